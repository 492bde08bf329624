"""ADOPT, AdEMAMix and simplified AdEMAMix: parity with optax.contrib over 20 jitted steps, the paper's ADOPT in
float64 NumPy, schedules for the paper's warm-ups, complex updates, validation and state paths.

optax 0.2.8's three rules are the papers' (ADOPT's clipping bound is ``t^(1/4)`` at the t-th update, as in the
paper; the authors' PyTorch code counts the initialising call too): every case is compared with optax, and
ADOPT also with a float64 transcription of the paper's Algorithm 2.
"""

from __future__ import annotations

import math

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
N_STEPS = 20


def _matrices(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def _grads(t):
    """Step ``t``'s gradients: a fresh nested tree, scaled by a factor that varies with the step."""
    return jax.tree.map(lambda g: g * (1.0 + 0.5 * np.sin(t)), nested_tree(seed=t + 1))


def _paper_alpha(count):
    """The paper's alpha warm-up (its ``alpha_scheduler``): linear from 0 to 5 over 10 steps."""
    return jnp.minimum(count.astype(jnp.float32) * 5.0 / 10.0, 5.0)


def _paper_b3(count):
    """The paper's b3 warm-up (its ``beta3_scheduler``) from b1 = 0.9 to b3 = 0.999 over 10 steps."""
    f = jnp.minimum(count.astype(jnp.float32) / 10.0, 1.0)
    start, end = math.log(0.9), math.log(0.999)
    return jnp.minimum(jnp.exp(start * end / ((1 - f) * end + f * start)), 0.999)


def _adopt_clip(count):
    return 0.5 + 0.1 * count.astype(jnp.float32)


#: ADOPT's default b2 as optax uses it (see the cases below).
B2_F32 = np.float32(0.9999)

CASES = [
    ("scale_by_adopt", lambda: ux.scale_by_adopt(b1=0.8, b2=0.95, eps=1e-6),
     lambda: optax.contrib.scale_by_adopt(b1=0.8, b2=0.95, eps=1e-6)),
    ("scale_by_adopt_nesterov", lambda: ux.scale_by_adopt(b1=0.8, b2=0.95, eps=1e-6, nesterov=True),
     lambda: optax.contrib.scale_by_adopt(b1=0.8, b2=0.95, eps=1e-6, nesterov=True)),
    ("scale_by_adopt_unclipped", lambda: ux.scale_by_adopt(b1=0.8, b2=0.5, eps=1e-3, use_clipping=False),
     lambda: optax.contrib.scale_by_adopt(b1=0.8, b2=0.5, eps=1e-3, use_clipping=False)),
    ("scale_by_adopt_clip_schedule", lambda: ux.scale_by_adopt(b1=0.8, b2=0.95, clip_value=_adopt_clip),
     lambda: optax.contrib.scale_by_adopt(b1=0.8, b2=0.95, clip_value_fn=_adopt_clip)),
    # optax's ADOPT makes b2 a float32 array (jnp.where(count > 0, b2, 0)), so its 1 - b2 is 1 - float32(0.9999),
    # 1.7e-4 away from 1e-4 relatively; with a Python 0.9999 ours is the exact one. Given the float32 b2, the two
    # agree to rounding.
    ("scale_by_adopt_clip_number", lambda: ux.scale_by_adopt(b2=B2_F32, clip_value=0.7),
     lambda: optax.contrib.scale_by_adopt(clip_value_fn=lambda count: 0.7)),
    ("adopt", lambda: O.adopt(0.05, b2=B2_F32), lambda: optax.contrib.adopt(0.05)),
    ("scale_by_ademamix", lambda: ux.scale_by_ademamix(b1=0.8, b2=0.95, b3=0.99, alpha=3.0, eps=1e-7, eps_root=1e-9),
     lambda: optax.contrib.scale_by_ademamix(b1=0.8, b2=0.95, b3=0.99, alpha=3.0, eps=1e-7, eps_root=1e-9)),
    ("scale_by_ademamix_warmups", lambda: ux.scale_by_ademamix(b1=0.9, b2=0.95, b3=_paper_b3, alpha=_paper_alpha),
     lambda: optax.contrib.scale_by_ademamix(b1=0.9, b2=0.95, b3=_paper_b3, alpha=_paper_alpha)),
    ("scale_by_ademamix_linear_schedule",
     lambda: ux.scale_by_ademamix(alpha=ux.schedules.linear_schedule(0.0, 5.0, transition_steps=10)),
     lambda: optax.contrib.scale_by_ademamix(alpha=optax.linear_schedule(0.0, 5.0, transition_steps=10))),
    ("ademamix", lambda: O.ademamix(0.05), lambda: optax.contrib.ademamix(0.05)),
    ("ademamix_decay_masked", lambda: O.ademamix(0.05, b3=0.99, alpha=8.0, decay=0.1, mask=_matrices),
     lambda: optax.contrib.ademamix(0.05, b3=0.99, alpha=8.0, weight_decay=0.1, mask=_matrices)),
    ("scale_by_simplified_ademamix",
     lambda: ux.scale_by_simplified_ademamix(b1=0.9, b2=0.95, alpha=2.0, eps=1e-7, eps_root=1e-9),
     lambda: optax.contrib.scale_by_simplified_ademamix(b1=0.9, b2=0.95, alpha=2.0, eps=1e-7, eps_root=1e-9)),
    ("scale_by_simplified_ademamix_alpha_schedule",
     lambda: ux.scale_by_simplified_ademamix(alpha=_paper_alpha),
     lambda: optax.contrib.scale_by_simplified_ademamix(alpha=_paper_alpha)),
    ("simplified_ademamix", lambda: O.simplified_ademamix(1e-3),
     lambda: optax.contrib.simplified_ademamix(1e-3)),
    ("simplified_ademamix_decay_masked",
     lambda: O.simplified_ademamix(1e-3, alpha=1.0, decay=0.1, mask=_matrices),
     lambda: optax.contrib.simplified_ademamix(1e-3, alpha=1.0, weight_decay=0.1, mask=_matrices)),
]


@pytest.mark.parametrize("ours, theirs", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parity_with_optax_over_20_jitted_steps(ours, theirs):
    opt, ref = ours(), theirs()
    params = nested_tree(seed=0)
    p1 = p2 = params
    s1, s2 = opt.init(params), ref.init(params)
    step1, step2 = jax.jit(opt.update), jax.jit(ref.update)
    for t in range(N_STEPS):
        grads = _grads(t)
        u1, s1 = step1(grads, s1, p1)
        u2, s2 = step2(grads, s2, p2)
        assert jax.tree.structure(u1) == jax.tree.structure(grads)
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL, err_msg=f"step {t}")
        p1, p2 = ux.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    for x, y in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------
# ADOPT as the paper writes it


def _paper_adopt(grads, b1, b2, eps, clip, nesterov=False):
    """Algorithm 2 of the paper in float64 (with the revised version's clipping ``clip(t)``, None for none):
    v0 = g0², m0 = 0; then m_t = b1·m + (1-b1)·clip(g_t / max(sqrt(v), eps)), v_t = b2·v + (1-b2)·|g_t|²."""
    out, m, v = [np.zeros_like(grads[0])], np.zeros_like(grads[0]), np.abs(grads[0]) ** 2
    for t, g in enumerate(grads[1:], start=1):
        normed = g / np.maximum(np.sqrt(v), eps)
        if clip is not None:
            size = np.abs(normed)
            normed = np.where(size > clip(t), normed * clip(t) / np.maximum(size, 1e-300), normed)
        m = b1 * m + (1 - b1) * normed
        out.append(b1 * m + (1 - b1) * normed if nesterov else m)
        v = b2 * v + (1 - b2) * np.abs(g) ** 2
    return out


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("clipping", [True, False])
def test_adopt_follows_the_paper_in_float64(clipping, nesterov):
    rng = np.random.default_rng(1)
    # A zero first gradient in one coordinate: the clip (or eps) bounds the step there.
    grads = [rng.normal(size=6) * scale for scale in [1.0, 0.05, 3.0, 0.5, 1.0, 0.02, 2.0, 0.3] * 3]
    grads[0][2] = 0.0
    opt = ux.scale_by_adopt(b1=0.7, b2=0.9, eps=1e-4, use_clipping=clipping, nesterov=nesterov)
    expected = _paper_adopt(grads, 0.7, 0.9, 1e-4, (lambda t: t**0.25) if clipping else None, nesterov)
    state, step = opt.init({"w": jnp.zeros(6)}), jax.jit(opt.update)
    for t, (g, e) in enumerate(zip(grads, expected)):
        u, state = step({"w": jnp.asarray(g, jnp.float32)}, state)
        np.testing.assert_allclose(u["w"], e, rtol=RTOL, atol=ATOL, err_msg=f"step {t}")


def test_adopt_clips_the_modulus_of_complex_updates():
    rng = np.random.default_rng(2)
    grads = [(rng.normal(size=4) + 1j * rng.normal(size=4)) * s for s in [0.1, 1.0, 3.0, 0.5, 2.0, 1.0]]
    opt = ux.scale_by_adopt(b1=0.5, b2=0.9, eps=1e-6)
    expected = _paper_adopt(grads, 0.5, 0.9, 1e-6, lambda t: t**0.25)
    state = opt.init({"w": jnp.zeros(4, jnp.complex64)})
    for t, (g, e) in enumerate(zip(grads, expected)):
        u, state = opt.update({"w": jnp.asarray(g, jnp.complex64)}, state)
        assert u["w"].dtype == jnp.complex64
        np.testing.assert_allclose(u["w"], e, rtol=RTOL, atol=ATOL, err_msg=f"step {t}")


def test_adopt_first_step_only_measures_even_with_zero_eps_and_no_clipping():
    opt = ux.optimizers.adopt(0.1, eps=0.0, use_clipping=False)
    params = {"w": jnp.asarray([1.0, -2.0])}
    u, state = opt.update({"w": jnp.asarray([0.0, 3.0])}, opt.init(params), params)
    np.testing.assert_array_equal(u["w"], [0.0, 0.0])
    np.testing.assert_array_equal(opt.get_state(state, "scale_by_adopt.nu")["w"], [0.0, 9.0])
    assert int(opt.get_state(state, "scale_by_adopt.count")) == 1


# --------------------------------------------------------------------------
# Structure, dtypes, validation


def test_optimizers_equal_their_explicit_pipelines():
    lr = 0.05
    assert O.adopt(lr, clip_value=0.5) == ux.scale_by_adopt(clip_value=0.5).scale_by_learning_rate(lr)
    assert O.ademamix(lr, decay=1e-2) == ux.scale_by_ademamix().add_decayed_weights(1e-2).scale_by_learning_rate(lr)
    assert O.simplified_ademamix(lr, alpha=1.0) == (
        ux.scale_by_simplified_ademamix(alpha=1.0).add_decayed_weights(0.0).scale_by_learning_rate(lr))


def test_states_are_named():
    params = {"w": jnp.zeros((2, 3), jnp.bfloat16)}
    opt = ux.scale_by_ademamix(mu_dtype=jnp.bfloat16)
    state = opt.init(params)
    assert type(state[0]).__name__ == "ScaleByAdemamixState"
    assert state[0]._fields == ("mu_fast", "mu_slow", "nu", "count")
    assert opt.get_state(state, "scale_by_ademamix.mu_slow")["w"].dtype == jnp.bfloat16
    assert opt.get_state(state, "scale_by_ademamix.nu")["w"].dtype == jnp.float32
    for opt in [ux.scale_by_adopt(), ux.scale_by_simplified_ademamix()]:
        assert opt.init(params)[0]._fields == ("mu", "nu", "count")


def test_scheduled_options_are_readable_from_the_state():
    opt = ux.scale_by_ademamix(alpha=_paper_alpha, b3=_paper_b3)
    params = {"w": jnp.zeros(2)}
    state = opt.init(params)
    for _ in range(4):
        _, state = opt.update({"w": jnp.ones(2)}, state)
    np.testing.assert_allclose(opt.get_state(state, "scale_by_ademamix.alpha"), _paper_alpha(jnp.asarray(3)))
    np.testing.assert_allclose(opt.get_state(state, "scale_by_ademamix.b3"), _paper_b3(jnp.asarray(3)))


@pytest.mark.parametrize("build, message", [
    (lambda: ux.scale_by_adopt(b2=1.0), r"^scale_by_adopt\(b2=1\.0\): b2 must be in \[0, 1\)"),
    (lambda: ux.scale_by_adopt(clip_value=0.0), r"^scale_by_adopt\(clip_value=0\.0\): clip_value must be in \(0, "),
    (lambda: ux.scale_by_adopt(eps=-1.0), r"^scale_by_adopt\(eps=-1\.0\): eps must be in \[0, "),
    (lambda: ux.scale_by_ademamix(b3=1.5), r"^scale_by_ademamix\(b3=1\.5\): b3 must be in \[0, 1\)"),
    (lambda: ux.scale_by_ademamix(alpha=-1.0), r"^scale_by_ademamix\(alpha=-1\.0\): alpha must be in \[0, "),
    (lambda: ux.scale_by_simplified_ademamix(b1=1.0), r"^scale_by_simplified_ademamix\(b1=1\.0\): b1 must be in"),
    (lambda: O.ademamix(mu_dtype="int32"), r"^scale_by_ademamix\(mu_dtype='int32'\): mu_dtype must be None or"),
])
def test_options_are_validated_at_construction(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_flags_are_validated():
    with pytest.raises(TypeError, match=r"^scale_by_adopt\(use_clipping=1\): use_clipping must be True or False"):
        ux.scale_by_adopt(use_clipping=1)


def test_low_precision_params_keep_their_dtype_and_float32_moments():
    params = {"w": jnp.ones((2, 2), jnp.bfloat16), "s": jnp.asarray(1.0, jnp.float16)}
    for opt in [O.adopt(), O.ademamix(), O.simplified_ademamix()]:
        state = opt.init(params)
        for _ in range(3):
            updates, state = jax.jit(opt.update)(params, state, params)
        assert [u.dtype for u in jax.tree.leaves(updates)] == [jnp.float16, jnp.bfloat16]
        moments = [x for x in jax.tree.leaves(state) if x.ndim > 0]
        assert moments and all(x.dtype == jnp.float32 for x in moments)


# --------------------------------------------------------------------------
# LaProp: not in optax 0.2.8; a float64 transcription of the paper's Algorithm 1


def _paper_laprop(grads, lr, b1, b2, eps, decay, x):
    """Ziyin et al., Algorithm 1, float64, with decoupled weight decay lr·decay·x (the authors' code's)."""
    m, v, out = np.zeros_like(x), np.zeros_like(x), []
    for t, g in enumerate(grads, start=1):
        v = b2 * v + (1 - b2) * g * g
        m = b1 * m + (1 - b1) * g / (np.sqrt(v / (1 - b2**t)) + eps)
        x = x - lr * (m / (1 - b1**t) + decay * x)
        out.append(x)
    return out


@pytest.mark.parametrize("b1, b2, eps, decay", [(0.9, 0.999, 1e-15, 0.0), (0.5, 0.9, 1e-4, 0.1), (0.99, 0.5, 0.0, 0.0)])
def test_laprop_follows_the_paper_over_20_steps_on_a_nested_tree(b1, b2, eps, decay):
    params = nested_tree(seed=0)
    grads = [_grads(t) for t in range(N_STEPS)]
    opt = O.laprop(0.05, b1=b1, b2=b2, eps=eps, decay=decay)
    state, step, p = opt.init(params), jax.jit(opt.update), params
    leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(params)]
    expected = [_paper_laprop([np.asarray(jax.tree.leaves(g)[i], np.float64) for g in grads], 0.05, b1, b2, eps,
                              decay, x) for i, x in enumerate(leaves)]
    for t, g in enumerate(grads):
        u, state = step(g, state, p)
        p = ux.apply_updates(p, u)
        for i, x in enumerate(jax.tree.leaves(p)):
            np.testing.assert_allclose(x, expected[i][t], rtol=1e-5, atol=1e-5, err_msg=f"step {t}")


def test_laprop_with_no_momentum_is_rmsprop_bias_corrected_with_eps_outside():
    """b1 = 0: the update is g / (sqrt(v / (1 - b2^t)) + eps), optax's rmsprop(eps_in_sqrt=False,
    bias_correction=True)."""
    opt = ux.scale_by_laprop(b1=0.0, b2=0.9, eps=1e-6)
    ref = optax.scale_by_rms(decay=0.9, eps=1e-6, eps_in_sqrt=False, bias_correction=True)
    params = nested_tree(seed=0)
    s1, s2 = opt.init(params), ref.init(params)
    for t in range(N_STEPS):
        u1, s1 = opt.update(_grads(t), s1)
        u2, s2 = ref.update(_grads(t), s2)
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL, err_msg=f"step {t}")


