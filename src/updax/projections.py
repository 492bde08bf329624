r"""Euclidean projections onto convex sets: the closest point of the set to a pytree, as plain functions.

Each function treats the whole pytree $x$ as one vector (the concatenation of
its leaves) and returns $\operatorname*{argmin}_{p \in C} \lVert x - p \rVert_2$ with the structure,
shapes and dtypes of ``x``; None leaves stay None. Use them for projected
gradient descent after ``apply_updates``::

    params = ux.projections.projection_simplex(ux.apply_updates(params, updates))

Leaves must be real floating-point arrays (Python numbers become arrays of
the default float dtype). Arithmetic runs in at least float32 and each
result is stored in its leaf's dtype. Every function works under
``jax.jit``; the numeric options (``scale``, ``lower``, ``upper``) may be
traced values, and are checked only when they are concrete.

>>> import jax.numpy as jnp
>>> import updax as ux
>>> ux.projections.projection_simplex({"a": jnp.array([2.0, 0.0]), "b": jnp.array(1.0)})
{'a': Array([1., 0.], dtype=float32), 'b': Array(0., dtype=float32)}
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree
from updax import _validate as check
from updax._typing import ArrayLike, PyTree

__all__ = [
    "projection_box",
    "projection_halfspace",
    "projection_hypercube",
    "projection_hyperplane",
    "projection_l1_ball",
    "projection_l1_sphere",
    "projection_l2_ball",
    "projection_l2_sphere",
    "projection_linf_ball",
    "projection_non_negative",
    "projection_simplex",
    "projection_vector",
]


# --------------------------------------------------------------------------
# Leaves and bounds


def _flatten(call: str, tree: Any) -> tuple[list[jax.Array], list[str], Any]:
    """The leaves of ``tree`` as real floating arrays, their paths, and the tree's structure."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    leaves, paths = [], []
    for path, x in flat:
        where = f"tree{jax.tree_util.keystr(path)}"
        if isinstance(x, numbers.Real) and not isinstance(x, bool):
            x = jnp.asarray(x, dtype=jax.dtypes.canonicalize_dtype(jnp.float64))
        elif not isinstance(x, jax.Array):
            try:
                x = jnp.asarray(x)
            except TypeError:
                raise TypeError(f"{call}: {where} is {x!r}, not an array or a number") from None
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{call}: {where} has dtype {x.dtype}; projections take real floating-point leaves "
                            "(cast it, e.g. with .astype(jnp.float32))")
        leaves.append(x)
        paths.append(jax.tree_util.keystr(path))
    return leaves, paths, treedef


def _is_concrete(x: Any) -> bool:
    return not isinstance(x, jax.core.Tracer)


def _bounds(call: str, name: str, bound: Any, tree: Any, leaves: list[jax.Array], paths: list[str]) -> list[Any]:
    """``bound`` as one value per leaf: a real scalar, or a tree shaped like ``tree`` whose leaves broadcast to its
    leaves' shapes. Concrete values must not be NaN (infinities are fine: a one-sided box)."""
    scalar = _tree.is_scalar(bound) or isinstance(bound, (bool, complex))
    if scalar:
        values, where, targets = [bound], [name], [()]
    else:
        _tree.check_same_structure(call, tree, bound, "tree", name)
        values = jax.tree.leaves(bound)
        where, targets = [f"{name}{path}" for path in paths], [x.shape for x in leaves]
    for value, at, target in zip(values, where, targets):
        real = isinstance(value, (numbers.Real, jax.Array, np.ndarray, np.generic)) and not isinstance(value, bool)
        if not real or not (jnp.issubdtype(jnp.result_type(value), jnp.floating)
                            or jnp.issubdtype(jnp.result_type(value), jnp.integer)):
            raise TypeError(f"{call}: {at} is {value!r}; a bound must be a real number or array")
        try:
            fits = np.broadcast_shapes(jnp.shape(value), target) == target
        except ValueError:
            fits = False
        if not fits:
            raise ValueError(f"{call}: {at} has shape {jnp.shape(value)}, which does not broadcast to the shape "
                             f"{target} of the leaf it bounds")
        if _is_concrete(value) and np.any(np.isnan(np.asarray(value, np.float64))):
            raise ValueError(f"{call}: {at} must not be NaN, got {value!r}")
    return values * len(leaves) if scalar else values


