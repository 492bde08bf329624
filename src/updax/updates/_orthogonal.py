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
from updax._domains import (
    ANY_REAL,
    NON_NEGATIVE,
    UNIT,
    Count,
    Flag,
    FloatDtype,
    Integer,
    NonNegativeField,
    Valid,
    fail,
)
from updax._primitives import stateful, stateless
from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import abs_sq, moment, real_only, safe_sqrt, scaled
from updax.updates._muon_dims import DIMENSION_NUMBERS, fans, leaf_axes, on_matrices

# The quintic Newton–Schulz coefficients of Muon (Jordan et al., 2024).
_NS_COEFFS = (3.4445, -4.7750, 2.0315)

#: Named coefficients, as optax.contrib.muon names them: Muon's triple, and Dion's five per-step triples
#: (Ahn et al., 2025).
NS_PRESETS = {
    "standard": _NS_COEFFS,
    "dion": ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
             (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)),
}


class ScaleByMuonState(NamedTuple):
    """The momentum ``mu`` and the steps taken ``count``."""

    mu: Any
    count: Count


_NS_COEFFS_TEXT = "must be a tuple of three finite real numbers"
_NS_FORMS_TEXT = ("must be a tuple of three finite real numbers, a tuple of such triples (one per iteration, "
                  f"at most 100), or a preset's name ({' or '.join(map(repr, NS_PRESETS))})")


def _triple(call, name, whole, value, text):
    """Three finite real numbers, stored as a tuple (refused naming ``whole``, the option as given)."""
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        fail(call, name, whole, text, TypeError)
    try:
        return tuple(ANY_REAL.check(call, name, k) for k in value)
    except (TypeError, ValueError) as error:  # (named with the whole option, not the one number)
        fail(call, name, whole, text, type(error))


def _ns_coeffs(call, name, value):
    """A triple, a tuple of per-iteration triples, or a preset's name: stored as numbers."""
    if isinstance(value, str):
        if value not in NS_PRESETS:
            fail(call, name, value, _NS_FORMS_TEXT)
        return NS_PRESETS[value]
    if not isinstance(value, (tuple, list)):
        fail(call, name, value, _NS_FORMS_TEXT, TypeError)
    if value and all(isinstance(k, (tuple, list)) for k in value):
        if len(value) > MAX_NS_STEPS:
            fail(call, name, value, _NS_FORMS_TEXT)
        return tuple(_triple(call, name, value, k, _NS_FORMS_TEXT) for k in value)
    return _triple(call, name, value, value, _NS_COEFFS_TEXT)


#: How a matrix is brought under spectral norm 1 before (or in) the first iteration; ``"frobenius"`` is stored
#: as None (the option was added after the stages shipped: their pipelines print as before).
PRECONDITIONINGS = ("frobenius", "spectral", "aol", "schatten")
_PRECONDITIONING_TEXT = "must be " + " or ".join(map(repr, PRECONDITIONINGS))


def _preconditioning(call, name, value):
    if value is None:
        return None
    if not isinstance(value, str) or value not in PRECONDITIONINGS:
        fail(call, name, value, _PRECONDITIONING_TEXT, ValueError if isinstance(value, str) else TypeError)
    return None if value == "frobenius" else value


def _none_or_non_negative(call, name, value):
    return None if value is None else NON_NEGATIVE.check(call, name, value, schedulable=True)


#: Newton-Schulz iterations are unrolled into the compiled step, so their number is bounded (5 is usual).
MAX_NS_STEPS = 100

#: What the options of the orthogonalising stages hold.
_MUON_DOMAINS = dict(
    ns_coeffs=Valid(rule=_ns_coeffs, text=_NS_FORMS_TEXT, values=ANY_REAL),
    ns_steps=Integer(1, MAX_NS_STEPS, why=" (each iteration is unrolled into the compiled step)"),
    beta=UNIT, beta2=UNIT, eps=NON_NEGATIVE, rms=NON_NEGATIVE, nesterov=Flag(), mu_dtype=FloatDtype(),
    adaptive=Flag(late=True),
    preconditioning=Valid(rule=_preconditioning, text=_PRECONDITIONING_TEXT),
    consistent_rms=Valid(rule=_none_or_non_negative, text="must be None or in [0, inf)", values=NON_NEGATIVE),
    weight_dimension_numbers=DIMENSION_NUMBERS)


