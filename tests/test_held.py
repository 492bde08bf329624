"""ux.hyperparams_in_state: numeric hyperparameters kept in the state, changed by path without recompiling."""

from __future__ import annotations

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import updax as ux
from registry import ENTRIES, NEEDS_PARAMS, SWEPT_OPTIMIZERS, half_squared_norm, nested_tree, updates_for

TARGETS = {**ENTRIES, **{f"optimizers.{n}": (lambda n=n: getattr(ux.optimizers, n)(0.05))
                         for n in SWEPT_OPTIMIZERS}}  # (the others are chains of the entries' stages)
TARGETS["optimizers.lbfgs"] = lambda: ux.optimizers.lbfgs(0.05, objective=half_squared_norm)  # for its line search
TARGETS["optimizers.sophia"] = lambda: ux.optimizers.sophia(0.05, objective=half_squared_norm)  # for its Hessian


def _steps(opt, params, steps=3, jit=True):
    update = jax.jit(opt.update) if jit else opt.update
    state, outs = opt.init(params), []
    for t in range(steps):
        grads = jax.tree.map(lambda p, t=t: jnp.cos(p * (t + 1)), params)
        u, state = update(updates_for(opt, grads), state, params, loss=jnp.asarray(1.0 / (t + 1)))
        outs.append(u)
    return outs, state


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_the_same_numbers_as_the_options_give(name):
    plain = TARGETS[name]()
    held = ux.hyperparams_in_state(plain)
    params = nested_tree()
    expected, _ = _steps(plain, params, jit=False)  # eager: its small kernels are shared by every target
    got, state = _steps(held, params, jit=False)
    # Held options are float32 arrays, as the options of an object passed into jax.jit are: 1 - b2 is then
    # computed in float32 where a Python float computes it in float64 first (0.001 vs 0.0010000467 for
    # b2 = 0.999), which moves Adam-like steps by up to a few 1e-5 relative.
    # Shampoo's float32 roots follow such rounding only to about 1e-3 of a leaf's largest step: eigh's
    # eigenvectors round at about 1e-7 of the largest eigenvalue over the gap, and the inverse root amplifies the
    # smallest directions (tests/test_shampoo.py holds it to its float64 reference).
    loose = "shampoo" in name
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        atol = 5e-3 * float(np.max(np.abs(b))) if loose and np.size(b) else 1e-6
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-4, atol=atol)
    # Every number option of every stage is in the state, and get_state reads it there.
    labels = [stage.label for stage in held.stages]
    for i, stage in enumerate(held.stages):
        selector = stage.label if labels.count(stage.label) == 1 else f"{stage.label}[{labels[:i].count(stage.label)}]"
        for key in stage.held:
            assert isinstance(held.get_state(state, f"{selector}.{key}"), jax.Array)


def test_three_learning_rates_one_trace():
    """The object is static (closed over), as Flax NNX's Optimizer and Linen's TrainState hold it."""
    opt = ux.hyperparams_in_state(ux.optimizers.adamw(1e-2, decay=1e-3))
    params = {"w": jnp.ones(3), "b": jnp.zeros(2)}
    traces = []

    @jax.jit
    def step(state, params):
        traces.append(1)
        grads = jax.tree.map(jnp.sin, params)
        updates, state = opt.update(grads, state, params)
        return state, ux.apply_updates(params, updates)

    state = opt.init(params)
    for lr in (1e-2, 3e-3, 1e-3):
        state = opt.replace_state(state, "scale_by_learning_rate.learning_rate", lr)
        new_state, new_params = step(state, params)
        plain = ux.optimizers.adamw(lr, decay=1e-3)
        u, _ = plain.update(jax.tree.map(jnp.sin, params), plain.init(params), params)
        expected = ux.apply_updates(params, u)
        for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(expected)):
            np.testing.assert_allclose(a, b, rtol=1e-5)  # (b2 in float32, see above)
        assert float(opt.get_state(new_state, "scale_by_learning_rate.learning_rate")) == pytest.approx(lr)
    assert len(traces) == 1


