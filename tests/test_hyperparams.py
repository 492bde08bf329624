"""Schedules driving any numeric hyperparameter; hyperparameters read by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import updax as ux


def _decaying(count):
    return 0.1 * 0.5**count


def _b1_ramp(count):
    return jnp.minimum(0.5 + 0.1 * count, 0.9)


def test_a_schedule_drives_the_step_size_and_the_value_used_is_readable():
    opt = ux.scale(_decaying)
    assert repr(opt) == "scale(step_size=test_hyperparams._decaying)"
    g = {"w": jnp.ones(2)}
    state = opt.init(g)
    assert isinstance(state[0], ux.ScheduledState)
    for t in range(4):
        u, state = opt.update(g, state)
        np.testing.assert_allclose(u["w"], 0.1 * 0.5**t, rtol=1e-6)
        np.testing.assert_allclose(opt.get_state(state, "scale.step_size"), 0.1 * 0.5**t, rtol=1e-6)
    assert int(opt.get_state(state, "scale").count) == 4


@pytest.mark.parametrize("jit", [False, True])
def test_a_scheduled_b1_matches_optax_inject_hyperparams(jit):
    opt = ux.scale_by_adam(b1=_b1_ramp, b2=0.99, eps=1e-8, eps_root=0.0)
    ref = optax.inject_hyperparams(optax.scale_by_adam)(b1=_b1_ramp, b2=0.99, eps=1e-8, eps_root=0.0)
    params = {"w": jnp.zeros(3), "b": [jnp.zeros(())]}
    s1, s2 = opt.init(params), ref.init(params)
    update = jax.jit(opt.update) if jit else opt.update
    rng = np.random.default_rng(0)
    for t in range(8):
        g = {"w": jnp.asarray(rng.normal(size=3), jnp.float32), "b": [jnp.asarray(rng.normal(), jnp.float32)]}
        u1, s1 = update(g, s1)
        u2, s2 = ref.update(g, s2)
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(opt.get_state(s1, "scale_by_adam.b1"), _b1_ramp(t), rtol=1e-6)
    # The stage's own state is still reachable by field name through the schedule wrapper.
    np.testing.assert_allclose(opt.get_state(s1, "scale_by_adam.mu")["w"], s2.inner_state.mu["w"], rtol=1e-5)
    assert int(opt.get_state(s1, "scale_by_adam.count")) == 8


def test_constant_hyperparameters_read_by_name_and_cannot_be_replaced_as_state():
    opt = ux.scale_by_adam(b1=0.8).scale(-0.01)
    state = opt.init({"w": jnp.zeros(1)})
    assert opt.get_state(state, "scale.step_size") == -0.01
    assert opt.get_state(state, "scale_by_adam.b1") == 0.8
    with pytest.raises(KeyError, match="step_size is a hyperparameter, not state"):
        opt.replace_state(state, "scale.step_size", 0.1)
    scheduled = ux.scale(_decaying)
    with pytest.raises(KeyError, match="step_size is a schedule, evaluated anew on every step"):
        scheduled.replace_state(scheduled.init(None), "scale.step_size", 0.1)


def test_scheduled_hyperparameters_are_at_least_float32():
    opt = ux.scale_by_adam(b2=lambda count: jnp.asarray(0.99, jnp.bfloat16))  # (0.999 rounds to 1 in bfloat16)
    state = opt.init({"w": jnp.zeros(1, jnp.bfloat16)})
    assert opt.get_state(state, "scale_by_adam.b2").dtype == jnp.float32


def test_a_scheduled_stage_keeps_the_jitted_step_compiled_once():
    traces = []

    @jax.jit
    def step(opt, g, state):
        traces.append(1)
        return opt.update(g, state)

    opt = ux.clip(_decaying).scale(-1.0)
    g = {"w": jnp.ones(1)}
    state = opt.init(g)
    for _ in range(3):
        _, state = step(opt, g, state)
    assert len(traces) == 1 and int(opt.get_state(state, "clip").count) == 3


@pytest.mark.parametrize("cooldown, accumulation_size", [(0, 1), (2, 1), (1, 3)])
def test_reduce_on_plateau_matches_optax(cooldown, accumulation_size):
    options = dict(factor=0.5, patience=2, rtol=1e-3, atol=0.01, cooldown=cooldown,
                   accumulation_size=accumulation_size, min_scale=0.05)
    opt = ux.reduce_on_plateau(**options)
    ref = optax.contrib.reduce_on_plateau(**options)
    g = {"w": jnp.array([1.0, -2.0]), "b": [jnp.asarray(0.5)]}
    s1, s2 = opt.init(g), ref.init(g)
    step, ref_step = jax.jit(opt.update), jax.jit(ref.update)
    losses = [5.0, 4.0, 4.0, 3.999, 4.1, 4.0, 4.0, 4.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0,
              2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    scales = []
    for loss in losses:
        u1, s1 = step(g, s1, loss=jnp.asarray(loss))
        u2, s2 = ref_step(g, s2, value=jnp.asarray(loss))
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            np.testing.assert_allclose(x, y, rtol=1e-6)
        scales.append(float(opt.get_state(s1, "reduce_on_plateau.scale")))
        assert int(s1[0].plateau_count) == int(s2.plateau_count)
        assert int(s1[0].cooldown_count) == int(s2.cooldown_count)
    assert len(set(scales)) >= 2
    if accumulation_size == 1:
        assert scales[-1] == pytest.approx(0.05)  # reached min_scale



def _torch_plateau(values, lr, mode, factor, patience, threshold, threshold_mode, cooldown, min_lr):
    """torch.optim.lr_scheduler.ReduceLROnPlateau as its documentation describes it, in float64: the learning
    rate after each reported value."""
    best = np.inf if mode == "min" else -np.inf
    bad = cooldown_counter = 0
    rates = []
    for a in values:
        if mode == "min":
            better = a < (best * (1 - threshold) if threshold_mode == "rel" else best - threshold)
        else:
            better = a > (best * (1 + threshold) if threshold_mode == "rel" else best + threshold)
        best, bad = (a, 0) if better else (best, bad + 1)
        if cooldown_counter > 0:
            cooldown_counter, bad = cooldown_counter - 1, 0
        if bad > patience:
            lr, cooldown_counter, bad = max(lr * factor, min_lr), cooldown, 0
        rates.append(lr)
    return rates


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("threshold_mode", ["rel", "abs"])
@pytest.mark.parametrize("cooldown", [0, 2])
def test_reduce_on_plateau_matches_torchs_documented_rule(mode, threshold_mode, cooldown):
    """mode="max" and both of torch's threshold modes, through updax's rtol/atol (torch's patience p is updax's
    p + 1): the factor times the initial learning rate is torch's rate after every reported value."""
    lr, threshold, patience = 0.5, 0.05, 1
    rtol, atol = (threshold, 0.0) if threshold_mode == "rel" else (0.0, threshold)
    opt = ux.scale_by_learning_rate(lr).reduce_on_plateau(factor=0.5, patience=patience + 1, rtol=rtol, atol=atol,
                                                          cooldown=cooldown, min_scale=0.02 / lr, mode=mode)
    rng = np.random.default_rng(3)
    # a metric improving by steps of a few threshold's worth, with plateaus, in both directions of the margin
    values = np.concatenate([np.linspace(1.0, 2.0, 6), 2.0 + 0.03 * rng.standard_normal(10),
                             np.linspace(2.0, 3.0, 4), 3.0 + 0.2 * rng.standard_normal(12)])
    values = values if mode == "max" else -values
    want = _torch_plateau(values, lr, mode, 0.5, patience, threshold, threshold_mode, cooldown, 0.02)
    g = {"w": jnp.array([1.0, -2.0]), "b": [jnp.asarray(0.5)]}
    state, step = opt.init(g), jax.jit(opt.update)
    for value, rate in zip(values, want):
        u, state = step(g, state, loss=jnp.asarray(value, jnp.float32))
        np.testing.assert_allclose(u["w"], -rate * np.array([1.0, -2.0]), rtol=1e-5)
    assert len(set(want)) >= 2  # reduced at least once

