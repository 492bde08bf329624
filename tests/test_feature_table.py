"""The README's feature table states only what tests show: every test it names exists, and its optax claims hold.

The updax claims are the named tests' own assertions. The optax cells that describe optax itself (its defaults, how
its objects print, how a new learning rate retraces) are checked here, against the installed optax.
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import re

import jax
import jax.numpy as jnp
import optax
import pytest
from test_optimizers import PARITY
from test_pages_and_examples import POLARIS

import updax as ux

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _table():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## How it compares"):text.index("Licensed under")]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| |")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def _defined_tests(path):
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_named_test_exists():
    rows = _table()
    assert len(rows) >= 10, "the README's table was not found"
    for feature, *_, shown_by in rows:
        named = re.findall(r"`(test_\w+\.py)::(test_\w+)`", shown_by)
        assert named, f"row {feature!r} names no test"
        for module, name in named:
            assert name in _defined_tests(ROOT / "tests" / module), f"row {feature!r}: {module}::{name} does not exist"


def test_the_counts_in_the_table_are_the_tests_counts():
    cells = {row[0]: row[1] for row in _table()}
    polaris = sum(len(names) for names in POLARIS.values())
    assert f"all {polaris} functions" in cells["Axon's catalogue, same names, options and defaults"]
    assert cells["Same numbers as optax"].startswith(f"{len(PARITY)} optimizer cases over 20 steps")


def test_the_readmes_reasons_give_the_tests_counts():
    """The pitch's second reason repeats the table's counts: they are the tests' too."""
    text = (ROOT / "README.md").read_text()
    reasons = text[text.index("## Why updax"):text.index("## Install")]
    polaris = sum(len(names) for names in POLARIS.values())
    assert f"{len(PARITY)} optimizer cases agree with optax" in reasons and f"all {polaris} functions" in reasons


def test_optax_defaults_differ_where_the_table_says():
    assert inspect.signature(optax.scale_by_adam).parameters["eps_root"].default == 0.0
    assert inspect.signature(ux.scale_by_adam).parameters["eps_root"].default == 1e-15


def test_optax_objects_print_as_functions():
    assert re.fullmatch(r"GradientTransformation\w*\(init=<function .*>, update=<function .*>\)", repr(optax.adam(1e-3)))
    assert "learning_rate=0.001" in repr(ux.optimizers.adam(1e-3))


def test_a_new_learning_rate_retraces_optax_but_not_updax():
    params = {"w": jnp.ones(3)}
    grads = {"w": jnp.full(3, 0.5)}
    with pytest.raises(TypeError):  # a pair of functions is not a valid jit argument
        jax.jit(lambda tx, p: tx.init(p))(optax.adam(1e-3), params)

    traces = []

    def step(tx, state):
        traces.append(1)
        return tx.update(grads, state, params)

    static = jax.jit(step, static_argnums=0)  # optax's way: the transformation is static
    for lr in (1e-1, 1e-2, 1e-3):
        tx = optax.adam(lr)
        static(tx, tx.init(params))
    assert len(traces) == 3  # each rate makes new functions, so a new trace

    traces.clear()
    jitted = jax.jit(step)
    results = []
    for lr in (1e-1, 1e-2, 1e-3):  # updax: an argument of the step
        opt = ux.optimizers.adam(lr)
        updates, _ = jitted(opt, opt.init(params))
        results.append(float(updates["w"][0]))
    assert len(traces) == 1
    assert results == pytest.approx([-1e-1, -1e-2, -1e-3], rel=1e-4)  # Adam's first step is -lr · sign(g)
