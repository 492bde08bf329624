"""Functions over params and gradients outside a pipeline: a target network's updates (``incremental_update``,
``periodic_update``) and a gradient scaled in the backward pass (``scale_gradient``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree
from updax import _validate as check
from updax._domains import is_concrete
from updax._typing import ArrayLike, PyTree


def _pair(call: str, new_tensors: PyTree, old_tensors: PyTree) -> tuple[PyTree, PyTree]:
    """Both trees as arrays, of one structure and shapes, their leaves floating point."""
    new = _tree.as_arrays(call, new_tensors, "new_tensors", floating=True)
    old = _tree.as_arrays(call, old_tensors, "old_tensors", floating=True)
    _tree.check_same_structure(call, new, old, "new_tensors", "old_tensors")
    for (path, n), o in zip(jax.tree_util.tree_flatten_with_path(new)[0], jax.tree.leaves(old)):
        if n.shape != o.shape:
            where = jax.tree_util.keystr(path)
            raise ValueError(f"{call}: new_tensors{where} has shape {n.shape}, old_tensors{where} {o.shape}")
    return new, old


def incremental_update(new_tensors: PyTree, old_tensors: PyTree, step_size: ArrayLike) -> PyTree:
    r"""Moves a copy of the params (a target network) a step towards the params: Polyak averaging.

    With $\tau$ = ``step_size``, $\theta$ the params (``new_tensors``) and $\bar\theta$ the copy (``old_tensors``):

    $$
    \bar\theta \gets \tau\, \theta + (1 - \tau)\, \bar\theta
    $$

    Computed in at least float32, each result in ``old_tensors``' dtype.
    ``step_size`` may be traced (a schedule's value under ``jax.jit``); a
    concrete one is checked. :func:`ema_params` keeps such an average in an
    optimizer's state instead.

    Args:
        new_tensors: the params, a pytree of floating arrays. No default.
        old_tensors: the moving copy, shaped like ``new_tensors``. No default.
        step_size: $\tau$, in [0, 1]. No default.

    Returns:
        The new copy, shaped like ``old_tensors``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> ux.incremental_update({"w": jnp.array([1.0])}, {"w": jnp.array([0.0])}, 0.25)
        {'w': Array([0.25], dtype=float32)}

    References:
        Polyak & Juditsky, "Acceleration of stochastic approximation by
        averaging", SIAM J. Control Optim. 30, 1992; Lillicrap et al.,
        "Continuous control with deep reinforcement learning", ICLR 2016
        (soft target updates). https://arxiv.org/abs/1509.02971;
        optax.incremental_update (same rule and arguments).
    """
    call = "incremental_update"
    step_size = check.number(call, "step_size", step_size, 0.0, 1.0)
    new, old = _pair(call, new_tensors, old_tensors)

    def leaf(n, o):
        c = _tree.compute_dtype(n.dtype, o.dtype)
        tau = jnp.asarray(step_size).astype(jnp.finfo(c).dtype)
        return (tau * n.astype(c) + (1 - tau) * o.astype(c)).astype(o.dtype)

    return jax.tree.map(leaf, new, old)


def periodic_update(new_tensors: PyTree, old_tensors: PyTree, steps: ArrayLike, update_period: int) -> PyTree:
    r"""Copies the params into a target network every ``update_period`` steps, and keeps it otherwise.

    With $t$ = ``steps`` and $k$ = ``update_period``:
    $\bar\theta \gets \theta$ if $t \bmod k = 0$, else $\bar\theta$.

    Each leaf keeps ``old_tensors``' dtype. ``steps`` may be traced.

    Args:
        new_tensors: the params, a pytree of floating arrays. No default.
        old_tensors: the target copy, shaped like ``new_tensors``.
            No default.
        steps: the steps the params have taken, an integer >= 0 (an int
            scalar array under ``jax.jit``). No default.
        update_period: $k$, the steps between copies, an integer >= 1.
            No default.

    Returns:
        The new copy, shaped like ``old_tensors``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> target = {"w": jnp.array([0.0])}
        >>> [ux.periodic_update({"w": jnp.array([float(t)])}, target, t, 3)["w"].item() for t in range(1, 7)]
        [0.0, 0.0, 3.0, 0.0, 0.0, 6.0]

    References:
        Mnih et al., "Human-level control through deep reinforcement
        learning", Nature 518, 2015; Grill et al., "Bootstrap Your Own
        Latent", NeurIPS 2020. https://arxiv.org/abs/2006.07733;
        optax.periodic_update (same rule and arguments).
    """
    call = "periodic_update"
    update_period = check.positive_int(call, "update_period", update_period)
    steps = _steps(call, steps)
    new, old = _pair(call, new_tensors, old_tensors)
    copy = steps % update_period == 0
    return jax.tree.map(lambda n, o: jnp.where(copy, n.astype(o.dtype), o), new, old)


def _steps(call: str, steps: ArrayLike) -> jax.Array:
    """An integer scalar (a Python int, or an integer array of shape ()), >= 0 where concrete."""
    try:
        array = jnp.asarray(steps)
    except TypeError:
        raise TypeError(f"{call}(steps={steps!r}): steps must be an integer >= 0") from None
    if array.shape != () or not jnp.issubdtype(array.dtype, jnp.integer):
        raise TypeError(f"{call}(steps=...): steps must be an integer scalar, not "
                        f"{array.dtype.name}{list(array.shape)}")
    if is_concrete(array) and int(np.asarray(array)) < 0:
        raise ValueError(f"{call}(steps={int(np.asarray(array))}): steps must be >= 0")
    return array


@jax.custom_vjp
def _scaled_backward(x, scale):
    return x


def _scaled_backward_forward(x, scale):
    return x, scale


def _scaled_backward_backward(scale, g):
    c = _tree.compute_dtype(g.dtype)
    return _tree.cast(jnp.asarray(scale).astype(jnp.finfo(c).dtype) * _tree.cast(g, c), g.dtype), jnp.zeros_like(scale)


_scaled_backward.defvjp(_scaled_backward_forward, _scaled_backward_backward)


def scale_gradient(inputs: PyTree, scale: ArrayLike) -> PyTree:
    r"""The identity in the forward pass; in the backward pass, the gradient times ``scale``.

    With $s$ = ``scale``: $f(x) = x$ and $\partial L / \partial x = s\, \partial L / \partial f(x)$,
    leaf by leaf. Use it inside a loss to slow a part of a model down
    (``scale=0.1``), stop its gradient (``0``, as ``jax.lax.stop_gradient``)
    or reverse it (``-1``, a gradient-reversal layer). The forward values are
    ``inputs`` itself, bit for bit. Floating and complex leaves are scaled;
    other leaves (integers) pass through, with no gradient.

    Args:
        inputs: a pytree of arrays. No default.
        scale: $s$, a real scalar (traced values too; no gradient flows to
            it). No default.

    Returns:
        ``inputs``, with the gradient scaled on the way back.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import updax as ux
        >>> def loss(w):
        ...     return jnp.sum(ux.scale_gradient(w, 0.1) ** 2)
        >>> loss(jnp.array([3.0])), jax.grad(loss)(jnp.array([3.0]))  # 9, and 0.1·2·3
        (Array(9., dtype=float32), Array([0.6], dtype=float32))

    References:
        Ganin & Lempitsky, "Unsupervised Domain Adaptation by
        Backpropagation", ICML 2015 (gradient reversal).
        https://arxiv.org/abs/1409.7495; optax.scale_gradient (same rule and
        arguments).
    """
    scale = check.number("scale_gradient", "scale", scale)
    scale = jnp.asarray(scale)
    if not jnp.issubdtype(scale.dtype, jnp.floating):  # (an int scale: its cotangent is a float's)
        scale = scale.astype(jnp.float32)

    def leaf(x):
        x = jnp.asarray(x)
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            return x
        return _scaled_backward(x, scale)

    return jax.tree.map(leaf, inputs)
