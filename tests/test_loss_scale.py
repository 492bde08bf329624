"""Loss scaling (Axon.LossScale): the scale's closed forms, the unscaled gradients, and apply_if_finite inside it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import updax as ux
from registry import nested_tree


def _loss(params):
    return sum(jnp.sum(jnp.sin(p) * p) for p in jax.tree.leaves(params))


PARAMS = nested_tree(seed=1)


def _finite_grads(t):
    return nested_tree(seed=t + 2)


def _overflowed(grads):
    """``grads`` with an infinity in one leaf: what a float16 backward pass gives when the scale is too large."""
    leaves, tree = jax.tree.flatten(grads)
    leaves[0] = leaves[0].at[(0,) * leaves[0].ndim].set(jnp.inf)
    return jax.tree.unflatten(tree, leaves)


@pytest.mark.parametrize("period, factor, steps", [(3, 2.0, 10), (1, 1.5, 4), (4, 2.0, 3)])
def test_a_dynamic_scale_grows_by_factor_after_every_period_finite_steps(period, factor, steps):
    """After n finite steps from s0: s = s0 · factor^(n // period), counter = n mod period."""
    opt = ux.scale(-0.1).loss_scale(8.0, dynamic=True, period=period, factor=factor)
    state = opt.init(PARAMS)
    step = jax.jit(opt.update)
    for n in range(1, steps + 1):
        _, state = step(_finite_grads(n), state, PARAMS)
        assert float(ux.current_loss_scale(state)) == pytest.approx(8.0 * factor ** (n // period), rel=1e-6)
        assert int(opt.get_state(state, "loss_scale.counter")) == n % period


def test_a_non_finite_step_backs_off_resets_the_counter_and_stops_at_the_minimum():
    opt = ux.scale(-0.1).loss_scale(64.0, dynamic=True, period=3, factor=4.0, min_loss_scale=2.0)
    state = opt.init(PARAMS)
    for n in range(2):  # two finite steps: the counter at 2, one short of growing
        _, state = opt.update(_finite_grads(n), state, PARAMS)
    assert int(opt.get_state(state, "loss_scale.counter")) == 2
    expected = [16.0, 4.0, 2.0, 2.0]  # 64 / 4, / 4, then max(2, 4 / 4) = 2, and 2 stays
    for scale in expected:
        _, state = opt.update(_overflowed(_finite_grads(0)), state, PARAMS)
        assert float(ux.current_loss_scale(state)) == scale
        assert int(opt.get_state(state, "loss_scale.counter")) == 0
    for n in range(3):  # the count starts over: 3 finite steps to grow
        _, state = opt.update(_finite_grads(n), state, PARAMS)
    assert float(ux.current_loss_scale(state)) == 8.0


def test_a_nan_backs_off_as_an_infinity_does():
    opt = ux.scale(-0.1).loss_scale(64.0, dynamic=True)
    state = opt.init({"w": jnp.zeros(2)})
    _, state = opt.update({"w": jnp.array([jnp.nan, 1.0])}, state)
    assert float(ux.current_loss_scale(state)) == 32.0


def test_a_scale_whose_growth_would_overflow_float32_stays():
    top = float(jnp.finfo(jnp.float32).max)
    opt = ux.scale(-0.1).loss_scale(top, dynamic=True, period=1)
    state = opt.init({"w": jnp.zeros(2)})
    _, state = opt.update({"w": jnp.ones(2)}, state)
    assert float(ux.current_loss_scale(state)) == top


def test_a_static_scale_never_changes():
    opt = ux.scale(-0.1).loss_scale(2.0**10)
    state = opt.init(PARAMS)
    for grads in [_finite_grads(0), _overflowed(_finite_grads(1))]:
        _, state = opt.update(grads, state, PARAMS)
        assert float(ux.current_loss_scale(state)) == 2.0**10
        assert int(opt.get_state(state, "loss_scale.counter")) == 0


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_the_unscaled_gradients_train_as_the_unscaled_run_does(dynamic):
    """AdamW over 20 steps on the gradients of s·L, unscaled by the stage, against optax's AdamW on those of L
    (powers of two: the unscaling is exact). The dynamic scale grows every 4 steps on the way."""
    opt = ux.optimizers.adamw(1e-2, decay=1e-3).apply_if_finite().loss_scale(2.0**8, dynamic=dynamic, period=4)
    reference = optax.adamw(1e-2, weight_decay=1e-3)
    params, ref_params = PARAMS, PARAMS
    state, ref_state = opt.init(params), reference.init(ref_params)
    step = jax.jit(opt.update)
    for t in range(20):
        scale = ux.current_loss_scale(state)
        grads = jax.grad(lambda p: _loss(p) * scale)(params)
        updates, state = step(grads, state, params)
        params = ux.apply_updates(params, updates)
        ref_updates, ref_state = reference.update(jax.grad(_loss)(ref_params), ref_state, ref_params)
        ref_params = optax.apply_updates(ref_params, ref_updates)
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"step {t + 1}")
    assert float(ux.current_loss_scale(state)) == (2.0**13 if dynamic else 2.0**8)


def test_apply_if_finite_inside_drops_the_overflowed_step_and_the_scale_backs_off():
    opt = ux.scale_by_adam().scale(-0.1).apply_if_finite(3).loss_scale(2.0**6, dynamic=True, period=2)
    state = opt.init(PARAMS)
    _, state = opt.update(_finite_grads(0), state, PARAMS)
    before = state
    updates, state = opt.update(_overflowed(_finite_grads(1)), state, PARAMS)
    assert all(not np.any(np.asarray(u)) for u in jax.tree.leaves(updates))
    path = "loss_scale/apply_if_finite/scale_by_adam"
    for a, b in zip(jax.tree.leaves(opt.get_state(state, path)), jax.tree.leaves(opt.get_state(before, path))):
        np.testing.assert_array_equal(a, b)  # Adam's state bit for bit
    assert int(opt.get_state(state, "loss_scale/apply_if_finite.total_notfinite")) == 1
    assert float(opt.get_state(state, "loss_scale.scale")) == 2.0**5
    # the next finite steps go on from the kept state, and after 2 of them the scale grows again
    for n in range(2):
        updates, state = opt.update(_finite_grads(n + 2), state, PARAMS)
    assert int(opt.get_state(state, "loss_scale/apply_if_finite/scale_by_adam.count")) == 3
    assert float(ux.current_loss_scale(state)) == 2.0**6


@pytest.mark.parametrize("build", [
    lambda: ux.optimizers.sgd(0.1).loss_scale(dynamic=True).apply_if_finite(),
    lambda: ux.apply_if_finite(ux.optimizers.sgd(0.1).loss_scale(dynamic=True)),
    lambda: ux.compose(ux.optimizers.sgd(0.1).loss_scale(dynamic=True), ux.apply_if_finite()).init({"w": jnp.ones(1)}),
    lambda: ux.optimizers.sgd(0.1).loss_scale(dynamic=True).masked({"w": True}).apply_if_finite(),
], ids=["fluent", "leading", "composed", "nested"])
def test_apply_if_finite_around_a_dynamic_loss_scale_is_refused(build):
    with pytest.raises(ValueError, match=r"^apply_if_finite: the pipeline it wraps holds a dynamic loss_scale"):
        build()


def test_apply_if_finite_around_a_static_loss_scale_is_fine():
    opt = ux.optimizers.sgd(0.1).loss_scale(4.0).apply_if_finite()
    updates, _ = opt.update({"w": jnp.array([4.0])}, opt.init({"w": jnp.ones(1)}))
    np.testing.assert_allclose(updates["w"], [-0.1])


def test_float16_compute_gradients_that_underflow_unscaled_are_recovered():
    """float32 master params, float16 compute: the gradient 1e-8 underflows in float16 unless the loss is scaled."""
    x = jnp.full(4, 1e-4, jnp.float16)

    def loss(params):
        w = params["w"].astype(jnp.float16)
        return jnp.sum(w * x) * jnp.float16(1e-4)

    params = {"w": jnp.ones(4)}
    assert not np.any(np.asarray(jax.grad(loss)(params)["w"]))  # flushed to zero
    opt = ux.scale(-1.0).loss_scale(2.0**15)
    state = opt.init(params)
    grads = jax.grad(lambda p: loss(p) * ux.current_loss_scale(state))(params)
    updates, _ = opt.update(grads, state, params)
    exact = -float(np.float16(1e-4)) ** 2  # d/dw of the float16 product, in float32
    np.testing.assert_allclose(updates["w"], np.full(4, exact), rtol=2e-3)


def test_the_options_are_checked_by_name():
    for bad, message in [(dict(loss_scale=0.0), r"loss_scale\(loss_scale=0.0\): loss_scale must be in \(0, inf\)"),
                         (dict(period=0), r"loss_scale\(period=0\): period must be a positive integer"),
                         (dict(factor=0.5), r"loss_scale\(factor=0.5\): factor must be in \[1, inf\)"),
                         (dict(min_loss_scale=-1.0), r"min_loss_scale must be in \(0, inf\)"),
                         (dict(dynamic=1), r"dynamic must be True or False")]:
        with pytest.raises((ValueError, TypeError), match=message):
            ux.loss_scale(**bad)


def test_current_loss_scale_wants_exactly_one_loss_scale_state():
    with pytest.raises(ValueError, match=r"^current_loss_scale: the state holds 0 loss_scale states"):
        ux.current_loss_scale(ux.optimizers.sgd(0.1).init({"w": jnp.ones(1)}))
    two = ux.partition({"a": ux.scale(-1.0).loss_scale(2.0), "b": ux.scale(-1.0).loss_scale(4.0)},
                       lambda params: {"w": "a", "v": "b"})
    state = two.init({"w": jnp.ones(1), "v": jnp.ones(1)})
    with pytest.raises(ValueError, match=r"holds 2 loss_scale states"):
        ux.current_loss_scale(state)
    assert float(ux.current_loss_scale(two.get_state(state, "partition.inner")["b"])) == 4.0
