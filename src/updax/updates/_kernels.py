"""Arithmetic shared by the catalogue's kernels, so that each family file holds only its own algorithm.

Kernels compute in at least float32 (the widest of the dtypes involved, see
:func:`updax._tree.compute_dtype`) and store each result in the dtype of
what it replaces: an update in the update's dtype, a moment in the moment's
storage dtype. :func:`per_leaf` does that casting once for all of them.

Complex numbers: second moments and norms use ``|g|² = (g·conj(g)).real``
(:func:`abs_sq`, plain ``g·g`` for real dtypes), so norms are real and first
moments keep their phase, as in optax. Accumulators keep the params' dtype,
so a complex ``nu`` holds real values with a zero imaginary part. A stage
whose rule needs an ordering or a sign rejects complex updates with
:func:`real_only`.
"""

from __future__ import annotations

import numbers
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
        outs = fn(*(_tree.cast(x, c) for x in xs))
        return tuple(store(call, name, out, x) for out, x, name in zip(outs, xs, names))

    n_out = len(trees) if n_out is None else n_out
    return _tree.tree_map_unzip(call, leaf, n_out, *trees, names=tuple(names))


def per_leaf_rooted(call: str, before: Callable[..., tuple], after: Callable[..., tuple], trees: Sequence[Any],
                    names: Sequence[str], n_out: int | None = None) -> tuple:
    """:func:`per_leaf` for a kernel that takes one square root per leaf: all the roots in one :func:`safe_sqrt`.

    ``before`` receives each tree's leaf in the compute dtype, as
    :func:`per_leaf`'s ``fn``, and returns ``(radicand, *carry)``;
    ``after(root, *carry)`` returns the outputs, stored as :func:`per_leaf`
    stores them. The values are those of one function doing both with
    ``safe_sqrt(radicand)`` between them. The difference is the tracing:
    ``safe_sqrt``'s custom derivative traces a sub-program at every call,
    about 0.8 ms a call on the benchmark machine (0.12 ms a leaf for one
    call on a tree of 384 leaves), the largest single item of an Adam-like
    leaf's tracing.
    """
    treedef, columns = _tree.side_by_side(call, tuple(trees), tuple(names))
    firsts = []
    for xs in columns:
        c = _tree.compute_dtype(*(x.dtype for x in xs))
        firsts.append(before(*(_tree.cast(x, c) for x in xs)))
    roots = safe_sqrt([first[0] for first in firsts]) if firsts else []
    outs = [tuple(store(call, name, out, x) for out, x, name in zip(after(root, *first[1:]), xs, names))
            for root, first, xs in zip(roots, firsts, columns)]
    n_out = len(trees) if n_out is None else n_out
    return tuple(treedef.unflatten([out[i] for out in outs]) for i in range(n_out))


def store(call: str, name: str, out: jax.Array, like: jax.Array) -> jax.Array:
    """``out`` in the dtype of ``like``, the leaf it replaces; a complex ``out`` for a real ``like`` is refused
    by name (its imaginary part would be dropped)."""
    if jnp.iscomplexobj(out) and not jnp.iscomplexobj(like):
        raise TypeError(f"{call}: {name} is stored as {like.dtype} but holds complex values; keep the "
                        "accumulators of complex params complex (leave the *_dtype option at None)")
    return _tree.cast(out, like.dtype)


def real_only(call: str, tree: Any, name: str = "updates") -> None:
    """Raises a TypeError naming ``call`` and the first complex leaf of ``tree``, if it has one.

    For the stages whose rule is not defined for complex numbers (a sign, an
    ordering, a clip by value) or not written for them; it runs at trace time.
    """
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if jnp.iscomplexobj(leaf):
            raise TypeError(f"{call}: complex {name} are not supported ({name}{jax.tree_util.keystr(path)} is "
                            f"{jnp.result_type(leaf)}); split them into real and imaginary parts, or see "
                            "'Complex numbers' in docs/guide.md for the stages that support them")


# --------------------------------------------------------------------------
# Arithmetic that traces fast. jax.numpy's operators are jitted functions: while a step is traced, each one
# is traced again for every new leaf shape, which on a model of a thousand leaf shapes is most of the tracing
# (and, eagerly, a small program per shape). lax's primitives bind directly. The helpers below take them
# where the operands' dtypes already agree (arrays of one dtype, or a Python float with an array of the
# default float dtype) and their shapes need no broadcasting but a 0-d operand's, which gives the same numbers
# as jax.numpy's promotion, and jax.numpy otherwise (tests/test_tracing.py checks both against jax.numpy's).