def _domains(options):
    return {k: _MUON_DOMAINS[k] for k in options}


def _per_iteration(ns_coeffs, ns_steps):
    """The coefficients of each iteration: the one triple ``ns_steps`` times, or the per-iteration triples."""
    return tuple(ns_coeffs) if isinstance(ns_coeffs[0], (tuple, list)) else (ns_coeffs,) * ns_steps


def _first_rescaled(x, gram, preconditioning, eps):
    """``x`` and ``gram = x xᵀ`` rescaled in the first iteration: AOL's row scaling ``D = diag(max(Σⱼ|Aᵢⱼ|,
    eps))^(-1/2)`` (``x ← D x``, ``A ← D A D``), or by the Schatten-4 norm ``s = max(‖A‖_F, eps)^(1/2)``
    (``x ← x / s``, ``A ← A / s²``)."""
    if preconditioning == "aol":
        s = jax.lax.rsqrt(jnp.maximum(jnp.sum(jnp.abs(gram), axis=-1, keepdims=True), eps))
        return x * s, gram * s * jnp.swapaxes(s, -1, -2)
    s = jax.lax.rsqrt(jnp.maximum(safe_sqrt(jnp.sum(abs_sq(gram), axis=(-2, -1), keepdims=True)), eps))
    return x * s, gram * s**2


#: Above this largest entry a matrix's ``x xᵀ`` could overflow float32 (2^127) before AOL's or the Schatten rescaling.
_LARGE = 2.0**40


def _shrunk(x):
    """``x`` over a power of two that brings its largest entry into [0.5, 1), where ``x xᵀ`` could overflow;
    ``x`` itself otherwise. AOL's and the Schatten-4 rescalings do not depend on ``x``'s scale, and a power of
    two changes no rounding."""
    largest = jnp.max(jnp.abs(x), axis=(-2, -1), keepdims=True)
    if jnp.iscomplexobj(x):  # (ldexp takes real numbers: scale by the power of two itself)
        return jnp.where(largest > _LARGE, x * jnp.ldexp(jnp.ones_like(largest), -jnp.frexp(largest)[1]), x)
    return jnp.where(largest > _LARGE, jnp.ldexp(x, -jnp.frexp(largest)[1]), x)


def _adjoint(x):
    """The conjugate transpose of each matrix of a batch (the transpose, for real matrices)."""
    x = jnp.swapaxes(x, -1, -2)
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


def _newton_schulz(x, ns_coeffs, ns_steps, eps, preconditioning=None):
    """The quintic ``x ← a·x + (b·xxᴴ + c·(xxᴴ)²)·x`` on each matrix of a batch ``(..., m, n)``, from ``x``
    brought under spectral norm 1 as ``preconditioning`` says (None: ``x / (‖x‖_F + eps)``); ``xᴴ`` is the
    conjugate transpose, so a complex matrix tends to a unitary one (optax's iteration). (On a mesh,
    :func:`on_matrices` gathers the matrix axes first: the products contract them.)"""
    if x.size == 0:
        return x
    tall = x.shape[-2] > x.shape[-1]
    if tall:  # the iteration commutes with transposition: work with the smaller Gram matrix
        x = jnp.swapaxes(x, -1, -2)
    if preconditioning is None:  # jnp.linalg.norm of each matrix, with a finite gradient at x = 0
        x = x / (safe_sqrt(jnp.sum(abs_sq(x), axis=(-2, -1), keepdims=True)) + eps)
    elif preconditioning == "spectral":  # the largest singular value of each matrix
        x = x / (jnp.linalg.norm(x, ord=2, axis=(-2, -1), keepdims=True) + eps)
    else:
        x = _shrunk(x)
    for i, coeffs in enumerate(_per_iteration(ns_coeffs, ns_steps)):
        a, b, c = (jnp.asarray(k, x.dtype) for k in coeffs)
        gram = x @ _adjoint(x)
        if i == 0 and preconditioning in ("aol", "schatten"):
            x, gram = _first_rescaled(x, gram, preconditioning, eps)
        x = a * x + (b * gram + c * gram @ gram) @ x
    return jnp.swapaxes(x, -1, -2) if tall else x


