"""Line searches: the step size along the incoming update, from evaluations of the objective.

A line-search stage needs the objective ``f`` the params minimise. Give it to
``update`` as optax does: ``update(updates, state, params, value=f(w),
grad=∇f(w), value_fn=f)``; other keywords of ``update`` that ``f`` names
(a batch, say) are passed to ``f``. For a fixed (full-batch) objective the
stage can instead be built with ``objective=f``; ``value`` and ``grad``, when
not given, are then computed from it at the params.

The stage keeps the value and gradient at the point it accepts, so that the
next step need not compute them again: :func:`value_and_grad_from_state`.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Callable
from typing import Annotated, Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import (NON_NEGATIVE, POSITIVE, UNIT, Count, Flag, Function, Integer, OneOf, Real, Valid,
                            is_concrete, scalar_input)
from updax._options import keywords
from updax._primitives import stateful
from updax._stage import ScheduledState
from updax._update import Update
from updax.updates._kernels import scaled
from updax.updates._lbfgs import real_dtype, tree_vdot

__all__ = ["ScaleByBacktrackingLinesearchState", "ScaleByZoomLinesearchState", "scale_by_backtracking_linesearch",
           "scale_by_zoom_linesearch", "value_and_grad_from_state"]

#: The keywords of ``update`` a line search reads itself.
_OWN = ("value", "grad", "value_fn")


def _none_or_positive(call, name, value):
    return None if value is None else POSITIVE.check(call, name, value)


def _none_or_non_negative(call, name, value):
    return None if value is None else NON_NEGATIVE.check(call, name, value)


#: Why the step counts are bounded: each step evaluates the objective (and halving a step from 1 leaves float32's
#: range in about 150 steps).
_STEPS_WHY = " (each step evaluates the objective; optax's searches take 15 to 30)"

#: What the options both line searches have hold.
_SHARED_DOMAINS = dict(slope_rtol=UNIT, objective=Function(optional=True))

_BACKTRACKING_DOMAINS = dict(
    _SHARED_DOMAINS, max_backtracking_steps=Integer(0, 1000, why=_STEPS_WHY),
    decrease_factor=Real(0.0, 1.0, lo_open=True, hi_open=True), increase_factor=Real(1.0, inf=True), max_learning_rate=POSITIVE,
    atol=NON_NEGATIVE, rtol=NON_NEGATIVE, store_grad=Flag(), verbose=Flag(late=True))

_ZOOM_DOMAINS = dict(
    _SHARED_DOMAINS, max_linesearch_steps=Integer(1, 1000, why=_STEPS_WHY),
    max_learning_rate=Valid(rule=_none_or_positive, text="must be None or in (0, inf)", values=POSITIVE),
    tol=NON_NEGATIVE, increase_factor=Real(1.0, lo_open=True), curv_rtol=NON_NEGATIVE,
    approx_dec_rtol=Valid(rule=_none_or_non_negative, text="must be None or in [0, inf)", values=NON_NEGATIVE),
    stepsize_precision=NON_NEGATIVE, initial_guess_strategy=OneOf(("keep", "one")), verbose=Flag(late=True))


def _report(cases: list[tuple[Any, str]], **values: Any) -> None:
    """``verbose``: prints the message of the first of ``cases`` (a condition, the step's own test, and a message in
    ``jax.debug.print``'s format of ``values``) whose condition holds, and nothing if none does; under ``jax.jit``
    through a ``lax.switch``, one print at most per step."""
    def say(message: str) -> None:
        named = {name for _, name, _, _ in string.Formatter().parse(message) if name}
        jax.debug.print(message, **{name: values[name] for name in named})

    if all(is_concrete(condition) for condition, _ in cases):
        message = next((message for condition, message in cases if bool(condition)), None)
        if message is not None:
            say(message)
        return
    index = jnp.select([jnp.asarray(condition) for condition, _ in cases], list(range(1, len(cases) + 1)), 0)
    jax.lax.switch(index, [lambda: None] + [functools.partial(say, message) for _, message in cases])


# --------------------------------------------------------------------------
# The objective along the line


def _line(call, updates, params, objective, extra):
    """``(f, value, grad)``: ``f(step) -> (value, grad, slope)`` at ``w + step·u``, and the value and gradient at
    ``w`` (given to ``update``, or computed from the function).

    The function is ``update``'s ``value_fn``, else the stage's ``objective``; it gets the keywords of
    ``update`` that its signature names (all of them, but the line search's own, if it takes ``**kwargs``).
    """
    value, grad, value_fn = (extra.pop(k, None) for k in _OWN)
    if value_fn is not None and objective is not None:
        raise ValueError(f"{call}: update got value_fn= and the stage was built with objective=; give one of them")
    fn = value_fn if value_fn is not None else objective
    if fn is None:
        raise ValueError(f"{call} needs the objective: call update(updates, state, params, value=value, grad=grad, "
                         f"value_fn=fn), or build the stage with objective=fn")
    accepted = keywords(fn)
    kwargs = {k: v for k, v in extra.items() if accepted is None or k in accepted}
    which = "value_fn" if value_fn is not None else "objective"

    def f(p):
        return _scalar_output(call, which, fn(p, **kwargs))

    value_and_grad = jax.value_and_grad(f)
    dtype = real_dtype(params)
    if (value is None) != (grad is None):
        raise ValueError(f"{call}: update got {'value' if grad is None else 'grad'}= alone; give value= and grad= "
                         "together (or neither: they are then computed from the objective)")
    if value is None:
        value, grad = value_and_grad(params)
    value = scalar_input(call, "value", value)
    _tree.check_same_structure(call, params, grad, "params", "grad")

    def point(step):
        """``w + step·u``, in the params' dtypes."""
        return jax.tree.map(lambda p, u: (p.astype(_tree.compute_dtype(p.dtype, u.dtype))
                                          + step * u.astype(_tree.compute_dtype(p.dtype, u.dtype))).astype(p.dtype),
                            params, updates)

    def at(step, with_grad=True):
        """``(value, grad, slope)`` at ``w + step·u``; without ``with_grad``, ``(value, grad_fn)``: the gradient
        comes from a linearisation, computed only when ``grad_fn()`` is called."""
        x = point(step)
        if not with_grad:
            v, linear = jax.linearize(f, x)
            return jnp.asarray(v).astype(dtype), lambda: jax.linear_transpose(linear, x)(jnp.ones_like(v))[0]
        v, g = value_and_grad(x)
        return jnp.asarray(v).astype(dtype), g, slope_along(g, updates, dtype)

    def moves(step):
        """Whether ``w + step·u`` differs from ``w`` (where it does not, no smaller step moves the params either)."""
        changed = [jnp.any(x != p) for x, p in zip(jax.tree.leaves(point(step)), jax.tree.leaves(params))]
        return functools.reduce(jnp.logical_or, changed, jnp.asarray(False))

    return at, moves, value.astype(dtype), grad


def slope_along(grad, updates, dtype):
    """The objective's derivative along ``updates``, from JAX's gradient: ``Re Σ g·u``. (For complex params
    ``jax.grad`` gives the conjugate of the steepest ascent, so no conjugate is taken here, as in optax.)"""
    return tree_vdot(jax.tree.map(lambda g: jnp.conj(g) if jnp.iscomplexobj(g) else g, grad), updates, dtype)


def _scalar_output(call, which, value):
    """The objective's value, refused by name unless it is a scalar (shapes are static: under ``jax.jit`` too)."""
    if jnp.shape(value) != ():
        raise TypeError(f"{call}: {which}(params) returned {jnp.result_type(value).name} of shape {jnp.shape(value)}; "
                        "the objective must return a real scalar (the mean over the batch, not one value per example)")
    return value


def _like(tree, like):
    """``tree`` in the dtypes of ``like`` (a loop's carry keeps its types)."""
    return jax.tree.map(lambda x, y: jnp.asarray(x).astype(y.dtype), tree, like)


def _scaled(updates, step):
    return jax.tree.map(lambda u: scaled(u, step), updates)


def _not_nan(error):
    """A NaN error (the objective undefined there) as infinitely bad."""
    return jnp.where(jnp.isnan(error), jnp.inf, error)


# --------------------------------------------------------------------------
# Backtracking (Armijo)


class ScaleByBacktrackingLinesearchState(NamedTuple):
    """The step size taken ``learning_rate``; the objective's ``value`` and ``grad`` where the step lands
    (``grad`` None without ``store_grad``); ``num_linesearch_steps`` evaluations and the final
    ``decrease_error`` (0: sufficient decrease), for diagnostics."""

    learning_rate: Annotated[jax.Array, NON_NEGATIVE]
    value: jax.Array
    grad: Any
    num_linesearch_steps: Count
    decrease_error: jax.Array


def _init_backtracking(params, *, store_grad):
    dtype = real_dtype(params)
    return ScaleByBacktrackingLinesearchState(
        learning_rate=jnp.ones([], dtype), value=jnp.full([], jnp.inf, dtype),
        grad=_tree.accumulators(params, None) if store_grad else None,
        num_linesearch_steps=_tree.zero_count(), decrease_error=jnp.full([], jnp.inf, dtype))


def _apply_backtracking(updates, state, params, *, max_backtracking_steps, slope_rtol, decrease_factor,
                        increase_factor, max_learning_rate, atol, rtol, store_grad, objective, verbose, **extra):
    call = "scale_by_backtracking_linesearch"
    at, _, value, grad = _line(call, updates, params, objective, extra)
    dtype = value.dtype
    slope = slope_along(grad, updates, dtype)

    def body(carry):
        step, _, new_grad, _, n = carry
        step = jnp.where(n > 0, decrease_factor * step, step).astype(dtype)
        new_value, gradient = at(step, with_grad=False)
        error = jnp.maximum(_not_nan(new_value - (1 + rtol) * value - step * slope_rtol * slope), 0).astype(dtype)
        if store_grad:  # the gradient where the search stops only
            last = (error <= atol) | (n == max_backtracking_steps)
            new_grad = jax.lax.cond(last, lambda: _like(gradient(), new_grad), lambda: new_grad)
        return step, new_value, new_grad, error, n + 1

    def searching(carry):
        *_, error, n = carry
        return ~(error <= atol) & (n <= max_backtracking_steps)

    # After a failed search (step 0) start again from max_learning_rate: optax would try 0 forever.
    grown = jnp.minimum(increase_factor * state.learning_rate, max_learning_rate)
    first = jnp.where(state.learning_rate > 0, grown, max_learning_rate).astype(dtype)
    start = (first, value, state.grad, jnp.full([], jnp.inf, dtype), _tree.zero_count())
    step, new_value, new_grad, error, n = jax.lax.while_loop(searching, body, start)
    failed = jnp.isinf(error)  # every value tried was NaN or infinite: no step, and the value and gradient at w
    if verbose:
        said = ("scale_by_backtracking_linesearch: no step with sufficient decrease in {tries} tries: value at the "
                "params {value}, slope along the update {slope}, step taken {step}, decrease error {error}")
        unmet = ~(error <= atol) & ~failed
        _report([(failed, "scale_by_backtracking_linesearch: every value tried in {tries} tries was NaN or infinite: "
                          "a step of 0 (value at the params {value}, slope along the update {slope})"),
                 (unmet & (slope >= 0), said + "\n  the update is not a descent direction: its slope is not below 0"),
                 (unmet, said)], tries=n, value=value, slope=slope, step=step, error=error)
    step = jnp.where(failed, 0.0, step).astype(dtype)
    new_value = jnp.where(failed, value, new_value)
    if store_grad:
        new_grad = _select(failed, _like(grad, new_grad), new_grad)
    return _scaled(updates, step), ScaleByBacktrackingLinesearchState(
        learning_rate=step, value=new_value, grad=new_grad, num_linesearch_steps=n, decrease_error=error)


@combinator
def scale_by_backtracking_linesearch(max_backtracking_steps: int, slope_rtol: float = 1e-4,
                                     decrease_factor: float = 0.8, increase_factor: float = 1.5,
                                     max_learning_rate: float = 1.0, atol: float = 0.0, rtol: float = 0.0,
                                     store_grad: bool = False, objective: Callable[..., Any] | None = None,
                                     verbose: bool = False) -> Update:
    r"""Scales updates by a step size with sufficient decrease, found by backtracking (Armijo).

    Rule: with $f$ the objective, $w$ the params, $u$ the incoming update (a
    descent direction, e.g. $-\nabla f$), $g = \nabla f(w)$, $c_1$ =
    ``slope_rtol``, $\tau_\text{abs}$ = ``atol``, $\tau_\text{rel}$ = ``rtol``,
    the step $\eta$ starts at $\min(\kappa\, \eta_\text{prev}, \eta_\text{max})$, with
    $\kappa$ = ``increase_factor``, $\eta_\text{max}$ = ``max_learning_rate`` and
    $\eta_\text{prev}$ the last step taken (1 on the first call), and is
    multiplied by $\delta$ = ``decrease_factor`` until (at most
    ``max_backtracking_steps`` times)

    $$
    f(w + \eta u) \le (1 + \tau_\text{rel})\, f(w) + c_1 \eta\, \langle u, g \rangle + \tau_\text{abs}
    $$

    and the output is $\eta u$. If every value tried is NaN or infinite, $\eta = 0$,
    and the next call starts again from $\eta_\text{max}$ (optax's starts
    from $\kappa \cdot 0 = 0$ and never moves again). The direction must
    descend ($\langle u, g \rangle < 0$): along one that does not, no step of a convex
    objective passes, and the last one tried, $\delta^N$ times the first
    ($N$ = ``max_backtracking_steps``), is taken
    uphill, as optax's is; the state's ``decrease_error > 0`` says so.
    ``update`` takes the objective's ``value``, ``grad`` and ``value_fn``
    (see the module), or the stage is built with ``objective``.

    Args:
        max_backtracking_steps: the most step-size reductions per call, an
            integer in [0, 1000]. No default.
        slope_rtol: the fraction $c_1$ of the linear decrease required, in
            [0, 1). Default: ``0.0001``.
        decrease_factor: the factor a rejected step is multiplied by, in (0, 1).
            Default: ``0.8``.
        increase_factor: the first try is the last step times this, >= 1;
            ``math.inf`` starts every search at ``max_learning_rate``.
            Default: ``1.5``.
        max_learning_rate: the largest step, > 0. Default: ``1.0``.
        atol: absolute slack of the criterion, >= 0. Default: ``0.0``.
        rtol: relative slack of the criterion, >= 0. Default: ``0.0``.
        store_grad: also keep the gradient where the step lands (one more
            gradient evaluation), for :func:`value_and_grad_from_state`.
            Default: ``False``.
        objective: the objective ``f(params)``, for ``update`` calls without
            ``value_fn``; None to take it from ``update``. Default: ``None``.
        verbose: print, with ``jax.debug.print``, the value and slope at
            the params, the step and its error when a search ends without
            sufficient decrease, and whether the update was not a descent
            direction (optax's option; a search that succeeds prints
            nothing). Default: ``False``.

    Returns:
        An update object with state ``ScaleByBacktrackingLinesearchState(
        learning_rate, value, grad, num_linesearch_steps, decrease_error)``;
        it needs params.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import updax as ux
        >>> def f(w):
        ...     return jnp.sum(w ** 2)
        >>> opt = ux.scale(-1.0).scale_by_backtracking_linesearch(max_backtracking_steps=15)
        >>> w = jnp.array([1.0, 2.0, 3.0])
        >>> state = opt.init(w)
        >>> value, grad = jax.value_and_grad(f)(w)
        >>> u, state = opt.update(grad, state, w, value=value, grad=grad, value_fn=f)
        >>> print(f"{f(w):.2f} -> {f(w + u):.2f}")
        14.00 -> 5.04

    References:
        Armijo, "Minimization of functions having Lipschitz continuous first
        partial derivatives", Pacific J. Math. 16, 1966; Nocedal & Wright,
        "Numerical Optimization", 2nd ed., 2006, Algorithm 3.1; optax's
        ``scale_by_backtracking_linesearch``.
    """
    options = dict(max_backtracking_steps=max_backtracking_steps, slope_rtol=slope_rtol,
                   decrease_factor=decrease_factor, increase_factor=increase_factor,
                   max_learning_rate=max_learning_rate, atol=atol, rtol=rtol, store_grad=store_grad,
                   objective=objective, verbose=verbose)
    return stateful(_init_backtracking, _apply_backtracking, name="scale_by_backtracking_linesearch", options=options,
                    domains=_BACKTRACKING_DOMAINS, needs_params=True, static=("max_backtracking_steps",),
                    schedulable=("slope_rtol", "decrease_factor", "increase_factor", "max_learning_rate", "atol",
                                 "rtol"))


# --------------------------------------------------------------------------
# Zoom (strong Wolfe)


class ScaleByZoomLinesearchState(NamedTuple):
    """The step size taken ``learning_rate``; the objective's ``value`` and ``grad`` where the step lands;
    ``num_linesearch_steps`` evaluations and the final ``decrease_error`` and ``curvature_error`` (0: the
    criterion holds), for diagnostics."""

    learning_rate: Annotated[jax.Array, NON_NEGATIVE]
    value: jax.Array
    grad: Any
    num_linesearch_steps: Count
    decrease_error: jax.Array
    curvature_error: jax.Array


class _Search(NamedTuple):
    """The zoom line search's loop: the last point tried, the bracket ``[low, high]`` (values and slopes at
    both ends, and the previous end ``cubic_ref`` for the cubic fit) and the best point with sufficient
    decrease so far (``safe_*``)."""

    count: jax.Array
    step: jax.Array
    value: jax.Array
    grad: Any
    slope: jax.Array
    decrease_error: jax.Array
    curvature_error: jax.Array
    bracketed: jax.Array
    done: jax.Array
    failed: jax.Array
    low: jax.Array
    value_low: jax.Array
    slope_low: jax.Array
    high: jax.Array
    value_high: jax.Array
    slope_high: jax.Array
    cubic_ref: jax.Array
    value_cubic_ref: jax.Array
    safe_step: jax.Array
    safe_value: jax.Array
    safe_grad: Any


def _cubic_minimiser(a, fa, da, b, fb, c, fc):
    """The critical point of the cubic through ``(a, fa)`` with slope ``da`` there, ``(b, fb)`` and ``(c, fc)``
    (NaN when it has none)."""
    db, dc = b - a, c - a
    rb, rc = fb - fa - da * db, fc - fa - da * dc
    det = (db * dc) ** 2 * (db - dc)
    # The cubic's coefficients, p3·x³ + p2·x² + da·x + fa with x = t - a: the 2x2 system solved by its inverse.
    inverse = jnp.asarray([[dc**2, -(db**2)], [-(dc**3), db**3]])
    p3, p2 = jnp.dot(inverse, jnp.asarray([rb, rc]), precision=jax.lax.Precision.HIGHEST) / det
    return a + (-p2 + jnp.sqrt(p2 * p2 - 3 * p3 * da)) / (3 * p3)


def _quadratic_minimiser(a, fa, da, b, fb):
    """The critical point of the parabola through ``(a, fa)`` with slope ``da`` there and ``(b, fb)``."""
    db = b - a
    curvature = (fb - fa - da * db) / db**2
    return a - da / (2 * curvature)


def _select(pred, if_true, if_false):
    return jax.tree.map(lambda x, y: jnp.where(pred, x, y), if_true, if_false)


def _init_zoom(params):
    dtype = real_dtype(params)
    return ScaleByZoomLinesearchState(
        learning_rate=jnp.ones([], dtype), value=jnp.full([], jnp.inf, dtype), grad=_tree.accumulators(params, None),
        num_linesearch_steps=_tree.zero_count(), decrease_error=jnp.full([], jnp.inf, dtype),
        curvature_error=jnp.full([], jnp.inf, dtype))


def _apply_zoom(updates, state, params, *, max_linesearch_steps, max_learning_rate, tol, increase_factor, slope_rtol,
                curv_rtol, approx_dec_rtol, stepsize_precision, initial_guess_strategy, objective, verbose, **extra):
    call = "scale_by_zoom_linesearch"
    at, moves, value0, grad0 = _line(call, updates, params, objective, extra)
    dtype = value0.dtype
    grad0 = _like(grad0, state.grad)
    slope0 = slope_along(grad0, updates, dtype)
    # "keep" after a failed search (step 0) guesses 1 again: optax would try 0 forever.
    keep = jnp.where(state.learning_rate > 0, state.learning_rate, 1.0).astype(dtype)
    guess = keep if initial_guess_strategy == "keep" else jnp.ones([], dtype)

    def errors(step, value, slope):
        """Sufficient decrease (Armijo, or Hager and Zhang's approximate form near flat values) and curvature."""
        decrease = value - value0 - slope_rtol * step * slope0
        if approx_dec_rtol is not None:
            approximate = jnp.maximum(slope - (2 * slope_rtol - 1) * slope0,
                                      value - value0 - approx_dec_rtol * jnp.abs(value0))
            decrease = jnp.minimum(approximate, decrease)
        curvature = jnp.abs(slope) - curv_rtol * jnp.abs(slope0)
        # (in the loop's dtype: a schedule's float64 value under x64 would widen them)
        return _not_nan(jnp.maximum(decrease, 0)).astype(dtype), _not_nan(jnp.maximum(curvature, 0)).astype(dtype)

    def evaluate(s, step):
        value, grad, slope = at(step)
        decrease, curvature = errors(step, value, slope)
        return value, _like(grad, grad0), slope, decrease, curvature

    def bracket(s):  # Algorithm 3.5: grow the step until [low, high] holds an acceptable one
        step = jnp.where(s.count == 0, guess, increase_factor * s.step).astype(dtype)
        capped = jnp.asarray(False)
        if max_learning_rate is not None:
            capped = step >= max_learning_rate
            step = jnp.minimum(step, max_learning_rate).astype(dtype)
        value, grad, slope, decrease, curvature = evaluate(s, step)
        error = jnp.maximum(decrease, curvature)
        safe = _select(decrease <= tol, (step, value, grad), (s.safe_step, s.safe_value, s.safe_grad))
        high_is_new = (decrease > 0) | ((value >= s.value) & (s.count > 0))
        low_is_new = (slope >= 0) & ~high_is_new
        old, new = (s.step, s.value, s.slope), (step, value, slope)
        low, high = _select(low_is_new, (new, old), (old, new))
        bracketed = high_is_new | low_is_new | (error <= tol)
        done = (error <= tol) | (capped & ~bracketed)
        return s._replace(step=step, value=value, grad=grad, slope=slope, decrease_error=decrease,
                          curvature_error=curvature, bracketed=bracketed, done=done,
                          failed=(s.count + 1 >= max_linesearch_steps) & ~done, low=low[0], value_low=low[1],
                          slope_low=low[2], high=high[0], value_high=high[1], slope_high=high[2], cubic_ref=low[0],
                          value_cubic_ref=low[1], safe_step=safe[0], safe_value=safe[1], safe_grad=safe[2])

    def zoom(s):  # Algorithm 3.6: shrink [low, high] around a cubic, quadratic or bisection point
        width = jnp.abs(s.high - s.low)
        left, right = jnp.minimum(s.low, s.high), jnp.maximum(s.low, s.high)
        cubic = _cubic_minimiser(s.low, s.value_low, s.slope_low, s.high, s.value_high, s.cubic_ref,
                                 s.value_cubic_ref)
        quadratic = _quadratic_minimiser(s.low, s.value_low, s.slope_low, s.high, s.value_high)
        step = jnp.where((cubic > left + 0.2 * width) & (cubic < right - 0.2 * width), cubic,
                         jnp.where((quadratic > left + 0.1 * width) & (quadratic < right - 0.1 * width), quadratic,
                                   (s.low + s.high) / 2)).astype(dtype)
        value, grad, slope, decrease, curvature = evaluate(s, step)
        error = jnp.maximum(decrease, curvature)
        safe = _select((decrease <= tol) & (value < s.safe_value), (step, value, grad),
                       (s.safe_step, s.safe_value, s.safe_grad))
        done = error <= tol
        high_is_new = (decrease > 0) | (value >= s.value_low)
        high_is_low = (slope * (s.high - s.low) >= 0) & ~high_is_new
        new, low, high = (step, value, slope), (s.low, s.value_low, s.slope_low), (s.high, s.value_high, s.slope_high)
        new_high = _select(high_is_new, new, _select(high_is_low, low, high))
        new_low = _select(high_is_new, low, new)
        ref = _select(high_is_new | high_is_low, (s.high, s.value_high), (s.low, s.value_low))
        # The interval has collapsed when no step in it is left to try: it is narrower than the float resolution
        # at its ends, or its larger end is below the smallest normal number or moves no param (nor then does any
        # step in it). Searching on would evaluate the same points until max_linesearch_steps.
        right = jnp.maximum(new_low[0], new_high[0])
        info = jnp.finfo(dtype)
        collapsed = ((jnp.abs(new_high[0] - new_low[0]) <= info.eps * right) | (right <= info.tiny)
                     | ~moves(right))
        stuck = (s.count + 1 >= max_linesearch_steps) | ((width <= stepsize_precision) & (safe[0] > 0)) | collapsed
        return s._replace(step=step, value=value, grad=grad, slope=slope, decrease_error=decrease,
                          curvature_error=curvature, done=done, failed=stuck & ~done, low=new_low[0],
                          value_low=new_low[1], slope_low=new_low[2], high=new_high[0], value_high=new_high[1],
                          slope_high=new_high[2], cubic_ref=ref[0], value_cubic_ref=ref[1], safe_step=safe[0],
                          safe_value=safe[1], safe_grad=safe[2])

    def fall_back(s):  # out of steps: the best point with sufficient decrease, if any (or if the last was NaN)
        use_safe = (s.safe_step > 0) | jnp.isinf(s.decrease_error)
        step, value, grad = _select(use_safe, (s.safe_step, s.safe_value, s.safe_grad), (s.step, s.value, s.grad))
        return s._replace(step=step, value=value, grad=grad)

    def body(s):
        s = jax.lax.cond(s.bracketed, zoom, bracket, s)
        s = jax.lax.cond(s.failed, fall_back, lambda s: s, s)
        return s._replace(count=s.count + 1)

    zero, inf, false = jnp.zeros([], dtype), jnp.full([], jnp.inf, dtype), jnp.asarray(False)
    start = _Search(count=_tree.zero_count(), step=zero, value=value0, grad=grad0, slope=slope0,
                    decrease_error=inf, curvature_error=inf, bracketed=false, done=false, failed=false, low=zero,
                    value_low=value0, slope_low=slope0, high=zero, value_high=value0, slope_high=slope0,
                    cubic_ref=zero, value_cubic_ref=value0, safe_step=zero, safe_value=value0, safe_grad=grad0)
    s = jax.lax.while_loop(lambda s: ~(s.done | s.failed), body, start)
    if verbose:
        unmet = jnp.maximum(s.decrease_error, s.curvature_error) > tol
        said = ("scale_by_zoom_linesearch: no step meeting both conditions after {tries} evaluations of the "
                "objective: value at the params {value}, slope along the update {slope}, step taken {step}, decrease "
                "error {decrease}, curvature error {curvature}")
        capped = [] if max_learning_rate is None else [
            (unmet & ~s.bracketed & (s.step >= max_learning_rate),
             said + "\n  the step reached max_learning_rate ({cap}) with no interval meeting the curvature condition "
                    "below it: a larger max_learning_rate may find one")]
        _report([(unmet & (slope0 >= 0), said + "\n  the update is not a descent direction: its slope is not below 0"),
                 *capped,
                 (unmet & s.bracketed & (jnp.abs(s.high - s.low) <= stepsize_precision),
                  said + "\n  the searched interval is narrower than stepsize_precision ({precision})"),
                 (unmet, said)],
                tries=s.count, value=value0, slope=slope0, step=s.step, decrease=s.decrease_error,
                curvature=s.curvature_error, cap=max_learning_rate, precision=stepsize_precision)
    return _scaled(updates, s.step), ScaleByZoomLinesearchState(
        learning_rate=s.step, value=s.value, grad=s.grad, num_linesearch_steps=s.count,
        decrease_error=s.decrease_error, curvature_error=s.curvature_error)


@combinator
def scale_by_zoom_linesearch(max_linesearch_steps: int, max_learning_rate: float | None = None, tol: float = 0.0,
                             increase_factor: float = 2.0, slope_rtol: float = 1e-4, curv_rtol: float = 0.9,
                             approx_dec_rtol: float | None = 1e-6, stepsize_precision: float = 1e-5,
                             initial_guess_strategy: str = "keep", objective: Callable[..., Any] | None = None,
                             verbose: bool = False) -> Update:
    r"""Scales updates by a step size meeting the strong Wolfe conditions, found by bracketing and zooming.

    Rule (Nocedal & Wright, Algorithms 3.5 and 3.6): with $f$ the objective,
    $w$ the params, $u$ the incoming update (a descent direction),
    $\varphi(\eta) = f(w + \eta u)$, $c_1$ = ``slope_rtol``, $c_2$ = ``curv_rtol``
    and $\tau$ = ``tol``, find $\eta$ with

    $$
    \begin{align*}
    \varphi(\eta) &\le \varphi(0) + c_1 \eta\, \varphi'(0) + \tau && \text{(sufficient decrease)} \\
    \lvert \varphi'(\eta) \rvert &\le c_2 \lvert \varphi'(0) \rvert + \tau && \text{(curvature)}
    \end{align*}
    $$

    by growing $\eta$ by ``increase_factor`` from the first guess until an
    interval holds such a step, then shrinking the interval around the
    minimiser of a cubic or quadratic fit (or its midpoint); the output is
    $\eta u$. Near flat values, where $\varphi(\eta) \le \varphi(0) + \epsilon \lvert \varphi(0) \rvert + \tau$
    with $\epsilon$ = ``approx_dec_rtol``, Hager and Zhang's approximate test
    $\varphi'(\eta) \le (2 c_1 - 1)\, \varphi'(0) + \tau$ also counts as
    sufficient decrease. Out of steps, it takes the best
    step with sufficient decrease seen, else the last one tried (the state's
    ``decrease_error`` or ``curvature_error`` is then > 0). It stops so too
    once the interval has collapsed, with no step left to try: narrower than
    the float resolution at its ends, or its larger end below the smallest
    normal number or moving no param (then no step in it does); optax's
    search evaluates the same point until ``max_linesearch_steps``. The
    direction must descend ($\varphi'(0) < 0$): along one that does not, no step
    of a convex objective has sufficient decrease, and the search shrinks
    towards 0 and takes its last, tiny step uphill, as optax's does. Where it
    stops is decided by rounding, so that step may differ between one device
    and a mesh. ``update`` takes the objective's ``value``, ``grad`` and
    ``value_fn`` (see the module), or the stage is built with ``objective``;
    ``value`` and what the objective returns must be real scalars.

    Args:
        max_linesearch_steps: the most evaluations of the objective per call,
            an integer in [1, 1000]. No default.
        max_learning_rate: the largest step, > 0, or None for no bound.
            Default: ``None``.
        tol: slack of both criteria, >= 0. Default: ``0.0``.
        increase_factor: the factor the step grows by while bracketing, > 1.
            Default: ``2.0``.
        slope_rtol: $c_1$ of the sufficient decrease, in [0, 1). Default: ``0.0001``.
        curv_rtol: $c_2$ of the curvature condition, >= 0 ($c_1 < c_2 < 1$ in
            the book). Default: ``0.9``.
        approx_dec_rtol: the relative change of the value below which the
            approximate decrease test applies, >= 0, or None for Armijo's test
            alone. Default: ``1e-06``.
        stepsize_precision: an interval narrower than this, >= 0, ends the
            search at the best step with sufficient decrease. Default: ``1e-05``.
        initial_guess_strategy: the first step tried: ``"keep"`` the last step
            taken (for SGD-like directions; 1 after a step of 0, where optax's
            would stay at 0), ``"one"`` a step of 1 (for Newton-like
            directions such as L-BFGS's). Default: ``'keep'``.
        objective: the objective ``f(params)``, for ``update`` calls without
            ``value_fn``; None to take it from ``update``. Default: ``None``.
        verbose: print, with ``jax.debug.print``, the value and slope at
            the params, the step taken and both errors when a search ends
            without a step meeting both conditions, and the reason where it
            is one of three (not a descent direction; ``max_learning_rate``
            reached before an interval met the curvature condition; the
            interval narrower than ``stepsize_precision``). optax's option;
            a search that succeeds prints nothing. Default: ``False``.

    Returns:
        An update object with state ``ScaleByZoomLinesearchState(learning_rate,
        value, grad, num_linesearch_steps, decrease_error, curvature_error)``;
        it needs params.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import updax as ux
        >>> def f(w):
        ...     return jnp.sum((w - 1.0) ** 2)
        >>> opt = ux.scale(-1.0).scale_by_zoom_linesearch(max_linesearch_steps=15)
        >>> w = jnp.zeros(3)
        >>> value, grad = jax.value_and_grad(f)(w)
        >>> u, state = opt.update(grad, opt.init(w), w, value=value, grad=grad, value_fn=f)
        >>> w + u, opt.get_state(state, "scale_by_zoom_linesearch.learning_rate")
        (Array([1., 1., 1.], dtype=float32), Array(0.5, dtype=float32))

    References:
        Nocedal & Wright, "Numerical Optimization", 2nd ed., 2006, Algorithms
        3.5 and 3.6; Hager & Zhang, "Algorithm 851: CG_DESCENT", ACM TOMS 32,
        2006 (the approximate decrease test); optax's ``scale_by_zoom_linesearch``.
    """
    options = dict(max_linesearch_steps=max_linesearch_steps, max_learning_rate=max_learning_rate, tol=tol,
                   increase_factor=increase_factor, slope_rtol=slope_rtol, curv_rtol=curv_rtol,
                   approx_dec_rtol=approx_dec_rtol, stepsize_precision=stepsize_precision,
                   initial_guess_strategy=initial_guess_strategy, objective=objective, verbose=verbose)
    return stateful(_init_zoom, _apply_zoom, name="scale_by_zoom_linesearch", options=options, domains=_ZOOM_DOMAINS,
                    needs_params=True, static=("max_linesearch_steps",),
                    schedulable=("max_learning_rate", "tol", "increase_factor", "slope_rtol", "curv_rtol",
                                 "approx_dec_rtol", "stepsize_precision"))


# --------------------------------------------------------------------------
# Reusing the line search's evaluations


_STATES = (ScaleByZoomLinesearchState, ScaleByBacktrackingLinesearchState)


def _found(state):
    """The line-search states in a pipeline's state (inside wrappers and scheduled states too)."""
    if isinstance(state, _STATES):
        return [state]
    if isinstance(state, ScheduledState):
        return _found(state.state)
    if isinstance(state, (tuple, list)):
        return [found for child in state for found in _found(child)]
    if isinstance(state, dict):
        return [found for child in state.values() for found in _found(child)]
    return []


def value_and_grad_from_state(value_fn: Callable[..., Any]) -> Callable[..., tuple[Any, Any]]:
    """``jax.value_and_grad(value_fn)`` that reuses the value and gradient a line search stored in the state.

    A line search evaluates the objective where its step lands; when the
    params are then updated with that step, the next call's value and
    gradient are those. The returned function ``f(params, *args, state,
    **kwargs)`` takes them from the one line-search stage in ``state`` while
    they are finite (after ``init`` the stored value is infinite), else
    computes ``jax.value_and_grad(value_fn)(params, *args, **kwargs)``. Use it
    for a fixed (full-batch) objective only: the stored values are those of
    the objective the line search saw.

    Args:
        value_fn: the objective, a scalar function of the params. No default.

    Returns:
        ``f(params, *args, state, **kwargs) -> (value, grad)``, the gradient in
        the params' dtypes.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> def f(w):
        ...     return jnp.sum(w ** 2)
        >>> opt = ux.optimizers.lbfgs()
        >>> w = jnp.array([1.0, 2.0, 3.0])
        >>> state = opt.init(w)
        >>> value_and_grad = ux.value_and_grad_from_state(f)
        >>> for _ in range(2):
        ...     value, grad = value_and_grad(w, state=state)
        ...     u, state = opt.update(grad, state, w, value=value, grad=grad, value_fn=f)
        ...     w = ux.apply_updates(w, u)
        >>> float(f(w)) < 1e-10
        True

    References:
        optax's ``value_and_grad_from_state``.
    """
    Function().check("value_and_grad_from_state", "value_fn", value_fn)

    def value_and_grad(params, *args, state, **kwargs):
        found = [s for s in _found(state) if s.grad is not None]
        if len(found) != 1:
            raise ValueError(f"value_and_grad_from_state: the state holds {len(found)} line-search states with a "
                             "stored gradient; it needs exactly one (scale_by_backtracking_linesearch keeps its "
                             "gradient only with store_grad=True)")
        stored = found[0]

        def fresh(params):
            return jax.value_and_grad(value_fn)(params, *args, **kwargs)

        value, grad = jax.eval_shape(fresh, params)
        reuse = (stored.value.astype(value.dtype), _like(stored.grad, grad))
        return jax.lax.cond(jnp.isfinite(stored.value), lambda p: reuse, fresh, params)

    return value_and_grad
