"""Clipping and privacy: adaptive_grad_clip, per-example clipping, differentially_private_aggregate and dpsgd.

Oracles: optax 0.2.8 (adaptive_grad_clip, per_example_global_norm_clip, contrib.differentially_private_aggregate,
contrib.dpsgd) over 20 jitted steps on the registry's nested trees; a float64 NumPy transcription of AGC (Brock et
al. 2021, eq. 3) for the ``axis`` option and 0-d / 1-d leaves, which optax refuses with an axis; and, for the noise,
its distribution: mean and standard deviation over many draws against the formula, with bounds derived below.
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

RTOL, ATOL = 2e-5, 1e-6
STEPS = 20


def _assert_trees_close(actual, expected, what, rtol=RTOL, atol=ATOL):
    assert jax.tree.structure(actual) == jax.tree.structure(expected), what
    for (path, a), e in zip(jax.tree_util.tree_flatten_with_path(actual)[0], jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol,
                                   err_msg=f"{what}{jax.tree_util.keystr(path)}")


#: Per-example scales: with the nested trees' global norm of about 6 and l2_norm_clip = 1.5, two of the four
#: examples are clipped and two are not.
SCALES = (0.1, 1.0, 3.0, 0.02)


def examples(t):
    """Step ``t``'s per-example gradients: four different nested trees, stacked on a leading axis."""
    trees = [jax.tree.map(lambda g, s=s: g * s, nested_tree(seed=100 + 10 * t + i)) for i, s in enumerate(SCALES)]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


# --------------------------------------------------------------------------
# adaptive_grad_clip


def _agc_reference(g, p, clipping, eps, axis):
    """Brock et al. (2021), eq. 3, in float64: G_i ← λ·max(‖W_i‖, ε)/‖G_i‖·G_i where ‖G_i‖/max(‖W_i‖, ε) > λ."""
    g, p = np.asarray(g, np.float64), np.asarray(p, np.float64)
    if axis is not None and g.ndim >= 2:
        axes = axis if isinstance(axis, tuple) else (axis,)
    elif np.squeeze(g).ndim <= 1:
        axes = None
    else:
        axes = {2: (0,), 3: (0,), 4: (0, 1, 2), 5: (0, 1, 2, 3)}[g.ndim]
    g_norm = np.sqrt(np.sum(g * g, axis=axes, keepdims=True))
    p_norm = np.maximum(np.sqrt(np.sum(p * p, axis=axes, keepdims=True)), eps)
    ratio = g_norm / p_norm
    return np.where(ratio > clipping, g * clipping * p_norm / np.where(g_norm > 0, g_norm, 1.0), g)


@pytest.mark.parametrize("clipping, eps", [(0.8, 1e-3), (0.05, 1e-3), (1.0, 0.5)])
def test_adaptive_grad_clip_matches_optax_over_20_steps(clipping, eps):
    opt, ref = ux.adaptive_grad_clip(clipping, eps=eps), optax.adaptive_grad_clip(clipping, eps=eps)
    p1 = p2 = nested_tree(seed=0)
    s1, s2 = opt.init(p1), ref.init(p2)
    step1, step2 = jax.jit(opt.update), jax.jit(ref.update)
    clipped = kept = 0
    for t in range(STEPS):
        grads = jax.tree.map(lambda g, t=t: g * (1.0 + 0.5 * np.sin(t)), nested_tree(seed=t + 1))
        u1, s1 = step1(grads, s1, p1)
        u2, s2 = step2(grads, s2, p2)
        _assert_trees_close(u1, u2, f"step {t + 1}")
        for u, g in zip(jax.tree.leaves(u1), jax.tree.leaves(grads)):
            same = np.isclose(u, g, rtol=1e-6).all()
            clipped, kept = clipped + (not same), kept + same
        p1 = ux.apply_updates(p1, jax.tree.map(lambda u: -0.1 * u, u1))
        p2 = optax.apply_updates(p2, jax.tree.map(lambda u: -0.1 * u, u2))
    assert clipped or clipping == 1.0, "nothing was clipped: the comparison saw one branch only"