def test_reduce_on_plateau_asks_for_the_loss_by_name():
    opt = ux.reduce_on_plateau()
    with pytest.raises(ValueError, match=r"reduce_on_plateau needs the loss: call update\(updates, state, params, loss=loss\)"):
        opt.update({"w": jnp.ones(1)}, opt.init(None))


def test_a_schedule_object_in_scale_by_schedule_is_a_leaf_not_evaluated_by_the_stage():
    traces = []

    @jax.jit
    def step(opt, g, state):
        traces.append(1)
        return opt.update(g, state)

    g = {"w": jnp.ones(1)}
    for init_value in [0.1, 0.2]:
        opt = ux.scale_by_schedule(ux.schedules.cosine_decay(init_value, decay_steps=10))
        u, _ = step(opt, g, opt.init(g))
        np.testing.assert_allclose(u["w"], init_value, rtol=1e-6)
    assert len(traces) == 1


def test_bf16_moments_do_not_round_b2_to_one():
    # In bfloat16, 0.999 rounds to 1.0 and 1 - b2 to 0: a second moment updated in bf16 arithmetic would stay 0.
    assert float(jnp.asarray(0.999, jnp.bfloat16)) == 1.0
    opt = ux.scale_by_adam(b2=0.999, mu_dtype=jnp.bfloat16, nu_dtype=jnp.bfloat16)
    params = {"w": jnp.zeros(3, jnp.bfloat16)}
    g = {"w": jnp.asarray([1.0, 2.0, -4.0], jnp.bfloat16)}
    _, state = jax.jit(opt.update)(g, opt.init(params), params)
    nu = opt.get_state(state, "scale_by_adam.nu")["w"]
    assert nu.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(nu, np.float32), [0.001, 0.004, 0.016], rtol=1e-2)


def test_extra_keywords_reach_stages_inside_wrappers():
    g = {"w": jnp.ones(1)}
    for opt in [ux.reduce_on_plateau(factor=0.5, patience=1).accumulate_gradients(1),
                ux.masked(ux.reduce_on_plateau(factor=0.5, patience=1), {"w": True}),
                ux.partition({"a": ux.reduce_on_plateau(factor=0.5, patience=1)}, {"w": "a"})]:
        state = opt.init(g)
        for loss in [1.0, 1.0, 1.0]:
            u, state = opt.update(g, state, g, loss=loss)
        assert float(u["w"][0]) == 0.25, opt
