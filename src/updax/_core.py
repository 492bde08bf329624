"""Update objects, the two primitives and the pipe.

An :class:`Update` is an immutable sequence of :class:`Stage` s. A stage is a
name, one or two kernels and its options; numeric options (and nested
pipelines) are pytree leaves, everything else (flags, dtypes, functions) is
static structure. So an update object passed into ``jax.jit`` retraces only
when its structure changes, never when a number does.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import re
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree

__all__ = [
    "EmptyState",
    "ScheduledState",
    "Stage",
    "Update",
    "apply_updates",
    "combinator",
    "compose",
    "identity",
    "stateful",
    "stateless",
]


class EmptyState(NamedTuple):
    """The state of a stateless stage: it holds nothing."""


class ScheduledState(NamedTuple):
    """The state of a stage some of whose options are schedules.

    ``state`` is the stage's own state, ``count`` the steps taken, and
    ``hyperparams`` the value each scheduled option had on the last step (at
    init: its value at count 0). :meth:`Update.get_state` sees through it:
    ``"scale_by_adam.mu"`` and ``"scale_by_adam.b1"`` both resolve.
    """

    state: tuple
    count: jax.Array
    hyperparams: dict


# --------------------------------------------------------------------------
# Options: which are leaves, how they print, hash and compare.


def _is_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (numbers.Number, np.ndarray, np.generic, jax.Array))


def _is_dynamic(value) -> bool:
    """Numbers and arrays are leaves, and so is any pytree whose leaves are all numbers
    (a nested pipeline, a schedule object); the rest (flags, dtypes, functions) is structure."""
    if isinstance(value, Update) or _is_number(value):
        return True
    if isinstance(value, bool) or value is None:
        return False
    leaves, treedef = jax.tree.flatten(value)
    return treedef.num_nodes > 1 and all(_is_number(leaf) for leaf in leaves)


class _Frozen:
    """A static pytree option (a dict of labels, a list of bools) made hashable; kernels get ``.tree``."""

    __slots__ = ("tree", "_key")

    def __init__(self, tree):
        leaves, treedef = jax.tree.flatten(tree)
        object.__setattr__(self, "tree", tree)
        object.__setattr__(self, "_key", (treedef, tuple(leaves)))
        hash(self._key)

    def __setattr__(self, name, value):
        raise AttributeError("update objects are immutable")

    def __eq__(self, other):
        return type(other) is _Frozen and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def __reduce__(self):
        return (_Frozen, (self.tree,))

    def __repr__(self):
        return repr(self.tree)


def _is_key(value) -> bool:
    return isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jax.dtypes.prng_key)


def _format(value) -> str:
    if isinstance(value, jax.core.Tracer):
        return repr(value)
    if _is_key(value):
        return f"key({np.asarray(jax.random.key_data(value)).tolist()})"
    if isinstance(value, (np.ndarray, np.generic, jax.Array)):
        return np.array2string(np.asarray(value), separator=", ")
    if inspect.isfunction(value) or inspect.isbuiltin(value):
        return value.__qualname__
    return repr(value)


def _hashable(value):
    if isinstance(value, jax.core.Tracer):
        raise TypeError("an update object holding traced values cannot be hashed or compared")
    if _is_key(value):
        value = jax.random.key_data(value)
    if isinstance(value, (np.ndarray, np.generic, jax.Array)):
        array = np.asarray(value)
        return ("array", array.dtype.str, array.shape, array.tobytes())
    if not isinstance(value, Update) and _is_dynamic(value) and not _is_number(value):
        leaves, treedef = jax.tree.flatten(value)
        return ("tree", treedef, tuple(_hashable(leaf) for leaf in leaves))
    return value


@functools.lru_cache(maxsize=None)
def _keywords(fn) -> frozenset | None:
    """The option names ``fn`` takes as keywords; None when it takes ``**kwargs``."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return frozenset(p.name for p in parameters if p.kind in kinds)


# --------------------------------------------------------------------------
# Stage


