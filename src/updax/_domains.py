"""Domains: what an option or a state field may hold, declared once and checked wherever a value enters.

A stage declares a :class:`Domain` per option (``domains={"b1": Real(0, 1,
hi_open=True)}``) and :class:`Relation` values between options
(``min_step_size <= max_step_size``); a state NamedTuple declares what each
field holds with an annotation (``count: Count``). One checker reads those
declarations on every path a value takes into a pipeline: the constructor,
``replace_state``, :func:`updax.hyperparams_in_state`, the held values on
each eager step, the values a schedule returns, an update object rebuilt by a
tree map, and (opt-in, under ``jax.jit``) :func:`updax.checked`. Each path
raises the same message, naming the call, the option and the value::

    scale_by_adam(b1=1.5): b1 must be in [0, 1)

A path that is not the constructor says where the value came from in
parentheses after it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import numbers
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Annotated, Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np

from updax._options import canonical, format_value

__all__ = ["ANY_REAL", "COUNT", "Count", "Domain", "Flag", "FlagField", "FloatDtype", "Function", "Integer",
           "LEARNING_RATE", "MomentField", "NON_NEGATIVE", "NonNegativeField", "OneOf", "POSITIVE", "Pipeline",
           "Pipelines", "Quantizable", "Real", "Relation", "SecondMomentField", "UNIT", "Unchecked", "Valid",
           "count_dtype", "count_limit_text", "count_max", "fail", "field_domain", "field_quantizable",
           "fits_dtype", "is_concrete", "message", "checking", "returned", "scalar_input"]

INT32_MAX = 2**31 - 1


def count_dtype() -> np.dtype:
    """The step counters' dtype: int32, or int64 under ``jax_enable_x64`` (read when a state is built)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(jnp.int64))


def count_max() -> int:
    """The largest step count: 2**31 - 1, or 2**63 - 1 under ``jax_enable_x64``."""
    return int(np.iinfo(count_dtype()).max)


def count_limit_text() -> str:
    if count_max() > INT32_MAX:
        return "must be at most 2**63 - 1 (step counters are int64)"
    return "must be at most 2**31 - 1 (step counters are int32; int64 under jax_enable_x64)"


def message(call: str, name: str, value: Any, what: str, where: str = "") -> str:
    """The one error format: ``call(name=value): name what``, with ``(where)`` after it when given."""
    shown = value if isinstance(value, str) and value.startswith("<") else _shown(value)
    return f"{call}({name}={shown}): {name} {what}{f' ({where})' if where else ''}"


def _shown(value: Any) -> str:
    if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer) and value.ndim == 0 \
            and not jnp.issubdtype(value.dtype, jax.dtypes.prng_key):
        value = np.asarray(value)
    if isinstance(value, (np.ndarray, np.generic)) and np.ndim(value) == 0 and value.dtype.kind in "biuf":
        return str(np.asarray(value)[()])  # a value read back from the state: the number it is, in its dtype
    if isinstance(value, np.ndarray) and value.size > 16:
        return format_value(value)  # (its shape and a digest, not a page of numbers)
    return repr(value)


def fail(call: str, name: str, value: Any, what: str, exc: type[Exception] = ValueError, where: str = "") -> NoReturn:
    raise exc(message(call, name, value, what, where))


def is_concrete(value: Any) -> bool:
    """Whether every leaf of ``value`` can be read in Python (no JAX tracer, no abstract shape)."""
    return not any(isinstance(leaf, (jax.core.Tracer, jax.ShapeDtypeStruct)) for leaf in jax.tree.leaves(value))


def _is_schedule(value: Any) -> bool:
    """A callable that is not an array or a class: a schedule ``count -> value``."""
    return callable(value) and not isinstance(value, (jax.Array, np.ndarray, np.generic, type))


def _is_array(value: Any) -> bool:
    return isinstance(value, (jax.Array, np.ndarray, np.generic))


