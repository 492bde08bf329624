"""A decay of one half, given as a number, reaches the rule as a value XLA cannot see through.

An exponential moving average steps ``decay·old + (1 - decay)·new``. With
``decay = 0.5`` given as a Python number, XLA's simplifier sees
``0.5·old + 0.5·new``, writes it ``0.5·(old + new)`` and folds that ``0.5``
into the scalar a reader multiplies the new average by (Adam's
``m / (1 - b1^t)``). The params' kernel then holds no copy of the new
average to read: it recomputes it from the old one, which it reads after
the kernel that writes the new average into the same buffer, and XLA copies
the old average on every step (so does optax's step; DCGAN's
``adam(b1=0.5)``, ``adan(b2=0.5)``). Behind an optimization barrier the two
weights are two values to the simplifier: the step is ``0.5·old +
0.5·new`` as written, the eager step's numbers (the factored form differs
only where ``old + new`` overflows or the halves fall below the normal
range).

Which options: those a stage declares schedulable (so its rule takes a
traced value there already) whose domain lies in [0, 1], a decay's. The
value keeps its weak type, so it promotes as the number did.

What it saves: ``python benchmarks/step_times.py --catalogue --recipes
adan,adam/b1=0.5`` (docs/performance-xla.md, "A decay of one half"). Test:
``tests/test_in_place.py`` (``test_a_decay_of_one_half_...``: no copy with
it, the factored form's copy without it, the same numbers).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from updax._backend import _switch
from updax._domains import Real

__all__ = ["opaque_halves"]


def opaque_halves(declaration: Any, values: dict[str, Any], updates: Any) -> dict[str, Any]:
    """``values`` (a stage's option values for one step) with each declared decay given as the number 0.5 made
    opaque to XLA's simplifier, when hinted; ``values`` itself otherwise."""
    halves = [k for k in declaration.schedulable if type(values.get(k)) is float and values[k] == 0.5
              and _is_decay(declaration.domain(k))]
    if not halves or not _switch.hinted(updates):
        return values
    return {**values, **{k: jax.lax.optimization_barrier(jnp.asarray(0.5)) for k in halves}}


def _is_decay(domain: Any) -> bool:
    return (isinstance(domain, Real) and domain.lo is not None and domain.hi is not None and domain.lo >= 0
            and domain.hi <= 1)
