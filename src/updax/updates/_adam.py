"""The Adam family: first and second moments of the updates, bias-corrected.

Adam and its variants from the papers: AdaBelief, RAdam, Yogi, AMSGrad,
AdaMax, NAdam and Adan. Defaults are Axon's where Axon has the entry, else
the paper's or optax's (each docstring says which).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import ANY_REAL, NON_NEGATIVE, UNIT, Count, Flag, FloatDtype, MomentField, Real, SecondMomentField
from updax._primitives import stateful
from updax._typing import DType, ScalarOrSchedule
from updax._update import Update
from updax._leafwise import per_leaf
from updax.updates._kernels import abs_sq, bias_corrections, safe_sqrt

# --------------------------------------------------------------------------
# States


class ScaleByAdamState(NamedTuple):
    """First moment ``mu``, second moment ``nu``, steps taken ``count`` (Adam's, RAdam's and NAdam's: the
    same numbers)."""

    mu: MomentField
    nu: SecondMomentField
    count: Count


class ScaleByBeliefState(NamedTuple):
    """First moment ``mu``, the belief ``nu`` (an EMA of ``(g - m)²``), steps taken ``count``."""

    mu: MomentField
    nu: SecondMomentField
    count: Count


class ScaleByYogiState(NamedTuple):
    """First moment ``mu``, Yogi's second moment ``nu``, steps taken ``count``."""

    mu: MomentField
    nu: SecondMomentField
    count: Count


class ScaleByAdamaxState(NamedTuple):
    """First moment ``mu``, the infinity norm ``nu``, steps taken ``count``."""

    mu: MomentField
    nu: SecondMomentField
    count: Count


class ScaleByAmsgradState(NamedTuple):
    """First moment ``mu``, second moment ``nu``, running maximum of the
    bias-corrected ``nu`` (``nu_max``), steps taken ``count``."""

    mu: MomentField
    nu: SecondMomentField
    nu_max: SecondMomentField
    count: Count


class ScaleByAdanState(NamedTuple):
    """EMAs of the updates ``mu``, of their differences ``mu_diff`` and of the
    squared look-ahead ``nu``; the previous updates ``prev_grads``; steps taken ``count``."""

    mu: MomentField
    mu_diff: MomentField
    nu: SecondMomentField
    prev_grads: Any
    count: Count


# --------------------------------------------------------------------------
# Shared by the family


def _adam_like_init(params, *, mu_dtype, nu_dtype, mu_fill=0.0, nu_fill=0.0, state=ScaleByAdamState):
    return state(
        mu=_tree.accumulators(params, mu_dtype, mu_fill),
        nu=_tree.accumulators(params, nu_dtype, nu_fill),
        count=_tree.zero_count(),
    )


def _init_scale_by_belief(params, *, mu_dtype, nu_dtype):
    return _adam_like_init(params, mu_dtype=mu_dtype, nu_dtype=nu_dtype, state=ScaleByBeliefState)


def _init_scale_by_adamax(params, *, mu_dtype, nu_dtype):
    return _adam_like_init(params, mu_dtype=mu_dtype, nu_dtype=nu_dtype, state=ScaleByAdamaxState)


#: What the options of the Adam-like stages hold.
_ADAM_DOMAINS = dict(b1=UNIT, b2=UNIT, b3=UNIT, eps=NON_NEGATIVE, eps_root=NON_NEGATIVE, threshold=ANY_REAL,
                     initial_accumulator_value=NON_NEGATIVE, mu_dtype=FloatDtype(complex=True), nu_dtype=FloatDtype(),
                     nesterov=Flag(late=True))


def _adam_like(init_fn, apply_fn, name, options, state_last=()):
    """An Adam-like stage: elementwise, its options' domains from :data:`_ADAM_DOMAINS`, every real option
    schedulable."""
    schedulable = [k for k in options if isinstance(_ADAM_DOMAINS[k], Real)]
    return stateful(init_fn, apply_fn, elementwise=True, name=name, options=options,
                    domains={k: _ADAM_DOMAINS[k] for k in options}, schedulable=schedulable, state_last=state_last)


