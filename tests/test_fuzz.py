"""A registry-wide fuzz: random nested pytrees and random valid hyperparameters for every catalogue entry
and every optimizer, checked against the contract each of them keeps.

Valid hyperparameters are the documented ones. Each option's range is parsed from the Args section of its
docstring (``in [0, 1)``, ``> 0``, ``>= 0``, ``>= ``min_step_size````, ``an integer >= 1``, ``a positive
integer``, ``any real number``, ...). An optimizer option whose docstring states no range takes the
documented range of the catalogue option it lands in: building the optimizer with a probe value shows
which stage option receives it (``adam(b1=...)`` lands in ``scale_by_adam.b1``, documented ``in [0, 1)``).
The few options that neither gives (a docstring that states no range, a tuple, a seed, a function) are in
:data:`OVERRIDES` or :data:`STRUCTURAL`, each with its reason, and
``test_every_option_of_every_target_has_a_strategy`` keeps that complete: a new entry, optimizer or
option cannot skip the fuzz.

Properties of every example (a random tree of params and a few steps of random finite gradients):
updates keep the gradients' tree structure and each leaf's shape and dtype; the state keeps the structure,
shapes and dtypes ``init`` gives; updates are finite; ``jax.jit`` agrees with eager execution; and for
catalogue entries the pipe forms give equal objects (``ux.f(**o)``, ``ux.identity().f(**o)``,
``ux.f(ux.identity(), **o)``, ``parent.f(**o)``, ``ux.f(parent, **o)``, ``ux.compose(parent, ux.f(**o))``,
``parent.pipe(ux.f, **o)``) whose numbers are bit-identical.

Budget: the ``ci`` profile (the default, see conftest.py) runs ``EXAMPLES["ci"]`` examples per target from
a small pool of leaf shapes, so compiled steps and eager kernels are reused; ``--hypothesis-profile=long``
runs ``EXAMPLES["long"]`` per target (over 10,000 in all) on arbitrary small shapes.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import pickle
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

import updax as ux
from registry import ENTRIES, catalogue_names, half_squared_norm, updates_for

# --------------------------------------------------------------------------
# Budget

PROFILE = settings.get_current_profile_name()
LONG = PROFILE == "long"

#: Catalogue entries (by name) and optimizers (``optimizers.<name>``): the fuzz targets.
COMBINATORS = catalogue_names()
OPTIMIZERS = [f"optimizers.{name}" for name in sorted(ux.optimizers.__all__)]
TARGETS = COMBINATORS + OPTIMIZERS

#: Examples per target and profile. The long profile's total is EXAMPLES["long"] * len(TARGETS) >= 10,000
#: (hypothesis counts examples that ran to the end; rejected draws do not count).
EXAMPLES = {"ci": 2, "long": math.ceil(10_000 / len(TARGETS))}
#: ``FUZZ_EXAMPLES=n`` overrides the count, e.g. for a quick run of the long profile's strategies.
PER_TARGET = int(os.environ.get("FUZZ_EXAMPLES", EXAMPLES.get(PROFILE, EXAMPLES["ci"])))

#: Gradient steps per example: bias corrections show from step 2, accumulate_gradients(3) steps on the 3rd.
STEPS = st.integers(1, 6) if LONG else st.just(3)

#: Leaf dtypes.
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]

#: COMPLEX HOOK: tests/test_complex.py names the registry entries that support complex64 updates as
#: SUPPORTED; those targets also get complex64 leaves (without it, no target does). Complex examples run
#: under the standard dtype promotion, as test_complex.py does, and leave the *_dtype options at None (a
#: real storage dtype for complex accumulators is refused by name, see test_complex.py).
try:
    from test_complex import SUPPORTED as COMPLEX_SUPPORTED  # type: ignore[import-not-found]
except ImportError:
    COMPLEX_SUPPORTED = frozenset()

#: In CI, leaves take one of a few shapes (0-d, zero-size, vectors, matrices both ways, a 3-d array), so
#: the eager kernels compiled for one target are reused by the next.
CI_SHAPES = [(), (0,), (3,), (1, 4), (2, 3), (3, 2), (0, 3), (2, 2, 2)]

#: Unbounded sides of a documented range are drawn this far from the other side (or from 0).
SPAN = 10.0
#: Integers are drawn at most this far above their lower bound (some are unrolled: ns_steps is "in [1, 100]").
INT_SPAN = 8 if LONG else 4
#: Gradients and params are drawn in [-MAGNITUDE, MAGNITUDE] (finite in every dtype drawn).
MAGNITUDE = 100.0


# --------------------------------------------------------------------------
# Documented ranges


@dataclasses.dataclass(frozen=True)
class Range:
    """A documented range: reals or integers in [lo, hi] (bounds open or closed, None for unbounded), or
    at least another option of the same call (``max_step_size >= min_step_size``)."""

    integer: bool = False
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    at_least: str | None = None

    def meet(self, other: Range) -> Range:
        """The values in both ranges."""
        lo, lo_open = _tighter(self.lo, self.lo_open, other.lo, other.lo_open, max)
        hi, hi_open = _tighter(self.hi, self.hi_open, other.hi, other.hi_open, min)
        return Range(self.integer or other.integer, lo, hi, lo_open, hi_open, self.at_least or other.at_least)


def _tighter(a, a_open, b, b_open, pick):
    if a is None or b is None:
        return (b, b_open) if a is None else (a, a_open)
    if a == b:
        return a, a_open or b_open
    return (a, a_open) if pick(a, b) == a else (b, b_open)


def args_section(fn: Callable[..., Any]) -> dict[str, str]:
    """The Args section of ``fn``'s docstring: option name -> its text on one line."""
    doc = inspect.cleandoc(fn.__doc__ or "")
    match = re.search(r"^Args:\n(.*?)(?=^\S|\Z)", doc, re.MULTILINE | re.DOTALL)
    if match is None:
        return {}
    entries = re.findall(r"^    (\w+): (.*?)(?=^    \w+: |\Z)", match.group(1), re.MULTILINE | re.DOTALL)
    return {name: " ".join(text.split()) for name, text in entries}


_NUMBER = r"-?(?:\d+(?:\.\d*)?(?:e-?\d+)?|inf)"


def parse_range(text: str) -> Range | None:
    """The valid range an option's documentation states, or None when it states none."""
    if m := re.search(rf"\bin ([\[(])({_NUMBER}), ({_NUMBER})([\])])", text):
        lo, hi = float(m.group(2)), float(m.group(3))
        return Range(bool(re.search(r"\binteger\b", text)), None if lo == -math.inf else lo,
                     None if hi == math.inf else hi, m.group(1) == "(", m.group(4) == ")")
    if re.search(r"\ba positive integer\b", text):
        return Range(integer=True, lo=1)
    if re.search(r"\ba non-negative integer\b", text):
        return Range(integer=True, lo=0)
    if m := re.search(r"\ban integer >= (\d+)", text):
        return Range(integer=True, lo=int(m.group(1)))
    if m := re.search(r"(>=?) ``(\w+)``", text):
        return Range(at_least=m.group(2), lo_open=m.group(1) == ">")
    if m := re.search(rf"(>=?) ({_NUMBER})\b", text):
        return Range(lo=float(m.group(2)), lo_open=m.group(1) == ">")
    if re.search(r"\b(?:any|a) real number\b", text):
        return Range()
    if re.search(r"\ba positive number\b", text):
        return Range(lo=0.0, lo_open=True)
    return None


#: Numeric options whose documentation states no parseable range: (entry, option) -> (range, why).
#: Optimizer options landing in these use them too.
OVERRIDES: dict[tuple[str, str], tuple[Range, str]] = {
    ("scale_by_radam", "threshold"): (Range(), "documented as the rho_t the rectified step starts at, values "
                                               + "below 4 acting as 4: any real number"),
    ("scale_by_trust_ratio", "trust_coefficient"): (Range(), "documented as 'the factor c', no range"),
    ("schedule_free", "weight_lr_power"): (Range(lo=0.0), "documented as 'the power p of the weights', no range; "
                                                         + "p < 0 weighs a zero learning rate by 0^p = inf"),
    ("ema", "init"): (Range(), "a number (or a tree shaped like the values: STRUCTURAL draws those too)"),
    ("scale_by_adamax", "eps"): (Range(lo=0.0, lo_open=True), "documented '>= 0' with 'with 0, a zero update "
                                                               + "before any non-zero one divides 0 by 0'"),
    ("scale_by_factored_rms", "step_offset"): (
        Range(integer=True, lo=0, hi=0),
        "documented 'an integer >= 0' with 'the count must not be below it': the fuzz starts at count 0"),
    ("optimizers.adafactor", "decay_offset"): (
        Range(integer=True, lo=0, hi=0), "scale_by_factored_rms.step_offset: the count must not be below it"),
    ("optimizers.schedule_free_adamw", "warmup_steps"): (
        Range(integer=True, lo=1), "documented as 'length of the linear warm-up, or None'; a length is >= 1"),
    ("optimizers.schedule_free_sgd", "warmup_steps"): (
        Range(integer=True, lo=1), "documented as 'length of the linear warm-up, or None'; a length is >= 1"),
}

