"""Hypothesis profiles for the whole suite, the fast tier, and the subprocesses some tests start early.

The fast tier, ``pytest -m fast tests src/updax/updates/_adam.py``, runs in under a minute on two cores what
:data:`FAST` names (the laws, the layers, the object model, one optimizer's parity, the held numbers of two) and
the docstring examples of the source files named on the command line: a contributor names the files they
touched (docs/contributing.md).

``ci`` (the default) is deterministic: every run tests the same examples, so
CI failures reproduce. ``long`` draws fresh examples on every run and is meant
for an occasional deep fuzz, e.g. ``pytest tests/test_fuzz.py
--hypothesis-profile=long``; tests/test_fuzz.py reads the profile's name to
pick its number of examples per target. Both print the reproduction blob of a
failure, and neither has a deadline (a JAX example's time is mostly
compilation, which varies with the machine).

Each test process compiles at XLA's cheapest (tests/compile_options.py; ``UPDAX_TEST_COMPILE=default``
compiles as a user's program does), and the test processes of a run share JAX's persistent compilation cache
(see :func:`_compile_cache`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, settings

from compile_options import FAST_COMPILE, USER_XLA_FLAGS, host_devices, xla_flags

# XLA's cheapest compilation in every test process, set before JAX starts (the workers and the subprocesses the
# tests start inherit it): tests/compile_options.py says which checks compile at the defaults instead.
_COMPILE = os.environ.get("UPDAX_TEST_COMPILE", "fast")
if _COMPILE not in ("fast", "default"):
    raise pytest.UsageError(f"UPDAX_TEST_COMPILE={_COMPILE!r}: 'fast' (XLA's cheapest compilation, the default) "
                            "or 'default' (XLA's default, as a user's program)")
os.environ["UPDAX_TEST_USER_XLA_FLAGS"] = USER_XLA_FLAGS
os.environ["XLA_FLAGS"] = f"{USER_XLA_FLAGS} {xla_flags(FAST_COMPILE) if _COMPILE == 'fast' else ''}".strip()

_COMMON = {"deadline": None, "print_blob": True, "suppress_health_check": [HealthCheck.too_slow]}

settings.register_profile("ci", derandomize=True, database=None, **_COMMON)
settings.register_profile("long", derandomize=False, **_COMMON)
settings.load_profile("ci")


# --------------------------------------------------------------------------
# Long checks in subprocesses of their own. The 8-device checks (tests/sharding_checks.py) start as soon as the
# tests are collected, so that on a 2-core machine they run alongside the rest of the suite. They write their
# results to a file that appears when they are done; tests/test_sharding.py waits for it. With pytest-xdist the
# controller starts them once (not each worker) and tells the workers where the file will be.

SHARDED_CHECKS = pytest.StashKey[subprocess.Popen]()
SHARDED_OUT = pytest.StashKey[str]()
_WORKER_KEY = "updax_sharded_out"


#: The fast tier, by test id prefix: the core laws, the package's layers, the object model, one optimizer's parity
#: with optax over 20 steps, and the held numbers of Adam and AdamW (eager and jitted).
FAST = ("tests/test_laws.py", "tests/test_layers.py", "tests/test_core.py",
        "tests/test_optimizers.py::test_parity_with_optax_over_20_steps[adam]",
        "tests/test_held_numbers.py::test_the_numbers_are_the_ones_held[scale_by_adam-",
        "tests/test_held_numbers.py::test_the_numbers_are_the_ones_held[optimizers/adamw-")


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group(name): run the module's tests in one pytest-xdist worker")
    config.addinivalue_line("markers", "fast: the fast tier (FAST in tests/conftest.py, and the doctests of the "
                                       "source files named on the command line)")
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        config.stash[SHARDED_OUT] = os.path.join(tempfile.mkdtemp(prefix="updax-sharded-"), "results.txt")
    _compile_cache(config)


# --------------------------------------------------------------------------
# Compile each program once per run. Most of the suite's time is XLA compiling, and many tests build the same
# optimizer and jit the same step anew (a fresh closure, so JAX's in-memory caches miss), in either worker: with
# the persistent cache on, a program whose HLO (module name included) was compiled before in this run, by this
# process or another, is loaded from the disk instead. The executable is the one the compile wrote, so nothing
# tested changes: the same kernels run, and a test reading the compiled HLO or its memory analysis reads the same
# text. The controller makes the directory, the workers share it (tests/xla_cache.py writes each entry whole),
# and it lives for the run: every run compiles everything once. A cache directory the user has set
# (JAX_COMPILATION_CACHE_DIR) is left as it is. Measured: tests/test_contract.py alone, 239 s without it and
# 151 s with it (-n0); the contract, held, fuzz and dtype sweeps with 2 workers, 306 s of CPU with a directory
# per process and 279 s with one shared.

COMPILE_CACHE = pytest.StashKey[dict]()
_CACHE_KEY = "updax_compile_cache"


def _compile_cache(config):
    import jax  # (here, not at the top: the hypothesis profiles above need no JAX)

    import xla_cache

    if jax.config.jax_compilation_cache_dir or not xla_cache.write_atomically():
        return
    workerinput = getattr(config, "workerinput", None)
    directory = workerinput.get(_CACHE_KEY) if workerinput is not None else None
    if directory is None:  # the controller, or a run without xdist: the run's directory, removed at its end
        directory = tempfile.mkdtemp(prefix="updax-xla-cache-")
        config.stash[_OWNED_CACHE] = directory
    # Every program, however quick to compile or small.
    config.stash[COMPILE_CACHE] = {"jax_compilation_cache_dir": directory,
                                   "jax_persistent_cache_min_compile_time_secs": 0.0,
                                   "jax_persistent_cache_min_entry_size_bytes": -1}
    for name, value in config.stash[COMPILE_CACHE].items():
        jax.config.update(name, value)


_OWNED_CACHE = pytest.StashKey[str]()


def compile_cache_env(config) -> dict:
    """Environment variables that give a subprocess the run's compile cache: a fresh process that resumes what the
    tests compiled loads it (it must call tests/xla_cache.py's write_atomically before it compiles)."""
    return {name.upper(): str(value) for name, value in config.stash.get(COMPILE_CACHE, {}).items()}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):  # (pytest-xdist) -n auto: one worker per core, at most 4
    return max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):  # (pytest-xdist, in the controller) the workers learn where results and programs go
    node.workerinput[_WORKER_KEY] = node.config.stash[SHARDED_OUT]
    if _OWNED_CACHE in node.config.stash:
        node.workerinput[_CACHE_KEY] = node.config.stash[_OWNED_CACHE]


