"""Options: which are pytree leaves, how they are copied, compared, hashed and printed.

An option's printed form is its identity: two option values print the same
exactly when they compare equal (and then a kernel computes the same numbers
from them). So the key an option is compared by carries the type of a Python
number (``1`` and ``1.0`` differ, as do ``0.0`` and ``-0.0``), an array's
dtype and shape, and a function's identity; and the printed form shows each
of these.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import numbers
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Frozen", "canonical", "format_value", "function_name", "is_dynamic", "is_number", "key_of", "keywords"]

#: Arrays up to this many elements print their values; larger ones print a digest of them.
_SHOWN_ELEMENTS = 16


def is_number(value: Any) -> bool:
    """A number or an array (not a bool): a pytree leaf of a hyperparameter."""
    return not isinstance(value, bool) and isinstance(value, (numbers.Number, np.ndarray, np.generic, jax.Array))


def is_dynamic(value: Any) -> bool:
    """Numbers and arrays are leaves, and so is any pytree node whose leaves are all numbers
    (a nested pipeline, a schedule object); the rest (flags, dtypes, functions) is structure."""
    if is_number(value):
        return True
    if isinstance(value, bool) or value is None:
        return False
    leaves, treedef = jax.tree.flatten(value)
    return treedef.num_nodes > 1 and all(is_number(leaf) for leaf in leaves)


def _is_array(value: Any) -> bool:
    return isinstance(value, (np.ndarray, np.generic, jax.Array))


def _is_key(value: Any) -> bool:
    return isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jax.dtypes.prng_key)


def canonical(value: Any) -> Any:
    """A copy of an option that the caller can no longer change: the object keeps it, not a reference.

    NumPy arrays become read-only copies; containers (dicts, lists, tuples and
    any other pytree node) are rebuilt, dicts in sorted key order as JAX
    flattens them. Scalars, JAX arrays, functions and other hashable values are
    immutable already and kept as they are.
    """
    if isinstance(value, jax.core.Tracer) or value is None:
        return value
    if isinstance(value, np.ndarray):
        copy = np.array(value, copy=True)
        copy.flags.writeable = False
        return copy
    if _is_array(value) or isinstance(value, (numbers.Number, str, bytes, type)):
        return value
    leaves, treedef = jax.tree.flatten(value)
    if treedef.num_nodes == 1 and treedef.num_leaves == 1:
        return value  # a leaf that is not a container (a function, a flag object)
    return treedef.unflatten([canonical(leaf) for leaf in leaves])


def key_of(value: Any) -> Any:
    """The hashable key an option is compared by: equal keys mean the same option for every kernel."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError("an update object holding traced values cannot be hashed or compared")
    if _is_key(value):
        data = np.asarray(jax.random.key_data(value))
        return ("key", str(jax.random.key_impl(value)), data.shape, data.tobytes())
    if _is_array(value):
        array = np.asarray(value)
        return ("array", array.dtype.str, array.shape, array.tobytes())
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", value.hex())  # tells 0.0 from -0.0, and nan equals nan
    if isinstance(value, complex):
        return ("complex", value.real.hex(), value.imag.hex())
    if is_dynamic(value):
        leaves, treedef = jax.tree.flatten(value)
        return ("tree", treedef, tuple(key_of(leaf) for leaf in leaves))
    return value


class Frozen:
    """A static pytree option (a dict of labels, a list of bools), copied and made hashable; kernels get ``.tree``."""

    __slots__ = ("tree", "_key")

    def __init__(self, tree: Any):
        tree = canonical(tree)
        leaves, treedef = jax.tree.flatten(tree)
        object.__setattr__(self, "tree", tree)
        object.__setattr__(self, "_key", (treedef, tuple(key_of(leaf) for leaf in leaves)))
        hash(self._key)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("update objects are immutable")

    def __eq__(self, other: object) -> bool:
        return type(other) is Frozen and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Frozen, (self.tree,))

    def __repr__(self) -> str:
        return format_value(self.tree)


# --------------------------------------------------------------------------
# Printing


def function_name(fn: Any) -> str | None:
    """How a function prints: the import path where it is found under it, its bare name where it is
    defined at top level of a script or a doctest, else None (a lambda, a closure)."""
    qualname, module = getattr(fn, "__qualname__", None), getattr(fn, "__module__", None)
    if not isinstance(qualname, str) or "<" in qualname:
        return None

    def found(namespace_get) -> bool:
        head, *rest = qualname.split(".")
        obj = namespace_get(head)
        for part in rest:
            obj = getattr(obj, part, None)
        return obj is fn

    loaded = sys.modules.get(module) if isinstance(module, str) else None
    if loaded is not None and module != "__main__" and found(lambda name: getattr(loaded, name, None)):
        return f"{module}.{qualname}"
    namespace = getattr(fn, "__globals__", None)
    if isinstance(namespace, dict) and found(namespace.get):
        return qualname
    return None


def _format_array(value: Any) -> str:
    array = np.asarray(value)
    if array.size <= _SHOWN_ELEMENTS:
        shown = np.array2string(array, separator=", ")
        return f"array({shown}, dtype={array.dtype.name})"
    digest = hashlib.blake2b(array.tobytes(), digest_size=6).hexdigest()
    return f"array(shape={array.shape}, dtype={array.dtype.name}, digest={digest})"


class _Shown:
    """A leaf standing in for its printed form inside a container's repr."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def format_value(value: Any) -> str:
    """An option as the repr of an update object shows it (see the module docstring)."""
    if isinstance(value, jax.core.Tracer):
        return repr(value)
    if _is_key(value):
        return f"key({np.asarray(jax.random.key_data(value)).tolist()})"
    if _is_array(value):
        return _format_array(value)
    if value is None or isinstance(value, (numbers.Number, str, bytes)):
        return repr(value)
    if callable(value) and hasattr(value, "__qualname__"):  # a function or a class
        name = function_name(value)
        return repr(value) if name is None else name  # <function f.<locals>.g at 0x...>: its identity
    if isinstance(value, (dict, list, tuple)):
        leaves, treedef = jax.tree.flatten(value)
        return repr(treedef.unflatten([_Shown(format_value(leaf)) for leaf in leaves]))
    return repr(value)  # update objects, schedules and other values print themselves


# --------------------------------------------------------------------------
# Kernels take the options their signature names


@functools.lru_cache(maxsize=None)
def keywords(fn: Any) -> frozenset[str] | None:
    """The option names ``fn`` takes as keywords; None when it takes ``**kwargs``."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return frozenset(p.name for p in parameters if p.kind in kinds)
