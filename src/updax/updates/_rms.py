"""The second-moment family: updates scaled by a running average or sum of their squares.

RMSProp (plain and centred), AdaGrad and AdaDelta.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import NON_NEGATIVE, POSITIVE, UNIT, Count, Flag, FloatDtype, MomentField, SecondMomentField
from updax._primitives import stateful
from updax._typing import DType, ScalarOrSchedule
from updax._update import Update
from updax._leafwise import per_leaf
from updax.updates._kernels import abs_sq, bias_corrections, safe_sqrt

# --------------------------------------------------------------------------
# States


class ScaleByRmsState(NamedTuple):
    """EMA of squared updates ``nu``."""

    nu: SecondMomentField


class ScaleByRmsWithCountState(NamedTuple):
    """EMA of squared updates ``nu`` and steps taken ``count`` (for the bias correction)."""

    nu: SecondMomentField
    count: Count


class ScaleByRssState(NamedTuple):
    """Running sum of squared updates."""

    sum_of_squares: SecondMomentField


class ScaleByStddevState(NamedTuple):
    """EMAs of the updates ``mu`` and of their squares ``nu``."""

    mu: MomentField
    nu: SecondMomentField


class ScaleByStddevWithCountState(NamedTuple):
    """EMAs of the updates ``mu`` and of their squares ``nu``, and steps taken ``count`` (for the bias correction)."""

    mu: MomentField
    nu: SecondMomentField
    count: Count


class ScaleByAdadeltaState(NamedTuple):
    """EMAs of the squared incoming updates and of the squared outgoing steps."""

    avg_sq_grad: SecondMomentField
    avg_sq_step: SecondMomentField


#: What the options of the second-moment stages hold.
_RMS_DOMAINS = dict(decay=UNIT, rho=UNIT, eps=NON_NEGATIVE, initial_scale=NON_NEGATIVE,
                    initial_accumulator_value=NON_NEGATIVE, mu_dtype=FloatDtype(), nu_dtype=FloatDtype(),
                    accumulator_dtype=FloatDtype(), eps_in_sqrt=Flag(late=True, default=True),
                    bias_correction=Flag(late=True))


def _rms_like(init_fn, apply_fn, name, options, schedulable, own=None):
    """A second-moment stage: elementwise, its options' domains from :data:`_RMS_DOMAINS`, or ``own`` for an
    option whose rule is the stage's own."""
    domains = {**_RMS_DOMAINS, **(own or {})}
    return stateful(init_fn, apply_fn, elementwise=True, name=name, options=options,
                    domains={k: domains[k] for k in options}, schedulable=schedulable)


# --------------------------------------------------------------------------
# RMSProp


def _init_scale_by_rms(params, *, initial_scale, nu_dtype, bias_correction=None):
    nu = _tree.accumulators(params, nu_dtype, initial_scale)
    return ScaleByRmsWithCountState(nu=nu, count=_tree.zero_count()) if bias_correction else ScaleByRmsState(nu=nu)


def _correction(state, decay, bias_correction):
    """The new step count and ``1-decay^t`` with ``bias_correction``; ``(None, None)`` without."""
    if not bias_correction:
        return None, None
    count = _tree.safe_increment(state.count)
    return count, bias_corrections(count, decay)[0]


def _over_root(g, r, eps, eps_in_sqrt):
    """RMSProp's division: ``g / sqrt(r + eps)``, or with ``eps_in_sqrt=False`` ``g / (sqrt(r) + eps)`` (the
    root through ``safe_sqrt``, as Adam's)."""
    if eps_in_sqrt is False:
        return g / (safe_sqrt(r) + eps)
    return g * jax.lax.rsqrt(r + eps)


def _apply_scale_by_rms(updates, state, params, *, decay, eps, eps_in_sqrt=None, bias_correction=None):
    count, c = _correction(state, decay, bias_correction)

    def rule(g, v):
        v = decay * v + (1 - decay) * abs_sq(g)
        v_hat = v / c if bias_correction else v
        return _over_root(g, v_hat, eps, eps_in_sqrt), v

    u, nu = per_leaf("scale_by_rms", rule, (updates, state.nu), ("updates", "state.nu"))
    return u, (ScaleByRmsWithCountState(nu=nu, count=count) if bias_correction else ScaleByRmsState(nu=nu))


