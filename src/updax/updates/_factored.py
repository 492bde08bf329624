"""Memory-light second moments and block-wise scalings: Adafactor and SM3.

Adafactor's factored second moment, its relative step (the parameter
block's RMS) and its update clipping (the update block's RMS); SM3's
second moment covered by per-axis maxima.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree
from updax._combinators import combinator
from updax._domains import NON_NEGATIVE, POSITIVE, UNIT, Count, Flag, FloatDtype, Integer, NonNegativeField, Real
from updax._primitives import stateful, stateless
from updax._typing import DType, ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import abs_sq, moment, number, real_only, safe_sqrt

# --------------------------------------------------------------------------
# States


class ScaleByFactoredRmsState(NamedTuple):
    """Adafactor's second moments and the steps taken.

    For a factored leaf ``v_row`` is the EMA of $g^2$ (plus ``epsilon``) averaged over the
    leaf's largest axis and ``v_col`` over its second largest (optax's names
    and layout); ``v`` is the full EMA of $g^2$ for a leaf that is not
    factored. The fields a leaf does not use hold a one-element zero.
    """

    v_row: NonNegativeField
    v_col: NonNegativeField
    v: NonNegativeField
    count: Count


class ScaleBySm3State(NamedTuple):
    """SM3's accumulators and the momentum of the preconditioned updates.

    ``accumulators`` holds, for each leaf, a tuple of one vector per axis: the
    maxima of the accumulated squares over the other axes (a leaf with fewer
    than two axes keeps one full-size accumulator). ``mu`` is the momentum.
    """

    accumulators: NonNegativeField
    mu: Any


#: What the options of Adafactor's and SM3's stages hold.
_FACTORED_DOMAINS = dict(factored=Flag(), decay_rate=NON_NEGATIVE, step_offset=Integer(0, arrays=True),
                         min_dim_size_to_factor=Integer(1), epsilon=NON_NEGATIVE, accumulator_dtype=FloatDtype(),
                         b1=UNIT, b2=Real(0.0, 1.0), eps=NON_NEGATIVE, mu_dtype=FloatDtype())


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
        # Placeholders are separate buffers (a state holding one buffer twice cannot be donated), replicated
        # over the param's mesh; the factors are split along the param's axes they keep.
        def placeholder():
            return _tree.full((1,), 0.0, dtype, p, dims=(None,))

        if dims is None:
            return placeholder(), placeholder(), _tree.accumulator_like(p, accumulator_dtype)
        second, largest = dims
        axes = range(p.ndim)
        return (_tree.full(_without(p.shape, largest), 0.0, dtype, p, dims=_without(axes, largest)),
                _tree.full(_without(p.shape, second), 0.0, dtype, p, dims=_without(axes, second)), placeholder())

    v_row, v_col, v = _tree.tree_map_unzip("scale_by_factored_rms", leaf, 3, params, names=("params",))
    return ScaleByFactoredRmsState(v_row=v_row, v_col=v_col, v=v, count=_tree.zero_count())


def _real(x):
    """``x``'s real part (``x`` itself when real)."""
    return x.real if jnp.iscomplexobj(x) else x


def _apply_scale_by_factored_rms(updates, state, params, *, factored, decay_rate, step_offset,
                                 min_dim_size_to_factor, epsilon):
    t = (state.count - step_offset).astype(jnp.float32) + 1.0  # + 1 in float: the count may be its dtype's maximum
    decay = 1.0 - t ** (-decay_rate)

    def leaf(g, r0, c0, v0):
        # The statistics are real (|g|², as optax's), in the real dtype of the compute dtype; a complex leaf's
        # (complex-stored, as its params') hold real numbers.
        c = _tree.compute_dtype(g.dtype, r0.dtype, c0.dtype, v0.dtype)
        rc = jnp.finfo(c).dtype
        g32, d = g.astype(c), decay.astype(rc)
        g2 = abs_sq(g32) + epsilon
        dims = _factored_dims(g.shape, factored, min_dim_size_to_factor)
        if dims is None:
            v = moment(d, _real(v0).astype(rc), g2)
            return (g32 * jax.lax.rsqrt(v)).astype(g.dtype), r0, c0, v.astype(v0.dtype)
        second, largest = dims
        r = moment(d, _real(r0).astype(rc), jnp.mean(g2, axis=largest))
        col = moment(d, _real(c0).astype(rc), jnp.mean(g2, axis=second))
        second_in_r = second - 1 if second > largest else second
        row_factor = jax.lax.rsqrt(r / jnp.mean(r, axis=second_in_r, keepdims=True))
        u = g32 * jnp.expand_dims(row_factor, largest) * jnp.expand_dims(jax.lax.rsqrt(col), second)
        return u.astype(g.dtype), r.astype(r0.dtype), col.astype(c0.dtype), v0

    u, v_row, v_col, v = _tree.tree_map_unzip("scale_by_factored_rms", leaf, 4, updates, state.v_row, state.v_col,
                                              state.v, names=("updates", "state.v_row", "state.v_col", "state.v"))
    return u, ScaleByFactoredRmsState(v_row=v_row, v_col=v_col, v=v, count=_tree.safe_increment(state.count))


