"""More adaptive rules: sign-based, max-based, layer-wise and step-size-adapting.

Defaults are the papers' where the papers fix one, else optax's (the JAX
reference); each docstring says which. Where optax departs from the paper the
docstring says which one updax follows.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax import _validate as check
from updax._core import combinator, stateful, stateless
from updax.updates._scaling import _adam_like_init, _adam_like_update, _adam_options, _bias_corrections

# --------------------------------------------------------------------------
# States


class ScaleByLionState(NamedTuple):
    """EMA of the updates ``mu`` (the rule needs no step count)."""

    mu: object


class ScaleByAmsgradState(NamedTuple):
    """First moment ``mu``, second moment ``nu``, running maximum of the
    bias-corrected ``nu`` (``nu_max``), steps taken ``count``."""

    mu: object
    nu: object
    nu_max: object
    count: jax.Array


class ScaleByNovogradState(NamedTuple):
    """Momentum of the normalized updates ``mu``, one scalar second moment per leaf ``nu``, steps taken ``count``."""

    mu: object
    nu: object
    count: jax.Array


class ScaleByAdadeltaState(NamedTuple):
    """EMAs of the squared incoming updates and of the squared outgoing steps."""

    avg_sq_grad: object
    avg_sq_step: object


class ScaleByRpropState(NamedTuple):
    """Per-element step sizes, and the last step taken (0 where the sign flipped)."""

    step_sizes: object
    prev_steps: object


class ScaleByAdanState(NamedTuple):
    """EMAs of the updates ``mu``, of their differences ``mu_diff`` and of the
    squared look-ahead ``nu``; the previous updates ``prev_grads``; steps taken ``count``."""

    mu: object
    mu_diff: object
    nu: object
    prev_grads: object
    count: jax.Array


# --------------------------------------------------------------------------
# Lion


def _init_scale_by_lion(params, *, mu_dtype):
    return ScaleByLionState(mu=_tree.accumulators(params, mu_dtype))


def _apply_scale_by_lion(updates, state, params, *, b1, b2):
    def leaf(g, m0):
        c = _tree.compute_dtype(g.dtype, m0.dtype)
        g32, m_old = g.astype(c), m0.astype(c)
        u = jnp.sign(b1 * m_old + (1 - b1) * g32)
        m = b2 * m_old + (1 - b2) * g32
        return u.astype(g.dtype), m.astype(m0.dtype)

    u, mu = _tree.tree_map_unzip("scale_by_lion", leaf, 2, updates, state.mu, names=("updates", "state.mu"))
    return u, ScaleByLionState(mu=mu)


@combinator
def scale_by_lion(b1=0.9, b2=0.99, *, mu_dtype=None):
    """Scales updates to the sign of an interpolation of momentum and update (Lion).

    Update rule (the sign uses the old ``m``; ``m`` is updated after)::

        u = sign(b1·m + (1-b1)·g)
        m ← b2·m + (1-b2)·g

    Args:
        b1: weight of the momentum in the interpolation, in [0, 1); the
            paper's value. Default: ``0.9``.
        b2: decay of the momentum, in [0, 1); the paper's value. Default: ``0.99``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.

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
    call = "scale_by_lion"
    options = dict(b1=check.unit(call, "b1", b1), b2=check.unit(call, "b2", b2),
                   mu_dtype=check.float_dtype(call, "mu_dtype", mu_dtype))
    return stateful(_init_scale_by_lion, _apply_scale_by_lion, name=call, options=options)


# --------------------------------------------------------------------------
# AMSGrad


def _init_scale_by_amsgrad(params, *, mu_dtype, nu_dtype):
    return ScaleByAmsgradState(mu=_tree.accumulators(params, mu_dtype), nu=_tree.accumulators(params, nu_dtype),
                               nu_max=_tree.accumulators(params, nu_dtype), count=_tree.zero_count())


