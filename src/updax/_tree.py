"""Pytree helpers shared by the primitives and the catalogue kernels."""

from __future__ import annotations

import contextlib
import contextvars
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec, SingleDeviceSharding

from updax._domains import count_dtype


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


def side_by_side(call: str, trees, names):
    """The leaves of ``trees`` side by side (``[(leaf of each tree), ...]``) and the first tree's structure;
    a tree that does not match the first is named with ``call`` and its first differing path."""
    for tree, name in zip(trees[1:], names[1:]):
        check_same_structure(call, trees[0], tree, names[0], name)
    treedef = jax.tree.structure(trees[0])
    return treedef, list(zip(*(treedef.flatten_up_to(t) for t in trees)))


def tree_map_unzip(call: str, fn, n_out: int, tree, *rest, names=None):
    """Like :func:`tree_map` for a ``fn`` returning ``n_out`` values per leaf: ``n_out`` trees."""
    treedef = jax.tree.structure(tree)
    out = treedef.flatten_up_to(tree_map(call, fn, tree, *rest, names=names))
    return tuple(treedef.unflatten([leaf[i] for leaf in out]) for i in range(n_out))


def safe_increment(count):
    """``count + 1`` that saturates at its dtype's maximum (int32's, int64's under x64) instead of wrapping."""
    top = jnp.iinfo(count.dtype).max
    return jnp.where(count < top, count + 1, top).astype(count.dtype)


def cyclic_increment(count, period):
    """``count + 1`` that, at its dtype's maximum, steps back ``period - 1`` instead of wrapping.

    Past the maximum the count cycles through its last ``period`` values, so
    ``count % period`` keeps advancing by one per step: a ring-buffer slot or
    a phase of ``period`` steps stays right forever. With ``period = 1`` it
    is :func:`safe_increment`.
    """
    back = jnp.asarray(period, count.dtype) - 1
    return jnp.where(count < jnp.iinfo(count.dtype).max, count + 1, count - back).astype(count.dtype)


def float_count(count):
    """A step count as the default float: float32, or float64 with ``jax_enable_x64`` (so that float64
    optimizers' bias corrections are float64-accurate)."""
    return count.astype(jax.dtypes.canonicalize_dtype(jnp.float64))


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


def cast(x, dtype):
    """``x.astype(dtype)``, or ``x`` itself where that would change nothing: the kernels cast every leaf to the
    compute dtype and back, and while tracing even an astype to the same dtype costs a call into jax.numpy."""
    return x if x.dtype == dtype and not x.weak_type else x.astype(dtype)


def added(p, u):
    """``p + u`` in the wider of their dtypes, cast back to ``p``'s dtype and placed like ``p``: one param's
    update, as :func:`updax.apply_updates` computes it."""
    # The param's sharding too: an update sharded otherwise (ZeRO-1's, split over the data axis) is gathered.
    return place_like(summed(p, u), p)


def summed(p, u):
    """:func:`added` before it is placed like ``p``: the operations the in-place ordering repeats, for XLA to
    merge them with the step's own (updax._backend._order)."""
    wide = wider(p.dtype, u.dtype)
    return cast(jax.lax.add(cast(p, wide), cast(u, wide)), p.dtype)  # (one dtype: lax traces fastest)


def compute_dtype(*dtypes):
    """The dtype arithmetic runs in: at least float32 (bf16/f16 promote, f64 stays)."""
    return wider(jnp.float32, *dtypes)


# --------------------------------------------------------------------------
# Placement: state is created where its parameter lives


def sharding_like(like, dims=None):
    """The sharding of a new array derived from ``like``, or None to leave its placement to JAX.

    Axis ``i`` of the new array is split like axis ``dims[i]`` of ``like``
    (None: not split); ``dims=None`` means the same axes, ``dims=()`` a
    scalar replicated over ``like``'s mesh. A concrete ``like`` gives its
    own sharding (an uncommitted one: None, so the state stays uncommitted
    too). A traced ``like`` gives its sharding on an Explicit mesh, where it
    is part of the type; on an Auto mesh none is known at trace time (the
    jitted function's out_shardings or XLA's propagation decide).
    """
    if isinstance(like, jax.core.Tracer):
        sharding = getattr(jax.typeof(like), "sharding", None)
        if not isinstance(sharding, NamedSharding) or AxisType.Explicit not in sharding.mesh.axis_types:
            return None
    else:
        sharding = getattr(like, "sharding", None)
        if sharding is None or not getattr(like, "_committed", True):
            return None
        if not isinstance(sharding, NamedSharding):  # one device (any shape), or another sharding (same shape)
            return sharding if isinstance(sharding, SingleDeviceSharding) or dims is None else None
    if dims is None:
        return sharding
    spec = tuple(sharding.spec) + (None,) * (jnp.ndim(like) - len(sharding.spec))
    return NamedSharding(sharding.mesh, PartitionSpec(*(None if d is None else spec[d] for d in dims)))


