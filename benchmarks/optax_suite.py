"""optax 0.2.8's own test files, run against updax (issue 43, "What optax users' code relies on").

    nice -n 19 env PYTHONPATH=src .venv/bin/python benchmarks/optax_suite.py [FILE_GLOB ...] [--out NAME]

Each of optax's installed ``*_test.py`` files is copied to a temporary directory and run with pytest, this file
loaded as a plugin (``-p optax_suite``). While a test module is imported, the optax modules it imports
(``import optax``, ``from optax._src import alias``, ``from optax.contrib import ...``) are *proxies*: each
optax constructor named in :data:`MAPPING` (optimizers, transforms, wrappers, schedules) answers with a function
that binds optax's arguments with optax's defaults, renames them to updax's, builds the updax object and returns
``ux.to_optax(...)`` (a schedule is returned as the updax schedule, which is callable). optax's own modules keep
their own functions, so a constructor left unmapped (:data:`NOT_REPLACED`) is optax's code throughout.

Per test the plugin records which constructors ran, mapped or not, and the outcome; a test that ran no mapped
constructor and one that ran only unmapped ones are counted apart ("out of scope" and "not replaced"). Failures are
grouped by reason: a missing option (optax's argument has a value updax cannot take), state layout (the test reads
optax's state fields, by design different), numbers (an assertion on values: each is listed), refused by updax
(updax raised), and other. Files of optax's internals that construct no optimizer (:data:`OUT_OF_SCOPE`) are not
run; their tests are counted at collection.

Writes benchmarks/results/optax_suite.md and .json (or ``--out NAME``: NAME.md, NAME.json), and the raw records,
one JSON line per test report, to NAME.jsonl as the tests run (``--reuse`` reports from them again; not kept in git). Without optax
installed the script says so and stops. tests/test_optax_suite.py runs one small file through the same plugin.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import glob
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# --------------------------------------------------------------------------------------------------------------
# The mapping: optax's public name -> (updax's name, {optax argument: updax argument or None to drop}).
# An argument not renamed keeps its name; one updax lacks is dropped while it holds optax's default (or None),
# and refused by name (MissingOption) otherwise. "uo." is updax.optimizers, "us." updax.schedules, "ux." updax.
# A third element, when present, is a function of the bound optax arguments returning updax's keywords.

WD = {"weight_decay": "decay", "weight_decay_mask": "mask"}


def _key_from_seed(a: dict) -> dict:
    """optax's ``key=None, seed=None`` (a PRNG key or an int) as updax's ``key`` (an int or a key, default 0)."""
    key, seed = a.pop("key", None), a.pop("seed", None)
    a["key"] = key if key is not None else (seed if seed is not None else 0)
    return a


def _scales_to_values(a: dict) -> dict:
    """optax's ``boundaries_and_scales`` (cumulative factors) as updax's ``boundaries_and_values``."""
    scales, value, values = a.pop("boundaries_and_scales") or {}, a["init_value"], {}
    for boundary in sorted(scales):
        value = value * scales[boundary]
        values[boundary] = value
    a["boundaries_and_values"] = values
    return a


def _muon_dims(a: dict) -> dict:
    """optax.contrib's ``MuonDimensionNumbers`` or ``GaLoreDimensionNumbers`` (a tree of them, or a function
    returning one) as updax's ``MuonDimensionNumbers`` (GaLore reads Muon's: one mechanism)."""
    import jax
    import optax.contrib
    from optax.contrib._galore import GaLoreDimensionNumbers

    import updax as ux

    kinds = (optax.contrib.MuonDimensionNumbers, GaLoreDimensionNumbers)

    def convert(tree):
        return jax.tree.map(lambda d: ux.MuonDimensionNumbers(d.reduction_axis, d.output_axis)
                            if isinstance(d, kinds) else d, tree, is_leaf=lambda d: isinstance(d, kinds))

    for key in ("weight_dimension_numbers", "muon_weight_dimension_numbers"):
        dims = a.get(key)
        if callable(dims) and not isinstance(dims, kinds):
            a[key] = functools.wraps(dims)(lambda params, dims=dims: convert(dims(params)))
        elif dims is not None:
            a[key] = convert(dims)
    return a


def _decoupled(a: dict) -> dict:
    """optax's MoMo weight decay: updax's ``decay_form="decoupled"`` (updax's default is the paper's proximal step)."""
    a["decay_form"] = "decoupled"
    return a


def _init_step(a: dict) -> dict:
    """optax's ``init_step=(type, value)`` as updax's ``init_step_type``, ``init_step``."""
    a["init_step_type"], a["init_step"] = a.pop("init_step")
    return a


def _betas(a: dict) -> dict:
    """optax's ``betas=(b1, b2)`` as updax's ``b1``, ``b2``."""
    a["b1"], a["b2"] = a.pop("betas")
    return a


MAPPING: dict[str, tuple] = {
    # optimizers (optax._src.alias, optax.contrib)
    **{f"optax.{n}": (f"uo.{n}", WD) for n in (
        "adabelief", "adadelta", "adagrad", "adam", "adamax", "adamaxw", "adamw", "adan", "amsgrad",
        "fromage", "lamb", "lion", "nadam", "nadamw", "novograd", "optimistic_adam_v2",
        "optimistic_gradient_descent", "radam", "rmsprop", "rprop", "sgd", "sign_sgd", "sm3", "yogi")},
    "optax.lars": ("uo.lars", WD),
    "optax.adafactor": ("uo.adafactor", {"weight_decay_rate": "decay", "weight_decay_mask": "mask"}),
    "optax.signum": ("uo.signum", {"beta": "momentum"}),
    "optax.noisy_sgd": ("uo.noisy_sgd", {}, _key_from_seed),
    "optax.lbfgs": ("uo.lbfgs", {}),
    **{f"optax.contrib.{n}": (f"uo.{n}", WD) for n in (
        "acprop", "ademamix", "adopt", "cocob", "dowg", "madgrad",
        "schedule_free_adamw", "schedule_free_sgd", "simplified_ademamix")},
    "optax.contrib.dog": ("uo.dog", WD, _init_step),
    "optax.contrib.dadapt_adamw": ("uo.dadapt_adamw", WD, _betas),
    "optax.contrib.prodigy": ("uo.prodigy", {**WD, "beta3": "b3"}, _betas),
    "optax.contrib.muon": ("uo.muon", {**WD, "adam_weight_decay": "adam_decay",
                                       "muon_weight_dimension_numbers": "weight_dimension_numbers"}, _muon_dims),
    "optax.contrib.scale_by_muon": ("ux.scale_by_muon", {}, _muon_dims),
    "optax.contrib.sophia": ("uo.sophia", WD),
    "optax.contrib.galore": ("uo.galore", WD, _muon_dims),
    "optax.contrib.scale_by_galore": ("ux.scale_by_galore", {}, _muon_dims),
    "optax.contrib.momo": ("uo.momo", {**WD, "beta": "momentum"}, _decoupled),
    "optax.contrib.momo_adam": ("uo.momo_adam", WD, _decoupled),
    "optax.contrib.dpsgd": ("uo.dpsgd", {"seed": "key"}),
    # transforms (optax._src.transform, optax.transforms)
    **{f"optax.{n}": (f"ux.{n}", {}) for n in (
        "scale", "scale_by_adadelta", "scale_by_adam", "scale_by_adamax", "scale_by_adan", "scale_by_amsgrad",
        "scale_by_backtracking_linesearch", "scale_by_belief", "scale_by_factored_rms", "scale_by_lbfgs",
        "scale_by_learning_rate", "scale_by_lion", "scale_by_novograd", "scale_by_optimistic_gradient",
        "scale_by_param_block_norm", "scale_by_param_block_rms", "scale_by_polyak", "scale_by_radam",
        "scale_by_rms", "scale_by_rprop", "scale_by_rss", "scale_by_sign", "scale_by_sm3",
        "scale_by_stddev", "scale_by_trust_ratio", "scale_by_yogi", "scale_by_zoom_linesearch", "trace", "ema",
        "centralize", "identity", "keep_params_nonnegative", "zero_nans", "apply_every", "clip_by_global_norm",
        "clip_by_block_rms", "adaptive_grad_clip", "normalize_by_update_norm", "freeze")},
    "optax.scale_by_novograd": ("ux.scale_by_novograd", WD),
    "optax.clip": ("ux.clip", {"max_delta": "delta"}),
    "optax.add_decayed_weights": ("ux.add_decayed_weights", WD),
    "optax.add_noise": ("ux.add_noise", {}, _key_from_seed),
    "optax.scale_by_schedule": ("ux.scale_by_schedule", {"step_size_fn": "schedule_fn"}),
    **{f"optax.contrib.{n}": (f"ux.{n}", {}) for n in (
        "scale_by_acprop", "scale_by_ademamix", "scale_by_adopt", "scale_by_cocob", "scale_by_madgrad",
        "scale_by_simplified_ademamix", "reduce_on_plateau")},
    "optax.contrib.differentially_private_aggregate": ("ux.differentially_private_aggregate", {}, _key_from_seed),
    # wrappers: an inner optax transformation becomes updax (the updax object behind a to_optax, else from_optax)
    "optax.masked": ("ux.masked", {}),
    "optax.apply_if_finite": ("ux.apply_if_finite", {}),
    "optax.partition": ("ux.partition", {"param_labels": "labels"}),
    "optax.multi_transform": ("ux.partition", {"param_labels": "labels"}),
    "optax.conditionally_mask": ("ux.conditionally_mask", {}),
    "optax.conditionally_transform": ("ux.conditionally_transform", {}),
    "optax.selective_transform": ("ux.selective_transform", {"optimizer": "inner"}),
    "optax.contrib.split_real_and_imaginary": ("ux.split_real_and_imaginary", {}),
    "optax.contrib.schedule_free": ("ux.schedule_free", {"base_optimizer": "inner"}),
    "optax.contrib.mechanize": ("ux.mechanize", {"base_optimizer": "inner", "weight_decay": "decay"}),
    # schedules (optax.schedules): the updax schedule object, itself a function of the count
    "optax.constant_schedule": ("us.constant", {"value": "init_value"}),
    "optax.cosine_decay_schedule": ("us.cosine_decay", {}),
    "optax.exponential_decay": ("us.exponential_decay", {}),
    "optax.linear_schedule": ("us.linear_schedule", {}),
    "optax.polynomial_schedule": ("us.polynomial_decay", {}),
    "optax.piecewise_constant_schedule": ("us.piecewise_constant", {}, _scales_to_values),
    "optax.piecewise_interpolate_schedule": ("us.piecewise_interpolate", {}),
    "optax.join_schedules": ("us.join_schedules", {}),
    "optax.warmup_constant_schedule": ("us.warmup_constant", {}),
    "optax.warmup_cosine_decay_schedule": ("us.warmup_cosine_decay", {}),
    "optax.warmup_exponential_decay_schedule": ("us.warmup_exponential_decay", {}),
    "optax.cosine_onecycle_schedule": ("us.cosine_onecycle", {}),
    "optax.linear_onecycle_schedule": ("us.linear_onecycle", {}),
    "optax.sgdr_schedule": ("us.sgdr", {}),
}

#: Keywords of ``update`` that updax names otherwise: the loss (optax's value=) and Sophia's objective.
UPDATE_KEYWORDS = {"optax.contrib.reduce_on_plateau": {"value": "loss"}, "optax.scale_by_polyak": {"value": "loss"},
                   "optax.contrib.sophia": {"obj_fn": "value_fn"}, "optax.contrib.momo": {"value": "loss"},
                   "optax.contrib.momo_adam": {"value": "loss"}}

#: optax constructors with no updax equivalent here (optax's own code runs; their tests count as not replaced
#: when they use no mapped constructor). Neutral combinators (chain, named_chain, inject_hyperparams,
#: with_extra_args_support, stateless, MultiSteps) are neither: they combine whatever they are given.
NOT_REPLACED = (
    "optax.optimistic_adam",  # optax's `optimism` argument; updax's optimistic_adam takes alpha and beta
    "optax.polyak_sgd",  # optax's scaling/max_learning_rate; updax's takes learning_rate and max_learning_rate
    "optax.lookahead",  # optax's params are LookaheadParams(fast, slow); updax keeps the slow params in the state
    "optax.scale_by_distance_over_gradients",  # optax's reps_rel and global_scale; updax's scale_by_dog: init_step
    # updax's monitor, measure_with_ema and snapshot exist, their measurements read by path (optax: optax.tree.get
    # on its state): optax's tests of them read optax's state
    "optax.monitor", "optax.measure_with_ema", "optax.snapshot",
    "optax.flatten", "optax.set_to_zero",
    "optax.contrib.sam", "optax.contrib.normalize", "optax.contrib.hutchinson_estimator_diag_hessian",
)

#: optax test files of internals that construct no optimizer: not run, their tests counted at collection.
OUT_OF_SCOPE = ("losses/*", "tree_utils/_random_test.py", "tree_utils/_casting_test.py",
                "tree_utils/_tree_math_test.py", "assignment/*", "perturbations/*", "projections/*",
                "_src/numerics_test.py", "_src/linear_algebra_test.py", "_src/float64_test.py")


#: optax's arguments whose None is a choice updax takes as None too, not "the default": L-BFGS's
#: ``linesearch=None``, no line search (updax's default is the zoom search). (A learning rate of None is optax's "no
#: scaling", updax's default of 1.0 where updax's default is not None itself, as adadelta's.)
NONE_IS_AN_OPTION = ("linesearch",)


class MissingOption(NotImplementedError):
    """optax's argument holds a value that updax's equivalent cannot take."""


# --------------------------------------------------------------------------------------------------------------
# The plugin (loaded in the pytest process with -p optax_suite)

_CALLED: dict[str, set] = {"mapped": set(), "unmapped": set()}
_UPDAX_BEHIND: dict[int, tuple[Any, Any]] = {}  # id(to_optax object) -> (it, the updax object)


def _resolve(target: str) -> Callable:
    import updax
    import updax.optimizers
    import updax.schedules
    prefix, name = target.split(".", 1)
    return getattr({"ux": updax, "uo": updax.optimizers, "us": updax.schedules}[prefix], name)


def _optax_object(public: str) -> Any:
    import importlib
    module, name = public.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def _is_transformation(value: Any) -> bool:
    import updax as ux
    return (not isinstance(value, ux.Update) and callable(getattr(value, "init", None))
            and callable(getattr(value, "update", None)))


def _as_updax(value: Any) -> Any:
    """An optax transformation given to a wrapper, as updax: the object behind a to_optax, else from_optax."""
    import updax as ux
    if id(value) in _UPDAX_BEHIND and _UPDAX_BEHIND[id(value)][0] is value:
        return _UPDAX_BEHIND[id(value)][1]
    return ux.from_optax(value)


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 (an array, a tracer: not optax's default)
        return False


def _adapter(public: str, optax_fn: Callable, spec: tuple) -> Callable:
    target, renames, *convert = spec
    signature = inspect.signature(optax_fn)
    is_schedule = target.startswith("us.")

    @functools.wraps(optax_fn)
    def build(*args: Any, **kwargs: Any) -> Any:
        _CALLED["mapped"].add(public)
        updax_fn = _resolve(target)
        accepted = inspect.signature(updax_fn).parameters
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        given = dict(bound.arguments)
        if convert:
            given = convert[0](given)
        options = {}
        for name, value in given.items():
            uname = renames.get(name, name)
            default = signature.parameters[name].default if name in signature.parameters else None
            if uname not in accepted:
                if value is None or _same(value, default):
                    continue
                raise MissingOption(f"updax's {target[3:]} has no option for optax's {name}={value!r}")
            if value is None and accepted[uname].default not in (None, inspect.Parameter.empty) and \
                    name not in NONE_IS_AN_OPTION:  # optax's None for "none" (a weight decay): updax's default
                continue
            if isinstance(value, dict) and name == "transforms":
                value = {k: _as_updax(v) if _is_transformation(v) else v for k, v in value.items()}
            elif _is_transformation(value):
                value = _as_updax(value)
            options[uname] = value
        inner = [options.pop("inner")] if "inner" in options else []  # a combinator's leading update: positional
        built = updax_fn(*inner, **options)
        if is_schedule:
            return built
        import updax as ux
        tx = ux.to_optax(built)
        if public in UPDATE_KEYWORDS:
            renamed, updax_update = UPDATE_KEYWORDS[public], tx.update

            def update(updates, state, params=None, **extra):
                return updax_update(updates, state, params, **{renamed.get(k, k): v for k, v in extra.items()})

            tx = type(tx)(tx.init, update)
        _UPDAX_BEHIND[id(tx)] = (tx, built)
        return tx

    build.__signature__ = signature
    build._optax_suite = public
    return build


def _counter(public: str, optax_fn: Callable) -> Callable:
    @functools.wraps(optax_fn)
    def counted(*args: Any, **kwargs: Any) -> Any:
        _CALLED["unmapped"].add(public)
        return optax_fn(*args, **kwargs)

    counted._optax_suite = public
    return counted


def _replacements() -> dict[int, Callable]:
    """id(optax's function) -> its replacement, for every mapped and every unmapped constructor."""
    out = {}
    for public, spec in MAPPING.items():
        fn = _optax_object(public)
        out[id(fn)] = _adapter(public, fn, spec)
    for public in NOT_REPLACED:
        fn = _optax_object(public)
        out.setdefault(id(fn), _counter(public, fn))
    return out


class _Proxy(types.ModuleType):
    """A stand-in for one optax module: the replacements where the module holds optax's function, the proxies
    of its submodules, and the module's own attributes otherwise."""

    def __init__(self, real: types.ModuleType, replaced: dict[int, Callable], proxies: dict[str, Any]) -> None:
        super().__init__(real.__name__, real.__doc__)
        self.__dict__["_real"] = real
        self.__dict__["_replaced"] = replaced
        self.__dict__["_proxies"] = proxies

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.__dict__["_real"], name)
        if isinstance(value, types.ModuleType):
            return self.__dict__["_proxies"].get(value.__name__, value)
        if callable(value):
            return self.__dict__["_replaced"].get(id(value), value)
        return value

    def __dir__(self) -> list[str]:
        return dir(self.__dict__["_real"])


