"""The Axon.Updates catalogue: combinators that build update objects.

Every entry is built on the primitives :func:`updax.stateless` and
:func:`updax.stateful`, takes Axon's option names and defaults, accepts an
optional leading parent (``scale(parent, 0.1)``) and is also a fluent method
of every update object (``parent.scale(0.1)``).
"""

from updax._combinators import combinator
from updax._primitives import apply_updates, compose, identity, stateful, stateless
from updax.updates._accumulation import accumulate_gradients, apply_every, has_updated, trace
from updax.updates._adam import (
    scale_by_adam,
    scale_by_adamax,
    scale_by_adan,
    scale_by_amsgrad,
    scale_by_belief,
    scale_by_nadam,
    scale_by_radam,
    scale_by_yogi,
)
from updax.updates._adam_variants import (
    scale_by_acprop,
    scale_by_ademamix,
    scale_by_adopt,
    scale_by_laprop,
    scale_by_simplified_ademamix,
)
from updax.updates._averaging import (
    averaged_params,
    ema_params,
    schedule_free,
    schedule_free_eval_params,
    swa,
)
from updax.updates._clipping import (
    adaptive_grad_clip,
    centralize,
    clip,
    clip_by_global_norm,
    global_norm,
    normalize_by_update_norm,
    unitwise_clip,
)
from updax.updates._conditional import conditionally_mask, conditionally_transform
from updax.updates._dual_averaging import scale_by_madgrad
from updax.updates._factored import (
    clip_by_block_rms,
    scale_by_factored_rms,
    scale_by_param_block_norm,
    scale_by_param_block_rms,
    scale_by_sm3,
)
from updax.updates._flat import flat_state, from_flat
from updax.updates._layerwise import scale_by_novograd, scale_by_trust_ratio
from updax.updates._lbfgs import scale_by_lbfgs
from updax.updates._linesearch import (
    scale_by_backtracking_linesearch,
    scale_by_zoom_linesearch,
    value_and_grad_from_state,
)
from updax.updates._mars import scale_by_mars
from updax.updates._masking import freeze, masked, partition, selective_transform
from updax.updates._galore import scale_by_galore
from updax.updates._lr_free import (
    mechanize,
    scale_by_cocob,
    scale_by_dadapt_adamw,
    scale_by_dog,
    scale_by_dowg,
    scale_by_polyak,
    scale_by_prodigy,
)
from updax.updates._momo import scale_by_momo, scale_by_momo_adam
from updax.updates._moving_averages import ema, sma, weighted_moving_average
from updax.updates._muon_dims import MuonDimensionNumbers
from updax.updates._noise_decay import add_decayed_weights, add_noise
from updax.updates._privacy import (
    differentially_private_aggregate,
    per_example_clipped_sum,
    per_example_global_norm_clip,
    per_example_layer_norm_clip,
)
from updax.updates._orthogonal import scale_by_muon, scale_by_newton_schulz, scale_by_normuon, scale_by_shape
from updax.updates._psgd import scale_by_psgd_kron
from updax.updates._quantized import quantized_state
from updax.updates._rms import scale_by_adadelta, scale_by_rms, scale_by_rss, scale_by_stddev
from updax.updates._shampoo import scale_by_shampoo
from updax.updates._targets import incremental_update, periodic_update, scale_gradient
from updax.updates._sign import scale_by_lion, scale_by_rprop, scale_by_sign
from updax.updates._soap import scale_by_soap
from updax.updates._skipping import (
    apply_if_finite,
    current_loss_scale,
    loss_scale,
    skip_large_updates,
    skip_not_finite,
)
from updax.updates._sophia import scale_by_sophia
from updax.updates._step_size import (
    reduce_on_plateau,
    scale,
    scale_by_learning_rate,
    scale_by_multiplicative_lr,
    scale_by_schedule,
    scale_by_state,
)
from updax.updates._utilities import keep_params_nonnegative, measure_with_ema, monitor, snapshot, zero_nans
from updax.updates._wrappers import (
    cautious,
    lookahead,
    sam,
    scale_by_optimistic_gradient,
    split_real_and_imaginary,
)

__all__ = [
    "MuonDimensionNumbers",
    "accumulate_gradients",
    "adaptive_grad_clip",
    "add_decayed_weights",
    "add_noise",
    "apply_every",
    "apply_if_finite",
    "apply_updates",
    "averaged_params",
    "cautious",
    "centralize",
    "clip",
    "clip_by_block_rms",
    "clip_by_global_norm",
    "combinator",
    "compose",
    "conditionally_mask",
    "conditionally_transform",
    "current_loss_scale",
    "differentially_private_aggregate",
    "ema",
    "ema_params",
    "flat_state",
    "freeze",
    "from_flat",
    "global_norm",
    "has_updated",
    "identity",
    "incremental_update",
    "keep_params_nonnegative",
    "lookahead",
    "loss_scale",
    "masked",
    "measure_with_ema",
    "mechanize",
    "monitor",
    "normalize_by_update_norm",
    "partition",
    "per_example_clipped_sum",
    "per_example_global_norm_clip",
    "per_example_layer_norm_clip",
    "periodic_update",
    "quantized_state",
    "reduce_on_plateau",
    "sam",
    "scale",
    "scale_by_acprop",
    "scale_by_adadelta",
    "scale_by_adam",
    "scale_by_adamax",
    "scale_by_adan",
    "scale_by_ademamix",
    "scale_by_adopt",
    "scale_by_amsgrad",
    "scale_by_backtracking_linesearch",
    "scale_by_belief",
    "scale_by_cocob",
    "scale_by_dadapt_adamw",
    "scale_by_dog",
    "scale_by_dowg",
    "scale_by_factored_rms",
    "scale_by_galore",
    "scale_by_laprop",
    "scale_by_lbfgs",
    "scale_by_learning_rate",
    "scale_by_lion",
    "scale_by_madgrad",
    "scale_by_mars",
    "scale_by_multiplicative_lr",
    "scale_by_momo",
    "scale_by_momo_adam",
    "scale_by_muon",
    "scale_by_nadam",
    "scale_by_newton_schulz",
    "scale_by_normuon",
    "scale_by_novograd",
    "scale_by_optimistic_gradient",
    "scale_by_param_block_norm",
    "scale_by_param_block_rms",
    "scale_by_polyak",
    "scale_by_prodigy",
    "scale_by_psgd_kron",
    "scale_by_radam",
    "scale_by_rms",
    "scale_by_rprop",
    "scale_by_rss",
    "scale_by_schedule",
    "scale_by_shampoo",
    "scale_by_shape",
    "scale_by_sign",
    "scale_by_simplified_ademamix",
    "scale_by_sm3",
    "scale_by_soap",
    "scale_by_sophia",
    "scale_by_state",
    "scale_by_stddev",
    "scale_by_trust_ratio",
    "scale_by_yogi",
    "scale_by_zoom_linesearch",
    "scale_gradient",
    "schedule_free",
    "schedule_free_eval_params",
    "selective_transform",
    "skip_large_updates",
    "skip_not_finite",
    "sma",
    "snapshot",
    "split_real_and_imaginary",
    "stateful",
    "stateless",
    "swa",
    "trace",
    "unitwise_clip",
    "value_and_grad_from_state",
    "weighted_moving_average",
    "zero_nans",
]