def _adam_like_update(call, rule, updates, state, count):
    """Runs ``rule(g, mu, nu) -> (u, mu, nu)`` leaf by leaf (:func:`updax._leafwise.per_leaf`): the shared body
    of the Adam-like kernels."""
    u, mu, nu = per_leaf(call, rule, (updates, state.mu, state.nu), ("updates", "state.mu", "state.nu"))
    return u, state._replace(mu=mu, nu=nu, count=count)


def adam_direction(m_hat, v, c2, eps, eps_root):
    """Adam's step from the first moment estimate and the new second moment: ``m̂ / (sqrt(v/(1-b2^t) + eps_root) +
    eps)`` (LAMB's fused path recomputes it: one formula for both)."""
    return m_hat / (safe_sqrt(v / c2 + eps_root) + eps)


def _first_moment_estimate(count, b1, c1, nesterov):
    """``m ↦ m̂`` and whether it needs the gradient: ``m/(1-b1^t)``, or with Nesterov's look-ahead (Dozat 2016, as
    optax's ``nesterov=True``) ``b1·m/(1-b1^(t+1)) + (1-b1)·g/(1-b1^t)``."""
    if not nesterov:
        return lambda m, g: m / c1
    (c1_next,) = bias_corrections(_tree.safe_increment(count), b1)
    return lambda m, g: b1 * m / c1_next + (1 - b1) * g / c1


# --------------------------------------------------------------------------
# Adam


def _apply_scale_by_adam(updates, state, params, *, b1, b2, eps, eps_root, nesterov=None):
    return _adam_step("scale_by_adam", updates, state, b1, b2, eps, eps_root, nesterov)


def _adam_step(call, updates, state, b1, b2, eps, eps_root, nesterov):
    count = _tree.safe_increment(state.count)
    c1, c2 = bias_corrections(count, b1, b2)
    m_hat = _first_moment_estimate(count, b1, c1, nesterov)

    def rule(g, m, v):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * abs_sq(g)
        u = adam_direction(m_hat(m, g), v, c2, eps, eps_root)
        return u, m, v

    return _adam_like_update(call, rule, updates, state, count)


@combinator
def scale_by_adam(b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999, eps: ScalarOrSchedule = 1e-8,
                  eps_root: ScalarOrSchedule = 1e-15, *, mu_dtype: DType = None, nu_dtype: DType = None,
                  nesterov: bool = False) -> Update:
    r"""Scales updates by Adam's bias-corrected moment ratio.

    Update rule, for an update $g$ at step $t$ (counting from 1), with $b_1$ = ``b1``, $b_2$ = ``b2``,
    $\epsilon$ = ``eps``, $\epsilon_\text{root}$ = ``eps_root``:

    $$
    \begin{align*}
    m &\gets b_1 m + (1 - b_1)\, g \\
    v &\gets b_2 v + (1 - b_2)\, g^2 \\
    u &= \frac{m / (1 - b_1^t)}{\sqrt{v / (1 - b_2^t) + \epsilon_\text{root}} + \epsilon}
    \end{align*}
    $$

    Args:
        b1: decay of the first moment, in [0, 1). Default: ``0.9``.
        b2: decay of the second moment, in [0, 1). Default: ``0.999``.
        eps: added to the denominator, >= 0. Default: ``1e-8``.
        eps_root: added inside the square root, >= 0 (Axon's default; optax's
            is 0). Default: ``1e-15``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        nu_dtype: storage dtype of ``nu``, as ``mu_dtype``. Default: ``None``.
        nesterov: use Nesterov's look-ahead first moment,
            $\hat m = b_1 m / (1 - b_1^{t+1}) + (1 - b_1)\, g / (1 - b_1^t)$
            (NAdam's, as optax's ``nesterov=True``); it prints only when True.
            Default: ``False``.

    Returns:
        An update object with state ``ScaleByAdamState(mu, nu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_adam()
        >>> opt
        scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=1e-15)
        >>> u, state = opt.update({"w": jnp.array([0.3, -2.0])}, opt.init({"w": jnp.zeros(2)}))
        >>> u["w"]  # the first step is sign(g), up to eps
        Array([ 1., -1.], dtype=float32)

    References:
        Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015.
        https://arxiv.org/abs/1412.6980
    """
    return _adam_like(_adam_like_init, _apply_scale_by_adam, "scale_by_adam",
                      dict(b1=b1, b2=b2, eps=eps, eps_root=eps_root, nesterov=nesterov, mu_dtype=mu_dtype,
                           nu_dtype=nu_dtype))


