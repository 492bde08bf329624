"""Flat state: an elementwise pipeline run on the leaves joined into one buffer per dtype.

XLA compiles a kernel per output array, so a step over a thousand leaves of a
thousand shapes is three thousand small kernels for Adam: most of the step
time and nearly all the compile time. Joined, the moments are one array per
dtype and their update is one kernel each; only the params, which belong to
the user, keep a kernel per leaf.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from updax import _tree
from updax._combinators import combinator
from updax._domains import Integer, Pipeline, Valid
from updax._primitives import stateful
from updax._typing import PyTree
from updax._update import Update

__all__ = ["FlatState", "flat_state", "from_flat"]


class FlatState(NamedTuple):
    """The wrapped pipeline's state, computed for the joined params: each params-shaped field of it is a dict
    of buffers (see :func:`flat_state`); :func:`from_flat` gives one the params' shape again."""

    inner: tuple


def _groups(tree: Any, max_join_size: int, max_shared: int | None, min_joined: int) -> list[str]:
    """Each leaf's buffer: its dtype's name for a joined leaf (at most ``max_join_size`` elements, a shape and
    dtype at most ``max_shared`` leaves have, and at least ``min_joined`` such leaves of its dtype),
    ``leaf_<index>`` for any other (kept as it is)."""
    kinds = [(jnp.shape(x), jnp.result_type(x).name) for x in jax.tree.leaves(tree)]
    count = Counter(kinds)
    groups = [dtype if math.prod(shape) <= max_join_size and (max_shared is None or count[shape, dtype] <= max_shared)
              else None for shape, dtype in kinds]
    joined = Counter(g for g in groups if g is not None)
    return [g if g is not None and joined[g] >= min_joined else f"leaf_{i:05d}" for i, g in enumerate(groups)]


def _sharding(x):
    return getattr(jax.typeof(x) if isinstance(x, jax.core.Tracer) else x, "sharding", None)


def _join(call: str, tree: Any, groups: list[str]) -> dict[str, jax.Array]:
    """The buffers of ``tree``'s leaves: each joined group flattened and concatenated in order, each larger leaf
    as it is."""
    by_group, joined = {}, {}
    for x, name in zip(jax.tree.leaves(tree), groups):  # (one pass: a scan per group was quadratic in the leaves)
        by_group.setdefault(name, []).append(x)
    for name in sorted(by_group):
        members = by_group[name]
        if name.startswith("leaf_"):
            joined[name] = members[0]
            continue
        for x in members:
            sharding = _sharding(x)
            if isinstance(sharding, NamedSharding) and not sharding.is_fully_replicated:
                raise ValueError(f"{call}: a leaf of {jnp.size(x)} elements is split over the devices of a mesh "
                                 f"({sharding.spec}); joining it with the other small leaves would gather it. Keep "
                                 "split leaves out of the join (max_join_size below their size) or leave flat_state "
                                 "out")
        parts = [jnp.ravel(x) for x in members]
        joined[name] = parts[0] if len(parts) == 1 else jnp.concatenate(parts)
    return joined


