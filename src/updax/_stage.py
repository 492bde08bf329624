"""Stages: one combinator in a pipeline, its kernels, its options and what the name of a stage binds.

A stage is a name, one or two kernels and its options. Numeric options (and
nested pipelines, schedule objects) are pytree leaves; everything else
(flags, dtypes, functions) is static structure. An option is evaluated as a
schedule only where the stage declares it ``schedulable`` and its value is
callable; any other callable option reaches the kernels as a function.

A stage name binds its kind: the kernels, the option names and the
declarations (``needs_params``, ``wraps``, ``static``, ``schedulable``,
``per_example``, ``elementwise``, ``state_last``). Two
stages of one name are therefore the same computation whenever their options
are equal, which is what lets a pipeline print as its identity.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._options import Frozen, canonical, format_value, function_name, is_dynamic, is_number, key_of, keywords

__all__ = ["EmptyState", "ScheduledState", "Stage", "check_stage_result", "check_updates", "without_examples"]


class EmptyState(NamedTuple):
    """The state of a stateless stage: it holds nothing."""


class ScheduledState(NamedTuple):
    """The state of a stage some of whose options are schedules.

    ``state`` is the stage's own state, ``count`` the steps taken, and
    ``hyperparams`` the value each scheduled option had on the last step (at
    init: its value at count 0). :meth:`Update.get_state` sees through it:
    ``"scale_by_adam.mu"`` and ``"scale_by_adam.b1"`` both resolve.
    """

    state: Any
    count: jax.Array
    hyperparams: dict[str, jax.Array]


#: The labels of unnamed stages; no stage may take them as names.
_UNNAMED = ("stateless", "stateful")


class _Kind(NamedTuple):
    """What a stage name binds. (``needs_params`` is not bound: a factory may derive it from the options, as
    ``scale_by_novograd`` does from its decay; it must follow from the options, which print.)"""

    init_fn: Callable[..., Any] | None
    apply_fn: Callable[..., Any]
    option_names: frozenset[str]
    wraps: str | None
    static: frozenset[str]
    schedulable: frozenset[str]
    per_example: bool = False
    elementwise: bool = False
    state_last: frozenset[str] = frozenset()

    def origin(self) -> tuple:
        """The kernels by the name they are found under; a kernel found under no name (a lambda, a closure)
        is itself, so that only the same object matches it."""
        return tuple(None if f is None else (function_name(f) or f) for f in (self.init_fn, self.apply_fn))

    def describe(self) -> str:
        kernels = ", ".join(format_value(f) for f in (self.init_fn, self.apply_fn) if f is not None)
        return (f"kernels {kernels}; options {sorted(self.option_names)}; wraps={self.wraps!r}; "
                f"static={sorted(self.static)}; schedulable={sorted(self.schedulable)}; "
                f"per_example={self.per_example}; elementwise={self.elementwise}; "
                f"state_last={sorted(self.state_last)}")


_KINDS: dict[str, _Kind] = {}


def _bind(name: str, kind: _Kind) -> None:
    """Binds ``name`` to ``kind``, or raises if the name already means another computation.

    Redefining the same kernels (a reloaded module, a re-run notebook cell:
    the same module and qualified names) rebinds the name.
    """
    bound = _KINDS.get(name)
    if bound == kind:
        return
    if bound is not None and bound.origin() != kind.origin():
        hint = ""
        if any(callable(o) for o in kind.origin()):  # a kernel found under no name
            hint = (" (a kernel defined inside a function or as a lambda is a new object on every call: define "
                    "it once at module level and pass what varies as options)")
        raise ValueError(f"stage name {name!r} is already bound to {bound.describe()}; a stage with "
                         f"{kind.describe()} needs a name of its own (a name is bound once per process){hint}")
    if bound is not None and bound._replace(init_fn=None, apply_fn=None) != kind._replace(init_fn=None, apply_fn=None):
        same_kernels = bound.init_fn is kind.init_fn and bound.apply_fn is kind.apply_fn
        if same_kernels:  # one definition, two declarations: a mistake in the factory
            raise ValueError(f"stage {name!r} is declared two ways: {bound.describe()}; and {kind.describe()}")
    _KINDS[name] = kind


def _names(call: str, what: str, names: Iterable[str], options: Mapping[str, Any]) -> frozenset[str]:
    if isinstance(names, str):
        raise TypeError(f"{call}({what}={names!r}): {what} must be a collection of option names, not a string")
    names = frozenset(names)
    unknown = sorted(names - set(options))
    if unknown:
        raise ValueError(f"{call}({what}=...): {unknown} are not options of the stage (options: {sorted(options)})")
    return names


def _fields(call: str, state_last: Iterable[str], init_fn: Callable[..., Any] | None,
            wraps: str | None) -> frozenset[str]:
    """``state_last`` checked: field names (identifiers) of a stateful stage (a wrapper's ``wraps`` field among
    them: its pipeline's whole state, see :func:`updax.stateful`)."""
    if isinstance(state_last, str):
        raise TypeError(f"{call}(state_last={state_last!r}): state_last must be a collection of field names, not a "
                        "string")
    fields = frozenset(state_last)
    bad = sorted(repr(f) for f in fields if not (isinstance(f, str) and f.isidentifier()))
    if bad:
        raise TypeError(f"{call}(state_last=...): {', '.join(bad)} are not field names")
    if fields and init_fn is None:
        raise ValueError(f"{call}(state_last=...): a stateless stage has no state to write last")
    return fields


class Stage:
    """One combinator in a pipeline: a name, its kernels and its options.

    Users rarely build a :class:`Stage` directly: :func:`updax.stateless` and
    :func:`updax.stateful` do. ``init_fn`` is None for a stateless stage.
    Options are passed by keyword to each kernel that names them in its
    signature. ``wraps`` names the option holding the pipeline a wrapper stage
    runs (its state lives in the state field of the same name). Options named
    in ``schedulable`` may be schedules ``count -> value``: the stage then
    evaluates them at its own step count and the kernels see the number.
    Options named in ``static`` are structure even when numeric. A
    ``per_example`` stage gets updates with a leading axis of examples (one
    gradient per example) and returns them reduced, shaped like the params.
    An ``elementwise`` stage computes each element from the same element of
    its inputs and state, and from scalars (its options, counts, reductions
    over all leaves together), so it computes the same on the leaves joined
    into one buffer (:func:`updax.flat_state`). ``state_last`` names the
    fields of its state whose old values the updates read: under ``jax.jit``
    on the CPU their new values are written after the params' update, so
    that XLA updates their donated buffers in place (see
    :func:`updax.stateful`); a wrapper may name its ``wraps`` field, and
    when its pipeline is elementwise every leaf of that pipeline's state
    shaped like a param is then written after that param.

    Attributes:
        name: the name given, or None (then ``label`` is ``"stateless"`` or
            ``"stateful"``).
        init_fn: ``init_fn(params, **options) -> state``, or None.
        apply_fn: the update kernel.
        options: the options as ``((name, value), ...)``, copied at
            construction (static pytrees as frozen copies).
        needs_params: whether ``update`` must be given params.
        wraps: the option holding a wrapped pipeline, or None.
        static: options kept static even when numeric.
        schedulable: options evaluated per step when their value is callable.
        dynamic: options that are pytree leaves (derived).
        scheduled: options whose value is a schedule (derived).
        held: options whose value lives in the state (see
            :func:`updax.hyperparams_in_state`); empty unless asked for.
        per_example: whether the updates it gets carry a leading axis of
            examples, which it reduces away.
        elementwise: whether its rule is element by element (see above).
        state_last: the state fields written after the params' update.
    """

    __slots__ = ("name", "init_fn", "apply_fn", "options", "needs_params", "wraps", "static", "schedulable",
                 "dynamic", "scheduled", "held", "per_example", "elementwise", "state_last")

    name: str | None
    init_fn: Callable[..., Any] | None
    apply_fn: Callable[..., Any]
    options: tuple[tuple[str, Any], ...]
    needs_params: bool
    wraps: str | None
    static: frozenset[str]
    schedulable: frozenset[str]
    dynamic: frozenset[str]
    scheduled: frozenset[str]
    held: frozenset[str]
    per_example: bool
    elementwise: bool
    state_last: frozenset[str]

    def __init__(self, name: str | None, init_fn: Callable[..., Any] | None, apply_fn: Callable[..., Any],
                 options: Mapping[str, Any] | Iterable[tuple[str, Any]] = (), *, needs_params: bool = False,
                 wraps: str | None = None, static: Iterable[str] = (), schedulable: Iterable[str] = (),
                 per_example: bool = False, elementwise: bool = False, state_last: Iterable[str] = ()) -> None:
        call = name or ("stateless" if init_fn is None else "stateful")
        if name is not None and (not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name)
                                 or name in _UNNAMED):
            raise ValueError(f"{call}(name={name!r}): a stage name must be a Python identifier other than "
                             f"{' and '.join(_UNNAMED)} (state paths use it)")
        for role, fn in (("init_fn", init_fn), ("apply_fn", apply_fn)):
            if not (fn is None and role == "init_fn") and not callable(fn):
                raise TypeError(f"{call}({role}={fn!r}): {role} must be callable")
        options = dict(options)
        for key in options:
            if not isinstance(key, str) or not key.isidentifier():
                raise TypeError(f"{call}(options=...): option names must be identifiers, got {key!r}")
        static = _names(call, "static", static, options)
        schedulable = _names(call, "schedulable", schedulable, options)
        if static & schedulable:
            raise ValueError(f"{call}: options {sorted(static & schedulable)} cannot be both static and schedulable")
        if not isinstance(needs_params, bool):
            raise TypeError(f"{call}(needs_params={needs_params!r}): needs_params must be True or False")
        if not isinstance(per_example, bool):
            raise TypeError(f"{call}(per_example={per_example!r}): per_example must be True or False")
        if not isinstance(elementwise, bool):
            raise TypeError(f"{call}(elementwise={elementwise!r}): elementwise must be True or False")
        if elementwise and (per_example or wraps is not None):
            raise ValueError(f"{call}: a wrapper or per-example stage cannot be elementwise")
        if per_example and wraps is not None:
            raise ValueError(f"{call}: a wrapper stage cannot take per-example updates")
        state_last = _fields(call, state_last, init_fn, wraps)
        if wraps is not None and not _is_pipeline(options.get(wraps)):
            raise TypeError(f"{call}: option {wraps!r} must be an update object (the pipeline it wraps)")
        if name is not None:
            kind = _Kind(init_fn, apply_fn, frozenset(options), wraps, static, schedulable, per_example, elementwise,
                         state_last)
            _bind(name, kind)
        stored = tuple((k, _store(call, k, v, static)) for k, v in options.items())
        self._set(name, init_fn, apply_fn, stored, needs_params, wraps, static, schedulable, per_example=per_example,
                  elementwise=elementwise, state_last=state_last)

    def _set(self, name, init_fn, apply_fn, options, needs_params, wraps, static, schedulable, dynamic=None,
             scheduled=None, held=frozenset(), per_example=False, elementwise=False, state_last=frozenset()):
        if dynamic is None:  # derived at construction; a pytree round trip carries them unchanged
            dynamic = frozenset(k for k, v in options
                                if k not in static and not isinstance(v, Frozen) and is_dynamic(v))
            scheduled = frozenset(k for k, v in options if k in schedulable and callable(v))
        for slot, value in zip(self.__slots__, (name, init_fn, apply_fn, options, needs_params, wraps, static,
                                                schedulable, dynamic, scheduled, held, per_example, elementwise,
                                                state_last)):
            object.__setattr__(self, slot, value)

    def holdable(self) -> frozenset[str]:
        """The options :func:`updax.hyperparams_in_state` keeps in the state: the numbers and arrays among the
        dynamic options that are not schedules (a schedule's value on the last step is in the state already)."""
        return frozenset(k for k, v in self.options if k in self.dynamic and k not in self.scheduled and is_number(v))

    def _holding(self, convert: Callable[[Any], Any]) -> Stage:
        """This stage with its holdable options kept in the state, and ``convert`` applied to every update object
        its options hold (the pipeline it wraps, partition's groups)."""
        options = tuple((k, v if k in self.static or isinstance(v, Frozen) else _map_pipelines(convert, v))
                        for k, v in self.options)
        stage = Stage.__new__(Stage)
        stage._set(self.name, self.init_fn, self.apply_fn, options, self.needs_params, self.wraps, self.static,
                   self.schedulable, self.dynamic, self.scheduled, per_example=self.per_example,
                   elementwise=self.elementwise, state_last=self.state_last)
        object.__setattr__(stage, "held", stage.holdable())
        return stage

    @property
    def in_state(self) -> frozenset[str]:
        """The options whose current values the state holds: the scheduled ones and the held ones."""
        return self.scheduled | self.held

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("update objects are immutable")

    @property
    def label(self) -> str:
        """The name used in ``repr`` and state paths."""
        if self.name is not None:
            return self.name
        return _UNNAMED[0] if self.init_fn is None else _UNNAMED[1]

    def option(self, key: str) -> Any:
        """The value of option ``key`` (a static pytree option as the tree it was given as)."""
        value = dict(self.options)[key]
        return value.tree if isinstance(value, Frozen) else value

    def _with_option(self, key: str, value: Any) -> Stage:
        """This stage with option ``key`` replaced (its kind unchanged)."""
        stage = Stage.__new__(Stage)
        options = tuple((k, _store(self.label, k, value, self.static) if k == key else v) for k, v in self.options)
        stage._set(self.name, self.init_fn, self.apply_fn, options, self.needs_params, self.wraps, self.static,
                   self.schedulable, per_example=self.per_example, elementwise=self.elementwise,
                   state_last=self.state_last)
        object.__setattr__(stage, "held", self.held & stage.holdable())
        return stage

    @staticmethod
    def _kwargs(fn, values):
        accepted = keywords(fn)
        return {k: v for k, v in values.items() if accepted is None or k in accepted}

    def _values(self, count):
        """The options, with each schedule evaluated at ``count`` (at least float32; unused without schedules)."""
        values = {k: v.tree if isinstance(v, Frozen) else v for k, v in self.options}
        for key in self.scheduled:
            value = jnp.asarray(values[key](count))
            if value.shape != () or not (jnp.issubdtype(value.dtype, jnp.floating)
                                         or jnp.issubdtype(value.dtype, jnp.integer)):
                raise TypeError(f"{self.label}: the schedule for {key} returned {value.dtype.name} of shape "
                                f"{value.shape}; a schedule must return a real scalar")
            if jnp.issubdtype(value.dtype, jnp.floating):
                value = value.astype(_tree.compute_dtype(value.dtype))
            values[key] = value
        return values

    def init(self, params: Any) -> Any:
        """The stage's initial state for ``params``."""
        count = _tree.zero_count()
        values = self._values(count)
        state = EmptyState() if self.init_fn is None else self.init_fn(params, **self._kwargs(self.init_fn, values))
        if not self.in_state:
            return state
        hyperparams = {k: _held_value(values[k]) if k in self.held else values[k] for k in sorted(self.in_state)}
        return ScheduledState(state=state, count=count, hyperparams=hyperparams)

    def apply(self, updates: Any, state: Any, params: Any, extra: Mapping[str, Any]) -> tuple[Any, Any]:
        """Runs the stage: ``(updates, state)`` after one step; ``extra`` are the keywords ``update`` got."""
        if self.needs_params and params is None and jax.tree.leaves(updates):  # (no leaves: nothing to need)
            raise ValueError(
                f"{self.label} needs params, but update() got none: call update(updates, state, params)"
            )
        outer = state
        if self.in_state:
            if not isinstance(state, ScheduledState):
                raise ValueError(f"{self.label}: its options are {'scheduled' if self.scheduled else 'held'}, so its "
                                 f"state must be the ScheduledState that init() returns, got {type(state).__name__}")
            state = outer.state
        values = self._values(outer.count if self.scheduled else None)
        values.update({k: outer.hyperparams[k] for k in self.held})
        kwargs = self._kwargs(self.apply_fn, {**extra, **values})
        given = without_examples(self.label, updates) if self.per_example else updates
        if self.init_fn is None:
            updates = check_updates(self.label, given, self.apply_fn(updates, params, **kwargs))
        else:
            updates, state = check_stage_result(self.label, given, state,
                                                self.apply_fn(updates, state, params, **kwargs))
        if self.in_state:
            state = ScheduledState(state=state, count=_tree.safe_increment(outer.count),
                                   hyperparams={k: values[k] for k in sorted(self.in_state)})
        return updates, state

    # --- value semantics ---------------------------------------------------

    def _key(self):
        options = tuple((k, key_of(v)) for k, v in self.options)
        return (self.name, self.init_fn, self.apply_fn, options, self.needs_params, self.wraps, self.static,
                self.schedulable, self.held, self.per_example, self.elementwise, self.state_last)

    def __eq__(self, other: object) -> bool:
        return type(other) is Stage and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore_stage, (self.name, self.init_fn, self.apply_fn, self.options, self.needs_params, self.wraps,
                                 self.static, self.schedulable, self.held, self.per_example, self.elementwise,
                                 self.state_last))

    def _arguments(self, *, with_wrapped: bool) -> str:
        shown = []
        if self.name is None:
            shown += [format_value(fn) for fn in (self.init_fn, self.apply_fn) if fn is not None]
        for key, value in self.options:
            if key == self.wraps:
                if with_wrapped and value.stages:
                    shown.insert(0, repr(value))
            elif value is not None or self.name is None:
                # A named stage's option names are fixed by its name, so None can be left unsaid.
                shown.append(f"{key}={format_value(value)}")
        return f"{self.label}({', '.join(shown)})"

    def __repr__(self) -> str:
        return self._arguments(with_wrapped=True)


