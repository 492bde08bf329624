"""Complex updates: the supported stages match optax or a closed form, the others refuse them by name.

Second moments and norms come from ``|g|² = (g·conj(g)).real``, as in optax,
so norms are real and first moments keep their phase. Every registry entry is
either in SUPPORTED (it must carry the phase of its input) or in REJECTED (its
complex step must raise a TypeError naming the stage and the leaf); a test
keeps the two sets a partition of the registry.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import updax as ux
from registry import ENTRIES, NEEDS_PARAMS, updates_for

RTOL, ATOL = 1e-5, 1e-6
# Per-step scales: clipping sees both sides of its bound, RAdam rectifies from step 6.
STEP_SCALES = [1.0, 0.05, 3.0, 0.5, 1.0, 2.0]


def complex_tree(seed, scale=1.0):
    """{"dense": {"w": (2, 3), "b": (3,)}, "seq": [(3,), ((2, 3),)], "s": ()} of complex64.

    Few distinct shapes keep the file fast: eager JAX compiles each operation once per shape.
    """
    rng = np.random.default_rng(seed)

    def arr(*shape):
        return jnp.asarray((rng.normal(size=shape) + 1j * rng.normal(size=shape)) * scale, jnp.complex64)

    return {"dense": {"w": arr(2, 3), "b": arr(3)}, "seq": [arr(3), (arr(2, 3),)], "s": arr()}


PARAMS = complex_tree(100)
GRADS = [complex_tree(t, scale) for t, scale in enumerate(STEP_SCALES)]


def assert_trees_close(actual, expected, what, rtol=RTOL, atol=ATOL):
    assert jax.tree.structure(actual) == jax.tree.structure(expected), what
    for (path, a), e in zip(jax.tree_util.tree_flatten_with_path(actual)[0], jax.tree.leaves(expected)):
        assert a.dtype == e.dtype, f"{what}{jax.tree_util.keystr(path)}: dtype {a.dtype} != {e.dtype}"
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol,
                                   err_msg=f"{what}{jax.tree_util.keystr(path)}")


def run_pair(ours, theirs, lr):
    """Both sides over the steps of GRADS, comparing every step's updates; ``lr`` evolves each side's params."""
    s1, s2 = ours.init(PARAMS), theirs.init(PARAMS)
    step1, step2 = ours.update, theirs.update
    p1 = p2 = PARAMS
    for t, g in enumerate(GRADS):
        u1, s1 = step1(g, s1, p1)
        u2, s2 = step2(g, s2, p2)
        assert_trees_close(u1, u2, f"step {t + 1} updates")
        if lr is not None:
            p1 = ux.apply_updates(p1, jax.tree.map(lambda u: lr * u, u1))
            p2 = optax.apply_updates(p2, jax.tree.map(lambda u: lr * u, u2))
    return s1, s2


# --------------------------------------------------------------------------
# Parity with optax on complex trees

ADAM_KW = dict(b1=0.8, b2=0.9, eps=1e-6, eps_root=1e-10)

STAGES = [
    # (id, updax, optax, lr for evolving params or None)
    ("scale", lambda: ux.scale(-0.3), lambda: optax.scale(-0.3), None),
    ("scale_by_adam", lambda: ux.scale_by_adam(**ADAM_KW), lambda: optax.scale_by_adam(**ADAM_KW), None),
    ("scale_by_nadam", lambda: ux.scale_by_nadam(**ADAM_KW),
     lambda: optax.scale_by_adam(**ADAM_KW, nesterov=True), None),
    ("scale_by_amsgrad", lambda: ux.scale_by_amsgrad(**ADAM_KW), lambda: optax.scale_by_amsgrad(**ADAM_KW), None),
    ("scale_by_adamax", lambda: ux.scale_by_adamax(b1=0.8, b2=0.9, eps=1e-6),
     lambda: optax.scale_by_adamax(b1=0.8, b2=0.9, eps=1e-6), None),
    ("scale_by_belief", lambda: ux.scale_by_belief(**ADAM_KW), lambda: optax.scale_by_belief(**ADAM_KW), None),
    ("scale_by_radam", lambda: ux.scale_by_radam(**ADAM_KW, threshold=5.0),
     lambda: optax.scale_by_radam(**ADAM_KW, threshold=5.0), None),
    ("scale_by_yogi", lambda: ux.scale_by_yogi(initial_accumulator_value=1e-3, **ADAM_KW),
     lambda: optax.scale_by_yogi(initial_accumulator_value=1e-3, **ADAM_KW), None),
    # b2 = 0.5: where optax 0.2.8's Adan agrees with the paper's (tests/test_adaptive.py).
    ("scale_by_adan", lambda: ux.scale_by_adan(b1=0.8, b2=0.5, b3=0.9, eps=1e-6, eps_root=1e-10),
     lambda: optax.scale_by_adan(b1=0.8, b2=0.5, b3=0.9, eps=1e-6, eps_root=1e-10), None),
    ("scale_by_ademamix", lambda: ux.scale_by_ademamix(b1=0.8, b2=0.9, b3=0.95, alpha=2.0, eps=1e-6, eps_root=1e-10),
     lambda: optax.contrib.scale_by_ademamix(b1=0.8, b2=0.9, b3=0.95, alpha=2.0, eps=1e-6, eps_root=1e-10), None),
    ("scale_by_rms", lambda: ux.scale_by_rms(decay=0.8, eps=1e-6, initial_scale=0.1),
     lambda: optax.scale_by_rms(decay=0.8, eps=1e-6, initial_scale=0.1, eps_in_sqrt=True, bias_correction=False),
     None),
    ("scale_by_stddev", lambda: ux.scale_by_stddev(decay=0.8, eps=1e-6, initial_scale=0.5),
     lambda: optax.scale_by_stddev(decay=0.8, eps=1e-6, initial_scale=0.5, eps_in_sqrt=True,
                                   bias_correction=False), None),
    ("scale_by_rss", lambda: ux.scale_by_rss(initial_accumulator_value=0.2, eps=1e-6),
     lambda: optax.scale_by_rss(initial_accumulator_value=0.2, eps=1e-6), None),
    ("scale_by_novograd", lambda: ux.scale_by_novograd(b1=0.8, b2=0.6, eps=1e-6, eps_root=1e-10, decay=0.05),
     lambda: optax.scale_by_novograd(b1=0.8, b2=0.6, eps=1e-6, eps_root=1e-10, weight_decay=0.05), -0.01),
    ("scale_by_trust_ratio", lambda: ux.scale_by_trust_ratio(min_norm=0.0, trust_coefficient=0.5, eps=1e-6),
     lambda: optax.scale_by_trust_ratio(min_norm=0.0, trust_coefficient=0.5, eps=1e-6), -0.05),
    ("trace", lambda: ux.trace(decay=0.7), lambda: optax.trace(decay=0.7), None),
    ("trace_nesterov", lambda: ux.trace(decay=0.7, nesterov=True), lambda: optax.trace(decay=0.7, nesterov=True),
     None),
    ("add_decayed_weights", lambda: ux.add_decayed_weights(0.05), lambda: optax.add_decayed_weights(0.05), -0.1),
    ("clip_by_global_norm", lambda: ux.clip_by_global_norm(2.0), lambda: optax.clip_by_global_norm(2.0), None),
    ("centralize", lambda: ux.centralize(), lambda: optax.centralize(), None),
    ("clip_by_block_rms", lambda: ux.clip_by_block_rms(0.8), lambda: optax.clip_by_block_rms(0.8), None),
    ("scale_by_param_block_rms", lambda: ux.scale_by_param_block_rms(1e-3),
     lambda: optax.scale_by_param_block_rms(1e-3), -0.1),
    ("chain", lambda: ux.clip_by_global_norm(1.0).scale_by_adam(b1=0.9, b2=0.99, eps=1e-8, eps_root=0.0)
     .add_decayed_weights(1e-2).scale(-1e-3),
     lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(b1=0.9, b2=0.99, eps=1e-8),
                         optax.add_decayed_weights(1e-2), optax.scale(-1e-3)), 1.0),
]


@pytest.mark.parametrize("ours, theirs, lr", [c[1:] for c in STAGES], ids=[c[0] for c in STAGES])
def test_stage_parity_with_optax_on_complex_trees(ours, theirs, lr):
    run_pair(ours(), theirs(), lr)


def test_adam_state_matches_optax_nu_stays_complex_and_real_valued():
    s1, s2 = run_pair(ux.scale_by_adam(**ADAM_KW), optax.scale_by_adam(**ADAM_KW), None)
    assert_trees_close(s1[0].mu, s2.mu, "mu")
    assert_trees_close(s1[0].nu, s2.nu, "nu")
    for v in jax.tree.leaves(s1[0].nu):
        assert v.dtype == jnp.complex64 and not np.any(np.imag(v)) and np.all(np.real(v) > 0)


O = ux.optimizers

OPTIMIZERS = [
    ("adam", lambda: O.adam(0.05, b1=0.8, b2=0.99, eps=1e-7, eps_root=0.0),
     lambda: optax.adam(0.05, b1=0.8, b2=0.99, eps=1e-7, eps_root=0.0)),
    ("adamw", lambda: O.adamw(0.05, b1=0.8, b2=0.99, eps=1e-7, eps_root=0.0, decay=0.01),
     lambda: optax.adamw(0.05, b1=0.8, b2=0.99, eps=1e-7, eps_root=0.0, weight_decay=0.01)),
    ("lamb", lambda: O.lamb(0.05, b1=0.8, b2=0.99, eps=1e-6, eps_root=0.0, decay=0.01),
     lambda: optax.lamb(0.05, b1=0.8, b2=0.99, eps=1e-6, eps_root=0.0, weight_decay=0.01)),
    ("rmsprop_centered_momentum", lambda: O.rmsprop(0.05, centered=True, momentum=0.9, nesterov=True, decay=0.8,
                                                    eps=1e-6, initial_scale=0.1),
     lambda: optax.rmsprop(0.05, centered=True, momentum=0.9, nesterov=True, decay=0.8, eps=1e-6,
                           initial_scale=0.1)),
    ("adagrad", lambda: O.adagrad(0.05, initial_accumulator_value=0.2, eps=1e-6),
     lambda: optax.adagrad(0.05, initial_accumulator_value=0.2, eps=1e-6)),
    ("sgd_nesterov", lambda: O.sgd(0.05, momentum=0.9, nesterov=True),
     lambda: optax.sgd(0.05, momentum=0.9, nesterov=True)),
    ("yogi", lambda: O.yogi(0.05, initial_accumulator_value=1e-6, b1=0.8, b2=0.99, eps=1e-3, eps_root=0.0),
     lambda: optax.yogi(0.05, b1=0.8, b2=0.99, eps=1e-3)),
    ("nadamw", lambda: O.nadamw(0.05, b1=0.8, b2=0.95, eps=1e-7, eps_root=0.0, decay=0.01),
     lambda: optax.nadamw(0.05, b1=0.8, b2=0.95, eps=1e-7, eps_root=0.0, weight_decay=0.01)),
    ("lars", lambda: O.lars(0.05, decay=0.01, trust_coefficient=0.01, eps=1e-6, momentum=0.8, nesterov=True),
     lambda: optax.lars(0.05, weight_decay=0.01, trust_coefficient=0.01, eps=1e-6, momentum=0.8, nesterov=True)),
]


@pytest.mark.parametrize("ours, theirs", [c[1:] for c in OPTIMIZERS], ids=[c[0] for c in OPTIMIZERS])
def test_optimizer_parity_with_optax_on_complex_trees(ours, theirs):
    run_pair(ours(), theirs(), 1.0)


def test_adadelta_matches_its_closed_form_on_complex_trees():
    """optax's AdaDelta squares complex updates without the conjugate: the reference is the rule itself."""
    rho, eps = 0.8, 1e-5
    opt = ux.scale_by_adadelta(rho=rho, eps=eps)
    state = opt.init(PARAMS)
    eg = ex = jax.tree.map(lambda p: np.zeros(p.shape), PARAMS)
    for t, g in enumerate(GRADS):
        u, state = opt.update(g, state)
        g = jax.tree.map(lambda x: np.asarray(x, np.complex128), g)
        eg = jax.tree.map(lambda e, x: rho * e + (1 - rho) * np.abs(x) ** 2, eg, g)
        expected = jax.tree.map(lambda e_x, e_g, x: np.sqrt(e_x + eps) / np.sqrt(e_g + eps) * x, ex, eg, g)
        ex = jax.tree.map(lambda e, x: rho * e + (1 - rho) * np.abs(x) ** 2, ex, expected)
        assert_trees_close(u, jax.tree.map(lambda x: x.astype(np.complex64), expected), f"step {t + 1}")


