"""MoMo and MoMo-Adam: the paper's Algorithms 1 and 2 in float64 NumPy, parity with optax.contrib over 20 jitted steps
on a nested tree, the model's identities, and optax's weight-decay form.

The paper's weight decay is a proximal step: x' = (x - τd) / (1 + αλ), the minimiser of the truncated model plus
λ/2‖y‖² + ‖y - x‖²/(2α) (the authors' implementation divides the same way). optax 0.2.8 computes the same τ but
takes x' = x / (1 + αλ) - τd, an AdamW-like decoupled decay ("in similar fashion to AdamW", its docstring says):
``decay_form="decoupled"`` reproduces it, and the tests below hold each form to its own oracle. With λ = 0 the two
are the same, and optax is the oracle for both lower-bound modes.
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
RTOL, ATOL = 2e-5, 2e-6
TARGET = nested_tree(seed=7)


def _weight(t):
    return 1.0 + 0.5 * np.sin(t)  # a different mini-batch each step: the loss's curvature changes


def _loss(params, t, floor=0.3):
    """``floor + w_t/2 Σ (x - c)²`` over every leaf of the nested tree: its minimum is ``floor``."""
    sq = sum(jnp.sum((p - c) ** 2) for p, c in zip(jax.tree.leaves(params), jax.tree.leaves(TARGET)))
    return floor + 0.5 * _weight(t) * sq


def _run_ours(opt, steps=20, floor=0.3):
    params, state = nested_tree(seed=0), None
    state = opt.init(params)
    step = jax.jit(opt.update)
    trajectory = []
    for t in range(steps):
        value, grads = jax.value_and_grad(_loss)(params, t, floor)
        updates, state = step(grads, state, params, loss=value)
        params = ux.apply_updates(params, updates)
        trajectory.append((updates, params))
    return trajectory, state


def _run_optax(tx, steps=20, floor=0.3):
    params = nested_tree(seed=0)
    state = tx.init(params)
    step = jax.jit(tx.update)
    trajectory = []
    for t in range(steps):
        value, grads = jax.value_and_grad(_loss)(params, t, floor)
        updates, state = step(grads, state, params, value=value)
        params = optax.apply_updates(params, updates)
        trajectory.append((updates, params))
    return trajectory


def _schedule(count):
    return 0.8 / (1.0 + 0.05 * count.astype(jnp.float32))


CASES = [
    ("momo", lambda: O.momo(1.0, momentum=0.9), lambda: optax.contrib.momo(1.0, beta=0.9)),
    ("momo_small_rate", lambda: O.momo(0.05, momentum=0.5), lambda: optax.contrib.momo(0.05, beta=0.5)),
    ("momo_adapt", lambda: O.momo(1.0, momentum=0.9, lower_bound=0.1, adapt_lower_bound=True),
     lambda: optax.contrib.momo(1.0, beta=0.9, lower_bound=0.1, adapt_lower_bound=True)),
    ("momo_scheduled", lambda: O.momo(_schedule, lower_bound=0.2), lambda: optax.contrib.momo(_schedule, lower_bound=0.2)),
    ("momo_decoupled", lambda: O.momo(0.5, decay=0.1, decay_form="decoupled"),
     lambda: optax.contrib.momo(0.5, weight_decay=0.1)),
    ("momo_decoupled_adapt", lambda: O.momo(1.0, decay=0.05, adapt_lower_bound=True, decay_form="decoupled"),
     lambda: optax.contrib.momo(1.0, weight_decay=0.05, adapt_lower_bound=True)),
    ("momo_adam", lambda: O.momo_adam(0.1), lambda: optax.contrib.momo_adam(0.1)),
    ("momo_adam_options", lambda: O.momo_adam(0.05, b1=0.8, b2=0.99, eps=1e-6, lower_bound=0.1),
     lambda: optax.contrib.momo_adam(0.05, b1=0.8, b2=0.99, eps=1e-6, lower_bound=0.1)),
    ("momo_adam_adapt", lambda: O.momo_adam(0.1, adapt_lower_bound=True),
     lambda: optax.contrib.momo_adam(0.1, adapt_lower_bound=True)),
    ("momo_adam_scheduled", lambda: O.momo_adam(_schedule), lambda: optax.contrib.momo_adam(_schedule)),
    ("momo_adam_decoupled", lambda: O.momo_adam(0.1, decay=0.1, adapt_lower_bound=True, decay_form="decoupled"),
     lambda: optax.contrib.momo_adam(0.1, weight_decay=0.1, adapt_lower_bound=True)),
]


@pytest.mark.parametrize("ours, theirs", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parity_with_optax_over_20_jitted_steps(ours, theirs):
    mine, reference = _run_ours(ours())[0], _run_optax(theirs())
    for t, ((u1, p1), (u2, p2)) in enumerate(zip(mine, reference)):
        assert jax.tree.structure(u1) == jax.tree.structure(u2)
        for x, y in zip(jax.tree.leaves((u1, p1)), jax.tree.leaves((u2, p2))):
            np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL, err_msg=f"step {t}")


# --------------------------------------------------------------------------
# The paper's algorithms in float64 NumPy (the params flattened into one vector: only inner products are global)


def _flat(tree):
    return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)])


def _paper(kind, steps, *, lr, lower_bound, decay, adapt, floor=0.3, beta=0.9, b1=0.9, b2=0.999, eps=1e-8):
    """MoMo (Algorithm 1) or MoMo-Adam (Algorithm 2) with the proximal weight decay and the online lower bound;
    the loss and its gradient in closed form. Returns the iterates and how often the lower bound was reset."""
    x, c = _flat(nested_tree(seed=0)), _flat(TARGET)
    d, v = np.zeros_like(x), np.zeros_like(x)
    f_bar = gamma = 0.0
    f_star, resets, iterates = lower_bound, 0, []
    for t in range(steps):
        k = t + 1
        f = floor + 0.5 * _weight(t) * np.sum((x - c) ** 2)
        g = _weight(t) * (x - c)
        if kind == "momo":
            b, rho = (0.0 if k == 1 else beta), 1.0  # Algorithm 1 starts its averages at the first values
            d = b * d + (1 - b) * g
            direction = d
        else:
            b, rho = b1, 1 - b1**k
            d = b1 * d + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            direction = d / (np.sqrt(v / (1 - b2**k)) + eps)  # D_k^-1 d_k
        f_bar = b * f_bar + (1 - b) * f
        gamma = b * gamma + (1 - b) * (g @ x)
        shrink = 1 + lr * decay
        norm = d @ direction
        if adapt:
            cap = shrink * (f_bar - gamma) + d @ x
            if cap < shrink * rho * f_star:
                f_star, resets = max(cap / (2 * rho * shrink), lower_bound), resets + 1
        tau = min(lr / rho, max(shrink * (f_bar - rho * f_star - gamma) + d @ x, 0.0) / norm)
        if adapt:
            f_star = max((f_bar + d @ x - gamma - tau / 2 * norm) / rho, lower_bound)
        x = (x - tau * direction) / shrink
        iterates.append(x)
    return iterates, resets


@pytest.mark.parametrize("kind, lr, lower_bound, decay, adapt", [
    ("momo", 1.0, 0.0, 0.0, False),
    ("momo", 1.0, 0.2, 0.1, False),
    ("momo", 0.7, 0.0, 0.05, True),
    ("momo_adam", 0.1, 0.0, 0.1, False),
    ("momo_adam", 0.1, 0.0, 0.05, True),
])
def test_the_papers_algorithm_in_float64(kind, lr, lower_bound, decay, adapt):
    if kind == "momo":
        opt = O.momo(lr, lower_bound=lower_bound, decay=decay, adapt_lower_bound=adapt)
    else:
        opt = O.momo_adam(lr, lower_bound=lower_bound, decay=decay, adapt_lower_bound=adapt)
    trajectory, state = _run_ours(opt)
    iterates, resets = _paper(kind, 20, lr=lr, lower_bound=lower_bound, decay=decay, adapt=adapt)
    for t, ((_, params), x) in enumerate(zip(trajectory, iterates)):
        np.testing.assert_allclose(_flat(params), x, rtol=1e-4, atol=1e-5, err_msg=f"step {t}")
    if adapt:
        assert resets > 0  # the reset branch ran, and was matched
        assert float(state[0].lower_bound) > lower_bound  # the estimate moved up from the floor


def _model_after_one_step(decay_form, *, lr=1.0, decay=0.5, loss=2.0):
    """One MoMo step from x with gradient g; the model f + <g, y - x> at the new point, and what was needed."""
    params = {"a": jnp.array([1.0, -2.0]), "b": [jnp.array(0.5)]}
    grads = {"a": jnp.array([0.5, 1.0]), "b": [jnp.array(-1.0)]}
    opt = ux.scale_by_momo(learning_rate=lr, decay=decay, decay_form=decay_form)
    u, _ = opt.update(grads, opt.init(params), params, loss=loss)
    new = jax.tree.map(lambda p, s: p - s, params, u)
    g, x, x_new = _flat(grads), _flat(params), _flat(new)
    return loss + g @ (x_new - x), g, x, x_new


def test_the_proximal_step_lands_on_the_lower_bound_and_optaxs_form_below_it():
    """With the Polyak term active (τ < α), the paper's step lands exactly where the model meets f_* = 0; optax's
    decoupled form takes (1 + αλ) times that step along d, and lands τ·αλ‖d‖²/(1 + αλ) below f_*."""
    lr, decay = 4.0, 0.25
    model, g, x, x_new = _model_after_one_step("proximal", lr=lr, decay=decay)
    np.testing.assert_allclose(model, 0.0, atol=1e-6)
    shrink = 1 + lr * decay
    tau = (shrink * (2.0 - g @ x) + g @ x) / (g @ g)  # the Polyak term of the first step (f̄ = f, γ = <g, x>)
    assert tau < lr
    np.testing.assert_allclose(x_new, (x - tau * g) / shrink, rtol=1e-6)
    model_dec, *_, x_dec = _model_after_one_step("decoupled", lr=lr, decay=decay)
    np.testing.assert_allclose(x_dec, x / shrink - tau * g, rtol=1e-6)
    np.testing.assert_allclose(model_dec, -tau * lr * decay * (g @ g) / shrink, rtol=1e-5)


def test_the_two_decay_forms_agree_without_decay():
    a = _run_ours(O.momo_adam(0.1, adapt_lower_bound=True))[0]
    b = _run_ours(O.momo_adam(0.1, adapt_lower_bound=True, decay_form="decoupled"))[0]
    for (u1, _), (u2, _) in zip(a, b):
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            np.testing.assert_array_equal(x, y)


def test_a_zero_momentum_step_is_zero_and_the_decay_still_applies():
    params = {"w": jnp.array([1.0, 2.0])}
    opt = ux.scale_by_momo(learning_rate=0.5, decay=1.0)
    u, state = opt.update({"w": jnp.zeros(2)}, opt.init(params), params, loss=1.0)
    np.testing.assert_allclose(u["w"], params["w"] * 0.5 / 1.5, rtol=1e-6)  # x - x/(1 + αλ)
    assert bool(jnp.all(jnp.isfinite(state[0].lower_bound)))


def test_the_lower_bound_is_in_the_state_by_path():
    opt = O.momo(adapt_lower_bound=True)
    _, state = _run_ours(opt, steps=5)
    bound = opt.get_state(state, "scale_by_momo.lower_bound")
    assert bound.shape == () and float(bound) >= 0.0


def test_errors_name_the_call_and_the_option():
    params = {"w": jnp.ones(2)}
    opt = ux.scale_by_momo()
    with pytest.raises(ValueError, match=r"scale_by_momo needs the loss: call update\(.*loss=loss\).*value="):
        opt.update(params, opt.init(params), params)
    with pytest.raises(TypeError, match=r"scale_by_momo_adam: update\(..., loss=...\) got float32 of shape \(3,\)"):
        ux.scale_by_momo_adam().update(params, ux.scale_by_momo_adam().init(params), params, loss=jnp.ones(3))
    with pytest.raises(ValueError, match=r"scale_by_momo\(momentum=1.0\)"):
        ux.scale_by_momo(momentum=1.0)
    with pytest.raises(ValueError, match=r"scale_by_momo_adam\(decay=-0.1\)"):
        ux.scale_by_momo_adam(decay=-0.1)
    with pytest.raises(ValueError, match=r"decay_form"):
        ux.scale_by_momo(decay_form="adamw")
    with pytest.raises(ValueError, match=r"momo\(learning_rate=-1.0\)"):
        O.momo(-1.0)
    with pytest.raises(TypeError, match=r"optax's name; updax's is decay"):
        O.momo(weight_decay=0.1)
    with pytest.raises(TypeError, match=r"optax's name; updax's is momentum"):
        O.momo(beta=0.5)
    with pytest.raises(ValueError, match=r"scale_by_momo.*params"):
        opt.update(params, opt.init(params), loss=1.0)
    c = {"w": jnp.ones(2, jnp.complex64)}
    with pytest.raises(TypeError, match=r"scale_by_momo: complex updates are not supported"):
        opt.update(c, opt.init(c), c, loss=1.0)