#: Options that are not a number in a range: (entry, option) -> (strategy factory(params), why).
#: ``"*"`` matches every target that has the option.
STRUCTURAL: dict[tuple[str, str], tuple[Callable[[Any], st.SearchStrategy], str]] = {}


def _structural(target: str, option: str, why: str):
    def register(factory):
        STRUCTURAL[(target, option)] = (factory, why)
        return factory

    return register


def _catalogue_fn(name: str) -> Callable[..., ux.Update]:
    if name.startswith("optimizers."):
        return getattr(ux.optimizers, name.removeprefix("optimizers."))
    return getattr(ux.updates, name)


def _parameters(target: str) -> list[inspect.Parameter]:
    """The options of a target: its signature without the wrapped pipeline."""
    params = inspect.signature(_catalogue_fn(target)).parameters.values()
    return [p for p in params if p.name != "inner"]


def _is_numeric(parameter: inspect.Parameter) -> bool:
    annotation = str(parameter.annotation)
    default = parameter.default
    if isinstance(default, bool) or "bool" in annotation:
        return False
    return (bool(re.search(r"\b(Scalar|ScalarOrSchedule|int|float)\b", annotation))
            or isinstance(default, (int, float)))


def _is_dtype(parameter: inspect.Parameter) -> bool:
    return parameter.name.endswith("_dtype")


def _is_flag(parameter: inspect.Parameter) -> bool:
    return isinstance(parameter.default, bool) or str(parameter.annotation) == "bool"


# --- where an optimizer option lands ---------------------------------------

_PROBES = (0.4321, 1.4321)
_INT_PROBE = 7


def _stages(opt: ux.Update):
    """The stages of ``opt`` and of every pipeline its options hold (wrapped pipelines, partition groups)."""
    for stage in opt.stages:
        yield stage
        for key, _ in stage.options:
            for inner in jax.tree.leaves(stage.option(key), is_leaf=lambda x: isinstance(x, ux.Update)):
                if isinstance(inner, ux.Update):
                    yield from _stages(inner)


def _same(value: Any, probe: Any) -> bool:
    return type(value) is type(probe) and value == probe


def landings(target: str, option: str) -> list[tuple[str, str]]:
    """The catalogue options that receive an optimizer's option: build it with a probe value, find the value."""
    parameter = next(p for p in _parameters(target) if p.name == option)
    annotation = str(parameter.annotation)
    if "tuple" in annotation:
        probes = [(_PROBES[0], -_PROBES[0], _PROBES[0])]
    elif re.search(r"\bint\b", annotation) and "Scalar" not in annotation:
        probes = [_INT_PROBE]
    else:
        probes = list(_PROBES)
    for probe in probes:
        try:
            opt = _catalogue_fn(target)(**{option: probe})
        except (ValueError, TypeError):
            continue
        found = sorted({(stage.label, key) for stage in _stages(opt) for key, _ in stage.options
                        if _same(stage.option(key), probe)})
        if found:
            return found
    return []


@functools.cache
def documented_range(target: str, option: str) -> tuple[Range, str] | None:
    """The valid range of ``target``'s numeric ``option`` and where it comes from, or None."""
    if (target, option) in OVERRIDES:
        rng, why = OVERRIDES[(target, option)]
        return rng, f"override: {why}"
    text = args_section(_catalogue_fn(target)).get(option, "")
    parsed = parse_range(text)
    if parsed is not None:
        return parsed, f"doc: {text}"
    if not target.startswith("optimizers."):
        return None
    found = landings(target, option)
    if not found:
        return None
    total, sources = Range(), []
    for label, key in found:
        inner = documented_range(label, key)
        if inner is None:
            return None
        total = total.meet(inner[0])
        sources.append(f"{label}.{key} ({inner[1]})")
    return total, "lands in " + "; ".join(sources)


# --------------------------------------------------------------------------
# Strategies for hyperparameters


def _bounds(rng: Range, lo_floor: float | None = None) -> tuple[float, float]:
    lo = rng.lo if rng.lo is not None else lo_floor
    hi = rng.hi
    if lo is None and hi is None:
        lo, hi = -SPAN, SPAN
    elif lo is None:
        lo = hi - 2 * SPAN
    elif hi is None:
        hi = lo + SPAN
    return lo, hi


def _f32(x: float, towards: float) -> float:
    """The float32 nearest ``x`` on the side of ``towards`` (inside the range)."""
    f = np.float32(x)
    if (f < x) if towards > x else (f > x):
        f = np.nextafter(f, np.float32(towards))
    return float(f)


def reals(rng: Range, lo_floor: float | None = None) -> st.SearchStrategy[float]:
    """Float32-exact Python floats in a documented range (bounds included where they are), not subnormal:
    XLA on CPU flushes subnormals to zero, so ``eps=1e-45`` would act as the 0 that "> 0" excludes."""
    lo, hi = _bounds(rng, lo_floor)
    lo, hi = _f32(lo, math.inf), _f32(hi, -math.inf)
    return st.floats(lo, hi, exclude_min=rng.lo_open, exclude_max=rng.hi_open and rng.hi is not None,
                     allow_nan=False, allow_subnormal=False, width=32)


def integers(rng: Range, lo_floor: int | None = None) -> st.SearchStrategy[int]:
    lo = int(rng.lo if rng.lo is not None else (lo_floor if lo_floor is not None else -INT_SPAN))
    lo += 1 if rng.lo_open else 0
    hi = int(rng.hi) - (1 if rng.hi_open else 0) if rng.hi is not None else lo + INT_SPAN
    return st.integers(lo, min(hi, lo + INT_SPAN))


def linear_schedule(a: float, b: float) -> Any:
    """A schedule from ``a`` to ``b`` over two steps: its values stay between them, so in any interval."""
    return ux.schedules.polynomial_decay(a, end_value=b, power=1.0, transition_steps=2)


#: The smallest magnitude of a schedule's ends but 0: the value halfway, ``a/2 + b/2``, stays a normal float32
#: (XLA on CPU flushes subnormals to zero, so ends at float32's smallest normal can meet at 0, outside "> 0").
SCHEDULE_FLOOR = 2.0**-120


def _schedule_ends(rng: Range, lo_floor: float | None) -> st.SearchStrategy[float]:
    return reals(rng, lo_floor).filter(lambda x: x == 0 or abs(x) >= SCHEDULE_FLOOR)


def numbers(rng: Range, *, schedulable: bool, lo_floor: float | None = None) -> st.SearchStrategy:
    """A documented value: a Python number, a float32 JAX scalar, or (where schedulable) a schedule."""
    if rng.integer:
        return integers(rng, lo_floor)
    forms = [reals(rng, lo_floor), reals(rng, lo_floor).map(lambda v: jnp.asarray(v, jnp.float32))]
    if schedulable:
        forms.append(st.builds(linear_schedule, _schedule_ends(rng, lo_floor), _schedule_ends(rng, lo_floor)))
        forms.append(reals(rng, lo_floor).map(ux.schedules.constant))
    return st.one_of(*forms)


def _floor(value: Any) -> float | None:
    """The lower bound another option's value sets (a schedule sets none the fuzz can use)."""
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, jax.Array):
        return float(value)
    return None


# --- structural options: functions, masks, pipelines, seeds ------------------


