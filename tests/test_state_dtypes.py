"""Every stage's state keeps its dtypes and shapes across steps, with float64 params (``JAX_ENABLE_X64``) too.

A state whose dtypes change between steps (a float32 field at ``init`` that a float64 computation widens on
the first step) breaks ``lax.cond``, ``lax.scan``, buffer donation and checkpoints restored with ``init``'s
shapes as their target. For every catalogue entry (tests/registry.py) and the optimizers that are more than a
chain of its stages (``SWEPT_OPTIMIZERS``) at their defaults, :func:`drift` runs ``init`` and three steps,
eagerly and jitted, and names every leaf whose dtype or shape differs from ``init``'s. ``JAX_ENABLE_X64`` must
be set before JAX starts, so float64 runs in a subprocess; float32 is checked by tests/test_held_numbers.py's
sweep, and here for the options the registry leaves out.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

import updax as ux
from conftest import finish, finished, start_float64
from registry import ENTRIES, SWEPT_OPTIMIZERS, half_squared_norm, nested_tree, updates_for

STEPS = 3
LOSS = 1.0


#: Optimizers built with options their defaults leave out.
EXTRA = {
    "optimizers.schedule_free_adamw/warmup": lambda: ux.optimizers.schedule_free_adamw(1e-2, warmup_steps=2),
    "optimizers.lbfgs": lambda: ux.optimizers.lbfgs(objective=half_squared_norm),
    "optimizers.sophia": lambda: ux.optimizers.sophia(objective=half_squared_norm),
}


def targets() -> dict:
    from test_declarations import _optimizer

    built = dict(ENTRIES)
    built.update({f"optimizers.{name}": (lambda name=name: _optimizer(name)) for name in SWEPT_OPTIMIZERS})
    built.update(EXTRA)
    return built


def drift(name: str, build, dtype) -> list[str]:
    """The state leaves whose dtype or shape after a step differs from ``init``'s, as ``'path: before -> after'``."""
    opt = build()
    params = nested_tree(dtype, seed=0)
    grads = [nested_tree(dtype, seed=t + 1) for t in range(STEPS)]
    state0 = opt.init(params)
    found = []
    for jit in (False, True):
        step = jax.jit(opt.update) if jit else opt.update
        state = state0
        for t, g in enumerate(grads):
            _, state = step(updates_for(opt, g), state, params, loss=jnp.asarray(LOSS, dtype))
            before = jax.tree_util.tree_flatten_with_path(state0)[0]
            after = jax.tree.leaves(state)
            for (path, a), b in zip(before, after):
                if (jnp.result_type(a), jnp.shape(a)) != (jnp.result_type(b), jnp.shape(b)):
                    found.append(f"{name} {'jit' if jit else 'eager'} step {t + 1} {jax.tree_util.keystr(path)}: "
                                 f"{jnp.result_type(a)}{jnp.shape(a)} -> {jnp.result_type(b)}{jnp.shape(b)}")
    return found


def main() -> None:
    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    report = {}
    for name, build in sorted(targets().items()):
        try:
            report[name] = drift(name, build, dtype)
        except Exception as error:  # a failure is a finding too
            report[name] = [f"{name}: {type(error).__name__}: {error}"[:500]]
    print(json.dumps(report))


@pytest.fixture(scope="module")
def float64_run():
    """:func:`main` in a float64 subprocess, started early to run alongside the float32 tests."""
    proc = start_float64("test_state_dtypes", "main")
    yield proc
    finish(proc)


@pytest.fixture(scope="module")
def float64_report(float64_run):
    return json.loads(finished(float64_run).strip().splitlines()[-1])


pytestmark = pytest.mark.xdist_group("state_dtypes")


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_the_state_keeps_its_dtypes_and_shapes_float32(name, float64_run):
    """The options the registry leaves out; every registry entry and optimizer is checked in float32 by
    tests/test_held_numbers.py's sweep. (float64_run is requested here only to start the float64 subprocess
    while the rest of the suite runs.)"""
    assert drift(name, targets()[name], jnp.float32) == []


@pytest.mark.parametrize("name", sorted(targets()))
def test_the_state_keeps_its_dtypes_and_shapes_float64(name, float64_report):
    assert float64_report[name] == []
