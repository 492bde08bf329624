"""Moving averages of whatever flows through a stage: EMA, SMA, weighted EMA.

Each takes the value as the ``updates`` argument of ``update`` and returns
its average, so it averages updates inside a pipeline or any other value
(a loss, a metric, a tree of statistics) on its own. The averages live in the
state and checkpoint with the rest of the optimizer.
"""

from __future__ import annotations

from typing import Annotated, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree
from updax._combinators import combinator
from updax._domains import ANY_REAL, Count, Flag, FloatDtype, Integer, Real, Valid, fail
from updax._primitives import stateful
from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import blend, filled, moment, warmed_up


def _init_value(call, name, value):
    """ema's ``init``: a finite number (complex, for complex values) or a tree of arrays shaped like the values
    (checked against them at ``init``)."""
    number = _tree.is_scalar(value) or isinstance(value, complex)
    if not (number or jax.tree.leaves(value)):
        fail(call, name, value, "must be a number or a tree of arrays", TypeError)
    if number and not jnp.iscomplexobj(value):
        return ANY_REAL.check(call, name, value)
    if number and not np.isfinite(complex(value)):
        fail(call, name, value, "must be finite", ValueError)
    return value


#: What the options of the moving averages hold.
_AVERAGE_DOMAINS = dict(
    decay=Real(0.0, 1.0), debias=Flag(), init=Valid(rule=_init_value, text="must be a number or a tree of arrays"),
    decay_min=Flag(), keep_previous=Flag(), accumulator_dtype=FloatDtype(),
    window=Integer(1, 100_000, why=" (the state holds window copies of the values, and each step sums them)"))


def _domains(options):
    return {k: _AVERAGE_DOMAINS[k] for k in options}


# --------------------------------------------------------------------------
# ema


class EmaState(NamedTuple):
    """The observation count, their total weight ``1 - Π decays``, the average, and the one before."""

    count: Count
    total_weight: Annotated[jax.Array, Real(0.0, 1.0)]
    ema: Any
    previous: Any


def _init_ema(params, *, init, accumulator_dtype, keep_previous):
    ema = filled("ema", params, init, accumulator_dtype)
    previous = jax.tree.map(lambda a: jnp.array(a, copy=True), ema) if keep_previous else None
    return EmaState(count=_tree.zero_count(), total_weight=jnp.zeros([], jnp.float32), ema=ema, previous=previous)


def _apply_ema(updates, state, params, *, decay, debias, decay_min, keep_previous):
    b = warmed_up(decay, state.count, decay_min)
    total_weight = b * state.total_weight + (1.0 - b)
    if debias:
        # The zero-debiased average (ema - init·Πb) / (1 - Πb) is the weighted mean of the
        # observations: recur on it directly (the old mean has weight b·(1 - Πb_{t-1})).
        safe = jnp.where(total_weight > 0, total_weight, 1.0)
        keep = jnp.where(total_weight > 0, b * state.total_weight / safe, 1.0)
        take = jnp.where(total_weight > 0, (1.0 - b) / safe, 0.0)
    else:
        keep, take = b, 1.0 - b
    ema = _tree.tree_map("ema", lambda m, x: blend(m, x, keep, take), state.ema, updates,
                         names=("state.ema", "updates"))
    out = jax.tree.map(lambda average, value: average.astype(value.dtype), ema, updates)
    return out, EmaState(count=_tree.safe_increment(state.count), total_weight=total_weight, ema=ema,
                         previous=state.ema if keep_previous else None)


