"""Many devices: sharded state that stays where the params are, Explicit and Auto meshes, vmap and scan.

The multi-device checks run in a subprocess with 8 host devices (JAX fixes
the device count when its backend starts); see tests/sharding_checks.py for
what each target is put through. conftest.py starts the subprocess as soon as
the tests are collected, so it runs alongside the rest of the suite.
"""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import updax as ux
from conftest import SHARDED_CHECKS, sharded_out, start_sharded_checks
from sharding_checks import targets

#: Its module-scoped fixture starts a subprocess: with pytest-xdist, one worker runs the whole module, once.
pytestmark = pytest.mark.xdist_group("sharding")

TARGETS = sorted(targets())

#: Float32 rounding between a sharded step (reductions split over devices) and the single-device one,
#: relative to each leaf's largest value.
ROUNDING = 1e-5
#: Wider bounds, by target: NorMuon brings each output unit of Muon's orthogonalised update to one RMS, which
#: carries Newton-Schulz's rounding on an Auto mesh at the tests' compilation (5e-6 of the leaf for Muon) to 2e-5
#: (both below 1e-6 at XLA's default compilation).
ROUNDING_OF = {"scale_by_normuon": 5e-5}


@pytest.fixture(scope="module")
def sharded_run(request):
    """The subprocess's results by (target, mesh). conftest.py starts it when the tests are collected; it writes
    its results to a file that appears when they are all there (waited for here, at most 20 minutes)."""
    out = sharded_out(request.config)
    own = None
    if request.config.stash.get(SHARDED_CHECKS, None) is None and not hasattr(request.config, "workerinput"):
        own = start_sharded_checks(out)  # e.g. when the test ids were given one by one
    results = {}

    def get():
        if not results:
            deadline = time.monotonic() + 1200
            while not os.path.exists(out):
                assert time.monotonic() < deadline, "the sharded checks did not finish in 20 minutes"
                if own is not None and own.poll() is not None and not os.path.exists(out):
                    pytest.fail(f"the sharded checks exited with {own.returncode}")
                time.sleep(0.5)
            with open(out) as f:
                text = f.read()
            for line in text.splitlines():
                if line.startswith("RESULT "):
                    r = json.loads(line[len("RESULT "):])
                    results[r["name"], r["mesh"]] = r
            crashed = [json.loads(line[len("CRASHED "):]) for line in text.splitlines() if line.startswith("CRASHED ")]
            assert results and not crashed, f"the sharded checks crashed:\n{''.join(crashed)[-3000:]}"
        return results

    yield get
    if own is not None and own.poll() is None:
        own.kill()
        own.wait()


# --------------------------------------------------------------------------
# Single device, while the subprocess runs: vmap over optimizers, scan over steps


def _loss(params, x, y):
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.normal(size=(16, 3)), jnp.float32)
    return x, x @ jnp.asarray([1.0, -2.0, 0.5]) + 0.3


def _train(opt, params, steps=5):
    x, y = _data()
    state = opt.init(params)
    for _ in range(steps):
        grads = jax.grad(_loss)(params, x, y)
        updates, state = opt.update(grads, state, params)
        params = ux.apply_updates(params, updates)
    return params


PARAMS = {"w": jnp.zeros(3), "b": jnp.zeros([])}


def test_vmap_over_learning_rates_trains_an_ensemble():
    """Hyperparameters are pytree leaves: one vmapped step trains one model per learning rate."""
    rates = jnp.asarray([1e-3, 1e-2, 1e-1])
    x, y = _data()

    def train(lr):
        opt = ux.optimizers.adamw(lr, decay=1e-2)
        return jax.lax.fori_loop(0, 5, lambda _, c: _step(opt, c, x, y), (PARAMS, opt.init(PARAMS)))[0]

    batched = jax.jit(jax.vmap(train))(rates)
    for i, lr in enumerate(rates):
        one = _train(ux.optimizers.adamw(float(lr), decay=1e-2), PARAMS)
        for leaf in ("w", "b"):
            np.testing.assert_allclose(batched[leaf][i], one[leaf], rtol=1e-5, atol=1e-7)


def _step(opt, carry, x, y):
    params, state = carry
    updates, state = opt.update(jax.grad(_loss)(params, x, y), state, params)
    return ux.apply_updates(params, updates), state