# --------------------------------------------------------------------------
# AdaBelief


def _apply_scale_by_belief(updates, state, params, *, b1, b2, eps, eps_root, nesterov=None):
    count = _tree.safe_increment(state.count)
    c1, c2 = bias_corrections(count, b1, b2)
    m_hat = _first_moment_estimate(count, b1, c1, nesterov)

    def rule(g, m, s):
        m = b1 * m + (1 - b1) * g
        s = b2 * s + (1 - b2) * abs_sq(g - m) + eps_root
        u = m_hat(m, g) / (safe_sqrt(s / c2) + eps)
        return u, m, s

    return _adam_like_update("scale_by_belief", rule, updates, state, count)


@combinator
def scale_by_belief(b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999, eps: ScalarOrSchedule = 0.0,
                    eps_root: ScalarOrSchedule = 1e-16, *, mu_dtype: DType = None, nu_dtype: DType = None,
                    nesterov: bool = False) -> Update:
    r"""Scales updates by AdaBelief's ratio: the first moment over the spread of the belief.

    Update rule, as in the paper (Polaris instead uses Adam's $g^2$ for $s$), for an update $g$ at step $t$
    (counting from 1), with $b_1$ = ``b1``, $b_2$ = ``b2``, $\epsilon$ = ``eps``, $\epsilon_\text{root}$ =
    ``eps_root``:

    $$
    \begin{align*}
    m &\gets b_1 m + (1 - b_1)\, g \\
    s &\gets b_2 s + (1 - b_2)\, (g - m)^2 + \epsilon_\text{root} \\
    u &= \frac{\hat m}{\sqrt{\hat s} + \epsilon}, \quad \hat m = \frac{m}{1 - b_1^t}, \quad \hat s = \frac{s}{1 - b_2^t}
    \end{align*}
    $$

    Args:
        b1: decay of the first moment, in [0, 1). Default: ``0.9``.
        b2: decay of the belief term, in [0, 1). Default: ``0.999``.
        eps: added to the denominator, >= 0. Default: ``0.0``.
        eps_root: added to $s$ at every step, >= 0. Default: ``1e-16``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        nu_dtype: storage dtype of ``nu`` (the belief $s$). Default: ``None``.
        nesterov: use Nesterov's look-ahead first moment,
            $\hat m = b_1 m / (1 - b_1^{t+1}) + (1 - b_1)\, g / (1 - b_1^t)$
            (NAdam's, as optax's ``nesterov=True``); it prints only when True.
            Default: ``False``.

    Returns:
        An update object with state ``ScaleByBeliefState(mu, nu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_belief()
        >>> u, _ = opt.update({"w": jnp.array([0.5])}, opt.init({"w": jnp.zeros(1)}))
        >>> u["w"]  # m̂ = 0.5, ŝ = (0.5 - 0.05)²: 0.5/0.45 up to float32 rounding
        Array([1.1111], dtype=float32)

    References:
        Zhuang et al., "AdaBelief Optimizer: Adapting Stepsizes by the Belief
        in Observed Gradients", NeurIPS 2020. https://arxiv.org/abs/2010.07468
    """
    # XLA recomputes the new s from the old one in the params' kernel: s (nu) is written after it (``state_last``).
    return _adam_like(_init_scale_by_belief, _apply_scale_by_belief, "scale_by_belief",
                      dict(b1=b1, b2=b2, eps=eps, eps_root=eps_root, nesterov=nesterov, mu_dtype=mu_dtype,
                           nu_dtype=nu_dtype), state_last=("nu",))


# --------------------------------------------------------------------------
# RAdam


