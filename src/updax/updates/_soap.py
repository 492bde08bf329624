"""SOAP: Adam run in the eigenbasis of Shampoo's statistics.

Each preconditioned axis of a leaf keeps an EMA of the gradient's Gram matrix
along it (Shampoo's statistic) and an orthogonal basis that estimates its
eigenvectors; Adam's second moment lives in the rotated coordinates.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, PartitionSpec

from updax import _tree
from updax._combinators import combinator
from updax._domains import NON_NEGATIVE, UNIT, Count, Flag, Integer, NonNegativeField
from updax._primitives import stateful
from updax._typing import ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import bias_corrections, real_only, safe_sqrt


class ScaleBySoapState(NamedTuple):
    """Adam's first moment ``mu`` (in the leaf's own coordinates) and second moment ``nu`` (in the eigenbasis);
    per leaf a tuple of Shampoo's statistics ``stats`` and of their estimated eigenbases ``bases``, one square
    matrix for each preconditioned axis (an empty tuple for a leaf that takes Adam), replicated over the leaf's
    mesh (split where a ZeRO-1 layout, :func:`updax.sharding.zero1_shardings`, puts them: each step gathers them
    for its products and its refresh, and keeps their placement); steps taken ``count``."""

    mu: Any
    nu: NonNegativeField
    stats: Any
    bases: Any
    count: Count


#: What the options of scale_by_soap hold.
_SOAP_DOMAINS = dict(b1=UNIT, b2=UNIT, shampoo_beta=UNIT, eps=NON_NEGATIVE, precondition_frequency=Integer(1),
                     max_precond_dim=Integer(1), merge_dims=Flag())


def merged_shape(shape, max_precond_dim):
    """``shape`` with runs of neighbouring axes merged while their product stays at most ``max_precond_dim``
    (a convolution's kernel axes become one axis)."""
    out: list[int] = []
    for n in shape:
        if out and out[-1] * n <= max_precond_dim:
            out[-1] *= n
        else:
            out.append(n)
    return tuple(out)


def preconditioned(shape, max_precond_dim, merge_dims):
    """The shape SOAP works on and the axes of it that get a basis: none for a leaf of fewer than two axes (after
    merging) or no elements; else each axis of at most ``max_precond_dim`` elements."""
    shape = merged_shape(shape, max_precond_dim) if merge_dims else tuple(shape)
    if len(shape) < 2 or 0 in shape:
        return shape, ()
    return shape, tuple(i for i, n in enumerate(shape) if n <= max_precond_dim)


def _init_scale_by_soap(params, *, max_precond_dim, merge_dims):
    def leaf(p):
        p = p if isinstance(p, jax.Array) else jnp.asarray(p)
        dtype = _tree.compute_dtype(p.dtype)
        shape, axes = preconditioned(p.shape, max_precond_dim, merge_dims)

        def square(n, fill):  # replicated over the param's mesh
            zeros = _tree.full((n, n), 0.0, dtype, p, dims=(None, None))
            return zeros + jnp.eye(n, dtype=dtype) if fill else zeros

        return (tuple(square(shape[i], False) for i in axes), tuple(square(shape[i], True) for i in axes))

    stats, bases = _tree.tree_map_unzip("scale_by_soap", leaf, 2, params, names=("params",))
    return ScaleBySoapState(mu=_tree.accumulators(params, None), nu=_tree.accumulators(params, None),
                            stats=stats, bases=bases, count=_tree.zero_count())


def _gathered(x):
    """``x`` whole on each device of its mesh (unchanged off a mesh)."""
    return _tree.place_like(x, x, dims=(None,) * x.ndim)


def _like(x, like):
    """``x`` (shaped like ``like``) split as ``like`` is: on an Auto mesh under jit tied to it
    (:func:`updax._tree.full`'s tie, which XLA's sharding propagation reads), else by
    :func:`updax._tree.place_like`."""
    mesh = jax.sharding.get_abstract_mesh()
    if isinstance(like, jax.core.Tracer) and not mesh.empty and AxisType.Explicit not in mesh.axis_types:
        return _tree._tied(x, like)
    return _tree.place_like(x, like)


def _kept_like(x, old):
    """``x`` placed as ``old`` is (replicated): on an Auto mesh under jit, where no sharding is known while tracing,
    by a sharding constraint to the current mesh, else as :func:`updax._tree.place_like` places it."""
    mesh = jax.sharding.get_abstract_mesh()
    if isinstance(x, jax.core.Tracer) and not mesh.empty and AxisType.Explicit not in mesh.axis_types:
        return jax.lax.with_sharding_constraint(x, PartitionSpec())
    return _tree.place_like(x, old)


def _rotated(x, bases, axes, back=False):
    """``x`` with each axis ``i`` of ``axes`` multiplied by its basis: by ``Q.T`` into the eigenbasis, by ``Q``
    back (``back=True``)."""
    for q, i in zip(bases, axes):
        x = jnp.moveaxis(jnp.tensordot(q if back else q.T, x, axes=([1], [i])), 0, i)
    return x


def _gram(g, i):
    """``G_(i) G_(i).T``: the products of ``g``'s slices along axis ``i``, summed over the other axes."""
    others = tuple(j for j in range(g.ndim) if j != i)
    return jnp.tensordot(g, g, axes=(others, others))


def _eigenbasis(s):
    """The eigenvectors of the symmetric ``s``, eigenvalues descending (the first basis)."""
    return jnp.linalg.eigh((s + s.T) / 2)[1][:, ::-1]


def _power_step(s, q):
    """One power-iteration step from ``q`` and a QR decomposition, columns first sorted by the estimated
    eigenvalues ``diag(Q.T S Q)``, descending; and that order, for the second moment."""
    sq = s @ q
    order = jnp.argsort(-jnp.sum(q * sq, axis=0), stable=True)
    return jnp.linalg.qr(sq[:, order])[0], order


def _refreshed(kind, stats, bases, nu, plans):
    """The bases and second moments after a refresh of ``kind`` (0: none, 1: the first eigendecomposition, 2: a
    power-iteration step), one ``lax.switch`` for the whole tree."""
    def keep(stats, bases, nu):
        return bases, nu

    def first(stats, bases, nu):  # from the identity: V carried over as the diagonal of its rotation
        new_bases = [tuple(_eigenbasis(s) for s in ss) for ss in stats]
        return new_bases, [_rotated(v, tuple(q * q for q in qs), axes)
                           for v, qs, (_, axes) in zip(nu, new_bases, plans)]

    def power(stats, bases, nu):
        new_bases, new_nu = [], []
        for ss, qs, v, (shape, axes) in zip(stats, bases, nu, plans):
            v = v.reshape(shape)
            out = []
            for s, q, i in zip(ss, qs, axes):
                q, order = _power_step(s, q)
                out.append(q)
                v = jnp.take(v, order, axis=i)  # (the coordinates of the second moment follow their columns)
            new_bases.append(tuple(out))
            new_nu.append(v)
        return new_bases, new_nu

    nu = [v.reshape(shape) for v, (shape, _) in zip(nu, plans)]
    # Differentiation takes the bases as constants: eigenvectors have no derivative where eigenvalues repeat, as
    # they do for zero statistics (JAX's would be NaN there).
    stats, bases = jax.lax.stop_gradient((stats, bases))
    return jax.lax.switch(kind, (keep, first, power), stats, bases, nu)


def _apply_scale_by_soap(updates, state, params, *, b1, b2, shampoo_beta, eps, precondition_frequency,
                         max_precond_dim, merge_dims):
    call = "scale_by_soap"
    real_only(call, updates)
    _tree.check_same_structure(call, updates, state.mu, "updates", "state.mu")
    leaves, treedef = jax.tree.flatten(updates)
    mus, nus = treedef.flatten_up_to(state.mu), treedef.flatten_up_to(state.nu)
    stats, bases = treedef.flatten_up_to(state.stats), treedef.flatten_up_to(state.bases)
    # whole on each device for the products and the refresh (split only where a ZeRO-1 layout put them)
    whole_stats = [tuple(_gathered(s) for s in ss) for ss in stats]
    whole_bases = [tuple(_gathered(q) for q in qs) for qs in bases]
    count = _tree.safe_increment(state.count)
    c1, c2 = bias_corrections(count, b1, b2)

    us, new_mu, new_nu, new_stats, plans = [], [], [], [], []
    for g, m, v, ss, qs in zip(leaves, mus, nus, whole_stats, whole_bases):
        c = _tree.compute_dtype(g.dtype, m.dtype, v.dtype)
        shape, axes = preconditioned(g.shape, max_precond_dim, merge_dims)
        # On a mesh a rotated leaf is gathered (the rotations contract its axes), and split back at the end.
        local = (lambda a: a) if shape == g.shape and not axes else _gathered
        x = local(g).astype(c).reshape(shape)
        m = b1 * local(m).astype(c).reshape(shape) + (1 - b1) * x
        v = b2 * local(v).astype(c).reshape(shape) + (1 - b2) * jnp.square(_rotated(x, qs, axes))
        d = safe_sqrt(v / c2.astype(c)) + eps
        # (0 where the denominator is: a coordinate no update has reached, with eps = 0)
        n = jnp.where(d > 0, _rotated(m, qs, axes) / c1.astype(c) / jnp.where(d > 0, d, 1), 0)
        us.append(_like(_rotated(n, qs, axes, back=True).reshape(g.shape).astype(g.dtype), g))
        new_mu.append(m)
        new_nu.append(v)
        new_stats.append(tuple(shampoo_beta * s + (1 - shampoo_beta) * _gram(x, i).astype(s.dtype)
                               for s, i in zip(ss, axes)))
        plans.append((shape, axes))

    kind = jnp.where(count == 1, 1, jnp.where(count % precondition_frequency == 0, 2, 0))
    new_bases, new_nu = _refreshed(kind, new_stats, whole_bases, new_nu, plans)
    # Under jit on an Auto mesh nothing else pins the statistics and bases: XLA would split them like the updates.
    new_stats = [tuple(_kept_like(a, b) for a, b in zip(ss, old)) for ss, old in zip(new_stats, stats)]
    new_bases = [tuple(_kept_like(a, b) for a, b in zip(qs, old)) for qs, old in zip(new_bases, bases)]
    new_mu = [_like(a.reshape(m.shape).astype(m.dtype), m) for a, m in zip(new_mu, mus)]
    new_nu = [_like(a.reshape(v.shape).astype(v.dtype), v) for a, v in zip(new_nu, nus)]
    return treedef.unflatten(us), ScaleBySoapState(
        mu=treedef.unflatten(new_mu), nu=treedef.unflatten(new_nu), stats=treedef.unflatten(new_stats),
        bases=treedef.unflatten(new_bases), count=count)


@combinator
def scale_by_soap(b1: ScalarOrSchedule = 0.95, b2: ScalarOrSchedule = 0.95, shampoo_beta: ScalarOrSchedule = 0.95,
                  eps: ScalarOrSchedule = 1e-8, precondition_frequency: int = 10, max_precond_dim: int = 10000,
                  merge_dims: bool = False) -> Update:
    r"""Scales updates by SOAP: Adam in the eigenbasis of Shampoo's preconditioner.

    Update rule, for a matrix update $G$ at step $t$ (counting from 1), with $b_1$ = ``b1``, $b_2$ = ``b2``,
    $\beta$ = ``shampoo_beta``, $\epsilon$ = ``eps``, the bases $Q_L, Q_R$ (the identity at first) and the
    statistics $L, R$ (zero at first):

    $$
    \begin{align*}
    M &\gets b_1 M + (1 - b_1)\, G \\
    V &\gets b_2 V + (1 - b_2)\, (Q_L^\top G Q_R)^2 \\
    u &= Q_L\, \frac{Q_L^\top M Q_R / (1 - b_1^t)}{\sqrt{V / (1 - b_2^t)} + \epsilon}\, Q_R^\top \\
    L &\gets \beta L + (1 - \beta)\, G G^\top \\
    R &\gets \beta R + (1 - \beta)\, G^\top G
    \end{align*}
    $$

    Then, after step 1, $Q_L$ and $Q_R$ become the eigenvectors of $L$ and $R$; after each step $t > 1$ that
    is a multiple of $f$ = ``precondition_frequency``, each takes one power-iteration step,
    $Q_L \gets \operatorname{QR}(L Q_L)$, its columns first sorted by $\operatorname{diag}(Q_L^\top L Q_L)$,
    descending, and the rows of $V$ permuted with them ($R$ and the columns of $V$ alike). $M$ kept in the
    update's own coordinates equals the paper's rotated moment rotated back and into each new basis.

    A leaf of $k \ge 2$ axes keeps one statistic per axis ($G_{(i)} G_{(i)}^\top$ over the others), rotated
    along it; an axis above ``max_precond_dim`` keeps the identity, and a leaf of fewer than two axes takes
    Adam. The refresh is a ``lax.switch`` on the step count: the jitted step is one program. Zero or
    rank-deficient statistics give orthogonal bases (an eigendecomposition, or a QR whose zero columns are
    completed), never NaN; with $\epsilon = 0$ a coordinate whose denominator is 0 gets 0. Differentiating
    through the step takes the bases as constants (eigenvectors have no derivative where eigenvalues repeat).

    Deviations from the authors' code: it skips the first step (it only builds $Q_L, Q_R$, with $V$ still 0);
    here step 1 is Adam's, and the first eigenbases carry $V$ over as
    $V \gets (Q_L \odot Q_L)^\top V (Q_R \odot Q_R)$ (its rotation's diagonal, exact for a signed permutation).
    $\epsilon$ is added to $\sqrt{V / (1 - b_2^t)}$, as in Adam.

    Args:
        b1: decay of the first moment, in [0, 1). Default: ``0.95``.
        b2: decay of the second moment, in [0, 1). Default: ``0.95``.
        shampoo_beta: decay of the statistics $L, R$, in [0, 1) (the paper takes $b_2$).
            Default: ``0.95``.
        eps: added to the denominator, >= 0. Default: ``1e-08``.
        precondition_frequency: steps between refreshes of the bases, an integer >= 1.
            Default: ``10``.
        max_precond_dim: the largest axis that gets a basis, an integer >= 1; a larger axis keeps
            the identity. Default: ``10000``.
        merge_dims: first merge neighbouring axes while their product stays at most
            ``max_precond_dim`` (a convolution's kernel axes, as the paper's code does). Default: ``False``.

    Returns:
        An update object with state ``ScaleBySoapState(mu, nu, stats, bases, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_soap(precondition_frequency=2)
        >>> params = {"w": jnp.zeros((2, 2)), "b": jnp.zeros(2)}
        >>> state = opt.init(params)
        >>> u, state = opt.update({"w": jnp.array([[1.0, 2.0], [2.0, 1.0]]), "b": jnp.array([3.0, -1.0])}, state)
        >>> u["w"]  # step 1 is Adam's: about sign(g)
        Array([[1., 1.],
               [1., 1.]], dtype=float32)
        >>> jnp.abs(opt.get_state(state, "scale_by_soap.bases")["w"][0]) * 2**0.5  # eigenvectors of G Gᵀ
        Array([[1., 1.],
               [1., 1.]], dtype=float32)

    References:
        Vyas et al., "SOAP: Improving and Stabilizing Shampoo using Adam", ICLR 2025.
        https://arxiv.org/abs/2409.11321
    """
    options = dict(b1=b1, b2=b2, shampoo_beta=shampoo_beta, eps=eps, precondition_frequency=precondition_frequency,
                   max_precond_dim=max_precond_dim, merge_dims=merge_dims)
    # Which axes get a basis shapes the state, and the refresh period is a step of the program: structure, not data.
    return stateful(_init_scale_by_soap, _apply_scale_by_soap, name="scale_by_soap", options=options,
                    domains={k: _SOAP_DOMAINS[k] for k in options},
                    static=("precondition_frequency", "max_precond_dim", "merge_dims"),
                    schedulable=("b1", "b2", "shampoo_beta", "eps"))
