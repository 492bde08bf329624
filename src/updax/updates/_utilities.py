"""Utilities: zeroing NaNs, keeping params non-negative, and snapshots of the updates for inspection."""

from __future__ import annotations

import keyword
from collections.abc import Callable
from typing import Annotated, Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import Flag, Function, fail
from updax._primitives import stateful, stateless
from updax._typing import PyTree
from updax._update import Update
from updax.updates._kernels import real_only

# --------------------------------------------------------------------------
# zero_nans


class ZeroNansState(NamedTuple):
    """Per leaf of the updates, a bool scalar: whether the last call found a NaN in that leaf."""

    found_nan: Annotated[Any, Flag()]


def _init_zero_nans(params):
    return ZeroNansState(found_nan=jax.tree.map(lambda p: _tree.full((), False, jnp.bool_, p, dims=()), params))


def _apply_zero_nans(updates, state, params):
    found_nan = jax.tree.map(lambda u: jnp.any(jnp.isnan(u)), updates)
    zeroed = jax.tree.map(lambda u: jnp.where(jnp.isnan(u), jnp.zeros((), u.dtype), u), updates)
    return zeroed, ZeroNansState(found_nan=found_nan)


@combinator
def zero_nans() -> Update:
    r"""Replaces the NaN entries of the updates with 0, recording per leaf whether it found one.

    Update rule: $u \gets 0$ where $u$ is NaN, else $u$; and
    ``found_nan`` $\gets \operatorname{any}(\operatorname{isnan}(u))$ for each leaf. Infinities pass unchanged.
    The state is for the user (``opt.get_state(state, "zero_nans.found_nan")``):
    the stage does not read it.

    Returns:
        An update object with state ``ZeroNansState(found_nan)``, one bool
        scalar per leaf of the params.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.zero_nans()
        >>> g = {"a": jnp.array([1.0, jnp.nan]), "b": jnp.array([2.0])}
        >>> updates, state = opt.update(g, opt.init(g))
        >>> updates["a"], opt.get_state(state, "zero_nans.found_nan")
        (Array([1., 0.], dtype=float32), {'a': Array(True, dtype=bool), 'b': Array(False, dtype=bool)})

    References:
        optax.zero_nans (same rule and state).
    """
    return stateful(_init_zero_nans, _apply_zero_nans, name="zero_nans")


# --------------------------------------------------------------------------
# keep_params_nonnegative


def _nonnegative_leaf(u, p):
    c = _tree.compute_dtype(u.dtype, p.dtype)
    p_c = p.astype(c)
    floor = (-p_c).astype(u.dtype)
    if u.dtype != c:  # -p rounded to a narrower update dtype may overshoot it: round towards 0 instead
        floor = jnp.where(p_c + floor.astype(c) < 0, jnp.nextafter(floor, jnp.zeros((), u.dtype)), floor)
    return jnp.where(p_c + u.astype(c) < 0, floor, u)


def _apply_keep_params_nonnegative(updates, params):
    real_only("keep_params_nonnegative", updates)
    real_only("keep_params_nonnegative", params, "params")
    return _tree.tree_map("keep_params_nonnegative", _nonnegative_leaf, updates, params, names=("updates", "params"))


@combinator
def keep_params_nonnegative() -> Update:
    r"""Changes the updates so that the params they produce are non-negative.

    Update rule: $u \gets -p$ where $p + u < 0$, else $u$; so
    ``apply_updates(p, u) >= 0`` element by element. Put it last in the
    pipeline: a stage after it may undo it. A param that is already negative
    is moved to 0. When $-p$ is not exact in the update's dtype it is
    rounded towards 0, so the sum is never below 0.

    Returns:
        A stateless update object; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale(-1.0).keep_params_nonnegative()
        >>> params = {"w": jnp.array([1.0, 1.0, -0.5])}
        >>> updates, _ = opt.update({"w": jnp.array([0.5, 3.0, 0.0])}, opt.init(params), params)
        >>> updates["w"], ux.apply_updates(params, updates)["w"]
        (Array([-0.5, -1. ,  0.5], dtype=float32), Array([0.5, 0. , 0. ], dtype=float32))

    References:
        optax.keep_params_nonnegative (same rule).
    """
    return stateless(_apply_keep_params_nonnegative, elementwise=True, name="keep_params_nonnegative",
                     needs_params=True)


