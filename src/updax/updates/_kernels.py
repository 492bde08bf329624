"""Arithmetic shared by the catalogue's kernels, so that each family file holds only its own algorithm.

Kernels compute in at least float32 (the widest of the dtypes involved, see
:func:`updax._tree.compute_dtype`) and store each result in the dtype of
what it replaces: an update in the update's dtype, a moment in the moment's
storage dtype. :func:`per_leaf` does that casting once for all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from updax import _tree


def per_leaf(call: str, fn: Callable[..., tuple], trees: Sequence[Any], names: Sequence[str],
             n_out: int | None = None) -> tuple:
    """Runs ``fn`` leaf by leaf over ``trees``, in the compute dtype; returns one tree per output of ``fn``.

    ``fn`` receives each tree's leaf cast to the widest of their dtypes (at
    least float32) and returns ``n_out`` values (default: one per tree); the
    ``i``-th is stored in the dtype of the ``i``-th tree's leaf, so
    ``fn(g, m, v) -> (u, m, v)`` keeps the update's dtype and each moment's
    storage dtype. The trees must match ``trees[0]``; a mismatch names
    ``call`` and the first differing path.
    """
    def leaf(*xs):
        c = _tree.compute_dtype(*(x.dtype for x in xs))
        outs = fn(*(x.astype(c) for x in xs))
        return tuple(out.astype(x.dtype) for out, x in zip(outs, xs))

    n_out = len(trees) if n_out is None else n_out
    return _tree.tree_map_unzip(call, leaf, n_out, *trees, names=tuple(names))


def moment(decay: Any, old: jax.Array, new: jax.Array) -> jax.Array:
    """An exponential moving average's step: ``decay·old + (1 - decay)·new``."""
    return decay * old + (1 - decay) * new


def bias_corrections(count: jax.Array, *decays: Any) -> tuple[jax.Array, ...]:
    """``1 - decay^t`` for each decay, with ``t`` the (already incremented) step count."""
    t = count.astype(jnp.float32)
    return tuple(1 - decay**t for decay in decays)


def adam_direction(m: jax.Array, v: jax.Array, c1: Any, c2: Any, eps: Any, eps_root: Any) -> jax.Array:
    """Adam's step from the new moments and the bias corrections: ``m̂ / (sqrt(v̂ + eps_root) + eps)``."""
    return (m / c1) / (jnp.sqrt(v / c2 + eps_root) + eps)


def scaled(g: jax.Array, factor: Any) -> jax.Array:
    """``g·factor`` computed in at least float32, in ``g``'s dtype."""
    c = _tree.compute_dtype(g.dtype)
    return (g.astype(c) * factor).astype(g.dtype)


# --------------------------------------------------------------------------
# The trust ratio (LARS, LAMB, Fromage)


def _safe_norm(x: jax.Array, min_norm: Any) -> jax.Array:
    norm = jnp.sqrt(jnp.sum(jnp.square(x)))
    return jnp.where(norm <= min_norm, min_norm, norm)


def trust_ratio(g: jax.Array, p: jax.Array, min_norm: Any, trust_coefficient: Any, eps: Any) -> jax.Array:
    """One leaf's trust ratio ``c·‖p‖ / (‖g‖ + eps)`` (1 when either norm is 0), in the compute dtype."""
    c = _tree.compute_dtype(g.dtype, p.dtype)
    param_norm = _safe_norm(p.astype(c), min_norm)
    update_norm = _safe_norm(g.astype(c), min_norm)
    ratio = trust_coefficient * param_norm / (update_norm + eps)
    return jnp.where((param_norm == 0) | (update_norm == 0), 1.0, ratio)


def trust_ratios(updates: Any, params: Any, min_norm: Any, trust_coefficient: Any, eps: Any) -> Any:
    """:func:`trust_ratio` of each leaf, as a tree shaped like ``updates``."""
    return _tree.tree_map("scale_by_trust_ratio", lambda g, p: trust_ratio(g, p, min_norm, trust_coefficient, eps),
                          updates, params, names=("updates", "params"))


def trust_scaled(g: jax.Array, ratio: jax.Array) -> jax.Array:
    """``g`` rescaled by its trust ratio, in ``g``'s dtype."""
    return (g.astype(ratio.dtype) * ratio).astype(g.dtype)


# --------------------------------------------------------------------------
# Averages (moving averages of values, averages of the params)


def warmed_up(decay: Any, count: jax.Array, decay_min: bool) -> jax.Array:
    """``min(decay, (1 + t) / (10 + t))`` when ``decay_min`` (TensorFlow's warm-up), else ``decay``."""
    decay = jnp.asarray(decay, jnp.float32)
    if not decay_min:
        return decay
    t = count.astype(jnp.float32)
    return jnp.minimum(decay, (1.0 + t) / (10.0 + t))


def blend(average: jax.Array, value: jax.Array, keep: jax.Array, take: jax.Array) -> jax.Array:
    """``keep·average + take·value`` in at least float32, stored in ``average``'s dtype."""
    c = _tree.compute_dtype(average.dtype, value.dtype)
    return (keep.astype(c) * average.astype(c) + take.astype(c) * value.astype(c)).astype(average.dtype)


def filled(call: str, like: Any, init: Any, dtype: Any) -> Any:
    """Accumulators shaped like ``like`` holding ``init`` (a number, or a tree shaped like ``like``).

    Always fresh buffers, never ``init``'s own: a state sharing a buffer with the params cannot be donated.
    """
    if _tree.is_scalar(init):
        return _tree.accumulators(like, dtype, init)
    _tree.check_same_structure(call, like, init, "the values", "init")
    return jax.tree.map(lambda p, i: jnp.array(jnp.broadcast_to(i, jnp.shape(p)),
                                               dtype=_tree.accumulator_like(p, dtype).dtype, copy=True), like, init)