def test_adaptive_grad_clip_matches_optax_with_an_axis():
    """optax applies an ``axis`` to every leaf, so its 0-d leaves would fail: the tree here has none."""
    def tree(seed):
        return {k: v for k, v in nested_tree(seed=seed).items() if k != "scalar"}

    for axis in [-1, 0]:
        opt, ref = ux.adaptive_grad_clip(0.5, axis=axis), optax.adaptive_grad_clip(0.5, axis=axis)
        params = tree(0)
        for t in range(3):
            grads = tree(t + 1)
            _assert_trees_close(jax.jit(opt.update)(grads, opt.init(params), params)[0],
                                ref.update(grads, ref.init(params), params)[0], f"axis={axis} step {t + 1}")


@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 1), (1, 2)])
def test_adaptive_grad_clip_matches_the_papers_rule_in_float64(axis):
    rng = np.random.default_rng(5)
    shapes = {"scalar": (), "vector": (6,), "row": (1, 5), "matrix": (4, 3), "rank3": (2, 3, 4), "conv": (3, 3, 2, 4)}
    if axis is not None:
        shapes = {k: s for k, s in shapes.items() if len(s) < 2 or all(-len(s) <= a < len(s)
                                                                         for a in np.atleast_1d(axis))}
    params = {k: rng.normal(size=s) for k, s in shapes.items()}
    params["zero"] = np.zeros(6)  # eps decides its bound
    grads = {k: rng.normal(size=np.shape(v)) * rng.choice([0.01, 1.0, 10.0]) for k, v in params.items()}
    opt = ux.adaptive_grad_clip(0.3, eps=0.2, axis=axis)
    grads, params = jax.tree.map(np.float32, grads), jax.tree.map(np.float32, params)
    got, _ = jax.jit(opt.update)(grads, opt.init(params), params)
    for key, p in params.items():
        expected = _agc_reference(grads[key], p, 0.3, 0.2, axis)
        np.testing.assert_allclose(got[key], expected, rtol=2e-6, atol=1e-7, err_msg=key)


def test_adaptive_grad_clip_keeps_dtypes_and_zero_updates():
    params = {"w": jnp.ones((2, 3), jnp.bfloat16), "b": jnp.zeros(3)}
    grads = {"w": jnp.full((2, 3), 4.0, jnp.bfloat16), "b": jnp.zeros(3)}
    opt = ux.adaptive_grad_clip(0.5)
    updates, _ = opt.update(grads, opt.init(params), params)
    assert updates["w"].dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(updates["w"], np.float32), 0.5, rtol=1e-2)  # column norms 8 -> 0.5·√2
    np.testing.assert_array_equal(updates["b"], 0.0)
    zero = ux.adaptive_grad_clip(0.0)
    np.testing.assert_array_equal(zero.update(grads, zero.init(params), params)[0]["b"], 0.0)


def test_adaptive_grad_clip_refuses_bad_options_and_unknown_units_by_name():
    with pytest.raises(ValueError, match=r"^adaptive_grad_clip\(clipping=-1.0\): clipping must be in \[0, inf\)"):
        ux.adaptive_grad_clip(-1.0)
    with pytest.raises(TypeError, match=r"^adaptive_grad_clip\(axis=1.5\): axis must be None, an int or"):
        ux.adaptive_grad_clip(0.1, axis=1.5)
    with pytest.raises(TypeError, match=r"adaptive_grad_clip\(axis=\(0, 0\)\)"):
        ux.adaptive_grad_clip(0.1, axis=(0, 0))
    assert ux.adaptive_grad_clip(0.1, axis=[0, 1]) == ux.adaptive_grad_clip(0.1, axis=(0, 1))
    opt = ux.adaptive_grad_clip(0.1)
    params = {"big": jnp.ones((2,) * 6)}
    with pytest.raises(ValueError, match=r"^adaptive_grad_clip: params\['big'\] has shape \(2, 2, 2, 2, 2, 2\); .* "
                                         r"give axis="):
        opt.update(params, opt.init(params), params)
    opt = ux.adaptive_grad_clip(0.1, axis=2)
    params = {"w": jnp.ones((2, 3))}
    with pytest.raises(ValueError, match=r"^adaptive_grad_clip\(axis=\(2,\)\): params\['w'\] has shape \(2, 3\), "
                                         r"which has no axis 2"):
        opt.update(params, opt.init(params), params)
    with pytest.raises(ValueError, match="adaptive_grad_clip needs params"):
        opt.update(params, opt.init(params))


