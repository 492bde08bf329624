"""Per-example clipping and differentially private aggregation (DP-SGD).

These stages take per-example updates: every leaf carries a leading axis of
examples, one gradient per example, as ``jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, batch)``
gives them (the batch's arrays have the examples on axis 0). They reduce that
axis, so what they return is shaped like the params; they come first in a
pipeline, and a pipeline holds one of them.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree
from updax._combinators import combinator
from updax._domains import NON_NEGATIVE, Flag
from updax._primitives import stateful, stateless
from updax._stage import without_examples
from updax._typing import PyTree, ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import abs_sq, real_only, safe_sqrt
from updax.updates._noise_decay import _KEY, _key_data

#: What the options of the privacy stages hold (the key as add_noise's).
_PRIVACY_DOMAINS = dict(l2_norm_clip=NON_NEGATIVE, noise_multiplier=NON_NEGATIVE, key=_KEY, uniform=Flag())


def _clipped_sum(updates, l2_norm_clip):
    """The sum over examples of each example's updates scaled to a global norm of at most ``l2_norm_clip``, and
    how many examples were scaled down."""
    leaves, treedef = jax.tree.flatten(updates)
    if not leaves:
        return updates, jnp.zeros([], jnp.int32)
    computes = [_tree.compute_dtype(g.dtype) for g in leaves]
    squares = [jnp.sum(abs_sq(g.astype(c)), axis=tuple(range(1, g.ndim))) for g, c in zip(leaves, computes)]
    real = _tree.wider(*(s.dtype for s in squares))
    norms = safe_sqrt(functools.reduce(jnp.add, (s.astype(real) for s in squares)))  # one per example
    bound = jnp.asarray(l2_norm_clip).astype(real)
    within = norms <= bound
    # Double where: the branch not taken divides by 1, so a zero norm gives no NaN (nor a NaN gradient).
    factors = jnp.where(within, 1.0, bound / jnp.where(within, 1.0, norms)).astype(real)
    summed = [jnp.tensordot(factors.astype(c), g.astype(c), axes=1).astype(g.dtype) for g, c in zip(leaves, computes)]
    return treedef.unflatten(summed), jnp.sum(factors < 1).astype(jnp.int32)


def per_example_clipped_sum(grads: PyTree, l2_norm_clip: jax.typing.ArrayLike) -> tuple[PyTree, jax.Array]:
    """Clips each example's gradient to a global L2 norm of ``l2_norm_clip`` and sums them: ``(sum, num_clipped)``.

    The function form of :func:`per_example_global_norm_clip` (``optax.per_example_global_norm_clip``
    returns the same pair): every leaf of ``grads`` has a leading axis of
    examples, of one size for all leaves. Each example's global norm is the
    norm of its slices of all leaves together, computed in at least float32;
    ``num_clipped`` counts the examples whose norm exceeded the bound.

    Args:
        grads: per-example gradients, e.g. ``jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, batch)``.
            No default.
        l2_norm_clip: the largest global norm an example keeps, >= 0.
            No default.

    Returns:
        The sum of the clipped examples, shaped like one example, and the
        number of examples clipped (an int32 scalar).

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> grads = {"w": jnp.array([[0.0, 0.0], [3.0, 4.0], [0.3, 0.4]])}  # three examples
        >>> ux.per_example_clipped_sum(grads, 1.0)
        ({'w': Array([0.90000004, 1.2       ], dtype=float32)}, Array(1, dtype=int32))

    References:
        Abadi et al., "Deep Learning with Differential Privacy", CCS 2016.
        https://arxiv.org/abs/1607.00133
    """
    call = "per_example_clipped_sum"
    l2_norm_clip = _PRIVACY_DOMAINS["l2_norm_clip"].check(call, "l2_norm_clip", l2_norm_clip)
    grads = _tree.as_arrays(call, grads, "grads", floating=True)
    without_examples(call, grads)
    return _clipped_sum(grads, l2_norm_clip)


def _apply_per_example_global_norm_clip(updates, params, *, l2_norm_clip):
    return _clipped_sum(updates, l2_norm_clip)[0]


@combinator
def per_example_global_norm_clip(l2_norm_clip: ScalarOrSchedule = 1.0) -> Update:
    r"""Clips each example's gradient to a global L2 norm of ``l2_norm_clip``, then sums over the examples.

    Update rule, for updates $g_1, \dots, g_B$ with a leading axis of $B$ examples, with $C$ = ``l2_norm_clip``:

    $$
    u \gets \sum_i g_i \min(1, C / \lVert g_i \rVert)
    $$

    where $\lVert g_i \rVert$ is the norm of example $i$ over all leaves together.
    The updates it gets are per-example, e.g.
    ``jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, batch)``; what it
    returns is shaped like the params. It comes first in a pipeline (stages
    before it would see the examples' axis). :func:`per_example_clipped_sum`
    is the function form, which also counts the examples clipped.

    Args:
        l2_norm_clip: the largest global norm an example keeps, >= 0.
            Default: ``1.0``.

    Returns:
        A stateless update object that takes per-example updates.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import updax as ux
        >>> def loss(params, x):
        ...     return jnp.sum(params["w"] * x)
        >>> params, batch = {"w": jnp.zeros(2)}, jnp.array([[3.0, 4.0], [0.3, 0.4]])
        >>> grads = jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, batch)  # (2, 2): one row per example
        >>> opt = ux.per_example_global_norm_clip(l2_norm_clip=1.0)
        >>> opt.update(grads, opt.init(params), params)[0]
        {'w': Array([0.90000004, 1.2       ], dtype=float32)}

    References:
        Abadi et al., "Deep Learning with Differential Privacy", CCS 2016.
        https://arxiv.org/abs/1607.00133
    """
    options = dict(l2_norm_clip=l2_norm_clip)
    return stateless(_apply_per_example_global_norm_clip, name="per_example_global_norm_clip", options=options,
                     domains={k: _PRIVACY_DOMAINS[k] for k in options}, schedulable=("l2_norm_clip",),
                     per_example=True)


def _apply_per_example_layer_norm_clip(updates, params, *, l2_norm_clip, uniform):
    leaves, treedef = jax.tree.flatten(updates)
    if not leaves:
        return updates
    sizes = [math.prod(g.shape[1:]) for g in leaves]  # D_i, one example's elements in leaf i

    def leaf(g, size):
        c = _tree.compute_dtype(g.dtype)
        real = jnp.finfo(c).dtype
        share = 1 / len(leaves) if uniform else size / max(sum(sizes), 1)
        bound = jnp.asarray(l2_norm_clip).astype(real) * np.sqrt(share).astype(real)  # C_i
        norms = safe_sqrt(jnp.sum(abs_sq(g.astype(c)), axis=tuple(range(1, g.ndim))))  # one per example
        within = norms <= bound
        # Double where: the branch not taken divides by 1, so a zero norm gives no NaN (nor a NaN gradient).
        factors = jnp.where(within, 1.0, bound / jnp.where(within, 1.0, norms))
        return jnp.tensordot(factors.astype(c), g.astype(c), axes=1).astype(g.dtype)

    return treedef.unflatten([leaf(g, size) for g, size in zip(leaves, sizes)])


@combinator
def per_example_layer_norm_clip(l2_norm_clip: ScalarOrSchedule = 1.0, uniform: bool = True) -> Update:
    r"""Clips each example's gradient leaf by leaf, each to its share of ``l2_norm_clip``, then sums.

    Update rule, for updates with a leading axis of $B$ examples and $K$
    leaves (layers), leaf $i$ of example $b$ being $g_{b,i}$ with $D_i$
    elements ($D = \sum_i D_i$), with $C$ = ``l2_norm_clip``:

    $$
    \begin{align*}
    C_i &= C / \sqrt{K} && (\texttt{uniform=True}) \\
    C_i &= C \sqrt{D_i / D} && (\texttt{uniform=False}) \\
    u_i &\gets \sum_b g_{b,i} \min(1, C_i / \lVert g_{b,i} \rVert)
    \end{align*}
    $$

    Since $\sum_i C_i^2 = C^2$, each example's clipped gradient has a global
    norm of at most $C$, as with :func:`per_example_global_norm_clip`
    (which it equals for one leaf). The updates it gets are per-example;
    what it returns is shaped like the params, and it comes first in a
    pipeline.

    Args:
        l2_norm_clip: $C$, the global bound the layers' bounds share, >= 0.
            Default: ``1.0``.
        uniform: give every layer the same bound (True) or one by its share
            of the elements (False). Default: ``True``.

    Returns:
        A stateless update object that takes per-example updates.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> grads = [jnp.array([4.0, 0.5]), jnp.array([-2.0, 0.25]), jnp.array([1.0, 8.0]), jnp.zeros(2)]
        >>> opt = ux.per_example_layer_norm_clip(l2_norm_clip=2.0)  # 4 layers of 2 examples: 2/√4 = 1 each
        >>> opt.update(grads, opt.init(None))[0]  # 4/4 + 0.5, -2/2 + 0.25, 1 + 8/8, 0
        [Array(1.5, dtype=float32), Array(-0.75, dtype=float32), Array(2., dtype=float32), Array(0., dtype=float32)]

    References:
        McMahan et al., "Learning Differentially Private Recurrent Language
        Models", ICLR 2018. https://arxiv.org/abs/1710.06963;
        optax.per_example_layer_norm_clip, which returns the sums with the
        counts of examples clipped.
    """
    options = dict(l2_norm_clip=l2_norm_clip, uniform=uniform)
    return stateless(_apply_per_example_layer_norm_clip, name="per_example_layer_norm_clip", options=options,
                     domains={k: _PRIVACY_DOMAINS[k] for k in options}, schedulable=("l2_norm_clip",),
                     per_example=True)


class DifferentiallyPrivateAggregateState(NamedTuple):
    """The raw PRNG key data for the next step's noise."""

    key: jax.Array