#: False while only the shapes of new state are wanted (:func:`shapes_only`): placement ties are then skipped.
_PLACING = contextvars.ContextVar("updax_placing", default=True)


@contextlib.contextmanager
def shapes_only():
    """Within it, :func:`full` leaves out the placement ties it adds under jit: for ``jax.eval_shape`` of an
    ``init`` whose result only its shapes and dtypes are read from (each tie is a traced select per leaf)."""
    token = _PLACING.set(False)
    try:
        yield
    finally:
        _PLACING.reset(token)


def _tied(value, like):
    """``value`` (shaped like ``like``) placed like ``like`` under jit on an Auto mesh, where no sharding is known
    while tracing: a select on a constant true, which XLA's sharding propagation reads before its simplifier
    folds it to ``value``; the compiled step does not read ``like``. (``jnp.where``, not ``lax.select``: its
    select sits in a call of its own, which keeps it until propagation; tests/sharding_checks.py checks it.)"""
    if jnp.iscomplexobj(like) and not jnp.iscomplexobj(value):
        like = like.real
    return jnp.where(True, value, like.astype(value.dtype))


def full(shape, fill, dtype, like, dims=None):
    """``jnp.full(shape, fill, dtype)`` created directly with the sharding :func:`sharding_like` gives (under jit
    on an Auto mesh, placed like ``like`` when it has ``like``'s shape)."""
    sharding = sharding_like(like, dims)
    if sharding is None:
        value = jnp.full(shape, fill, dtype)
        tie = isinstance(like, jax.core.Tracer) and dims is None and tuple(shape) == like.shape and _PLACING.get()
        return _tied(value, like) if tie else value
    if isinstance(like, jax.core.Tracer):
        return jnp.full(shape, fill, dtype, out_sharding=sharding)
    return jnp.full(shape, fill, dtype, device=sharding)


def zeros_like(x):
    """``jnp.zeros_like(x)``, placed like ``x`` also under jit on an Auto mesh."""
    return full(jnp.shape(x), 0, jnp.result_type(x), x)


def place_like(x, like, dims=None):
    """``x`` (a new value derived from ``like``) with the sharding :func:`sharding_like` gives."""
    sharding = sharding_like(like, dims)
    if sharding is None:
        return x
    if isinstance(like, jax.core.Tracer):
        same = getattr(jax.typeof(x), "sharding", None) == sharding
        return x if same else jax.sharding.reshard(x, sharding)
    return x if getattr(x, "sharding", None) == sharding else jax.device_put(x, sharding)


def onto_mesh_of(state, params):
    """``state`` with its uncommitted leaves (a stage's own counts and scalars) replicated over the mesh of
    ``params``' first sharded leaf, if one is: then every leaf of the state is on that mesh, and the state's
    shardings can be given to ``jax.jit`` as they are. Eager only; a traced state is left alone."""
    mesh = next((x.sharding.mesh for x in jax.tree.leaves(params)
                 if not isinstance(x, jax.core.Tracer) and isinstance(getattr(x, "sharding", None), NamedSharding)),
                None)
    if mesh is None:
        return state
    replicated = NamedSharding(mesh, PartitionSpec())

    def place(x):
        loose = isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) and not x._committed
        return jax.device_put(x, replicated) if loose else x

    return jax.tree.map(place, state)


def zeros_of(struct):
    """Zeros of a ``jax.ShapeDtypeStruct``, with its sharding when it has one on an Explicit mesh (the type of
    a value traced there)."""
    sharding = getattr(struct, "sharding", None)
    if isinstance(sharding, NamedSharding) and AxisType.Explicit in sharding.mesh.axis_types:
        return jnp.zeros(struct.shape, struct.dtype, out_sharding=sharding)
    return jnp.zeros(struct.shape, struct.dtype)


def accumulator_like(leaf, dtype, fill=0.0):
    """A full-size accumulator for ``leaf``, sharded like it: ``dtype`` if given, else at least float32."""
    leaf = leaf if isinstance(leaf, jax.Array) else jnp.asarray(leaf)
    return full(leaf.shape, fill, dtype if dtype is not None else compute_dtype(leaf.dtype), leaf)


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
    """A step counter at 0: int32, or int64 under ``jax_enable_x64`` (counting past 2**31 - 1)."""
    return jnp.zeros([], count_dtype())