def test_it_prints_as_what_it_is_and_has_value_semantics():
    adam = ux.scale_by_adam(b1=0.8)
    held = ux.hyperparams_in_state(adam.scale(-0.1))
    assert repr(held) == ("hyperparams_in_state(scale_by_adam(b1=0.8, b2=0.999, eps=1e-08, eps_root=1e-15) |> "
                          "scale(step_size=-0.1))")
    assert held == ux.hyperparams_in_state(adam).scale(-0.1).hyperparams_in_state() == adam.scale(-0.1).pipe(
        ux.hyperparams_in_state)
    assert held != adam.scale(-0.1) and hash(held) != hash(adam.scale(-0.1))
    # Stages with no number join the run after them; a plain stage after it prints outside.
    mixed = ux.hyperparams_in_state(adam).scale_by_sign().scale(-1.0)
    assert repr(mixed) == ("hyperparams_in_state(scale_by_adam(b1=0.8, b2=0.999, eps=1e-08, eps_root=1e-15) |> "
                           "scale_by_sign()) |> scale(step_size=-1.0)")
    assert mixed != ux.hyperparams_in_state(adam.scale_by_sign().scale(-1.0))
    assert pickle.loads(pickle.dumps(held)) == held
    leaves, treedef = jax.tree.flatten(held)
    assert jax.tree.unflatten(treedef, leaves) == held


def test_wrapped_pipelines_and_partition_groups_hold_theirs():
    inner = ux.scale_by_adam(b1=0.8).scale(-0.1)
    opt = ux.hyperparams_in_state(inner.apply_if_finite(3))
    assert repr(opt) == ("hyperparams_in_state(scale_by_adam(b1=0.8, b2=0.999, eps=1e-08, eps_root=1e-15) |> "
                         "scale(step_size=-0.1)) |> hyperparams_in_state(apply_if_finite(max_consecutive_errors=3))")
    params = {"w": jnp.ones(2)}
    state = opt.init(params)
    state = opt.replace_state(state, "apply_if_finite/scale_by_adam.b1", 0.5)
    assert float(opt.get_state(state, "apply_if_finite/scale_by_adam.b1")) == 0.5
    u, _ = opt.update({"w": jnp.ones(2)}, state, params)
    plain = ux.scale_by_adam(b1=0.5).scale(-0.1).apply_if_finite(3)
    expected, _ = plain.update({"w": jnp.ones(2)}, plain.init(params), params)
    np.testing.assert_allclose(u["w"], expected["w"], rtol=1e-5)  # (b2 in float32, see above)

    groups = ux.partition({"a": ux.scale(-0.1), "b": ux.scale(-2.0)}, {"x": "a", "y": "b"})
    held = ux.hyperparams_in_state(groups)
    state = held.init({"x": jnp.ones(1), "y": jnp.ones(1)})
    assert "ScheduledState" in repr(jax.tree.structure(state))


def test_replacing_a_held_value_keeps_the_dtype_and_refuses_what_is_not_one():
    opt = ux.hyperparams_in_state(ux.scale_by_adam().scale_by_learning_rate(ux.schedules.constant(0.1)))
    state = opt.init({"w": jnp.ones(2)})
    new = opt.replace_state(state, "scale_by_adam.b1", 0.5)
    assert opt.get_state(new, "scale_by_adam.b1").dtype == jnp.float32
    with pytest.raises(KeyError, match="learning_rate is a schedule, evaluated anew on every step"):
        opt.replace_state(state, "scale_by_learning_rate.learning_rate", 0.01)
    with pytest.raises(ValueError, match=r"b1 has shape \(2,\), the state \(\)"):
        opt.replace_state(state, "scale_by_adam.b1", jnp.ones(2))
    with pytest.raises(TypeError, match="hyperparams_in_state\\(opt=3\\): expected an update object"):
        ux.hyperparams_in_state(3)


def test_plain_objects_still_say_where_the_hyperparameters_can_live():
    opt = ux.scale_by_adam()
    with pytest.raises(KeyError, match="keep the hyperparameters in the state with ux.hyperparams_in_state"):
        opt.replace_state(opt.init({"w": jnp.ones(1)}), "scale_by_adam.b1", 0.5)


@pytest.mark.parametrize("name", sorted(NEEDS_PARAMS))
def test_stages_that_need_params_still_say_so(name):
    held = ux.hyperparams_in_state(ENTRIES[name]())
    params = {"w": jnp.ones(2)}
    with pytest.raises(ValueError, match="needs params"):
        held.update({"w": jnp.ones(2)}, held.init(params))
