"""Shampoo: Kronecker-factored preconditioning, one statistic per axis, grafted onto a diagonal method's step size.

Each leaf with two axes or more keeps, for each axis small enough, the sum
(or EMA) of its gradient's contractions over the other axes, and the
inverse root of it, refreshed every few steps by an eigendecomposition (or
a coupled Newton iteration) under ``lax.cond`` (the jitted step stays one
program). The step takes its direction from the roots and its size, per
leaf, from the graft. With ``block_size``, a leaf with a longer axis is cut
into blocks, each a tensor of its own; the blocks of equal shape are
stacked, so that each region of them is one batched computation.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import NON_NEGATIVE, POSITIVE, Count, Integer, NonNegativeField, OneOf, Real, Valid
from updax._primitives import stateful
from updax._typing import ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import bias_corrections, number, real_only, safe_sqrt


class ScaleByShampooState(NamedTuple):
    r"""Shampoo's statistics and roots, the graft's second moment and the steps taken.

    ``stats`` and ``roots`` hold, for each leaf, a tuple of one entry per axis: for a preconditioned axis of
    size $n$ the $n \times n$ statistic and its inverse root (the identity until the first refresh), for any
    other axis a one-element zero; on a mesh their rows are split as the leaf's axis is (the products gather
    the leaf and them; each step keeps the placement the state has, so a ZeRO-1 layout from
    :func:`updax.sharding.zero1_shardings`, which splits them over the data axis too, stays). A leaf cut into
    blocks (``block_size``) holds instead a tuple of its regions of equal blocks (:func:`block_regions`), each
    a tuple of one entry per axis: the blocks' statistics (or roots) of that axis
    stacked, shaped $(c_0, \dots, c_{k-1}, b, b)$ for the region's $c_j$ blocks along axis $j$ and blocks $b$
    long along this one (a one-element zero for an axis the region does not precondition), replicated over the
    leaf's mesh. ``nu`` is the graft's accumulator of $g^2$, shaped like the leaf (a one-element zero for
    ``graft="sgd"``).
    """

    stats: Any
    roots: Any
    nu: NonNegativeField
    count: Count


_GRAFTS = ("adagrad", "rmsprop", "adam", "sgd")

#: The ways to compute the inverse roots.
_ROOT_METHODS = ("eigh", "newton")


def _none_or_positive_integer(call, name, value):
    return None if value is None else Integer(1).check(call, name, value)


_SHAMPOO_DOMAINS = dict(b2=Real(0.0, 1.0), eps=NON_NEGATIVE, matrix_eps=POSITIVE, precondition_frequency=Integer(1),
                        start_preconditioning_step=Integer(1), max_preconditioner_dim=Integer(1),
                        graft=OneOf(_GRAFTS),
                        block_size=Valid(rule=_none_or_positive_integer, text="must be None or a positive integer"),
                        root_method=OneOf(_ROOT_METHODS))


#: The products of statistics and roots in full float32 (not TF32 or bfloat16 passes on an accelerator).
_HIGHEST = jax.lax.Precision.HIGHEST

#: The coupled Newton iteration stops after this many steps at most...
NEWTON_ITERATIONS = 100
#: ... or once ``max|M - I|`` is at most this, or when a step does not lower it (the last step that did is kept).
NEWTON_TOLERANCE = 1e-6
#: A root whose iteration ended with ``max|M - I|`` above this is not taken: the previous root is kept.
NEWTON_FAILURE = 1e-3


def _whole(x):
    """``x`` gathered on every device of its mesh (the statistics contract every axis but one)."""
    return _tree.place_like(x, x, dims=(None,) * x.ndim)


def _preconditioned_axes(shape, max_preconditioner_dim):
    """The axes that get a statistic: every axis of at most ``max_preconditioner_dim`` elements of a non-empty
    leaf with two axes or more."""
    if len(shape) < 2 or 0 in shape:
        return ()
    return tuple(i for i, n in enumerate(shape) if n <= max_preconditioner_dim)


def block_regions(shape, block_size, max_preconditioner_dim):
    """None for a leaf that is not cut into blocks: ``block_size`` None, fewer than two axes, no elements, or no
    axis longer than ``block_size``. Else the leaf's regions of equal blocks, in row-major order of the pieces of
    each axis: an axis longer than ``block_size`` has a piece of its whole blocks and, if its length is not a
    multiple, one of the last, shorter block; any other axis is one piece. A region is a pair: per axis
    ``(start, stop, count, size)`` (its ``count`` blocks of ``size`` from ``start`` to ``stop``), and the axes its
    blocks precondition (those of at most ``max_preconditioner_dim`` elements)."""
    if block_size is None or len(shape) < 2 or 0 in shape or all(n <= block_size for n in shape):
        return None
    pieces = []
    for n in shape:
        whole, rest = divmod(n, block_size)
        if n <= block_size:
            pieces.append(((0, n, 1, n),))
        else:
            pieces.append(((0, whole * block_size, whole, block_size),) + (((n - rest, n, 1, rest),) if rest else ()))
    return tuple((region, tuple(i for i, (_, _, _, b) in enumerate(region) if b <= max_preconditioner_dim))
                 for region in itertools.product(*pieces))


def _blocks(x, region):
    """The region's blocks of the whole leaf ``x``, stacked: shaped ``(c_0, ..., c_{k-1}, b_0, ..., b_{k-1})``."""
    k = x.ndim
    x = x[tuple(slice(start, stop) for start, stop, _, _ in region)]
    x = x.reshape(tuple(d for _, _, c, b in region for d in (c, b)))
    return jnp.transpose(x, tuple(range(0, 2 * k, 2)) + tuple(range(1, 2 * k, 2)))


