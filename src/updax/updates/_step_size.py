"""Step sizes: fixed, tunable, scheduled, a learning rate, multiplied by a factor per step, and lowering it when the
loss plateaus."""

from __future__ import annotations

from typing import Annotated, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree
from updax._combinators import combinator
from updax._domains import (ANY_REAL, LEARNING_RATE, NON_NEGATIVE, Count, Function, Integer, NonNegativeField,
                            OneOf, Real, fail, is_concrete, returned, scalar_input)
from updax._primitives import stateful, stateless
from updax._typing import Scalar, ScalarOrSchedule, ScheduleLike
from updax._update import Update
from updax.updates._kernels import scaled

# --------------------------------------------------------------------------
# States


class ScaleByScheduleState(NamedTuple):
    """Steps taken; the schedule is evaluated at ``count`` before it is incremented."""

    count: Count


class ScaleByStateState(NamedTuple):
    """The step size, held in state so outside code can read and replace it."""

    step_size: Annotated[jax.Array, ANY_REAL]


class ScaleByMultiplicativeLrState(NamedTuple):
    """The learning rate of the next step (float32), the running product; the steps taken."""

    learning_rate: Annotated[jax.Array, LEARNING_RATE]
    count: Count


class ReduceOnPlateauState(NamedTuple):
    """The current factor ``scale`` and the bookkeeping of the plateau rule."""

    scale: NonNegativeField
    best_loss: jax.Array
    plateau_count: Count
    cooldown_count: Count
    count: Count
    avg_loss: jax.Array


# --------------------------------------------------------------------------
# Fixed, tunable and scheduled step sizes


def _apply_scale(updates, params, *, step_size):
    return jax.tree.map(lambda g: scaled(g, step_size), updates)


@combinator
def scale(step_size: ScalarOrSchedule) -> Update:
    r"""Multiplies updates by a fixed step size.

    Update rule: $u \gets \alpha u$.

    Args:
        step_size: the factor $\alpha$, any real number (a negative learning
            rate turns a direction into a descent step). No default.

    Returns:
        A stateless update object.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale(-0.5)
        >>> opt
        scale(step_size=-0.5)
        >>> opt.update({"w": jnp.array([2.0, 4.0])}, opt.init(None))[0]
        {'w': Array([-1., -2.], dtype=float32)}

    References:
        Axon.Updates.scale.
    """
    return stateless(_apply_scale, elementwise=True, name="scale", options=dict(step_size=step_size),
                     domains=dict(step_size=ANY_REAL), schedulable=("step_size",))


def _init_scale_by_state(params, *, step_size):
    return ScaleByStateState(step_size=jnp.asarray(step_size, jnp.float32))


def _apply_scale_by_state(updates, state, params):
    return jax.tree.map(lambda g: scaled(g, state.step_size), updates), state


@combinator
def scale_by_state(step_size: ScalarOrSchedule) -> Update:
    r"""Multiplies updates by a step size held in state (Axon's tunable learning rate).

    Update rule: $u \gets \alpha u$ with $\alpha$ = ``state.step_size``. Outside code reads
    and replaces it between steps, e.g.
    ``opt.replace_state(state, "scale_by_state.step_size", 1e-4)``, with no
    recompilation of a jitted step.

    Args:
        step_size: the initial $\alpha$, any real number. No default.

    Returns:
        An update object with state ``ScaleByStateState(step_size)`` (float32).

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_state(-0.1)
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> state = opt.replace_state(state, "scale_by_state.step_size", -0.01)
        >>> opt.update({"w": jnp.array([2.0])}, state)[0]["w"]
        Array([-0.02], dtype=float32)

    References:
        Axon.Updates.scale_by_state.
    """
    return stateful(_init_scale_by_state, _apply_scale_by_state, name="scale_by_state",
                    options=dict(step_size=step_size), domains=dict(step_size=ANY_REAL), schedulable=("step_size",))


def _init_scale_by_schedule(params):
    return ScaleByScheduleState(count=_tree.zero_count())


def _apply_scale_by_schedule(updates, state, params, *, schedule_fn):
    step_size = returned("scale_by_schedule", "schedule_fn", schedule_fn(state.count), ANY_REAL, state.count)
    updates = jax.tree.map(lambda g: scaled(g, step_size), updates)
    return updates, ScaleByScheduleState(count=_tree.safe_increment(state.count))