class Stage:
    """One combinator in a pipeline: a name, its kernels and its options.

    Users rarely build a :class:`Stage` directly: :func:`stateless` and
    :func:`stateful` do. ``init_fn`` is None for a stateless stage. Options are
    passed by keyword to each kernel that names them in its signature.
    ``wraps`` names the option holding the pipeline a wrapper stage runs (its
    state lives in the state field of the same name). An option whose value
    is callable is a schedule: the stage evaluates it at its own step count
    and the kernels see the number, unless the option is named in
    ``callables`` (the kernels get the function) or ``static``.
    """

    __slots__ = ("name", "init_fn", "apply_fn", "options", "dynamic", "scheduled", "needs_params", "wraps")

    def __init__(self, name, init_fn, apply_fn, options=(), *, needs_params=False, wraps=None, static=(),
                 callables=()):
        options = tuple((k, _freeze(name, k, v) if not _is_dynamic(v) or k in static else v)
                        for k, v in dict(options).items())
        if wraps is not None and not isinstance(dict(options).get(wraps), Update):
            raise TypeError(f"{name}: option {wraps!r} must be an update object")
        dynamic = frozenset(k for k, v in options if _is_dynamic(v) and k not in static)
        scheduled = frozenset(k for k, v in options if callable(v) and not isinstance(v, Update)
                              and k not in static and k not in callables)
        self._set(name, init_fn, apply_fn, options, dynamic, scheduled, needs_params, wraps)

    def _set(self, *values):
        for slot, value in zip(self.__slots__, values):
            object.__setattr__(self, slot, value)

    def __setattr__(self, name, value):
        raise AttributeError("update objects are immutable")

    @property
    def label(self) -> str:
        """The name used in ``repr`` and state paths."""
        if self.name is not None:
            return self.name
        return "stateless" if self.init_fn is None else "stateful"

    def option(self, key):
        value = dict(self.options)[key]
        return value.tree if isinstance(value, _Frozen) else value

    @staticmethod
    def _kwargs(fn, values):
        accepted = _keywords(fn)
        return {k: v for k, v in values.items() if accepted is None or k in accepted}

    def _values(self, count):
        """The options, with each schedule evaluated at ``count`` (at least float32)."""
        values = {k: v.tree if isinstance(v, _Frozen) else v for k, v in self.options}
        for key in self.scheduled:
            value = jnp.asarray(values[key](count))
            if jnp.issubdtype(value.dtype, jnp.floating):
                value = value.astype(_tree.compute_dtype(value.dtype))
            values[key] = value
        return values

    def init(self, params):
        count = _tree.zero_count()
        values = self._values(count)
        state = EmptyState() if self.init_fn is None else self.init_fn(params, **self._kwargs(self.init_fn, values))
        if not self.scheduled:
            return state
        return ScheduledState(state=state, count=count, hyperparams={k: values[k] for k in sorted(self.scheduled)})

    def apply(self, updates, state, params, extra):
        if self.needs_params and params is None:
            raise ValueError(
                f"{self.label} needs params, but update() got none: call update(updates, state, params)"
            )
        outer = state
        if self.scheduled:
            if not isinstance(state, ScheduledState):
                raise ValueError(f"{self.label}: its options are scheduled, so its state must be the "
                                 f"ScheduledState that init() returns, got {type(state).__name__}")
            values, state = self._values(outer.count), outer.state
        else:
            values = {k: v.tree if isinstance(v, _Frozen) else v for k, v in self.options}
        kwargs = self._kwargs(self.apply_fn, {**extra, **values})
        if self.init_fn is None:
            updates = self.apply_fn(updates, params, **kwargs)
        else:
            updates, state = self.apply_fn(updates, state, params, **kwargs)
        if self.scheduled:
            state = ScheduledState(state=state, count=_tree.safe_increment(outer.count),
                                   hyperparams={k: values[k] for k in sorted(self.scheduled)})
        return updates, state

    # --- value semantics ---------------------------------------------------

    def _key(self):
        options = tuple((k, _hashable(v)) for k, v in self.options)
        return (self.name, self.init_fn, self.apply_fn, options, self.needs_params, self.wraps)

    def __eq__(self, other):
        return type(other) is Stage and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __reduce__(self):
        return (_restore_stage, (self.name, self.init_fn, self.apply_fn, self.options, self.dynamic,
                                 self.scheduled, self.needs_params, self.wraps))

    def _arguments(self, *, with_wrapped: bool) -> str:
        shown = []
        if self.name is None:
            shown += [_format(fn) for fn in (self.init_fn, self.apply_fn) if fn is not None]
        for key, value in self.options:
            if key == self.wraps:
                if with_wrapped and value.stages:
                    shown.insert(0, repr(value))
            elif value is not None:
                shown.append(f"{key}={_format(value)}")
        return f"{self.label}({', '.join(shown)})"

    def __repr__(self):
        return self._arguments(with_wrapped=True)