def _unblocked(x, region):
    """The inverse of :func:`_blocks`: the region of the leaf."""
    k = len(region)
    x = jnp.transpose(x, tuple(j for i in range(k) for j in (i, k + i)))
    return x.reshape(tuple(stop - start for start, stop, _, _ in region))


def _joined(parts, counts):
    """The leaf from its regions ``parts`` (row-major over the pieces of each axis, ``counts[i]`` along axis i)."""
    parts = iter(parts)
    index = {key: next(parts) for key in itertools.product(*(range(c) for c in counts))}

    def join(prefix):
        axis = len(prefix)
        if axis == len(counts):
            return index[prefix]
        pieces = [join(prefix + (j,)) for j in range(counts[axis])]
        return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=axis)

    return join(())


def _subscripts(k, i):
    """Einsum letters of a region's stacked blocks: its counts' (upper case), its blocks' axes (lower case), and
    the latter with axis ``i``'s letter replaced by ``z``."""
    counts, axes = "ABCDEFGHIJKLMNOPQRSTUVWXY"[:k], "abcdefghijklmnopqrstuvwxy"[:k]
    return counts, axes, axes[:i] + "z" + axes[i + 1:]


def _block_contracted(x, i):
    r"""Per block, $G_{(i)} G_{(i)}^\top$ of the stacked blocks ``x``: shaped ``(c_0, ..., c_{k-1}, b_i, b_i)``."""
    k = x.ndim // 2
    c, b, z = _subscripts(k, i)
    return jnp.einsum(f"{c}{b},{c}{z}->{c}{b[i]}z", x, x, precision=_HIGHEST)


def _block_along(root, x, i):
    """Per block, the stacked blocks ``x`` with their roots ``root`` applied along axis ``i``."""
    k = x.ndim // 2
    c, b, z = _subscripts(k, i)
    return jnp.einsum(f"{c}z{b[i]},{c}{b}->{c}{z}", root, x, precision=_HIGHEST)


