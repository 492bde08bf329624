"""Numerical parity: every catalogue entry against optax or a numpy reference.

Each parity case sets every option explicitly on both sides, runs 12 steps
(14 for gradient accumulation) on a nested pytree with fixed random
gradients that differ per step, and compares every step's updates and the
final state leaves that correspond. Where updax deliberately departs from
optax (Axon's defaults, the RAdam rectifier guard, mixed precision), the
reference is optax with Axon's values or a numpy transcription of the paper.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import updax as ux

RTOL, ATOL = 1e-5, 1e-6
N_STEPS = 12

# Per-step gradient scales: the global norm of a gradient tree is about 5x
# its scale, so clipping and min-norm floors see both sides of their bound.
STEP_SCALES = [1.0, 0.05, 3.0, 0.5, 1.0, 0.02, 2.0, 0.3, 1.0, 0.1, 4.0, 0.7]


def make_tree(rng, scale=1.0, dtype=jnp.float32):
    """{"dense": {"w": (3, 4), "b": (4,)}, "seq": [(5,), ((2, 2),)], "s": ()}."""

    def arr(*shape):
        return jnp.asarray(np.asarray(rng.normal(size=shape) * scale, np.float32), dtype)

    return {"dense": {"w": arr(3, 4), "b": arr(4)}, "seq": [arr(5), (arr(2, 2),)], "s": arr()}


def make_grads(n, scale=1.0, dtype=jnp.float32):
    rng = np.random.default_rng(0)
    return [make_tree(rng, scale * STEP_SCALES[t % len(STEP_SCALES)], dtype) for t in range(n)]


PARAMS = make_tree(np.random.default_rng(1))
GRADS = make_grads(14)


def assert_trees_close(actual, expected, what, rtol=RTOL, atol=ATOL):
    assert jax.tree.structure(actual) == jax.tree.structure(expected), (
        f"{what}: structure {jax.tree.structure(actual)} != {jax.tree.structure(expected)}")
    flat_a = jax.tree_util.tree_flatten_with_path(actual)[0]
    flat_e = jax.tree.leaves(expected)
    for (path, a), e in zip(flat_a, flat_e):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape, f"{what}{jax.tree_util.keystr(path)}: shape {a.shape} != {e.shape}"
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=f"{what}{jax.tree_util.keystr(path)}")


def scaled(tree, factor):
    return jax.tree.map(lambda u: u * factor, tree)


def run_pair(ux_opt, ox_opt, *, n_steps=N_STEPS, lr=None, jit=False, params=PARAMS, grads=GRADS):
    """Runs both sides ``n_steps`` steps, comparing updates (and params) at every step.

    ``lr=None`` feeds the same params every step; otherwise each side evolves its
    own params with its own ``apply_updates(params, lr * updates)``.
    """
    ux_state, ox_state = ux_opt.init(params), ox_opt.init(params)
    ux_params = ox_params = params

    def ux_step(opt, g, s, p):
        return opt.update(g, s, p)

    def ox_step(g, s, p):
        return ox_opt.update(g, s, p)

    if jit:
        ux_step, ox_step = jax.jit(ux_step), jax.jit(ox_step)
    for t in range(n_steps):
        ux_updates, ux_state = ux_step(ux_opt, grads[t], ux_state, ux_params)
        ox_updates, ox_state = ox_step(grads[t], ox_state, ox_params)
        assert_trees_close(ux_updates, ox_updates, f"step {t + 1} updates")
        if lr is not None:
            ux_params = ux.apply_updates(ux_params, scaled(ux_updates, lr))
            ox_params = optax.apply_updates(ox_params, scaled(ox_updates, lr))
            assert_trees_close(ux_params, ox_params, f"step {t + 1} params")
    return ux_state, ox_state


# --------------------------------------------------------------------------
# The parity table


def decaying(count):
    return 0.5 * 0.8**count


def fields(ux_stage, *names, ox_index=None):
    """State pairs ``ux_opt.get_state(s, "<stage>.<name>")`` vs ``ox_state[.ox_index].<name>``."""

    def pairs(ux_opt, ux_state, ox_state):
        ox = ox_state if ox_index is None else ox_state[ox_index]
        return [(f"{ux_stage}.{n}", ux_opt.get_state(ux_state, f"{ux_stage}.{n}"), getattr(ox, n)) for n in names]

    return pairs


def no_state(ux_opt, ux_state, ox_state):
    return []


ADAM_KW = dict(b1=0.8, b2=0.95, eps=1e-6, eps_root=1e-12)

CASES = [
    # (id, updax factory, optax factory, state pairs, lr for evolving params or None)
    ("scale", lambda: ux.scale(step_size=-0.3), lambda: optax.scale(step_size=-0.3), no_state, None),
    ("scale_by_adam", lambda: ux.scale_by_adam(**ADAM_KW), lambda: optax.scale_by_adam(**ADAM_KW),
     fields("scale_by_adam", "mu", "nu", "count"), None),
    ("scale_by_belief", lambda: ux.scale_by_belief(b1=0.8, b2=0.95, eps=1e-6, eps_root=1e-10),
     lambda: optax.scale_by_belief(b1=0.8, b2=0.95, eps=1e-6, eps_root=1e-10),
     fields("scale_by_belief", "mu", "nu", "count"), None),
    ("scale_by_radam", lambda: ux.scale_by_radam(b1=0.8, b2=0.9, eps=1e-6, eps_root=1e-10, threshold=5.0),
     lambda: optax.scale_by_radam(b1=0.8, b2=0.9, eps=1e-6, eps_root=1e-10, threshold=5.0),
     fields("scale_by_radam", "mu", "nu", "count"), None),
    ("scale_by_rms", lambda: ux.scale_by_rms(decay=0.8, eps=1e-6, initial_scale=0.1),
     lambda: optax.scale_by_rms(decay=0.8, eps=1e-6, initial_scale=0.1, eps_in_sqrt=True, bias_correction=False),
     fields("scale_by_rms", "nu"), None),
    # optax's two options, alone and together (Adam without momentum), from a nonzero initial scale
    *[(f"scale_by_rms_{label}", lambda kw=kw: ux.scale_by_rms(decay=0.8, eps=1e-6, initial_scale=0.1, **kw),
       lambda kw=kw: optax.scale_by_rms(decay=0.8, eps=1e-6, initial_scale=0.1, **{"eps_in_sqrt": True,
                                                                                  "bias_correction": False, **kw}),
       fields("scale_by_rms", "nu", *(["count"] if kw.get("bias_correction") else [])), None)
      for label, kw in [("eps_outside", dict(eps_in_sqrt=False)), ("bias_corrected", dict(bias_correction=True)),
                        ("both", dict(eps_in_sqrt=False, bias_correction=True))]],
    ("scale_by_rss", lambda: ux.scale_by_rss(initial_accumulator_value=0.2, eps=1e-6),
     lambda: optax.scale_by_rss(initial_accumulator_value=0.2, eps=1e-6),
     fields("scale_by_rss", "sum_of_squares"), None),
    ("scale_by_rss_zero_init", lambda: ux.scale_by_rss(initial_accumulator_value=0.0, eps=0.0),
     lambda: optax.scale_by_rss(initial_accumulator_value=0.0, eps=0.0),
     fields("scale_by_rss", "sum_of_squares"), None),
    ("scale_by_stddev", lambda: ux.scale_by_stddev(decay=0.8, eps=1e-6, initial_scale=0.5),
     lambda: optax.scale_by_stddev(decay=0.8, eps=1e-6, initial_scale=0.5, eps_in_sqrt=True,
                                   bias_correction=False),
     fields("scale_by_stddev", "mu", "nu"), None),
    # the same two options on the centred rule: the bias correction divides both moments
    *[(f"scale_by_stddev_{label}", lambda kw=kw: ux.scale_by_stddev(decay=0.8, eps=1e-6, initial_scale=0.5, **kw),
       lambda kw=kw: optax.scale_by_stddev(decay=0.8, eps=1e-6, initial_scale=0.5, **{"eps_in_sqrt": True,
                                                                                     "bias_correction": False, **kw}),
       fields("scale_by_stddev", "mu", "nu", *(["count"] if kw.get("bias_correction") else [])), None)
      for label, kw in [("eps_outside", dict(eps_in_sqrt=False)), ("bias_corrected", dict(bias_correction=True)),
                        ("both", dict(eps_in_sqrt=False, bias_correction=True))]],
    ("scale_by_schedule", lambda: ux.scale_by_schedule(decaying), lambda: optax.scale_by_schedule(decaying),
     fields("scale_by_schedule", "count"), None),
    ("scale_by_trust_ratio", lambda: ux.scale_by_trust_ratio(min_norm=0.0, trust_coefficient=0.5, eps=1e-6),
     lambda: optax.scale_by_trust_ratio(min_norm=0.0, trust_coefficient=0.5, eps=1e-6), no_state, -0.05),
    ("scale_by_trust_ratio_min_norm",
     lambda: ux.scale_by_trust_ratio(min_norm=1.0, trust_coefficient=0.7, eps=1e-5),
     lambda: optax.scale_by_trust_ratio(min_norm=1.0, trust_coefficient=0.7, eps=1e-5), no_state, -0.05),
    ("scale_by_yogi",
     lambda: ux.scale_by_yogi(initial_accumulator_value=1e-3, b1=0.8, b2=0.95, eps=1e-4, eps_root=1e-8),
     lambda: optax.scale_by_yogi(initial_accumulator_value=1e-3, b1=0.8, b2=0.95, eps=1e-4, eps_root=1e-8),
     fields("scale_by_yogi", "mu", "nu", "count"), None),
    ("trace", lambda: ux.trace(decay=0.7, nesterov=False), lambda: optax.trace(decay=0.7, nesterov=False),
     fields("trace", "trace"), None),
    ("trace_nesterov", lambda: ux.trace(decay=0.7, nesterov=True), lambda: optax.trace(decay=0.7, nesterov=True),
     fields("trace", "trace"), None),
    ("clip", lambda: ux.clip(delta=0.5), lambda: optax.clip(max_delta=0.5), no_state, None),
    ("clip_by_global_norm", lambda: ux.clip_by_global_norm(max_norm=2.0),
     lambda: optax.clip_by_global_norm(max_norm=2.0), no_state, None),
    ("centralize", lambda: ux.centralize(), lambda: optax.centralize(), no_state, None),
    ("add_decayed_weights", lambda: ux.add_decayed_weights(decay=0.05),
     lambda: optax.add_decayed_weights(weight_decay=0.05, mask=None), no_state, -0.1),
    ("scale_by_state", lambda: ux.scale_by_state(step_size=-0.3), lambda: optax.scale(step_size=-0.3),
     no_state, None),
    ("chain",
     lambda: ux.clip_by_global_norm(max_norm=1.0).scale_by_adam(b1=0.9, b2=0.99, eps=1e-8, eps_root=0.0)
     .add_decayed_weights(decay=1e-2).scale(step_size=-1e-3),
     lambda: optax.chain(optax.clip_by_global_norm(max_norm=1.0),
                         optax.scale_by_adam(b1=0.9, b2=0.99, eps=1e-8, eps_root=0.0),
                         optax.add_decayed_weights(weight_decay=1e-2, mask=None), optax.scale(step_size=-1e-3)),
     fields("scale_by_adam", "mu", "nu", "count", ox_index=1), 1.0),
]


@pytest.mark.parametrize("ux_factory, ox_factory, state_pairs, lr",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parity_with_optax(ux_factory, ox_factory, state_pairs, lr):
    ux_opt, ox_opt = ux_factory(), ox_factory()
    ux_state, ox_state = run_pair(ux_opt, ox_opt, lr=lr)
    for label, ux_leaf, ox_leaf in state_pairs(ux_opt, ux_state, ox_state):
        assert_trees_close(ux_leaf, ox_leaf, f"final state {label}")


def test_chain_parity_under_jit():
    ux_opt = (ux.clip_by_global_norm(max_norm=1.0).scale_by_adam(b1=0.9, b2=0.99, eps=1e-8, eps_root=0.0)
              .add_decayed_weights(decay=1e-2).scale(step_size=-1e-3))
    ox_opt = optax.chain(optax.clip_by_global_norm(max_norm=1.0),
                         optax.scale_by_adam(b1=0.9, b2=0.99, eps=1e-8, eps_root=0.0),
                         optax.add_decayed_weights(weight_decay=1e-2, mask=None), optax.scale(step_size=-1e-3))
    ux_state, ox_state = run_pair(ux_opt, ox_opt, lr=1.0, jit=True)
    for name in ("mu", "nu", "count"):
        assert_trees_close(ux_opt.get_state(ux_state, f"scale_by_adam.{name}"), getattr(ox_state[1], name),
                           f"final state scale_by_adam.{name}")


def test_the_parity_grads_exercise_both_sides_of_the_bounds():
    """clip_by_global_norm(2.0) and trust_ratio(min_norm=1.0) see norms on both sides of their bound."""
    norms = np.array([np.sqrt(sum(np.sum(np.square(np.asarray(x))) for x in jax.tree.leaves(g)))
                      for g in GRADS[:N_STEPS]])
    assert (norms < 2.0).sum() >= 3 and (norms > 2.0).sum() >= 3, norms
    leaf_norms = np.array([np.linalg.norm(np.asarray(x)) for g in GRADS[:N_STEPS] for x in jax.tree.leaves(g)])
    assert (leaf_norms <= 1.0).any() and (leaf_norms > 1.0).any()
    param_norms = np.array([np.linalg.norm(np.asarray(x)) for x in jax.tree.leaves(PARAMS)])
    assert (param_norms <= 1.0).any() and (param_norms > 1.0).any(), param_norms
    assert np.any(np.abs(np.asarray(GRADS[0]["dense"]["w"])) > 0.5)  # clip(delta=0.5) clips something


def test_clip_by_global_norm_matches_closed_form():
    opt = ux.clip_by_global_norm(max_norm=2.0)
    for g in GRADS[:N_STEPS]:
        norm = np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(g)))
        factor = 1.0 if norm < 2.0 else 2.0 / norm
        expected = jax.tree.map(lambda x, factor=factor: np.asarray(x) * factor, g)
        updates, _ = opt.update(g, opt.init(PARAMS))
        assert_trees_close(updates, expected, f"norm {norm:.3f}")


# --------------------------------------------------------------------------
# Trust ratio with zero leaves


@pytest.mark.parametrize("min_norm", [0.0, 0.5])
def test_trust_ratio_zero_leaves(min_norm):
    """A zero param leaf and a zero update leaf: ratio 1 without a floor, floored norms with one."""
    params = make_tree(np.random.default_rng(2))
    params["seq"][0] = jnp.zeros(5)
    grads = make_grads(N_STEPS)
    for g in grads:
        g["dense"]["b"] = jnp.zeros(4)
    ux_opt = ux.scale_by_trust_ratio(min_norm=min_norm, trust_coefficient=0.8, eps=1e-6)
    ox_opt = optax.scale_by_trust_ratio(min_norm=min_norm, trust_coefficient=0.8, eps=1e-6)
    run_pair(ux_opt, ox_opt, params=params, grads=grads)

    # Independent check on the zero param leaf at step 1.
    g = np.asarray(grads[0]["seq"][0], np.float64)
    u, _ = ux_opt.update(grads[0], ux_opt.init(params), params)
    if min_norm == 0.0:
        expected = g  # param norm 0: the ratio is 1
    else:
        expected = g * 0.8 * min_norm / (max(np.linalg.norm(g), min_norm) + 1e-6)
    np.testing.assert_allclose(np.asarray(u["seq"][0]), expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(np.asarray(u["dense"]["b"]), 0.0)


# --------------------------------------------------------------------------
# Gradient accumulation vs optax.MultiSteps


def test_accumulate_gradients_matches_multisteps():
    k, n = 3, 14  # 4 full cycles and 2 calls into the fifth
    adam = dict(b1=0.8, b2=0.95, eps=1e-6, eps_root=0.0)
    ux_opt = ux.scale_by_adam(**adam).scale(step_size=-0.1).accumulate_gradients(k)
    ox_opt = optax.MultiSteps(optax.chain(optax.scale_by_adam(**adam), optax.scale(step_size=-0.1)),
                              every_k_schedule=k, use_grad_mean=True)
    ux_state, ox_state = run_pair(ux_opt, ox_opt, n_steps=n, lr=1.0, jit=True)  # eager lax.cond is slow

    count = ux_opt.get_state(ux_state, "accumulate_gradients.mini_step")
    assert int(count) == int(ox_state.mini_step) == n % k
    for name in ("mu", "nu", "count"):
        assert_trees_close(ux_opt.get_state(ux_state, f"accumulate_gradients/scale_by_adam.{name}"),
                           getattr(ox_state.inner_opt_state[0], name), f"inner scale_by_adam.{name}")
    assert int(ux_opt.get_state(ux_state, "accumulate_gradients/scale_by_adam.count")) == n // k
    # updax keeps the running sum, optax the running mean.
    accumulated = ux_opt.get_state(ux_state, "accumulate_gradients.accumulated")
    assert_trees_close(scaled(accumulated, 1.0 / (n % k)), ox_state.acc_grads, "accumulated / count")


# --------------------------------------------------------------------------
# scale_by_state: a tunable step size


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_scale_by_state_replace_matches_optax_scale(jit):
    opt = ux.scale_by_state(step_size=-0.3)
    step = jax.jit(opt.update) if jit else opt.update
    state = opt.init(PARAMS)
    for t in range(N_STEPS):
        if t == 5:
            state = opt.replace_state(state, "scale_by_state.step_size", -0.05)
        reference = optax.scale(step_size=-0.3 if t < 5 else -0.05)
        expected, _ = reference.update(GRADS[t], reference.init(PARAMS), PARAMS)
        updates, state = step(GRADS[t], state, PARAMS)
        assert_trees_close(updates, expected, f"step {t + 1}")
    np.testing.assert_allclose(np.asarray(opt.get_state(state, "scale_by_state.step_size")), -0.05, rtol=1e-7)


# --------------------------------------------------------------------------
# RAdam: both branches, and the rectifier guard for thresholds below 4


def radam_rho(b2, n):
    t = np.arange(1, n + 1, dtype=np.float64)
    rho_inf = 2.0 / (1.0 - b2) - 1.0
    return rho_inf, rho_inf - 2.0 * t * b2**t / (1.0 - b2**t)


def radam_reference(grads, *, b1, b2, eps, eps_root, threshold):
    """The paper's RAdam in float64 numpy, with the rectified step only where rho_t > 4."""
    rho_inf, rho = radam_rho(b2, len(grads))
    leaves = [[np.asarray(x, np.float64) for x in jax.tree.leaves(g)] for g in grads]
    m = [np.zeros_like(x) for x in leaves[0]]
    v = [np.zeros_like(x) for x in leaves[0]]
    out = []
    for t, (gs, rho_t) in enumerate(zip(leaves, rho), start=1):
        m = [b1 * mi + (1 - b1) * g for mi, g in zip(m, gs)]
        v = [b2 * vi + (1 - b2) * g * g for vi, g in zip(v, gs)]
        m_hat = [mi / (1 - b1**t) for mi in m]
        v_hat = [vi / (1 - b2**t) for vi in v]
        if rho_t >= threshold and rho_t > 4.0:
            r = np.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
            step = [r * mh / (np.sqrt(vh + eps_root) + eps) for mh, vh in zip(m_hat, v_hat)]
        else:
            step = m_hat
        out.append(jax.tree.unflatten(jax.tree.structure(grads[0]), step))
    return out


