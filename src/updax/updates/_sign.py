"""The sign family: steps that keep the sign of the update and choose their own magnitude.

signSGD, Lion (the sign of an interpolated momentum) and Rprop (a per-element
step size adapted to sign agreement).
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import (NON_NEGATIVE, POSITIVE, UNIT, FloatDtype, MomentField, NonNegativeField, OneOf, Real,
                            Relation, Valid)
from updax._primitives import stateful, stateless
from updax._typing import DType, ScalarOrSchedule
from updax._update import Update
from updax._leafwise import per_leaf
from updax.updates._kernels import moment, real_only

# --------------------------------------------------------------------------
# States


class ScaleByLionState(NamedTuple):
    """EMA of the updates ``mu`` (the rule needs no step count)."""

    mu: MomentField


class ScaleByRpropState(NamedTuple):
    """Per-element step sizes, and the last step taken (0 where the sign flipped)."""

    step_sizes: NonNegativeField
    prev_steps: Any


# --------------------------------------------------------------------------
# Sign


def _apply_scale_by_sign(updates, params):
    real_only("scale_by_sign", updates)
    # (lax's sign: jnp.sign is a jitted function, traced again for every leaf shape)
    return jax.tree.map(lambda g: _tree.cast(jax.lax.sign(_tree.cast(g, _tree.compute_dtype(g.dtype))), g.dtype),
                        updates)


@combinator
def scale_by_sign() -> Update:
    r"""Replaces each update by its sign (signSGD; after an EMA, signum).

    Update rule, for an update $g$: $u = \operatorname{sign}(g)$, with $\operatorname{sign}(0) = 0$.

    Returns:
        A stateless update object.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_sign()
        >>> opt.update({"w": jnp.array([0.3, -2.0, 0.0])}, opt.init(None))[0]["w"]
        Array([ 1., -1.,  0.], dtype=float32)

    References:
        Bernstein et al., "signSGD: Compressed Optimisation for Non-Convex
        Problems", ICML 2018. https://arxiv.org/abs/1802.04434
    """
    return stateless(_apply_scale_by_sign, elementwise=True, name="scale_by_sign")


# --------------------------------------------------------------------------
# Lion


def _init_scale_by_lion(params, *, mu_dtype):
    return ScaleByLionState(mu=_tree.accumulators(params, mu_dtype))


#: The maps from the interpolated momentum to the update: the sign, or one of two smooth stand-ins for it.
_LION_MODES = ("hard", "smooth", "refined")


def _unread_or_positive(call, name, value):
    """None (``smooth_beta`` where ``mode`` is not "smooth": unread, left unsaid), or a number > 0."""
    return None if value is None else POSITIVE.check(call, name, value)


_SMOOTH_BETA = Valid(rule=_unread_or_positive, text="must be in (0, inf)", values=POSITIVE)


def _lion_direction(x, mode, smooth_beta):
    if mode is None:  # "hard", stored as None (a late option: see OneOf)
        return jnp.sign(x)
    if mode == "smooth":
        return jnp.tanh(smooth_beta * x)
    return jnp.clip(x, -1.0, 1.0)  # "refined": x where |x| < 1, its sign beyond


def _apply_scale_by_lion(updates, state, params, *, b1, b2, mode, smooth_beta):
    real_only("scale_by_lion", updates)

    def leaf(g, m):
        return _lion_direction(moment(b1, m, g), mode, smooth_beta), moment(b2, m, g)  # the map reads the old m

    u, mu = per_leaf("scale_by_lion", leaf, (updates, state.mu), ("updates", "state.mu"))
    return u, ScaleByLionState(mu=mu)


@combinator
def scale_by_lion(b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.99, *, mu_dtype: DType = None,
                  mode: str = "hard", smooth_beta: ScalarOrSchedule = 1.0) -> Update:
    r"""Scales updates to the sign of an interpolation of momentum and update (Lion).

    Update rule (the sign uses the old $m$; $m$ is updated after), for an update $g$, with $b_1$ = ``b1``, $b_2$ =
    ``b2``:

    $$
    \begin{align*}
    x &= b_1 m + (1 - b_1)\, g \\
    u &= \phi(x) \\
    m &\gets b_2 m + (1 - b_2)\, g
    \end{align*}
    $$

    where the map $\phi$ is chosen by ``mode`` (optax 0.2.8's ``mode``), with $\beta$ = ``smooth_beta``:

    $$
    \phi(x) = \begin{cases}
    \operatorname{sign}(x) & \text{``hard'' (the paper's rule)} \\
    \tanh(\beta x) & \text{``smooth''} \\
    \max(-1, \min(1, x)) & \text{``refined'': } x \text{ where } |x| < 1 \text{, else } \operatorname{sign}(x)
    \end{cases}
    $$

    The two smooth maps are optax's documented variants, not the paper's: $\tanh(\beta x)$ tends to the sign as
    $\beta \to \infty$; "refined" keeps small interpolations linear and saturates large ones to their sign.

    Args:
        b1: weight of the momentum in the interpolation, in [0, 1); the
            paper's value. Default: ``0.9``.
        b2: decay of the momentum, in [0, 1); the paper's value. Default: ``0.99``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        mode: the map $\phi$: ``"hard"`` (the sign), ``"smooth"`` (tanh) or
            ``"refined"`` (clipped to [-1, 1]). Default: ``'hard'``.
        smooth_beta: the slope $\beta$ of ``"smooth"``'s tanh, > 0; read (and
            kept, printed) only when ``mode="smooth"``, as optax. Default: ``1.0``.

    Returns:
        An update object with state ``ScaleByLionState(mu)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_lion()
        >>> opt
        scale_by_lion(b1=0.9, b2=0.99)
        >>> u, state = opt.update({"w": jnp.array([0.5, -2.0])}, opt.init({"w": jnp.zeros(2)}))
        >>> u["w"], opt.get_state(state, "scale_by_lion.mu")["w"]  # m = 0.01·g
        (Array([ 1., -1.], dtype=float32), Array([ 0.005, -0.02 ], dtype=float32))

    References:
        Chen et al., "Symbolic Discovery of Optimization Algorithms", NeurIPS
        2023, Algorithm 2. https://arxiv.org/abs/2302.06675
    """
    _SMOOTH_BETA.check("scale_by_lion", "smooth_beta", smooth_beta, schedulable=True)  # by its name, read or not
    if mode != "smooth":
        smooth_beta = None  # unread: left unsaid, so scale_by_lion() prints and compares as before these options
    # The sign reads the old momentum: mu is written after the params' update (``state_last``).
    return stateful(_init_scale_by_lion, _apply_scale_by_lion, elementwise=True, name="scale_by_lion",
                    options=dict(b1=b1, b2=b2, mu_dtype=mu_dtype, mode=mode, smooth_beta=smooth_beta),
                    domains=dict(b1=UNIT, b2=UNIT, mu_dtype=FloatDtype(), mode=OneOf(_LION_MODES, late=True, default="hard"),
                                 smooth_beta=_SMOOTH_BETA),
                    schedulable=("b1", "b2", "smooth_beta"),
                    state_last=("mu",))


# --------------------------------------------------------------------------
# Rprop


#: What Rprop's options hold, and the rule between its bounds.
_RPROP_DOMAINS = dict(learning_rate=POSITIVE, eta_minus=Real(0.0, 1.0, lo_open=True), eta_plus=Real(1.0),
                      min_step_size=NON_NEGATIVE, max_step_size=NON_NEGATIVE)
_RPROP_RELATIONS = (Relation(("min_step_size", "max_step_size"), operator.le,
                             "min_step_size must be <= max_step_size"),)


def _init_scale_by_rprop(params, *, learning_rate):
    return ScaleByRpropState(step_sizes=_tree.accumulators(params, None, learning_rate),
                             prev_steps=_tree.accumulators(params, None))


def _apply_scale_by_rprop(updates, state, params, *, eta_minus, eta_plus, min_step_size, max_step_size):
    real_only("scale_by_rprop", updates)

    def leaf(g, s, prev):
        agree = jnp.sign(g) * jnp.sign(prev)
        grown = jnp.minimum(eta_plus * s, max_step_size)
        shrunk = jnp.maximum(eta_minus * s, min_step_size)
        s = jnp.where(agree > 0, grown, jnp.where(agree < 0, shrunk, s))
        step = jnp.where(agree < 0, 0.0, s * jnp.sign(g))
        return step, s, step

    u, sizes, prev = per_leaf("scale_by_rprop", leaf, (updates, state.step_sizes, state.prev_steps),
                              ("updates", "state.step_sizes", "state.prev_steps"))
    return u, ScaleByRpropState(step_sizes=sizes, prev_steps=prev)


@combinator
def scale_by_rprop(learning_rate: ScalarOrSchedule, eta_minus: ScalarOrSchedule = 0.5,
                   eta_plus: ScalarOrSchedule = 1.2, min_step_size: ScalarOrSchedule = 1e-6,
                   max_step_size: ScalarOrSchedule = 50.0) -> Update:
    r"""Scales updates by Rprop: a per-element step size adapted to sign agreement (iRprop-).

    Update rule, per element (iRprop-: on a sign change the step is skipped,
    where the original Rprop backtracks), for an update $g$ and the step size $\Delta$, with $\eta^+$ =
    ``eta_plus``, $\eta^-$ = ``eta_minus``, $\Delta_\text{max}$ = ``max_step_size``, $\Delta_\text{min}$ =
    ``min_step_size``. $u$ is a direction: follow it with a negative scale:

    $$
    \begin{align*}
    s &= \operatorname{sign}(g)\, \operatorname{sign}(u_\text{prev}) \\
    \Delta &\gets \begin{cases}
    \min(\eta^+ \Delta, \Delta_\text{max}) & \text{if } s > 0 \\
    \max(\eta^- \Delta, \Delta_\text{min}) & \text{if } s < 0 \\
    \Delta & \text{if } s = 0
    \end{cases} \\
    u &= \begin{cases}
    0 & \text{if } s < 0 \\
    \Delta \operatorname{sign}(g) & \text{otherwise}
    \end{cases} \\
    u_\text{prev} &\gets u
    \end{align*}
    $$

    $u$ is this step's update, as in the paper and PyTorch's ``Rprop``;
    optax 0.2.8 returns the previous step's (0 on the first step).

    Args:
        learning_rate: the initial step size $\Delta_0$, > 0 (the paper uses 0.1).
            No default.
        eta_minus: step-size factor on a sign change, in (0, 1]; the paper's
            value. Default: ``0.5``.
        eta_plus: step-size factor on agreeing signs, >= 1; the paper's value.
            Default: ``1.2``.
        min_step_size: the smallest step size, >= 0; the paper's value.
            Default: ``1e-6``.
        max_step_size: the largest step size, >= ``min_step_size``; the
            paper's value. Default: ``50.0``.

    Returns:
        An update object with state ``ScaleByRpropState(step_sizes, prev_steps)``
        (at least float32).

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_rprop(0.1)
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> for g in (1.0, 3.0, -2.0, -2.0):
        ...     u, state = opt.update({"w": jnp.array([g])}, state)
        ...     print(u["w"])
        [0.1]
        [0.12]
        [0.]
        [-0.06]

    References:
        Riedmiller & Braun, "A Direct Adaptive Method for Faster
        Backpropagation Learning: The RPROP Algorithm", ICNN 1993; Igel &
        Hüsken, "Empirical evaluation of the improved Rprop learning
        algorithms", Neurocomputing 50, 2003.
    """
    options = dict(learning_rate=learning_rate, eta_minus=eta_minus, eta_plus=eta_plus, min_step_size=min_step_size,
                   max_step_size=max_step_size)
    return stateful(_init_scale_by_rprop, _apply_scale_by_rprop, elementwise=True, name="scale_by_rprop",
                    options=options, domains=_RPROP_DOMAINS, relations=_RPROP_RELATIONS, schedulable=tuple(options))