@combinator
def scale_by_factored_rms(factored: bool = True, decay_rate: ScalarOrSchedule = 0.8, step_offset: int = 0,
                          min_dim_size_to_factor: int = 128, epsilon: ScalarOrSchedule = 1e-30,
                          *, accumulator_dtype: DType = None) -> Update:
    r"""Scales updates by Adafactor's factored estimate of their root mean square.

    Update rule, with $t$ = ``count - step_offset + 1`` (``count`` the steps taken before this one),
    $\beta = 1 - t^{-\rho}$, $\rho$ = ``decay_rate``, $\epsilon$ = ``epsilon``.
    A leaf whose two largest axes both have at least ``min_dim_size_to_factor``
    elements keeps one statistic per row and one per column (largest axis
    $j$, second largest $i$):

    $$
    \begin{align*}
    s &= g^2 + \epsilon \\
    r &\gets \beta r + (1 - \beta) \operatorname{mean}_j(s) \\
    c &\gets \beta c + (1 - \beta) \operatorname{mean}_i(s) \\
    u &= \frac{g}{\sqrt{r / \operatorname{mean}_i(r)}\, \sqrt{c}}
    \end{align*}
    $$

    Any other leaf keeps the full $v \gets \beta v + (1 - \beta)\, s$ and $u = g / \sqrt{v}$.

    Args:
        factored: factor the second moment of leaves large enough.
            Default: ``True``.
        decay_rate: the exponent $\rho$ of the decay schedule $\beta$, >= 0.
            Default: ``0.8``.
        step_offset: subtracted from the step count, e.g. the step at which a
            fine-tuning run starts; an integer >= 0 (a 0-d integer array too,
            traced or not). The count must not be below it ($\beta$ is
            undefined there, as in optax). Default: ``0``.
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
        >>> u["w"].tolist()  # factored: g divided by a rank-one estimate of |g|
        [[0.6183, 0.9469, 1.1402], [1.0547, 1.0094, 0.9723]]
        >>> opt.get_state(state, "scale_by_factored_rms.v_row")["w"].shape  # one per row: w is 2 x 3
        (2,)

    References:
        Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear
        Memory Cost", ICML 2018. https://arxiv.org/abs/1804.04235
    """
    options = dict(factored=factored, decay_rate=decay_rate, step_offset=step_offset,
                   min_dim_size_to_factor=min_dim_size_to_factor, epsilon=epsilon, accumulator_dtype=accumulator_dtype)
    # The factoring decision shapes the state, so the size threshold is structure, not data.
    return stateful(_init_scale_by_factored_rms, _apply_scale_by_factored_rms, name="scale_by_factored_rms",
                    options=options, domains={k: _FACTORED_DOMAINS[k] for k in options},
                    static=("min_dim_size_to_factor",), schedulable=("decay_rate", "epsilon"))


def _rms(x):
    return safe_sqrt(jnp.mean(abs_sq(x)))


def _apply_scale_by_param_block_rms(updates, params, *, min_scale):
    def leaf(g, p):
        c = _tree.compute_dtype(g.dtype, p.dtype)
        return (jnp.maximum(_rms(p.astype(c)), min_scale) * g.astype(c)).astype(g.dtype)

    return _tree.tree_map("scale_by_param_block_rms", leaf, updates, params, names=("updates", "params"))


