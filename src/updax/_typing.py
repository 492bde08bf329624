"""Type aliases of the public API, for annotations (IDEs and type checkers); the code never checks them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias, Union

import jax
from jax.typing import ArrayLike, DTypeLike

__all__ = ["ArrayLike", "DType", "PyTree", "Scalar", "ScalarOrSchedule", "ScheduleLike"]

#: Any pytree of arrays: nested dicts, lists, tuples, None, registered classes.
PyTree: TypeAlias = Any

#: A real number or a 0-d array.
Scalar: TypeAlias = ArrayLike

#: A schedule ``count -> value``: a function of the step count (an int32 array, int64 under ``jax_enable_x64``),
#: jittable.
ScheduleLike: TypeAlias = Callable[[jax.Array], ArrayLike]

#: A hyperparameter that may be a schedule (the options a stage declares ``schedulable``).
ScalarOrSchedule: TypeAlias = Union[ArrayLike, ScheduleLike]

#: A storage dtype, or None for "the params' dtype, but at least float32".
DType: TypeAlias = Union[DTypeLike, None]