def _init_scale_by_shampoo(params, *, max_preconditioner_dim, graft, block_size):
    def leaf(p):
        p = jnp.asarray(p)
        dtype = _tree.compute_dtype(p.dtype)

        def placeholder():  # separate buffers, replicated over the param's mesh
            return _tree.full((1,), 0.0, dtype, p, dims=(None,))

        regions = block_regions(p.shape, block_size, max_preconditioner_dim)
        if regions is not None:
            def stacked(region, i, identity):  # one per block, replicated over the param's mesh
                shape = tuple(c for _, _, c, _ in region) + (region[i][3],) * 2
                zeros = _tree.full(shape, 0.0, dtype, p, dims=(None,) * len(shape))
                return zeros + jnp.eye(shape[-1], dtype=dtype) if identity else zeros

            stats = tuple(tuple(stacked(region, i, False) if i in axes else placeholder() for i in range(p.ndim))
                          for region, axes in regions)
            roots = tuple(tuple(stacked(region, i, True) if i in axes else placeholder() for i in range(p.ndim))
                          for region, axes in regions)
        else:
            axes = _preconditioned_axes(p.shape, max_preconditioner_dim)

            def square(i, identity):  # its rows split as the leaf's axis i is
                n = p.shape[i]
                if identity:
                    return _tree.place_like(jnp.eye(n, dtype=dtype), p, dims=(i, None))
                return _tree.full((n, n), 0.0, dtype, p, dims=(i, None))

            stats = tuple(square(i, False) if i in axes else placeholder() for i in range(p.ndim))
            roots = tuple(square(i, True) if i in axes else placeholder() for i in range(p.ndim))
        nu = placeholder() if graft == "sgd" else _tree.accumulator_like(p, None)
        return stats, roots, nu

    stats, roots, nu = _tree.tree_map_unzip("scale_by_shampoo", leaf, 3, params, names=("params",))
    return ScaleByShampooState(stats=stats, roots=roots, nu=nu, count=_tree.zero_count())


def _contracted(g, axis):
    r"""$G_{(i)} G_{(i)}^\top$: ``g`` times itself, summed over every axis but ``axis``."""
    others = tuple(j for j in range(g.ndim) if j != axis)
    return jnp.tensordot(g, g, axes=(others, others), precision=_HIGHEST)


def _along(root, x, axis):
    """``x`` with ``root`` applied along ``axis`` (the mode-``axis`` product)."""
    return jnp.moveaxis(jnp.tensordot(root, x, axes=((1,), (axis,)), precision=_HIGHEST), 0, axis)


def _transposed(x):
    return jnp.swapaxes(x, -1, -2)


def _power(x, p):
    """``x`` to the static integer power ``p`` >= 1, by squaring."""
    out, square = None, x
    while p:
        if p & 1:
            out = square if out is None else jnp.matmul(out, square, precision=_HIGHEST)
        p >>= 1
        if p:
            square = jnp.matmul(square, square, precision=_HIGHEST)
    return out


def _newton_root(h, exponent, ridge):
    r"""The coupled Newton iteration for $A^{-1/p}$ of one symmetric positive definite ``h`` + ``ridge``·I
    (Guo & Higham 2006, as Anil et al. 2020 run it): from $z = (1 + p) / (2 \lVert A \rVert)$, $X_0 = z^{1/p} I$,
    $M_0 = z A$, steps $T = ((p + 1) I - M) / p$, $X \gets X T$, $M \gets T^p M$ while $\max|M - I|$ falls,
    above :data:`NEWTON_TOLERANCE`, at most :data:`NEWTON_ITERATIONS` times. $\lVert A \rVert$ is the Frobenius
    norm (at least the largest eigenvalue: $M_0$'s eigenvalues lie in $(0, (1 + p) / 2]$, where it converges).
    Returns $X$ and its last $\max|M - I|$."""
    eye = jnp.eye(h.shape[-1], dtype=h.dtype)
    a = h + ridge * eye
    norm = jnp.sqrt(jnp.sum(a * a))
    z = (1.0 + exponent) / (2.0 * jnp.where(norm > 0, norm, 1.0))
    m = z * a

    def error(m):
        return jnp.max(jnp.abs(m - eye))

    def step(carry):
        i, x, m, err, _ = carry
        t = ((exponent + 1) * eye - m) / exponent
        x_new = jnp.matmul(x, t, precision=_HIGHEST)
        m_new = jnp.matmul(_power(t, exponent), m, precision=_HIGHEST)
        err_new = error(m_new)
        better = err_new < err  # (False for NaN)
        x, m, err = (jnp.where(better, new, old) for new, old in ((x_new, x), (m_new, m), (err_new, err)))
        return i + 1, x, m, err, better & (err > NEWTON_TOLERANCE) & (i + 1 < NEWTON_ITERATIONS)

    # The first step is always taken: it brings every eigenvalue of M into (0, 1], where each then rises toward 1,
    # so that max|M - I| (on M - I's diagonal, as M - I is negative semidefinite) falls in exact arithmetic.
    start = (jnp.zeros((), jnp.int32), z ** (1.0 / exponent) * eye, m, jnp.asarray(jnp.inf, h.dtype), True)
    _, x, _, err, _ = jax.lax.while_loop(lambda carry: carry[4], step, start)
    return x, err


