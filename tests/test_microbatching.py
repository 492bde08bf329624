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


# --------------------------------------------------------------------------
# micro_vmap, micro_grad and AccumulationType: parity with optax's, and jax.vmap / jax.grad of the full batch


def test_accumulation_type_is_the_name():
    x = jnp.arange(12.0)
    for name, member in [("sum", U.AccumulationType.SUM), ("mean", U.AccumulationType.MEAN),
                         ("running_mean", U.AccumulationType.RUNNING_MEAN), ("concat", U.AccumulationType.CONCAT)]:
        assert member == name and member.name == OPTAX_NAMES[name].name
        _close(U.microbatch(lambda v: v * 2.0, 0, 3, member)(x), U.microbatch(lambda v: v * 2.0, 0, 3, name)(x), name)


def _example(x, w, *, z):
    """One example's outputs of every kind: a vector, a scalar, a nested tree."""
    h = jnp.tanh(x["a"] * w) + z
    return {"vec": h, "scalar": jnp.sum(h**2), "tree": [x["b"] * 2.0, {"m": jnp.max(x["a"])}]}


def _examples(seed, rows=12):
    rng = np.random.default_rng(seed)
    x = {"a": jnp.asarray(rng.normal(size=(rows, 3)), jnp.float32), "b": jnp.asarray(rng.normal(size=(rows,)),
                                                                                        jnp.float32)}
    return x, jnp.asarray(rng.normal(size=(rows, 3)), jnp.float32)


@pytest.mark.parametrize("name", sorted(OPTAX_NAMES))
@pytest.mark.parametrize("microbatch_size", [None, 1, 3, 12])
def test_micro_vmap_matches_optax_and_vmap(name, microbatch_size):
    w = jnp.asarray([0.5, -1.0, 2.0], jnp.float32)
    ours = jax.jit(U.micro_vmap(_example, in_axes=(0, None), microbatch_size=microbatch_size, accumulator=name))
    theirs = M.micro_vmap(_example, in_axes=(0, None), microbatch_size=microbatch_size, accumulator=OPTAX_NAMES[name])
    full = jax.vmap(_example, in_axes=(0, None))
    reduce = {"concat": lambda v: v, "sum": lambda v: jnp.sum(v, 0)}.get(name, lambda v: jnp.mean(v, 0))
    for t in range(4):
        x, z = _examples(t)
        got = ours(x, w, z=z)
        _close(got, theirs(x, w, z=z), f"{name}, {microbatch_size}, batch {t}")
        _close(got, jax.tree.map(reduce, full(x, w, z=z)), f"{name}: jax.vmap, reduced", rtol=2e-5, atol=2e-5)


def test_micro_vmap_takes_a_prefix_tree_axes_and_the_first_microbatches():
    w = jnp.ones(3)
    accumulators = {"vec": "concat", "scalar": "sum", "tree": "mean"}
    x, z = _examples(5)
    xt = {"a": x["a"].T, "b": x["b"][None]}  # the batch on axis 1 of x
    ours = U.micro_vmap(_example, in_axes=(1, None), microbatch_size=4, accumulator=accumulators)(xt, w, z=z)
    theirs = M.micro_vmap(_example, in_axes=(1, None), microbatch_size=4,
                          accumulator=jax.tree.map(lambda a: OPTAX_NAMES[a], accumulators))(xt, w, z=z)
    _close(ours, theirs, "prefix tree, axis 1")
    _close(U.micro_vmap(_example, in_axes=(-1, None), microbatch_size=4, accumulator=accumulators)(xt, w, z=z),
           theirs, "axis -1 (optax's reshape takes no negative axis)")
    for real in (1, 2):
        ours = jax.jit(lambda x, r: U.micro_vmap(_example, (0, None), microbatch_size=4, accumulator="sum",
                                                 num_real_microbatches=r)(x, w, z=z))(x, jnp.asarray(real))
        theirs = M.micro_vmap(_example, (0, None), microbatch_size=4, accumulator=M.AccumulationType.SUM,
                              num_real_microbatches=real)(x, w, z=z)
        _close(ours, theirs, f"{real} microbatches")


def test_micro_vmap_with_an_int_axis_maps_every_argument_as_vmap():
    a, b = jnp.arange(6.0).reshape(3, 2), jnp.arange(3.0)
    _close(U.micro_vmap(lambda u, v: u * v, microbatch_size=1)(a, b), jax.vmap(lambda u, v: u * v)(a, b), "int")
    _close(U.micro_vmap(jnp.sin, microbatch_size=3)(b), M.micro_vmap(jnp.sin, microbatch_size=3)(b), "one argument")


def _mse(w, features, targets):
    return 0.5 * jnp.mean((features @ w["k"] + w["c"] - targets) ** 2)


def _mse_aux(w, features, targets):
    loss = _mse(w, features, targets)
    return loss, {"loss2": loss * 2, "n": features.shape[0]}


def _data(seed, rows=8):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.normal(size=(rows, 3)), jnp.float32), jnp.asarray(rng.normal(size=(rows,)), jnp.float32))


W = {"k": jnp.asarray([0.3, -0.2, 0.1], jnp.float32), "c": jnp.asarray(0.5, jnp.float32)}


def _clip(grad):
    norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grad)))
    return jax.tree.map(lambda g: g * jnp.minimum(1.0, 0.5 / norm), grad)


def _norm(grad):
    return jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grad)))