# --------------------------------------------------------------------------
# Per-example clipping


@pytest.mark.parametrize("l2_norm_clip", [1.5, 0.0, 1e6])
def test_per_example_clipping_matches_optax_over_20_batches(l2_norm_clip):
    opt = ux.per_example_global_norm_clip(l2_norm_clip)
    params = nested_tree(seed=0)
    state = opt.init(params)
    stage = jax.jit(opt.update)
    function = jax.jit(ux.per_example_clipped_sum)
    for t in range(STEPS):
        grads = examples(t)
        theirs, their_count = optax.per_example_global_norm_clip(jax.tree.leaves(grads), l2_norm_clip)
        theirs = jax.tree.unflatten(jax.tree.structure(grads), theirs)
        ours, count = function(grads, l2_norm_clip)
        _assert_trees_close(ours, theirs, f"step {t + 1} function")
        _assert_trees_close(stage(grads, state, params)[0], theirs, f"step {t + 1} stage")
        assert int(count) == int(their_count) == {1.5: 2, 0.0: 4, 1e6: 0}[l2_norm_clip]


def test_per_example_clipping_is_the_papers_rule():
    """Abadi et al., Algorithm 1: ḡ(x_i) = g(x_i) / max(1, ‖g(x_i)‖₂ / C), summed over the lot."""
    grads = {"a": jnp.array([[3.0, 0.0], [0.0, 0.5], [0.0, 0.0]]), "b": jnp.array([4.0, 0.0, 0.0])}
    summed, count = ux.per_example_clipped_sum(grads, 2.0)
    np.testing.assert_allclose(summed["a"], [3.0 * 2 / 5, 0.5], rtol=1e-6)
    np.testing.assert_allclose(summed["b"], 4.0 * 2 / 5, rtol=1e-6)
    assert int(count) == 1
    with pytest.raises(ValueError, match=r"^per_example_clipped_sum: it takes per-example updates, .* but "
                                         r"updates\['b'\] is 0-d"):
        ux.per_example_clipped_sum({"a": jnp.ones((2, 2)), "b": jnp.ones(())}, 1.0)
    with pytest.raises(ValueError, match=r"^per_example_clipped_sum: updates\['a'\] has 0 examples"):
        ux.per_example_clipped_sum({"a": jnp.ones((0, 2))}, 1.0)
    with pytest.raises(ValueError, match=r"^per_example_clipped_sum\(l2_norm_clip=-1.0\)"):
        ux.per_example_clipped_sum(grads, -1.0)


def test_per_example_gradients_from_vmap_in_a_jitted_training_step():
    """The docstrings' recipe: jax.vmap(jax.grad(loss), in_axes=(None, 0)) gives the per-example gradients."""
    def loss(params, x, y):
        return 0.5 * (jnp.dot(params["w"], x) + params["b"] - y) ** 2

    rng = np.random.default_rng(0)
    xs = jnp.asarray(rng.normal(size=(16, 3)), jnp.float32)
    ys = xs @ jnp.array([1.0, -2.0, 0.5]) + 0.3
    params = {"w": jnp.zeros(3), "b": jnp.zeros(())}
    opt = ux.optimizers.dpsgd(0.1, l2_norm_clip=1.0, noise_multiplier=0.0, momentum=0.9)
    state = opt.init(params)

    @jax.jit
    def step(params, state):
        grads = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(params, xs, ys)
        updates, state = opt.update(grads, state, params)
        return ux.apply_updates(params, updates), state

    before = float(jnp.mean(jax.vmap(loss, in_axes=(None, 0, 0))(params, xs, ys)))
    for _ in range(30):
        params, state = step(params, state)
    after = float(jnp.mean(jax.vmap(loss, in_axes=(None, 0, 0))(params, xs, ys)))
    assert after < 0.1 * before


