"""Averaging of iterates: schedule-free learning, and EMA/SWA averages of the params kept in the state."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import (ANY_REAL, LEARNING_RATE, Count, Flag, FloatDtype, Integer, NonNegativeField, Pipeline,
                            Real, Valid, fail)
from updax._primitives import apply_updates, stateful
from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import blend, filled, warmed_up


class ScheduleFreeState(NamedTuple):
    """The wrapped pipeline's state, the base iterate ``z``, and the averaging weights (float32: the largest
    learning rate so far ``max_lr`` and the sum of its powers ``weight_sum``)."""

    inner: tuple
    z: Any
    weight_sum: NonNegativeField
    max_lr: NonNegativeField


_B1 = Real(0.0, 1.0, lo_open=True, hi_open=True)


def _fixed_b1(call, name, value):
    """schedule_free's ``b1``: a number in (0, 1), refused as a schedule (see :func:`schedule_free`)."""
    if callable(value) and not isinstance(value, type):
        fail(call, name, value, "must be a number in (0, 1), not a schedule: each step carries y = b1·x + (1 - b1)·z "
             "with one b1, so a b1 that changes moves y off the average x that schedule_free_eval_params recovers "
             "(the paper's b1 is a constant)", TypeError)
    return _B1.check(call, name, value)


#: What the options of the averaging stages hold.
_AVERAGING_DOMAINS = dict(
    inner=Pipeline(), learning_rate=LEARNING_RATE,
    b1=Valid(rule=_fixed_b1, text="must be a number in (0, 1), not a schedule", values=_B1),
    weight_lr_power=ANY_REAL, state_dtype=FloatDtype(), decay=Real(0.0, 1.0), decay_min=Flag(),
    accumulator_dtype=FloatDtype(), start=Integer(1), period=Integer(1))


def _domains(options):
    return {k: _AVERAGING_DOMAINS[k] for k in options}


def _init_schedule_free(params, *, inner, state_dtype):
    z = jax.tree.map(lambda p: jnp.array(p, dtype=state_dtype or jnp.asarray(p).dtype), params)
    return ScheduleFreeState(inner=inner.init(params), z=z, weight_sum=jnp.zeros([], jnp.float32),
                             max_lr=jnp.zeros([], jnp.float32))


def _apply_schedule_free(updates, state, params, *, inner, learning_rate, b1, weight_lr_power, **extra):
    return schedule_free_step(updates, state, params, inner, learning_rate, b1, weight_lr_power, extra)


def schedule_free_step(updates, state, params, inner, learning_rate, b1, weight_lr_power, extra, step_again=None):
    """One schedule-free step. ``step_again(fn)``, where given, returns the step of ``fn() -> (step, state)`` (the
    pipeline's) for the params' update, the same values traced again (a backend's path), or None."""
    # (the weights keep their dtype: a schedule's float64 value under x64 would widen them, and a state whose
    # dtypes change between steps breaks lax.cond, lax.scan and donation)
    dtype = state.max_lr.dtype
    max_lr = jnp.maximum(state.max_lr, learning_rate).astype(dtype)
    weight = (max_lr**weight_lr_power).astype(dtype)
    weight_sum = (state.weight_sum + weight).astype(dtype)
    ck = jnp.where(weight_sum > 0, weight / jnp.where(weight_sum > 0, weight_sum, 1.0), 0.0)
    steps, inner_state = inner.update(updates, state.inner, params, **extra)
    again = None if step_again is None else step_again(lambda: inner.update(updates, state.inner, params, **extra))
    keep = 1 - b1 * (1 - ck)

    def leaf(y, z, u, u_again):
        # y' = b1·x' + (1 - b1)·z' with x = (y - (1 - b1)·z) / b1 substituted: no division by b1, so a tiny b1
        # neither overflows nor magnifies the rounding of y.
        c, stored_as, emitted_as = _tree.compute_dtype(y.dtype, z.dtype), z.dtype, u.dtype
        narrower = jnp.dtype(z.dtype).itemsize < jnp.dtype(y.dtype).itemsize
        y, z, u, u_again = (_tree.cast(x, c) for x in (y, z, u, u_again))
        z_new = _tree.cast(z + u, stored_as)
        if narrower:
            # z stored narrower than y: y moves with the step z took as stored, z' - z (exact where z' is within
            # a factor 2 of z), so that x is the average of the stored z's.
            step = ck * (z - y) + keep * (_tree.cast(z_new, c) - z)
        else:
            # y' - y = ck·(z' - y) + (1 - b1)·(1 - ck)·u, from the new z (the old z is then read by its writer
            # alone, which can write it in place).
            step = ck * (_tree.cast(z_new, c) - y) + (1 - b1) * (1 - ck) * u_again
        return _tree.cast(step, emitted_as), z_new

    out, z = _tree.tree_map_unzip("schedule_free", leaf, 2, params, state.z, steps,
                                  steps if again is None else again, names=("params", "state.z", "updates", "updates"))
    return out, ScheduleFreeState(inner=inner_state, z=z, weight_sum=weight_sum, max_lr=max_lr)


