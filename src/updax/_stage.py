"""Stages: one combinator in a pipeline, its kernels, its options and what the name of a stage binds.

A stage is a ``Declaration`` (its name, kernels, option names and what
it declares about them) and the values of its options. Numeric options (and
nested pipelines, schedule objects) are pytree leaves; everything else
(flags, dtypes, functions) is static structure. An option is evaluated as a
schedule only where the stage declares it ``schedulable`` and its value is
callable; any other callable option reaches the kernels as a function.

A stage name binds its declaration: the kernels, the option names, their
domains and relations, and the other declarations (``wraps``, ``static``,
``schedulable``, ``per_example``, ``elementwise``, ``state_last``). Two
stages of one name are therefore the same computation whenever their options
are equal, which is what lets a pipeline print as its identity.

Every option's domain is checked where its value enters (see
:mod:`updax._domains`): when the stage is built; on first use, for a stage
rebuilt from other leaves by a tree map; on every eager step, for the values
held in the state and those a schedule returns; under ``jax.jit`` where the
pipeline is :func:`updax.checked`.
"""

from __future__ import annotations

import inspect
import keyword
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree
from updax._backend import _half, _variants
from updax._domains import (Count, Domain, Integer, Pipeline, Pipelines, Real, Relation, Valid, checking,
                            count_dtype, is_concrete, message)
from updax._options import Frozen, canonical, format_value, is_dynamic, is_number, key_of, keywords

__all__ = ["Declaration", "EmptyState", "ScheduledState", "Stage", "check_stage_result", "check_updates",
           "reserve_name", "without_examples"]


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
    count: Count
    hyperparams: dict[str, jax.Array]


#: The labels of unnamed stages; no stage may take them as names.
_UNNAMED = ("stateless", "stateful")


class Declaration(NamedTuple):
    """Everything a stage declares, as one value: what a stage name binds.

    ``domains`` are ``(option, Domain)`` pairs sorted by option (an option
    with none is unchecked), ``relations`` the rules between options.
    (``needs_params`` is not declared here: a factory may derive it from the
    options, as ``scale_by_novograd`` does from its decay; it must follow
    from the options, which print.)
    """

    name: str | None
    init_fn: Callable[..., Any] | None
    apply_fn: Callable[..., Any]
    option_names: frozenset[str]
    wraps: str | None = None
    static: frozenset[str] = frozenset()
    schedulable: frozenset[str] = frozenset()
    per_example: bool = False
    elementwise: bool = False
    state_last: frozenset[str] = frozenset()
    domains: tuple[tuple[str, Domain], ...] = ()
    relations: tuple[Relation, ...] = ()

    @property
    def label(self) -> str:
        """The name used in ``repr``, state paths and messages."""
        return self.name if self.name is not None else _UNNAMED[0] if self.init_fn is None else _UNNAMED[1]

    def domain(self, option: str) -> Domain | None:
        for key, domain in self.domains:
            if key == option:
                return domain
        return None

    def origin(self) -> tuple:
        """The kernels by where they are defined, so that running a definition again (a re-run notebook cell,
        a reloaded module) binds the same name again: see :func:`_origin`."""
        return tuple(None if f is None else _origin(f) for f in (self.init_fn, self.apply_fn))

    def describe(self) -> str:
        kernels = ", ".join(format_value(f) for f in (self.init_fn, self.apply_fn) if f is not None)
        return (f"kernels {kernels}; options {sorted(self.option_names)}; wraps={self.wraps!r}; "
                f"static={sorted(self.static)}; schedulable={sorted(self.schedulable)}; "
                f"per_example={self.per_example}; elementwise={self.elementwise}; "
                f"state_last={sorted(self.state_last)}; domains={dict(self.domains)}; "
                f"relations={[r.text for r in self.relations]}")