@combinator
def scale_by_rms(decay: ScalarOrSchedule = 0.9, eps: ScalarOrSchedule = 1e-8, initial_scale: ScalarOrSchedule = 0.0,
                 *, nu_dtype: DType = None, eps_in_sqrt: bool = True, bias_correction: bool = False) -> Update:
    r"""Scales updates by the root of an EMA of their squares (RMSProp).

    Update rule, for an update $g$, with $b$ = ``decay``, $\epsilon$ = ``eps``:

    $$
    \begin{align*}
    v &\gets b v + (1 - b)\, g^2 \\
    u &= \frac{g}{\sqrt{v + \epsilon}}
    \end{align*}
    $$

    With ``eps_in_sqrt=False``, $u = g / (\sqrt{v} + \epsilon)$; with
    ``bias_correction=True``, $\hat v = v / (1 - b^t)$ ($t$ counts from 1) takes
    $v$'s place in $u$. Both options are optax's; Axon's RMSProp has
    neither. Adam without momentum (``b1=0``) is
    ``scale_by_rms(b2, eps, eps_in_sqrt=False, bias_correction=True)``,
    without Adam's first-moment state.

    Args:
        decay: EMA decay, in [0, 1). Default: ``0.9``.
        eps: added inside the square root, >= 0 (above 0 it keeps the first
            steps finite). Default: ``1e-8``.
        initial_scale: initial value of $v$, >= 0. Default: ``0.0``.
        nu_dtype: storage dtype of ``nu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        eps_in_sqrt: add ``eps`` inside the square root (Axon's and optax's
            default) rather than to it; prints only when False. Default: ``True``.
        bias_correction: divide $v$ by $1 - b^t$, as Adam does; the state
            then counts the steps. The correction assumes $v$ starts at 0, so
            an ``initial_scale`` above 0 weighs more on the first steps than it
            would uncorrected (as in optax). Prints only when True.
            Default: ``False``.

    Returns:
        An update object with state ``ScaleByRmsState(nu)``, or with
        ``bias_correction=True`` ``ScaleByRmsWithCountState(nu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_rms(decay=0.75, eps=0.0)
        >>> u, _ = opt.update({"w": jnp.array([2.0])}, opt.init({"w": jnp.zeros(1)}))
        >>> u["w"]  # 2 / sqrt(0.25·4)
        Array([2.], dtype=float32)
        >>> opt = ux.scale_by_rms(decay=0.75, eps=0.0, bias_correction=True)
        >>> opt
        scale_by_rms(decay=0.75, eps=0.0, initial_scale=0.0, bias_correction=True)
        >>> u, _ = opt.update({"w": jnp.array([2.0])}, opt.init({"w": jnp.zeros(1)}))
        >>> u["w"]  # 2 / sqrt(0.25·4 / (1-0.75))
        Array([1.], dtype=float32)

    References:
        Tieleman & Hinton, "Lecture 6.5 - RMSProp", COURSERA: Neural Networks
        for Machine Learning, 2012.
    """
    return _rms_like(_init_scale_by_rms, _apply_scale_by_rms, "scale_by_rms",
                     dict(decay=decay, eps=eps, initial_scale=initial_scale, nu_dtype=nu_dtype,
                          eps_in_sqrt=eps_in_sqrt, bias_correction=bias_correction),
                     schedulable=("decay", "eps", "initial_scale"))


# --------------------------------------------------------------------------
# Centred RMSProp


def _init_scale_by_stddev(params, *, initial_scale, mu_dtype, nu_dtype, bias_correction=None):
    mu, nu = _tree.accumulators(params, mu_dtype), _tree.accumulators(params, nu_dtype, initial_scale)
    if bias_correction:
        return ScaleByStddevWithCountState(mu=mu, nu=nu, count=_tree.zero_count())
    return ScaleByStddevState(mu=mu, nu=nu)


def _apply_scale_by_stddev(updates, state, params, *, decay, eps, eps_in_sqrt=None, bias_correction=None):
    count, c = _correction(state, decay, bias_correction)

    def rule(g, m, v):
        m = decay * m + (1 - decay) * g
        v = decay * v + (1 - decay) * abs_sq(g)
        m_hat, v_hat = (m / c, v / c) if bias_correction else (m, v)
        var = v_hat - abs_sq(m_hat)
        var = var.real if jnp.iscomplexobj(var) else var
        # Clamped at 0: where the variance vanishes (decay 0 or tiny), rounding (an FMA under jit) can take
        # v - m² below 0, and the root would be NaN.
        return _over_root(g, jnp.maximum(var, 0.0), eps, eps_in_sqrt), m, v

    u, mu, nu = per_leaf("scale_by_stddev", rule, (updates, state.mu, state.nu), ("updates", "state.mu", "state.nu"))
    if bias_correction:
        return u, ScaleByStddevWithCountState(mu=mu, nu=nu, count=count)
    return u, ScaleByStddevState(mu=mu, nu=nu)