def test_radam_parity_case_crosses_the_threshold():
    """With b2=0.9 rho_t goes 1, 1.95, 2.86, 3.74, 4.58, 5.39, ...: both branches within 12 steps."""
    _, rho = radam_rho(0.9, N_STEPS)
    assert (rho < 5.0).sum() >= 3 and (rho >= 5.0).sum() >= 3, rho
    opt = ux.scale_by_radam(b1=0.8, b2=0.9, eps=1e-6, eps_root=1e-10, threshold=5.0)
    expected = radam_reference(GRADS[:N_STEPS], b1=0.8, b2=0.9, eps=1e-6, eps_root=1e-10, threshold=5.0)
    state = opt.init(PARAMS)
    for t in range(N_STEPS):
        updates, state = opt.update(GRADS[t], state, PARAMS)
        assert_trees_close(updates, expected[t], f"step {t + 1} (rho={rho[t]:.2f})")


def test_radam_threshold_below_four_stays_finite():
    kw = dict(b1=0.8, b2=0.9, eps=1e-6, eps_root=0.0)
    _, rho = radam_rho(kw["b2"], N_STEPS)
    assert (rho <= 4.0).any() and ((rho > 2.0) & (rho < 4.0)).any() and (rho > 4.0).any(), rho

    ux_opt = ux.scale_by_radam(**kw, threshold=0.0)
    ox_opt = optax.scale_by_radam(**kw, threshold=0.0)
    expected = radam_reference(GRADS[:N_STEPS], **kw, threshold=0.0)
    ux_state, ox_state = ux_opt.init(PARAMS), ox_opt.init(PARAMS)
    for t in range(N_STEPS):
        updates, ux_state = ux_opt.update(GRADS[t], ux_state, PARAMS)
        ox_updates, ox_state = ox_opt.update(GRADS[t], ox_state, PARAMS)
        for leaf in jax.tree.leaves(updates):
            assert np.all(np.isfinite(np.asarray(leaf))), f"step {t + 1}: non-finite update (rho={rho[t]:.2f})"
        # rho_t <= 4: plain bias-corrected momentum; rho_t > 4: the rectified step.
        assert_trees_close(updates, expected[t], f"step {t + 1} (rho={rho[t]:.2f})")
        if rho[t] > 4.0:
            assert_trees_close(updates, ox_updates, f"step {t + 1} vs optax (rho={rho[t]:.2f})")
    assert_trees_close(ux_opt.get_state(ux_state, "scale_by_radam.mu"), ox_state.mu, "final mu")
    assert_trees_close(ux_opt.get_state(ux_state, "scale_by_radam.nu"), ox_state.nu, "final nu")


