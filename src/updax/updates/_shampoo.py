"""Shampoo: Kronecker-factored preconditioning, one statistic per axis, grafted onto a diagonal method's step size.

Each leaf with two axes or more keeps, for each axis small enough, the sum
(or EMA) of its gradient's contractions over the other axes, and the
inverse root of it, refreshed every few steps by an eigendecomposition
under ``lax.cond`` (the jitted step stays one program). The step takes its
direction from the roots and its size, per leaf, from the graft.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import NON_NEGATIVE, POSITIVE, Count, Integer, NonNegativeField, OneOf, Real
from updax._primitives import stateful
from updax._typing import ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import bias_corrections, number, real_only, safe_sqrt


class ScaleByShampooState(NamedTuple):
    r"""Shampoo's statistics and roots, the graft's second moment and the steps taken.

    ``stats`` and ``roots`` hold, for each leaf, a tuple of one entry per axis: for a preconditioned axis of
    size $n$ the $n \times n$ statistic and its inverse root (the identity until the first refresh), for any
    other axis a one-element zero; on a mesh their rows are split as the leaf's axis is (the products gather
    the leaf). ``nu`` is the graft's accumulator of $g^2$, shaped like the leaf (a one-element zero for
    ``graft="sgd"``).
    """

    stats: Any
    roots: Any
    nu: NonNegativeField
    count: Count


_GRAFTS = ("adagrad", "rmsprop", "adam", "sgd")


_SHAMPOO_DOMAINS = dict(b2=Real(0.0, 1.0), eps=NON_NEGATIVE, matrix_eps=POSITIVE, precondition_frequency=Integer(1),
                        start_preconditioning_step=Integer(1), max_preconditioner_dim=Integer(1),
                        graft=OneOf(_GRAFTS))


#: The products of statistics and roots in full float32 (not TF32 or bfloat16 passes on an accelerator).
_HIGHEST = jax.lax.Precision.HIGHEST


def _whole(x):
    """``x`` gathered on every device of its mesh (the statistics contract every axis but one)."""
    return _tree.place_like(x, x, dims=(None,) * x.ndim)


def _preconditioned_axes(shape, max_preconditioner_dim):
    """The axes that get a statistic: every axis of at most ``max_preconditioner_dim`` elements of a non-empty
    leaf with two axes or more."""
    if len(shape) < 2 or 0 in shape:
        return ()
    return tuple(i for i, n in enumerate(shape) if n <= max_preconditioner_dim)


def _init_scale_by_shampoo(params, *, max_preconditioner_dim, graft):
    def leaf(p):
        p = jnp.asarray(p)
        dtype = _tree.compute_dtype(p.dtype)
        axes = _preconditioned_axes(p.shape, max_preconditioner_dim)

        def placeholder():  # separate buffers, replicated over the param's mesh
            return _tree.full((1,), 0.0, dtype, p, dims=(None,))

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


def _inverse_root(stat, old, exponent, matrix_eps):
    """``Q·max(Λ, ε·λ_max)^(-1/exponent)·Qᵀ`` from ``eigh`` of the statistic ``QΛQᵀ``; ``old`` where the
    statistic is zero or the result is not finite.

    Clamped rather than shifted by ``ε·λ_max``: float32's eigenvalues are exact to about 1e-7 of ``λ_max`` only,
    so those below the floor are round-off, and a root read from them would differ from one rounding to the next.
    The root is a constant to derivatives through the step: ``eigh``'s derivative is not finite where eigenvalues
    repeat (a statistic of rank one has them), and a preconditioner is not what one differentiates a step by.
    """
    h, matrix_eps = jax.lax.stop_gradient(((stat + stat.T) / 2, matrix_eps))
    lam, q = jnp.linalg.eigh(h)
    lam_max = jnp.max(lam)
    floor = jnp.maximum(matrix_eps * lam_max, jnp.finfo(lam.dtype).tiny)
    root = jnp.matmul(q * jnp.maximum(lam, floor) ** (-1.0 / exponent), q.T, precision=_HIGHEST)
    ok = (lam_max > 0) & jnp.all(jnp.isfinite(root))
    return jnp.where(ok, root, jax.lax.stop_gradient(old))


def _apply_scale_by_shampoo(updates, state, params, *, b2, eps, matrix_eps, precondition_frequency,
                            start_preconditioning_step, max_preconditioner_dim, graft):
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

    def statistics(g, stats):
        axes = _preconditioned_axes(g.shape, max_preconditioner_dim)
        c = _tree.compute_dtype(g.dtype, *(s.dtype for s in stats))
        x = _whole(_tree.cast(g, c)) if axes else g
        return tuple(_tree.place_like(b2 * s + gain * _contracted(x, i), g, dims=(i, None)) if i in axes else s
                     for i, s in enumerate(stats))

    def refreshed(all_stats, all_roots):
        out = []
        for g, stats, roots in zip(leaves, all_stats, all_roots):
            axes = _preconditioned_axes(g.shape, max_preconditioner_dim)
            out.append(tuple(_tree.place_like(_inverse_root(_whole(s), _whole(r), 2 * len(axes), matrix_eps), g,
                                              dims=(i, None)) if i in axes else r
                             for i, (s, r) in enumerate(zip(stats, roots))))
        return out

    def kept(all_stats, all_roots):
        return list(all_roots)

    stats = [statistics(g, s) for g, s in zip(leaves, stats0)]
    start = jnp.asarray(start_preconditioning_step, count.dtype)
    after_start = count >= start
    refresh = after_start & ((count - start) % jnp.asarray(precondition_frequency, count.dtype) == 0)
    roots = jax.lax.cond(refresh, refreshed, kept, stats, list(roots0))

    def leaf(g, v, roots):
        c = _tree.compute_dtype(g.dtype, *(r.dtype for r in roots))
        x = _tree.cast(g, c)
        if graft == "sgd":
            diagonal, v_new = x, v
        else:
            v_new = (_tree.cast(v, c) + x * x) if graft == "adagrad" else (b2 * _tree.cast(v, c) + gain * x * x)
            v_hat = v_new / jnp.asarray(correction, c) if graft == "adam" else v_new
            denominator = safe_sqrt(v_hat) + eps  # 0 only where v, and so g, is 0 (eps = 0)
            diagonal = x / jnp.where(denominator > 0, denominator, 1.0)
            v_new = v_new.astype(v.dtype)
        axes = _preconditioned_axes(g.shape, max_preconditioner_dim)
        if not axes:
            return diagonal.astype(g.dtype), v_new
        direction = _whole(x)
        for i in axes:
            direction = _along(_whole(roots[i]), direction, i)
        norm = safe_sqrt(jnp.sum(direction * direction))
        grafted = direction * (safe_sqrt(jnp.sum(diagonal * diagonal)) / jnp.where(norm > 0, norm, 1.0))
        grafted = _tree.place_like(grafted, g)  # split again as the leaf is
        return jnp.where(after_start, grafted, diagonal).astype(g.dtype), v_new

    out = [leaf(g, v, r) for g, v, r in zip(leaves, nu0, roots)]
    u = treedef.unflatten([o[0] for o in out])
    nu = treedef.unflatten([o[1] for o in out])
    return u, ScaleByShampooState(stats=treedef.unflatten(stats), roots=treedef.unflatten(roots), nu=nu, count=count)


@combinator
def scale_by_shampoo(b2: ScalarOrSchedule = 0.999, eps: ScalarOrSchedule = 1e-8, matrix_eps: ScalarOrSchedule = 1e-6,
                     precondition_frequency: int = 10, start_preconditioning_step: int = 1,
                     max_preconditioner_dim: int = 1024, graft: str = "adam") -> Update:
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
    steps $t \ge t_0$ with $t - t_0$ a multiple of $f$ (an eigendecomposition, in at least float32; in between,
    and before the first refresh, the last roots, the identity at first), and $d$ the graft's step, $\epsilon$ =
    ``eps``: ``graft="adagrad"`` takes $v \gets v + g^2$, $d = g / (\sqrt{v} + \epsilon)$;
    ``graft="rmsprop"`` takes $v \gets \beta_2 v + \gamma\, g^2$, $d = g / (\sqrt{v} + \epsilon)$;
    ``graft="adam"`` the same $v$ bias-corrected, $d = g / (\sqrt{v / (1 - \beta_2^t)} + \epsilon)$ (with
    $\beta_2 = 1$ both are AdaGrad's);
    ``graft="sgd"`` $d = g$. Norms are per leaf (Frobenius). A matrix gets the paper's $P_i = H_i^{-1/4}$, an
    order-$k$ tensor $H_i^{-1/(2k)}$. Before $t_0$, and on a leaf with fewer than two axes or no axis small
    enough, $u = d$ (the graft alone). An axis above ``max_preconditioner_dim`` is not preconditioned (its factor
    is the identity; blocking of large axes is not offered).

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
        graft: the diagonal method whose step size (norm per leaf) the update takes: ``"adagrad"``,
            ``"rmsprop"``, ``"adam"`` or ``"sgd"``. Default: ``'adam'``.

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

    References:
        Gupta, Koren & Singer, "Shampoo: Preconditioned Stochastic Tensor Optimization", ICML 2018.
        https://arxiv.org/abs/1802.09568;
        Anil et al., "Scalable Second Order Optimization for Deep Learning", 2020.
        https://arxiv.org/abs/2002.09018
    """
    options = dict(b2=b2, eps=eps, matrix_eps=matrix_eps, precondition_frequency=precondition_frequency,
                   start_preconditioning_step=start_preconditioning_step,
                   max_preconditioner_dim=max_preconditioner_dim, graft=graft)
    # Which axes get a statistic shapes the state, and the graft picks the kernel: structure, not data.
    return stateful(_init_scale_by_shampoo, _apply_scale_by_shampoo, name="scale_by_shampoo", options=options,
                    domains=_SHAMPOO_DOMAINS,
                    static=("max_preconditioner_dim", "graft"), schedulable=("b2", "eps", "matrix_eps"))