def _apply_scale_by_amsgrad(updates, state, params, *, b1, b2, eps, eps_root):
    count = _tree.safe_increment(state.count)
    c1, c2 = _bias_corrections(count, b1, b2)

    def leaf(g, m0, v0, vmax0):
        c = _tree.compute_dtype(g.dtype, m0.dtype, v0.dtype, vmax0.dtype)
        g32 = g.astype(c)
        m = b1 * m0.astype(c) + (1 - b1) * g32
        v = b2 * v0.astype(c) + (1 - b2) * g32 * g32
        v_max = jnp.maximum(vmax0.astype(c), v / c2)
        u = (m / c1) / (jnp.sqrt(v_max + eps_root) + eps)
        return u.astype(g.dtype), m.astype(m0.dtype), v.astype(v0.dtype), v_max.astype(vmax0.dtype)

    u, mu, nu, nu_max = _tree.tree_map_unzip("scale_by_amsgrad", leaf, 4, updates, state.mu, state.nu, state.nu_max,
                                             names=("updates", "state.mu", "state.nu", "state.nu_max"))
    return u, ScaleByAmsgradState(mu=mu, nu=nu, nu_max=nu_max, count=count)


@combinator
def scale_by_amsgrad(b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, *, mu_dtype=None, nu_dtype=None):
    """Scales updates by AMSGrad: Adam whose second moment never decreases.

    Update rule, as optax (t counts from 1)::

        m ← b1·m + (1-b1)·g          v ← b2·v + (1-b2)·g²
        v_max ← max(v_max, v/(1-b2^t))
        u = m̂ / (sqrt(v_max + eps_root) + eps),  m̂ = m/(1-b1^t)

    The paper's Algorithm 2 has no bias correction; optax (and updax) keep
    Adam's, with the maximum taken over the bias-corrected ``v``.

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
    call = "scale_by_amsgrad"
    options = _adam_options(call, b1, b2, eps, eps_root, mu_dtype, nu_dtype)
    return stateful(_init_scale_by_amsgrad, _apply_scale_by_amsgrad, name=call, options=options)


# --------------------------------------------------------------------------
# AdaMax


def _apply_scale_by_adamax(updates, state, params, *, b1, b2, eps):
    count = _tree.safe_increment(state.count)
    (c1,) = _bias_corrections(count, b1)

    def leaf(g, m0, v0):
        c = _tree.compute_dtype(g.dtype, m0.dtype, v0.dtype)
        g32 = g.astype(c)
        m = b1 * m0.astype(c) + (1 - b1) * g32
        v = jnp.maximum(jnp.abs(g32) + eps, b2 * v0.astype(c))
        return ((m / c1) / v).astype(g.dtype), m.astype(m0.dtype), v.astype(v0.dtype)

    return _adam_like_update("scale_by_adamax", leaf, updates, state, count)


@combinator
def scale_by_adamax(b1=0.9, b2=0.999, eps=1e-8, *, mu_dtype=None, nu_dtype=None):
    """Scales updates by AdaMax: Adam with an infinity-norm second moment.

    Update rule, as optax (t counts from 1; the paper has no ``eps``)::

        m ← b1·m + (1-b1)·g          v ← max(|g| + eps, b2·v)
        u = m̂ / v,  m̂ = m/(1-b1^t)

    Args:
        b1: decay of the first moment, in [0, 1); the paper's value.
            Default: ``0.9``.
        b2: decay of the infinity norm, in [0, 1); the paper's value.
            Default: ``0.999``.
        eps: added to ``|g|`` inside the maximum, >= 0 (optax's default); with
            0, a zero update before any non-zero one divides 0 by 0.
            Default: ``1e-8``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        nu_dtype: storage dtype of ``nu``, as ``mu_dtype``. Default: ``None``.

    Returns:
        An update object with state ``ScaleByAdamState(mu, nu, count)``;
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
    call = "scale_by_adamax"
    options = dict(b1=check.unit(call, "b1", b1), b2=check.unit(call, "b2", b2),
                   eps=check.nonnegative(call, "eps", eps),
                   mu_dtype=check.float_dtype(call, "mu_dtype", mu_dtype),
                   nu_dtype=check.float_dtype(call, "nu_dtype", nu_dtype))
    return stateful(_adam_like_init, _apply_scale_by_adamax, name=call, options=options)


# --------------------------------------------------------------------------
# NAdam


def _apply_scale_by_nadam(updates, state, params, *, b1, b2, eps, eps_root):
    count = _tree.safe_increment(state.count)
    c1, c2 = _bias_corrections(count, b1, b2)
    (c1_next,) = _bias_corrections(_tree.safe_increment(count), b1)

    def leaf(g, m0, v0):
        c = _tree.compute_dtype(g.dtype, m0.dtype, v0.dtype)
        g32 = g.astype(c)
        m = b1 * m0.astype(c) + (1 - b1) * g32
        v = b2 * v0.astype(c) + (1 - b2) * g32 * g32
        m_hat = b1 * m / c1_next + (1 - b1) * g32 / c1
        u = m_hat / (jnp.sqrt(v / c2 + eps_root) + eps)
        return u.astype(g.dtype), m.astype(m0.dtype), v.astype(v0.dtype)

    return _adam_like_update("scale_by_nadam", leaf, updates, state, count)


@combinator
def scale_by_nadam(b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, *, mu_dtype=None, nu_dtype=None):
    """Scales updates by NAdam: Adam with a Nesterov look-ahead first moment.

    Update rule, as optax's ``scale_by_adam(nesterov=True)`` (t counts from 1)::

        m ← b1·m + (1-b1)·g          v ← b2·v + (1-b2)·g²
        m̂ = b1·m/(1-b1^(t+1)) + (1-b1)·g/(1-b1^t),  v̂ = v/(1-b2^t)
        u = m̂ / (sqrt(v̂ + eps_root) + eps)

    Dozat's Algorithm 2 lets the momentum follow a schedule ``μ_t`` and
    multiplies ``v̂`` by ``b2``; optax (and updax) use a constant ``b1`` and
    Adam's ``v̂``.

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
    call = "scale_by_nadam"
    options = _adam_options(call, b1, b2, eps, eps_root, mu_dtype, nu_dtype)
    return stateful(_adam_like_init, _apply_scale_by_nadam, name=call, options=options)


# --------------------------------------------------------------------------
# NovoGrad


def _init_scale_by_novograd(params, *, mu_dtype):
    nu = jax.tree.map(lambda p: jnp.zeros([], _tree.compute_dtype(jnp.asarray(p).dtype)), params)
    return ScaleByNovogradState(mu=_tree.accumulators(params, mu_dtype), nu=nu, count=_tree.zero_count())


def _apply_scale_by_novograd(updates, state, params, *, b1, b2, eps, eps_root, weight_decay):
    count = _tree.safe_increment(state.count)
    # The first step sets both moments from the step itself rather than decaying zeros.
    first = count == 1
    b1_t, b2_t = jnp.where(first, 0.0, b1), jnp.where(first, 0.0, b2)

    def leaf(g, m0, v0, p=None):
        c = _tree.compute_dtype(g.dtype, m0.dtype, v0.dtype)
        g32 = g.astype(c)
        d1, d2 = b1_t.astype(c), b2_t.astype(c)
        v = d2 * v0.astype(c) + (1 - d2) * jnp.sum(g32 * g32)
        step = g32 / (jnp.sqrt(v + eps_root) + eps)
        if p is not None:
            step = step + weight_decay * p.astype(c)
        m = d1 * m0.astype(c) + step
        return m.astype(g.dtype), m.astype(m0.dtype), v.astype(v0.dtype)

    trees, names = (updates, state.mu, state.nu), ("updates", "state.mu", "state.nu")
    if params is not None:
        trees, names = trees + (params,), names + ("params",)
    u, mu, nu = _tree.tree_map_unzip("scale_by_novograd", leaf, 3, *trees, names=names)
    return u, ScaleByNovogradState(mu=mu, nu=nu, count=count)


def _is_zero(value) -> bool:
    """True for a concrete 0 (already checked to be a real scalar); schedules and tracers may not be 0."""
    return not (callable(value) or isinstance(value, jax.core.Tracer)) and float(value) == 0.0


@combinator
def scale_by_novograd(b1=0.9, b2=0.25, eps=1e-8, eps_root=0.0, weight_decay=0.0, *, mu_dtype=None):
    """Scales updates by NovoGrad: momentum of updates normalized by a layer-wise second moment.

    Update rule, per leaf (layer) ``l``; on the first step ``v`` and ``m``
    start from the step itself (``b1``, ``b2`` act as 0)::

        v_l ← b2·v_l + (1-b2)·‖g_l‖²                      (a scalar per leaf)
        m_l ← b1·m_l + g_l / (sqrt(v_l + eps_root) + eps) + weight_decay·p_l
        u_l = m_l

    Args:
        b1: decay of the momentum, in [0, 1) (optax's default; the paper tunes
            it per task). Default: ``0.9``.
        b2: decay of the layer-wise second moment, in [0, 1) (optax's
            default). Default: ``0.25``.
        eps: added to the denominator, >= 0 (``optax.scale_by_novograd``'s
            default; ``optax.novograd`` passes 1e-6). Default: ``1e-8``.
        eps_root: added inside the square root, >= 0. Default: ``0.0``.
        weight_decay: the decoupled weight-decay rate ``d``, any real number;
            when it is not 0, ``update`` needs ``params``. Default: ``0.0``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. ``nu`` holds one scalar per leaf, at least float32.
            Default: ``None``.

    Returns:
        An update object with state ``ScaleByNovogradState(mu, nu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_novograd(eps=0.0)
        >>> u, state = opt.update({"w": jnp.array([3.0, 4.0])}, opt.init({"w": jnp.zeros(2)}))
        >>> u["w"], opt.get_state(state, "scale_by_novograd.nu")["w"]  # g / ‖g‖, v = ‖g‖²
        (Array([0.6, 0.8], dtype=float32), Array(25., dtype=float32))

    References:
        Ginsburg et al., "Stochastic Gradient Methods with Layer-wise Adaptive
        Moments for Training of Deep Networks", 2019, Algorithm 1.
        https://arxiv.org/abs/1905.11286
    """
    call = "scale_by_novograd"
    options = dict(b1=check.unit(call, "b1", b1), b2=check.unit(call, "b2", b2),
                   eps=check.nonnegative(call, "eps", eps), eps_root=check.nonnegative(call, "eps_root", eps_root),
                   weight_decay=check.real(call, "weight_decay", weight_decay),
                   mu_dtype=check.float_dtype(call, "mu_dtype", mu_dtype))
    return stateful(_init_scale_by_novograd, _apply_scale_by_novograd, name=call, options=options,
                    needs_params=not _is_zero(options["weight_decay"]))


# --------------------------------------------------------------------------
# AdaDelta


def _init_scale_by_adadelta(params, *, accumulator_dtype):
    return ScaleByAdadeltaState(avg_sq_grad=_tree.accumulators(params, accumulator_dtype),
                                avg_sq_step=_tree.accumulators(params, accumulator_dtype))


def _apply_scale_by_adadelta(updates, state, params, *, rho, eps):
    def leaf(g, eg0, ex0):
        c = _tree.compute_dtype(g.dtype, eg0.dtype, ex0.dtype)
        g32 = g.astype(c)
        eg = rho * eg0.astype(c) + (1 - rho) * g32 * g32
        u = jnp.sqrt(ex0.astype(c) + eps) / jnp.sqrt(eg + eps) * g32
        ex = rho * ex0.astype(c) + (1 - rho) * u * u
        return u.astype(g.dtype), eg.astype(eg0.dtype), ex.astype(ex0.dtype)

    u, eg, ex = _tree.tree_map_unzip("scale_by_adadelta", leaf, 3, updates, state.avg_sq_grad, state.avg_sq_step,
                                     names=("updates", "state.avg_sq_grad", "state.avg_sq_step"))
    return u, ScaleByAdadeltaState(avg_sq_grad=eg, avg_sq_step=ex)


@combinator
def scale_by_adadelta(rho=0.9, eps=1e-6, *, accumulator_dtype=None):
    """Scales updates by AdaDelta: the RMS of past steps over the RMS of updates.

    Update rule (``u`` is a direction: follow it with a negative scale)::

        E[g²] ← rho·E[g²] + (1-rho)·g²
        u = sqrt(E[Δ²] + eps) / sqrt(E[g²] + eps) · g
        E[Δ²] ← rho·E[Δ²] + (1-rho)·u²

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
    call = "scale_by_adadelta"
    options = dict(rho=check.unit(call, "rho", rho), eps=check.positive(call, "eps", eps),
                   accumulator_dtype=check.float_dtype(call, "accumulator_dtype", accumulator_dtype))
    return stateful(_init_scale_by_adadelta, _apply_scale_by_adadelta, name=call, options=options)


# --------------------------------------------------------------------------
# Rprop


def _init_scale_by_rprop(params, *, learning_rate):
    return ScaleByRpropState(step_sizes=_tree.accumulators(params, None, learning_rate),
                             prev_steps=_tree.accumulators(params, None))


def _apply_scale_by_rprop(updates, state, params, *, eta_minus, eta_plus, min_step_size, max_step_size):
    def leaf(g, s0, p0):
        c = _tree.compute_dtype(g.dtype, s0.dtype, p0.dtype)
        g32, s_old = g.astype(c), s0.astype(c)
        agree = jnp.sign(g32) * jnp.sign(p0.astype(c))
        grown = jnp.minimum(s_old * eta_plus, max_step_size)
        shrunk = jnp.maximum(s_old * eta_minus, min_step_size)
        s = jnp.where(agree > 0, grown, jnp.where(agree < 0, shrunk, s_old))
        step = jnp.where(agree < 0, 0.0, s * jnp.sign(g32))
        return step.astype(g.dtype), s.astype(s0.dtype), step.astype(p0.dtype)

    u, sizes, prev = _tree.tree_map_unzip("scale_by_rprop", leaf, 3, updates, state.step_sizes, state.prev_steps,
                                          names=("updates", "state.step_sizes", "state.prev_steps"))
    return u, ScaleByRpropState(step_sizes=sizes, prev_steps=prev)


@combinator
def scale_by_rprop(learning_rate, eta_minus=0.5, eta_plus=1.2, min_step_size=1e-6, max_step_size=50.0):
    """Scales updates by Rprop: a per-element step size adapted to sign agreement (iRprop-).

    Update rule, per element (iRprop-: on a sign change the step is skipped,
    where the original Rprop backtracks). ``u`` is a direction: follow it with
    a negative scale::

        s = sign(g)·sign(u_prev)
        Δ ← min(Δ·eta_plus, max_step_size)    if s > 0
        Δ ← max(Δ·eta_minus, min_step_size)   if s < 0
        u = 0 if s < 0 else Δ·sign(g);         u_prev ← u

    ``u`` is this step's update, as in the paper and PyTorch's ``Rprop``;
    optax 0.2.8 returns the previous step's (0 on the first step).

    Args:
        learning_rate: the initial step size ``Δ₀``, > 0 (the paper uses 0.1).
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
    call = "scale_by_rprop"
    options = dict(learning_rate=check.positive(call, "learning_rate", learning_rate),
                   eta_minus=check.real(call, "eta_minus", eta_minus, 0.0, 1.0, lo_open=True),
                   eta_plus=check.real(call, "eta_plus", eta_plus, 1.0),
                   min_step_size=check.nonnegative(call, "min_step_size", min_step_size),
                   max_step_size=check.nonnegative(call, "max_step_size", max_step_size))
    low, high = options["min_step_size"], options["max_step_size"]
    if isinstance(low, float) and isinstance(high, float) and high < low:
        raise ValueError(f"{call}(max_step_size={high!r}): max_step_size must be >= min_step_size={low!r}")
    return stateful(_init_scale_by_rprop, _apply_scale_by_rprop, name=call, options=options)


# --------------------------------------------------------------------------
# Sign


def _apply_scale_by_sign(updates, params):
    return jax.tree.map(lambda g: jnp.sign(g.astype(_tree.compute_dtype(g.dtype))).astype(g.dtype), updates)


@combinator
def scale_by_sign():
    """Replaces each update by its sign (signSGD; after an EMA, signum).

    Update rule: ``u = sign(g)``, with ``sign(0) = 0``.

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
    return stateless(_apply_scale_by_sign, name="scale_by_sign")


# --------------------------------------------------------------------------
# Adan


def _init_scale_by_adan(params, *, mu_dtype, nu_dtype):
    return ScaleByAdanState(mu=_tree.accumulators(params, mu_dtype), mu_diff=_tree.accumulators(params, mu_dtype),
                            nu=_tree.accumulators(params, nu_dtype), prev_grads=_tree.accumulators(params, None),
                            count=_tree.zero_count())


def _apply_scale_by_adan(updates, state, params, *, b1, b2, b3, eps, eps_root):
    count = _tree.safe_increment(state.count)
    c1, c2, c3 = _bias_corrections(count, b1, b2, b3)
    first = count == 1

    def leaf(g, m0, d0, n0, g0):
        c = _tree.compute_dtype(g.dtype, m0.dtype, d0.dtype, n0.dtype, g0.dtype)
        g32 = g.astype(c)
        diff = jnp.where(first, 0.0, g32 - g0.astype(c))
        m = b1 * m0.astype(c) + (1 - b1) * g32
        d = b2 * d0.astype(c) + (1 - b2) * diff
        look_ahead = g32 + b2 * diff
        n = b3 * n0.astype(c) + (1 - b3) * look_ahead * look_ahead
        u = (m / c1 + b2 * d / c2) / (jnp.sqrt(n / c3 + eps_root) + eps)
        return u.astype(g.dtype), m.astype(m0.dtype), d.astype(d0.dtype), n.astype(n0.dtype), g32.astype(g0.dtype)

    u, mu, mu_diff, nu, prev = _tree.tree_map_unzip(
        "scale_by_adan", leaf, 5, updates, state.mu, state.mu_diff, state.nu, state.prev_grads,
        names=("updates", "state.mu", "state.mu_diff", "state.nu", "state.prev_grads"))
    return u, ScaleByAdanState(mu=mu, mu_diff=mu_diff, nu=nu, prev_grads=prev, count=count)


@combinator
def scale_by_adan(b1=0.98, b2=0.92, b3=0.99, eps=1e-8, eps_root=0.0, *, mu_dtype=None, nu_dtype=None):
    """Scales updates by Adan: adaptive Nesterov momentum from gradient differences.

    Update rule, with the decays written as in the authors' code (the paper's
    ``β`` is ``1 - b``); ``Δ = g - g_prev``, 0 on the first step::

        m ← b1·m + (1-b1)·g       d ← b2·d + (1-b2)·Δ
        n ← b3·n + (1-b3)·(g + b2·Δ)²
        u = (m̂ + b2·d̂) / (sqrt(n̂ + eps_root) + eps),  x̂ = x/(1-b^t)

    The gradient-difference terms are weighted by ``b2`` (the paper's
    ``1 - β2``), as in the paper and the authors' code; optax 0.2.8 weights
    them by ``1 - b2``. The two agree only when ``b2 = 0.5``.

    Args:
        b1: decay of the first moment, in [0, 1) (the paper's ``1 - β1``).
            Default: ``0.98``.
        b2: decay of the gradient-difference moment, in [0, 1) (``1 - β2``).
            Default: ``0.92``.
        b3: decay of the second moment, in [0, 1) (``1 - β3``).
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
    call = "scale_by_adan"
    options = dict(b1=check.unit(call, "b1", b1), b2=check.unit(call, "b2", b2), b3=check.unit(call, "b3", b3),
                   eps=check.nonnegative(call, "eps", eps), eps_root=check.nonnegative(call, "eps_root", eps_root),
                   mu_dtype=check.float_dtype(call, "mu_dtype", mu_dtype),
                   nu_dtype=check.float_dtype(call, "nu_dtype", nu_dtype))
    return stateful(_init_scale_by_adan, _apply_scale_by_adan, name=call, options=options)
