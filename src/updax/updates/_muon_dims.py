"""Which axes of a leaf are Muon's matrix: ``MuonDimensionNumbers``, and leaves seen as batches of matrices.

A leaf with dimension numbers is a batch of matrices: its reduction axes
(flattened, in the order given) are the rows, its output axes the columns,
and every other axis is a batch axis (stacked layers of a scanned model,
attention heads, ...). Each matrix of the batch is treated on its own.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree
from updax._domains import Valid, fail


class MuonDimensionNumbers(NamedTuple):
    """Which axes of a weight form the matrix that Muon orthogonalises (optax.contrib's name and fields).

    For a layer ``y = x @ W`` the reduction axes of ``W`` are contracted with
    the input (the rows, fan-in) and the output axes index the output (the
    columns, fan-out): the default ``(0, 1)`` is a plain ``(in, out)``
    matrix. Each side is an axis or a tuple of axes (flattened in that
    order); negative axes count from the end. Every axis on neither side is a
    batch axis: each index into the batch axes is a matrix of its own, e.g.
    ``MuonDimensionNumbers(reduction_axis=1, output_axis=2)`` for layers
    stacked on axis 0, or ``MuonDimensionNumbers(0, (1, 2))`` for an
    ``(in, heads, head_dim)`` projection.
    """

    reduction_axis: int | tuple[int, ...] = 0
    output_axis: int | tuple[int, ...] = 1


#: The matrix of a leaf with two axes when no dimension numbers are given.
MATRIX = MuonDimensionNumbers(0, 1)


def is_spec(x: Any) -> bool:
    """A leaf of a dimension-numbers tree: dimension numbers, or None (not a matrix)."""
    return x is None or isinstance(x, MuonDimensionNumbers)


def _is_function(value: Any) -> bool:
    return callable(value) and not isinstance(value, MuonDimensionNumbers) and jax.tree.leaves(value) == [value]


def _axes(call: str, name: str, where: str, value: Any, side: str) -> int | tuple[int, ...]:
    def bad(what):
        fail(call, name, value, f"must hold integer axes: at {where or 'the root'} {side} {what}", TypeError)

    axes = value if isinstance(value, (tuple, list)) else (value,)
    if not axes:
        bad("is empty")
    for axis in axes:
        if isinstance(axis, bool) or not isinstance(axis, (numbers.Integral, np.integer)):
            bad(f"has {axis!r}")
    if len({int(a) for a in axes}) != len(axes):
        fail(call, name, value, f"names an axis twice: at {where or 'the root'} {side} is {value!r}")
    return tuple(int(a) for a in axes) if isinstance(value, (tuple, list)) else int(value)


def dimension_numbers(call: str, value: Any, name: str = "weight_dimension_numbers") -> Any:
    """None, a function of the params, or a pytree whose leaves are :class:`MuonDimensionNumbers` or None,
    with each side normalised to an int or a tuple of ints (checked: integers, no axis twice)."""
    if value is None or _is_function(value):
        return value

    def normalise(path, spec):
        where = jax.tree_util.keystr(path)
        if spec is None:
            return None
        if not isinstance(spec, MuonDimensionNumbers):
            fail(call, name, value, f"must be a pytree of MuonDimensionNumbers or None, or a function of the "
                 f"params returning one; at {where or 'the root'} it has {type(spec).__name__} {spec!r}", TypeError)
        rows = _axes(call, name, where, spec.reduction_axis, "reduction_axis")
        cols = _axes(call, name, where, spec.output_axis, "output_axis")
        if set(np.atleast_1d(rows).tolist()) & set(np.atleast_1d(cols).tolist()):
            fail(call, name, value, f"must name different axes on each side: at {where or 'the root'} it is "
                 f"{spec!r}")
        return MuonDimensionNumbers(rows, cols)

    return jax.tree_util.tree_map_with_path(normalise, value, is_leaf=is_spec)


def _dimension_numbers_rule(call: str, name: str, value: Any) -> Any:
    return dimension_numbers(call, value, name)


#: The domain of a ``weight_dimension_numbers`` option: :func:`dimension_numbers`' rule.
DIMENSION_NUMBERS = Valid(rule=_dimension_numbers_rule, text="must be a pytree of MuonDimensionNumbers or None, or a "
                          "function of the params returning one")


#: A leaf's matrix: (batch axes, reduction axes, output axes), each a tuple of non-negative axes.
Axes = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def _leaf_axes(call: str, where: str, x: Any, spec: MuonDimensionNumbers) -> Axes:
    ndim = jnp.ndim(x)
    sides = []
    for side in spec:
        axes = side if isinstance(side, tuple) else (side,)
        if any(not -ndim <= a < ndim for a in axes):
            raise ValueError(f"{call}: weight_dimension_numbers{where} is {spec!r}, but updates{where} has shape "
                             f"{jnp.shape(x)}: an axis is out of range")
        sides.append(tuple(a % ndim for a in axes))
    rows, cols = sides
    if set(rows) & set(cols):
        raise ValueError(f"{call}: weight_dimension_numbers{where} is {spec!r}, which names axis "
                         f"{min(set(rows) & set(cols))} on both sides for updates{where} of shape "
                         f"{jnp.shape(x)}")
    batch = tuple(a for a in range(ndim) if a not in rows and a not in cols)
    return batch, rows, cols


def leaf_axes(call: str, spec: Any, updates: Any, params: Any = None) -> list[Axes | None]:
    """Each leaf's matrix axes (None: not a matrix), in the order of ``jax.tree.leaves(updates)``.

    ``spec`` is an option checked by :func:`dimension_numbers`. None makes
    every leaf with two axes an ``(in, out)`` matrix. A function is called on
    the params (the updates when there are none; only shapes matter). A tree
    may be a prefix of the updates: an entry applies to its whole subtree, and
    entries over None (leaves another ``partition`` group holds) are dropped.
    """
    flat = jax.tree_util.tree_flatten_with_path(updates)[0]
    if spec is None:
        return [((), (0,), (1,)) if jnp.ndim(x) == 2 else None for _, x in flat]
    if _is_function(spec):
        spec = dimension_numbers(call, spec(updates if params is None else params),
                                 "weight_dimension_numbers(params)")
    treedef = jax.tree.structure(spec, is_leaf=is_spec)
    try:
        subtrees = treedef.flatten_up_to(updates)
    except (ValueError, TypeError):
        shown = jax.tree.map(lambda s: 0, spec, is_leaf=is_spec)
        raise ValueError(f"{call}: weight_dimension_numbers does not match the updates: "
                         f"{_tree.first_difference(updates, shown, 'updates', 'weight_dimension_numbers')}") from None
    specs = [s for s, sub in zip(jax.tree.leaves(spec, is_leaf=is_spec), subtrees)
             for _ in jax.tree.leaves(sub)]
    return [None if s is None else _leaf_axes(call, jax.tree_util.keystr(path), x, s)
            for (path, x), s in zip(flat, specs)]


def as_matrices(x: jax.Array, axes: Axes) -> jax.Array:
    """``x`` seen as a batch of matrices ``(*batch, rows, cols)``: its batch axes first, then its reduction axes
    flattened into the rows and its output axes into the columns. On a mesh the matrix axes are gathered first
    (the products contract them) and the batch axes keep their sharding."""
    batch, rows, cols = axes
    order = batch + rows + cols
    gathered = _tree.place_like(x, x, dims=tuple(a if a in batch else None for a in range(x.ndim)))
    if order != tuple(range(x.ndim)):
        gathered = jnp.transpose(gathered, order)
    lead = tuple(x.shape[a] for a in batch)
    return gathered.reshape(lead + (math.prod(x.shape[a] for a in rows), math.prod(x.shape[a] for a in cols)))


def from_matrices(y: jax.Array, x: jax.Array, axes: Axes) -> jax.Array:
    """Matrices ``y`` as :func:`as_matrices` gives them for ``x``, back in ``x``'s shape and axis order, and split
    as ``x`` is."""
    batch, rows, cols = axes
    order = batch + rows + cols
    out = y.reshape(tuple(x.shape[a] for a in order))
    if order != tuple(range(x.ndim)):
        out = jnp.transpose(out, tuple(int(a) for a in np.argsort(order)))
    return _tree.place_like(out, x)


def on_matrices(fn: Callable[[jax.Array], jax.Array], x: jax.Array, axes: Axes) -> jax.Array:
    """``fn`` on ``x`` seen as a batch of matrices ``(*batch, rows, cols)`` (:func:`as_matrices`); the result
    shaped and placed like ``x`` (:func:`from_matrices`), so each device works on its own matrices."""
    return from_matrices(fn(as_matrices(x, axes)), x, axes)


def fans(x: Any, axes: Axes) -> tuple[int, int]:
    """``(fan_in, fan_out)``: the sizes of a leaf's matrix, rows by columns."""
    _, rows, cols = axes
    shape = jnp.shape(x)
    return math.prod(shape[a] for a in rows), math.prod(shape[a] for a in cols)

