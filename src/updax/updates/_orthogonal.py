"""Orthogonalised updates: Muon's Newton–Schulz iteration, Muon itself, and its shape scaling."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax import _validate as check
from updax._combinators import combinator
from updax._primitives import stateful, stateless
from updax._typing import DType, ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import abs_sq, moment, per_leaf, real_only, safe_sqrt

# The quintic Newton–Schulz coefficients of Muon (Jordan et al., 2024).
_NS_COEFFS = (3.4445, -4.7750, 2.0315)


class ScaleByMuonState(NamedTuple):
    """The momentum ``mu`` and the steps taken ``count``."""

    mu: Any
    count: jax.Array


def _check_ns_coeffs(call, value):
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise TypeError(f"{call}(ns_coeffs={value!r}): ns_coeffs must be a tuple of three real numbers")
    return tuple(check.number(call, "ns_coeffs", k) for k in value)


#: Newton-Schulz iterations are unrolled into the compiled step, so their number is bounded (5 is usual).
MAX_NS_STEPS = 100


def _check_ns_steps(call, ns_steps):
    return check.integer(call, "ns_steps", ns_steps, 1, MAX_NS_STEPS, " (each iteration is unrolled into the "
                         "compiled step)")


def _newton_schulz(x, ns_coeffs, ns_steps, eps):
    """The quintic ``x ← a·x + (b·xxᵀ + c·(xxᵀ)²)·x`` on a matrix, from ``x / (‖x‖_F + eps)``.

    A matrix sharded over a mesh is gathered first (its products contract the sharded axes) and split as it
    was at the end.
    """
    sharded, x = x, _tree.place_like(x, x, dims=(None, None))
    a, b, c = (jnp.asarray(k, x.dtype) for k in ns_coeffs)
    tall = x.shape[0] > x.shape[1]
    if tall:  # the iteration commutes with transposition: work with the smaller Gram matrix
        x = x.T
    x = x / (safe_sqrt(jnp.sum(abs_sq(x))) + eps)  # jnp.linalg.norm(x), with a finite gradient at x = 0
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return _tree.place_like(x.T if tall else x, sharded)


def _apply_scale_by_newton_schulz(updates, params, *, ns_coeffs, ns_steps, eps):
    real_only("scale_by_newton_schulz", updates)

    def leaf(g):
        if g.ndim != 2:
            return g
        return _newton_schulz(g.astype(_tree.compute_dtype(g.dtype)), ns_coeffs, ns_steps, eps).astype(g.dtype)

    return jax.tree.map(leaf, updates)


@combinator
def scale_by_newton_schulz(ns_coeffs: tuple[float, float, float] = _NS_COEFFS, ns_steps: int = 5,
                           eps: ScalarOrSchedule = 1e-8) -> Update:
    """Replaces each matrix update by an approximate orthogonalization (Muon's Newton–Schulz step).

    Update rule, for a leaf with two axes (other leaves pass unchanged), with
    ``(a, b, c) = ns_coeffs``; a leaf with more rows than columns is
    transposed first and back after, as the iteration commutes with
    transposition::

        X ← u / (‖u‖_F + eps)
        X ← a·X + (b·XXᵀ + c·(XXᵀ)²)·X      (ns_steps times);   u = X

    The default coefficients do not converge to the polar factor ``UVᵀ`` of
    ``u = USVᵀ``: they push every singular value into roughly [0.7, 1.2] in
    few steps, which is what Muon needs.

    Args:
        ns_coeffs: the quintic's coefficients ``(a, b, c)``.
            Default: ``(3.4445, -4.7750, 2.0315)``.
        ns_steps: the number of iterations, an integer in [1, 100] (each is
            unrolled into the compiled step). Default: ``5``.
        eps: added to the Frobenius norm, >= 0. Default: ``1e-8``.

    Returns:
        A stateless update object.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_newton_schulz()
        >>> g = {"w": jnp.array([[3.0, 0.0], [0.0, 0.3], [0.0, 0.0]]), "b": jnp.array([5.0])}
        >>> u, _ = opt.update(g, opt.init(None))
        >>> u["w"]  # singular values 3 and 0.3 both land near 1
        Array([[0.702, 0.   ],
               [0.   , 0.7087],
               [0.   , 0.   ]], dtype=float32)
        >>> u["b"]
        Array([5.], dtype=float32)

    References:
        Jordan et al., "Muon: An optimizer for hidden layers in neural
        networks", 2024. https://kellerjordan.github.io/posts/muon/
    """
    call = "scale_by_newton_schulz"
    options = dict(ns_coeffs=_check_ns_coeffs(call, ns_coeffs), ns_steps=_check_ns_steps(call, ns_steps),
                   eps=check.nonnegative(call, "eps", eps))
    # The number of iterations unrolls into the compiled step: structure, not data.
    return stateless(_apply_scale_by_newton_schulz, name=call, options=options, static=("ns_steps",),
                     schedulable=("eps",))


# --------------------------------------------------------------------------
# Muon


def _init_scale_by_muon(params, *, mu_dtype):
    return ScaleByMuonState(mu=_tree.accumulators(params, mu_dtype), count=_tree.zero_count())


def _apply_scale_by_muon(updates, state, params, *, ns_coeffs, ns_steps, beta, eps, nesterov):
    real_only("scale_by_muon", updates)
    count = _tree.safe_increment(state.count)
    t = _tree.float_count(count)
    correction, next_correction = 1 - beta**t, 1 - beta ** (t + 1)

    def leaf(g, m):
        m = moment(beta, m, g)
        if nesterov:
            m_hat = beta * m / next_correction.astype(g.dtype) + (1 - beta) * g / correction.astype(g.dtype)
        else:
            m_hat = m / correction.astype(g.dtype)
        return (_newton_schulz(m_hat, ns_coeffs, ns_steps, eps) if g.ndim == 2 else m_hat), m

    u, mu = per_leaf("scale_by_muon", leaf, (updates, state.mu), ("updates", "state.mu"))
    return u, ScaleByMuonState(mu=mu, count=count)


@combinator
def scale_by_muon(ns_coeffs: tuple[float, float, float] = _NS_COEFFS, ns_steps: int = 5,
                  beta: ScalarOrSchedule = 0.95, eps: ScalarOrSchedule = 1e-8, nesterov: bool = True, *,
                  mu_dtype: DType = None) -> Update:
    """Scales updates by Muon: bias-corrected momentum, orthogonalized by Newton–Schulz.

    Update rule (t counts from 1), then :func:`scale_by_newton_schulz` on
    each leaf with two axes; other leaves get the momentum alone::

        m ← beta·m + (1-beta)·g
        m̂ = beta·m/(1-beta^(t+1)) + (1-beta)·g/(1-beta^t)    (nesterov=True)
        m̂ = m/(1-beta^t)                                      (nesterov=False)
        u = NewtonSchulz(m̂)

    Args:
        ns_coeffs: the quintic's coefficients ``(a, b, c)``.
            Default: ``(3.4445, -4.7750, 2.0315)``.
        ns_steps: the number of iterations, an integer in [1, 100] (each is
            unrolled into the compiled step). Default: ``5``.
        beta: decay of the momentum, in [0, 1). Default: ``0.95``.
        eps: added to the Frobenius norm, >= 0. Default: ``1e-8``.
        nesterov: use Nesterov's look-ahead momentum. Default: ``True``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.

    Returns:
        An update object with state ``ScaleByMuonState(mu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_muon(beta=0.5, nesterov=False)
        >>> state = opt.init({"w": jnp.zeros((2, 2)), "b": jnp.zeros(1)})
        >>> u, state = opt.update({"w": jnp.array([[3.0, 0.0], [0.0, 0.3]]), "b": jnp.array([2.0])}, state)
        >>> u["w"]  # m̂ = g on the first step, orthogonalized
        Array([[0.702, 0.   ],
               [0.   , 0.7087]], dtype=float32)
        >>> u["b"], opt.get_state(state, "scale_by_muon.mu")["b"]  # not a matrix: the bias-corrected momentum
        (Array([2.], dtype=float32), Array([1.], dtype=float32))

    References:
        Jordan et al., "Muon: An optimizer for hidden layers in neural
        networks", 2024. https://kellerjordan.github.io/posts/muon/;
        Bernstein & Newhouse, "Old Optimizer, New Norm: An Anthology", 2024.
        https://arxiv.org/abs/2409.20325
    """
    call = "scale_by_muon"
    options = dict(ns_coeffs=_check_ns_coeffs(call, ns_coeffs), ns_steps=_check_ns_steps(call, ns_steps),
                   beta=check.unit(call, "beta", beta), eps=check.nonnegative(call, "eps", eps),
                   nesterov=check.flag(call, "nesterov", nesterov),
                   mu_dtype=check.float_dtype(call, "mu_dtype", mu_dtype))
    return stateful(_init_scale_by_muon, _apply_scale_by_muon, name=call, options=options, static=("ns_steps",),
                    schedulable=("beta", "eps"))


# --------------------------------------------------------------------------
# Muon's width transfer


def _shape_scale(g):
    if g.ndim != 2 or g.size == 0:  # (a zero-size matrix has nothing to scale, and fan_in may be 0)
        return g
    fan_in, fan_out = g.shape
    c = _tree.compute_dtype(g.dtype)
    return (g.astype(c) * max(1.0, fan_out / fan_in) ** 0.5).astype(g.dtype)


def _apply_scale_by_shape(updates, params):
    return jax.tree.map(_shape_scale, updates)


@combinator
def scale_by_shape() -> Update:
    """Scales each matrix update by ``sqrt(max(1, fan_out / fan_in))`` (Muon's width transfer).

    Update rule: ``u ← u·sqrt(max(1, n/m))`` for a 2-D leaf of shape
    ``(m, n)`` (input dimension first); other leaves pass unchanged.

    Returns:
        A stateless update object.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_shape()
        >>> opt.update({"w": jnp.ones((2, 8)), "b": jnp.ones(8)}, opt.init(None))[0]["w"][0, 0]
        Array(2., dtype=float32)

    References:
        Jordan et al., "Muon: An optimizer for hidden layers in neural
        networks", 2024 (the shape factor of Muon's update), as applied by
        optax.contrib.muon.
    """
    return stateless(_apply_scale_by_shape, name="scale_by_shape")