# --------------------------------------------------------------------------
# differentially_private_aggregate and dpsgd


@pytest.mark.parametrize("noise_multiplier", [0.0, 1.1])
def test_private_aggregate_matches_optax_over_20_steps(noise_multiplier):
    """Without noise the numbers are optax's; with it too, since the same key gives optax's draws."""
    opt = ux.differentially_private_aggregate(1.5, noise_multiplier, key=42)
    ref = optax.contrib.differentially_private_aggregate(1.5, noise_multiplier, key=jax.random.key(42))
    params = nested_tree(seed=0)
    s1, s2 = opt.init(params), ref.init(params)
    step1, step2 = jax.jit(opt.update), jax.jit(ref.update)
    for t in range(STEPS):
        u1, s1 = step1(examples(t), s1, params)
        u2, s2 = step2(examples(t), s2, params)
        _assert_trees_close(u1, u2, f"step {t + 1}")


@pytest.mark.parametrize("momentum, nesterov", [(None, False), (0.9, False), (0.8, True)])
@pytest.mark.parametrize("noise_multiplier", [0.0, 0.7])
def test_dpsgd_matches_optax_over_20_steps(momentum, nesterov, noise_multiplier):
    opt = ux.optimizers.dpsgd(0.05, l2_norm_clip=1.5, noise_multiplier=noise_multiplier, key=7, momentum=momentum,
                              nesterov=nesterov)
    with pytest.warns(DeprecationWarning):  # optax 0.2.8's dpsgd takes only a seed, which it passes on as deprecated
        ref = optax.contrib.dpsgd(0.05, l2_norm_clip=1.5, noise_multiplier=noise_multiplier, seed=7,
                                  momentum=momentum, nesterov=nesterov)
    p1 = p2 = nested_tree(seed=0)
    s1, s2 = opt.init(p1), ref.init(p2)
    step1, step2 = jax.jit(opt.update), jax.jit(ref.update)
    for t in range(STEPS):
        u1, s1 = step1(examples(t), s1, p1)
        u2, s2 = step2(examples(t), s2, p2)
        _assert_trees_close(u1, u2, f"step {t + 1}")
        p1, p2 = ux.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    _assert_trees_close(p1, p2, "params")


#: The noise test: N draws of u = noise / B with noise ~ N(0, (σC)²), s = σC / B. The sample mean of N iid
#: N(0, s²) draws is N(0, s²/N): |mean| < 5·s/√N fails with probability 6e-7. The sample variance S² has
#: Var(S²) = 2s⁴/(N - 1), and for N this large it is normal: |S²/s² - 1| < 5·√(2/(N - 1)) fails with the same
#: probability. Two leaves' draws (and two steps') are independent: their sample correlation is within 5/√N. The
#: keys are fixed, so the test is deterministic; the bounds say it is not tuned to them.
NOISE_STEPS, NOISE_SIZE, BATCH, CLIP, SIGMA = 50, 4000, 8, 0.7, 1.3