def _numeric(values: Any) -> np.ndarray:
    """``values`` as a NumPy array NumPy's own predicates read: bfloat16 and float8 (ml_dtypes, which NumPy
    does not count as floating) as float32, exactly."""
    x = np.asarray(values)
    if jnp.issubdtype(x.dtype, jnp.floating) and not np.issubdtype(x.dtype, np.floating):
        return x.astype(np.float32)
    return x


class Domain:
    """What one option or state field may hold.

    ``check`` takes a value as the user gives it (when the object is built)
    and returns it as stored, or raises naming the call, the option and the
    value. ``check_values`` takes the concrete values of a value already in
    a pipeline (held in the state, returned by a schedule, written by a tree
    map) as a NumPy array. ``holds`` is the same test as a traced boolean,
    for :func:`updax.checked` under ``jax.jit``; None where a domain has no
    numeric test. ``text`` is what a value must be: ``"must be in [0, 1)"``.
    """

    text: str = "may be anything"
    hint: str = ""

    @property
    def refusal(self) -> str:
        """What a refused value is told: ``text``, and the hint after it."""
        return self.text + (f"; {self.hint}" if self.hint else "")

    def check(self, call: str, name: str, value: Any, *, schedulable: bool = False) -> Any:
        return value

    def check_values(self, call: str, name: str, values: Any, where: str) -> None:
        """Raises unless the concrete ``values`` (a number or a NumPy array) lie in the domain."""

    def holds(self, value: jax.Array) -> jax.Array | None:
        return None


@dataclasses.dataclass(frozen=True)
class Unchecked(Domain):
    """Any value: the option's kernel decides (a user's option declared without a domain is unchecked)."""


def _interval(lo, hi, lo_open, hi_open) -> str:
    left = "(" if lo_open or lo is None else "["
    right = ")" if hi_open or hi is None else "]"
    low = "-inf" if lo is None else f"{lo:g}"
    high = "inf" if hi is None else f"{hi:g}"
    return f"{left}{low}, {high}{right}"


