"""One registry of every catalogue entry: it drives the contract tests.

Each entry builds the combinator with options that exercise it (all numbers
explicit), and says whether ``update`` needs params. A test checks that the
registry covers the whole public catalogue, so a new entry cannot skip the
contract.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import updax as ux


def _by_rank(params):
    return jax.tree.map(lambda p: "adam" if p.ndim >= 2 else "sgd", params)


def _matrices(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def _halving(count):
    return 0.5 ** (count / 2)


def _odd_epochs_decay(epoch):
    """MultiplicativeLR's factor: 0.9 on odd epochs, 1 on even ones."""
    return jnp.where(epoch % 2 == 1, 0.9, 1.0)


def _three_in_four(step):
    """The conditional wrappers' choice: all calls but every fourth from the first (so, at the int32 limit, where
    the step saturates at 2**31 - 1, every call: tests/test_counters.py)."""
    return step % 4 != 0


def _norms(updates, params):
    """What a monitor records: the update and param norms and their ratio."""
    update_norm, param_norm = ux.global_norm(updates), ux.global_norm(params)
    return {"update": update_norm, "param": param_norm, "ratio": update_norm / param_norm}


def _update_norm(updates, params):
    return ux.global_norm(updates)


def _stacked_matrices(params):
    """Muon's dimension numbers: every leaf with two axes or more is a batch of matrices over its last two."""
    return jax.tree.map(lambda p: ux.MuonDimensionNumbers(-2, -1) if p.ndim >= 2 else None, params)


def half_squared_norm(params):
    """An objective for the line searches: ``|w|²/2`` over any tree, in float32 (complex64 leaves as they are; the
    contract tests pass only ``loss=``, so the line-search entries are built with ``objective=``)."""
    return sum((0.5 * jnp.sum(jnp.abs(p if jnp.iscomplexobj(p) else p.astype(jnp.float32)) ** 2)
                for p in jax.tree.leaves(params)), jnp.zeros([], jnp.float32))


def quartic(params):
    """``Σ w²/2 + w⁴/4`` over any real tree, in float32: Sophia's objective, whose Hessian, 1 + 3w², depends on
    the params (so that the gradient tests reach them through it)."""
    return sum((jnp.sum(p.astype(jnp.float32) ** 2 / 2 + p.astype(jnp.float32) ** 4 / 4)
                for p in jax.tree.leaves(params)), jnp.zeros([], jnp.float32))


