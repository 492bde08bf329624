"""MARS (Yuan et al. 2024) against a float64 NumPy implementation written from the paper's algorithm (MARS-approx,
as MARS-AdamW and MARS-Lion), over 24 steps on a nested tree; its reduction cases (gamma=0 is AdamW, and Lion with
both decays b1); its clipping on degenerate leaves."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import updax as ux

STEPS = 24
LR, B2, EPS, DECAY = 0.02, 0.99, 1e-8, 0.1


def _params():
    """Dicts, a list, a None leaf, a scalar; leaves of different sizes, so that the per-leaf clip fires on some
    leaves and steps and not on others."""
    return {"dense": {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": jnp.array([0.5, -0.25, 0.0])},
            "layers": [jnp.array(1.5), None, {"k": jnp.linspace(0.0, 2.0, 10).reshape(2, 5)}]}


#: The amplitude of each leaf's gradients (by its size): "w" near norm 1, "b" well within it, the scalar and "k"
#: mostly above it.
_AMPLITUDE = {12: 0.25, 3: 0.2, 1: 3.0, 10: 1.0}


def _grads(step, params):
    """Gradients whose signs change from step to step (a function of the step and the leaves' shapes only, so
    both sides get the same numbers); every fifth step the scalar's is 0."""
    def leaf(p):
        phase = np.arange(np.size(p), dtype=np.float64).reshape(np.shape(p))
        g = _AMPLITUDE[np.size(p)] * (np.sin(1.7 * step + phase) - 0.3 + 0.2 * np.cos(0.3 * step * (phase + 1)))
        if np.size(p) == 1 and step % 5 == 4:
            g = 0.0 * g
        return np.float32(g)
    return jax.tree.map(leaf, params)


def _run(opt, steps=STEPS, grads=_grads):
    params = _params()
    state = opt.init(params)
    step = jax.jit(opt.update)
    for t in range(steps):
        g = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), grads(t, params))
        updates, state = step(g, state, params)
        params = ux.apply_updates(params, updates)
    return params


def _reference(variant, *, gamma, b1, steps=STEPS, max_norm=1.0):
    """The paper's algorithm in float64 (MARS-approx: the previous step's gradient; x_1 = x_0, so no correction
    on the first step): c_t = g_t + gamma·b1/(1-b1)·(g_t - g_{t-1}), clipped to norm max_norm per tensor, as the
    authors' code does; then m ← b1·m + (1-b1)·c, and AdamW's bias-corrected step with v ← b2·v + (1-b2)·c²
    (MARS-AdamW) or sign(m) (MARS-Lion, H_t = sqrt(diag(m²))), with decoupled weight decay."""
    params = jax.tree.map(lambda p: np.asarray(p, np.float64), _params())
    leaves, treedef = jax.tree.flatten(params)
    m = [np.zeros_like(x) for x in leaves]
    v = [np.zeros_like(x) for x in leaves]
    previous = [None] * len(leaves)
    for t in range(1, steps + 1):
        grads = jax.tree.leaves(_grads(t - 1, treedef.unflatten(leaves)))
        new = []
        for i, (x, g) in enumerate(zip(leaves, grads)):
            g = np.asarray(g, np.float64)
            g_prev = g if previous[i] is None else previous[i]
            c = g + gamma * b1 / (1 - b1) * (g - g_prev)
            norm = np.sqrt(np.sum(c * c))
            if norm > max_norm:
                c = c / norm * max_norm
            m[i] = b1 * m[i] + (1 - b1) * c
            if variant == "adamw":
                v[i] = B2 * v[i] + (1 - B2) * c * c
                step = (m[i] / (1 - b1**t)) / (np.sqrt(v[i] / (1 - B2**t)) + EPS)
            else:
                step = np.sign(m[i])
            new.append(x - LR * (step + DECAY * x))
            previous[i] = g
        leaves = new
    return treedef.unflatten(leaves)


def _optimizer(variant, **options):
    if variant == "adamw":
        return ux.optimizers.mars_adamw(LR, b2=B2, eps=EPS, eps_root=0.0, decay=DECAY, **options)
    return ux.optimizers.mars_lion(LR, decay=DECAY, **options)


