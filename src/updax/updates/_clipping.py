"""Clipping and centring: bounds on the updates' values or on their global norm."""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree
from updax._combinators import combinator
from updax._domains import ANY_REAL, NON_NEGATIVE, POSITIVE, Valid, fail
from updax._primitives import stateless
from updax._typing import PyTree, ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import abs_sq, real_only, safe_sqrt, scaled


def _apply_clip(updates, params, *, delta):
    real_only("clip", updates)  # complex numbers have no order to clip by

    def leaf(g):
        c = _tree.compute_dtype(g.dtype)  # (the bound, a JAX scalar or a schedule's value, is cast explicitly)
        bound = jnp.asarray(delta).astype(c)
        return jnp.clip(g.astype(c), -bound, bound).astype(g.dtype)

    return jax.tree.map(leaf, updates)


@combinator
def clip(delta: ScalarOrSchedule = 2.0) -> Update:
    r"""Clips every element of the updates to ``[-delta, delta]``.

    Update rule, with $\delta$ = ``delta``: $u \gets \min(\max(u, -\delta), \delta)$.

    Args:
        delta: the bound, >= 0. Default: ``2.0``.

    Returns:
        A stateless update object.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.clip(delta=1.0)
        >>> opt.update({"w": jnp.array([-3.0, 0.5, 2.0])}, opt.init(None))[0]["w"]
        Array([-1. ,  0.5,  1. ], dtype=float32)

    References:
        Axon.Updates.clip.
    """
    return stateless(_apply_clip, elementwise=True, name="clip", options=dict(delta=delta),
                     domains=dict(delta=NON_NEGATIVE), schedulable=("delta",))


def global_norm(updates: PyTree) -> jax.Array:
    """The L2 norm of all leaves together, computed in at least float32; real for complex leaves (from $|g|^2$).

    The leaves are arrays or numbers (None leaves are empty subtrees); any
    other leaf is a TypeError naming its path, e.g.
    ``global_norm: tree['a'] is 'x', not an array or a number``.
    """
    squares = [jnp.sum(abs_sq(_tree.cast(g, _tree.compute_dtype(g.dtype)))) for g in _numeric_leaves(updates)]
    return safe_sqrt(sum(squares, jnp.zeros([], jnp.float32)))  # (a finite gradient at a zero update)


def _numeric_leaves(tree):
    """The leaves of :func:`global_norm`'s tree as JAX arrays of numbers (a Python number or a NumPy array
    converted), or a TypeError naming the first leaf that is not one."""
    leaves = []
    for path, g in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if isinstance(g, numbers.Number) and not isinstance(g, bool):
            g = jnp.asarray(g)
        elif not isinstance(g, (jax.Array, np.ndarray, np.generic)):
            raise TypeError(f"global_norm: tree{jax.tree_util.keystr(path)} is {g!r}, not an array or a number")
        if g.dtype == np.bool_ or not jnp.issubdtype(g.dtype, jnp.number):
            raise TypeError(f"global_norm: tree{jax.tree_util.keystr(path)} is an array of {g.dtype}, not of "
                            "numbers")
        leaves.append(g if isinstance(g, jax.Array) else jnp.asarray(g))
    return leaves


def _apply_clip_by_global_norm(updates, params, *, max_norm):
    norm = global_norm(updates)
    # One scalar factor, so the rescaling is a cheap multiply that XLA fuses into whatever
    # consumes the updates next instead of materialising a clipped copy of them.
    factor = jnp.where(norm < max_norm, 1.0, max_norm / jnp.where(norm < max_norm, 1.0, norm))

    def leaf(g):
        return scaled(g, factor)

    return jax.tree.map(leaf, updates)