def test_radam_rectifier_precision_at_default_b2():
    """Default b2=0.999: updax's rectified steps stay within 1% of the float64 paper formula.

    (float32 cancellation in rho_t bounds what is achievable; optax is further off.)
    """
    kw = dict(b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, threshold=5.0)
    expected = radam_reference(GRADS[:N_STEPS], **kw)
    for t, u in enumerate(collect_updates(ux.scale_by_radam(**kw), GRADS[:N_STEPS])):
        assert_trees_close(u, expected[t], f"step {t + 1}", rtol=1e-2)


# --------------------------------------------------------------------------
# Axon's defaults

AXON_DEFAULTS = {
    "scale_by_adam": dict(b1=0.9, b2=0.999, eps=1e-8, eps_root=1e-15),
    "scale_by_belief": dict(b1=0.9, b2=0.999, eps=0.0, eps_root=1e-16),
    "scale_by_radam": dict(b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, threshold=5.0),
    "scale_by_rms": dict(decay=0.9, eps=1e-8, initial_scale=0.0),
    "scale_by_rss": dict(initial_accumulator_value=0.1, eps=1e-7),
    "scale_by_stddev": dict(decay=0.9, eps=1e-8, initial_scale=0.0),
    "scale_by_trust_ratio": dict(min_norm=0.0, trust_coefficient=1.0, eps=0.0),
    "scale_by_yogi": dict(initial_accumulator_value=1e-6, b1=0.9, b2=0.999, eps=1e-3, eps_root=0.0),
    "trace": dict(decay=0.9, nesterov=False),
    "clip": dict(delta=2.0),
    "clip_by_global_norm": dict(max_norm=1.0),
    "add_decayed_weights": dict(decay=0.0),
    "add_noise": dict(eta=0.01, gamma=0.55),
}