ENTRIES = {
    "scale": lambda: ux.scale(-0.5),
    "scale_by_adam": lambda: ux.scale_by_adam(b1=0.8, b2=0.95, eps=1e-8, eps_root=1e-15),
    "scale_by_belief": lambda: ux.scale_by_belief(b1=0.8, b2=0.95, eps=1e-8, eps_root=1e-16),
    "scale_by_radam": lambda: ux.scale_by_radam(b1=0.8, b2=0.9, eps=1e-8, eps_root=0.0, threshold=5.0),
    "scale_by_rms": lambda: ux.scale_by_rms(decay=0.9, eps=1e-8, initial_scale=0.0),
    "scale_by_rms_bias_corrected": lambda: ux.scale_by_rms(decay=0.9, eps=1e-8, initial_scale=0.0, eps_in_sqrt=False,
                                                           bias_correction=True),
    "scale_by_rss": lambda: ux.scale_by_rss(initial_accumulator_value=0.1, eps=1e-7),
    "scale_by_stddev": lambda: ux.scale_by_stddev(decay=0.9, eps=1e-8, initial_scale=0.0),
    # initial_scale > 0: bias-corrected from 0, the first step's variance is 0 (m̂ = g, v̂ = g²) and u = g / eps
    "scale_by_stddev_bias_corrected": lambda: ux.scale_by_stddev(decay=0.9, eps=1e-8, initial_scale=0.1,
                                                                 eps_in_sqrt=False, bias_correction=True),
    "scale_by_schedule": lambda: ux.scale_by_schedule(_halving),
    "scale_by_state": lambda: ux.scale_by_state(-0.1),
    "scale_by_learning_rate": lambda: ux.scale_by_learning_rate(0.1),
    "scale_by_multiplicative_lr": lambda: ux.scale_by_multiplicative_lr(0.1, _odd_epochs_decay),
    "reduce_on_plateau": lambda: ux.reduce_on_plateau(factor=0.5, patience=2, rtol=1e-4, atol=0.0, cooldown=1,
                                                      accumulation_size=1, min_scale=0.01),
    "scale_by_trust_ratio": lambda: ux.scale_by_trust_ratio(min_norm=0.0, trust_coefficient=0.5, eps=1e-6),
    "scale_by_yogi": lambda: ux.scale_by_yogi(initial_accumulator_value=1e-6, b1=0.9, b2=0.999, eps=1e-3,
                                              eps_root=0.0),
    "trace": lambda: ux.trace(decay=0.9, nesterov=False),
    "trace_nesterov": lambda: ux.trace(decay=0.5, nesterov=True),
    "clip": lambda: ux.clip(delta=0.5),
    "clip_by_global_norm": lambda: ux.clip_by_global_norm(max_norm=1.0),
    "centralize": lambda: ux.centralize(),
    # (cautious: the masked decay computes everything the plain one does, and every optimizer test runs the plain one)
    "add_decayed_weights": lambda: ux.add_decayed_weights(decay=0.1, cautious=True),
    "add_noise": lambda: ux.add_noise(eta=0.01, gamma=0.55, key=3),
    "accumulate_gradients": lambda: ux.scale_by_adam().scale(-0.1).accumulate_gradients(
        2, should_skip=ux.skip_large_updates(1e6)),
    "apply_if_finite": lambda: ux.scale_by_adam().scale(-0.1).apply_if_finite(3),
    # period 2: the sweeps' few steps see the scale grow
    "loss_scale": lambda: ux.scale_by_adam().scale(-0.1).apply_if_finite(3).loss_scale(2.0**4, dynamic=True, period=2),
    "ema": lambda: ux.ema(0.9, debias=True, init=0.5, decay_min=True, keep_previous=True),
    "sma": lambda: ux.sma(3),
    "weighted_moving_average": lambda: ux.weighted_moving_average(0.8),
    "ema_params": lambda: ux.scale(-0.1).ema_params(0.9, decay_min=True),
    "swa": lambda: ux.scale(-0.1).swa(start=2, period=1),
    "freeze": lambda: ux.scale(-0.1).freeze(_matrices),
    "scale_by_lion": lambda: ux.scale_by_lion(b1=0.9, b2=0.99),
    "scale_by_amsgrad": lambda: ux.scale_by_amsgrad(b1=0.8, b2=0.95, eps=1e-8, eps_root=0.0),
    "scale_by_adamax": lambda: ux.scale_by_adamax(b1=0.8, b2=0.95, eps=1e-8),
    "scale_by_nadam": lambda: ux.scale_by_nadam(b1=0.8, b2=0.95, eps=1e-8, eps_root=0.0),
    "scale_by_novograd": lambda: ux.scale_by_novograd(b1=0.9, b2=0.25, eps=1e-8, eps_root=0.0, decay=1e-3),
    "scale_by_adadelta": lambda: ux.scale_by_adadelta(rho=0.9, eps=1e-6),
    "scale_by_rprop": lambda: ux.scale_by_rprop(learning_rate=1e-3, eta_minus=0.5, eta_plus=1.2, min_step_size=1e-6,
                                                max_step_size=50.0),
    "scale_by_sign": lambda: ux.scale_by_sign(),
    "partition": lambda: ux.partition({"adam": ux.scale_by_adam(), "sgd": ux.scale(-0.1)}, _by_rank),
    "masked": lambda: ux.scale_by_adam().masked(_matrices),
    "scale_by_factored_rms": lambda: ux.scale_by_factored_rms(factored=True, decay_rate=0.8, step_offset=0,
                                                              min_dim_size_to_factor=2, epsilon=1e-30),
    "scale_by_param_block_rms": lambda: ux.scale_by_param_block_rms(min_scale=1e-3),
    "scale_by_shape": lambda: ux.scale_by_shape(weight_dimension_numbers=_stacked_matrices),
    "clip_by_block_rms": lambda: ux.clip_by_block_rms(threshold=1.0),
    "scale_by_sm3": lambda: ux.scale_by_sm3(b1=0.9, b2=1.0, eps=1e-8),
    # (a refresh every 2 steps: the sweeps' second and later steps run the power step, the first the eigh)
    "scale_by_soap": lambda: ux.scale_by_soap(b1=0.9, b2=0.95, shampoo_beta=0.9, eps=1e-8, precondition_frequency=2,
                                              max_precond_dim=64, merge_dims=False),
    # (rank 2 with a refresh every 2 steps: the sweeps' steps refresh and keep the projectors; stacked leaves are
    # batches of matrices, each with its own projector, and the rank is clipped on the smaller ones)
    "scale_by_galore": lambda: ux.scale_by_galore(rank=2, update_proj_gap=2, scale=0.5, b1=0.9, b2=0.999, eps=1e-8,
                                                  eps_root=0.0, weight_dimension_numbers=_stacked_matrices),
    # (a base pipeline of two stages in Adam's place: its state nested in GaLore's, on the projected shapes)
    "scale_by_galore_with_base": lambda: ux.scale_by_galore(
        rank=2, update_proj_gap=2, scale=0.5, weight_dimension_numbers=_stacked_matrices,
        base_optimizer=ux.scale_by_rms(decay=0.9, eps=1e-8).trace(decay=0.8)),
    "scale_by_newton_schulz": lambda: ux.scale_by_newton_schulz(ns_coeffs=(3.4445, -4.7750, 2.0315), ns_steps=5,
                                                                eps=1e-8, weight_dimension_numbers=_stacked_matrices),
    "scale_by_muon": lambda: ux.scale_by_muon(ns_coeffs=(3.4445, -4.7750, 2.0315), ns_steps=5, beta=0.95, eps=1e-8,
                                              nesterov=True, adaptive=True,
                                              weight_dimension_numbers=_stacked_matrices),
    # (refreshed every 2 steps from step 2, axes above 3 elements cut into blocks of 3: the sweeps' few steps hit a
    # refresh, and leaves cut into blocks (a (3, 4) matrix in the registry's tree, (8, 4) and (2, 4, 3) on the
    # sharded checks' mesh) and not)
    "scale_by_shampoo": lambda: ux.scale_by_shampoo(b2=0.9, eps=1e-8, matrix_eps=1e-6, precondition_frequency=2,
                                                    start_preconditioning_step=2, max_preconditioner_dim=3,
                                                    graft="adam", block_size=3),
    "scale_by_normuon": lambda: ux.scale_by_normuon(ns_coeffs=(3.4445, -4.7750, 2.0315), ns_steps=5, beta=0.95,
                                                    beta2=0.9, eps=1e-8, rms=0.2, nesterov=True,
                                                    weight_dimension_numbers=_stacked_matrices),
    # (axes above 3 elements get diagonal factors; Li's init scale from the first gradients; a fit at every step)
    "scale_by_psgd_kron": lambda: ux.scale_by_psgd_kron(b1=0.9, precond_lr=0.1, precond_update_prob=1.0,
                                                        max_size_triangular=3, preconditioner_init_scale=None,
                                                        momentum_into_precond_update=True, key=3),
    "schedule_free": lambda: ux.scale_by_adam(b1=0.0).scale_by_learning_rate(0.1).schedule_free(0.1, b1=0.9),
    "scale_by_adan": lambda: ux.scale_by_adan(b1=0.98, b2=0.92, b3=0.99, eps=1e-8, eps_root=0.0),
    "scale_by_mars": lambda: ux.scale_by_mars(gamma=0.5, b1=0.9, max_norm=1.0),
    # (clip_value=None, the paper's t^(1/4), is not a number the contract can turn into a constant schedule)
    "scale_by_adopt": lambda: ux.scale_by_adopt(b1=0.9, b2=0.9999, eps=1e-6, clip_value=1.5, nesterov=False,
                                                use_clipping=True),
    "scale_by_ademamix": lambda: ux.scale_by_ademamix(b1=0.9, b2=0.999, b3=0.99, alpha=5.0, eps=1e-8, eps_root=0.0),
    "scale_by_simplified_ademamix": lambda: ux.scale_by_simplified_ademamix(b1=0.9, b2=0.95, alpha=1.0, eps=1e-8,
                                                                            eps_root=0.0),
    "scale_by_laprop": lambda: ux.scale_by_laprop(b1=0.9, b2=0.95, eps=1e-8),
    "scale_by_acprop": lambda: ux.scale_by_acprop(b1=0.9, b2=0.95, eps=1e-8, eps_root=1e-16),
    "zero_nans": lambda: ux.zero_nans(),
    "keep_params_nonnegative": lambda: ux.keep_params_nonnegative(),
    "snapshot": lambda: ux.scale(-0.5).snapshot(),
    "scale_by_madgrad": lambda: ux.scale_by_madgrad(learning_rate=0.1, momentum=0.9, eps=1e-6),
    "scale_by_prodigy": lambda: ux.scale_by_prodigy(learning_rate=1.0, b1=0.9, b2=0.99, b3=0.9, eps=1e-8,
                                                    estim_lr0=1e-3, estim_lr_coef=1.0, decay=0.01,
                                                    safeguard_warmup=False),
    "scale_by_dadapt_adamw": lambda: ux.scale_by_dadapt_adamw(learning_rate=1.0, b1=0.9, b2=0.99, eps=1e-8,
                                                              estim_lr0=1e-3, decay=0.01),
    "scale_by_dog": lambda: ux.scale_by_dog(init_step=1e-4, init_step_type="heuristic", eps=1e-8),
    "scale_by_dowg": lambda: ux.scale_by_dowg(init_estim_sq_dist=1e-2, eps=1e-4),
    "scale_by_cocob": lambda: ux.scale_by_cocob(alpha=10.0, eps=1e-8),
    "scale_by_polyak": lambda: ux.scale_by_polyak(f_min=0.0, max_learning_rate=0.5, eps=1e-6, variant="sps+"),
    "scale_by_momo": lambda: ux.scale_by_momo(learning_rate=1.0, momentum=0.9, lower_bound=0.0, decay=0.01,
                                              adapt_lower_bound=True, decay_form="proximal"),
    "scale_by_momo_adam": lambda: ux.scale_by_momo_adam(learning_rate=0.1, b1=0.9, b2=0.99, eps=1e-8, lower_bound=0.0,
                                                        decay=0.01, adapt_lower_bound=False, decay_form="decoupled"),
    "mechanize": lambda: ux.scale_by_adam().scale_by_learning_rate(1.0).mechanize(decay=0.01, eps=1e-8, s_init=1e-6,
                                                                                   num_betas=4),
    "lookahead": lambda: ux.scale_by_adam().scale(-0.1).lookahead(2, 0.5, reset_state=True),
    "sam": lambda: ux.scale_by_adam().scale(-0.1).sam(0.05, 3, reset_state=True, adversary=ux.trace(0.5)),
    "cautious": lambda: ux.scale_by_adam().scale(-0.1).cautious(eps=1e-8),
    "scale_by_optimistic_gradient": lambda: ux.scale_by_optimistic_gradient(alpha=0.5, beta=1.0),
    "adaptive_grad_clip": lambda: ux.adaptive_grad_clip(clipping=0.05, eps=1e-3),
    "per_example_global_norm_clip": lambda: ux.per_example_global_norm_clip(l2_norm_clip=1.0),
    "differentially_private_aggregate": lambda: ux.differentially_private_aggregate(l2_norm_clip=1.0,
                                                                                    noise_multiplier=0.5, key=3),
    "scale_by_lbfgs": lambda: ux.scale_by_lbfgs(memory_size=3, scale_init_precond=True),
    "scale_by_zoom_linesearch": lambda: ux.scale(-1.0).scale_by_zoom_linesearch(
        max_linesearch_steps=8, max_learning_rate=10.0, tol=0.0, increase_factor=2.0, slope_rtol=1e-4, curv_rtol=0.9,
        approx_dec_rtol=1e-6, stepsize_precision=1e-5, initial_guess_strategy="one", objective=half_squared_norm),
    # (max_join_size=8, min_joined=1: the registry's few small leaves are joined, its larger ones keep their own
    # buffers)
    "flat_state": lambda: ux.scale_by_adam().add_decayed_weights(0.01).clip_by_global_norm(1.0).scale(-0.1)
    .flat_state(max_join_size=8, min_joined=1),
    # (min_size=4, block_size=2: the registry's leaves of 4 elements and more are stored in 8 bits, in blocks of 2)
    "quantized_state": lambda: ux.scale_by_adam().add_decayed_weights(0.01).scale(-0.1)
    .quantized_state(bits=8, block_size=2, min_size=4),
    # (b2=0.6, gamma=1: the estimate of the Hessian, 1 + 3w², brings most ratios inside the clip from step 2 on)
    "scale_by_sophia": lambda: ux.scale_by_sophia(b1=0.9, b2=0.6, eps=1e-8, gamma=1.0, clip_threshold=5.0,
                                                  update_interval=2, key=3, objective=quartic),
    "conditionally_mask": lambda: ux.scale_by_adam().scale(-0.1).conditionally_mask(_three_in_four),
    "conditionally_transform": lambda: ux.scale_by_adam().scale(-0.1).conditionally_transform(_three_in_four),
    "apply_every": lambda: ux.apply_every(2),
    "selective_transform": lambda: ux.scale_by_adam().scale(-0.1).selective_transform(_matrices),
    "monitor": lambda: ux.scale(-0.5).monitor({"norms": _norms, "ema": ux.measure_with_ema(_update_norm, 0.9)},
                                              with_params=True),
    "normalize_by_update_norm": lambda: ux.normalize_by_update_norm(scale_factor=-0.5, eps=1e-6),
    "scale_by_param_block_norm": lambda: ux.scale_by_param_block_norm(min_scale=1e-3),
    "per_example_layer_norm_clip": lambda: ux.per_example_layer_norm_clip(l2_norm_clip=1.0, uniform=False),
    "split_real_and_imaginary": lambda: ux.scale_by_adam().scale(-0.1).split_real_and_imaginary(),
    "scale_by_backtracking_linesearch": lambda: ux.scale(-1.0).scale_by_backtracking_linesearch(
        max_backtracking_steps=8, slope_rtol=1e-4, decrease_factor=0.8, increase_factor=1.5, max_learning_rate=1.0,
        atol=0.0, rtol=0.0, store_grad=True, objective=half_squared_norm),
}