def _apply_scale_by_radam(updates, state, params, *, b1, b2, eps, eps_root, threshold, nesterov=None):
    count = _tree.safe_increment(state.count)
    c1, c2 = bias_corrections(count, b1, b2)
    t = _tree.float_count(count)
    rho_inf = 2.0 / (1.0 - b2) - 1.0
    rho = rho_inf - 2.0 * t * (1.0 - c2) / c2
    # The rectifier is defined for rho > 4 only; a threshold below 4 must not
    # take the square root of a negative number.
    rectified = (rho >= threshold) & (rho > 4.0)
    ratio = (rho - 4.0) * (rho - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho)
    r = jnp.sqrt(jnp.where(rectified, ratio, 1.0))
    estimate = _first_moment_estimate(count, b1, c1, nesterov)

    def rule(g, m, v):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * abs_sq(g)
        m_hat = estimate(m, g)
        u = jnp.where(rectified, adam_direction(r * m_hat, v, c2, eps, eps_root), m_hat)
        return u, m, v

    return _adam_like_update("scale_by_radam", rule, updates, state, count)


@combinator
def scale_by_radam(b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999, eps: ScalarOrSchedule = 1e-8,
                   eps_root: ScalarOrSchedule = 0.0, threshold: ScalarOrSchedule = 5.0, *, mu_dtype: DType = None,
                   nu_dtype: DType = None, nesterov: bool = False) -> Update:
    r"""Scales updates by Rectified Adam: Adam once the variance is tractable, momentum before.

    Update rule, as in the paper (Polaris uses ``b1`` in $\rho_\infty$), for an update $g$ at step $t$ (counting
    from 1), with $b_1$ = ``b1``, $b_2$ = ``b2``, $\epsilon$ = ``eps``, $\epsilon_\text{root}$ = ``eps_root``,
    $\tau$ = ``threshold``:

    $$
    \begin{align*}
    m &\gets b_1 m + (1 - b_1)\, g \\
    v &\gets b_2 v + (1 - b_2)\, g^2 \\
    \rho_\infty &= \frac{2}{1 - b_2} - 1, \quad \rho_t = \rho_\infty - \frac{2 t\, b_2^t}{1 - b_2^t} \\
    r &= \sqrt{\frac{(\rho_t - 4)(\rho_t - 2)\, \rho_\infty}{(\rho_\infty - 4)(\rho_\infty - 2)\, \rho_t}} \\
    u &= \begin{cases}
    \dfrac{r \hat m}{\sqrt{\hat v + \epsilon_\text{root}} + \epsilon}
    & \text{if } \rho_t \ge \tau \text{ and } \rho_t > 4 \\
    \hat m & \text{otherwise}
    \end{cases}
    \end{align*}
    $$

    with $\hat m = m / (1 - b_1^t)$ and $\hat v = v / (1 - b_2^t)$.

    Args:
        b1: decay of the first moment, in [0, 1). Default: ``0.9``.
        b2: decay of the second moment, in [0, 1). Default: ``0.999``.
        eps: added to the denominator, >= 0. Default: ``1e-8``.
        eps_root: added inside the square root, >= 0. Default: ``0.0``.
        threshold: $\rho_t$ from which the rectified step is used; values below
            4 act as 4. Default: ``5.0``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        nu_dtype: storage dtype of ``nu``. Default: ``None``.
        nesterov: use Nesterov's look-ahead first moment,
            $\hat m = b_1 m / (1 - b_1^{t+1}) + (1 - b_1)\, g / (1 - b_1^t)$
            (NAdam's, as optax's ``nesterov=True``); it prints only when True.
            Default: ``False``.

    Returns:
        An update object with state ``ScaleByAdamState(mu, nu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_radam()
        >>> u, _ = opt.update({"w": jnp.array([0.5])}, opt.init({"w": jnp.zeros(1)}))
        >>> u["w"]  # ρ1 = 1 < 5: the bias-corrected momentum
        Array([0.5], dtype=float32)

    References:
        Liu et al., "On the Variance of the Adaptive Learning Rate and Beyond",
        ICLR 2020. https://arxiv.org/abs/1908.03265
    """
    return _adam_like(_adam_like_init, _apply_scale_by_radam, "scale_by_radam",
                      dict(b1=b1, b2=b2, eps=eps, eps_root=eps_root, threshold=threshold, nesterov=nesterov,
                           mu_dtype=mu_dtype, nu_dtype=nu_dtype))


# --------------------------------------------------------------------------
# Yogi


def _init_scale_by_yogi(params, *, initial_accumulator_value, mu_dtype, nu_dtype):
    v0 = initial_accumulator_value
    return _adam_like_init(params, mu_dtype=mu_dtype, nu_dtype=nu_dtype, mu_fill=v0, nu_fill=v0,
                           state=ScaleByYogiState)


