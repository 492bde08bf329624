"""GaLore: Adam on low-rank projections of the matrix gradients, with decoupled weight decay."""

from __future__ import annotations

from collections.abc import Callable

from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer
from updax.updates import scale_by_galore


@optimizer
def galore(learning_rate: ScalarOrSchedule = 1e-3, rank: int = 128, update_proj_gap: int = 200,
           scale: ScalarOrSchedule = 1.0, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
           eps: ScalarOrSchedule = 1e-8, eps_root: ScalarOrSchedule = 0.0, decay: ScalarOrSchedule = 0.0, *,
           mu_dtype: DType = None, weight_dimension_numbers: PyTree | Callable[[PyTree], PyTree] | None = None,
           mask: PyTree | Callable[[PyTree], PyTree] | None = None, cautious_decay: bool = False,
           base_optimizer: Update | None = None, maximize: bool = False) -> Update:
    """GaLore: Adam on each matrix gradient's projection onto its top singular vectors.

    Pipeline: ``scale_by_galore(...) |> add_decayed_weights(decay) |> scale_by_learning_rate(learning_rate)``,
    optax.contrib.galore's (``decay`` is its ``weight_decay``, applied in the full parameter space; Adam is
    built in, and ``base_optimizer`` puts another pipeline in its place). Leaves that are not matrices take AdamW. The defaults are optax's; the paper
    pre-trains LLaMA with ``learning_rate=0.01, scale=0.25`` and ranks of a quarter to a half of the width.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.001``.
        rank: the rank of each matrix's projection, an integer >= 1. Default: ``128``.
        update_proj_gap: the steps between refreshes of the projectors, an integer >= 1. Default: ``200``.
        scale: the factor of the matrices' projected-back updates. Default: ``1.0``.
        b1: first-moment decay; set only without ``base_optimizer``. Default: ``0.9``.
        b2: second-moment decay; set only without ``base_optimizer``. Default: ``0.999``.
        eps: added to the denominator; set only without ``base_optimizer``. Default: ``1e-08``.
        eps_root: added to the second moment inside the root; set only without ``base_optimizer``.
            Default: ``0.0``.
        decay: decoupled weight-decay rate. Default: ``0.0``.
        mu_dtype: storage dtype of the first moment; None: at least float32; set only without
            ``base_optimizer``. Default: ``None``.
        weight_dimension_numbers: which leaves are matrices and which of
            their axes (see :func:`updax.scale_by_galore`); None makes every
            leaf with two axes a matrix. Default: ``None``.
        mask: which leaves decay: a pytree of bools shaped like the params (or
            a prefix of it), or a function of the params returning one; None
            decays every leaf. Default: ``None``.
        cautious_decay: decay a coordinate only where the update and the
            param agree in sign (``add_decayed_weights(cautious=True)``);
            prints only when True. Default: ``False``.
        base_optimizer: a pipeline in Adam's place on the projected
            gradients, e.g. ``scale_by_lion()``, which must not need params
            (see :func:`updax.scale_by_galore`); None: Adam, with ``b1``,
            ``b2``, ``eps``, ``eps_root`` and ``mu_dtype``. Default: ``None``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object; ``update`` needs ``params`` (for the decay).

    Example:
        >>> import updax as ux
        >>> ux.optimizers.galore(1e-2, rank=64)
        scale_by_galore(rank=64, update_proj_gap=200, scale=1.0, b1=0.9, b2=0.999, eps=1e-08, eps_root=0.0) |> add_decayed_weights(decay=0.0) |> scale_by_learning_rate(learning_rate=0.01)

    References:
        Zhao et al., "GaLore: Memory-Efficient LLM Training by Gradient
        Low-Rank Projection", ICML 2024. https://arxiv.org/abs/2403.03507
    """
    pipeline = (scale_by_galore(rank=rank, update_proj_gap=update_proj_gap, scale=scale, b1=b1, b2=b2, eps=eps,
                                eps_root=eps_root, mu_dtype=mu_dtype,
                                weight_dimension_numbers=weight_dimension_numbers, base_optimizer=base_optimizer)
                .add_decayed_weights(decay=decay, mask=mask, cautious=cautious_decay)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)
