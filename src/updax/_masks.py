"""Masks and labels: the one validator for every ``mask=``, ``masked``, ``freeze`` and ``partition``.

A mask says which leaves a stage touches; labels say which group each leaf
belongs to. Both decide the *structure* of a step (which leaves get state,
which kernels run), so both are static: a mask's leaves are booleans
(Python's, NumPy's, or a 0-d boolean array, taken as the bool it holds), and
a label is any hashable value, matched to a group by ``==`` as a dict key is
(``1`` and ``"1"`` are different labels, as in optax). Either may be a
prefix of the params (``{"encoder": False}`` covers the whole encoder), or a
function of the params returning one, called on every step, whose result is
checked the same way.

Refused by name, with the call and the leaf's path:

- a leaf that is not a bool (the string ``"False"``, ``1``, ``0.5``): a
  mask is never guessed from truthiness;
- a boolean array with elements (a per-element mask): masks select whole
  leaves (a stage that touches some elements of a leaf is a stage of its
  own, e.g. ``jnp.where`` in a stateless kernel);
- a traced value: a mask or labels computed from the params' *values* under
  ``jax.jit`` cannot fix the step's structure. A mask function should read
  the params' structure and shapes (``p.ndim >= 2``, ``p.shape``), which are
  known while tracing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from updax import _tree
from updax._domains import Domain, fail

__all__ = ["Labels", "Mask", "is_function", "leaf_mask", "resolve_labels", "resolve_mask"]

_STRUCTURE_HINT = ("a mask decides which leaves a stage touches, so it must follow from the params' structure and "
                   "shapes (p.ndim, p.shape), which are known while jax.jit traces, not from their values")


def is_function(spec: Any) -> bool:
    """A plain function of the params, not a callable pytree such as an Equinox module."""
    return callable(spec) and jax.tree.leaves(spec) == [spec]


def _where(path) -> str:
    return jax.tree_util.keystr(path) or " (the root)"


def _bool(call: str, name: str, spec: Any, path, leaf: Any) -> bool:
    """A mask leaf as the Python bool it stands for, or an error naming the leaf."""
    if isinstance(leaf, (bool, np.bool_)):
        return bool(leaf)
    if isinstance(leaf, jax.core.Tracer):
        fail(call, name, spec, f"is traced at {name}{_where(path)}: {_STRUCTURE_HINT}", TypeError)
    if isinstance(leaf, (jax.Array, np.ndarray)) and leaf.dtype == np.bool_:
        if leaf.ndim == 0:
            return bool(leaf)
        fail(call, name, spec, f"has a boolean array of shape {leaf.shape} at {name}{_where(path)}: a mask selects "
             "whole leaves, one bool per leaf (per-element masks are not supported)", TypeError)
    fail(call, name, spec, f"must be a pytree of bools or a function of the params returning one; at "
         f"{name}{_where(path)} it has {type(leaf).__name__} {leaf!r}", TypeError)


def _bools(call: str, name: str, spec: Any) -> Any:
    """``spec`` with every leaf a Python bool (see :func:`_bool`)."""
    return jax.tree_util.tree_map_with_path(lambda path, leaf: _bool(call, name, spec, path, leaf), spec)


def _label(call: str, name: str, spec: Any, path, leaf: Any) -> Any:
    if isinstance(leaf, jax.core.Tracer):
        fail(call, name, spec, f"is traced at {name}{_where(path)}: labels decide which pipeline runs on each "
             "leaf, so they must follow from the params' structure and shapes, not their values", TypeError)
    if isinstance(leaf, (np.ndarray, jax.Array)) and leaf.ndim == 0:
        leaf = leaf.item()  # a 0-d array label is the number it holds
    try:
        hash(leaf)
    except TypeError:
        fail(call, name, spec, f"must have hashable labels; at {name}{_where(path)} it has "
             f"{type(leaf).__name__} {leaf!r}", TypeError)
    return leaf


def _labels(call: str, name: str, spec: Any) -> Any:
    return jax.tree_util.tree_map_with_path(lambda path, leaf: _label(call, name, spec, path, leaf), spec)


@dataclasses.dataclass(frozen=True)
class Mask(Domain):
    """A mask: a pytree of bools (a prefix of the params, or the params' shape), or a function of the params
    returning one; None (where ``optional``) selects every leaf."""

    optional: bool = True
    text: str = "must be a pytree of bools or a function of the params returning one"

    def check(self, call: str, name: str, value: Any, *, schedulable: bool = False) -> Any:
        if value is None:
            if self.optional:
                return None
            fail(call, name, value, self.text, TypeError)
        if is_function(value):
            return value
        return _bools(call, name, value)


@dataclasses.dataclass(frozen=True)
class Labels(Domain):
    """Labels: a pytree of hashable labels (a prefix of the params, or the params' shape), or a function of
    the params returning one."""

    text: str = "must be a pytree of labels or a function of the params returning one"

    def check(self, call: str, name: str, value: Any, *, schedulable: bool = False) -> Any:
        if value is None:
            fail(call, name, value, self.text, TypeError)
        if is_function(value):
            return value
        return _labels(call, name, value)


def _broadcast(call: str, tree: Any, params: Any, what: str) -> Any:
    """``tree`` shaped like ``params``: a prefix's entries cover their whole subtrees, as in optax. Inside another
    ``masked`` or ``partition`` the leaves left out are None, so a mask written for the whole params still
    applies there: entries over None are dropped."""
    if jax.tree.structure(tree) != jax.tree.structure(params):
        try:
            tree = jax.tree.map(lambda entry, sub: jax.tree.map(lambda p: entry, sub), tree, params,
                                is_leaf=lambda x: x is None)
        except (ValueError, TypeError):
            pass  # not a prefix: the check below names the first differing path
    _tree.check_same_structure(call, params, tree, "params", what)
    return tree


def resolve_mask(call: str, mask: Any, params: Any, name: str = "mask") -> Any:
    """``mask`` for ``params``: a tree of Python bools shaped like ``params`` (all True for None). A mask
    function is called on ``params`` and its result checked as a mask given directly is."""
    if mask is None:
        return jax.tree.map(lambda _: True, params)
    if is_function(mask):
        mask = _bools(call, f"{name}(params)", mask(params))
    return _broadcast(call, mask, params, name)


def leaf_mask(call: str, mask: Any, params: Any) -> list[bool]:
    """Per leaf of ``params`` (in flattening order): whether ``mask`` selects it."""
    return jax.tree.leaves(resolve_mask(call, mask, params))


def resolve_labels(call: str, labels: Any, params: Any, groups: Mapping[Any, Any], name: str = "labels") -> Any:
    """``labels`` for ``params``: a tree of labels shaped like ``params``, each a key of ``groups``."""
    if is_function(labels):
        labels = _labels(call, f"{name}(params)", labels(params))
    labels = _broadcast(call, labels, params, name)
    unknown = []
    for path, label in jax.tree_util.tree_flatten_with_path(labels)[0]:
        if label not in groups and label not in unknown:
            unknown.append(label)
            where = jax.tree_util.keystr(path)
    if unknown:
        raise ValueError(f"{call}: {name}{where} is {unknown[0]!r}, which names no pipeline (labels are matched to "
                         f"the transforms' keys by ==, as dict keys are; keys: {sorted(map(repr, groups))})")
    return labels


def select(tree: Any, keep: Callable[[Any], bool], labels: Any) -> Any:
    """``tree`` with the leaves whose label fails ``keep`` replaced by None (an empty subtree: no state)."""
    return jax.tree.map(lambda x, label: x if keep(label) else None, tree, labels)