def _apply_scale_by_yogi(updates, state, params, *, b1, b2, eps, eps_root):
    count = _tree.safe_increment(state.count)
    c1, c2 = bias_corrections(count, b1, b2)

    def rule(g, m, v):
        g2 = abs_sq(g)
        m = b1 * m + (1 - b1) * g
        v = v - (1 - b2) * jnp.sign(v - g2) * g2
        u = adam_direction(m / c1, v, c2, eps, eps_root)
        return u, m, v

    return _adam_like_update("scale_by_yogi", rule, updates, state, count)


@combinator
def scale_by_yogi(initial_accumulator_value: ScalarOrSchedule = 1e-6, b1: ScalarOrSchedule = 0.9,
                  b2: ScalarOrSchedule = 0.999, eps: ScalarOrSchedule = 1e-3, eps_root: ScalarOrSchedule = 0.0, *,
                  mu_dtype: DType = None, nu_dtype: DType = None) -> Update:
    r"""Scales updates by Yogi: Adam with an additive, sign-controlled second moment.

    Update rule, for an update $g$ at step $t$ (counting from 1), with $b_1$ = ``b1``, $b_2$ = ``b2``,
    $\epsilon$ = ``eps``, $\epsilon_\text{root}$ = ``eps_root``:

    $$
    \begin{align*}
    m &\gets b_1 m + (1 - b_1)\, g \\
    v &\gets v - (1 - b_2) \operatorname{sign}(v - g^2)\, g^2 \\
    u &= \frac{m / (1 - b_1^t)}{\sqrt{v / (1 - b_2^t) + \epsilon_\text{root}} + \epsilon}
    \end{align*}
    $$

    Args:
        initial_accumulator_value: initial value of $m$ and $v$, >= 0.
            Default: ``1e-6``.
        b1: decay of the first moment, in [0, 1). Default: ``0.9``.
        b2: rate of the second moment, in [0, 1). Default: ``0.999``.
        eps: added to the denominator, >= 0. Default: ``1e-3``.
        eps_root: added inside the square root, >= 0. Default: ``0.0``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        nu_dtype: storage dtype of ``nu``. Default: ``None``.

    Returns:
        An update object with state ``ScaleByYogiState(mu, nu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_yogi(initial_accumulator_value=0.0, eps=0.0)
        >>> u, _ = opt.update({"w": jnp.array([-3.0])}, opt.init({"w": jnp.zeros(1)}))
        >>> u["w"]  # from zero accumulators the first step is sign(g)
        Array([-1.], dtype=float32)

    References:
        Zaheer et al., "Adaptive Methods for Nonconvex Optimization", NeurIPS
        2018.
    """
    return _adam_like(_init_scale_by_yogi, _apply_scale_by_yogi, "scale_by_yogi",
                      dict(initial_accumulator_value=initial_accumulator_value, b1=b1, b2=b2, eps=eps,
                           eps_root=eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype))


# --------------------------------------------------------------------------
# AMSGrad


def _init_scale_by_amsgrad(params, *, mu_dtype, nu_dtype):
    return ScaleByAmsgradState(mu=_tree.accumulators(params, mu_dtype), nu=_tree.accumulators(params, nu_dtype),
                               nu_max=_tree.accumulators(params, nu_dtype), count=_tree.zero_count())


def _apply_scale_by_amsgrad(updates, state, params, *, b1, b2, eps, eps_root):
    count = _tree.safe_increment(state.count)
    c1, c2 = bias_corrections(count, b1, b2)

    def rule(g, m, v, v_max):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * abs_sq(g)
        v_max = jnp.maximum(v_max, v / c2)
        u = m / c1 / (safe_sqrt(v_max + eps_root) + eps)
        return u, m, v, v_max

    u, mu, nu, nu_max = per_leaf("scale_by_amsgrad", rule, (updates, state.mu, state.nu, state.nu_max),
                                 ("updates", "state.mu", "state.nu", "state.nu_max"))
    return u, ScaleByAmsgradState(mu=mu, nu=nu, nu_max=nu_max, count=count)