@combinator(wraps=True)
def schedule_free(inner: Update, learning_rate: ScalarOrSchedule, b1: float = 0.9,
                  weight_lr_power: ScalarOrSchedule = 2.0, *, state_dtype: DType = None) -> Update:
    r"""Replaces the momentum of the pipeline before it by schedule-free interpolation and averaging.

    The wrapped pipeline (without momentum, e.g. ``scale_by_rms(b2,
    eps_in_sqrt=False, bias_correction=True) |> scale_by_learning_rate(lr)``,
    Adam without momentum) makes the step of the base iterate
    $z$; the params $y$ the gradient is taken at interpolate $z$ and the
    average $x$ that is evaluated (see :func:`schedule_free_eval_params`). For an update $g$, with
    $b_1$ = ``b1``, $p$ = ``weight_lr_power``, $\mathrm{lr}_\text{max}$ the largest learning rate so far, and
    the sum over the steps so far (this one included):

    $$
    \begin{align*}
    z &\gets z + \operatorname{inner}(g) \\
    x &\gets (1 - c)\, x + c\, z, \quad c = \frac{\mathrm{lr}_\text{max}^p}{\sum \mathrm{lr}_\text{max}^p} \\
    y &\gets b_1 x + (1 - b_1)\, z
    \end{align*}
    $$

    $x$ is never stored itself (see :func:`schedule_free_eval_params`).
    The params' update is computed from the new $z$,
    $y' - y = c\, (z' - y) + (1 - b_1)(1 - c)\, u$ with $u = \operatorname{inner}(g)$, so that XLA writes $z$
    in place (optax's step copies it on every step). With $z$ in a
    narrower ``state_dtype`` than the params, $y$ moves with the step
    $z$ took as stored, $z' - z$, so that $x$ is the average of the
    stored $z$'s (XLA then copies $z$). Jitted for the CPU, the
    backend's hints (:func:`updax.backend_hints`) trace the wrapped
    pipeline a second time for the params' update, so that XLA computes the
    step inside both kernels rather than store it for both (the same
    values; a pipeline whose trace has effects is traced once).

    ``b1`` is a number, fixed for the run, as in the paper: each step carries
    $y$ forward with one ``b1``, $y' = b_1 x' + (1 - b_1)\, z'$ holding only
    if $y = b_1 x + (1 - b_1)\, z$ held with the same ``b1``, so a schedule for
    it is refused (with a ``b1`` that changed, $y$ would no longer
    interpolate the average that :func:`schedule_free_eval_params` recovers
    from it). For the same reason ``b1`` is static: a new ``b1`` is a new
    run (and a new compiled step), and :func:`updax.hyperparams_in_state`
    does not hold it in the state to be replaced between steps. The learning
    rate is
    ``>= 0`` (a negative one would turn the averaging off: its weights come
    from the largest rate so far, which would stay 0); the averaging weights
    are float32.

    Args:
        learning_rate: the wrapped pipeline's learning rate, >= 0 (a number
            or a schedule); it weights the average. No default.
        b1: the interpolation weight, a number in (0, 1), not a schedule
            (above). Default: ``0.9``.
        weight_lr_power: the power $p$ of the weights. Default: ``2.0``.
        state_dtype: storage dtype of $z$; None keeps the params' dtype.
            Default: ``None``.

    Returns:
        An update object with state ``ScheduleFreeState(inner, z, weight_sum,
        max_lr)``; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_learning_rate(0.1).schedule_free(0.1, b1=0.5)
        >>> params = {"w": jnp.array([1.0])}
        >>> state = opt.init(params)
        >>> u, state = opt.update({"w": jnp.array([1.0])}, state, params)
        >>> u["w"]  # z = 0.9, x = z (first weight is the whole sum), y = 0.9
        Array([-0.1], dtype=float32)
        >>> ux.schedule_free_eval_params(opt, state, ux.apply_updates(params, u))["w"]
        Array([0.9], dtype=float32)

    References:
        Defazio et al., "The Road Less Scheduled", NeurIPS 2024.
        https://arxiv.org/abs/2405.15682
    """
    options = dict(inner=inner, learning_rate=learning_rate, b1=b1, weight_lr_power=weight_lr_power,
                   state_dtype=state_dtype)
    return stateful(_init_schedule_free, _apply_schedule_free, name="schedule_free", options=options,
                    domains=_domains(options), wraps="inner", needs_params=True, static=("b1",),
                    schedulable=("learning_rate", "weight_lr_power"))


