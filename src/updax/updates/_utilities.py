"""Utilities: zeroing NaNs, keeping params non-negative, and snapshots and measurements of the updates for
inspection."""

from __future__ import annotations

import dataclasses
import keyword
from collections.abc import Callable
from typing import Annotated, Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import Count, Flag, FloatDtype, Function, Real, Valid, fail
from updax._options import format_value
from updax._primitives import stateful, stateless
from updax._typing import DType, PyTree
from updax._update import Update
from updax.updates._kernels import real_only

# --------------------------------------------------------------------------
# zero_nans


class ZeroNansState(NamedTuple):
    """Per leaf of the updates, a bool scalar: whether the last call found a NaN in that leaf."""

    found_nan: Annotated[Any, Flag()]


def _init_zero_nans(params):
    return ZeroNansState(found_nan=jax.tree.map(lambda p: _tree.full((), False, jnp.bool_, p, dims=()), params))


def _apply_zero_nans(updates, state, params):
    found_nan = jax.tree.map(lambda u: jnp.any(jnp.isnan(u)), updates)
    zeroed = jax.tree.map(lambda u: jnp.where(jnp.isnan(u), jnp.zeros((), u.dtype), u), updates)
    return zeroed, ZeroNansState(found_nan=found_nan)


@combinator
def zero_nans() -> Update:
    r"""Replaces the NaN entries of the updates with 0, recording per leaf whether it found one.

    Update rule: $u \gets 0$ where $u$ is NaN, else $u$; and
    ``found_nan`` $\gets \operatorname{any}(\operatorname{isnan}(u))$ for each leaf. Infinities pass unchanged.
    The state is for the user (``opt.get_state(state, "zero_nans.found_nan")``):
    the stage does not read it.

    Returns:
        An update object with state ``ZeroNansState(found_nan)``, one bool
        scalar per leaf of the params.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.zero_nans()
        >>> g = {"a": jnp.array([1.0, jnp.nan]), "b": jnp.array([2.0])}
        >>> updates, state = opt.update(g, opt.init(g))
        >>> updates["a"], opt.get_state(state, "zero_nans.found_nan")
        (Array([1., 0.], dtype=float32), {'a': Array(True, dtype=bool), 'b': Array(False, dtype=bool)})

    References:
        optax.zero_nans (same rule and state).
    """
    return stateful(_init_zero_nans, _apply_zero_nans, name="zero_nans")


# --------------------------------------------------------------------------
# keep_params_nonnegative


def _nonnegative_leaf(u, p):
    c = _tree.compute_dtype(u.dtype, p.dtype)
    p_c = p.astype(c)
    floor = (-p_c).astype(u.dtype)
    if u.dtype != c:  # -p rounded to a narrower update dtype may overshoot it: round towards 0 instead
        floor = jnp.where(p_c + floor.astype(c) < 0, jnp.nextafter(floor, jnp.zeros((), u.dtype)), floor)
    return jnp.where(p_c + u.astype(c) < 0, floor, u)


def _apply_keep_params_nonnegative(updates, params):
    real_only("keep_params_nonnegative", updates)
    real_only("keep_params_nonnegative", params, "params")
    return _tree.tree_map("keep_params_nonnegative", _nonnegative_leaf, updates, params, names=("updates", "params"))


@combinator
def keep_params_nonnegative() -> Update:
    r"""Changes the updates so that the params they produce are non-negative.

    Update rule: $u \gets -p$ where $p + u < 0$, else $u$; so
    ``apply_updates(p, u) >= 0`` element by element. Put it last in the
    pipeline: a stage after it may undo it. A param that is already negative
    is moved to 0. When $-p$ is not exact in the update's dtype it is
    rounded towards 0, so the sum is never below 0.

    Returns:
        A stateless update object; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale(-1.0).keep_params_nonnegative()
        >>> params = {"w": jnp.array([1.0, 1.0, -0.5])}
        >>> updates, _ = opt.update({"w": jnp.array([0.5, 3.0, 0.0])}, opt.init(params), params)
        >>> updates["w"], ux.apply_updates(params, updates)["w"]
        (Array([-0.5, -1. ,  0.5], dtype=float32), Array([0.5, 0. , 0. ], dtype=float32))

    References:
        optax.keep_params_nonnegative (same rule).
    """
    return stateless(_apply_keep_params_nonnegative, elementwise=True, name="keep_params_nonnegative",
                     needs_params=True)


