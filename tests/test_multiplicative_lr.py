"""scale_by_multiplicative_lr (torch's MultiplicativeLR): the running product against closed forms (a constant
factor is exponential decay, a factor of 1 but at given steps is piecewise_constant), against torch's documented
rule written in float64 NumPy, jitted against eager, by path and under hyperparams_in_state, and its errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from registry import nested_tree

import updax as ux
import updax.schedules as uxs

PATH = "scale_by_multiplicative_lr.learning_rate"
INT32_MAX = int(jnp.iinfo(jnp.int32).max)


def _grads(t):
    return jax.tree.map(lambda x: jnp.cos(x * (t + 1)) + 0.01 * t, nested_tree())


def _run(opt, steps, jit=False):
    """Each step's updates and the state after it."""
    step = jax.jit(opt.update) if jit else opt.update
    state, outs = opt.init(nested_tree()), []
    for t in range(steps):
        updates, state = step(_grads(t), state)
        outs.append((updates, state))
    return outs


def torch_rates(lr0, lr_lambda, steps):
    """MultiplicativeLR's documented rule, in float64, with ``scheduler.step()`` after each optimizer step: the
    rate starts at the optimizer's (``last_epoch = 0``), and each ``step()`` raises ``last_epoch`` by one and
    multiplies the rate by ``lr_lambda(last_epoch)``. The rate each optimizer step uses, in order."""
    rates, lr, last_epoch = [], float(lr0), 0
    for _ in range(steps):
        rates.append(lr)
        last_epoch += 1
        lr *= float(lr_lambda(last_epoch))
    return np.array(rates)


def _epoch_factor(epoch):
    """A factor that changes with the epoch: 0.98 (1 + 0.05 cos e), between 0.931 and 1.029."""
    return 0.98 * (1 + 0.05 * jnp.cos(jnp.asarray(epoch, jnp.float32)))


def _assert_steps(outs, rates, rtol):
    """Every step's updates are ``-rate · g`` and the state holds the next step's rate."""
    for t, (updates, state) in enumerate(outs):
        want = jax.tree.map(lambda g, r=rates[t]: -r * np.asarray(g, np.float64), _grads(t))
        for got, ref in zip(jax.tree.leaves(updates), jax.tree.leaves(want)):
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=1e-9, err_msg=f"step {t}")
        if t + 1 < len(rates):
            np.testing.assert_allclose(state[0].learning_rate, rates[t + 1], rtol=rtol, err_msg=f"state after {t}")
        assert int(state[0].count) == t + 1


def test_a_factor_depending_on_the_epoch_follows_torchs_rule_in_float64():
    steps = 50
    rates = torch_rates(0.3, lambda e: 0.98 * (1 + 0.05 * np.cos(e)), steps)
    assert not np.allclose(rates[1:] / rates[:-1], rates[1] / rates[0])  # (the factor does change)
    _assert_steps(_run(ux.scale_by_multiplicative_lr(0.3, _epoch_factor), steps), rates, rtol=5e-6)


def test_a_constant_factor_is_exponential_decay():
    steps = 40
    ours = _run(ux.scale_by_multiplicative_lr(0.3, lambda epoch: 0.9), steps)
    _assert_steps(ours, 0.3 * 0.9 ** np.arange(steps + 1), rtol=5e-6)  # the closed form, float64
    decay = _run(ux.scale_by_learning_rate(uxs.exponential_decay(0.3, decay_rate=0.9, transition_steps=1)), steps)
    for t, ((u1, _), (u2, _)) in enumerate(zip(ours, decay)):
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            np.testing.assert_allclose(x, y, rtol=5e-6, atol=1e-9, err_msg=f"step {t}")


def test_a_factor_of_one_but_at_given_steps_is_piecewise_constant():
    def drops(epoch):  # x0.1 at step 10, x0.5 at step 25
        return jnp.where(epoch == 10, 0.1, jnp.where(epoch == 25, 0.5, 1.0))

    steps = 35
    ours = _run(ux.scale_by_multiplicative_lr(0.2, drops), steps)
    piecewise = _run(ux.scale_by_learning_rate(uxs.piecewise_constant(0.2, {10: 0.02, 25: 0.01})), steps)
    for t, ((u1, _), (u2, _)) in enumerate(zip(ours, piecewise)):
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=0, err_msg=f"step {t}")
    rates = [float(s[0].learning_rate) for _, s in ours]
    assert rates[8] == rates[0] and rates[9] == pytest.approx(0.02) and rates[24] == pytest.approx(0.01)


def test_jit_equals_eager():
    opt = ux.scale_by_multiplicative_lr(0.3, _epoch_factor)
    for (u1, s1), (u2, s2) in zip(_run(opt, 20), _run(opt, 20, jit=True)):
        for x, y in zip(jax.tree.leaves((u1, s1)), jax.tree.leaves((u2, s2))):
            np.testing.assert_array_equal(x, y)