def _freeze(name, key, value):
    """A static option as it is stored: itself if hashable, else a frozen pytree of hashable leaves."""
    try:
        hash(value)
        return value
    except TypeError:
        pass
    try:
        return _Frozen(value)
    except TypeError:
        raise TypeError(f"{name or 'stage'}({key}={value!r}): an option must be a number, an array, a "
                        "hashable value or a pytree of them") from None


def _restore_stage(*values):
    stage = Stage.__new__(Stage)
    stage._set(*values)
    return stage


def _flatten_stage(stage):
    children = [(jax.tree_util.GetAttrKey(k), v) for k, v in stage.options if k in stage.dynamic]
    static = tuple((k, None if k in stage.dynamic else v) for k, v in stage.options)
    aux = (stage.name, stage.init_fn, stage.apply_fn, static, stage.dynamic, stage.scheduled, stage.needs_params,
           stage.wraps)
    return children, aux


def _unflatten_stage(aux, children):
    name, init_fn, apply_fn, static, dynamic, scheduled, needs_params, wraps = aux
    children = iter(children)
    options = tuple((k, next(children) if k in dynamic else v) for k, v in static)
    return _restore_stage(name, init_fn, apply_fn, options, dynamic, scheduled, needs_params, wraps)


jax.tree_util.register_pytree_with_keys(Stage, _flatten_stage, _unflatten_stage)


# --------------------------------------------------------------------------
# Fused execution paths: the same numbers from fewer passes over memory.

_FUSED_PATHS: list[tuple[tuple, Callable]] = []


def register_fused_path(kernels: tuple, run: Callable) -> None:
    """Runs consecutive stages whose apply kernels are ``kernels`` through ``run`` instead of one by one.

    ``run(stages, updates, states, params, extra) -> (updates, new_states)``
    must return exactly what applying the stages one after another returns
    (a parity test checks every registered path); it may fall back to
    ``stage.apply`` for inputs it does not handle. It is used only when none
    of the stages has a scheduled option and params are given. This is an
    execution detail: the pipeline, its repr and its state are unchanged.
    """
    _FUSED_PATHS.append((tuple(kernels), run))


def _fused_path(stages, params):
    """The fused run covering a prefix of ``stages`` and its width, or ``(None, 1)``."""
    if params is None:
        return None, 1
    for kernels, run in _FUSED_PATHS:
        width = len(kernels)
        prefix = stages[:width]
        if (len(prefix) == width and all(s.apply_fn is k for s, k in zip(prefix, kernels))
                and not any(s.scheduled for s in prefix)):
            return run, width
    return None, 1


# --------------------------------------------------------------------------
# Update


_SELECTOR = re.compile(r"^(?P<name>[A-Za-z_][\w]*)(?:\[(?P<index>\d+)\])?$")


