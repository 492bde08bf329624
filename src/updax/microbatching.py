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

:func:`micro_vmap` is ``jax.vmap`` run one microbatch at a time, whose
outputs can be reduced over the batch as they come (their sum, their mean)
instead of kept; :func:`micro_grad` computes per-example gradients with it,
transforms them (a clip, their squares) and accumulates them, returning
each example's loss and metrics beside them. The accumulators can be named
by optax's enum too, :class:`AccumulationType` (``AccumulationType.SUM`` is
``"sum"``).

Microbatch $i$ of $n$ holds the rows $i, i + n, i + 2n, \dots$ of the batch
(a column-major split, as optax's): a batch sharded along its rows keeps
each microbatch sharded the same way, and ``"concat"`` puts the rows back
in their order.
"""

from __future__ import annotations

import enum
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

__all__ = ["AccumulationType", "Accumulator", "MicroGradAux", "micro_grad", "micro_vmap", "microbatch",
           "reshape_batch_axis"]


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
    carry``, jittable; ``finalize``, ``carry -> result``; ``aggregate``,
    ``values -> value``, how :func:`micro_vmap` reduces one microbatch's
    values (stacked along axis 0, one per example) to the value ``update``
    gets, or None for an accumulator :func:`micro_vmap` does not take
    (optax's ``aggregate``; the built-in ones sum, average or keep them).

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
    aggregate: Callable[[Any], Any] | None = None


class AccumulationType(enum.StrEnum):
    """optax's names of the built-in accumulators: each member is the string updax names it by
    (``AccumulationType.SUM == "sum"``), so either spelling goes wherever an accumulator does."""

    SUM = "sum"
    """The sum of the microbatches' outputs."""
    MEAN = "mean"
    """Their mean (over the microbatches run, with ``num_real_microbatches``)."""
    RUNNING_MEAN = "running_mean"
    """Their mean, kept as a running mean."""
    CONCAT = "concat"
    """Their rows, back in the batch's order."""


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


def _aggregate(accumulator: str | Accumulator) -> Callable[[Any], Any]:
    """How :func:`micro_vmap` reduces one microbatch's per-example values (stacked on axis 0) for ``accumulator``."""
    if isinstance(accumulator, Accumulator):
        return accumulator.aggregate
    if accumulator == "concat":
        return lambda values: values
    if accumulator == "sum":
        return lambda values: jnp.sum(values, axis=0)
    return lambda values: jnp.mean(values, axis=0)  # "mean", "running_mean": the means of equal microbatches


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
    return _microbatch("microbatch", fun, argnums, microbatch_size, accumulator, argnames=argnames, in_axes=in_axes,
                       num_real_microbatches=num_real_microbatches)


def _microbatch(call: str, fun: Callable[..., Any], argnums: Any, microbatch_size: Any, accumulator: Any, *,
                argnames: Any, in_axes: Any, num_real_microbatches: Any) -> Callable[..., Any]:
    """:func:`microbatch`, its errors naming ``call`` (the public function the user called)."""
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
            if not all(callable(f) for f in value[:3]) or not (value.aggregate is None or callable(value.aggregate)):
                fail(call, "accumulator", accumulator, "must hold Accumulators of three functions (and an aggregate "
                     "function or None)", TypeError)
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


def _per_leaf_accumulators(call: str, accumulator: Any, outputs: Any) -> Any:
    """``accumulator`` (a prefix tree) broadcast to one name or :class:`Accumulator` per leaf of ``outputs``."""
    try:
        return jax.tree.map(lambda acc, sub: jax.tree.map(lambda _: acc, sub), accumulator, outputs,
                            is_leaf=_is_accumulator)
    except (ValueError, TypeError):
        raise ValueError(f"{call}: accumulator must be one accumulator or a pytree of them shaped like a prefix of "
                         f"fun's output; {_tree.first_difference(outputs, accumulator, 'the output', 'accumulator')}"
                         ) from None


def micro_vmap(fun: Callable[..., Any], in_axes: int | None | Sequence[int | None] = 0, out_axes: int = 0, *,
               microbatch_size: int | None = None, vmap_fn: Callable[..., Any] | None = None,
               accumulator: str | Accumulator | PyTree = "concat",
               num_real_microbatches: int | jax.Array | None = None) -> Callable[..., Any]:
    r"""``jax.vmap(fun)`` one microbatch at a time, each output kept (as vmap's) or reduced over the batch.

    With $x_1, \dots, x_B$ the examples (the rows along ``in_axes`` of the
    mapped arguments; keyword arguments are mapped along their axis 0, as
    ``jax.vmap`` maps them) and $f$ = ``fun``, the result for an output of
    ``fun`` is, by its accumulator:

    $$
    \begin{align*}
    \text{concat}: &\ \bigl(f(x_1), \dots, f(x_B)\bigr) \text{ stacked along axis 0, as } \texttt{jax.vmap} \\
    \text{sum}: &\ \sum_b f(x_b) \\
    \text{mean}: &\ \frac{1}{B} \sum_b f(x_b)
    \end{align*}
    $$

    (``"running_mean"`` is the mean too.) The batch is split into
    microbatches of ``microbatch_size`` examples (as :func:`microbatch`
    splits it); each is vmapped and reduced by the accumulator's
    ``aggregate`` before the next, so a sum or a mean never holds more
    than one microbatch's outputs.

    Args:
        fun: the function of one example. No default.
        in_axes: the batch axis of each positional argument, None for one
            not mapped: one int (or None) for all, or one per argument, as
            ``jax.vmap`` takes it. Default: ``0``.
        out_axes: the outputs' batch axis; only 0. Default: ``0``.
        microbatch_size: the examples per microbatch, an integer >= 1 that
            divides the batch; None vmaps the whole batch at once.
            Default: ``None``.
        vmap_fn: the vectorizing map, with ``jax.vmap``'s signature
            ``(fun, in_axes, out_axes)``; None for ``jax.vmap``.
            Default: ``None``.
        accumulator: ``"concat"``, ``"sum"``, ``"mean"``,
            ``"running_mean"`` (or :class:`AccumulationType`'s members), an
            :class:`Accumulator` with an ``aggregate``, or a pytree of them
            shaped like a prefix of ``fun``'s output. Default: ``'concat'``.
        num_real_microbatches: the microbatches to run, an integer in
            [1, n] (traced values too), or None for all (see
            :func:`microbatch`). Default: ``None``.

    Returns:
        A function with ``fun``'s arguments, each mapped one with a batch axis.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> def fun(x, w):
        ...     return x * w, jnp.sum(x**2)
        >>> micro = ux.microbatching.micro_vmap(fun, in_axes=(0, None), microbatch_size=2, accumulator=("concat", "sum"))
        >>> micro(jnp.arange(4.0), 2.0)  # the rows times w, and the sum of the squares over the batch
        (Array([0., 2., 4., 6.], dtype=float32), Array(14., dtype=float32))

    References:
        optax.microbatching.micro_vmap (the same split and accumulators;
        updax's integer ``in_axes`` maps every positional argument, as
        ``jax.vmap``'s does).
    """
    return _micro_vmap("micro_vmap", fun, in_axes, out_axes, microbatch_size=microbatch_size, vmap_fn=vmap_fn,
                       accumulator=accumulator, num_real_microbatches=num_real_microbatches)


def _micro_vmap(call: str, fun: Callable[..., Any], in_axes: Any, out_axes: Any, *, microbatch_size: Any,
                vmap_fn: Callable[..., Any], accumulator: Any, num_real_microbatches: Any) -> Callable[..., Any]:
    """:func:`micro_vmap`, its errors naming ``call``."""
    if not callable(fun):
        fail(call, "fun", fun, "must be callable", TypeError)
    if vmap_fn is None:
        vmap_fn = jax.vmap
    elif not callable(vmap_fn):
        fail(call, "vmap_fn", vmap_fn, "must be callable or None", TypeError)
    if isinstance(out_axes, bool) or out_axes != 0:
        fail(call, "out_axes", out_axes, "must be 0 (the outputs' batch axis comes first, as optax's)",
             NotImplementedError)
    if in_axes is None or isinstance(in_axes, numbers.Integral):
        _indices(call, "in_axes", 0 if in_axes is None else in_axes, numbers.Integral)
    elif not isinstance(in_axes, (tuple, list)) or any(
            a is not None and (isinstance(a, bool) or not isinstance(a, numbers.Integral)) for a in in_axes):
        fail(call, "in_axes", in_axes, "must be an int or None, or a sequence of them (one per positional argument)",
             TypeError)
    if microbatch_size is not None:
        microbatch_size = check.positive_int(call, "microbatch_size", microbatch_size)
    _check_accumulators(call, accumulator)
    for path, acc in jax.tree_util.tree_flatten_with_path(accumulator, is_leaf=_is_accumulator)[0]:
        if isinstance(acc, Accumulator) and acc.aggregate is None:
            fail(call, "accumulator", accumulator, "must hold Accumulators with an aggregate function (how one "
                 f"microbatch's values are reduced); accumulator{jax.tree_util.keystr(path)} has none", TypeError)

    @functools.wraps(fun)
    def mapped(*args, **kwargs):
        axes = (in_axes,) * len(args) if in_axes is None or isinstance(in_axes, numbers.Integral) else tuple(in_axes)
        if len(axes) != len(args):
            raise ValueError(f"{call}: in_axes has {len(axes)} entries, but the call has {len(args)} positional "
                             f"arguments; give one axis (or None) per argument")
        argnums = tuple(i for i, a in enumerate(axes) if a is not None)
        if not argnums and not jax.tree.leaves(kwargs):
            raise ValueError(f"{call}: in_axes maps no argument; map at least one (an axis in place of None)")

        def vmapped(*args, kwargs):
            outputs = vmap_fn(fun, axes, 0)(*args, **kwargs)
            aggregates = _per_leaf_accumulators(call, accumulator, outputs)
            return jax.tree.map(lambda acc, values: _aggregate(acc)(values), aggregates, outputs,
                                is_leaf=_is_accumulator)

        micro = _microbatch(call, vmapped, argnums, microbatch_size, accumulator, argnames="kwargs",
                            in_axes=tuple(axes[i] for i in argnums) + (0,),
                            num_real_microbatches=num_real_microbatches)
        return micro(*args, kwargs=kwargs)

    return mapped


class MicroGradAux(NamedTuple):
    """What :func:`micro_grad` returns beside the gradients, one entry per example (optax's ``Aux``): the
    loss ``values``, the ``metrics`` of the gradient, and ``fun``'s own auxiliary output ``aux`` (None without
    ``has_aux``)."""

    values: Any
    metrics: Any
    aux: Any


def micro_grad(fun: Callable[..., Any], has_aux: bool = False, argnums: int | Sequence[int] = 0, *,
               batch_argnums: int | Sequence[int] = 1, keep_batch_dim: bool = True,
               microbatch_size: int | None = None, accumulator: str | Accumulator | PyTree = "sum",
               transform_fn: Callable[[Any], Any] | None = None, metrics_fn: Callable[[Any], Any] | None = None,
               num_real_microbatches: int | jax.Array | None = None) -> Callable[..., Any]:
    r"""Per-example gradients of ``fun``, transformed and accumulated over the batch by microbatches.

    With $x_1, \dots, x_B$ the examples (the rows of the ``batch_argnums``
    arguments), $\nabla_b$ the gradient of ``fun`` on example $b$ with
    respect to the ``argnums`` arguments, $T$ = ``transform_fn`` and $M$ =
    ``metrics_fn``, the result is

    $$
    \Bigl(\operatorname{acc}_b T(\nabla_b),\ \text{MicroGradAux}\bigl(f(x_b), M(\nabla_b), \text{aux}_b\bigr)_{b=1}^{B}\Bigr)
    $$

    where $\operatorname{acc}$ is the accumulator: the sum (default), the
    mean, or ``"concat"`` to keep each example's. The auxiliary outputs are
    kept per example, in the batch's order. A $T$ that clips each
    gradient's norm and a sum give DP-SGD's clipped sum; $T(\nabla) =
    (\nabla, \nabla^2)$ and the mean give the gradient's mean and second
    moment. ``fun`` sees each example as a batch of one (with
    ``keep_batch_dim``, its batch axis kept), so a loss written for a batch
    works unchanged. Built on :func:`micro_vmap`: a microbatch of
    ``microbatch_size`` examples at a time.

    Args:
        fun: the loss, ``fun(*args, **kwargs)``, a real scalar (and its
            auxiliary output with ``has_aux``). No default.
        has_aux: ``fun`` returns ``(loss, aux)``. Default: ``False``.
        argnums: the argument(s) to differentiate, as ``jax.grad`` takes
            them. Default: ``0``.
        batch_argnums: the positions of the arguments with a batch axis
            (axis 0), an int or a sequence of ints; keyword arguments are
            mapped along their axis 0 too. Default: ``1``.
        keep_batch_dim: give ``fun`` each example with a batch axis of 1
            (False: without it). Default: ``True``.
        microbatch_size: the examples per microbatch, an integer >= 1 that
            divides the batch; None: the whole batch at once.
            Default: ``None``.
        accumulator: how the transformed gradients are combined over the
            batch: ``"sum"``, ``"mean"``, ``"running_mean"``, ``"concat"``,
            an :class:`Accumulator` with an ``aggregate``, or a prefix tree
            of them over ``transform_fn``'s output. Default: ``'sum'``.
        transform_fn: applied to each example's gradient before it is
            accumulated; None for the identity. Default: ``None``.
        metrics_fn: applied to each example's gradient (before
            ``transform_fn``), kept per example in the ``metrics`` of the
            auxiliary output, best a scalar; None for no metrics (``metrics``
            is None). Default: ``None``.
        num_real_microbatches: the microbatches to run, or None for all
            (see :func:`microbatch`). Default: ``None``.

    Returns:
        A function with ``fun``'s arguments returning ``(accumulated,
        MicroGradAux(values, metrics, aux))``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> def loss(w, x, y):
        ...     return 0.5 * jnp.mean((x @ w - y) ** 2)
        >>> w, x, y = jnp.zeros(1), jnp.ones((4, 1)), jnp.array([0.0, 2.0, 4.0, 6.0])
        >>> grad_fn = ux.microbatching.micro_grad(loss, batch_argnums=(1, 2), accumulator="mean", microbatch_size=2,
        ...                                       transform_fn=lambda g: (g, g**2), metrics_fn=jnp.linalg.norm)
        >>> (mean, second_moment), aux = grad_fn(w, x, y)  # the examples' gradients are -y
        >>> mean, second_moment
        (Array([-3.], dtype=float32), Array([14.], dtype=float32))
        >>> aux.values, aux.metrics
        (Array([ 0.,  2.,  8., 18.], dtype=float32), Array([0., 2., 4., 6.], dtype=float32))

    References:
        optax.microbatching.micro_grad (the same semantics; its auxiliary
        output is a namedtuple ``Aux(values, metrics, aux)``). Per-example
        gradients as in Abadi et al., "Deep Learning with Differential
        Privacy", CCS 2016, https://arxiv.org/abs/1607.00133.
    """
    call = "micro_grad"
    if not callable(fun):
        fail(call, "fun", fun, "must be callable", TypeError)
    has_aux = check.flag(call, "has_aux", has_aux)
    keep_batch_dim = check.flag(call, "keep_batch_dim", keep_batch_dim)
    batch_argnums = _indices(call, "batch_argnums", batch_argnums, numbers.Integral)
    if not batch_argnums or any(i < 0 for i in batch_argnums):
        fail(call, "batch_argnums", batch_argnums, "must name at least one positional argument, by a position >= 0")
    for name, fn in (("transform_fn", transform_fn), ("metrics_fn", metrics_fn)):
        if fn is not None and not callable(fn):
            fail(call, name, fn, "must be callable or None", TypeError)
    transform = (lambda grad: grad) if transform_fn is None else transform_fn
    metrics = (lambda grad: None) if metrics_fn is None else metrics_fn
    if microbatch_size is not None:
        microbatch_size = check.positive_int(call, "microbatch_size", microbatch_size)
    _check_accumulators(call, accumulator)
    value_and_grad = jax.value_and_grad(fun if has_aux else (lambda *a, **k: (fun(*a, **k), None)), argnums,
                                        has_aux=True)

    def per_example(*args, **kwargs):
        (value, aux), grad = value_and_grad(*args, **kwargs)
        return transform(grad), MicroGradAux(values=value, metrics=metrics(grad), aux=aux)

    @functools.wraps(fun)
    def grad_fn(*args, **kwargs):
        if max(batch_argnums) >= len(args):
            raise ValueError(f"{call}: batch_argnums names argument {max(batch_argnums)}, but the call has "
                             f"{len(args)} positional arguments")
        args = list(args)
        if keep_batch_dim:  # each example keeps a batch axis of 1: (B, ...) -> (B, 1, ...)
            for i in batch_argnums:
                args[i] = jax.tree.map(lambda x: jnp.expand_dims(x, 1), args[i])
        axes = [0 if i in batch_argnums else None for i in range(len(args))]
        micro = _micro_vmap(call, per_example, axes, 0, microbatch_size=microbatch_size, vmap_fn=jax.vmap,
                            accumulator=(accumulator, "concat"), num_real_microbatches=num_real_microbatches)
        return micro(*args, **kwargs)

    return grad_fn