def test_laprop_leaves_a_zero_update_zero_without_eps():
    opt = ux.scale_by_laprop(b1=0.9, b2=0.99, eps=0.0)
    state = opt.init({"w": jnp.zeros(2)})
    for g in ([0.0, 1.0], [0.0, -1.0]):
        u, state = opt.update({"w": jnp.array(g)}, state)
        assert np.all(np.isfinite(u["w"])) and float(u["w"][0]) == 0.0


def test_laprop_equals_its_pipeline_and_names_its_state():
    assert O.laprop(0.1, decay=0.01) == ux.scale_by_laprop().add_decayed_weights(0.01).scale_by_learning_rate(0.1)
    opt = O.laprop(0.1)
    state = opt.init({"w": jnp.zeros(2)})
    assert int(opt.get_state(state, "scale_by_laprop.count")) == 0
    with pytest.raises(ValueError, match=r"scale_by_laprop\(b1=1.0\): b1 must be in \[0, 1\)"):
        ux.scale_by_laprop(b1=1.0)


# --------------------------------------------------------------------------
# ACProp: optax 0.2.8's documented rule in float64, and optax's numbers through the identity that relates its
# code (centred on the previous momentum) to its documentation (centred on the new one)


def _documented_acprop(grads, b1, b2, eps, eps_root):
    """optax.contrib.acprop's documented rule (and the paper's centring), float64: g / (sqrt(s_(t-1) / (1 -
    b2^(t-1))) + eps), with s centred on the new momentum; the missing first second moment taken as 1 (optax's)."""
    m, s, out = np.zeros_like(grads[0]), np.zeros_like(grads[0]), []
    for t, g in enumerate(grads, start=1):
        out.append(g / (1 + eps) if t == 1 else g / (np.sqrt(s / (1 - b2 ** (t - 1))) + eps))
        m = b1 * m + (1 - b1) * g
        s = b2 * s + (1 - b2) * (g - m) ** 2 + eps_root
    return out