def _inverse_root(stat, old, exponent, matrix_eps, root_method):
    """The inverse ``exponent``-th root of the symmetrised statistic (of each, for a stack of them), ``old``
    where the statistic is zero or the result is not taken.

    ``eigh``: ``Q·max(Λ, ε·λ_max)^(-1/exponent)·Qᵀ`` from the eigendecomposition ``QΛQᵀ``, ``old`` where the
    result is not finite. Clamped rather than shifted by ``ε·λ_max``: float32's eigenvalues are exact to about
    1e-7 of ``λ_max`` only, so those below the floor are round-off, and a root read from them would differ from one
    rounding to the next. ``newton``: :func:`_newton_root` of the statistic plus ``ε·‖H‖_F·I``, ``old`` where the
    result is not finite or its iteration ended above :data:`NEWTON_FAILURE`.

    The root is a constant to derivatives through the step: ``eigh``'s derivative is not finite where eigenvalues
    repeat (a statistic of rank one has them), and a preconditioner is not what one differentiates a step by.
    """
    h, matrix_eps = jax.lax.stop_gradient(((stat + _transposed(stat)) / 2, matrix_eps))
    if root_method == "newton":
        flat = h.reshape((-1,) + h.shape[-2:])
        scale = jnp.sqrt(jnp.sum(flat * flat, axis=(-2, -1)))
        root, err = jax.vmap(lambda a, r: _newton_root(a, exponent, r))(flat, matrix_eps * scale)
        root = root.reshape(h.shape)
        ok = (scale > 0) & (err <= NEWTON_FAILURE) & jnp.all(jnp.isfinite(root.reshape(flat.shape)), axis=(-2, -1))
        ok = ok.reshape(h.shape[:-2])
    else:
        lam, q = jnp.linalg.eigh(h)
        lam_max = jnp.max(lam, axis=-1, keepdims=True)
        floor = jnp.maximum(matrix_eps * lam_max, jnp.finfo(lam.dtype).tiny)
        root = jnp.matmul(q * (jnp.maximum(lam, floor) ** (-1.0 / exponent))[..., None, :], _transposed(q),
                          precision=_HIGHEST)
        ok = (lam_max[..., 0] > 0) & jnp.all(jnp.isfinite(root), axis=(-2, -1))
    return jnp.where(ok[..., None, None], root, jax.lax.stop_gradient(old))


