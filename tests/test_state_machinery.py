"""Moving averages, params averaging, multi-step accumulation, skipping and freezing.

References are numpy loops written here from the formulas (the issue's and
the papers'), closed forms, and optax (ema, MultiSteps, skip functions,
apply_if_finite, freeze) as an independent oracle.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_parity import GRADS, PARAMS, assert_trees_close, make_grads, run_pair

import updax as ux

RNG = np.random.default_rng(7)
VALUES = [RNG.normal(size=(3, 2)).astype(np.float32) for _ in range(15)]


def _feed(opt, values, **extra):
    """Feeds each value to ``opt`` (jitted); returns the outputs and the final state."""
    state = opt.init(jnp.zeros_like(values[0]))
    step = jax.jit(lambda s, x, **e: opt.update(x, s, **e))
    outs = []
    for x in values:
        out, state = step(state, jnp.asarray(x), **extra)
        outs.append(np.asarray(out))
    return outs, state


# --------------------------------------------------------------------------
# ema


def _ema_reference(values, decay, *, debias, init=0.0, decay_min=False):
    """The issue's formulas in float64: ema ← b·ema + (1-b)·x from init; debias (ema - init·Πb)/(1 - Πb)."""
    ema, product, outs = np.full(values[0].shape, init, np.float64), 1.0, []
    for t, x in enumerate(values):
        b = min(decay(t) if callable(decay) else decay, (1 + t) / (10 + t) if decay_min else np.inf)
        ema = b * ema + (1 - b) * x
        product *= b
        outs.append((ema - init * product) / (1 - product) if debias else ema)
    return outs


@pytest.mark.parametrize("debias", [True, False])
@pytest.mark.parametrize("init", [0.0, 2.5])
@pytest.mark.parametrize("decay_min", [False, True])
def test_ema_matches_the_reference_recursion(debias, init, decay_min):
    outs, _ = _feed(ux.ema(0.8, debias=debias, init=init, decay_min=decay_min), VALUES)
    for t, (got, want) in enumerate(zip(outs, _ema_reference(VALUES, 0.8, debias=debias, init=init,
                                                             decay_min=decay_min))):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=f"step {t}")


