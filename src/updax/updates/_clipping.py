"""Clipping and centring: bounds on the updates' values or on their global norm."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from updax import _tree
from updax import _validate as check
from updax._combinators import combinator
from updax._primitives import stateless
from updax._typing import PyTree, ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import abs_sq, real_only, safe_sqrt


def _apply_clip(updates, params, *, delta):
    real_only("clip", updates)  # complex numbers have no order to clip by

    def leaf(g):
        c = _tree.compute_dtype(g.dtype)  # (the bound, a JAX scalar or a schedule's value, is cast explicitly)
        bound = jnp.asarray(delta).astype(c)
        return jnp.clip(g.astype(c), -bound, bound).astype(g.dtype)

    return jax.tree.map(leaf, updates)


@combinator
def clip(delta: ScalarOrSchedule = 2.0) -> Update:
    """Clips every element of the updates to ``[-delta, delta]``.

    Update rule: ``u ← min(max(u, -delta), delta)``.

    Args:
        delta: the bound, >= 0. Default: ``2.0``.

    Returns:
        A stateless update object.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.clip(delta=1.0)
        >>> opt.update({"w": jnp.array([-3.0, 0.5, 2.0])}, opt.init(None))[0]["w"]
        Array([-1. ,  0.5,  1. ], dtype=float32)

    References:
        Axon.Updates.clip.
    """
    return stateless(_apply_clip, name="clip", options=dict(delta=check.nonnegative("clip", "delta", delta)),
                     schedulable=("delta",))


def global_norm(updates: PyTree) -> jax.Array:
    """The L2 norm of all leaves together, computed in at least float32; real for complex leaves (from ``|g|²``)."""
    squares = [jnp.sum(abs_sq(g.astype(_tree.compute_dtype(g.dtype)))) for g in jax.tree.leaves(updates)]
    return safe_sqrt(sum(squares, jnp.zeros([], jnp.float32)))  # (a finite gradient at a zero update)


def _apply_clip_by_global_norm(updates, params, *, max_norm):
    norm = global_norm(updates)
    # One scalar factor, so the rescaling is a cheap multiply that XLA fuses into whatever
    # consumes the updates next instead of materialising a clipped copy of them.
    factor = jnp.where(norm < max_norm, 1.0, max_norm / jnp.where(norm < max_norm, 1.0, norm))

    def leaf(g):
        c = _tree.compute_dtype(g.dtype)
        return (g.astype(c) * factor.astype(c)).astype(g.dtype)

    return jax.tree.map(leaf, updates)


@combinator
def clip_by_global_norm(max_norm: ScalarOrSchedule = 1.0) -> Update:
    """Rescales the updates so that their global L2 norm is at most ``max_norm``.

    Update rule: ``u ← u`` if ``‖u‖ < max_norm``, else ``u ← u / ‖u‖ · max_norm``,
    where ``‖u‖`` is the norm of all leaves together.

    Args:
        max_norm: the largest norm let through, > 0. Default: ``1.0``.

    Returns:
        A stateless update object.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.clip_by_global_norm(max_norm=1.0)
        >>> opt.update({"a": jnp.array([3.0]), "b": jnp.array([4.0])}, opt.init(None))[0]
        {'a': Array([0.6], dtype=float32), 'b': Array([0.8], dtype=float32)}

    References:
        Pascanu et al., "On the difficulty of training recurrent neural
        networks", ICML 2013. https://arxiv.org/abs/1211.5063
    """
    max_norm = check.positive("clip_by_global_norm", "max_norm", max_norm)
    return stateless(_apply_clip_by_global_norm, name="clip_by_global_norm", options=dict(max_norm=max_norm),
                     schedulable=("max_norm",))


def _centralize_leaf(g):
    g = jnp.asarray(g)
    if g.ndim <= 1:
        return g
    c = _tree.compute_dtype(g.dtype)
    g32 = g.astype(c)
    return (g32 - jnp.mean(g32, axis=tuple(range(1, g.ndim)), keepdims=True)).astype(g.dtype)


def _apply_centralize(updates, params):
    return jax.tree.map(_centralize_leaf, updates)


@combinator
def centralize() -> Update:
    """Subtracts from each leaf of rank >= 2 its mean over all axes but the first.

    Update rule: ``u ← u - mean(u, axes=1..n-1)`` for leaves with ``ndim > 1``;
    vectors and scalars pass unchanged.

    Returns:
        A stateless update object.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.centralize()
        >>> opt.update({"w": jnp.array([[1.0, 3.0], [0.0, 0.0]])}, opt.init(None))[0]["w"]
        Array([[-1.,  1.],
               [ 0.,  0.]], dtype=float32)

    References:
        Yong et al., "Gradient Centralization: A New Optimization Technique for
        Deep Neural Networks", ECCV 2020. https://arxiv.org/abs/2004.01461
    """
    return stateless(_apply_centralize, name="centralize")