@combinator
def ema(decay: ScalarOrSchedule, debias: bool = True, *, init: PyTree = 0.0, decay_min: bool = False,
        keep_previous: bool = False, accumulator_dtype: DType = None) -> Update:
    r"""Exponential moving average of the values that flow through it.

    Update rule, for each observation $x$ ($b$ the decay of this step), with $\text{ema}$ starting at
    $\text{init}$ = ``init``:

    $$
    \begin{align*}
    \text{ema} &\gets b\, \text{ema} + (1 - b)\, x \\
    u &= \text{ema} && (\texttt{debias=False}) \\
    u &= \frac{\text{ema} - \text{init} \prod b}{1 - \prod b} && (\texttt{debias=True})
    \end{align*}
    $$

    $\prod b$ is the product of the decays used so far ($b^t$ for a constant
    decay). The debiased average is the weighted mean of the observations, so
    it does not depend on ``init`` (it stays at ``init`` while $\prod b = 1$,
    before any observation has a weight); the state stores that average directly.

    Args:
        decay: the decay $b$, in [0, 1], or a schedule ``count -> decay``.
            No default.
        debias: remove the bias towards ``init`` (Adam's bias correction).
            Default: ``True``.
        init: the starting value, a number or a tree shaped like the values.
            Default: ``0.0``.
        decay_min: TensorFlow's warm-up: step $t$ (from 0) uses the smaller
            of ``decay`` and $(1 + t) / (10 + t)$. Default: ``False``.
        keep_previous: also keep the average before the last observation in
            ``state.previous`` (the one to freeze for evaluation). Default:
            ``False``.
        accumulator_dtype: storage dtype of the average; None keeps the
            values' dtype but at least float32. Default: ``None``.

    Returns:
        An update object with state ``EmaState(count, total_weight, ema,
        previous)``; it returns the current average.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.ema(0.5, debias=False)
        >>> state = opt.init({"x": jnp.zeros(())})
        >>> for x in [2.0, 4.0]:
        ...     avg, state = opt.update({"x": jnp.array(x)}, state)
        >>> avg["x"]  # 0.5·(0.5·0 + 0.5·2) + 0.5·4
        Array(2.5, dtype=float32)
        >>> ux.ema(0.5).update({"x": jnp.array(2.0)}, ux.ema(0.5).init({"x": jnp.zeros(())}))[0]["x"]
        Array(2., dtype=float32)

    References:
        Kingma & Ba, "Adam", ICLR 2015 (zero-debias); tf.train.ExponentialMovingAverage
        (``num_updates`` warm-up); optax.ema.
    """
    options = dict(decay=decay, debias=debias, init=init, decay_min=decay_min, keep_previous=keep_previous,
                   accumulator_dtype=accumulator_dtype)
    return stateful(_init_ema, _apply_ema, name="ema", options=options, domains=_domains(options),
                    schedulable=("decay",))


# --------------------------------------------------------------------------
# sma


class SmaState(NamedTuple):
    """The observation count and the last ``window`` observations (a ring buffer on a leading axis).

    At its dtype's maximum ``count`` cycles through its last ``window`` values,
    so the slot it points to in the ring buffer keeps advancing.
    """

    count: Count
    window_values: Any


def _init_sma(params, *, window, accumulator_dtype):
    def buffer(p):
        p = jnp.asarray(p)
        return _tree.full((window,) + p.shape, 0.0, accumulator_dtype or _tree.compute_dtype(p.dtype), p,
                          dims=(None, *range(p.ndim)))

    return SmaState(count=_tree.zero_count(), window_values=jax.tree.map(buffer, params))


def _apply_sma(updates, state, params, *, window):
    slot = state.count % window
    seen = jnp.minimum(state.count, window - 1) + 1

    def leaf(buf, x):
        buf = buf.at[slot].set(x.astype(buf.dtype))
        c = _tree.compute_dtype(buf.dtype, x.dtype)
        mean = jnp.sum(buf.astype(c), axis=0) / seen.astype(c)
        return mean.astype(x.dtype), buf

    out, buffers = _tree.tree_map_unzip("sma", leaf, 2, state.window_values, updates,
                                        names=("state.window_values", "updates"))
    return out, SmaState(count=_tree.cyclic_increment(state.count, window), window_values=buffers)


@combinator
def sma(window: int, *, accumulator_dtype: DType = None) -> Update:
    r"""Simple moving average: the mean of the last ``window`` values.

    Update rule, for the observations $x_1, x_2, \ldots$ at step $t$ (counting from 1):
    $u = (x_{t-n+1} + \cdots + x_t) / n$ with $n$ the smaller of $t$ and ``window``, so before the window fills
    it is the mean of what has been seen.

    Args:
        window: the number of values averaged, an integer in [1, 100000]
            (the state holds ``window`` copies of the values). No default.
        accumulator_dtype: storage dtype of the window; None keeps the values'
            dtype but at least float32. Default: ``None``.

    Returns:
        An update object with state ``SmaState(count, window_values)``
        (``window`` copies of the values).

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.sma(2)
        >>> state = opt.init(jnp.zeros(()))
        >>> for x in [1.0, 3.0, 8.0]:
        ...     avg, state = opt.update(jnp.array(x), state)
        ...     print(float(avg))
        1.0
        2.0
        5.5

    References:
        The simple (boxcar) moving average of signal processing, e.g. the
        moving-average system of Oppenheim & Schafer, "Discrete-Time Signal
        Processing", 3rd ed., 2010, chapter 2.
    """
    options = dict(window=window, accumulator_dtype=accumulator_dtype)
    return stateful(_init_sma, _apply_sma, name="sma", options=options, domains=_domains(options), static=("window",))