def _box(call: str, tree: Any, lower: tuple[str, Any], upper: tuple[str, Any]) -> PyTree:
    leaves, paths, treedef = _flatten(call, tree)
    lows = _bounds(call, lower[0], lower[1], tree, leaves, paths)
    highs = _bounds(call, upper[0], upper[1], tree, leaves, paths)
    for lo, hi, path in zip(lows, highs, paths):
        if _is_concrete(lo) and _is_concrete(hi) and np.any(np.asarray(lo, np.float64) > np.asarray(hi, np.float64)):
            at = "" if _tree.is_scalar(lower[1]) and _tree.is_scalar(upper[1]) else f" (at tree{path})"
            raise ValueError(f"{call}: {lower[0]} must be <= {upper[0]}{at}; the box is empty")
    return treedef.unflatten([_clip(x, lo, hi) for x, lo, hi in zip(leaves, lows, highs)])


def _clip(x: jax.Array, lower: Any, upper: Any) -> jax.Array:
    """``x`` clipped to ``[lower, upper]``, a bound not exact in ``x``'s dtype rounded into the box."""
    c = _tree.compute_dtype(x.dtype)
    lo, hi = jnp.asarray(lower).astype(c), jnp.asarray(upper).astype(c)
    y = jnp.clip(x.astype(c), lo, hi).astype(x.dtype)
    if x.dtype != c:  # rounding a bound to a narrower dtype may step outside the box: step back in
        y = jnp.where(y.astype(c) > hi, jnp.nextafter(y, jnp.asarray(-jnp.inf, x.dtype)), y)
        y = jnp.where(y.astype(c) < lo, jnp.nextafter(y, jnp.asarray(jnp.inf, x.dtype)), y)
    return y


def _scale(call: str, scale: Any, *, positive: bool) -> Any:
    if positive:
        return check.number(call, "scale", scale, 0.0, lo_open=True)
    return check.number(call, "scale", scale, 0.0)


def _common(leaves: list[jax.Array]) -> Any:
    """The dtype the whole vector is computed in: the widest of the leaves', at least float32."""
    return _tree.compute_dtype(*(x.dtype for x in leaves))


def _simplex_threshold(v: jax.Array, z: jax.Array) -> jax.Array:
    """The θ with ``sum(max(v - θ, 0)) = z``, by sorting (Duchi et al. 2008, Figure 1).

    With ``μ`` the values sorted in decreasing order, ``ρ = max{j : μ_j - (Σ_{r<=j} μ_r - z) / j > 0}`` and
    ``θ = (Σ_{r<=ρ} μ_r - z) / ρ``. ``ρ >= 1`` always (``j = 1`` gives ``z > 0``; kept so under rounding).
    """
    mu = jnp.sort(v)[::-1]
    excess = jnp.cumsum(mu) - z
    j = jnp.arange(1, v.shape[0] + 1)
    rho = jnp.max(jnp.where(mu - excess / j.astype(v.dtype) > 0, j, 1))
    return excess[rho - 1] / rho.astype(v.dtype)


# --------------------------------------------------------------------------
# The projections


def projection_non_negative(tree: PyTree) -> PyTree:
    r"""Projects onto the non-negative orthant.

    Rule: $p = \max(x, 0)$, element by element.

    Args:
        tree: the point to project, a pytree of floating arrays. No default.

    Returns:
        The projection, shaped like ``tree``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> ux.projections.projection_non_negative({"w": jnp.array([-1.0, 2.0])})
        {'w': Array([0., 2.], dtype=float32)}

    References:
        optax.projections.projection_non_negative.
    """
    leaves, _, treedef = _flatten("projection_non_negative", tree)
    return treedef.unflatten([jnp.maximum(x, jnp.zeros((), x.dtype)) for x in leaves])