def _more_than_a_chain(name: str) -> bool:
    """Whether optimizer ``name``'s pipeline, at its defaults, holds more than a chain of catalogue stages at
    options the registry's entries stand for: a stage running pipelines inside it (a wrapper, groups) or a
    scheduled option (a state of its own, ``ScheduledState``)."""
    return any(stage.nested() or stage.scheduled for stage in getattr(ux.optimizers, name)().stages)


#: The optimizers the sweeps of per-stage properties run beside the registry's entries (the 8-device placements,
#: tests/sharding_checks.py; the float64 dtypes, tests/test_state_dtypes.py; the numbers held in the state,
#: tests/test_held.py). An optimizer is a chain of catalogue stages, which those sweeps run one by one; an
#: optimizer whose pipeline holds more than a chain (muon's and normuon's groups, the schedule-free wrappers,
#: adafactor's scheduled decay) is run whole, and so are those whose results other checks read by name (shampoo's
#: derived state on the mesh) or that take an objective (lbfgs, sophia). Every optimizer is still run whole by
#: the held numbers, the fuzz, the backends' programs and its parity with optax (tests/test_optimizers.py).
SWEPT_OPTIMIZERS = tuple(sorted({name for name in ux.optimizers.__all__ if _more_than_a_chain(name)}
                                | {"shampoo", "lbfgs", "sophia"}))