# --------------------------------------------------------------------------
# snapshot


class SnapshotState(NamedTuple):
    """The value kept at the last call: the updates as they reached the stage, or ``measure`` of them."""

    value: Any


def _init_snapshot(params, *, measure):
    if measure is None:
        return SnapshotState(value=jax.tree.map(_tree.zeros_like, params))
    return SnapshotState(value=jax.tree.map(_tree.zeros_of, jax.eval_shape(measure, params)))


def _apply_snapshot(updates, state, params, *, measure):
    value = updates if measure is None else measure(updates)
    # A copy in the dtype init gave, so that the state keeps its dtypes and shares no buffer with the updates.
    value = jax.tree.map(lambda old, new: jnp.array(new, dtype=old.dtype, copy=True), state.value, value)
    return updates, SnapshotState(value=value)


@combinator
def snapshot(name: str = "snapshot", measure: Callable[[PyTree], PyTree] | None = None) -> Update:
    r"""Keeps a copy of the updates at this point of the pipeline in its state; the updates pass unchanged.

    Update rule: $u \gets u$; ``value`` $\gets u$, or ``value`` $\gets$ ``measure(u)``. Read
    it after a step with ``opt.get_state(state, "snapshot.value")``, where
    ``snapshot`` is the stage's ``name``: two snapshots in one pipeline take
    two names, or are told apart as ``"snapshot[0]"`` and ``"snapshot[1]"``.
    The stage prints under its name: ``scale(step_size=2.0) |> scaled()``
    is a scale then a snapshot named ``scaled``.

    A full copy (``measure=None``) doubles that stage's memory: the state
    holds one more tree the size of the updates, in the params' dtypes (as
    ``init`` creates it; updates of another dtype are cast). A reducing
    ``measure`` (``ux.global_norm``) keeps only what it returns. Before the
    first step the value is zeros.

    Args:
        name: the stage's name, which state paths use: a Python identifier
            not taken by another kind of stage. Default: ``"snapshot"``.
        measure: a jittable function of the updates returning a pytree of
            arrays to keep instead of the updates themselves, e.g.
            ``ux.global_norm``; ``init`` traces it on the params for the
            shapes and dtypes. None keeps a copy of the updates.
            Default: ``None``.

    Returns:
        An update object with state ``SnapshotState(value)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale(2.0).snapshot("scaled").snapshot("scaled_norm", measure=ux.global_norm).clip(1.0)
        >>> opt
        scale(step_size=2.0) |> scaled() |> scaled_norm(measure=updax.updates._clipping.global_norm) |> clip(delta=1.0)
        >>> g = {"w": jnp.array([3.0, 0.0])}
        >>> updates, state = opt.update(g, opt.init(g))
        >>> updates["w"], opt.get_state(state, "scaled.value")["w"], opt.get_state(state, "scaled_norm.value")
        (Array([1., 0.], dtype=float32), Array([6., 0.], dtype=float32), Array(6., dtype=float32))

    References:
        optax.snapshot(measure_name, measure), which keeps the measurement
        in a dict of its state, read with ``optax.tree.get``; its initial
        value is ``measure(params)``.
    """
    # (the name is the stage's, not an option: checked here, and bound by the stage like any stage name)
    if not (isinstance(name, str) and name.isidentifier()):
        fail("snapshot", "name", name, "must be a Python identifier (state paths use it)", TypeError)
    if keyword.iskeyword(name) or name in ("stateless", "stateful"):
        fail("snapshot", "name", name, "must be a Python identifier other than a keyword, stateless and stateful "
             "(state paths use it)")
    try:
        return stateful(_init_snapshot, _apply_snapshot, name=name, options=dict(measure=measure),
                        domains=dict(measure=Function(optional=True)))
    except ValueError as error:  # a name another kind of stage has (a catalogue combinator's: ux.trace)
        raise ValueError(f"snapshot(name={name!r}): {error}") from None


# --------------------------------------------------------------------------
# monitor and measure_with_ema


#: What an EMA measurement's options hold.
_EMA_DOMAINS = dict(measure=Function(), decay=Real(0.0, 1.0), debias=Flag(), accumulator_dtype=FloatDtype())