def test_the_noise_has_the_mean_and_standard_deviation_of_the_formula():
    opt = ux.differentially_private_aggregate(CLIP, SIGMA, key=2024)
    zeros = {"a": jnp.zeros((BATCH, NOISE_SIZE)), "b": [jnp.zeros((BATCH, 40, NOISE_SIZE // 40))]}
    params = jax.tree.map(lambda x: x[0], zeros)
    state, step = opt.init(params), jax.jit(opt.update)
    a, b = [], []
    for _ in range(NOISE_STEPS):
        u, state = step(zeros, state, params)
        a.append(np.asarray(u["a"], np.float64))
        b.append(np.asarray(u["b"][0], np.float64).ravel())
    a, b = np.stack(a), np.stack(b)
    s = SIGMA * CLIP / BATCH
    for draws in (a.ravel(), b.ravel()):
        n = draws.size
        assert abs(draws.mean()) < 5 * s / np.sqrt(n)
        assert abs(draws.var(ddof=1) / s**2 - 1) < 5 * np.sqrt(2 / (n - 1))
    n = a.size
    assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 5 / np.sqrt(n)
    assert abs(np.corrcoef(a[:-1].ravel(), a[1:].ravel())[0, 1]) < 5 / np.sqrt(n)


def test_the_noise_is_added_to_the_clipped_sum_and_the_key_decides_it():
    opt = ux.differentially_private_aggregate(1.5, 1.0, key=3)
    quiet = ux.differentially_private_aggregate(1.5, 0.0, key=3)
    params = nested_tree(seed=0)
    grads, zeros = examples(0), jax.tree.map(jnp.zeros_like, examples(0))
    noisy, state = opt.update(grads, opt.init(params), params)
    noise, _ = opt.update(zeros, opt.init(params), params)
    clean, _ = quiet.update(grads, quiet.init(params), params)
    _assert_trees_close(noisy, jax.tree.map(jnp.add, clean, noise), "noisy = clean + noise")
    again, again_state = opt.update(grads, opt.init(params), params)
    for x, y in zip(jax.tree.leaves((noisy, state)), jax.tree.leaves((again, again_state))):
        np.testing.assert_array_equal(x, y)  # same key, same numbers
    for key in [4, jax.random.key(3), jax.random.key_data(jax.random.key(3))]:
        other = ux.differentially_private_aggregate(1.5, 1.0, key=key)
        out, _ = other.update(grads, other.init(params), params)
        same = all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(out), jax.tree.leaves(noisy)))
        assert same == (not isinstance(key, int)), key  # the seed 3 as a key or key data is the same key
    second, _ = opt.update(grads, state, params)
    assert not np.array_equal(second["dense"]["w"], noisy["dense"]["w"])  # a new draw on every step


def test_private_aggregate_refuses_complex_updates_and_bad_options_by_name():
    opt = ux.differentially_private_aggregate()
    grads = {"w": jnp.ones((2, 3), jnp.complex64)}
    with pytest.raises(TypeError, match=r"^differentially_private_aggregate: complex updates are not supported"):
        opt.update(grads, opt.init({"w": jnp.ones(3, jnp.complex64)}))
    with pytest.raises(ValueError, match=r"^differentially_private_aggregate\(noise_multiplier=-0.5\)"):
        ux.differentially_private_aggregate(noise_multiplier=-0.5)
    with pytest.raises(ValueError, match=r"^differentially_private_aggregate\(key=-1\)"):
        ux.differentially_private_aggregate(key=-1)
    with pytest.raises(TypeError, match=r"^dpsgd\(nesterov=1\)"):
        ux.optimizers.dpsgd(nesterov=1)


def test_dpsgd_is_its_pipeline_and_prints_it():
    opt = ux.optimizers.dpsgd(0.1, l2_norm_clip=2.0, noise_multiplier=0.5, key=9, momentum=0.9, nesterov=True)
    assert opt == ux.differentially_private_aggregate(2.0, 0.5, key=9).trace(0.9, nesterov=True) \
        .scale_by_learning_rate(0.1)
    assert repr(ux.optimizers.dpsgd(0.1)) == ("differentially_private_aggregate(l2_norm_clip=1.0, noise_multiplier=1.0, "
                                              "key=0) |> scale_by_learning_rate(learning_rate=0.1)")
