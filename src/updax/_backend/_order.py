"""State updated in place: the fields a stage declares ``state_last`` are written after the params' update.

A training step jits ``update`` and ``apply_updates`` together, with the
params and the optimizer state donated, and XLA updates both in place. When
the params' update reads a state field's *old* value (Lion's sign of the
old momentum, or a new value that XLA recomputes from the old one inside
the params' kernel), the kernel that writes the field's new value into the
same buffer has to wait for the params' kernel. XLA's copy insertion does
not see that order, so it copies the old state first: a full-size
temporary, mapped afresh and faulted in on every step (for Lion on the
benchmark's T, the larger part of its step time: docs/performance-xla.md, "The
state in place"). optax's steps copy it.

A stage names such fields (``stateful(..., state_last=("mu",))``). Traced
for the CPU, with params given to the outermost ``update``, each declared
field's new value ``s`` becomes ``select(q < q, q, s)``, element by
element, where ``q`` is the param after the update, computed as
:func:`updax.apply_updates` computes it (``-s`` in place of ``q`` where
their dtypes differ: a branch of a select has the select's dtype). ``q < q``
is never true (NaN is not less than itself either), so the value is ``s``
bit for bit, but XLA does not fold the comparison. Taking ``q`` as the
branch never taken costs no operation of its own: against ``-s`` it saves
one per leaf (1000 on the benchmark's S), a change of compile time within
this machine's noise (docs/performance.md). When the step adds the updates
to the params in the same jit (``ux.apply_updates``, ``optax.apply_updates``,
``equinox.apply_updates``), XLA's common subexpression elimination makes
``q`` the params' own new buffer: the field's kernel reads it, so it runs
after the params' kernel and writes in place. The price is that read, one
pass over the param where the copy cost two and a fresh buffer. ``q`` is
the sum before :func:`updax.apply_updates` places it like the param, so on a
mesh it is split as the updates are: a state split over the data axis while
the params are replicated (ZeRO-1) reads its own slice, and no collective
is added (tests/sharding_checks.py, ``zero1_lion``). Applied
otherwise (``p - lr·u`` with donated params), ``q`` is computed from the old
params, which XLA then copies instead: that form gains nothing here.

Inside a wrapper (``masked``, ``partition``, ``accumulate_gradients``,
``apply_if_finite``, ...) the wrapper's updates are the ones added to the
params, and an inner stage's field is ordered the same way, each leaf after
the param it belongs to (``masked`` and ``partition`` give their inner
pipelines the params with None for the leaves left out, so their inner
state is shaped like the params but for those). A field not shaped like
the params (``flat_state``'s joined buffers) is left in XLA's order. A
wrapper may name its whole pipeline's state (its ``wraps`` field): when
the pipeline is elementwise every leaf of it shaped like a param is then
ordered after that param (``apply_if_finite``, whose check reads a step
computed again from the old state, :func:`updax._backend._apart.traced_apart`; and
``accumulate_gradients``, which computes the step on every call rather than
in a conditional).

A step traced for another backend keeps XLA's own order (XLA for GPUs
writes both from one kernel), and an eager step has no schedule to order;
neither does a step traced with the hints off (:func:`updax.backend_hints`).

What it saves, optimizer by optimizer and inside wrappers: ``python
benchmarks/in_place.py`` (``benchmarks/results/in_place*.md``, summed up in
docs/performance-xla.md, "The state in place"). That it changes no number and
removes the copies: ``tests/test_in_place.py`` (bit for bit against the
unordered step; the copies read from XLA's compiled program, with the
unordered step's copies as the counter-case).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from updax import _tree
from updax._backend import _switch
from updax._stage import ScheduledState, Stage

__all__ = ["after_params", "after_reading", "elementwise"]


def after_params(stages: Sequence[Stage], old: tuple, new: tuple, params: Any, updates: Any) -> tuple:
    """``new`` with each ``state_last`` field of each stage written after the params' update (see the module),
    the fields of the stages inside a wrapper (``masked``, ``partition``, ``accumulate_gradients``, ...) too."""
    if not any(_declares(stage) for stage in stages):
        return new
    for stage, n in zip(stages, new):  # (whether or not they are ordered here: a misnamed field fails everywhere)
        _check_declared(stage, n)
    if not _switch.hinted(updates):
        return new
    treedef = jax.tree.structure(params)
    ps = treedef.flatten_up_to(params)
    sums = [_new_param(p, u) for p, u in zip(ps, treedef.flatten_up_to(updates))]
    return _ordered_pipeline(stages, old, new, treedef, ps, sums, nested=False)


def _check_declared(stage: Stage, state: Any) -> None:
    """:func:`_check_fields` for the stage and the stages of the pipelines it wraps."""
    own = _own(stage, state)
    if stage.state_last:
        _check_fields(stage, own)
    inner = getattr(own, "inner", None)
    for key, pipeline in _wrapped(stage).items():
        states = inner if key is None else inner.get(key) if isinstance(inner, dict) else None
        if isinstance(states, tuple):
            for inner_stage, inner_state in zip(pipeline.stages, states):
                _check_declared(inner_stage, inner_state)


def _declares(stage: Stage) -> bool:
    """Whether the stage, or a stage of a pipeline it wraps, declares ``state_last``."""
    return bool(stage.state_last) or any(_declares(inner) for pipeline in _wrapped(stage).values()
                                         for inner in pipeline.stages)


def _wrapped(stage: Stage) -> dict[Any, Any]:
    """The pipelines the stage runs inside it (:meth:`updax.Stage.nested`), by where their state is in its own:
    ``wraps``'s as the ``inner`` field, the groups of ``partition`` by key of an ``inner`` dict."""
    return {key: pipeline for key, (_, pipeline) in stage.nested().items()}