class Update:
    """An update object: an immutable pipeline of stages.

    Build one with the catalogue (``ux.scale_by_adam().scale(-1e-3)``) or the
    primitives :func:`stateless` / :func:`stateful`. It has ``init(params)``
    and ``update(updates, state, params=None)``, unpacks into
    ``(init_fn, update_fn)`` like Axon's tuple, prints in pipe notation, and is
    a pytree whose numeric hyperparameters are leaves.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_adam().scale(-1e-3)
        >>> opt
        scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=1e-15) |> scale(step_size=-0.001)
        >>> params = {"w": jnp.ones(2)}
        >>> state = opt.init(params)
        >>> updates, state = opt.update({"w": jnp.array([1.0, -1.0])}, state, params)
        >>> updates["w"]
        Array([-0.001,  0.001], dtype=float32)
        >>> opt.get_state(state, "scale_by_adam.count")
        Array(1, dtype=int32)
    """

    __slots__ = ("stages",)

    def __init__(self, stages=()):
        stages = tuple(stages)
        for stage in stages:
            if not isinstance(stage, Stage):
                raise TypeError(f"Update(stages=...): expected Stage objects, got {stage!r}")
        object.__setattr__(self, "stages", stages)

    def __setattr__(self, name, value):
        raise AttributeError("update objects are immutable")

    # --- the optax-compatible interface -------------------------------------

    def init(self, params):
        """Returns the initial state: a tuple with one entry per stage, in pipeline order."""
        return tuple(stage.init(params) for stage in self.stages)

    def update(self, updates, state, params=None, **extra):
        """Transforms ``updates``; returns ``(updates, new_state)``.

        Extra keyword arguments (e.g. ``loss=``) reach the stages whose kernels
        name them and are ignored by the others.
        """
        if not isinstance(state, (tuple, list)) or len(state) != len(self.stages):
            got = f"{type(state).__name__} of length {len(state)}" if isinstance(state, (tuple, list)) else (
                type(state).__name__)
            raise ValueError(
                f"{self!r}: state must be the tuple of {len(self.stages)} stage states that init() "
                f"returns, got a {got}"
            )
        new_state, i = [], 0
        while i < len(self.stages):
            run, width = _fused_path(self.stages[i:], params)
            if run is None:
                updates, stage_state = self.stages[i].apply(updates, state[i], params, extra)
                new_state.append(stage_state)
            else:
                updates, states = run(self.stages[i:i + width], updates, tuple(state[i:i + width]), params, extra)
                new_state.extend(states)
            i += width
        return updates, tuple(new_state)

    def __iter__(self):
        yield self.init
        yield self.update

    def pipe(self, fn, *args, **kwargs):
        """``fn(self, *args, **kwargs)``: pipes this object into any combinator."""
        return fn(self, *args, **kwargs)

    # --- reading and replacing state by name --------------------------------

    def _resolve(self, path: str):
        """Turns ``"a/b[1].field"`` into ([(stage index, wrapped option or None)], field, last stage)."""
        if not isinstance(path, str) or not path:
            raise TypeError(f"a state path is a string like 'scale_by_adam.mu', got {path!r}")
        stages_part, _, field = path.partition(".")
        selectors = stages_part.split("/")
        steps, current = [], self
        for depth, selector in enumerate(selectors):
            match = _SELECTOR.match(selector)
            if not match:
                raise KeyError(f"bad stage selector {selector!r} in {path!r}: use 'name' or 'name[k]'")
            name, index = match["name"], match["index"]
            found = [i for i, stage in enumerate(current.stages) if stage.label == name]
            labels = [stage.label for stage in current.stages]
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

    @staticmethod
    def _where(path, stage, entry, field):
        """Where ``field`` of a stage's state entry lives: 'state', 'scheduled' or 'option'."""
        own = entry.state if isinstance(entry, ScheduledState) else entry
        if field in getattr(own, "_fields", ()):
            return "state"
        if isinstance(entry, ScheduledState) and field in entry.hyperparams:
            return "scheduled"
        if field in stage.dynamic and not isinstance(stage.option(field), Update):
            return "option"
        hyper = sorted(k for k in stage.dynamic | stage.scheduled if not isinstance(stage.option(k), Update))
        raise KeyError(f"{path!r}: the state {type(own).__name__} has no field {field!r} "
                       f"(fields: {list(getattr(own, '_fields', ()))}; hyperparameters: {hyper})")

    def _entry(self, state, steps):
        node = state
        for position, wrapped in steps:
            node = node[position]
            if wrapped is not None:
                node = getattr(node.state if isinstance(node, ScheduledState) else node, wrapped)
        return node

    def get_state(self, state, path: str):
        """Reads a stage's state, one field of it, or one of its hyperparameters, by name.

        ``path`` is a stage name (``"scale_by_adam"``), optionally with a field
        (``"scale_by_adam.count"``). ``"trace[1]"`` picks the second of two
        stages of the same kind; ``"accumulate_gradients/scale_by_adam.mu"``
        reaches into the pipeline a wrapper stage runs. A hyperparameter name
        (``"scale_by_learning_rate.learning_rate"``) gives the value used on
        the last step: from the state when it is scheduled, else the option.
        """
        steps, field, stage = self._resolve(path)
        entry = self._entry(state, steps)
        if field is None:
            return entry
        where = self._where(path, stage, entry, field)
        if where == "state":
            return getattr(entry.state if isinstance(entry, ScheduledState) else entry, field)
        if where == "scheduled":
            return entry.hyperparams[field]
        return stage.option(field)

    def replace_state(self, state, path: str, value):
        """Returns ``state`` with the stage state or field at ``path`` replaced.

        The new value keeps the old one's tree structure, shapes and dtypes (a
        Python number becomes an array of the old dtype), so a jitted step does
        not recompile. See :meth:`get_state` for paths. Hyperparameters are
        not state: build the object with a new value instead (passed into a
        jitted step as an argument, that does not recompile either).
        """
        steps, field, stage = self._resolve(path)
        entry = self._entry(state, steps)
        if field is not None and self._where(path, stage, entry, field) != "state":
            raise KeyError(f"replace_state({path!r}): {field} is a hyperparameter, not state; build the "
                           f"update object with the new value (or a schedule) instead")
        value = _like(path, self.get_state(state, path), value)

        def rebuild(node, depth):
            position, wrapped = steps[depth]
            child = node[position]
            if wrapped is not None or field is not None:
                own = child.state if isinstance(child, ScheduledState) else child
                if wrapped is not None:
                    own = own._replace(**{wrapped: rebuild(getattr(own, wrapped), depth + 1)})
                else:
                    own = own._replace(**{field: value})
                child = child._replace(state=own) if isinstance(child, ScheduledState) else own
            else:
                child = value
            return tuple(node[:position]) + (child,) + tuple(node[position + 1:])

        return rebuild(state, 0)

    # --- value semantics ---------------------------------------------------

    def __eq__(self, other):
        return type(other) is Update and self.stages == other.stages

    def __hash__(self):
        return hash(("Update", self.stages))

    def __reduce__(self):
        return (Update, (self.stages,))

    def __repr__(self):
        if not self.stages:
            return "identity()"
        parts = [self.stages[0]._arguments(with_wrapped=False)]
        head = self.stages[0]
        if head.wraps is not None and head.option(head.wraps).stages:
            # A leading wrapper wraps everything before it: print that first.
            parts.insert(0, repr(head.option(head.wraps)))
        parts += [repr(stage) for stage in self.stages[1:]]
        return " |> ".join(parts)