@combinator
def scale_by_schedule(schedule_fn: ScheduleLike) -> Update:
    r"""Multiplies updates by ``schedule_fn(count)``.

    Update rule, with $\eta$ = ``schedule_fn``: $u \gets \eta(t)\, u$, with $t = 0$ on the first call.

    Args:
        schedule_fn: a jittable function ``count -> step size``. No default.

    Returns:
        An update object with state ``ScaleByScheduleState(count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> def halving(count):
        ...     return 0.5 ** count
        >>> opt = ux.scale_by_schedule(halving)
        >>> opt
        scale_by_schedule(schedule_fn=halving)
        >>> state = opt.init(None)
        >>> for _ in range(3):
        ...     u, state = opt.update({"w": jnp.array([1.0])}, state)
        >>> u["w"]
        Array([0.25], dtype=float32)

    References:
        Axon.Updates.scale_by_schedule.
    """
    return stateful(_init_scale_by_schedule, _apply_scale_by_schedule, elementwise=True, name="scale_by_schedule",
                    options=dict(schedule_fn=schedule_fn), domains=dict(schedule_fn=Function()))


# --------------------------------------------------------------------------
# Learning rates


def _apply_scale_by_learning_rate(updates, params, *, learning_rate):
    factor = -learning_rate
    return jax.tree.map(lambda g: scaled(g, factor), updates)


@combinator
def scale_by_learning_rate(learning_rate: ScalarOrSchedule) -> Update:
    r"""Turns a direction into a descent step: multiplies updates by ``-learning_rate``.

    Update rule: $u \gets -\eta u$, where $\eta$ = ``learning_rate`` is a number or a schedule
    $\text{count} \mapsto \eta$. With a schedule, the value used on the last step is
    readable as ``opt.get_state(state, "scale_by_learning_rate.learning_rate")``
    (with a number, the same call returns the number).

    The learning rate is positive and this stage gives the step its sign, as
    every optimizer does: a negative $\eta$ (a sign error that would train
    uphill) is refused, as PyTorch refuses it; the optimizers take
    ``maximize=True`` for gradient ascent. Axon's ``scale(step_size)`` takes
    the signed step instead: ``scale(-lr)``.

    Args:
        learning_rate: $\eta$, a number >= 0 or a schedule of them. No default.

    Returns:
        A stateless update object (with a ``ScheduledState`` when $\eta$ is a
        schedule).

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_learning_rate(0.1)
        >>> opt.update({"w": jnp.array([2.0])}, opt.init(None))[0]["w"]
        Array([-0.2], dtype=float32)

    References:
        Polaris.Optimizers' ``scale_by_learning_rate`` helper; optax's
        ``scale_by_learning_rate``.
    """
    return stateless(_apply_scale_by_learning_rate, elementwise=True, name="scale_by_learning_rate",
                     options=dict(learning_rate=learning_rate), domains=dict(learning_rate=LEARNING_RATE),
                     schedulable=("learning_rate",))


def _init_scale_by_multiplicative_lr(params, *, learning_rate):
    return ScaleByMultiplicativeLrState(learning_rate=jnp.asarray(learning_rate, jnp.float32),
                                        count=_tree.zero_count())


def _factor(lr_lambda, epoch):
    """``lr_lambda(epoch)`` as a float32 scalar; a value that is not a real scalar (an array with elements, a
    bool, a string) is refused by name, under ``jax.jit`` too (shapes are static), and a negative one where it is
    concrete (a learning rate stays >= 0)."""
    call, name = "scale_by_multiplicative_lr", "lr_lambda(...)"
    value = lr_lambda(epoch)
    try:
        dtype, shape = jnp.result_type(value), jnp.shape(value)
    except TypeError:
        fail(call, name, value, "must return a real scalar", TypeError, "the value it returned")
    if shape != () or not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)):
        shown = np.asarray(value) if is_concrete(value) else f"<traced {dtype.name}{list(shape)}>"
        fail(call, name, shown, f"must return a real scalar, not {dtype.name}{list(shape)}", TypeError,
             "the value it returned")
    return jnp.asarray(returned(call, "lr_lambda", value, NON_NEGATIVE, epoch)).astype(jnp.float32)


def _apply_scale_by_multiplicative_lr(updates, state, params, *, lr_lambda):
    factor = -state.learning_rate
    updates = jax.tree.map(lambda g: scaled(g, factor), updates)
    count = _tree.safe_increment(state.count)  # the epoch of the next step, 1-based as torch's
    learning_rate = state.learning_rate * _factor(lr_lambda, count)
    return updates, ScaleByMultiplicativeLrState(learning_rate=learning_rate, count=count)


