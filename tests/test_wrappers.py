"""Lookahead, SAM and optimistic gradients: parity with optax over 20 steps, and the papers' algorithms in float64.

Oracles: optax.lookahead (its ``LookaheadParams.fast`` are updax's params, its ``slow`` the ``slow`` state),
optax.contrib.sam in its default (non-opaque) mode, optax.scale_by_optimistic_gradient and the optimistic
aliases; and NumPy float64 transcriptions of Lookahead's Algorithm 1 (Zhang et al., 2019) and Optimistic
Adam's Algorithm 1 (Daskalakis et al., 2018), where updax follows the paper (nesterov=False by default).
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


def _targets():
    return nested_tree(seed=7)


def _grads(params, t):
    """The gradient of ``sum(0.5·(p - target)²)`` plus a deterministic per-step perturbation: it depends on where
    the params are, so both sides must be at the same place for the gradients to agree."""
    noise = nested_tree(seed=t + 1)
    return jax.tree.map(lambda p, c, n: (p - c) + 0.3 * np.sin(t) * n, params, _targets(), noise)


def _scaled_grads(t, seed):
    """The gradients of tests/test_optimizers.py's parity test: a fresh tree, scaled by a factor varying with t."""
    factor = 1.0 + 0.5 * np.sin(t)
    return jax.tree.map(lambda g: g * factor, nested_tree(seed=seed))


def _close(actual, expected, what, rtol=RTOL, atol=ATOL):
    assert jax.tree.structure(actual) == jax.tree.structure(expected), what
    for (path, a), e in zip(jax.tree_util.tree_flatten_with_path(actual)[0], jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol,
                                   err_msg=f"{what}{jax.tree_util.keystr(path)}")


# --------------------------------------------------------------------------
# Lookahead


@pytest.mark.parametrize("reset_state", [False, True])
def test_lookahead_matches_optax_fast_and_slow_params_over_20_steps(reset_state):
    opt = O.adam(0.05, eps_root=0.0).lookahead(3, 0.6, reset_state)
    ref = optax.lookahead(optax.adam(0.05), sync_period=3, slow_step_size=0.6, reset_state=reset_state)
    params = nested_tree(seed=0)
    p1, p2 = params, optax.LookaheadParams.init_synced(params)
    s1, s2 = opt.init(p1), ref.init(p2)
    step1, step2 = jax.jit(opt.update), jax.jit(ref.update)
    for t in range(20):
        u1, s1 = step1(_grads(p1, t), s1, p1)
        u2, s2 = step2(_grads(p2.fast, t), s2, p2)
        p1, p2 = ux.apply_updates(p1, u1), optax.apply_updates(p2, u2)
        _close(p1, p2.fast, f"fast params, step {t + 1}")
        _close(opt.get_state(s1, "lookahead.slow"), p2.slow, f"slow params, step {t + 1}")
        assert int(opt.get_state(s1, "lookahead.steps_since_sync")) == int(s2.steps_since_sync)


def _lookahead_algorithm_1(theta0, k, alpha, lr, momentum, steps, reset):
    """Zhang et al.'s Algorithm 1 in float64, with SGD + heavy-ball momentum as the inner optimizer A; the params
    after each call of the loop (the fast weights, and the new slow weights after every k-th)."""
    target = [np.asarray(c, np.float64) for c in jax.tree.leaves(_targets())]
    phi = [np.asarray(p, np.float64) for p in theta0]
    trace = [np.zeros_like(p) for p in phi]
    out, t = [], 0
    while t < steps:
        theta = [p.copy() for p in phi]  # θ_{t,0} ← φ_{t-1}
        if reset:
            trace = [np.zeros_like(p) for p in phi]
        for _ in range(k):  # θ_{t,i} ← θ_{t,i-1} + A(L, θ_{t,i-1}, d)
            noise = [np.asarray(n, np.float64) for n in jax.tree.leaves(nested_tree(seed=t + 1))]
            grads = [(p - c) + 0.3 * np.sin(t) * n for p, c, n in zip(theta, target, noise)]
            trace = [momentum * m + g for m, g in zip(trace, grads)]
            theta = [p - lr * m for p, m in zip(theta, trace)]
            t += 1
            out.append(theta)
        phi = [p + alpha * (q - p) for p, q in zip(phi, theta)]  # φ_t ← φ_{t-1} + α(θ_{t,k} - φ_{t-1})
        out[-1] = phi
    return out[:steps]