_STATE: dict[str, Any] = {}


def _proxies() -> dict[str, _Proxy]:
    if "proxies" not in _STATE:
        import importlib
        import pkgutil

        import optax
        for info in pkgutil.walk_packages(optax.__path__, "optax."):
            if not info.name.endswith("_test") and ".test_utils" not in info.name:
                with contextlib.suppress(Exception):
                    importlib.import_module(info.name)
        replaced = _replacements()
        proxies: dict[str, _Proxy] = {}
        for name, module in list(sys.modules.items()):
            if (name == "optax" or name.startswith("optax.")) and isinstance(module, types.ModuleType):
                proxies[name] = _Proxy(module, replaced, proxies)
        _STATE["proxies"] = proxies
    return _STATE["proxies"]


@contextlib.contextmanager
def _optax_replaced():
    """sys.modules' optax modules as proxies, for the import of one test module."""
    proxies = _proxies()
    saved = {name: sys.modules[name] for name in proxies}
    sys.modules.update(proxies)
    try:
        yield
    finally:
        sys.modules.update(saved)


def pytest_pycollect_makemodule(module_path, parent):
    import pytest
    if os.environ.get("OPTAX_SUITE_PLAIN"):  # the baseline: optax's own constructors
        return None

    class ReplacedModule(pytest.Module):
        def _getobj(self):
            with _optax_replaced():
                return super()._getobj()

    return ReplacedModule.from_parent(parent, path=module_path)