# --------------------------------------------------------------------------
# Norms are real


def test_global_norm_of_complex_leaves_is_real():
    norm = ux.global_norm([jnp.array(3j, jnp.complex64), jnp.array(4j, jnp.complex64)])
    assert norm.dtype == jnp.float32 and float(norm) == 5.0
    skip, record = ux.updates.skip_large_updates(24.0)([jnp.array(3j), jnp.array(4j)], 0, None)
    assert bool(skip) and float(record["norm_squared"]) == pytest.approx(25.0)


def test_clip_by_global_norm_clips_complex_updates():
    opt = ux.clip_by_global_norm(1.0)
    u, _ = opt.update({"a": jnp.array([3j], jnp.complex64), "b": jnp.array([4.0 + 0j], jnp.complex64)}, opt.init(None))
    np.testing.assert_allclose(u["a"], [0.6j], rtol=1e-6)
    np.testing.assert_allclose(u["b"], [0.8], rtol=1e-6)


def test_adam_on_an_imaginary_gradient_steps_along_it():
    opt = ux.scale_by_adam()
    u, _ = opt.update({"w": jnp.array([1j, -2j], jnp.complex64)}, opt.init({"w": jnp.zeros(2, jnp.complex64)}))
    np.testing.assert_allclose(u["w"], [1j, -1j], atol=1e-5)