@combinator
def clip_by_global_norm(max_norm: ScalarOrSchedule = 1.0) -> Update:
    r"""Rescales the updates so that their global L2 norm is at most ``max_norm``.

    Update rule, with $c$ = ``max_norm``: $u \gets u$ if $\lVert u \rVert < c$, else
    $u \gets u / \lVert u \rVert \cdot c$, where $\lVert u \rVert$ is the norm of all leaves together.

    Args:
        max_norm: the largest norm let through, > 0. Default: ``1.0``.

    Returns:
        A stateless update object.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.clip_by_global_norm(max_norm=1.0)
        >>> opt.update({"a": jnp.array([3.0]), "b": jnp.array([4.0])}, opt.init(None))[0]
        {'a': Array([0.6], dtype=float32), 'b': Array([0.8], dtype=float32)}

    References:
        Pascanu et al., "On the difficulty of training recurrent neural
        networks", ICML 2013. https://arxiv.org/abs/1211.5063
    """
    return stateless(_apply_clip_by_global_norm, elementwise=True, name="clip_by_global_norm",
                     options=dict(max_norm=max_norm), domains=dict(max_norm=POSITIVE), schedulable=("max_norm",))


def _centralize_leaf(g):
    g = jnp.asarray(g)
    if g.ndim <= 1:
        return g
    c = _tree.compute_dtype(g.dtype)
    g32 = g.astype(c)
    return (g32 - jnp.mean(g32, axis=tuple(range(1, g.ndim)), keepdims=True)).astype(g.dtype)


def _apply_centralize(updates, params):
    return jax.tree.map(_centralize_leaf, updates)


@combinator
def centralize() -> Update:
    r"""Subtracts from each leaf of rank >= 2 its mean over all axes but the first.

    Update rule, for a leaf with $n > 1$ axes (``ndim``): $u \gets u - \operatorname{mean}_{1, \dots, n-1}(u)$,
    the mean over all axes but axis 0 (broadcast along it); vectors and scalars pass unchanged.

    Returns:
        A stateless update object.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.centralize()
        >>> opt.update({"w": jnp.array([[1.0, 3.0], [0.0, 0.0]])}, opt.init(None))[0]["w"]
        Array([[-1.,  1.],
               [ 0.,  0.]], dtype=float32)

    References:
        Yong et al., "Gradient Centralization: A New Optimization Technique for
        Deep Neural Networks", ECCV 2020. https://arxiv.org/abs/2004.01461
    """
    return stateless(_apply_centralize, name="centralize")


def _unit_axes(call, where, x, axis):
    """The axes each unit's norm sums over in leaf ``x``: None for the whole leaf (scalars and vectors)."""
    if axis is not None and x.ndim >= 2:
        if any(not -x.ndim <= a < x.ndim for a in axis):
            raise ValueError(f"{call}(axis={axis!r}): {where} has shape {x.shape}, which has no axis "
                             f"{next(a for a in axis if not -x.ndim <= a < x.ndim)}")
        return tuple(sorted({a % x.ndim for a in axis}))
    if axis is not None or sum(n != 1 for n in x.shape) <= 1:
        return None
    defaults = {2: (0,), 3: (0,), 4: (0, 1, 2), 5: (0, 1, 2, 3)}
    if x.ndim not in defaults:
        raise ValueError(f"{call}: {where} has shape {x.shape}; the units of a leaf of rank {x.ndim} are not "
                         "known: give axis=, the axes a unit's norm sums over")
    return defaults[x.ndim]


def _apply_adaptive_grad_clip(updates, params, *, clipping, eps, axis):
    call = "adaptive_grad_clip"

    def leaf(where, g, p):
        axes = _unit_axes(call, f"params{jax.tree_util.keystr(where)}", p, axis)
        c = _tree.compute_dtype(g.dtype, p.dtype)
        g_norm = safe_sqrt(jnp.sum(abs_sq(g.astype(c)), axis=axes, keepdims=True))
        p_norm = safe_sqrt(jnp.sum(abs_sq(p.astype(c)), axis=axes, keepdims=True))
        bound = clipping * jnp.maximum(p_norm, eps)
        within = g_norm < bound
        # Double where: the branch not taken divides by 1 (a zero norm is within any bound but 0, where 0·g = g).
        factor = jnp.where(within, 1.0, bound / jnp.where(within | (g_norm == 0), 1.0, g_norm))
        return (factor.astype(c) * g.astype(c)).astype(g.dtype)

    _tree.check_same_structure(call, updates, params, "updates", "params")
    return jax.tree_util.tree_map_with_path(leaf, updates, params)


