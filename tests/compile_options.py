"""How the tests ask XLA to compile: its cheapest compilation for checks of values, its default where a check
holds the program a user gets.

Most of the suite's time is XLA compiling small programs that run once. At
optimization level 0 and without the fusion emitters (:data:`FAST_COMPILE`)
the CPU compiles them about four times faster, computing the same operations
and rounding otherwise in the last bit in places (a product kept in a
register, a sum in another order). ``tests/conftest.py`` makes it every test
process's default, before JAX starts.

The checks that hold XLA's default program compile with
:data:`DEFAULT_COMPILE`, the options a user's program gets: the compiled
program's copies and temporaries (tests/test_in_place.py, tests/test_fused.py),
the parities whose tolerance the default program sets (Muon's and L-BFGS's,
over many steps), and the device check's smoke run. The held numbers were
written at XLA's default (``python tests/held_numbers.py``), and are checked
at the cheapest compilation to float32 rounding (tests/test_held_numbers.py:
another CPU rounds XLA's default program otherwise in the last bit too). ``UPDAX_TEST_COMPILE=default pytest`` runs
the whole suite at XLA's default compilation.

This module has no side effect, so that ``python tests/held_numbers.py``
(which records at the defaults) can import it.
"""

from __future__ import annotations

import os

#: XLA's cheapest compilation for the CPU (about 4x faster here), for checks of values, not of the program. The
#: program is generated in one part rather than XLA's 32 (parts compiled on threads of their own, which on two
#: cores and a small program cost more than they save: the contract's sweep, 19.9 s of CPU -> 16.6).
FAST_COMPILE = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 0,
                "xla_cpu_parallel_codegen_split_count": 1}

#: XLA's default compilation, the one a user's program gets, for the checks that hold its program or its numbers:
#: every option FAST_COMPILE sets, at XLA's default (the test processes' XLA_FLAGS carry FAST_COMPILE).
DEFAULT_COMPILE = {"xla_cpu_use_fusion_emitters": True, "xla_backend_optimization_level": 3,
                   "xla_cpu_parallel_codegen_split_count": 32}

#: ``XLA_FLAGS`` as the user started the tests (conftest adds :data:`FAST_COMPILE` to the processes' own).
USER_XLA_FLAGS = os.environ.get("UPDAX_TEST_USER_XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))


def host_devices(count: int = 8) -> str:
    """``XLA_FLAGS`` for ``count`` host devices, with XLA's patience at a collective raised to 15 minutes: on two
    busy cores the threads of 8 devices can reach an all-reduce far apart, and XLA aborted a subprocess of the
    suite once when one came 40 s after the others ("Expected 8 threads to join the rendezvous, but only 7 of them
    arrived on time", tests/quantized_sharding.py in a fresh-clone run). The flag is that timeout: set to 10 s,
    an all-reduce that one device reaches 44 s late aborts with the same message after 10 s."""
    return f"--xla_force_host_platform_device_count={count} --xla_cpu_collective_call_terminate_timeout_seconds=900"


def xla_flags(options: dict) -> str:
    """``options`` written as ``XLA_FLAGS``."""
    return " ".join(f"--{name}={str(value).lower()}" for name, value in options.items())


def default_compile_env() -> dict[str, str]:
    """The environment of a subprocess that compiles as a user's program does (the user's ``XLA_FLAGS``)."""
    return {**os.environ, "XLA_FLAGS": USER_XLA_FLAGS}
