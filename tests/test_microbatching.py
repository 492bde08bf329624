"""updax.microbatching: parity with optax.microbatching (0.2.8) and the full batch's results.

Oracles: optax.microbatching.microbatch and reshape_batch_axis (the same column-major split, accumulators named by
its enum), and the function on the whole batch (a sum of a per-row loss's gradients is the full gradient).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from registry import nested_tree

import updax as ux

M = optax.microbatching
U = ux.microbatching
OPTAX_NAMES = {"sum": M.AccumulationType.SUM, "mean": M.AccumulationType.MEAN,
               "running_mean": M.AccumulationType.RUNNING_MEAN, "concat": M.AccumulationType.CONCAT}


def _close(actual, expected, what, rtol=1e-5, atol=1e-6):
    assert jax.tree.structure(actual) == jax.tree.structure(expected), what
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        assert a.shape == e.shape and a.dtype == e.dtype, (what, a.shape, e.shape, a.dtype, e.dtype)
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol, err_msg=what)


def _batch(seed, rows=12):
    rng = np.random.default_rng(seed)
    return {"x": jnp.asarray(rng.normal(size=(rows, 3)), jnp.float32),
            "pair": (jnp.asarray(rng.normal(size=(rows,)), jnp.float32), jnp.asarray(rng.normal(size=(rows, 2, 2)),
                                                                                     jnp.float32))}


def _outputs(w, batch, scale):
    """Outputs of every kind: per-row values, a scalar, a nested tree of reductions."""
    x, (y, z) = batch["x"], batch["pair"]
    rows = jnp.tanh(x @ w["a"]) * scale + y
    return {"rows": rows, "total": jnp.sum(rows ** 2), "tree": [jnp.mean(z, axis=0), {"m": jnp.max(x, axis=0)}]}


@pytest.mark.parametrize("name", sorted(OPTAX_NAMES))
@pytest.mark.parametrize("microbatch_size", [1, 3, 12])
def test_microbatch_matches_optax(name, microbatch_size):
    w = {"a": jnp.asarray(np.random.default_rng(1).normal(size=3), jnp.float32)}
    ours = jax.jit(U.microbatch(_outputs, argnums=1, microbatch_size=microbatch_size, accumulator=name))
    theirs = M.microbatch(_outputs, argnums=1, microbatch_size=microbatch_size, accumulator=OPTAX_NAMES[name])
    for t in range(20):
        batch = _batch(t)
        _close(ours(w, batch, 0.5 + t), theirs(w, batch, 0.5 + t), f"{name}, batch {t}")


def test_microbatch_takes_a_prefix_tree_of_accumulators_keywords_and_axes():
    w = {"a": jnp.ones(3)}

    def fun(w, batch, *, extra):
        return _outputs(w, batch, 1.0), jnp.sum(extra, axis=0)

    accumulators = ({"rows": "concat", "total": "sum", "tree": "running_mean"}, "sum")
    extra = jnp.arange(24.0).reshape(2, 12)  # its batch axis is 1
    ours = U.microbatch(fun, 1, 4, accumulators, argnames="extra", in_axes=(0, 1))(w, _batch(0), extra=extra)
    theirs = M.microbatch(fun, 1, 4, jax.tree.map(lambda a: OPTAX_NAMES[a], accumulators), argnames="extra",
                          in_axes=(0, 1))(w, _batch(0), extra=extra)
    _close(ours, theirs, "prefix tree")
    _close(ours[0]["rows"], _outputs(w, _batch(0), 1.0)["rows"], "concat is the full batch's rows, in order")


@pytest.mark.parametrize("name", ["sum", "running_mean", "concat"])
def test_num_real_microbatches_runs_the_first_ones_as_optax(name):
    w = {"a": jnp.ones(3)}
    for real in (1, 2, 4):
        ours = jax.jit(lambda b, r: U.microbatch(_outputs, 1, 3, name, num_real_microbatches=r)(w, b, 1.0))
        theirs = M.microbatch(_outputs, 1, 3, OPTAX_NAMES[name], num_real_microbatches=real)(w, _batch(2), 1.0)
        _close(ours(_batch(2), jnp.asarray(real)), theirs, f"{name}, {real} microbatches (traced)")
        _close(U.microbatch(_outputs, 1, 3, name, num_real_microbatches=real)(w, _batch(2), 1.0), theirs, name)


def test_mean_of_some_microbatches_divides_by_those_run():
    """optax's MEAN divides by all microbatches whatever num_real_microbatches is (its RUNNING_MEAN by those run);
    updax's "mean" and "running_mean" both divide by those run."""
    w = {"a": jnp.ones(3)}
    for real in (1, 3):
        mean = U.microbatch(_outputs, 1, 3, "mean", num_real_microbatches=real)(w, _batch(3), 1.0)
        running = U.microbatch(_outputs, 1, 3, "running_mean", num_real_microbatches=real)(w, _batch(3), 1.0)
        summed = U.microbatch(_outputs, 1, 3, "sum", num_real_microbatches=real)(w, _batch(3), 1.0)
        _close(mean, running, f"{real} run")
        _close(mean, jax.tree.map(lambda s: s / real, summed), f"{real} run")


