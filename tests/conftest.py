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

from hypothesis import HealthCheck, settings

_COMMON = {"deadline": None, "print_blob": True, "suppress_health_check": [HealthCheck.too_slow]}

settings.register_profile("ci", derandomize=True, database=None, **_COMMON)
settings.register_profile("long", derandomize=False, **_COMMON)
settings.load_profile("ci")