def schedule_free_eval_params(opt: Update, state: PyTree, params: PyTree, *, path: str | None = None) -> PyTree:
    r"""The averaged params $x$ to evaluate a schedule-free model at: $z + (y - z) / b_1$.

    With $b_1$ = ``b1`` and $z$ the base iterate :func:`schedule_free` keeps, $x$ is recovered from
    $y = b_1 x + (1 - b_1)\, z$, so the rounding of $y$ is divided by $b_1$: with a tiny ``b1`` (say below 1e-3 in
    float32) the recovered average is imprecise. The training steps do not
    divide by ``b1``.

    Args:
        opt: the update object. No default.
        state: its state. No default.
        params: the current (training) params $y$. No default.
        path: the ``schedule_free`` stage's state path, when there is not
            exactly one at the top of the pipeline (e.g.
            ``"apply_if_finite/schedule_free"`` inside a wrapper, or
            ``"schedule_free[1]"``). Default: ``None``.

    Returns:
        A params-shaped tree; the training params are untouched.

    Example:
        See :func:`schedule_free`; inside a wrapper, name the stage:

        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_learning_rate(0.1).schedule_free(0.1, b1=0.5).apply_if_finite()
        >>> params = {"w": jnp.array([1.0])}
        >>> u, state = opt.update({"w": jnp.array([1.0])}, opt.init(params), params)
        >>> ux.schedule_free_eval_params(opt, state, ux.apply_updates(params, u),
        ...                              path="apply_if_finite/schedule_free")["w"]
        Array([0.9], dtype=float32)
    """
    if path is None:
        path = _the_stage("schedule_free_eval_params", opt, ("schedule_free",))
    b1 = opt.get_state(state, f"{path}.b1")
    z = opt.get_state(state, f"{path}.z")

    def leaf(y, zi):
        c = _tree.compute_dtype(y.dtype, zi.dtype)
        z32 = zi.astype(c)
        return (z32 + (y.astype(c) - z32) / b1).astype(y.dtype)

    return _tree.tree_map("schedule_free_eval_params", leaf, params, z, names=("params", "state.z"))


# --------------------------------------------------------------------------
# Averages of the params kept in the optimizer state: EMA (Polyak) and SWA.


def _mix(average, params, updates, keep):
    """``keep·average + (1 - keep)·p'`` for the params ``p'`` after this step (as apply_updates makes them)."""
    new = apply_updates(params, updates)
    return _tree.tree_map("the params average", lambda a, p: blend(a, p, keep, 1.0 - keep), average, new,
                          names=("state.average", "params"))