#: Entries whose ``update`` needs ``params``.
NEEDS_PARAMS = {"scale_by_prodigy", "scale_by_dadapt_adamw", "scale_by_dog", "scale_by_dowg", "scale_by_cocob",
                "mechanize", "scale_by_trust_ratio", "lookahead", "sam", "add_decayed_weights", "scale_by_novograd", "schedule_free",
                "scale_by_param_block_rms", "ema_params", "swa", "keep_params_nonnegative", "adaptive_grad_clip",
                "scale_by_lbfgs", "scale_by_zoom_linesearch", "scale_by_backtracking_linesearch", "flat_state",
                "scale_by_sophia", "monitor", "scale_by_param_block_norm", "scale_by_madgrad", "quantized_state",
                "scale_by_momo", "scale_by_momo_adam"}

#: Entries with no per-param state and no params argument: they accept any update tree.
ANY_TREE = {"scale_by_polyak", "scale", "clip", "clip_by_global_norm", "centralize", "scale_by_schedule", "scale_by_state", "add_noise",
            "scale_by_learning_rate", "scale_by_multiplicative_lr", "reduce_on_plateau", "scale_by_sign", "clip_by_block_rms",
            "scale_by_newton_schulz", "scale_by_shape", "freeze", "per_example_global_norm_clip",
            "differentially_private_aggregate", "normalize_by_update_norm", "per_example_layer_norm_clip"}

