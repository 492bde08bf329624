"""benchmarks/optax_suite.py (optax 0.2.8's own test files against updax) on one small file, so that the harness
cannot rot silently: the file's tests run through the plugin, each builds updax objects in place of optax's
(recorded per test), and the counts are the ones the full run reports for that file
(benchmarks/results/optax_suite.md). The full run takes minutes and is not part of the suite."""

from __future__ import annotations

import collections
import pathlib
import sys

import pytest

pytest.importorskip("optax")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
try:
    import optax_suite
finally:
    sys.path.pop(0)

#: optax's transforms/_constraining_test.py: keep_params_nonnegative (after trace and scale) and zero_nans, all
#: replaced by updax's; the zero_nans test compares the state with optax's ZeroNansState (a state layout).
FILE = "transforms/_constraining_test.py"
EXPECTED = {"passed": 2, "state layout": 1}


def test_one_optax_test_file_runs_against_updax():
    result = optax_suite.run([FILE])
    rows = result["rows"]
    assert rows, result["pytest_tail"]
    assert {row["file"] for row in rows} == {FILE}
    counts = collections.Counter(row["category"] for row in rows)
    assert counts == EXPECTED, (counts, [(r["nodeid"], r.get("first_line")) for r in rows if r["category"] != "passed"])
    # The replacement happened: every test that passed built an updax object through the mapping.
    assert all(row["mapped"] for row in rows if row["category"] == "passed")
    assert {name for row in rows for name in row["mapped"]} == {"optax.keep_params_nonnegative", "optax.scale",
                                                                      "optax.trace", "optax.zero_nans"}


def test_the_mapping_names_optax_and_updax_functions_that_exist():
    """Every row of the table resolves on both sides (an optax or updax rename breaks it here, not in the run)."""
    for public, spec in optax_suite.MAPPING.items():
        assert callable(optax_suite._optax_object(public)), public
        assert callable(optax_suite._resolve(spec[0])), spec[0]
    for public in optax_suite.NOT_REPLACED:
        assert callable(optax_suite._optax_object(public)), public