@dataclasses.dataclass(frozen=True)
class Real(Domain):
    """A finite real number in an interval (ends open or closed, None for unbounded).

    Python ints become floats; a JAX or NumPy real scalar keeps its dtype (a
    NumPy one is copied). Where the stage declares the option schedulable, a
    callable is a schedule ``count -> value``: it is kept, and its values are
    checked against this domain when they are concrete. NaN and infinities
    are refused whatever the interval (``+inf`` is taken where ``inf`` is set
    and ``hi`` is None: an option to which it means something, such as a
    line search's growth factor), and so are complex and boolean values.
    """

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    #: the hint appended to an out-of-range message (``"for ascent, pass maximize=True"``)
    hint: str = ""
    #: whether +inf is in the domain (with ``hi`` None)
    inf: bool = False

    @property
    def text(self) -> str:  # type: ignore[override]
        if self.lo is None and self.hi is None:
            return "must be a finite number"
        interval = _interval(self.lo, self.hi, self.lo_open, self.hi_open)
        return f"must be in {interval[:-1] + ']' if self.inf else interval}"

    def _infinite(self, x):
        """Where ``x`` is the +inf the domain takes (nowhere unless ``inf``)."""
        return (x == np.inf) if self.inf else np.zeros(np.shape(x), bool)

    def _outside(self, x: np.ndarray) -> np.ndarray:
        bad = ~np.isfinite(x) & ~self._infinite(x)
        with np.errstate(invalid="ignore"):
            if self.lo is not None:
                bad |= x <= self.lo if self.lo_open else x < self.lo
            if self.hi is not None:
                bad |= x >= self.hi if self.hi_open else x > self.hi
        return bad

    def _refuse(self, call, name, value, where=""):
        fail(call, name, value, self.refusal, ValueError, where)

    def check(self, call: str, name: str, value: Any, *, schedulable: bool = False) -> Any:
        if schedulable and _is_schedule(value):
            return value
        if isinstance(value, bool) or value is None:
            fail(call, name, value, "must be a real number", TypeError)
        if isinstance(value, numbers.Real):
            concrete = float(value)
            value = concrete if isinstance(value, numbers.Integral) and not _is_array(value) else value
        elif _is_array(value):
            dtype = jnp.result_type(value)
            if jnp.ndim(value) != 0 or not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)):
                fail(call, name, value, "must be a real scalar", TypeError)
            if not is_concrete(value):
                return value
            value = canonical(value)  # a NumPy array becomes a read-only copy the caller cannot change
            concrete = float(value)
        elif callable(value) and not isinstance(value, type):
            fail(call, name, value, "must be a real number (it cannot be a schedule here)", TypeError)
        else:
            fail(call, name, value, "must be a real number", TypeError)
        if not (math.isfinite(concrete) or (self.inf and concrete == math.inf)) or self._outside_scalar(concrete):
            self._refuse(call, name, value)
        return value

    def _outside_scalar(self, x: float) -> bool:
        """:meth:`_outside` for one finite Python float (the constructor's case: no NumPy on the way)."""
        if self.lo is not None and (x <= self.lo if self.lo_open else x < self.lo):
            return True
        return self.hi is not None and (x >= self.hi if self.hi_open else x > self.hi)

    def check_values(self, call: str, name: str, values: Any, where: str) -> None:
        x = _numeric(values)
        if np.iscomplexobj(x) and not np.any(x.imag):
            x = x.real  # (a complex state field holding real numbers: a second moment of complex updates)
        if np.iscomplexobj(x) or not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
            fail(call, name, values, "must be a real number", TypeError, where)
        if np.any(self._outside(x.astype(np.float64))):
            self._refuse(call, name, values, where)

    def holds(self, value: jax.Array) -> jax.Array:
        ok = jnp.isfinite(value) | ((value == jnp.inf) if self.inf else False)
        if self.lo is not None:
            ok &= value > self.lo if self.lo_open else value >= self.lo
        if self.hi is not None:
            ok &= value < self.hi if self.hi_open else value <= self.hi
        return jnp.all(ok)


ANY_REAL = Real()
"""Any finite real number."""
UNIT = Real(0.0, 1.0, hi_open=True)
"""A decay rate: [0, 1)."""
NON_NEGATIVE = Real(0.0)
"""Real numbers >= 0 (an eps, a weight decay)."""
POSITIVE = Real(0.0, lo_open=True)
"""Real numbers > 0."""
LEARNING_RATE = Real(0.0, hint="the step's sign is the optimizer's: for gradient ascent pass maximize=True")
"""A learning rate: >= 0, the sign being the optimizer's (``maximize=True`` for ascent)."""