def _ordered_pipeline(stages: Sequence[Stage], old: tuple, new: tuple, treedef: Any, params: list, sums: list,
                      nested: bool) -> tuple:
    return tuple(_ordered_stage(stage, o, n, treedef, params, sums, nested) if _declares(stage) else n
                 for stage, o, n in zip(stages, old, new))


def _ordered_stage(stage: Stage, old: Any, new: Any, treedef: Any, params: list, sums: list, nested: bool) -> Any:
    """The stage's new state with its own ``state_last`` fields ordered, and those of the pipelines it wraps.

    Inside a wrapper the final updates are the wrapper's, and a field of an inner stage is ordered after the
    param its leaf belongs to: the inner state of ``masked`` and ``partition`` is shaped like the params with
    None for the leaves left out. A field shaped otherwise (``flat_state``'s joined buffers) is left in XLA's
    order, as is one inside a wrapper whose state has no ``inner`` field.
    """
    if isinstance(new, ScheduledState) and stage.in_state:
        return new._replace(state=_ordered_stage(stage, old.state, new.state, treedef, params, sums, nested))
    whole = _whole(stage)
    if whole:  # (its own fields then after the pipeline's state of the same param, which reads their old values)
        written: list[list] = [[] for _ in params]
        new = new._replace(**{stage.wraps: _ordered_tree(getattr(old, stage.wraps), getattr(new, stage.wraps),
                                                         treedef, params, sums, written)})
        sums = [_after_written(summed, leaves) for summed, leaves in zip(sums, written)]
    if stage.state_last - {stage.wraps}:
        try:
            new = _ordered(stage, old, new, treedef, params, sums)
        except ValueError:  # (a field not shaped like the params: refused at the top, left alone inside)
            if not nested:
                raise
    if whole:
        return new
    pipelines = _wrapped(stage)
    inner_old, inner_new = getattr(old, "inner", None), getattr(new, "inner", None)
    if not pipelines or not hasattr(new, "_replace") or inner_new is None:
        return new
    if None in pipelines and isinstance(inner_new, tuple):
        ordered = _ordered_pipeline(pipelines[None].stages, inner_old, inner_new, treedef, params, sums, True)
    elif isinstance(inner_new, dict) and inner_new.keys() == pipelines.keys():
        ordered = {key: _ordered_pipeline(pipelines[key].stages, inner_old[key], inner_new[key], treedef, params,
                                          sums, True) for key in inner_new}
    else:
        return new
    return new._replace(inner=ordered)


def _whole(stage: Stage) -> bool:
    """Whether the wrapper's whole pipeline state is ordered: it names its ``wraps`` field and the pipeline is
    elementwise, so that the wrapper computes the pipeline's step on every call and selects between the new state
    and the old (``apply_if_finite``, ``accumulate_gradients``), where a pipeline of another kind runs once, or in a
    conditional whose outputs are buffers of their own, and a select after them would be a kernel more a leaf."""
    return stage.wraps is not None and stage.wraps in stage.state_last and elementwise(stage.option(stage.wraps))


def elementwise(pipeline: Any) -> bool:
    """Whether every stage of ``pipeline`` is elementwise: a step cheap enough for a wrapper to compute again or
    on every call (:func:`traced_apart`; ``accumulate_gradients``), where a matrix product or a norm per leaf
    would cost a second pass of its own. The same test decides the wrapper's path and whether its whole
    pipeline's state is ordered (:func:`_whole`)."""
    return all(stage.elementwise for stage in pipeline.stages)


def _ordered_tree(old: Any, new: Any, treedef: Any, params: list, sums: list, written: list[list]) -> Any:
    """``new`` with each subtree shaped like the params ordered leaf by leaf (:func:`_after`: a leaf shaped
    otherwise than its param is left alone), found wherever it is in a wrapper's whole inner state; the rest,
    counts and buffers shaped otherwise (``flat_state``'s), as it is. Each ordered leaf is added to ``written``
    at its param's index."""
    try:
        olds, news = treedef.flatten_up_to(old), treedef.flatten_up_to(new)
    except (TypeError, ValueError):
        olds = news = None
    if news is not None and all(n is None or isinstance(n, jax.Array) for n in news):
        ordered = [_after(o, n, p, q) for o, n, p, q in zip(olds, news, params, sums)]
        for leaves, n, r in zip(written, news, ordered):
            if r is not n:
                leaves.append(r)
        return treedef.unflatten(ordered)
    if new is None:
        return new
    news, node = jax.tree.flatten(new, is_leaf=lambda x: x is not new)  # (its children, one level down)
    if jax.tree_util.treedef_is_leaf(node):
        return new
    return node.unflatten([_ordered_tree(o, n, treedef, params, sums, written)
                           for o, n in zip(node.flatten_up_to(old), news)])