def test_a_real_accumulator_for_complex_params_is_refused_by_name():
    opt = ux.scale_by_adam(nu_dtype=jnp.float32)
    with pytest.raises(TypeError, match=r"^scale_by_adam: state\.nu is stored as float32 but holds complex values"):
        opt.update(GRADS[0], opt.init(PARAMS))


# --------------------------------------------------------------------------
# The registry: every entry supports complex updates or refuses them by name

#: Entries whose rule needs an order or a sign (clip, sign, lion, rprop, keeping params non-negative), or is not
#: written for complex numbers yet (SM3's cover maxima, NorMuon's per-unit second moments).
#: Prodigy, D-Adaptation, COCOB and Mechanic: their estimates (inner products, per-coordinate maxima) are
#: written for real numbers.
#: DP-SGD's aggregate: its privacy analysis adds noise per real coordinate, which a complex draw would halve.
REJECTED = {"differentially_private_aggregate", "scale_by_prodigy", "scale_by_dadapt_adamw", "scale_by_cocob", "mechanize",
            "clip", "scale_by_sign", "scale_by_lion", "scale_by_rprop", "scale_by_sm3",
            "scale_by_normuon", "keep_params_nonnegative",
            "scale_by_shampoo", "scale_by_soap", "scale_by_sophia",  # eigenbases of real statistics; Hutchinson's signs
            "scale_by_galore", "scale_by_galore_with_base",  # projectors from real SVDs (optax's transposes)
            "scale_by_psgd_kron",  # real triangular factors and Gaussian probes
            "scale_by_madgrad",  # a cube root of sums of squares, written for real numbers as optax's
            "scale_by_momo", "scale_by_momo_adam",  # a model of the loss, real inner products (optax's too)
            "quantized_state"}  # the papers' maps code real numbers: a complex moment is refused by its path