@pytest.mark.parametrize("name", sorted(AXON_DEFAULTS))
def test_axon_defaults_in_signature_and_repr(name):
    fn = getattr(ux, name)
    parameters = inspect.signature(fn).parameters
    shown = repr(fn())
    for option, value in AXON_DEFAULTS[name].items():
        assert parameters[option].default == value, (name, option, parameters[option].default)
        assert type(parameters[option].default) is type(value), (name, option)
        assert f"{option}={value!r}" in shown, (name, shown)


# (id, updax with no options, optax with Axon's values, optax with its own defaults or None
#  when optax has no default, whether the two optax runs must differ, gradient scale[, rtol])
DEFAULT_CASES = [
    ("scale_by_adam", lambda: ux.scale_by_adam(),
     lambda: optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-8, eps_root=1e-15),
     lambda: optax.scale_by_adam(), True, 1e-8),
    # optax's eps=1e-16 vs Axon's 0.0 adds 1e-16 to a denominator >= sqrt(eps_root/(1-b2)) ~ 3e-7:
    # below float32 resolution, so the two cannot be told apart numerically.
    ("scale_by_belief", lambda: ux.scale_by_belief(),
     lambda: optax.scale_by_belief(b1=0.9, b2=0.999, eps=0.0, eps_root=1e-16),
     lambda: optax.scale_by_belief(), False, 1e-8),
    # With b2=0.999, rho_t = rho_inf - 2t·b2^t/(1-b2^t) is a difference of two numbers near
    # 2000 with a result near t: in float32 both libraries lose ~3 digits of rho_t (optax more,
    # see test_radam_rectifier_precision_at_default_b2), so the rectified steps agree only to ~1%.
    ("scale_by_radam", lambda: ux.scale_by_radam(),
     lambda: optax.scale_by_radam(b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, threshold=5.0),
     lambda: optax.scale_by_radam(), False, 1.0, 2e-2),
    ("scale_by_rms", lambda: ux.scale_by_rms(),
     lambda: optax.scale_by_rms(decay=0.9, eps=1e-8, initial_scale=0.0, eps_in_sqrt=True, bias_correction=False),
     lambda: optax.scale_by_rms(), False, 1.0),
    ("scale_by_rss", lambda: ux.scale_by_rss(),
     lambda: optax.scale_by_rss(initial_accumulator_value=0.1, eps=1e-7),
     lambda: optax.scale_by_rss(), False, 1.0),
    ("scale_by_stddev", lambda: ux.scale_by_stddev(),
     lambda: optax.scale_by_stddev(decay=0.9, eps=1e-8, initial_scale=0.0, eps_in_sqrt=True,
                                   bias_correction=False),
     lambda: optax.scale_by_stddev(), False, 1.0),
    ("scale_by_yogi", lambda: ux.scale_by_yogi(),
     lambda: optax.scale_by_yogi(initial_accumulator_value=1e-6, b1=0.9, b2=0.999, eps=1e-3, eps_root=0.0),
     lambda: optax.scale_by_yogi(), False, 1.0),
    ("scale_by_trust_ratio", lambda: ux.scale_by_trust_ratio(),
     lambda: optax.scale_by_trust_ratio(min_norm=0.0, trust_coefficient=1.0, eps=0.0),
     lambda: optax.scale_by_trust_ratio(), False, 1.0),
    ("trace", lambda: ux.trace(), lambda: optax.trace(decay=0.9, nesterov=False), None, False, 1.0),
    ("clip", lambda: ux.clip(), lambda: optax.clip(max_delta=2.0), None, False, 1.0),
    ("clip_by_global_norm", lambda: ux.clip_by_global_norm(), lambda: optax.clip_by_global_norm(max_norm=1.0),
     None, False, 1.0),
    ("add_decayed_weights", lambda: ux.add_decayed_weights(),
     lambda: optax.add_decayed_weights(weight_decay=0.0, mask=None),
     lambda: optax.add_decayed_weights(), False, 1.0),
]