@combinator
def scale_by_multiplicative_lr(learning_rate: Scalar, lr_lambda: ScheduleLike) -> Update:
    r"""A learning rate multiplied by ``lr_lambda(epoch)`` after every step (torch's ``MultiplicativeLR``).

    Update rule, with $\eta_0$ = ``learning_rate`` and $\lambda$ = ``lr_lambda``, at the step
    $t = 0, 1, \ldots$:

    $$
    \begin{align*}
    \eta_t &= \eta_0 \prod_{e=1}^{t} \lambda(e) = \eta_{t-1}\, \lambda(t) \\
    u &\gets -\eta_t\, u
    \end{align*}
    $$

    This is the rate torch's ``MultiplicativeLR(optimizer, lr_lambda)``
    gives the optimizer's step $t$ when ``scheduler.step()`` follows each
    optimizer step: the scheduler starts at ``last_epoch = 0`` with the
    optimizer's rate and its $k$-th ``step()`` multiplies the rate by
    ``lr_lambda(k)``. A function of the count would loop over every step so
    far; this stage keeps the running product in its state instead, one
    multiplication per step, so ``state.learning_rate`` is the rate of the
    next step: read it with
    ``opt.get_state(state, "scale_by_multiplicative_lr.learning_rate")``
    (torch's ``get_last_lr()``), and a rate written there with
    ``replace_state`` is multiplied on from there, as torch multiplies the
    optimizer's current rate. The product is float32: each step rounds the
    factor and the product, so the relative error after $t$ steps is at
    most about $2t \cdot 2^{-24}$; for a constant factor,
    ``schedules.exponential_decay(lr, decay_rate=f, transition_steps=1)``
    computes the power at once. Past $2^{31} - 1$
    steps the count saturates and $\lambda$ is called with $2^{31} - 1$.
    The learning rate is positive and this stage gives the step its sign, as
    :func:`scale_by_learning_rate` does.

    Args:
        learning_rate: the first step's rate $\eta_0$, a number >= 0. It
            makes the state, so it is not kept with ``hyperparams_in_state``:
            the state holds the current rate. No default.
        lr_lambda: a jittable function ``epoch -> factor`` (an int32 count,
            1 on the first call) returning a real scalar >= 0. A factor for
            an epoch of ``n`` steps is one that is 1 except where
            ``epoch % n == 0``. No default.

    Returns:
        An update object with state
        ``ScaleByMultiplicativeLrState(learning_rate, count)``, the rate
        float32.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> def halve_every_other(epoch):
        ...     return jnp.where(epoch % 2 == 0, 0.5, 1.0)
        >>> opt = ux.scale_by_multiplicative_lr(0.8, halve_every_other)
        >>> opt
        scale_by_multiplicative_lr(learning_rate=0.8, lr_lambda=halve_every_other)
        >>> state = opt.init(None)
        >>> for _ in range(3):  # the rates 0.8, 0.8, 0.4
        ...     u, state = opt.update({"w": jnp.array([1.0])}, state)
        >>> u["w"], opt.get_state(state, "scale_by_multiplicative_lr.learning_rate")
        (Array([-0.4], dtype=float32), Array(0.4, dtype=float32))

    References:
        PyTorch's ``torch.optim.lr_scheduler.MultiplicativeLR``.
    """
    return stateful(_init_scale_by_multiplicative_lr, _apply_scale_by_multiplicative_lr, elementwise=True,
                    name="scale_by_multiplicative_lr", options=dict(learning_rate=learning_rate, lr_lambda=lr_lambda),
                    domains=dict(learning_rate=LEARNING_RATE, lr_lambda=Function()))


def _init_reduce_on_plateau(params, *, mode):
    worst = jnp.inf if mode == "min" else -jnp.inf
    return ReduceOnPlateauState(scale=jnp.ones([], jnp.float32), best_loss=jnp.full([], worst, jnp.float32),
                                plateau_count=_tree.zero_count(), cooldown_count=_tree.zero_count(),
                                count=_tree.zero_count(),
                                avg_loss=jnp.zeros([], jnp.float32))


def _apply_reduce_on_plateau(updates, state, params, *, factor, patience, rtol, atol, cooldown,
                             accumulation_size, min_scale, mode, loss=None):
    if loss is None:
        raise ValueError("reduce_on_plateau needs the loss: call update(updates, state, params, loss=loss) (inside "
                         "optax.chain, wrap the updax object in ux.to_optax so that optax passes the loss on)")
    loss = scalar_input("reduce_on_plateau", "loss", loss)
    count = _tree.safe_increment(state.count)
    avg = (state.count.astype(jnp.float32) * state.avg_loss + jnp.asarray(loss, jnp.float32)) / count.astype(jnp.float32)
    evaluate = count >= accumulation_size

    if mode == "min":
        improved = avg < (1 - rtol) * state.best_loss - atol
    else:
        improved = avg > (1 + rtol) * state.best_loss + atol
    best = jnp.where(improved, avg, state.best_loss)
    plateau = jnp.where(improved, 0, _tree.safe_increment(state.plateau_count))
    cooling = state.cooldown_count > 0
    hit = (~cooling) & (plateau >= patience)
    scale = jnp.where(hit, jnp.maximum(state.scale * factor, min_scale), state.scale)
    plateau = jnp.where(cooling | hit, 0, plateau)
    cooldown_count = jnp.where(cooling, state.cooldown_count - 1, jnp.where(hit, cooldown, 0))

    new = ReduceOnPlateauState(scale=scale.astype(jnp.float32), best_loss=best, plateau_count=plateau,
                               cooldown_count=cooldown_count.astype(state.cooldown_count.dtype), count=jnp.zeros_like(count),
                               avg_loss=jnp.zeros_like(avg))
    waiting = state._replace(count=count, avg_loss=avg)
    new = jax.tree.map(lambda a, b: jnp.where(evaluate, a, b), new, waiting)

    return jax.tree.map(lambda g: scaled(g, new.scale), updates), new


