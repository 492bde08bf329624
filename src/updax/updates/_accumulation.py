"""Momentum and gradient accumulation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree
from updax._combinators import combinator
from updax._domains import (Count, Flag, FlagField, FloatDtype, Function, Integer, MomentField, Pipeline, Real, Valid,
                            count_dtype, fail, is_concrete, returned)
from updax._primitives import stateful
from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax._leafwise import per_leaf


class TraceState(NamedTuple):
    """The momentum buffer."""

    trace: MomentField


def _init_trace(params, *, accumulator_dtype):
    return TraceState(trace=_tree.accumulators(params, accumulator_dtype))


def _apply_trace(updates, state, params, *, decay, nesterov):
    def rule(g, t):
        t = decay * t + g
        u = decay * t + g if nesterov else t
        return u, t

    u, trace_ = per_leaf("trace", rule, (updates, state.trace), ("updates", "state.trace"))
    return u, TraceState(trace=trace_)


@combinator
def trace(decay: ScalarOrSchedule = 0.9, nesterov: bool = False, *, accumulator_dtype: DType = None) -> Update:
    r"""Accumulates a momentum trace of the updates (heavy-ball or Nesterov).

    Update rule, for an update $g$, with $b$ = ``decay``:

    $$
    \begin{align*}
    t &\gets b\, t + g \\
    u &= t && (\texttt{nesterov=False}) \\
    u &= b\, t + g && (\texttt{nesterov=True})
    \end{align*}
    $$

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
    return stateful(_init_trace, _apply_trace, elementwise=True, name="trace",
                    options=dict(decay=decay, nesterov=nesterov, accumulator_dtype=accumulator_dtype),
                    domains=dict(decay=Real(0.0, 1.0), nesterov=Flag(), accumulator_dtype=FloatDtype(complex=True)),
                    schedulable=("decay",))


class AccumulateGradientsState(NamedTuple):
    """The multi-step wrapper's state.

    ``inner`` is the wrapped pipeline's state, ``accumulated`` the sum of the
    updates since its last step, ``mini_step`` how many there are,
    ``gradient_step`` how many steps the wrapped pipeline has taken,
    ``updated`` whether the last call ran it, and ``skip`` what the skip
    function reported on the last call (``{}`` without one).
    """

    inner: tuple
    accumulated: Any
    mini_step: Count
    gradient_step: Count
    updated: FlagField
    skip: dict


#: ``k``, the calls accumulated per step: the ``steps`` option, or each value its function returns.
_STEPS = Integer(1)


def _steps_option(call, name, value):
    """``steps``: a positive integer, or a function ``gradient_step -> k`` (whose values :func:`_steps_at`
    checks as it returns them)."""
    return value if callable(value) else _STEPS.check(call, name, value)


#: What the options of accumulate_gradients hold.
_ACCUMULATE_DOMAINS = dict(inner=Pipeline(), mean=Flag(), should_skip=Function(optional=True),
                           steps=Valid(rule=_steps_option, values=_STEPS,
                                       text="must be a positive integer or a function gradient_step -> k"))


def _steps_at(steps, gradient_step):
    """``k`` for this call, in the step counters' dtype: ``steps``, or what its function returns for
    ``gradient_step``. What it returns is refused by name unless it is a positive integer: its shape and dtype
    while tracing (a traced float too: whether it is whole is not known until it runs), its value where it is
    concrete (and under :func:`updax.checked`)."""
    if not callable(steps):
        return jnp.asarray(steps, count_dtype())
    call, name, where = "accumulate_gradients", "steps(...)", "the value it returned"
    k = steps(gradient_step)
    try:
        dtype, shape = jnp.result_type(k), jnp.shape(k)
    except TypeError:
        fail(call, name, k, _STEPS.text, TypeError, where)
    shown = np.asarray(k) if is_concrete(k) else f"<traced {dtype.name}{list(shape)}>"
    if shape != ():
        fail(call, name, shown, f"{_STEPS.text}, not an array of shape {shape}", TypeError, where)
    if dtype == jnp.bool_ or not (jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating)):
        fail(call, name, shown, f"{_STEPS.text}, not {dtype.name}", TypeError, where)
    if jnp.issubdtype(dtype, jnp.floating) and not is_concrete(k):
        fail(call, name, shown, f"{_STEPS.text}: return an integer dtype under jax.jit (a traced float is not "
             "known to be whole until it runs)", TypeError, where)
    return jnp.asarray(returned(call, "steps", k, _STEPS, gradient_step), count_dtype())


