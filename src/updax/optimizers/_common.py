"""What every optimizer does the same way, written once: its learning rate's domain, ascent, optax's spellings."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from updax import _validate as check
from updax import schedules
from updax._domains import LEARNING_RATE, Flag
from updax._hints import check_keywords
from updax._primitives import compose
from updax._update import Update
from updax.updates import scale

__all__ = ["maximized", "optimizer", "warmed_up"]


def optimizer(fn: Callable[..., Update]) -> Callable[..., Update]:
    """Marks a public optimizer: its ``learning_rate`` is checked against
    :data:`updax.domains.LEARNING_RATE` in its own name (a negative, NaN or
    infinite rate is refused: ``adam(learning_rate=-0.1): learning_rate must
    be in [0, inf)...``), and an option spelt as optax spells it gets a hint."""
    names = list(inspect.signature(fn).parameters)
    position = names.index("learning_rate") if "learning_rate" in names else None

    @functools.wraps(fn)
    def build(*args: Any, **kwargs: Any) -> Update:
        check_keywords(fn.__name__, fn, kwargs)
        if position is not None:
            given = args[position] if position < len(args) else kwargs.get("learning_rate")
            if given is not None:
                LEARNING_RATE.check(fn.__name__, "learning_rate", given, schedulable=True)
        return fn(*args, **kwargs)

    return build


def maximized(maximize: bool, opt: Update) -> Update:
    """``opt`` for gradient ascent where ``maximize``: ``scale(-1.0)`` in front, negating the gradients, as
    PyTorch's ``maximize=True`` does (maximising f is minimising -f: decoupled weight decay still decays,
    and the learning rate stays positive)."""
    return compose(scale(-1.0), opt) if Flag().check("optimizer", "maximize", maximize) else opt


def warmed_up(call: str, learning_rate: Any, warmup_steps: int | None) -> Any:
    """``learning_rate``, or with ``warmup_steps`` a linear warm-up from 0 to it over that many steps, then it
    (the schedule-free optimizers' ``warmup_steps``): the peak must then be a number."""
    if warmup_steps is None:
        return learning_rate
    check.positive_int(call, "warmup_steps", warmup_steps)
    peak = check.number(call, "learning_rate", learning_rate)
    return schedules.polynomial_decay(0.0, end_value=peak, power=1.0, transition_steps=warmup_steps)