def test_the_state_holds_the_next_rate_and_a_written_rate_is_multiplied_on():
    """As torch multiplies the optimizer's current rate: a rate written by path is the next step's, then decays."""
    opt = ux.scale_by_multiplicative_lr(0.5, lambda epoch: 0.5)
    g = {"w": jnp.ones(2)}
    state = opt.init(g)
    assert float(opt.get_state(state, PATH)) == 0.5  # before any step: the first rate
    _, state = opt.update(g, state)
    assert float(opt.get_state(state, PATH)) == 0.25
    state = opt.replace_state(state, PATH, 2.0)
    u, state = opt.update(g, state)
    assert u["w"].tolist() == [-2.0, -2.0] and float(opt.get_state(state, PATH)) == 1.0
    with pytest.raises(ValueError, match=r"replace_state\(scale_by_multiplicative_lr.learning_rate=-1.0\): .* "
                                         r"must be in \[0, inf\)"):
        opt.replace_state(state, PATH, -1.0)


def test_under_hyperparams_in_state_the_rate_is_read_and_written_by_path_without_recompiling():
    opt = ux.hyperparams_in_state(ux.scale_by_adam().scale_by_multiplicative_lr(0.1, lambda epoch: 0.5))
    params = {"w": jnp.ones(3)}
    traces = []

    @jax.jit
    def step(g, state):
        traces.append(1)
        return opt.update(g, state, params)

    state = opt.init(params)
    _, state = step({"w": jnp.ones(3)}, state)
    assert float(opt.get_state(state, PATH)) == pytest.approx(0.05)
    state = opt.replace_state(state, PATH, 0.4)
    u, state = step({"w": jnp.ones(3)}, state)
    np.testing.assert_allclose(u["w"], -0.4 * np.ones(3), rtol=1e-5)  # Adam's direction is 1 for a steady gradient
    assert float(opt.get_state(state, PATH)) == pytest.approx(0.2) and len(traces) == 1


def test_past_the_int32_limit_the_epoch_saturates():
    """The count saturates at 2**31 - 1 (tests/test_counters.py): the factor is then asked for that epoch again."""
    opt = ux.scale_by_multiplicative_lr(1.0, lambda epoch: jnp.where(epoch == INT32_MAX, 0.5, 1.0))
    g = {"w": jnp.ones(1)}
    state = opt.replace_state(opt.init(g), "scale_by_multiplicative_lr.count", INT32_MAX - 2)
    rates = []
    for _ in range(4):
        u, state = jax.jit(opt.update)(g, state)
        rates.append(-float(u["w"][0]))
    assert rates == [1.0, 1.0, 0.5, 0.25] and int(state[0].count) == INT32_MAX


BAD = [
    (lambda: ux.scale_by_multiplicative_lr(0.1, 0.9), TypeError,
     r"scale_by_multiplicative_lr\(lr_lambda=0.9\): lr_lambda must be callable"),
    (lambda: ux.scale_by_multiplicative_lr(-0.1, lambda epoch: 0.9), ValueError,
     r"scale_by_multiplicative_lr\(learning_rate=-0.1\): learning_rate must be in \[0, inf\)"),
    (lambda: ux.scale_by_multiplicative_lr(uxs.constant(0.1), lambda epoch: 0.9), TypeError,
     r"learning_rate must be a real number \(it cannot be a schedule here\)"),
]


@pytest.mark.parametrize("build, exc, text", BAD)
def test_bad_options_are_refused_by_name(build, exc, text):
    with pytest.raises(exc, match=text):
        build()


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("factor, exc, text", [
    (lambda epoch: jnp.full(3, 0.9), TypeError, r"lr_lambda\(\.\.\.\) must return a real scalar, not float32\[3\]"),
    (lambda epoch: epoch > 2, TypeError, r"lr_lambda\(\.\.\.\) must return a real scalar, not bool\[\]"),
    (lambda epoch: "0.9", TypeError, r"lr_lambda\(\.\.\.\) must return a real scalar"),
    (lambda epoch: -0.5, ValueError, r"-0.5\): lr_lambda\(\.\.\.\) must be in \[0, inf\)"),
])
def test_a_factor_that_is_not_a_real_scalar_at_least_0_is_refused_by_name(factor, exc, text, jit):
    opt = ux.scale_by_multiplicative_lr(0.1, factor)
    step = jax.jit(opt.update) if jit else opt.update
    with pytest.raises(exc, match=r"scale_by_multiplicative_lr\(lr_lambda\(\.\.\.\)=.*" + text):
        step({"w": jnp.ones(2)}, opt.init(None))


def test_a_traced_negative_factor_is_refused_by_a_checked_step():
    from jax.experimental import checkify

    opt = ux.checked(ux.scale_by_multiplicative_lr(0.1, lambda epoch: 1.0 - epoch.astype(jnp.float32)))
    step = checkify.checkify(jax.jit(opt.update))
    err, (_, state) = step({"w": jnp.ones(2)}, opt.init(None))  # epoch 1: a factor of 0
    err.throw()
    err, _ = step({"w": jnp.ones(2)}, state)  # epoch 2: -1
    with pytest.raises(checkify.JaxRuntimeError, match=r"lr_lambda\(\.\.\.\) must be in \[0, inf\)"):
        err.throw()