def projection_box(tree: PyTree, lower: ArrayLike | PyTree, upper: ArrayLike | PyTree) -> PyTree:
    r"""Projects onto the box $\text{lower} \le p \le \text{upper}$.

    Rule: $p = \min(\max(x, \text{lower}), \text{upper})$, element by element. A bound not
    exact in a leaf's dtype is rounded into the box.

    Args:
        tree: the point to project, a pytree of floating arrays. No default.
        lower: the lower bound, a scalar (``-inf`` for none) or a pytree
            shaped like ``tree`` whose leaves broadcast to its leaves'
            shapes; <= ``upper``. No default.
        upper: the upper bound, a scalar (``inf`` for none) or a pytree
            like ``lower``. No default.

    Returns:
        The projection, shaped like ``tree``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> ux.projections.projection_box({"w": jnp.array([-2.0, 0.5, 3.0])}, -1.0, 1.0)
        {'w': Array([-1. ,  0.5,  1. ], dtype=float32)}

    References:
        optax.projections.projection_box.
    """
    return _box("projection_box", tree, ("lower", lower), ("upper", upper))


def projection_hypercube(tree: PyTree, scale: ArrayLike | PyTree = 1.0) -> PyTree:
    r"""Projects onto the hypercube $0 \le p \le \text{scale}$.

    Rule: $p = \min(\max(x, 0), \text{scale})$, element by element.

    Args:
        tree: the point to project, a pytree of floating arrays. No default.
        scale: the side of the cube, >= 0: a scalar or a pytree shaped like
            ``tree``. Default: ``1.0``.

    Returns:
        The projection, shaped like ``tree``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> ux.projections.projection_hypercube({"w": jnp.array([-2.0, 0.5, 3.0])})
        {'w': Array([0. , 0.5, 1. ], dtype=float32)}

    References:
        optax.projections.projection_hypercube.
    """
    if _tree.is_scalar(scale):
        scale = _scale("projection_hypercube", scale, positive=False)
    return _box("projection_hypercube", tree, ("0", 0.0), ("scale", scale))


def projection_simplex(tree: PyTree, scale: ArrayLike = 1.0) -> PyTree:
    r"""Projects onto the simplex $\{p \ge 0, \sum p = \text{scale}\}$, all leaves together.

    Rule (Duchi et al., Figure 1): sort the elements of $x$ in decreasing order,
    $\mu_1 \ge \mu_2 \ge \dots$; with

    $$
    \rho = \max \{ j : \mu_j - \tfrac{1}{j} (\mu_1 + \dots + \mu_j - \text{scale}) > 0 \}, \qquad
    \theta = \tfrac{1}{\rho} (\mu_1 + \dots + \mu_\rho - \text{scale}),
    $$

    $p = \max(x - \theta, 0)$. The sort
    makes it $O(n \log n)$ in the total number of elements $n$, and it
    holds a float32 (or wider) copy of them all. A point of the simplex is
    returned as it is, up to rounding.

    Args:
        tree: the point to project, a pytree of floating arrays with at least
            one element. No default.
        scale: the sum of the projection, > 0. Default: ``1.0``.

    Returns:
        The projection, shaped like ``tree``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> ux.projections.projection_simplex({"a": jnp.array([0.5, 1.5]), "b": jnp.array(-1.0)})
        {'a': Array([0., 1.], dtype=float32), 'b': Array(0., dtype=float32)}

    References:
        Duchi, Shalev-Shwartz, Singer & Chandra, "Efficient projections onto
        the l1-ball for learning in high dimensions", ICML 2008, Figure 1.
        https://doi.org/10.1145/1390156.1390191; optax.projections.projection_simplex.
    """
    call = "projection_simplex"
    scale = _scale(call, scale, positive=True)
    leaves, _, treedef = _flatten(call, tree)
    if sum(x.size for x in leaves) == 0:
        raise ValueError(f"{call}: the tree has no elements, and the simplex in zero dimensions is empty")
    c = _common(leaves)
    theta = _simplex_threshold(jnp.concatenate([x.astype(c).ravel() for x in leaves]), jnp.asarray(scale).astype(c))
    return treedef.unflatten([jnp.maximum(x.astype(c) - theta, 0).astype(x.dtype) for x in leaves])


