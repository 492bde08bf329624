"""Arithmetic shared by the catalogue's kernels, so that each family file holds only its own algorithm.

Kernels compute in at least float32 (the widest of the dtypes involved, see
:func:`updax._tree.compute_dtype`) and store each result in the dtype of
what it replaces: an update in the update's dtype, a moment in the moment's
storage dtype. :func:`updax._leafwise.per_leaf` does that casting once for all of
them, and runs a rule written for one leaf over every leaf of the trees.

Complex numbers: second moments and norms use ``|g|² = (g·conj(g)).real``
(:func:`abs_sq`, plain ``g·g`` for real dtypes), so norms are real and first
moments keep their phase, as in optax. Accumulators keep the params' dtype,
so a complex ``nu`` holds real values with a zero imaginary part. A stage
whose rule needs an ordering or a sign rejects complex updates with
:func:`real_only`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from updax import _tree


def real_only(call: str, tree: Any, name: str = "updates") -> None:
    """Raises a TypeError naming ``call`` and the first complex leaf of ``tree``, if it has one.

    For the stages whose rule is not defined for complex numbers (a sign, an
    ordering, a clip by value) or not written for them; it runs at trace time.
    """
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if jnp.iscomplexobj(leaf):
            raise TypeError(f"{call}: complex {name} are not supported ({name}{jax.tree_util.keystr(path)} is "
                            f"{jnp.result_type(leaf)}); split them into real and imaginary parts, or see "
                            "'Complex numbers' in docs/concepts.md for the stages that support them")


def number(x: Any) -> float | None:
    """``x`` when it is a Python number (an option given as one), None when it is an array or a traced value (an
    option under ``jax.jit`` or a schedule's): what a kernel can decide while it is traced, such as dropping a
    guard that only a zero ``eps`` needs."""
    return x if type(x) in (int, float) else None


def abs_sq(x: jax.Array) -> jax.Array:
    """``|x|²``, real: ``x·x`` for a real ``x`` (bit for bit), ``(x·conj(x)).real`` for a complex one."""
    return (x * jnp.conj(x)).real if jnp.iscomplexobj(x) else x * x


@jax.custom_jvp
def safe_sqrt(x: Any) -> Any:
    """``sqrt(x)`` for ``x >= 0``, bit for bit, whose derivative at ``x = 0`` is taken as 0 instead of infinite.

    ``x`` is an array or a pytree of them (one call for a whole tree traces
    faster than one per leaf).

    The kernels take roots of sums of squares: norms, and second moments plus
    ``eps_root >= 0``. Where such a sum is 0 it is at its minimum, so its
    tangent is 0 and the step's derivative is finite, but ``jnp.sqrt``'s
    infinite one makes it ``0·∞ = NaN`` (at a zero update, a zero gradient
    history). Only along ``eps_root`` itself, at ``eps_root = 0``, is the
    one-sided derivative infinite where the numerator is not 0 as well; it is
    taken as 0 there too.
    """
    return jax.tree.map(jnp.sqrt, x)


@safe_sqrt.defjvp
def _safe_sqrt_jvp(primals, tangents):
    def leaf(x, dx):
        root = jnp.sqrt(x)
        nonzero = root != 0  # (not root > 0: a complex moment holding real values comes here too)
        return root, dx * jnp.where(nonzero, 0.5 / jnp.where(nonzero, root, 1.0), 0.0)

    (x,), (dx,) = primals, tangents
    treedef = jax.tree.structure(x)
    pairs = [leaf(a, b) for a, b in zip(treedef.flatten_up_to(x), treedef.flatten_up_to(dx))]
    return treedef.unflatten([r for r, _ in pairs]), treedef.unflatten([t for _, t in pairs])


def moment(decay: Any, old: jax.Array, new: jax.Array) -> jax.Array:
    """An exponential moving average's step: ``decay·old + (1 - decay)·new``."""
    return decay * old + (1 - decay) * new


def bias_corrections(count: jax.Array, *decays: Any) -> tuple[jax.Array, ...]:
    """``1 - decay^t`` for each decay, with ``t`` the (already incremented) step count."""
    t = _tree.float_count(count)
    return tuple(1 - decay**t for decay in decays)


def scaled(g: jax.Array, factor: Any) -> jax.Array:
    """``g·factor`` computed in at least float32, in ``g``'s dtype."""
    c = _tree.compute_dtype(g.dtype)
    return _tree.cast(factor * _tree.cast(g, c), g.dtype)


# --------------------------------------------------------------------------
# The trust ratio (LARS, LAMB, Fromage)


def _safe_norm(x: jax.Array, min_norm: Any) -> jax.Array:
    """``max(‖x‖, min_norm)``, real for a complex ``x``, with a finite gradient at ``x = 0``."""
    norm = safe_sqrt(jnp.sum(abs_sq(x)))
    return jnp.where(norm <= min_norm, min_norm, norm)


def trust_ratio(g: jax.Array, p: jax.Array, min_norm: Any, trust_coefficient: Any, eps: Any) -> jax.Array:
    """One leaf's trust ratio ``c·‖p‖ / (‖g‖ + eps)`` (1 when either norm is 0), real, at the compute precision."""
    c = _tree.compute_dtype(g.dtype, p.dtype)
    param_norm = _safe_norm(p.astype(c), min_norm)
    update_norm = _safe_norm(g.astype(c), min_norm)
    either_zero = (param_norm == 0) | (update_norm == 0)
    # Double where: the discarded branch divides by 1, not by a zero norm, so its gradient stays finite.
    ratio = trust_coefficient * param_norm / (jnp.where(either_zero, 1.0, update_norm) + eps)
    return jnp.where(either_zero, 1.0, ratio)


def trust_ratios(updates: Any, params: Any, min_norm: Any, trust_coefficient: Any, eps: Any) -> Any:
    """:func:`trust_ratio` of each leaf, as a tree shaped like ``updates``."""
    return _tree.tree_map("scale_by_trust_ratio", lambda g, p: trust_ratio(g, p, min_norm, trust_coefficient, eps),
                          updates, params, names=("updates", "params"))


def trust_scaled(g: jax.Array, ratio: jax.Array) -> jax.Array:
    """``g`` rescaled by its trust ratio, in ``g``'s dtype (a complex ``g`` keeps its phase: the ratio is real)."""
    c = _tree.compute_dtype(g.dtype, ratio.dtype)
    return (ratio.astype(c) * g.astype(c)).astype(g.dtype)


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
    A complex ``init`` (or leaf of it) is for complex values only: a real one would drop its imaginary part.
    """
    number = _tree.is_scalar(init) or isinstance(init, complex)
    if not number:
        _tree.check_same_structure(call, like, init, "the values", "init")
    leaves = jax.tree_util.tree_flatten_with_path(like)[0]
    for (path, p), i in zip(leaves, [init] * len(leaves) if number else jax.tree.leaves(init)):
        if jnp.iscomplexobj(i) and not jnp.iscomplexobj(p):
            raise TypeError(f"{call}: init{'' if number else jax.tree_util.keystr(path)} is complex but the values"
                            f"{jax.tree_util.keystr(path)} are real ({jnp.result_type(p)}): the imaginary part "
                            "would be dropped")
    if number:
        return _tree.accumulators(like, dtype, init)
    return jax.tree.map(lambda p, i: _tree.place_like(jnp.array(jnp.broadcast_to(i, jnp.shape(p)), copy=True,
                                                                dtype=dtype or _tree.compute_dtype(p.dtype)), p),
                        like, init)