def _like(path, old, value):
    """Casts ``value`` to the structure, shapes and dtypes of ``old``."""
    def cast(o, v):
        if isinstance(o, (jax.Array, np.ndarray, np.generic)):
            v = jnp.asarray(v, dtype=o.dtype)
            if v.shape != o.shape:
                raise ValueError(f"replace_state({path!r}): shape {v.shape} differs from the current {o.shape}")
        return v

    if isinstance(old, (jax.Array, np.ndarray, np.generic)):
        return cast(old, value)
    _tree.check_same_structure(f"replace_state({path!r})", old, value, "the current state", "the new value")
    return jax.tree.map(cast, old, value)


jax.tree_util.register_pytree_with_keys(
    Update,
    lambda u: ([(jax.tree_util.SequenceKey(i), s) for i, s in enumerate(u.stages)], None),
    lambda _, stages: Update(stages),
)


# --------------------------------------------------------------------------
# Combinators: the leading-parent form and the fluent method, written once.

_REGISTRY: dict[str, Callable[..., Update]] = {}


def combinator(factory=None, *, wraps: bool = False, name: str | None = None):
    """Registers a combinator so that all four pipe forms work for it.

    ``factory(*args, **options)`` returns an :class:`Update`. The registered
    function also accepts a leading parent, ``f(parent, *args, **options)``,
    meaning ``parent`` then ``f``, and ``parent.f(*args, **options)`` becomes a
    method of every update object. With ``wraps=True`` the factory receives
    the parent (``identity()`` when none is given) as its first argument and
    decides how to run it, as :func:`updax.accumulate_gradients` does.

    Kernels are compared by identity, so define them once (at module level),
    not as a fresh lambda per call, or two equal-looking objects differ.

    Example:
        >>> import jax
        >>> import updax as ux
        >>> def negate(updates, params):
        ...     return jax.tree.map(lambda g: -g, updates)
        >>> @ux.combinator
        ... def flip_sign():
        ...     return ux.stateless(negate, name="flip_sign")
        >>> ux.scale(2.0).flip_sign() == flip_sign(ux.scale(2.0)) == ux.scale(2.0).pipe(flip_sign)
        True
    """

    def register(factory):
        fname = name or factory.__name__

        @functools.wraps(factory)
        def build(*args, **kwargs):
            parent = None
            if args and isinstance(args[0], Update):
                parent, args = args[0], args[1:]
            if wraps:
                return factory(Update() if parent is None else parent, *args, **kwargs)
            made = factory(*args, **kwargs)
            if not isinstance(made, Update):
                raise TypeError(f"combinator {fname} returned {type(made).__name__}, not an update object")
            return made if parent is None else compose(parent, made)

        previous = _REGISTRY.get(fname)
        if previous is None and hasattr(Update, fname):
            raise ValueError(f"cannot register combinator {fname!r}: it would hide Update.{fname}")
        origin = (factory.__module__, factory.__qualname__)
        if previous is not None and (previous.__module__, previous.__qualname__) != origin:
            # Re-running the same definition (a reloaded module, a notebook cell) replaces it;
            # another definition must not silently take over a name everyone's pipelines use.
            raise ValueError(f"cannot register combinator {fname!r} from {origin[0]}: "
                             f"{previous.__module__}.{previous.__qualname__} already has that name")

        def method(self, *args, **kwargs):
            return build(self, *args, **kwargs)

        functools.update_wrapper(method, factory)
        setattr(Update, fname, method)
        _REGISTRY[fname] = build
        return build

    return register if factory is None else register(factory)


