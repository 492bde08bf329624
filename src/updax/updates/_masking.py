"""Masking and parameter groups: run pipelines on some leaves only."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax

from updax import _tree
from updax._combinators import combinator
from updax._domains import Pipeline, Pipelines
from updax._masks import Labels, Mask, resolve_labels, resolve_mask, select
from updax._primitives import stateful, stateless
from updax._typing import PyTree
from updax._update import Update


def leafwise(call, fn, mask, updates, params, other=None):
    """``fn(u, x)`` on each leaf the mask selects (all of them when ``mask`` is None), with ``x`` the leaf of
    ``other`` (by default the params); the others pass unchanged. A mask function is called on the params
    (:func:`updax._masks.resolve_mask`)."""
    other = params if other is None else other
    if mask is None:
        return _tree.tree_map(call, fn, updates, other, names=("updates", "params"))
    mask = resolve_mask(call, mask, updates if params is None else params)
    _tree.check_same_structure(call, mask, updates, "mask", "updates")
    _tree.check_same_structure(call, updates, other, "updates", "params")
    return jax.tree.map(lambda m, u, x: fn(u, x) if m else u, mask, updates, other)


class PartitionState(NamedTuple):
    """Each group's pipeline state, by label, holding state for that group's leaves only."""

    inner: dict


def _in_group(name):
    """Whether a leaf's label is ``name``: the one way labels match groups, as a dict's keys do."""
    return lambda label: label == name and hash(label) == hash(name)


def _init_partition(params, *, transforms, labels):
    labels = resolve_labels("partition", labels, params, transforms)
    return PartitionState(inner={name: opt.init(select(params, _in_group(name), labels))
                                 for name, opt in transforms.items()})


def _apply_partition(updates, state, params, *, transforms, labels, **extra):
    labels = resolve_labels("partition", labels, updates if params is None else params, transforms)
    _tree.check_same_structure("partition", labels, updates, "labels", "updates")
    outs, inner = {}, {}
    leaves_labels, treedef = jax.tree.flatten(labels)
    for name, opt in transforms.items():
        keep = _in_group(name)
        sub_params = None if params is None else select(params, keep, labels)
        out, inner[name] = opt.update(select(updates, keep, labels), state.inner[name], sub_params, **extra)
        outs[name] = treedef.flatten_up_to(jax.tree.map(lambda x, label: x, out, labels,
                                                        is_leaf=lambda x: x is None))
    merged = [outs[next(n for n in transforms if _in_group(n)(label))][i] for i, label in enumerate(leaves_labels)]
    return treedef.unflatten(merged), PartitionState(inner=inner)


@combinator
def partition(transforms: dict[str, Update], labels: PyTree | Callable[[PyTree], PyTree]) -> Update:
    """Runs a different pipeline on each group of leaves.

    ``labels`` gives each leaf of the params a group label (a pytree of
    labels, or a function ``params -> labels``); each pipeline in
    ``transforms`` sees only its group's leaves, the others replaced by None,
    so it stores no state for them. A label is any hashable value, matched
    to a key of ``transforms`` as dict keys are (``1`` and ``"1"`` differ);
    a label with no pipeline is refused by name. Read a group's state or
    held hyperparameters by path: ``"partition/adam/scale_by_adam.mu"``.

    Args:
        transforms: a dict ``{label: update object}``, its labels of one
            kind (JAX sorts a dict's keys). No default.
        labels: a pytree of labels shaped like the params (or a prefix of
            it), or a function of the params returning one (an Equinox module
            is a pytree, not a function), computed from the params' structure
            and shapes (see docs/errors.md, "Masks and labels"). No default.

    Returns:
        An update object with state ``PartitionState(inner)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.partition({"train": ux.scale(-0.1), "frozen": ux.scale(0.0)},
        ...                    {"w": "train", "b": "frozen"})
        >>> g = {"w": jnp.ones(1), "b": jnp.ones(1)}
        >>> opt.update(g, opt.init(g))[0]
        {'b': Array([0.], dtype=float32), 'w': Array([-0.1], dtype=float32)}

    References:
        optax.partition (multi_transform).
    """
    return stateful(_init_partition, _apply_partition, name="partition",
                    options=dict(transforms=transforms, labels=labels),
                    domains=dict(transforms=Pipelines(field="inner"), labels=Labels()))


class MaskedState(NamedTuple):
    """The wrapped pipeline's state, for the masked-in leaves only."""

    inner: tuple


def _init_masked(params, *, inner, mask):
    mask = resolve_mask("masked", mask, params)
    return MaskedState(inner=inner.init(select(params, bool, mask)))


def _apply_masked(updates, state, params, *, inner, mask, **extra):
    mask = resolve_mask("masked", mask, updates if params is None else params)
    _tree.check_same_structure("masked", mask, updates, "mask", "updates")
    sub_params = None if params is None else select(params, bool, mask)
    out, inner_state = inner.update(select(updates, bool, mask), state.inner, sub_params, **extra)
    out_leaves = jax.tree.structure(mask).flatten_up_to(jax.tree.map(lambda x, m: x, out, mask,
                                                                      is_leaf=lambda x: x is None))
    merged = [o if m else u for o, u, m in zip(out_leaves, jax.tree.structure(mask).flatten_up_to(updates),
                                               jax.tree.leaves(mask))]
    return jax.tree.structure(mask).unflatten(merged), MaskedState(inner=inner_state)


@combinator(wraps=True)
def masked(inner: Update, mask: PyTree | Callable[[PyTree], PyTree]) -> Update:
    """Runs the pipeline before it on the masked-in leaves only; the others pass through unchanged.

    Args:
        mask: a pytree of bools shaped like the params (or a prefix of it),
            or a function of the params returning one, computed from their
            structure and shapes (see docs/errors.md, "Masks and labels"). No default.

    Returns:
        An update object with state ``MaskedState(inner)`` (state only for
        masked-in leaves).

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.masked(ux.add_decayed_weights(0.5), {"w": True, "b": False})
        >>> params = {"w": jnp.ones(1), "b": jnp.ones(1)}
        >>> opt.update({"w": jnp.zeros(1), "b": jnp.zeros(1)}, opt.init(params), params)[0]
        {'b': Array([0.], dtype=float32), 'w': Array([0.5], dtype=float32)}

    References:
        optax.masked.
    """
    return stateful(_init_masked, _apply_masked, name="masked", options=dict(inner=inner, mask=mask), wraps="inner",
                    domains=dict(inner=Pipeline(), mask=Mask(optional=False)))


def _apply_freeze(updates, params, *, mask):
    mask = resolve_mask("freeze", mask, updates if params is None else params)
    _tree.check_same_structure("freeze", mask, updates, "mask", "updates")
    treedef = jax.tree.structure(mask)
    merged = [_tree.zeros_like(u) if m else u for u, m in zip(treedef.flatten_up_to(updates), jax.tree.leaves(mask))]
    return treedef.unflatten(merged)


@combinator
def freeze(mask: PyTree | Callable[[PyTree], PyTree]) -> Update:
    """Zeroes the updates of the masked-in (frozen) leaves; the others pass through unchanged.

    It stores no state. The stages before it still keep state for the frozen
    leaves; to avoid that, wrap them in ``masked`` with the opposite mask.

    Args:
        mask: a pytree of bools shaped like the params, True for the leaves
            to freeze, or a function of the params returning one. No default.

    Returns:
        A stateless update object.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale(-0.1).freeze({"w": False, "embedding": True})
        >>> g = {"w": jnp.ones(1), "embedding": jnp.ones(1)}
        >>> opt.update(g, opt.init(g))[0]
        {'embedding': Array([0.], dtype=float32), 'w': Array([-0.1], dtype=float32)}

    References:
        optax.transforms.freeze.
    """
    return stateless(_apply_freeze, name="freeze", options=dict(mask=mask), domains=dict(mask=Mask(optional=False)))


class SelectiveTransformState(NamedTuple):
    """The wrapped pipeline's state, for the trained (not frozen) leaves only."""

    inner: tuple


def _trained(call, freeze_mask, tree):
    """Per leaf of ``tree``, True where it is trained: the opposite of the freeze mask."""
    return jax.tree.map(lambda frozen: not frozen, resolve_mask(call, freeze_mask, tree))


def _init_selective_transform(params, *, inner, freeze_mask):
    return SelectiveTransformState(inner=inner.init(select(params, bool, _trained("selective_transform",
                                                                                   freeze_mask, params))))


def _apply_selective_transform(updates, state, params, *, inner, freeze_mask, **extra):
    call = "selective_transform"
    trained = _trained(call, freeze_mask, updates if params is None else params)
    _tree.check_same_structure(call, trained, updates, "freeze_mask", "updates")
    sub_params = None if params is None else select(params, bool, trained)
    out, inner_state = inner.update(select(updates, bool, trained), state.inner, sub_params, **extra)
    treedef = jax.tree.structure(trained)
    out_leaves = treedef.flatten_up_to(jax.tree.map(lambda x, m: x, out, trained, is_leaf=lambda x: x is None))
    merged = [o if m else _tree.zeros_like(u)
              for o, u, m in zip(out_leaves, treedef.flatten_up_to(updates), jax.tree.leaves(trained))]
    return treedef.unflatten(merged), SelectiveTransformState(inner=inner_state)


@combinator(wraps=True)
def selective_transform(inner: Update, freeze_mask: PyTree | Callable[[PyTree], PyTree]) -> Update:
    r"""Runs the pipeline before it on the trained leaves only and zeroes the updates of the frozen ones.

    Update rule, per leaf, with $m$ = ``freeze_mask``:
    $u = 0$ where $m$ is True (frozen), $u = \text{inner}(g)$ otherwise,
    with the wrapped pipeline holding state for the trained leaves only.
    It is ``masked`` with the opposite mask followed by ``freeze``, in one
    stage: the frozen leaves neither move nor cost state.

    Args:
        freeze_mask: True for the leaves to freeze: a bool (freeze all or
            none), a pytree of bools shaped like the params (or a prefix of
            it), or a function of the params returning one, computed from
            their structure and shapes (see docs/errors.md, "Masks and
            labels"). No default.

    Returns:
        An update object with state ``SelectiveTransformState(inner)``
        (state only for the trained leaves).

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_adam().scale(-0.1).selective_transform({"w": False, "embedding": True})
        >>> g = {"w": jnp.ones(1), "embedding": jnp.ones(1)}
        >>> state = opt.init(g)
        >>> opt.update(g, state)[0]
        {'embedding': Array([0.], dtype=float32), 'w': Array([-0.1], dtype=float32)}
        >>> opt.get_state(state, "selective_transform/scale_by_adam.mu")  # no state for the frozen leaf
        {'embedding': None, 'w': Array([0.], dtype=float32)}

    References:
        optax.transforms.selective_transform (same rule).
    """
    return stateful(_init_selective_transform, _apply_selective_transform, name="selective_transform",
                    options=dict(inner=inner, freeze_mask=freeze_mask), wraps="inner",
                    domains=dict(inner=Pipeline(), freeze_mask=Mask(optional=False)))