class EmaParamsState(NamedTuple):
    """The applied steps and the exponential moving average of the params after each."""

    count: Count
    average: Any


def _init_ema_params(params, *, accumulator_dtype):
    return EmaParamsState(count=_tree.zero_count(), average=filled("ema_params", params, params, accumulator_dtype))


def _apply_ema_params(updates, state, params, *, decay, decay_min):
    average = _mix(state.average, params, updates, warmed_up(decay, state.count, decay_min))
    return updates, EmaParamsState(count=_tree.safe_increment(state.count), average=average)


@combinator
def ema_params(decay: ScalarOrSchedule = 0.999, *, decay_min: bool = False, accumulator_dtype: DType = None) -> Update:
    r"""Keeps an exponential moving average (Polyak averaging) of the params in the state.

    Put it last in the pipeline: it sees the final updates, averages the
    params they produce and passes the updates on unchanged. Read the
    average with :func:`averaged_params`; the training params are untouched.
    Update rule, for the params $p$ and the update $u$ ($n$ the steps applied before this one), with the
    average $a$ starting at the initial params:

    $$
    \begin{align*}
    p' &= p + u \\
    a &\gets b\, a + (1 - b)\, p'
    \end{align*}
    $$

    with $b$ = ``decay``, or with ``decay_min`` the smaller of ``decay`` and $(1 + n) / (10 + n)$.

    Args:
        decay: the decay, in [0, 1], or a schedule ``count -> decay``.
            Default: ``0.999``.
        decay_min: TensorFlow's warm-up of the decay (above). Default:
            ``False``.
        accumulator_dtype: storage dtype of the average; None keeps the params'
            dtype but at least float32. Default: ``None``.

    Returns:
        An update object with state ``EmaParamsState(count, average)``;
        ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale(-1.0).ema_params(0.5)
        >>> params = {"w": jnp.array([0.0])}
        >>> state = opt.init(params)
        >>> for _ in range(2):
        ...     u, state = opt.update({"w": jnp.array([-2.0])}, state, params)
        ...     params = ux.apply_updates(params, u)
        >>> params["w"], ux.averaged_params(opt, state)["w"]  # 0.5·(0.5·0 + 0.5·2) + 0.5·4
        (Array([4.], dtype=float32), Array([2.5], dtype=float32))

    References:
        Polyak & Juditsky, "Acceleration of stochastic approximation by
        averaging", 1992; tf.train.ExponentialMovingAverage.
    """
    options = dict(decay=decay, decay_min=decay_min, accumulator_dtype=accumulator_dtype)
    return stateful(_init_ema_params, _apply_ema_params, name="ema_params", options=options,
                    domains=_domains(options), needs_params=True, schedulable=("decay",))


class SwaState(NamedTuple):
    """The applied steps, the snapshots taken, and their running mean.

    At its dtype's maximum ``count`` cycles through its last ``period`` values,
    so snapshots keep coming every ``period`` steps; ``snapshots`` saturates.
    """

    count: Count
    snapshots: Count
    average: Any


def _init_swa(params, *, accumulator_dtype):
    return SwaState(count=_tree.zero_count(), snapshots=_tree.zero_count(),
                    average=filled("swa", params, params, accumulator_dtype))


def _apply_swa(updates, state, params, *, start, period):
    step = _tree.cyclic_increment(state.count, period)
    take = (step >= start) & ((step - start) % period == 0)
    n = state.snapshots.astype(jnp.float32)
    keep = jnp.where(take, n / (n + 1.0), 1.0)
    average = _mix(state.average, params, updates, keep)
    return updates, SwaState(count=step,
                             snapshots=jnp.where(take, _tree.safe_increment(state.snapshots), state.snapshots),
                             average=average)