@pytest.mark.parametrize("reset_state", [False, True])
def test_lookahead_follows_algorithm_1_of_the_paper_in_float64(reset_state):
    k, alpha, lr, momentum = 4, 0.5, 0.1, 0.9
    opt = O.sgd(lr, momentum=momentum).lookahead(k, alpha, reset_state)
    params = nested_tree(seed=0)
    expected = _lookahead_algorithm_1(jax.tree.leaves(params), k, alpha, lr, momentum, 20, reset_state)
    state, step = opt.init(params), jax.jit(opt.update)
    for t in range(20):
        u, state = step(_grads(params, t), state, params)
        params = ux.apply_updates(params, u)
        for a, e in zip(jax.tree.leaves(params), expected[t]):
            np.testing.assert_allclose(np.asarray(a), e, rtol=1e-5, atol=1e-6, err_msg=f"step {t + 1}")
        if (t + 1) % k == 0:  # right after a sync the params are the slow weights
            _close(opt.get_state(state, "lookahead.slow"), params, f"slow weights, step {t + 1}", atol=1e-6)



def test_lookahead_keeps_its_slow_step_exact_when_the_updates_are_narrower_than_the_params():
    """bfloat16 gradients of float32 params give bfloat16 updates. The slow weights on a sync are then the paper's
    ``φ + α·(θ_k - φ)`` in float32, not the new params as apply_updates sums them, which would round every slow
    step to bfloat16 (0.5% of a step, a thousand times float32's rounding); the params restart within the
    updates' rounding of them. The reference: float64 from the params and the fast pipeline's own updates."""
    k, alpha, lr = 2, 0.5, 0.1
    fast, opt = O.sgd(lr), O.sgd(lr).lookahead(k, alpha)
    params = jax.tree.map(lambda x: x.astype(jnp.float32), nested_tree(seed=0))
    state, step = opt.init(params), jax.jit(lambda g, s, p: opt.update(g, s, p))
    slow, theta = (jax.tree.map(lambda x: np.asarray(x, np.float64), params) for _ in range(2))
    for t in range(2 * k):
        grads = jax.tree.map(lambda x: x.astype(jnp.bfloat16), _grads(params, t))
        u_fast, _ = fast.update(grads, fast.init(params), params)  # (plain SGD is stateless: the same step)
        assert {x.dtype for x in jax.tree.leaves(u_fast)} == {jnp.dtype(jnp.bfloat16)}
        theta = jax.tree.map(lambda th, u: th + np.asarray(u, np.float64), theta, u_fast)
        u, state = step(grads, state, params)
        params = ux.apply_updates(params, u)
        if (t + 1) % k == 0:
            slow = jax.tree.map(lambda phi, th: phi + alpha * (th - phi), slow, theta)
            got = opt.get_state(state, "lookahead.slow")
            for a, e in zip(jax.tree.leaves(got), jax.tree.leaves(slow)):
                assert a.dtype == jnp.float32
                np.testing.assert_allclose(np.asarray(a, np.float64), e, rtol=0, atol=1e-6 * lr)
            _close(got, params, f"params restart at the slow weights, step {t + 1}", atol=1e-2 * lr)
            theta = jax.tree.map(lambda x: np.asarray(x, np.float64), params)