def _origin(fn: Any) -> Any:
    """Where a kernel is defined: ``(module, qualified name)`` for a function defined at the top of a module or
    a class (found again there by a re-run or a reload); for a lambda or a function defined inside another,
    its module, name and code when it closes over nothing (a re-run cell defines the same code again), else
    the object itself (a closure's values are part of what it computes)."""
    qualname, module = getattr(fn, "__qualname__", None), getattr(fn, "__module__", None)
    if not isinstance(qualname, str) or not isinstance(module, str):
        return fn
    if "<" not in qualname:
        return module, qualname
    code = getattr(fn, "__code__", None)
    if code is None or getattr(fn, "__closure__", None) or getattr(fn, "__defaults__", None) \
            or getattr(fn, "__kwdefaults__", None):
        return fn
    return module, qualname, code.co_code, repr(code.co_consts), code.co_names, code.co_varnames


_DECLARED: dict[str, Declaration] = {}

#: Stage names kept for the catalogue's stages from import on: name -> the module whose kernels may bind it.
_RESERVED: dict[str, str] = {}


def reserve_name(name: str, module: str) -> None:
    """Keeps ``name`` for a stage whose update kernel is defined in ``module`` (the catalogue combinator's own):
    no other stage can take it, whether or not the catalogue has built its stage yet."""
    _RESERVED.setdefault(name, module)


def _bind(declaration: Declaration) -> None:
    """Binds the declaration's name to it, or raises if the name already means another computation.

    Running a definition again (a re-run notebook cell, a reloaded module:
    the kernels' module and qualified names are the same) binds the name
    again.
    """
    name = declaration.name
    module = _RESERVED.get(name)
    if module is not None and getattr(declaration.apply_fn, "__module__", None) != module:
        raise ValueError(f"stage name {name!r} is updax's (ux.{name}); give your stage another name")
    bound = _DECLARED.get(name)
    if bound == declaration:
        return
    if bound is not None and bound.origin() != declaration.origin():
        hint = ""
        if any(not isinstance(o, tuple) for o in declaration.origin() if o is not None):  # a closure
            hint = (" (a kernel that closes over values is a new computation on every call: define it once at "
                    "module level and pass what varies as options)")
        raise ValueError(f"stage name {name!r} is taken by {format_value(bound.apply_fn)}; give the stage with "
                         f"{format_value(declaration.apply_fn)} another name{hint}")
    if bound is not None and bound._replace(init_fn=None, apply_fn=None) != \
            declaration._replace(init_fn=None, apply_fn=None):
        if bound.init_fn is declaration.init_fn and bound.apply_fn is declaration.apply_fn:
            # one definition, two declarations: a mistake in the factory
            raise ValueError(f"stage {name!r} is declared two ways: {bound.describe()}; and {declaration.describe()}")
    _DECLARED[name] = declaration


def _names(call: str, what: str, names: Iterable[str], options: Mapping[str, Any]) -> frozenset[str]:
    if isinstance(names, str):
        raise TypeError(f"{call}({what}={names!r}): {what} must be a collection of option names, not a string")
    names = frozenset(names)
    unknown = sorted(names - set(options))
    if unknown:
        raise ValueError(f"{call}({what}=...): {unknown} are not options of the stage (options: {sorted(options)})")
    return names


def _fields(call: str, state_last: Iterable[str], init_fn: Callable[..., Any] | None) -> frozenset[str]:
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


def _declared_domains(call: str, domains: Mapping[str, Any] | None, options: Mapping[str, Any]) -> tuple:
    if domains is None:
        return ()
    if not isinstance(domains, Mapping):
        raise TypeError(f"{call}(domains={domains!r}): domains must be a mapping {{option: Domain}}")
    unknown = sorted(set(domains) - set(options))
    if unknown:
        raise ValueError(f"{call}(domains=...): {unknown} are not options of the stage (options: {sorted(options)})")
    for key, domain in domains.items():
        if not isinstance(domain, Domain):
            raise TypeError(f"{call}(domains=...): the domain of {key} must be a Domain (ux.domains), got {domain!r}")
    return tuple(sorted(domains.items()))