def collect_updates(opt, grads, params=PARAMS):
    state, out = opt.init(params), []
    for g in grads:
        u, state = opt.update(g, state, params)
        out.append(u)
    return out


@pytest.mark.parametrize("ux_factory, ox_axon, ox_own, must_differ, grad_scale, rtol",
                         [(c[1:] + (RTOL,))[:6] for c in DEFAULT_CASES], ids=[c[0] for c in DEFAULT_CASES])
def test_default_options_match_optax_with_axon_values(ux_factory, ox_axon, ox_own, must_differ, grad_scale, rtol):
    grads = make_grads(N_STEPS, scale=grad_scale)
    actual = collect_updates(ux_factory(), grads)
    for t, (a, e) in enumerate(zip(actual, collect_updates(ox_axon(), grads))):
        assert_trees_close(a, e, f"step {t + 1}", rtol=rtol)
    if ox_own is None:
        return
    own = collect_updates(ox_own(), grads)
    close = all(np.allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=ATOL)
                for a, o in zip(actual, own) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(o)))
    assert close != must_differ, "updax's defaults should differ from optax's" if must_differ else (
        "updax's defaults should equal optax's")


def test_adam_default_eps_root_matters_for_tiny_gradients():
    """Closed form at step 1 with g = 1e-8: |u| = g / (sqrt(g² + eps_root) + eps)."""
    g = 1e-8
    grads = {"w": jnp.full(3, g, jnp.float32)}
    opt = ux.scale_by_adam()
    u, _ = opt.update(grads, opt.init(grads))
    np.testing.assert_allclose(np.asarray(u["w"]), g / (np.sqrt(g * g + 1e-15) + 1e-8), rtol=1e-4)
    ox = optax.scale_by_adam()
    ox_u, _ = ox.update(grads, ox.init(grads))
    np.testing.assert_allclose(np.asarray(ox_u["w"]), g / (g + 1e-8), rtol=1e-4)  # optax: eps_root = 0


