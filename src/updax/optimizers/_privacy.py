"""Differentially private SGD."""

from __future__ import annotations

import jax

from updax import _validate as check
from updax._typing import ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer
from updax.updates import differentially_private_aggregate


@optimizer
def dpsgd(learning_rate: ScalarOrSchedule = 1e-2, l2_norm_clip: ScalarOrSchedule = 1.0,
          noise_multiplier: ScalarOrSchedule = 1.0, key: int | jax.Array = 0, momentum: ScalarOrSchedule | None = None,
          nesterov: bool = False, *, maximize: bool = False) -> Update:
    """Differentially private SGD: per-example clipping and Gaussian noise, then (momentum) SGD.

    Pipeline: ``differentially_private_aggregate(l2_norm_clip, noise_multiplier, key)
    |> trace(momentum, nesterov) |> scale_by_learning_rate(learning_rate)``,
    without the trace when ``momentum`` is None, as ``optax.contrib.dpsgd``.
    Its updates are per-example gradients, a leading axis of examples on
    every leaf: ``jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, batch)``.
    The privacy guarantee depends on the noise multiplier, the sampling rate
    and the number of steps; compute it with a privacy accountant.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.01``.
        l2_norm_clip: the largest global norm an example's gradient
            keeps, >= 0. Default: ``1.0``.
        noise_multiplier: the noise's standard deviation in units of
            ``l2_norm_clip``, >= 0. Default: ``1.0``.
        key: an int seed in [0, 2**32), a JAX PRNG key or its raw key data.
            Default: ``0``.
        momentum: the trace decay, or None for plain SGD. Default: ``None``.
        nesterov: Nesterov momentum (with ``momentum`` set). Default: ``False``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object that takes per-example updates.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.dpsgd(0.1, l2_norm_clip=1.0, noise_multiplier=1.1, key=7, momentum=0.9)
        differentially_private_aggregate(l2_norm_clip=1.0, noise_multiplier=1.1, key=7) |> trace(decay=0.9, nesterov=False) |> scale_by_learning_rate(learning_rate=0.1)

    References:
        Abadi et al., "Deep Learning with Differential Privacy", CCS 2016.
        https://arxiv.org/abs/1607.00133
    """
    check.flag("dpsgd", "nesterov", nesterov)
    aggregate = differentially_private_aggregate(l2_norm_clip, noise_multiplier, key)
    if momentum is not None:
        aggregate = aggregate.trace(decay=momentum, nesterov=nesterov)
    return maximized(maximize, aggregate.scale_by_learning_rate(learning_rate))