def from_flat(buffers: dict[str, jax.Array], like: PyTree) -> PyTree:
    """A field of a :func:`flat_state` pipeline's state, shaped like the params again.

    Args:
        buffers: the field, a dict of buffers, e.g.
            ``opt.get_state(state, "flat_state/scale_by_adam.mu")``. No default.
        like: the params the state was made for (their structure, shapes and
            dtypes; arrays or ``jax.ShapeDtypeStruct``). No default.

    Returns:
        A tree shaped like ``like``, each leaf in its buffer's dtype.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_adam().scale(-0.1).flat_state(min_joined=2)
        >>> params = {"b": jnp.zeros(2), "w": jnp.zeros((2, 2))}
        >>> _, state = opt.update({"b": jnp.ones(2), "w": jnp.ones((2, 2))}, opt.init(params), params)
        >>> opt.get_state(state, "flat_state/scale_by_adam.mu")["float32"].shape
        (6,)
        >>> ux.from_flat(opt.get_state(state, "flat_state/scale_by_adam.mu"), params)["w"]
        Array([[0.1, 0.1],
               [0.1, 0.1]], dtype=float32)
    """
    if not isinstance(buffers, dict):
        raise TypeError(f"from_flat: buffers must be the dict of buffers of a flat_state field, got "
                        f"{type(buffers).__name__}")
    leaves = jax.tree.leaves(like)
    groups = [f"leaf_{i:05d}" if f"leaf_{i:05d}" in buffers else jnp.result_type(x).name
              for i, x in enumerate(leaves)]
    if set(groups) != set(buffers):
        raise ValueError(f"from_flat: the buffers {sorted(buffers)} are not those of these params "
                         f"({sorted(set(groups))}); pass the params the state was made for")
    sizes = Counter()
    for x, group in zip(leaves, groups):
        if not group.startswith("leaf_"):
            sizes[group] += math.prod(jnp.shape(x))
        elif buffers[group].shape != jnp.shape(x):
            raise ValueError(f"from_flat: {group} has shape {buffers[group].shape}, its param {jnp.shape(x)}")
    for group, size in sizes.items():
        buffer = buffers[group]
        if buffer.ndim != 1 or buffer.size < size:
            raise ValueError(f"from_flat: the {group} buffer has shape {buffer.shape}, too small for the params' "
                             f"{group} leaves")
        if buffer.size != size:
            raise ValueError(f"from_flat: the {group} buffer has {buffer.size} elements, the params' {group} "
                             f"leaves {size}")
    return _split(buffers, like, groups, cast=False)


def _split(flat: dict[str, jax.Array], like: Any, groups: list[str], *, cast: bool = True) -> Any:
    """The buffers split back into ``like``'s leaves (their shapes; their dtypes too if ``cast``)."""
    leaves, treedef = jax.tree.flatten(like)
    offsets, out = dict.fromkeys(flat, 0), []
    for x, group in zip(leaves, groups):
        shape = jnp.shape(x)
        if group.startswith("leaf_"):
            leaf = flat[group]
        else:
            start, size = offsets[group], math.prod(shape)
            leaf, offsets[group] = flat[group][start:start + size].reshape(shape), start + size
        out.append(_tree.cast(leaf, x.dtype) if cast else leaf)
    return treedef.unflatten(out)


def _init_flat_state(params, *, inner, max_join_size, max_shared, min_joined):
    _check_elementwise(inner)
    groups = _groups(params, max_join_size, max_shared, min_joined)
    return FlatState(inner=inner.init(_join("flat_state", params, groups)))


def _apply_flat_state(updates, state, params, *, inner, max_join_size, max_shared, min_joined, **extra):
    _check_elementwise(inner)  # (also here: a pipeline composed before flat_state() is checked only now)
    # The groups follow the params (the state was made for them), else the updates; a group's updates are
    # joined in their common dtype and split back into each leaf's own.
    needing = [stage.label for stage in inner.stages if stage.reads_params()]
    if params is None and needing and jax.tree.leaves(updates):
        raise ValueError(f"flat_state needs params ({needing[0]} reads them), but update() got none: call "
                         "update(updates, state, params)")
    groups = _groups(updates if params is None else params, max_join_size, max_shared, min_joined)
    joined = _join("flat_state", updates, groups)
    # The params are joined only for a stage that reads them (with no leaves, the same empty dict).
    flat_params = (_join("flat_state", params, groups) if params is not None else {}) if needing else None
    flat, inner_state = inner.update(joined, state.inner, flat_params, **extra)
    return _split(flat, updates, groups), FlatState(inner=inner_state)


def _check_elementwise(inner: Update) -> None:
    for stage in inner.stages:
        if not stage.elementwise:
            raise ValueError(f"flat_state: {stage.label} is not elementwise (its rule reads the leaves one by one: "
                             "their shapes, a norm or a key per leaf, a mask), so it cannot run on the leaves joined "
                             "into one buffer; only stages declared elementwise can (see stateless(elementwise=...))")
        mask = dict(stage.options).get("mask")
        if mask is not None:
            raise ValueError(f"flat_state: {stage.label} has a mask, which selects leaves; joined, there are no "
                             "leaves to select. Mask outside flat_state, or leave the mask out")


def _none_or_positive(call, name, value):
    return None if value is None else _POSITIVE_INT.check(call, name, value)


_POSITIVE_INT = Integer(1)

