"""Where the core finds a stage's hinted step: a registry of apply functions by stage name.

A stage name binds its kernels (:mod:`updax._stage`), so a function
registered for a name replaces the kernel of that stage, and of it only.
Each registered function takes what the stage's own apply function takes
(the step's option values: schedules evaluated, held values read) and
returns the same numbers (:mod:`updax._backend._paths`). This module imports
nothing of updax, so that :mod:`updax._stage` can ask it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["apply_fn_for", "register"]

_VARIANTS: dict[str, Callable[..., Any]] = {}


def register(name: str, apply_fn: Callable[..., Any]) -> None:
    """Runs the stage named ``name`` through ``apply_fn`` instead of its own apply function."""
    _VARIANTS[name] = apply_fn


def apply_fn_for(name: str | None, default: Callable[..., Any]) -> Callable[..., Any]:
    """The apply function to run for the stage named ``name``: the registered one, or ``default``."""
    return default if name is None else _VARIANTS.get(name, default)
