"""Recent variants of Adam: ADOPT, AdEMAMix, simplified AdEMAMix, LaProp and ACProp.

ADOPT normalises each update by the second moment of the *previous*
updates before averaging it; AdEMAMix adds a slow EMA of the updates to
Adam's fast one; simplified AdEMAMix replaces both by one undamped sum of
the updates plus a multiple of the current one; LaProp takes the momentum of
the updates after dividing them by the root of their second moment; ACProp
divides each update by AdaBelief's centred second moment as it was before
that update. Defaults
are the papers' or optax's (``optax.contrib``); each docstring says which.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import NON_NEGATIVE, POSITIVE, Count, Flag, MomentField, SecondMomentField, Valid
from updax._primitives import stateful
from updax._typing import DType, ScalarOrSchedule
from updax._update import Update
from updax.updates._adam import _ADAM_DOMAINS, _adam_like_init
from updax._leafwise import per_leaf
from updax.updates._kernels import abs_sq, bias_corrections, number, safe_sqrt

# --------------------------------------------------------------------------
# States


class ScaleByAdoptState(NamedTuple):
    """ADOPT's momentum of the normalised updates ``mu``, the second moment ``nu`` of the updates before this
    one (``g²`` after the first call), steps taken ``count``."""

    mu: MomentField
    nu: SecondMomentField
    count: Count


class ScaleByAdemamixState(NamedTuple):
    """The fast EMA ``mu_fast`` and the slow EMA ``mu_slow`` of the updates, their second moment ``nu``,
    steps taken ``count``."""

    mu_fast: MomentField
    mu_slow: MomentField
    nu: SecondMomentField
    count: Count


class ScaleBySimplifiedAdemamixState(NamedTuple):
    """The undamped sum ``mu`` of the updates (``m ← b1·m + g``), their second moment ``nu``, steps taken
    ``count``."""

    mu: MomentField
    nu: SecondMomentField
    count: Count


def _optional_positive(call, name, value):
    """None, or a number > 0."""
    return None if value is None else POSITIVE.check(call, name, value)


#: What the options of the Adam variants hold: Adam's rules (:data:`updax.updates._adam._ADAM_DOMAINS`) and
#: the variants' own. (ADOPT's ``nesterov`` was there from the start: it prints at False.)
_VARIANT_DOMAINS = {**_ADAM_DOMAINS, "alpha": NON_NEGATIVE, "nesterov": Flag(), "use_clipping": Flag(),
                    "clip_value": Valid(rule=_optional_positive, text="must be None or in (0, inf)",
                                        values=POSITIVE)}


def _variant(init_fn, apply_fn, name, options, state_last=()):
    """An Adam variant: its options' domains from :data:`_VARIANT_DOMAINS`, every option but the flags and
    dtypes schedulable."""
    schedulable = [k for k in options if k not in ("mu_dtype", "nu_dtype", "nesterov", "use_clipping")]
    return stateful(init_fn, apply_fn, name=name, options=options, domains={k: _VARIANT_DOMAINS[k] for k in options},
                    schedulable=schedulable, state_last=state_last)


# --------------------------------------------------------------------------
# ADOPT


def _clipped(x, bound):
    """``x`` clipped to ``[-bound, bound]``; a complex ``x`` keeps its phase and has its modulus clipped."""
    if not jnp.iscomplexobj(x):
        return jnp.clip(x, -bound, bound)
    size = jnp.abs(x)
    over = size > bound
    return jnp.where(over, x * (bound / jnp.where(over, size, 1.0)), x)


def _init_scale_by_adopt(params, *, mu_dtype, nu_dtype):
    return _adam_like_init(params, mu_dtype=mu_dtype, nu_dtype=nu_dtype, state=ScaleByAdoptState)


def _apply_scale_by_adopt(updates, state, params, *, b1, b2, eps, clip_value=None, nesterov, use_clipping):
    first = state.count == 0  # the first call only sets v = g²
    if use_clipping and clip_value is None:
        clip_value = _tree.float_count(state.count) ** 0.25

    # On the first call the selects below discard the normalised update. Its divisor must not be 0 even so (0
    # times an infinite derivative is NaN): 1 on that call, unless eps is a positive number.
    guarded = not (number(eps) or 0) > 0

    def rule(g, m, v):
        scale = jnp.maximum(safe_sqrt(v.real if jnp.iscomplexobj(v) else v), eps)  # (the old v)
        normed = g / (jnp.where(first, 1.0, scale) if guarded else scale)
        if use_clipping:
            normed = _clipped(normed, clip_value)
        m = jnp.where(first, m, b1 * m + (1 - b1) * normed)
        u = b1 * m + (1 - b1) * normed if nesterov else m
        v = jnp.where(first, abs_sq(g), b2 * v + (1 - b2) * abs_sq(g))
        return jnp.where(first, 0.0, u), m, v

    u, mu, nu = per_leaf("scale_by_adopt", rule, (updates, state.mu, state.nu), ("updates", "state.mu", "state.nu"))
    return u, ScaleByAdoptState(mu=mu, nu=nu, count=_tree.safe_increment(state.count))


@combinator
def scale_by_adopt(b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.9999, eps: ScalarOrSchedule = 1e-6,
                   clip_value: ScalarOrSchedule | None = None, *, mu_dtype: DType = None, nu_dtype: DType = None,
                   nesterov: bool = False, use_clipping: bool = True) -> Update:
    r"""Scales updates by ADOPT: momentum of the updates normalised by the previous second moment.

    Update rule, as in the paper (Algorithm 2, with the clipping of its
    revised version), for an update $g$, with $b_1$ = ``b1``, $b_2$ = ``b2``, $\epsilon$ = ``eps``, and
    $\operatorname{clip}(x, c)$ clipping $x$ to $[-c, c]$; the first call only sets $v = g^2$ and returns
    zeros, then for $t = 1, 2, \ldots$:

    $$
    \begin{align*}
    \hat g &= \operatorname{clip}\left(\frac{g}{\max(\sqrt{v}, \epsilon)}, c_t\right), \quad c_t = t^{1/4} \\
    m &\gets b_1 m + (1 - b_1)\, \hat g \\
    v &\gets b_2 v + (1 - b_2)\, g^2 \\
    u &= m
    \end{align*}
    $$

    and with ``nesterov``, $u = b_1 m + (1 - b_1)\, \hat g$. The $v$ in $\hat g$ is the previous calls' second
    moment: the current update does not enter its own normalisation. A complex $\hat g$ has its modulus clipped.

    Args:
        b1: decay of the first moment, in [0, 1); the paper's. Default: ``0.9``.
        b2: decay of the second moment, in [0, 1); the paper's.
            Default: ``0.9999``.
        eps: the smallest normaliser $\max(\sqrt{v}, \epsilon)$, >= 0; the paper's.
            Default: ``1e-6``.
        clip_value: the clipping bound $c_t$, > 0, or a schedule of $t$
            (the calls before this one: 1 on the first update); None is the
            paper's $t^{1/4}$. Unused without ``use_clipping``.
            Default: ``None``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        nu_dtype: storage dtype of ``nu``, as ``mu_dtype``. Default: ``None``.
        nesterov: return the look-ahead $b_1 m + (1 - b_1)\, \hat g$ instead of $m$
            (optax's option). Default: ``False``.
        use_clipping: clip $\hat g$ to $[-c_t, c_t]$; False is the paper's
            first, unclipped ADOPT. Default: ``True``.

    Returns:
        An update object with state ``ScaleByAdoptState(mu, nu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_adopt(b1=0.5)
        >>> state = opt.init({"w": jnp.zeros(2)})
        >>> u, state = opt.update({"w": jnp.array([2.0, -4.0])}, state)
        >>> u["w"]  # the first call sets v = g² only
        Array([0., 0.], dtype=float32)
        >>> u, state = opt.update({"w": jnp.array([1.0, -8.0])}, state)
        >>> u["w"]  # ĝ = (0.5, -2) clipped to [-1, 1], halved
        Array([ 0.25, -0.5 ], dtype=float32)

    References:
        Taniguchi et al., "ADOPT: Modified Adam Can Converge with Any β2 with
        the Optimal Rate", NeurIPS 2024. https://arxiv.org/abs/2411.02853
    """
    # The update is normalized by the old second moment: nu is written after the params' update (``state_last``).
    return _variant(_init_scale_by_adopt, _apply_scale_by_adopt, "scale_by_adopt",
                    dict(b1=b1, b2=b2, eps=eps, clip_value=clip_value, mu_dtype=mu_dtype, nu_dtype=nu_dtype,
                         nesterov=nesterov, use_clipping=use_clipping), state_last=("nu",))


# --------------------------------------------------------------------------
# AdEMAMix


def _init_scale_by_ademamix(params, *, mu_dtype, nu_dtype):
    return ScaleByAdemamixState(mu_fast=_tree.accumulators(params, mu_dtype),
                                mu_slow=_tree.accumulators(params, mu_dtype),
                                nu=_tree.accumulators(params, nu_dtype), count=_tree.zero_count())


def _apply_scale_by_ademamix(updates, state, params, *, b1, b2, b3, alpha, eps, eps_root):
    count = _tree.safe_increment(state.count)
    c1, c2 = bias_corrections(count, b1, b2)

    def rule(g, m1, m2, v):
        m1 = b1 * m1 + (1 - b1) * g
        m2 = b3 * m2 + (1 - b3) * g
        v = b2 * v + (1 - b2) * abs_sq(g)
        u = (m1 / c1 + alpha * m2) / (safe_sqrt(v / c2 + eps_root) + eps)
        return u, m1, m2, v

    u, mu_fast, mu_slow, nu = per_leaf("scale_by_ademamix", rule, (updates, state.mu_fast, state.mu_slow, state.nu),
                                       ("updates", "state.mu_fast", "state.mu_slow", "state.nu"))
    return u, ScaleByAdemamixState(mu_fast=mu_fast, mu_slow=mu_slow, nu=nu, count=count)


@combinator
def scale_by_ademamix(b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999, b3: ScalarOrSchedule = 0.9999,
                      alpha: ScalarOrSchedule = 5.0, eps: ScalarOrSchedule = 1e-8, eps_root: ScalarOrSchedule = 0.0,
                      *, mu_dtype: DType = None, nu_dtype: DType = None) -> Update:
    r"""Scales updates by AdEMAMix: Adam's fast EMA plus ``alpha`` times a slow EMA of the updates.

    Update rule, as in the paper (Algorithm 1), for an update $g$ at step $t$ (counting from 1), with $b_1$ =
    ``b1``, $b_2$ = ``b2``, $b_3$ = ``b3``, $\alpha$ = ``alpha``, $\epsilon$ = ``eps``, $\epsilon_\text{root}$ =
    ``eps_root``:

    $$
    \begin{align*}
    m_1 &\gets b_1 m_1 + (1 - b_1)\, g \\
    m_2 &\gets b_3 m_2 + (1 - b_3)\, g \\
    v &\gets b_2 v + (1 - b_2)\, g^2 \\
    u &= \frac{m_1 / (1 - b_1^t) + \alpha\, m_2}{\sqrt{v / (1 - b_2^t) + \epsilon_\text{root}} + \epsilon}
    \end{align*}
    $$

    The slow EMA $m_2$ is not bias-corrected: it fills slowly on purpose.
    The paper warms ``alpha`` and ``b3`` up over its first steps; give them
    as schedules, e.g. ``alpha=ux.schedules.linear_schedule(0.0, 5.0, T)``
    (schedules get the steps taken before this one, from 0).

    Args:
        b1: decay of the fast EMA, in [0, 1). Default: ``0.9``.
        b2: decay of the second moment, in [0, 1). Default: ``0.999``.
        b3: decay of the slow EMA, in [0, 1); the paper's. Default: ``0.9999``.
        alpha: weight of the slow EMA, >= 0 (``optax.contrib.ademamix``'s;
            ``scale_by_ademamix``'s is 6). Default: ``5.0``.
        eps: added to the denominator, >= 0. Default: ``1e-8``.
        eps_root: added inside the square root, >= 0 (optax's default).
            Default: ``0.0``.
        mu_dtype: storage dtype of ``mu_fast`` and ``mu_slow``; None keeps
            the params' dtype but at least float32. Default: ``None``.
        nu_dtype: storage dtype of ``nu``, as ``mu_dtype``. Default: ``None``.

    Returns:
        An update object with state ``ScaleByAdemamixState(mu_fast, mu_slow, nu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_ademamix(b3=0.5, alpha=2.0, eps=0.0)
        >>> u, _ = opt.update({"w": jnp.array([0.5, -2.0])}, opt.init({"w": jnp.zeros(2)}))
        >>> u["w"]  # (sign(g) + 2·0.5·g) / |g| on the first step
        Array([ 2., -2.], dtype=float32)

    References:
        Pagliardini et al., "The AdEMAMix Optimizer: Better, Faster, Older",
        2024. https://arxiv.org/abs/2409.03137
    """
    return _variant(_init_scale_by_ademamix, _apply_scale_by_ademamix, "scale_by_ademamix",
                    dict(b1=b1, b2=b2, b3=b3, alpha=alpha, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype,
                         nu_dtype=nu_dtype))


# --------------------------------------------------------------------------
# Simplified AdEMAMix


def _init_scale_by_simplified_ademamix(params, *, mu_dtype, nu_dtype):
    return _adam_like_init(params, mu_dtype=mu_dtype, nu_dtype=nu_dtype, state=ScaleBySimplifiedAdemamixState)


def _apply_scale_by_simplified_ademamix(updates, state, params, *, b1, b2, alpha, eps, eps_root):
    count = _tree.safe_increment(state.count)
    (c2,) = bias_corrections(count, b2)

    def rule(g, m, v):
        m = b1 * m + g
        v = b2 * v + (1 - b2) * abs_sq(g)
        u = (m + alpha * g) / (safe_sqrt(v / c2 + eps_root) + eps)
        return u, m, v

    u, mu, nu = per_leaf("scale_by_simplified_ademamix", rule, (updates, state.mu, state.nu),
                         ("updates", "state.mu", "state.nu"))
    return u, ScaleBySimplifiedAdemamixState(mu=mu, nu=nu, count=count)


@combinator
def scale_by_simplified_ademamix(b1: ScalarOrSchedule = 0.99, b2: ScalarOrSchedule = 0.95,
                                 alpha: ScalarOrSchedule = 0.0, eps: ScalarOrSchedule = 1e-8,
                                 eps_root: ScalarOrSchedule = 0.0, *, mu_dtype: DType = None,
                                 nu_dtype: DType = None) -> Update:
    r"""Scales updates by simplified AdEMAMix: an undamped momentum plus ``alpha`` times the update.

    Update rule, as in the paper, for an update $g$ at step $t$ (counting from 1), with $b_1$ = ``b1``, $b_2$ =
    ``b2``, $\alpha$ = ``alpha``, $\epsilon$ = ``eps``, $\epsilon_\text{root}$ = ``eps_root``:

    $$
    \begin{align*}
    m &\gets b_1 m + g \\
    v &\gets b_2 v + (1 - b_2)\, g^2 \\
    u &= \frac{m + \alpha\, g}{\sqrt{v / (1 - b_2^t) + \epsilon_\text{root}} + \epsilon}
    \end{align*}
    $$

    $m$ sums the updates without the $1 - b_1$ factor, so it is about
    $1/(1 - b_1)$ times Adam's: scale the learning rate down by that much.
    With $\alpha = 0$ it is Adam without the first-moment bias correction.

    Args:
        b1: decay of the momentum, in [0, 1); optax's. Default: ``0.99``.
        b2: decay of the second moment, in [0, 1); optax's. Default: ``0.95``.
        alpha: weight of the current update, >= 0; optax's.
            Default: ``0.0``.
        eps: added to the denominator, >= 0. Default: ``1e-8``.
        eps_root: added inside the square root, >= 0. Default: ``0.0``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        nu_dtype: storage dtype of ``nu``, as ``mu_dtype``. Default: ``None``.

    Returns:
        An update object with state ``ScaleBySimplifiedAdemamixState(mu, nu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_simplified_ademamix(b1=0.5, alpha=1.0, eps=0.0)
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> _, state = opt.update({"w": jnp.array([2.0])}, state)
        >>> u, _ = opt.update({"w": jnp.array([2.0])}, state)
        >>> u["w"]  # (0.5·2 + 2 + 1·2) / 2
        Array([2.5], dtype=float32)

    References:
        Morwani et al., "Connections between Schedule-Free Optimizers,
        AdEMAMix, and Accelerated SGD Variants", 2025.
        https://arxiv.org/abs/2502.02431
    """
    return _variant(_init_scale_by_simplified_ademamix, _apply_scale_by_simplified_ademamix,
                    "scale_by_simplified_ademamix",
                    dict(b1=b1, b2=b2, alpha=alpha, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype))


# --------------------------------------------------------------------------
# LaProp


class ScaleByLapropState(NamedTuple):
    """The momentum of the normalised updates ``mu``, the second moment of the updates ``nu``, steps taken
    ``count``."""

    mu: Any
    nu: NonNegativeField
    count: Count


def _init_scale_by_laprop(params, *, mu_dtype, nu_dtype):
    return _adam_like_init(params, mu_dtype=mu_dtype, nu_dtype=nu_dtype, state=ScaleByLapropState)


def _apply_scale_by_laprop(updates, state, params, *, b1, b2, eps):
    count = _tree.safe_increment(state.count)
    c1, c2 = bias_corrections(count, b1, b2)

    def rule(g, m, v):
        v = b2 * v + (1 - b2) * abs_sq(g)
        scale = safe_sqrt(v / c2) + eps
        m = b1 * m + (1 - b1) * g / jnp.where(scale == 0, 1.0, scale)  # (v = 0 only where g = 0)
        return m / c1, m, v

    u, mu, nu = per_leaf("scale_by_laprop", rule, (updates, state.mu, state.nu), ("updates", "state.mu", "state.nu"))
    return u, ScaleByLapropState(mu=mu, nu=nu, count=count)


@combinator
def scale_by_laprop(b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999, eps: ScalarOrSchedule = 1e-15, *,
                    mu_dtype: DType = None, nu_dtype: DType = None) -> Update:
    r"""Scales updates by LaProp: the momentum of the updates normalised by their second moment.

    Update rule, as in the paper (Algorithm 1), for an update $g$ at step $t$ (counting from 1), with $b_1$ =
    ``b1``, $b_2$ = ``b2`` and $\epsilon$ = ``eps``:

    $$
    \begin{align*}
    v &\gets b_2 v + (1 - b_2)\, g^2 \\
    m &\gets b_1 m + (1 - b_1)\, \frac{g}{\sqrt{v / (1 - b_2^t)} + \epsilon} \\
    u &= m / (1 - b_1^t)
    \end{align*}
    $$

    Adam divides the momentum by the root of the second moment; LaProp takes
    the momentum of the already divided updates, which decouples ``b1`` from
    ``b2`` (any $b_1 \le 1$ and $b_2$ converge). Where $v = 0$ (the update and
    its history are 0) the normalised update is 0, also with $\epsilon = 0$.

    Args:
        b1: decay of the momentum, in [0, 1). Default: ``0.9``.
        b2: decay of the second moment, in [0, 1). Default: ``0.999``.
        eps: added to the denominator, >= 0 (the authors' code's 1e-15).
            Default: ``1e-15``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but
            at least float32. Default: ``None``.
        nu_dtype: storage dtype of ``nu``, as ``mu_dtype``. Default: ``None``.

    Returns:
        An update object with state ``ScaleByLapropState(mu, nu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_laprop(eps=0.0)
        >>> u, _ = opt.update({"w": jnp.array([0.5, -2.0])}, opt.init({"w": jnp.zeros(2)}))
        >>> u["w"]  # the first step is g / |g|
        Array([ 1., -1.], dtype=float32)

    References:
        Ziyin, Wang & Ueda, "LaProp: Separating Momentum and Adaptivity in
        Adam", 2020. https://arxiv.org/abs/2002.04839
    """
    return _variant(_init_scale_by_laprop, _apply_scale_by_laprop, "scale_by_laprop",
                    dict(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype, nu_dtype=nu_dtype))


# --------------------------------------------------------------------------
# ACProp


class ScaleByAcpropState(NamedTuple):
    """The momentum ``mu``, the second moment of the updates' deviations from it ``nu`` (AdaBelief's belief
    term), steps taken ``count``."""

    mu: Any
    nu: NonNegativeField
    count: Count


def _init_scale_by_acprop(params, *, mu_dtype, nu_dtype):
    return _adam_like_init(params, mu_dtype=mu_dtype, nu_dtype=nu_dtype, state=ScaleByAcpropState)


def _apply_scale_by_acprop(updates, state, params, *, b1, b2, eps, eps_root):
    first = state.count == 0  # no second moment yet: taken as 1
    (c2,) = bias_corrections(state.count, b2)  # of the old nu, 1 - b2^(t-1)
    c2 = jnp.where(first, 1.0, c2)

    def rule(g, m, v):
        scale = safe_sqrt(jnp.where(first, 1.0, v / c2)) + eps  # (the old v: the asynchronous step)
        u = g / jnp.where(scale == 0, 1.0, scale)  # (0 only with eps = 0 and no deviation yet: g as it is)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * abs_sq(g - m) + eps_root
        return u, m, v

    u, mu, nu = per_leaf("scale_by_acprop", rule, (updates, state.mu, state.nu), ("updates", "state.mu", "state.nu"))
    return u, ScaleByAcpropState(mu=mu, nu=nu, count=_tree.safe_increment(state.count))


@combinator
def scale_by_acprop(b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999, eps: ScalarOrSchedule = 1e-16,
                    eps_root: ScalarOrSchedule = 1e-16, *, mu_dtype: DType = None, nu_dtype: DType = None) -> Update:
    r"""Scales updates by ACProp: AdaBelief's centred second moment, read one step late.

    Update rule, for an update $g$ at step $t$ (counting from 1), with $b_1$ = ``b1``, $b_2$ = ``b2``,
    $\epsilon$ = ``eps`` and $\epsilon_\text{root}$ = ``eps_root``, as optax's documentation writes it:

    $$
    \begin{align*}
    u &= g / \left(\sqrt{s / (1 - b_2^{t-1})} + \epsilon\right) && \text{(the old } s\text{; } g / (1 + \epsilon) \text{ at } t = 1) \\
    m &\gets b_1 m + (1 - b_1)\, g \\
    s &\gets b_2 s + (1 - b_2)\, (g - m)^2 + \epsilon_\text{root}
    \end{align*}
    $$

    The denominator holds what was known before this update (the asynchronous
    step), so the step is not correlated with it; the second moment is of the
    deviation from the momentum (centring, as AdaBelief's). With no second
    moment on the first step, it is taken as 1, as in optax.
    optax 0.2.8 computes the deviation from the *old* momentum,
    $g - m_{t-1} = (g - m_t) / b_1$, against its documentation and the paper (its
    pull request 1716 fixes it): with $\epsilon_\text{root} = 0$ its $s$ is this one over
    $b_1^2$, and its steps with ``eps`` $= \epsilon / b_1$ are these times $b_1$ (from the second on).
    Where the denominator is 0 ($s = 0$ with $\epsilon = 0$ and $\epsilon_\text{root} = 0$: no deviation from
    the momentum yet) the update passes unchanged, where optax divides by 0.

    Args:
        b1: decay of the momentum, in [0, 1). Default: ``0.9``.
        b2: decay of the second moment, in [0, 1). Default: ``0.999``.
        eps: added to the denominator, >= 0 (optax's). Default: ``1e-16``.
        eps_root: added to the second moment each step, >= 0 (optax's).
            Default: ``1e-16``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but
            at least float32. Default: ``None``.
        nu_dtype: storage dtype of ``nu``, as ``mu_dtype``. Default: ``None``.

    Returns:
        An update object with state ``ScaleByAcpropState(mu, nu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_acprop(b1=0.5, b2=0.5, eps=0.0, eps_root=0.0)
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> u, state = opt.update({"w": jnp.array([4.0])}, state)  # g / 1; m = 2, s = (4 - 2)²/2 = 2
        >>> u, _ = opt.update({"w": jnp.array([3.0])}, state)
        >>> u["w"]  # 3 / sqrt(2 / (1 - 0.5))
        Array([1.5], dtype=float32)

    References:
        Zhuang et al., "Momentum Centering and Asynchronous Update for
        Adaptive Gradient Methods", NeurIPS 2021.
        https://arxiv.org/abs/2110.05454
    """
    return _variant(_init_scale_by_acprop, _apply_scale_by_acprop, "scale_by_acprop",
                    dict(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype))