def pytest_runtest_setup(item):
    _CALLED["mapped"].clear()
    _CALLED["unmapped"].clear()


def _reason(excinfo) -> dict:
    value = excinfo.value
    text = str(value).strip()
    first = next((line for line in text.splitlines() if line.strip()), "")
    frames = [str(entry.path) for entry in excinfo.traceback]
    in_updax = any(os.sep + "updax" + os.sep in f and "site-packages" not in f for f in frames[-3:])
    return {"type": type(value).__name__, "first_line": first[:300], "text": text[:3000], "raised_in_updax": in_updax,
            "last_frame": frames[-1] if frames else ""}


def pytest_runtest_makereport(item, call):
    if call.when != "call" and not (call.when == "setup" and call.excinfo is not None):
        return
    record = {"nodeid": item.nodeid, "when": call.when, "mapped": sorted(_CALLED["mapped"]),
              "unmapped": sorted(_CALLED["unmapped"])}
    if call.excinfo is None:
        record["outcome"] = "passed"
    elif call.excinfo.errisinstance(_skip_exceptions()):
        record["outcome"] = "skipped"
    else:
        record["outcome"] = "failed"
        record.update(_reason(call.excinfo))
    path = os.environ.get("OPTAX_SUITE_RECORDS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def _skip_exceptions():
    import unittest

    import pytest
    return (pytest.skip.Exception, unittest.SkipTest)


# --------------------------------------------------------------------------------------------------------------
# The run and the report

NUMERIC = re.compile(r"Not equal to tolerance|not almost equal|Arrays are not equal|Mismatched elements|"
                     r"not close|assert_trees_all_close|Values are not close|Items are not equal|"
                     r"AssertionError: \d|!= |not less than|not greater than|mismatch", re.IGNORECASE)
STATE = re.compile(r"State\b|has no attribute '(mu|nu|count|trace|inner_state|hyperparams|.*_state|.*state.*)'|"
                   r"PyTreeDef|tree structure|Custom node type mismatch|namedtuple|NamedTuple|not subscriptable|"
                   r"tuple index out of range|isinstance|no attribute '_asdict'|KeyError|"
                   r"'tuple' object has no attribute", re.IGNORECASE)


def categorize(record: dict) -> str:
    if record["outcome"] != "failed":
        return record["outcome"]
    kind, text = record["type"], record.get("text", "")
    if kind == "MissingOption":
        return "missing option"
    if record.get("raised_in_updax"):  # (a state built by hand in optax's layout, refused by updax's state check)
        return "state layout" if "state must be" in record["first_line"] else "refused by updax"
    if kind == "AssertionError" and re.search(r"dtype\(", record["first_line"]):
        return "state dtype"
    if kind == "AssertionError" and re.search(r'does not match "|not raised', record["first_line"]):
        return "error message or error not raised"
    if kind == "AssertionError" and NUMERIC.search(text) and not STATE.search(record["first_line"]):
        return "numbers"
    if kind in ("AttributeError", "KeyError", "IndexError", "TypeError", "ValueError", "AssertionError") and \
            STATE.search(text):
        return "state layout"
    # an error (not an assertion) in the test's own code or in optax's state utilities (optax.tree.get): the test
    # read optax's state by position or field, e.g. ``state[-1][0] * slope`` with updax's state there
    frame = record.get("last_frame", "")
    if kind != "AssertionError" and ("optax_suite_" in frame or "tree_utils" in frame):
        return "state layout"
    if kind == "AssertionError":
        return "assertion (other)"
    return "other"


def optax_tests_dir() -> str:
    import optax
    return os.path.dirname(optax.__file__)


def _selected(patterns: list[str]) -> tuple[list[str], list[str]]:
    base = optax_tests_dir()
    files = sorted(os.path.relpath(p, base) for p in glob.glob(os.path.join(base, "**", "*_test.py"),
                                                              recursive=True))
    if patterns:
        files = [f for f in files if any(glob.fnmatch.fnmatch(f, p) for p in patterns)]
    out = [f for f in files if any(glob.fnmatch.fnmatch(f, p) for p in OUT_OF_SCOPE)]
    return [f for f in files if f not in out], out


def _copy(files: list[str], into: str) -> list[str]:
    base, paths = optax_tests_dir(), []
    for f in files:
        dst = os.path.join(into, f.replace(os.sep, "__"))  # flat: each a top-level module of its own name
        shutil.copy(os.path.join(base, f), dst)
        paths.append(dst)
    return paths


def _env(records: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([HERE, os.path.join(ROOT, "src"), env.get("PYTHONPATH", "")])
    env["OPTAX_SUITE_RECORDS"] = records
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def _count_collected(paths: list[str], cwd: str) -> dict[str, int]:
    if not paths:
        return {}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
                          "-p", "no:cacheprovider", *paths], cwd=cwd, capture_output=True, text=True, check=False,
                         env=_env(os.devnull))
    counts: dict[str, int] = {}
    for line in out.stdout.splitlines():
        if "::" in line:
            counts[line.split("::")[0]] = counts.get(line.split("::")[0], 0) + 1
    return counts