def _mask_matrices(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def _mask_all(params):
    return jax.tree.map(lambda p: True, params)


def _mask_none(params):
    return jax.tree.map(lambda p: False, params)


def _mask_alternate(params):
    leaves, treedef = jax.tree.flatten(params)
    return treedef.unflatten([i % 2 == 0 for i in range(len(leaves))])


def _labels_alternate(params):
    leaves, treedef = jax.tree.flatten(params)
    return treedef.unflatten(["adam" if i % 2 else "sgd" for i in range(len(leaves))])


def _labels_adam(params):
    return jax.tree.map(lambda p: "adam", params)


def _steps_alternate(gradient_step):
    """A varying accumulation: 1 call, then 2, then 1, ..."""
    return 1 + gradient_step % 2


def _leaf_tree(params, leaf_values: st.SearchStrategy) -> st.SearchStrategy:
    leaves, treedef = jax.tree.flatten(params)
    return st.lists(leaf_values, min_size=len(leaves), max_size=len(leaves)).map(treedef.unflatten)


@_structural("*", "mask", "a pytree of bools shaped like the params, or a function of the params")
def _masks(params):
    functions = st.sampled_from([_mask_matrices, _mask_all, _mask_none, _mask_alternate])
    if params is None:  # a mask shaped like None params is None, refused as no mask at all (a function is not)
        return functions
    return st.one_of(functions, _leaf_tree(params, st.booleans()))


@_structural("optimizers.lars", "trust_ratio_mask", "a pytree of bools shaped like the params, or a function of the "
                                                     "params, as any mask")
def _trust_ratio_masks(params):
    return _masks(params)


@_structural("partition", "labels", "a pytree of labels shaped like the params, or a function of the params")
def _labels(params):
    template = ENTRIES["partition"]().stages[0].option("labels")
    functions = st.sampled_from([template, _labels_alternate, _labels_adam])
    if params is None:  # as for masks
        return functions
    return st.one_of(functions, _leaf_tree(params, st.sampled_from(["adam", "sgd"])))


@_structural("partition", "transforms", "a dict of pipelines: the registry's, as the template")
def _transforms(params):
    return st.just(ENTRIES["partition"]().stages[0].option("transforms"))


@_structural("*", "objective", "a line search's objective, a function of the params: |w|²/2 (the registry's; the "
                               "fuzz's random gradients are not its gradient, so directions may not descend)")
def _objectives(params):
    return st.just(half_squared_norm)


@_structural("scale_by_zoom_linesearch", "initial_guess_strategy", "a name: 'keep' or 'one'")
def _initial_guesses(params):
    return st.sampled_from(["keep", "one"])


@_structural("optimizers.lbfgs", "linesearch", "a name ('zoom', 'backtracking'; None takes no objective) or a "
                                               "pipeline")
def _lbfgs_linesearches(params):
    return st.sampled_from(["zoom", "backtracking"])


@_structural("accumulate_gradients", "steps", "'an integer >= 1, or a function gradient_step -> k'")
def _accumulation_steps(params):
    rng = parse_range(args_section(ux.accumulate_gradients)["steps"])
    return st.one_of(integers(rng), st.just(_steps_alternate))


@_structural("accumulate_gradients", "should_skip", "a skip function (its own option drawn from its docs), "
                                                     "or None")
def _skips(params):
    bound = parse_range(args_section(ux.skip_large_updates)["max_squared_norm"])
    return st.one_of(st.none(), st.just(ux.skip_not_finite),
                     reals(bound).map(ux.skip_large_updates), st.just(ux.skip_large_updates(0.0)))


@_structural("scale_by_schedule", "schedule_fn", "'a jittable function count -> step size': the registry's, "
                                                  "or schedules of any real number")
def _schedule_fns(params):
    template = ENTRIES["scale_by_schedule"]().stages[0].option("schedule_fn")
    return st.one_of(st.just(template), numbers(Range(), schedulable=True).filter(callable))


@_structural("scale_by_multiplicative_lr", "lr_lambda", "'a jittable function epoch -> factor >= 0': the "
                                                           "registry's, or schedules of factors in [0, 2]")
def _factor_fns(params):
    template = ENTRIES["scale_by_multiplicative_lr"]().stages[0].option("lr_lambda")
    return st.one_of(st.just(template), numbers(Range(lo=0.0, hi=2.0), schedulable=True).filter(callable))


@_structural("ema", "init", "'a number or a tree shaped like the values'")
def _ema_init(params):
    value = reals(Range())
    if not jax.tree.leaves(params):
        return value  # ema refuses a tree without arrays ("a number or a tree of arrays")
    trees = st.builds(lambda v: jax.tree.map(lambda p: jnp.full(p.shape, v, p.dtype), params), value)
    return st.one_of(value, trees)


@_structural("*", "key", "'an int seed or a JAX PRNG key'")
def _keys(params):
    seeds = st.integers(0, 2**31 - 1)
    return st.one_of(seeds, seeds.map(jax.random.key))


#: Coefficients whose Newton-Schulz iteration is known to converge: the default (Jordan's), the cubic
#: (1.5, -0.5, 0) written as a quintic, and the classical quintic (15/8, -5/4, 3/8); per iteration, Dion's preset
#: and Jordan's triple then the classical one.
_NS_COEFFS = [(3.4445, -4.7750, 2.0315), (1.5, -0.5, 0.0), (1.875, -1.25, 0.375), "dion",
              ((3.4445, -4.7750, 2.0315), (1.875, -1.25, 0.375))]


@_structural("*", "ns_coeffs", "'the quintic's coefficients (a, b, c)': no range; coefficient sets that converge")
def _ns_coeffs(params):
    return st.sampled_from(_NS_COEFFS)


@_structural("*", "preconditioning", "a name: 'frobenius', 'spectral', 'aol' or 'schatten'")
def _preconditionings(params):
    return st.sampled_from(["frobenius", "spectral", "aol", "schatten"])


def _muon_last_two(params):
    return jax.tree.map(lambda p: ux.MuonDimensionNumbers(-2, -1) if p.ndim >= 2 else None, params)


def _muon_first_two(params):
    return jax.tree.map(lambda p: ux.MuonDimensionNumbers(0, (1,)) if p.ndim >= 2 else None, params)


@_structural("*", "weight_dimension_numbers", "'a pytree of MuonDimensionNumbers or None, or a function of the "
                                              "params': None, functions, and trees drawn leaf by leaf")
def _weight_dimension_numbers(params):
    def entry(p):  # a leaf with two axes or more: its last two, its first two, or none
        return st.sampled_from([None] + ([ux.MuonDimensionNumbers(-2, -1), ux.MuonDimensionNumbers((0,), 1)]
                                         if jnp.ndim(p) >= 2 else []))

    leaves, treedef = jax.tree.flatten(params)
    trees = st.tuples(*(entry(p) for p in leaves)).map(lambda specs: treedef.unflatten(list(specs)))
    return st.one_of(st.none(), st.sampled_from([_muon_last_two, _muon_first_two]), trees)


@_structural("adaptive_grad_clip", "axis", "'an int or a tuple of ints' for leaves of rank >= 2, or None: axes "
                                          "every such leaf of the drawn trees (rank <= 3) has")
def _agc_axes(params):
    return st.sampled_from([None, 0, -1, (0,), (0, -1)])


@_structural("snapshot", "name", "'a Python identifier', the stage's name: the default and another")
def _snapshot_names(params):
    return st.sampled_from(["snapshot", "fuzz_snapshot"])


@_structural("sam", "adversary", "None or a pipeline giving the ascent direction: none, a stateless and a "
                                  "stateful one")
def _sam_adversaries(params):
    return st.sampled_from([None, ux.scale(2.0), ux.scale_by_adam()])


@_structural("*", "base_optimizer", "None or a pipeline in GaLore's Adam's place: none, a stateful one and two "
                                     "stages")
def _galore_bases(params):
    return st.sampled_from([None, ux.scale_by_lion(), ux.scale_by_rms(decay=0.9).trace(decay=0.5)])


@_structural("snapshot", "measure", "'a jittable function of the updates', or None: a copy or their global norm")
def _snapshot_measures(params):
    return st.sampled_from([None, ux.global_norm])


def _always(step, **extra):
    return step >= 0


def _never(step, **extra):
    return step < 0


def _every_other(step, **extra):
    return step % 2 == 1


@_structural("*", "should_transform_fn", "a function of the step count returning a bool: every call, none, every "
                                         "other one")
def _conditions(params):
    return st.sampled_from([_always, _never, _every_other])


@_structural("selective_transform", "freeze_mask", "a bool, or a pytree of bools shaped like the params, or a "
                                                   "function of the params, as any mask")
def _freeze_masks(params):
    return st.one_of(st.booleans(), _masks(params))


def _measured_norm(updates, params=None):
    """A monitor's measure either way it is called: with or without the params."""
    return ux.global_norm(updates)


def _measured_leaves(updates, params=None):
    return jax.tree.map(lambda u: jnp.sum(u.astype(jnp.float32)), updates)


@_structural("monitor", "measures", "a dict of measures, functions and measure_with_ema, each taking the params or "
                                    "not (with_params is drawn too)")
def _monitor_measures(params):
    return st.sampled_from([{"norm": _measured_norm},
                            {"leaves": _measured_leaves, "ema": ux.measure_with_ema(_measured_norm, 0.9)},
                            {"ema": ux.measure_with_ema(_measured_leaves, 0.5, debias=False)}])


@_structural("scale_by_dog", "init_step_type", "'\"heuristic\", \"distance\" or \"learning_rate\"'")
@_structural("optimizers.dog", "init_step_type", "scale_by_dog.init_step_type")
def _dog_init_step_types(params):
    return st.sampled_from(["heuristic", "distance", "learning_rate"])


@_structural("scale_by_polyak", "variant", "'\"sps\" or \"sps+\"'")
@_structural("optimizers.polyak_sgd", "variant", "scale_by_polyak.variant")
def _polyak_variants(params):
    return st.sampled_from(["sps", "sps+"])


@_structural("scale_by_momo", "decay_form", "'\"proximal\" or \"decoupled\"'")
@_structural("scale_by_momo_adam", "decay_form", "'\"proximal\" or \"decoupled\"'")
@_structural("optimizers.momo", "decay_form", "scale_by_momo.decay_form")
@_structural("optimizers.momo_adam", "decay_form", "scale_by_momo_adam.decay_form")
def _momo_decay_forms(params):
    return st.sampled_from(["proximal", "decoupled"])


@_structural("scale_by_lion", "mode", "'\"hard\", \"smooth\" or \"refined\"'")
@_structural("optimizers.lion", "mode", "scale_by_lion.mode")
def _lion_modes(params):
    return st.sampled_from(["hard", "smooth", "refined"])


@_structural("optimizers.adafactor", "dtype_momentum", "a storage dtype, as the *_dtype options (None only for "
             "complex trees)")
def _adafactor_momentum_dtypes(params):
    return st.just(None) if _is_complex(params) else st.sampled_from(DTYPE_OPTIONS)


@_structural("reduce_on_plateau", "mode", "'\"min\" or \"max\"'")
def _plateau_modes(params):
    return st.sampled_from(["min", "max"])


@_structural("scale_by_shampoo", "graft", "'\"adagrad\", \"rmsprop\", \"adam\" or \"sgd\"'")
@_structural("optimizers.shampoo", "graft", "scale_by_shampoo.graft")
def _shampoo_grafts(params):
    return st.sampled_from(["adagrad", "rmsprop", "adam", "sgd"])


@_structural("scale_by_shampoo", "block_size", "'None or a positive integer': no blocks, or blocks of 1 to 4 "
             "elements (the fuzz's leaves have axes of a few elements, so that some are cut)")
@_structural("optimizers.shampoo", "block_size", "scale_by_shampoo.block_size")
def _shampoo_block_sizes(params):
    return st.sampled_from([None, 1, 2, 3, 4])


@_structural("scale_by_shampoo", "root_method", "'\"eigh\" or \"newton\"'")
@_structural("optimizers.shampoo", "root_method", "scale_by_shampoo.root_method")
def _shampoo_root_methods(params):
    return st.sampled_from(["eigh", "newton"])


@_structural("quantized_state", "bits", "'8, 4 or \"float8\"'")
def _quantized_bits(params):
    return st.sampled_from([8, 4, "float8"])


@_structural("quantized_state", "block_size", "'a power of two >= 2; None: each format's default'")
def _quantized_block_sizes(params):
    return st.sampled_from([None, 2, 4, 2048])


@_structural("quantized_state", "formats", "a dict of state paths to formats, or None (the default)")
def _quantized_formats(params):
    return st.sampled_from([None, {"scale_by_adam.nu": "float8"}])


@_structural("quantized_state", "rounding", "'\"nearest\" or \"stochastic\"'")
def _quantized_roundings(params):
    return st.sampled_from(["nearest", "stochastic"])


def _structural_for(target: str, option: str):
    return STRUCTURAL.get((target, option)) or STRUCTURAL.get(("*", option))


DTYPE_OPTIONS = [None, "float32", "bfloat16", "float16"]


def _schedule_only_without(target: str, option: str) -> str | None:
    match = re.search(r"without ``(\w+)``, a schedule", args_section(_catalogue_fn(target)).get(option, ""))
    return match.group(1) if match else None


def _set_only_without(target: str, option: str) -> str | None:
    """The option whose docs say "set only without ``other``" (GaLore's Adam options beside its base_optimizer):
    drawn at its default while ``other`` is drawn set."""
    match = re.search(r"set only\s+without\s+``(\w+)``", args_section(_catalogue_fn(target)).get(option, ""))
    return match.group(1) if match else None


def _option_strategy(target: str, parameter: inspect.Parameter, params: Any, schedulable: bool):
    """The strategy of one option given the others drawn before it (a dict), or None if it has none."""
    own, other = _own_strategy(target, parameter, params, schedulable), _set_only_without(target, parameter.name)
    if own is None or other is None:
        return own
    return lambda drawn: st.just(parameter.default) if drawn[other] is not None else own(drawn)


def _own_strategy(target: str, parameter: inspect.Parameter, params: Any, schedulable: bool):
    structural = _structural_for(target, parameter.name)
    if structural is not None:
        return lambda drawn: structural[0](params)
    if _is_flag(parameter):
        return lambda drawn: st.booleans()
    if _is_dtype(parameter):
        return lambda drawn: st.just(None) if _is_complex(params) else st.sampled_from(DTYPE_OPTIONS)
    if not _is_numeric(parameter):
        return None
    found = documented_range(target, parameter.name)
    if found is None:
        return None
    rng = found[0]
    nullable = parameter.default is None or "None" in str(parameter.annotation)
    # "a number or, without ``warmup_steps``, a schedule": a schedule only while that option is None.
    only_without = _schedule_only_without(target, parameter.name)

    def strategy(drawn):
        floor = _floor(drawn.get(rng.at_least)) if rng.at_least else None
        if rng.at_least and floor is None and rng.lo is None:
            floor = 0.0  # the other option is a schedule or None: draw from its own documented floor
        may_schedule = schedulable and not rng.at_least and (only_without is None or drawn[only_without] is None)
        values = numbers(rng, schedulable=may_schedule, lo_floor=floor)
        return st.one_of(st.none(), values) if nullable else values

    return strategy


# --------------------------------------------------------------------------
# Targets: how each is built from its options


@dataclasses.dataclass(frozen=True)
class Target:
    """A catalogue entry (with the pipeline before it, as the registry builds it) or an optimizer."""

    name: str
    parent: ux.Update | None  # catalogue entries: what the entry follows or wraps (identity() if nothing)
    schedulable: frozenset[str]

    @property
    def fn(self):
        return _catalogue_fn(self.name)

    def build(self, options):
        if self.parent is None or not self.parent.stages:
            return self.fn(**options)
        return self.fn(self.parent, **options)


@functools.cache
def target(name: str) -> Target:
    if name.startswith("optimizers."):
        schedulable = frozenset(p.name for p in _parameters(name) if "ScalarOrSchedule" in str(p.annotation))
        return Target(name, None, schedulable)
    template = ENTRIES[name]()  # the registry's entry: its last stage is the entry, the rest its parent
    stage = template.stages[-1]
    assert stage.label == name, f"registry entry {name} does not end with its own stage"
    parent = stage.option(stage.wraps) if stage.wraps else ux.Update(template.stages[:-1])
    return Target(name, parent, stage.schedulable)


def options_strategy(name: str, params: Any) -> st.SearchStrategy[dict]:
    tgt = target(name)
    # An option another one must be at least is drawn as a number, so the other can be drawn above it.
    floors = {documented_range(name, p.name)[0].at_least for p in _parameters(name)
              if _is_numeric(p) and _structural_for(name, p.name) is None and documented_range(name, p.name)}
    strategies = [(p.name, _option_strategy(name, p, params, p.name in tgt.schedulable and p.name not in floors))
                  for p in _parameters(name)]
    # Options others depend on are drawn first.
    first = floors | {_schedule_only_without(name, p.name) for p in _parameters(name)} | {
        _set_only_without(name, p.name) for p in _parameters(name)}
    strategies.sort(key=lambda item: item[0] not in first)

    @st.composite
    def draw(draw_):
        drawn: dict[str, Any] = {}
        for option, strategy in strategies:
            drawn[option] = draw_(strategy(drawn), label=option)
        return drawn

    return draw()


# --------------------------------------------------------------------------
# Random pytrees


class Leaf:
    """A leaf's shape and dtype in a drawn tree spec (not a pytree node: a leaf of the spec)."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype

    def __repr__(self):
        return f"Leaf({self.shape}, {jnp.dtype(self.dtype).name})"


def tree_specs(dtypes: st.SearchStrategy) -> st.SearchStrategy:
    """Nested dicts, lists and tuples of leaves and None: 0-d, zero-size and small arrays."""
    shapes = array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5) if LONG else st.sampled_from(CI_SHAPES)
    leaf = st.builds(Leaf, shapes, dtypes)
    keys = st.sampled_from(["a", "b", "c", "w", "bias"])

    def containers(children):
        return st.one_of(st.dictionaries(keys, children, max_size=3), st.lists(children, max_size=3),
                         st.lists(children, max_size=3).map(tuple))

    return st.recursive(st.one_of(st.none(), leaf), containers, max_leaves=6 if LONG else 4)


def _is_spec_leaf(x):
    return isinstance(x, Leaf)


@st.composite
def trees_and_steps(draw, name):
    """A spec, the params and ``steps`` gradient trees shaped like it (one dtype per leaf)."""
    dtypes = list(DTYPES) + ([jnp.complex64] if name in COMPLEX_SUPPORTED else [])
    mixed = draw(st.booleans(), label="mixed dtypes")
    tree_dtype = draw(st.sampled_from(dtypes), label="dtype")
    spec = draw(tree_specs(st.sampled_from(dtypes) if mixed else st.just(tree_dtype)), label="tree")
    steps = draw(STEPS, label="steps")
    leaves, treedef = jax.tree.flatten(spec, is_leaf=_is_spec_leaf)
    values = [draw(arrays(np.float32, (steps + 1, *leaf.shape),
                          elements=st.floats(-MAGNITUDE, MAGNITUDE, width=32)), label=f"leaf {i}")
              for i, leaf in enumerate(leaves)]
    values = [v + 1j * np.roll(v, 1) if leaf.dtype == jnp.complex64 else v for v, leaf in zip(values, leaves)]

    def tree(t):
        return treedef.unflatten([jnp.asarray(v[t], leaf.dtype) for v, leaf in zip(values, leaves)])

    params, grads = tree(0), [tree(t + 1) for t in range(steps)]
    losses = draw(st.lists(st.floats(-MAGNITUDE, MAGNITUDE, width=32), min_size=steps, max_size=steps),
                  label="losses")
    return params, grads, [jnp.asarray(x, jnp.float32) for x in losses]


# --------------------------------------------------------------------------
# Running and checking


def _update(opt, grads, state, params, loss):
    return opt.update(grads, state, params, loss=loss)


#: One jitted step for everything: JAX caches it by the pipeline's structure (stages, flags, dtypes) and
#: the tree's shapes and dtypes; hyperparameter values are leaves, so new values do not recompile.
_jit_update = jax.jit(_update)


def _is_complex(tree) -> bool:
    return any(jnp.iscomplexobj(x) for x in jax.tree.leaves(tree))


def run(opt, params, grads, losses, jit, state=None):
    """Each step's updates and state, from ``state`` (by default ``opt.init(params)``)."""
    step = _jit_update if jit else _update
    state = opt.init(params) if state is None else state
    outs, states = [], []
    for g, loss in zip(grads, losses):
        updates, state = step(opt, g, state, params, loss)
        outs.append(updates)
        states.append(state)
    return outs, states


def _tolerance(dtype):
    """Rounding differences between a fused jitted step and eager kernels, relative to the leaf's scale."""
    return {jnp.dtype(jnp.bfloat16): 3e-2, jnp.dtype(jnp.float16): 4e-3}.get(jnp.dtype(dtype), 2e-5)


def _shapes(tree):
    return [(jnp.shape(x), jnp.result_type(x)) for x in jax.tree.leaves(tree)]


def _as_float(x):
    x = np.asarray(x)
    return x if np.iscomplexobj(x) else x.astype(np.float64)


def check_structure(grads, updates, state0, state):
    assert jax.tree.structure(updates) == jax.tree.structure(grads)
    assert _shapes(updates) == _shapes(grads)
    assert jax.tree.structure(state) == jax.tree.structure(state0)
    assert _shapes(state) == _shapes(state0)


def check_finite(updates):
    for leaf in jax.tree.leaves(updates):
        assert np.all(np.isfinite(_as_float(leaf))), f"non-finite update {leaf}"


def storage_tolerance(opt: ux.Update) -> float:
    """The tolerance of the narrowest dtype a stage stores state in (``mu_dtype``, ``state_dtype``, ...), else 0:
    jit and eager may round a stored value to opposite neighbours, and every later step carries that rounding
    (schedule_free's ``z`` in float16 moves ``y`` by the step ``z`` took as stored)."""
    return max([_tolerance(value) for stage in _stages(opt) for key, value in stage.options
                if key.endswith("_dtype") and value is not None], default=0.0)


def check_close(eager, jitted, *, same_non_finite=True, storage=0.0):
    """Equal up to rounding where finite (relative to the leaf's largest value, and at least ``storage``, the
    state's), non-finite at the same places (unless ``same_non_finite`` is False: a subnormal eps may be NaN
    under jit only, see EFFECTIVELY_ZERO)."""
    for x, y in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        tol = max(_tolerance(x.dtype), storage)
        a, b = _as_float(x), _as_float(y)
        finite = np.isfinite(a)
        if same_non_finite:
            np.testing.assert_array_equal(finite, np.isfinite(b))
        else:
            finite &= np.isfinite(b)
        a, b = a[finite], b[finite]
        scale = max(1.0, float(np.max(np.abs(a)))) if a.size else 1.0
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale)