def _apply_scale_by_shampoo(updates, state, params, *, b2, eps, matrix_eps, precondition_frequency,
                            start_preconditioning_step, max_preconditioner_dim, graft, block_size, root_method):
    call = "scale_by_shampoo"
    real_only(call, updates)
    _tree.check_same_structure(call, updates, state.nu, "updates", "state.nu")
    count = _tree.safe_increment(state.count)
    # b2 = 1 sums, b2 < 1 averages (decided here for a number, traced for an array or a schedule's value)
    gain = (1.0 if b2 == 1 else 1.0 - b2) if number(b2) is not None else jnp.where(b2 == 1.0, 1.0, 1.0 - b2)
    (correction,) = bias_corrections(count, b2) if graft == "adam" else (1.0,)
    if graft == "adam":  # b2 = 1 sums: nothing to correct
        correction = (correction if b2 != 1 else 1.0) if number(b2) is not None else jnp.where(b2 == 1.0, 1.0,
                                                                                                 correction)
    treedef = jax.tree.structure(updates)
    leaves = treedef.flatten_up_to(updates)
    stats0, roots0, nu0 = (treedef.flatten_up_to(t) for t in (state.stats, state.roots, state.nu))
    plans = [block_regions(g.shape, block_size, max_preconditioner_dim) for g in leaves]

    def statistics(g, stats, regions):
        if regions is not None:  # per region, per axis: each block's statistic
            c = _tree.compute_dtype(g.dtype, *(s.dtype for ss in stats for s in ss))
            x = _whole(_tree.cast(g, c))
            out = []
            for (region, axes), ss in zip(regions, stats):
                blocks = _blocks(x, region)
                out.append(tuple(_tree.place_like(b2 * s + gain * _block_contracted(blocks, i), s) if i in axes
                                 else s for i, s in enumerate(ss)))
            return tuple(out)
        axes = _preconditioned_axes(g.shape, max_preconditioner_dim)
        c = _tree.compute_dtype(g.dtype, *(s.dtype for s in stats))
        x = _whole(_tree.cast(g, c)) if axes else g
        # (placed as the statistic was: along the leaf's axis i, or as a ZeRO-1 layout put it)
        return tuple(_tree.place_like(b2 * s + gain * _contracted(x, i), s) if i in axes else s
                     for i, s in enumerate(stats))

    def refreshed(all_stats, all_roots):
        out = []
        for g, stats, roots, regions in zip(leaves, all_stats, all_roots, plans):
            if regions is None:
                regions, stats, roots = (((None, _preconditioned_axes(g.shape, max_preconditioner_dim)),),
                                         (stats,), (roots,))
                unwrap = True
            else:
                unwrap = False
            new = tuple(tuple(_tree.place_like(_inverse_root(_whole(s), _whole(r), 2 * len(axes), matrix_eps,
                                                             root_method), r) if i in axes else r
                              for i, (s, r) in enumerate(zip(ss, rs)))
                        for (_, axes), ss, rs in zip(regions, stats, roots))
            out.append(new[0] if unwrap else new)
        return out

    def kept(all_stats, all_roots):
        return list(all_roots)

    stats = [statistics(g, s, regions) for g, s, regions in zip(leaves, stats0, plans)]
    start = jnp.asarray(start_preconditioning_step, count.dtype)
    after_start = count >= start
    refresh = after_start & ((count - start) % jnp.asarray(precondition_frequency, count.dtype) == 0)
    roots = jax.lax.cond(refresh, refreshed, kept, stats, list(roots0))

    def grafted_onto(direction, diagonal):
        """Per block, the stacked blocks' direction with the norm of the diagonal step's (blocks of its last half
        of axes)."""
        over = tuple(range(direction.ndim // 2, direction.ndim))
        norm = safe_sqrt(jnp.sum(direction * direction, axis=over, keepdims=True))
        size = safe_sqrt(jnp.sum(diagonal * diagonal, axis=over, keepdims=True))
        return direction * (size / jnp.where(norm > 0, norm, 1.0))

    def leaf(g, v, roots, regions):
        c = _tree.compute_dtype(g.dtype, *(r.dtype for r in jax.tree.leaves(roots)))
        x = _tree.cast(g, c)
        if graft == "sgd":
            diagonal, v_new = x, v
        else:
            v_new = (_tree.cast(v, c) + x * x) if graft == "adagrad" else (b2 * _tree.cast(v, c) + gain * x * x)
            v_hat = v_new / jnp.asarray(correction, c) if graft == "adam" else v_new
            denominator = safe_sqrt(v_hat) + eps  # 0 only where v, and so g, is 0 (eps = 0)
            diagonal = x / jnp.where(denominator > 0, denominator, 1.0)
            v_new = v_new.astype(v.dtype)
        if regions is not None:  # each block a tensor of its own: its direction, with its own graft's norm
            whole, whole_diagonal = _whole(x), _whole(diagonal)
            parts = []
            for (region, axes), rs in zip(regions, roots):
                d = _blocks(whole_diagonal, region)
                if axes:
                    direction = _blocks(whole, region)
                    for i in axes:
                        direction = _block_along(_whole(rs[i]), direction, i)
                    d = grafted_onto(direction, d)
                parts.append(_unblocked(d, region))
            counts = [len({region[i][:2] for region, _ in regions}) for i in range(g.ndim)]  # pieces per axis
            grafted = _tree.place_like(_joined(parts, counts), diagonal)  # split again as the graft's step is
            return jnp.where(after_start, grafted, diagonal).astype(g.dtype), v_new
        axes = _preconditioned_axes(g.shape, max_preconditioner_dim)
        if not axes:
            return diagonal.astype(g.dtype), v_new
        direction = _whole(x)
        for i in axes:
            direction = _along(_whole(roots[i]), direction, i)
        norm = safe_sqrt(jnp.sum(direction * direction))
        grafted = direction * (safe_sqrt(jnp.sum(diagonal * diagonal)) / jnp.where(norm > 0, norm, 1.0))
        grafted = _tree.place_like(grafted, diagonal)  # split again as the graft's step is (as the leaf, or nu)
        return jnp.where(after_start, grafted, diagonal).astype(g.dtype), v_new

    out = [leaf(g, v, r, regions) for g, v, r, regions in zip(leaves, nu0, roots, plans)]
    u = treedef.unflatten([o[0] for o in out])
    nu = treedef.unflatten([o[1] for o in out])
    return u, ScaleByShampooState(stats=treedef.unflatten(stats), roots=treedef.unflatten(roots), nu=nu, count=count)


@combinator
def scale_by_shampoo(b2: ScalarOrSchedule = 0.999, eps: ScalarOrSchedule = 1e-8, matrix_eps: ScalarOrSchedule = 1e-6,
                     precondition_frequency: int = 10, start_preconditioning_step: int = 1,
                     max_preconditioner_dim: int = 1024, graft: str = "adam", block_size: int | None = None,
                     root_method: str = "eigh") -> Update:
    r"""Scales updates by Shampoo: Kronecker-factored inverse roots, the step size a diagonal method's.

    Update rule at step $t$ (counting from 1), for a leaf $G$ with $k \ge 2$ axes whose preconditioned axes
    (those of at most ``max_preconditioner_dim`` elements) are $i_1, \dots, i_m$, with $G_{(i)}$ the leaf as a
    matrix whose rows are axis $i$, $\times_i$ the product along axis $i$, $\beta_2$ = ``b2``
    ($\gamma = 1 - \beta_2$, or $\gamma = 1$ when $\beta_2 = 1$: sums, as the paper's Algorithm 1),
    $\epsilon_H$ = ``matrix_eps``, $H_i = Q_i \Lambda_i Q_i^\top$ its eigendecomposition and
    $\lambda_\text{max}$ its largest eigenvalue:

    $$
    \begin{align*}
    H_i &\gets \beta_2 H_i + \gamma\, G_{(i)} G_{(i)}^\top \\
    P_i &\gets Q_i \max(\Lambda_i, \epsilon_H \lambda_\text{max})^{-1/(2m)} Q_i^\top \qquad
    \text{(every } f \text{ steps from } t_0 \text{, else kept)} \\
    D &= G \times_{i_1} P_{i_1} \cdots \times_{i_m} P_{i_m} \\
    u &= \frac{\lVert d \rVert}{\lVert D \rVert}\, D
    \end{align*}
    $$

    with $f$ = ``precondition_frequency``, $t_0$ = ``start_preconditioning_step``, the roots refreshed at the
    steps $t \ge t_0$ with $t - t_0$ a multiple of $f$ (an eigendecomposition, in at least float32, or the
    Newton iteration below; in between,
    and before the first refresh, the last roots, the identity at first), and $d$ the graft's step, $\epsilon$ =
    ``eps``: ``graft="adagrad"`` takes $v \gets v + g^2$, $d = g / (\sqrt{v} + \epsilon)$;
    ``graft="rmsprop"`` takes $v \gets \beta_2 v + \gamma\, g^2$, $d = g / (\sqrt{v} + \epsilon)$;
    ``graft="adam"`` the same $v$ bias-corrected, $d = g / (\sqrt{v / (1 - \beta_2^t)} + \epsilon)$ (with
    $\beta_2 = 1$ both are AdaGrad's);
    ``graft="sgd"`` $d = g$. Norms are per leaf (Frobenius). A matrix gets the paper's $P_i = H_i^{-1/4}$, an
    order-$k$ tensor $H_i^{-1/(2k)}$. Before $t_0$, and on a leaf with fewer than two axes or no axis small
    enough, $u = d$ (the graft alone). An axis above ``max_preconditioner_dim`` is not preconditioned (its factor
    is the identity).

    Blocking (Anil et al. 2020, "Preconditioning of large layers"): with ``block_size`` = $B$, a leaf of two
    axes or more with an axis longer than $B$ is cut along each such axis into blocks of $B$ elements (the last
    one shorter when $B$ does not divide the axis), and each block $G_b$ is a tensor of its own: the rule above
    runs on it with its own statistics $H_{b,i}$ and roots $P_{b,i}$ (for its axes of at most
    ``max_preconditioner_dim`` elements, as for a leaf; an axis of the leaf no longer than $B$ is not cut and
    keeps that meaning of ``max_preconditioner_dim``), and its own graft norm,
    $u_b = \lVert d_b \rVert / \lVert D_b \rVert\, D_b$ with $d_b$ the graft's step on the block: the update
    equals Shampoo run on each block apart (block-diagonal preconditioning; the graft's $v$ is elementwise,
    the same either way). ``None`` cuts nothing; a leaf whose axes are all at most $B$ long is not cut.

    ``root_method="newton"`` computes $P_i = (H_i + \epsilon_H \lVert H_i \rVert_F I)^{-1/p}$, $p = 2m$, by the
    coupled Newton iteration for the inverse $p$-th root (Guo & Higham 2006, as Anil et al. run it: matrix
    products only, no eigendecomposition) with $A = H_i + \epsilon_H \lVert H_i \rVert_F I$ and
    $z = (1 + p) / (2 \lVert A \rVert_F)$:

    $$
    \begin{align*}
    X_0 &= z^{1/p} I, \quad M_0 = z A \\
    T_j &= \tfrac{1}{p} \big((p + 1) I - M_j\big), \quad X_{j+1} = X_j T_j, \quad M_{j+1} = T_j^p M_j
    \end{align*}
    $$

    ($M_j = X_j^p A$ throughout, and $M_j \to I$, $X_j \to A^{-1/p}$): at most 100 steps, stopping once
    $\max |M_j - I| \le 10^{-6}$ or when a step (after the first) does not lower it, the last step that did
    kept. The ridge $\epsilon_H \lVert H_i \rVert_F$ (a shift, where ``"eigh"`` clamps) keeps $A$'s condition
    number below about $1 / \epsilon_H$, so a rank-deficient statistic converges (about $\log(1/\epsilon_H)$
    slow steps, then quadratically); where it does not (an $\epsilon_H$ below float32's rounding of a
    rank-deficient statistic, about $10^{-7}$), where it ends above $\max |M - I| = 10^{-3}$ or is not
    finite, the previous root is kept, as for a zero statistic.

    One statistic per axis, the paper's tensor case, rather than a matrix over the first axis and the rest
    flattened: a convolution kernel or a stack of layers keeps the structure of each axis, and each statistic
    stays as small as its axis.

    Numerically: the statistic is symmetrised and its eigenvalues clamped from below at
    $\epsilon_H \lambda_\text{max}$ (those below are float32 round-off, about $10^{-7} \lambda_\text{max}$), so a
    rank-deficient statistic has a finite root; a zero statistic (no gradient yet), or a root that is not
    finite, keeps the previous root; a zero direction gives $u = 0$. Even so, float32 roots reproduce to about
    $10^{-4}$ only: the eigenvectors round at $10^{-7} \lambda_\text{max}$ over the gaps between eigenvalues.
    Derivatives through the step take the roots as constants (``eigh``'s is not finite where eigenvalues
    repeat, as in a statistic of rank one).

    Args:
        b2: decay of the statistics and of the rmsprop and adam grafts' second moment, in [0, 1]; 1 sums
            (Algorithm 1). Default: ``0.999``.
        eps: the graft's denominator term, >= 0. Default: ``1e-08``.
        matrix_eps: added to the statistics' eigenvalues, relative to the largest one, > 0. Default: ``1e-06``.
        precondition_frequency: the steps between refreshes of the roots, a positive integer. Default: ``10``.
        start_preconditioning_step: the first step that uses the roots (and refreshes them), a positive integer.
            Default: ``1``.
        max_preconditioner_dim: the largest axis that gets a statistic, a positive integer. Default: ``1024``.
        graft: the diagonal method whose step size (norm per leaf, per block with ``block_size``) the update
            takes: ``"adagrad"``, ``"rmsprop"``, ``"adam"`` or ``"sgd"``. Default: ``'adam'``.
        block_size: None (no blocking), or a positive integer: the longest block of a leaf along an axis; a
            leaf with a longer axis is cut into blocks, each preconditioned and grafted on its own.
            Default: ``None``.
        root_method: how the roots are computed, ``"eigh"`` (an eigendecomposition, eigenvalues clamped) or
            ``"newton"`` (the coupled Newton iteration, a ridge added). Default: ``'eigh'``.

    Returns:
        An update object with state ``ScaleByShampooState(stats, roots, nu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_shampoo(b2=1.0, graft="sgd", precondition_frequency=1)
        >>> state = opt.init({"w": jnp.zeros((2, 2)), "b": jnp.zeros(2)})
        >>> u, state = opt.update({"w": jnp.array([[3.0, 0.0], [0.0, 0.3]]), "b": jnp.array([2.0, 1.0])}, state)
        >>> u["w"].round(3)  # L^(-1/4) G R^(-1/4) equalises the singular values 3 and 0.3, the norm is g's
        Array([[2.132, 0.   ],
               [0.   , 2.132]], dtype=float32)
        >>> u["b"]  # one axis: the graft alone
        Array([2., 1.], dtype=float32)
        >>> [r.shape for r in opt.get_state(state, "scale_by_shampoo.roots")["w"]]
        [(2, 2), (2, 2)]
        >>> blocked = ux.scale_by_shampoo(block_size=2)  # rows 0-1, 2-3 (stacked) and 4, all columns
        >>> stats = blocked.get_state(blocked.init({"w": jnp.zeros((5, 2))}), "scale_by_shampoo.stats")
        >>> [[s.shape for s in region] for region in stats["w"]]
        [[(2, 1, 2, 2), (2, 1, 2, 2)], [(1, 1, 1, 1), (1, 1, 2, 2)]]

    References:
        Gupta, Koren & Singer, "Shampoo: Preconditioned Stochastic Tensor Optimization", ICML 2018.
        https://arxiv.org/abs/1802.09568;
        Anil et al., "Scalable Second Order Optimization for Deep Learning", 2020.
        https://arxiv.org/abs/2002.09018;
        Guo & Higham, "A Schur-Newton Method for the Matrix p-th Root and its Inverse", SIAM J. Matrix Anal.
        Appl. 28(3), 2006. https://doi.org/10.1137/050643374
    """
    options = dict(b2=b2, eps=eps, matrix_eps=matrix_eps, precondition_frequency=precondition_frequency,
                   start_preconditioning_step=start_preconditioning_step,
                   max_preconditioner_dim=max_preconditioner_dim, graft=graft, block_size=block_size,
                   root_method=root_method)
    # Which axes (and blocks) get a statistic shapes the state, and the graft and the root's method pick the
    # kernel: structure, not data.
    return stateful(_init_scale_by_shampoo, _apply_scale_by_shampoo, name="scale_by_shampoo", options=options,
                    domains=_SHAMPOO_DOMAINS,
                    static=("max_preconditioner_dim", "graft", "block_size", "root_method"), schedulable=("b2", "eps", "matrix_eps"))