def test_lookahead_resets_a_scheduled_keyed_pipeline_under_jit():
    opt = ux.add_noise(eta=0.01, key=3).scale_by_adam(b1=ux.schedules.constant(0.9)).scale(-0.1).lookahead(
        2, 0.5, reset_state=True)
    params = nested_tree(seed=0)
    state, step = opt.init(params), jax.jit(opt.update)
    for t in range(4):
        u, state = step(_grads(params, t), state, params)
        params = ux.apply_updates(params, u)
        count = int(opt.get_state(state, "lookahead/scale_by_adam.count"))
        assert count == (t + 1) % 2, (t, count)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(params))


def test_lookahead_prints_and_pipes_as_a_wrapper():
    parent = O.adam(0.1)
    opt = parent.lookahead(4, 0.8)
    assert repr(opt) == ("scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=1e-15) |> "
                         "scale_by_learning_rate(learning_rate=0.1) |> "
                         "lookahead(sync_period=4, slow_step_size=0.8, reset_state=False)")
    assert opt == ux.lookahead(parent, 4, 0.8) == parent.pipe(ux.lookahead, 4, 0.8) == ux.compose(
        parent, ux.lookahead(4, 0.8))


@pytest.mark.parametrize("build, error, message", [
    (lambda: ux.lookahead(slow_step_size=0.0), ValueError,
     r"lookahead(slow_step_size=0.0): slow_step_size must be in (0, 1]"),
    (lambda: ux.lookahead(slow_step_size=1.5), ValueError, "slow_step_size must be in (0, 1]"),
    (lambda: ux.lookahead(sync_period=0), ValueError, "lookahead(sync_period=0): sync_period must be a positive"),
    (lambda: ux.lookahead(reset_state=1), TypeError, "lookahead(reset_state=1): reset_state must be True or False"),
    (lambda: ux.sam(rho=-0.1), ValueError, "sam(rho=-0.1): rho must be in [0, inf)"),
    (lambda: ux.sam(sync_period=1.5), TypeError, "sam(sync_period=1.5): sync_period must be a positive integer"),
    (lambda: ux.sam(adversary=optax.sgd(0.1)), TypeError, "sam(adversary="),
    (lambda: ux.scale_by_optimistic_gradient(beta=-1.0), ValueError,
     "scale_by_optimistic_gradient(beta=-1.0): beta must be in [0, inf)"),
])
def test_options_are_checked_at_construction_by_name(build, error, message):
    with pytest.raises(error) as info:
        build()
    assert str(info.value).startswith(message) or message in str(info.value), str(info.value)


# --------------------------------------------------------------------------
# SAM


def _sam_pair(rho, sync_period, reset_state, adaptive):
    ours = O.adam(0.05, eps_root=0.0).sam(rho, sync_period, reset_state=reset_state,
                                          adversary=ux.scale_by_adam(eps_root=0.0) if adaptive else None)
    direction = [optax.scale_by_adam()] if adaptive else []
    adv = optax.chain(*direction, optax.contrib.normalize(), optax.sgd(rho))
    theirs = optax.contrib.sam(optax.adam(0.05), adv, sync_period=sync_period, reset_state=reset_state)
    return ours, theirs


@pytest.mark.parametrize("rho, sync_period, reset_state, adaptive", [
    (0.05, 2, True, False), (0.1, 3, True, False), (0.1, 3, False, True), (0.05, 2, True, True)],
    ids=["paper", "two_ascents", "adaptive_kept", "adaptive_reset"])
def test_sam_matches_optax_contrib_sam_over_20_steps(rho, sync_period, reset_state, adaptive):
    opt, ref = _sam_pair(rho, sync_period, reset_state, adaptive)
    params = nested_tree(seed=0)
    p1 = p2 = params
    s1, s2 = opt.init(params), ref.init(params)
    step1, step2 = jax.jit(opt.update), jax.jit(ref.update)
    for t in range(20):
        u1, s1 = step1(_grads(p1, t), s1, p1)
        u2, s2 = step2(_grads(p2, t), s2, p2)
        _close(u1, u2, f"updates, step {t + 1}")
        p1, p2 = ux.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    _close(p1, p2, "params after 20 steps")