@pytest.mark.parametrize("b1, b2, eps, eps_root", [(0.9, 0.999, 1e-16, 1e-16), (0.5, 0.9, 1e-3, 1e-4),
                                                   (0.3, 0.5, 0.0, 0.0)])
def test_acprop_follows_the_documented_rule_over_20_steps_on_a_nested_tree(b1, b2, eps, eps_root):
    grads = [_grads(t) for t in range(N_STEPS)]
    opt = ux.scale_by_acprop(b1=b1, b2=b2, eps=eps, eps_root=eps_root)
    state, step = opt.init(nested_tree(seed=0)), jax.jit(opt.update)
    expected = [_documented_acprop([np.asarray(jax.tree.leaves(g)[i], np.float64) for g in grads], b1, b2, eps,
                                   eps_root) for i in range(len(jax.tree.leaves(grads[0])))]
    for t, g in enumerate(grads):
        u, state = step(g, state)
        for i, x in enumerate(jax.tree.leaves(u)):
            np.testing.assert_allclose(x, expected[i][t], rtol=1e-4, atol=1e-6, err_msg=f"step {t}")


@pytest.mark.parametrize("b1, b2, eps", [(0.9, 0.999, 1e-8), (0.5, 0.9, 1e-3)])
def test_acprop_is_optax_through_its_centring_identity(b1, b2, eps):
    """g - m_new = b1·(g - m_old): with eps_root = 0, optax 0.2.8's s is updax's over b1², so from the second step
    optax's steps with eps/b1 are updax's times b1; the first is g / (1 + eps) on both sides, with each one's eps."""
    opt = ux.scale_by_acprop(b1=b1, b2=b2, eps=eps, eps_root=0.0)
    ref = optax.contrib.scale_by_acprop(b1=b1, b2=b2, eps=eps / b1, eps_root=0.0)
    params = nested_tree(seed=0)
    s1, s2 = opt.init(params), ref.init(params)
    step1, step2 = jax.jit(opt.update), jax.jit(ref.update)
    for t in range(N_STEPS):
        u1, s1 = step1(_grads(t), s1)
        u2, s2 = step2(_grads(t), s2)
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            if t == 0:
                np.testing.assert_allclose(x * (1 + eps), y * (1 + eps / b1), rtol=RTOL, atol=ATOL)
            else:
                np.testing.assert_allclose(b1 * x, y, rtol=RTOL, atol=ATOL, err_msg=f"step {t}")
    for x, y in zip(jax.tree.leaves(opt.get_state(s1, "scale_by_acprop.nu")), jax.tree.leaves(s2.nu)):
        np.testing.assert_allclose(x, b1**2 * y, rtol=RTOL, atol=1e-12)