def projection_l1_ball(tree: PyTree, scale: ArrayLike = 1.0) -> PyTree:
    r"""Projects onto the L1 ball $\{\lVert p \rVert_1 \le \text{scale}\}$, all leaves together.

    Rule: $p = x$ if $\lVert x \rVert_1 \le \text{scale}$; else
    $p = \operatorname{sign}(x) \max(\lvert x \rvert - \theta, 0)$ with $\theta$ the simplex threshold
    of $\lvert x \rvert$ (see :func:`projection_simplex`), so that $\lVert p \rVert_1 = \text{scale}$.

    Args:
        tree: the point to project, a pytree of floating arrays. No default.
        scale: the radius, > 0. Default: ``1.0``.

    Returns:
        The projection, shaped like ``tree``; ``tree`` itself (values
        unchanged) when it is inside the ball.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> ux.projections.projection_l1_ball({"w": jnp.array([2.0, -1.0])})
        {'w': Array([1., 0.], dtype=float32)}

    References:
        Duchi, Shalev-Shwartz, Singer & Chandra, "Efficient projections onto
        the l1-ball for learning in high dimensions", ICML 2008 (the L1 ball
        reduced to the simplex of $\lvert x \rvert$, and Figure 1).
        https://doi.org/10.1145/1390156.1390191; optax.projections.projection_l1_ball.
    """
    call = "projection_l1_ball"
    scale = _scale(call, scale, positive=True)
    leaves, _, treedef = _flatten(call, tree)
    if sum(x.size for x in leaves) == 0:
        return treedef.unflatten(leaves)
    c = _common(leaves)
    magnitudes = jnp.concatenate([jnp.abs(x.astype(c)).ravel() for x in leaves])
    z = jnp.asarray(scale).astype(c)
    theta = _simplex_threshold(magnitudes, z)
    inside = jnp.sum(magnitudes) <= z

    def project(x):
        x_c = x.astype(c)
        p = jnp.where(jnp.abs(x_c) > theta, jnp.sign(x_c) * (jnp.abs(x_c) - theta), 0)
        return jnp.where(inside, x, p.astype(x.dtype))

    return treedef.unflatten([project(x) for x in leaves])


def projection_l2_ball(tree: PyTree, scale: ArrayLike = 1.0) -> PyTree:
    r"""Projects onto the L2 ball $\{\lVert p \rVert_2 \le \text{scale}\}$, all leaves together.

    Rule: $p = x \cdot \text{scale} / \lVert x \rVert_2$ if $\lVert x \rVert_2 > \text{scale}$, else $p = x$.

    Args:
        tree: the point to project, a pytree of floating arrays. No default.
        scale: the radius, >= 0. Default: ``1.0``.

    Returns:
        The projection, shaped like ``tree``; ``tree`` itself (values
        unchanged) when it is inside the ball.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> ux.projections.projection_l2_ball({"a": jnp.array([3.0]), "b": jnp.array([4.0])}, scale=1.0)
        {'a': Array([0.6], dtype=float32), 'b': Array([0.8], dtype=float32)}

    References:
        optax.projections.projection_l2_ball.
    """
    call = "projection_l2_ball"
    scale = _scale(call, scale, positive=False)
    leaves, _, treedef = _flatten(call, tree)
    if not leaves:
        return treedef.unflatten(leaves)
    c = _common(leaves)
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(c))) for x in leaves))
    radius = jnp.asarray(scale).astype(c)
    outside = norm > radius
    factor = radius / jnp.where(outside, norm, 1)

    def project(x):
        return jnp.where(outside, (factor * x.astype(c)).astype(x.dtype), x)

    return treedef.unflatten([project(x) for x in leaves])