def test_add_noise_default_schedule():
    """sigma_t^2 = eta / t^gamma (t from 1) with eta=0.01, gamma=0.55, checked on many samples."""
    zeros = {"a": jnp.zeros(100_000), "b": jnp.zeros(100_000)}
    opt = ux.add_noise(key=7)
    state = opt.init(zeros)
    for t in range(1, 4):
        noisy, state = opt.update(zeros, state)
        sample = np.concatenate([np.asarray(x) for x in jax.tree.leaves(noisy)])
        np.testing.assert_allclose(sample.std(), np.sqrt(0.01 / t**0.55), rtol=0.02)
        assert abs(sample.mean()) < 5 * np.sqrt(0.01) / np.sqrt(sample.size)


# --------------------------------------------------------------------------
# Mixed precision


def test_adam_bf16_params_keep_float32_moments():
    kw = dict(b1=0.9, b2=0.99, eps=1e-8, eps_root=0.0)
    params = make_tree(np.random.default_rng(1), dtype=jnp.bfloat16)
    grads = make_grads(N_STEPS, dtype=jnp.bfloat16)
    opt = ux.scale_by_adam(**kw)
    reference = optax.scale_by_adam(**kw)
    params32 = jax.tree.map(lambda x: x.astype(jnp.float32), params)
    state, ref_state = opt.init(params), reference.init(params32)
    for name in ("mu", "nu"):
        assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(opt.get_state(state, f"scale_by_adam.{name}")))
    for t, g in enumerate(grads):
        updates, state = opt.update(g, state, params)
        expected, ref_state = reference.update(jax.tree.map(lambda x: x.astype(jnp.float32), g), ref_state,
                                               params32)
        assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(updates)), f"step {t + 1}"
        assert_trees_close(updates, expected, f"step {t + 1}", rtol=1e-2, atol=1e-3)
    for name in ("mu", "nu"):
        moments = opt.get_state(state, f"scale_by_adam.{name}")
        assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(moments))
        # The moments are float32 sums of the upcast bf16 grads: float32 agreement.
        assert_trees_close(moments, getattr(ref_state, name), f"final {name}")