def _read(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def merged(records: list[dict]) -> list[dict]:
    """One row per test: a test's subtests (absltest's ``subTest``, reported one by one) make one, failed if any
    failed (with the first failure's reason), with the constructors of all."""
    rows: dict[str, dict] = {}
    for record in records:
        row = rows.get(record["nodeid"])
        if row is None:
            rows[record["nodeid"]] = dict(record)
            continue
        row["mapped"] = sorted(set(row["mapped"]) | set(record["mapped"]))
        row["unmapped"] = sorted(set(row["unmapped"]) | set(record["unmapped"]))
        if record["outcome"] == "failed" and row["outcome"] != "failed":
            row.update({k: v for k, v in record.items() if k not in ("mapped", "unmapped")})
    return list(rows.values())


def run(patterns: list[str], records: str | None = None, *, reuse: bool = False) -> dict:
    """Runs the selected optax test files under the plugin; returns the rows (one per test) and the facts of the
    run. The records (one JSON line per test report) go to ``records``, a temporary file if None; ``reuse=True``
    reads the records of an earlier run there instead of running the tests again."""
    in_scope, out_of_scope = _selected(patterns)
    elapsed, tail = None, ""
    with tempfile.TemporaryDirectory(prefix="optax_suite_") as tmp:
        records = records or os.path.join(tmp, "records.jsonl")
        skipped = _count_collected(_copy(out_of_scope, tmp), tmp)
        if not reuse:
            if os.path.exists(records):
                os.remove(records)
            paths = _copy(in_scope, tmp)
            start = time.time()
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "optax_suite", "-p", "no:randomly",
                                   "-p", "no:cacheprovider", "-n0", "--tb=no", "-W", "ignore", *paths], cwd=tmp,
                                  capture_output=True, text=True, check=False, env=_env(records))
            elapsed, tail = round(time.time() - start, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
        rows = merged(_read(records))
        for row in rows:
            row["category"] = _category(row)
        # The failures that are neither refusals nor layouts, run again with optax's own constructors: a test
        # that fails there too is no difference of updax's.
        again = [row for row in rows if row["category"] in BASELINE]
        if again:
            _copy(in_scope, tmp)
            plain = os.path.join(tmp, "plain.jsonl")
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "optax_suite", "-p", "no:randomly",
                            "-p", "no:cacheprovider", "-n0", "--tb=no", "-W", "ignore",
                            *[row["nodeid"] for row in again]], cwd=tmp, capture_output=True, text=True, check=False,
                           env={**_env(plain), "OPTAX_SUITE_PLAIN": "1"})
            outcome = {r["nodeid"]: r["outcome"] for r in merged(_read(plain))}
            for row in again:
                row["optax_outcome"] = outcome.get(row["nodeid"], "not run")
                if row["optax_outcome"] == "failed":
                    row["category"] = "fails with optax too"
    return {"rows": rows, "out_of_scope_files": {k.replace("__", "/"): v for k, v in skipped.items()},
            "elapsed_s": elapsed, "pytest_tail": tail, "files": in_scope}


