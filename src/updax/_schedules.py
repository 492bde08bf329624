"""Schedules: immutable, printable, jittable callables ``count -> value``.

Each schedule is a small class whose instances are values, like update
objects: they print in call form, compare and hash by their options, pickle,
and are pytrees. Options that only enter arithmetic (values, rates, step
counts) are pytree leaves, so a jitted function that takes a schedule as an
argument does not retrace when one changes; options that Python needs as
concrete values (flags, dict boundaries, the interpolation kind, the phase
boundaries of the one-cycle schedules) are static structure, and nested
schedules are pytree children.

Names and options of ``constant``, ``exponential_decay``, ``cosine_decay``,
``polynomial_decay`` and ``linear_decay`` are Polaris's (``Polaris.Schedules``):
``init_value`` is positional, the other options are keywords. The others follow
optax's schedules of the same meaning and take optax's arguments in optax's
order.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from updax import _validate as check
from updax._domains import count_limit_text, count_max
from updax._options import format_value, key_of
from updax._typing import ArrayLike, Scalar, ScheduleLike

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


# --------------------------------------------------------------------------
# The base class: fields, value semantics, pytree registration, written once.


class Schedule:
    """Base class of the schedules: an immutable callable value ``count -> value``.

    A subclass names its options as the parameters of ``__init__``, validates
    them there and stores them with ``self._set(**options)``; it lists in
    ``_static`` the options Python needs as concrete values, and defines
    ``__call__(count)``. Every other option is a pytree child. Subclasses are
    registered as pytrees when they are defined, and get ``repr`` in call form,
    ``==``, ``hash`` and pickling from here.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax.schedules as uxs
        >>> class halving(uxs.Schedule):
        ...     def __init__(self, init_value):
        ...         self._set(init_value=init_value)
        ...     def __call__(self, count):
        ...         return self.init_value * 0.5 ** jnp.asarray(count, jnp.float32)
        >>> halving(1.0)
        halving(init_value=1.0)
        >>> halving(1.0)(3)
        Array(0.125, dtype=float32)
    """

    _static: tuple[str, ...] = ()
    _fields: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._fields = tuple(inspect.signature(cls.__init__).parameters)[1:]
        if "__call__" in cls.__dict__:
            cls.__call__ = _counted(cls.__dict__["__call__"])
        jax.tree_util.register_pytree_with_keys(
            cls, _flatten_with_keys, functools.partial(_unflatten, cls), _flatten
        )

    def _set(self, **options: Any) -> None:
        for name in self._fields:
            object.__setattr__(self, name, options[name])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("schedules are immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("schedules are immutable")

    def __call__(self, count: ArrayLike) -> jax.Array:
        raise NotImplementedError

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._fields)

    def _key(self) -> tuple[Any, tuple[Any, ...]]:
        leaves, treedef = jax.tree.flatten(self)
        return treedef, tuple(key_of(leaf) for leaf in leaves)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self) -> tuple[Any, ...]:
        return _restore, (type(self), self._values())

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={format_value(v)}" for k, v in zip(self._fields, self._values()) if v is not None)
        return f"{type(self).__name__}({shown})"


def _counted(call):
    """``call(self, count)`` refusing a concrete negative or non-finite count by name: a step count starts at 0,
    and a schedule extrapolated before it (a warm-up's negative learning rate) is a wrong answer. A traced count
    (under ``jax.jit``) passes."""
    @functools.wraps(call)
    def counted(self, count):
        if not isinstance(count, jax.core.Tracer):
            values = np.asarray(count)
            if values.dtype.kind in "biuf" and not np.all(np.isfinite(values) & (values >= 0)):
                raise ValueError(f"{type(self).__name__}: the count must be a step count >= 0, got {count!r}")
            if values.dtype.kind in "iu" and values.size and np.max(values) > count_max():
                raise ValueError(f"{type(self).__name__}: the count must fit the step counters' dtype, got {count!r}; "
                                 f"{count_limit_text()}")
        return call(self, count)

    return counted


def _restore(cls, values):
    schedule = object.__new__(cls)
    for name, value in zip(cls._fields, values):
        object.__setattr__(schedule, name, value)
    return schedule


def _flatten_with_keys(schedule):
    children = [(jax.tree_util.GetAttrKey(k), getattr(schedule, k)) for k in schedule._fields
                if k not in schedule._static]
    return children, tuple(getattr(schedule, k) for k in schedule._static)


def _flatten(schedule):
    children, aux = _flatten_with_keys(schedule)
    return [child for _, child in children], aux


def _unflatten(cls, aux, children):
    children, aux = iter(children), iter(aux)
    return _restore(cls, tuple(next(aux) if k in cls._static else next(children) for k in cls._fields))


class _Function(Schedule):
    """A plain function used as a schedule inside :class:`join_schedules` (static structure)."""

    _static = ("fn",)

    def __init__(self, fn):
        self._set(fn=fn)

    def __call__(self, count):
        return self.fn(count)

    def __repr__(self):
        return format_value(self.fn)


# --------------------------------------------------------------------------
# Kernels, on at least float32 arrays


def _real(x):
    """``x`` as an array of at least float32 (a count becomes float32)."""
    x = jnp.asarray(x)
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32) if floating else jnp.float32)


def _exponential(t, init, rate, steps, begin, staircase, end):
    t = t - begin
    p = t / steps
    if staircase:
        p = jnp.floor(p)
    value = jnp.where(t <= 0, init, init * rate**p)
    if end is not None:
        value = jnp.where(rate < 1, jnp.maximum(value, end), jnp.minimum(value, end))
    return value


def _cosine(t, init, steps, alpha, exponent=1.0):
    cos = 0.5 * (1 + jnp.cos(jnp.pi * jnp.minimum(t, steps) / steps))
    return init * ((1 - alpha) * cos**exponent + alpha)


def _lerp(a, b, w):
    """``a·(1 - w) + b·w``: exactly ``a`` at ``w = 0``, exactly ``b`` at ``w = 1``, and exactly ``a`` all along
    where ``a = b`` (its halves could leave float32's normal range and be flushed to zero). (``a + (b - a)·w`` is
    not exact at the ends: with ``|a|`` below ``b``'s rounding, ``(a - b) + b`` gives 0, so a schedule from 6e-8
    to 2 would start at 0.)"""
    return jnp.where(a == b, a, a * (1 - w) + b * w)


def _polynomial(t, init, end, power, steps, begin):
    done = jnp.clip(t - begin, 0, steps) / steps
    return _lerp(end, init, (1 - done) ** power)


def _warmup(t, init, peak, steps):
    return _lerp(init, peak, t / jnp.maximum(steps, 1))


def _interpolate(kind, t, bounds, values):
    """Interpolates ``values[i] -> values[i+1]`` on ``[bounds[i], bounds[i+1])``; ``values[-1]`` after."""
    out = jnp.broadcast_to(values[-1], t.shape)
    for b0, b1, v0, v1 in zip(bounds, bounds[1:], values, values[1:]):
        pct = (t - b0) / max(b1 - b0, 1)
        if kind == "linear":
            value = _lerp(v0, v1, pct)
        else:
            value = _lerp(v1, v0, (jnp.cos(jnp.pi * pct) + 1) / 2)
        out = jnp.where((b0 <= t) & (t < b1), value, out)
    return out


# --------------------------------------------------------------------------
# Polaris's schedules


class constant(Schedule):
    r"""A schedule that holds one value.

    Formula, with $\eta_\text{init}$ = ``init_value``: $\eta(t) = \eta_\text{init}$.

    Args:
        init_value: the value, any real number. No default.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.constant(0.01)
        >>> sched
        constant(init_value=0.01)
        >>> sched(1000)
        Array(0.01, dtype=float32)

    References:
        Polaris.Schedules.constant.
    """

    init_value: Scalar

    def __init__(self, init_value: Scalar) -> None:
        self._set(init_value=check.number("constant", "init_value", init_value))

    def __call__(self, count: ArrayLike) -> jax.Array:
        return jnp.broadcast_to(_real(self.init_value), jnp.shape(count))


class exponential_decay(Schedule):
    r"""Exponential decay, continuous or in steps, from ``transition_begin`` on.

    Formula, with $\eta_\text{init}$ = ``init_value``, $r$ = ``decay_rate``, $k$ = ``transition_steps``
    and $s = t - t_0$, $t_0$ = ``transition_begin``:

    $$
    \begin{align*}
    \eta(t) &= \eta_\text{init} && \text{if } s \le 0 \\
    \eta(t) &= \eta_\text{init}\, r^{s/k} && \text{otherwise (} r^{\lfloor s/k \rfloor} \text{ with staircase)}
    \end{align*}
    $$

    then clipped at $\eta_\text{end}$ = ``end_value`` when given (at every step, those before
    $t_0$ too): a floor when $r < 1$, a ceiling otherwise.

    Args:
        init_value: the value before the decay begins, any real number.
            No default.
        decay_rate: the factor per ``transition_steps`` steps, > 0.
            Default: ``0.95``.
        transition_steps: steps per factor of ``decay_rate``, a positive
            integer. Default: ``10``.
        transition_begin: the step the decay begins at, a non-negative integer.
            Default: ``0``.
        staircase: decay in whole steps of ``transition_steps``.
            Default: ``False``.
        end_value: the bound the value stops at (not in Polaris; optax's
            option); None for no bound. Default: ``None``.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.exponential_decay(1.0, decay_rate=0.5, transition_steps=2, staircase=True)
        >>> sched(5)  # 0.5 ** ⌊5/2⌋
        Array(0.25, dtype=float32)

    References:
        Polaris.Schedules.exponential_decay.
    """

    init_value: Scalar
    decay_rate: Scalar
    transition_steps: int
    transition_begin: int
    staircase: bool
    end_value: Scalar | None

    _static = ("staircase",)

    def __init__(self, init_value: Scalar, *, decay_rate: Scalar = 0.95, transition_steps: int = 10,
                 transition_begin: int = 0, staircase: bool = False, end_value: Scalar | None = None) -> None:
        call = "exponential_decay"
        self._set(init_value=check.number(call, "init_value", init_value),
                  decay_rate=check.number(call, "decay_rate", decay_rate, 0.0, lo_open=True),
                  transition_steps=check.positive_int(call, "transition_steps", transition_steps),
                  transition_begin=check.integer(call, "transition_begin", transition_begin, 0),
                  staircase=check.flag(call, "staircase", staircase),
                  end_value=None if end_value is None else check.number(call, "end_value", end_value))

    def __call__(self, count: ArrayLike) -> jax.Array:
        end = None if self.end_value is None else _real(self.end_value)
        return _exponential(_real(count), _real(self.init_value), _real(self.decay_rate),
                            _real(self.transition_steps), _real(self.transition_begin), self.staircase, end)


class cosine_decay(Schedule):
    r"""Cosine decay from ``init_value`` to ``alpha`` times ``init_value`` over ``decay_steps`` steps.

    Formula, with $\eta_\text{init}$ = ``init_value``, $k$ = ``decay_steps``, $\alpha$ = ``alpha`` and
    $\gamma$ = ``exponent``:

    $$
    \begin{align*}
    \eta(t) &= \eta_\text{init} \left((1 - \alpha)\, c^\gamma + \alpha\right) \\
    c &= \tfrac{1}{2} \left(1 + \cos(\pi \min(t, k) / k)\right)
    \end{align*}
    $$

    Args:
        init_value: the value at step 0, any real number. No default.
        decay_steps: the steps the decay lasts, a positive integer; the value
            stays at ``alpha`` times ``init_value`` after. Default: ``10``.
        alpha: the final value as a fraction of ``init_value``, in [0, 1].
            Default: ``0.0``.
        exponent: the power of the cosine factor, > 0 (not in Polaris;
            optax's option). Default: ``1.0``.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.cosine_decay(0.01, decay_steps=1000)
        >>> sched
        cosine_decay(init_value=0.01, decay_steps=1000, alpha=0.0, exponent=1.0)
        >>> sched(500)  # halfway: half the initial value
        Array(0.005, dtype=float32)
        >>> uxs.cosine_decay(0.01, decay_steps=1000, exponent=2.0)(500)  # (½)²
        Array(0.0025, dtype=float32)

    References:
        Polaris.Schedules.cosine_decay; optax.cosine_decay_schedule for
        ``exponent``. Loshchilov & Hutter, "SGDR: Stochastic Gradient Descent
        with Warm Restarts", ICLR 2017. https://arxiv.org/abs/1608.03983
    """

    init_value: Scalar
    decay_steps: int
    alpha: Scalar
    exponent: Scalar

    def __init__(self, init_value: Scalar, *, decay_steps: int = 10, alpha: Scalar = 0.0,
                 exponent: Scalar = 1.0) -> None:
        call = "cosine_decay"
        self._set(init_value=check.number(call, "init_value", init_value),
                  decay_steps=check.positive_int(call, "decay_steps", decay_steps),
                  alpha=check.number(call, "alpha", alpha, 0.0, 1.0),
                  exponent=check.number(call, "exponent", exponent, 0.0, lo_open=True))

    def __call__(self, count: ArrayLike) -> jax.Array:
        return _cosine(_real(count), _real(self.init_value), _real(self.decay_steps), _real(self.alpha),
                       _real(self.exponent))


class polynomial_decay(Schedule):
    r"""Polynomial decay from ``init_value`` to ``end_value`` over ``transition_steps`` steps.

    Formula, with $\eta_\text{init}$ = ``init_value``, $\eta_\text{end}$ = ``end_value``, $p$ = ``power``,
    $k$ = ``transition_steps`` and $s = \min(\max(t - t_0, 0), k)$, $t_0$ = ``transition_begin``:

    $$
    \eta(t) = (\eta_\text{init} - \eta_\text{end})\, (1 - s/k)^p + \eta_\text{end}
    $$

    Args:
        init_value: the value up to ``transition_begin``, any real number.
            No default.
        end_value: the value from ``transition_begin + transition_steps`` on,
            any real number. Default: ``1e-3``.
        power: the exponent, > 0 (``1.0`` decays linearly). Default: ``2.0``.
        transition_steps: the steps the decay lasts, a positive integer.
            Default: ``10``.
        transition_begin: the step the decay begins at, a non-negative integer.
            Default: ``0``.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.polynomial_decay(1.0, end_value=0.0, power=2.0, transition_steps=4)
        >>> sched(2)  # (1 - 2/4) ** 2
        Array(0.25, dtype=float32)

    References:
        Polaris.Schedules.polynomial_decay.
    """

    init_value: Scalar
    end_value: Scalar
    power: Scalar
    transition_steps: int
    transition_begin: int

    def __init__(self, init_value: Scalar, *, end_value: Scalar = 1e-3, power: Scalar = 2.0,
                 transition_steps: int = 10, transition_begin: int = 0) -> None:
        call = "polynomial_decay"
        self._set(init_value=check.number(call, "init_value", init_value),
                  end_value=check.number(call, "end_value", end_value),
                  power=check.number(call, "power", power, 0.0, lo_open=True),
                  transition_steps=check.positive_int(call, "transition_steps", transition_steps),
                  transition_begin=check.integer(call, "transition_begin", transition_begin, 0))

    def __call__(self, count: ArrayLike) -> jax.Array:
        return _polynomial(_real(count), _real(self.init_value), _real(self.end_value), _real(self.power),
                           _real(self.transition_steps), _real(self.transition_begin))


class linear_decay(Schedule):
    r"""Linear warmup from 0 to ``init_value``, then linear decay to 0 at step ``steps``.

    Formula, with $\eta_\text{init}$ = ``init_value``, $w$ = ``warmup`` and $n$ = ``steps``:

    $$
    \begin{align*}
    \eta(t) &= \eta_\text{init}\, t / \max(w, 1) && \text{if } t < w \\
    \eta(t) &= \eta_\text{init} \max(0, (n - t) / \max(n - w, 1)) && \text{otherwise}
    \end{align*}
    $$

    With ``warmup=0`` this is a linear decay from ``init_value`` to 0 over
    ``steps`` steps, ``linear_schedule(init_value, 0.0, steps)``. For a
    linear ramp to another end value, use :class:`linear_schedule`.

    Args:
        init_value: the peak value, reached at step ``warmup`` (when
            ``warmup < steps``; 0 there when they are equal), any real
            number. No default.
        warmup: the warmup steps, an integer in [0, steps]. Default: ``0``.
        steps: the step at which the value reaches 0, a positive integer.
            Default: ``1000``.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.linear_decay(1.0, warmup=2, steps=6)
        >>> [round(float(sched(t)), 4) for t in range(8)]
        [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0]

    References:
        Polaris.Schedules.linear_decay.
    """

    init_value: Scalar
    warmup: int
    steps: int

    def __init__(self, init_value: Scalar, *, warmup: int = 0, steps: int = 1000) -> None:
        call = "linear_decay"
        steps = check.positive_int(call, "steps", steps)
        warmup = check.integer(call, "warmup", warmup, 0)
        if warmup > steps:
            check.fail(call, "warmup", warmup, f"must be in [0, steps] = [0, {steps}]")
        self._set(init_value=check.number(call, "init_value", init_value), warmup=warmup, steps=steps)

    def __call__(self, count: ArrayLike) -> jax.Array:
        t, warmup, steps = _real(count), _real(self.warmup), _real(self.steps)
        up = t / jnp.maximum(warmup, 1)
        down = jnp.maximum(0, (steps - t) / jnp.maximum(steps - warmup, 1))
        return _real(self.init_value) * jnp.where(t < warmup, up, down)


class linear_schedule(Schedule):
    r"""Linear ramp from ``init_value`` to ``end_value`` over ``transition_steps`` steps.

    Formula, with $\eta_\text{init}$ = ``init_value``, $\eta_\text{end}$ = ``end_value``,
    $k$ = ``transition_steps`` and $s = \min(\max(t - t_0, 0), k)$, $t_0$ = ``transition_begin``:

    $$
    \eta(t) = \eta_\text{init}\, (1 - s/k) + \eta_\text{end}\, s/k
    $$

    so ``init_value`` up to ``transition_begin`` and ``end_value`` from
    ``transition_begin + transition_steps`` on, each exactly. This is
    ``polynomial_decay`` with ``power=1.0``.

    Args:
        init_value: the value up to ``transition_begin``, any real number.
            No default.
        end_value: the value from ``transition_begin + transition_steps`` on,
            any real number. No default.
        transition_steps: the steps the ramp lasts, a positive integer.
            No default.
        transition_begin: the step the ramp begins at, a non-negative
            integer. Default: ``0``.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.linear_schedule(1.0, 0.2, transition_steps=4, transition_begin=1)
        >>> [round(float(sched(t)), 4) for t in range(7)]
        [1.0, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2]

    References:
        optax.linear_schedule.
    """

    init_value: Scalar
    end_value: Scalar
    transition_steps: int
    transition_begin: int

    def __init__(self, init_value: Scalar, end_value: Scalar, transition_steps: int,
                 transition_begin: int = 0) -> None:
        call = "linear_schedule"
        self._set(init_value=check.number(call, "init_value", init_value),
                  end_value=check.number(call, "end_value", end_value),
                  transition_steps=check.positive_int(call, "transition_steps", transition_steps),
                  transition_begin=check.integer(call, "transition_begin", transition_begin, 0))

    def __call__(self, count: ArrayLike) -> jax.Array:
        steps = _real(self.transition_steps)
        done = jnp.clip(_real(count) - _real(self.transition_begin), 0, steps) / steps
        return _lerp(_real(self.init_value), _real(self.end_value), done)


# --------------------------------------------------------------------------
# Piecewise schedules


class piecewise_constant(Schedule):
    r"""Piecewise constant: the value given for the last boundary the count has reached.

    Formula, with $\eta_\text{init}$ = ``init_value``, boundaries $b_1 < b_2 < \dots < b_n$, values
    $v_1, v_2, \dots, v_n$ and $b_{n+1} = \infty$:

    $$
    \begin{align*}
    \eta(t) &= \eta_\text{init} && \text{if } t < b_1 \\
    \eta(t) &= v_i && \text{if } b_i \le t < b_{i+1}
    \end{align*}
    $$

    Unlike optax's ``piecewise_constant_schedule``, whose dict holds *scales*
    that multiply into the value, the dict holds the values themselves.

    Args:
        init_value: the value before the first boundary, any real number.
            No default.
        boundaries_and_values: a dict ``{step: value}`` with non-negative
            integer steps (static structure) and real values (pytree leaves).
            No default.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.piecewise_constant(0.1, {4: 1.0, 8: 2.0})
        >>> [round(float(sched(t)), 4) for t in range(10)]
        [0.1, 0.1, 0.1, 0.1, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0]

    References:
        The step-decay schedule of He et al., "Deep Residual Learning for Image
        Recognition", CVPR 2016.
    """

    init_value: Scalar
    boundaries_and_values: dict[int, Scalar]

    def __init__(self, init_value: Scalar, boundaries_and_values: Mapping[int, Scalar]) -> None:
        call = "piecewise_constant"
        self._set(init_value=check.number(call, "init_value", init_value),
                  boundaries_and_values=check.boundaries(call, "boundaries_and_values", boundaries_and_values,
                                                    check.number))

    def __call__(self, count: ArrayLike) -> jax.Array:
        t = _real(count)
        value = jnp.broadcast_to(_real(self.init_value), t.shape)
        for step, v in sorted(self.boundaries_and_values.items()):
            value = jnp.where(t >= step, _real(v), value)
        return value


class piecewise_interpolate(Schedule):
    r"""Interpolates, linearly or by a half cosine, between values that scales multiply in at boundaries.

    Formula, with boundaries $b_0 = 0 \le b_1 < b_2 < \dots < b_n$, their scales $\sigma_i$ and values
    $v_0$ = ``init_value``, $v_i = \sigma_i v_{i-1}$: on $[b_i, b_{i+1})$, with
    $p = (t - b_i) / (b_{i+1} - b_i)$,

    $$
    \begin{align*}
    \eta(t) &= v_i + (v_{i+1} - v_i)\, p && \text{(linear)} \\
    \eta(t) &= v_{i+1} + (v_i - v_{i+1}) \tfrac{1}{2} (1 + \cos(\pi p)) && \text{(cosine)}
    \end{align*}
    $$

    and $\eta(t) = v_n$, the last value, from the last boundary on.

    Args:
        interpolate_type: ``'linear'`` or ``'cosine'`` (static). No default.
        init_value: the value at step 0, any real number. No default.
        boundaries_and_scales: a dict ``{step: scale}`` with non-negative
            integer steps (static structure) and scales >= 0 (pytree leaves);
            None for none. Default: ``None``.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.piecewise_interpolate("linear", 1.0, {4: 0.1, 8: 0.01})
        >>> [round(float(sched(t)), 6) for t in (0, 2, 4, 6, 8, 10)]
        [1.0, 0.55, 0.1, 0.0505, 0.001, 0.001]

    References:
        optax.piecewise_interpolate_schedule.
    """

    interpolate_type: str
    init_value: Scalar
    boundaries_and_scales: dict[int, Scalar]

    _static = ("interpolate_type",)

    def __init__(self, interpolate_type: str, init_value: Scalar,
                 boundaries_and_scales: Mapping[int, Scalar] | None = None) -> None:
        call = "piecewise_interpolate"
        if interpolate_type not in ("linear", "cosine"):
            check.fail(call, "interpolate_type", interpolate_type, "must be 'linear' or 'cosine'")
        self._set(interpolate_type=interpolate_type, init_value=check.number(call, "init_value", init_value),
                  boundaries_and_scales=check.boundaries(call, "boundaries_and_scales",
                                                    {} if boundaries_and_scales is None else boundaries_and_scales,
                                                    functools.partial(check.number, lo=0.0)))

    def __call__(self, count: ArrayLike) -> jax.Array:
        steps, scales = zip(*sorted(self.boundaries_and_scales.items())) if self.boundaries_and_scales else ((), ())
        values = [_real(self.init_value)]
        for scale in scales:
            values.append(values[-1] * _real(scale))
        return _interpolate(self.interpolate_type, _real(count), (0, *steps), values)


class linear_onecycle(Schedule):
    r"""One-cycle with three linear phases: up to ``peak_value``, back down, then annealed.

    Formula, with $\eta_\text{peak}$ = ``peak_value``, $d$ = ``div_factor``, $d_\text{final}$ =
    ``final_div_factor``, $T$ = ``transition_steps``, $v_0 = \eta_\text{peak} / d$,
    $b_1 = \lfloor p_\text{start} T \rfloor$ and $b_2 = \lfloor p_\text{final} T \rfloor$ ($p_\text{start}$ =
    ``pct_start``, $p_\text{final}$ = ``pct_final``): linear interpolation through the points $(0, v_0)$,
    $(b_1, \eta_\text{peak})$, $(b_2, v_0)$, $(T, v_0 / d_\text{final})$, and $v_0 / d_\text{final}$ after $T$.
    Where two points fall on one step, the later one holds there (with $b_1 = 0$ the cycle starts at
    $\eta_\text{peak}$; with $b_1 = b_2$ it drops from just below $\eta_\text{peak}$ to $v_0$ at $b_1$).

    Args:
        transition_steps: the length $T$ of the cycle, a positive integer
            (static). No default.
        peak_value: the value at step $b_1$, any real number. No default.
        pct_start: the fraction of $T$ spent going up, in [0, 1] (static).
            Default: ``0.3``.
        pct_final: the fraction of $T$ at which the value is back at
            $v_0$, in [pct_start, 1] (static). Default: ``0.85``.
        div_factor: $\eta_\text{peak} / v_0$, > 0. Default: ``25.0``.
        final_div_factor: $v_0$ over the final value, > 0. Default: ``1e4``.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.linear_onecycle(10, 1.0, pct_start=0.2, pct_final=0.6, div_factor=4.0,
        ...                             final_div_factor=10.0)
        >>> [round(float(sched(t)), 4) for t in (0, 1, 2, 4, 6, 10)]
        [0.25, 0.625, 1.0, 0.625, 0.25, 0.025]

    References:
        Smith & Topin, "Super-Convergence: Very Fast Training of Neural
        Networks Using Large Learning Rates", 2017.
        https://arxiv.org/abs/1708.07120
    """

    transition_steps: int
    peak_value: Scalar
    pct_start: float
    pct_final: float
    div_factor: Scalar
    final_div_factor: Scalar

    _static = ("transition_steps", "pct_start", "pct_final")

    def __init__(self, transition_steps: int, peak_value: Scalar, pct_start: Scalar = 0.3, pct_final: Scalar = 0.85,
                 div_factor: Scalar = 25.0, final_div_factor: Scalar = 1e4) -> None:
        call = "linear_onecycle"
        pct_start = float(check.number(call, "pct_start", pct_start, 0.0, 1.0))
        self._set(transition_steps=check.positive_int(call, "transition_steps", transition_steps),
                  peak_value=check.number(call, "peak_value", peak_value), pct_start=pct_start,
                  pct_final=float(check.number(call, "pct_final", pct_final, pct_start, 1.0)),
                  div_factor=check.number(call, "div_factor", div_factor, 0.0, lo_open=True),
                  final_div_factor=check.number(call, "final_div_factor", final_div_factor, 0.0, lo_open=True))

    def __call__(self, count: ArrayLike) -> jax.Array:
        steps = self.transition_steps
        bounds = (0, int(self.pct_start * steps), int(self.pct_final * steps), steps)
        peak = _real(self.peak_value)
        start = peak / _real(self.div_factor)
        return _interpolate("linear", _real(count), bounds, [start, peak, start, start / _real(self.final_div_factor)])


class cosine_onecycle(Schedule):
    r"""One-cycle with two half-cosine phases: up to ``peak_value``, then down to the final value.

    Formula, with $\eta_\text{peak}$ = ``peak_value``, $d$ = ``div_factor``, $d_\text{final}$ =
    ``final_div_factor``, $T$ = ``transition_steps``, $v_0 = \eta_\text{peak} / d$ and
    $b_1 = \lfloor p_\text{start} T \rfloor$ ($p_\text{start}$ = ``pct_start``): half-cosine interpolation
    through the points $(0, v_0)$, $(b_1, \eta_\text{peak})$, $(T, v_0 / d_\text{final})$, and
    $v_0 / d_\text{final}$ after $T$. Where two points fall on one step, the later one holds there (with
    $b_1 = 0$ the cycle starts at $\eta_\text{peak}$; with $b_1 = T$ it ends at $v_0 / d_\text{final}$).

    Args:
        transition_steps: the length $T$ of the cycle, a positive integer
            (static). No default.
        peak_value: the value at step $b_1$, any real number. No default.
        pct_start: the fraction of $T$ spent going up, in [0, 1] (static).
            Default: ``0.3``.
        div_factor: $\eta_\text{peak} / v_0$, > 0. Default: ``25.0``.
        final_div_factor: $v_0$ over the final value, > 0. Default: ``1e4``.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.cosine_onecycle(10, 1.0, pct_start=0.2, div_factor=4.0, final_div_factor=10.0)
        >>> [round(float(sched(t)), 4) for t in (0, 1, 2, 6, 10)]
        [0.25, 0.625, 1.0, 0.5125, 0.025]

    References:
        Smith & Topin, "Super-Convergence: Very Fast Training of Neural
        Networks Using Large Learning Rates", 2017.
        https://arxiv.org/abs/1708.07120
    """

    transition_steps: int
    peak_value: Scalar
    pct_start: float
    div_factor: Scalar
    final_div_factor: Scalar

    _static = ("transition_steps", "pct_start")

    def __init__(self, transition_steps: int, peak_value: Scalar, pct_start: Scalar = 0.3, div_factor: Scalar = 25.0,
                 final_div_factor: Scalar = 1e4) -> None:
        call = "cosine_onecycle"
        self._set(transition_steps=check.positive_int(call, "transition_steps", transition_steps),
                  peak_value=check.number(call, "peak_value", peak_value),
                  pct_start=float(check.number(call, "pct_start", pct_start, 0.0, 1.0)),
                  div_factor=check.number(call, "div_factor", div_factor, 0.0, lo_open=True),
                  final_div_factor=check.number(call, "final_div_factor", final_div_factor, 0.0, lo_open=True))

    def __call__(self, count: ArrayLike) -> jax.Array:
        steps = self.transition_steps
        bounds = (0, int(self.pct_start * steps), steps)
        peak = _real(self.peak_value)
        start = peak / _real(self.div_factor)
        return _interpolate("cosine", _real(count), bounds, [start, peak, start / _real(self.final_div_factor)])


# --------------------------------------------------------------------------
# Warmup, restarts and joins


class warmup_constant(Schedule):
    r"""Linear warmup from ``init_value`` to ``peak_value``, then constant at ``peak_value``.

    Formula, with $\eta_\text{init}$ = ``init_value``, $\eta_\text{peak}$ = ``peak_value`` and
    $w$ = ``warmup_steps``:

    $$
    \begin{align*}
    \eta(t) &= \eta_\text{init}\, (1 - t/w) + \eta_\text{peak}\, t/w && \text{if } t < w \\
    \eta(t) &= \eta_\text{peak} && \text{otherwise}
    \end{align*}
    $$

    ($\eta_\text{peak}$ from step 0 when $w = 0$, as in the other
    warmup schedules; optax holds ``init_value`` then).

    Args:
        init_value: the value at step 0, any real number. No default.
        peak_value: the value from the end of the warmup on, any real number.
            No default.
        warmup_steps: the warmup steps, a non-negative integer. No default.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.warmup_constant(0.0, 1.0, warmup_steps=4)
        >>> [round(float(sched(t)), 4) for t in range(7)]
        [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0]

    References:
        optax.warmup_constant_schedule. Goyal et al., "Accurate, Large
        Minibatch SGD: Training ImageNet in 1 Hour", 2017.
        https://arxiv.org/abs/1706.02677
    """

    init_value: Scalar
    peak_value: Scalar
    warmup_steps: int

    def __init__(self, init_value: Scalar, peak_value: Scalar, warmup_steps: int) -> None:
        call = "warmup_constant"
        self._set(init_value=check.number(call, "init_value", init_value),
                  peak_value=check.number(call, "peak_value", peak_value),
                  warmup_steps=check.integer(call, "warmup_steps", warmup_steps, 0))

    def __call__(self, count: ArrayLike) -> jax.Array:
        t, peak, warmup = _real(count), _real(self.peak_value), _real(self.warmup_steps)
        return jnp.where(t < warmup, _warmup(t, _real(self.init_value), peak, warmup), peak)


class warmup_cosine_decay(Schedule):
    r"""Linear warmup from ``init_value`` to ``peak_value``, then cosine decay to ``end_value``.

    Formula, with $\eta_\text{init}$ = ``init_value``, $\eta_\text{peak}$ = ``peak_value``,
    $\eta_\text{end}$ = ``end_value``, $\gamma$ = ``exponent``, $w$ = ``warmup_steps``, $n$ = ``decay_steps``
    and $k = n - w$:

    $$
    \begin{align*}
    \eta(t) &= \eta_\text{init} + (\eta_\text{peak} - \eta_\text{init})\, t/w && \text{if } t < w \\
    \eta(t) &= \eta_\text{end} + (\eta_\text{peak} - \eta_\text{end})\, c^\gamma && \text{otherwise} \\
    c &= \tfrac{1}{2} \left(1 + \cos(\pi \min(t - w, k) / k)\right)
    \end{align*}
    $$

    (0 throughout the decay when $\eta_\text{peak} = 0$, as in optax).

    Args:
        init_value: the value at step 0, any real number. No default.
        peak_value: the value at the end of the warmup, any real number.
            No default.
        warmup_steps: the warmup steps, a non-negative integer. No default.
        decay_steps: the total length of warmup and decay, an integer greater
            than ``warmup_steps``. No default.
        end_value: the value from step ``decay_steps`` on, any real number.
            Default: ``0.0``.
        exponent: the power of the cosine factor, > 0. Default: ``1.0``.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.warmup_cosine_decay(0.0, 1.0, warmup_steps=2, decay_steps=6)
        >>> [round(float(sched(t)), 4) for t in (0, 1, 2, 4, 6, 9)]
        [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]

    References:
        optax.warmup_cosine_decay_schedule. Loshchilov & Hutter, "SGDR:
        Stochastic Gradient Descent with Warm Restarts", ICLR 2017.
        https://arxiv.org/abs/1608.03983
    """

    init_value: Scalar
    peak_value: Scalar
    warmup_steps: int
    decay_steps: int
    end_value: Scalar
    exponent: Scalar

    def __init__(self, init_value: Scalar, peak_value: Scalar, warmup_steps: int, decay_steps: int,
                 end_value: Scalar = 0.0, exponent: Scalar = 1.0) -> None:
        call = "warmup_cosine_decay"
        warmup_steps = check.integer(call, "warmup_steps", warmup_steps, 0)
        decay_steps = check.positive_int(call, "decay_steps", decay_steps)
        if decay_steps <= warmup_steps:
            check.fail(call, "decay_steps", decay_steps, f"must be greater than warmup_steps={warmup_steps}")
        self._set(init_value=check.number(call, "init_value", init_value),
                  peak_value=check.number(call, "peak_value", peak_value), warmup_steps=warmup_steps,
                  decay_steps=decay_steps, end_value=check.number(call, "end_value", end_value),
                  exponent=check.number(call, "exponent", exponent, 0.0, lo_open=True))

    def __call__(self, count: ArrayLike) -> jax.Array:
        t, peak, end, warmup = _real(count), _real(self.peak_value), _real(self.end_value), _real(self.warmup_steps)
        alpha = jnp.where(peak == 0, 0.0, end / jnp.where(peak == 0, 1.0, peak))
        decay = _cosine(t - warmup, peak, _real(self.decay_steps) - warmup, alpha, _real(self.exponent))
        return jnp.where(t < warmup, _warmup(t, _real(self.init_value), peak, warmup), decay)


class warmup_exponential_decay(Schedule):
    r"""Linear warmup from ``init_value`` to ``peak_value``, then exponential decay.

    Formula, with $\eta_\text{init}$ = ``init_value``, $\eta_\text{peak}$ = ``peak_value`` and
    $w$ = ``warmup_steps``:

    $$
    \begin{align*}
    \eta(t) &= \eta_\text{init} + (\eta_\text{peak} - \eta_\text{init})\, t/w && \text{if } t < w \\
    \eta(t) &= e(t - w) && \text{otherwise}
    \end{align*}
    $$

    where $e$ is ``exponential_decay(peak_value, ...)``, the exponential decay from $\eta_\text{peak}$
    with ``decay_rate``, ``transition_steps``, ``transition_begin``, ``staircase`` and ``end_value``.

    Args:
        init_value: the value at step 0, any real number. No default.
        peak_value: the value at the end of the warmup, any real number.
            No default.
        warmup_steps: the warmup steps, a non-negative integer. No default.
        transition_steps: steps per factor of ``decay_rate``, a positive
            integer. No default.
        decay_rate: the factor per ``transition_steps`` steps, > 0. No default.
        transition_begin: steps after the warmup before the decay begins, a
            non-negative integer. Default: ``0``.
        staircase: decay in whole steps of ``transition_steps``.
            Default: ``False``.
        end_value: the bound the value stops at (a floor when
            ``decay_rate < 1``, a ceiling otherwise); None for no bound.
            Default: ``None``.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.warmup_exponential_decay(0.0, 1.0, warmup_steps=2, transition_steps=1, decay_rate=0.5)
        >>> [round(float(sched(t)), 4) for t in range(5)]
        [0.0, 0.5, 1.0, 0.5, 0.25]

    References:
        optax.warmup_exponential_decay_schedule.
    """

    init_value: Scalar
    peak_value: Scalar
    warmup_steps: int
    transition_steps: int
    decay_rate: Scalar
    transition_begin: int
    staircase: bool
    end_value: Scalar | None

    _static = ("staircase",)

    def __init__(self, init_value: Scalar, peak_value: Scalar, warmup_steps: int, transition_steps: int,
                 decay_rate: Scalar, transition_begin: int = 0, staircase: bool = False,
                 end_value: Scalar | None = None) -> None:
        call = "warmup_exponential_decay"
        self._set(init_value=check.number(call, "init_value", init_value),
                  peak_value=check.number(call, "peak_value", peak_value),
                  warmup_steps=check.integer(call, "warmup_steps", warmup_steps, 0),
                  transition_steps=check.positive_int(call, "transition_steps", transition_steps),
                  decay_rate=check.number(call, "decay_rate", decay_rate, 0.0, lo_open=True),
                  transition_begin=check.integer(call, "transition_begin", transition_begin, 0),
                  staircase=check.flag(call, "staircase", staircase),
                  end_value=None if end_value is None else check.number(call, "end_value", end_value))

    def __call__(self, count: ArrayLike) -> jax.Array:
        t, peak, warmup = _real(count), _real(self.peak_value), _real(self.warmup_steps)
        end = None if self.end_value is None else _real(self.end_value)
        decay = _exponential(t - warmup, peak, _real(self.decay_rate), _real(self.transition_steps),
                             _real(self.transition_begin), self.staircase, end)
        return jnp.where(t < warmup, _warmup(t, _real(self.init_value), peak, warmup), decay)


class join_schedules(Schedule):
    r"""Runs ``schedules[0]``, then from each boundary the next schedule, restarted at 0.

    Formula, with $s_i$ = ``schedules[i]``, boundaries $b_1 \le b_2 \le \dots \le b_n$ and
    $b_{n+1} = \infty$ (where boundaries are equal, the later schedule runs from them):

    $$
    \begin{align*}
    \eta(t) &= s_0(t) && \text{if } t < b_1 \\
    \eta(t) &= s_i(t - b_i) && \text{if } b_i \le t < b_{i+1}
    \end{align*}
    $$

    Args:
        schedules: a non-empty sequence of schedules. Schedule objects are
            pytree children; plain functions ``count -> value`` are static
            structure and must be hashable. No default.
        boundaries: one non-negative integer step per schedule after the
            first, non-decreasing (pytree leaves). No default.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.join_schedules([uxs.constant(1.0), uxs.linear_decay(1.0, steps=4)], [2])
        >>> [round(float(sched(t)), 4) for t in range(7)]
        [1.0, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]

    References:
        optax.join_schedules.
    """

    schedules: tuple[Schedule, ...]
    boundaries: tuple[int, ...]

    def __init__(self, schedules: Sequence[ScheduleLike], boundaries: Sequence[int]) -> None:
        call = "join_schedules"
        try:
            schedules, boundaries = tuple(schedules), tuple(boundaries)
        except TypeError:
            check.fail(call, "schedules", schedules, "and boundaries must be sequences", TypeError)
        if not schedules:
            check.fail(call, "schedules", schedules, "must hold at least one schedule")
        for fn in schedules:
            if not callable(fn):
                check.fail(call, "schedules", schedules, f"must hold callables, got {fn!r}", TypeError)
            if not isinstance(fn, Schedule):
                try:
                    hash(fn)
                except TypeError:
                    check.fail(call, "schedules", schedules, f"must hold hashable functions, got {fn!r}", TypeError)
        if len(boundaries) != len(schedules) - 1:
            check.fail(call, "boundaries", boundaries,
                        f"must hold len(schedules) - 1 = {len(schedules) - 1} steps")
        boundaries = tuple(check.integer(call, "boundaries", b, 0) for b in boundaries)
        if list(boundaries) != sorted(boundaries):
            check.fail(call, "boundaries", boundaries, "must be non-decreasing")
        self._set(schedules=tuple(fn if isinstance(fn, Schedule) else _Function(fn) for fn in schedules),
                  boundaries=boundaries)

    def __call__(self, count: ArrayLike) -> jax.Array:
        count = jnp.asarray(count)
        value = _real(self.schedules[0](count))
        for boundary, schedule in zip(self.boundaries, self.schedules[1:]):
            # (evaluated at 0 before its boundary, where the value is not taken: a schedule refuses a negative count)
            value = jnp.where(count < boundary, value, _real(schedule(jnp.maximum(count - boundary, 0))))
        return value


class sgdr(Schedule):
    r"""SGD with warm restarts: a sequence of warmup-cosine cycles, each starting at step 0.

    Formula: cycle $c_i$ is ``warmup_cosine_decay(**cosine_kwargs[i])`` and
    runs for its ``decay_steps`` steps; the last one holds its ``end_value``
    after. From the start $T_i$ of cycle $i$ (the sum of the ``decay_steps`` of the
    cycles before it) to the start of the next,

    $$
    \eta(t) = c_i(t - T_i)
    $$

    Args:
        cosine_kwargs: a non-empty sequence of cycles, each a dict of
            :class:`warmup_cosine_decay` options or a ``warmup_cosine_decay``
            object. No default.

    Returns:
        A schedule ``count -> value`` (float32) that holds the cycles as
        ``warmup_cosine_decay`` objects.

    Example:
        >>> import updax.schedules as uxs
        >>> cycle = dict(init_value=0.0, peak_value=1.0, warmup_steps=1, decay_steps=3)
        >>> sched = uxs.sgdr([cycle, cycle])
        >>> [round(float(sched(t)), 4) for t in range(7)]
        [0.0, 1.0, 0.5, 0.0, 1.0, 0.5, 0.0]

    References:
        Loshchilov & Hutter, "SGDR: Stochastic Gradient Descent with Warm
        Restarts", ICLR 2017. https://arxiv.org/abs/1608.03983
    """

    cosine_kwargs: tuple[warmup_cosine_decay, ...]

    def __init__(self, cosine_kwargs: Sequence[dict[str, Any] | warmup_cosine_decay]) -> None:
        call = "sgdr"
        cycles = tuple(cosine_kwargs) if isinstance(cosine_kwargs, (list, tuple)) else ()
        if not cycles:
            check.fail(call, "cosine_kwargs", cosine_kwargs, "must be a non-empty list of cycles")
        for cycle in cycles:
            if not isinstance(cycle, (dict, warmup_cosine_decay)):
                check.fail(call, "cosine_kwargs", cosine_kwargs,
                            "must hold dicts of warmup_cosine_decay options or warmup_cosine_decay objects",
                            TypeError)
        self._set(cosine_kwargs=tuple(c if isinstance(c, warmup_cosine_decay) else warmup_cosine_decay(**c)
                                      for c in cycles))

    def __call__(self, count: ArrayLike) -> jax.Array:
        count = jnp.asarray(count)
        cycles = self.cosine_kwargs
        value, begin = cycles[0](count), 0
        for previous, cycle in zip(cycles, cycles[1:]):
            begin = begin + previous.decay_steps
            value = jnp.where(count < begin, value, cycle(jnp.maximum(count - begin, 0)))
        return value


class relative_step(Schedule):
    r"""Adafactor's relative step size: $1/\sqrt{t}$, capped.

    Formula, with $\eta_\text{max}$ = ``max_value``: $\eta(t) = \min(\eta_\text{max}, 1/\sqrt{t + 1})$ (the
    paper's $t$ counts from 1).

    Args:
        max_value: the cap, > 0. Default: ``0.01``.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.relative_step()
        >>> sched(0), sched(39_999)
        (Array(0.01, dtype=float32), Array(0.005, dtype=float32))

    References:
        Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear
        Memory Cost", ICML 2018, section 8. https://arxiv.org/abs/1804.04235
    """

    max_value: Scalar

    def __init__(self, max_value: Scalar = 0.01) -> None:
        self._set(max_value=check.number("relative_step", "max_value", max_value, 0.0, lo_open=True))

    def __call__(self, count: ArrayLike) -> jax.Array:
        return jnp.minimum(_real(self.max_value), jax.lax.rsqrt(_real(count) + 1.0))


# --------------------------------------------------------------------------
# Current practice and torch.optim.lr_scheduler's schedules


_COOLDOWNS = ("linear", "cosine", "1-sqrt")


class warmup_stable_decay(Schedule):
    r"""Warmup-stable-decay (WSD): a linear warmup, a constant stretch at ``peak_value``, then a cooldown.

    Formula, with $\eta_\text{init}$ = ``init_value``, $\eta_\text{peak}$ = ``peak_value``,
    $\eta_\text{end}$ = ``end_value``, $w$ = ``warmup_steps``, $s$ = ``stable_steps``, $c$ = ``cooldown_steps``
    and $p = (t - w - s) / c$ the fraction of the cooldown done:

    $$
    \begin{align*}
    \eta(t) &= \eta_\text{init}\, (1 - t/w) + \eta_\text{peak}\, t/w && \text{if } t < w \\
    \eta(t) &= \eta_\text{peak} && \text{if } w \le t < w + s \\
    \eta(t) &= \eta_\text{end} + (\eta_\text{peak} - \eta_\text{end})\, f(p) && \text{if } w + s \le t < w + s + c \\
    \eta(t) &= \eta_\text{end} && \text{otherwise}
    \end{align*}
    $$

    with the cooldown's shape $f(p) = 1 - p$ (``'linear'``), $\tfrac{1}{2} (1 + \cos(\pi p))$ (``'cosine'``)
    or $1 - \sqrt{p}$ (``'1-sqrt'``, the one Hägele et al. find best).

    Args:
        init_value: the value at step 0, any real number. No default.
        peak_value: the value from the end of the warmup to the start of the
            cooldown, any real number. No default.
        warmup_steps: the warmup steps, a non-negative integer (0: the peak
            from step 0). No default.
        stable_steps: the steps at ``peak_value``, a non-negative integer.
            No default.
        cooldown_steps: the steps of the cooldown, a positive integer.
            No default.
        end_value: the value from step ``warmup_steps + stable_steps +
            cooldown_steps`` on, any real number. Default: ``0.0``.
        cooldown_type: ``'linear'``, ``'cosine'`` or ``'1-sqrt'`` (static).
            Default: ``'linear'``.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.warmup_stable_decay(0.0, 1.0, warmup_steps=2, stable_steps=2, cooldown_steps=4,
        ...                                 cooldown_type="1-sqrt")
        >>> [round(float(sched(t)), 4) for t in range(10)]
        [0.0, 0.5, 1.0, 1.0, 1.0, 0.5, 0.2929, 0.134, 0.0, 0.0]

    References:
        Hägele et al., "Scaling Laws and Compute-Optimal Training Beyond Fixed
        Training Durations", NeurIPS 2024. https://arxiv.org/abs/2405.18392
        Hu et al., "MiniCPM: Unveiling the Potential of Small Language Models
        with Scalable Training Strategies", 2024. https://arxiv.org/abs/2404.06395
    """

    init_value: Scalar
    peak_value: Scalar
    warmup_steps: int
    stable_steps: int
    cooldown_steps: int
    end_value: Scalar
    cooldown_type: str

    _static = ("cooldown_type",)

    def __init__(self, init_value: Scalar, peak_value: Scalar, warmup_steps: int, stable_steps: int,
                 cooldown_steps: int, end_value: Scalar = 0.0, cooldown_type: str = "linear") -> None:
        call = "warmup_stable_decay"
        if cooldown_type not in _COOLDOWNS:
            check.fail(call, "cooldown_type", cooldown_type, "must be 'linear', 'cosine' or '1-sqrt'")
        self._set(init_value=check.number(call, "init_value", init_value),
                  peak_value=check.number(call, "peak_value", peak_value),
                  warmup_steps=check.integer(call, "warmup_steps", warmup_steps, 0),
                  stable_steps=check.integer(call, "stable_steps", stable_steps, 0),
                  cooldown_steps=check.positive_int(call, "cooldown_steps", cooldown_steps),
                  end_value=check.number(call, "end_value", end_value), cooldown_type=cooldown_type)

    def __call__(self, count: ArrayLike) -> jax.Array:
        t, peak, end = _real(count), _real(self.peak_value), _real(self.end_value)
        warmup, cooldown = _real(self.warmup_steps), _real(self.cooldown_steps)
        done = jnp.clip(t - warmup - _real(self.stable_steps), 0, cooldown) / cooldown
        if self.cooldown_type == "linear":
            left = 1 - done
        elif self.cooldown_type == "cosine":
            left = 0.5 * (1 + jnp.cos(jnp.pi * done))
        else:
            left = 1 - jnp.sqrt(done)
        # exact at both ends of the cooldown: the peak where nothing is done, the end value where all is
        decay = jnp.where(done == 0, peak, jnp.where(done == 1, end, _lerp(end, peak, left)))
        return jnp.where(t < warmup, _warmup(t, _real(self.init_value), peak, warmup), decay)


_CYCLIC_MODES = ("triangular", "triangular2", "exp_range")


class cyclic(Schedule):
    r"""Cyclical learning rates (torch's ``CyclicLR``): a triangle wave between two values.

    Formula, with $\eta_\text{base}$ = ``base_value``, $\eta_\text{max}$ = ``max_value``, $u$ =
    ``step_size_up``, $d$ = ``step_size_down``, $n = u + d$ the cycle's length, $r = u / n$, the cycle
    $k = \lfloor 1 + t/n \rfloor$ and $x = 1 + t/n - k$ the position in it:

    $$
    \begin{align*}
    h &= x / r && \text{if } x \le r \\
    h &= (x - 1) / (r - 1) && \text{otherwise} \\
    \eta(t) &= \eta_\text{base} + (\eta_\text{max} - \eta_\text{base})\, h\, \sigma
    \end{align*}
    $$

    with the amplitude's scale $\sigma = 1$ (``'triangular'``), $\sigma = 2^{-(k - 1)}$ (``'triangular2'``: halved
    every cycle) or $\sigma = \gamma^t$ (``'exp_range'``, $\gamma$ = ``gamma``).

    Args:
        base_value: the low end of the cycle and the value at step 0 (torch's
            ``base_lr``), any real number. No default.
        max_value: the high end (torch's ``max_lr``), any real number.
            No default.
        step_size_up: the steps from ``base_value`` up to ``max_value``, a
            positive integer. Default: ``2000``.
        step_size_down: the steps back down, a positive integer; None for
            ``step_size_up``. Default: ``None``.
        mode: ``'triangular'``, ``'triangular2'`` or ``'exp_range'`` (static).
            Default: ``'triangular'``.
        gamma: the factor per step of ``'exp_range'``'s amplitude, in (0, 1]
            (the other modes ignore it). Default: ``1.0``.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.cyclic(0.0, 1.0, step_size_up=2, mode="triangular2")
        >>> [round(float(sched(t)), 4) for t in range(10)]
        [0.0, 0.5, 1.0, 0.5, 0.0, 0.25, 0.5, 0.25, 0.0, 0.125]

    References:
        Smith, "Cyclical Learning Rates for Training Neural Networks", WACV
        2017. https://arxiv.org/abs/1506.01186 torch.optim.lr_scheduler.CyclicLR.
    """

    base_value: Scalar
    max_value: Scalar
    step_size_up: int
    step_size_down: int | None
    mode: str
    gamma: Scalar

    _static = ("mode",)

    def __init__(self, base_value: Scalar, max_value: Scalar, step_size_up: int = 2000,
                 step_size_down: int | None = None, mode: str = "triangular", gamma: Scalar = 1.0) -> None:
        call = "cyclic"
        if mode not in _CYCLIC_MODES:
            check.fail(call, "mode", mode, "must be 'triangular', 'triangular2' or 'exp_range'")
        self._set(base_value=check.number(call, "base_value", base_value),
                  max_value=check.number(call, "max_value", max_value),
                  step_size_up=check.positive_int(call, "step_size_up", step_size_up),
                  step_size_down=None if step_size_down is None else check.positive_int(call, "step_size_down",
                                                                                        step_size_down),
                  mode=mode, gamma=check.number(call, "gamma", gamma, 0.0, 1.0, lo_open=True))

    def __call__(self, count: ArrayLike) -> jax.Array:
        t, count = _real(count), jnp.asarray(count)
        down = self.step_size_up if self.step_size_down is None else self.step_size_down
        up = _real(self.step_size_up)
        length = up + _real(down)
        steps = jnp.asarray(self.step_size_up) + jnp.asarray(down)
        if jnp.issubdtype(count.dtype, jnp.integer) and jnp.issubdtype(steps.dtype, jnp.integer):
            # in integers: float32's t / n is off by whole steps past 2**24 (a negative rate at 2**31)
            steps = steps.astype(count.dtype)
            cycles, within = _real(count // steps), _real(count % steps)
        else:
            cycles = jnp.floor(t / length)  # k - 1, whole cycles done
            within = t - cycles * length  # exact where t/n + 1 - k rounds
        x = within / length
        ratio = up / length
        height = jnp.where(x <= ratio, x / ratio, (x - 1) / (ratio - 1))
        if self.mode == "triangular2":
            height = height * 0.5**cycles
        elif self.mode == "exp_range":
            height = height * _real(self.gamma) ** t
        return _lerp(_real(self.base_value), _real(self.max_value), height)


class cosine_warm_restarts(Schedule):
    r"""Cosine annealing with warm restarts whose period grows (torch's ``CosineAnnealingWarmRestarts``).

    Formula, with $\eta_\text{init}$ = ``init_value``, $\eta_\text{end}$ = ``end_value``, $T_0$ = ``period``
    and $m$ = ``period_mult``: cycle $i = 0, 1, \dots$ lasts $T_i = T_0 m^i$ steps and starts at
    $S_i = \sum_{j < i} T_j$; in it, with $t_\text{cur} = t - S_i$,

    $$
    \eta(t) = \eta_\text{end} + (\eta_\text{init} - \eta_\text{end})\, \tfrac{1}{2}
        \left(1 + \cos(\pi\, t_\text{cur} / T_i)\right)
    $$

    so every cycle starts at $\eta_\text{init}$ and it never ends. :class:`sgdr` runs a given,
    finite list of cycles, each with its own warmup.

    Args:
        init_value: the value at the start of every cycle (torch's initial
            learning rate), any real number. No default.
        period: the length $T_0$ of the first cycle (torch's ``T_0``), a
            positive integer. No default.
        period_mult: the factor $m$ by which each cycle is longer than the
            one before (torch's ``T_mult``), a positive integer (static).
            Default: ``1``.
        end_value: the value each cycle decays towards (torch's
            ``eta_min``), any real number. Default: ``0.0``.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.cosine_warm_restarts(1.0, period=2, period_mult=2)
        >>> [round(float(sched(t)), 4) for t in range(8)]
        [1.0, 0.5, 1.0, 0.8536, 0.5, 0.1464, 1.0, 0.9619]

    References:
        Loshchilov & Hutter, "SGDR: Stochastic Gradient Descent with Warm
        Restarts", ICLR 2017. https://arxiv.org/abs/1608.03983
        torch.optim.lr_scheduler.CosineAnnealingWarmRestarts.
    """

    init_value: Scalar
    period: int
    period_mult: int
    end_value: Scalar

    _static = ("period_mult",)

    def __init__(self, init_value: Scalar, period: int, period_mult: int = 1, end_value: Scalar = 0.0) -> None:
        call = "cosine_warm_restarts"
        self._set(init_value=check.number(call, "init_value", init_value),
                  period=check.positive_int(call, "period", period),
                  period_mult=check.positive_int(call, "period_mult", period_mult),
                  end_value=check.number(call, "end_value", end_value))

    def __call__(self, count: ArrayLike) -> jax.Array:
        t, first, m = _real(count), _real(self.period), self.period_mult
        count = jnp.asarray(count)
        if m == 1 and jnp.issubdtype(count.dtype, jnp.integer):
            # the step within the cycle in integers: float32's t / T_0 is off by whole steps past 2**24
            within, length = _real(jnp.remainder(count, jnp.asarray(self.period, count.dtype))), first
        elif m == 1:
            cycle = jnp.floor(t / first)
            within, length = t - cycle * first, first
        else:
            # the cycle from the closed form of S_i, then moved by one where float32's log rounded across a start
            cycle = jnp.floor(jnp.log1p(t * (m - 1) / first) / math.log(m))
            start_of = lambda i: first * (m**i - 1) / (m - 1)  # noqa: E731
            cycle = jnp.where(start_of(cycle) > t, cycle - 1, cycle)
            cycle = jnp.where(start_of(cycle + 1) <= t, cycle + 1, cycle)
            within, length = t - start_of(cycle), first * m**cycle
        cos = 0.5 * (1 + jnp.cos(jnp.pi * within / length))
        return _lerp(_real(self.end_value), _real(self.init_value), cos)


class multiply_schedules(Schedule):
    r"""The product of schedules: torch's ``ChainedScheduler`` of schedulers that each multiply the rate.

    Formula, with $s_i$ = ``schedules[i]``: $\eta(t) = \prod_i s_i(t)$.

    To port a ``ChainedScheduler``, write each torch scheduler as the schedule of its factor (1 at
    step 0) and add the initial learning rate as a ``constant``:
    ``ChainedScheduler([ConstantLR(opt, factor=0.1, total_iters=2), ExponentialLR(opt, gamma=0.9)])`` with
    learning rate 1 is ``multiply_schedules([constant(1.0), piecewise_constant(0.1, {2: 1.0}),
    exponential_decay(1.0, decay_rate=0.9, transition_steps=1)])``.

    Args:
        schedules: a non-empty sequence of schedules. Schedule objects are
            pytree children; plain functions ``count -> value`` are static
            structure and must be hashable. No default.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.multiply_schedules([uxs.constant(2.0), uxs.piecewise_constant(0.1, {2: 1.0}),
        ...                                 uxs.exponential_decay(1.0, decay_rate=0.5, transition_steps=1)])
        >>> [round(float(sched(t)), 4) for t in range(5)]
        [0.2, 0.1, 0.5, 0.25, 0.125]

    References:
        torch.optim.lr_scheduler.ChainedScheduler.
    """

    schedules: tuple[Schedule, ...]

    def __init__(self, schedules: Sequence[ScheduleLike]) -> None:
        call = "multiply_schedules"
        if not isinstance(schedules, (list, tuple)) or not schedules:
            check.fail(call, "schedules", schedules, "must be a non-empty list of schedules")
        self._set(schedules=tuple(_schedule_like(call, "schedules", fn) for fn in schedules))

    def __call__(self, count: ArrayLike) -> jax.Array:
        value = _real(self.schedules[0](count))
        for schedule in self.schedules[1:]:
            value = value * _real(schedule(count))
        return value


class swalr(Schedule):
    r"""SWA's learning rate (torch's ``SWALR``): annealed from ``init_value`` to ``swa_value``, then held.

    Formula, with $\eta_\text{init}$ = ``init_value``, $\eta_\text{swa}$ = ``swa_value``, $k$ =
    ``anneal_steps`` and $p = \min(t / k, 1)$ ($p = 1$ when $k = 0$):

    $$
    \eta(t) = \eta_\text{swa}\, a(p) + \eta_\text{init}\, (1 - a(p))
    $$

    with $a(p) = \tfrac{1}{2} (1 - \cos(\pi p))$ (``'cos'``) or $a(p) = p$ (``'linear'``). To start it
    at SWA's first step ``swa_start`` after another schedule, join them:
    ``join_schedules([schedule, swalr(...)], [swa_start])``.

    Args:
        init_value: the value annealing starts from (torch: the optimizer's
            learning rate when SWA starts), any real number. No default.
        swa_value: the value annealed to and held (torch's ``swa_lr``), any
            real number. No default.
        anneal_steps: the steps of the annealing (torch's ``anneal_epochs``,
            counted in the steps the schedule is called at), a non-negative
            integer. Default: ``10``.
        anneal_strategy: ``'cos'`` or ``'linear'`` (static). Default: ``'cos'``.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.swalr(1.0, 0.2, anneal_steps=2, anneal_strategy="linear")
        >>> [round(float(sched(t)), 4) for t in range(4)]
        [1.0, 0.6, 0.2, 0.2]

    References:
        Izmailov et al., "Averaging Weights Leads to Wider Optima and Better
        Generalization", UAI 2018. https://arxiv.org/abs/1803.05407
        torch.optim.swa_utils.SWALR.
    """

    init_value: Scalar
    swa_value: Scalar
    anneal_steps: int
    anneal_strategy: str

    _static = ("anneal_strategy",)

    def __init__(self, init_value: Scalar, swa_value: Scalar, anneal_steps: int = 10,
                 anneal_strategy: str = "cos") -> None:
        call = "swalr"
        if anneal_strategy not in ("cos", "linear"):
            check.fail(call, "anneal_strategy", anneal_strategy, "must be 'cos' or 'linear'")
        self._set(init_value=check.number(call, "init_value", init_value),
                  swa_value=check.number(call, "swa_value", swa_value),
                  anneal_steps=check.integer(call, "anneal_steps", anneal_steps, 0), anneal_strategy=anneal_strategy)

    def __call__(self, count: ArrayLike) -> jax.Array:
        t, steps = _real(count), _real(self.anneal_steps)
        p = jnp.where(steps == 0, 1.0, jnp.minimum(t / jnp.maximum(steps, 1), 1.0))
        a = p if self.anneal_strategy == "linear" else jnp.where(p == 1, 1.0, 0.5 * (1 - jnp.cos(jnp.pi * p)))
        return _lerp(_real(self.init_value), _real(self.swa_value), a)


class power_decay_rate(Schedule):
    r"""A decay rate that rises to 1 as $1 - (t + 1)^{-c}$: Adafactor's and PaLM's second-moment decay.

    Formula, with $c$ = ``exponent`` and $\beta_\text{max}$ = ``max_value``:

    $$
    \beta(t) = \min\left(\beta_\text{max},\ 1 - (t + 1)^{-c}\right)
    $$

    the paper's $1 - k^{-c}$ at its step $k = t + 1$ (so 0 on the first step: the first second moment
    is the first squared gradient). Pass it as a decay rate, e.g. ``scale_by_adam(b2=power_decay_rate())``
    (PaLM's $\beta_2 = 1 - k^{-0.8}$); ``scale_by_factored_rms`` and ``adafactor`` build it in from their
    ``decay_rate``, the exponent.

    Args:
        exponent: $c$, > 0. Default: ``0.8``.
        max_value: the cap $\beta_\text{max}$, in (0, 1]. Default: ``1.0``.

    Returns:
        A schedule ``count -> value`` (float32).

    Example:
        >>> import updax.schedules as uxs
        >>> sched = uxs.power_decay_rate()
        >>> [round(float(sched(t)), 4) for t in (0, 1, 9, 999)]
        [0.0, 0.4257, 0.8415, 0.996]

    References:
        Chowdhery et al., "PaLM: Scaling Language Modeling with Pathways",
        2022, section 5. https://arxiv.org/abs/2204.02311 Shazeer & Stern,
        "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost", ICML
        2018, section 7. https://arxiv.org/abs/1804.04235
    """

    exponent: Scalar
    max_value: Scalar

    def __init__(self, exponent: Scalar = 0.8, max_value: Scalar = 1.0) -> None:
        call = "power_decay_rate"
        self._set(exponent=check.number(call, "exponent", exponent, 0.0, lo_open=True),
                  max_value=check.number(call, "max_value", max_value, 0.0, 1.0, lo_open=True))

    def __call__(self, count: ArrayLike) -> jax.Array:
        return jnp.minimum(_real(self.max_value), 1.0 - (_real(count) + 1.0) ** -_real(self.exponent))


def _schedule_like(call, name, fn):
    """A schedule object as it is, a plain hashable function wrapped as static structure."""
    if isinstance(fn, Schedule):
        return fn
    if not callable(fn):
        check.fail(call, name, fn, f"must hold schedules (callables), got {fn!r}", TypeError)
    try:
        hash(fn)
    except TypeError:
        check.fail(call, name, fn, f"must hold hashable functions, got {fn!r}", TypeError)
    return _Function(fn)