@combinator
def scale_by_amsgrad(b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999, eps: ScalarOrSchedule = 1e-8,
                     eps_root: ScalarOrSchedule = 0.0, *, mu_dtype: DType = None, nu_dtype: DType = None) -> Update:
    r"""Scales updates by AMSGrad: Adam whose second moment never decreases.

    Update rule, as optax, for an update $g$ at step $t$ (counting from 1), with $b_1$ = ``b1``, $b_2$ = ``b2``,
    $\epsilon$ = ``eps``, $\epsilon_\text{root}$ = ``eps_root``, and $v_\text{max}$ held in ``nu_max``:

    $$
    \begin{align*}
    m &\gets b_1 m + (1 - b_1)\, g \\
    v &\gets b_2 v + (1 - b_2)\, g^2 \\
    v_\text{max} &\gets \max\left(v_\text{max}, \frac{v}{1 - b_2^t}\right) \\
    u &= \frac{m / (1 - b_1^t)}{\sqrt{v_\text{max} + \epsilon_\text{root}} + \epsilon}
    \end{align*}
    $$

    The paper's Algorithm 2 has no bias correction; optax (and updax) keep
    Adam's, with the maximum taken over the bias-corrected $v$.

    Args:
        b1: decay of the first moment, in [0, 1). Default: ``0.9``.
        b2: decay of the second moment, in [0, 1). Default: ``0.999``.
        eps: added to the denominator, >= 0. Default: ``1e-8``.
        eps_root: added inside the square root, >= 0 (optax's default).
            Default: ``0.0``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        nu_dtype: storage dtype of ``nu`` and ``nu_max``, as ``mu_dtype``.
            Default: ``None``.

    Returns:
        An update object with state ``ScaleByAmsgradState(mu, nu, nu_max, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_amsgrad(b1=0.0, b2=0.5, eps=0.0)
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> _, state = opt.update({"w": jnp.array([4.0])}, state)
        >>> u, state = opt.update({"w": jnp.array([1.0])}, state)
        >>> u["w"]  # v̂ = 4.5/0.75 = 6 < v_max = 16: 1/sqrt(16)
        Array([0.25], dtype=float32)

    References:
        Reddi et al., "On the Convergence of Adam and Beyond", ICLR 2018.
        https://openreview.net/forum?id=ryQu7f-RZ
    """
    return _adam_like(_init_scale_by_amsgrad, _apply_scale_by_amsgrad, "scale_by_amsgrad",
                      dict(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype))


# --------------------------------------------------------------------------
# AdaMax


def _apply_scale_by_adamax(updates, state, params, *, b1, b2, eps):
    count = _tree.safe_increment(state.count)
    (c1,) = bias_corrections(count, b1)

    def rule(g, m, v):
        m = b1 * m + (1 - b1) * g
        v = jnp.maximum(jnp.abs(g) + eps, b2 * v)
        u = m / c1 / v
        return u, m, v

    return _adam_like_update("scale_by_adamax", rule, updates, state, count)


@combinator
def scale_by_adamax(b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999, eps: ScalarOrSchedule = 1e-8, *,
                    mu_dtype: DType = None, nu_dtype: DType = None) -> Update:
    r"""Scales updates by AdaMax: Adam with an infinity-norm second moment.

    Update rule, as optax (the paper has no ``eps``), for an update $g$ at step $t$ (counting from 1), with
    $b_1$ = ``b1``, $b_2$ = ``b2``, $\epsilon$ = ``eps``:

    $$
    \begin{align*}
    m &\gets b_1 m + (1 - b_1)\, g \\
    v &\gets \max(|g| + \epsilon, b_2 v) \\
    u &= \frac{m / (1 - b_1^t)}{v}
    \end{align*}
    $$

    Args:
        b1: decay of the first moment, in [0, 1); the paper's value.
            Default: ``0.9``.
        b2: decay of the infinity norm, in [0, 1); the paper's value.
            Default: ``0.999``.
        eps: added to $|g|$ inside the maximum, >= 0 (optax's default); with
            0, a zero update before any non-zero one divides 0 by 0.
            Default: ``1e-8``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        nu_dtype: storage dtype of ``nu``, as ``mu_dtype``. Default: ``None``.

    Returns:
        An update object with state ``ScaleByAdamaxState(mu, nu, count)``;
        ``nu`` holds the infinity norm.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_adamax(b1=0.5, b2=0.5, eps=0.0)
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> _, state = opt.update({"w": jnp.array([4.0])}, state)
        >>> u, state = opt.update({"w": jnp.array([1.0])}, state)
        >>> u["w"]  # m̂ = 1.5/0.75 = 2, v = max(|1|, 0.5·4) = 2
        Array([1.], dtype=float32)

    References:
        Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015,
        Section 7.1 and Algorithm 2. https://arxiv.org/abs/1412.6980
    """
    return _adam_like(_init_scale_by_adamax, _apply_scale_by_adamax, "scale_by_adamax",
                      dict(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype, nu_dtype=nu_dtype))