def sharded_out(config) -> str:
    """Where the 8-device checks write their results in this test run."""
    workerinput = getattr(config, "workerinput", None)
    return workerinput[_WORKER_KEY] if workerinput is not None else config.stash[SHARDED_OUT]


def start_sharded_checks(out: str) -> subprocess.Popen:
    here = os.path.dirname(os.path.abspath(__file__))
    # (XLA's cheapest compilation, FAST_COMPILE, always: they check values and placements; 141 s of CPU -> 68)
    flags = f"{USER_XLA_FLAGS} {host_devices(8)} {xla_flags(FAST_COMPILE)}"
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    with open(out + ".err", "w") as err:
        return subprocess.Popen([sys.executable, "-W", "ignore", os.path.join(here, "sharding_checks.py"), "--out", out],
                                cwd=here, stdout=subprocess.DEVNULL, stderr=err, env=env)


def _start_once(config, test_ids):
    if SHARDED_CHECKS not in config.stash and any("test_sharding.py" in test_id for test_id in test_ids):
        config.stash[SHARDED_CHECKS] = start_sharded_checks(config.stash[SHARDED_OUT])


@pytest.hookimpl(tryfirst=True)  # (before -m deselects)
def pytest_collection_modifyitems(config, items):
    named = {os.path.abspath(path) for path in (arg.split("::")[0] for arg in config.args) if path.endswith(".py")}
    for item in items:
        doctest_named = type(item).__name__ == "DoctestItem" and os.path.abspath(item.path) in named
        if doctest_named or item.nodeid.startswith(FAST):
            item.add_marker(pytest.mark.fast)


def pytest_collection_finish(session):
    if not hasattr(session.config, "workerinput"):  # without xdist (the controller does not collect)
        _start_once(session.config, [item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    _start_once(node.config, ids)


def start_float64(module: str, function: str) -> subprocess.Popen:
    """``module.function()`` (a test module of this folder) in a subprocess with ``JAX_ENABLE_X64=1``, which must
    be set before JAX starts; started early so that it runs alongside the tests of the process that waits for it."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import sys; sys.path.insert(0, {here!r}); import {module}; {module}.{function}()"
    env = {**os.environ, "JAX_ENABLE_X64": "1"}  # (and this process's XLA_FLAGS)
    return subprocess.Popen([sys.executable, "-W", "ignore", "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def finished(proc: subprocess.Popen, timeout: float = 900) -> str:
    """The output of a subprocess :func:`start_float64` started, once it has ended; the test fails with the end of
    its stderr unless it succeeded."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-4000:]
    return out


def finish(proc: subprocess.Popen) -> None:
    """Stops a subprocess :func:`start_float64` started, if it still runs."""
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def pytest_unconfigure(config):
    proc = config.stash.get(SHARDED_CHECKS, None)
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    if not hasattr(config, "workerinput") and SHARDED_OUT in config.stash:
        shutil.rmtree(os.path.dirname(config.stash[SHARDED_OUT]), ignore_errors=True)
    if _OWNED_CACHE in config.stash:
        shutil.rmtree(config.stash[_OWNED_CACHE], ignore_errors=True)