@dataclasses.dataclass(frozen=True)
class Integer(Domain):
    """A Python integer in ``[lo, hi]`` (``hi`` None: up to the step counters' maximum, 2**31 - 1, or 2**63 - 1
    under ``jax_enable_x64``, since it meets them in arithmetic);
    ``why`` says why the upper bound, e.g. that a loop is unrolled. ``late=True`` is an option added to a stage
    after it shipped: stored as None at its default (``default``), as :class:`Flag`'s ``late``."""

    lo: int = 0
    hi: int | None = None
    why: str = ""
    #: whether a 0-d integer array is taken too (an offset a jitted function passes in): checked when concrete
    #: (and kept as a Python integer), kept as it is when traced
    arrays: bool = False
    late: bool = False
    default: int = 0

    @property
    def text(self) -> str:  # type: ignore[override]
        if self.hi is not None:
            return f"must be an integer in [{self.lo}, {self.hi}]{self.why}"
        return {0: "must be a non-negative integer", 1: "must be a positive integer"}.get(
            self.lo, f"must be an integer >= {self.lo}")

    def check(self, call: str, name: str, value: Any, *, schedulable: bool = False) -> Any:
        if self.late and value is None:
            return None
        if self.arrays and _is_array(value) and jnp.ndim(value) == 0 \
                and jnp.issubdtype(jnp.result_type(value), jnp.integer):
            if not is_concrete(value):
                return value
            value = int(np.asarray(value))
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or _is_array(value):
            if isinstance(value, (np.integer,)) and not isinstance(value, bool):
                value = int(value)
            else:
                fail(call, name, value, self.text, TypeError)
        self.check_values(call, name, np.asarray(value), "")
        return None if self.late and int(value) == self.default else int(value)

    def check_values(self, call: str, name: str, values: Any, where: str) -> None:
        x = _numeric(values)
        if x.dtype == np.bool_ or not np.issubdtype(x.dtype, np.number) or np.iscomplexobj(x):
            fail(call, name, values, self.text, TypeError, where)
        whole = np.all(np.isfinite(x) & (x == np.round(x))) if np.issubdtype(x.dtype, np.floating) else True
        if not whole or (x.size and (np.min(x) < self.lo or (self.hi is not None and np.max(x) > self.hi))):
            fail(call, name, values, self.text, ValueError, where)
        if x.size and np.max(x) > count_max():
            fail(call, name, values, count_limit_text(), ValueError, where)

    def holds(self, value: jax.Array) -> jax.Array:
        ok = value >= self.lo
        if jnp.issubdtype(value.dtype, jnp.floating):
            ok &= jnp.isfinite(value) & (value == jnp.round(value))
        hi = count_max() if self.hi is None else self.hi
        return jnp.all(ok & (value <= hi))


COUNT = Integer(0)
"""A step counter: an int32 (int64 under ``jax_enable_x64``) that is never negative."""


@dataclasses.dataclass(frozen=True)
class Flag(Domain):
    """True or False. ``late=True`` is a flag added to a stage after it shipped: stored as None at its
    default (``default``), so that pipelines built before it print and compare as they did (None, its stored
    form, is its default too)."""

    late: bool = False
    default: bool = False
    text: str = "must be True or False"

    def check(self, call: str, name: str, value: Any, *, schedulable: bool = False) -> Any:
        if isinstance(value, np.bool_):
            value = bool(value)
        if self.late and value is None:
            return None
        if not isinstance(value, bool):
            fail(call, name, value, self.text, TypeError)
        return None if self.late and value == self.default else value

    def check_values(self, call: str, name: str, values: Any, where: str) -> None:
        x = _numeric(values)
        if not (x.dtype == np.bool_ or (np.issubdtype(x.dtype, np.number) and np.all((x == 0) | (x == 1)))):
            fail(call, name, values, "must be True or False (or 1 or 0)", ValueError, where)


@dataclasses.dataclass(frozen=True)
class OneOf(Domain):
    """One of a few values (names, mostly): ``OneOf(("sps", "sps+"))``. ``late=True`` is a choice added to a
    stage after it shipped: stored as None at its default (``default``), as :class:`Flag`'s ``late``, so that
    pipelines built before it print and compare as they did (None, its stored form, is its default too)."""

    choices: tuple = ()
    late: bool = False
    default: Any = None

    @property
    def text(self) -> str:  # type: ignore[override]
        return "must be " + " or ".join(repr(c) for c in self.choices)

    def check(self, call: str, name: str, value: Any, *, schedulable: bool = False) -> Any:
        try:
            known = any(type(value) is type(c) and value == c for c in self.choices)
        except (TypeError, ValueError):
            known = False
        if self.late and value is None:
            return None
        if not known:
            fail(call, name, value, self.text, ValueError)
        return None if self.late and value == self.default else value