def _dual_scaled(m, o):
    """``⟨m, o⟩·o`` for each matrix of a batch: with ``o ≈ UVᴴ`` of ``m = USVᴴ``, the nuclear norm of ``m``
    (the spectral norm's dual) times ``o``; ``⟨m, o⟩ = Σ conj(m)·o`` for complex matrices, as optax's."""
    return jnp.sum((jnp.conj(m) if jnp.iscomplexobj(m) else m) * o, axis=(-2, -1), keepdims=True) * o


def _apply_scale_by_newton_schulz(updates, params, *, ns_coeffs, ns_steps, eps, preconditioning=None,
                                  weight_dimension_numbers=None):
    call = "scale_by_newton_schulz"
    leaves, treedef = jax.tree.flatten(updates)

    def leaf(g, axes):
        if axes is None:
            return g
        c = _tree.compute_dtype(g.dtype)
        return on_matrices(lambda x: _newton_schulz(x, ns_coeffs, ns_steps, eps, preconditioning), g.astype(c),
                           axes).astype(g.dtype)

    axes = leaf_axes(call, weight_dimension_numbers, updates, params)
    return treedef.unflatten([leaf(g, a) for g, a in zip(leaves, axes)])


@combinator
def scale_by_newton_schulz(
        ns_coeffs: tuple[float, float, float] | tuple[tuple[float, float, float], ...] | str = _NS_COEFFS,
        ns_steps: int = 5, eps: ScalarOrSchedule = 1e-8, *, preconditioning: str = "frobenius",
        weight_dimension_numbers: PyTree | Callable[[PyTree], PyTree] | None = None) -> Update:
    r"""Replaces each matrix update by an approximate orthogonalization (Muon's Newton–Schulz step).

    Update rule, for each matrix $u$ (a leaf with two axes, or each matrix
    of a leaf that ``weight_dimension_numbers`` makes a batch of them; other
    leaves pass unchanged), with $(a_k, b_k, c_k)$ the coefficients of iteration $k$ of $N$ (``ns_coeffs``
    for each of ``ns_steps`` iterations, or one triple per iteration), $\epsilon$ = ``eps``;
    a matrix with more rows than columns is transposed first and back after, as the
    iteration commutes with transposition:

    $$
    \begin{align*}
    X &\gets u / (\lVert u \rVert_F + \epsilon) \\
    A &= X X^\top, \quad X \gets a_k X + (b_k A + c_k A^2)\, X \qquad (k = 1, \dots, N) \\
    u &= X
    \end{align*}
    $$

    The default coefficients do not converge to the polar factor $U V^\top$ of
    $u = U S V^\top$: they push every singular value into roughly [0.7, 1.2] in
    few steps, which is what Muon needs.

    The first line, ``preconditioning="frobenius"``, brings every singular value into [0, 1], where the
    iteration works. ``"spectral"`` divides by the largest singular value instead,
    $X \gets u / (\lVert u \rVert_2 + \epsilon)$ (an SVD of each matrix: the largest lands at 1, and the
    others above where the Frobenius norm would put them). ``"aol"`` and ``"schatten"`` drop the first
    line and rescale within the first iteration, from the $A$ it computes anyway. ``"aol"`` scales the
    rows, $X \gets D X$ and $A \gets D A D$ with $D = \operatorname{diag}(r)^{-1/2}$,
    $r_i = \max(\sum_j |A_{ij}|, \epsilon)$: AOL's rescaling, which bounds the spectral norm by 1
    (Turbo-Muon finds it saves about one iteration); the rows rescaled, the iteration tends to the polar
    factor of $D X$, not of $X$. ``"schatten"`` divides by the Schatten-4 norm of $X$, $X \gets X / s$ and
    $A \gets A / s^2$ with $s = \max(\lVert A \rVert_F, \epsilon)^{1/2}$. These are optax.contrib's
    ``preconditioning`` modes; optax floors the last two at 1e-8 whatever its ``eps``.

    A zero matrix stays zero in every mode (with ``eps`` > 0; with 0 it gives NaN), and so does a zero
    row. ``"aol"`` and ``"schatten"`` first divide a matrix whose largest entry passes $2^{40}$ by a power
    of two (their rescalings do not depend on its scale; optax's $A$ overflows there, giving NaN);
    ``"frobenius"`` gives a zero update where the sum of squares overflows float32 (entries near 1e19).

    Args:
        ns_coeffs: the quintic's coefficients: one triple $(a, b, c)$ of
            finite real numbers for every iteration; a tuple of triples, one
            per iteration (at most 100; ``ns_steps`` is then ignored); or a
            preset's name, ``"standard"`` (the default triple) or ``"dion"``
            (Dion's five triples), stored as its numbers.
            Default: ``(3.4445, -4.7750, 2.0315)``.
        ns_steps: the number of iterations of one triple, an integer in
            [1, 100] (each is unrolled into the compiled step). Default: ``5``.
        eps: added to the norm (``"frobenius"``, ``"spectral"``), or the
            floor of the row sums (``"aol"``) or of $\lVert A \rVert_F$
            (``"schatten"``), >= 0. Default: ``1e-8``.
        preconditioning: how each matrix is scaled before or in the first
            iteration: ``"frobenius"``, ``"spectral"``, ``"aol"`` or
            ``"schatten"`` (see above); static, and it prints only when not
            ``"frobenius"``. Default: ``"frobenius"``.
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
        >>> aol = ux.scale_by_newton_schulz(ns_coeffs="dion", preconditioning="aol")
        >>> aol.update(g, aol.init(None))[0]["w"]  # rows scaled to norm 1 first; Dion's triples land nearer 1
        Array([[0.9783, 0.    ],
               [0.    , 0.9783],
               [0.    , 0.    ]], dtype=float32)

    References:
        Jordan et al., "Muon: An optimizer for hidden layers in neural
        networks", 2024. https://kellerjordan.github.io/posts/muon/;
        Ahn et al., "Dion: Distributed Orthonormalized Updates", 2025.
        https://arxiv.org/abs/2504.05295;
        Boissin et al., "Turbo-Muon: Accelerating Orthogonality-Based
        Optimization with Pre-Conditioning", 2025.
        https://arxiv.org/abs/2512.04632;
        Grishina et al., "Accelerating Newton-Schulz Iteration for
        Orthogonalization via Chebyshev-type Polynomials", 2025.
        https://arxiv.org/abs/2506.10935
    """
    options = dict(ns_coeffs=ns_coeffs, ns_steps=ns_steps, eps=eps, preconditioning=preconditioning,
                   weight_dimension_numbers=weight_dimension_numbers)
    # The number of iterations unrolls into the compiled step, and the axes shape it: structure, not data.
    return stateless(_apply_scale_by_newton_schulz, name="scale_by_newton_schulz", options=options,
                     domains=_domains(options), static=("ns_steps", "preconditioning", "weight_dimension_numbers"),
                     schedulable=("eps",))


