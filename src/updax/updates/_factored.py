"""Memory-light second moments and block-wise scalings: Adafactor, SM3 and Muon."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree
from updax import _validate as check
from updax._core import combinator, stateful, stateless

# The quintic Newton–Schulz coefficients of Muon (Jordan et al., 2024).
_NS_COEFFS = (3.4445, -4.7750, 2.0315)

# --------------------------------------------------------------------------
# States


class ScaleByFactoredRmsState(NamedTuple):
    """Adafactor's second moments and the steps taken.

    For a factored leaf ``v_row`` is the EMA of ``g²`` averaged over the
    leaf's largest axis and ``v_col`` over its second largest (optax's names
    and layout); ``v`` is the full EMA of ``g²`` for a leaf that is not
    factored. The fields a leaf does not use hold a one-element zero.
    """

    v_row: object
    v_col: object
    v: object
    count: jax.Array


class ScaleBySm3State(NamedTuple):
    """SM3's accumulators and the momentum of the preconditioned updates.

    ``accumulators`` holds, for each leaf, a tuple of one vector per axis: the
    maxima of the accumulated squares over the other axes (a leaf with fewer
    than two axes keeps one full-size accumulator). ``mu`` is the momentum.
    """

    accumulators: object
    mu: object


class ScaleByMuonState(NamedTuple):
    """The momentum ``mu`` and the steps taken ``count``."""

    mu: object
    count: jax.Array


# --------------------------------------------------------------------------
# Adafactor: factored second moments, relative step size, update clipping


def _factored_dims(shape, factored, min_dim_size_to_factor):
    """(second largest axis, largest axis) when the second largest is big enough, else None."""
    if not factored or len(shape) < 2:
        return None
    order = np.argsort(shape)  # ties broken as optax breaks them
    if shape[order[-2]] < min_dim_size_to_factor:
        return None
    return int(order[-2]), int(order[-1])


def _without(shape, axis):
    return tuple(n for i, n in enumerate(shape) if i != axis)


def _init_scale_by_factored_rms(params, *, factored, min_dim_size_to_factor, accumulator_dtype):
    def leaf(p):
        p = jnp.asarray(p)
        dtype = accumulator_dtype if accumulator_dtype is not None else _tree.compute_dtype(p.dtype)
        dims = _factored_dims(p.shape, factored, min_dim_size_to_factor)
        # Placeholders are separate buffers: a state holding one buffer twice cannot be donated.
        if dims is None:
            return jnp.zeros((1,), dtype), jnp.zeros((1,), dtype), _tree.accumulator_like(p, accumulator_dtype)
        second, largest = dims
        return (jnp.zeros(_without(p.shape, largest), dtype), jnp.zeros(_without(p.shape, second), dtype),
                jnp.zeros((1,), dtype))

    v_row, v_col, v = _tree.tree_map_unzip("scale_by_factored_rms", leaf, 3, params, names=("params",))
    return ScaleByFactoredRmsState(v_row=v_row, v_col=v_col, v=v, count=_tree.zero_count())


def _apply_scale_by_factored_rms(updates, state, params, *, factored, decay_rate, step_offset,
                                 min_dim_size_to_factor, epsilon):
    t = (state.count - step_offset + 1).astype(jnp.float32)
    decay = 1.0 - t ** (-decay_rate)

    def leaf(g, r0, c0, v0):
        c = _tree.compute_dtype(g.dtype, r0.dtype, c0.dtype, v0.dtype)
        g32, d = g.astype(c), decay.astype(c)
        g2 = g32 * g32 + epsilon
        dims = _factored_dims(g.shape, factored, min_dim_size_to_factor)
        if dims is None:
            v = d * v0.astype(c) + (1 - d) * g2
            return (g32 * jax.lax.rsqrt(v)).astype(g.dtype), r0, c0, v.astype(v0.dtype)
        second, largest = dims
        r = d * r0.astype(c) + (1 - d) * jnp.mean(g2, axis=largest)
        col = d * c0.astype(c) + (1 - d) * jnp.mean(g2, axis=second)
        second_in_r = second - 1 if second > largest else second
        row_factor = jax.lax.rsqrt(r / jnp.mean(r, axis=second_in_r, keepdims=True))
        u = g32 * jnp.expand_dims(row_factor, largest) * jnp.expand_dims(jax.lax.rsqrt(col), second)
        return u.astype(g.dtype), r.astype(r0.dtype), col.astype(c0.dtype), v0

    u, v_row, v_col, v = _tree.tree_map_unzip("scale_by_factored_rms", leaf, 4, updates, state.v_row, state.v_col,
                                              state.v, names=("updates", "state.v_row", "state.v_col", "state.v"))
    return u, ScaleByFactoredRmsState(v_row=v_row, v_col=v_col, v=v, count=_tree.safe_increment(state.count))


@combinator
def scale_by_factored_rms(factored=True, decay_rate=0.8, step_offset=0, min_dim_size_to_factor=128, epsilon=1e-30,
                          *, accumulator_dtype=None):
    """Scales updates by Adafactor's factored estimate of their root mean square.

    Update rule, with ``t = count - step_offset + 1`` and ``β = 1 - t^(-decay_rate)``.
    A leaf whose two largest axes both have at least ``min_dim_size_to_factor``
    elements keeps one statistic per row and one per column (largest axis
    ``j``, second largest ``i``)::

        s = g² + epsilon
        r ← β·r + (1-β)·mean_j(s)            c ← β·c + (1-β)·mean_i(s)
        u = g / sqrt(r / mean_i(r)) / sqrt(c)

    Any other leaf keeps the full ``v ← β·v + (1-β)·s`` and ``u = g / sqrt(v)``.

    Args:
        factored: factor the second moment of leaves large enough.
            Default: ``True``.
        decay_rate: the exponent of the decay schedule ``β``, >= 0.
            Default: ``0.8``.
        step_offset: subtracted from the step count, e.g. the step at which a
            fine-tuning run starts; an integer >= 0. The count must not be
            below it (``β`` is undefined there, as in optax). Default: ``0``.
        min_dim_size_to_factor: the size both of a leaf's two largest axes
            need to be factored, a positive integer. Default: ``128``.
        epsilon: added to the squared updates, >= 0. Default: ``1e-30``.
        accumulator_dtype: storage dtype of the statistics; None keeps the
            params' dtype but at least float32. Default: ``None``.

    Returns:
        An update object with state ``ScaleByFactoredRmsState(v_row, v_col, v, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_factored_rms(min_dim_size_to_factor=2)
        >>> state = opt.init({"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)})
        >>> g = {"w": jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), "b": jnp.array([2.0, -1.0, 0.5])}
        >>> u, state = opt.update(g, state)
        >>> u["b"]  # unfactored, β = 0 on the first step: sign(g)
        Array([ 1., -1.,  1.], dtype=float32)
        >>> u["w"]  # factored: g divided by a rank-one estimate of |g|
        Array([[0.6183 , 0.9469, 1.1402 ],
               [1.0547 , 1.0094 , 0.9723 ]], dtype=float32)
        >>> opt.get_state(state, "scale_by_factored_rms.v_row")["w"].shape  # one per row: w is 2 x 3
        (2,)

    References:
        Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear
        Memory Cost", ICML 2018. https://arxiv.org/abs/1804.04235
    """
    call = "scale_by_factored_rms"
    options = dict(factored=check.flag(call, "factored", factored),
                   decay_rate=check.nonnegative(call, "decay_rate", decay_rate),
                   step_offset=check.integer(call, "step_offset", step_offset),
                   min_dim_size_to_factor=check.positive_int(call, "min_dim_size_to_factor", min_dim_size_to_factor),
                   epsilon=check.nonnegative(call, "epsilon", epsilon),
                   accumulator_dtype=check.float_dtype(call, "accumulator_dtype", accumulator_dtype))
    # The factoring decision shapes the state, so the size threshold is structure, not data.
    return stateful(_init_scale_by_factored_rms, _apply_scale_by_factored_rms, name=call, options=options,
                    static=("min_dim_size_to_factor",))


def _rms(x):
    return jnp.sqrt(jnp.mean(x * x))


def _apply_scale_by_param_block_rms(updates, params, *, min_scale):
    def leaf(g, p):
        c = _tree.compute_dtype(g.dtype, p.dtype)
        return (g.astype(c) * jnp.maximum(_rms(p.astype(c)), min_scale)).astype(g.dtype)

    return _tree.tree_map("scale_by_param_block_rms", leaf, updates, params, names=("updates", "params"))


@combinator
def scale_by_param_block_rms(min_scale=1e-3):
    """Scales each leaf's update by the root mean square of its parameters (Adafactor's relative step).

    Update rule, per leaf: ``u ← u · max(rms(p), min_scale)``, with
    ``rms(p) = sqrt(mean(p²))``.

    Args:
        min_scale: the smallest factor, >= 0; it keeps parameters at zero
            moving. Default: ``1e-3``.

    Returns:
        A stateless update object; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_param_block_rms()
        >>> params = {"w": jnp.array([1.0, 7.0]), "b": jnp.zeros(2)}
        >>> u, _ = opt.update({"w": jnp.array([0.1, -0.2]), "b": jnp.ones(2)}, opt.init(params), params)
        >>> u["w"], u["b"]  # rms = 5; the zero block moves by min_scale
        (Array([ 0.5, -1. ], dtype=float32), Array([0.001, 0.001], dtype=float32))

    References:
        Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear
        Memory Cost", ICML 2018 (relative step size).
        https://arxiv.org/abs/1804.04235
    """
    call = "scale_by_param_block_rms"
    return stateless(_apply_scale_by_param_block_rms, name=call,
                     options=dict(min_scale=check.nonnegative(call, "min_scale", min_scale)), needs_params=True)


def _apply_clip_by_block_rms(updates, params, *, threshold):
    def leaf(g):
        g32 = g.astype(_tree.compute_dtype(g.dtype))
        return (g32 / jnp.maximum(1.0, _rms(g32) / threshold)).astype(g.dtype)

    return jax.tree.map(leaf, updates)


@combinator
def clip_by_block_rms(threshold=1.0):
    """Clips each leaf's update to a root mean square of at most ``threshold`` (Adafactor).

    Update rule, per leaf: ``u ← u / max(1, rms(u) / threshold)``, with
    ``rms(u) = sqrt(mean(u²))``.

    Args:
        threshold: the largest root mean square of a leaf, > 0. Default: ``1.0``.

    Returns:
        A stateless update object.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.clip_by_block_rms(threshold=1.0)
        >>> u, _ = opt.update({"w": jnp.array([1.0, 7.0]), "b": jnp.array([0.5])}, opt.init(None))
        >>> u["w"], u["b"]  # rms 5 is divided down to 1; rms 0.5 is left alone
        (Array([0.2, 1.4], dtype=float32), Array([0.5], dtype=float32))

    References:
        Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear
        Memory Cost", ICML 2018 (update clipping).
        https://arxiv.org/abs/1804.04235
    """
    call = "clip_by_block_rms"
    return stateless(_apply_clip_by_block_rms, name=call,
                     options=dict(threshold=check.positive(call, "threshold", threshold)))


# --------------------------------------------------------------------------
# SM3: second moments covered by per-axis maxima


def _init_scale_by_sm3(params, *, mu_dtype, accumulator_dtype):
    def covers(p):
        p = jnp.asarray(p)
        if p.ndim < 2:
            return (_tree.accumulator_like(p, accumulator_dtype),)
        dtype = accumulator_dtype if accumulator_dtype is not None else _tree.compute_dtype(p.dtype)
        return tuple(jnp.zeros((n,), dtype) for n in p.shape)

    return ScaleBySm3State(accumulators=jax.tree.map(covers, params), mu=_tree.accumulators(params, mu_dtype))


def _along(ndim, axis):
    """The shape that broadcasts a vector along ``axis`` of an ``ndim``-array."""
    return tuple(-1 if i == axis else 1 for i in range(ndim))


def _apply_scale_by_sm3(updates, state, params, *, b1, b2, eps):
    call = "scale_by_sm3"
    _tree.check_same_structure(call, updates, state.mu, "updates", "state.mu")

    def leaf(g, covers, m0):
        c = _tree.compute_dtype(g.dtype, m0.dtype, *(a.dtype for a in covers))
        g32 = g.astype(c)
        if g.ndim < 2:
            previous = covers[0].astype(c)
        else:
            previous = functools.reduce(jnp.minimum, [a.astype(c).reshape(_along(g.ndim, i))
                                                      for i, a in enumerate(covers)])
        gain = jnp.where(b2 == 1.0, 1.0, 1.0 - b2).astype(c)  # b2 = 1 sums the squares, b2 < 1 averages them
        s = gain * g32 * g32 + b2 * previous
        m = b1 * m0.astype(c) + (1 - b1) * g32 * jnp.where(s > 0, jax.lax.rsqrt(s + eps), 0.0)
        if g.ndim < 2:
            new = (s,)
        else:
            new = tuple(jnp.max(s, axis=tuple(j for j in range(g.ndim) if j != i)) for i in range(g.ndim))
        return m.astype(g.dtype), tuple(x.astype(a.dtype) for x, a in zip(new, covers)), m.astype(m0.dtype)

    # state.accumulators holds a tuple per leaf of updates: map over updates' structure, then unzip.
    treedef = jax.tree.structure(updates)
    out = treedef.flatten_up_to(jax.tree.map(leaf, updates, state.accumulators, state.mu))
    u, accumulators, mu = (treedef.unflatten([o[i] for o in out]) for i in range(3))
    return u, ScaleBySm3State(accumulators=accumulators, mu=mu)


@combinator
def scale_by_sm3(b1=0.9, b2=1.0, eps=1e-8, *, mu_dtype=None, accumulator_dtype=None):
    """Scales updates by SM3: an AdaGrad-like second moment stored as per-axis maxima.

    Update rule, for a leaf with axes ``1..k`` and one vector ``a_i`` per axis
    (a leaf with fewer than two axes keeps a full ``a``)::

        v = (1-b2)·g² + b2·min_i a_i     (b2 < 1;  b2 = 1: v = g² + min_i a_i)
        m ← b1·m + (1-b1)·g / sqrt(v + eps)      (0 where v = 0)
        a_i ← max of v over all axes but i;   u = m

    Args:
        b1: decay of the momentum, in [0, 1). Default: ``0.9``.
        b2: decay of the accumulated squares, in [0, 1]; 1 sums them.
            Default: ``1.0``.
        eps: added inside the square root, >= 0. Default: ``1e-8``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        accumulator_dtype: storage dtype of the accumulators, as ``mu_dtype``.
            Default: ``None``.

    Returns:
        An update object with state ``ScaleBySm3State(accumulators, mu)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_sm3(b1=0.0, eps=0.0)
        >>> state = opt.init({"w": jnp.zeros((2, 2))})
        >>> u, state = opt.update({"w": jnp.array([[3.0, 0.0], [0.0, 4.0]])}, state)
        >>> u["w"]  # the first step is sign(g)
        Array([[1., 0.],
               [0., 1.]], dtype=float32)
        >>> opt.get_state(state, "scale_by_sm3.accumulators")["w"]  # row maxima, column maxima of g²
        (Array([ 9., 16.], dtype=float32), Array([ 9., 16.], dtype=float32))

    References:
        Anil et al., "Memory-Efficient Adaptive Optimization", NeurIPS 2019.
        https://arxiv.org/abs/1901.11150
    """
    call = "scale_by_sm3"
    options = dict(b1=check.unit(call, "b1", b1), b2=check.real(call, "b2", b2, 0.0, 1.0),
                   eps=check.nonnegative(call, "eps", eps),
                   mu_dtype=check.float_dtype(call, "mu_dtype", mu_dtype),
                   accumulator_dtype=check.float_dtype(call, "accumulator_dtype", accumulator_dtype))
    return stateful(_init_scale_by_sm3, _apply_scale_by_sm3, name=call, options=options)


# --------------------------------------------------------------------------
# Muon: momentum orthogonalized by a Newton–Schulz iteration


def _check_ns_coeffs(call, value):
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise TypeError(f"{call}(ns_coeffs={value!r}): ns_coeffs must be a tuple of three real numbers")
    return tuple(check.real(call, "ns_coeffs", k) for k in value)


def _newton_schulz(x, ns_coeffs, ns_steps, eps):
    """The quintic ``x ← a·x + (b·xxᵀ + c·(xxᵀ)²)·x`` on a matrix, from ``x / (‖x‖_F + eps)``."""
    a, b, c = (jnp.asarray(k, x.dtype) for k in ns_coeffs)
    tall = x.shape[0] > x.shape[1]
    if tall:  # the iteration commutes with transposition: work with the smaller Gram matrix
        x = x.T
    x = x / (jnp.linalg.norm(x) + eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def _apply_scale_by_newton_schulz(updates, params, *, ns_coeffs, ns_steps, eps):
    def leaf(g):
        if g.ndim != 2:
            return g
        return _newton_schulz(g.astype(_tree.compute_dtype(g.dtype)), ns_coeffs, ns_steps, eps).astype(g.dtype)

    return jax.tree.map(leaf, updates)


@combinator
def scale_by_newton_schulz(ns_coeffs=_NS_COEFFS, ns_steps=5, eps=1e-8):
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
        ns_steps: the number of iterations, a positive integer. Default: ``5``.
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
    options = dict(ns_coeffs=_check_ns_coeffs(call, ns_coeffs), ns_steps=check.positive_int(call, "ns_steps", ns_steps),
                   eps=check.nonnegative(call, "eps", eps))
    # The number of iterations unrolls into the compiled step: structure, not data.
    return stateless(_apply_scale_by_newton_schulz, name=call, options=options, static=("ns_steps",))


def _init_scale_by_muon(params, *, mu_dtype):
    return ScaleByMuonState(mu=_tree.accumulators(params, mu_dtype), count=_tree.zero_count())


def _apply_scale_by_muon(updates, state, params, *, ns_coeffs, ns_steps, beta, eps, nesterov):
    count = _tree.safe_increment(state.count)
    t = count.astype(jnp.float32)
    correction, next_correction = 1 - beta**t, 1 - beta ** (t + 1)

    def leaf(g, m0):
        c = _tree.compute_dtype(g.dtype, m0.dtype)
        g32 = g.astype(c)
        m = beta * m0.astype(c) + (1 - beta) * g32
        if nesterov:
            m_hat = beta * m / next_correction.astype(c) + (1 - beta) * g32 / correction.astype(c)
        else:
            m_hat = m / correction.astype(c)
        u = _newton_schulz(m_hat, ns_coeffs, ns_steps, eps) if g.ndim == 2 else m_hat
        return u.astype(g.dtype), m.astype(m0.dtype)

    u, mu = _tree.tree_map_unzip("scale_by_muon", leaf, 2, updates, state.mu, names=("updates", "state.mu"))
    return u, ScaleByMuonState(mu=mu, count=count)


@combinator
def scale_by_muon(ns_coeffs=_NS_COEFFS, ns_steps=5, beta=0.95, eps=1e-8, nesterov=True, *, mu_dtype=None):
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
        ns_steps: the number of iterations, a positive integer. Default: ``5``.
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
    options = dict(ns_coeffs=_check_ns_coeffs(call, ns_coeffs), ns_steps=check.positive_int(call, "ns_steps", ns_steps),
                   beta=check.unit(call, "beta", beta), eps=check.nonnegative(call, "eps", eps),
                   nesterov=check.flag(call, "nesterov", nesterov),
                   mu_dtype=check.float_dtype(call, "mu_dtype", mu_dtype))
    return stateful(_init_scale_by_muon, _apply_scale_by_muon, name=call, options=options, static=("ns_steps",))


def _shape_scale(g):
    if g.ndim != 2:
        return g
    fan_in, fan_out = g.shape
    c = _tree.compute_dtype(g.dtype)
    return (g.astype(c) * max(1.0, fan_out / fan_in) ** 0.5).astype(g.dtype)


def _apply_scale_by_shape(updates, params):
    return jax.tree.map(_shape_scale, updates)


@combinator
def scale_by_shape():
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
        networks", 2024; optax.contrib.scale_by_shape.
    """
    return stateless(_apply_scale_by_shape, name="scale_by_shape")