def _raw(x):
    return np.asarray(jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x)


def check_bit_identical(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = _raw(x), _raw(y)
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def pipe_forms(tgt: Target, options: dict) -> list[ux.Update]:
    """Every way to write the same pipeline (docs/DESIGN section 3)."""
    f, name, parent = tgt.fn, tgt.name, tgt.parent
    forms = [getattr(parent, name)(**options), f(parent, **options), ux.compose(parent, f(**options)),
             parent.pipe(f, **options)]
    if not parent.stages:
        identity = ux.identity()
        forms += [f(**options), getattr(identity, name)(**options), f(identity, **options),
                  identity.pipe(f, **options)]
    return forms


# --------------------------------------------------------------------------
# Exceptions to the fuzz's checks: documented behaviour, and open bugs. Each relaxes only the checks it names,
# for the examples it applies to only, and has a test at the end of this file: one showing the documented
# behaviour, or a strict-xfail reproduction of the open bug. (Bugs the fuzz found and that are fixed, clip's
# bound not cast to a low-precision leaf's dtype and schedule_free_adamw refusing a documented learning rate
# with a warm-up, are plain tests below.)


#: Below this an eps counts as 0 under jax.jit: XLA may reassociate ``(m / c1) / eps`` into ``m / (c1·eps)``,
#: whose product leaves float32's normal range and is flushed to zero (documented in docs/errors.md).
EFFECTIVELY_ZERO = 1e-30


def _over_steps(value: Any) -> np.ndarray:
    """An option's values: a number's, or a schedule's over the steps the fuzz takes (one vectorised call)."""
    return np.asarray(value(jnp.arange(8, dtype=jnp.int32)) if callable(value) else value, np.float64)


def _can_be_zero(value: Any) -> bool:
    return bool(np.any(np.abs(_over_steps(value)) < EFFECTIVELY_ZERO))


#: The stages whose options keep a denominator off zero: all zero gives 0/0 = NaN on a zero gradient. A tuple
#: of options guards as their product: it is zero where any of them is.
ZERO_GUARDS = {
    **{name: ("eps", "eps_root") for name in ["scale_by_adam", "scale_by_belief", "scale_by_radam",
                                              "scale_by_amsgrad", "scale_by_nadam", "scale_by_novograd",
                                              "scale_by_adan"]},
    "scale_by_yogi": ("eps", "eps_root", "initial_accumulator_value"),
    "scale_by_rms": ("eps", ("initial_scale", "decay")),  # (the initial v weighs decay^t·initial_scale)
    "scale_by_stddev": ("eps",),
    "scale_by_adamax": ("eps",),
    "scale_by_factored_rms": ("epsilon",),
    "scale_by_newton_schulz": ("eps",),
    "scale_by_muon": ("eps",),
    "scale_by_normuon": ("eps",),
    "scale_by_adopt": ("eps",),
    "scale_by_ademamix": ("eps", "eps_root"),
    "scale_by_simplified_ademamix": ("eps", "eps_root"),
}


def _unguarded(opt, params):
    def zero(stage, guard):
        keys = guard if isinstance(guard, tuple) else (guard,)
        return any(_can_be_zero(stage.option(key)) for key in keys)

    return any(stage.label in ZERO_GUARDS and all(zero(stage, guard) for guard in ZERO_GUARDS[stage.label])
               for stage in _stages(opt))


def _stage_option_below(label: str, option: str, bound: float):
    """Applies when a stage named ``label`` has ``option`` below ``bound`` (at some step, for a schedule)."""
    return lambda opt, params: any(stage.label == label and np.any(_over_steps(stage.option(option)) < bound)
                                   for stage in _stages(opt))


@dataclasses.dataclass(frozen=True)
class Bug:
    summary: str
    applies: Callable[[ux.Update, Any], bool]  # (the pipeline, the params) -> whether it can show
    #: "finite": do not require finite updates; "close": do not compare jit with eager
    relaxes: tuple[str, ...]


KNOWN_BUGS = {
    "EPS-ZERO": Bug("documented (docs/errors.md, '`eps=0` on a zero gradient'): the ranges admit eps = 0 (with "
                    "eps_root = 0 and a zero initial accumulator), and then an exactly-zero gradient (a zero "
                    "matrix, for Newton-Schulz) gives 0/0 = NaN, as the papers' formulas do",
                    _unguarded, ("finite",)),
    # Open bugs (strict-xfail reproductions at the end of this file: fixing one makes its test fail, asking
    # to delete its row here).
    "STDDEV-CANCEL": Bug("scale_by_stddev's v - m^2 cancels where the variance vanishes (decay = 0 or tiny, "
                         "or a steady gradient, whose variance decays as decay^t: below 0.5, 6 steps leave 1.6% "
                         "of g^2, and float32's rounding of g^2 is past the tolerance relative to it): it is "
                         "clamped at 0 (so finite), but jit (an FMA) and eager round it differently, and "
                         "rsqrt(variance + eps) magnifies that beyond rounding. With bias_correction a steady "
                         "gradient's corrected variance is exactly 0, whatever the decay: only rounding is left",
                         lambda opt, params: (_stage_option_below("scale_by_stddev", "decay", 0.5)(opt, params)
                                              or any(stage.label == "scale_by_stddev"
                                                     and stage.option("bias_correction") for stage in _stages(opt))),
                         ("close",)),
}


def known_bugs(opt, params) -> dict[str, Bug]:
    return {key: bug for key, bug in KNOWN_BUGS.items() if bug.applies(opt, params)}


#: float16's largest finite value. bfloat16 has float32's range.
FLOAT16_MAX = float(jnp.finfo(jnp.float16).max)


def _upcast_float16(tree):
    return jax.tree.map(lambda x: x.astype(jnp.float32) if x.dtype == jnp.float16 else x, tree)


def exceeds_float16(opt, params, grads, losses) -> bool:
    """Documented (docs/errors.md, 'A result beyond float16's range'): whether the same example with its float16
    leaves in float32 has a stage result beyond float16's range in one of those leaves, at some step. Stages
    return their leaf's dtype, so there the float16 run overflows to inf (and a later stage may make it NaN).
    Checked only for an example that fails, and only at the top level of the pipeline."""
    float16 = [x.dtype == jnp.float16 for x in jax.tree.leaves(params)]
    if not any(float16):
        return False
    params32, grads32 = _upcast_float16(params), [_upcast_float16(g) for g in grads]
    for k in range(1, len(opt.stages) + 1):
        outs, _ = run(ux.Update(opt.stages[:k]), params32, grads32, losses, jit=True)
        for out in outs:
            for is16, leaf in zip(float16, jax.tree.leaves(out)):
                if is16 and np.any(np.abs(_as_float(leaf)) > FLOAT16_MAX):
                    return True
    return False


#: Known bugs that refuse documented options at construction: (target, options) -> whether it applies.
#: The fuzz skips exactly those draws.
REFUSED: dict[str, tuple[Callable[[str, dict], bool], str]] = {}


# --------------------------------------------------------------------------
# The fuzz


@pytest.mark.parametrize("name", TARGETS)
@settings(max_examples=PER_TARGET)
@given(data=st.data())
def test_fuzz(name, data):
    tgt = target(name)
    params, grads, losses = data.draw(trees_and_steps(name), label="inputs")
    options = data.draw(options_strategy(name, params), label="options")
    assume(not any(applies(name, options) for applies, _ in REFUSED.values()))
    opt = tgt.build(options)
    fed = [updates_for(opt, g) for g in grads]  # (per-example targets: a batch of examples made of each)
    note(f"opt = {opt!r}")
    bugs = known_bugs(opt, params)
    relaxed = {check for bug in bugs.values() for check in bug.relaxes}
    if bugs:
        note(f"known bugs: {sorted(bugs)}")
    # Kernels cast explicitly (strict promotion, as in the contract tests); complex leaves run under the
    # standard promotion, as in test_complex.py.
    promotion = "standard" if "strict" in relaxed or _is_complex(params) else "strict"
    with jax.numpy_dtype_promotion(promotion):
        state0 = opt.init(params)
        eager, eager_states = run(opt, params, fed, losses, jit=False, state=state0)
        jitted, jitted_states = run(opt, params, fed, losses, jit=True, state=state0)

        def check_steps(relaxed):
            for t, (g, e, j, es, js) in enumerate(zip(grads, eager, jitted, eager_states, jitted_states)):
                note(f"step {t + 1}")
                check_structure(g, e, state0, es)
                check_structure(g, j, state0, js)
                if "finite" not in relaxed:
                    check_finite(e)
                    check_finite(j)
                if "close" not in relaxed:
                    check_close(e, j, same_non_finite="finite" not in relaxed, storage=storage_tolerance(opt))

        try:
            check_steps(relaxed)
        except AssertionError:
            if "finite" in relaxed or not exceeds_float16(opt, params, fed, losses):
                raise
            note("beyond float16's range: float16 leaves may be inf or NaN, jit and eager compared where finite")
            check_steps(relaxed | {"finite"})
        if tgt.parent is not None:
            for form in pipe_forms(tgt, options):
                assert form == opt and hash(form) == hash(opt) and repr(form) == repr(opt)
                outs, states = run(form, params, fed, losses, jit=True)
                check_bit_identical(outs, jitted)
                check_bit_identical(states, jitted_states)
            assert pickle.loads(pickle.dumps(opt)) == opt


# --------------------------------------------------------------------------
# Writes: values written into a pipeline's state, inside and outside what each declares


def held_paths(opt: ux.Update, prefix: str = ""):
    """``(path, stage, option)`` for every held hyperparameter of ``opt``, nested pipelines included."""
    counts: dict[str, int] = {}
    labels = [stage.label for stage in opt.stages]
    for stage in opt.stages:
        k = counts[stage.label] = counts.get(stage.label, -1) + 1
        selector = f"{stage.label}[{k}]" if labels.count(stage.label) > 1 else stage.label
        path = prefix + selector
        for option in sorted(stage.held):
            yield f"{path}.{option}", stage, option
        for key, (_, inner) in stage.nested().items():
            yield from held_paths(inner, f"{path}/" if key is None else f"{path}/{key}/")


def field_paths(opt: ux.Update, state, prefix: str = ""):
    """``(path, value, domains)`` for every field of every stage's own state (not a nested pipeline's state, which
    its own stages declare), with the domain declared for each of the field's leaves (None: only its dtype's
    rules)."""
    from updax._domains import field_domain

    counts: dict[str, int] = {}
    labels = [stage.label for stage in opt.stages]
    for stage, entry in zip(opt.stages, state):
        k = counts[stage.label] = counts.get(stage.label, -1) + 1
        path = prefix + (f"{stage.label}[{k}]" if labels.count(stage.label) > 1 else stage.label)
        own = entry.state if isinstance(entry, ux.ScheduledState) else entry
        nested = stage.nested()
        fields_of_nested = {field for field, _ in nested.values()}
        for field in getattr(own, "_fields", ()):
            value = getattr(own, field)
            if field in fields_of_nested or not jax.tree.leaves(value):
                continue
            yield f"{path}.{field}", value, _declared(value, field_domain(type(own), field))
        for key, (field, inner) in nested.items():
            inner_state = getattr(own, field) if key is None else getattr(own, field)[key]
            yield from field_paths(inner, inner_state, f"{path}/" if key is None else f"{path}/{key}/")


def _declared(value, domain) -> list:
    """The domain each leaf of a state field's ``value`` is declared to hold, in flattening order: ``domain``,
    or inside a state held in the field (sam's adversary's) what its NamedTuple declares for the field above."""
    from updax._domains import field_domain

    if hasattr(value, "_fields"):
        return [d for name in value._fields
                for d in _declared(getattr(value, name), field_domain(type(value), name) or domain)]
    children = jax.tree_util.tree_flatten(value, is_leaf=lambda x: x is not value)[0]
    if len(children) == 1 and children[0] is value:
        return [domain]
    return [d for child in children for d in _declared(child, domain)]


def _outside_real(domain) -> list[float]:
    out = [float("nan"), float("inf"), -float("inf")]
    if domain.lo is not None:
        out += [domain.lo - 1.0, domain.lo - 1e-3] + ([domain.lo] if domain.lo_open else [])
    if domain.hi is not None:
        out += [domain.hi + 1.0] + ([domain.hi] if domain.hi_open else [])
    return out


def written_values(domain, dtype) -> st.SearchStrategy[tuple[Any, bool]]:
    """``(value, inside)``: values a write may bring, each with whether ``domain`` and ``dtype`` admit it."""
    from updax._domains import Flag, Integer, Real, Valid

    if isinstance(domain, Valid):
        domain = domain.values
    dtype = jnp.dtype(dtype)
    if dtype == jnp.bool_:
        return st.sampled_from([(True, True), (False, True), (1, True), (5, False), (-1, False), (0.5, False)])
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        lo = max(domain.lo, int(info.min)) if isinstance(domain, Integer) else int(info.min)
        hi = min(domain.hi if isinstance(domain, Integer) and domain.hi is not None else 2**31 - 1, int(info.max))
        inside = st.integers(lo, min(hi, lo + 1000)).map(lambda v: (v, True))
        outside = [(lo - 1, False), (int(info.max) + 1, False), (2.5, False), (float("nan"), False)]
        return st.one_of(inside, st.sampled_from(outside + ([] if hi >= 2**31 - 1 else [(hi + 1, False)])))
    big = float(jnp.finfo(dtype).max)
    if isinstance(domain, Real):
        rng = Range(False, domain.lo, domain.hi, domain.lo_open, domain.hi_open)
        inside = reals(rng).filter(lambda v: abs(v) <= big).map(lambda v: (v, True))
        return st.one_of(inside, st.sampled_from([(v, False) for v in _outside_real(domain)] + [(big * 4, False)]))
    if isinstance(domain, Flag):
        return st.sampled_from([(True, True), (False, True), (0.5, False)])
    bound = min(1e6, float(np.float32(big)) / 2)
    finite = st.floats(-bound, bound, allow_nan=False, width=32).map(lambda v: (v, True))
    return st.one_of(finite, st.sampled_from([(big * 4, False), (1e40, False) if big < 1e40 else (big * 10, False)]))


def _ordered_relations_hold(stage, option, value, state_values) -> bool:
    merged = {**dict(stage.options), **state_values, option: value}
    return all(bool(np.all(rel.rule(*(np.asarray(merged[n], np.float64) for n in rel.names))))
               for rel in stage.declaration.relations if option in rel.names)


def _named(error: Exception, *names: str) -> bool:
    text = str(error)
    return all(name in text for name in names)


@pytest.mark.parametrize("name", TARGETS)
@settings(max_examples=PER_TARGET)
@given(data=st.data())
def test_fuzz_writes(name, data):
    """Random values written to held hyperparameters (``hyperparams_in_state``) and to state fields, inside and
    outside what each declares: each is refused with an error naming the stage, the option or the path, or it
    is taken and gives the right numbers (a held value: the same step as the object built with that value; a
    state field: what it holds reads back, and the jitted step from it agrees with the eager one)."""
    tgt = target(name)
    params, grads, losses = data.draw(trees_and_steps(name), label="inputs")
    options = data.draw(options_strategy(name, params), label="options")
    opt = tgt.build(options)
    held = ux.hyperparams_in_state(opt)
    promotion = "standard" if _is_complex(params) else "strict"
    g, loss = updates_for(opt, grads[0]), losses[0]
    with jax.numpy_dtype_promotion(promotion):
        state = held.init(params)
        writes = list(held_paths(held))
        if writes:
            path, stage, option = data.draw(st.sampled_from(writes), label="held")
            old = held.get_state(state, path)
            domain = stage.declaration.domain(option)
            value, inside = data.draw(written_values(domain, old.dtype), label=f"{path} <-")
            inside = inside and _ordered_relations_hold(stage, option, value, {})
            try:
                written = held.replace_state(state, path, value)
            except (ValueError, TypeError) as error:
                assert not inside, f"{path} <- {value!r} refused though declared valid: {error}"
                assert _named(error, f"{stage.label}(", option), f"not named: {error}"
            else:
                assert inside, f"{path} <- {value!r} taken though outside {domain!r}"
                cast = jnp.asarray(value, old.dtype)
                np.testing.assert_array_equal(held.get_state(written, path), cast)
                u_held, _ = _update(held, g, written, params, loss)
                rebuilt = _with_option(opt, path, cast)
                u_ref, _ = _update(rebuilt, g, rebuilt.init(params), params, loss)
                check_close(u_ref, u_held, storage=storage_tolerance(opt))
        fields = list(field_paths(opt, opt.init(params)))
        if fields:
            state = opt.init(params)
            path, old, domains = data.draw(st.sampled_from(fields), label="field")
            leaves = jax.tree.leaves(old)
            leaf = data.draw(st.integers(0, len(leaves) - 1), label="leaf")
            domain = domains[leaf]
            value, inside = data.draw(written_values(domain, leaves[leaf].dtype), label=f"{path}[{leaf}] <-")
            if jnp.issubdtype(leaves[leaf].dtype, jax.dtypes.prng_key):
                return
            new = jax.tree.unflatten(jax.tree.structure(old), [np.full(np.shape(x), value) if i == leaf else x
                                                               for i, x in enumerate(leaves)])
            if not np.size(leaves[leaf]):
                inside = True  # nothing to hold
            try:
                written = opt.replace_state(state, path, new)
            except (ValueError, TypeError) as error:
                assert not inside, f"{path} <- {value!r} refused though declared valid: {error}"
                assert _named(error, f"replace_state({path}"), f"not named: {error}"
            else:
                assert inside, f"{path} <- {value!r} taken though outside {domain!r}"
                got = jax.tree.leaves(opt.get_state(written, path))[leaf]
                np.testing.assert_array_equal(got, np.full(np.shape(got), value).astype(got.dtype))
                eager, eager_state = _update(opt, g, written, params, loss)
                jitted, jitted_state = _jit_update(opt, g, written, params, loss)
                check_structure(grads[0], eager, state, eager_state)
                check_close(eager, jitted, same_non_finite=False, storage=storage_tolerance(opt))


def _with_option(opt: ux.Update, path: str, value) -> ux.Update:
    """``opt`` with the option at the held path ``path`` replaced by ``value`` (a tree map over its leaves)."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(opt)
    keys = _leaf_keys(opt, path)
    assert keys in [key_path for key_path, _ in leaves], path
    return jax.tree.unflatten(treedef, [value if key_path == keys else leaf for key_path, leaf in leaves])


def _leaf_keys(opt: ux.Update, path: str):
    """The key path of the leaf a held path's option is among ``opt``'s pytree leaves."""
    stages_part, _, option = path.rpartition(".")
    keys: tuple = ()
    current = opt
    selectors = stages_part.split("/")
    i = 0
    while i < len(selectors):
        selector = selectors[i]
        label, _, index = selector.partition("[")
        matching = [j for j, s in enumerate(current.stages) if s.label == label]
        position = matching[int(index.rstrip("]")) if index else 0]
        stage = current.stages[position]
        keys += (jax.tree_util.SequenceKey(position),)
        i += 1
        if i == len(selectors):
            return keys + (jax.tree_util.GetAttrKey(option),)
        nested = stage.nested()
        if None in nested:  # (the wrapped pipeline, or GaLore's base: the option named as its state field)
            keys += (jax.tree_util.GetAttrKey(nested[None][0]),)
            current = nested[None][1]
        else:
            group = next(k for k in nested if str(k) == selectors[i])
            groups_option = next(k for k, d in stage.declaration.domains if type(d).__name__ == "Pipelines")
            keys += (jax.tree_util.GetAttrKey(groups_option), jax.tree_util.DictKey(group))
            current = nested[group][1]
            i += 1
    raise AssertionError(path)


# --------------------------------------------------------------------------
# The fuzz covers everything


@pytest.mark.parametrize("name", TARGETS)
def test_every_option_of_every_target_has_a_strategy(name):
    """Every option of every entry and optimizer is drawn; every numeric one from a documented range."""
    tgt = target(name)
    params = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)}
    for p in _parameters(name):
        strategy = _option_strategy(name, p, params, p.name in tgt.schedulable)
        assert strategy is not None, (f"{name}({p.name}=...): no strategy; its docstring states no range the "
                                      "fuzz can parse: document one, or add an OVERRIDES/STRUCTURAL row")
        if _is_numeric(p) and _structural_for(name, p.name) is None:
            assert documented_range(name, p.name) is not None


def test_override_rows_name_existing_options_and_say_why():
    for (name, option), (rng, why) in OVERRIDES.items():
        assert option in {p.name for p in _parameters(name)}, (name, option)
        assert why
    for (name, option), (_, why) in STRUCTURAL.items():
        if name != "*":
            assert option in {p.name for p in _parameters(name)}, (name, option)
        assert why


@pytest.mark.parametrize("text, expected", [
    ("decay of the first moment, in [0, 1). Default: ``0.9``.", Range(False, 0.0, 1.0, False, True)),
    ("the interpolation weight, in (0, 1). Default: ``0.9``.", Range(False, 0.0, 1.0, True, True)),
    ("the momentum, in [0, 1]. Default: ``0.9``.", Range(False, 0.0, 1.0)),
    ("added to the denominator, >= 0. Default: ``1e-8``.", Range(lo=0.0)),
    ("the bound, > 0. Default: ``1.0``.", Range(lo=0.0, lo_open=True)),
    ("step-size factor on agreeing signs, >= 1; the paper's value.", Range(lo=1.0)),
    ("the largest step size, >= ``min_step_size``; the paper's value.", Range(at_least="min_step_size")),
    ("calls averaged per evaluation, an integer >= 1. Default: ``1``.", Range(integer=True, lo=1)),
    ("the number of iterations, a positive integer. Default: ``5``.", Range(integer=True, lo=1)),
    ("the number of iterations, an integer in [1, 100].", Range(integer=True, lo=1, hi=100)),
    ("the weight-decay rate, any real number. Default: ``0.0``.", Range()),
    ("the factor ``c``. Default: ``1.0``.", None),
])
def test_parse_range(text, expected):
    assert parse_range(text) == expected


def test_every_optimizer_option_lands_where_its_range_is_documented():
    """The probe that finds an optimizer option's range finds the obvious ones."""
    assert landings("optimizers.adam", "b1") == [("scale_by_adam", "b1")]
    assert landings("optimizers.sgd", "momentum") == [("trace", "decay")]
    assert documented_range("optimizers.adam", "b1")[0] == Range(False, 0.0, 1.0, False, True)


# --------------------------------------------------------------------------
# The documented exception, and the bugs the fuzz found (fixed), as tests


@pytest.mark.parametrize("delta", [jnp.asarray(1.0, jnp.float32), ux.schedules.constant(1.0)],
                         ids=["array", "schedule"])
def test_clip_casts_its_bound_to_the_leaf_dtype(delta):
    grads = {"w": jnp.asarray([-3.0, 0.5, 2.0], jnp.bfloat16)}
    opt = ux.clip(delta)
    with jax.numpy_dtype_promotion("strict"):
        out, _ = opt.update(grads, opt.init(grads))
    assert out["w"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out["w"], np.float32), [-1.0, 0.5, 1.0])


