"""Learning-rate-free rules: the step size comes from the run itself.

Distance estimates (Prodigy, D-Adaptation, DoG, DoWG), coin betting (COCOB),
Polyak's step from the loss, and Mechanic's learned scale around any
pipeline. Defaults are the papers' where they fix one, else optax's (each
docstring says which). Scalar estimates are kept in at least float32 (float64
with float64 params), and each stage that needs the starting point keeps a
copy of the params it was initialised with (``init_params``): ``init`` must
get the real params, not a template.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import (ANY_REAL, LEARNING_RATE, NON_NEGATIVE, POSITIVE, UNIT, Count, Flag, Integer,
                            NonNegativeField, OneOf, Pipeline, Valid, scalar_input)
from updax._masks import Mask, leaf_mask
from updax._primitives import stateful, stateless
from updax._typing import PyTree, ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import (
    abs_sq,
    bias_corrections,
    filled,
    number,
    real_only,
    safe_sqrt,
    scaled,
)

# --------------------------------------------------------------------------
# States


class ScaleByProdigyState(NamedTuple):
    """Adam's moments of the scaled updates ``mu`` and ``nu``, the weighted sum of updates ``grad_sum``, the
    starting point ``init_params``, the distance estimate ``estim_lr`` (the ``d`` of the paper), the weighted
    sum ``numerator`` of its numerator, steps taken ``count``."""

    mu: Any
    nu: NonNegativeField
    grad_sum: Any
    init_params: Any
    estim_lr: Annotated[jax.Array, POSITIVE]
    numerator: jax.Array
    count: Count


class ScaleByDadaptAdamwState(NamedTuple):
    """Adam's moments ``mu`` and ``nu``, the weighted sum of updates ``grad_sum``, the distance estimate
    ``estim_lr`` (the ``d`` of the paper), the weighted sum ``numerator`` of its numerator, steps taken ``count``."""

    mu: Any
    nu: NonNegativeField
    grad_sum: Any
    estim_lr: Annotated[jax.Array, POSITIVE]
    numerator: jax.Array
    count: Count


class ScaleByDogState(NamedTuple):
    """The starting point ``init_params``, the largest distance from it so far ``max_dist``, the sum of the
    squared update norms ``sum_sq_norm_grads``, steps taken ``count``."""

    init_params: Any
    max_dist: NonNegativeField
    sum_sq_norm_grads: NonNegativeField
    count: Count


class ScaleByDowgState(NamedTuple):
    """The starting point ``init_params``, the largest squared distance from it so far ``estim_sq_dist``, the
    sum of the squared update norms weighted by it ``weighted_sq_norm_grads``."""

    init_params: Any
    estim_sq_dist: NonNegativeField
    weighted_sq_norm_grads: NonNegativeField


class ScaleByCocobState(NamedTuple):
    """Per coordinate: the starting point ``init_params``, the sum of the updates ``sum_grads``, the largest
    absolute update ``max_abs_grad``, the sum of the absolute updates ``sum_abs_grads`` and the ``reward``."""

    init_params: Any
    sum_grads: Any
    max_abs_grad: NonNegativeField
    sum_abs_grads: NonNegativeField
    reward: NonNegativeField


class MechanizeState(NamedTuple):
    """The wrapped pipeline's state ``inner``, the point the scale multiplies from ``init_params``, and per
    decay ``betas``: the scale ``s``, the ``reward`` ``r``, the largest correlation ``m`` and the sum of its
    squares ``v``; steps taken ``count``."""

    inner: tuple
    init_params: Any
    s: NonNegativeField
    r: jax.Array
    m: NonNegativeField
    v: NonNegativeField
    count: Count


# --------------------------------------------------------------------------
# Shared: global sums in the scalar dtype, leaves side by side, guarded division


def _scalar_dtype(tree):
    """The dtype of a stage's scalar estimates: the params' compute dtype (at least float32), real."""
    return jnp.finfo(_tree.compute_dtype(*(jnp.result_type(x) for x in jax.tree.leaves(tree)))).dtype


def _total(values, dtype):
    """The sum of some scalars, in ``dtype``."""
    return sum((v.astype(dtype) for v in values), jnp.zeros([], dtype))


def _sq_norm(tree, dtype):
    """``‖tree‖²`` over all leaves, real, in ``dtype``."""
    return _total([jnp.sum(abs_sq(x.astype(_tree.compute_dtype(x.dtype)))) for x in jax.tree.leaves(tree)], dtype)


def _div(a, b):
    """``a / b``, and 0 where ``b`` is 0 (a double where: the discarded branch keeps its gradient finite)."""
    nonzero = b != 0
    return jnp.where(nonzero, a / jnp.where(nonzero, b, 1.0), jnp.zeros_like(a))


def _div_positive(a, b, eps):
    """``_div(a, b)`` for ``b = root + eps`` with ``root >= 0``: a plain division when ``eps`` is a positive
    number (``b`` is never 0 then), which saves a comparison and two selects per element."""
    return a / b if (number(eps) or 0) > 0 else _div(a, b)


def _copy(call, params):
    """A copy of the params (at least float32), placed like them."""
    return filled(call, params, params, None)


def _distance_sq(call, params, init_params, dtype):
    """``‖params - init_params‖²``, in ``dtype``."""
    _, leaves = _tree.side_by_side(call, (params, init_params), ("params", "state.init_params"))
    return _total([jnp.sum(abs_sq(p.astype(x0.dtype) - x0)) for p, x0 in leaves], dtype)


def _optional_unit(call, name, value):
    return None if value is None else UNIT.check(call, name, value)


def _optional_positive(call, name, value):
    return None if value is None else POSITIVE.check(call, name, value)


#: What the options of the distance-estimating Adam stages (Prodigy, D-Adaptation) hold.
_DISTANCE_DOMAINS = dict(learning_rate=LEARNING_RATE, b1=UNIT, b2=UNIT,
                         b3=Valid(rule=_optional_unit, text="must be None or in [0, 1)", values=UNIT),
                         eps=NON_NEGATIVE, estim_lr0=POSITIVE, estim_lr_coef=NON_NEGATIVE, decay=NON_NEGATIVE,
                         safeguard_warmup=Flag(), mask=Mask())


def _needs_loss(call, loss):
    if loss is None:
        raise ValueError(f"{call} needs the loss: call update(updates, state, params, loss=loss) (optax's polyak "
                         "takes it as value=; inside optax.chain, wrap the updax object in ux.to_optax so that "
                         "optax passes it on)")


# --------------------------------------------------------------------------
# Prodigy


def _init_scale_by_prodigy(params, *, estim_lr0):
    dtype = _scalar_dtype(params)
    return ScaleByProdigyState(mu=_tree.accumulators(params, None), nu=_tree.accumulators(params, None),
                               grad_sum=_tree.accumulators(params, None), init_params=_copy("scale_by_prodigy", params),
                               estim_lr=jnp.asarray(estim_lr0, dtype), numerator=jnp.zeros([], dtype),
                               count=_tree.zero_count())


def _apply_scale_by_prodigy(updates, state, params, *, learning_rate, b1, b2, b3, eps, estim_lr0, estim_lr_coef,
                            decay, safeguard_warmup, mask):
    call = "scale_by_prodigy"
    real_only(call, updates)
    count = _tree.safe_increment(state.count)
    c1, c2 = bias_corrections(count, b1, b2)
    b3 = jnp.sqrt(b2) if b3 is None else b3
    d = state.estim_lr
    dlr = d * learning_rate * jnp.sqrt(c2) / c1  # d·γ with Adam's bias correction folded in
    weight = (d / estim_lr0) * (d if safeguard_warmup else dlr)
    treedef, leaves = _tree.side_by_side(
        call, (updates, state.mu, state.nu, state.grad_sum, state.init_params, params),
        ("updates", "state.mu", "state.nu", "state.grad_sum", "state.init_params", "params"))
    mus, nus, sums, dots, l1 = [], [], [], [], []
    for g, m, v, s, x0, p in leaves:
        c = _tree.compute_dtype(g.dtype, m.dtype, v.dtype, s.dtype, x0.dtype, p.dtype)
        g32 = g.astype(c)
        dots.append(jnp.sum(g32 * (x0.astype(c) - p.astype(c))))
        mus.append(b1 * m.astype(c) + (1 - b1) * d * g32)
        nus.append(b2 * v.astype(c) + (1 - b2) * d * d * g32 * g32)
        sums.append(b3 * s.astype(c) + weight * g32)
        l1.append(jnp.sum(jnp.abs(sums[-1])))
    dtype = d.dtype
    numerator = b3 * state.numerator + (d / estim_lr0) * dlr * _total(dots, dtype)
    denominator = _total(l1, dtype)
    estim_lr = jnp.where(denominator > 0, jnp.maximum(d, estim_lr_coef * _div(numerator, denominator)), d)
    decays = leaf_mask(call, mask, params)
    roots = safe_sqrt(nus)  # (one call for the tree: safe_sqrt traces a sub-program per call)
    no_decay = number(decay) == 0  # (a decay of the number 0 adds no term)
    out = []
    for (g, *_, p), m, root, decays in zip(leaves, mus, roots, decays):
        step = _div(m, root + estim_lr * eps)
        if not no_decay:
            step = step + (decay * p.astype(m.dtype) if decays else 0)
        out.append((dlr * step).astype(g.dtype))
    stored = [[x.astype(leaf[i].dtype) for x, leaf in zip(xs, leaves)] for i, xs in ((1, mus), (2, nus), (3, sums))]
    mu, nu, grad_sum = (treedef.unflatten(xs) for xs in stored)
    return treedef.unflatten(out), ScaleByProdigyState(
        mu=mu, nu=nu, grad_sum=grad_sum, init_params=state.init_params, estim_lr=estim_lr.astype(dtype),
        numerator=numerator.astype(dtype), count=count)


@combinator
def scale_by_prodigy(learning_rate: ScalarOrSchedule = 1.0, b1: ScalarOrSchedule = 0.9,
                     b2: ScalarOrSchedule = 0.999, b3: ScalarOrSchedule | None = None, eps: ScalarOrSchedule = 1e-8,
                     estim_lr0: float = 1e-6, estim_lr_coef: ScalarOrSchedule = 1.0, decay: ScalarOrSchedule = 0.0,
                     safeguard_warmup: bool = False, *,
                     mask: PyTree | Callable[[PyTree], PyTree] | None = None) -> Update:
    r"""Scales updates by Prodigy's AdamW step, with the distance to the solution estimated on the fly.

    Update rule, for step $t$ (counting from 1), with $x$ the params, $x_0$ the params ``init`` got,
    $\gamma$ = ``learning_rate``, $d$ the distance estimate starting at $d_0$ = ``estim_lr0``,
    $b_1$ = ``b1``, $b_2$ = ``b2``, $b_3$ = ``b3``, $\epsilon$ = ``eps``, $\kappa$ = ``estim_lr_coef``,
    $\omega$ = ``decay``:

    $$
    \begin{align*}
    \lambda &= d \gamma \sqrt{1 - b_2^t} / (1 - b_1^t) \\
    m &\gets b_1 m + (1 - b_1)\, d g \\
    v &\gets b_2 v + (1 - b_2)\, d^2 g^2 \\
    s &\gets b_3 s + (d / d_0)\, \lambda g \\
    r &\gets b_3 r + (d / d_0)\, \lambda \langle g, x_0 - x \rangle \\
    d &\gets \max(d, \kappa r / \lVert s \rVert_1) \\
    u &= \lambda \bigl(m / (\sqrt{v} + d \epsilon) + \omega x\bigr)
    \end{align*}
    $$

    (the decay term $\omega x$ on the leaves ``mask`` selects). The emitted $u$ is the step's size, so the
    descent step is $-u$ (:func:`updax.optimizers.prodigy` ends in ``scale(-1.0)``). As in the
    authors' implementation (and optax), $\lambda$ carries Adam's bias
    correction and the step's $\epsilon$ term the new $d$; with
    ``safeguard_warmup`` the sum $s$ takes $(d / d_0)\, d g$ (no $\gamma$). While
    $\lVert s \rVert_1$ is 0 (zero updates so far) $d$ stays as it is, where optax
    divides 0 by 0.

    Args:
        learning_rate: the schedule $\gamma$, a multiplier of the estimated
            step, >= 0; best 1 at its peak. Default: ``1.0``.
        b1: decay of the first moment, in [0, 1). Default: ``0.9``.
        b2: decay of the second moment, in [0, 1). Default: ``0.999``.
        b3: decay of $s$ and $r$, None for $\sqrt{b_2}$, or in [0, 1).
            Default: ``None``.
        eps: added to the denominator (times $d$), >= 0. Default: ``1e-08``.
        estim_lr0: the initial (under-)estimate $d_0$ of the distance, > 0.
            Default: ``1e-06``.
        estim_lr_coef: multiplies each new estimate, >= 0. Default: ``1.0``.
        decay: decoupled weight decay (scaled by $\lambda$), >= 0; the number 0
            adds no term to the step. Default: ``0.0``.
        safeguard_warmup: leave $\gamma$ out of $s$, for schedules that warm
            up from 0. Default: ``False``.
        mask: which leaves decay: a pytree of bools shaped like the params
            (or a prefix of it), or a function of the params returning one;
            None decays every leaf. Default: ``None``.

    Returns:
        An update object with state ``ScaleByProdigyState(mu, nu, grad_sum,
        init_params, estim_lr, numerator, count)``; ``update`` needs
        ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_prodigy()
        >>> params = {"w": jnp.array([1.0, -2.0])}
        >>> state = opt.init(params)
        >>> u, state = opt.update({"w": jnp.array([0.5, -0.5])}, state, params)
        >>> u["w"]  # the first step is d₀·sign(g), up to eps
        Array([ 1.e-06, -1.e-06], dtype=float32)

    References:
        Mishchenko & Defazio, "Prodigy: An Expeditiously Adaptive
        Parameter-Free Learner", ICML 2024. https://arxiv.org/abs/2306.06101
    """
    options = dict(learning_rate=learning_rate, b1=b1, b2=b2, b3=b3, eps=eps, estim_lr0=estim_lr0,
                   estim_lr_coef=estim_lr_coef, decay=decay, safeguard_warmup=safeguard_warmup, mask=mask)
    return stateful(_init_scale_by_prodigy, _apply_scale_by_prodigy, name="scale_by_prodigy", options=options,
                    domains={k: _DISTANCE_DOMAINS[k] for k in options}, needs_params=True,
                    schedulable=("learning_rate", "b1", "b2", "b3", "eps", "estim_lr_coef", "decay"))


# --------------------------------------------------------------------------
# D-Adaptation (AdamW)


def _init_scale_by_dadapt_adamw(params, *, estim_lr0):
    dtype = _scalar_dtype(params)
    return ScaleByDadaptAdamwState(mu=_tree.accumulators(params, None), nu=_tree.accumulators(params, None),
                                   grad_sum=_tree.accumulators(params, None), estim_lr=jnp.asarray(estim_lr0, dtype),
                                   numerator=jnp.zeros([], dtype), count=_tree.zero_count())


def _apply_scale_by_dadapt_adamw(updates, state, params, *, learning_rate, b1, b2, eps, decay, mask):
    return dadapt_adamw_step(updates, state, params, learning_rate, b1, b2, eps, decay, mask)


def _itself(read_first, old, new):
    return new


def dadapt_adamw_step(updates, state, params, learning_rate, b1, b2, eps, decay, mask, written=_itself):
    """D-Adaptation's step. ``written(read_first, old, new)`` returns ``new``, a state leaf whose old value the
    reductions read: the same values, which a backend's path writes after ``read_first`` (a scalar computed from
    those reductions)."""
    call = "scale_by_dadapt_adamw"
    real_only(call, updates)
    count = _tree.safe_increment(state.count)
    c1, c2 = bias_corrections(count, b1, b2)
    sb2 = jnp.sqrt(b2)
    d = state.estim_lr
    dlr = d * learning_rate * jnp.sqrt(c2) / c1
    treedef, leaves = _tree.side_by_side(call, (updates, state.mu, state.nu, state.grad_sum, params),
                                         ("updates", "state.mu", "state.nu", "state.grad_sum", "params"))
    outs, mus, nus, sums, dots, l1s = [], [], [], [], [], []
    for stored, decays in zip(leaves, leaf_mask(call, mask, params)):
        c = _tree.compute_dtype(*(x.dtype for x in stored))
        g, m, v_old, s_old, p = (_tree.cast(x, c) for x in stored)
        g_in, m_in, v_in, s_in, _ = stored
        dot = jnp.sum(g * _div_positive(s_old, safe_sqrt(v_old) + eps, eps))  # <g, s>, weighted by the old v
        m = b1 * m + (1 - b1) * dlr * g
        v = b2 * v_old + (1 - b2) * g * g
        s = sb2 * s_old + (1 - sb2) * dlr * g
        l1 = jnp.sum(jnp.abs(s))
        u = _div_positive(m, safe_sqrt(v) + eps, eps)
        if number(decay) != 0:  # (a decay of the number 0 adds no term)
            u = u + decay * dlr * p if decays else u + 0.0
        outs.append(_tree.cast(u, g_in.dtype))
        mus.append(m.astype(m_in.dtype))
        nus.append(written(dot, v_in, v.astype(v_in.dtype)))
        sums.append(written(dot + l1, s_in, s.astype(s_in.dtype)))
        dots.append(dot)
        l1s.append(l1)
    dtype = d.dtype
    numerator = sb2 * state.numerator + (1 - sb2) * dlr * _total(dots, dtype)
    denominator = (1 - sb2) * _total(l1s, dtype)
    estim_lr = jnp.where(denominator > 0, jnp.maximum(d, _div(numerator, denominator)), d)
    return treedef.unflatten(outs), ScaleByDadaptAdamwState(
        mu=treedef.unflatten(mus), nu=treedef.unflatten(nus), grad_sum=treedef.unflatten(sums),
        estim_lr=estim_lr.astype(dtype), numerator=numerator.astype(dtype), count=count)


@combinator
def scale_by_dadapt_adamw(learning_rate: ScalarOrSchedule = 1.0, b1: ScalarOrSchedule = 0.9,
                          b2: ScalarOrSchedule = 0.999, eps: ScalarOrSchedule = 1e-8, estim_lr0: float = 1e-6,
                          decay: ScalarOrSchedule = 0.0, *,
                          mask: PyTree | Callable[[PyTree], PyTree] | None = None) -> Update:
    r"""Scales updates by D-Adaptation's AdamW step, the distance to the solution estimated on the fly.

    Update rule, for step $t$ (counting from 1), with $x$ the params, $\gamma$ = ``learning_rate``, $d$ the
    distance estimate starting at $d_0$ = ``estim_lr0``, $b_1$ = ``b1``, $b_2$ = ``b2``, $\beta = \sqrt{b_2}$,
    $\epsilon$ = ``eps``, $\omega$ = ``decay``:

    $$
    \begin{align*}
    \lambda &= d \gamma \sqrt{1 - b_2^t} / (1 - b_1^t) \\
    r &\gets \beta r + (1 - \beta)\, \lambda \langle g, s / (\sqrt{v} + \epsilon) \rangle \\
    m &\gets b_1 m + (1 - b_1)\, \lambda g \\
    v &\gets b_2 v + (1 - b_2)\, g^2 \\
    s &\gets \beta s + (1 - \beta)\, \lambda g \\
    d &\gets \max\bigl(d, r / ((1 - \beta) \lVert s \rVert_1)\bigr) \\
    u &= m / (\sqrt{v} + \epsilon) + \omega \lambda x
    \end{align*}
    $$

    ($r$ reads the old $s$ and $v$; the decay term $\omega \lambda x$ on the leaves ``mask`` selects.)
    The emitted $u$ is the step itself, $\gamma$ included (each step's $\lambda$
    weighs its update into $m$), so the descent step is $-u$
    (:func:`updax.optimizers.dadapt_adamw` ends in ``scale(-1.0)``). As in
    the authors' implementation (and optax), $\lambda$ carries Adam's bias
    correction. While $\lVert s \rVert_1$ is 0, $d$ stays as it is, where optax
    divides 0 by 0.

    Args:
        learning_rate: the schedule $\gamma$, a multiplier of the estimated
            step, >= 0; best 1 at its peak. Default: ``1.0``.
        b1: decay of the first moment, in [0, 1). Default: ``0.9``.
        b2: decay of the second moment, in [0, 1). Default: ``0.999``.
        eps: added to the denominator, >= 0. Default: ``1e-08``.
        estim_lr0: the initial (under-)estimate $d_0$ of the distance, > 0.
            Default: ``1e-06``.
        decay: decoupled weight decay (scaled by $\lambda$), >= 0; the number 0
            adds no term (an infinite param then leaves the update finite).
            Default: ``0.0``.
        mask: which leaves decay: a pytree of bools shaped like the params
            (or a prefix of it), or a function of the params returning one;
            None decays every leaf. Default: ``None``.

    Returns:
        An update object with state ``ScaleByDadaptAdamwState(mu, nu,
        grad_sum, estim_lr, numerator, count)``; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_dadapt_adamw()
        >>> params = {"w": jnp.array([1.0, -2.0])}
        >>> u, state = opt.update({"w": jnp.array([0.5, -0.5])}, opt.init(params), params)
        >>> u["w"]  # the first step is d₀·sign(g), up to eps
        Array([ 1.e-06, -1.e-06], dtype=float32)

    References:
        Defazio & Mishchenko, "Learning-Rate-Free Learning by D-Adaptation",
        ICML 2023. https://arxiv.org/abs/2301.07733
    """
    options = dict(learning_rate=learning_rate, b1=b1, b2=b2, eps=eps, estim_lr0=estim_lr0, decay=decay, mask=mask)
    return stateful(_init_scale_by_dadapt_adamw, _apply_scale_by_dadapt_adamw, name="scale_by_dadapt_adamw",
                    options=options, domains={k: _DISTANCE_DOMAINS[k] for k in options}, needs_params=True,
                    schedulable=("learning_rate", "b1", "b2", "eps", "decay"), state_last=("nu",))


# --------------------------------------------------------------------------
# DoG and DoWG

_DOG_INIT_STEPS = ("heuristic", "distance", "learning_rate")


def _init_scale_by_dog(params, *, init_step, init_step_type):
    dtype = _scalar_dtype(params)
    if init_step_type == "heuristic":
        r_eps = init_step * (1 + safe_sqrt(_sq_norm(params, dtype)))
    else:
        r_eps = init_step if init_step_type == "distance" else 0.0
    return ScaleByDogState(init_params=_copy("scale_by_dog", params), max_dist=jnp.asarray(r_eps, dtype),
                           sum_sq_norm_grads=jnp.zeros([], dtype), count=_tree.zero_count())


def _apply_scale_by_dog(updates, state, params, *, init_step, init_step_type, eps):
    call = "scale_by_dog"
    dtype = state.max_dist.dtype
    dist = safe_sqrt(_distance_sq(call, params, state.init_params, dtype))
    max_dist = jnp.maximum(state.max_dist, dist)
    sum_sq = state.sum_sq_norm_grads + _sq_norm(updates, dtype)
    step = _div(max_dist, safe_sqrt(sum_sq + eps))
    if init_step_type == "learning_rate":
        step = jnp.where(state.count == 0, jnp.asarray(init_step, dtype), step)
    out = _tree.tree_map(call, lambda g: scaled(g, step), updates)
    return out, ScaleByDogState(init_params=state.init_params, max_dist=max_dist.astype(dtype),
                                sum_sq_norm_grads=sum_sq.astype(dtype), count=_tree.safe_increment(state.count))


@combinator
def scale_by_dog(init_step: float = 1e-6, init_step_type: str = "heuristic", eps: ScalarOrSchedule = 1e-8) -> Update:
    r"""Scales updates by DoG's step: the distance travelled over the root of the summed squared norms.

    Update rule, with $x$ the params, $x_0$ the params ``init`` got, $\epsilon$ = ``eps``:

    $$
    \begin{align*}
    \bar r &\gets \max(\bar r, \lVert x - x_0 \rVert) \\
    G &\gets G + \lVert g \rVert^2 \\
    u &= \bar r / \sqrt{G + \epsilon} \cdot g
    \end{align*}
    $$

    $\bar r$ starts at $r_\epsilon$, with $\alpha$ = ``init_step``: with ``init_step_type="heuristic"``
    $r_\epsilon = \alpha (1 + \lVert x_0 \rVert)$ (the paper's suggestion, with
    ``init_step`` 1e-6, or 1e-4 with batch normalization); with
    ``"distance"`` $r_\epsilon = \alpha$; with ``"learning_rate"`` the first
    step is $\alpha g$ and $r_\epsilon = 0$. The norms are global, over all
    leaves. The authors recommend averaging the iterates (e.g.
    :func:`updax.ema_params`).

    Args:
        init_step: the initial step's value, > 0 (see above). Default: ``1e-06``.
        init_step_type: ``"heuristic"``, ``"distance"`` or ``"learning_rate"``.
            Default: ``'heuristic'``.
        eps: added to $G$, >= 0. Default: ``1e-08``.

    Returns:
        An update object with state ``ScaleByDogState(init_params, max_dist,
        sum_sq_norm_grads, count)``; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_dog(init_step=0.5, init_step_type="distance", eps=0.0)
        >>> params = {"w": jnp.array([1.0, -2.0])}
        >>> u, state = opt.update({"w": jnp.array([3.0, 4.0])}, opt.init(params), params)
        >>> u["w"]  # r̄ / ‖g‖ = 0.5 / 5
        Array([0.3, 0.4], dtype=float32)

    References:
        Ivgi, Hinder & Carmon, "DoG is SGD's Best Friend: A Parameter-Free
        Dynamic Step Size Schedule", ICML 2023. https://arxiv.org/abs/2302.12022
    """
    return stateful(_init_scale_by_dog, _apply_scale_by_dog, name="scale_by_dog",
                    options=dict(init_step=init_step, init_step_type=init_step_type, eps=eps),
                    domains=dict(init_step=POSITIVE, init_step_type=OneOf(_DOG_INIT_STEPS), eps=NON_NEGATIVE),
                    needs_params=True, schedulable=("eps",))


def _init_scale_by_dowg(params, *, init_estim_sq_dist, eps):
    dtype = _scalar_dtype(params)
    start = eps if init_estim_sq_dist is None else init_estim_sq_dist
    return ScaleByDowgState(init_params=_copy("scale_by_dowg", params), estim_sq_dist=jnp.asarray(start, dtype),
                            weighted_sq_norm_grads=jnp.zeros([], dtype))


def _apply_scale_by_dowg(updates, state, params, *, eps):
    call = "scale_by_dowg"
    dtype = state.estim_sq_dist.dtype
    sq_dist = jnp.maximum(state.estim_sq_dist, _distance_sq(call, params, state.init_params, dtype))
    weighted = state.weighted_sq_norm_grads + sq_dist * _sq_norm(updates, dtype)
    step = _div(sq_dist, safe_sqrt(weighted) + eps)
    out = _tree.tree_map(call, lambda g: scaled(g, step), updates)
    return out, ScaleByDowgState(init_params=state.init_params, estim_sq_dist=sq_dist.astype(dtype),
                                 weighted_sq_norm_grads=weighted.astype(dtype))


@combinator
def scale_by_dowg(init_estim_sq_dist: float | None = None, eps: ScalarOrSchedule = 1e-4) -> Update:
    r"""Scales updates by DoWG's step: the squared distance travelled over the weighted norms' root.

    Update rule, with $x$ the params, $x_0$ the params ``init`` got, $\epsilon$ = ``eps``:

    $$
    \begin{align*}
    \bar r^2 &\gets \max(\bar r^2, \lVert x - x_0 \rVert^2) \\
    v &\gets v + \bar r^2 \lVert g \rVert^2 \\
    u &= \bar r^2 / (\sqrt{v} + \epsilon) \cdot g
    \end{align*}
    $$

    $\bar r^2$ starts at ``init_estim_sq_dist`` ($\epsilon$ when None). The norms
    are global, over all leaves.

    Args:
        init_estim_sq_dist: the initial guess of the squared distance to the
            solution, None (``eps``) or > 0. Default: ``None``.
        eps: added to the denominator, and the initial guess when
            ``init_estim_sq_dist`` is None, > 0. Default: ``0.0001``.

    Returns:
        An update object with state ``ScaleByDowgState(init_params,
        estim_sq_dist, weighted_sq_norm_grads)``; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_dowg(init_estim_sq_dist=4.0)
        >>> params = {"w": jnp.array([1.0, -2.0])}
        >>> u, state = opt.update({"w": jnp.array([3.0, 4.0])}, opt.init(params), params)
        >>> u["w"]  # r̄² / (r̄·‖g‖ + eps) = 4 / 10.0001
        Array([1.19999, 1.59998], dtype=float32)

    References:
        Khaled, Mishchenko & Jin, "DoWG Unleashed: An Efficient Universal
        Parameter-Free Gradient Descent Method", NeurIPS 2023.
        https://arxiv.org/abs/2305.16284
    """
    domains = dict(init_estim_sq_dist=Valid(rule=_optional_positive, text="must be None or in (0, inf)",
                                            values=POSITIVE), eps=POSITIVE)
    return stateful(_init_scale_by_dowg, _apply_scale_by_dowg, name="scale_by_dowg",
                    options=dict(init_estim_sq_dist=init_estim_sq_dist, eps=eps), domains=domains,
                    needs_params=True, schedulable=("eps",))


# --------------------------------------------------------------------------
# COCOB


def _init_scale_by_cocob(params, *, eps):
    return ScaleByCocobState(init_params=_copy("scale_by_cocob", params), sum_grads=_tree.accumulators(params, None),
                             max_abs_grad=_tree.accumulators(params, None, eps),
                             sum_abs_grads=_tree.accumulators(params, None), reward=_tree.accumulators(params, None))


def _apply_scale_by_cocob(updates, state, params, *, alpha):
    return cocob_step(updates, state, params, alpha)


def cocob_step(updates, state, params, alpha, rewarded=list):
    """COCOB's step. ``rewarded(rewards)`` returns the new rewards, one per leaf, the same values: a backend's path
    has XLA compute them apart (the params' update reads them, and they read the old params)."""
    call = "scale_by_cocob"
    real_only(call, updates)
    treedef, leaves = _tree.side_by_side(
        call, (updates, state.sum_grads, state.max_abs_grad, state.sum_abs_grads, state.reward, params,
               state.init_params),
        ("updates", "state.sum_grads", "state.max_abs_grad", "state.sum_abs_grads", "state.reward", "params",
         "state.init_params"))
    wide = [[_tree.cast(x, _tree.compute_dtype(*(x.dtype for x in leaf))) for x in leaf] for leaf in leaves]
    rewards = rewarded([jnp.maximum(reward - g * (x - x0), 0.0) for g, _, _, _, reward, x, x0 in wide])
    new = []
    for (g, theta, big_l, big_g, _, x, x0), reward, stored in zip(wide, rewards, leaves):
        theta = theta + g
        big_l = jnp.maximum(big_l, jnp.abs(g))
        big_g = big_g + jnp.abs(g)
        bet = _div(theta * (big_l + reward), big_l * jnp.maximum(big_g + big_l, alpha * big_l))
        u = x0 - bet - x
        new.append([value.astype(like.dtype) for value, like in zip((u, theta, big_l, big_g, reward), stored)])
    out, sum_grads, max_abs, sum_abs, reward = (treedef.unflatten([leaf[i] for leaf in new]) for i in range(5))
    return out, ScaleByCocobState(init_params=state.init_params, sum_grads=sum_grads, max_abs_grad=max_abs,
                                  sum_abs_grads=sum_abs, reward=reward)


@combinator
def scale_by_cocob(alpha: ScalarOrSchedule = 100.0, eps: float = 1e-8) -> Update:
    r"""Replaces updates by COCOB-Backprop's step: coordinate-wise coin betting from the starting point.

    Update rule, per coordinate, with $x$ the params, $x_0$ the params ``init`` got, $\alpha$ = ``alpha``:

    $$
    \begin{align*}
    L &\gets \max(L, |g|) \\
    G &\gets G + |g| \\
    \theta &\gets \theta + g \\
    R &\gets \max\bigl(R - g (x - x_0), 0\bigr) \\
    x' &= x_0 - \frac{\theta}{L \max(G + L, \alpha L)} (L + R) \\
    u &= x' - x
    \end{align*}
    $$

    The emitted $u$ is the step itself (descent included): it ends a
    pipeline (:func:`updax.optimizers.cocob` scales the gradients before
    it). $L$ starts at ``eps`` rather than the paper's 0, so that a zero
    first update divides nothing by 0 (as optax).

    Args:
        alpha: bounds the bet by $1 / (\alpha L)$ early on, > 0. Default: ``100.0``.
        eps: the initial $L$, > 0. Default: ``1e-08``.

    Returns:
        An update object with state ``ScaleByCocobState(init_params,
        sum_grads, max_abs_grad, sum_abs_grads, reward)``; ``update`` needs
        ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_cocob(alpha=4.0)
        >>> params = {"w": jnp.array([1.0, -2.0])}
        >>> u, state = opt.update({"w": jnp.array([2.0, -0.5])}, opt.init(params), params)
        >>> u["w"]  # -θ/(L·alpha·L)·L = -g/(alpha·|g|)
        Array([-0.25,  0.25], dtype=float32)

    References:
        Orabona & Tommasi, "Training Deep Networks without Learning Rates
        Through Coin Betting", NeurIPS 2017, Algorithm 2.
        https://arxiv.org/abs/1705.07795
    """
    return stateful(_init_scale_by_cocob, _apply_scale_by_cocob, name="scale_by_cocob",
                    options=dict(alpha=alpha, eps=eps), domains=dict(alpha=POSITIVE, eps=POSITIVE),
                    needs_params=True, schedulable=("alpha",))


# --------------------------------------------------------------------------
# Polyak's step size

_POLYAK_VARIANTS = ("sps", "sps+")


def _apply_scale_by_polyak(updates, params, *, f_min, max_learning_rate, eps, variant, loss=None):
    call = "scale_by_polyak"
    _needs_loss(call, loss)
    loss = scalar_input(call, "loss", loss)  # (a loss per example would scale each coordinate by its own step)
    dtype = _scalar_dtype(updates)
    gap = loss.astype(dtype) - f_min
    if variant == "sps+":
        gap = jnp.maximum(gap, 0)
    denominator = _sq_norm(updates, dtype) + eps
    step = jnp.where(denominator > 0, jnp.minimum(_div(gap, denominator), max_learning_rate), 0)
    return _tree.tree_map(call, lambda g: scaled(g, step), updates)


@combinator
def scale_by_polyak(f_min: ScalarOrSchedule = 0.0, max_learning_rate: ScalarOrSchedule = 1.0,
                    eps: ScalarOrSchedule = 0.0, variant: str = "sps") -> Update:
    r"""Scales updates by Polyak's step size, from the loss and its lower bound.

    Pass the loss to every call: ``opt.update(grads, state, params,
    loss=loss)`` (optax's keyword is ``value=``), a real scalar (a loss per
    example is refused: it would give each coordinate a step of its own).
    Update rule, with $f$ the loss, $f_\text{min}$ = ``f_min``, $\eta_\text{max}$ = ``max_learning_rate``,
    $\epsilon$ = ``eps``, and the norm global over all leaves:

    $$
    u = \min\Bigl(\frac{f - f_\text{min}}{\lVert g \rVert^2 + \epsilon}, \eta_\text{max}\Bigr) \cdot g
    $$

    With ``variant="sps+"`` the gap $f - f_\text{min}$ is floored at 0 (Garrigos
    et al. 2023). Where $\lVert g \rVert^2 + \epsilon$ is 0 the step is 0.

    Args:
        f_min: a lower bound of the loss (0 for models that interpolate the
            data), any real number. Default: ``0.0``.
        max_learning_rate: the largest step size, > 0. Default: ``1.0``.
        eps: added to the denominator, >= 0. Default: ``0.0``.
        variant: ``"sps"`` or ``"sps+"``. Default: ``'sps'``.

    Returns:
        A stateless update object; ``update`` needs ``loss=``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_polyak(max_learning_rate=10.0)
        >>> u, _ = opt.update({"w": jnp.array([1.0, 2.0])}, opt.init(None), loss=2.5)
        >>> u["w"]  # 2.5 / 5 · g
        Array([0.5, 1. ], dtype=float32)

    References:
        Loizou et al., "Stochastic Polyak Step-size for SGD: An Adaptive
        Learning Rate for Fast Convergence", AISTATS 2021.
        https://arxiv.org/abs/2002.10542
    """
    options = dict(f_min=f_min, max_learning_rate=max_learning_rate, eps=eps, variant=variant)
    domains = dict(f_min=ANY_REAL, max_learning_rate=POSITIVE, eps=NON_NEGATIVE, variant=OneOf(_POLYAK_VARIANTS))
    return stateless(_apply_scale_by_polyak, name="scale_by_polyak", options=options, domains=domains,
                     schedulable=("f_min", "max_learning_rate", "eps"))


# --------------------------------------------------------------------------
# Mechanic


def _init_mechanize(params, *, inner, s_init, num_betas):
    dtype = _scalar_dtype(params)
    return MechanizeState(inner=inner.init(params), init_params=_copy("mechanize", params),
                          s=jnp.full([num_betas], s_init, dtype), r=jnp.zeros([num_betas], dtype),
                          m=jnp.zeros([num_betas], dtype), v=jnp.zeros([num_betas], dtype), count=_tree.zero_count())


def _apply_mechanize(updates, state, params, *, inner, decay, eps, s_init, num_betas, **extra):
    call = "mechanize"
    real_only(call, updates)
    steps, inner_state = inner.update(updates, state.inner, params, **extra)
    dtype = state.s.dtype
    first = state.count == 0  # the params of the first step are the origin (not init's: they may be replaced)
    treedef, leaves = _tree.side_by_side(call, (updates, steps, params, state.init_params),
                                         ("updates", "updates of the wrapped pipeline", "params", "state.init_params"))
    s_sum = jnp.sum(state.s)
    grad_norm = safe_sqrt(_sq_norm(updates, dtype))
    param_norm = safe_sqrt(_sq_norm(params, dtype))
    pull = decay * s_sum * grad_norm / (param_norm + eps)
    origins, deltas, dots = [], [], []
    for g, u, p, x0 in leaves:
        c = _tree.compute_dtype(g.dtype, u.dtype, p.dtype, x0.dtype)
        p32 = p.astype(c)
        origin = jnp.where(first, p32, x0.astype(c))
        delta_prev = (origin - p32) / (s_sum + eps)  # the sum of the inner steps so far, up to the sign
        dots.append(jnp.sum((g.astype(c) + pull * p32) * delta_prev))
        origins.append(origin)
        deltas.append(delta_prev - u.astype(c))
    h = _total(dots, dtype)
    betas = jnp.asarray([1 - 0.1**i for i in range(1, num_betas + 1)], dtype)
    clipped = jnp.clip(h, -state.m, state.m)  # (optax's clip of the correlation, added after the paper)
    m = jnp.maximum(betas * state.m, jnp.abs(h) + eps)
    v = betas**2 * state.v + h**2
    r = betas * state.r + clipped * state.s
    wealth = s_init / num_betas * m + jnp.maximum(r, 0)
    s = wealth / (safe_sqrt(v) + eps)
    scale = jnp.sum(s)
    out = [(o - scale * d - p.astype(o.dtype)).astype(g.dtype) for (g, _, p, _), o, d in zip(leaves, origins, deltas)]
    init_params = [o.astype(x0.dtype) for (*_, x0), o in zip(leaves, origins)]
    # (in the state's dtype: a schedule's float64 value under x64 would widen them)
    s, r, m, v = (x.astype(dtype) for x in (s, r, m, v))
    return treedef.unflatten(out), MechanizeState(inner=inner_state, init_params=treedef.unflatten(init_params),
                                                  s=s, r=r, m=m, v=v, count=_tree.safe_increment(state.count))


#: The number of Mechanic's decays ``β_i = 1 - 10^-i``: 6 in the paper and optax.
_NUM_BETAS = Integer(1, 16, why=" (the decays 1 - 10^-i round to 1 beyond i = 16 in float64)")


@combinator(wraps=True)
def mechanize(inner: Update, decay: ScalarOrSchedule = 1e-2, eps: ScalarOrSchedule = 1e-8, s_init: float = 1e-6,
              num_betas: int = 6) -> Update:
    r"""Learns the scale of the steps of the pipeline before it (Mechanic), from the params' origin.

    The wrapped pipeline (with its learning rate at 1, or a schedule peaking
    at 1) proposes steps $w$ whose sum is $\Delta$; the params are $x = x_0 + S \Delta$
    with $S = \sum_i s_i$, and each scale $s_i$ (one per decay $\beta_i = 1 - 10^{-i}$, $i = 1, \dots, n$)
    is learned by coin betting on the correlation $h$. With $\lambda$ = ``decay``, $\epsilon$ = ``eps``,
    $s_\text{init}$ = ``s_init``, $n$ = ``num_betas``, and $\beta$, $m$, $v$, $r$, $s$ vectors over $i$
    (elementwise):

    $$
    \begin{align*}
    \tilde g &= g + \lambda S \lVert g \rVert / (\lVert x \rVert + \epsilon) \cdot x \\
    h &= \langle \tilde g, x_0 - x \rangle / (S + \epsilon) \\
    m &\gets \max(\beta m, |h| + \epsilon) \\
    v &\gets \beta^2 v + h^2 \\
    r &\gets \beta r + \operatorname{clip}(h, -m_\text{old}, m_\text{old})\, s \\
    s &\gets \bigl(s_\text{init} m / n + \max(r, 0)\bigr) / (\sqrt{v} + \epsilon) \\
    u &= x_0 + S' \bigl((x - x_0) / (S + \epsilon) + w\bigr) - x, \qquad S' = \sum_i s_i
    \end{align*}
    $$

    where $(x - x_0) / (S + \epsilon)$ is, up to $\epsilon$, the sum $\Delta$ of the earlier steps: $h$ is
    $-\langle \tilde g, \Delta \rangle$, and the params after the step are $x_0 + S' \Delta$ with the new scales'
    sum $S'$ and this step's $w$ added to $\Delta$. The params of the first step are the origin $x_0$. As
    optax, the correlation is clipped to the last $m$ (the authors' later addition).

    Args:
        decay: the weight decay of $\tilde g$ (not the wrapped pipeline's), >= 0.
            Default: ``0.01``.
        eps: added to denominators, > 0. Default: ``1e-08``.
        s_init: the initial total scale, > 0. Default: ``1e-06``.
        num_betas: the number $n$ of decays, an integer in [1, 16] (beyond
            16 the decays are 1 in float64). Default: ``6``.

    Returns:
        An update object with state ``MechanizeState(inner, init_params, s, r,
        m, v, count)``; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_learning_rate(1.0).mechanize()
        >>> params = {"w": jnp.array([1.0, -2.0])}
        >>> u, state = opt.update({"w": jnp.array([1.0, 1.0])}, opt.init(params), params)
        >>> u["w"]  # the first step is the inner step times s_init
        Array([-1.e-06, -1.e-06], dtype=float32)

    References:
        Cutkosky, Defazio & Mehta, "Mechanic: A Learning Rate Tuner", NeurIPS
        2023. https://arxiv.org/abs/2306.00144
    """
    options = dict(inner=inner, decay=decay, eps=eps, s_init=s_init, num_betas=num_betas)
    domains = dict(inner=Pipeline(), decay=NON_NEGATIVE, eps=POSITIVE, s_init=POSITIVE, num_betas=_NUM_BETAS)
    return stateful(_init_mechanize, _apply_mechanize, name="mechanize", options=options, domains=domains,
                    wraps="inner", needs_params=True, static=("num_betas",), schedulable=("decay", "eps"))