def test_acprop_optimizer_is_optaxs_pipeline():
    """optax.contrib.acprop = scale_by_acprop |> add_decayed_weights |> scale_by_learning_rate, here too: at
    b1 = 0.5, eps_root = 0 and eps = 0 the two rules differ by the factor b1 alone (see the identity above)."""
    assert O.acprop(0.1, decay=0.01) == ux.scale_by_acprop().add_decayed_weights(0.01).scale_by_learning_rate(0.1)
    opt = O.acprop(0.05, b1=0.5, b2=0.9, eps=0.0, eps_root=0.0, decay=0.0)
    ref = optax.contrib.acprop(0.05, b1=0.5, b2=0.9, eps=0.0, eps_root=0.0, weight_decay=0.0)
    params = nested_tree(seed=0)
    s1, s2 = opt.init(params), ref.init(params)
    for t in range(N_STEPS):
        u1, s1 = opt.update(_grads(t), s1, params)
        u2, s2 = ref.update(_grads(t), s2, params)
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            np.testing.assert_allclose(x if t == 0 else 0.5 * x, y, rtol=RTOL, atol=ATOL, err_msg=f"step {t}")


def test_acprop_first_update_is_the_update_without_eps_and_a_zero_history_stays_zero():
    opt = ux.scale_by_acprop(b1=0.9, b2=0.99, eps=0.0, eps_root=0.0)
    state = opt.init({"w": jnp.zeros(3)})
    u, state = opt.update({"w": jnp.array([1.0, -2.0, 0.0])}, state)
    np.testing.assert_array_equal(u["w"], [1.0, -2.0, 0.0])
    u, state = opt.update({"w": jnp.array([1.0, 1.0, 0.0])}, state)
    assert np.all(np.isfinite(u["w"])) and float(u["w"][2]) == 0.0