#: One call per EPS-ZERO stage, each with every guard ZERO_GUARDS names at 0 (a product by one of its options;
#: the ends of their documented ranges). scale_by_rss is not one: it guards its zero sum of squares.
_UNGUARDED = {
    "scale_by_adam": lambda: ux.scale_by_adam(eps=0.0, eps_root=0.0),
    "scale_by_belief": lambda: ux.scale_by_belief(b1=0.0, eps=0.0, eps_root=0.0),
    "scale_by_radam": lambda: ux.scale_by_radam(eps=0.0, eps_root=0.0),  # rectified from step 6 on
    "scale_by_amsgrad": lambda: ux.scale_by_amsgrad(eps=0.0, eps_root=0.0),
    "scale_by_nadam": lambda: ux.scale_by_nadam(eps=0.0, eps_root=0.0),
    "scale_by_novograd": lambda: ux.scale_by_novograd(eps=0.0, eps_root=0.0),
    "scale_by_adan": lambda: ux.scale_by_adan(eps=0.0, eps_root=0.0),
    "scale_by_yogi": lambda: ux.scale_by_yogi(initial_accumulator_value=0.0, eps=0.0, eps_root=0.0),
    "scale_by_stddev": lambda: ux.scale_by_stddev(eps=0.0),
    "scale_by_rms": lambda: ux.scale_by_rms(eps=0.0, initial_scale=1.0, decay=0.0),
    "scale_by_adamax": lambda: ux.scale_by_adamax(eps=0.0),
    "scale_by_factored_rms": lambda: ux.scale_by_factored_rms(epsilon=0.0),
    "scale_by_newton_schulz": lambda: ux.scale_by_newton_schulz(eps=0.0),
    "scale_by_muon": lambda: ux.scale_by_muon(eps=0.0),
    "scale_by_normuon": lambda: ux.scale_by_normuon(eps=0.0),
    "scale_by_adopt": lambda: ux.scale_by_adopt(eps=0.0),  # 0/0 from the second call on
    "scale_by_ademamix": lambda: ux.scale_by_ademamix(eps=0.0, eps_root=0.0),
    "scale_by_simplified_ademamix": lambda: ux.scale_by_simplified_ademamix(eps=0.0, eps_root=0.0),
}


