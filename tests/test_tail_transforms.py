"""optax's smaller transforms and wrappers: parity with optax 0.2.8 over 20+ steps on nested trees, and closed forms.

Oracles: optax.transforms.conditionally_mask / conditionally_transform, optax.apply_every,
optax.transforms.selective_transform, optax.monitor / optax.measure_with_ema (their measurements read with
optax.tree.get), and NumPy float64 where optax has no such option (a monitor's measures of the params).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from registry import nested_tree

import updax as ux

O = ux.optimizers
RTOL, ATOL = 2e-5, 1e-6
STEPS = 24


def _close(actual, expected, what, rtol=RTOL, atol=ATOL):
    assert jax.tree.structure(actual) == jax.tree.structure(expected), what
    for (path, a), e in zip(jax.tree_util.tree_flatten_with_path(actual)[0], jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol,
                                   err_msg=f"{what}{jax.tree_util.keystr(path)}")


def _grads(t):
    factor = 1.0 + 0.5 * np.sin(t)
    return jax.tree.map(lambda g: g * factor, nested_tree(seed=t + 1))


def _run_both(ux_opt, ox_opt, check=None, params=None, jit=True):
    """Both over STEPS steps from the same params, the updates applied; their updates must agree at every step."""
    p1 = p2 = nested_tree(seed=0) if params is None else params
    s1, s2 = ux_opt.init(p1), ox_opt.init(p2)
    step1, step2 = (jax.jit(ux_opt.update), jax.jit(ox_opt.update)) if jit else (ux_opt.update, ox_opt.update)
    for t in range(STEPS):
        g = _grads(t)
        u1, s1 = step1(g, s1, p1)
        u2, s2 = step2(g, s2, p2)
        _close(u1, u2, f"updates, step {t + 1}")
        p1, p2 = ux.apply_updates(p1, u1), optax.apply_updates(p2, u2)
        if check is not None:
            check(t, s1, s2)
    return s1, s2


# --------------------------------------------------------------------------
# conditionally_mask and conditionally_transform


def _every_third(step):
    return step % 3 == 1


@pytest.mark.parametrize("wrapper", ["conditionally_mask", "conditionally_transform"])
def test_conditional_wrappers_match_optax_over_24_steps(wrapper):
    ux_opt = getattr(O.adam(0.05, b1=0.8, eps_root=0.0), wrapper)(_every_third)
    ox_opt = getattr(optax.transforms, wrapper)(optax.adam(0.05, b1=0.8), _every_third)

    def check(t, s1, s2):
        assert int(ux_opt.get_state(s1, f"{wrapper}.step")) == int(s2.step) == t + 1
        _close(ux_opt.get_state(s1, f"{wrapper}/scale_by_adam.mu"), s2.inner_state[0].mu, f"mu, step {t + 1}")
        assert int(ux_opt.get_state(s1, f"{wrapper}/scale_by_adam.count")) == int(s2.inner_state[0].count)

    _run_both(ux_opt, ox_opt, check)


def test_conditionally_transform_passes_the_updates_and_keeps_the_state_bit_for_bit():
    opt = ux.scale_by_adam().scale(-0.1).conditionally_transform(lambda step: step == 0)
    g = nested_tree(seed=3)
    state = opt.init(g)
    _, state = opt.update(g, state)
    kept = opt.get_state(state, "conditionally_transform/scale_by_adam")
    u, state = opt.update(g, state)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), u, g))
    after = opt.get_state(state, "conditionally_transform/scale_by_adam")
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), kept, after))


def test_conditionally_mask_forwards_extra_args_to_its_function():
    opt = ux.scale(-1.0).conditionally_mask(lambda step, loss: loss < 1.0, forward_extra_args=True)
    g = {"w": jnp.ones(2)}
    state = opt.init(g)
    high, state = opt.update(g, state, loss=jnp.asarray(2.0))
    low, state = opt.update(g, state, loss=jnp.asarray(0.5))
    np.testing.assert_array_equal(high["w"], [0.0, 0.0])
    np.testing.assert_array_equal(low["w"], [-1.0, -1.0])


@pytest.mark.parametrize("returned", [jnp.ones(2, bool), jnp.asarray(1.0), "yes"])
def test_conditional_wrappers_refuse_a_function_that_returns_no_bool_scalar(returned):
    opt = ux.scale(-1.0).conditionally_mask(lambda step: returned)
    with pytest.raises(TypeError, match=r"conditionally_mask\(should_transform_fn\(\.\.\.\)="):
        opt.update({"w": jnp.ones(2)}, opt.init({"w": jnp.ones(2)}))
    with pytest.raises(TypeError, match="conditionally_transform.*must be callable"):
        ux.scale(-1.0).conditionally_transform(3)


# --------------------------------------------------------------------------
# apply_every


@pytest.mark.parametrize("k", [1, 3, 4])
def test_apply_every_matches_optax_over_24_steps(k):
    ux_opt = ux.scale_by_adam(b1=0.8, eps_root=0.0).apply_every(k).scale(-0.05)
    ox_opt = optax.chain(optax.scale_by_adam(b1=0.8), optax.apply_every(k), optax.scale(-0.05))

    def check(t, s1, s2):
        assert int(ux_opt.get_state(s1, "apply_every.count")) == int(s2[1].count)

    _run_both(ux_opt, ox_opt, check)


def test_apply_every_emits_the_sum_every_kth_call():
    opt = ux.apply_every(3)
    grads = [nested_tree(seed=s) for s in range(6)]
    state = opt.init(grads[0])
    for t, g in enumerate(grads):
        u, state = opt.update(g, state)
        expected = (jax.tree.map(lambda *xs: sum(np.asarray(x, np.float64) for x in xs), *grads[t - 2:t + 1])
                    if t % 3 == 2 else jax.tree.map(np.zeros_like, g))
        _close(u, expected, f"call {t + 1}")


# --------------------------------------------------------------------------
# selective_transform


@pytest.mark.parametrize("kind", ["tree", "all", "none"])
def test_selective_transform_matches_optax_over_24_steps(kind):
    params = nested_tree(seed=0)
    mask = {"tree": jax.tree.map(lambda p: p.ndim >= 2, params), "all": True, "none": False}[kind]
    ux_opt = O.adam(0.05, b1=0.8, eps_root=0.0).selective_transform(mask)
    ox_opt = optax.transforms.selective_transform(optax.adam(0.05, b1=0.8), freeze_mask=mask)
    s1, _ = _run_both(ux_opt, ox_opt, params=params)
    mu = ux_opt.get_state(s1, "selective_transform/scale_by_adam.mu")  # state for the trained leaves only
    frozen = jax.tree.map(lambda p: mask, params) if isinstance(mask, bool) else mask
    expected = jax.tree.map(lambda p, m: None if m else p.shape, params, frozen)
    assert jax.tree.map(jnp.shape, mu) == expected


def test_selective_transform_refuses_a_mask_that_is_not_one():
    with pytest.raises(TypeError, match="selective_transform.*freeze_mask"):
        ux.scale(-1.0).selective_transform({"w": "yes"})


# --------------------------------------------------------------------------
# monitor and measure_with_ema


def test_monitor_and_measure_with_ema_match_optax_over_24_steps():
    ux_measures = {"norm": ux.global_norm, "norm_ema": ux.measure_with_ema(ux.global_norm, 0.9),
                   "raw": ux.measure_with_ema(ux.global_norm, 0.7, debias=False)}
    ox_measures = {"norm": optax.tree.norm, "norm_ema": optax.measure_with_ema(optax.tree.norm, 0.9),
                   "raw": optax.measure_with_ema(optax.tree.norm, 0.7, debias=False)}
    ux_opt = O.sgd(0.1, momentum=0.9).monitor(ux_measures).clip_by_global_norm(1.0)
    ox_opt = optax.chain(optax.sgd(0.1, momentum=0.9), optax.monitor(ox_measures), optax.clip_by_global_norm(1.0))

    def check(t, s1, s2):
        measured = ux_opt.get_state(s1, "monitor.measurements")
        for name in ux_measures:
            _close(measured[name], s2[1].measurements[name], f"{name}, step {t + 1}")

    _run_both(ux_opt, ox_opt, check)


def test_monitor_reads_update_and_param_norms_and_their_ratio_by_path():
    def norms(updates, params):
        u, p = ux.global_norm(updates), ux.global_norm(params)
        return {"update": u, "param": p, "ratio": u / p}

    opt = O.adam(0.1).monitor({"norms": norms, "ratio_ema": ux.measure_with_ema(lambda u, p: norms(u, p)["ratio"],
                                                                               0.8)}, with_params=True)
    params = nested_tree(seed=0)
    state = opt.init(params)
    ratios = []
    for t in range(STEPS):
        updates, state = jax.jit(opt.update)(_grads(t), state, params)
        u = np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in jax.tree.leaves(updates)))
        p = np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in jax.tree.leaves(params)))
        ratios.append(u / p)
        measured = opt.get_state(state, "monitor.measurements")
        _close(measured["norms"], {"param": p, "ratio": u / p, "update": u}, f"step {t + 1}")
        weights = 0.2 * 0.8 ** np.arange(t, -1, -1)
        _close(measured["ratio_ema"], np.dot(weights, ratios) / (1 - 0.8 ** (t + 1)), f"ema, step {t + 1}")
        params = ux.apply_updates(params, updates)
    with pytest.raises(ValueError, match="monitor needs params"):
        opt.update(_grads(0), state)


def test_monitor_refuses_measures_that_are_not_a_dict_of_measures():
    with pytest.raises(TypeError, match=r"monitor\(measures="):
        ux.monitor([ux.global_norm])
    with pytest.raises(TypeError, match=r"monitor\(measures="):
        ux.monitor({"a": 3})
    with pytest.raises(ValueError, match=r"measure_with_ema\(decay=1.5\)"):
        ux.measure_with_ema(ux.global_norm, 1.5)


# --------------------------------------------------------------------------
# normalize_by_update_norm, scale_by_param_block_norm, unitwise_clip, per_example_layer_norm_clip


@pytest.mark.parametrize("scale_factor, eps", [(1.0, 1e-6), (-0.05, 0.0), (0.3, 0.5)])
def test_normalize_by_update_norm_matches_optax_over_24_steps(scale_factor, eps):
    _run_both(ux.normalize_by_update_norm(scale_factor, eps), optax.normalize_by_update_norm(scale_factor, eps))


def test_normalize_by_update_norm_leaves_a_zero_update_at_zero():
    opt = ux.normalize_by_update_norm(1.0, 1e-6)
    u, _ = opt.update({"w": jnp.zeros(3)}, opt.init(None))
    np.testing.assert_array_equal(u["w"], np.zeros(3))


@pytest.mark.parametrize("min_scale", [1e-3, 0.5])
def test_scale_by_param_block_norm_matches_optax_over_24_steps(min_scale):
    ux_opt = ux.scale_by_adam(eps_root=0.0).scale_by_param_block_norm(min_scale).scale(-0.05)
    ox_opt = optax.chain(optax.scale_by_adam(), optax.scale_by_param_block_norm(min_scale), optax.scale(-0.05))
    params = jax.tree.map(lambda p: p * 0.1, nested_tree(seed=0))  # small blocks: min_scale binds on some
    _run_both(ux_opt, ox_opt, params=params)


def test_scale_by_param_block_norm_is_the_rms_times_the_root_of_the_size():
    params, grads = nested_tree(seed=4), nested_tree(seed=5)
    by_norm = ux.scale_by_param_block_norm(0.0).update(grads, (ux.EmptyState(),), params)[0]
    by_rms = ux.scale_by_param_block_rms(0.0).update(grads, (ux.EmptyState(),), params)[0]
    _close(by_norm, jax.tree.map(lambda r, p: r * np.sqrt(p.size), by_rms, params), "norm = rms·√n")


def test_unitwise_clip_matches_optax_and_the_rule_in_float64():
    rng = np.random.default_rng(0)
    for shape, axis in [((3, 4), 0), ((2, 2, 3, 5), (0, 1, 2)), ((6,), None)]:
        g = jnp.asarray(rng.normal(size=shape), jnp.float32)
        norms = jnp.sqrt(jnp.sum(g * g, axis=axis, keepdims=True)) * jnp.ones_like(g)
        for bound in (0.0, 0.5, 1.0, 10.0):
            max_norm = jnp.full_like(g, bound)
            ours = ux.unitwise_clip(norms, max_norm, g)
            np.testing.assert_allclose(ours, optax.transforms.unitwise_clip(norms, max_norm, g), rtol=1e-6)
            n64, g64 = np.asarray(norms, np.float64), np.asarray(g, np.float64)
            expected = np.where(n64 < bound, g64, g64 * bound / np.maximum(n64, 1e-6))
            np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-7)
    # the norms may broadcast (one per unit), as with keepdims
    g = jnp.asarray(rng.normal(size=(3, 4)), jnp.float32)
    norms = jnp.linalg.norm(g, axis=0, keepdims=True)
    np.testing.assert_allclose(ux.unitwise_clip(norms, 0.5, g), ux.unitwise_clip(norms * jnp.ones_like(g),
                                                                                  jnp.full_like(g, 0.5), g))
    with pytest.raises(ValueError, match=r"unitwise_clip: g_norm has shape \(3,\), which does not broadcast"):
        ux.unitwise_clip(jnp.ones(3), 1.0, g)
    with pytest.raises(ValueError, match=r"unitwise_clip\(div_eps=0.0\)"):
        ux.unitwise_clip(norms, 1.0, g, div_eps=0.0)


def _examples(t, batch=5):
    """Per-example gradients: a leading axis of examples on every leaf of a nested tree, of several sizes."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *[jax.tree.map(lambda g: g * (0.2 + b), nested_tree(seed=t + b))
                                                     for b in range(batch)])


