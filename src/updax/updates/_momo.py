r"""MoMo: a Polyak-type step size from a momentum model of the loss (Schaipp et al., ICML 2024).

The model averages the losses, the gradients and the products $\langle g, x \rangle$
seen so far, truncated at a lower bound $f_*$ of the loss; each step is the
proximal step on that model (and on $\frac{\lambda}{2}\lVert x \rVert^2$ with weight
decay), so the step size is $\min(\alpha, \text{Polyak's})$. The loss enters on
every call as ``update(grads, state, params, loss=loss)`` (optax's ``value=``),
as for :func:`updax.scale_by_polyak`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import (
    ANY_REAL,
    LEARNING_RATE,
    NON_NEGATIVE,
    UNIT,
    Count,
    Flag,
    NonNegativeField,
    OneOf,
    scalar_input,
)
from updax._primitives import stateful
from updax._typing import ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import real_only, safe_sqrt
from updax.updates._lr_free import _div, _scalar_dtype, _total

__all__ = ["ScaleByMomoAdamState", "ScaleByMomoState", "scale_by_momo", "scale_by_momo_adam"]

#: How the weight decay enters: the paper's proximal step, or optax 0.2.8's decoupled form.
_DECAY_FORMS = ("proximal", "decoupled")


class ScaleByMomoState(NamedTuple):
    """The moving averages of the updates ``mu`` ($d$), of the loss ``loss_avg`` ($\\bar f$) and of
    $\\langle g, x \\rangle$ ``dot_avg`` ($\\gamma$); the loss's ``lower_bound`` in use ($f_*$, estimated on the
    fly with ``adapt_lower_bound``); steps taken ``count``."""

    mu: Any
    loss_avg: jax.Array
    dot_avg: jax.Array
    lower_bound: jax.Array
    count: Count


class ScaleByMomoAdamState(NamedTuple):
    """Adam's moments ``mu`` ($d$) and ``nu`` ($v$), the moving averages of the loss ``loss_avg`` ($\\bar f$) and
    of $\\langle g, x \\rangle$ ``dot_avg`` ($\\gamma$); the loss's ``lower_bound`` in use ($f_*$); steps taken
    ``count``."""

    mu: Any
    nu: NonNegativeField
    loss_avg: jax.Array
    dot_avg: jax.Array
    lower_bound: jax.Array
    count: Count


def _loss(call, loss, dtype):
    if loss is None:
        raise ValueError(f"{call} needs the loss: call update(updates, state, params, loss=loss) (optax's momo takes "
                         "it as value=; inside optax.chain, wrap the updax object in ux.to_optax so that optax "
                         "passes it on)")
    return scalar_input(call, "loss", loss).astype(dtype)


def _leaves(call, updates, params):
    real_only(call, updates)
    real_only(call, params, "params")
    return _tree.side_by_side(call, (updates, params), ("updates", "params"))


def _scalars(params, lower_bound):
    dtype = _scalar_dtype(params)  # (three buffers: the state may be donated)
    return dict(loss_avg=jnp.zeros([], dtype), dot_avg=jnp.zeros([], dtype), lower_bound=jnp.asarray(lower_bound, dtype))


def _step_size(*, loss_avg, dot_avg, dot, sq_norm, state_bound, lower_bound, learning_rate, decay,
               adapt_lower_bound, correction):
    """MoMo's step size $\\tau$ and the lower bound in use after the step, from the model's scalars.

    ``correction`` is Adam's first-moment bias correction $\\rho$ (1 for MoMo): the bound enters as $\\rho f_*$,
    the cap as $\\alpha / \\rho$."""
    shrink = 1 + learning_rate * decay
    level = loss_avg - dot_avg  # the model is level + <d, y> (Adam's: before its bias correction)
    if adapt_lower_bound:  # reset the estimate where the model at x is already below it
        cap = shrink * level + dot
        bound = jnp.where(cap < shrink * correction * state_bound,
                          jnp.maximum(cap / (2 * correction * shrink), lower_bound), state_bound)
    else:
        bound = jnp.asarray(lower_bound, loss_avg.dtype)
    polyak = _div(jnp.maximum(shrink * (level - correction * bound) + dot, 0), sq_norm)
    tau = jnp.minimum(learning_rate / correction, polyak)
    if adapt_lower_bound:
        bound = jnp.maximum((level + dot - tau * sq_norm / 2) / correction, lower_bound)
    return tau, bound.astype(loss_avg.dtype)


def _decayed(step, p, *, learning_rate, decay, decay_form):
    """``x - x_new`` for the step ``step`` (``tau d``, preconditioned for Adam) with weight decay."""
    shrink = 1 + learning_rate * decay
    if decay_form == "proximal":  # x_new = (x - step) / (1 + αλ)
        return (step + learning_rate * decay * p) / shrink
    return step + (learning_rate * decay / shrink) * p  # x_new = x / (1 + αλ) - step


# --------------------------------------------------------------------------
# MoMo


def _init_scale_by_momo(params, *, lower_bound):
    return ScaleByMomoState(mu=_tree.accumulators(params, None), **_scalars(params, lower_bound),
                            count=_tree.zero_count())


def _apply_scale_by_momo(updates, state, params, *, learning_rate, momentum, lower_bound, decay, adapt_lower_bound,
                         decay_form, loss=None):
    call = "scale_by_momo"
    dtype = state.loss_avg.dtype
    treedef, leaves = _leaves(call, updates, params)  # (complex updates refused before a missing loss)
    loss = _loss(call, loss, dtype)
    leaves = [(g, p, m) for (g, p), m in zip(leaves, treedef.flatten_up_to(state.mu))]
    beta = jnp.where(state.count == 0, 0.0, momentum)  # the averages start at the first loss and gradient
    mus, dots, sq_norms, grad_dots = [], [], [], []
    for g, p, m in leaves:
        c = m.dtype
        g32, p32 = g.astype(c), p.astype(c)
        m = beta * m + (1 - beta) * g32
        mus.append(m.astype(c))
        dots.append(jnp.sum(m * p32))
        sq_norms.append(jnp.sum(m * m))
        grad_dots.append(jnp.sum(g32 * p32))
    dot, sq_norm = _total(dots, dtype), _total(sq_norms, dtype)
    loss_avg = (beta * state.loss_avg + (1 - beta) * loss).astype(dtype)
    dot_avg = (beta * state.dot_avg + (1 - beta) * _total(grad_dots, dtype)).astype(dtype)
    tau, bound = _step_size(loss_avg=loss_avg, dot_avg=dot_avg, dot=dot, sq_norm=sq_norm,
                            state_bound=state.lower_bound, lower_bound=lower_bound, learning_rate=learning_rate,
                            decay=decay, adapt_lower_bound=adapt_lower_bound, correction=1)
    out = [_decayed(tau * m, p.astype(m.dtype), learning_rate=learning_rate, decay=decay,
                    decay_form=decay_form).astype(g.dtype) for (g, p, _), m in zip(leaves, mus)]
    return treedef.unflatten(out), ScaleByMomoState(mu=treedef.unflatten(mus), loss_avg=loss_avg, dot_avg=dot_avg,
                                                    lower_bound=bound, count=_tree.safe_increment(state.count))


@combinator
def scale_by_momo(learning_rate: ScalarOrSchedule = 1.0, momentum: ScalarOrSchedule = 0.9,
                  lower_bound: ScalarOrSchedule = 0.0, decay: ScalarOrSchedule = 0.0, adapt_lower_bound: bool = False,
                  decay_form: str = "proximal") -> Update:
    r"""Replaces updates by MoMo's step: SGD with momentum and a Polyak-type step size from the loss.

    Pass the loss to every call: ``opt.update(grads, state, params,
    loss=loss)`` (optax's keyword is ``value=``), a real scalar. Update rule
    (the paper's Algorithm 1), with $f$ the loss, $x$ the params, $\alpha$ =
    ``learning_rate``, $\beta$ = ``momentum``, $f_*$ = ``lower_bound``, $\lambda$ =
    ``decay`` and inner products and norms over all leaves together:

    $$
    \begin{align*}
    d &\gets \beta d + (1 - \beta) g \\
    \bar f &\gets \beta \bar f + (1 - \beta) f \\
    \gamma &\gets \beta \gamma + (1 - \beta) \langle g, x \rangle \\
    \tau &= \min\Bigl(\alpha, \frac{\bigl((1 + \alpha\lambda)(\bar f - f_* - \gamma) + \langle d, x \rangle\bigr)_+}
        {\lVert d \rVert^2}\Bigr) \\
    x' &= \frac{x - \tau d}{1 + \alpha\lambda}, \qquad u = x - x'
    \end{align*}
    $$

    The averages start at the first step's values ($\beta$ is 0 on the first
    call), as in the authors' implementation and optax. $x'$ minimises the
    model $\max(\bar f + \langle d, y - x \rangle - \gamma + \langle d, x \rangle, f_*)$ plus
    $\frac{\lambda}{2}\lVert y \rVert^2 + \frac{1}{2\alpha}\lVert y - x \rVert^2$: where the Polyak term
    is the smaller, the model at $x'$ is exactly $f_*$. Where $d = 0$ the step
    is 0 (the decay still applies). The emitted $u$ is the step along the
    gradient, so the descent step is $-u$ (:func:`updax.optimizers.momo`
    ends in ``scale(-1.0)``).

    With ``decay_form="decoupled"`` the decay is applied as optax 0.2.8's
    ``contrib.momo`` applies it: $x' = x / (1 + \alpha\lambda) - \tau d$, the step
    $\tau d$ not divided by $1 + \alpha\lambda$ (an AdamW-like decoupled decay, with
    the same $\tau$). It takes a step $1 + \alpha\lambda$ times the paper's, which
    lands below $f_*$ on the model when the Polyak term is active. With
    ``decay=0`` both forms are the same.

    With ``adapt_lower_bound=True`` $f_*$ is estimated on the fly (the
    paper's online estimate), never below ``lower_bound``: before the step,
    where $h = (1 + \alpha\lambda)(\bar f - \gamma) + \langle d, x \rangle$ falls below
    $(1 + \alpha\lambda) f_*$, $f_*$ is reset to $\max\bigl(h / (2(1 + \alpha\lambda)), f_\text{lb}\bigr)$;
    after it, $f_* = \max(\bar f - \gamma + \langle d, x \rangle - \frac{\tau}{2}\lVert d \rVert^2, f_\text{lb})$,
    with $f_\text{lb}$ = ``lower_bound``. The estimate is the state's ``lower_bound``.

    Args:
        learning_rate: the largest step size $\alpha$, >= 0, a number or a
            schedule. Default: ``1.0``.
        momentum: the averaging $\beta$ (optax's ``beta``), in [0, 1).
            Default: ``0.9``.
        lower_bound: a lower bound $f_*$ of the loss (0 for most losses),
            any real number, or a schedule. Default: ``0.0``.
        decay: the weight decay $\lambda$ (optax's ``weight_decay``), >= 0.
            Default: ``0.0``.
        adapt_lower_bound: estimate $f_*$ on the fly, from ``lower_bound``
            up. Default: ``False``.
        decay_form: ``"proximal"`` (the paper's) or ``"decoupled"``
            (optax's). Default: ``'proximal'``.

    Returns:
        An update object with state ``ScaleByMomoState(mu, loss_avg, dot_avg,
        lower_bound, count)``; ``update`` needs ``params`` and ``loss=``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_momo(learning_rate=10.0)
        >>> params = {"w": jnp.array([1.0, 2.0])}
        >>> u, state = opt.update({"w": jnp.array([2.0, 4.0])}, opt.init(params), params, loss=5.0)
        >>> u["w"]  # τ = f / ‖g‖² = 5 / 20: the model's zero, below the cap 10
        Array([0.5, 1. ], dtype=float32)

    References:
        Schaipp, Ohana, Eickenberg, Defazio & Gower, "MoMo: Momentum Models
        for Adaptive Learning Rates", ICML 2024, Algorithm 1.
        https://arxiv.org/abs/2305.07583
    """
    options = dict(learning_rate=learning_rate, momentum=momentum, lower_bound=lower_bound, decay=decay,
                   adapt_lower_bound=adapt_lower_bound, decay_form=decay_form)
    domains = dict(learning_rate=LEARNING_RATE, momentum=UNIT, lower_bound=ANY_REAL, decay=NON_NEGATIVE,
                   adapt_lower_bound=Flag(), decay_form=OneOf(_DECAY_FORMS))
    return stateful(_init_scale_by_momo, _apply_scale_by_momo, name="scale_by_momo", options=options,
                    domains=domains, needs_params=True,
                    schedulable=("learning_rate", "momentum", "lower_bound", "decay"))


# --------------------------------------------------------------------------
# MoMo-Adam


def _init_scale_by_momo_adam(params, *, lower_bound):
    return ScaleByMomoAdamState(mu=_tree.accumulators(params, None), nu=_tree.accumulators(params, None),
                                **_scalars(params, lower_bound), count=_tree.zero_count())


def _apply_scale_by_momo_adam(updates, state, params, *, learning_rate, b1, b2, eps, lower_bound, decay,
                              adapt_lower_bound, decay_form, loss=None):
    call = "scale_by_momo_adam"
    dtype = state.loss_avg.dtype
    treedef, leaves = _leaves(call, updates, params)  # (complex updates refused before a missing loss)
    loss = _loss(call, loss, dtype)
    leaves = [(g, p, m, v) for (g, p), m, v in zip(leaves, treedef.flatten_up_to(state.mu),
                                                  treedef.flatten_up_to(state.nu))]
    k = _tree.float_count(_tree.safe_increment(state.count)).astype(dtype)
    correction1, correction2 = 1 - b1**k, 1 - b2**k
    mus, nus, steps, dots, sq_norms, grad_dots = [], [], [], [], [], []
    for g, p, m, v in leaves:
        c = m.dtype
        g32, p32 = g.astype(c), p.astype(c)
        m = (b1 * m + (1 - b1) * g32).astype(c)
        v = (b2 * v + (1 - b2) * g32 * g32).astype(c)
        direction = m / (safe_sqrt(v / correction2) + eps)  # D⁻¹ d (a finite derivative at v = 0)
        mus.append(m)
        nus.append(v)
        steps.append(direction)
        dots.append(jnp.sum(m * p32))
        sq_norms.append(jnp.sum(m * direction))
        grad_dots.append(jnp.sum(g32 * p32))
    dot, sq_norm = _total(dots, dtype), _total(sq_norms, dtype)
    loss_avg = (b1 * state.loss_avg + (1 - b1) * loss).astype(dtype)
    dot_avg = (b1 * state.dot_avg + (1 - b1) * _total(grad_dots, dtype)).astype(dtype)
    tau, bound = _step_size(loss_avg=loss_avg, dot_avg=dot_avg, dot=dot, sq_norm=sq_norm,
                            state_bound=state.lower_bound, lower_bound=lower_bound, learning_rate=learning_rate,
                            decay=decay, adapt_lower_bound=adapt_lower_bound, correction=correction1)
    out = [_decayed(tau * s, p.astype(s.dtype), learning_rate=learning_rate, decay=decay,
                    decay_form=decay_form).astype(g.dtype) for (g, p, _, _), s in zip(leaves, steps)]
    return treedef.unflatten(out), ScaleByMomoAdamState(
        mu=treedef.unflatten(mus), nu=treedef.unflatten(nus), loss_avg=loss_avg, dot_avg=dot_avg, lower_bound=bound,
        count=_tree.safe_increment(state.count))


@combinator
def scale_by_momo_adam(learning_rate: ScalarOrSchedule = 1e-2, b1: ScalarOrSchedule = 0.9,
                       b2: ScalarOrSchedule = 0.999, eps: ScalarOrSchedule = 1e-8,
                       lower_bound: ScalarOrSchedule = 0.0, decay: ScalarOrSchedule = 0.0, adapt_lower_bound: bool = False,
                       decay_form: str = "proximal") -> Update:
    r"""Replaces updates by MoMo-Adam's step: Adam's direction with a Polyak-type step size from the loss.

    Pass the loss to every call: ``opt.update(grads, state, params,
    loss=loss)`` (optax's keyword is ``value=``), a real scalar. Update rule
    (the paper's Algorithm 2), for step $k = 1, 2, \ldots$, with $f$ the loss,
    $x$ the params, $\alpha$ = ``learning_rate``, $f_*$ = ``lower_bound``,
    $\lambda$ = ``decay``, $\epsilon$ = ``eps``, $\rho_k = 1 - \beta_1^k$ and inner products and
    norms over all leaves together:

    $$
    \begin{align*}
    d &\gets \beta_1 d + (1 - \beta_1) g \\
    v &\gets \beta_2 v + (1 - \beta_2) g^2 \\
    \bar f &\gets \beta_1 \bar f + (1 - \beta_1) f \\
    \gamma &\gets \beta_1 \gamma + (1 - \beta_1) \langle g, x \rangle \\
    D &= \sqrt{v / (1 - \beta_2^k)} + \epsilon \\
    \tau &= \min\Bigl(\frac{\alpha}{\rho_k}, \frac{\bigl((1 + \alpha\lambda)(\bar f - \rho_k f_* - \gamma)
        + \langle d, x \rangle\bigr)_+}{\langle d, D^{-1} d \rangle}\Bigr) \\
    x' &= \frac{x - \tau D^{-1} d}{1 + \alpha\lambda}, \qquad u = x - x'
    \end{align*}
    $$

    The averages start at 0 (hence $\rho_k$ on $f_*$ and on the cap). Where
    $d = 0$ the step is 0 (the decay still applies). The emitted $u$ is the
    step along the gradient, so the descent step is $-u$
    (:func:`updax.optimizers.momo_adam` ends in ``scale(-1.0)``).

    With ``decay_form="decoupled"`` the decay is applied as optax 0.2.8's
    ``contrib.momo_adam`` applies it ("in similar fashion to AdamW"):
    $x' = x / (1 + \alpha\lambda) - \tau D^{-1} d$, the step not divided by $1 + \alpha\lambda$.
    With ``decay=0`` both forms are the same.

    With ``adapt_lower_bound=True`` $f_*$ is estimated on the fly, never
    below ``lower_bound`` ($f_\text{lb}$): before the step, where
    $h = (1 + \alpha\lambda)(\bar f - \gamma) + \langle d, x \rangle$ falls below $(1 + \alpha\lambda)\rho_k f_*$,
    $f_*$ is reset to $\max\bigl(h / (2\rho_k(1 + \alpha\lambda)), f_\text{lb}\bigr)$; after it,
    $f_* = \max\bigl((\bar f - \gamma + \langle d, x \rangle - \frac{\tau}{2}\langle d, D^{-1} d \rangle) / \rho_k,
    f_\text{lb}\bigr)$.

    Args:
        learning_rate: the largest step size $\alpha$ (before the bias
            correction), >= 0, a number or a schedule. Default: ``0.01``.
        b1: first-moment decay, in [0, 1). Default: ``0.9``.
        b2: second-moment decay, in [0, 1). Default: ``0.999``.
        eps: added to the root of the second moment, >= 0. Default: ``1e-08``.
        lower_bound: a lower bound $f_*$ of the loss (0 for most losses),
            any real number, or a schedule. Default: ``0.0``.
        decay: the weight decay $\lambda$ (optax's ``weight_decay``), >= 0.
            Default: ``0.0``.
        adapt_lower_bound: estimate $f_*$ on the fly, from ``lower_bound``
            up. Default: ``False``.
        decay_form: ``"proximal"`` (the paper's) or ``"decoupled"``
            (optax's). Default: ``'proximal'``.

    Returns:
        An update object with state ``ScaleByMomoAdamState(mu, nu, loss_avg,
        dot_avg, lower_bound, count)``; ``update`` needs ``params`` and
        ``loss=``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_momo_adam(learning_rate=1.0, eps=0.0)
        >>> params = {"w": jnp.array([0.0, 0.0])}
        >>> u, state = opt.update({"w": jnp.array([3.0, -4.0])}, opt.init(params), params, loss=0.7)
        >>> u["w"]  # D⁻¹d = sign(g)/10, τ = f̄ / ⟨d, D⁻¹d⟩ = 0.07 / 0.07 = 1, below the cap α/ρ = 10
        Array([ 0.1, -0.1], dtype=float32)

    References:
        Schaipp, Ohana, Eickenberg, Defazio & Gower, "MoMo: Momentum Models
        for Adaptive Learning Rates", ICML 2024, Algorithm 2.
        https://arxiv.org/abs/2305.07583
    """
    options = dict(learning_rate=learning_rate, b1=b1, b2=b2, eps=eps, lower_bound=lower_bound, decay=decay,
                   adapt_lower_bound=adapt_lower_bound, decay_form=decay_form)
    domains = dict(learning_rate=LEARNING_RATE, b1=UNIT, b2=UNIT, eps=NON_NEGATIVE, lower_bound=ANY_REAL,
                   decay=NON_NEGATIVE, adapt_lower_bound=Flag(), decay_form=OneOf(_DECAY_FORMS))
    return stateful(_init_scale_by_momo_adam, _apply_scale_by_momo_adam, name="scale_by_momo_adam", options=options,
                    domains=domains, needs_params=True,
                    schedulable=("learning_rate", "b1", "b2", "eps", "lower_bound", "decay"))
