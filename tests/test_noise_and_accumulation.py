"""add_noise (statistics, determinism) and accumulate_gradients (mean-of-k semantics)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import updax as ux


def _noise_draws(opt, shape, steps):
    zeros = {"w": jnp.zeros(shape)}
    state = opt.init(zeros)
    draws = []
    for _ in range(steps):
        noise, state = opt.update(zeros, state)
        draws.append(np.asarray(noise["w"]))
    return draws


def test_add_noise_variance_follows_the_paper():
    eta, gamma = 0.3, 0.55
    draws = _noise_draws(ux.add_noise(eta=eta, gamma=gamma, key=0), (200_000,), 4)
    for t, d in enumerate(draws):
        variance = eta / (1 + t) ** gamma  # Neelakantan et al.: the variance, not the std
        n = d.size
        # Standard errors: mean sqrt(var/n); sample variance var*sqrt(2/n). 5 sigma bounds.
        assert abs(d.mean()) < 5 * np.sqrt(variance / n)
        assert abs(d.var() - variance) < 5 * variance * np.sqrt(2 / n)
    # Successive draws are independent.
    assert abs(np.corrcoef(draws[0], draws[1])[0, 1]) < 5 / np.sqrt(draws[0].size)


def test_add_noise_is_deterministic_for_a_key_and_differs_across_keys():
    a = _noise_draws(ux.add_noise(eta=1.0, key=5), (64,), 3)
    b = _noise_draws(ux.add_noise(eta=1.0, key=jax.random.key(5)), (64,), 3)
    c = _noise_draws(ux.add_noise(eta=1.0, key=6), (64,), 3)
    for x, y, z in zip(a, b, c):
        np.testing.assert_array_equal(x, y)
        assert not np.allclose(x, z)
    assert not np.allclose(a[0], a[1])


def test_add_noise_jitted_equals_eager_and_leaves_differ():
    opt = ux.add_noise(eta=1.0, key=1)
    g = {"a": jnp.zeros(8), "b": [jnp.zeros(8)]}
    eager, _ = opt.update(g, opt.init(g))
    jitted, _ = jax.jit(opt.update)(g, opt.init(g))
    np.testing.assert_array_equal(eager["a"], jitted["a"])
    assert not np.allclose(eager["a"], eager["b"][0])


def test_add_noise_default_is_axon_values_with_a_fixed_key():
    assert ux.add_noise() == ux.add_noise(eta=0.01, gamma=0.55, key=0)


@pytest.mark.parametrize("k", [1, 3, 4])
def test_accumulate_gradients_runs_the_inner_pipeline_on_the_mean_of_each_k(k):
    inner = ux.scale_by_adam(b1=0.9, b2=0.99).scale(-0.1)
    wrapped = inner.accumulate_gradients(k)
    params = {"w": jnp.zeros(3), "b": [jnp.zeros(())]}
    rng = np.random.default_rng(0)
    grads = [{"w": jnp.asarray(rng.normal(size=3), jnp.float32), "b": [jnp.asarray(rng.normal(), jnp.float32)]}
             for _ in range(4 * k)]

    state = wrapped.init(params)
    inner_state = inner.init(params)
    step = jax.jit(wrapped.update)
    for i, g in enumerate(grads):
        before = state
        out, state = step(g, state, params)
        if (i + 1) % k:
            assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree.leaves(out))
            # Between inner steps the wrapped pipeline's state is bit-identical.
            for x, y in zip(jax.tree.leaves(before[0].inner), jax.tree.leaves(state[0].inner)):
                np.testing.assert_array_equal(x, y)
        else:
            mean = jax.tree.map(lambda *xs: sum(xs) / k, *grads[i + 1 - k:i + 1])
            expected, inner_state = inner.update(mean, inner_state, params)
            for x, y in zip(jax.tree.leaves(out), jax.tree.leaves(expected)):
                np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
    assert int(wrapped.get_state(state, "accumulate_gradients/scale_by_adam.count")) == 4


def test_a_decay_of_the_number_zero_passes_the_updates_through_without_an_operation():
    """``add_decayed_weights(0.0)`` (every optimizer's default decay) traces nothing and leaves an infinite
    param's update alone; a decay of 0 given as a traced value computes ``u + 0·p`` (NaN there, as optax)."""
    params = {"w": jnp.array([jnp.inf, 1.0]), "b": None, "m": [jnp.ones((2, 2))]}
    grads = {"w": jnp.array([1.0, -0.0]), "b": None, "m": [jnp.full((2, 2), 3.0)]}
    for opt in (ux.add_decayed_weights(0.0), ux.add_decayed_weights(0, mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p))):
        state = opt.init(params)
        jaxpr = jax.make_jaxpr(lambda g, p: opt.update(g, state, p)[0])(grads, params)
        assert not jaxpr.eqns, jaxpr
        out = opt.update(grads, state, params)[0]
        assert jax.tree.structure(out) == jax.tree.structure(grads)
        assert np.array_equal(np.signbit(out["w"]), [False, True]) and np.array_equal(out["w"], [1.0, 0.0])
    def decayed(decay, g, p):
        opt = ux.add_decayed_weights(decay)
        return opt.update(g, opt.init(p), p)[0]

    traced = jax.jit(decayed)
    assert np.isnan(traced(0.0, grads, params)["w"][0])
    # A non-zero decay still decays; the optimizers' default (decay=0) pipelines equal the undecayed ones.
    assert float(decayed(0.5, grads, params)["w"][1]) == 0.5
    adamw, adam = ux.optimizers.adamw(0.1), ux.optimizers.adam(0.1)
    u1 = adamw.update(grads, adamw.init(params), params)[0]
    u2 = adam.update(grads, adam.init(params), params)[0]
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)))
