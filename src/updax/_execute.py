"""The execution loop: a pipeline's state at init, and one step through its stages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from updax import _fused
from updax._stage import Stage

__all__ = ["init", "step"]


def init(stages: Sequence[Stage], params: Any) -> tuple:
    """The initial state: one entry per stage, in pipeline order."""
    return tuple(stage.init(params) for stage in stages)


def step(pipeline: Any, updates: Any, state: Any, params: Any, extra: Mapping[str, Any]) -> tuple[Any, tuple]:
    """Runs ``updates`` through the pipeline's stages, each with its own state."""
    stages = pipeline.stages
    if not isinstance(state, (tuple, list)) or len(state) != len(stages):
        got = (f"{type(state).__name__} of length {len(state)}" if isinstance(state, (tuple, list))
               else type(state).__name__)
        raise ValueError(f"{pipeline!r}: state must be the tuple of {len(stages)} stage states that init() "
                         f"returns, got a {got}")
    new_state, i = [], 0
    while i < len(stages):
        run, width = _fused.find(stages[i:], params)
        if run is None:
            updates, stage_state = stages[i].apply(updates, state[i], params, extra)
            new_state.append(stage_state)
        else:
            updates, states = run(stages[i:i + width], updates, tuple(state[i:i + width]), params, dict(extra))
            new_state.extend(states)
        i += width
    return updates, tuple(new_state)