def _declared_relations(call: str, relations: Iterable[Relation], options: Mapping[str, Any]) -> tuple:
    relations = tuple(relations)
    for relation in relations:
        if not isinstance(relation, Relation):
            raise TypeError(f"{call}(relations=...): expected Relation values (ux.domains.Relation), got {relation!r}")
        unknown = sorted(set(relation.names) - set(options))
        if unknown:
            raise ValueError(f"{call}(relations=...): {relation.text!r} names {unknown}, which are not options of "
                             f"the stage (options: {sorted(options)})")
    return relations


def _check_kernel_options(call: str, init_fn, apply_fn, options: Mapping[str, Any]) -> None:
    """Every option is a parameter of a kernel (or a kernel takes ``**kwargs``): a misspelt option is refused
    when the stage is built, not silently left out of every call."""
    kernels = [("init_fn", init_fn, 1), ("apply_fn", apply_fn, 2 if init_fn is None else 3)]
    taken = [(role, keywords(fn), fn, leading) for role, fn, leading in kernels if fn is not None]
    if any(names is None for _, names, _, _ in taken):
        return
    unknown = sorted(set(options) - frozenset().union(*(names for _, names, _, _ in taken)))
    if unknown:
        shown = "; ".join(f"{role} takes {_option_parameters(fn, leading)}" for role, _, fn, leading in taken)
        raise ValueError(f"{call}(options=...): {', '.join(map(repr, unknown))} "
                         f"{'is not a parameter' if len(unknown) == 1 else 'are not parameters'} of its kernels "
                         f"({shown})")


def _option_parameters(fn, leading: int) -> list[str]:
    """The parameters of a kernel after its ``leading`` positional ones (updates, state, params): its options."""
    parameters = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.POSITIONAL_ONLY)]
    return [p.name for p in parameters[leading:] if p.kind is not p.POSITIONAL_ONLY]