GRAD_CASES = {
    "sum": dict(),
    "mean_moments": dict(accumulator="mean", transform_fn=lambda g: (g, jax.tree.map(jnp.square, g)),
                         metrics_fn=_norm),
    "clipped_sum": dict(transform_fn=_clip, metrics_fn=_norm),
    "concat": dict(accumulator="concat"),
    "running_mean_no_batch_dim": dict(accumulator="running_mean", keep_batch_dim=False),
    "two_argnums": dict(argnums=(0, 1)),
    "has_aux": dict(has_aux=True, accumulator="mean"),
    "prefix": dict(accumulator=("sum", "concat"), transform_fn=lambda g: (g, _norm(g))),
}


@pytest.mark.parametrize("case", sorted(GRAD_CASES))
@pytest.mark.parametrize("microbatch_size", [None, 1, 4])
def test_micro_grad_matches_optax(case, microbatch_size):
    options = dict(GRAD_CASES[case])
    fun = _mse_aux if options.get("has_aux") else _mse
    to_optax = {"accumulator": lambda a: jax.tree.map(lambda n: OPTAX_NAMES[n], a)}
    theirs_options = {k: to_optax.get(k, lambda v: v)(v) for k, v in options.items()}
    ours = jax.jit(U.micro_grad(fun, batch_argnums=(1, 2), microbatch_size=microbatch_size, **options))
    theirs = M.micro_grad(fun, batch_argnums=(1, 2), microbatch_size=microbatch_size, **theirs_options)
    for t in range(4):
        x, y = _data(t)
        (g1, a1), (g2, a2) = ours(W, x, y), theirs(W, x, y)
        _close(g1, g2, f"{case}: gradients, batch {t}")
        assert type(a1).__name__ == "MicroGradAux" and a1._fields == a2._fields
        _close(tuple(a1), tuple(a2), f"{case}: per-example outputs, batch {t}")


def test_micro_grad_sums_to_the_full_batch_gradient_and_keeps_the_first_microbatches():
    def total(w, x, y):  # a per-example loss summed: its per-example gradients sum to the batch's gradient
        return jnp.sum((x @ w["k"] + w["c"] - y) ** 2)

    x, y = _data(3, rows=12)
    grads, aux = U.micro_grad(total, batch_argnums=(1, 2), microbatch_size=3)(W, x, y)
    _close(grads, jax.grad(total)(W, x, y), "the full batch's gradient", rtol=1e-5, atol=1e-5)
    _close(aux.values, jax.vmap(total, (None, 0, 0))(W, x[:, None], y[:, None]), "each example's loss")
    for real in (1, 3):
        ours = U.micro_grad(total, batch_argnums=(1, 2), microbatch_size=3, num_real_microbatches=real)(W, x, y)
        theirs = M.micro_grad(total, batch_argnums=(1, 2), microbatch_size=3, num_real_microbatches=real)(W, x, y)
        _close(ours[0], theirs[0], f"{real} microbatches")


def test_micro_vmap_and_micro_grad_name_what_does_not_fit():
    with pytest.raises(ValueError, match=r"micro_vmap: argument 0\['a'\] has a batch of 12 along axis 0, which "
                                         r"microbatch_size=5 does not divide"):
        U.micro_vmap(_example, (0, None), microbatch_size=5)(_examples(0)[0], jnp.ones(3), z=_examples(0)[1])
    with pytest.raises(ValueError, match=r"micro_vmap: in_axes has 1 entries, but the call has 2"):
        U.micro_vmap(_example, (0,))(_examples(0)[0], jnp.ones(3), z=_examples(0)[1])
    with pytest.raises(NotImplementedError, match=r"micro_vmap\(out_axes=1\): out_axes must be 0"):
        U.micro_vmap(_example, out_axes=1)
    with pytest.raises(TypeError, match=r"micro_vmap\(in_axes='x'\)"):
        U.micro_vmap(_example, in_axes="x")
    with pytest.raises(ValueError, match=r"micro_vmap: in_axes maps no argument"):
        U.micro_vmap(jnp.sin, in_axes=(None,))(jnp.ones(3))
    largest = U.Accumulator(init=lambda s: jnp.full(s.shape, -jnp.inf, s.dtype),
                            update=lambda carry, x, i: jnp.maximum(carry, x), finalize=lambda carry: carry)
    with pytest.raises(TypeError, match=r"micro_vmap\(accumulator=.*has none"):
        U.micro_vmap(jnp.sin, accumulator=largest)
    with_aggregate = largest._replace(aggregate=lambda v: jnp.max(v, axis=0))
    assert float(U.micro_vmap(jnp.sin, microbatch_size=2, accumulator=with_aggregate)(jnp.arange(6.0))) == float(
        jnp.max(jnp.sin(jnp.arange(6.0))))
    x, y = _data(0, rows=6)
    with pytest.raises(ValueError, match=r"micro_grad: argument 1 has a batch of 6 along axis 0, which "
                                         r"microbatch_size=4 does not divide"):
        U.micro_grad(_mse, batch_argnums=(1, 2), microbatch_size=4)(W, x, y)
    with pytest.raises(ValueError, match=r"micro_grad: batch_argnums names argument 3, but the call has 3"):
        U.micro_grad(_mse, batch_argnums=(1, 3))(W, x, y)
    with pytest.raises(TypeError, match=r"micro_grad\(batch_argnums='x'\)"):
        U.micro_grad(_mse, batch_argnums="x")
    with pytest.raises(TypeError, match=r"micro_grad\(has_aux=1\)"):
        U.micro_grad(_mse, has_aux=1)
    with pytest.raises(TypeError, match=r"micro_grad\(transform_fn=3\): transform_fn must be callable or None"):
        U.micro_grad(_mse, transform_fn=3)