def _max_error(actual, expected):
    return max(float(np.max(np.abs(np.asarray(a, np.float64) - e), initial=0.0))
               for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)))


@pytest.mark.parametrize("variant", ["adamw", "lion"])
@pytest.mark.parametrize("gamma, b1", [(0.025, 0.95), (0.5, 0.9), (1.0, 0.5)])
def test_mars_follows_the_papers_algorithm_over_24_steps(variant, gamma, b1):
    actual = _run(_optimizer(variant, gamma=gamma, b1=b1))
    expected = _reference(variant, gamma=gamma, b1=b1)
    assert _max_error(actual, expected) < 2e-6  # float32 against float64 (measured: at most 3.7e-7)
    # The correction and the clip change the path: the test can fail.
    plain = _reference(variant, gamma=0.0, b1=b1, max_norm=1e30)
    assert _max_error(actual, plain) > 1e-2


def test_the_clip_fires_on_some_leaves_and_steps_and_not_on_others():
    """With the paper's options, the reference test's gradients are clipped on every step ("k"), on none ("b"),
    and on some steps only (the matrix "w", and the scalar, whose zero gradients are not)."""
    opt = ux.scale_by_mars()
    params = _params()
    state, clipped = opt.init(params), []
    for t in range(STEPS):
        c, state = opt.update(_grads(t, params), state)
        clipped.append([bool(np.isclose(float(jnp.linalg.norm(leaf)), 1.0, atol=1e-6)) for leaf in jax.tree.leaves(c)])
    b, w, scalar, k = np.mean(clipped, axis=0)
    assert b == 0 and k == 1 and 0 < w < 1 and 0 < scalar < 1


def test_the_first_step_has_no_correction():
    """x_1 = x_0 in the paper's Algorithm 1: c_1 = g_1 (the authors' code, starting from g_0 = 0, would give
    (1 + gamma·b1/(1-b1))·g_1 = 1.475·g_1)."""
    opt = ux.scale_by_mars()
    g = {"w": jnp.array([0.1, -0.2, 0.3])}
    c, state = opt.update(g, opt.init(g))
    np.testing.assert_array_equal(c["w"], g["w"])
    c, _ = opt.update({"w": jnp.zeros(3)}, state)
    np.testing.assert_allclose(c["w"], -0.475 * g["w"], rtol=1e-6)


@pytest.mark.parametrize("mask", [None, {"dense": True, "layers": False}])
def test_gamma_zero_is_adamw_where_the_clip_does_not_fire(mask):
    """The paper's reduction: with gamma = 0, MARS-AdamW is AdamW, bit for bit, with every option the same;
    with the unit clip, on gradients whose leaves' norms stay within 1."""
    options = dict(b1=0.9, b2=0.999, eps=1e-7, eps_root=1e-12, decay=0.05, mask=mask)
    adamw = _run(ux.optimizers.adamw(0.05, **options))
    unclipped = _run(ux.optimizers.mars_adamw(0.05, gamma=0.0, max_norm=1e6, **options))
    jax.tree.map(np.testing.assert_array_equal, unclipped, adamw)

    def small(step, params):
        return jax.tree.map(lambda g: g / 8, _grads(step, params))

    adamw = _run(ux.optimizers.adamw(0.05, **options), grads=small)
    jax.tree.map(np.testing.assert_array_equal, _run(ux.optimizers.mars_adamw(0.05, gamma=0.0, **options),
                                                     grads=small), adamw)


def test_gamma_zero_mars_lion_is_lion_with_both_decays_b1():
    """MARS-Lion steps along sign(m), m a momentum of decay b1: Lion with b1 = b2, bit for bit."""
    lion = _run(ux.optimizers.lion(0.05, b1=0.9, b2=0.9, decay=0.05))
    mars = _run(ux.optimizers.mars_lion(0.05, gamma=0.0, b1=0.9, max_norm=1e6, decay=0.05))
    jax.tree.map(np.testing.assert_array_equal, mars, lion)