def _init_private_aggregate(params, *, key):
    return DifferentiallyPrivateAggregateState(key=_key_data(key))


def _apply_private_aggregate(updates, state, params, *, l2_norm_clip, noise_multiplier):
    real_only("differentially_private_aggregate", updates)
    leaves, treedef = jax.tree.flatten(updates)
    if not leaves:
        return updates, state
    examples = leaves[0].shape[0]
    summed, _ = _clipped_sum(updates, l2_norm_clip)
    # The leaves are numbered as optax numbers them, None leaves not counted (add_noise counts them, so that
    # groups of partition draw their leaves' own noise): a per-example stage never runs inside partition or
    # masked, whose groups keep the updates' shapes, so two groups of one key cannot meet here.
    keys = jax.random.split(jax.random.wrap_key_data(state.key), len(leaves) + 1)
    std = l2_norm_clip * noise_multiplier

    def leaf(s, key):
        c = _tree.compute_dtype(s.dtype)
        noise = jnp.asarray(std).astype(c) * jax.random.normal(key, s.shape, c)
        return ((s.astype(c) + noise) / examples).astype(s.dtype)

    noisy = [leaf(s, k) for s, k in zip(treedef.flatten_up_to(summed), keys[1:])]
    return treedef.unflatten(noisy), DifferentiallyPrivateAggregateState(key=jax.random.key_data(keys[0]))


