"""Averaging of iterates: schedule-free learning."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax import _validate as check
from updax._core import Update, combinator, stateful


class ScheduleFreeState(NamedTuple):
    """The wrapped pipeline's state, the base iterate ``z``, and the averaging weights."""

    inner: tuple
    z: object
    weight_sum: jax.Array
    max_lr: jax.Array


def _init_schedule_free(params, *, inner, state_dtype):
    z = jax.tree.map(lambda p: jnp.array(p, dtype=state_dtype or jnp.asarray(p).dtype), params)
    return ScheduleFreeState(inner=inner.init(params), z=z, weight_sum=jnp.zeros([], jnp.float32),
                             max_lr=jnp.zeros([], jnp.float32))


def _apply_schedule_free(updates, state, params, *, inner, learning_rate, b1, weight_lr_power, **extra):
    max_lr = jnp.maximum(state.max_lr, learning_rate)
    weight = max_lr**weight_lr_power
    weight_sum = state.weight_sum + weight
    ck = jnp.where(weight_sum > 0, weight / jnp.where(weight_sum > 0, weight_sum, 1.0), 0.0)
    steps, inner_state = inner.update(updates, state.inner, params, **extra)

    def leaf(y, z0, u):
        c = _tree.compute_dtype(y.dtype, z0.dtype)
        y32, z32 = y.astype(c), z0.astype(c)
        z = z32 + u.astype(c)
        x = (1 - ck) * (y32 - (1 - b1) * z32) / b1 + ck * z
        return (b1 * x + (1 - b1) * z - y32).astype(u.dtype), z.astype(z0.dtype)

    out, z = _tree.tree_map_unzip("schedule_free", leaf, 2, params, state.z, steps,
                                  names=("params", "state.z", "updates"))
    return out, ScheduleFreeState(inner=inner_state, z=z, weight_sum=weight_sum, max_lr=max_lr)


@combinator(wraps=True)
def schedule_free(inner: Update, learning_rate, b1=0.9, weight_lr_power=2.0, *, state_dtype=None):
    """Replaces the momentum of the pipeline before it by schedule-free interpolation and averaging.

    The wrapped pipeline (without momentum, e.g. ``scale_by_adam(b1=0.0)
    |> scale_by_learning_rate(lr)``) makes the step of the base iterate
    ``z``; the params ``y`` the gradient is taken at interpolate ``z`` and the
    average ``x`` that is evaluated (see :func:`schedule_free_eval_params`)::

        z ← z + inner(g)
        x ← (1 - c)·x + c·z,   c = lr_max^p / Σ lr_max^p
        y ← b1·x + (1 - b1)·z

    Args:
        learning_rate: the wrapped pipeline's learning rate (a number or a
            schedule); it weights the average. No default.
        b1: the interpolation weight, in (0, 1). Default: ``0.9``.
        weight_lr_power: the power ``p`` of the weights. Default: ``2.0``.
        state_dtype: storage dtype of ``z``; None keeps the params' dtype.
            Default: ``None``.

    Returns:
        An update object with state ``ScheduleFreeState(inner, z, weight_sum,
        max_lr)``; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_learning_rate(0.1).schedule_free(0.1, b1=0.5)
        >>> params = {"w": jnp.array([1.0])}
        >>> state = opt.init(params)
        >>> u, state = opt.update({"w": jnp.array([1.0])}, state, params)
        >>> u["w"]  # z = 0.9, x = z (first weight is the whole sum), y = 0.9
        Array([-0.1], dtype=float32)
        >>> ux.schedule_free_eval_params(opt, state, ux.apply_updates(params, u))["w"]
        Array([0.9], dtype=float32)

    References:
        Defazio et al., "The Road Less Scheduled", NeurIPS 2024.
        https://arxiv.org/abs/2405.15682
    """
    call = "schedule_free"
    options = dict(inner=inner, learning_rate=check.real(call, "learning_rate", learning_rate),
                   b1=check.real(call, "b1", b1, 0.0, 1.0, lo_open=True, hi_open=True),
                   weight_lr_power=check.real(call, "weight_lr_power", weight_lr_power),
                   state_dtype=check.float_dtype(call, "state_dtype", state_dtype))
    return stateful(_init_schedule_free, _apply_schedule_free, name=call, options=options, wraps="inner",
                    needs_params=True)


def schedule_free_eval_params(opt: Update, state, params):
    """The averaged params ``x`` to evaluate a schedule-free model at: ``(y - (1 - b1)·z) / b1``.

    Args:
        opt: the update object holding one ``schedule_free`` stage. No default.
        state: its state. No default.
        params: the current (training) params ``y``. No default.

    Returns:
        A params-shaped tree; the training params are untouched.

    Example:
        See :func:`schedule_free`.
    """
    b1 = opt.get_state(state, "schedule_free.b1")
    z = opt.get_state(state, "schedule_free.z")

    def leaf(y, zi):
        c = _tree.compute_dtype(y.dtype, zi.dtype)
        return ((y.astype(c) - (1 - b1) * zi.astype(c)) / b1).astype(y.dtype)

    return _tree.tree_map("schedule_free_eval_params", leaf, params, z, names=("params", "state.z"))
