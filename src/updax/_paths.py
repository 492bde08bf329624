"""The state-path language: a stage's state, a field of it or a hyperparameter, by name.

A path is ``"name"``, ``"name[k]"`` (the k-th stage of that name),
``"wrapper/inner_name"`` (into the pipeline a wrapper stage runs), and
optionally ``".field"`` at the end: a field of the stage's state or one of
its hyperparameters.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree
from updax._stage import ScheduledState, Stage

__all__ = ["get_state", "replace_state"]

_SELECTOR = re.compile(r"^(?P<name>[A-Za-z_][\w]*)(?:\[(?P<index>\d+)\])?$")


def _resolve(pipeline, path: str) -> tuple[list[tuple[int, str | None]], str | None, Stage]:
    """Turns ``"a/b[1].field"`` into ([(stage index, wrapped option or None)], field, last stage)."""
    if not isinstance(path, str) or not path:
        raise TypeError(f"a state path is a string like 'scale_by_adam.mu', got {path!r}")
    stages_part, _, field = path.partition(".")
    selectors = stages_part.split("/")
    steps, current, stage = [], pipeline, None
    for depth, selector in enumerate(selectors):
        match = _SELECTOR.match(selector)
        if not match:
            raise KeyError(f"bad stage selector {selector!r} in {path!r}: use 'name' or 'name[k]'")
        name, index = match["name"], match["index"]
        found = [i for i, s in enumerate(current.stages) if s.label == name]
        labels = [s.label for s in current.stages]
        if not found:
            raise KeyError(f"no stage named {name!r} in {current!r} (stages: {labels})")
        if index is None and len(found) > 1:
            choices = ", ".join(f"'{name}[{k}]'" for k in range(len(found)))
            raise KeyError(f"{len(found)} stages are named {name!r}; pick one with {choices}")
        if index is not None and int(index) >= len(found):
            raise KeyError(f"{path!r}: there are only {len(found)} stages named {name!r}")
        position = found[int(index or 0)]
        stage = current.stages[position]
        last = depth == len(selectors) - 1
        if not last and stage.wraps is None:
            raise KeyError(f"{path!r}: {selector} wraps no pipeline")
        steps.append((position, None if last else stage.wraps))
        if not last:
            current = stage.option(stage.wraps)
    return steps, field or None, stage


def _own(entry):
    return entry.state if isinstance(entry, ScheduledState) else entry


def _where(path: str, stage: Stage, entry, field: str) -> str:
    """Where ``field`` of a stage's state entry lives: 'state', 'scheduled' or 'option'."""
    own = _own(entry)
    if field in getattr(own, "_fields", ()):
        return "state"
    if isinstance(entry, ScheduledState) and field in entry.hyperparams:
        return "scheduled"
    options = [k for k, _ in stage.options if k != stage.wraps]
    if field in options:
        return "option"
    raise KeyError(f"{path!r}: the state {type(own).__name__} has no field {field!r} "
                   f"(fields: {list(getattr(own, '_fields', ()))}; options: {options})")


def _entry(pipeline, state, steps, call):
    node, current = state, pipeline
    for position, wrapped in steps:
        if not isinstance(node, (tuple, list)) or len(node) != len(current.stages):
            got = (f"a {type(node).__name__} of length {len(node)}" if isinstance(node, (tuple, list))
                   else _tree.describe(node))
            raise TypeError(f"{call}: expected the state of {current!r} (the tuple of {len(current.stages)} stage "
                            f"states its init() returns), got {got}")
        if wrapped is not None:
            current = current.stages[position].option(wrapped)
        node = node[position]
        if wrapped is not None:
            node = getattr(_own(node), wrapped)
    return node


def get_state(pipeline, state: Any, path: str) -> Any:
    """See :meth:`updax.Update.get_state`."""
    steps, field, stage = _resolve(pipeline, path)
    entry = _entry(pipeline, state, steps, f"get_state({path!r})")
    if field is None:
        return entry
    where = _where(path, stage, entry, field)
    if where == "state":
        return getattr(_own(entry), field)
    if where == "scheduled":
        return entry.hyperparams[field]
    return stage.option(field)