@combinator
def differentially_private_aggregate(l2_norm_clip: ScalarOrSchedule = 1.0, noise_multiplier: ScalarOrSchedule = 1.0,
                                     key: int | jax.Array = 0) -> Update:
    r"""DP-SGD's aggregation: per-example clipping, a sum, Gaussian noise, and the mean over the batch.

    Update rule (Abadi et al., Algorithm 1), for updates $g_1, \dots, g_B$ with
    a leading axis of $B$ examples, as ``optax.contrib.differentially_private_aggregate``, with
    $C$ = ``l2_norm_clip`` and $\sigma$ = ``noise_multiplier``:

    $$
    u \gets \Bigl(\sum_i g_i \min(1, C / \lVert g_i \rVert) + \mathcal{N}(0, \sigma^2 C^2 I)\Bigr) / B
    $$

    where $\lVert g_i \rVert$ is the norm of example $i$ over all leaves together.
    The updates it gets are per-example, e.g.
    ``jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, batch)``; what it
    returns is shaped like the params. It comes first in a pipeline and is
    not for gradient accumulation (``accumulate_gradients`` would average
    noisy means; use a bigger batch). The noise is drawn in at least float32
    from an explicit key, so the same key gives the same noise; with the
    same key, the numbers are optax's. Complex updates are refused: the
    analysis's noise is per real coordinate, and a complex draw would give
    each part $1/\sqrt{2}$ of it.

    Args:
        l2_norm_clip: the largest global norm an example keeps, >= 0.
            Default: ``1.0``.
        noise_multiplier: the noise's standard deviation in units of
            ``l2_norm_clip``, >= 0. Default: ``1.0``.
        key: an int seed in [0, 2**32), a JAX PRNG key or its raw key data.
            Default: ``0``.

    Returns:
        An update object that takes per-example updates, with state
        ``DifferentiallyPrivateAggregateState(key)``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import updax as ux
        >>> def loss(params, x):
        ...     return jnp.sum(params["w"] * x)
        >>> params, batch = {"w": jnp.zeros(2)}, jnp.array([[3.0, 4.0], [0.3, 0.4]])
        >>> grads = jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, batch)
        >>> opt = ux.differentially_private_aggregate(l2_norm_clip=1.0, noise_multiplier=0.0)
        >>> opt.update(grads, opt.init(params), params)[0]  # ((0.6, 0.8) + (0.3, 0.4)) / 2
        {'w': Array([0.45000002, 0.6       ], dtype=float32)}

    References:
        Abadi et al., "Deep Learning with Differential Privacy", CCS 2016.
        https://arxiv.org/abs/1607.00133
    """
    options = dict(l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier, key=key)
    return stateful(_init_private_aggregate, _apply_private_aggregate, name="differentially_private_aggregate",
                    options=options, domains={k: _PRIVACY_DOMAINS[k] for k in options},
                    schedulable=("l2_norm_clip", "noise_multiplier"), per_example=True)