# --------------------------------------------------------------------------
# snapshot


class SnapshotState(NamedTuple):
    """The value kept at the last call: the updates as they reached the stage, or ``measure`` of them."""

    value: Any


def _init_snapshot(params, *, measure):
    if measure is None:
        return SnapshotState(value=jax.tree.map(_tree.zeros_like, params))
    return SnapshotState(value=jax.tree.map(_tree.zeros_of, jax.eval_shape(measure, params)))


def _apply_snapshot(updates, state, params, *, measure):
    value = updates if measure is None else measure(updates)
    # A copy in the dtype init gave, so that the state keeps its dtypes and shares no buffer with the updates.
    value = jax.tree.map(lambda old, new: jnp.array(new, dtype=old.dtype, copy=True), state.value, value)
    return updates, SnapshotState(value=value)


@combinator
def snapshot(name: str = "snapshot", measure: Callable[[PyTree], PyTree] | None = None) -> Update:
    r"""Keeps a copy of the updates at this point of the pipeline in its state; the updates pass unchanged.

    Update rule: $u \gets u$; ``value`` $\gets u$, or ``value`` $\gets$ ``measure(u)``. Read
    it after a step with ``opt.get_state(state, "snapshot.value")``, where
    ``snapshot`` is the stage's ``name``: two snapshots in one pipeline take
    two names, or are told apart as ``"snapshot[0]"`` and ``"snapshot[1]"``.
    The stage prints under its name: ``scale(step_size=2.0) |> scaled()``
    is a scale then a snapshot named ``scaled``.

    A full copy (``measure=None``) doubles that stage's memory: the state
    holds one more tree the size of the updates, in the params' dtypes (as
    ``init`` creates it; updates of another dtype are cast). A reducing
    ``measure`` (``ux.global_norm``) keeps only what it returns. Before the
    first step the value is zeros.

    Args:
        name: the stage's name, which state paths use: a Python identifier
            not taken by another kind of stage. Default: ``"snapshot"``.
        measure: a jittable function of the updates returning a pytree of
            arrays to keep instead of the updates themselves, e.g.
            ``ux.global_norm``; ``init`` traces it on the params for the
            shapes and dtypes. None keeps a copy of the updates.
            Default: ``None``.

    Returns:
        An update object with state ``SnapshotState(value)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale(2.0).snapshot("scaled").snapshot("scaled_norm", measure=ux.global_norm).clip(1.0)
        >>> opt
        scale(step_size=2.0) |> scaled() |> scaled_norm(measure=updax.updates._clipping.global_norm) |> clip(delta=1.0)
        >>> g = {"w": jnp.array([3.0, 0.0])}
        >>> updates, state = opt.update(g, opt.init(g))
        >>> updates["w"], opt.get_state(state, "scaled.value")["w"], opt.get_state(state, "scaled_norm.value")
        (Array([1., 0.], dtype=float32), Array([6., 0.], dtype=float32), Array(6., dtype=float32))

    References:
        optax.snapshot(measure_name, measure), which keeps the measurement
        in a dict of its state, read with ``optax.tree.get``; its initial
        value is ``measure(params)``.
    """
    # (the name is the stage's, not an option: checked here, and bound by the stage like any stage name)
    if not (isinstance(name, str) and name.isidentifier()):
        fail("snapshot", "name", name, "must be a Python identifier (state paths use it)", TypeError)
    if keyword.iskeyword(name) or name in ("stateless", "stateful"):
        fail("snapshot", "name", name, "must be a Python identifier other than a keyword, stateless and stateful "
             "(state paths use it)")
    try:
        return stateful(_init_snapshot, _apply_snapshot, name=name, options=dict(measure=measure),
                        domains=dict(measure=Function(optional=True)))
    except ValueError as error:  # a name another kind of stage has (a catalogue combinator's: ux.trace)
        raise ValueError(f"snapshot(name={name!r}): {error}") from None