# --------------------------------------------------------------------------
# weighted moving average


class WeightedMovingAverageState(NamedTuple):
    """The EMA of ``value·weight`` and the EMA of ``weight`` (both without debiasing: it cancels)."""

    weighted_sum: Any
    weight_sum: Any


def _init_weighted_moving_average(params, *, accumulator_dtype):
    return WeightedMovingAverageState(weighted_sum=_tree.accumulators(params, accumulator_dtype),
                                      weight_sum=_tree.accumulators(params, accumulator_dtype))


def _apply_weighted_moving_average(updates, state, params, *, decay, weight=1.0):
    b = jnp.asarray(decay, jnp.float32)
    if _tree.is_scalar(weight):
        weight = jax.tree.map(lambda _: weight, updates)
    _tree.check_same_structure("weighted_moving_average", updates, weight, "updates", "weight")
    for (where, x), w in zip(jax.tree_util.tree_flatten_with_path(updates)[0], jax.tree.leaves(weight)):
        w_shape, x_shape = jnp.shape(w), jnp.shape(x)
        if len(w_shape) > len(x_shape) or any(a not in (1, b) for a, b in zip(w_shape[::-1], x_shape[::-1])):
            raise ValueError(f"weighted_moving_average: weight{jax.tree_util.keystr(where)} has shape {w_shape}, "
                             f"which does not broadcast to the values' shape {x_shape}")

    def leaf(x, w, ws0, s0):
        c = _tree.compute_dtype(x.dtype, s0.dtype)
        b_c, w = b.astype(c), jnp.asarray(w).astype(c)
        s = moment(b_c, s0.astype(c), w * x.astype(c))
        ws = moment(b_c, ws0.astype(c), w)
        mean = jnp.where(ws > 0, s / jnp.where(ws > 0, ws, 1), 0)
        return mean.astype(x.dtype), s.astype(s0.dtype), jnp.broadcast_to(ws, jnp.shape(ws0)).astype(ws0.dtype)

    out, sums, weights = _tree.tree_map_unzip("weighted_moving_average", leaf, 3, updates, weight,
                                              state.weight_sum, state.weighted_sum,
                                              names=("updates", "weight", "state.weight_sum",
                                                     "state.weighted_sum"))
    return out, WeightedMovingAverageState(weighted_sum=sums, weight_sum=weights)


@combinator
def weighted_moving_average(decay: ScalarOrSchedule, *, accumulator_dtype: DType = None) -> Update:
    r"""Weighted exponential moving average: ``EMA(value·weight) / EMA(weight)``.

    Each ``update(values, state, weight=w)`` observes the values with weight
    ``w`` (a number, or a tree of arrays broadcastable to the values' leaves,
    e.g. a batch size or a mask; 1 when not given). Update rule, for the values $x$ with weight $w$, with $b$ =
    ``decay``:

    $$
    \begin{align*}
    s &\gets b s + (1 - b)\, w x \\
    z &\gets b z + (1 - b)\, w \\
    u &= s / z
    \end{align*}
    $$

    and $u = 0$ where $z \le 0$ (while no weight has been seen). The zero-debias factors of $s$ and $z$ are equal
    and cancel.

    Args:
        decay: the decay $b$, in [0, 1], or a schedule ``count -> decay``.
            No default.
        accumulator_dtype: storage dtype of both averages; None keeps the
            values' dtype but at least float32. Default: ``None``.

    Returns:
        An update object with state ``WeightedMovingAverageState(weighted_sum,
        weight_sum)``; ``update`` takes ``weight=``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.weighted_moving_average(0.5)
        >>> state = opt.init(jnp.zeros(()))
        >>> avg, state = opt.update(jnp.array(1.0), state, weight=3.0)
        >>> avg, state = opt.update(jnp.array(5.0), state, weight=1.0)
        >>> avg  # (0.5·0.5·3·1 + 0.5·1·5) / (0.5·0.5·3 + 0.5·1)
        Array(2.6, dtype=float32)

    References:
        The weighted moving average of Keras/TensorFlow metrics (a mean
        weighted by sample weights), with exponential forgetting.
    """
    options = dict(decay=decay, accumulator_dtype=accumulator_dtype)
    return stateful(_init_weighted_moving_average, _apply_weighted_moving_average, name="weighted_moving_average",
                    options=options, domains=_domains(options), schedulable=("decay",))
