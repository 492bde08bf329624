"""Sophia (Liu et al. 2023) against optax.contrib.sophia over 25 steps on a nested tree, with the same objective
and the same key sequence; against a float64 NumPy implementation of the paper's Algorithm 3 where Hutchinson's
estimate is exact; the estimator's expectation; the degenerate cases; and how the objective is given."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import updax as ux

STEPS = 25


# --------------------------------------------------------------------------
# Parity with optax


def _params():
    """Dicts, a list, a tuple, a None leaf and a 0-d leaf: 28 numbers."""
    rng = np.random.default_rng(0)

    def arr(*shape):
        return jnp.asarray(rng.normal(size=shape), jnp.float32)

    return {"dense": {"w": arr(3, 4), "b": arr(4)}, "layers": [arr(2, 3), (None, arr(5))], "scale": arr()}


def _flat(params):
    return jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(params)])


def _coupling():
    """A positive definite matrix over the 28 numbers, far from diagonal: Hutchinson's estimate of its diagonal
    depends on the Rademacher vectors drawn, so the two sides agree only if they draw the same ones."""
    rng = np.random.default_rng(1)
    b = rng.normal(size=(28, 28)) / np.sqrt(28)
    return b @ b.T + np.diag(np.linspace(0.5, 3.0, 28))


COUPLING = jnp.asarray(_coupling(), jnp.float32)


def objective(params):
    """``xᵀAx/2 + Σ x⁴/20`` over the flattened tree: a Hessian that is not diagonal and changes from point to
    point."""
    x = _flat(params)
    return 0.5 * x @ COUPLING @ x + 0.05 * jnp.sum(x**4)


def _matrices(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


#: Options that make most coordinates' ratios fall inside the clip, that leave the clip out, and the defaults.
CASES = {
    "clipped_sometimes": dict(b1=0.9, b2=0.95, eps=1e-8, gamma=1.0, clip_threshold=0.8, update_interval=3,
                              decay=0.05),
    # (eps bounds the first step, which divides the momentum by max(0, eps) with no clip to bound it)
    "no_clip": dict(b1=0.8, b2=0.5, eps=0.5, gamma=2.0, clip_threshold=None, update_interval=1, decay=0.0),
    "defaults": {},
}


def _trajectory(opt, update, apply, steps=STEPS):
    """The params and states after each of ``steps`` jitted steps on ``objective``, each at its own params."""

    @jax.jit
    def step(params, state):
        updates, state = update(opt, jax.grad(objective)(params), state, params)
        return apply(params, updates), state

    params, state, out = _params(), opt.init(_params()), []
    for _ in range(steps):
        params, state = step(params, state)
        out.append((params, state))
    return out


def _ours(options, key=7):
    return ux.optimizers.sophia(0.1, mask=_matrices, key=key, **options)


def _run_ours(options, key=7):
    return _trajectory(_ours(options, key), lambda o, g, s, p: o.update(g, s, p, value_fn=objective),
                       ux.apply_updates)


def _run_optax(options):
    options = dict(options)
    decay = options.pop("decay", 1e-4)
    opt = optax.contrib.sophia(0.1, weight_decay=decay, weight_decay_mask=_matrices, **options,
                               hessian_diagonal_fn=optax.contrib.hutchinson_estimator_diag_hessian(
                                   jax.random.PRNGKey(7)))
    return _trajectory(opt, lambda o, g, s, p: o.update(g, s, p, obj_fn=objective), optax.apply_updates)


def _largest_difference(a, b):
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("case", sorted(CASES))
def test_sophia_matches_optax_over_25_steps_with_the_same_key(case):
    """Params, the Hessian estimate and the key step by step. The largest differences over the 25 steps are float32
    rounding: in the params (steps of 0.1 at most) 7.5e-08 with ``clipped_sometimes``, 1.2e-07 with ``no_clip``
    and 0 with the defaults; in the Hessian estimate 0, 2.4e-07 and 0."""
    ours, theirs = _run_ours(CASES[case]), _run_optax(CASES[case])
    worst = 0.0
    for t, ((p, s), (q, r)) in enumerate(zip(ours, theirs)):
        assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(p)), f"step {t + 1}"
        worst = max(worst, _largest_difference(p, q))
        np.testing.assert_allclose(_flat(s[0].hessian), _flat(r[0].nu), rtol=1e-6, atol=1e-7,
                                   err_msg=f"the Hessian estimate at step {t + 1}")
        np.testing.assert_array_equal(s[0].key, r[0].hessian_fn_state.key, err_msg=f"the key at step {t + 1}")
    assert worst < 1e-6, worst
    # The test can fail: another key draws other vectors, and the estimates and then the params differ.
    if case != "defaults":  # (the defaults clip nearly every coordinate: the step is then ±lr whatever the key)
        other = _run_ours(CASES[case], key=8)
        assert _largest_difference(other[-1][0], ours[-1][0]) > 1e-3


def test_the_optax_cases_do_not_always_clip():
    """With ``clipped_sometimes`` most coordinates of the last steps are strictly inside the clip, so the parity
    above checks the ratio, not only its sign."""
    options = {k: v for k, v in CASES["clipped_sometimes"].items() if k != "decay"}
    opt = ux.scale_by_sophia(**options, key=7, objective=objective)
    params = _params()
    state = opt.init(params)
    inside = []
    for _ in range(STEPS):
        u, state = opt.update(jax.grad(objective)(params), state, params)
        params = jax.tree.map(lambda p, u: p - 0.1 * u, params, u)
        inside.append(float(jnp.mean(jnp.abs(_flat(u)) < 0.8 * 0.999)))
    assert min(inside[-10:]) > 0.5, inside


# --------------------------------------------------------------------------
# The paper's algorithm, in float64, where Hutchinson's estimate is exact


CURVATURE = np.array([0.5, 2.0, 10.0, 40.0, 0.1, 1.0])
CENTRE = np.array([1.0, -2.0, 0.5, 3.0, -1.0, 0.25])


def separable(w):
    """``Σ c (w - w*)²/2``: its Hessian is diagonal, so z ⊙ Hz = c exactly for every Rademacher z."""
    return 0.5 * jnp.sum(jnp.asarray(CURVATURE, w.dtype) * (w - jnp.asarray(CENTRE, w.dtype)) ** 2)


def _algorithm_3(steps, *, lr, b1, b2, eps, gamma, rho, k, decay):
    """The paper's Algorithm 3 with Hutchinson's estimator, in float64, with optax's two changes (the docstring
    says them): the momentum is bias-corrected, and the estimate of step t is used from step t + 1 on."""
    w, m, h = np.zeros(6), np.zeros(6), np.zeros(6)
    out = []
    for t in range(1, steps + 1):
        g = CURVATURE * (w - CENTRE)
        m = b1 * m + (1 - b1) * g
        m_hat = m / (1 - b1**t)
        step = np.clip(m_hat / np.maximum(gamma * h, eps), -rho, rho)
        if t % k == 1 % k:
            h = b2 * h + (1 - b2) * CURVATURE  # the estimate, exact here
        w = w - lr * (step + decay * w)
        out.append(w)
    return np.array(out)


@pytest.mark.parametrize("k", [1, 4])
def test_sophia_follows_the_papers_algorithm_in_float64_over_20_steps(k):
    options = dict(b1=0.9, b2=0.8, eps=1e-8, gamma=0.5, clip_threshold=1.5, update_interval=k)
    expected = _algorithm_3(20, lr=0.2, b1=0.9, b2=0.8, eps=1e-8, gamma=0.5, rho=1.5, k=k, decay=0.01)
    opt = ux.optimizers.sophia(0.2, decay=0.01, objective=separable, **options)
    w = jnp.zeros(6)
    state = opt.init(w)
    for t in range(20):
        u, state = opt.update(jax.grad(separable)(w), state, w)
        w = ux.apply_updates(w, u)
        np.testing.assert_allclose(np.asarray(w, np.float64), expected[t], rtol=1e-5, atol=1e-6,
                                   err_msg=f"step {t + 1}")
    assert np.abs(expected[-1] - CENTRE).max() < np.abs(CENTRE).max()  # (it moved towards the minimum)


def test_without_momentum_and_clip_the_step_is_newtons():
    """b1 = b2 = 0, γ = 1, no clip: the ratio is g / diag(H), Newton's step, which on a separable quadratic
    lands on the minimum in one step (the first step only estimates the curvature: h is 0 before it)."""
    opt = ux.scale_by_sophia(b1=0.0, b2=0.0, gamma=1.0, clip_threshold=None, update_interval=1, objective=separable)
    w = jnp.zeros(6)
    _, state = opt.update(jax.grad(separable)(w), opt.init(w), w)
    u, _ = opt.update(jax.grad(separable)(w), state, w)
    np.testing.assert_allclose(w - u, CENTRE, rtol=1e-6)


def test_hutchinsons_estimate_is_unbiased_and_drawn_afresh_at_each_refresh():
    """With b2 = 0 the state holds the last estimate z ⊙ Az. Over 4000 refreshes (a new key each) its mean is
    diag(A), within 5 standard errors: Var(z_i (Az)_i) = Σ_{j≠i} A_ij²."""
    a = np.asarray(_coupling()[:6, :6])

    def quadratic(w):
        return 0.5 * w @ jnp.asarray(a, jnp.float32) @ w

    opt = ux.scale_by_sophia(b2=0.0, update_interval=1, key=11, objective=quadratic)
    w = jnp.linspace(-1.0, 1.0, 6)

    def body(state, _):
        _, state = opt.update(jnp.ones(6), state, w)
        return state, state[0].hessian

    n = 4000
    _, estimates = jax.jit(lambda s: jax.lax.scan(body, s, None, length=n))(opt.init(w))
    estimates = np.asarray(estimates, np.float64)
    error = np.sqrt((np.sum(a**2, axis=1) - np.diag(a) ** 2) / n)
    assert np.all(np.abs(estimates.mean(axis=0) - np.diag(a)) < 5 * error), (estimates.mean(axis=0), np.diag(a))
    # A new vector at each refresh: 50 refreshes show more than half of the 32 estimates ±z can give.
    assert len({tuple(e) for e in estimates[:50]}) > 16


def test_the_estimate_is_refreshed_every_update_interval_steps():
    opt = ux.scale_by_sophia(update_interval=3, objective=objective)
    params = _params()
    state = opt.init(params)
    keys, hessians = [], []
    for t in range(7):
        _, state = opt.update(jax.grad(objective)(params), state, params)
        keys.append(tuple(np.asarray(state[0].key)))
        hessians.append(np.asarray(_flat(state[0].hessian)))
    # Refreshed at steps 1, 4 and 7: the key moves then, and the estimate changes; in between both stay.
    assert [keys[i] != keys[i - 1] for i in range(1, 7)] == [False, False, True, False, False, True]
    assert [not np.array_equal(hessians[i], hessians[i - 1]) for i in range(1, 7)] == [False, False, True, False,
                                                                                       False, True]


# --------------------------------------------------------------------------
# Degenerate cases: no NaN, the step bounded


def _steps(opt, f, w, steps=30):
    out = []
    state = opt.init(w)
    for _ in range(steps):
        u, state = opt.update(jax.grad(f)(w), state, w)
        out.append(u)
        w = w - 0.1 * u
    return jnp.stack(out), state


def test_a_zero_hessian_estimate_gives_clipped_steps_of_the_momentums_sign():
    """A linear objective: the estimate is 0, the denominator eps, and every step is ±clip_threshold."""

    def linear(w):
        return jnp.sum(jnp.array([3.0, -1e-3, 0.0, 1e30]) * w)

    updates, state = _steps(ux.scale_by_sophia(clip_threshold=0.7, update_interval=1, objective=linear), linear,
                            jnp.zeros(4))
    assert np.all(np.isfinite(updates)) and np.all(np.isfinite(state[0].hessian))
    np.testing.assert_array_equal(updates, np.broadcast_to(np.float32([0.7, -0.7, 0.0, 0.7]), updates.shape))


def test_zero_momentum_and_zero_curvature_give_zero_even_without_eps():
    """0/0: eps = 0 and a zero Hessian estimate leave the denominator 0; a zero momentum steps by 0, not NaN."""

    def flat(w):
        return jnp.zeros([], w.dtype) * jnp.sum(w)

    updates, _ = _steps(ux.scale_by_sophia(eps=0.0, update_interval=1, objective=flat), flat, jnp.ones(3))
    np.testing.assert_array_equal(updates, np.zeros_like(updates))


def test_negative_curvature_is_clipped_and_still_descends():
    """A concave objective: γh < 0, the denominator eps, and the step is -clip_threshold·sign(g) (no Newton step
    towards the maximum)."""

    def concave(w):
        return -0.5 * jnp.sum(w**2)

    w = jnp.array([0.5, -2.0])
    updates, _ = _steps(ux.scale_by_sophia(b1=0.0, update_interval=1, objective=concave), concave, w, steps=5)
    np.testing.assert_array_equal(updates, np.broadcast_to([-1.0, 1.0], updates.shape))
    assert np.all(np.isfinite(updates))


def test_bfloat16_params_keep_float32_statistics():
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), _params())
    opt = ux.optimizers.sophia(objective=objective)
    state = opt.init(params)
    for _ in range(3):
        grads = jax.grad(objective)(params)
        updates, state = opt.update(grads, state, params)
        params = ux.apply_updates(params, updates)
    assert {x.dtype for x in jax.tree.leaves(state[0].mu)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(state[0].hessian)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(params))


# --------------------------------------------------------------------------
# How the objective is given


def test_the_objective_gets_the_keywords_of_update_it_names():
    def batch_loss(w, batch):
        return 0.5 * batch * jnp.sum(w**2)

    opt = ux.scale_by_sophia(b2=0.0, update_interval=1)
    w = jnp.ones(3)
    _, state = opt.update(w, opt.init(w), w, value_fn=batch_loss, batch=4.0, loss=1.0)
    np.testing.assert_allclose(state[0].hessian, 4.0 * np.ones(3))


def test_the_objective_is_refused_by_name_when_missing_doubled_or_not_a_scalar():
    w = jnp.ones(3)
    opt = ux.scale_by_sophia()
    with pytest.raises(ValueError, match=r"scale_by_sophia needs the objective.*value_fn=f"):
        opt.update(w, opt.init(w), w)
    with pytest.raises(ValueError, match=r"obj_fn= is optax's name; updax's is value_fn="):
        opt.update(w, opt.init(w), w, obj_fn=jnp.sum)
    built = ux.scale_by_sophia(objective=jnp.sum)
    with pytest.raises(ValueError, match="give one of them"):
        built.update(w, built.init(w), w, value_fn=jnp.sum)
    with pytest.raises(TypeError, match=r"value_fn\(params\) returned float32 of shape \(3,\)"):
        opt.update(w, opt.init(w), w, value_fn=lambda p: p**2)
    with pytest.raises(TypeError, match="complex updates are not supported"):
        opt.update(w.astype(jnp.complex64), opt.init(w), w, value_fn=jnp.sum)


@pytest.mark.parametrize("options, message", [
    (dict(b1=1.0), r"scale_by_sophia\(b1=1.0\): b1 must be in \[0, 1\)"),
    (dict(b2=-0.1), r"b2 must be in \[0, 1\)"),
    (dict(gamma=-1.0), r"gamma must be in \[0, inf\)"),
    (dict(eps=-1.0), r"eps must be in \[0, inf\)"),
    (dict(clip_threshold=0.0), r"clip_threshold must be"),
    (dict(update_interval=0), r"update_interval must be a positive integer"),
    (dict(key=-1), r"key must be an int seed"),
    (dict(print_win_rate_every_n_steps=-1), r"print_win_rate_every_n_steps must be a non-negative integer"),
    (dict(print_win_rate_every_n_steps=2.5), r"print_win_rate_every_n_steps must be a non-negative integer"),
    (dict(verbose=1), r"verbose must be True or False"),
])
def test_bad_options_are_refused_by_name(options, message):
    with pytest.raises((ValueError, TypeError), match=message):
        ux.scale_by_sophia(**options)


def _sophia(**options):
    """b1 = b2 = 0 and a refresh every step: from step 2 the estimate is the exact diagonal a (Hutchinson's estimate
    of a diagonal Hessian is exact), so the step is m / (γ a) = w / γ."""
    return ux.scale_by_sophia(**{**dict(b1=0.0, b2=0.0, gamma=1.0, clip_threshold=1.0, update_interval=1,
                                        verbose=True), **options})


def _printed_rates(capsys, steps, jit, **options):
    """What ``steps`` steps of :func:`_sophia` on the quadratic 0.5 Σ a w² at fixed params print; a traced
    ``print_win_rate_every_n_steps`` (as optax's inject_hyperparams passes it) builds the stage inside the step."""
    a, w = jnp.array([1.0, 2.0, 3.0, 4.0]), {"w": jnp.array([1.0, -2.0, 0.5, 3.0])}

    def f(params):
        return 0.5 * jnp.sum(a * params["w"] ** 2)

    def step(g, state, every):
        return _sophia(**{**options, "print_win_rate_every_n_steps": every}).update(g, state, w, value_fn=f)

    every = options.pop("print_win_rate_every_n_steps", 0)
    state = _sophia(**options).init(w)
    for _ in range(steps):
        g = jax.grad(f)(w)
        if jit:
            _, state = jax.jit(step, static_argnums=() if isinstance(every, jax.Array) else (2,))(g, state, every)
        else:
            _, state = step(g, state, every)
    jax.effects_barrier()
    return re.findall(r"scale_by_sophia: win rate ([\d.]+) at step (\d+)", capsys.readouterr().out)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_verbose_prints_the_win_rate_every_n_steps(capsys, jit):
    """With γ = 1 and ρ = 1 only w = 0.5 is inside the clip from step 2: a win rate of 1/4. Step 1 divides by eps
    (nothing estimated yet): every coordinate is clipped, a rate of 0."""
    assert _printed_rates(capsys, 5, jit, print_win_rate_every_n_steps=2) == [("0.25", "2"), ("0.25", "4")]
    assert _printed_rates(capsys, 2, jit, print_win_rate_every_n_steps=1) == [("0.0", "1"), ("0.25", "2")]
    assert _printed_rates(capsys, 2, jit, print_win_rate_every_n_steps=1, clip_threshold=None) == [
        ("1.0", "1"), ("1.0", "2")]  # no clip: every coordinate wins
    assert _printed_rates(capsys, 3, jit, print_win_rate_every_n_steps=1, verbose=False) == []
    assert _printed_rates(capsys, 3, jit, print_win_rate_every_n_steps=0) == []


def test_a_traced_win_rate_period_prints_on_its_multiples(capsys):
    assert _printed_rates(capsys, 4, True, print_win_rate_every_n_steps=jnp.int32(3)) == [("0.25", "3")]
    assert _printed_rates(capsys, 3, True, print_win_rate_every_n_steps=jnp.int32(0)) == []


def test_the_win_rate_options_are_late():
    """At their defaults the options print and compare as before they existed; the optimizer passes them on."""
    assert repr(ux.scale_by_sophia()) == ("scale_by_sophia(b1=0.965, b2=0.99, eps=1e-08, gamma=0.01, "
                                          "clip_threshold=1.0, update_interval=10, key=0)")
    assert ux.scale_by_sophia(verbose=False, print_win_rate_every_n_steps=0) == ux.scale_by_sophia()
    assert ux.optimizers.sophia(verbose=True, print_win_rate_every_n_steps=3).stages[0] == ux.scale_by_sophia(
        verbose=True, print_win_rate_every_n_steps=3).stages[0]


def test_the_optimizer_is_its_pipeline_and_takes_updax_names():
    opt = ux.optimizers.sophia(1e-3, decay=0.1, key=3, objective=separable)
    assert opt == ux.scale_by_sophia(key=3, objective=separable).add_decayed_weights(0.1).scale_by_learning_rate(1e-3)
    with pytest.raises(TypeError, match=r"'weight_decay': optax's name; updax's is decay"):
        ux.optimizers.sophia(weight_decay=0.1)