# --------------------------------------------------------------------------
# Muon


def _init_scale_by_muon(params, *, mu_dtype):
    return ScaleByMuonState(mu=_tree.accumulators(params, mu_dtype), count=_tree.zero_count())


def _momentum(g, m, beta, nesterov, correction, next_correction):
    """Muon's new momentum and its bias-corrected estimate m̂ (Nesterov's look-ahead one with ``nesterov``), in
    the compute dtype (at least float32); ``correction`` is ``1 - beta^t``, ``next_correction`` ``1 - beta^(t+1)``."""
    c = _tree.compute_dtype(g.dtype, m.dtype)
    x, m_new = g.astype(c), moment(beta, m.astype(c), g.astype(c))
    if nesterov:
        m_hat = beta * m_new / next_correction.astype(c) + (1 - beta) * x / correction.astype(c)
    else:
        m_hat = m_new / correction.astype(c)
    return m_hat, m_new


def _apply_scale_by_muon(updates, state, params, *, ns_coeffs, ns_steps, beta, eps, nesterov, adaptive=None,
                         preconditioning=None, weight_dimension_numbers=None):
    call = "scale_by_muon"
    _tree.check_same_structure(call, updates, state.mu, "updates", "state.mu")
    count = _tree.safe_increment(state.count)
    t = _tree.float_count(count)
    correction, next_correction = 1 - beta**t, 1 - beta ** (t + 1)

    def orthogonalised(m_hat):
        o = _newton_schulz(m_hat, ns_coeffs, ns_steps, eps, preconditioning)
        return _dual_scaled(m_hat, o) if adaptive else o

    def leaf(g, m, axes):
        m_hat, m_new = _momentum(g, m, beta, nesterov, correction, next_correction)
        u = m_hat if axes is None else on_matrices(orthogonalised, m_hat, axes)
        return u.astype(g.dtype), m_new.astype(m.dtype)

    leaves, treedef = jax.tree.flatten(updates)
    axes = leaf_axes(call, weight_dimension_numbers, updates, params)
    out = [leaf(g, m, a) for g, m, a in zip(leaves, treedef.flatten_up_to(state.mu), axes)]
    return (treedef.unflatten([u for u, _ in out]),
            ScaleByMuonState(mu=treedef.unflatten([m for _, m in out]), count=count))