def number(x: Any) -> float | None:
    """``x`` when it is a Python number (an option given as one), None when it is an array or a traced value (an
    option under ``jax.jit`` or a schedule's): what a kernel can decide while it is traced, such as dropping a
    guard that only a zero ``eps`` needs."""
    return x if type(x) in (int, float) else None


def _lax_ready(a: Any, b: Any) -> bool:
    da, db = getattr(a, "dtype", None), getattr(b, "dtype", None)
    if da is not None and db is not None:
        # (lax broadcasts a 0-d operand only)
        same_shape = a.shape == b.shape or not a.shape or not b.shape
        return da == db and not jnp.issubdtype(da, jnp.integer) and same_shape
    dtype, other = (da, b) if da is not None else (db, a)
    return type(other) is float and dtype == jax.dtypes.canonicalize_dtype(float)


def mul(a: Any, b: Any) -> Any:
    """``a * b``."""
    return jax.lax.mul(a, b) if _lax_ready(a, b) else a * b


def add(a: Any, b: Any) -> Any:
    """``a + b``."""
    return jax.lax.add(a, b) if _lax_ready(a, b) else a + b


def sub(a: Any, b: Any) -> Any:
    """``a - b``."""
    return jax.lax.sub(a, b) if _lax_ready(a, b) else a - b


def div(a: Any, b: Any) -> Any:
    """``a / b`` (for floating operands)."""
    return jax.lax.div(a, b) if _lax_ready(a, b) else a / b


def maximum(a: Any, b: Any) -> Any:
    """``jnp.maximum(a, b)``."""
    return jax.lax.max(a, b) if _lax_ready(a, b) else jnp.maximum(a, b)


def minimum(a: Any, b: Any) -> Any:
    """``jnp.minimum(a, b)``."""
    return jax.lax.min(a, b) if _lax_ready(a, b) else jnp.minimum(a, b)


def clip(x: Any, low: Any, high: Any) -> Any:
    """``jnp.clip(x, low, high)``: ``min(max(x, low), high)``."""
    return minimum(maximum(x, low), high)


def _on_a_mesh(x: Any) -> bool:
    """Whether ``x`` is an array typed with a sharding over a mesh (JAX's explicit sharding)."""
    if not hasattr(x, "dtype"):
        return False
    mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
    return mesh is not None and not mesh.empty


def where(cond: Any, x: Any, y: Any) -> Any:
    """``jnp.where(cond, x, y)``.

    lax's select where ``cond`` is a boolean array, ``x`` and ``y`` agree in
    dtype as for :func:`mul`, and each of the three is a scalar or of the one
    shape of the others; jax.numpy's otherwise.
    """
    shapes = {jnp.shape(a) for a in (cond, x, y)} - {()}
    if (getattr(cond, "dtype", None) != jnp.bool_ or len(shapes) > 1 or not _lax_ready(x, y)
            or any(_on_a_mesh(a) for a in (cond, x, y))):
        return jnp.where(cond, x, y)  # (on a mesh, jax.numpy's select reconciles the operands' shardings)
    shape = shapes.pop() if shapes else ()
    dtype = x.dtype if hasattr(x, "dtype") else y.dtype
    x, y = (a if jnp.shape(a) == shape and hasattr(a, "dtype") else jax.lax.full(shape, a, dtype) for a in (x, y))
    return jax.lax.select(cond, x, y)


def sqrt(x: jax.Array) -> jax.Array:
    """``jnp.sqrt(x)``."""
    return jax.lax.sqrt(x) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.sqrt(x)


def sign(x: jax.Array) -> jax.Array:
    """``jnp.sign(x)``."""
    return jax.lax.sign(x) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.sign(x)


def absolute(x: jax.Array) -> jax.Array:
    """``jnp.abs(x)``."""
    return jax.lax.abs(x) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.abs(x)


def abs_sq(x: jax.Array) -> jax.Array:
    """``|x|²``, real: ``x·x`` for a real ``x`` (bit for bit), ``(x·conj(x)).real`` for a complex one."""
    return (x * jnp.conj(x)).real if jnp.iscomplexobj(x) else mul(x, x)


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
    return jax.tree.map(sqrt, x)


@safe_sqrt.defjvp
def _safe_sqrt_jvp(primals, tangents):
    def leaf(x, dx):
        root = sqrt(x)
        nonzero = root != 0  # (not root > 0: a complex moment holding real values comes here too)
        return root, dx * jnp.where(nonzero, 0.5 / jnp.where(nonzero, root, 1.0), 0.0)

    (x,), (dx,) = primals, tangents
    treedef = jax.tree.structure(x)
    pairs = [leaf(a, b) for a, b in zip(treedef.flatten_up_to(x), treedef.flatten_up_to(dx))]
    return treedef.unflatten([r for r, _ in pairs]), treedef.unflatten([t for _, t in pairs])