# --------------------------------------------------------------------------
# Fitting trees to each other, with messages that name the path


def _children(x):
    """``[(path suffix, child), ...]`` of a pytree node, or None for a leaf."""
    try:
        keyed, _ = jax.tree_util.flatten_one_level_with_keys(x)
    except ValueError:
        return None
    if hasattr(x, "_fields"):
        return [(f".{field}", child) for field, (_, child) in zip(x._fields, keyed)]
    return [(jax.tree_util.keystr((key,)), child) for key, child in keyed]


def describe(x) -> str:
    """A short description of a pytree node or leaf, for error messages."""
    if hasattr(x, "_fields"):
        return f"{type(x).__name__}({', '.join(x._fields)})"
    if isinstance(x, dict):
        return f"a dict with keys {sorted(map(str, x))}"
    if isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of length {len(x)}"
    if x is None:
        return "None"
    shape = getattr(x, "shape", None)
    if shape is not None:
        return f"an array of shape {tuple(shape)}"
    return f"a {type(x).__name__}"


def shape_of(x) -> tuple:
    shape = getattr(x, "shape", None)
    return tuple(shape) if shape is not None else np.shape(x)


def mismatch(expected, actual, path: str = ""):
    """The first place where ``actual`` differs from ``expected`` in containers or leaf shapes.

    Returns None when they fit, else ``(path, what expected has, what actual has)``.
    """
    if jax.tree.structure(expected) == jax.tree.structure(actual):
        pairs = zip(jax.tree_util.tree_flatten_with_path(expected)[0], jax.tree.leaves(actual))
        for (where, e), a in pairs:
            if shape_of(e) != shape_of(a):
                return path + jax.tree_util.keystr(where), f"shape {shape_of(e)}", f"shape {shape_of(a)}"
        return None
    return _first_mismatch(expected, actual, path)


def _first_mismatch(expected, actual, path):
    ec, ac = _children(expected), _children(actual)
    if ec == [] and ac == []:  # two empty nodes (EmptyState, (), None): nothing to mismatch
        return None
    if ec is None and ac is None:
        es, as_ = shape_of(expected), shape_of(actual)
        return None if es == as_ else (path, f"shape {es}", f"shape {as_}")
    if isinstance(expected, dict) and isinstance(actual, dict) and type(expected) is type(actual):
        for key in sorted(set(expected) ^ set(actual), key=str):  # name the first key only one of them has
            where = path + jax.tree_util.keystr((jax.tree_util.DictKey(key),))
            if key in expected:
                return where, describe(expected[key]), "nothing"
            return where, "nothing", describe(actual[key])
    if isinstance(expected, list) and type(expected) is type(actual) and len(expected) != len(actual):
        n = min(len(expected), len(actual))  # name the first element only one of them has
        where = f"{path}[{n}]"
        return (where, "nothing", describe(actual[n])) if n == len(expected) else \
            (where, describe(expected[n]), "nothing")
    if ec is None or ac is None or type(expected) is not type(actual) or [k for k, _ in ec] != [k for k, _ in ac]:
        return path or "<root>", describe(expected), describe(actual)
    for (key, e), (_, a) in zip(ec, ac):
        found = _first_mismatch(e, a, path + key)
        if found:
            return found
    return None


def as_arrays(call: str, tree, name: str, *, floating: bool = False):
    """``tree`` with Python and NumPy scalars as JAX arrays; with ``floating``, every leaf must be floating or
    complex (integer and boolean updates would be silently truncated by the kernels)."""
    def array(where, x):
        if isinstance(x, jax.Array):
            return x
        try:
            return jnp.asarray(x)
        except TypeError:
            raise TypeError(f"{call}: {name}{jax.tree_util.keystr(where)} is {x!r}; the leaves of {name} must be "
                            "arrays or numbers") from None

    if not all(isinstance(x, jax.Array) for x in jax.tree.leaves(tree)):
        tree = jax.tree_util.tree_map_with_path(array, tree)
    if floating:
        for where, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            if not jnp.issubdtype(leaf.dtype, jnp.inexact):
                raise TypeError(f"{call}: {name}{jax.tree_util.keystr(where)} has dtype {leaf.dtype}; {name} must be "
                                "floating point or complex (cast them, e.g. with .astype(jnp.float32), or leave "
                                "integer leaves out of what the optimizer sees)")
    return tree