# --------------------------------------------------------------------------
# NAdam


def _apply_scale_by_nadam(updates, state, params, *, b1, b2, eps, eps_root):
    return _adam_step("scale_by_nadam", updates, state, b1, b2, eps, eps_root, nesterov=True)


@combinator
def scale_by_nadam(b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999, eps: ScalarOrSchedule = 1e-8,
                   eps_root: ScalarOrSchedule = 0.0, *, mu_dtype: DType = None, nu_dtype: DType = None) -> Update:
    r"""Scales updates by NAdam: Adam with a Nesterov look-ahead first moment.

    Update rule, as optax's ``scale_by_adam(nesterov=True)``, for an update $g$ at step $t$ (counting from 1),
    with $b_1$ = ``b1``, $b_2$ = ``b2``, $\epsilon$ = ``eps``, $\epsilon_\text{root}$ = ``eps_root``:

    $$
    \begin{align*}
    m &\gets b_1 m + (1 - b_1)\, g \\
    v &\gets b_2 v + (1 - b_2)\, g^2 \\
    \hat m &= \frac{b_1 m}{1 - b_1^{t+1}} + \frac{(1 - b_1)\, g}{1 - b_1^t}, \quad \hat v = \frac{v}{1 - b_2^t} \\
    u &= \frac{\hat m}{\sqrt{\hat v + \epsilon_\text{root}} + \epsilon}
    \end{align*}
    $$

    Dozat's Algorithm 2 lets the momentum follow a schedule $\mu_t$ and
    multiplies $\hat v$ by $b_2$; optax (and updax) use a constant $b_1$ and
    Adam's $\hat v$.

    Args:
        b1: decay of the first moment, in [0, 1). Default: ``0.9``.
        b2: decay of the second moment, in [0, 1). Default: ``0.999``.
        eps: added to the denominator, >= 0. Default: ``1e-8``.
        eps_root: added inside the square root, >= 0 (optax's default).
            Default: ``0.0``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        nu_dtype: storage dtype of ``nu``, as ``mu_dtype``. Default: ``None``.

    Returns:
        An update object with state ``ScaleByAdamState(mu, nu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_nadam(eps=0.0)
        >>> u, _ = opt.update({"w": jnp.array([0.3, -2.0])}, opt.init({"w": jnp.zeros(2)}))
        >>> u["w"]  # the first step is (1 + b1/(1+b1))·sign(g)
        Array([ 1.4737, -1.4737], dtype=float32)

    References:
        Dozat, "Incorporating Nesterov Momentum into Adam", ICLR 2016
        workshop. https://openreview.net/forum?id=OM0jvwB8jIp57ZJjtNEZ
    """
    return _adam_like(_adam_like_init, _apply_scale_by_nadam, "scale_by_nadam",
                      dict(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype))


# --------------------------------------------------------------------------
# Adan


def _init_scale_by_adan(params, *, mu_dtype, nu_dtype):
    return ScaleByAdanState(mu=_tree.accumulators(params, mu_dtype), mu_diff=_tree.accumulators(params, mu_dtype),
                            nu=_tree.accumulators(params, nu_dtype), prev_grads=_tree.accumulators(params, None),
                            count=_tree.zero_count())


