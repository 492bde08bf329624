"""Orthogonalised updates: Muon's Newton–Schulz iteration, Muon itself, and its shape scaling.

Each takes ``weight_dimension_numbers`` (see ``_muon_dims.py``): which leaves are matrices, and
which of their axes are rows, columns and batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import ANY_REAL, NON_NEGATIVE, UNIT, Count, Flag, FloatDtype, Integer, Valid, fail
from updax._primitives import stateful, stateless
from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import abs_sq, moment, real_only, safe_sqrt, scaled
from updax.updates._muon_dims import DIMENSION_NUMBERS, fans, leaf_axes, on_matrices

# The quintic Newton–Schulz coefficients of Muon (Jordan et al., 2024).
_NS_COEFFS = (3.4445, -4.7750, 2.0315)


class ScaleByMuonState(NamedTuple):
    """The momentum ``mu`` and the steps taken ``count``."""

    mu: Any
    count: Count


_NS_COEFFS_TEXT = "must be a tuple of three finite real numbers"


def _ns_coeffs(call, name, value):
    """Three finite real numbers, stored as a tuple."""
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        fail(call, name, value, _NS_COEFFS_TEXT, TypeError)
    try:
        return tuple(ANY_REAL.check(call, name, k) for k in value)
    except (TypeError, ValueError) as error:  # (named with the whole tuple, not the one number)
        fail(call, name, tuple(value), _NS_COEFFS_TEXT, type(error))


#: Newton-Schulz iterations are unrolled into the compiled step, so their number is bounded (5 is usual).
MAX_NS_STEPS = 100

#: What the options of the orthogonalising stages hold.
_MUON_DOMAINS = dict(
    ns_coeffs=Valid(rule=_ns_coeffs, text=_NS_COEFFS_TEXT, values=ANY_REAL),
    ns_steps=Integer(1, MAX_NS_STEPS, why=" (each iteration is unrolled into the compiled step)"),
    beta=UNIT, eps=NON_NEGATIVE, nesterov=Flag(), mu_dtype=FloatDtype(), adaptive=Flag(late=True),
    weight_dimension_numbers=DIMENSION_NUMBERS)


def _domains(options):
    return {k: _MUON_DOMAINS[k] for k in options}


def _newton_schulz(x, ns_coeffs, ns_steps, eps):
    """The quintic ``x ← a·x + (b·xxᵀ + c·(xxᵀ)²)·x`` on each matrix of a batch ``(..., m, n)``, from
    ``x / (‖x‖_F + eps)``. (On a mesh, :func:`on_matrices` gathers the matrix axes first: the products contract
    them.)"""
    a, b, c = (jnp.asarray(k, x.dtype) for k in ns_coeffs)
    tall = x.shape[-2] > x.shape[-1]
    if tall:  # the iteration commutes with transposition: work with the smaller Gram matrix
        x = jnp.swapaxes(x, -1, -2)
    # jnp.linalg.norm of each matrix, with a finite gradient at x = 0
    x = x / (safe_sqrt(jnp.sum(abs_sq(x), axis=(-2, -1), keepdims=True)) + eps)
    for _ in range(ns_steps):
        gram = x @ jnp.swapaxes(x, -1, -2)
        x = a * x + (b * gram + c * gram @ gram) @ x
    return jnp.swapaxes(x, -1, -2) if tall else x


def _dual_scaled(m, o):
    """``⟨m, o⟩·o`` for each matrix of a batch: with ``o ≈ UVᵀ`` of ``m = USVᵀ``, the nuclear norm of ``m``
    (the spectral norm's dual) times ``o``."""
    return jnp.sum(m * o, axis=(-2, -1), keepdims=True) * o


def _apply_scale_by_newton_schulz(updates, params, *, ns_coeffs, ns_steps, eps, weight_dimension_numbers=None):
    call = "scale_by_newton_schulz"
    real_only(call, updates)
    leaves, treedef = jax.tree.flatten(updates)

    def leaf(g, axes):
        if axes is None:
            return g
        c = _tree.compute_dtype(g.dtype)
        return on_matrices(lambda x: _newton_schulz(x, ns_coeffs, ns_steps, eps), g.astype(c), axes).astype(g.dtype)

    axes = leaf_axes(call, weight_dimension_numbers, updates, params)
    return treedef.unflatten([leaf(g, a) for g, a in zip(leaves, axes)])


@combinator
def scale_by_newton_schulz(ns_coeffs: tuple[float, float, float] = _NS_COEFFS, ns_steps: int = 5,
                           eps: ScalarOrSchedule = 1e-8, *,
                           weight_dimension_numbers: PyTree | Callable[[PyTree], PyTree] | None = None) -> Update:
    r"""Replaces each matrix update by an approximate orthogonalization (Muon's Newton–Schulz step).

    Update rule, for each matrix $u$ (a leaf with two axes, or each matrix
    of a leaf that ``weight_dimension_numbers`` makes a batch of them; other
    leaves pass unchanged), with $(a, b, c)$ = ``ns_coeffs``, $\epsilon$ = ``eps``, $N$ = ``ns_steps``;
    a matrix with more rows than columns is transposed first and back after, as the
    iteration commutes with transposition:

    $$
    \begin{align*}
    X &\gets u / (\lVert u \rVert_F + \epsilon) \\
    X &\gets a X + \bigl(b\, X X^\top + c\, (X X^\top)^2\bigr) X \qquad (N \text{ times}) \\
    u &= X
    \end{align*}
    $$

    The default coefficients do not converge to the polar factor $U V^\top$ of
    $u = U S V^\top$: they push every singular value into roughly [0.7, 1.2] in
    few steps, which is what Muon needs.

    Args:
        ns_coeffs: the quintic's coefficients $(a, b, c)$, three finite
            real numbers. Default: ``(3.4445, -4.7750, 2.0315)``.
        ns_steps: the number of iterations, an integer in [1, 100] (each is
            unrolled into the compiled step). Default: ``5``.
        eps: added to the Frobenius norm, >= 0. Default: ``1e-8``.
        weight_dimension_numbers: which leaves are matrices and which of
            their axes: a pytree of :class:`MuonDimensionNumbers` or None (not
            a matrix) shaped like the updates or a prefix of them, or a
            function of the params returning one. A leaf with dimension numbers
            is a batch of matrices (its reduction axes are the rows, its output
            axes the columns, the other axes index the batch), each
            orthogonalised on its own. None makes every leaf with two axes a
            matrix. Default: ``None``.

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
    options = dict(ns_coeffs=ns_coeffs, ns_steps=ns_steps, eps=eps, weight_dimension_numbers=weight_dimension_numbers)
    # The number of iterations unrolls into the compiled step, and the axes shape it: structure, not data.
    return stateless(_apply_scale_by_newton_schulz, name="scale_by_newton_schulz", options=options,
                     domains=_domains(options), static=("ns_steps", "weight_dimension_numbers"), schedulable=("eps",))


# --------------------------------------------------------------------------
# Muon


def _init_scale_by_muon(params, *, mu_dtype):
    return ScaleByMuonState(mu=_tree.accumulators(params, mu_dtype), count=_tree.zero_count())


def _apply_scale_by_muon(updates, state, params, *, ns_coeffs, ns_steps, beta, eps, nesterov, adaptive=None,
                         weight_dimension_numbers=None):
    call = "scale_by_muon"
    real_only(call, updates)
    _tree.check_same_structure(call, updates, state.mu, "updates", "state.mu")
    count = _tree.safe_increment(state.count)
    t = _tree.float_count(count)
    correction, next_correction = 1 - beta**t, 1 - beta ** (t + 1)

    def orthogonalised(m_hat):
        o = _newton_schulz(m_hat, ns_coeffs, ns_steps, eps)
        return _dual_scaled(m_hat, o) if adaptive else o

    def leaf(g, m, axes):  # in the compute dtype (at least float32); stored in g's and m's dtypes
        c = _tree.compute_dtype(g.dtype, m.dtype)
        x, m_new = g.astype(c), moment(beta, m.astype(c), g.astype(c))
        if nesterov:
            m_hat = beta * m_new / next_correction.astype(c) + (1 - beta) * x / correction.astype(c)
        else:
            m_hat = m_new / correction.astype(c)
        u = m_hat if axes is None else on_matrices(orthogonalised, m_hat, axes)
        return u.astype(g.dtype), m_new.astype(m.dtype)

    leaves, treedef = jax.tree.flatten(updates)
    axes = leaf_axes(call, weight_dimension_numbers, updates, params)
    out = [leaf(g, m, a) for g, m, a in zip(leaves, treedef.flatten_up_to(state.mu), axes)]
    return (treedef.unflatten([u for u, _ in out]),
            ScaleByMuonState(mu=treedef.unflatten([m for _, m in out]), count=count))


@combinator
def scale_by_muon(ns_coeffs: tuple[float, float, float] = _NS_COEFFS, ns_steps: int = 5,
                  beta: ScalarOrSchedule = 0.95, eps: ScalarOrSchedule = 1e-8, nesterov: bool = True, *,
                  mu_dtype: DType = None, adaptive: bool = False,
                  weight_dimension_numbers: PyTree | Callable[[PyTree], PyTree] | None = None) -> Update:
    r"""Scales updates by Muon: bias-corrected momentum, orthogonalized by Newton–Schulz.

    Update rule, for step $t$ (counting from 1), with $\beta$ = ``beta``, then
    :func:`scale_by_newton_schulz` ($\operatorname{NewtonSchulz}$) on
    each matrix (a leaf with two axes, or each matrix of a leaf that
    ``weight_dimension_numbers`` makes a batch of them); other leaves get the
    momentum $\hat m$ alone:

    $$
    \begin{align*}
    m &\gets \beta m + (1 - \beta)\, g \\
    \hat m &= \beta m / (1 - \beta^{t+1}) + (1 - \beta)\, g / (1 - \beta^t) \\
    u &= \operatorname{NewtonSchulz}(\hat m)
    \end{align*}
    $$

    This $\hat m$ is ``nesterov=True``'s; ``nesterov=False`` takes $\hat m = m / (1 - \beta^t)$.

    With ``adaptive=True``, $u \gets \langle \hat m, u \rangle\, u$ then: each orthogonalised matrix is scaled by
    $\langle \hat m, u \rangle = \operatorname{trace}(\hat m^\top u)$, about the nuclear norm of $\hat m$ (the
    dual of the spectral norm): the steepest-descent step of Bernstein & Newhouse,
    as optax's ``adaptive=True``. Each matrix of a batch gets its own
    $\langle \hat m, u \rangle$, as a leaf of its own would; optax 0.2.8 takes one sum over
    the whole leaf, batch axes included, so that stacking layers changes
    their steps (they agree on leaves with two axes).

    Args:
        ns_coeffs: the quintic's coefficients ``(a, b, c)``, three finite
            real numbers. Default: ``(3.4445, -4.7750, 2.0315)``.
        ns_steps: the number of iterations, an integer in [1, 100] (each is
            unrolled into the compiled step). Default: ``5``.
        beta: decay of the momentum, in [0, 1). Default: ``0.95``.
        eps: added to the Frobenius norm, >= 0. Default: ``1e-8``.
        nesterov: use Nesterov's look-ahead momentum. Default: ``True``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        adaptive: scale each orthogonalised matrix by $\langle \hat m, u \rangle$; it prints
            only when True. Default: ``False``.
        weight_dimension_numbers: which leaves are matrices and which of
            their axes, as in :func:`scale_by_newton_schulz`: a pytree of
            :class:`MuonDimensionNumbers` or None, or a function of the params
            returning one; None makes every leaf with two axes a matrix.
            Default: ``None``.

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
    options = dict(ns_coeffs=ns_coeffs, ns_steps=ns_steps, beta=beta, eps=eps, nesterov=nesterov, mu_dtype=mu_dtype,
                   adaptive=adaptive, weight_dimension_numbers=weight_dimension_numbers)
    return stateful(_init_scale_by_muon, _apply_scale_by_muon, name="scale_by_muon", options=options,
                    domains=_domains(options), static=("ns_steps", "weight_dimension_numbers"),
                    schedulable=("beta", "eps"))


# --------------------------------------------------------------------------
# Muon's width transfer


def _shape_scale(g, axes):
    if axes is None:
        return g
    fan_in, fan_out = fans(g, axes)
    if fan_in == 0 or g.size == 0:  # (a zero-size matrix has nothing to scale, and fan_in may be 0)
        return g
    return scaled(g, max(1.0, fan_out / fan_in) ** 0.5)


def _apply_scale_by_shape(updates, params, *, weight_dimension_numbers=None):
    leaves, treedef = jax.tree.flatten(updates)
    axes = leaf_axes("scale_by_shape", weight_dimension_numbers, updates, params)
    return treedef.unflatten([_shape_scale(g, a) for g, a in zip(leaves, axes)])


@combinator
def scale_by_shape(weight_dimension_numbers: PyTree | Callable[[PyTree], PyTree] | None = None) -> Update:
    r"""Scales each matrix update by ``sqrt(max(1, fan_out / fan_in))`` (Muon's width transfer).

    Update rule: $u \gets u \sqrt{\max(1, n / m)}$ for a 2-D leaf of shape
    $(m, n)$ (input dimension first); other leaves pass unchanged. With
    ``weight_dimension_numbers``, $m$ is the size of a leaf's reduction
    axes and $n$ of its output axes (one factor for the whole batch).

    Args:
        weight_dimension_numbers: which leaves are matrices and which of
            their axes, as in :func:`scale_by_newton_schulz`: a pytree of
            :class:`MuonDimensionNumbers` or None, or a function of the params
            returning one; None makes every leaf with two axes a matrix.
            Default: ``None``.

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
    options = dict(weight_dimension_numbers=weight_dimension_numbers)
    return stateless(_apply_scale_by_shape, name="scale_by_shape", options=options, domains=_domains(options),
                     static=("weight_dimension_numbers",))