#: What flat_state's options hold (the sizes only choose which leaves are joined: they size no state or loop).
_FLAT_DOMAINS = dict(inner=Pipeline(), max_join_size=Integer(0), min_joined=_POSITIVE_INT,
                     max_shared=Valid(rule=_none_or_positive, text="must be None or a positive integer",
                                      values=_POSITIVE_INT))


@combinator(wraps=True)
def flat_state(inner: Update, max_join_size: int = 2**15, max_shared: int | None = 8,
               min_joined: int = 16) -> Update:
    """The pipeline before it, run on its small leaves joined into one buffer per dtype (state too).

    Every stage before it must be elementwise (each element of its output
    computed from the same element of its inputs and state, and from
    scalars): the Adam family, RMSProp, AdaGrad, momentum, Lion, sign,
    clipping by value or by global norm, unmasked weight decay, the
    learning rate. The updates it returns are the same as the pipeline's,
    up to rounding where XLA fuses the joined arithmetic differently (and
    global norms, summed in another order).

    What it changes is how XLA compiles the step: a kernel per state field
    instead of one per field and leaf, for the leaves it joins. On a model
    of many small leaves of distinct shapes the kernels per leaf are most
    of the step and compile time (a thousand leaves, Adam: a third off the
    step and nearly half off the compile, see docs/performance.md). It
    joins a leaf of at most ``max_join_size`` elements whose shape and
    dtype at most ``max_shared`` leaves have, when at least ``min_joined``
    leaves of its dtype qualify; any other leaf keeps a buffer of its own,
    as without it. Joining costs a copy of the joined leaves' gradients per
    step, which is why large leaves stay apart; and XLA compiles a kernel
    once for all the leaves of one shape, where a joined leaf's param update
    is a kernel of its own (it reads its slice of the joined update), so
    leaves of a shape many share (the layers of a deep model) compile faster
    apart, and a handful of small leaves is not worth the join (a model's
    few layer-norm scales: more compile time, no faster step). Joined leaves
    must not be sharded over several devices (they would be gathered): that
    is refused by name.

    Named state access reaches the fields as dicts of buffers, one per dtype
    for the joined leaves and ``leaf_<index>`` for each larger leaf
    (``opt.get_state(state, "flat_state/scale_by_adam.mu")``);
    :func:`from_flat` shapes one like the params.

    Args:
        max_join_size: leaves of at most this many elements may be joined,
            an integer >= 0 (0: only empty leaves). Default: ``32768``.
        max_shared: a leaf may be joined when at most this many leaves
            (itself included) have its shape and dtype, an integer >= 1;
            None joins them whatever their shapes. Default: ``8``.
        min_joined: a dtype's qualifying leaves are joined only when there
            are at least this many, an integer >= 1 (1: whenever one
            qualifies). Default: ``16``.

    Returns:
        An update object with state ``FlatState(inner)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.optimizers.adam(0.1).flat_state(min_joined=2)  # (a tree of two leaves)
        >>> opt
        scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=1e-15) |> scale_by_learning_rate(learning_rate=0.1) |> flat_state(max_join_size=32768, max_shared=8, min_joined=2)
        >>> params = {"b": jnp.zeros(2), "w": jnp.ones((2, 3))}
        >>> grads = {"b": jnp.array([1.0, -1.0]), "w": jnp.full((2, 3), 2.0)}
        >>> updates, state = opt.update(grads, opt.init(params), params)
        >>> updates["b"], updates["w"][0]
        (Array([-0.1,  0.1], dtype=float32), Array([-0.1, -0.1, -0.1], dtype=float32))
        >>> opt.get_state(state, "flat_state/scale_by_adam.nu")["float32"].shape  # 2 + 6 elements
        (8,)

    References:
        The kernel count behind it: docs/performance-xla.md, "What XLA on a CPU allows".
    """
    _check_elementwise(inner)
    options = dict(inner=inner, max_join_size=max_join_size, max_shared=max_shared, min_joined=min_joined)
    return stateful(_init_flat_state, _apply_flat_state, name="flat_state", options=options,
                    domains={k: _FLAT_DOMAINS[k] for k in options}, wraps="inner",
                    static=("max_join_size", "max_shared", "min_joined"))
