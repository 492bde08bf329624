"""Weight decay and gradient noise."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree
from updax._combinators import combinator
from updax._domains import ANY_REAL, NON_NEGATIVE, Count, Flag, Valid, fail
from updax._masks import Mask
from updax._primitives import stateful, stateless
from updax._typing import PyTree, ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import number
from updax.updates._masking import leafwise


def _apply_add_decayed_weights(updates, params, *, decay, mask=None, cautious=None):
    none = number(decay) == 0  # (a number, not a traced or scheduled value)

    def leaf(g, p):
        if none:
            return g
        c = _tree.compute_dtype(g.dtype, p.dtype)
        u, x = _tree.cast(g, c), _tree.cast(p, c)
        if cautious:  # decay only where the update and the param agree in sign (Re(u conj(x)) for complex)
            x = jnp.where(jnp.real(u * jnp.conj(x)) >= 0, x, jnp.zeros_like(x))
        return _tree.cast(u + decay * x, g.dtype)

    return leafwise("add_decayed_weights", leaf, mask, updates, params)


@combinator
def add_decayed_weights(decay: ScalarOrSchedule = 0.0, mask: PyTree | Callable[[PyTree], PyTree] | None = None, *,
                        cautious: bool = False) -> Update:
    r"""Adds ``decay`` times the parameters to the updates (decoupled weight decay).

    Update rule, with $\lambda$ = ``decay``: $u \gets u + \lambda p$ on the leaves ``mask`` selects; the
    others pass through unchanged. Keeping biases and normalisation scales
    out of the decay is the usual use. A decay of the number 0 (the default
    of the optimizers that take one) passes every update through as it is,
    without an operation: no pass over the params, and an infinite param
    does not turn its update into NaN ($0 \cdot \infty$). A decay of 0 given as a
    traced value or a schedule computes $u + 0 \cdot p$.

    With ``cautious=True`` (cautious weight decay, Chen et al. 2025), a
    coordinate decays only where the update and the param agree in sign,
    $u \gets u + \lambda\, \mathbb{I}(u \odot p \ge 0) \odot p$ (for complex
    leaves, $\operatorname{Re}(u \bar p) \ge 0$): the decay never pulls a
    param back against the step the rule before it takes. Put it where
    ``add_decayed_weights`` usually sits, after the rule's direction and
    before the learning rate.

    Args:
        decay: the weight-decay rate, any real number. Default: ``0.0``.
        mask: which leaves decay: a pytree of bools shaped like the params,
            or a function of the params returning one (True: decayed); None
            decays every leaf. Default: ``None``.
        cautious: decay only the coordinates where $u \odot p \ge 0$; prints
            only when True. Default: ``False``.

    Returns:
        A stateless update object; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.add_decayed_weights(decay=0.1)
        >>> params = {"w": jnp.array([2.0])}
        >>> opt.update({"w": jnp.array([1.0])}, opt.init(params), params)[0]["w"]
        Array([1.2], dtype=float32)
        >>> no_bias = ux.add_decayed_weights(0.1, mask=lambda p: {k: k != "b" for k in p})
        >>> params = {"w": jnp.array([2.0]), "b": jnp.array([2.0])}
        >>> no_bias.update({"w": jnp.array([1.0]), "b": jnp.array([1.0])}, no_bias.init(params), params)[0]
        {'b': Array([1.], dtype=float32), 'w': Array([1.2], dtype=float32)}
        >>> careful = ux.add_decayed_weights(0.1, cautious=True)  # the update and the param disagree at [1]
        >>> params = {"w": jnp.array([2.0, 2.0])}
        >>> careful.update({"w": jnp.array([1.0, -1.0])}, careful.init(params), params)[0]["w"]
        Array([ 1.2, -1. ], dtype=float32)

    References:
        Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR
        2019. https://arxiv.org/abs/1711.05101

        Chen et al., "Cautious Weight Decay", 2025.
        https://arxiv.org/abs/2510.12402
    """
    return stateless(_apply_add_decayed_weights, elementwise=True, name="add_decayed_weights",
                     options=dict(decay=decay, mask=mask, cautious=cautious),
                     domains=dict(decay=ANY_REAL, mask=Mask(optional=True), cautious=Flag(late=True)),
                     needs_params=True, schedulable=("decay",))


class AddNoiseState(NamedTuple):
    """Steps taken and the raw PRNG key data for the next draw."""

    count: Count
    key: jax.Array


def _key_data(key):
    if isinstance(key, numbers.Integral) or (jnp.ndim(key) == 0 and jnp.issubdtype(jnp.result_type(key), jnp.integer)):
        return jax.random.key_data(jax.random.key(key))
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(key)
    return jnp.asarray(key, jnp.uint32)


def _init_add_noise(params, *, key):
    return AddNoiseState(count=_tree.zero_count(), key=_key_data(key))


def _apply_add_noise(updates, state, params, *, eta, gamma):
    count = _tree.safe_increment(state.count)
    std = jnp.sqrt(eta / count.astype(jnp.float32) ** gamma)
    # A leaf's key is that of its position in the whole tree, None leaves counted: inside partition (or masked)
    # a group's leaves come with the others' as None, and draw what they draw in the whole tree, not the noise
    # of another group's leaves. Without None leaves, leaf i draws from key i + 1 of the split, as it always did.
    positions, treedef = jax.tree.flatten(updates, is_leaf=lambda x: x is None)
    keys = jax.random.split(jax.random.wrap_key_data(state.key), len(positions) + 1)

    def leaf(g, key):
        c = _tree.compute_dtype(g.dtype)
        return (g.astype(c) + std * jax.random.normal(key, g.shape, c)).astype(g.dtype)

    noisy = treedef.unflatten([None if g is None else leaf(g, k) for g, k in zip(positions, keys[1:])])
    return noisy, AddNoiseState(count=count, key=jax.random.key_data(keys[0]))


_SEEDS = 2**32  # jax.random.key folds a seed into 32 bits: -1 and 2**32 - 1 would be the same key


def _key_option(call, name, key):
    """An int seed in [0, 2**32), a 0-d integer array in that range, a typed PRNG key, or raw key data."""
    wraps = f"{_KEY.text}; seeds outside it wrap onto other seeds' keys"
    if isinstance(key, bool):
        fail(call, name, key, _KEY.text, TypeError)
    if isinstance(key, numbers.Integral):
        if not 0 <= key < _SEEDS:
            fail(call, name, key, wraps)
        return int(key)
    if isinstance(key, (jax.Array, np.ndarray)):
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.ndim == 0:
            return key
        raw = jax.random.key_data(jax.random.key(0))
        if key.dtype == raw.dtype and key.shape == raw.shape:
            return key
        if key.ndim == 0 and jnp.issubdtype(key.dtype, jnp.integer):
            if not isinstance(key, jax.core.Tracer) and not 0 <= int(key) < _SEEDS:
                fail(call, name, key, wraps)
            return key
    fail(call, name, key, _KEY.text, TypeError)


#: What a ``key`` option holds (add_noise's; differentially_private_aggregate's too).
_KEY = Valid(rule=_key_option, text="must be an int seed in [0, 2**32), a PRNG key (jax.random.key) or its raw data "
                                    "(jax.random.key_data)")


@combinator
def add_noise(eta: ScalarOrSchedule = 0.01, gamma: ScalarOrSchedule = 0.55, key: int | jax.Array = 0) -> Update:
    r"""Adds annealed Gaussian noise to the updates.

    Update rule, as in the paper (Polaris uses the variance as the standard
    deviation and seeds from the clock), with $\eta$ = ``eta``, $\gamma$ = ``gamma`` and $t = 0, 1, \dots$ the
    steps taken before this one:

    $$
    u \gets u + \mathcal{N}(0, \sigma_t^2), \qquad \sigma_t^2 = \eta / (1 + t)^\gamma
    $$

    Each leaf draws from the key of its position in the whole tree, None
    leaves counted, so inside :func:`partition` or :func:`masked` (which
    hand a group its leaves with the others' as None) a leaf gets the noise
    it gets outside them, and two groups with one key draw different noise.

    Args:
        eta: the initial variance, >= 0. Default: ``0.01``.
        gamma: the annealing exponent, >= 0. Default: ``0.55``.
        key: an int seed in [0, 2**32), a JAX PRNG key or its raw key data;
            the same key gives the same noise.
            Default: ``0``.

    Returns:
        An update object with state ``AddNoiseState(count, key)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.add_noise(eta=0.5, key=42)
        >>> g = {"w": jnp.zeros(3)}
        >>> a, _ = opt.update(g, opt.init(g))
        >>> b, _ = opt.update(g, opt.init(g))
        >>> bool((a["w"] == b["w"]).all()), bool((a["w"] != 0).all())
        (True, True)

    References:
        Neelakantan et al., "Adding Gradient Noise Improves Learning for Very
        Deep Networks", 2015. https://arxiv.org/abs/1511.06807
    """
    return stateful(_init_add_noise, _apply_add_noise, name="add_noise", options=dict(eta=eta, gamma=gamma, key=key),
                    domains=dict(eta=NON_NEGATIVE, gamma=NON_NEGATIVE, key=_KEY), schedulable=("eta", "gamma"))