@combinator
def scale_by_stddev(decay: ScalarOrSchedule = 0.9, eps: ScalarOrSchedule = 1e-8,
                    initial_scale: ScalarOrSchedule = 0.0, *, mu_dtype: DType = None,
                    nu_dtype: DType = None, eps_in_sqrt: bool = True, bias_correction: bool = False) -> Update:
    r"""Scales updates by the root of the centred EMA of their squares (centred RMSProp).

    Update rule, for an update $g$, with $b$ = ``decay``, $\epsilon$ = ``eps``:

    $$
    \begin{align*}
    m &\gets b m + (1 - b)\, g \\
    v &\gets b v + (1 - b)\, g^2 \\
    u &= \frac{g}{\sqrt{\max(v - m^2, 0) + \epsilon}}
    \end{align*}
    $$

    With ``eps_in_sqrt=False``, $u = g / (\sqrt{\max(v - m^2, 0)} + \epsilon)$; with
    ``bias_correction=True``, $\hat m = m / (1 - b^t)$ and $\hat v = v / (1 - b^t)$
    ($t$ counts from 1) take $m$'s and $v$'s places in $u$. Both options
    are optax's; Axon's centred RMSProp has neither. $v - m^2$ is clamped at
    0 before the root: rounding can take it just below 0 where the variance
    vanishes.

    Args:
        decay: EMA decay, in [0, 1). Default: ``0.9``.
        eps: added inside the square root, >= 0. Default: ``1e-8``.
        initial_scale: initial value of $v$, >= 0. Default: ``0.0``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        nu_dtype: storage dtype of ``nu``. Default: ``None``.
        eps_in_sqrt: add ``eps`` inside the square root (Axon's and optax's
            default) rather than to it; prints only when False. Default: ``True``.
        bias_correction: divide $m$ and $v$ by $1 - b^t$, as Adam does;
            the state then counts the steps. From ``initial_scale=0`` the
            first step's variance is 0 ($\hat m = g$, $\hat v = g^2$), so the first
            update is $g / \sqrt{\epsilon}$, or $g / \epsilon$ outside the root, as
            in optax: start $v$ above 0 or keep ``eps`` large enough. Prints
            only when True. Default: ``False``.

    Returns:
        An update object with state ``ScaleByStddevState(mu, nu)``, or with
        ``bias_correction=True`` ``ScaleByStddevWithCountState(mu, nu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_stddev(decay=0.5, eps=0.0)
        >>> u, _ = opt.update({"w": jnp.array([2.0])}, opt.init({"w": jnp.zeros(1)}))
        >>> u["w"]  # m = 1, v = 2: 2 / sqrt(2 - 1)
        Array([2.], dtype=float32)
        >>> opt = ux.scale_by_stddev(decay=0.5, eps=0.0, initial_scale=1.0, bias_correction=True)
        >>> u, _ = opt.update({"w": jnp.array([2.0])}, opt.init({"w": jnp.zeros(1)}))
        >>> u["w"]  # m̂ = 1/0.5 = 2, v̂ = (0.5 + 2)/0.5 = 5: 2 / sqrt(5 - 4)
        Array([2.], dtype=float32)

    References:
        Graves, "Generating Sequences With Recurrent Neural Networks", 2013,
        eq. 38-45. https://arxiv.org/abs/1308.0850
    """
    return _rms_like(_init_scale_by_stddev, _apply_scale_by_stddev, "scale_by_stddev",
                     dict(decay=decay, eps=eps, initial_scale=initial_scale, mu_dtype=mu_dtype, nu_dtype=nu_dtype,
                          eps_in_sqrt=eps_in_sqrt, bias_correction=bias_correction),
                     schedulable=("decay", "eps", "initial_scale"))


# --------------------------------------------------------------------------
# AdaGrad


def _init_scale_by_rss(params, *, initial_accumulator_value, accumulator_dtype):
    return ScaleByRssState(sum_of_squares=_tree.accumulators(params, accumulator_dtype, initial_accumulator_value))


def _apply_scale_by_rss(updates, state, params, *, eps):
    def rule(g, s):
        s = s + abs_sq(g)
        return g * jnp.where(s > 0, jax.lax.rsqrt(s + eps), 0.0), s

    u, sos = per_leaf("scale_by_rss", rule, (updates, state.sum_of_squares), ("updates", "state.sum_of_squares"))
    return u, ScaleByRssState(sum_of_squares=sos)