def test_the_zero_eps_cases_cover_every_guarded_stage():
    assert set(_UNGUARDED) == set(ZERO_GUARDS)


@pytest.mark.parametrize("name", sorted(_UNGUARDED))
def test_zero_eps_on_a_zero_gradient_gives_nan_as_documented(name):
    opt = _UNGUARDED[name]()
    grads = {"w": jnp.zeros((2, 2)), "b": jnp.asarray([0.0, 1.0])}
    state = opt.init(grads)
    finite = True
    for _ in range(8):
        updates, state = opt.update(grads, state, grads)
        finite &= all(bool(np.all(np.isfinite(leaf))) for leaf in jax.tree.leaves(updates))
    assert not finite, f"{opt!r} stays finite: update docs/errors.md and EPS-ZERO"


def test_schedule_free_adamw_takes_any_documented_peak_with_a_warmup():
    for peak in (0.0, 0.1, 3e38):
        assert ux.optimizers.schedule_free_adamw(learning_rate=peak, warmup_steps=10) is not None
        assert ux.optimizers.schedule_free_sgd(learning_rate=peak, warmup_steps=10) is not None


def _finite_steps(opt, grads, steps, jit):
    state, update = opt.init(grads), jax.jit(opt.update) if jit else opt.update
    for _ in range(steps):
        updates, state = update(grads, state, grads)
        for leaf in jax.tree.leaves(updates):
            assert np.all(np.isfinite(leaf)), f"{opt!r}: {leaf}"


