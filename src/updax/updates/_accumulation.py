"""Momentum and gradient accumulation."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax import _validate as check
from updax._core import Update, combinator, stateful


class TraceState(NamedTuple):
    """The momentum buffer."""

    trace: object


def _init_trace(params, *, accumulator_dtype):
    return TraceState(trace=_tree.accumulators(params, accumulator_dtype))


def _apply_trace(updates, state, params, *, decay, nesterov):
    def leaf(g, t0):
        c = _tree.compute_dtype(g.dtype, t0.dtype)
        g32 = g.astype(c)
        t = decay * t0.astype(c) + g32
        u = decay * t + g32 if nesterov else t
        return u.astype(g.dtype), t.astype(t0.dtype)

    u, trace_ = _tree.tree_map_unzip("trace", leaf, 2, updates, state.trace, names=("updates", "state.trace"))
    return u, TraceState(trace=trace_)


@combinator
def trace(decay=0.9, nesterov=False, *, accumulator_dtype=None):
    """Accumulates a momentum trace of the updates (heavy-ball or Nesterov).

    Update rule::

        t ← decay·t + g
        u = t                 (nesterov=False)
        u = decay·t + g       (nesterov=True)

    Args:
        decay: the momentum, in [0, 1]. Default: ``0.9``.
        nesterov: use Nesterov's look-ahead form. Default: ``False``.
        accumulator_dtype: storage dtype of the trace; None keeps the params'
            dtype but at least float32. Default: ``None``.

    Returns:
        An update object with state ``TraceState(trace)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.trace(decay=0.5)
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> for _ in range(3):
        ...     u, state = opt.update({"w": jnp.array([1.0])}, state)
        >>> u["w"]  # 1 + 0.5 + 0.25
        Array([1.75], dtype=float32)

    References:
        Polyak, "Some methods of speeding up the convergence of iteration
        methods", 1964; Sutskever et al., "On the importance of initialization
        and momentum in deep learning", ICML 2013.
    """
    options = dict(decay=check.real("trace", "decay", decay, 0.0, 1.0),
                   nesterov=check.flag("trace", "nesterov", nesterov),
                   accumulator_dtype=check.float_dtype("trace", "accumulator_dtype", accumulator_dtype))
    return stateful(_init_trace, _apply_trace, name="trace", options=options)


class AccumulateGradientsState(NamedTuple):
    """The wrapped pipeline's state, the running sum of updates, and calls since the last step."""

    inner: tuple
    accumulated: object
    count: jax.Array


def _init_accumulate_gradients(params, *, inner):
    return AccumulateGradientsState(inner=inner.init(params), accumulated=_tree.accumulators(params, None),
                                    count=_tree.zero_count())


def _apply_accumulate_gradients(updates, state, params, *, inner, steps, **extra):
    accumulated = _tree.tree_map("accumulate_gradients", lambda g, a: a + g.astype(a.dtype), updates,
                                 state.accumulated, names=("updates", "state.accumulated"))
    count = state.count + 1
    ready = count >= steps

    def run(operand):
        total, inner_state = operand
        mean = jax.tree.map(lambda a, g: (a / steps).astype(g.dtype), total, updates)
        return inner.update(mean, inner_state, params, **extra)

    def wait(operand):
        shapes = jax.eval_shape(run, operand)[0]
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes), operand[1]

    out, inner_state = jax.lax.cond(ready, run, wait, (accumulated, state.inner))
    accumulated = jax.tree.map(lambda a: jnp.where(ready, jnp.zeros_like(a), a), accumulated)
    return out, AccumulateGradientsState(inner=inner_state, accumulated=accumulated,
                                         count=jnp.where(ready, 0, count).astype(count.dtype))


@combinator(wraps=True)
def accumulate_gradients(inner: Update, steps):
    """Runs the pipeline before it once every ``steps`` calls, on the mean of those calls' updates.

    Between those calls it emits zeros and leaves the wrapped pipeline's
    state untouched. It wraps everything before it:
    ``ux.trace().accumulate_gradients(4)`` runs ``trace`` on the mean of each
    4 updates (Polaris divides only the current update by the count).

    Update rule: ``a ← a + g``; on every ``steps``-th call
    ``u = inner(a / steps)`` and ``a ← 0``, otherwise ``u = 0``.

    Args:
        steps: the number of calls accumulated per step, an integer >= 1.
            No default.

    Returns:
        An update object with state
        ``AccumulateGradientsState(inner, accumulated, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale(-1.0).accumulate_gradients(2)
        >>> opt
        scale(step_size=-1.0) |> accumulate_gradients(steps=2)
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> u1, state = opt.update({"w": jnp.array([1.0])}, state)
        >>> u2, state = opt.update({"w": jnp.array([3.0])}, state)
        >>> u1["w"], u2["w"]
        (Array([0.], dtype=float32), Array([-2.], dtype=float32))

    References:
        Axon.Loop's gradient accumulation; the mean-of-k semantics of
        optax.MultiSteps.
    """
    steps = check.positive_int("accumulate_gradients", "steps", steps)
    return stateful(_init_accumulate_gradients, _apply_accumulate_gradients, name="accumulate_gradients",
                    options=dict(inner=inner, steps=steps), wraps="inner")