def replace_state(pipeline, state: Any, path: str, value: Any) -> Any:
    """See :meth:`updax.Update.replace_state`."""
    steps, field, stage = _resolve(pipeline, path)
    entry = _entry(pipeline, state, steps, f"replace_state({path!r})")
    where = "state" if field is None else _where(path, stage, entry, field)
    if where == "scheduled" and field not in stage.held:
        raise KeyError(f"replace_state({path!r}): {field} is a schedule, evaluated anew on every step; build the "
                       f"update object with another schedule instead")
    if where == "option":
        raise KeyError(f"replace_state({path!r}): {field} is a hyperparameter, not state; build the "
                       f"update object with the new value (or a schedule) instead, or keep the hyperparameters "
                       f"in the state with ux.hyperparams_in_state(opt)")
    value = _like(path, get_state(pipeline, state, path), value)

    def rebuild(node, depth):
        position, wrapped = steps[depth]
        child = node[position]
        if wrapped is not None or field is not None:
            own = _own(child)
            if wrapped is not None:
                own = own._replace(**{wrapped: rebuild(getattr(own, wrapped), depth + 1)})
            elif where == "scheduled":  # a held hyperparameter
                return tuple(node[:position]) + (child._replace(hyperparams={**child.hyperparams, field: value}),) \
                    + tuple(node[position + 1:])
            else:
                own = own._replace(**{field: value})
            child = child._replace(state=own) if isinstance(child, ScheduledState) else own
        else:
            child = value
        return tuple(node[:position]) + (child,) + tuple(node[position + 1:])

    return rebuild(state, 0)


def _like(path, old, value):
    """Casts ``value`` to the structure, shapes and dtypes of ``old``; refuses values the dtype cannot hold."""
    call = f"replace_state({path!r})"

    def cast(where, o, v):
        if not isinstance(o, (jax.Array, np.ndarray, np.generic)):
            return v
        leaf = f"the new value{jax.tree_util.keystr(where)}"
        if not isinstance(v, jax.core.Tracer):
            try:
                given = np.asarray(v)
            except (TypeError, ValueError):
                raise TypeError(f"{call}: {leaf} is {v!r}, not a number or an array") from None
            counter = "count" in jax.tree_util.keystr(where) or (not where and path.endswith("count"))
            _check_fits_dtype(call, leaf, given, o.dtype, counter)
        v = jnp.asarray(v, dtype=o.dtype)
        if v.shape != o.shape:
            raise ValueError(f"{call}: shape {v.shape} differs from the current {o.shape}")
        return v

    if isinstance(old, (jax.Array, np.ndarray, np.generic)):
        return cast((), old, value)
    _tree.check_same_structure(call, old, value, "the current state", "the new value")
    return jax.tree_util.tree_map_with_path(cast, old, value)


def _check_fits_dtype(call, leaf, value, dtype, counter):
    """Raises unless every element of ``value`` is exactly representable as ``dtype`` (no wrap, no truncation)."""
    dtype = jnp.dtype(dtype)
    if not (np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_):
        raise TypeError(f"{call}: {leaf} has dtype {value.dtype}, not a number")
    if np.issubdtype(value.dtype, np.complexfloating) and not jnp.issubdtype(dtype, jnp.complexfloating):
        raise TypeError(f"{call}: {leaf} is complex but the state holds {dtype.name}")
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        low = 0 if counter else info.min
        if np.issubdtype(value.dtype, np.floating) and not np.all(np.isfinite(value) & (value == np.round(value))):
            raise ValueError(f"{call}: {leaf} must hold whole numbers for the {dtype.name} state, got {value}")
        if value.size and (np.min(value) < low or np.max(value) > info.max):
            raise ValueError(f"{call}: {leaf} must be in [{low}, {info.max}] for the {dtype.name} state"
                             f"{' (a step counter)' if counter else ''}, got {value}")