def _after_written(summed: tuple[jax.Array, jax.Array] | None, leaves: list) -> tuple[jax.Array, jax.Array] | None:
    """:func:`_new_param`'s pair for a wrapper's own field, to be written after the new ``leaves`` of its
    pipeline's state of the same param (themselves written after the param): the first of them, and a mask
    false everywhere read from each. ``accumulate_gradients``' sum: the pipeline's state kernels add the
    gradient to the old sum, so the sum's kernel that overwrites it must wait for all of them."""
    if summed is None or not leaves:
        return summed
    return leaves[0], functools.reduce(jax.lax.bitwise_or, [jax.lax.lt(x, x) for x in leaves])


def _new_param(p: jax.Array, u: jax.Array) -> tuple[jax.Array, jax.Array] | None:
    """``(q, q < q)`` for ``q = p + u`` as :func:`updax.apply_updates` computes it (XLA merges it with the
    params' new buffer): the new param and an all-false mask read from it, once per leaf for every ordered
    field. None for a complex leaf (left alone: its order has not been measured)."""
    if jnp.iscomplexobj(p) or jnp.iscomplexobj(u):
        return None
    q = _tree.summed(p, u)  # (not yet placed like the param: a state split like the update reads its own slice)
    return q, jax.lax.lt(q, q)


def _own(stage: Stage, state: Any) -> Any:
    """The stage's own state: inside the ScheduledState of a stage whose options are scheduled or held."""
    return state.state if isinstance(state, ScheduledState) and stage.in_state else state


def _check_fields(stage: Stage, state: Any) -> None:
    """A declared field the stage's state lacks is refused by name."""
    fields = getattr(state, "_fields", None)
    missing = sorted(stage.state_last - set(fields or ()))
    if missing:
        raise ValueError(f"{stage.label}: state_last names {missing}, which its state {type(state).__name__} does "
                         f"not have (its fields: {list(fields or ())})")


def _ordered(stage: Stage, old: Any, new: Any, treedef: Any, params: list, sums: list) -> Any:
    """The stage's new state with its ``state_last`` fields ordered (a wrapper's pipeline's field apart, which
    :func:`_ordered_tree` orders); a declared field not shaped like the params is refused by name."""
    if isinstance(new, ScheduledState) and stage.in_state:
        return new._replace(state=_ordered(stage, old.state, new.state, treedef, params, sums))
    changed = {}
    for field in sorted(stage.state_last - {stage.wraps}):
        try:
            olds, news = treedef.flatten_up_to(getattr(old, field)), treedef.flatten_up_to(getattr(new, field))
        except (TypeError, ValueError):
            raise ValueError(f"{stage.label}: state_last field {field!r} must be a tree shaped like the params "
                             f"({treedef})") from None
        changed[field] = treedef.unflatten([_after(o, n, p, q) for o, n, p, q in zip(olds, news, params, sums)])
    return new._replace(**changed)


def _after(old: jax.Array, new: jax.Array, param: jax.Array,
           summed: tuple[jax.Array, jax.Array] | None) -> jax.Array:
    """``new``, read after the new param (``summed``, :func:`_new_param`'s): a leaf passed through unchanged,
    shaped otherwise than the param, not floating or not an array (a :func:`updax.quantized_state` leaf's
    codes and scales) is left alone. What the select reads is placed like ``new``
    (on an explicit mesh a select needs it), which it already is when the state is split like the updates
    (ZeRO-1's state and updates both are)."""
    if (summed is None or new is None or new is old or not isinstance(new, jax.Array) or new.shape != param.shape
            or not jnp.issubdtype(new.dtype, jnp.floating)):
        return new
    q, never = summed
    never_taken = _tree.place_like(q, new) if q.dtype == new.dtype else jax.lax.neg(new)
    return jax.lax.select(_tree.place_like(never, new), never_taken, new)


def after_reading(token: jax.Array, old: jax.Array, new: jax.Array) -> jax.Array:
    """``new``, the new value of a state leaf whose *old* value a reduction read, written after that reduction
    (``token``, a scalar computed from it): ``select(token < token, old, new)``.

    The same copy as :func:`after_params` avoids, for a reader that is not the params' kernel: D-Adaptation
    weighs ``<g, s>`` by the old second moment, a reduction over the old ``s`` and ``v`` whose result the step's
    updates do not use, and XLA copies both fields on every step rather than running it before the kernels
    that write them in place. Reading the scalar orders the writer after it; the branch never taken is the old
    value, which the writer reads anyway (no operation, and placed like the new value). Traced for the CPU
    only (see the module); elsewhere, and for a leaf that changes dtype or shape, ``new`` as it is.
    """
    if not _switch.hinted(new) or old.dtype != new.dtype or old.shape != new.shape:
        return new
    return jax.lax.select(jax.lax.lt(token, token), old, new)