SUPPORTED = {
    "adaptive_grad_clip", "per_example_global_norm_clip",  # |g|² norms, real factors (tests/test_privacy.py)
    "scale_by_dog", "scale_by_dowg", "scale_by_polyak",
    "scale", "scale_by_state", "scale_by_schedule", "scale_by_learning_rate", "scale_by_multiplicative_lr",
    "reduce_on_plateau",
    "scale_by_adam", "scale_by_belief", "scale_by_radam", "scale_by_yogi", "scale_by_amsgrad", "scale_by_adamax",
    "scale_by_nadam", "scale_by_adan", "scale_by_rms", "scale_by_rms_bias_corrected", "scale_by_rss", "scale_by_stddev", "scale_by_stddev_bias_corrected", "scale_by_adadelta",
    "scale_by_trust_ratio", "scale_by_novograd", "scale_by_param_block_rms", "clip_by_block_rms", "scale_by_shape",
    "trace", "trace_nesterov", "clip_by_global_norm", "centralize", "add_decayed_weights", "add_noise",
    "accumulate_gradients", "apply_if_finite", "loss_scale", "ema", "sma", "weighted_moving_average", "ema_params", "swa",
    "schedule_free", "freeze", "masked", "partition", "zero_nans", "snapshot", "scale_by_lbfgs",
    "lookahead", "sam", "scale_by_optimistic_gradient", "flat_state",
    "cautious",  # the sign of Re(u conj(g)) (tests/test_cautious.py)
    "scale_by_mars",  # |c|² norms, a real factor (tests/test_mars.py)
    # tests/test_adam_variants.py: ADOPT clips the modulus (against the paper's rule in float64); optax 0.2.8's
    # simplified AdEMAMix squares complex updates without the conjugate, its phase is checked here.
    "scale_by_adopt", "scale_by_ademamix", "scale_by_simplified_ademamix", "scale_by_laprop", "scale_by_acprop",
    "conditionally_mask", "conditionally_transform", "apply_every", "selective_transform", "monitor",
    "normalize_by_update_norm", "scale_by_param_block_norm", "per_example_layer_norm_clip",  # |g|² norms
    # tests/test_optax_compat.py: against optax on complex trees
    "scale_by_factored_rms", "scale_by_newton_schulz", "scale_by_muon", "scale_by_zoom_linesearch",
    "scale_by_backtracking_linesearch",
}