def test_ema_with_a_scheduled_decay_debiases_with_the_product_of_the_decays_used():
    def decay(count):
        return 0.5 + 0.4 * jnp.minimum(count, 4) / 4  # 0.5, 0.6, ... 0.9, then 0.9

    def decay_np(t):
        return 0.5 + 0.4 * min(t, 4) / 4

    outs, _ = _feed(ux.ema(decay, init=1.0), VALUES)
    for got, want in zip(outs, _ema_reference(VALUES, decay_np, debias=True, init=1.0)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_debiased_ema_does_not_depend_on_init_and_keeps_the_previous_average():
    opt = ux.ema(0.9, init=7.0, keep_previous=True)
    outs, state = _feed(opt, VALUES)
    plain, _ = _feed(ux.ema(0.9), VALUES)
    np.testing.assert_allclose(outs[-1], plain[-1], rtol=1e-5)
    np.testing.assert_allclose(opt.get_state(state, "ema.previous"), outs[-2], rtol=0, atol=0)
    np.testing.assert_allclose(opt.get_state(state, "ema.ema"), outs[-1], rtol=0, atol=0)
    assert ux.ema(0.9).init(jnp.zeros(2))[0].previous is None  # no second copy unless asked


def test_ema_of_the_founding_example_has_the_stationary_statistics():
    """alpha 0.9 on 1 + 0.3·N(0, 1): mean 1, variance 0.09·(1-a)/(1+a) (an AR(1) process)."""
    alpha, n, burn = 0.9, 40_000, 200
    x = 1.0 + 0.3 * jax.random.normal(jax.random.key(0), (n,))
    opt = ux.ema(alpha)
    _, averages = jax.lax.scan(lambda s, xi: opt.update(xi, s)[::-1], opt.init(jnp.zeros(())), x)
    averages = np.asarray(averages[burn:], np.float64)
    variance = 0.09 * (1 - alpha) / (1 + alpha)
    # The EMA's samples are correlated (lag-1 correlation alpha): effective sample size n(1-a)/(1+a).
    n_eff = len(averages) * (1 - alpha) / (1 + alpha)
    assert abs(averages.mean() - 1.0) < 5 * np.sqrt(variance / n_eff)
    assert abs(averages.var() / variance - 1) < 0.1
    # Debiased, the first output is the first observation, not 0.1 of it.
    first, _ = opt.update(x[0], opt.init(x[0]))
    np.testing.assert_allclose(first, x[0], rtol=1e-6)


@pytest.mark.parametrize("debias", [True, False])
def test_ema_on_updates_matches_optax_ema(debias):
    run_pair(ux.ema(0.7, debias=debias), optax.ema(0.7, debias=debias))


def test_ema_accumulator_dtype_and_init_tree():
    params = {"a": jnp.zeros(2, jnp.bfloat16), "b": jnp.zeros(3)}
    (state,) = ux.ema(0.9).init(params)
    assert state.ema["a"].dtype == jnp.float32  # at least float32
    assert ux.ema(0.9, accumulator_dtype="bfloat16").init(params)[0].ema["b"].dtype == jnp.bfloat16
    init = {"a": jnp.ones(2), "b": jnp.arange(3.0)}
    (state,) = ux.ema(0.5, debias=False, init=init).init(params)
    np.testing.assert_array_equal(state.ema["b"], [0.0, 1.0, 2.0])
    # Started at the params themselves, the state still holds its own buffers (so both can be donated).
    (state,) = ux.ema(0.5, init=params).init(params)
    assert state.ema["b"].unsafe_buffer_pointer() != params["b"].unsafe_buffer_pointer()
    with pytest.raises(ValueError, match="init"):
        ux.ema(0.5, init={"a": jnp.ones(2)}).init(params)


# --------------------------------------------------------------------------
# sma and weighted moving average


@pytest.mark.parametrize("window", [1, 3, 5])
def test_sma_is_the_mean_of_the_last_window_values(window):
    outs, _ = _feed(ux.sma(window), VALUES)
    for t, got in enumerate(outs):
        seen = VALUES[max(0, t + 1 - window):t + 1]
        np.testing.assert_allclose(got, np.mean(seen, axis=0), rtol=1e-5, atol=1e-6, err_msg=f"step {t}")


def test_weighted_moving_average_matches_the_reference():
    decay = 0.8
    weights = RNG.uniform(0.0, 3.0, size=len(VALUES))
    masks = [(RNG.uniform(size=(3, 2)) > 0.3).astype(np.float32) for _ in VALUES]
    opt = ux.weighted_moving_average(decay)
    state, step = opt.init(jnp.zeros((3, 2))), jax.jit(opt.update)
    mask_state = state
    s = z = 0.0
    sm = zm = np.zeros((3, 2))
    for x, w, m in zip(VALUES, weights, masks):
        out, state = step(jnp.asarray(x), state, weight=jnp.float32(w))
        mout, mask_state = step(jnp.asarray(x), mask_state, weight=jnp.asarray(m))
        s, z = decay * s + (1 - decay) * w * x, decay * z + (1 - decay) * w
        sm, zm = decay * sm + (1 - decay) * m * x, decay * zm + (1 - decay) * m
        np.testing.assert_allclose(out, s / z, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mout, np.where(zm > 0, sm / np.where(zm > 0, zm, 1), 0), rtol=1e-5, atol=1e-6)


def test_weighted_moving_average_with_unit_weights_is_the_debiased_ema():
    weighted, _ = _feed(ux.weighted_moving_average(0.9), VALUES)
    debiased, _ = _feed(ux.ema(0.9), VALUES)
    for a, b in zip(weighted, debiased):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------
# params averaging


def _train(opt, n, params=PARAMS, grads=GRADS):
    """Runs ``opt`` n steps; returns the params after each step and the final state."""
    state, step, history = opt.init(params), jax.jit(opt.update), []
    for t in range(n):
        updates, state = step(grads[t % len(grads)], state, params)
        params = ux.apply_updates(params, updates)
        history.append(params)
    return history, state


@pytest.mark.parametrize(("start", "period"), [(1, 1), (3, 2), (5, 4)])
def test_swa_is_the_arithmetic_mean_of_the_snapshots(start, period):
    opt = ux.optimizers.adam(0.1).swa(start=start, period=period)
    history, state = _train(opt, 12)
    taken = [p for t, p in enumerate(history, start=1) if t >= start and (t - start) % period == 0]
    expected = jax.tree.map(lambda *leaves: np.mean(leaves, axis=0), *taken)
    assert int(opt.get_state(state, "swa.snapshots")) == len(taken)
    assert_trees_close(ux.averaged_params(opt, state), expected, "swa average", rtol=1e-5, atol=1e-6)


def test_swa_before_its_first_snapshot_is_the_initial_params():
    opt = ux.optimizers.sgd(0.1).swa(start=10)
    _, state = _train(opt, 3)
    assert_trees_close(ux.averaged_params(opt, state), PARAMS, "swa average", rtol=0, atol=0)


@pytest.mark.parametrize("decay_min", [False, True])
def test_ema_params_follows_the_reference_recursion(decay_min):
    decay = 0.9
    opt = ux.optimizers.adam(0.1).ema_params(decay, decay_min=decay_min)
    history, state = _train(opt, 12)
    average = jax.tree.map(lambda p: np.asarray(p, np.float64), PARAMS)
    for n, params in enumerate(history):
        b = min(decay, (1 + n) / (10 + n)) if decay_min else decay
        average = jax.tree.map(lambda a, p: b * a + (1 - b) * np.asarray(p, np.float64), average, params)
    assert_trees_close(ux.averaged_params(opt, state), average, "ema_params average", rtol=1e-5, atol=1e-6)


def test_averaged_params_casts_to_the_params_dtypes_and_leaves_the_params_alone():
    params = {"w": jnp.ones(3, jnp.bfloat16), "b": jnp.zeros(2)}
    opt = ux.optimizers.sgd(0.1).ema_params(0.5)
    state = opt.init(params)
    updates, state = opt.update({"w": jnp.ones(3, jnp.bfloat16), "b": jnp.ones(2)}, state, params)
    assert state[-1].average["w"].dtype == jnp.float32
    averaged = ux.averaged_params(opt, state, params)
    assert averaged["w"].dtype == jnp.bfloat16 and averaged["b"].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(averaged["b"]), -0.05)
    np.testing.assert_array_equal(np.asarray(params["w"], np.float32), 1.0)


