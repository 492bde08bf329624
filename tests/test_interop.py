"""optax both ways: ux.from_optax (an optax transformation as a stage) and ux.to_optax (an updax object where
optax expects a transformation taking extra arguments), checked against optax run on its own."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import updax as ux
from registry import nested_tree

STEPS = 5


def _grads(params, t):
    return jax.tree.map(lambda p: jnp.sin(p * (t + 1)) + 0.1 * t, params)


def _run(init, update, params, steps=STEPS, **extra):
    state, outs = init(params), []
    for t in range(steps):
        updates, state = update(_grads(params, t), state, params, **extra)
        params = optax.apply_updates(params, updates)
        outs.append(params)
    return outs, state


def test_an_optax_optimizer_as_a_stage_computes_what_optax_does():
    params = nested_tree()
    tx = optax.adamw(1e-2, weight_decay=1e-3)
    ours, _ = _run(*ux.from_optax(tx, "adamw"), params)
    theirs, _ = _run(tx.init, tx.update, params)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_array_equal(a, b)  # the same computation: bit for bit


def test_a_mixed_pipeline_equals_the_optax_chain():
    params = nested_tree()
    opt = ux.clip_by_global_norm(1.0).pipe(ux.compose, ux.from_optax(optax.scale_by_adam(b1=0.8))).scale(-0.05)
    chain = optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(b1=0.8), optax.scale(-0.05))
    ours, state = _run(opt.init, jax.jit(opt.update), params)
    theirs, chain_state = _run(chain.init, chain.update, params)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    # The optax state is reachable by path: the stage's, and a field of its NamedTuple.
    mu = opt.get_state(state, "from_optax.mu")
    for a, b in zip(jax.tree.leaves(mu), jax.tree.leaves(chain_state[1].mu)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert type(opt.get_state(state, "from_optax")).__name__ == "ScaleByAdamState"


def test_the_stage_prints_as_its_label_and_identity_and_compares_by_identity():
    tx = optax.sgd(0.1)
    a, b = ux.from_optax(tx, "sgd"), ux.from_optax(tx, "sgd")
    assert a == b and hash(a) == hash(b) and repr(a) == repr(b)
    assert repr(a) == f"from_optax(transformation=<optax 'sgd' at {id(tx):#x}>)"
    other = ux.from_optax(optax.sgd(0.1), "sgd")  # built alike, but another transformation
    assert other != a and repr(other) != repr(a)
    assert ux.from_optax(tx) != a  # another label


def test_extra_arguments_reach_an_optax_transformation_that_takes_them():
    """optax's reduce_on_plateau takes ``value=``: given to update, it reaches the stage."""
    tx = optax.contrib.reduce_on_plateau(factor=0.5, patience=1, accumulation_size=1)
    opt = ux.scale(-0.1).pipe(ux.compose, ux.from_optax(tx))
    params = {"w": jnp.zeros(1)}
    state = opt.init(params)
    for _ in range(3):
        updates, state = opt.update({"w": jnp.ones(1)}, state, params, value=jnp.asarray(1.0))
    theirs = tx.init(params)
    for _ in range(3):
        expected, theirs = tx.update({"w": -0.1 * jnp.ones(1)}, theirs, params, value=jnp.asarray(1.0))
    np.testing.assert_allclose(updates["w"], expected["w"])
    assert float(updates["w"][0]) < -0.0 and float(opt.get_state(state, "from_optax.scale")) < 1.0


def test_inside_optax_chain_the_loss_reaches_updax_only_through_to_optax():
    opt = ux.scale(-0.1).reduce_on_plateau(factor=0.5, patience=1)
    params = {"w": jnp.zeros(1)}
    tx = optax.chain(ux.to_optax(opt), optax.scale(2.0))
    state = tx.init(params)
    for _ in range(3):
        updates, state = tx.update({"w": jnp.ones(1)}, state, params, loss=jnp.asarray(1.0))
    direct = opt.init(params)
    for _ in range(3):
        expected, direct = opt.update({"w": jnp.ones(1)}, direct, params, loss=jnp.asarray(1.0))
    np.testing.assert_allclose(updates["w"], 2.0 * expected["w"])  # 0.1 · 0.5² · 2
    np.testing.assert_allclose(updates["w"], [-0.05])
    # Without to_optax, optax drops the loss, and the message says what to do.
    plain = optax.chain(opt, optax.scale(2.0))
    with pytest.raises(ValueError, match="wrap the updax object in ux.to_optax"):
        plain.update({"w": jnp.ones(1)}, plain.init(params), params, loss=jnp.asarray(1.0))


def test_to_optax_works_with_optax_multisteps():
    opt = ux.optimizers.adam(0.1)
    params = nested_tree()
    multi = optax.MultiSteps(ux.to_optax(opt), every_k_schedule=2)
    reference = optax.MultiSteps(optax.adam(0.1), every_k_schedule=2)
    ours, _ = _run(multi.init, multi.update, params, steps=4)
    theirs, _ = _run(reference.init, reference.update, params, steps=4)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="^from_optax\\(transformation=3\\): transformation must be an optax"):
        ux.from_optax(3)
    with pytest.raises(TypeError, match="already an updax object"):
        ux.from_optax(ux.scale(1.0))
    with pytest.raises(TypeError, match="label must be a string"):
        ux.from_optax(optax.sgd(0.1), label=1)
    with pytest.raises(TypeError, match="to_optax\\(opt=3\\): expected an updax update object"):
        ux.to_optax(3)


def test_importing_updax_does_not_import_optax():
    code = "import sys, updax; print('optax' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