@dataclasses.dataclass(frozen=True, repr=False)
class measure_with_ema:  # noqa: N801  (optax's name: it reads as the function that builds a measure)
    r"""A measurement for :func:`monitor`: ``measure`` of the updates, averaged over the calls by an EMA.

    With $b$ = ``decay``, $x_t$ = ``measure(updates)`` at call $t$ (from 1)
    and $a_0 = 0$, the measurement recorded is

    $$
    \begin{align*}
    a_t &= b\, a_{t-1} + (1 - b)\, x_t \\
    m_t &= a_t && (\texttt{debias=False}) \\
    m_t &= a_t / (1 - b^t) && (\texttt{debias=True})
    \end{align*}
    $$

    It is a value (equal for equal options) that :func:`monitor` runs; the
    average $a_t$ lives in the monitor's state (``averages``), the
    measurement in ``measurements``.

    Args:
        measure: a jittable function of the updates (of the updates and the
            params, in a monitor with ``with_params=True``) returning an
            array or a pytree of arrays, e.g. ``ux.global_norm``. No default.
        decay: $b$, in [0, 1]. No default.
        debias: divide by $1 - b^t$ (Adam's bias correction). Default:
            ``True``.
        accumulator_dtype: storage dtype of the average; None keeps the
            measurement's dtype but at least float32. Default: ``None``.

    Returns:
        A measurement to give :func:`monitor` under a name.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.monitor({"norm_ema": ux.measure_with_ema(ux.global_norm, decay=0.5)})
        >>> state = opt.init({"w": jnp.zeros(2)})
        >>> for g in [3.0, 1.0]:  # norms 3√2, √2; debiased: (0.25·3√2 + 0.5·√2) / 0.75
        ...     _, state = opt.update({"w": jnp.array([g, g])}, state)
        >>> opt.get_state(state, "monitor.measurements")["norm_ema"]
        Array(2.3570225, dtype=float32)

    References:
        optax.measure_with_ema (same rule and options).
    """

    measure: Callable[..., Any]
    decay: float
    debias: bool = True
    accumulator_dtype: DType = None

    def __post_init__(self) -> None:
        for name, domain in _EMA_DOMAINS.items():
            value = domain.check("measure_with_ema", name, getattr(self, name))
            if name == "decay":
                value = float(value)
            object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        shown = [f"{format_value(self.measure)}", f"decay={self.decay!r}", f"debias={self.debias!r}"]
        if self.accumulator_dtype is not None:
            shown.append(f"accumulator_dtype={format_value(self.accumulator_dtype)}")
        return f"measure_with_ema({', '.join(shown)})"


def _measures(call, name, value):
    """``monitor``'s measures: a non-empty dict of named functions and :class:`measure_with_ema` values."""
    text = "must be a non-empty dict {name: function or ux.measure_with_ema(...)}, its names strings"
    if not isinstance(value, dict) or not value or not all(isinstance(k, str) for k in value):
        fail(call, name, value, text, TypeError)
    for key, measure in value.items():
        if not (isinstance(measure, measure_with_ema) or callable(measure)):
            fail(call, name, value, f"{text}; {key!r} holds {measure!r}", TypeError)
    return value


class MonitorState(NamedTuple):
    """The last call's measurement under each name, the raw moving average of each EMA measurement, and the
    calls so far."""

    measurements: dict
    averages: dict
    count: Count


def _measured(measure, updates, params, with_params):
    fn = measure.measure if isinstance(measure, measure_with_ema) else measure
    return fn(updates, params) if with_params else fn(updates)


def _init_monitor(params, *, measures, with_params):
    measurements, averages = {}, {}
    for name, measure in measures.items():
        shapes = jax.eval_shape(lambda p, m=measure: _measured(m, p, p, with_params), params)
        if isinstance(measure, measure_with_ema):
            averages[name] = jax.tree.map(
                lambda s, m=measure: jnp.zeros(s.shape, _tree.compute_dtype(s.dtype) if m.accumulator_dtype is None
                                               else m.accumulator_dtype), shapes)
            measurements[name] = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), averages[name])
        else:
            measurements[name] = jax.tree.map(_tree.zeros_of, shapes)
    return MonitorState(measurements=measurements, averages=averages, count=_tree.zero_count())