@combinator
def swa(start: int = 1, period: int = 1, *, accumulator_dtype: DType = None) -> Update:
    r"""Stochastic weight averaging: the equal-weight mean of params snapshots, kept in the state.

    Put it last in the pipeline. After applied step $t$ (from 1) with
    $t \ge s$ and $t - s$ a multiple of $k$ ($s$ = ``start``, $k$ = ``period``) it takes a snapshot of
    the params $p' = p + u$ into the running mean (decay $n / (n + 1)$
    after $n$ snapshots); the updates pass on unchanged. Read the mean
    with :func:`averaged_params` (the initial params until the first
    snapshot).

    Args:
        start: the first step whose params are averaged, an integer >= 1.
            Default: ``1``.
        period: the steps between snapshots, an integer >= 1. Default: ``1``.
        accumulator_dtype: storage dtype of the mean; None keeps the params'
            dtype but at least float32. Default: ``None``.

    Returns:
        An update object with state ``SwaState(count, snapshots, average)``;
        ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale(-1.0).swa(start=2, period=2)
        >>> params = {"w": jnp.array([0.0])}
        >>> state = opt.init(params)
        >>> for _ in range(4):  # params 1, 2, 3, 4: snapshots after steps 2 and 4
        ...     u, state = opt.update({"w": jnp.array([-1.0])}, state, params)
        ...     params = ux.apply_updates(params, u)
        >>> ux.averaged_params(opt, state)["w"]
        Array([3.], dtype=float32)

    References:
        Izmailov et al., "Averaging Weights Leads to Wider Optima and Better
        Generalization", UAI 2018. https://arxiv.org/abs/1803.05407
    """
    options = dict(start=start, period=period, accumulator_dtype=accumulator_dtype)
    return stateful(_init_swa, _apply_swa, name="swa", options=options, domains=_domains(options), needs_params=True)


_AVERAGING_STAGES = ("ema_params", "swa")


def _the_stage(call: str, opt: Update, labels: tuple[str, ...]) -> str:
    """The label of the one stage at the top of ``opt`` named one of ``labels``, or an error that asks for a path
    (and lists the paths of such stages anywhere in ``opt``)."""
    found = [s.label for s in opt.stages if s.label in labels]
    if len(found) != 1:
        anywhere = _paths_to(opt, labels)
        raise ValueError(f"{call}: {opt!r} has {len(found)} {'/'.join(labels)} stages at the top; name the one to "
                         f"read with path=" + (f" (such stages: {', '.join(map(repr, anywhere))})" if anywhere else ""))
    return found[0]


def _paths_to(opt: Update, labels: tuple[str, ...], prefix: str = "") -> list[str]:
    """The state paths of the stages named one of ``labels`` in ``opt`` and in the pipelines its stages run."""
    paths, labels_here = [], [s.label for s in opt.stages]
    for i, stage in enumerate(opt.stages):
        k = labels_here[:i].count(stage.label)
        selector = stage.label if labels_here.count(stage.label) == 1 else f"{stage.label}[{k}]"
        if stage.label in labels:
            paths.append(prefix + selector)
        for key, (_, inner) in stage.nested().items():
            paths += _paths_to(inner, labels, f"{prefix}{selector}/" + ("" if key is None else f"{key}/"))
    return paths


def averaged_params(opt: Update, state: PyTree, params: PyTree | None = None, *, path: str | None = None) -> PyTree:
    """The params average an ``ema_params`` or ``swa`` stage keeps, as a params-shaped tree.

    Args:
        opt: the update object. No default.
        state: its state. No default.
        params: when given, each leaf of the average is cast to that param's
            dtype (and the trees must match). Default: ``None`` (the stored
            dtype).
        path: the stage's state path, when there is not exactly one such
            stage at the top of the pipeline (e.g. ``"swa[1]"`` or
            ``"accumulate_gradients/ema_params"``). Default: ``None``.

    Returns:
        The averaged params; the training params are untouched.

    Example:
        See :func:`ema_params` and :func:`swa`.
    """
    if path is None:
        path = _the_stage("averaged_params", opt, _AVERAGING_STAGES)
    average = opt.get_state(state, f"{path}.average")
    if params is None:
        return average
    _tree.check_same_structure("averaged_params", params, average, "params", "the average")
    return jax.tree.map(lambda a, p: a.astype(jnp.asarray(p).dtype), average, params)