@combinator
def scale_by_param_block_rms(min_scale: ScalarOrSchedule = 1e-3) -> Update:
    r"""Scales each leaf's update by the root mean square of its parameters (Adafactor's relative step).

    Update rule, per leaf, with $s_\text{min}$ = ``min_scale``: $u \gets u \max(\operatorname{rms}(p), s_\text{min})$,
    with $\operatorname{rms}(p) = \sqrt{\operatorname{mean}(|p|^2)}$.

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
    return stateless(_apply_scale_by_param_block_rms, name="scale_by_param_block_rms",
                     options=dict(min_scale=min_scale), domains=dict(min_scale=NON_NEGATIVE), needs_params=True,
                     schedulable=("min_scale",))


def _apply_scale_by_param_block_norm(updates, params, *, min_scale):
    def leaf(g, p):
        c = _tree.compute_dtype(g.dtype, p.dtype)
        norm = safe_sqrt(jnp.sum(abs_sq(p.astype(c))))
        return (jnp.maximum(norm, min_scale) * g.astype(c)).astype(g.dtype)

    return _tree.tree_map("scale_by_param_block_norm", leaf, updates, params, names=("updates", "params"))


@combinator
def scale_by_param_block_norm(min_scale: ScalarOrSchedule = 1e-3) -> Update:
    r"""Scales each leaf's update by the L2 norm of its parameters.

    Update rule, per leaf, with $s_\text{min}$ = ``min_scale``:
    $u \gets u \max(\lVert p \rVert_2, s_\text{min})$, the norm over all of
    the leaf's elements. :func:`scale_by_param_block_rms` divides that norm
    by the root of the leaf's size.

    Args:
        min_scale: the smallest factor, >= 0; it keeps parameters at zero
            moving. Default: ``1e-3``.

    Returns:
        A stateless update object; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_param_block_norm()
        >>> params = {"w": jnp.array([3.0, 4.0]), "b": jnp.zeros(2)}
        >>> u, _ = opt.update({"w": jnp.array([0.1, -0.2]), "b": jnp.ones(2)}, opt.init(params), params)
        >>> u["w"], u["b"]  # norm 5; the zero block moves by min_scale
        (Array([ 0.5, -1. ], dtype=float32), Array([0.001, 0.001], dtype=float32))

    References:
        Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear
        Memory Cost", ICML 2018 (relative step size).
        https://arxiv.org/abs/1804.04235; optax.scale_by_param_block_norm
        (same rule and options).
    """
    return stateless(_apply_scale_by_param_block_norm, name="scale_by_param_block_norm",
                     options=dict(min_scale=min_scale), domains=dict(min_scale=NON_NEGATIVE), needs_params=True,
                     schedulable=("min_scale",))


def _apply_clip_by_block_rms(updates, params, *, threshold):
    def leaf(g):
        g32 = g.astype(_tree.compute_dtype(g.dtype))
        rms = _rms(g32)
        # max(1, rms / threshold), without 0/0 for a zero update at a threshold (a schedule's) of 0.
        return (g32 / jnp.where(rms > threshold, rms / threshold, 1.0)).astype(g.dtype)

    return jax.tree.map(leaf, updates)


@combinator
def clip_by_block_rms(threshold: ScalarOrSchedule = 1.0) -> Update:
    r"""Clips each leaf's update to a root mean square of at most ``threshold`` (Adafactor).

    Update rule, per leaf, with $\tau$ = ``threshold``: $u \gets u / \max(1, \operatorname{rms}(u) / \tau)$, with
    $\operatorname{rms}(u) = \sqrt{\operatorname{mean}(|u|^2)}$.

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
    return stateless(_apply_clip_by_block_rms, name="clip_by_block_rms", options=dict(threshold=threshold),
                     domains=dict(threshold=POSITIVE), schedulable=("threshold",))


# --------------------------------------------------------------------------
# SM3: second moments covered by per-axis maxima


def _init_scale_by_sm3(params, *, mu_dtype, accumulator_dtype):
    def covers(p):
        p = jnp.asarray(p)
        if p.ndim < 2:
            return (_tree.accumulator_like(p, accumulator_dtype),)
        dtype = accumulator_dtype if accumulator_dtype is not None else _tree.compute_dtype(p.dtype)
        return tuple(_tree.full((n,), 0.0, dtype, p, dims=(i,)) for i, n in enumerate(p.shape))

    return ScaleBySm3State(accumulators=jax.tree.map(covers, params), mu=_tree.accumulators(params, mu_dtype))