def test_sam_with_sync_period_1_is_the_pipeline_it_wraps():
    # (optax 0.2.8's sam steps from the previous call's params when sync_period is 1: its cache is one call late)
    opt, plain = O.adam(0.05).sam(0.1, 1), O.adam(0.05)
    params = nested_tree(seed=0)
    p1 = p2 = params
    s1, s2 = opt.init(params), plain.init(params)
    for t in range(3):
        u1, s1 = opt.update(_grads(p1, t), s1, p1)
        u2, s2 = plain.update(_grads(p2, t), s2, p2)
        p1, p2 = ux.apply_updates(p1, u1), ux.apply_updates(p2, u2)
        _close(p1, p2, f"step {t + 1}")


def test_sam_ascent_on_a_zero_gradient_is_zero_not_nan():
    opt = O.sgd(0.1).sam(0.05)
    params = {"w": jnp.ones(3)}
    u, state = opt.update({"w": jnp.zeros(3)}, opt.init(params), params)
    np.testing.assert_array_equal(u["w"], np.zeros(3))
    assert int(opt.get_state(state, "sam.steps_since_sync")) == 1


def test_sam_prints_its_adversary_and_reaches_into_the_outer_pipeline():
    opt = O.sgd(0.1).sam(0.05, adversary=ux.scale_by_adam())
    assert repr(opt) == ("scale_by_learning_rate(learning_rate=0.1) |> sam(rho=0.05, sync_period=2, "
                         "reset_state=True, adversary=scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=1e-15))")
    assert opt != O.sgd(0.1).sam(0.05)
    params = {"w": jnp.ones(2)}
    state = opt.init(params)
    assert opt.get_state(state, "sam/scale_by_learning_rate") == ux.EmptyState()
    assert isinstance(opt.get_state(state, "sam.adversary")[0], type(ux.scale_by_adam().init(params)[0]))


# --------------------------------------------------------------------------
# Optimistic gradients


PARITY = [
    ("scale_by_optimistic_gradient", lambda: ux.scale_by_optimistic_gradient(alpha=0.7, beta=1.3),
     lambda: optax.scale_by_optimistic_gradient(alpha=0.7, beta=1.3)),
    ("optimistic_gradient_descent", lambda: O.optimistic_gradient_descent(0.05, alpha=0.5, beta=0.8),
     lambda: optax.optimistic_gradient_descent(0.05, alpha=0.5, beta=0.8)),
    # (optax 0.2.8 types alpha and beta as schedulable but adds them as numbers: only the learning rate here)
    ("optimistic_gradient_descent_scheduled", lambda: O.optimistic_gradient_descent(
        ux.schedules.exponential_decay(0.05, decay_rate=0.5, transition_steps=5), alpha=0.5),
     lambda: optax.optimistic_gradient_descent(optax.exponential_decay(0.05, 5, 0.5), alpha=0.5)),
    ("optimistic_adam", lambda: O.optimistic_adam(0.05, alpha=0.5, beta=0.9, b1=0.8, b2=0.99, eps=1e-7),
     lambda: optax.optimistic_adam_v2(0.05, alpha=0.5, beta=0.9, b1=0.8, b2=0.99, eps=1e-7, nesterov=False)),
    ("optimistic_adam_nesterov", lambda: O.optimistic_adam(0.05, nesterov=True),
     lambda: optax.optimistic_adam_v2(0.05)),
]


@pytest.mark.parametrize("name, ours, theirs", PARITY, ids=[p[0] for p in PARITY])
def test_optimistic_parity_with_optax_over_20_steps(name, ours, theirs):
    opt, ref = ours(), theirs()
    params = nested_tree(seed=0)
    p1 = p2 = params
    s1, s2 = opt.init(params), ref.init(params)
    step1, step2 = jax.jit(opt.update), jax.jit(ref.update)
    for t in range(20):
        grads = _scaled_grads(t, t + 1)
        u1, s1 = step1(grads, s1, p1)
        u2, s2 = step2(grads, s2, p2)
        _close(u1, u2, f"{name} step {t + 1}")
        p1, p2 = ux.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    _close(p1, p2, f"{name} params")