def _ema_step(measure, averages, value, count):
    """One call of a :class:`measure_with_ema`: the new raw averages, and the measurement, divided by
    ``1 - b^t`` where it is debiased (``b^t`` in float32 from the count; nothing to divide by while it is 0)."""
    b = jnp.asarray(measure.decay, jnp.float32)
    correction = 1 - b ** _tree.float_count(count) if measure.debias else jnp.ones([], jnp.float32)
    correction = jnp.where(correction > 0, correction, 1.0)

    def leaf(a, x):
        c = _tree.compute_dtype(a.dtype, jnp.result_type(x))
        average = b.astype(c) * a.astype(c) + (1 - b.astype(c)) * jnp.asarray(x).astype(c)
        return average.astype(a.dtype), (average / correction.astype(c)).astype(a.dtype)

    return _tree.tree_map_unzip("monitor", leaf, 2, averages, value, names=("state.averages", "the measurement"))


def _apply_monitor(updates, state, params, *, measures, with_params):
    count = _tree.safe_increment(state.count)
    measurements, averages = {}, {}
    for name, measure in measures.items():
        value = _measured(measure, updates, params, with_params)
        _tree.check_same_structure("monitor", state.measurements[name], value, f"the measurement {name!r} at init",
                                   f"the measurement {name!r}")
        if isinstance(measure, measure_with_ema):
            averages[name], measurements[name] = _ema_step(measure, state.averages[name], value, count)
        else:  # a copy in the dtypes init gave, sharing no buffer with what the measure returned
            measurements[name] = jax.tree.map(lambda old, new: jnp.array(new, dtype=old.dtype, copy=True),
                                              state.measurements[name], value)
    return updates, MonitorState(measurements=measurements, averages=averages, count=count)


@combinator
def monitor(measures: dict[str, Any], *, with_params: bool = False) -> Update:
    r"""Records named measurements of the updates at this point of the pipeline, which it passes unchanged.

    Update rule: $u \gets u$; for each name $k$ of ``measures``,
    ``measurements[k]`` $\gets f_k(u)$ ($f_k(u, p)$ with ``with_params``),
    or the moving average of a :func:`measure_with_ema`. Read them after a
    step with ``opt.get_state(state, "monitor.measurements")["name"]``: the
    update norm, the param norm and their ratio are

    ``ux.monitor({"update_norm": lambda u, p: ux.global_norm(u),
    "param_norm": lambda u, p: ux.global_norm(p),
    "ratio": lambda u, p: ux.global_norm(u) / ux.global_norm(p)}, with_params=True)``.

    Before the first call every measurement is zeros (optax's state holds
    no entry for it). Each measurement keeps the structure, shapes and
    dtypes ``init`` traces from the params.

    Args:
        measures: a non-empty dict ``{name: measure}``, the names strings,
            each measure a jittable function of the updates (and the params)
            returning an array or a pytree of arrays, or a
            :func:`measure_with_ema`. No default.
        with_params: call every measure as ``measure(updates, params)``;
            ``update`` then needs ``params``. Default: ``False``.

    Returns:
        An update object with state ``MonitorState(measurements, averages,
        count)``: ``averages`` holds the raw moving average of each
        :func:`measure_with_ema` by name, ``count`` the calls so far.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale(-0.1).monitor({"step_norm": lambda u, p: ux.global_norm(u),
        ...                               "ratio": lambda u, p: ux.global_norm(u) / ux.global_norm(p)},
        ...                              with_params=True)
        >>> params = {"w": jnp.array([3.0, 4.0])}
        >>> _, state = opt.update({"w": jnp.array([6.0, 8.0])}, opt.init(params), params)
        >>> opt.get_state(state, "monitor.measurements")
        {'ratio': Array(0.2, dtype=float32), 'step_norm': Array(1., dtype=float32)}

    References:
        optax.monitor (same measures; its measurements read with
        ``optax.tree.get``).
    """
    with_params = Flag().check("monitor", "with_params", with_params)  # (whether update needs params follows)
    return stateful(_init_monitor, _apply_monitor, name="monitor",
                    options=dict(measures=measures, with_params=with_params), needs_params=with_params,
                    domains=dict(measures=Valid(rule=_measures, text="must be a non-empty dict {name: measure}"),
                                 with_params=Flag()))
