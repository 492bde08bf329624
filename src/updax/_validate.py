"""Checks of a function's arguments that are not a stage's options (the schedules', an optimizer's own), by
the domains of :mod:`updax._domains`: one checker, one message format, e.g.
``scale_by_adam(b1=1.5): b1 must be in [0, 1)``. Values that are JAX tracers
(an object built inside ``jax.jit``) cannot be inspected and pass.

A stage's options are not checked here: the stage declares their domains
(``stateful(..., domains=...)``) and the stage checks them on every path.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from typing import Any

from updax._domains import Flag, Integer, Real, fail


def number(call: str, name: str, value: Any, lo: float | None = None, hi: float | None = None, *,
           lo_open: bool = False, hi_open: bool = False) -> Any:
    """A finite real scalar in an interval, never a schedule (:class:`updax.domains.Real`)."""
    return Real(lo, hi, lo_open, hi_open).check(call, name, value)


def integer(call: str, name: str, value: Any, low: int = 0, high: int | None = None, why: str = "") -> int:
    """A Python integer >= ``low`` (and <= ``high`` if given; ``why`` says why the bound)."""
    return Integer(low, high, why).check(call, name, value)


def positive_int(call: str, name: str, value: Any) -> int:
    """A Python integer >= 1."""
    return integer(call, name, value, 1)


def boundaries(call: str, name: str, mapping: Any, value_check: Callable[[str, str, Any], Any]) -> dict[int, Any]:
    """A dict ``{step: value}`` with non-negative integer steps, sorted by step; each value through ``value_check``."""
    if not isinstance(mapping, Mapping):
        fail(call, name, mapping, "must be a dict {step: value}", TypeError)
    for step in mapping:
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            fail(call, name, mapping, f"must have non-negative integer steps as keys, got {step!r}")
    return {int(step): value_check(call, f"{name}[{step}]", mapping[step]) for step in sorted(mapping)}


def flag(call: str, name: str, value: Any) -> bool:
    return Flag().check(call, name, value)