def _axes(call, name, axis):
    """None, an int, or a non-empty sequence of distinct ints (kept as a tuple)."""
    axes = (axis,) if isinstance(axis, int) else axis
    if axis is None:
        return None
    if (not isinstance(axes, (tuple, list)) or not axes or len(set(axes)) != len(axes)
            or any(isinstance(a, bool) or not isinstance(a, int) for a in axes)):
        fail(call, name, axis, _AXIS.text, TypeError)
    return tuple(axes)


_AXIS = Valid(rule=_axes, text="must be None, an int or a non-empty tuple of distinct ints")


@combinator
def adaptive_grad_clip(clipping: ScalarOrSchedule, eps: ScalarOrSchedule = 1e-3,
                       axis: int | tuple[int, ...] | None = None) -> Update:
    r"""Clips each unit's update to at most ``clipping`` times its parameters' norm (AGC).

    Update rule, per unit $i$ (a slice of a leaf: one output unit's weights), with $\lambda$ = ``clipping``,
    $\epsilon$ = ``eps``:

    $$
    u_i \gets \begin{cases}
    u_i \cdot \lambda \max(\lVert p_i \rVert, \epsilon) / \lVert u_i \rVert
    & \text{if } \lVert u_i \rVert \ge \lambda \max(\lVert p_i \rVert, \epsilon) \\
    u_i & \text{otherwise}
    \end{cases}
    $$

    With ``axis`` None a unit is, as in the paper's code and optax: the
    whole leaf for scalars and vectors (leaves with at most one axis longer
    than 1), a column for matrices and rank-3 leaves (the norm sums over
    axis 0, the fan-in of an ``(in, out)`` kernel), the last axis' slices for
    rank-4 and rank-5 convolution kernels (HWIO, DHWIO). Unlike optax, a
    zero norm is divided by exactly (optax divides by at least 1e-6, which
    clips an update with a norm below 1e-6 too hard).

    Args:
        clipping: the largest ratio of a unit's update norm to its parameter
            norm, >= 0 (the paper uses 0.01 to 0.16, smaller for larger
            batches). No default.
        eps: the smallest parameter norm used, so that zero-initialised
            units can move, >= 0. Default: ``0.001``.
        axis: the axes a unit's norm sums over in leaves of rank >= 2 (an
            int or a tuple of ints, negative counting from the end); scalars
            and vectors are one unit each. None infers them from the rank as
            above. Default: ``None``.

    Returns:
        A stateless update object; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.adaptive_grad_clip(clipping=0.1)
        >>> params = {"w": jnp.array([[3.0, 1.0], [4.0, 0.0]])}  # column norms 5 and 1
        >>> grads = {"w": jnp.array([[0.0, 0.3], [1.0, 0.4]])}   # column norms 1 and 0.5
        >>> opt.update(grads, opt.init(params), params)[0]["w"]   # to 0.5 and 0.1
        Array([[0.        , 0.06      ],
               [0.5       , 0.08000001]], dtype=float32)

    References:
        Brock et al., "High-Performance Large-Scale Image Recognition Without
        Normalization", ICML 2021. https://arxiv.org/abs/2102.06171
    """
    return stateless(_apply_adaptive_grad_clip, name="adaptive_grad_clip",
                     options=dict(clipping=clipping, eps=eps, axis=axis),
                     domains=dict(clipping=NON_NEGATIVE, eps=NON_NEGATIVE, axis=_AXIS), needs_params=True,
                     static=("axis",), schedulable=("clipping", "eps"))