@combinator
def scale_by_muon(
        ns_coeffs: tuple[float, float, float] | tuple[tuple[float, float, float], ...] | str = _NS_COEFFS,
        ns_steps: int = 5, beta: ScalarOrSchedule = 0.95, eps: ScalarOrSchedule = 1e-8, nesterov: bool = True, *,
        mu_dtype: DType = None, adaptive: bool = False, preconditioning: str = "frobenius",
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
        ns_coeffs: the quintic's coefficients, as in
            :func:`scale_by_newton_schulz`: one triple ``(a, b, c)`` of finite
            real numbers for every iteration, a tuple of triples (one per
            iteration, at most 100; ``ns_steps`` is then ignored), or a
            preset's name, ``"standard"`` or ``"dion"``.
            Default: ``(3.4445, -4.7750, 2.0315)``.
        ns_steps: the number of iterations of one triple, an integer in
            [1, 100] (each is unrolled into the compiled step). Default: ``5``.
        beta: decay of the momentum, in [0, 1). Default: ``0.95``.
        eps: added to the norm that scales each matrix before the iteration,
            or the floor of the first iteration's rescaling (see
            :func:`scale_by_newton_schulz`), >= 0. Default: ``1e-8``.
        nesterov: use Nesterov's look-ahead momentum. Default: ``True``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        adaptive: scale each orthogonalised matrix by $\langle \hat m, u \rangle$; it prints
            only when True. Default: ``False``.
        preconditioning: how each matrix is scaled before or in the first
            iteration, ``"frobenius"``, ``"spectral"``, ``"aol"`` or
            ``"schatten"`` (see :func:`scale_by_newton_schulz`); static, and
            it prints only when not ``"frobenius"``. Default: ``"frobenius"``.
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
        https://arxiv.org/abs/2409.20325; for ``ns_coeffs`` and
        ``preconditioning``, those of :func:`scale_by_newton_schulz`.
    """
    options = dict(ns_coeffs=ns_coeffs, ns_steps=ns_steps, beta=beta, eps=eps, nesterov=nesterov, mu_dtype=mu_dtype,
                   adaptive=adaptive, preconditioning=preconditioning,
                   weight_dimension_numbers=weight_dimension_numbers)
    return stateful(_init_scale_by_muon, _apply_scale_by_muon, name="scale_by_muon", options=options,
                    domains=_domains(options), static=("ns_steps", "preconditioning", "weight_dimension_numbers"),
                    schedulable=("beta", "eps"))


# --------------------------------------------------------------------------
# NorMuon: Muon with each output unit's update normalised by its second moment


class ScaleByNorMuonState(NamedTuple):
    """The momentum ``mu``, each output unit's second moment ``nu`` (a matrix's shape with its reduction axes of
    size 1; a one-element zero for a leaf that is not a matrix), and the steps taken ``count``."""

    mu: Any
    nu: NonNegativeField
    count: Count


def _init_scale_by_normuon(params, *, mu_dtype, weight_dimension_numbers=None):
    def nu(p, axes):
        p = jnp.asarray(p)
        dtype = _tree.compute_dtype(p.dtype)
        if axes is None:  # (a separate buffer per leaf, replicated: a state holding one twice cannot be donated)
            return _tree.full((1,), 0.0, dtype, p, dims=(None,))
        _, rows, _ = axes
        shape = tuple(1 if a in rows else n for a, n in enumerate(p.shape))
        return _tree.full(shape, 0.0, dtype, p, dims=tuple(None if a in rows else a for a in range(p.ndim)))

    leaves, treedef = jax.tree.flatten(params)
    axes = leaf_axes("scale_by_normuon", weight_dimension_numbers, params, params)
    return ScaleByNorMuonState(mu=_tree.accumulators(params, mu_dtype),
                               nu=treedef.unflatten([nu(p, a) for p, a in zip(leaves, axes)]),
                               count=_tree.zero_count())


def _neuron_normalised(o, v, axes, beta2, eps, rms):
    """NorMuon's step on an orthogonalised leaf ``o``: each output unit's mean square into the EMA ``v``, ``o``
    divided by its root, and the whole matrix scaled to RMS ``rms`` (each matrix of a batch on its own)."""
    _, rows, cols = axes
    fan_in, fan_out = fans(o, axes)
    if o.size == 0:  # (nothing to normalise; a mean over no rows would be NaN)
        return o, v
    v = moment(beta2, v, jnp.mean(o * o, axis=rows, keepdims=True))
    u = o / (safe_sqrt(v) + eps)
    norm = safe_sqrt(jnp.sum(u * u, axis=rows + cols, keepdims=True))
    scale = rms * (fan_in * fan_out) ** 0.5 / jnp.where(norm > 0, norm, 1)  # a zero matrix stays zero
    return u * scale, v


def _apply_scale_by_normuon(updates, state, params, *, ns_coeffs, ns_steps, beta, beta2, eps, rms, nesterov,
                            preconditioning=None, weight_dimension_numbers=None):
    call = "scale_by_normuon"
    real_only(call, updates)
    _tree.check_same_structure(call, updates, state.mu, "updates", "state.mu")
    _tree.check_same_structure(call, updates, state.nu, "updates", "state.nu")
    count = _tree.safe_increment(state.count)
    t = _tree.float_count(count)
    correction, next_correction = 1 - beta**t, 1 - beta ** (t + 1)

    def leaf(g, m, v, axes):
        m_hat, m_new = _momentum(g, m, beta, nesterov, correction, next_correction)
        if axes is None:
            return m_hat.astype(g.dtype), m_new.astype(m.dtype), v
        o = on_matrices(lambda x: _newton_schulz(x, ns_coeffs, ns_steps, eps, preconditioning), m_hat, axes)
        u, v_new = _neuron_normalised(o, v.astype(o.dtype), axes, beta2, eps, rms)
        return u.astype(g.dtype), m_new.astype(m.dtype), v_new.astype(v.dtype)

    leaves, treedef = jax.tree.flatten(updates)
    axes = leaf_axes(call, weight_dimension_numbers, updates, params)
    out = [leaf(*args) for args in zip(leaves, treedef.flatten_up_to(state.mu), treedef.flatten_up_to(state.nu),
                                       axes)]
    return (treedef.unflatten([u for u, _, _ in out]),
            ScaleByNorMuonState(mu=treedef.unflatten([m for _, m, _ in out]),
                                nu=treedef.unflatten([v for _, _, v in out]), count=count))


@combinator
def scale_by_normuon(
        ns_coeffs: tuple[float, float, float] | tuple[tuple[float, float, float], ...] | str = _NS_COEFFS,
        ns_steps: int = 5, beta: ScalarOrSchedule = 0.95, beta2: ScalarOrSchedule = 0.95,
        eps: ScalarOrSchedule = 1e-8, rms: ScalarOrSchedule = 0.2, nesterov: bool = True, *,
        mu_dtype: DType = None, preconditioning: str = "frobenius",
        weight_dimension_numbers: PyTree | Callable[[PyTree], PyTree] | None = None) -> Update:
    r"""Scales updates by NorMuon: Muon's step with each output unit normalised by its second moment.

    Update rule, for step $t$ (counting from 1), with $\beta$ = ``beta``, $\beta_2$ = ``beta2``,
    $\epsilon$ = ``eps``, $\rho$ = ``rms``, for each matrix (a leaf with two axes, or each matrix of a leaf that
    ``weight_dimension_numbers`` makes a batch of them) of $d_\text{in}$ rows (the reduction axes) and
    $d_\text{out}$ columns (the output axes, one per output unit, or neuron), $v$ holding one number per column:

    $$
    \begin{align*}
    m &\gets \beta m + (1 - \beta)\, g \\
    O &= \operatorname{NewtonSchulz}\bigl(\beta m / (1 - \beta^{t+1}) + (1 - \beta)\, g / (1 - \beta^t)\bigr) \\
    v_j &\gets \beta_2 v_j + (1 - \beta_2)\, \frac{1}{d_\text{in}} \sum_i O_{ij}^2 \\
    \hat O_{ij} &= O_{ij} / (\sqrt{v_j} + \epsilon) \\
    u &= \rho \sqrt{d_\text{in} d_\text{out}}\, \hat O / \lVert \hat O \rVert_F
    \end{align*}
    $$

    The momentum and $\operatorname{NewtonSchulz}$ are :func:`scale_by_muon`'s (with ``nesterov=False``, $O =
    \operatorname{NewtonSchulz}(m / (1 - \beta^t))$). Muon's orthogonalised update leaves the output units'
    norms uneven; dividing each by the root of its EMA gives every unit an adaptive step, as Adam's second
    moment does per coordinate, and the last line sets the matrix's RMS to $\rho$ (0.2: AdamW's, so AdamW's
    learning rate carries over), the paper's $\hat\eta = 0.2\, \eta \sqrt{mn} / \lVert \hat O \rVert_F$. Other
    leaves get the momentum $\hat m$ alone, as in :func:`scale_by_muon`. A zero matrix stays zero (with
    ``eps`` > 0), and so does an output unit whose updates have all been zero.

    Args:
        ns_coeffs: the quintic's coefficients, as in
            :func:`scale_by_newton_schulz`: one triple ``(a, b, c)`` of finite
            real numbers for every iteration, a tuple of triples (one per
            iteration, at most 100; ``ns_steps`` is then ignored), or a
            preset's name, ``"standard"`` or ``"dion"``.
            Default: ``(3.4445, -4.7750, 2.0315)``.
        ns_steps: the number of iterations of one triple, an integer in
            [1, 100] (each is unrolled into the compiled step). Default: ``5``.
        beta: decay of the momentum, in [0, 1). Default: ``0.95``.
        beta2: decay of the output units' second moments, in [0, 1) (0:
            each unit's update of the step alone, at RMS ``rms``).
            Default: ``0.95``.
        eps: added to the norm that scales each matrix before the
            iteration, and to each unit's root second moment, >= 0.
            Default: ``1e-8``.
        rms: the RMS $\rho$ of each matrix's update, >= 0.
            Default: ``0.2``.
        nesterov: use Nesterov's look-ahead momentum. Default: ``True``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32 (``nu`` is at least float32). Default: ``None``.
        preconditioning: how each matrix is scaled before or in the first
            iteration, ``"frobenius"``, ``"spectral"``, ``"aol"`` or
            ``"schatten"`` (see :func:`scale_by_newton_schulz`); static, and
            it prints only when not ``"frobenius"``. Default: ``"frobenius"``.
        weight_dimension_numbers: which leaves are matrices and which of
            their axes, as in :func:`scale_by_newton_schulz`: a pytree of
            :class:`MuonDimensionNumbers` or None, or a function of the params
            returning one; None makes every leaf with two axes an
            ``(in, out)`` matrix. Default: ``None``.

    Returns:
        An update object with state ``ScaleByNorMuonState(mu, nu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_normuon(beta2=0.0)
        >>> w = jnp.array([[3.0, 0.0, 1.0], [0.0, 0.3, 1.0]])  # 2 inputs, 3 output units
        >>> u, state = opt.update({"w": w, "b": jnp.ones(3)}, opt.init({"w": w, "b": jnp.ones(3)}))
        >>> jnp.sqrt(jnp.mean(u["w"] ** 2, axis=0)).round(5)  # beta2 = 0: every unit's update at RMS 0.2
        Array([0.2, 0.2, 0.2], dtype=float32)
        >>> opt.get_state(state, "scale_by_normuon.nu")["w"].shape  # one number per output unit
        (1, 3)

    References:
        Li et al., "NorMuon: Making Muon more efficient and scalable",
        2025. https://arxiv.org/abs/2510.05491; Jordan et al., "Muon: An
        optimizer for hidden layers in neural networks", 2024.
        https://kellerjordan.github.io/posts/muon/
    """
    options = dict(ns_coeffs=ns_coeffs, ns_steps=ns_steps, beta=beta, beta2=beta2, eps=eps, rms=rms,
                   nesterov=nesterov, mu_dtype=mu_dtype, preconditioning=preconditioning,
                   weight_dimension_numbers=weight_dimension_numbers)
    return stateful(_init_scale_by_normuon, _apply_scale_by_normuon, name="scale_by_normuon", options=options,
                    domains=_domains(options), static=("ns_steps", "preconditioning", "weight_dimension_numbers"),
                    schedulable=("beta", "beta2", "eps", "rms"))


# --------------------------------------------------------------------------
# Muon's width transfer


def _shape_scale(g, axes, consistent_rms):
    if axes is None:
        return g
    fan_in, fan_out = fans(g, axes)
    if fan_in == 0 or g.size == 0:  # (a zero-size matrix has nothing to scale, and fan_in may be 0)
        return g
    if consistent_rms is not None:
        return scaled(g, max(fan_in, fan_out) ** 0.5 * consistent_rms)
    return scaled(g, max(1.0, fan_out / fan_in) ** 0.5)


def _apply_scale_by_shape(updates, params, *, weight_dimension_numbers=None, consistent_rms=None):
    leaves, treedef = jax.tree.flatten(updates)
    axes = leaf_axes("scale_by_shape", weight_dimension_numbers, updates, params)
    return treedef.unflatten([_shape_scale(g, a, consistent_rms) for g, a in zip(leaves, axes)])


@combinator
def scale_by_shape(weight_dimension_numbers: PyTree | Callable[[PyTree], PyTree] | None = None,
                   consistent_rms: ScalarOrSchedule | None = None) -> Update:
    r"""Scales each matrix update by Muon's width factor ``sqrt(max(1, fan_out / fan_in))``, or to an RMS.

    Update rule: $u \gets u \sqrt{\max(1, n / m)}$ for a 2-D leaf of shape
    $(m, n)$ (input dimension first); other leaves pass unchanged. With
    ``weight_dimension_numbers``, $m$ is the size of a leaf's reduction
    axes and $n$ of its output axes (one factor for the whole batch).

    With ``consistent_rms`` = $\rho$ the factor is Moonlight's instead (Liu et al.):

    $$
    u \gets \rho \sqrt{\max(m, n)}\, u
    $$

    An orthogonalised $m \times n$ matrix has $\min(m, n)$ singular values
    near 1, so a root mean square near $1 / \sqrt{\max(m, n)}$: scaled, every
    matrix's update has an RMS near $\rho$ whatever its shape (0.2 matches
    AdamW's, so AdamW's learning rate and weight decay carry over).

    Args:
        weight_dimension_numbers: which leaves are matrices and which of
            their axes, as in :func:`scale_by_newton_schulz`: a pytree of
            :class:`MuonDimensionNumbers` or None, or a function of the params
            returning one; None makes every leaf with two axes a matrix.
            Default: ``None``.
        consistent_rms: the RMS $\rho$ to scale each matrix update to,
            None or >= 0 (or a schedule); None takes the width factor.
            Default: ``None``.

    Returns:
        A stateless update object.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_shape()
        >>> opt.update({"w": jnp.ones((2, 8)), "b": jnp.ones(8)}, opt.init(None))[0]["w"][0, 0]
        Array(2., dtype=float32)
        >>> rms = ux.scale_by_shape(consistent_rms=0.2)
        >>> rms.update({"w": jnp.ones((2, 8)), "b": jnp.ones(8)}, rms.init(None))[0]["w"][0, 0]  # 0.2·√8
        Array(0.5657, dtype=float32)

    References:
        Jordan et al., "Muon: An optimizer for hidden layers in neural
        networks", 2024 (the shape factor of Muon's update), as applied by
        optax.contrib.muon; Liu et al., "Muon is Scalable for LLM
        Training", 2025. https://arxiv.org/abs/2502.16982
    """
    options = dict(weight_dimension_numbers=weight_dimension_numbers, consistent_rms=consistent_rms)
    return stateless(_apply_scale_by_shape, name="scale_by_shape", options=options, domains=_domains(options),
                     static=("weight_dimension_numbers",), schedulable=("consistent_rms",))