@combinator
def reduce_on_plateau(factor: ScalarOrSchedule = 0.1, patience: int = 10, rtol: ScalarOrSchedule = 1e-4,
                      atol: ScalarOrSchedule = 0.0, cooldown: int = 0, accumulation_size: int = 1,
                      min_scale: ScalarOrSchedule = 0.0, mode: str = "min") -> Update:
    r"""Multiplies updates by a factor that drops when the reported loss stops improving.

    Pass the loss to every call: ``opt.update(grads, state, params, loss=loss)``
    (stages that take no extra keywords ignore it). The loss is averaged over
    ``accumulation_size`` calls; each average that is not below
    $(1 - \text{rtol})\, \text{best} - \text{atol}$ counts toward the plateau, and after
    ``patience`` such averages the scale is multiplied by ``factor`` (floored
    at ``min_scale``), then rests for ``cooldown`` averages. With
    ``mode="max"`` the reported value is a metric to raise (an accuracy): an
    average improves when it is above $(1 + \text{rtol})\, \text{best} + \text{atol}$.

    PyTorch's ``ReduceLROnPlateau(mode, factor, patience, threshold,
    threshold_mode, cooldown, min_lr)`` is ``reduce_on_plateau(factor,
    patience + 1, rtol, atol, cooldown, min_scale=min_lr / lr, mode=mode)``
    with ``rtol=threshold, atol=0.0`` for ``threshold_mode="rel"`` and
    ``rtol=0.0, atol=threshold`` for ``"abs"`` (torch lowers the rate after
    more than ``patience`` bad epochs, updax after ``patience``).

    Update rule: $u \gets s u$ with $s$ the current scale (1 at the start).

    Args:
        factor: the multiplier applied on a plateau, in [0, 1]. Default: ``0.1``.
        patience: averages without improvement before lowering, an integer >= 1.
            Default: ``10``.
        rtol: relative improvement needed, >= 0. Default: ``0.0001``.
        atol: absolute improvement needed, >= 0. Default: ``0.0``.
        cooldown: averages to wait after lowering, an integer >= 0. Default: ``0``.
        accumulation_size: calls averaged per evaluation, an integer >= 1.
            Default: ``1``.
        min_scale: the lowest scale, >= 0. Default: ``0.0``.
        mode: ``'min'`` (the value is a loss, lower is better) or ``'max'``
            (a metric, higher is better). Default: ``'min'``.

    Returns:
        An update object with state ``ReduceOnPlateauState(scale, best_loss,
        plateau_count, cooldown_count, count, avg_loss)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_learning_rate(0.1).reduce_on_plateau(factor=0.5, patience=2)
        >>> g = {"w": jnp.ones(1)}
        >>> state = opt.init(g)
        >>> for loss in [3.0, 2.0, 2.0, 2.0, 2.0, 2.0]:  # two plateaus of 2
        ...     u, state = opt.update(g, state, loss=loss)
        >>> opt.get_state(state, "reduce_on_plateau.scale"), u["w"]
        (Array(0.25, dtype=float32), Array([-0.025], dtype=float32))

    References:
        PyTorch's ``ReduceLROnPlateau``; optax.contrib.reduce_on_plateau.
    """
    options = dict(factor=factor, patience=patience, rtol=rtol, atol=atol, cooldown=cooldown,
                   accumulation_size=accumulation_size, min_scale=min_scale, mode=mode)
    domains = dict(factor=Real(0.0, 1.0), patience=Integer(1), rtol=NON_NEGATIVE, atol=NON_NEGATIVE,
                   cooldown=Integer(0), accumulation_size=Integer(1), min_scale=NON_NEGATIVE,
                   mode=OneOf(("min", "max")))
    return stateful(_init_reduce_on_plateau, _apply_reduce_on_plateau, name="reduce_on_plateau", options=options,
                    domains=domains, schedulable=("factor", "rtol", "atol", "min_scale"))
