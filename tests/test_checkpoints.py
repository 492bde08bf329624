"""Checkpoints: for every optimizer, N steps, save (orbax, flax.serialization), restore in a fresh process with
opt.init(params) as the target, M more steps: the params equal N+M uninterrupted steps, bit for bit. A state
restored without its target, or given to another pipeline, is refused with a message that says what to do."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import serialization

import updax as ux
from checkpoint_cases import AFTER, BEFORE, CASES, flat, params, run
from conftest import compile_cache_env

#: Its fixture starts a subprocess: with pytest-xdist, one worker runs the whole module. The fixture is
#: session-scoped: a worker may run other modules' tests between this module's, which would set a
#: module-scoped fixture up again (it did: twice 160 s of a worker's time).
pytestmark = pytest.mark.xdist_group("checkpoints")

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="session")
def resumed(tmp_path_factory, pytestconfig):
    """Saves every case after BEFORE steps, resumes all of them in one fresh process; returns the directory.
    The fresh process reads this one's compile cache (conftest.py): a step it compiles again is loaded (a
    restored state's step is often a program of its own, so about a fifth of its time is saved)."""
    directory = tmp_path_factory.mktemp("checkpoints")
    for name, build in CASES.items():
        opt = build()
        p, state = run(opt, params(), opt.init(params()), BEFORE, 0)
        np.savez(directory / f"{name}.params.npz", **flat(p))
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(directory / f"{name}.orbax", state)
        (directory / f"{name}.flax").write_bytes(serialization.to_bytes(state))
    done = subprocess.run([sys.executable, "-W", "ignore", os.path.join(HERE, "checkpoint_cases.py"), str(directory)],
                          cwd=HERE, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **compile_cache_env(pytestconfig)})
    assert done.returncode == 0, done.stderr[-5000:]
    return directory


@pytest.mark.parametrize("fmt", ["orbax", "flax"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_resumed_run_equals_the_uninterrupted_one_bit_for_bit(resumed, name, fmt):
    got = np.load(resumed / f"{name}.{fmt}.npz")
    for key, value in _uninterrupted(name).items():
        assert got[key].tobytes() == value.tobytes(), (name, fmt, key)


@functools.cache
def _uninterrupted(name):
    """The params after BEFORE + AFTER steps without a checkpoint (once per case: both formats compare with it)."""
    opt = CASES[name]()
    return flat(run(opt, params(), opt.init(params()), BEFORE + AFTER, 0)[0])


def test_a_state_restored_without_its_target_is_refused_with_what_to_do(tmp_path):
    opt = ux.optimizers.adamw(0.1)
    p = params()
    state = opt.init(p)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "state", state)
        raw = checkpointer.restore(tmp_path / "state")  # no target: plain dicts and lists
    with pytest.raises(ValueError, match="restored with opt.init\\(params\\) as its target"):
        opt.update(p, raw, p)


def test_a_state_given_to_another_pipeline_is_refused_by_name():
    p = params()
    sgd = ux.optimizers.sgd(0.1, momentum=0.9)
    with pytest.raises(ValueError, match="init\\(\\) gives TraceState\\(trace\\), the state has ScaleByAdamState"):
        sgd.update(p, ux.optimizers.adam(0.1).init(p), p)  # two stages each
    state = ux.optimizers.adamw(0.1).init(p)
    with pytest.raises(ValueError, match="state must be the tuple of 2 stage states that init\\(\\) returns, got a "
                                         "tuple of length 3"):
        sgd.update(p, state, p)
    # flax.serialization into another pipeline's target fails in flax, naming what differs.
    with pytest.raises(ValueError):
        serialization.from_bytes(ux.optimizers.sgd(0.1, momentum=0.9).init(p), serialization.to_bytes(state))
    assert jax.tree.structure(state) != jax.tree.structure(ux.optimizers.sgd(0.1, momentum=0.9).init(p))


def test_the_module_is_grouped_into_one_worker(request):
    """Under ``--dist loadgroup`` this module's tests carry their group (else each worker sets the fixture up)."""
    workerinput = getattr(request.config, "workerinput", None)
    if workerinput is None or not request.config.getvalue("loadgroup"):
        pytest.skip("not under pytest-xdist's --dist loadgroup")
    assert request.node.nodeid.endswith("@checkpoints"), request.node.nodeid