@pytest.mark.xfail(strict=True, reason="STDDEV-CANCEL: v - m^2 in float32 cancels as the variance vanishes")
def test_stddev_of_a_steady_gradient_is_its_closed_form():
    """A steady gradient g with decay d: m = (1 - d^t)·g, v = (1 - d^t)·g², so v - m² = g²·d^t·(1 - d^t), and
    the update g / sqrt(v - m²). At d = 0.25 and t = 8 it is 1.5e-5 of g²: float32 is 1.7e-3 off (eagerly, where
    the rule runs as the jitted step's program, as under jax.jit)."""
    opt, g, d = ux.scale_by_stddev(decay=0.25, eps=0.0, eps_in_sqrt=False), 17.0, 0.25
    state = opt.init({"w": jnp.zeros(1)})
    for t in range(1, 9):
        u, state = opt.update({"w": jnp.asarray([g])}, state)
        np.testing.assert_allclose(u["w"], [g / np.sqrt(g * g * d**t * (1 - d**t))], rtol=2e-5)


def test_stddev_of_a_single_sample_is_finite_under_jit():
    _finite_steps(ux.scale_by_stddev(decay=0.0, eps=1e-8), {"w": jnp.asarray([32.179688])}, 1, jit=True)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_schedule_free_with_a_tiny_documented_b1_is_finite_and_exact(jit):
    # It recovered x as (y - (1 - b1)·z) / b1: step 2 was (1 - 31) / 1.2e-38 / 2 = -inf. Its steps now need no
    # division by b1: y' - y = c·(z - y) + (1 - b1·(1 - c))·u, c = 1/t here (a constant learning rate).
    b1 = float(np.finfo(np.float32).tiny)
    opt = ux.scale_by_learning_rate(30.0).schedule_free(30.0, b1=b1)
    params, grads = {"w": jnp.ones(1)}, {"w": jnp.ones(1)}
    _finite_steps(opt, grads, 2, jit=jit)
    update = jax.jit(opt.update) if jit else opt.update
    state, y, z, x = opt.init(params), 1.0, 1.0, 1.0
    for t in range(1, 4):  # closed form in float64: z' = z - 30, x' = x + (z' - x)/t, y' = b1·x' + (1 - b1)·z'
        u, state = update(grads, state, params)
        params = ux.apply_updates(params, u)
        z -= 30.0
        x += (z - x) / t
        y = b1 * x + (1 - b1) * z
        np.testing.assert_allclose(params["w"], [y], rtol=1e-6)


