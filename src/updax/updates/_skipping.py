"""Skipping bad steps: non-finite or too large updates leave the state untouched."""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import NON_NEGATIVE, Count, FlagField, Integer, Pipeline
from updax._primitives import stateful
from updax._typing import ArrayLike, PyTree
from updax._update import Update
from updax.updates._clipping import global_norm


def _count_not_finite(tree) -> jax.Array:
    counts = [jnp.sum(~jnp.isfinite(x)).astype(jnp.int32) for x in jax.tree.leaves(tree)]
    return sum(counts, jnp.zeros([], jnp.int32))


def _all_finite(*trees) -> jax.Array:
    """Whether every element of ``trees`` is finite: an ``and`` of booleans, which XLA reduces through a byte per
    element where a count goes through a 32-bit integer. Trees of the same leaf shapes (a step and its input)
    are checked leaf by leaf together, one reduction for each pair of leaves (a third fewer kernels)."""
    leaves = [jax.tree.leaves(tree) for tree in trees]
    shapes = {tuple(jnp.shape(x) for x in group) for group in leaves}
    if len(shapes) == 1:
        checks = [functools.reduce(jnp.logical_and, [jnp.isfinite(x) for x in group]) for group in zip(*leaves)]
    else:
        checks = [jnp.isfinite(x) for group in leaves for x in group]
    return functools.reduce(jnp.logical_and, [jnp.all(c) for c in checks], jnp.ones([], bool))


def skip_not_finite(updates: PyTree, gradient_step: ArrayLike,
                    params: PyTree) -> tuple[jax.Array, dict[str, jax.Array]]:
    """A skip function for :func:`accumulate_gradients`: skip updates holding a NaN or an infinity.

    Args:
        updates: the updates of this call. No default.
        gradient_step: the wrapped pipeline's step count (unused). No default.
        params: the params (unused). No default.

    Returns:
        ``(skip, record)`` with ``record = {"should_skip", "num_not_finite"}``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale(-1.0).accumulate_gradients(1, should_skip=ux.skip_not_finite)
        >>> state = opt.init({"w": jnp.zeros(2)})
        >>> u, state = opt.update({"w": jnp.array([1.0, jnp.nan])}, state)
        >>> u["w"], state[0].skip["num_not_finite"], ux.has_updated(state)
        (Array([0., 0.], dtype=float32), Array(1, dtype=int32), Array(False, dtype=bool))
    """
    del gradient_step, params
    num = _count_not_finite(updates)
    skip = num > 0
    return skip, {"should_skip": skip, "num_not_finite": num}


@dataclasses.dataclass(frozen=True)
class skip_large_updates:
    """A skip function for :func:`accumulate_gradients`: skip updates whose squared global norm exceeds a bound.

    ``skip_large_updates(max_squared_norm)`` is the skip function; it is a
    value (equal for equal bounds), so pipelines holding it compare equal.

    Args:
        max_squared_norm: the largest squared global norm accepted, >= 0;
            a non-finite norm is always skipped. No default.

    Returns:
        A skip function returning ``(skip, {"should_skip", "norm_squared"})``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> skip = ux.skip_large_updates(10.0)
        >>> skip({"w": jnp.array([3.0, 1.0])}, 0, None)[0], skip({"w": jnp.array([3.0, 2.0])}, 0, None)[0]
        (Array(False, dtype=bool), Array(True, dtype=bool))
    """

    max_squared_norm: float

    def __post_init__(self) -> None:
        bound = NON_NEGATIVE.check("skip_large_updates", "max_squared_norm", self.max_squared_norm)
        object.__setattr__(self, "max_squared_norm", float(bound))

    def __call__(self, updates: PyTree, gradient_step: ArrayLike,
                 params: PyTree) -> tuple[jax.Array, dict[str, jax.Array]]:
        del gradient_step, params
        norm_squared = jnp.square(global_norm(updates))
        skip = ~(norm_squared <= self.max_squared_norm)  # also skips NaN
        return skip, {"should_skip": skip, "norm_squared": norm_squared}


class ApplyIfFiniteState(NamedTuple):
    """The wrapped pipeline's state and the counts of non-finite steps (optax's names)."""

    inner: tuple
    notfinite_count: Count
    last_finite: FlagField
    total_notfinite: Count


def _init_apply_if_finite(params, *, inner):
    return ApplyIfFiniteState(inner=inner.init(params), notfinite_count=_tree.zero_count(),
                              last_finite=jnp.ones([], bool), total_notfinite=_tree.zero_count())


def _apply_apply_if_finite(updates, state, params, *, inner, max_consecutive_errors, **extra):
    return if_finite(updates, state, params, inner, max_consecutive_errors, extra)


def if_finite(updates, state, params, inner, max_consecutive_errors, extra, recheck=None):
    """The step, kept where it is finite. ``recheck(updates, inner_state, params)``, where given, returns the step
    the check reads instead of the one returned: the same values, computed apart (a backend's path)."""
    out, inner_state = inner.update(updates, state.inner, params, **extra)
    checked = None if recheck is None else recheck(updates, state.inner, params)
    finite = _all_finite(updates, out if checked is None else checked)
    notfinite_count = jnp.where(finite, 0, _tree.safe_increment(state.notfinite_count))
    apply = finite | (notfinite_count > max_consecutive_errors)
    out = jax.tree.map(lambda u: jnp.where(apply, u, _tree.zeros_like(u)), out)
    inner_state = jax.tree.map(lambda new, old: jax.lax.select(apply, new, old), inner_state, state.inner)
    total = jnp.where(finite, state.total_notfinite, _tree.safe_increment(state.total_notfinite))
    return out, ApplyIfFiniteState(inner=inner_state, notfinite_count=notfinite_count.astype(jnp.int32),
                                   last_finite=finite, total_notfinite=total)


@combinator(wraps=True)
def apply_if_finite(inner: Update, max_consecutive_errors: int = 5) -> Update:
    """Drops steps whose updates are not finite, leaving the pipeline before it untouched.

    The wrapped pipeline runs on every call; when its input or its output
    holds a NaN or an infinity, the call emits zeros and its state is kept
    bit-identical, unless more than ``max_consecutive_errors`` such calls
    came in a row: then the update is applied anyway (so a run that keeps
    failing fails loudly). The counts are kept in the state.

    Args:
        max_consecutive_errors: non-finite calls in a row that are dropped,
            an integer >= 0. Default: ``5``.

    Returns:
        An update object with state ``ApplyIfFiniteState(inner,
        notfinite_count, last_finite, total_notfinite)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_adam().scale(-0.1).apply_if_finite(3)
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> u, state = opt.update({"w": jnp.array([jnp.inf])}, state)
        >>> u["w"], opt.get_state(state, "apply_if_finite/scale_by_adam.count")
        (Array([0.], dtype=float32), Array(0, dtype=int32))
        >>> opt.get_state(state, "apply_if_finite.total_notfinite")
        Array(1, dtype=int32)

    References:
        optax.apply_if_finite; the loss-scaling skip of mixed-precision
        training (Micikevicius et al., "Mixed Precision Training", ICLR 2018).
    """
    return stateful(_init_apply_if_finite, _apply_apply_if_finite, name="apply_if_finite",
                    options=dict(inner=inner, max_consecutive_errors=max_consecutive_errors),
                    domains=dict(inner=Pipeline(), max_consecutive_errors=Integer(0)), wraps="inner",
                    state_last=("inner",))
