"""Schedules ``count -> value``: immutable, printable, jittable, and pytrees.

Polaris's schedules (``constant``, ``exponential_decay``, ``cosine_decay``,
``polynomial_decay``, ``linear_decay``) with its option names and defaults,
``piecewise_constant``, and optax's linear, warmup, one-cycle, restart, join
and interpolation schedules. Pass one wherever a learning rate is expected:

>>> import updax as ux
>>> import updax.schedules as uxs
>>> ux.scale_by_schedule(uxs.cosine_decay(-0.01, decay_steps=1000))
scale_by_schedule(schedule_fn=cosine_decay(init_value=-0.01, decay_steps=1000, alpha=0.0, exponent=1.0))
"""

from updax._schedules import (
    Schedule,
    constant,
    cosine_decay,
    cosine_onecycle,
    cosine_warm_restarts,
    cyclic,
    exponential_decay,
    join_schedules,
    linear_decay,
    linear_onecycle,
    linear_schedule,
    multiply_schedules,
    piecewise_constant,
    piecewise_interpolate,
    polynomial_decay,
    power_decay_rate,
    relative_step,
    sgdr,
    swalr,
    warmup_constant,
    warmup_cosine_decay,
    warmup_exponential_decay,
    warmup_stable_decay,
)

__all__ = [
    "Schedule",
    "constant",
    "cosine_decay",
    "cosine_onecycle",
    "cosine_warm_restarts",
    "cyclic",
    "exponential_decay",
    "join_schedules",
    "linear_decay",
    "linear_onecycle",
    "linear_schedule",
    "multiply_schedules",
    "piecewise_constant",
    "piecewise_interpolate",
    "polynomial_decay",
    "power_decay_rate",
    "relative_step",
    "sgdr",
    "swalr",
    "warmup_constant",
    "warmup_cosine_decay",
    "warmup_exponential_decay",
    "warmup_stable_decay",
]