# --------------------------------------------------------------------------
# The primitives


def _check_callable(call, name, fn):
    if not callable(fn):
        raise TypeError(f"{call}({name}={fn!r}): {name} must be callable")


@combinator
def stateless(apply_fn, *, name=None, options=None, needs_params=False, static=(), callables=()):
    """A stage without state.

    Args:
        apply_fn: ``apply_fn(updates, params, **options) -> updates``; it gets
            the options its signature names, by keyword. No default.
        name: the name shown in ``repr`` and used in state paths. Default:
            ``None`` (shown as ``stateless(apply_fn)``).
        options: a mapping of hyperparameters. Numbers and arrays are pytree
            leaves (a jitted step does not retrace when they change); other
            values are static and must be hashable. Default: ``None``.
        needs_params: raise a clear error when ``update`` gets no params.
            Default: ``False``.
        static: option names passed to the kernels as they are: kept static
            even when numeric, and not evaluated as schedules when callable.
            Default: ``()``.
        callables: option names whose callable values the kernels get as
            functions, not evaluated as schedules (a schedule object there
            still has its numbers as leaves). Default: ``()``.

    Returns:
        An :class:`Update` with one stage.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import updax as ux
        >>> def negate(updates, params):
        ...     return jax.tree.map(lambda g: -g, updates)
        >>> opt = ux.stateless(negate)
        >>> opt
        stateless(negate)
        >>> opt.update({"w": jnp.array([1.0])}, opt.init(None))[0]
        {'w': Array([-1.], dtype=float32)}
    """
    _check_callable("stateless", "apply_fn", apply_fn)
    stage = Stage(name, None, apply_fn, options or {}, needs_params=needs_params, static=static, callables=callables)
    return Update((stage,))


