"""PSGD Kron: Xi-Lin Li's preconditioned SGD with a Kronecker-factored preconditioner fitted on a Lie group.

Each leaf keeps one factor per axis, upper triangular (or diagonal for a
large axis, and for vectors and scalars); their Kronecker product ``Q``
gives the preconditioner ``P = QᵀQ``. With a given probability per step the
factors take one normalised step on their matrix group toward the whitening
preconditioner ``P ≈ E[hhᵀ]^(-1/2)``, from the update ``h`` and a Gaussian
probe ``v``; no Hessian-vector product, no eigendecomposition, no inverse.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import POSITIVE, UNIT, Count, Flag, FloatDtype, Integer, Real, Valid, is_concrete
from updax._primitives import stateful
from updax._typing import DType, ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import bias_corrections, real_only
from updax.updates._noise_decay import _KEY, _key_data
from updax.updates._soap import _gathered, _kept_like, _like


class ScaleByPsgdKronState(NamedTuple):
    """The momentum ``mu``; per leaf a tuple of its Kronecker ``factors``, one per axis: an ``n x n`` upper-triangular
    matrix (replicated over the param's mesh) or a length-``n`` diagonal (split as the param's axis); one 0-d factor
    for a scalar, none for an empty leaf; the raw PRNG ``key`` data of the next step's draws; steps taken
    ``count``."""

    mu: Any
    factors: Any
    key: jax.Array
    count: Count


#: The products of factors in full float32 (not TF32 or bfloat16 passes on an accelerator).
_HIGHEST = jax.lax.Precision.HIGHEST


def factor_kinds(shape, max_size_triangular):
    """One entry per factor of a leaf of ``shape``: True for an upper-triangular factor, False for a diagonal
    one. A scalar has one (diagonal, 0-d) factor, an empty leaf none, a vector a diagonal one; a leaf of two or
    more axes one per axis, triangular where the axis has at most ``max_size_triangular`` elements."""
    shape = tuple(shape)
    if 0 in shape:
        return ()
    if not shape:
        return (False,)
    return tuple(len(shape) >= 2 and n <= max_size_triangular for n in shape)


def _init_scale_by_psgd_kron(params, *, max_size_triangular, key, mu_dtype):
    def leaf(p):
        p = p if isinstance(p, jax.Array) else jnp.asarray(p)
        dtype = _tree.compute_dtype(p.dtype)
        kinds = factor_kinds(p.shape, max_size_triangular)
        if p.ndim == 0:
            return tuple(_tree.full((), 1.0, dtype, p, dims=()) for _ in kinds)
        # A triangular factor replicated over the param's mesh, a diagonal one split as the param's axis is (a
        # vector's placed like it, also under jit on an Auto mesh).
        return tuple(_tree.full((n, n), 0.0, dtype, p, dims=(None, None)) + jnp.eye(n, dtype=dtype) if tri
                     else _tree.full((n,), 1.0, dtype, p, dims=None if p.ndim == 1 else (i,))
                     for i, (n, tri) in enumerate(zip(p.shape, kinds)))

    return ScaleByPsgdKronState(mu=_tree.accumulators(params, mu_dtype), factors=jax.tree.map(leaf, params),
                                key=_key_data(key), count=_tree.zero_count())


def _along(q, x, i, tri, transpose=False):
    """``x`` times the factor ``q`` (``qᵀ`` with ``transpose``) along axis ``i``."""
    if tri:
        return jnp.moveaxis(jnp.tensordot(q.T if transpose else q, x, axes=([1], [i]), precision=_HIGHEST), 0, i)
    return x * (q if q.ndim == 0 else q.reshape((-1,) + (1,) * (x.ndim - i - 1)))


def _solved(q, x, i, tri):
    """``x`` times ``q⁻ᵀ`` along axis ``i``: a triangular solve, or a division by the diagonal."""
    if not tri:
        return x / (q if q.ndim == 0 else q.reshape((-1,) + (1,) * (x.ndim - i - 1)))
    y = jnp.moveaxis(x, i, 0)
    z = jax.scipy.linalg.solve_triangular(q, y.reshape(y.shape[0], -1), trans="T", lower=False)
    return jnp.moveaxis(z.reshape(y.shape), 0, i)


def _gram(a, i, tri):
    r"""$A_{(i)} A_{(i)}^\top$ (summed over every axis but ``i``), or only its diagonal for a diagonal factor."""
    others = tuple(j for j in range(a.ndim) if j != i)
    if tri:
        return jnp.tensordot(a, a, axes=(others, others), precision=_HIGHEST)
    return jnp.sum(a * a, axis=others)


def norm_lower_bound(s):
    r"""A lower bound of the spectral norm of the symmetric positive semi-definite ``s``: $\lVert S x \rVert /
    \lVert x \rVert$ for $x$ its column of largest norm (at least that column's norm, and so at least the largest
    entry of ``s``), computed on ``s / max|s|`` so that no square overflows; 0 for a zero ``s``."""
    peak = jnp.max(jnp.abs(s))
    x = s / jnp.where(peak > 0, peak, 1.0)
    column = x[:, jnp.argmax(jnp.sum(x * x, axis=0))]
    norm = jnp.linalg.norm(column)
    return peak * jnp.linalg.norm(jnp.matmul(x, column, precision=_HIGHEST)) / jnp.where(norm > 0, norm, 1.0)


def _fitted(qs, kinds, h, v, precond_lr):
    r"""The factors ``qs`` after one normalised step on their group, from the update ``h`` and the probe ``v``
    (both as the factors see them: gathered, in the factors' dtype); the old factors where a new one is not
    finite."""
    a, b = h, v
    for i, (q, tri) in enumerate(zip(qs, kinds)):
        a = _along(q, a, i, tri)  # A = Q h
        b = _solved(q, b, i, tri)  # B = Q⁻ᵀ v
    # The step is the same for A and B scaled alike: scaled so that the largest entry is 1, no square overflows
    # or underflows wholesale (a huge or tiny gradient).
    peak = jnp.maximum(jnp.max(jnp.abs(a), initial=0.0), jnp.max(jnp.abs(b), initial=0.0))
    unit = jnp.where((peak > 0) & jnp.isfinite(peak), peak, 1.0)
    a, b = a / unit, b / unit
    tiny = jnp.finfo(h.dtype).tiny
    new = []
    for i, (q, tri) in enumerate(zip(qs, kinds)):
        aa, bb = _gram(a, i, tri), _gram(b, i, tri)
        if tri:
            step = precond_lr / jnp.maximum(norm_lower_bound(aa + bb), tiny)
            new.append(q - step * jnp.matmul(jnp.triu(aa - bb), q, precision=_HIGHEST))
        else:
            step = precond_lr / jnp.maximum(jnp.max(aa + bb), tiny)
            new.append(q - step * (aa - bb) * q)
    ok = jnp.all(jnp.stack([jnp.all(jnp.isfinite(q)) for q in new]))
    return tuple(jnp.where(ok, n, q) for n, q in zip(new, qs))


def _preconditioned(qs, kinds, x):
    """``QᵀQ x``: every factor along its axis, then every factor's transpose."""
    for i, (q, tri) in enumerate(zip(qs, kinds)):
        x = _along(q, x, i, tri)
    for i, (q, tri) in enumerate(zip(qs, kinds)):
        x = _along(q, x, i, tri, transpose=True)
    return x


def first_scale(leaves):
    r"""Li's initial scale from the first gradients: $(\max_\ell \operatorname{mean}(|g_\ell|^4))^{-1/8}$ over the
    non-empty leaves, computed from each leaf divided by its largest entry (no fourth power overflows); 1 where
    every gradient is 0 (or it is not finite)."""
    leaves = [g for g in leaves if g.size]
    c = _tree.compute_dtype(*(g.dtype for g in leaves))
    if not leaves:
        return jnp.ones([], c)
    roots = []
    for g in leaves:
        x = _tree.cast(jnp.abs(g), c)
        peak = jnp.max(x)
        x = x / jnp.where(peak > 0, peak, 1.0)
        roots.append(peak * jnp.mean(jnp.square(jnp.square(x))) ** 0.25)  # (mean |g|^4)^(1/4)
    r = jnp.max(jnp.stack(roots))
    return jnp.where((r > 0) & jnp.isfinite(r), jax.lax.rsqrt(jnp.where(r > 0, r, 1.0)), 1.0)


def _apply_scale_by_psgd_kron(updates, state, params, *, b1, precond_lr, precond_update_prob, max_size_triangular,
                              preconditioner_init_scale, momentum_into_precond_update):
    call = "scale_by_psgd_kron"
    real_only(call, updates)
    _tree.check_same_structure(call, updates, state.mu, "updates", "state.mu")
    leaves, treedef = jax.tree.flatten(updates)
    mus, old = treedef.flatten_up_to(state.mu), treedef.flatten_up_to(state.factors)
    factors = [tuple(_gathered(q) for q in qs) for qs in old]  # (the products read each factor whole)
    count = _tree.safe_increment(state.count)
    (c1,) = bias_corrections(count, b1)
    plans = [factor_kinds(g.shape, max_size_triangular) for g in leaves]

    # The factors start at the identity; the first step scales them to preconditioner_init_scale (Li's scale of
    # the first gradients if None), a k-factor leaf's each by its k-th root: P = scale² I.
    # (a constant to derivatives, as the factors are)
    scale = (jax.lax.stop_gradient(first_scale(leaves)) if preconditioner_init_scale is None
             else preconditioner_init_scale)
    first = state.count == 0
    factors = [tuple(jnp.where(first, q * jnp.asarray(scale, q.dtype) ** (1.0 / len(qs)), q) for q in qs)
               for qs in factors]

    new_mu, m_hats, fit_inputs = [], [], []
    for g, m, qs, kinds in zip(leaves, mus, factors, plans):
        c = _tree.compute_dtype(g.dtype, m.dtype, *(q.dtype for q in qs))
        local = _gathered if kinds else (lambda a: a)  # (the factors contract each axis: a split leaf is gathered)
        x = _tree.cast(local(g), c)
        m = b1 * _tree.cast(local(m), c) + (1 - b1) * x
        new_mu.append(m)
        m_hats.append(m / c1.astype(c))
        fit_inputs.append(m_hats[-1] if momentum_into_precond_update else x)

    # One draw decides the refresh, one key per leaf position (None leaves counted) draws its probe v ~ N(0, I).
    key, draw, noise = jax.random.split(jax.random.wrap_key_data(state.key), 3)
    refresh = jax.random.uniform(draw, dtype=jnp.float32) < precond_update_prob
    positions = jax.tree.leaves(updates, is_leaf=lambda x: x is None)
    leaf_keys = jax.random.split(noise, len(positions))
    leaf_keys = [k for k, x in zip(leaf_keys, positions) if x is not None]

    def fit(factors, hs):
        # Differentiating through the step takes the factors as constants (the probe has no derivative anyway).
        factors, hs = jax.lax.stop_gradient((factors, hs))
        return [_fitted(qs, kinds, h, jax.random.normal(k, h.shape, h.dtype), precond_lr) if kinds else qs
                for qs, kinds, h, k in zip(factors, plans, hs, leaf_keys)]

    def keep(factors, hs):
        return factors

    if is_concrete(refresh):  # (eagerly: a cond of new closures would be traced and compiled again at each step)
        new_factors = fit(factors, fit_inputs) if refresh else factors
    else:
        new_factors = jax.lax.cond(refresh, fit, keep, factors, fit_inputs)

    us = [_like(_preconditioned(qs, kinds, x).astype(g.dtype), g)
          for qs, kinds, x, g in zip(new_factors, plans, m_hats, leaves)]
    new_mu = [_like(a.astype(m.dtype), m) for a, m in zip(new_mu, mus)]
    # Each factor placed as it was: under jit on an Auto mesh nothing else pins a triangular one (XLA would split
    # it like the updates), and a diagonal one is tied to its old placement, split as the param's axis.
    new_factors = [tuple((_kept_like if a.ndim == 2 else _like)(a.astype(b.dtype), b) for a, b in zip(qs, o))
                   for qs, o in zip(new_factors, old)]
    return treedef.unflatten(us), ScaleByPsgdKronState(
        mu=treedef.unflatten(new_mu), factors=treedef.unflatten(new_factors), key=jax.random.key_data(key),
        count=count)


def _none_or_positive(call, name, value):
    return None if value is None else POSITIVE.check(call, name, value)


_DOMAINS = dict(
    b1=UNIT, precond_lr=UNIT, precond_update_prob=Real(0.0, 1.0), max_size_triangular=Integer(0),
    preconditioner_init_scale=Valid(rule=_none_or_positive, text="must be None or in (0, inf)", values=POSITIVE),
    momentum_into_precond_update=Flag(), key=_KEY, mu_dtype=FloatDtype())


@combinator
def scale_by_psgd_kron(b1: ScalarOrSchedule = 0.9, precond_lr: ScalarOrSchedule = 0.1,
                       precond_update_prob: ScalarOrSchedule = 1.0, max_size_triangular: int = 8192,
                       preconditioner_init_scale: float | None = None, momentum_into_precond_update: bool = True,
                       key: int | jax.Array = 0, *, mu_dtype: DType | None = None) -> Update:
    r"""Scales updates by PSGD Kron: the momentum whitened by Kronecker factors fitted on a Lie group.

    Update rule at step $t$ (counting from 1), for a leaf $G$ of $k$ axes with factors $Q_1, \dots, Q_k$ (upper
    triangular, or diagonal), $Q = Q_1 \otimes \cdots \otimes Q_k$ acting on the leaf axis by axis ($\times_i$
    the product along axis $i$), $P = Q^\top Q$, $b_1$ = ``b1``, $\mu$ = ``precond_lr``, $p_t$ =
    ``precond_update_prob`` and $A_{(i)}$ the leaf $A$ as a matrix whose rows are its axis $i$:

    $$
    \begin{align*}
    m &\gets b_1 m + (1 - b_1)\, G, \qquad h = \hat m = m / (1 - b_1^t) \\
    A &= h \times_1 Q_1 \cdots \times_k Q_k, \qquad
    B = v \times_1 Q_1^{-\top} \cdots \times_k Q_k^{-\top}, \qquad v \sim \mathcal{N}(0, I) \\
    Q_i &\gets Q_i - \frac{\mu}{\lVert A_{(i)} A_{(i)}^\top + B_{(i)} B_{(i)}^\top \rVert}\,
        \operatorname{triu}\!\left(A_{(i)} A_{(i)}^\top - B_{(i)} B_{(i)}^\top\right) Q_i
        \qquad \text{(with probability } p_t \text{, every } i \text{ from the same } A, B\text{)} \\
    u &= P \hat m = \hat m \times_1 Q_1^\top Q_1 \cdots \times_k Q_k^\top Q_k
    \end{align*}
    $$

    This is a step on the group of upper-triangular matrices with positive diagonal down the gradient of Li's
    criterion $E[h^\top P h + v^\top P^{-1} v]$, whose minimum is the whitening preconditioner
    $P = E[h h^\top]^{-1/2}$ (the Hessian-vector-free form: the momentum stands where a Hessian-vector product
    would). A diagonal factor takes the diagonal of the same gradient, normalised by its largest entry; the norm
    of a triangular one is a lower bound of the spectral norm (see ``norm_lower_bound``), which is at least the
    largest diagonal entry, so that each diagonal multiplier stays at least $1 - \mu > 0$. An axis of more than
    ``max_size_triangular`` elements, a vector and a scalar get diagonal factors (a scalar's is 0-d); an empty
    leaf none ($u = \hat m$). The factors start at the identity; at the first step each of a $k$-factor leaf's is
    multiplied by $s^{1/k}$ before the fit, so that $P = s^2 I$, with $s$ = ``preconditioner_init_scale`` or, if
    None, Li's $s = (\max_\ell \operatorname{mean} |g_\ell|^4)^{-1/8}$ over the first gradients' leaves.
    With ``momentum_into_precond_update=False`` the fit reads the gradient, $h = G$ (the preconditioned step
    is still $P \hat m$).

    Randomness: the state's key is split at each step into the next key, one draw $U \sim \mathcal{U}[0, 1)$
    (the fit runs where $U < p_t$: always for $p_t = 1$, never for $p_t = 0$) and a key per leaf position of the
    tree (None leaves counted), from which the leaf's probe $v$ is drawn in the factors' dtype. The same ``key``
    gives the same steps; the fit is a ``lax.cond``, so a step without one costs only the preconditioning.

    Numerically: $A$ and $B$ are divided by their largest entry before their products (the step is the same, no
    square overflows), the normalising norm is at least the smallest normal number, and a new factor that is not
    finite leaves the leaf's factors as they were; so rank-deficient, zero, tiny or huge gradients (a NaN one too)
    never turn the factors to NaN. The factors are in at least float32 (bfloat16 params keep float32 factors).
    Derivatives through the step take the factors and the first scale as constants.

    Not offered (psgd_jax's ``kron`` options): ``min_ndim_triangular``, ``memory_save_mode``, the scanned-layers
    handling, and the default schedule of ``precond_update_prob`` (1 for 500 steps, then decaying to 0.03): pass
    a schedule of the count.

    Args:
        b1: decay of the momentum, in [0, 1); 0 takes the gradient. Default: ``0.9``.
        precond_lr: the step size $\mu$ on the Lie group, in [0, 1). Default: ``0.1``.
        precond_update_prob: the probability of a fit at each step, in [0, 1], or a schedule of the count.
            Default: ``1.0``.
        max_size_triangular: the largest axis that gets a triangular factor, an integer >= 0; larger axes get
            diagonal ones. Default: ``8192``.
        preconditioner_init_scale: the scale $s$ of the first preconditioner $P = s^2 I$, > 0, or None to set it
            from the first gradients as Li does. Default: ``None``.
        momentum_into_precond_update: fit the preconditioner to the momentum (True) or to the gradient (False).
            Default: ``True``.
        key: an int seed in [0, 2**32), a JAX PRNG key or its raw key data, for the draws. Default: ``0``.
        mu_dtype: the momentum's dtype; None: the params' (at least float32). Default: ``None``.

    Returns:
        An update object with state ``ScaleByPsgdKronState(mu, factors, key, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_psgd_kron(b1=0.0, precond_lr=0.0, preconditioner_init_scale=2.0)
        >>> params = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)}
        >>> state = opt.init(params)
        >>> u, state = opt.update({"w": jnp.ones((2, 3)), "b": jnp.array([1.0, -1.0, 0.5])}, state)
        >>> u["b"]  # no fit (precond_lr = 0): P = s² I
        Array([ 4., -4.,  2.], dtype=float32)
        >>> [q.shape for q in opt.get_state(state, "scale_by_psgd_kron.factors")["w"]]
        [(2, 2), (3, 3)]

    References:
        Li, "Preconditioned Stochastic Gradient Descent", IEEE TNNLS 2018. https://arxiv.org/abs/1512.04202;
        Li, "Black Box Lie Group Preconditioners for SGD", 2022. https://arxiv.org/abs/2211.04422
    """
    options = dict(b1=b1, precond_lr=precond_lr, precond_update_prob=precond_update_prob,
                   max_size_triangular=max_size_triangular, preconditioner_init_scale=preconditioner_init_scale,
                   momentum_into_precond_update=momentum_into_precond_update, key=key, mu_dtype=mu_dtype)
    # Which factors are triangular shapes the state; whether the fit reads the momentum picks the kernel.
    return stateful(_init_scale_by_psgd_kron, _apply_scale_by_psgd_kron, name="scale_by_psgd_kron", options=options,
                    domains=_DOMAINS, static=("max_size_triangular", "momentum_into_precond_update"),
                    schedulable=("b1", "precond_lr", "precond_update_prob"))