def projection_linf_ball(tree: PyTree, scale: ArrayLike = 1.0) -> PyTree:
    r"""Projects onto the L-infinity ball $\{\max \lvert p \rvert \le \text{scale}\}$.

    Rule: $p = \min(\max(x, -\text{scale}), \text{scale})$, element by element.

    Args:
        tree: the point to project, a pytree of floating arrays. No default.
        scale: the radius, >= 0. Default: ``1.0``.

    Returns:
        The projection, shaped like ``tree``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> ux.projections.projection_linf_ball({"w": jnp.array([-2.0, 0.5, 3.0])})
        {'w': Array([-1. ,  0.5,  1. ], dtype=float32)}

    References:
        optax.projections.projection_linf_ball.
    """
    call = "projection_linf_ball"
    scale = _scale(call, scale, positive=False)
    return _box(call, tree, ("-scale", -scale), ("scale", scale))


# --------------------------------------------------------------------------
# Spheres, and the sets a vector defines


def _paired(call: str, x: Any, a: Any) -> tuple[list[jax.Array], list[jax.Array], Any, Any]:
    """The leaves of ``x`` and ``a`` (same structure and shapes), their structure, and the dtype both are computed
    in."""
    leaves, paths, treedef = _flatten(call, x)
    _tree.check_same_structure(call, x, a, "x", "a")
    directions, _, _ = _flatten(call, a)
    for path, p, q in zip(paths, leaves, directions):
        if p.shape != q.shape:
            raise ValueError(f"{call}: a{path} has shape {q.shape}, x{path} {p.shape}; a must be shaped like x")
    return leaves, directions, treedef, _common(leaves + directions)


def _dot(xs: list[jax.Array], ys: list[jax.Array], c: Any) -> jax.Array:
    return sum((jnp.sum(x.astype(c) * y.astype(c)) for x, y in zip(xs, ys)), jnp.zeros([], c))


def _offset(call: str, b: Any) -> Any:
    return check.number(call, "b", b)


def _along(leaves: list[jax.Array], directions: list[jax.Array], step: jax.Array, c: Any) -> list[jax.Array]:
    """``x - step·a``, leaf by leaf, in each leaf of ``x``'s dtype."""
    return [(x.astype(c) - step * a.astype(c)).astype(x.dtype) for x, a in zip(leaves, directions)]


def projection_hyperplane(x: PyTree, a: PyTree, b: ArrayLike) -> PyTree:
    r"""Projects onto the hyperplane $\{p : \langle a, p \rangle = b\}$, all leaves together.

    Rule: $p = x - \dfrac{\langle a, x \rangle - b}{\langle a, a \rangle}\, a$.

    With $a = 0$ the set is all of space when $b = 0$ ($p = x$) and empty
    otherwise: refused when ``a`` and ``b`` are concrete, NaN under
    ``jax.jit``.

    Args:
        x: the point to project, a pytree of floating arrays. No default.
        a: the normal, a pytree shaped like ``x``. No default.
        b: the offset, a real scalar. No default.

    Returns:
        The projection, shaped like ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> ux.projections.projection_hyperplane({"w": jnp.array([3.0, 1.0])}, {"w": jnp.array([1.0, 1.0])}, 2.0)
        {'w': Array([2., 0.], dtype=float32)}

    References:
        Boyd & Vandenberghe, "Convex Optimization", 2004, section 8.1.1;
        optax.projections.projection_hyperplane.
    """
    call = "projection_hyperplane"
    b = _offset(call, b)
    leaves, directions, treedef, c = _paired(call, x, a)
    norm_sq = _dot(directions, directions, c)
    excess = _dot(directions, leaves, c) - jnp.asarray(b).astype(c)
    _whole_space(call, norm_sq, b, lambda b: b == 0)
    step = jnp.where(norm_sq > 0, excess / jnp.where(norm_sq > 0, norm_sq, 1), jnp.where(excess == 0, 0.0, jnp.nan))
    return treedef.unflatten(_along(leaves, directions, step.astype(c), c))