def _skip_record(should_skip, params):
    """The skip function's record with every field zero: its structure is fixed at init."""
    if should_skip is None:
        return {}
    shapes = jax.eval_shape(lambda p: should_skip(p, _tree.zero_count(), p)[1], params)
    return jax.tree.map(_tree.zeros_of, shapes)


def _init_accumulate_gradients(params, *, inner, should_skip):
    return AccumulateGradientsState(inner=inner.init(params), accumulated=_tree.accumulators(params, None),
                                    mini_step=_tree.zero_count(), gradient_step=_tree.zero_count(),
                                    updated=jnp.zeros([], bool), skip=_skip_record(should_skip, params))


def _apply_accumulate_gradients(updates, state, params, *, inner, steps, mean, should_skip, **extra):
    return accumulated_step(updates, state, params, inner, steps, mean, should_skip, extra)


def _in_a_conditional(ready, run, wait, operand):
    """The pipeline's step on the ready calls only: ``lax.cond``."""
    return jax.lax.cond(ready, run, wait, operand)


def accumulated_step(updates, state, params, inner, steps, mean, should_skip, extra, stepped=_in_a_conditional):
    """One call: the updates accumulated, the pipeline stepped on every ``k``-th. ``stepped(ready, run, wait,
    operand)`` returns the pipeline's ``(updates, state)`` on the ready calls and ``wait``'s otherwise: in a
    conditional here; a backend's path may compute the step on every call and select."""
    if should_skip is None:
        skip, record = jnp.zeros([], bool), {}
    else:
        skip, record = should_skip(updates, state.gradient_step, params)
        skip = jnp.asarray(skip, bool)
        _tree.check_same_structure("accumulate_gradients", state.skip, record, "the skip record at init",
                                   "the skip function's record")
    k = _steps_at(steps, state.gradient_step)
    accumulated = _tree.tree_map("accumulate_gradients", lambda a, g: a + g.astype(a.dtype), state.accumulated,
                                 updates, names=("state.accumulated", "updates"))
    mini_step = _tree.safe_increment(state.mini_step)
    ready = (mini_step >= k) & ~skip

    def run(operand):
        total, inner_state = operand
        scale = k.astype(jnp.float32) if mean else jnp.ones([], jnp.float32)
        step = jax.tree.map(lambda a, g: (a / scale.astype(a.dtype)).astype(g.dtype), total, updates)
        return inner.update(step, inner_state, params, **extra)

    def wait(operand):
        return jax.tree.map(_tree.zeros_of, jax.eval_shape(run, operand)[0]), operand[1]

    out, inner_state = stepped(ready, run, wait, (accumulated, state.inner))
    accumulated = jax.tree.map(lambda new, old: jnp.where(skip, old, jnp.where(ready, jnp.zeros_like(new), new)),
                               accumulated, state.accumulated)
    return out, AccumulateGradientsState(
        inner=inner_state, accumulated=accumulated,
        mini_step=jnp.where(skip, state.mini_step, jnp.where(ready, 0, mini_step)).astype(mini_step.dtype),
        gradient_step=jnp.where(ready, _tree.safe_increment(state.gradient_step), state.gradient_step),
        updated=ready, skip=record)


