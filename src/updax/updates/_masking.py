"""Masking and parameter groups: run pipelines on some leaves only."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax

from updax import _tree
from updax._combinators import combinator
from updax._primitives import stateful, stateless
from updax._typing import PyTree
from updax._update import Update


def _is_function(labels) -> bool:
    """A plain function of params, not a callable pytree such as an Equinox module."""
    return callable(labels) and jax.tree.leaves(labels) == [labels]


def _resolve(call, spec, params, what):
    """The mask or labels for ``params``, shaped like ``params``.

    A mask or labels tree may be a prefix of the params (``{"encoder": False, "decoder": True}`` for nested
    params): each entry applies to its whole subtree, as in optax. Inside another ``masked`` or ``partition``
    the leaves left out are None, so a mask written for the whole params still applies there: entries over
    None are dropped.
    """
    tree = spec(params) if _is_function(spec) else spec
    if jax.tree.structure(tree) != jax.tree.structure(params):
        try:
            tree = jax.tree.map(lambda entry, sub: jax.tree.map(lambda p: entry, sub), tree, params,
                                is_leaf=lambda x: x is None)
        except (ValueError, TypeError):
            pass  # not a prefix: the check below names the first differing path
    _tree.check_same_structure(call, params, tree, "params", what)
    return tree


def leafwise(call, fn, mask, updates, params, other=None):
    """``fn(u, x)`` on each leaf the mask selects (all of them when ``mask`` is None), with ``x`` the leaf of
    ``other`` (by default the params); the others pass unchanged. A mask function is called on the params."""
    other = params if other is None else other
    if mask is None:
        return _tree.tree_map(call, fn, updates, other, names=("updates", "params"))
    mask = _resolve(call, mask, updates if params is None else params, "mask")
    _tree.check_same_structure(call, mask, updates, "mask", "updates")
    _tree.check_same_structure(call, updates, other, "updates", "params")
    return jax.tree.map(lambda m, u, x: fn(u, x) if m else u, mask, updates, other)


def leaf_mask(call, mask, params):
    """Per leaf of ``params`` (in flattening order): whether ``mask`` selects it (every leaf when it is None).
    For a kernel that loops over the leaves itself; ``mask`` as in :func:`leafwise`."""
    treedef = jax.tree.structure(params)
    if mask is None:
        return [True] * treedef.num_leaves
    return [bool(m) for m in treedef.flatten_up_to(_resolve(call, mask, params, "mask"))]


def _select(tree, labels, keep):
    """``tree`` with the leaves whose label fails ``keep`` replaced by None (an empty subtree: no state)."""
    return jax.tree.map(lambda x, label: x if keep(label) else None, tree, labels)


def _merge(labels, pick):
    return jax.tree.map(lambda label: pick(label), labels)


class PartitionState(NamedTuple):
    """Each group's pipeline state, by label, holding state for that group's leaves only."""

    inner: dict


def _init_partition(params, *, transforms, labels):
    labels = _resolve("partition", labels, params, "labels")
    return PartitionState(inner={name: opt.init(_select(params, labels, lambda label, n=name: label == n))
                                 for name, opt in transforms.items()})


def _apply_partition(updates, state, params, *, transforms, labels, **extra):
    labels = _resolve("partition", labels, updates if params is None else params, "labels")
    _tree.check_same_structure("partition", labels, updates, "labels", "updates")
    unknown = sorted({str(label) for label in jax.tree.leaves(labels)} - set(transforms))
    if unknown:
        raise ValueError(f"partition: labels {unknown} have no pipeline (pipelines: {sorted(transforms)})")
    outs, inner = {}, {}
    leaves_labels, treedef = jax.tree.flatten(labels)
    for name, opt in transforms.items():
        keep = (lambda label, n=name: label == n)
        sub_params = None if params is None else _select(params, labels, keep)
        out, inner[name] = opt.update(_select(updates, labels, keep), state.inner[name], sub_params, **extra)
        outs[name] = treedef.flatten_up_to(jax.tree.map(lambda x, label: x, out, labels,
                                                        is_leaf=lambda x: x is None))
    merged = [outs[label][i] for i, label in enumerate(leaves_labels)]
    return treedef.unflatten(merged), PartitionState(inner=inner)


@combinator
def partition(transforms: dict[str, Update], labels: PyTree | Callable[[PyTree], PyTree]) -> Update:
    """Runs a different pipeline on each group of leaves.

    ``labels`` gives each leaf of the params a group label (a pytree of
    labels, or a function ``params -> labels``); each pipeline in
    ``transforms`` sees only its group's leaves, the others replaced by None,
    so it stores no state for them.

    Args:
        transforms: a dict ``{label: update object}``. No default.
        labels: a pytree of labels shaped like the params, or a function of
            the params returning one (an Equinox module is a pytree, not a
            function). No default.

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
    if not isinstance(transforms, dict) or not all(isinstance(t, Update) for t in transforms.values()):
        raise TypeError(f"partition(transforms={transforms!r}): transforms must be a dict of update objects")
    return stateful(_init_partition, _apply_partition, name="partition",
                    options=dict(transforms=transforms, labels=labels))


class MaskedState(NamedTuple):
    """The wrapped pipeline's state, for the masked-in leaves only."""

    inner: tuple


def _init_masked(params, *, inner, mask):
    mask = _resolve("masked", mask, params, "mask")
    return MaskedState(inner=inner.init(_select(params, mask, bool)))


def _apply_masked(updates, state, params, *, inner, mask, **extra):
    mask = _resolve("masked", mask, updates if params is None else params, "mask")
    _tree.check_same_structure("masked", mask, updates, "mask", "updates")
    sub_params = None if params is None else _select(params, mask, bool)
    out, inner_state = inner.update(_select(updates, mask, bool), state.inner, sub_params, **extra)
    out_leaves = jax.tree.structure(mask).flatten_up_to(jax.tree.map(lambda x, m: x, out, mask,
                                                                      is_leaf=lambda x: x is None))
    merged = [o if m else u for o, u, m in zip(out_leaves, jax.tree.structure(mask).flatten_up_to(updates),
                                               jax.tree.leaves(mask))]
    return jax.tree.structure(mask).unflatten(merged), MaskedState(inner=inner_state)


@combinator(wraps=True)
def masked(inner: Update, mask: PyTree | Callable[[PyTree], PyTree]) -> Update:
    """Runs the pipeline before it on the masked-in leaves only; the others pass through unchanged.

    Args:
        mask: a pytree of bools shaped like the params, or a function of the
            params returning one. No default.

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
    return stateful(_init_masked, _apply_masked, name="masked", options=dict(inner=inner, mask=mask), wraps="inner")


def _apply_freeze(updates, params, *, mask):
    mask = _resolve("freeze", mask, updates if params is None else params, "mask")
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
    return stateless(_apply_freeze, name="freeze", options=dict(mask=mask))