def test_optimistic_adam_follows_algorithm_1_of_the_paper_in_float64():
    lr, b1, b2, eps = 0.05, 0.8, 0.99, 1e-8
    opt = O.optimistic_adam(lr, b1=b1, b2=b2, eps=eps)
    params = nested_tree(seed=0)
    theta = [np.asarray(p, np.float64) for p in jax.tree.leaves(params)]
    m = [np.zeros_like(p) for p in theta]
    v = [np.zeros_like(p) for p in theta]
    previous = None
    state, step = opt.init(params), jax.jit(opt.update)
    for t in range(1, 21):
        grads = _scaled_grads(t, t)
        u, state = step(grads, state, params)
        params = ux.apply_updates(params, u)
        g64 = [np.asarray(g, np.float64) for g in jax.tree.leaves(grads)]
        m = [b1 * a + (1 - b1) * g for a, g in zip(m, g64)]
        v = [b2 * a + (1 - b2) * g * g for a, g in zip(v, g64)]
        r = [(a / (1 - b1**t)) / (np.sqrt(c / (1 - b2**t)) + eps) for a, c in zip(m, v)]
        previous = r if previous is None else previous  # m̂_0 is 0/0: the first step is -η·r_1, as in optax
        theta = [p - 2 * lr * a + lr * b for p, a, b in zip(theta, r, previous)]
        previous = r
        for a, e in zip(jax.tree.leaves(params), theta):
            np.testing.assert_allclose(np.asarray(a), e, rtol=1e-5, atol=1e-6, err_msg=f"step {t}")


def test_optimistic_gradient_descent_converges_on_a_bilinear_game_where_gradient_descent_spirals_out():
    def play(opt, steps=400):
        params = {"x": jnp.asarray(1.0), "y": jnp.asarray(2.0)}
        state = opt.init(params)

        @jax.jit
        def step(params, state):
            grads = {"x": params["y"], "y": -params["x"]}  # min over x, max over y of x·y
            u, state = opt.update(grads, state, params)
            return ux.apply_updates(params, u), state

        for _ in range(steps):
            params, state = step(params, state)
        return float(jnp.hypot(params["x"], params["y"]))

    start = float(np.hypot(1.0, 2.0))
    assert play(O.optimistic_gradient_descent(0.2)) < 1e-3 * start
    assert play(O.sgd(0.2)) > 1e3 * start


# --------------------------------------------------------------------------
# Checkpoints (tests/test_checkpoints.py runs the optimizers in a fresh process; these also cover the wrappers)


CHECKPOINTED = {
    "optimistic_adam": lambda: O.optimistic_adam(0.05),
    "optimistic_gradient_descent": lambda: O.optimistic_gradient_descent(0.05),
    "lookahead": lambda: O.adam(0.05).lookahead(3, 0.5, reset_state=True),
    "sam": lambda: O.adam(0.05).sam(0.05, 3, adversary=ux.trace(0.5)),
}


@pytest.mark.parametrize("name", sorted(CHECKPOINTED))
def test_a_run_resumed_from_a_flax_checkpoint_equals_the_uninterrupted_one_bit_for_bit(name):
    from checkpoint_cases import flat, params, run
    from flax import serialization

    opt = CHECKPOINTED[name]()
    expected, _ = run(opt, params(), opt.init(params()), 5, 0)
    p, state = run(opt, params(), opt.init(params()), 2, 0)  # stops mid-cycle: an ascent or a fast step
    restored = serialization.from_bytes(opt.init(params()), serialization.to_bytes(state))
    got, _ = run(opt, p, restored, 3, 2)
    for key, value in flat(expected).items():
        assert flat(got)[key].tobytes() == value.tobytes(), (name, key)