def _whole_space(call: str, norm_sq: jax.Array, b: Any, feasible: Callable[[float], bool]) -> None:
    """With ``a = 0`` the set is all of space or empty, by ``b``: refused where it is empty and both are known."""
    if _is_concrete(norm_sq) and _is_concrete(b) and float(norm_sq) == 0 and not feasible(float(b)):
        raise ValueError(f"{call}: a is zero and b is {float(b)!r}, so the set is empty")


def projection_halfspace(x: PyTree, a: PyTree, b: ArrayLike) -> PyTree:
    r"""Projects onto the half-space $\{p : \langle a, p \rangle \le b\}$, all leaves together.

    Rule: $p = x - \dfrac{\max(\langle a, x \rangle - b, 0)}{\langle a, a \rangle}\, a$;
    a point of the half-space is returned as it is.

    With $a = 0$ the set is all of space when $b \ge 0$ ($p = x$) and empty
    otherwise: refused when ``a`` and ``b`` are concrete, NaN under
    ``jax.jit``.

    Args:
        x: the point to project, a pytree of floating arrays. No default.
        a: the normal, a pytree shaped like ``x``. No default.
        b: the offset, a real scalar. No default.

    Returns:
        The projection, shaped like ``x``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> a = {"w": jnp.array([1.0, 1.0])}
        >>> ux.projections.projection_halfspace({"w": jnp.array([3.0, 1.0])}, a, 2.0)
        {'w': Array([2., 0.], dtype=float32)}
        >>> ux.projections.projection_halfspace({"w": jnp.array([0.5, 1.0])}, a, 2.0)  # inside
        {'w': Array([0.5, 1. ], dtype=float32)}

    References:
        Boyd & Vandenberghe, "Convex Optimization", 2004, section 8.1.1;
        optax.projections.projection_halfspace.
    """
    call = "projection_halfspace"
    b = _offset(call, b)
    leaves, directions, treedef, c = _paired(call, x, a)
    norm_sq = _dot(directions, directions, c)
    excess = jnp.maximum(_dot(directions, leaves, c) - jnp.asarray(b).astype(c), 0)
    _whole_space(call, norm_sq, b, lambda b: b >= 0)
    step = jnp.where(norm_sq > 0, excess / jnp.where(norm_sq > 0, norm_sq, 1), jnp.where(excess == 0, 0.0, jnp.nan))
    return treedef.unflatten(_along(leaves, directions, step.astype(c), c))


def projection_vector(x: PyTree, a: PyTree) -> PyTree:
    r"""Projects onto the line spanned by $a$, all leaves together.

    Rule: $p = \dfrac{\langle x, a \rangle}{\langle a, a \rangle}\, a$; with
    $a = 0$ the line is the point 0, and $p = 0$.

    Args:
        x: the point to project, a pytree of floating arrays. No default.
        a: the direction, a pytree shaped like ``x``. No default.

    Returns:
        The projection, shaped like ``x`` (in its dtypes).

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> ux.projections.projection_vector({"w": jnp.array([3.0, 1.0])}, {"w": jnp.array([1.0, 1.0])})
        {'w': Array([2., 2.], dtype=float32)}

    References:
        optax.projections.projection_vector.
    """
    call = "projection_vector"
    leaves, directions, treedef, c = _paired(call, x, a)
    norm_sq = _dot(directions, directions, c)
    ratio = jnp.where(norm_sq > 0, _dot(leaves, directions, c) / jnp.where(norm_sq > 0, norm_sq, 1), 0)
    return treedef.unflatten([(ratio * d.astype(c)).astype(x.dtype) for x, d in zip(leaves, directions)])