def test_vmap_over_seeds_and_params():
    """Independent params and noise seeds, one optimizer object: vmap over params and state."""
    opt = ux.add_noise(eta=0.01, gamma=0.55, key=0).pipe(ux.compose, ux.optimizers.adam(0.05))
    starts = {"w": jnp.asarray(np.random.default_rng(1).normal(size=(4, 3)), jnp.float32), "b": jnp.arange(4.0)}
    x, y = _data()

    def train(params):
        return jax.lax.fori_loop(0, 5, lambda _, c: _step(opt, c, x, y), (params, opt.init(params)))[0]

    batched = jax.jit(jax.vmap(train))(starts)
    for i in range(4):
        one = _train(opt, {"w": starts["w"][i], "b": starts["b"][i]})
        np.testing.assert_allclose(batched["w"][i], one["w"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(batched["b"][i], one["b"], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["adam", "lamb", "adafactor", "muon", "schedule_free_adamw", "lion"])
def test_scan_over_steps_equals_the_python_loop(name):
    opt = getattr(ux.optimizers, name)(0.05)
    params = {"w": jnp.asarray(np.random.default_rng(2).normal(size=(3, 4)), jnp.float32), "b": jnp.ones(4)}
    grads = [jax.tree.map(lambda p, s=s: jnp.sin(p + s), params) for s in range(6)]

    def body(carry, g):
        params, state = carry
        updates, state = opt.update(g, state, params)
        return (ux.apply_updates(params, updates), state), updates

    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *grads)
    (scanned, state), _ = jax.jit(lambda p: jax.lax.scan(body, (p, opt.init(p)), stacked))(params)
    looped, loop_state = params, opt.init(params)
    step = jax.jit(opt.update)
    for g in grads:
        updates, loop_state = step(g, loop_state, looped)
        looped = ux.apply_updates(looped, updates)
    for a, b in zip(jax.tree.leaves((scanned, state)), jax.tree.leaves((looped, loop_state))):
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------
# 8 host devices (the subprocess)

@pytest.mark.parametrize("mesh", ["Explicit", "Auto"])
@pytest.mark.parametrize("name", TARGETS)
def test_sharded_state_and_steps(sharded_run, name, mesh):
    result = sharded_run()[name, mesh]
    assert not result["problems"], "\n".join(result["problems"])
    assert result["error"] < ROUNDING_OF.get(name, ROUNDING), result["error"]


def test_derived_state_is_placed_along_the_params_axes(sharded_run):
    """State that is not shaped like its param keeps the param's axes it has, and is replicated otherwise."""
    for mesh in ("Explicit", "Auto"):
        results = sharded_run()
        factored = results["scale_by_factored_rms", mesh]["derived"]
        # w: (8, 4) split ("data", "model"); the row factor drops the largest axis (0), the column one axis 1.
        assert factored["[0].v_row['w']"] == "('model',)" and factored["[0].v_col['w']"] == "('data',)"
        assert factored["[0].v['w']"] == "(None,)"  # a placeholder, replicated over the mesh
        sma = results["sma", mesh]["derived"]
        assert sma["[0].window_values['w']"] == "(None, 'data', 'model')"  # the window axis first
        novograd = results["scale_by_novograd", mesh]["derived"]
        assert novograd["[0].nu['w']"] == "()"  # a per-leaf scalar, replicated over the param's mesh
        sm3 = results["scale_by_sm3", mesh]["derived"]
        assert sm3["[0].accumulators['w'][0]"] == "('data',)" and sm3["[0].accumulators['w'][1]"] == "('model',)"
        # Shampoo's n x n statistic and root of each axis: their rows split as that axis is (w's axis 0 over data,
        # axis 1 over model; layers[0] (2, 4, 3) split (None, data, None)); a placeholder replicated.
        shampoo = results["optimizers.shampoo", mesh]["derived"]
        for field in ("stats", "roots"):
            assert shampoo[f"[0].{field}['w'][0]"] == "('data', None)"
            assert shampoo[f"[0].{field}['w'][1]"] == "('model', None)"
            assert [shampoo[f"[0].{field}['layers'][0][{i}]"] for i in range(3)] == [
                "(None, None)", "('data', None)", "(None, None)"]
            assert shampoo[f"[0].{field}['layers'][1][0][0]"] == "(None,)"
        # cut into blocks of 3 (the registry's entry), each region's stacked blocks are replicated over the mesh
        blocked = results["scale_by_shampoo", mesh]["derived"]
        assert blocked["[0].stats['w'][0][0]"] == blocked["[0].roots['w'][0][1]"] == "(None, None, None, None)"
        assert blocked["[0].stats['layers'][0][0][1]"] == "(None, None, None, None, None)"
        # SOAP's statistics and bases: replicated over the param's mesh, as ScaleBySoapState says
        soap = results["scale_by_soap", mesh]["derived"]
        assert {soap[f"[0].{field}['w'][{i}]"] for field in ("stats", "bases") for i in (0, 1)} == {"(None, None)"}


@pytest.mark.parametrize("mesh", ["Explicit", "Auto"])
def test_zero1_splits_the_state_and_keeps_the_numbers(sharded_run, mesh):
    result = sharded_run()["zero1", mesh]
    assert not result["problems"], result["problems"]
    assert result["error"] == 0.0  # elementwise state updates: the same arithmetic on each slice
    specs = result["specs"]
    assert specs["[1].mu['w']"] == "('data', None)" and specs["[1].nu['b']"] == "('data',)"
    assert specs["[1].mu['small']"] == "(None,)"  # 3 is not divisible by 8: replicated
    # Each device holds an eighth of every divisible moment: (64·32 + 32)·4 bytes·2 moments / 8, plus the rest.
    divisible, rest = (64 * 32 + 32) * 4 * 2, 3 * 4 * 2 + 4  # w's and b's mu, nu; small's mu, nu and the count
    assert result["replicated_bytes"] == divisible + rest
    assert result["zero1_bytes"] == divisible // 8 + rest


@pytest.mark.parametrize("mesh", ["Explicit", "Auto"])
def test_zero1_keeps_lions_in_place_order_and_its_numbers(sharded_run, mesh):
    """Lion's momentum is written after the params' update (updax._backend._order), read from the update's split sum:
    on an Explicit mesh too, where a select of differently placed operands is refused."""
    result = sharded_run()["zero1_lion", mesh]
    assert not result["problems"], result["problems"]
    assert result["error"] == 0.0
    assert result["specs"]["[1].mu['w']"] == "('data', None)" and result["specs"]["[1].mu['small']"] == "(None,)"


@pytest.mark.parametrize("mesh", ["Explicit", "Auto"])
@pytest.mark.parametrize("name", ["zero1_shampoo", "zero1_soap"])
def test_zero1_splits_the_n_by_n_statistics_and_keeps_the_numbers(sharded_run, name, mesh):
    """Shampoo's statistics and roots, SOAP's statistics and bases, split over the data axis along their rows by
    zero1_shardings (their largest axis that 8 divides, the first of two equal ones): each step gathers them for
    its products and its eigendecompositions, so the params are those of the replicated run within float32
    rounding (the statistics' sums are split otherwise; measured: 4.3e-6 for Shampoo, 6.5e-6 for SOAP, on
    params of about 1), and each device holds an eighth of every divisible leaf."""
    result = sharded_run()[name, mesh]
    assert not result["problems"], result["problems"]
    assert result["error"] < 2e-5, result["error"]
    specs = result["specs"]
    for field in ("stats", "roots" if name == "zero1_shampoo" else "bases"):
        assert specs[f"[1].{field}['w'][0]"] == specs[f"[1].{field}['w'][1]"] == "('data', None)"
    assert specs["[1].nu['w']"] == "('data', None)" and specs["[1].nu['small']"] == "(None,)"
    # w (64, 32): statistics and roots (bases) of 64 x 64 and 32 x 32; two moments shaped like each param
    # (Shampoo: the graft's nu and the momentum of ema; SOAP: mu and nu); then the leaves 8 does not divide.
    divisible = (64 * 64 + 32 * 32) * 4 * 2 + (64 * 32 + 32) * 4 * 2
    if name == "zero1_shampoo":  # small's nu and ema; b's and small's one-element placeholders; 2 counts, a weight
        rest = 3 * 4 * 2 + 4 * 4 + 3 * 4
    else:  # small's mu and nu; the count
        rest = 3 * 4 * 2 + 4
    assert result["replicated_bytes"] == divisible + rest
    assert result["zero1_bytes"] == divisible // 8 + rest


@pytest.mark.parametrize("mesh", ["Explicit", "Auto"])
def test_an_orbax_checkpoint_of_sharded_state_restores_its_shardings(sharded_run, mesh):
    """Saved after 3 steps, restored with opt.init(params) as the target: the same bits and shardings, and 3
    more steps equal the uninterrupted run bit for bit (adafactor's factors and ema_params' average)."""
    result = sharded_run()["checkpoint", mesh]
    assert not result["problems"], result["problems"]
    specs = result["specs"]
    assert specs["[0].v_row['w']"] == "('model',)" and specs["[5].average['w']"] == "('data', 'model')"


@pytest.mark.parametrize("mesh", ["Explicit", "Auto"])
def test_flat_state_joins_no_split_leaf_and_keeps_the_others_where_their_params_are(sharded_run, mesh):
    result = sharded_run()["flat_state_on_a_mesh", mesh]
    assert not result["problems"], result["problems"]


def test_every_target_was_checked_on_both_meshes(sharded_run):
    names = [*TARGETS, "zero1", "zero1_lion", "zero1_shampoo", "zero1_soap", "checkpoint", "flat_state_on_a_mesh"]
    assert set(sharded_run()) == {(name, mesh) for name in names for mesh in ("Explicit", "Auto")}


# --------------------------------------------------------------------------
# zero1_shardings on one device: its arguments


def test_zero1_shardings_names_a_bad_mesh_or_axis():
    state = ux.optimizers.adam(0.1).init(PARAMS)
    with pytest.raises(TypeError, match="zero1_shardings: mesh must be a jax.sharding.Mesh"):
        ux.sharding.zero1_shardings(state, "data")
    with pytest.raises(ValueError, match="axis 'model' is not an axis of the mesh, whose axes are \\('data',\\)"):
        ux.sharding.zero1_shardings(state, jax.make_mesh((1,), ("data",)), "model")


def test_zero1_shardings_takes_shapes_and_any_tree():
    mesh = jax.make_mesh((1,), ("data",))
    tree = {"a": [jax.ShapeDtypeStruct((2, 6), jnp.float32), None], "b": (jnp.zeros(()),)}
    where = ux.sharding.zero1_shardings(tree, mesh)
    assert where["a"][1] is None and where["a"][0].spec == jax.sharding.PartitionSpec(None, "data")  # the largest
    assert where["b"][0].spec == jax.sharding.PartitionSpec()