@combinator
def scale_by_rss(initial_accumulator_value: ScalarOrSchedule = 0.1, eps: ScalarOrSchedule = 1e-7, *,
                 accumulator_dtype: DType = None) -> Update:
    r"""Scales updates by the root of the sum of all their squares so far (AdaGrad).

    Update rule, for an update $g$, with $\epsilon$ = ``eps``:

    $$
    \begin{align*}
    s &\gets s + g^2 \\
    u &= \frac{g}{\sqrt{s + \epsilon}}
    \end{align*}
    $$

    and $u = 0$ where $s = 0$.

    Args:
        initial_accumulator_value: initial value of $s$, >= 0. Default: ``0.1``.
        eps: added inside the square root, >= 0. Default: ``1e-7``.
        accumulator_dtype: storage dtype of $s$; None keeps the params' dtype
            but at least float32. Default: ``None``.

    Returns:
        An update object with state ``ScaleByRssState(sum_of_squares)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_rss(initial_accumulator_value=0.0, eps=0.0)
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> _, state = opt.update({"w": jnp.array([3.0])}, state)
        >>> opt.update({"w": jnp.array([4.0])}, state)[0]["w"]  # 4 / sqrt(9 + 16)
        Array([0.8], dtype=float32)

    References:
        Duchi et al., "Adaptive Subgradient Methods for Online Learning and
        Stochastic Optimization", JMLR 2011.
    """
    return _rms_like(_init_scale_by_rss, _apply_scale_by_rss, "scale_by_rss",
                     dict(initial_accumulator_value=initial_accumulator_value, eps=eps,
                          accumulator_dtype=accumulator_dtype),
                     schedulable=("initial_accumulator_value", "eps"))


# --------------------------------------------------------------------------
# AdaDelta


def _init_scale_by_adadelta(params, *, accumulator_dtype):
    return ScaleByAdadeltaState(avg_sq_grad=_tree.accumulators(params, accumulator_dtype),
                                avg_sq_step=_tree.accumulators(params, accumulator_dtype))


def _apply_scale_by_adadelta(updates, state, params, *, rho, eps):
    def rule(g, eg, ex):
        eg = rho * eg + (1 - rho) * abs_sq(g)
        u = jnp.sqrt(ex + eps) / jnp.sqrt(eg + eps) * g
        ex = rho * ex + (1 - rho) * abs_sq(u)
        return u, eg, ex

    u, eg, ex = per_leaf("scale_by_adadelta", rule, (updates, state.avg_sq_grad, state.avg_sq_step),
                         ("updates", "state.avg_sq_grad", "state.avg_sq_step"))
    return u, ScaleByAdadeltaState(avg_sq_grad=eg, avg_sq_step=ex)


@combinator
def scale_by_adadelta(rho: ScalarOrSchedule = 0.9, eps: ScalarOrSchedule = 1e-6, *,
                      accumulator_dtype: DType = None) -> Update:
    r"""Scales updates by AdaDelta: the RMS of past steps over the RMS of updates.

    Update rule ($u$ is a direction: follow it with a negative scale), for an update $g$, with $\rho$ = ``rho``,
    $\epsilon$ = ``eps``:

    $$
    \begin{align*}
    \mathbb{E}[g^2] &\gets \rho\, \mathbb{E}[g^2] + (1 - \rho)\, g^2 \\
    u &= \frac{\sqrt{\mathbb{E}[\Delta^2] + \epsilon}}{\sqrt{\mathbb{E}[g^2] + \epsilon}}\, g \\
    \mathbb{E}[\Delta^2] &\gets \rho\, \mathbb{E}[\Delta^2] + (1 - \rho)\, u^2
    \end{align*}
    $$

    Args:
        rho: decay of both averages, in [0, 1) (optax's and PyTorch's default;
            the paper's experiments use 0.95). Default: ``0.9``.
        eps: added inside both square roots, > 0 (with 0 no step is ever
            taken); the paper's value. Default: ``1e-6``.
        accumulator_dtype: storage dtype of both averages; None keeps the
            params' dtype but at least float32. Default: ``None``.

    Returns:
        An update object with state ``ScaleByAdadeltaState(avg_sq_grad, avg_sq_step)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_adadelta(rho=0.5, eps=1.0)
        >>> u, _ = opt.update({"w": jnp.array([2.0])}, opt.init({"w": jnp.zeros(1)}))
        >>> u["w"]  # sqrt(0 + 1) / sqrt(0.5·4 + 1) · 2
        Array([1.1547], dtype=float32)

    References:
        Zeiler, "ADADELTA: An Adaptive Learning Rate Method", 2012,
        Algorithm 1. https://arxiv.org/abs/1212.5701
    """
    # (AdaDelta's eps is > 0, where the others' is >= 0: with 0 no step is ever taken)
    return _rms_like(_init_scale_by_adadelta, _apply_scale_by_adadelta, "scale_by_adadelta",
                     dict(rho=rho, eps=eps, accumulator_dtype=accumulator_dtype), schedulable=("rho", "eps"),
                     own=dict(eps=POSITIVE))