#: Entries that treat the real and imaginary parts of complex leaves apart, so a rotation does not commute with
#: them by design (tests/test_tail_transforms.py: optax's numbers, a second moment per part).
SPLIT = {"split_real_and_imaginary"}


def test_every_registry_entry_is_either_supported_or_rejected():
    assert not SUPPORTED & REJECTED and not SPLIT & (SUPPORTED | REJECTED), SUPPORTED & REJECTED
    assert SUPPORTED | REJECTED | SPLIT == set(ENTRIES), (set(ENTRIES) - SUPPORTED - REJECTED - SPLIT) or (
        (SUPPORTED | REJECTED | SPLIT) - set(ENTRIES))


def _steps(opt, step, grads, params):
    """Each step's updates, on fixed params (the stages that do not need them ignore them)."""
    state, outs = opt.init(params), []
    for g in grads:
        u, state = step(updates_for(opt, g), state, params)
        outs.append(u)
    return outs


#: Entries that branch with lax.cond, which eager JAX compiles on every call: one jit is cheaper.
BRANCHING = {"accumulate_gradients", "apply_if_finite", "loss_scale", "lookahead", "sam", "scale_by_zoom_linesearch",
             "scale_by_backtracking_linesearch"}


def _step_fn(name, opt):
    def step(g, s, p):
        return opt.update(g, s, p, loss=1.0)

    return jax.jit(step) if name in BRANCHING else step


def _rotated(tree, phase):
    """``tree`` times ``phase``, as complex64."""
    return jax.tree.map(lambda x: x * jnp.asarray(phase, jnp.complex64), tree)


def _real(tree):
    return jax.tree.map(lambda x: x.real, tree)


#: Yogi starts its first moment at a real constant, which a rotation of the inputs does not turn.
PHASE_FREE = {"scale_by_yogi": lambda: ux.scale_by_yogi(initial_accumulator_value=0.0, b1=0.9, b2=0.999, eps=1e-3)}