def projection_l2_sphere(tree: PyTree, scale: ArrayLike = 1.0) -> PyTree:
    r"""Projects onto the L2 sphere $\{\lVert p \rVert_2 = \text{scale}\}$, all leaves together.

    Rule: $p = x \cdot \text{scale} / \lVert x \rVert_2$. Every point of the
    sphere is closest to $x = 0$; there it returns the one with all
    coordinates equal, $\text{scale} / \sqrt{n}$ ($n$ elements), where
    optax returns NaN.

    Args:
        tree: the point to project, a pytree of floating arrays. No default.
        scale: the radius, >= 0. Default: ``1.0``.

    Returns:
        The projection, shaped like ``tree``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> ux.projections.projection_l2_sphere({"a": jnp.array([0.3]), "b": jnp.array([0.4])}, scale=1.0)
        {'a': Array([0.6], dtype=float32), 'b': Array([0.8], dtype=float32)}

    References:
        optax.projections.projection_l2_sphere.
    """
    call = "projection_l2_sphere"
    scale = _scale(call, scale, positive=False)
    leaves, _, treedef = _flatten(call, tree)
    n = sum(x.size for x in leaves)
    if n == 0:
        return treedef.unflatten(leaves)
    c = _common(leaves)
    norm = jnp.sqrt(_dot(leaves, leaves, c))
    radius = jnp.asarray(scale).astype(c)
    factor = radius / jnp.where(norm > 0, norm, 1)
    centre = radius / jnp.sqrt(jnp.asarray(n, c))

    def project(x):
        return jnp.where(norm > 0, factor * x.astype(c), centre).astype(x.dtype)

    return treedef.unflatten([project(x) for x in leaves])


def projection_l1_sphere(tree: PyTree, scale: ArrayLike = 1.0) -> PyTree:
    r"""Projects onto the L1 sphere $\{\lVert p \rVert_1 = \text{scale}\}$, all leaves together.

    Rule: $p = \operatorname{sign}(x) \max(\lvert x \rvert - \theta, 0)$, with
    $\theta$ the simplex threshold of $\lvert x \rvert$ (see
    :func:`projection_simplex`): the projection of $\lvert x \rvert$ onto the
    simplex of sum ``scale``, given back $x$'s signs. Inside the ball
    $\theta < 0$ and the point moves outwards. An element at 0 has no sign
    and stays 0 (at $x = 0$ the result is 0, off the sphere, as in optax).

    Args:
        tree: the point to project, a pytree of floating arrays. No default.
        scale: the radius, > 0. Default: ``1.0``.

    Returns:
        The projection, shaped like ``tree``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> ux.projections.projection_l1_sphere({"w": jnp.array([0.1, -0.2])})  # |p| sums to 1
        {'w': Array([ 0.45, -0.55], dtype=float32)}

    References:
        Duchi, Shalev-Shwartz, Singer & Chandra, "Efficient projections onto
        the l1-ball for learning in high dimensions", ICML 2008, Figure 1.
        https://doi.org/10.1145/1390156.1390191; optax.projections.projection_l1_sphere.
    """
    call = "projection_l1_sphere"
    scale = _scale(call, scale, positive=True)
    leaves, _, treedef = _flatten(call, tree)
    if sum(x.size for x in leaves) == 0:
        return treedef.unflatten(leaves)
    c = _common(leaves)
    magnitudes = jnp.concatenate([jnp.abs(x.astype(c)).ravel() for x in leaves])
    theta = _simplex_threshold(magnitudes, jnp.asarray(scale).astype(c))
    return treedef.unflatten([(jnp.sign(x.astype(c)) * jnp.maximum(jnp.abs(x.astype(c)) - theta, 0)).astype(x.dtype)
                              for x in leaves])