#: Public names of ``updax.updates`` that are not catalogue combinators.
NOT_COMBINATORS = {"apply_updates", "combinator", "compose", "identity", "stateful", "stateless", "global_norm",
                   "schedule_free_eval_params", "averaged_params", "has_updated", "current_loss_scale", "skip_not_finite",
                   "per_example_clipped_sum", "skip_large_updates", "MuonDimensionNumbers", "measure_with_ema",
                   "unitwise_clip", "incremental_update", "periodic_update", "scale_gradient", "value_and_grad_from_state",
                   "from_flat"}


#: Entries whose updates are per-example: a leading axis of examples on every leaf, which the entry reduces (its
#: output is shaped like the params, as every entry's is). The tests feed every pipeline ``updates_for(opt, grads)``.
PER_EXAMPLE = {"per_example_global_norm_clip", "differentially_private_aggregate", "per_example_layer_norm_clip"}

#: The examples ``as_examples`` makes of one gradient: its multiples. With the registry's nested trees (global norm
#: about 6) and l2_norm_clip=1, some examples are clipped and one (-0.1) is not.
EXAMPLE_SCALES = (1.0, -0.1, 2.0)


def as_examples(grads):
    """Per-example gradients made of ``grads``: a leading axis of examples, ``grads`` times each EXAMPLE_SCALES."""
    return jax.tree.map(lambda g: jnp.stack([g * jnp.asarray(s, g.dtype) for s in EXAMPLE_SCALES]), grads)


def updates_for(opt, grads):
    """What ``opt.update`` takes for gradients ``grads`` (shaped like the params): ``as_examples(grads)`` if one of
    its stages takes per-example updates (PER_EXAMPLE, ``optimizers.dpsgd``), else ``grads`` (an optax
    transformation, the oracle of some tests, takes ``grads``)."""
    per_example = isinstance(opt, ux.Update) and any(stage.per_example for stage in opt.stages)
    return as_examples(grads) if per_example else grads


def catalogue_names():
    return sorted(set(ux.updates.__all__) - NOT_COMBINATORS)


def nested_tree(dtype=jnp.float32, seed=0):
    """Dicts, lists, tuples, None leaves, empty subtrees and a scalar."""
    key = iter(range(seed * 100, seed * 100 + 100))

    def arr(*shape):
        import numpy as np

        return jnp.asarray(np.random.default_rng(next(key)).normal(size=shape), dtype)

    return {
        "dense": {"w": arr(3, 4), "b": arr(4)},
        "layers": [arr(2, 2, 3), (arr(5), None)],
        "empty": {},
        "nothing": None,
        "empty_list": [],
        "scalar": arr(),
    }