def _apply_scale_by_adan(updates, state, params, *, b1, b2, b3, eps, eps_root):
    count = _tree.safe_increment(state.count)
    c1, c2, c3 = bias_corrections(count, b1, b2, b3)
    first = count == 1

    def rule(g, m, d, n, g_prev):
        diff = jnp.where(first, 0.0, g - g_prev)
        m = b1 * m + (1 - b1) * g
        d = b2 * d + (1 - b2) * diff
        n = b3 * n + (1 - b3) * abs_sq(g + b2 * diff)
        u = (m / c1 + b2 * d / c2) / (safe_sqrt(n / c3 + eps_root) + eps)
        return u, m, d, n, g

    u, mu, mu_diff, nu, prev = per_leaf(
        "scale_by_adan", rule, (updates, state.mu, state.mu_diff, state.nu, state.prev_grads),
        ("updates", "state.mu", "state.mu_diff", "state.nu", "state.prev_grads"))
    return u, ScaleByAdanState(mu=mu, mu_diff=mu_diff, nu=nu, prev_grads=prev, count=count)


@combinator
def scale_by_adan(b1: ScalarOrSchedule = 0.98, b2: ScalarOrSchedule = 0.92, b3: ScalarOrSchedule = 0.99,
                  eps: ScalarOrSchedule = 1e-8, eps_root: ScalarOrSchedule = 0.0, *, mu_dtype: DType = None,
                  nu_dtype: DType = None) -> Update:
    r"""Scales updates by Adan: adaptive Nesterov momentum from gradient differences.

    Update rule, with the decays written as in the authors' code (the paper's
    $\beta$ is $1 - b$), for an update $g$ at step $t$ (counting from 1), with $b_1$ = ``b1``, $b_2$ = ``b2``,
    $b_3$ = ``b3``, $\epsilon$ = ``eps``, $\epsilon_\text{root}$ = ``eps_root``, and
    $\Delta = g - g_\text{prev}$, 0 on the first step:

    $$
    \begin{align*}
    m &\gets b_1 m + (1 - b_1)\, g \\
    d &\gets b_2 d + (1 - b_2)\, \Delta \\
    n &\gets b_3 n + (1 - b_3)\, (g + b_2 \Delta)^2 \\
    u &= \frac{m / (1 - b_1^t) + b_2\, d / (1 - b_2^t)}{\sqrt{n / (1 - b_3^t) + \epsilon_\text{root}} + \epsilon}
    \end{align*}
    $$

    The gradient-difference terms are weighted by $b_2$ (the paper's
    $1 - \beta_2$), as in the paper and the authors' code; optax 0.2.8 weights
    them by $1 - b_2$. The two agree only when $b_2 = 0.5$.

    Args:
        b1: decay of the first moment, in [0, 1) (the paper's $1 - \beta_1$).
            Default: ``0.98``.
        b2: decay of the gradient-difference moment, in [0, 1) ($1 - \beta_2$).
            Default: ``0.92``.
        b3: decay of the second moment, in [0, 1) ($1 - \beta_3$).
            Default: ``0.99``.
        eps: added to the denominator, >= 0. Default: ``1e-8``.
        eps_root: added inside the square root, >= 0
            (``optax.scale_by_adan``'s default). Default: ``0.0``.
        mu_dtype: storage dtype of ``mu`` and ``mu_diff``; None keeps the
            params' dtype but at least float32. Default: ``None``.
        nu_dtype: storage dtype of ``nu``, as ``mu_dtype``. Default: ``None``.

    Returns:
        An update object with state
        ``ScaleByAdanState(mu, mu_diff, nu, prev_grads, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_adan(b1=0.5, b2=0.5, b3=0.5, eps=0.0)
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> _, state = opt.update({"w": jnp.array([1.0])}, state)
        >>> u, state = opt.update({"w": jnp.array([3.0])}, state)
        >>> u["w"]  # Δ = 2: m̂ = 1.75/0.75, d̂ = 1/0.75, n̂ = (0.25 + 0.5·4²)/0.75: 3/sqrt(11)
        Array([0.9045], dtype=float32)

    References:
        Xie et al., "Adan: Adaptive Nesterov Momentum Algorithm for Faster
        Optimizing Deep Models", IEEE TPAMI 2024, Algorithm 1.
        https://arxiv.org/abs/2208.06677
    """
    # The update reads the previous gradient: prev_grads is written after the params' update (``state_last``).
    return _adam_like(_init_scale_by_adan, _apply_scale_by_adan, "scale_by_adan",
                      dict(b1=b1, b2=b2, b3=b3, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype),
                      state_last=("prev_grads",))