def moment(decay: Any, old: jax.Array, new: jax.Array) -> jax.Array:
    """An exponential moving average's step: ``decay·old + (1 - decay)·new``."""
    return add(mul(decay, old), mul(complement(decay, new), new))


def complement(decay: Any, like: Any, dtype: Any = None, default: Any = None) -> Any:
    """``1 - decay`` (or ``default``), the weight of the new value in an exponential moving average; where it
    equals ``decay`` (``0.5``) and ``like`` (an array or a tree) is traced for the CPU, a scalar of ``dtype``
    (default: ``like``'s) that XLA cannot see through.

    XLA's simplifier writes ``0.5·old + 0.5·new`` as ``0.5·(old + new)`` and then folds that ``0.5`` into the
    scalar a reader multiplies the new average by (Adam's ``m / (1 - b1^t)``). The params' kernel then holds
    no copy of the new average to read: it recomputes it from the old one, which it reads after the kernel
    that writes the new average into the same buffer, and XLA copies the old average on every step (as in
    optax's step; DCGAN's ``adam(b1=0.5)``, ``adan(b2=0.5)``). Behind an optimization barrier the two
    weights are two values to the simplifier, and the step is the eager step's ``0.5·old + 0.5·new``: the
    same numbers as the factored form but where ``old + new`` overflows or the halves fall below the
    normal range.
    """
    if isinstance(decay, numbers.Real) and 1 - decay == decay and _tree.traced_for_cpu(like):
        return jax.lax.optimization_barrier(jnp.asarray(1 - decay, like.dtype if dtype is None else dtype))
    return 1 - decay if default is None else default


def bias_corrections(count: jax.Array, *decays: Any) -> tuple[jax.Array, ...]:
    """``1 - decay^t`` for each decay, with ``t`` the (already incremented) step count."""
    t = _tree.float_count(count)
    return tuple(1 - decay**t for decay in decays)


def adam_direction(m: jax.Array, v: jax.Array, c1: Any, c2: Any, eps: Any, eps_root: Any) -> jax.Array:
    """Adam's step from the new moments and the bias corrections: ``m̂ / (sqrt(v̂ + eps_root) + eps)``."""
    return div(div(m, c1), add(safe_sqrt(add(div(v, c2), eps_root)), eps))


@jax.jit
def adam_directions(mu: Any, nu: Any, c1: Any, c2: Any, eps: Any, eps_root: Any) -> Any:
    """:func:`adam_direction` over whole trees of new moments, as one jitted function.

    Under ``jax.jit`` it is inlined and XLA fuses it with the moments' kernels
    as before. Eagerly it is one small program for the whole tree, where the
    formula op by op is four (two divisions by a scalar, a root, a division)
    for every distinct leaf shape: optax's ``tree_bias_correction`` does the
    same. Eager numbers are therefore XLA's, as under ``jax.jit``: it divides
    by a scalar as a multiplication by its reciprocal, which can differ from
    the division in the last bit.
    """
    roots = safe_sqrt(jax.tree.map(lambda v: add(div(v, c2), eps_root), nu))  # (one root for the tree)
    return jax.tree.map(lambda m, root: div(div(m, c1), add(root, eps)), mu, roots)


def scaled(g: jax.Array, factor: Any) -> jax.Array:
    """``g·factor`` computed in at least float32, in ``g``'s dtype."""
    c = _tree.compute_dtype(g.dtype)
    return _tree.cast(mul(factor, _tree.cast(g, c)), g.dtype)


def ordered_after(x: jax.Array, token: jax.Array) -> jax.Array:
    """``x`` itself, as a value XLA can only compute once ``token`` is computed.

    ``x·(1 + (popcount(bits of token) >> 6))``: a 32-bit word has at most 32
    bits set, so the factor is exactly 1 and ``x`` keeps every value (signed
    zeros, infinities and NaNs too; a subnormal is flushed to zero on CPU, as
    by the arithmetic of any kernel it then feeds), but XLA sees a dependency
    it cannot fold away, where it drops an optimization barrier before it
    schedules. A kernel that reads ``ordered_after(g, token)`` is scheduled
    after whatever ``token`` comes from. A complex ``x`` is returned as it
    is (``x·(1+0j)`` is not ``x`` when a part is infinite), without the
    order.
    """
    if jnp.iscomplexobj(x):
        return x
    bits = jax.lax.bitcast_convert_type(jnp.asarray(token, jnp.float32), jnp.int32)
    zero = jax.lax.shift_right_logical(jax.lax.population_count(bits), jnp.int32(6))
    return mul((1 + zero).astype(x.dtype), x)


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