@dataclasses.dataclass(frozen=True)
class FloatDtype(Domain):
    """None (at least float32, the default) or a floating dtype, stored as its name; a complex dtype too where
    ``complex`` (a first moment of real updates kept complex, as optax allows: its imaginary part stays 0)."""

    complex: bool = False

    @property
    def text(self) -> str:  # type: ignore[override]
        return "must be None or a floating or complex dtype" if self.complex else "must be None or a floating dtype"

    def check(self, call: str, name: str, value: Any, *, schedulable: bool = False) -> Any:
        if value is None:
            return None
        try:
            dtype = jnp.dtype(value)
        except TypeError:
            fail(call, name, value, self.text, TypeError)
        if not (jnp.issubdtype(dtype, jnp.floating) or (self.complex and jnp.issubdtype(dtype, jnp.complexfloating))):
            fail(call, name, value, self.text, TypeError)
        return dtype.name


@dataclasses.dataclass(frozen=True)
class Function(Domain):
    """A callable (None too, where ``optional``)."""

    optional: bool = False

    @property
    def text(self) -> str:  # type: ignore[override]
        return "must be callable or None" if self.optional else "must be callable"

    def check(self, call: str, name: str, value: Any, *, schedulable: bool = False) -> Any:
        if value is None and self.optional:
            return None
        if not callable(value):
            fail(call, name, value, self.text, TypeError)
        return value


#: The class of update objects, set by :mod:`updax._update` when it is defined (update objects are built on stages,
#: which use domains, so this module cannot import it).
PIPELINE_TYPES: list[type] = []


def _is_update(value: Any) -> bool:
    return isinstance(value, tuple(PIPELINE_TYPES))


@dataclasses.dataclass(frozen=True)
class Pipeline(Domain):
    """An update object: the pipeline a wrapper runs (its ``wraps`` option), or one a stage runs inside it on
    what it makes of the updates (GaLore's ``base_optimizer``: its state in the stage's state field of the
    option's name). ``optional``: None is taken too (the stage's built-in rule). ``without_params``: the
    pipeline runs on something other than the params' gradients, so a stage of it that needs params is
    refused (``why`` says what it runs on)."""

    optional: bool = False
    without_params: bool = False
    why: str = ""

    @property
    def text(self) -> str:  # type: ignore[override]
        return "must be an update object or None" if self.optional else "must be an update object"

    def check(self, call: str, name: str, value: Any, *, schedulable: bool = False) -> Any:
        if not (_is_update(value) or (self.optional and value is None)):
            fail(call, name, value, self.text, TypeError)
        if self.without_params and value is not None:
            needing = [stage.label for stage in value.stages if stage.reads_params()]
            if needing:
                fail(call, name, value, f"must not need params ({', '.join(needing)} does){self.why}", ValueError)
        return value


@dataclasses.dataclass(frozen=True)
class Pipelines(Domain):
    """A dict ``{label: update object}``: pipelines run on groups of leaves, their states kept by label in the
    state field ``field``. Labels are hashable and, since JAX sorts a dict's keys, sortable among themselves."""

    field: str = "inner"
    text: str = "must be a dict {label: update object}"

    def check(self, call: str, name: str, value: Any, *, schedulable: bool = False) -> Any:
        if not isinstance(value, dict) or not all(_is_update(v) for v in value.values()):
            fail(call, name, value, self.text, TypeError)
        try:
            sorted(value)
        except TypeError:
            kinds = sorted({type(k).__name__ for k in value})
            fail(call, name, value, f"must have labels of one kind (JAX sorts a dict's keys), got {kinds}", TypeError)
        return value


