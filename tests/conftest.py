"""Hypothesis profiles for the whole suite.

``ci`` (the default) is deterministic: every run tests the same examples, so
CI failures reproduce. ``long`` draws fresh examples on every run and is meant
for an occasional deep fuzz, e.g. ``pytest tests/test_fuzz.py
--hypothesis-profile=long``; tests/test_fuzz.py reads the profile's name to
pick its number of examples per target. Both print the reproduction blob of a
failure, and neither has a deadline (a JAX example's time is mostly
compilation, which varies with the machine).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, settings

_COMMON = {"deadline": None, "print_blob": True, "suppress_health_check": [HealthCheck.too_slow]}

settings.register_profile("ci", derandomize=True, database=None, **_COMMON)
settings.register_profile("long", derandomize=False, **_COMMON)
settings.load_profile("ci")


# --------------------------------------------------------------------------
# The 8-device checks (tests/sharding_checks.py) run in a subprocess of their own: started as soon as the tests
# are collected, so that on a 2-core machine they run alongside the rest of the suite.

SHARDED_CHECKS = pytest.StashKey[subprocess.Popen]()


def start_sharded_checks() -> subprocess.Popen:
    here = os.path.dirname(os.path.abspath(__file__))
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"
    env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen([sys.executable, "-W", "ignore", os.path.join(here, "sharding_checks.py")], cwd=here,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def pytest_collection_finish(session):
    if any(item.path.name == "test_sharding.py" for item in session.items):
        session.config.stash[SHARDED_CHECKS] = start_sharded_checks()


def pytest_unconfigure(config):
    proc = config.stash.get(SHARDED_CHECKS, None)
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.communicate()