@combinator(wraps=True)
def accumulate_gradients(inner: Update, steps: int | Callable[..., Any], *, mean: bool = True,
                         should_skip: Callable[..., Any] | None = None) -> Update:
    r"""Runs the pipeline before it once every ``steps`` calls, on the mean of those calls' updates.

    Between those calls it emits zeros and leaves the wrapped pipeline's
    state untouched. It wraps everything before it:
    ``ux.trace().accumulate_gradients(4)`` runs ``trace`` on the mean of each
    4 updates (Polaris divides only the current update by the count). This
    is optax's ``MultiSteps`` as a stage: :func:`has_updated` tells whether a
    call stepped.

    Update rule, for an update $g$: $a \gets a + g$; on every $k$-th call $u = \operatorname{inner}(a / k)$
    ($\operatorname{inner}(a)$ with ``mean=False``) and $a \gets 0$, otherwise $u = 0$.

    A skip function ``should_skip(updates, gradient_step, params) -> (skip,
    record)`` (e.g. :func:`skip_not_finite`, :func:`skip_large_updates`) can
    reject a call: it emits zeros and leaves the state bit-identical except
    ``updated`` (False) and ``skip`` (the record of why).

    Jitted for the CPU around an elementwise pipeline, the backend's hints
    (:func:`updax.backend_hints`) compute the pipeline's step on every call
    and keep it on the ``k``-th, so that XLA writes the state in place; the
    values are the same, and a step with an effect (a ``jax.debug``
    callback) still runs in the conditional.

    Args:
        steps: $k$, the calls accumulated per step: an integer >= 1, or a
            function ``gradient_step -> k`` (a varying accumulation) that
            returns one, as a Python int or an integer array of shape ``()``
            (a whole float is taken where it is concrete, e.g. a constant
            ``4.0``; under ``jax.jit`` a traced float is refused while
            tracing, as not known to be whole until it runs). What the
            function returns is refused by name: an array of another shape
            or dtype always, 0, a negative, a fraction or NaN on an eager step
            (and under :func:`updax.checked`). No default.
        mean: divide the sum by ``k``; False steps on the sum. Default:
            ``True``.
        should_skip: a skip function, or None. Default: ``None``.

    Returns:
        An update object with state ``AccumulateGradientsState(inner,
        accumulated, mini_step, gradient_step, updated, skip)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale(-1.0).accumulate_gradients(2)
        >>> opt
        scale(step_size=-1.0) |> accumulate_gradients(steps=2, mean=True)
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> u1, state = opt.update({"w": jnp.array([1.0])}, state)
        >>> u2, state = opt.update({"w": jnp.array([3.0])}, state)
        >>> u1["w"], u2["w"], ux.has_updated(state)
        (Array([0.], dtype=float32), Array([-2.], dtype=float32), Array(True, dtype=bool))

    References:
        Axon.Loop's gradient accumulation; optax.MultiSteps (mini_step,
        gradient_step, should_skip_update_fn).
    """
    return stateful(_init_accumulate_gradients, _apply_accumulate_gradients, name="accumulate_gradients",
                    options=dict(inner=inner, steps=steps, mean=mean, should_skip=should_skip),
                    domains=_ACCUMULATE_DOMAINS, wraps="inner", state_last=("inner", "accumulated"))


def has_updated(state: PyTree) -> jax.Array:
    """Whether the last call of an ``accumulate_gradients`` stage ran the pipeline it wraps.

    Args:
        state: the state of a pipeline holding exactly one
            ``accumulate_gradients`` stage (at any depth), or that stage's
            ``AccumulateGradientsState``. No default.

    Returns:
        A boolean scalar array (usable under ``jax.jit``).

    Example:
        See :func:`accumulate_gradients`.
    """
    found = [s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, AccumulateGradientsState))
             if isinstance(s, AccumulateGradientsState)]
    if len(found) != 1:
        raise ValueError(f"has_updated: the state holds {len(found)} accumulate_gradients states; "
                         "pass the one to read")
    return found[0].updated


class ApplyEveryState(NamedTuple):
    """The calls since the last emitted sum, and the sum of their updates."""

    count: Count
    grad_acc: Any


def _init_apply_every(params):
    return ApplyEveryState(count=_tree.zero_count(), grad_acc=_tree.accumulators(params, None))


def _apply_apply_every(updates, state, params, *, k):
    emit = state.count >= k - 1

    def rule(g, a):
        a = a + g
        return jnp.where(emit, a, jnp.zeros_like(a)), jnp.where(emit, jnp.zeros_like(a), a)

    u, grad_acc = per_leaf("apply_every", rule, (updates, state.grad_acc), ("updates", "state.grad_acc"))
    count = jnp.where(emit, 0, state.count + 1).astype(state.count.dtype)
    return u, ApplyEveryState(count=count, grad_acc=grad_acc)


@combinator
def apply_every(k: int = 1) -> Update:
    r"""Sums the updates and emits the sum every ``k``-th call, zeros in between.

    Update rule, for an update $g$: $a \gets a + g$; on every $k$-th call
    $u = a$ and $a \gets 0$, otherwise $u = 0$.

    Unlike :func:`accumulate_gradients`, it wraps nothing: the stages before
    it step on every call, so ``apply_every`` after a batch of $N/k$ is not
    one step on a batch of $N$ (the stages before it see $k$ gradients). It
    emits the sum, not the mean.

    Args:
        k: the calls per emitted sum, an integer >= 1. Default: ``1``.

    Returns:
        An update object with state ``ApplyEveryState(count, grad_acc)``;
        ``count`` is the calls since the last emitted sum, ``grad_acc`` their
        sum (stored in the params' dtype but at least float32).

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.apply_every(3)
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> for g in [1.0, 2.0, 3.0, 4.0]:
        ...     u, state = opt.update({"w": jnp.array([g])}, state)
        ...     print(u["w"])
        [0.]
        [0.]
        [6.]
        [0.]

    References:
        optax.apply_every (same rule; optax keeps the emitted sum in its
        state until the next call, updax zeroes it).
    """
    return stateful(_init_apply_every, _apply_apply_every, name="apply_every", elementwise=True,
                    options=dict(k=k), domains=dict(k=Integer(1)))
