"""Pytree helpers shared by the primitives and the catalogue kernels."""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

_INT32_MAX = jnp.iinfo(jnp.int32).max


def _paths(tree):
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def first_difference(a, b, a_name: str, b_name: str) -> str:
    """Describes where two pytrees first differ, by path."""
    pa, pb = _paths(a), _paths(b)
    only_a = [p for p in pa if p not in set(pb)]
    only_b = [p for p in pb if p not in set(pa)]
    if only_a:
        return f"{only_a[0] or '<root>'} is in {a_name} but not in {b_name}"
    if only_b:
        return f"{only_b[0] or '<root>'} is in {b_name} but not in {a_name}"
    return (
        f"same leaf paths, different containers: {a_name} is {jax.tree.structure(a)}, "
        f"{b_name} is {jax.tree.structure(b)}"
    )


def check_same_structure(call: str, a, b, a_name: str, b_name: str) -> None:
    """Raises a ValueError naming the first differing path if ``a`` and ``b`` differ."""
    if jax.tree.structure(a) != jax.tree.structure(b):
        raise ValueError(f"{call}: {b_name} does not match {a_name}: {first_difference(a, b, a_name, b_name)}")


def tree_map(call: str, fn, tree, *rest, names=None):
    """``jax.tree.map`` whose structure errors name the call and the first differing path.

    ``names`` labels ``tree`` and each of ``rest`` in the message (default:
    ``updates``, then ``state[1]``, ``state[2]``, ...).
    """
    names = names or ("updates",) + tuple(f"state[{i}]" for i in range(1, len(rest) + 1))
    for other, name in zip(rest, names[1:]):
        check_same_structure(call, tree, other, names[0], name)
    return jax.tree.map(fn, tree, *rest)


def tree_map_unzip(call: str, fn, n_out: int, tree, *rest, names=None):
    """Like :func:`tree_map` for a ``fn`` returning ``n_out`` values per leaf: ``n_out`` trees."""
    treedef = jax.tree.structure(tree)
    out = treedef.flatten_up_to(tree_map(call, fn, tree, *rest, names=names))
    return tuple(treedef.unflatten([leaf[i] for leaf in out]) for i in range(n_out))


def safe_increment(count):
    """``count + 1`` that saturates at the int32 maximum instead of wrapping."""
    return jnp.where(count < _INT32_MAX, count + 1, _INT32_MAX).astype(count.dtype)


def wider(*dtypes):
    """The widest of some floating dtypes, without relying on the promotion mode.

    (Under ``jax.numpy_dtype_promotion("strict")`` even ``result_type`` refuses
    to mix bfloat16 and float32; the kernels cast explicitly instead.)
    """
    dtypes = [jnp.dtype(d) for d in dtypes]
    if any(jnp.issubdtype(d, jnp.complexfloating) for d in dtypes):
        with jax.numpy_dtype_promotion("standard"):
            return jnp.result_type(*dtypes)
    return max(dtypes, key=lambda d: d.itemsize)


def compute_dtype(*dtypes):
    """The dtype arithmetic runs in: at least float32 (bf16/f16 promote, f64 stays)."""
    return wider(jnp.float32, *dtypes)


def accumulator_like(leaf, dtype, fill=0.0):
    """A full-size accumulator for ``leaf``: ``dtype`` if given, else at least float32."""
    leaf = jnp.asarray(leaf)
    return jnp.full(leaf.shape, fill, dtype=dtype if dtype is not None else compute_dtype(leaf.dtype))


def accumulators(params, dtype, fill=0.0):
    """A tree of accumulators shaped like ``params`` (see :func:`accumulator_like`)."""
    return jax.tree.map(lambda p: accumulator_like(p, dtype, fill), params)


def is_scalar(value) -> bool:
    """A real number or a 0-d array (not a bool, not a tree)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, numbers.Real):
        return True
    return isinstance(value, (jax.Array, np.ndarray, np.generic)) and jnp.ndim(value) == 0


def zero_count():
    return jnp.zeros([], jnp.int32)
