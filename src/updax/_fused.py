"""Fused execution paths: the same numbers as running some stages one by one, from fewer passes over memory.

A path is registered for a run of consecutive stage names. A stage name binds
its kernels (see :mod:`updax._stage`), so matching by name is matching by
kernels. A fused path is an execution detail: the pipeline, its repr and its
state are the same with or without it, and a parity test checks each path
against the stage-by-stage computation. Fused paths are hints to the
compiler (updax._backend registers them): with the hints off
(:func:`updax.backend_hints`) every stage runs on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from updax._backend import _switch
from updax._stage import Stage

__all__ = ["find", "register_fused_path", "registered"]

#: ``run(stages, updates, states, params, extra) -> (updates, new_states)``
FusedRun = Callable[[Sequence[Stage], Any, tuple, Any, dict], tuple[Any, tuple]]

_PATHS: list[tuple[tuple[str, ...], FusedRun]] = []


def register_fused_path(names: Sequence[str], run: FusedRun) -> None:
    """Runs consecutive stages named ``names`` through ``run`` instead of one by one.

    ``run(stages, updates, states, params, extra) -> (updates, new_states)``
    must return exactly what applying the stages one after another returns;
    it may fall back to ``stage.apply`` for inputs it does not handle. It is
    used only when none of the stages has a scheduled or held option or is
    checked (:func:`updax.checked`), and params are given; the stages'
    options are checked against their declarations before it runs.
    """
    _PATHS.append((tuple(names), run))


def registered() -> list[tuple[str, ...]]:
    """The stage-name runs that have a fused path."""
    return [names for names, _ in _PATHS]


def find(stages: Sequence[Stage], params: Any) -> tuple[FusedRun | None, int]:
    """The fused run covering a prefix of ``stages`` and its width, or ``(None, 1)`` (also with the hints off)."""
    if params is None or not _switch.enabled():
        return None, 1
    for names, run in _PATHS:
        width = len(names)
        prefix = stages[:width]
        if (len(prefix) == width and all(s.name == n for s, n in zip(prefix, names))
                and not any(s.in_state or s.checked for s in prefix)):
            return run, width
    return None, 1