def unitwise_clip(g_norm: jax.typing.ArrayLike, max_norm: jax.typing.ArrayLike, grad: jax.typing.ArrayLike,
                  div_eps: jax.typing.ArrayLike = 1e-6) -> jax.Array:
    r"""Clips ``grad`` unit by unit, given each unit's norm: the building block of :func:`adaptive_grad_clip`.

    With $n$ = ``g_norm``, $c$ = ``max_norm`` and $\epsilon$ = ``div_eps``, element by element:

    $$
    g \gets \begin{cases} g & \text{if } n < c \\ g \, c / \max(n, \epsilon) & \text{otherwise} \end{cases}
    $$

    ``g_norm`` and ``max_norm`` hold each unit's norm and bound broadcast
    over the unit (e.g. ``jnp.linalg.norm(g, axis=0, keepdims=True)``);
    they broadcast to ``grad``'s shape. Arithmetic runs in at least float32;
    the result has ``grad``'s dtype. A unit at norm 0 with a bound of 0 is
    zeroed.

    Args:
        g_norm: the units' norms, >= 0, broadcasting to ``grad``. No default.
        max_norm: the units' bounds, >= 0, broadcasting to ``grad``.
            No default.
        grad: the real or complex array to clip. No default.
        div_eps: the smallest norm divided by, > 0. Default: ``1e-06``.

    Returns:
        ``grad`` with each unit above its bound scaled down to it.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> g = jnp.array([[6.0, 0.5], [8.0, 0.0]])  # columns of norm 10 and 0.5
        >>> norms = jnp.linalg.norm(g, axis=0, keepdims=True)
        >>> ux.unitwise_clip(norms, 5.0, g)  # the first scaled to norm 5
        Array([[3. , 0.5],
               [4. , 0. ]], dtype=float32)

    References:
        Brock et al., "High-Performance Large-Scale Image Recognition Without
        Normalization", ICML 2021. https://arxiv.org/abs/2102.06171;
        optax.transforms.unitwise_clip (same rule and arguments).
    """
    call = "unitwise_clip"
    div_eps = POSITIVE.check(call, "div_eps", div_eps)
    grad = _tree.as_arrays(call, grad, "grad", floating=True)
    c = _tree.compute_dtype(grad.dtype)
    real = jnp.finfo(c).dtype
    norm, bound = (_unit_values(call, name, value, grad.shape).astype(real)
                   for name, value in (("g_norm", g_norm), ("max_norm", max_norm)))
    within = norm < bound
    factor = jnp.where(within, 1.0, bound / jnp.maximum(norm, jnp.asarray(div_eps).astype(real)))
    return (factor.astype(c) * grad.astype(c)).astype(grad.dtype)


def _unit_values(call, name, value, shape):
    """A real array broadcasting to ``shape``, or an error naming the argument."""
    value = _tree.as_arrays(call, value, name)
    if value.dtype == np.bool_ or not jnp.issubdtype(value.dtype, jnp.number) or jnp.iscomplexobj(value):
        raise TypeError(f"{call}: {name} has dtype {value.dtype}; it must be real")
    try:
        fits = np.broadcast_shapes(value.shape, shape) == tuple(shape)
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"{call}: {name} has shape {value.shape}, which does not broadcast to grad's shape {shape}")
    return value


def _apply_normalize_by_update_norm(updates, params, *, scale_factor, eps):
    norm = global_norm(updates)
    factor = scale_factor / (norm + eps)
    return jax.tree.map(lambda g: scaled(g, factor), updates)


@combinator
def normalize_by_update_norm(scale_factor: ScalarOrSchedule = 1.0, eps: ScalarOrSchedule = 1e-6) -> Update:
    r"""Divides the updates by their global L2 norm (normalised gradient descent).

    Update rule, with $s$ = ``scale_factor``, $\epsilon$ = ``eps`` and
    $\lVert u \rVert$ the norm of all leaves together:

    $$
    u \gets s \, \frac{u}{\lVert u \rVert + \epsilon}
    $$

    Args:
        scale_factor: $s$, the step's length (negative: a descent step),
            any real number. Default: ``1.0``.
        eps: added to the norm, so that a zero update stays zero, >= 0.
            Default: ``1e-06``.

    Returns:
        A stateless update object.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.normalize_by_update_norm(scale_factor=-1.0, eps=0.0)
        >>> opt.update({"a": jnp.array([3.0]), "b": jnp.array([4.0])}, opt.init(None))[0]
        {'a': Array([-0.6], dtype=float32), 'b': Array([-0.8], dtype=float32)}

    References:
        Nesterov, "Introductory Lectures on Convex Optimization", 2004,
        section 3.2.3 (normalised gradient); optax.normalize_by_update_norm
        (same rule and options).
    """
    return stateless(_apply_normalize_by_update_norm, elementwise=True, name="normalize_by_update_norm",
                     options=dict(scale_factor=scale_factor, eps=eps),
                     domains=dict(scale_factor=ANY_REAL, eps=NON_NEGATIVE), schedulable=("scale_factor", "eps"))