class Stage:
    """One combinator in a pipeline: its declaration and the values of its options.

    Users rarely build a :class:`Stage` directly: :func:`updax.stateless` and
    :func:`updax.stateful` do, and their docstrings describe each
    declaration. ``init_fn`` is None for a stateless stage.

    Attributes:
        declaration: the ``Declaration`` its name binds (kernels, option
            names, domains, relations, flags); its fields read as attributes
            of the stage (``stage.wraps``, ``stage.schedulable``, ...).
        options: the options as ``((name, value), ...)``, checked against
            their domains and copied at construction (static pytrees as
            frozen copies).
        needs_params: whether ``update`` must be given params.
        dynamic: options that are pytree leaves (derived).
        scheduled: options whose value is a schedule (derived).
        held: options whose value lives in the state (see
            :func:`updax.hyperparams_in_state`); empty unless asked for.
        checked: whether its traced values are checked under ``jax.jit``
            (see :func:`updax.checked`).
    """

    __slots__ = ("declaration", "options", "needs_params", "held", "checked", "dynamic", "scheduled", "_valid")

    declaration: Declaration
    options: tuple[tuple[str, Any], ...]
    needs_params: bool
    held: frozenset[str]
    checked: bool
    dynamic: frozenset[str]
    scheduled: frozenset[str]

    def __init__(self, name: str | None, init_fn: Callable[..., Any] | None, apply_fn: Callable[..., Any],
                 options: Mapping[str, Any] | Iterable[tuple[str, Any]] = (), *, needs_params: bool = False,
                 wraps: str | None = None, static: Iterable[str] = (), schedulable: Iterable[str] = (),
                 per_example: bool = False, elementwise: bool = False, state_last: Iterable[str] = (),
                 domains: Mapping[str, Domain] | None = None, relations: Iterable[Relation] = ()) -> None:
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
        for flag, value in (("needs_params", needs_params), ("per_example", per_example),
                            ("elementwise", elementwise)):
            if not isinstance(value, bool):
                raise TypeError(f"{call}({flag}={value!r}): {flag} must be True or False")
        if elementwise and (per_example or wraps is not None):
            raise ValueError(f"{call}: a wrapper or per-example stage cannot be elementwise")
        if per_example and wraps is not None:
            raise ValueError(f"{call}: a wrapper stage cannot take per-example updates")
        state_last = _fields(call, state_last, init_fn)
        if wraps is not None and not _is_pipeline(options.get(wraps)):
            raise TypeError(f"{call}: option {wraps!r} must be an update object (the pipeline it wraps)")
        _check_kernel_options(call, init_fn, apply_fn, options)
        declaration = Declaration(name, init_fn, apply_fn, frozenset(options), wraps, static, schedulable,
                                  per_example, elementwise, state_last, _declared_domains(call, domains, options),
                                  _declared_relations(call, relations, options))
        if name is not None:
            _bind(declaration)
        checked = {k: _checked_option(declaration, k, v) for k, v in options.items()}
        for relation in declaration.relations:
            relation.check(call, checked)
        stored = tuple((k, _store(call, k, v, static)) for k, v in checked.items())
        self._set(declaration, stored, needs_params)

    def _set(self, declaration: Declaration, options: tuple, needs_params: bool, held: frozenset = frozenset(),
             checked: bool = False, dynamic: frozenset | None = None, scheduled: frozenset | None = None,
             valid: bool = True) -> None:
        if dynamic is None:  # derived at construction; a pytree round trip carries them unchanged
            dynamic = frozenset(k for k, v in options
                                if k not in declaration.static and not isinstance(v, Frozen) and is_dynamic(v))
            scheduled = frozenset(k for k, v in options if k in declaration.schedulable and callable(v))
        for slot, value in zip(self.__slots__, (declaration, options, needs_params, held, checked, dynamic,
                                                scheduled, valid)):
            object.__setattr__(self, slot, value)

    def _copy(self, **changes: Any) -> Stage:
        """This stage with some of ``options``, ``held`` and ``checked`` replaced (its declaration unchanged)."""
        fields = dict(options=self.options, held=self.held, checked=self.checked)
        fields.update(changes)
        stage = Stage.__new__(Stage)
        stage._set(self.declaration, fields["options"], self.needs_params, fields["held"], fields["checked"],
                   valid=self._valid and "options" not in changes)
        return stage

    # --- the declaration, read as attributes --------------------------------

    name = property(lambda self: self.declaration.name, doc="The name given, or None.")
    init_fn = property(lambda self: self.declaration.init_fn, doc="The init kernel, or None (stateless).")
    apply_fn = property(lambda self: self.declaration.apply_fn, doc="The update kernel.")
    wraps = property(lambda self: self.declaration.wraps, doc="The option holding a wrapped pipeline, or None.")
    static = property(lambda self: self.declaration.static, doc="Options kept static even when numeric.")
    schedulable = property(lambda self: self.declaration.schedulable, doc="Options that may be schedules.")
    per_example = property(lambda self: self.declaration.per_example, doc="Whether it takes per-example updates.")
    elementwise = property(lambda self: self.declaration.elementwise, doc="Whether its rule is element by element.")
    state_last = property(lambda self: self.declaration.state_last,
                          doc="The state fields written after the params' update.")
    label = property(lambda self: self.declaration.label, doc="The name used in ``repr`` and state paths.")

    def holdable(self) -> frozenset[str]:
        """The options :func:`updax.hyperparams_in_state` keeps in the state: the numbers among the dynamic
        options that are not schedules (a schedule's value on the last step is in the state already), that the
        update kernel reads and the init kernel does not (an option ``init`` reads, an initial accumulator or
        DoG's first distance, is spent making the state: written later it would disagree with the state made
        from it), and whose declared domain is numeric (a PRNG key seeds ``init``; it is not a number a
        framework tunes)."""
        accepted = keywords(self.apply_fn)
        spent = (keywords(self.init_fn) or frozenset()) if self.init_fn is not None else frozenset()
        return frozenset(k for k, v in self.options if k in self.dynamic and k not in self.scheduled and is_number(v)
                         and not _is_key(v) and (accepted is None or k in accepted) and k not in spent
                         and _numeric_domain(self.declaration.domain(k)))

    def _holding(self, convert: Callable[[Any], Any]) -> Stage:
        """This stage with its holdable options kept in the state, and ``convert`` applied to every update object
        its options hold (the pipeline it wraps, partition's groups)."""
        self.validate("hyperparams_in_state")
        options = tuple((k, v if k in self.static or isinstance(v, Frozen) else _map_pipelines(convert, v))
                        for k, v in self.options)
        stage = self._copy(options=options)
        object.__setattr__(stage, "held", stage.holdable())
        object.__setattr__(stage, "_valid", True)
        return stage

    def _checking(self, convert: Callable[[Any], Any]) -> Stage:
        """This stage checked under ``jax.jit`` (:func:`updax.checked`), and every update object its options hold
        through ``convert``."""
        self.validate("checked")
        options = tuple((k, v if k in self.static or isinstance(v, Frozen) else _map_pipelines(convert, v))
                        for k, v in self.options)
        stage = self._copy(options=options, checked=True)
        object.__setattr__(stage, "_valid", True)
        return stage

    @property
    def in_state(self) -> frozenset[str]:
        """The options whose current values the state holds: the scheduled ones and the held ones."""
        return self.scheduled | self.held

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("update objects are immutable")

    def option(self, key: str) -> Any:
        """The value of option ``key`` (a static pytree option as the tree it was given as)."""
        value = dict(self.options)[key]
        return value.tree if isinstance(value, Frozen) else value

    def reads_params(self) -> bool:
        """Whether this stage, or a stage of a pipeline it runs inside it, needs ``params`` in ``update``."""
        return self.needs_params or any(stage.reads_params() for _, pipeline in self.nested().values()
                                        for stage in pipeline.stages)

    def nested(self) -> dict[Any, tuple[str, Any]]:
        """The pipelines this stage runs inside it, by key, each with the state field holding their states:
        ``{None: (wraps, pipeline)}`` for a wrapper, ``{label: (field, pipeline)}`` for the groups of an option
        declared :class:`~updax._domains.Pipelines` (``partition``'s, whose state is a dict by label), and
        ``{None: (key, pipeline)}`` for an option ``key`` declared :class:`~updax._domains.Pipeline` that is not
        the wrapped one (GaLore's ``base_optimizer``, its state in the field ``key``), where it is set."""
        if self.wraps is not None:
            return {None: (self.wraps, self.option(self.wraps))}
        for key, domain in self.declaration.domains:
            if isinstance(domain, Pipelines):
                return {label: (domain.field, pipeline) for label, pipeline in self.option(key).items()}
            if isinstance(domain, Pipeline) and self.option(key) is not None:
                return {None: (key, self.option(key))}
        return {}

    def _with_option(self, key: str, value: Any) -> Stage:
        """This stage with option ``key`` replaced (its declaration unchanged), checked against its domain."""
        value = _checked_option(self.declaration, key, value)
        options = tuple((k, _store(self.label, k, value, self.static) if k == key else v) for k, v in self.options)
        stage = self._copy(options=options)
        object.__setattr__(stage, "held", self.held & stage.holdable())
        object.__setattr__(stage, "_valid", self._valid)
        return stage

    # --- checks of the values that enter after construction ------------------

    def validate(self, where: str) -> None:
        """Checks the concrete option values of a stage rebuilt from other leaves (a tree map over an update
        object) against the declaration, once; ``where`` names the path that rebuilt it in the message."""
        if self._valid:
            return
        values = dict(self.options)
        complete = True
        for key in sorted(self.dynamic - self.scheduled):
            domain = self.declaration.domain(key)
            value = values[key]
            if domain is None or _is_pipeline(value) or isinstance(value, dict):
                continue
            if not is_concrete(value):
                complete = False
                continue
            if _is_key(value):
                domain.check(self.label, key, value)  # (a typed PRNG key: the domain's own rule reads it)
                continue
            for leaf in jax.tree.leaves(value):
                domain.check_values(self.label, key, np.asarray(leaf), where)
        for relation in self.declaration.relations:
            relation.check(self.label, values, where)
        if complete:
            object.__setattr__(self, "_valid", True)

    def _check_values(self, values: Mapping[str, Any], keys: Iterable[str], where: str) -> None:
        """Checks ``values[key]`` for ``keys`` against their domains and the relations: concrete ones in Python,
        traced ones through ``checkify`` where the stage is checked."""
        keys = sorted(keys)
        if not keys:
            return
        concrete = {k: values[k] for k in keys if is_concrete(values[k]) and not _is_key(values[k])}
        if concrete:
            read = jax.device_get(concrete)
            for key, value in read.items():
                domain = self.declaration.domain(key)
                if domain is not None:
                    domain.check_values(self.label, key, np.asarray(value), where)
        if self.checked:
            from jax.experimental import checkify

            for key in keys:
                domain = self.declaration.domain(key)
                if key not in concrete and domain is not None:
                    holds = domain.holds(jnp.asarray(values[key]))
                    if holds is not None:
                        text = message(self.label, key, "<{}>", domain.refusal, where)
                        checkify.check(holds, text.replace("<{}>", "{}", 1), values[key])
        merged = {**dict(self.options), **values}
        for relation in self.declaration.relations:
            if set(relation.names) & set(keys):
                picked = [merged[n] for n in relation.names]
                if all(is_concrete(v) for v in picked):
                    relation.check(self.label, merged, where)
                elif self.checked and not any(callable(v) for v in picked):
                    from jax.experimental import checkify

                    shown = ", ".join(f"{n}={{}}" for n in relation.names)
                    checkify.check(jnp.all(relation.rule(*(jnp.asarray(v) for v in picked))),
                                   f"{self.label}({shown}): {relation.text} ({where})", *picked)

    @staticmethod
    def _kwargs(fn, values):
        accepted = keywords(fn)
        return {k: v for k, v in values.items() if accepted is None or k in accepted}

    def _values(self, count):
        """The options, with each schedule evaluated at ``count`` (at least float32; unused without schedules),
        its value checked against the option's domain."""
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
        if self.scheduled:
            at = f"at count {int(count)}" if is_concrete(count) else "at the step's count"
            self._check_values(values, self.scheduled, f"the value its schedule returned {at}")
        return values

    def _check_traced(self, values: Mapping[str, Any]) -> None:
        """Where the stage is checked (:func:`updax.checked`), the options traced under ``jax.jit`` (the object an
        argument of the step) against their domains, through ``checkify``."""
        if self.checked:
            traced = [k for k in self.dynamic - self.in_state if not is_concrete(values[k])
                      and not _is_pipeline(values[k]) and is_number(values[k])]
            self._check_values(values, traced, "an option traced under jax.jit")

    def init(self, params: Any) -> Any:
        """The stage's initial state for ``params``."""
        self.validate("an update object rebuilt by a tree map")
        count = _tree.zero_count()
        values = self._values(count)
        self._check_traced(values)
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
        self.validate("an update object rebuilt by a tree map")
        outer = state
        if self.in_state:
            if not isinstance(state, ScheduledState):
                raise ValueError(f"{self.label}: its options are {'scheduled' if self.scheduled else 'held'}, so its "
                                 f"state must be the ScheduledState that init() returns, got {type(state).__name__}")
            state = outer.state
        values = self._values(outer.count if self.scheduled else None)
        if self.held:
            values.update({k: outer.hyperparams[k] for k in self.held})
            self._check_values(values, self.held, "held in the state")
        self._check_traced(values)
        kwargs = self._kwargs(self.apply_fn, {**extra, **_half.opaque_halves(self.declaration, values, updates)})
        given = without_examples(self.label, updates) if self.per_example else updates
        apply_fn = _variants.apply_fn_for(self.name, self.apply_fn)  # (a backend's hinted step, or the stage's own)
        with checking(self.checked):
            if self.init_fn is None:
                updates = check_updates(self.label, given, apply_fn(updates, params, **kwargs))
            else:
                updates, state = check_stage_result(self.label, given, state,
                                                    apply_fn(updates, state, params, **kwargs))
        if self.in_state:
            state = ScheduledState(state=state, count=_tree.safe_increment(outer.count),
                                   hyperparams={k: values[k] for k in sorted(self.in_state)})
        return updates, state

    # --- value semantics ---------------------------------------------------

    def _key(self):
        options = tuple((k, key_of(v)) for k, v in self.options)
        return (self.declaration, options, self.needs_params, self.held, self.checked)

    def __eq__(self, other: object) -> bool:
        return type(other) is Stage and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore_stage, (self.declaration, self.options, self.needs_params, self.held, self.checked))

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