def without_examples(label: str, updates: Any) -> Any:
    """The shapes of per-example ``updates`` without their leading axis of examples (``jax.ShapeDtypeStruct``
    leaves); raises, naming ``label`` and the leaf, unless every leaf has that axis, of one size >= 1."""
    size, first = None, None
    for path, leaf in jax.tree_util.tree_flatten_with_path(updates)[0]:
        shape, where = _tree.shape_of(leaf), f"updates{jax.tree_util.keystr(path)}"
        if not shape:
            raise ValueError(f"{label}: it takes per-example updates, with a leading axis of examples, but {where} "
                             "is 0-d (jax.vmap(jax.grad(loss), in_axes=(None, 0))(params, batch) gives them)")
        if size is None:
            size, first = shape[0], where
        if shape[0] == 0:
            raise ValueError(f"{label}: {where} has 0 examples (shape {shape}); per-example updates need at least one")
        if shape[0] != size:
            raise ValueError(f"{label}: per-example updates need one leading axis of examples, of one size >= 1 "
                             f"for every leaf: {first} has {size} examples, {where} has {shape[0]}")
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(_tree.shape_of(x)[1:], jnp.result_type(x)), updates)


def check_updates(label: str, given: Any, returned: Any) -> Any:
    """``returned``, if it has the structure and shapes of the updates the stage was ``given``; else raises."""
    found = _tree.mismatch(given, returned, "updates")
    if found is not None:
        where, want, got = found
        raise ValueError(f"{label}: the stage must return updates shaped like the updates it gets: at {where} it "
                         f"got {want} and returned {got} (a leaf whose shape changes is silent broadcasting: the "
                         f"updates and the state must come from the same params)")
    return returned