def _along(ndim, axis):
    """The shape that broadcasts a vector along ``axis`` of an ``ndim``-array."""
    return tuple(-1 if i == axis else 1 for i in range(ndim))


def _apply_scale_by_sm3(updates, state, params, *, b1, b2, eps):
    call = "scale_by_sm3"
    real_only(call, updates)
    _tree.check_same_structure(call, updates, state.mu, "updates", "state.mu")
    # b2 = 1 sums the squares, b2 < 1 averages them (once per step, not per leaf, for a number)
    gain = (1.0 if b2 == 1 else 1.0 - b2) if number(b2) is not None else jnp.where(b2 == 1.0, 1.0, 1.0 - b2)

    def leaf(g, covers, m0):
        c = _tree.compute_dtype(g.dtype, m0.dtype, *(a.dtype for a in covers))
        g32 = _tree.cast(g, c)
        if g.ndim < 2:
            previous = _tree.cast(covers[0], c)
        else:
            previous = functools.reduce(jnp.minimum, [_tree.cast(a, c).reshape(_along(g.ndim, i))
                                                  for i, a in enumerate(covers)])
        s = (gain if number(gain) is not None else gain.astype(c)) * g32 * g32 + b2 * previous
        m = moment(b1, _tree.cast(m0, c), g32 * jnp.where(s > 0, jax.lax.rsqrt(s + eps), 0.0))
        if g.ndim < 2:
            new = (s,)
        else:
            # A zero-size leaf has no maximum: its covers are 0 (s >= 0 everywhere else). Only there: a
            # maximum with an initial value is one more operation per leaf, which XLA keeps out of the reduction's
            # kernel (one more kernel per cover).
            new = tuple(jax.lax.reduce_max(s, tuple(j for j in range(g.ndim) if j != i)) if s.size else
                        jnp.max(s, axis=tuple(j for j in range(g.ndim) if j != i), initial=0.0)
                        for i in range(g.ndim))
        return m.astype(g.dtype), tuple(x.astype(a.dtype) for x, a in zip(new, covers)), m.astype(m0.dtype)

    # state.accumulators holds a tuple per leaf of updates: map over updates' structure, then unzip.
    treedef = jax.tree.structure(updates)
    out = treedef.flatten_up_to(jax.tree.map(leaf, updates, state.accumulators, state.mu))
    u, accumulators, mu = (treedef.unflatten([o[i] for o in out]) for i in range(3))
    return u, ScaleBySm3State(accumulators=accumulators, mu=mu)


@combinator
def scale_by_sm3(b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 1.0, eps: ScalarOrSchedule = 1e-8, *,
                 mu_dtype: DType = None, accumulator_dtype: DType = None) -> Update:
    r"""Scales updates by SM3: an AdaGrad-like second moment stored as per-axis maxima.

    Update rule, for a leaf with axes $1, \dots, k$ and one vector $a_i$ per axis
    (a leaf with fewer than two axes keeps a full $a$), with $b_1$ = ``b1``, $b_2$ = ``b2``,
    $\epsilon$ = ``eps``:

    $$
    \begin{align*}
    v &= (1 - b_2)\, g^2 + b_2 \min_i a_i \\
    m &\gets b_1 m + (1 - b_1)\, g / \sqrt{v + \epsilon} \\
    a_i &\gets \max_{\text{all axes but } i} v \\
    u &= m
    \end{align*}
    $$

    where $b_2 = 1$ sums instead, $v = g^2 + \min_i a_i$, and $g / \sqrt{v + \epsilon}$ is 0 where $v = 0$.

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
    options = dict(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype, accumulator_dtype=accumulator_dtype)
    # (SM3's b2 may be 1, which sums the squares: in [0, 1], where the others' decays are in [0, 1))
    return stateful(_init_scale_by_sm3, _apply_scale_by_sm3, name="scale_by_sm3", options=options,
                    domains={k: _FACTORED_DOMAINS[k] for k in options}, schedulable=("b1", "b2", "eps"))