def _numeric_domain(domain: Domain | None) -> bool:
    """Whether a declared domain holds numbers (undeclared: whatever the option's value is)."""
    if isinstance(domain, Valid):
        domain = domain.values
    return domain is None or isinstance(domain, (Real, Integer))


def _is_key(value: Any) -> bool:
    """A typed PRNG key (``jax.random.key``): a leaf NumPy cannot read."""
    return isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jax.dtypes.prng_key)


def _is_pipeline(value: Any) -> bool:
    """An update object: a tuple of stages (checked by shape, since pipelines are built on stages)."""
    stages = getattr(value, "stages", None)
    return isinstance(stages, tuple) and all(isinstance(stage, Stage) for stage in stages)


def _checked_option(declaration: Declaration, key: str, value: Any) -> Any:
    """An option's value checked against its declared domain, as the domain stores it."""
    domain = declaration.domain(key)
    if domain is None:
        return value
    return domain.check(declaration.label, key, value, schedulable=key in declaration.schedulable)


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


def _restore_stage(declaration, options, needs_params, held=frozenset(), checked=False):
    if declaration.name is not None:
        _bind(declaration)
    stage = Stage.__new__(Stage)
    stage._set(declaration, options, needs_params, held, checked)
    return stage


def _held_value(value):
    """A held option as the state keeps it: an array of its own dtype (a Python float as the default float, an
    int as a step count, int32 or int64 under x64), so that the state's structure and dtypes are fixed at init."""
    if isinstance(value, float):
        return jnp.asarray(value, jax.dtypes.canonicalize_dtype(jnp.float64))
    if isinstance(value, int):
        return jnp.asarray(value, count_dtype())
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
    aux = (stage.declaration, static, stage.needs_params, stage.held, stage.checked, stage.dynamic, stage.scheduled)
    return children, aux


def _unflatten_stage(aux, children):
    declaration, static_options, needs_params, held, checked, dynamic, scheduled = aux
    children = iter(children)
    options = tuple((k, next(children) if k in dynamic else v) for k, v in static_options)
    stage = Stage.__new__(Stage)
    # (its leaves may be anything a tree map made of them: checked against the declaration when it is used)
    stage._set(declaration, options, needs_params, held, checked, dynamic, scheduled, valid=not dynamic)
    return stage


jax.tree_util.register_pytree_with_keys(Stage, _flatten_stage, _unflatten_stage)