def test_microbatched_gradients_train_as_the_full_batch_over_20_steps():
    """A per-row loss's gradient summed over microbatches is the full batch's: 20 SGD steps land on the same
    params (the microbatches in a fori_loop, under jax.jit)."""

    def loss(params, x, y):
        pred = jnp.tanh(x @ params["w"]) + params["b"]
        return jnp.sum((pred - y) ** 2)

    full, micro = jax.jit(jax.grad(loss)), jax.jit(U.microbatch(jax.grad(loss), (1, 2), 4))
    p1 = p2 = {"w": jnp.ones((3, 2)) * 0.1, "b": jnp.zeros(2)}
    rng = np.random.default_rng(0)
    for t in range(20):
        x = jnp.asarray(rng.normal(size=(16, 3)), jnp.float32)
        y = jnp.asarray(rng.normal(size=(16, 2)), jnp.float32)
        g1, g2 = micro(p1, x, y), full(p2, x, y)
        _close(g1, g2, f"step {t + 1}", rtol=1e-4, atol=1e-5)
        p1 = jax.tree.map(lambda p, g: p - 0.01 * g, p1, g1)
        p2 = jax.tree.map(lambda p, g: p - 0.01 * g, p2, g2)


def test_a_custom_accumulator_and_reshape_batch_axis():
    largest = U.Accumulator(init=lambda s: jnp.full(s.shape, -jnp.inf, s.dtype),
                            update=lambda carry, x, i: jnp.maximum(carry, x), finalize=lambda carry: carry)
    x = jnp.asarray(np.random.default_rng(4).normal(size=(12,)), jnp.float32)
    sums = U.microbatch(jnp.sum, 0, 3, "concat")(x)
    assert float(U.microbatch(jnp.sum, 0, 3, largest)(x)) == float(jnp.max(sums))
    tree = {"w": nested_tree(seed=0)["dense"]["w"], "v": jnp.arange(24.0).reshape(2, 4, 3)}  # 4 rows on axis 1
    for size in (1, 2, 4):
        _close(U.reshape_batch_axis(tree, size, axis=1), M.reshape_batch_axis(tree, size, axis=1), f"{size}")
        _close(U.reshape_batch_axis(tree["v"], size, axis=-2), M.reshape_batch_axis(tree["v"], size, axis=1), "-2")


def test_microbatch_names_what_does_not_fit():
    w = {"a": jnp.ones(3)}
    with pytest.raises(ValueError, match=r"microbatch: argument 1\['pair'\]\[0\] has a batch of 12 along axis 0, "
                                         r"which "
                                         r"microbatch_size=5 does not divide"):
        U.microbatch(_outputs, 1, 5)(w, _batch(0), 1.0)
    with pytest.raises(ValueError, match=r"microbatch: the batch arguments have different batch sizes"):
        U.microbatch(lambda a, b: a + b[:1], (0, 1), 2)(jnp.ones(4), jnp.ones(6))
    with pytest.raises(TypeError, match=r"microbatch\(accumulator=.*'max'"):
        U.microbatch(_outputs, 1, 4, "max")
    with pytest.raises(ValueError, match=r"microbatch\(num_real_microbatches=5\): num_real_microbatches must be"):
        U.microbatch(_outputs, 1, 4, num_real_microbatches=5)(w, _batch(0), 1.0)
    with pytest.raises(ValueError, match=r"microbatch: accumulator must be one accumulator or a pytree"):
        U.microbatch(_outputs, 1, 4, {"rows": "sum"})(w, _batch(0), 1.0)
    with pytest.raises(ValueError, match=r"microbatch\(microbatch_size=0\)"):
        U.microbatch(_outputs, 1, 0)