@pytest.mark.parametrize("uniform", [True, False])
@pytest.mark.parametrize("l2_norm_clip", [0.0, 0.5, 3.0, 1e3])
def test_per_example_layer_norm_clip_matches_optax(l2_norm_clip, uniform):
    opt = ux.per_example_layer_norm_clip(l2_norm_clip, uniform)
    step = jax.jit(opt.update)
    state = opt.init(nested_tree(seed=0))
    for t in range(STEPS):
        grads = _examples(t)
        ours, state = step(grads, state)
        theirs, _ = optax.per_example_layer_norm_clip(jax.tree.leaves(grads), l2_norm_clip, uniform)
        _close(ours, jax.tree.unflatten(jax.tree.structure(grads), theirs), f"step {t + 1}")


def test_per_example_layer_norm_clip_keeps_every_example_within_the_global_bound():
    grads, bound = _examples(0), 1.5
    opt = ux.per_example_layer_norm_clip(bound, uniform=False)
    for b in range(5):  # one example at a time: its clipped gradient's global norm is at most the bound
        one = jax.tree.map(lambda g: g[b:b + 1], grads)
        clipped = opt.update(one, opt.init(None))[0]
        assert float(ux.global_norm(clipped)) <= bound * (1 + 1e-6)
    leaf = {"w": grads["dense"]["w"]}  # one layer: the global clip
    ours = ux.per_example_layer_norm_clip(bound).update(leaf, opt.init(None))[0]
    _close(ours, ux.per_example_clipped_sum(leaf, bound)[0], "one layer")