@combinator
def stateful(init_fn, apply_fn, *, name=None, options=None, needs_params=False, static=(), callables=(),
             wraps=None):
    """A stage with state.

    Args:
        init_fn: ``init_fn(params, **options) -> state``, best a NamedTuple
            with descriptive fields. No default.
        apply_fn: ``apply_fn(updates, state, params, **options) -> (updates,
            state)``; each function gets the options its signature names.
            No default.
        name: the name shown in ``repr`` and used in state paths. Default:
            ``None`` (shown as ``stateful(init_fn, apply_fn)``).
        options: a mapping of hyperparameters (see :func:`stateless`).
            Default: ``None``.
        needs_params: raise a clear error when ``update`` gets no params.
            Default: ``False``.
        static: option names passed to the kernels as they are: kept static
            even when numeric, and not evaluated as schedules when callable.
            Default: ``()``.
        callables: option names whose callable values the kernels get as
            functions, not evaluated as schedules (a schedule object there
            still has its numbers as leaves). Default: ``()``.
        wraps: the option holding a pipeline this stage runs; its state must
            be stored in the state field of the same name. Default: ``None``.

    Returns:
        An :class:`Update` with one stage.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from typing import NamedTuple
        >>> import updax as ux
        >>> class CountState(NamedTuple):
        ...     count: jax.Array
        >>> def init(params):
        ...     return CountState(jnp.zeros([], jnp.int32))
        >>> def apply(updates, state, params, *, by):
        ...     return jax.tree.map(lambda g: g * by, updates), CountState(state.count + 1)
        >>> opt = ux.stateful(init, apply, name="counted_scale", options={"by": 2.0})
        >>> opt
        counted_scale(by=2.0)
        >>> updates, state = opt.update({"w": jnp.array([1.0])}, opt.init(None))
        >>> updates["w"], opt.get_state(state, "counted_scale.count")
        (Array([2.], dtype=float32), Array(1, dtype=int32))
    """
    _check_callable("stateful", "init_fn", init_fn)
    _check_callable("stateful", "apply_fn", apply_fn)
    stage = Stage(name, init_fn, apply_fn, options or {}, needs_params=needs_params, static=static,
                  callables=callables, wraps=wraps)
    return Update((stage,))


def identity() -> Update:
    """The empty pipeline: updates pass through unchanged.

    Example:
        >>> import updax as ux
        >>> ux.identity()
        identity()
        >>> ux.compose(ux.identity(), ux.scale(2.0)) == ux.scale(2.0)
        True
    """
    return Update()


def compose(*updates: Update) -> Update:
    """``a`` then ``b`` then ...: one pipeline whose state is the stages' states in order.

    Example:
        >>> import updax as ux
        >>> ux.compose(ux.clip(delta=1.0), ux.scale(-0.1))
        clip(delta=1.0) |> scale(step_size=-0.1)
    """
    stages = []
    for i, update in enumerate(updates):
        if not isinstance(update, Update):
            raise TypeError(f"compose: argument {i} is {type(update).__name__}, not an update object")
        stages.extend(update.stages)
    return Update(stages)


def apply_updates(params, updates):
    """``params + updates``, leaf by leaf, keeping each param's dtype.

    The sum is computed in the wider of the two dtypes, then cast back.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> ux.apply_updates({"w": jnp.ones(2, jnp.bfloat16)}, {"w": jnp.full(2, 0.5)})
        {'w': Array([1.5, 1.5], dtype=bfloat16)}
    """
    def add(p, u):
        p, u = jnp.asarray(p), jnp.asarray(u)
        wide = _tree.wider(p.dtype, u.dtype)
        return (p.astype(wide) + u.astype(wide)).astype(p.dtype)

    _tree.check_same_structure("apply_updates", params, updates, "params", "updates")
    return jax.tree.map(add, params, updates)