def check_stage_result(label: str, updates: Any, state: Any, result: Any) -> tuple[Any, Any]:
    """The ``(updates, state)`` a stateful kernel returned, checked against what it got: same structures and shapes."""
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(f"{label}: apply_fn must return a pair (updates, state), got {_tree.describe(result)}")
    new_updates, new_state = result
    check_updates(label, updates, new_updates)
    found = _tree.mismatch(state, new_state, "state")
    if found is not None:
        where, want, got = found
        raise ValueError(f"{label}: apply_fn must return a state of the structure and shapes init gives: at {where} "
                         f"it got {want} and returned {got}")
    return new_updates, new_state


def _is_pipeline(value: Any) -> bool:
    """An update object: a tuple of stages (checked by shape, since pipelines are built on stages)."""
    stages = getattr(value, "stages", None)
    return isinstance(stages, tuple) and all(isinstance(stage, Stage) for stage in stages)


def _store(call, key, value, static):
    """An option as it is stored: a copy the caller cannot change, frozen if it is static and unhashable."""
    value = canonical(value)
    if key not in static and is_dynamic(value):
        return value
    try:
        hash(value)
        return value
    except TypeError:
        pass
    try:
        return Frozen(value)
    except TypeError:
        raise TypeError(f"{call}({key}={value!r}): an option must be a number, an array, a hashable value "
                        "or a pytree of them") from None