# --------------------------------------------------------------------------
# Target networks and scale_gradient


def test_incremental_and_periodic_updates_track_a_target_network_as_optax_over_24_steps():
    opt = O.adam(0.05)
    params = nested_tree(seed=0)
    state = opt.init(params)
    soft_ux = soft_ox = hard_ux = hard_ox = jax.tree.map(lambda p: p * 0, params)
    for t in range(STEPS):
        updates, state = opt.update(_grads(t), state, params)
        params = ux.apply_updates(params, updates)
        tau = 0.1 + 0.02 * t  # a schedule's value
        soft_ux = jax.jit(ux.incremental_update)(params, soft_ux, tau)
        soft_ox = optax.incremental_update(params, soft_ox, tau)
        hard_ux = jax.jit(ux.periodic_update, static_argnums=3)(params, hard_ux, jnp.asarray(t + 1), 5)
        hard_ox = optax.periodic_update(params, hard_ox, jnp.asarray(t + 1), 5)
        _close(soft_ux, soft_ox, f"incremental, step {t + 1}")
        _close(hard_ux, hard_ox, f"periodic, step {t + 1}", rtol=0, atol=0)
        if (t + 1) % 5 == 0:
            _close(hard_ux, params, "a copy", rtol=0, atol=0)


def test_target_updates_keep_the_targets_dtypes_and_refuse_what_does_not_fit():
    params = {"w": jnp.ones(2, jnp.float32)}
    target = {"w": jnp.zeros(2, jnp.bfloat16)}
    assert ux.incremental_update(params, target, 0.5)["w"].dtype == jnp.bfloat16
    assert ux.periodic_update(params, target, 0, 3)["w"].dtype == jnp.bfloat16
    with pytest.raises(ValueError, match=r"incremental_update\(step_size=1.5\): step_size must be in \[0, 1\]"):
        ux.incremental_update(params, target, 1.5)
    with pytest.raises(ValueError, match=r"periodic_update\(update_period=0\)"):
        ux.periodic_update(params, target, 1, 0)
    with pytest.raises(ValueError, match=r"periodic_update: new_tensors\['w'\] has shape \(2,\), old_tensors"):
        ux.periodic_update(params, {"w": jnp.zeros(3)}, 1, 2)
    with pytest.raises(TypeError, match=r"periodic_update\(steps=...\): steps must be an integer scalar"):
        ux.periodic_update(params, target, 1.5, 2)
    with pytest.raises(ValueError, match="incremental_update: .*new_tensors"):
        ux.incremental_update(params, {"v": jnp.zeros(2)}, 0.5)