@dataclasses.dataclass(frozen=True)
class Valid(Domain):
    """A domain a rule can't say: ``rule(call, name, value) -> stored value`` raises by the one format
    (``fail``) for what it refuses. ``values`` checks the concrete values a tree map or the state gives,
    ``rule``'s :class:`Domain` for them; ``text`` says what the value must be."""

    rule: Callable[[str, str, Any], Any] = None  # type: ignore[assignment]
    text: str = "must be valid"
    values: Domain | None = None

    def check(self, call: str, name: str, value: Any, *, schedulable: bool = False) -> Any:
        if schedulable and _is_schedule(value) and self.values is not None:
            return self.values.check(call, name, value, schedulable=True)
        return self.rule(call, name, value)

    def check_values(self, call: str, name: str, values: Any, where: str) -> None:
        if self.values is not None:
            self.values.check_values(call, name, values, where)

    def holds(self, value: jax.Array) -> jax.Array | None:
        return None if self.values is None else self.values.holds(value)


@dataclasses.dataclass(frozen=True)
class Relation:
    """A rule between options that no single domain can say: ``rule(*values) -> bool`` over the options
    ``names``, ``text`` saying it (``"min_step_size must be <= max_step_size"``). It is checked wherever all
    its values are concrete, and traced (``rule`` on arrays) under :func:`updax.checked`. ``rule`` is a
    module-level function, so that two stages declaring it compare equal."""

    names: tuple[str, ...]
    rule: Callable[..., Any]
    text: str

    def check(self, call: str, values: Mapping[str, Any], where: str = "") -> None:
        picked = [values[n] for n in self.names]
        if any(_is_schedule(v) or v is None or not is_concrete(v) for v in picked):
            return
        if not bool(np.all(self.rule(*(np.asarray(v) for v in picked)))):
            shown = ", ".join(f"{n}={_shown(v)}" for n, v in zip(self.names, picked))
            raise ValueError(f"{call}({shown}): {self.text}{f' ({where})' if where else ''}")


# --------------------------------------------------------------------------
# State fields declare what they hold with an annotation: ``count: Count``.

Count = Annotated[jax.Array, COUNT]
"""A state field that counts steps: int32 (int64 under ``jax_enable_x64``), never negative (``count: Count``)."""
NonNegativeField = Annotated[Any, NON_NEGATIVE]
"""A state field of values that are never negative (second moments, sums of squares)."""
FlagField = Annotated[jax.Array, Flag()]
"""A boolean state field."""


@dataclasses.dataclass(frozen=True)
class Quantizable:
    """What a state field declares about storing it in fewer bits (:func:`updax.quantized_state`): ``signed``
    for a first moment (an average of signed values, stored with a signed map), else a second moment (never
    negative, stored with an unsigned map). A field without it is never quantized."""

    signed: bool


MomentField = Annotated[Any, Quantizable(signed=True)]
"""A state field of first moments (averages of the updates): quantized_state may store it with a signed map."""
SecondMomentField = Annotated[Any, NON_NEGATIVE, Quantizable(signed=False)]
"""A state field of second moments (averages of squares, never negative): quantized_state may store it with an
unsigned map."""


def field_quantizable(state_type: type, field: str) -> Quantizable | None:
    """What ``field`` of the NamedTuple type ``state_type`` declares about quantizing it (a
    :class:`Quantizable` in its annotation), or None: not quantizable."""
    try:
        hints = typing.get_type_hints(state_type, include_extras=True)
    except Exception:  # an annotation that names something not importable: nothing declared
        return None
    for meta in getattr(hints.get(field), "__metadata__", ()):
        if isinstance(meta, Quantizable):
            return meta
    return None


def field_domain(state_type: type, field: str) -> Domain | None:
    """What ``field`` of the NamedTuple type ``state_type`` declares it holds (an ``Annotated`` field whose
    metadata is a :class:`Domain`), or None."""
    try:
        hints = typing.get_type_hints(state_type, include_extras=True)
    except Exception:  # an annotation that names something not importable: nothing declared
        return None
    hint = hints.get(field)
    for meta in getattr(hint, "__metadata__", ()):
        if isinstance(meta, Domain):
            return meta
    return None