def test_averaged_params_needs_exactly_one_stage_or_a_path():
    opt = ux.optimizers.sgd(0.1).ema_params(0.9).swa()
    state = opt.init(PARAMS)
    with pytest.raises(ValueError, match="2 ema_params/swa stages"):
        ux.averaged_params(opt, state)
    assert_trees_close(ux.averaged_params(opt, state, path="swa"), PARAMS, "swa", rtol=0, atol=0)
    with pytest.raises(ValueError, match="0 ema_params/swa stages"):
        ux.averaged_params(ux.scale(1.0), ())


# --------------------------------------------------------------------------
# multi-step accumulation and skipping


def test_accumulate_gradients_matches_multisteps_over_20_steps():
    k, n = 4, 20
    adam = dict(b1=0.8, b2=0.95, eps=1e-6, eps_root=0.0)
    ux_opt = ux.scale_by_adam(**adam).scale(-0.1).accumulate_gradients(k)
    ox_opt = optax.MultiSteps(optax.chain(optax.scale_by_adam(**adam), optax.scale(-0.1)), every_k_schedule=k)
    grads = make_grads(n)
    ux_state, ox_state = run_pair(ux_opt, ox_opt, n_steps=n, lr=1.0, jit=True, grads=grads)
    assert int(ux_opt.get_state(ux_state, "accumulate_gradients.gradient_step")) == int(ox_state.gradient_step)
    assert int(ux_opt.get_state(ux_state, "accumulate_gradients.mini_step")) == int(ox_state.mini_step)
    assert bool(ux.has_updated(ux_state)) == bool(ox_opt.has_updated(ox_state))