def test_the_optimizers_are_their_pipelines():
    assert ux.optimizers.mars_adamw(1e-3, gamma=0.1, b1=0.9, decay=0.01) == (
        ux.scale_by_mars(gamma=0.1, b1=0.9).scale_by_adam(b1=0.9, b2=0.99, eps_root=0.0).add_decayed_weights(0.01)
        .scale_by_learning_rate(1e-3))
    assert ux.optimizers.mars_lion(1e-4, b1=0.9, max_norm=2.0) == (
        ux.scale_by_mars(b1=0.9, max_norm=2.0).scale_by_lion(b1=0.9, b2=0.9).add_decayed_weights(0.0)
        .scale_by_learning_rate(1e-4))


def test_the_state_keeps_the_previous_gradient_per_leaf():
    opt = ux.optimizers.mars_adamw(1e-3)
    params = _params()
    state = opt.init(params)
    g = _grads(0, params)
    _, state = opt.update(g, state, params)
    held = opt.get_state(state, "scale_by_mars.prev_grads")
    assert jax.tree.structure(held) == jax.tree.structure(params)
    jax.tree.map(np.testing.assert_array_equal, held, g)
    assert int(opt.get_state(state, "scale_by_mars.count")) == 1


@pytest.mark.parametrize("scale", [0.0, 1e-30, 1e30, 1e36])
def test_degenerate_leaves_stay_finite_in_float32(scale):
    """A zero gradient passes as zeros (its norm is 0: nothing to clip); a tiny one passes unchanged; a huge one,
    whose squares or whose norm overflow float32, is clipped to norm 1 along its direction, not to zeros or NaN."""
    opt = ux.scale_by_mars(gamma=0.5, b1=0.9)
    direction = jnp.array([[3.0, -4.0], [0.0, 0.0]])
    g = {"w": scale * direction, "zero": jnp.zeros(3), "empty": jnp.zeros((0, 2)), "huge": jnp.full((4, 4), 2e38)}
    state = opt.init(g)
    for _ in range(3):
        c, state = opt.update(g, state)
        assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(c))
        np.testing.assert_array_equal(c["zero"], jnp.zeros(3))
        np.testing.assert_allclose(c["huge"], jnp.full((4, 4), 0.25), rtol=1e-6)  # its norm, 8e38, overflows
        expected = direction / 5 if scale > 1 else scale * direction
        np.testing.assert_allclose(c["w"], expected, rtol=1e-6, atol=0)
    steps = ux.optimizers.mars_adamw(1e-3)
    updates, _ = steps.update(g, steps.init(g), g)
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(updates))


def test_complex_updates_are_clipped_by_their_modulus():
    opt = ux.scale_by_mars(gamma=0.0)
    g = {"z": jnp.array([3 + 4j, 0.0], jnp.complex64)}
    c, _ = opt.update(g, opt.init(g))
    np.testing.assert_allclose(c["z"], [0.6 + 0.8j, 0.0], rtol=1e-6)


@pytest.mark.parametrize("build, message", [
    (lambda: ux.scale_by_mars(gamma=-0.1), "scale_by_mars(gamma=-0.1): gamma must be in [0, inf)"),
    (lambda: ux.scale_by_mars(b1=1.0), "scale_by_mars(b1=1.0): b1 must be in [0, 1)"),
    (lambda: ux.scale_by_mars(max_norm=0.0), "scale_by_mars(max_norm=0.0): max_norm must be in (0, inf)"),
    (lambda: ux.optimizers.mars_adamw(gamma=-1.0), "scale_by_mars(gamma=-1.0): gamma must be in [0, inf)"),
    (lambda: ux.optimizers.mars_lion(-1e-3), "mars_lion(learning_rate=-0.001): learning_rate must be in"),
])
def test_bad_options_are_refused_by_name(build, message):
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        build()


def test_gamma_takes_a_schedule():
    """The paper's gamma_t: a schedule evaluated at the stage's own count."""
    opt = ux.scale_by_mars(gamma=lambda count: 0.5 * count, b1=0.5, max_norm=100.0)
    state = opt.init({"w": jnp.zeros(1)})
    outs = []
    for g in (1.0, 3.0, 2.0):
        c, state = opt.update({"w": jnp.array([g])}, state)
        outs.append(float(c["w"][0]))
    np.testing.assert_allclose(outs, [1.0, 3.0 + 0.5 * 2.0, 2.0 + 1.0 * -1.0])