def _restore_stage(name, init_fn, apply_fn, options, needs_params, wraps, static, schedulable, held=frozenset(),
                   per_example=False, elementwise=False, state_last=frozenset()):
    if name is not None:
        names = frozenset(k for k, _ in options)
        _bind(name, _Kind(init_fn, apply_fn, names, wraps, static, schedulable, per_example, elementwise, state_last))
    stage = Stage.__new__(Stage)
    stage._set(name, init_fn, apply_fn, options, needs_params, wraps, static, schedulable, held=held,
               per_example=per_example, elementwise=elementwise, state_last=state_last)
    return stage


def _held_value(value):
    """A held option as the state keeps it: an array of its own dtype (a Python float as the default float, an
    int as int32), so that the state's structure and dtypes are fixed at init."""
    if isinstance(value, float):
        return jnp.asarray(value, jax.dtypes.canonicalize_dtype(jnp.float64))
    if isinstance(value, int):
        return jnp.asarray(value, jnp.int32)
    return jnp.array(value, copy=True)


def _map_pipelines(convert, value):
    """``value`` with ``convert`` applied to every update object in it (the option itself, or leaves of a tree)."""
    if _is_pipeline(value):
        return convert(value)
    if isinstance(value, (dict, list, tuple)) and not hasattr(value, "_fields"):
        return jax.tree.map(lambda v: convert(v) if _is_pipeline(v) else v, value, is_leaf=_is_pipeline)
    return value


def _flatten_stage(stage):
    children = [(jax.tree_util.GetAttrKey(k), v) for k, v in stage.options if k in stage.dynamic]
    static = tuple((k, None if k in stage.dynamic else v) for k, v in stage.options)
    aux = (stage.name, stage.init_fn, stage.apply_fn, static, stage.needs_params, stage.wraps, stage.static,
           stage.schedulable, stage.dynamic, stage.scheduled, stage.held, stage.per_example, stage.elementwise,
           stage.state_last)
    return children, aux


def _unflatten_stage(aux, children):
    (name, init_fn, apply_fn, static_options, needs_params, wraps, static, schedulable, dynamic, scheduled, held,
     per_example, elementwise, state_last) = aux
    children = iter(children)
    options = tuple((k, next(children) if k in dynamic else v) for k, v in static_options)
    stage = Stage.__new__(Stage)
    stage._set(name, init_fn, apply_fn, options, needs_params, wraps, static, schedulable, dynamic, scheduled, held,
               per_example, elementwise, state_last)
    return stage


jax.tree_util.register_pytree_with_keys(Stage, _flatten_stage, _unflatten_stage)
