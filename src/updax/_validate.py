"""Build-time checks of hyperparameters, for the catalogue, the optimizers and the schedules.

Every message names the call, the option and the value, e.g.
``scale_by_adam(b1=1.5): b1 must be in [0, 1)``. Values that are JAX tracers
(an update object built inside ``jax.jit``) cannot be inspected and pass.

:func:`real` and the checks built on it accept a schedule (a callable
``count -> value``) for the options a stage declares ``schedulable``;
:func:`number` accepts numbers only.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np

from updax._options import canonical


def fail(call: str, name: str, value: Any, what: str, exc: type[Exception] = ValueError) -> NoReturn:
    raise exc(f"{call}({name}={value!r}): {name} {what}")


def _interval(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    left = "(" if lo_open or lo is None else "["
    right = ")" if hi_open or hi is None else "]"
    low = "-inf" if lo is None else f"{lo:g}"
    high = "inf" if hi is None else f"{hi:g}"
    return f"{left}{low}, {high}{right}"


def real(call: str, name: str, value: Any, lo: float | None = None, hi: float | None = None, *,
         lo_open: bool = False, hi_open: bool = False) -> Any:
    """A real scalar hyperparameter in an interval, or a schedule for it; Python ints become floats.

    JAX/NumPy scalars are kept as given (they may carry a chosen dtype). A
    callable is a schedule ``count -> value`` (the stage must declare the
    option ``schedulable``): it is kept, and its values cannot be checked
    here. A class is not a schedule.
    """
    if callable(value) and not isinstance(value, (jax.Array, np.ndarray, np.generic, type)):
        return value  # a schedule count -> value, evaluated by the stage at each step
    return number(call, name, value, lo, hi, lo_open=lo_open, hi_open=hi_open)


def number(call: str, name: str, value: Any, lo: float | None = None, hi: float | None = None, *,
           lo_open: bool = False, hi_open: bool = False) -> Any:
    """A finite real scalar in an interval, never a schedule; Python ints become floats (see :func:`real`).

    NaN and infinities are refused whatever the interval, and so are complex
    and boolean values.
    """
    if isinstance(value, bool) or value is None:
        fail(call, name, value, "must be a real number", TypeError)
    if isinstance(value, numbers.Real):
        concrete = float(value)
        value = concrete if isinstance(value, int) else value
    elif isinstance(value, (jax.Array, np.ndarray, np.generic)):
        dtype = jnp.result_type(value)
        if jnp.ndim(value) != 0 or not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)):
            fail(call, name, value, "must be a real scalar", TypeError)
        if isinstance(value, jax.core.Tracer):
            return value
        value = canonical(value)  # a NumPy array becomes a read-only copy: the caller cannot change it later
        concrete = float(value)
    else:
        fail(call, name, value, "must be a real number", TypeError)
    bad = not math.isfinite(concrete)  # (NaN and infinities lie outside every interval, bounded or not)
    if lo is not None:
        bad |= concrete <= lo if lo_open else concrete < lo
    if hi is not None:
        bad |= concrete >= hi if hi_open else concrete > hi
    if bad:
        fail(call, name, value, "must be a finite number" if lo is None and hi is None
             else f"must be in {_interval(lo, hi, lo_open, hi_open)}")
    return value


def unit(call: str, name: str, value: Any) -> Any:
    """A decay rate in [0, 1)."""
    return real(call, name, value, 0.0, 1.0, hi_open=True)


def nonnegative(call: str, name: str, value: Any) -> Any:
    return real(call, name, value, 0.0)


def positive(call: str, name: str, value: Any) -> Any:
    return real(call, name, value, 0.0, lo_open=True)


_INT32_MAX = 2**31 - 1


def integer(call: str, name: str, value: Any, low: int = 0, high: int | None = None, why: str = "") -> int:
    """A Python integer >= ``low`` (and <= ``high`` if given; ``why`` says why the bound)."""
    what = {0: "a non-negative integer", 1: "a positive integer"}.get(low, f"an integer >= {low}")
    if high is not None:
        what = f"an integer in [{low}, {high}]{why}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(call, name, value, f"must be {what}", TypeError)
    if value < low or (high is not None and value > high):
        fail(call, name, value, f"must be {what}")
    if value > _INT32_MAX:  # it is compared with int32 step counters
        fail(call, name, value, "must be at most 2**31 - 1 (step counters are int32)")
    return int(value)


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
    if not isinstance(value, bool):
        fail(call, name, value, "must be True or False", TypeError)
    return value


def late_flag(call: str, name: str, value: Any, default: bool = False) -> bool | None:
    """:func:`flag` for an option added after its stage: stored as None at its default. An option left at None
    is not printed, so the pipelines written before the option existed print and compare as they did; the
    stage's kernel reads None as the default."""
    return None if flag(call, name, value) == default else value


def function(call: str, name: str, value: Any) -> Any:
    if not callable(value):
        fail(call, name, value, "must be callable", TypeError)
    return value


def mask(call: str, name: str, value: Any) -> Any:
    """None, a function of the params, or a pytree whose leaves are bools (Python or NumPy, not arrays: a mask is
    static, it decides which leaves a stage touches)."""
    if value is None or (callable(value) and jax.tree.leaves(value) == [value]):
        return value
    for path, leaf in jax.tree_util.tree_leaves_with_path(value):
        if not isinstance(leaf, (bool, np.bool_)):
            fail(call, name, value, f"must be a pytree of bools or a function of the params returning one; at "
                 f"{jax.tree_util.keystr(path) or 'the root'} it has {type(leaf).__name__} {leaf!r}", TypeError)
    return value


def float_dtype(call: str, name: str, value: Any) -> str | None:
    """None (the default: at least float32) or a floating dtype, kept as its name."""
    if value is None:
        return None
    try:
        dtype = jnp.dtype(value)
    except TypeError:
        fail(call, name, value, "must be None or a floating dtype", TypeError)
    if not jnp.issubdtype(dtype, jnp.floating):
        fail(call, name, value, "must be None or a floating dtype", TypeError)
    return dtype.name
