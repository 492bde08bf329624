"""L-BFGS: the limited-memory BFGS direction, by the two-loop recursion.

The stage keeps the last ``memory_size`` differences of params ``s`` and of
updates (gradients) ``y`` and multiplies the incoming update by the inverse
Hessian approximation they define (Nocedal & Wright, Algorithm 7.4). It is
meant to be followed by a line search (:func:`updax.scale_by_zoom_linesearch`,
as in :func:`updax.optimizers.lbfgs`), which picks the step along it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from updax import _tree
from updax._combinators import combinator
from updax._domains import Count, Flag, Integer
from updax._primitives import stateful
from updax._update import Update

__all__ = ["ScaleByLbfgsState", "scale_by_lbfgs"]


class ScaleByLbfgsState(NamedTuple):
    """Steps taken ``count``; the params and updates of the last call (``prev_params``, ``prev_updates``);
    the memory of param differences ``s_memory``, update differences ``y_memory`` (each leaf with a leading
    axis of ``memory_size``, a ring buffer) and their weights ``rho_memory = 1/<y, s>``."""

    count: Count
    prev_params: Any
    prev_updates: Any
    s_memory: Any
    y_memory: Any
    rho_memory: jax.Array


def real_dtype(tree) -> Any:
    """The dtype scalars about ``tree`` are computed in: the widest real part of its leaves, at least float32."""
    dtypes = [jnp.real(jnp.zeros([], jnp.result_type(x))).dtype for x in jax.tree.leaves(tree)]
    return _tree.compute_dtype(*dtypes)


def _inner(x, y) -> jax.Array:
    """``Σ conj(x)·y`` of two arrays of one shape: a contraction over every axis, not ``jnp.vdot``, whose ravel
    would move sharded data (and fails on an Explicit mesh); on one, the scalar is replicated."""
    mesh = getattr(getattr(jax.typeof(x), "sharding", None), "mesh", None)
    explicit = mesh is not None and not mesh.empty and mesh.are_all_axes_explicit
    out = NamedSharding(mesh, PartitionSpec()) if explicit else None
    x = jnp.conj(x) if jnp.iscomplexobj(x) else x
    return jnp.tensordot(x, y, x.ndim, precision=jax.lax.Precision.HIGHEST, out_sharding=out)


def tree_vdot(a, b, dtype) -> jax.Array:
    """``Re <a, b> = Re Σ conj(a)·b`` over every leaf, in ``dtype`` (each leaf in the wider of the two dtypes)."""
    total = jnp.zeros([], dtype)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        c = _tree.compute_dtype(x.dtype, y.dtype)
        total = total + _inner(x.astype(c), y.astype(c)).real.astype(dtype)
    return total


def _init_scale_by_lbfgs(params, *, memory_size):
    def memory(p):
        p = jnp.asarray(p)
        return _tree.full((memory_size,) + p.shape, 0.0, _tree.compute_dtype(p.dtype), p,
                          dims=(None, *range(p.ndim)))

    return ScaleByLbfgsState(count=_tree.zero_count(), prev_params=_tree.accumulators(params, None),
                             prev_updates=_tree.accumulators(params, None),
                             s_memory=jax.tree.map(memory, params), y_memory=jax.tree.map(memory, params),
                             rho_memory=jnp.zeros([memory_size], real_dtype(params)))


def _two_loop(q, s_memory, y_memory, rhos, gamma, newest_first):
    """``H·q`` for the L-BFGS inverse Hessian ``H`` with initial matrix ``gamma·I`` (Algorithm 7.4). Empty slots
    (``rho = 0``, ``s = y = 0``) change nothing."""
    dtype = rhos.dtype

    def pick(memory, i):
        return jax.tree.map(lambda m: m[i], memory)

    def backward(q, i):  # newest to oldest: alpha_i = rho_i <s_i, q>,  q <- q - alpha_i y_i
        alpha = rhos[i] * tree_vdot(pick(s_memory, i), q, dtype)
        return jax.tree.map(lambda x, y: x - (alpha.astype(y.dtype) * y).astype(x.dtype), q, pick(y_memory, i)), alpha

    def forward(r, i_alpha):  # oldest to newest: beta = rho_i <y_i, r>,  r <- r + (alpha_i - beta) s_i
        i, alpha = i_alpha
        beta = rhos[i] * tree_vdot(pick(y_memory, i), r, dtype)
        return jax.tree.map(lambda x, s: x + ((alpha - beta).astype(s.dtype) * s).astype(x.dtype), r,
                            pick(s_memory, i)), None

    q, alphas = jax.lax.scan(backward, q, newest_first)
    r = jax.tree.map(lambda x: gamma.astype(x.dtype) * x, q)
    r, _ = jax.lax.scan(forward, r, (newest_first[::-1], alphas[::-1]))
    return r


def _apply_scale_by_lbfgs(updates, state, params, *, memory_size, scale_init_precond):
    call = "scale_by_lbfgs"
    dtype = state.rho_memory.dtype
    compute = jax.tree.map(lambda u, m: u.astype(_tree.compute_dtype(u.dtype, m.dtype)), updates, state.prev_updates)
    started = state.count > 0

    # The newest pair, from the params and updates of this call and the last: s = w_k - w_{k-1}, y = u_k - u_{k-1}.
    s = _tree.tree_map(call, lambda p, prev: jnp.where(started, p.astype(prev.dtype) - prev, 0), params,
                       state.prev_params, names=("params", "state.prev_params"))
    y = _tree.tree_map(call, lambda u, prev: jnp.where(started, u - prev, 0), compute, state.prev_updates,
                       names=("updates", "state.prev_updates"))
    sy, yy = tree_vdot(y, s, dtype), tree_vdot(y, y, dtype)
    rho = jnp.where(sy == 0, 0.0, 1.0 / jnp.where(sy == 0, 1.0, sy)).astype(dtype)

    slot = (state.count - 1) % memory_size  # the newest pair's slot; this call's own slot is count % memory_size
    s_memory = jax.tree.map(lambda m, x: m.at[slot].set(x.astype(m.dtype)), state.s_memory, s)
    y_memory = jax.tree.map(lambda m, x: m.at[slot].set(x.astype(m.dtype)), state.y_memory, y)
    rho_memory = state.rho_memory.at[slot].set(jnp.where(started, rho, 0.0).astype(dtype))

    if scale_init_precond:  # gamma = <s, y>/<y, y>; on the first call min(1, 1/||u||): a first step of length <= 1
        fixed = jax.lax.stop_gradient(compute)  # a constant scale to differentiate through (finite at u = 0)
        first = jnp.minimum(1.0, 1.0 / jnp.sqrt(tree_vdot(fixed, fixed, dtype)))
        gamma = jnp.where(started, jnp.where(yy > 0, sy / jnp.where(yy > 0, yy, 1.0), 1.0), first)
    else:
        gamma = jnp.ones([], dtype)
    newest_first = (state.count - 1 - jnp.arange(memory_size)) % memory_size
    direction = _two_loop(compute, s_memory, y_memory, rho_memory, gamma.astype(dtype), newest_first)

    new_state = ScaleByLbfgsState(
        count=_tree.cyclic_increment(state.count, memory_size),
        prev_params=jax.tree.map(lambda p, prev: p.astype(prev.dtype), params, state.prev_params),
        prev_updates=jax.tree.map(lambda u, prev: u.astype(prev.dtype), updates, state.prev_updates),
        s_memory=s_memory, y_memory=y_memory, rho_memory=rho_memory)
    return jax.tree.map(lambda d, u: d.astype(u.dtype), direction, updates), new_state


#: The pairs kept: 3 to 20 is the usual range (Nocedal & Wright, section 7.2), optax's default 10.
_MEMORY_SIZE = Integer(1, 1000, why=" (the state holds 2·memory_size copies of the params, and each step runs two "
                                    "loops over them)")


@combinator
def scale_by_lbfgs(memory_size: int = 10, scale_init_precond: bool = True) -> Update:
    r"""Multiplies updates by the L-BFGS approximation of the inverse Hessian.

    Update rule (Nocedal & Wright, Algorithm 7.4), with $u_k$ the incoming
    update (a gradient), $w_k$ the params, $m$ = ``memory_size``, and the last
    $m$ pairs $s_i = w_{i+1} - w_i$, $y_i = u_{i+1} - u_i$,
    $\rho_i = 1 / \langle y_i, s_i \rangle$ (0 where $\langle y_i, s_i \rangle = 0$):

    $$
    \begin{align*}
    q &\gets u_k, \quad \text{then for } i = k-1, \dots, k-m: \quad \alpha_i = \rho_i \langle s_i, q \rangle,
        \quad q \gets q - \alpha_i\, y_i \\
    r &\gets \gamma_k\, q, \quad \text{then for } i = k-m, \dots, k-1: \quad \beta = \rho_i \langle y_i, r \rangle,
        \quad r \gets r + (\alpha_i - \beta)\, s_i \\
    u &= r
    \end{align*}
    $$

    with $\gamma_k = \langle s_{k-1}, y_{k-1} \rangle / \langle y_{k-1}, y_{k-1} \rangle$ (1 where
    $\langle y_{k-1}, y_{k-1} \rangle = 0$), or $\gamma_k = 1$ without ``scale_init_precond``. On the first
    call, with ``scale_init_precond``, $\gamma_0 = \min(1, 1 / \lVert u_0 \rVert)$, optax's choice (the
    book leaves it open): the first step has length at most 1. $\langle \cdot, \cdot \rangle$ is
    the real part of the complex inner product, so complex params work. The
    pairs are formed from the params and updates of consecutive calls: put
    the stage first, and apply the step the pipeline returns.

    Args:
        memory_size: the number of pairs kept, an integer in [1, 1000]; 3 to
            20 is the usual range (Nocedal & Wright, section 7.2). Default: ``10``.
        scale_init_precond: start the recursion from $\gamma_k I$ (else
            $I$). Default: ``True``.

    Returns:
        An update object with state ``ScaleByLbfgsState(count, prev_params,
        prev_updates, s_memory, y_memory, rho_memory)``; it needs params.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_lbfgs(memory_size=3)
        >>> params = {"w": jnp.array([3.0, 4.0])}
        >>> u, state = opt.update(params, opt.init(params), params)  # grad of |w|²/2 is w
        >>> u["w"]  # the first step is the gradient scaled to length 1
        Array([0.6, 0.8], dtype=float32)

    References:
        Nocedal & Wright, "Numerical Optimization", 2nd ed., 2006,
        Algorithm 7.4; Liu & Nocedal, "On the limited memory BFGS method for
        large scale optimization", Math. Programming 45, 1989; optax's
        ``scale_by_lbfgs``.
    """
    return stateful(_init_scale_by_lbfgs, _apply_scale_by_lbfgs, name="scale_by_lbfgs",
                    options=dict(memory_size=memory_size, scale_init_precond=scale_init_precond),
                    domains=dict(memory_size=_MEMORY_SIZE, scale_init_precond=Flag()), needs_params=True,
                    static=("memory_size",))