@pytest.mark.parametrize("name", sorted(SUPPORTED - {"add_noise"}))
def test_supported_entries_carry_the_phase(name):
    """A purely imaginary input gives i times what the same real values give (which stays real), and a
    rotation by any phase commutes with the stage (|g|² moments and norms do not see it): the imaginary
    part is carried, never dropped or mixed into the real one."""
    opt = PHASE_FREE.get(name, ENTRIES[name])()
    step = _step_fn(name, opt)
    grads, params = GRADS[:3], PARAMS
    real = _steps(opt, step, [_rotated(_real(g), 1) for g in grads], _rotated(_real(params), 1))
    imaginary = _steps(opt, step, [_rotated(_real(g), 1j) for g in grads], _rotated(_real(params), 1j))
    for t, (r, i) in enumerate(zip(real, imaginary)):
        assert all(x.dtype == jnp.complex64 and not np.any(np.imag(x)) for x in jax.tree.leaves(r)), name
        assert_trees_close(i, _rotated(r, 1j), f"{name} step {t + 1} (imaginary input)", rtol=1e-5, atol=1e-6)
    phase = np.exp(0.7j)
    plain = _steps(opt, step, grads, params)
    turned = _steps(opt, step, [_rotated(g, phase) for g in grads], _rotated(params, phase))
    for t, (u, v) in enumerate(zip(plain, turned)):
        assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(u)), name
        assert_trees_close(v, _rotated(u, phase), f"{name} step {t + 1} (rotated input)", rtol=1e-4, atol=1e-5)


def test_add_noise_draws_complex_noise_independent_of_the_input():
    opt = ENTRIES["add_noise"]()
    step = _step_fn("add_noise", opt)
    plain = _steps(opt, step, GRADS[:3], PARAMS)
    turned = _steps(opt, step, [_rotated(g, 1j) for g in GRADS[:3]], PARAMS)
    for g, u, v in zip(GRADS, plain, turned):
        noise = jax.tree.map(lambda a, b: a - b, u, g)
        assert_trees_close(jax.tree.map(lambda a, b: a - b * 1j, v, g), noise, "noise", atol=1e-6)
        flat = np.concatenate([np.ravel(x) for x in jax.tree.leaves(noise)])
        assert np.all(np.isfinite(flat)) and np.any(flat.real != 0) and np.any(flat.imag != 0)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", sorted(REJECTED))
def test_rejected_entries_name_the_stage_and_the_leaf(name, jit):
    opt = ENTRIES[name]()
    params = _real(PARAMS)
    grads = {**_real(GRADS[0]), "seq": [GRADS[0]["seq"][0].real, (GRADS[0]["seq"][1][0],)]}
    update = jax.jit(opt.update) if jit else opt.update
    state = opt.init(params)
    with pytest.raises(TypeError, match=rf"^{name.removesuffix('_with_base')}: complex updates are not supported "
                                        r"\(updates\['seq'\]\[1\]\[0\] is complex64\)"):
        update(updates_for(opt, grads), state, params if name in NEEDS_PARAMS else None)


@pytest.mark.parametrize("build, stage, leaf", [
    (lambda: O.lion(0.1), "scale_by_lion", "['dense']['b']"),
    (lambda: O.signum(0.1), "scale_by_sign", "['dense']['b']"),
    (lambda: O.rprop(0.1), "scale_by_rprop", "['dense']['b']"),
    (lambda: O.sm3(0.1), "scale_by_sm3", "['dense']['b']"),
    (lambda: O.normuon(0.1), "scale_by_normuon", "['dense']['w']"),  # normuon's stage sees the matrices only
], ids=["lion", "signum", "rprop", "sm3", "normuon"])
def test_optimizers_built_on_rejected_stages_reject_complex_updates(build, stage, leaf):
    opt = build()
    with pytest.raises(TypeError, match=rf"^{stage}: complex updates are not supported \(updates{re.escape(leaf)} "):
        opt.update(GRADS[0], opt.init(PARAMS), PARAMS)
