"""The execution loop: a pipeline's state at init, and one step through its stages.

Every check here looks at tree structure and shapes only, so under
``jax.jit`` it runs once, while tracing, and costs nothing per step.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from updax import _fused, _tree
from updax._backend import _order
from updax._stage import Stage, check_stage_result, without_examples

__all__ = ["init", "step"]

_RESTORE_HINT = ("pass the state that init() returned (a checkpoint must be restored with opt.init(params) as its "
                 "target, so that the state keeps its NamedTuple types)")


def init(pipeline: Any, params: Any) -> tuple:
    """The initial state: one entry per stage, in pipeline order.

    Its shapes are kept on the pipeline for the step's state check, so the
    first trace of a step whose state came from this object's ``init`` does
    not trace ``init`` again to learn them (on many leaves that second trace
    is a good part of the step's tracing).
    """
    params = _tree.as_arrays("init", params, "params")
    state = _tree.onto_mesh_of(tuple(stage.init(params) for stage in pipeline.stages), params)
    try:
        shapes = jax.tree.map(jax.typeof, state)
    except TypeError:  # a leaf that is not a JAX type (a user's string): the step works the shapes out, or not
        return state
    _remember(pipeline, _shapes_key(params), shapes)
    return state


def _shapes_key(reference: Any) -> tuple:
    leaves, treedef = jax.tree.flatten(reference)
    return treedef, tuple((jnp.shape(x), jnp.result_type(x)) for x in leaves)


def _remember(pipeline: Any, key: tuple, shapes: Any) -> None:
    cache = pipeline._state_shapes
    cache.pop(key, None)
    cache[key] = shapes
    if len(cache) > 64:  # params of many shapes through one object: keep the newest
        del cache[next(iter(cache))]


def _expected_state(pipeline: Any, reference: Any) -> Any:
    """The shapes of ``pipeline.init(reference)`` (as its last ``init`` of such params gave them, else worked out
    from shapes alone), or None if they cannot be worked out from shapes alone."""
    key = _shapes_key(reference)
    cache = pipeline._state_shapes
    if key not in cache:
        try:
            with _tree.shapes_only():
                shapes = jax.eval_shape(pipeline.init, reference)
        except Exception:  # e.g. a mask that looks at values: the step reports its own errors then
            shapes = None
        _remember(pipeline, key, shapes)
    return cache[key]


def _check_state(pipeline: Any, state: Any, reference: Any, of: str) -> None:
    stages = pipeline.stages
    if not isinstance(state, (tuple, list)) or len(state) != len(stages):
        got = (f"{type(state).__name__} of length {len(state)}" if isinstance(state, (tuple, list))
               else type(state).__name__)
        raise ValueError(f"{pipeline!r}: state must be the tuple of {len(stages)} stage states that init() "
                         f"returns, got a {got}")
    expected = _expected_state(pipeline, reference)
    if expected is None:
        return
    found = _tree.mismatch(expected, tuple(state), "state")
    if found is not None:
        where, want, got = found
        raise ValueError(f"{pipeline!r}: the state does not fit {of}: at {where} init() gives {want}, the state "
                         f"has {got}; {_RESTORE_HINT}")


def step(pipeline: Any, updates: Any, state: Any, params: Any, extra: Mapping[str, Any]) -> tuple[Any, tuple]:
    """Runs ``updates`` through the pipeline's stages, each with its own state.

    First checks what it was given: floating (or complex) updates, params of
    the same structure and shapes (as each example's, when a stage takes
    per-example updates), and a state of the structure and shapes
    ``init`` gives; each stage's result is checked against what it got. The
    outermost pipeline, given params, writes the state fields its stages
    declare ``state_last`` after the params' update (:mod:`updax._backend._order`).
    """
    stages = pipeline.stages
    updates = _tree.as_arrays("update", updates, "updates", floating=True)
    # A pipeline with a per-example stage takes per-example updates: what fits the params is them without
    # their leading axis of examples.
    per_example = [stage.label for stage in stages if stage.per_example]
    if len(per_example) > 1:
        raise ValueError(f"{pipeline!r}: {' and '.join(per_example)} both take per-example updates; a pipeline "
                         "reduces its examples once")
    shapes = without_examples(per_example[0], updates) if per_example else updates
    if params is not None:
        params = _tree.as_arrays("update", params, "params")
        found = _tree.mismatch(params, shapes)
        if found is not None:
            where, want, got = found
            raise ValueError(f"{pipeline!r}: updates do not fit params: at {where or '<root>'} params have {want}, "
                             f"updates have {got}{' per example' if per_example else ''}")
    _check_state(pipeline, state, shapes if params is None else params,
                 "these updates" if params is None else "these params")
    outermost = not _NESTED.get()
    with nested():
        updates, new_state = _run(stages, updates, state, params, extra)
    if outermost and params is not None:
        new_state = _order.after_params(stages, tuple(state), new_state, params, updates)
    return updates, new_state


#: Set while a pipeline runs: a pipeline run inside another (a wrapper's) does not produce the final updates.
_NESTED = contextvars.ContextVar("updax_nested_update", default=False)


@contextlib.contextmanager
def nested() -> Iterator[None]:
    """Runs the ``update`` calls inside as parts of a larger step: their updates are not the ones added to the
    params (an updax object inside ``optax.chain``), so no state is ordered after the params' update."""
    entered = _NESTED.set(True)
    try:
        yield
    finally:
        _NESTED.reset(entered)


def _run(stages: Sequence[Stage], updates: Any, state: Any, params: Any,
         extra: Mapping[str, Any]) -> tuple[Any, tuple]:
    """The stages one after another (a run of them through its fused path, where one is registered)."""
    new_state, i = [], 0
    while i < len(stages):
        run, width = _fused.find(stages[i:], params)
        for stage in stages[i:i + width]:
            stage.validate("an update object rebuilt by a tree map")
        if run is None:
            updates, stage_state = stages[i].apply(updates, state[i], params, extra)
            new_state.append(stage_state)
        else:
            group = stages[i:i + width]
            given = tuple(state[i:i + width])
            result = run(group, updates, given, params, dict(extra))
            updates, states = check_stage_result(" |> ".join(s.label for s in group), updates, given, result)
            new_state.extend(states)
        i += width
    return updates, tuple(new_state)