def test_accumulate_gradients_with_a_sum_and_a_varying_k_matches_multisteps():
    def every_k(gradient_step):
        return jnp.where(gradient_step < 2, 2, 3)

    ux_opt = ux.trace(0.5).scale(-0.1).accumulate_gradients(every_k, mean=False)
    ox_opt = optax.MultiSteps(optax.chain(optax.trace(0.5), optax.scale(-0.1)), every_k_schedule=every_k,
                              use_grad_mean=False)
    ux_state, ox_state = run_pair(ux_opt, ox_opt, n_steps=14, lr=1.0, jit=True)
    assert int(ux_state[0].gradient_step) == int(ox_state.gradient_step) == 5  # 2 + 2 + 3 + 3 + 3 = 13 calls


def _bit_identical(before, after, what):
    assert jax.tree.structure(before) == jax.tree.structure(after), what
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(before)[0], jax.tree.leaves(after)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"{what}{jax.tree_util.keystr(path)}")


@pytest.mark.parametrize("skip", [ux.skip_not_finite, ux.skip_large_updates(50.0)], ids=["not_finite", "large"])
def test_a_skipped_mini_step_leaves_the_state_bit_identical_and_records_why(skip):
    opt = ux.scale_by_adam().scale(-0.1).accumulate_gradients(3, should_skip=skip)
    step = jax.jit(opt.update)
    state = opt.init(PARAMS)
    for g in GRADS[:4]:  # a full step and one mini-step in
        _, state = step(g, state, PARAMS)
    if skip is ux.skip_not_finite:
        bad = jax.tree.map(lambda g: g.at[...].set(jnp.nan) if g.ndim == 0 else g, GRADS[4])
    else:
        bad = jax.tree.map(lambda g: g * 100.0, GRADS[4])
    updates, skipped = step(bad, state, PARAMS)
    assert all(float(jnp.abs(u).max()) == 0.0 for u in jax.tree.leaves(updates))
    fields = [f for f in skipped[0]._fields if f not in ("updated", "skip")]
    for field in fields:
        _bit_identical(getattr(state[0], field), getattr(skipped[0], field), field)
    assert bool(skipped[0].skip["should_skip"]) and not bool(ux.has_updated(skipped))
    if skip is ux.skip_not_finite:
        assert int(skipped[0].skip["num_not_finite"]) == 1
    else:
        assert float(skipped[0].skip["norm_squared"]) > 50.0
    # The run goes on as if the bad call never happened.
    _, resumed = step(GRADS[5], skipped, PARAMS)
    _, reference = step(GRADS[5], state, PARAMS)
    _bit_identical(reference, resumed, "state")


def test_skip_functions_match_optax():
    ux_opt = ux.scale_by_adam().scale(-0.1).accumulate_gradients(2, should_skip=ux.skip_large_updates(40.0))
    ox_opt = optax.MultiSteps(optax.chain(optax.scale_by_adam(), optax.scale(-0.1)), every_k_schedule=2,
                              should_skip_update_fn=lambda u, g, p: optax.skip_large_updates(u, g, p, 40.0))
    ux_state, ox_state = run_pair(ux_opt, ox_opt, n_steps=14, jit=True)  # scales 0.02-4: some skip
    assert int(ux_state[0].gradient_step) == int(ox_state.gradient_step) < 7
    np.testing.assert_allclose(ux_state[0].skip["norm_squared"], ox_state.skip_state["norm_squared"], rtol=1e-5)
    # optax's skip function works as ours does.
    opt = ux.scale(1.0).accumulate_gradients(1, should_skip=optax.skip_not_finite)
    out, state = opt.update({"w": jnp.array([jnp.inf])}, opt.init({"w": jnp.zeros(1)}))
    assert float(out["w"][0]) == 0.0 and int(state[0].skip["num_not_finite"]) == 1


