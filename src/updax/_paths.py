"""The state-path language: a stage's state, a field of it or a hyperparameter, by name.

A path is ``"name"``, ``"name[k]"`` (the k-th stage of that name),
``"wrapper/inner_name"`` (into the pipeline a wrapper stage runs),
``"partition/label/inner_name"`` (into the pipeline of one group), and
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
from updax._domains import field_domain, fits_dtype, is_concrete, message
from updax._options import keywords
from updax._stage import ScheduledState, Stage

__all__ = ["get_state", "replace_state"]

_SELECTOR = re.compile(r"^(?P<name>[A-Za-z_][\w]*)(?:\[(?P<index>\d+)\])?$")


def _group(stage: Stage, selector: str, path: str) -> Any:
    """The key of the pipeline ``selector`` names among those ``stage`` runs inside it (a group label, as the
    label prints with ``str``), or None for a wrapper's one pipeline."""
    nested = stage.nested()
    if not nested:
        raise KeyError(f"{path!r}: {stage.label} runs no pipeline inside it")
    if None in nested:
        return None
    for label in nested:
        if str(label) == selector:
            return label
    raise KeyError(f"{path!r}: {stage.label} has no group {selector!r} (groups: {[str(k) for k in nested]})")


def _resolve(pipeline, path: str) -> tuple[list[tuple[int, tuple | None]], str | None, Stage]:
    """Turns ``"a/b[1].field"`` into ``([(stage index, (state field, group key) or None)], field, last stage)``:
    after a wrapper the next selector names a stage of the pipeline it wraps; after a stage that runs groups
    (``partition``) it names a group by its label, then a stage of that group's pipeline
    (``"partition/adam/scale_by_adam.mu"``)."""
    if not isinstance(path, str) or not path:
        raise TypeError(f"a state path is a string like 'scale_by_adam.mu', got {path!r}")
    stages_part, _, field = path.partition(".")
    selectors = stages_part.split("/")
    steps, current, stage, depth = [], pipeline, None, 0
    while depth < len(selectors):
        selector = selectors[depth]
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
        depth += 1
        if depth == len(selectors):
            steps.append((position, None))
            break
        key = _group(stage, selectors[depth], path)
        if key is not None:
            depth += 1  # the selector was the group's label
            if depth == len(selectors):
                raise KeyError(f"{path!r}: name a stage of group {key!r} after it ('.../{key}/<stage>')")
        state_field, current = stage.nested()[key]
        steps.append((position, (state_field, key)))
    return steps, field or None, stage


def _inside(node: Any, via: tuple) -> Any:
    """The state of a nested pipeline: the wrapper's field, or the group's entry of it."""
    state_field, key = via
    node = getattr(_own(node), state_field)
    return node if key is None else node[key]