#: Failures run again with optax's constructors (numbers, unexplained assertions and errors).
BASELINE = ("numbers", "assertion (other)", "other")


def _category(row: dict) -> str:
    row["file"] = row["nodeid"].split("::")[0].replace("__", "/")
    if row["outcome"] in ("passed", "failed"):
        if not row["mapped"]:
            row["scope"] = "not replaced" if row["unmapped"] else "out of scope (no constructor)"
        else:
            row["scope"] = "replaced"
    else:
        row["scope"] = row["outcome"]
    return categorize(row) if row["scope"] == "replaced" else row["scope"]


def summary(result: dict) -> dict:
    rows = result["rows"]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["category"]] = counts.get(row["category"], 0) + 1
    return {"run": len(rows), "by_category": dict(sorted(counts.items(), key=lambda kv: -kv[1])),
            "out_of_scope_not_run": sum(result["out_of_scope_files"].values())}


def _markdown(result: dict, stats: dict) -> str:
    rows = result["rows"]
    lines = ["# optax 0.2.8's test files against updax", "",
             "Written by `benchmarks/optax_suite.py` (see its docstring for the command and the method).", "",
             f"Files run: {len(result['files'])}; tests run: {stats['run']}; "
             f"not run (internals, no optimizer: {', '.join(OUT_OF_SCOPE)}): {stats['out_of_scope_not_run']}; "
             + (f"{result['elapsed_s']} s on 2 shared CPU cores." if result["elapsed_s"] else
                "reported from the records of earlier runs (--reuse)."),
             "", "| outcome | tests |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in stats["by_category"].items()]
    failed = [r for r in rows if r["category"] not in ("passed", "skipped", "not replaced",
                                                         "out of scope (no constructor)")]
    groups: dict[tuple, list] = {}
    for r in failed:
        groups.setdefault((r["category"], r["type"], r["first_line"][:160]), []).append(r["nodeid"])
    lines += ["", "## Failures by reason", "", "| category | exception | first line | tests | e.g. |",
              "| --- | --- | --- | --- | --- |"]
    for (cat, kind, first), ids in sorted(groups.items(), key=lambda kv: (kv[0][0], -len(kv[1]))):
        first = first.replace("|", "\\|")
        lines.append(f"| {cat} | {kind} | {first} | {len(ids)} | `{ids[0].replace('__', '/')}` |")
    numbers = [r for r in rows if r["category"] == "numbers"]
    lines += ["", "## Every numeric difference", ""]
    lines += [f"- `{r['nodeid'].replace('__', '/')}` ({', '.join(r['mapped'])}): {r['first_line']}"
              for r in numbers] or ["None."]
    per_file: dict[str, dict[str, int]] = {}
    for r in rows:
        per_file.setdefault(r["file"], {}).setdefault(r["category"], 0)
        per_file[r["file"]][r["category"]] += 1
    lines += ["", "## Per file", "", "| file | outcomes |", "| --- | --- |"]
    lines += [f"| {f} | {', '.join(f'{k} {v}' for k, v in sorted(c.items()))} |" for f, c in sorted(per_file.items())]
    lines += ["", "## The mapping", "", "| optax | updax | renamed arguments |", "| --- | --- | --- |"]
    for public, spec in MAPPING.items():
        renames = ", ".join(f"{k} -> {v}" for k, v in spec[1].items()) + (f" ({spec[2].__doc__.split(':')[0]})"
                                                                           if len(spec) > 2 else "")
        lines.append(f"| `{public}` | `{spec[0]}` | {renames} |")
    lines += ["", "Not replaced (optax's own code): " + ", ".join(f"`{n}`" for n in NOT_REPLACED) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("patterns", nargs="*", help="globs of optax test files, relative to optax's package")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "optax_suite"))
    parser.add_argument("--reuse", action="store_true", help="report from OUT.jsonl, the records of an earlier run")
    args = parser.parse_args(argv)
    try:
        import optax  # noqa: F401  (the harness needs it)
    except ImportError:
        sys.exit("optax_suite: optax is not installed (pip install optax==0.2.8)")
    # (the records are written as the tests run: a partial run can be reported with --reuse)
    result = run(args.patterns, records=args.out + ".jsonl", reuse=args.reuse)
    stats = summary(result)
    # every test but the passed ones, which are counted per file
    rows = [{k: v for k, v in row.items() if k not in ("text", "last_frame", "when", "scope")}
            for row in result["rows"] if row["category"] != "passed"]
    passed: dict[str, int] = {}
    for row in result["rows"]:
        if row["category"] == "passed":
            passed[row["file"]] = passed.get(row["file"], 0) + 1
    with open(args.out + ".json", "w") as f:
        json.dump({"summary": stats, **result, "rows": rows, "passed_per_file": passed}, f, indent=0)
    with open(args.out + ".md", "w") as f:
        f.write(_markdown(result, stats))
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