def test_accumulate_gradients_options_are_checked():
    with pytest.raises(TypeError, match=r"accumulate_gradients\(should_skip=3\)"):
        ux.accumulate_gradients(2, should_skip=3)
    with pytest.raises(TypeError, match="mean must be True or False"):
        ux.accumulate_gradients(2, mean=1)
    with pytest.raises(ValueError, match=r"skip_large_updates\(max_squared_norm=-1\.0\)"):
        ux.skip_large_updates(-1.0)
    with pytest.raises(ValueError, match="holds 0 accumulate_gradients states"):
        ux.has_updated(ux.scale(1.0).init(None))
    assert ux.skip_large_updates(2) == ux.skip_large_updates(2.0)
    assert ux.trace().accumulate_gradients(2, should_skip=ux.skip_large_updates(2)) == ux.trace(
    ).accumulate_gradients(2, should_skip=ux.skip_large_updates(2.0))


# --------------------------------------------------------------------------
# apply_if_finite


def test_apply_if_finite_drops_non_finite_steps_and_keeps_counts():
    opt = ux.scale_by_adam().scale(-0.1).apply_if_finite(2)
    step = jax.jit(opt.update)
    state = opt.init(PARAMS)
    _, state = step(GRADS[0], state, PARAMS)
    bad = jax.tree.map(lambda g: jnp.full_like(g, jnp.nan), GRADS[1])
    history = [state]
    for _ in range(3):
        updates, state = step(bad, state, PARAMS)
        history.append(state)
        if len(history) <= 3:  # two dropped calls: zeros, wrapped state bit-identical
            assert all(float(jnp.abs(u).max()) == 0.0 for u in jax.tree.leaves(updates))
            _bit_identical(history[0][0].inner, state[0].inner, "inner")
    # The third non-finite call in a row exceeds max_consecutive_errors=2 and goes through.
    assert all(np.isnan(np.asarray(u)).all() for u in jax.tree.leaves(updates))
    assert int(opt.get_state(state, "apply_if_finite.notfinite_count")) == 3
    assert int(opt.get_state(state, "apply_if_finite.total_notfinite")) == 3
    assert not bool(opt.get_state(state, "apply_if_finite.last_finite"))
    assert int(opt.get_state(state, "apply_if_finite/scale_by_adam.count")) == 2


def test_apply_if_finite_matches_optax():
    grads = make_grads(12)
    grads[3] = jax.tree.map(lambda g: g.at[...].set(jnp.inf), grads[3])
    grads[7] = jax.tree.map(lambda g: jnp.full_like(g, jnp.nan), grads[7])
    adam = dict(b1=0.8, b2=0.95, eps=1e-6)
    ux_opt = ux.scale_by_adam(**adam).scale(-0.1).apply_if_finite(3)
    ox_opt = optax.apply_if_finite(optax.chain(optax.scale_by_adam(**adam), optax.scale(-0.1)), 3)
    ux_state, ox_state = run_pair(ux_opt, ox_opt, n_steps=12, lr=1.0, jit=True, grads=grads)
    assert int(ux_state[0].total_notfinite) == int(ox_state.total_notfinite) == 2
    assert_trees_close(ux_state[0].inner[0].mu, ox_state.inner_state[0].mu, "mu")


def test_apply_if_finite_catches_a_pipeline_that_overflows_on_finite_input():
    opt = ux.scale(1e30).scale(1e30).apply_if_finite()
    out, state = opt.update({"w": jnp.ones(1)}, opt.init({"w": jnp.ones(1)}))
    assert float(out["w"][0]) == 0.0 and int(state[0].total_notfinite) == 1


# --------------------------------------------------------------------------
# freeze


@pytest.mark.parametrize("as_function", [False, True])
def test_freeze_zeroes_frozen_leaves_matches_optax_and_stores_nothing(as_function):
    mask = {"dense": {"w": True, "b": False}, "seq": [False, (True,)], "s": False}
    spec = (lambda params: mask) if as_function else mask
    ux_opt = ux.scale_by_adam().freeze(spec)
    ox_opt = optax.chain(optax.scale_by_adam(), optax.transforms.freeze(mask))
    run_pair(ux_opt, ox_opt)
    assert ux_opt.init(PARAMS)[1] == ux.EmptyState()
    out, _ = ux_opt.update(GRADS[0], ux_opt.init(PARAMS), PARAMS)
    assert float(jnp.abs(out["dense"]["w"]).max()) == 0.0 and float(jnp.abs(out["dense"]["b"]).max()) > 0.0