def _with_inside(node: Any, via: tuple, value: Any) -> Any:
    """``node`` (a stage's state entry) with the nested pipeline's state at ``via`` replaced by ``value``."""
    state_field, key = via
    own = _own(node)
    if key is not None:
        value = {**getattr(own, state_field), key: value}
    own = own._replace(**{state_field: value})
    return node._replace(state=own) if isinstance(node, ScheduledState) else own


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
    for position, via in steps:
        if not isinstance(node, (tuple, list)) or len(node) != len(current.stages):
            got = (f"a {type(node).__name__} of length {len(node)}" if isinstance(node, (tuple, list))
                   else _tree.describe(node))
            raise TypeError(f"{call}: expected the state of {current!r} (the tuple of {len(current.stages)} stage "
                            f"states its init() returns), got {got}")
        stage = current.stages[position]
        node = node[position]
        if via is not None:
            current = stage.nested()[via[1]][1]
            node = _inside(node, via)
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
        if stage.init_fn is not None and field in (keywords(stage.init_fn) or ()):
            raise KeyError(f"replace_state({path!r}): {field} is read by init, which makes the state from it, so "
                           f"it is not kept in the state; build a new update object and state with the new value")
        held = "" if stage.held else ", or keep the hyperparameters in the state with ux.hyperparams_in_state(opt)"
        raise KeyError(f"replace_state({path!r}): {field} is a hyperparameter, not state; build the "
                       f"update object with the new value (or a schedule) instead{held}")
    old = get_state(pipeline, state, path)
    if where == "scheduled":  # a held hyperparameter: the state's dtype and shape, its option's domain, relations
        value = _like(stage.label, field, old, value, [None])
        if is_concrete(value):
            stage._check_values({**entry.hyperparams, field: value}, [field], f"written by replace_state({path!r})")
    else:
        declared = _field_domains(entry if field is None else _own(entry), field)
        value = _like("replace_state", path, old, value, declared)

    def rebuild(node, depth):
        position, via = steps[depth]
        child = node[position]
        if via is not None:
            child = _with_inside(child, via, rebuild(_inside(child, via), depth + 1))
        elif where == "scheduled":  # a held hyperparameter
            child = child._replace(hyperparams={**child.hyperparams, field: value})
        elif field is not None:
            own = _own(child)._replace(**{field: value})
            child = child._replace(state=own) if isinstance(child, ScheduledState) else own
        else:
            child = value
        return tuple(node[:position]) + (child,) + tuple(node[position + 1:])

    return rebuild(state, 0)


def _numbers(call: str, name: str, value: Any) -> Any:
    """``value`` as a NumPy array, or a TypeError in the one format."""
    try:
        return np.asarray(value)
    except (TypeError, ValueError):
        raise TypeError(message(call, name, value, "must be a number or an array")) from None


def _field_domains(node: Any, field: str | None) -> list:
    """What each leaf of ``node`` (or of its ``field``) is declared to hold, in flattening order: the domain of
    the innermost NamedTuple field annotated with one (``count: Count``) above the leaf, else None."""
    base = None
    if field is not None:
        base = field_domain(type(node), field) if hasattr(node, "_fields") else None
        node = getattr(node, field)
    found = []
    for path, _ in jax.tree_util.tree_flatten_with_path(node)[0]:
        current, domain = node, base
        for key in path:
            if isinstance(key, jax.tree_util.GetAttrKey):
                if hasattr(current, "_fields"):
                    domain = field_domain(type(current), key.name) or domain
                current = getattr(current, key.name)
            elif isinstance(key, jax.tree_util.SequenceKey):
                current = current[key.idx]
            elif isinstance(key, jax.tree_util.DictKey):
                current = current[key.key]
            else:
                break
        found.append(domain)
    return found


def _like(call, name, old, value, domains):
    """Casts ``value`` to the structure, shapes and dtypes of ``old``, refusing what the dtype cannot hold and
    what a leaf's declared domain (``domains``, one per leaf of ``old``) refuses; a message names the call and
    ``name`` with the leaf's path (``replace_state(scale_by_adam.nu['w']=...): ...``)."""
    declared = iter(domains)

    def cast(where, o, v):
        domain = next(declared, None)
        if not isinstance(o, (jax.Array, np.ndarray, np.generic)):
            return v
        leaf = name + jax.tree_util.keystr(where)
        if not isinstance(v, jax.core.Tracer):
            given = _numbers(call, leaf, v)
            fits_dtype(call, leaf, given, o.dtype, "")
            if domain is not None:
                domain.check_values(call, leaf, given, "")
        v = jnp.asarray(v, dtype=o.dtype)
        if v.shape != o.shape:
            raise ValueError(f"{call}: {leaf} has shape {v.shape}, the state {o.shape}; the new value must have the "
                             "current shape")
        return v

    if isinstance(old, (jax.Array, np.ndarray, np.generic)):
        return cast((), old, value)
    _tree.check_same_structure(f"{call}({name})", old, value, "the current state", "the new value")
    return jax.tree_util.tree_map_with_path(cast, old, value)
