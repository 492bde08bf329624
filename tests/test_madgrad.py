"""MADGRAD: parity with optax.contrib over 20 jitted steps on a nested tree, the paper's Algorithm 1 in float64
NumPy, the first step's closed form, the guard where nothing was summed yet, validation and the starting point.

optax 0.2.8 follows the authors' PyTorch implementation, whose weight λ_k = (γ + ε)·sqrt(k + 1) adds eps to the
learning rate; the NumPy transcription below does the same (the paper's Algorithm 1 has γ alone).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest
from registry import nested_tree

import updax as ux

O = ux.optimizers
RTOL, ATOL = 2e-5, 1e-6


def _grads(t):
    return jax.tree.map(lambda g: g * (1.0 + 0.5 * np.sin(t)), nested_tree(seed=t + 1))


def _schedule(count):
    return 0.05 / (1.0 + 0.1 * count.astype(jnp.float32))


CASES = [
    ("stage", lambda: ux.scale_by_madgrad(learning_rate=0.05, momentum=0.8, eps=1e-6).scale(-1.0),
     lambda: optax.contrib.scale_by_madgrad(0.05, momentum=0.8, eps=1e-6)),
    ("stage_scheduled", lambda: ux.scale_by_madgrad(learning_rate=_schedule, momentum=0.9, eps=1e-5).scale(-1.0),
     lambda: optax.contrib.scale_by_madgrad(_schedule, momentum=0.9, eps=1e-5)),
    ("no_momentum", lambda: ux.scale_by_madgrad(learning_rate=0.05, momentum=0.0, eps=1e-6).scale(-1.0),
     lambda: optax.contrib.scale_by_madgrad(0.05, momentum=0.0, eps=1e-6)),
    ("optimizer", lambda: O.madgrad(0.05, momentum=0.8, decay=0.01, eps=1e-6),
     lambda: optax.contrib.madgrad(0.05, momentum=0.8, weight_decay=0.01, eps=1e-6)),
]


@pytest.mark.parametrize("ours, theirs", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parity_with_optax_over_20_jitted_steps(ours, theirs):
    opt, ref = ours(), theirs()
    p1 = p2 = nested_tree(seed=0)
    s1, s2 = opt.init(p1), ref.init(p2)
    step1, step2 = jax.jit(opt.update), jax.jit(ref.update)
    for t in range(20):
        u1, s1 = step1(_grads(t), s1, p1)
        u2, s2 = step2(_grads(t), s2, p2)
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL, err_msg=f"step {t}")
        p1, p2 = ux.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    for x, y in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL)


def _paper(x, grads, lr, momentum, eps, decay):
    """Algorithm 1 of Defazio & Jelassi in float64 (λ with γ + ε, as the authors' code), L2 decay in the gradient."""
    x0 = x.copy()
    s, v = np.zeros_like(x), np.zeros_like(x)
    out = []
    for k, g in enumerate(grads):
        g = g + decay * x
        lam = (lr + eps) * np.sqrt(k + 1)
        s, v = s + lam * g, v + lam * g * g
        z = x0 - s / (np.cbrt(v) + eps)
        x = momentum * x + (1 - momentum) * z
        out.append(x)
    return out


@pytest.mark.parametrize("momentum, decay", [(0.9, 0.0), (0.5, 0.1), (0.0, 0.0)])
def test_follows_the_paper_in_float64(momentum, decay):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 4))
    grads = [rng.normal(size=(3, 4)) * (1 + t % 3) for t in range(25)]
    want = _paper(x, grads, 0.1, momentum, 1e-6, decay)
    opt = O.madgrad(0.1, momentum=momentum, decay=decay, eps=1e-6)
    params = {"w": [jnp.asarray(x, jnp.float32)]}
    state, step = opt.init(params), jax.jit(opt.update)
    for t, (g, w) in enumerate(zip(grads, want)):
        u, state = step({"w": [jnp.asarray(g, jnp.float32)]}, state, params)
        params = ux.apply_updates(params, u)
        np.testing.assert_allclose(params["w"][0], w, rtol=1e-5, atol=1e-5, err_msg=f"step {t}")


def test_the_first_step_is_the_cube_root_rule():
    """s = λg, v = λg² on the first step: without momentum the step is λ^(2/3) g / |g|^(2/3)."""
    opt = ux.scale_by_madgrad(learning_rate=0.5, momentum=0.0, eps=0.0)
    g = jnp.array([8.0, -1.0, 0.125])
    u, _ = opt.update({"w": g}, opt.init({"w": jnp.zeros(3)}), {"w": jnp.zeros(3)})
    np.testing.assert_allclose(u["w"], 0.5 ** (2 / 3) * np.array([2.0, -1.0, 0.5]), rtol=1e-6)


def test_a_leaf_with_no_gradient_yet_stays_where_it_is_even_without_eps():
    """v = 0 where every gradient so far was 0 (s too): z is the starting point, not 0/0."""
    opt = ux.scale_by_madgrad(learning_rate=0.1, momentum=0.5, eps=0.0)
    params = {"w": jnp.array([1.0, 2.0])}
    state = opt.init(params)
    for g in ([0.0, 0.0], [0.0, 1.0]):
        u, state = opt.update({"w": jnp.array(g)}, state, params)
        assert np.all(np.isfinite(u["w"]))
    assert float(u["w"][0]) == 0.0


def test_the_state_keeps_the_starting_point_and_names_its_sums():
    opt = O.madgrad(0.1)
    params = {"w": jnp.array([1.0, -2.0])}
    state = opt.init(params)
    np.testing.assert_array_equal(opt.get_state(state, "scale_by_madgrad.init_params")["w"], [1.0, -2.0])
    _, state = opt.update({"w": jnp.array([1.0, 1.0])}, state, params)
    assert int(opt.get_state(state, "scale_by_madgrad.count")) == 1
    np.testing.assert_allclose(opt.get_state(state, "scale_by_madgrad.grad_sum")["w"], 0.100001, rtol=1e-6)


@pytest.mark.parametrize("build, message", [
    (lambda: ux.scale_by_madgrad(momentum=1.0), r"scale_by_madgrad\(momentum=1.0\): momentum must be in \[0, 1\)"),
    (lambda: ux.scale_by_madgrad(learning_rate=-0.1), r"scale_by_madgrad\(learning_rate=-0.1\)"),
    (lambda: ux.scale_by_madgrad(eps=-1.0), r"scale_by_madgrad\(eps=-1.0\): eps must be in \[0, inf\)"),
    (lambda: O.madgrad(-1.0), r"madgrad\(learning_rate=-1.0\)"),
])
def test_options_are_validated_at_construction(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_update_needs_params_and_refuses_complex_updates():
    opt = ux.scale_by_madgrad()
    state = opt.init({"w": jnp.zeros(2)})
    with pytest.raises(ValueError, match="scale_by_madgrad"):
        opt.update({"w": jnp.ones(2)}, state)
    z = {"w": jnp.zeros(2, jnp.complex64)}
    with pytest.raises(TypeError, match=r"scale_by_madgrad: complex updates are not supported \(updates\['w'\]"):
        opt.update(z, opt.init(z), z)