@pytest.mark.parametrize("scale", [0.0, 0.1, -1.0, 3.0])
def test_scale_gradient_matches_optax_and_is_the_identity_forward(scale):
    def loss(scaler, params, t):
        scaled = scaler(params, scale)
        return sum(jnp.sum(jnp.sin(x) * (x - c)) for x, c in zip(jax.tree.leaves(scaled),
                                                                  jax.tree.leaves(nested_tree(seed=t + 1))))

    params = nested_tree(seed=0)
    for t in range(STEPS):
        ours = jax.jit(jax.grad(lambda p: loss(ux.scale_gradient, p, t)))(params)
        theirs = jax.grad(lambda p: loss(optax.scale_gradient, p, t))(params)
        plain = jax.grad(lambda p: loss(lambda x, s: x, p, t))(params)
        _close(ours, theirs, f"optax, step {t + 1}")
        _close(ours, jax.tree.map(lambda g: scale * g, plain), f"s·grad, step {t + 1}")
        params = jax.tree.map(lambda p, g: p - 0.01 * g, params, plain)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), ux.scale_gradient(params, scale),
                                     params))


# --------------------------------------------------------------------------
# split_real_and_imaginary


def _complex_tree(seed):
    """A nested tree with complex leaves, and one real leaf (``scalar``) that passes through as it is."""
    real, imaginary = nested_tree(seed=seed), nested_tree(seed=seed + 50)
    tree = jax.tree.map(lambda x, y: jax.lax.complex(x, y), real, imaginary)
    tree["scalar"] = real["scalar"]
    return tree