def fits_dtype(call: str, name: str, value: np.ndarray, dtype: Any, where: str) -> None:
    """Raises unless every element of ``value`` is held by ``dtype`` as given: an integer in range and whole,
    a bool 0 or 1, a finite float that stays finite (1e40 overflows float32), no imaginary part dropped."""
    dtype = jnp.dtype(dtype)
    value = _numeric(value)
    if not (np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_):
        fail(call, name, value, f"must be a number, not of dtype {value.dtype}", TypeError, where)
    if np.iscomplexobj(value) and not jnp.issubdtype(dtype, jnp.complexfloating):
        fail(call, name, value, f"must be real: the state holds {dtype.name}", TypeError, where)
    if dtype == jnp.bool_:
        if not np.all((value == 0) | (value == 1)):
            fail(call, name, value, "must be True or False (or 1 or 0) for the bool state", ValueError, where)
    elif jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        if np.issubdtype(value.dtype, np.floating) and not np.all(np.isfinite(value) & (value == np.round(value))):
            fail(call, name, value, f"must hold whole numbers for the {dtype.name} state", ValueError, where)
        if value.size and (np.min(value) < info.min or np.max(value) > info.max):
            fail(call, name, value, f"must be in [{info.min}, {info.max}] for the {dtype.name} state", ValueError,
                 where)
    elif jnp.issubdtype(dtype, jnp.inexact):
        finite = np.isfinite(value)
        with np.errstate(over="ignore", invalid="ignore"):
            cast = np.asarray(value).astype(dtype)
        if np.any(finite & ~np.isfinite(cast)):
            fail(call, name, value, f"must fit the {dtype.name} state (its largest value is "
                 f"{float(jnp.finfo(dtype).max):.4g})", ValueError, where)


# --------------------------------------------------------------------------
# Values a user's callable returns, and values passed to update() by keyword


#: Set while a checked stage (:func:`updax.checked`) runs its kernels: traced values are checked by checkify.
_CHECKING = contextvars.ContextVar("updax_checking", default=False)


@contextlib.contextmanager
def checking(on: bool) -> Iterator[None]:
    """Within it (``on``), :func:`returned` checks traced values through ``checkify``."""
    token = _CHECKING.set(bool(on))
    try:
        yield
    finally:
        _CHECKING.reset(token)


def returned(call: str, name: str, value: Any, domain: Domain, count: Any = None) -> Any:
    """What the user's callable option ``name`` returned, checked against ``domain``: in Python when it is
    concrete (an eager step), through ``checkify`` when it is traced inside a checked stage
    (:func:`updax.checked`); returned unchanged."""
    where = "the value it returned"
    if is_concrete(value):
        at = f" at count {int(np.asarray(count))}" if count is not None and is_concrete(count) else ""
        domain.check_values(call, f"{name}(...)", np.asarray(jax.device_get(value)), where + at)
    elif _CHECKING.get():
        holds = domain.holds(jnp.asarray(value))
        if holds is not None:
            from jax.experimental import checkify

            text = message(call, f"{name}(...)", "<{}>", domain.refusal, where)
            checkify.check(holds, text.replace("<{}>", "{}", 1), value)
    return value


def scalar_input(call: str, name: str, value: Any) -> jax.Array:
    """A real scalar passed to ``update`` by keyword (``loss=``, ``value=``) as a 0-d array; anything else (a
    vector loss, a complex value, a string) is refused by name, under ``jax.jit`` too (shapes are static)."""
    try:
        array = jnp.asarray(value)
    except TypeError:
        raise TypeError(f"{call}: update(..., {name}={value!r}): {name} must be a real scalar") from None
    if array.shape != () or not (jnp.issubdtype(array.dtype, jnp.floating) or jnp.issubdtype(array.dtype, jnp.integer)):
        raise TypeError(f"{call}: update(..., {name}=...) got {array.dtype.name} of shape {array.shape}; {name} must "
                        f"be a real scalar (the mean over the batch, not one value per example)")
    return array
