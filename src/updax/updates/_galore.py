"""GaLore: Adam (or a base pipeline) run on each matrix gradient projected onto a low-rank subspace, refreshed
every few steps.

Which leaves are matrices, and which of their axes are rows, columns and batch, is ``weight_dimension_numbers``
(see ``_muon_dims.py``), as for the Muon family.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import (NON_NEGATIVE, UNIT, Count, FloatDtype, Integer, NonNegativeField, Pipeline, Valid,
                            fail)
from updax._leafwise import per_leaf
from updax._primitives import stateful
from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.updates._adam import adam_direction
from updax.updates._kernels import bias_corrections, real_only
from updax.updates._muon_dims import DIMENSION_NUMBERS, as_matrices, fans, from_matrices, leaf_axes
from updax.updates._soap import _gathered, _kept_like, _like


class ScaleByGaloreState(NamedTuple):
    """Adam's moments ``mu`` and ``nu`` (for a matrix in its projected coordinates: ``(*batch, r, n)`` when the
    projector is on the left, ``(*batch, m, r)`` on the right; for any other leaf its own shape), the projector of
    each matrix ``projector`` (``(*batch, m, r)`` on the left, ``(*batch, n, r)`` on the right, orthonormal
    columns; a one-element zero for a leaf that is not a matrix), and the steps taken ``count``. A matrix's
    moments and projector are replicated over its param's mesh (split as the param where they have its shape: a
    full-rank projector of a matrix with more rows, say)."""

    mu: Any
    nu: NonNegativeField
    projector: Any
    count: Count


class ScaleByGaloreBaseState(NamedTuple):
    """With a ``base_optimizer``: its state ``base_optimizer`` (made by its ``init`` on the projected shapes: a
    matrix's ``(*batch, r, n)`` or ``(*batch, m, r)`` in at least float32, any other leaf as the param), the
    projectors ``projector`` and the steps taken ``count``, as :class:`ScaleByGaloreState`'s."""

    base_optimizer: Any
    projector: Any
    count: Count


#: Adam's options, built in: with a base_optimizer they are its to set, and stored as None (so that they neither
#: print nor are held in the state, where setting one would change nothing).
_ADAM_DEFAULTS = dict(b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, mu_dtype=None)


def _adams_unit(call, name, value):
    """A built-in Adam's decay: in [0, 1), or None where a base_optimizer takes Adam's place."""
    return None if value is None else UNIT.check(call, name, value, schedulable=True)


def _adams_non_negative(call, name, value):
    """A built-in Adam's eps: >= 0, or None where a base_optimizer takes Adam's place."""
    return None if value is None else NON_NEGATIVE.check(call, name, value, schedulable=True)


_ADAMS_UNIT = Valid(rule=_adams_unit, text=UNIT.text, values=UNIT)
_ADAMS_NON_NEGATIVE = Valid(rule=_adams_non_negative, text=NON_NEGATIVE.text, values=NON_NEGATIVE)

#: What the options of scale_by_galore hold.
_GALORE_DOMAINS = dict(rank=Integer(1), update_proj_gap=Integer(1), scale=NON_NEGATIVE, b1=_ADAMS_UNIT,
                       b2=_ADAMS_UNIT, eps=_ADAMS_NON_NEGATIVE, eps_root=_ADAMS_NON_NEGATIVE, mu_dtype=FloatDtype(),
                       weight_dimension_numbers=DIMENSION_NUMBERS,
                       base_optimizer=Pipeline(optional=True, without_params=True,
                                               why=": it runs on the projected gradients, which no params match; "
                                                   "decay the weights after scale_by_galore, as galore's decay"))


def _plan(p, axes, rank):
    """A matrix leaf's batch shape, its sizes ``(m, n)``, the rank ``r = min(rank, m, n)`` and whether the
    projector is on the left (``m >= n``: the projected gradient is ``r x n``, the smaller side)."""
    m, n = fans(p, axes)
    return tuple(p.shape[a] for a in axes[0]), m, n, min(rank, m, n), m >= n


def _init_scale_by_galore(params, *, rank, mu_dtype, weight_dimension_numbers=None, base_optimizer=None):
    call = "scale_by_galore"
    leaves, treedef = jax.tree.flatten(params)
    axes = leaf_axes(call, weight_dimension_numbers, params, params)
    mus, nus, projectors, proxies = [], [], [], []
    for p, a in zip(leaves, axes):
        p = p if isinstance(p, jax.Array) else jnp.asarray(p)
        dtype = _tree.compute_dtype(p.dtype)
        if a is None:  # Adam on the whole leaf; no projector (a separate buffer per leaf: donation needs it)
            mus.append(_tree.accumulator_like(p, mu_dtype))
            nus.append(_tree.accumulator_like(p, None))
            projectors.append(_tree.full((1,), 0.0, dtype, p, dims=(None,)))
            proxies.append(p)
            continue
        batch, m, n, r, left = _plan(p, a, rank)
        low, side = batch + ((r, n) if left else (m, r)), batch + ((m if left else n), r)

        def zeros(shape, dtype, p=p):  # replicated over the param's mesh; split as it is where shaped like it
            return _tree.full(shape, 0.0, dtype, p, dims=None if shape == p.shape else (None,) * len(shape))

        mus.append(zeros(low, mu_dtype if mu_dtype is not None else dtype))
        nus.append(zeros(low, dtype))
        projectors.append(zeros(side, dtype))
        proxies.append(zeros(low, dtype))
    if base_optimizer is not None:
        return ScaleByGaloreBaseState(base_optimizer=base_optimizer.init(treedef.unflatten(proxies)),
                                      projector=treedef.unflatten(projectors), count=_tree.zero_count())
    return ScaleByGaloreState(mu=treedef.unflatten(mus), nu=treedef.unflatten(nus),
                              projector=treedef.unflatten(projectors), count=_tree.zero_count())


def _kept(x, old, g):
    """A new state leaf placed as ``init`` placed it: split like the update ``g`` where shaped like it, else
    replicated over its mesh (on an Auto mesh under jit, where XLA would otherwise split it like the updates)."""
    return _like(x, g) if x.shape == g.shape else _kept_like(x, old)


def _svd(x):
    """The thin SVD of each matrix of a batch (one seam, so that a test can stand in for a failing solver)."""
    return jnp.linalg.svd(x, full_matrices=False)


def _projector(x, r, left):
    """The first ``r`` left singular vectors of each matrix of ``x`` (``left``), or its first ``r`` right ones, as
    columns. A zero or rank-deficient matrix still gets orthonormal columns (the solver completes the basis). A
    finite matrix on which the solver returns a non-finite vector (a failed convergence) gets the identity's first
    ``r`` columns instead; a non-finite matrix keeps what the solver gives. Differentiation takes the projector as
    a constant (singular vectors have no derivative where singular values repeat, as they do at zero)."""
    *batch, m, n = x.shape
    side = m if left else n
    if x.size == 0 or r == 0:
        return jnp.zeros((*batch, side, r), x.dtype)
    x = jax.lax.stop_gradient(x)
    u, _, vh = _svd(x)
    q = u[..., :, :r] if left else jnp.swapaxes(vh[..., :r, :], -1, -2)
    solved = jnp.all(jnp.isfinite(q), axis=(-2, -1), keepdims=True)
    finite = jnp.all(jnp.isfinite(x), axis=(-2, -1), keepdims=True)
    return jnp.where(solved | ~finite, q, jnp.eye(side, r, dtype=q.dtype))


def _matrices(leaves, projectors, axes, count, update_proj_gap, dtypes):
    """The matrices of ``leaves`` (by index), in at least float32 (and ``dtypes(i)``, the state's), and their
    projectors: refreshed from their SVDs on the first step and every update_proj_gap-th after it (steps 1,
    1 + gap, 1 + 2 gap, ...), in one conditional for the whole tree."""
    matrices = {}
    for i, (g, q, a) in enumerate(zip(leaves, projectors, axes)):
        if a is not None:
            matrices[i] = as_matrices(g.astype(_tree.compute_dtype(g.dtype, q.dtype, *dtypes(i))), a)
    old = {i: _gathered(projectors[i]).astype(x.dtype) for i, x in matrices.items()}  # (whole, for the products)

    def refreshed(xs, qs):
        return {i: _projector(x, qs[i].shape[-1], x.shape[-2] >= x.shape[-1]) for i, x in xs.items()}

    if not matrices:
        return matrices, {}
    return matrices, jax.lax.cond(count % update_proj_gap == 0, refreshed, lambda xs, qs: qs, matrices, old)


def _down(x, p):
    """The projected gradient of the matrices ``x`` by their projectors ``p`` (on the left where ``x`` has at
    least as many rows as columns)."""
    return jnp.swapaxes(p, -1, -2) @ x if x.shape[-2] >= x.shape[-1] else x @ p


def _up(n, p, x):
    """``n`` (a step in the projected coordinates of the matrices ``x``) back in ``x``'s."""
    return p @ n if x.shape[-2] >= x.shape[-1] else n @ jnp.swapaxes(p, -1, -2)


def _apply_scale_by_galore(updates, state, params, *, rank, update_proj_gap, scale, b1, b2, eps, eps_root,
                           weight_dimension_numbers=None, base_optimizer=None, **extra):
    call = "scale_by_galore"
    real_only(call, updates)
    if base_optimizer is not None:
        return _apply_with_base(updates, state, params, update_proj_gap, scale, weight_dimension_numbers,
                                base_optimizer, extra)
    for field in ("mu", "nu", "projector"):
        _tree.check_same_structure(call, updates, getattr(state, field), "updates", f"state.{field}")
    leaves, treedef = jax.tree.flatten(updates)
    mus, nus = treedef.flatten_up_to(state.mu), treedef.flatten_up_to(state.nu)
    projectors = treedef.flatten_up_to(state.projector)
    axes = leaf_axes(call, weight_dimension_numbers, updates, params)
    count = _tree.safe_increment(state.count)
    c1, c2 = bias_corrections(count, b1, b2)
    matrices, new = _matrices(leaves, projectors, axes, state.count, update_proj_gap,
                              lambda i: (mus[i].dtype, nus[i].dtype))

    def adam(g, m, v):  # the leaves that are not matrices, one at a time, in at least float32
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * jnp.square(g)
        return adam_direction(m / c1, v, c2, eps, eps_root), m, v

    whole = [i for i, a in enumerate(axes) if a is None]
    outs = per_leaf(call, adam, tuple([t[i] for i in whole] for t in (leaves, mus, nus)),
                    ("updates", "state.mu", "state.nu")) if whole else ([], [], [])
    adam_out = dict(zip(whole, zip(*outs)))

    us, new_mu, new_nu, new_projectors = [], [], [], []
    for i, (g, m, v, q, a) in enumerate(zip(leaves, mus, nus, projectors, axes)):
        if a is None:
            u, mc, vc = adam_out[i]
            us.append(u)
            new_mu.append(mc)
            new_nu.append(vc)
            new_projectors.append(q)
            continue
        x, p = matrices[i], new[i]
        low = _down(x, p)
        mc = b1 * m.astype(x.dtype) + (1 - b1) * low
        vc = b2 * v.astype(x.dtype) + (1 - b2) * jnp.square(low)
        n = adam_direction(mc / c1, vc, c2, eps, eps_root)
        us.append(_like(from_matrices(scale * _up(n, p, x), g, a).astype(g.dtype), g))
        new_mu.append(_kept(mc.astype(m.dtype), m, g))
        new_nu.append(_kept(vc.astype(v.dtype), v, g))
        new_projectors.append(_kept(p.astype(q.dtype), q, g))
    return treedef.unflatten(us), ScaleByGaloreState(
        mu=treedef.unflatten(new_mu), nu=treedef.unflatten(new_nu), projector=treedef.unflatten(new_projectors),
        count=count)


def _placed(new, old, treedef, leaves, matrices):
    """The base's new state placed as ``init`` placed it: each of its trees shaped like the updates (a moment)
    leaf by leaf, a matrix's entry replicated over its mesh and any other split like the update where shaped like
    it; its other leaves (counts) as they are."""
    if jax.tree.structure(new) == treedef:
        news, olds = treedef.flatten_up_to(new), treedef.flatten_up_to(old)
        return treedef.unflatten([_kept_like(n, o) if i in matrices else _kept(n, o, g)
                                  for i, (n, o, g) in enumerate(zip(news, olds, leaves))])
    if isinstance(new, tuple) and hasattr(new, "_fields"):
        return type(new)(*(_placed(n, o, treedef, leaves, matrices) for n, o in zip(new, old)))
    if isinstance(new, (tuple, list)):
        return type(new)(_placed(n, o, treedef, leaves, matrices) for n, o in zip(new, old))
    if isinstance(new, dict):
        return {k: _placed(v, old[k], treedef, leaves, matrices) for k, v in new.items()}
    return new


def _apply_with_base(updates, state, params, update_proj_gap, scale, weight_dimension_numbers, base, extra):
    """The step with a base pipeline: it runs on the projected matrices and the other leaves as they are, its
    steps of the matrices projected back and scaled."""
    call = "scale_by_galore"
    _tree.check_same_structure(call, updates, state.projector, "updates", "state.projector")
    leaves, treedef = jax.tree.flatten(updates)
    projectors = treedef.flatten_up_to(state.projector)
    axes = leaf_axes(call, weight_dimension_numbers, updates, params)
    matrices, new = _matrices(leaves, projectors, axes, state.count, update_proj_gap, lambda i: ())
    low = [_down(matrices[i], new[i]) if i in matrices else g for i, g in enumerate(leaves)]
    steps, base_state = base.update(treedef.unflatten(low), state.base_optimizer, None, **extra)
    base_state = _placed(base_state, state.base_optimizer, treedef, leaves, matrices)
    us, new_projectors = [], []
    for i, (g, n, q, a) in enumerate(zip(leaves, treedef.flatten_up_to(steps), projectors, axes)):
        if a is None:
            us.append(n)
            new_projectors.append(q)
            continue
        x, p = matrices[i], new[i]
        us.append(_like(from_matrices(scale * _up(n.astype(x.dtype), p, x), g, a).astype(g.dtype), g))
        new_projectors.append(_kept(p.astype(q.dtype), q, g))
    return treedef.unflatten(us), ScaleByGaloreBaseState(
        base_optimizer=base_state, projector=treedef.unflatten(new_projectors),
        count=_tree.safe_increment(state.count))


@combinator
def scale_by_galore(rank: int = 128, update_proj_gap: int = 200, scale: ScalarOrSchedule = 1.0,
                    b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999, eps: ScalarOrSchedule = 1e-8,
                    eps_root: ScalarOrSchedule = 0.0, *, mu_dtype: DType = None,
                    weight_dimension_numbers: PyTree | Callable[[PyTree], PyTree] | None = None,
                    base_optimizer: Update | None = None) -> Update:
    r"""Scales updates by GaLore: Adam, or a base pipeline, on low-rank projections of matrix gradients.

    Update rule, for a matrix gradient $G$ of shape $m \times n$ at step $t$ (counting from 1), with
    $r = \min(\text{rank}, m, n)$, $T$ = ``update_proj_gap``, $\alpha$ = ``scale``, $b_1$ = ``b1``,
    $b_2$ = ``b2``, $\epsilon$ = ``eps``, $\epsilon_\text{root}$ = ``eps_root``, and $G = U S V^\top$ the
    thin SVD, when $m \ge n$ (the projector $P$ on the left):

    $$
    \begin{align*}
    P &\gets U_{:, 1:r} \qquad \text{if } t \equiv 1 \pmod T \\
    R &= P^\top G \\
    M &\gets b_1 M + (1 - b_1)\, R \\
    V &\gets b_2 V + (1 - b_2)\, R^2 \\
    N &= \frac{M / (1 - b_1^t)}{\sqrt{V / (1 - b_2^t) + \epsilon_\text{root}} + \epsilon} \\
    u &= \alpha\, P N
    \end{align*}
    $$

    When $m < n$ the projector is on the right: $P \gets V_{:, 1:r}$, $R = G P$ and $u = \alpha N P^\top$.
    Either way Adam's moments $M, V$ hold the $r \times n$ or $m \times r$ projected gradient, the smaller, and
    the state per matrix is $2 r \min(m, n) + r \max(m, n)$ numbers instead of Adam's $2 m n$. This side is
    optax's (the authors' code's ``"reverse_std"``); the authors' default (``"std"``) puts the projector on the
    smaller side and the moments on the larger, $2 r \max(m, n) + r \min(m, n)$ numbers. The moments are kept
    across a refresh of $P$, as in the paper. Leaves that are not matrices take Adam,
    $u = \hat m / (\sqrt{\hat v + \epsilon_\text{root}} + \epsilon)$, without $\alpha$ (as optax and the
    paper's code scale only the projected leaves).

    Which leaves are matrices is ``weight_dimension_numbers``, as for :func:`scale_by_muon`: by default every
    leaf with two axes, rows first; a leaf with dimension numbers is a batch of matrices (its reduction axes the
    rows, its output axes the columns, any other axis the batch), each with its own projector. The refresh is a
    ``lax.cond`` on the step count for the whole tree: the jitted step is one program, and the SVDs run only on
    refresh steps. The SVD runs in at least float32 (the state too, for bfloat16 params). A zero or
    rank-deficient gradient still gives orthonormal columns, never NaN: a zero matrix keeps a zero update. Where
    the solver returns a non-finite vector for a finite matrix (a failed convergence), the projector is the
    identity's first $r$ columns. Differentiating through the step takes the projector as a constant.

    With ``base_optimizer`` (optax's option) that pipeline takes Adam's place: it runs on the tree of the
    projected matrices $R$ (in at least float32) and the other leaves as they are, with no params, and its
    step $N$ of each matrix is projected back, $u = \alpha P N$ (or $\alpha N P^\top$); its steps of the
    other leaves are the updates as it returns them. Its state, made by its ``init`` on the projected shapes,
    is the field ``base_optimizer`` (read it by path: ``"scale_by_galore/scale_by_lion.mu"``). It must not
    need params (``add_decayed_weights``, a trust ratio): decay the weights after this stage, as
    :func:`updax.optimizers.galore`'s ``decay`` does. Adam's options are then the base's to set: giving
    ``b1``, ``b2``, ``eps``, ``eps_root`` or ``mu_dtype`` too is refused by name, and they are kept as None (the
    object prints without them, and :func:`updax.hyperparams_in_state` holds none of them).

    Args:
        rank: the rank $r$ of the projection, an integer >= 1; a matrix
            whose smaller side is shorter uses that side. Static.
            Default: ``128``.
        update_proj_gap: the steps $T$ between refreshes of the
            projectors, an integer >= 1 (1: every step). Static.
            Default: ``200``.
        scale: the factor $\alpha$ of the projected-back update of the
            matrices, >= 0 (the paper takes 0.25). Default: ``1.0``.
        b1: decay of the first moment, in [0, 1); Adam's, so set only
            without ``base_optimizer``. Default: ``0.9``.
        b2: decay of the second moment, in [0, 1); set only without
            ``base_optimizer``. Default: ``0.999``.
        eps: added to the denominator, >= 0; set only without
            ``base_optimizer``. Default: ``1e-08``.
        eps_root: added to the second moment inside the root, >= 0; set
            only without ``base_optimizer``. Default: ``0.0``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but
            at least float32 (``nu`` and the projectors are at least
            float32); set only without ``base_optimizer``. Default: ``None``.
        weight_dimension_numbers: which leaves are matrices and which of
            their axes, as in :func:`scale_by_newton_schulz`: a pytree of
            :class:`MuonDimensionNumbers` or None (not a matrix) shaped like
            the updates or a prefix of them, or a function of the params
            returning one; None makes every leaf with two axes an
            ``(in, out)`` matrix. Default: ``None``.
        base_optimizer: an update object that takes Adam's place on the
            projected gradients (optax's ``base_optimizer``), e.g.
            ``scale_by_lion()``; it must not need params. None: the built-in
            Adam. Default: ``None``.

    Returns:
        An update object with state ``ScaleByGaloreState(mu, nu, projector, count)``, or
        ``ScaleByGaloreBaseState(base_optimizer, projector, count)`` with a ``base_optimizer``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_galore(rank=1, update_proj_gap=10)
        >>> params = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}
        >>> g = {"w": jnp.array([[2.0, 0.0], [0.0, 1.0], [0.0, 0.0]]), "b": jnp.array([3.0, -1.0])}
        >>> u, state = opt.update(g, opt.init(params))
        >>> u["w"].round(4)  # Adam's step on the top singular direction only
        Array([[1., 0.],
               [0., 0.],
               [0., 0.]], dtype=float32)
        >>> opt.get_state(state, "scale_by_galore.mu")["w"].shape  # one row of 2: rank 1, projector on the left
        (1, 2)
        >>> u["b"].round(4)  # not a matrix: Adam
        Array([ 1., -1.], dtype=float32)

    References:
        Zhao et al., "GaLore: Memory-Efficient LLM Training by Gradient
        Low-Rank Projection", ICML 2024. https://arxiv.org/abs/2403.03507
    """
    options = dict(rank=rank, update_proj_gap=update_proj_gap, scale=scale, b1=b1, b2=b2, eps=eps,
                   eps_root=eps_root, mu_dtype=mu_dtype, weight_dimension_numbers=weight_dimension_numbers,
                   base_optimizer=base_optimizer)
    for name, default in _ADAM_DEFAULTS.items():
        value = options[name]
        if base_optimizer is None and value is None and default is not None:
            fail("scale_by_galore", name, value, _GALORE_DOMAINS[name].text, TypeError)
        if base_optimizer is not None:
            if value is not default and not (isinstance(value, (int, float)) and value == default):
                fail("scale_by_galore", name, value, "is the built-in Adam's: with base_optimizer, set it on the "
                     "base", ValueError)
            options[name] = None
    # The rank shapes the state and the refresh period is a step of the program: structure, not data.
    return stateful(_init_scale_by_galore, _apply_scale_by_galore, name="scale_by_galore", options=options,
                    domains=_GALORE_DOMAINS, static=("rank", "update_proj_gap", "weight_dimension_numbers"),
                    schedulable=("scale", "b1", "b2", "eps", "eps_root"))