def test_split_real_and_imaginary_matches_optax_over_24_steps():
    ux_opt = O.adam(0.05, b1=0.8, eps_root=0.0).split_real_and_imaginary()
    ox_opt = optax.contrib.split_real_and_imaginary(optax.adam(0.05, b1=0.8))
    p1 = p2 = _complex_tree(0)
    s1, s2 = ux_opt.init(p1), ox_opt.init(p2)
    for t in range(STEPS):
        g = jax.tree.map(lambda x: x * (1.0 + 0.5 * np.sin(t)), _complex_tree(t + 1))
        u1, s1 = jax.jit(ux_opt.update)(g, s1, p1)
        u2, s2 = jax.jit(ox_opt.update)(g, s2, p2)
        _close(u1, u2, f"updates, step {t + 1}")
        assert [x.dtype for x in jax.tree.leaves(u1)] == [x.dtype for x in jax.tree.leaves(g)]
        p1, p2 = ux.apply_updates(p1, u1), optax.apply_updates(p2, u2)


def test_split_real_and_imaginary_keeps_a_second_moment_per_part():
    """Adam inside: the real part's step is the real Adam step of the real parts alone, and likewise the imaginary."""
    grads = [_complex_tree(t) for t in range(6)]
    split = ux.scale_by_adam().split_real_and_imaginary()
    state = split.init(grads[0])
    real_state = imag_state = ux.scale_by_adam().init(jax.tree.map(jnp.real, grads[0]))
    for g in grads:
        u, state = split.update(g, state)
        ur, real_state = ux.scale_by_adam().update(jax.tree.map(jnp.real, g), real_state)
        ui, imag_state = ux.scale_by_adam().update(jax.tree.map(jnp.imag, g), imag_state)
        _close(jax.tree.map(jnp.real, u), ur, "real parts")
        _close(jax.tree.map(jnp.imag, u), jax.tree.map(lambda i, g: i if jnp.iscomplexobj(g) else 0 * i, ui, g),
               "imaginary parts")
    mu = split.get_state(state, "split_real_and_imaginary/scale_by_adam.mu")
    assert isinstance(mu["dense"]["w"], tuple) and not isinstance(mu["scalar"], tuple)
