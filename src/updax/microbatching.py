r"""Microbatching: a function of a batch evaluated one microbatch at a time, its results accumulated.

When ``fun(batch)`` does not fit in memory (a gradient over a large batch),
:func:`microbatch` returns a function that splits the batch arguments into
$n$ microbatches of ``microbatch_size`` rows, calls ``fun`` on each in turn
(a ``lax.fori_loop``: one at a time, so memory holds one microbatch's
intermediates) and combines the results by an accumulator: their sum, their
mean, their concatenation (the full batch's rows back in order), or your
own :class:`Accumulator`. Per-microbatch accumulators can differ across
``fun``'s outputs: give a pytree of them shaped like a prefix of the output.

>>> import jax, jax.numpy as jnp
>>> import updax as ux
>>> def loss(w, x, y):
...     return jnp.sum((x @ w - y) ** 2)
>>> w, x, y = jnp.ones(3), jnp.ones((8, 3)), jnp.arange(8.0)
>>> grad = ux.microbatching.microbatch(jax.grad(loss), argnums=(1, 2), microbatch_size=2)
>>> grad(w, x, y), jax.grad(loss)(w, x, y)  # the sum over 4 microbatches is the full batch's gradient
(Array([-8., -8., -8.], dtype=float32), Array([-8., -8., -8.], dtype=float32))

Microbatch $i$ of $n$ holds the rows $i, i + n, i + 2n, \dots$ of the batch
(a column-major split, as optax's): a batch sharded along its rows keeps
each microbatch sharded the same way, and ``"concat"`` puts the rows back
in their order.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree
from updax import _validate as check
from updax._domains import fail, is_concrete
from updax._typing import PyTree

__all__ = ["Accumulator", "microbatch", "reshape_batch_axis"]


class Accumulator(NamedTuple):
    r"""How :func:`microbatch` combines the results of one output of ``fun`` over the microbatches.

    Given the microbatches' values $x_0, \dots, x_{n-1}$ of that output, the
    result is::

        carry = init(shape)            # shape: a jax.ShapeDtypeStruct of one value
        for i in range(n):
            carry = update(carry, x_i, i)
        result = finalize(carry)

    ``"sum"``, ``"mean"``, ``"running_mean"`` and ``"concat"`` name the
    built-in ones. Its fields: ``init``, ``shape -> carry``, the carry
    before the first microbatch; ``update``, ``(carry, value, index) ->
    carry``, jittable; ``finalize``, ``carry -> result``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> largest = ux.microbatching.Accumulator(
        ...     init=lambda s: jnp.full(s.shape, -jnp.inf, s.dtype),
        ...     update=lambda carry, x, i: jnp.maximum(carry, x),
        ...     finalize=lambda carry: carry)
        >>> ux.microbatching.microbatch(jnp.sum, 0, 2, largest)(jnp.arange(8.0))  # sums 4, 6, 8, 10
        Array(10., dtype=float32)
    """

    init: Callable[[jax.ShapeDtypeStruct], Any]
    update: Callable[[Any, Any, jax.Array], Any]
    finalize: Callable[[Any], Any]


def _accumulating(x):
    """The dtype a sum of values of dtype ``x`` is kept in: floats in at least float32, others as they are."""
    return _tree.compute_dtype(x) if jnp.issubdtype(x, jnp.inexact) else x


def _sum(dtype):
    """The sum, kept in at least float32 for floats and returned in ``dtype``."""
    return Accumulator(init=lambda s: jnp.zeros(s.shape, _accumulating(s.dtype)),
                       update=lambda carry, x, i: carry + jnp.asarray(x).astype(carry.dtype),
                       finalize=lambda carry: carry.astype(dtype))


def _concat(num_microbatches):
    def init(s):
        return jnp.zeros((num_microbatches, *s.shape), s.dtype)

    def update(carry, x, i):
        return jax.lax.dynamic_update_index_in_dim(carry, jnp.asarray(x, carry.dtype), i, 0)

    def finalize(carry):
        if carry.ndim == 1:  # scalar values: one per microbatch, in the microbatches' order
            return carry
        # carry[i, j] is row i + n·j of the batch: (n, m, ...) -> (m, n, ...) -> (m·n, ...)
        stacked = jnp.swapaxes(carry, 0, 1)
        return stacked.reshape((stacked.shape[0] * stacked.shape[1], *stacked.shape[2:]))

    return Accumulator(init=init, update=update, finalize=finalize)


def _built_in(name: str, num_microbatches: int, count: Any, dtype: Any) -> Accumulator:
    """The accumulator ``name`` for values of ``dtype``, over ``count`` microbatches of ``num_microbatches``."""
    if name == "concat":
        return _concat(num_microbatches)
    total = _sum(dtype)
    if name == "sum":
        return total
    mean_dtype = dtype if jnp.issubdtype(dtype, jnp.inexact) else jnp.float32  # (the mean of integers: a float)
    kept = _accumulating(mean_dtype)
    if name == "mean":
        return Accumulator(init=lambda s: jnp.zeros(s.shape, kept), update=total.update,
                           finalize=lambda carry: (carry / jnp.asarray(count).astype(kept)).astype(mean_dtype))

    def running(carry, x, i):  # the mean of the first i + 1 values, kept in place of a sum
        x = jnp.asarray(x).astype(kept)
        return carry + (x - carry) / (jnp.asarray(i) + 1).astype(kept)

    return Accumulator(init=lambda s: jnp.zeros(s.shape, kept), update=running,
                       finalize=lambda carry: carry.astype(mean_dtype))


_NAMES = ("sum", "mean", "running_mean", "concat")


def _is_accumulator(value: Any) -> bool:
    return isinstance(value, Accumulator) or isinstance(value, str)


def _indices(call: str, name: str, value: Any, kind: type) -> tuple:
    """``value`` as a tuple: one ``kind`` or a sequence of them."""
    values = (value,) if isinstance(value, kind) else value
    if isinstance(value, bool) or not isinstance(values, (tuple, list)) or any(
            isinstance(v, bool) or not isinstance(v, kind) for v in values):
        what = "an int or a sequence of ints" if kind is numbers.Integral else "a str or a sequence of strs"
        fail(call, name, value, f"must be {what}", TypeError)
    return tuple(values)


def reshape_batch_axis(tree: PyTree, microbatch_size: int, axis: int = 0) -> PyTree:
    r"""Splits the batch axis of every leaf into ``(num_microbatches, microbatch_size)``, column-major.

    Row $b$ of the batch goes to ``[b mod n, b div n]`` ($n$ microbatches):
    microbatch $i$ holds the rows $i, i + n, \dots$, as :func:`microbatch`
    splits them, so that a batch sharded along its rows keeps each
    microbatch sharded the same way.

    Args:
        tree: a pytree of arrays, each with a batch axis ``axis`` whose size
            ``microbatch_size`` divides. No default.
        microbatch_size: the rows per microbatch, an integer >= 1.
            No default.
        axis: the batch axis (negative counts from the end). Default: ``0``.

    Returns:
        ``tree`` with each leaf's batch axis replaced by the two axes.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> ux.microbatching.reshape_batch_axis(jnp.arange(6), 2)  # 3 microbatches of 2 rows
        Array([[0, 3],
               [1, 4],
               [2, 5]], dtype=int32)

    References:
        optax.microbatching.reshape_batch_axis (same layout).
    """
    call = "reshape_batch_axis"
    microbatch_size = check.positive_int(call, "microbatch_size", microbatch_size)
    axis = check.integer(call, "axis", axis, low=-(2**31))

    def leaf(where, x):
        x = jnp.asarray(x)
        return _split_rows(call, f"tree{jax.tree_util.keystr(where)}", x, axis, microbatch_size)

    return jax.tree_util.tree_map_with_path(leaf, tree)


def _split_rows(call: str, where: str, x: jax.Array, axis: int, microbatch_size: int) -> jax.Array:
    """``x`` with its axis ``axis`` of size ``m·n`` replaced by ``(n, m)``: ``[i, j]`` is row ``i + n·j``."""
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{call}: {where} has shape {x.shape}, which has no batch axis {axis}")
    axis %= x.ndim
    size = x.shape[axis]
    if size % microbatch_size:
        raise ValueError(f"{call}: {where} has a batch of {size} along axis {axis}, which microbatch_size="
                         f"{microbatch_size} does not divide")
    n = size // microbatch_size
    split = x.reshape((*x.shape[:axis], microbatch_size, n, *x.shape[axis + 1:]))  # [j, i] is row j·n + i
    return jnp.swapaxes(split, axis, axis + 1)


def microbatch(fun: Callable[..., Any], argnums: int | Sequence[int], microbatch_size: int | None,
               accumulator: str | Accumulator | PyTree = "sum", *, argnames: str | Sequence[str] = (),
               in_axes: int | Sequence[int] = 0, num_real_microbatches: int | jax.Array | None = None
               ) -> Callable[..., Any]:
    r"""``fun`` evaluated on the microbatches of its batch arguments in turn, the results accumulated.

    With $x^{(0)}, \dots, x^{(n-1)}$ the microbatches (microbatch $i$ the rows
    $i, i + n, \dots$ of each batch argument) and $f$ = ``fun``, the result
    for an output of ``fun`` is, by its accumulator:

    $$
    \begin{align*}
    \text{sum}: &\ \sum_i f(x^{(i)}) \\
    \text{mean}: &\ \frac{1}{n} \sum_i f(x^{(i)}) \\
    \text{concat}: &\ \text{the rows of } f(x^{(0)}), \dots, f(x^{(n-1)}) \text{ back in the batch's order}
    \end{align*}
    $$

    (``"concat"`` of scalar outputs stacks them, one per microbatch.)
    ``"running_mean"`` is the mean too, kept as a running mean from step to
    step rather than a sum. Floating sums are kept in at least float32. The loop runs
    ``num_real_microbatches`` microbatches where it is given (the others
    are skipped and their rows ignored: a smaller batch padded to a fixed
    shape, without a recompile), and $n$ is then that number.

    Args:
        fun: the function of a batch. No default.
        argnums: the positions of the batch arguments (an int or a sequence
            of ints). No default.
        microbatch_size: the rows per microbatch, an integer >= 1 that
            divides the batch; None calls ``fun`` once on the whole batch.
            No default.
        accumulator: ``"sum"``, ``"mean"``, ``"running_mean"``, ``"concat"``
            or an :class:`Accumulator`, or a pytree of them shaped like a
            prefix of ``fun``'s output. Default: ``"sum"``.
        argnames: the names of keyword batch arguments. Default: ``()``.
        in_axes: the batch axis of each batch argument, in the order
            ``argnums`` then ``argnames``: one int for all, or one per
            argument. Default: ``0``.
        num_real_microbatches: the microbatches to run, an integer in
            [1, n] (traced values too), or None for all. Default: ``None``.

    Returns:
        A function with ``fun``'s arguments, returning the accumulated output.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> def fun(x):
        ...     return x + 1, jnp.sum(3 * x)
        >>> micro = ux.microbatching.microbatch(fun, argnums=0, microbatch_size=2, accumulator=("concat", "sum"))
        >>> micro(jnp.array([1.0, 2.0, 3.0, 4.0]))
        (Array([2., 3., 4., 5.], dtype=float32), Array(30., dtype=float32))

    References:
        optax.microbatching.microbatch (the same split and accumulators;
        optax names them by an enum, ``AccumulationType.SUM``, ...).
    """
    call = "microbatch"
    if not callable(fun):
        fail(call, "fun", fun, "must be callable", TypeError)
    argnums = _indices(call, "argnums", argnums, numbers.Integral)
    argnames = _indices(call, "argnames", argnames, str)
    if not argnums and not argnames:
        fail(call, "argnums", argnums, "must name at least one batch argument (or argnames one)")
    if microbatch_size is not None:
        microbatch_size = check.positive_int(call, "microbatch_size", microbatch_size)
    axes = _indices(call, "in_axes", in_axes, numbers.Integral)
    if len(axes) == 1:
        axes = axes * (len(argnums) + len(argnames))
    if len(axes) != len(argnums) + len(argnames):
        fail(call, "in_axes", in_axes, f"must be one int or one per batch argument ({len(argnums) + len(argnames)})")
    _check_accumulators(call, accumulator)

    @functools.wraps(fun)
    def microbatched(*args, **kwargs):
        if microbatch_size is None:
            return fun(*args, **kwargs)
        for position in argnums:
            if not -len(args) <= position < len(args):
                raise ValueError(f"{call}: argnums names argument {position}, but the call has {len(args)}")
        for name in argnames:
            if name not in kwargs:
                raise ValueError(f"{call}: argnames names {name!r}, which the call does not pass")
        batched = [("args", position % len(args), axis) for position, axis in zip(argnums, axes)]
        batched += [("kwargs", name, axis) for name, axis in zip(argnames, axes[len(argnums):])]
        args, split, counts = list(args), {}, set()
        for kind, key, axis in batched:
            value = args[key] if kind == "args" else kwargs[key]
            where = f"argument {key}" if kind == "args" else f"keyword argument {key}"
            split[(kind, key)] = jax.tree_util.tree_map_with_path(
                lambda path, x, w=where, a=axis: _split_rows(call, f"{w}{jax.tree_util.keystr(path)}",
                                                             jnp.asarray(x), a, microbatch_size), value)
            counts |= {jnp.shape(x)[axis % (jnp.ndim(x) - 1)] for x in jax.tree.leaves(split[(kind, key)])}
        if len(counts) > 1:
            raise ValueError(f"{call}: the batch arguments have different batch sizes (microbatches: "
                             f"{sorted(counts)}); they must split into as many microbatches")
        if not counts:
            return fun(*args, **kwargs)
        total = counts.pop()
        real = _real_count(call, num_real_microbatches, total)

        def call_on(i):
            call_args, call_kwargs = list(args), dict(kwargs)
            for kind, key, axis in batched:
                rows = jax.tree.map(lambda x, a=axis: jax.lax.dynamic_index_in_dim(
                    x, i, a % (x.ndim - 1), keepdims=False), split[(kind, key)])
                if kind == "args":
                    call_args[key] = rows
                else:
                    call_kwargs[key] = rows
            return fun(*call_args, **call_kwargs)

        shapes = jax.eval_shape(call_on, jnp.zeros([], jnp.int32))
        accumulators = _per_output(call, accumulator, shapes, total, real)
        carry = jax.tree.map(lambda acc, s: acc.init(s), accumulators, shapes, is_leaf=_is_accumulator_value)

        def body(i, carry):
            values = call_on(i)
            _tree.check_same_structure(call, shapes, values, "fun's output on microbatch 0", "its output")
            return jax.tree.map(lambda acc, c, v: acc.update(c, v, i), accumulators, carry, values,
                                is_leaf=_is_accumulator_value)

        carry = jax.lax.fori_loop(0, real, body, carry)
        return jax.tree.map(lambda acc, c: acc.finalize(c), accumulators, carry, is_leaf=_is_accumulator_value)

    return microbatched


def _is_accumulator_value(value: Any) -> bool:
    return isinstance(value, Accumulator)


def _check_accumulators(call: str, accumulator: Any) -> None:
    for path, value in jax.tree_util.tree_flatten_with_path(accumulator, is_leaf=_is_accumulator)[0]:
        if isinstance(value, Accumulator):
            if not all(callable(f) for f in value):
                fail(call, "accumulator", accumulator, "must hold Accumulators of three functions", TypeError)
        elif value not in _NAMES:
            fail(call, "accumulator", accumulator, f"must hold {', '.join(map(repr, _NAMES))} or Accumulators; "
                 f"at accumulator{jax.tree_util.keystr(path)} it holds {value!r}", TypeError)


def _per_output(call: str, accumulator: Any, shapes: Any, total: int, real: Any) -> Any:
    """One :class:`Accumulator` per leaf of ``fun``'s output: the prefix tree broadcast over it."""
    try:
        return jax.tree.map(lambda acc, sub: jax.tree.map(
            lambda s: acc if isinstance(acc, Accumulator) else _built_in(acc, total, real, s.dtype), sub),
            accumulator, shapes, is_leaf=_is_accumulator)
    except (ValueError, TypeError):
        raise ValueError(f"{call}: accumulator must be one accumulator or a pytree of them shaped like a prefix of "
                         f"fun's output; {_tree.first_difference(shapes, accumulator, 'the output', 'accumulator')}"
                         ) from None


def _real_count(call: str, num_real_microbatches: Any, total: int) -> Any:
    if num_real_microbatches is None:
        return total
    if is_concrete(num_real_microbatches):
        return check.integer(call, "num_real_microbatches", int(np.asarray(num_real_microbatches)), 1, total,
                             why=f" (the batch splits into {total} microbatches)")
    return jnp.asarray(num_real_microbatches, jnp.int32)