@pytest.mark.parametrize("opt", [ux.scale_by_belief(b1=0.0), ux.scale_by_stddev(decay=0.0)], ids=["belief", "stddev"])
def test_a_result_beyond_float16s_range_is_inf_in_a_float16_leaf(opt):
    # A vanishing variance leaves about g / sqrt(eps_root) (belief: (g - m)^2 = 0 when b1 = 0) or g / sqrt(eps)
    # (stddev: v - m^2 = 0 when decay = 0), both in their documented ranges.
    g = jnp.asarray([0.5, -100.0], jnp.float16)
    u32, _ = opt.update({"w": g.astype(jnp.float32)}, opt.init({"w": g.astype(jnp.float32)}))
    u16, _ = opt.update({"w": g}, opt.init({"w": g}))
    u32, u16 = np.asarray(u32["w"], np.float64), np.asarray(u16["w"], np.float64)
    beyond = np.abs(u32) > FLOAT16_MAX
    assert np.all(np.isfinite(u32)) and beyond[1]
    np.testing.assert_array_equal(u16[beyond], np.sign(u32[beyond]) * np.inf)
    np.testing.assert_allclose(u16[~beyond], u32[~beyond], rtol=1e-3)
    assert exceeds_float16(opt, {"w": g}, [{"w": g}], [jnp.zeros([])])
    assert not exceeds_float16(opt, {"w": g.astype(jnp.bfloat16)}, [{"w": g.astype(jnp.bfloat16)}], [jnp.zeros([])])


def test_the_long_runs_two_schedule_findings_are_finite():
    """Found by the long run: a schedule from a value below the other end's rounding started at 0 (adadelta's eps
    from 6e-8 to 2 divided 0 by 0 on a zero complex gradient; adafactor's block-RMS clipping threshold from
    2.2e-16 to 1 divided a zero update by 0). Schedules are now exact at both ends, and a schedule's value of 0
    for the threshold, outside its domain, is refused by name."""
    poly = ux.schedules.polynomial_decay
    adadelta = ux.scale_by_adadelta(rho=0.0, eps=poly(5.960464477539063e-08, end_value=2.0, power=1.0,
                                                          transition_steps=2))
    _finite_steps(adadelta, {"w": jnp.zeros(2, jnp.complex64)}, 2, jit=True)
    adafactor = ux.optimizers.adafactor(None, min_dim_size_to_factor=1, decay_rate=0.0, eps=1.0, factored=False,
                                        multiply_by_parameter_scale=False,
                                        clipping_threshold=poly(2.220446049250313e-16, end_value=1.0, power=1.0,
                                                                transition_steps=2))
    _finite_steps(adafactor, {"a": jnp.zeros(())}, 2, jit=False)
    clip = ux.clip_by_block_rms(ux.schedules.constant(0.0))  # (a threshold of 0 is outside its domain, > 0)
    with pytest.raises(ValueError, match=r"clip_by_block_rms\(threshold=0\.0\): threshold must be in \(0, inf\) "
                                         r"\(the value its schedule returned at count 0\)"):
        clip.init(None)


def test_ema_takes_a_complex_init_for_complex_values_and_refuses_it_for_real_ones():
    """Found by the long run: ema(init=<a 0-d complex array>), a params-shaped init for one complex scalar, was
    refused as 'must be a real scalar'. A complex init is now taken for complex values, and refused by name for
    real ones (where the imaginary part would be dropped)."""
    g = jnp.asarray(1 + 2j, jnp.complex64)
    for init in (jnp.asarray(0.5j, jnp.complex64), 0.5j):
        opt = ux.ema(0.5, debias=False, init=init)
        out, _ = opt.update(g, opt.init(g))
        np.testing.assert_allclose(out, 0.5 * 0.5j + 0.5 * (1 + 2j))  # keep·init + (1 - keep)·g
    with pytest.raises(TypeError, match="ema: init is complex but the values\\['w'\\] are real"):
        ux.ema(0.5, init=1j).init({"w": jnp.ones(2)})
    with pytest.raises(ValueError, match="init must be finite"):
        ux.ema(0.5, init=complex("nan"))
