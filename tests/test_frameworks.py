"""updax in the JAX frameworks that hold the optimizer as a static value: Flax NNX's Optimizer, Linen's TrainState
and Equinox's filter_jit. With ux.hyperparams_in_state, three learning rates train with one trace, and give the
params that the same optimizer gives with its state driven by hand."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax.training import train_state

import updax as ux

RATES = (1e-1, 3e-2, 1e-2)
PATH = "scale_by_learning_rate.learning_rate"
X = jnp.asarray(np.random.default_rng(0).normal(size=(16, 3)), jnp.float32)
Y = X @ jnp.asarray([[1.0], [-2.0], [0.5]]) + 0.3


def _optimizer():
    return ux.hyperparams_in_state(ux.clip_by_global_norm(max_norm=1.0).pipe(ux.compose, ux.optimizers.adamw(
        RATES[0], decay=1e-2)))


def _loss(params, x, y):
    return jnp.mean((x @ params["kernel"] + params["bias"] - y) ** 2)


def _by_hand(params):
    """The reference: plain JAX, the optimizer's state driven by replace_state, one step per rate."""
    opt = _optimizer()
    state, losses = opt.init(params), []
    for lr in RATES:
        state = opt.replace_state(state, PATH, lr)
        loss, grads = jax.value_and_grad(_loss)(params, X, Y)
        updates, state = opt.update(grads, state, params)
        params = ux.apply_updates(params, updates)
        losses.append(float(loss))
    return params, losses


def test_flax_nnx_optimizer():
    class Linear(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(3, 1, rngs=rngs)

        def __call__(self, x):
            return self.linear(x)

    model = Linear(nnx.Rngs(0))
    start = {"kernel": model.linear.kernel[...], "bias": model.linear.bias[...]}
    opt = _optimizer()
    optimizer = nnx.Optimizer(model, opt, wrt=nnx.Param)
    traces = []

    @nnx.jit
    def step(model, optimizer):
        traces.append(1)
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(X) - Y) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    losses = []
    for lr in RATES:
        opt.get_state(optimizer.opt_state, PATH)[...] = lr  # the state holds nnx variables: set in place
        losses.append(float(step(model, optimizer)))
    expected, expected_losses = _by_hand(start)
    assert len(traces) == 1
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-6)
    np.testing.assert_allclose(model.linear.kernel[...], expected["kernel"], rtol=1e-6, atol=1e-7)
    assert losses[-1] < losses[0]


def test_flax_linen_train_state():
    params = {"kernel": jnp.zeros((3, 1)), "bias": jnp.zeros(1)}
    opt = _optimizer()
    state = train_state.TrainState.create(apply_fn=None, params=params, tx=opt)
    traces = []

    @jax.jit
    def step(state):
        traces.append(1)
        loss, grads = jax.value_and_grad(_loss)(state.params, X, Y)
        return state.apply_gradients(grads=grads), loss

    losses = []
    for lr in RATES:
        state = state.replace(opt_state=opt.replace_state(state.opt_state, PATH, lr))
        state, loss = step(state)
        losses.append(float(loss))
    expected, expected_losses = _by_hand(params)
    assert len(traces) == 1
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-6)
    np.testing.assert_allclose(state.params["kernel"], expected["kernel"], rtol=1e-6, atol=1e-7)


def test_equinox_filter_jit():
    """filter_jit treats the optimizer's Python floats as static: a plain optimizer rebuilt with each rate traces
    once per rate; one in hyperparams_in_state mode traces once."""
    model = eqx.nn.Linear(3, 1, key=jax.random.key(0))
    traces = []

    @eqx.filter_jit
    def step(model, opt, state):
        traces.append(1)
        loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean((jax.vmap(m)(X) - Y) ** 2))(model)
        params = eqx.filter(model, eqx.is_array)
        updates, state = opt.update(eqx.filter(grads, eqx.is_array), state, params)
        return eqx.apply_updates(model, updates), state, loss

    start = {"kernel": model.weight.T, "bias": model.bias}
    plain_model = model
    for lr in RATES:  # the problem: a new trace per rate
        plain = ux.clip_by_global_norm(max_norm=1.0).pipe(ux.compose, ux.optimizers.adamw(lr, decay=1e-2))
        plain_model, _, _ = step(plain_model, plain, plain.init(eqx.filter(plain_model, eqx.is_array)))
    assert len(traces) == len(RATES)

    traces.clear()
    opt = _optimizer()
    state, losses = opt.init(eqx.filter(model, eqx.is_array)), []
    for lr in RATES:
        state = opt.replace_state(state, PATH, lr)
        model, state, loss = step(model, opt, state)
        losses.append(float(loss))
    expected, expected_losses = _by_hand(start)
    assert len(traces) == 1
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-6)
    np.testing.assert_allclose(model.weight.T, expected["kernel"], rtol=1e-6, atol=1e-7)


def test_optax_inject_hyperparams_gives_the_same_steps():
    """An independent oracle for the whole mechanism: optax's inject_hyperparams, driven the same way."""
    params = {"kernel": jnp.zeros((3, 1)), "bias": jnp.zeros(1)}
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax.inject_hyperparams(optax.adamw)(learning_rate=RATES[0], weight_decay=1e-2))
    state, p = tx.init(params), params
    for lr in RATES:
        state[1].hyperparams["learning_rate"] = jnp.asarray(lr)
        grads = jax.grad(_loss)(p, X, Y)
        updates, state = tx.update(grads, state, p)
        p = optax.apply_updates(p, updates)
    expected, _ = _by_hand(params)
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_learning_rate_an_nnx_variable_sets_out_of_range_is_refused():
    """An NNX variable written in place reaches no updax call: an eager step refuses it, and a jitted one through
    ux.checked and checkify (NNX's functional API: split, a pure jitted step, merge)."""
    from jax.experimental import checkify

    model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
    opt = ux.checked(_optimizer())
    optimizer = nnx.Optimizer(model, opt, wrt=nnx.Param)

    def step(model, optimizer):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(X) - Y) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    model_def, optimizer_def = nnx.graphdef(model), nnx.graphdef(optimizer)

    @jax.jit
    def pure(model_state, optimizer_state):
        m, o = nnx.merge(model_def, model_state), nnx.merge(optimizer_def, optimizer_state)
        return step(m, o), nnx.state(m), nnx.state(o)

    err, _ = checkify.checkify(pure)(nnx.state(model), nnx.state(optimizer))
    err.throw()  # RATES[0]: nothing to report
    opt.get_state(optimizer.opt_state, PATH)[...] = -1.0  # set in place, as a framework sets a variable
    err, _ = checkify.checkify(pure)(nnx.state(model), nnx.state(optimizer))
    with pytest.raises(checkify.JaxRuntimeError, match=r"scale_by_learning_rate\(learning_rate=-1\.0\): "
                                                       r"learning_rate must be in \[0, inf\).*\(held in the state\)"):
        err.throw()
    with pytest.raises(ValueError, match=r"^scale_by_learning_rate\(learning_rate=-1\.0\): learning_rate must be "
                                         r"in \[0, inf\).*\(held in the state\)$"):
        step(model, optimizer)  # eager
