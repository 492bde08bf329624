"""What a step costs before it runs: the programs an eager ``update`` compiles, and a rule traced once per kind of leaf.

A catalogue rule is written for one leaf, in the paper's infix arithmetic;
:mod:`updax._leafwise` runs it over the trees, tracing it once per leaf
signature (shape, dtype, weak type, sharding) and, eagerly, running it as
one compiled program per signature, kept from step to step. These tests
count the traces and the programs (the first eager step against optax's for
the same rule) and check that running one trace for many leaves gives what
tracing each leaf gives, derivatives included.
"""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import updax as ux
from updax import _leafwise
from updax.updates import _kernels

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks"))
try:
    from run import CompileLog  # the benchmark's counter: the counts here and on the performance page are one
finally:
    sys.path.pop(0)

O = ux.optimizers


def _first_eager_step_programs(opt, apply, params, grads):
    jax.clear_caches()
    state = opt.init(params)
    jax.block_until_ready(state)
    with CompileLog() as log:
        updates, state = opt.update(grads, state, params)
        jax.block_until_ready(apply(params, updates))
    return len(log.programs)


def _model():
    """Four leaf shapes, two leaves of each (as the layers of a small transformer)."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return jnp.asarray(rng.normal(size=shape), jnp.float32)

    return [{"wq": w(16, 16), "w1": w(16, 32), "w2": w(32, 16), "ln": w(16)} for _ in range(2)]


RECIPES = {
    "adam": (lambda: O.adam(1e-3, eps_root=0.0), lambda: optax.adam(1e-3)),
    "adamw": (lambda: O.adamw(1e-3, eps_root=0.0, decay=1e-4), lambda: optax.adamw(1e-3, weight_decay=1e-4)),
    "clip+adamw": (lambda: ux.clip_by_global_norm(1.0).pipe(ux.compose, O.adamw(1e-3, eps_root=0.0, decay=1e-4)),
                   lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=1e-4))),
    "lion": (lambda: O.lion(1e-4, decay=1e-3), lambda: optax.lion(1e-4, weight_decay=1e-3)),
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_the_first_eager_step_compiles_no_more_programs_than_optax(recipe):
    params = _model()
    grads = jax.tree.map(lambda p: 0.01 * p, params)
    ours, theirs = (make() for make in RECIPES[recipe])
    n_ours = _first_eager_step_programs(ours, ux.apply_updates, params, grads)
    n_theirs = _first_eager_step_programs(theirs, optax.apply_updates, params, grads)
    print(f"{recipe}: updax {n_ours} programs, optax {n_theirs}")
    assert 0 < n_ours <= n_theirs


def test_adam_compiles_one_program_per_leaf_shape_eagerly_and_none_on_the_next_step():
    """The rule of each leaf shape runs as one program (the jitted step's for that leaf), kept for the next step."""
    def count(shapes):
        params = [jnp.ones(s) for s in shapes]
        return _first_eager_step_programs(ux.scale_by_adam(), lambda p, u: u, params, params)

    assert count([(3,), (4,), (5,), (6,)]) - count([(3,), (4,)]) == 2
    opt, params = ux.scale_by_adam(), [jnp.ones(3), jnp.ones(7)]
    _, state = opt.update(params, opt.init(params))
    with CompileLog() as log:
        jax.block_until_ready(opt.update(params, state))
    assert not log.programs


def test_momentum_compiles_its_rule_once_per_leaf_shape_eagerly():
    """SGD with momentum: its rule (``t ← decay·t + g``) one program per leaf shape, the learning rate's product
    and the params' sum one each: 3 per shape. optax compiles 2 per shape, its momentum's product sharing the
    learning rate's program (one operand signature); updax's rule is one program whatever its length."""
    params = _model()
    n = _first_eager_step_programs(O.sgd(1e-2, momentum=0.9), ux.apply_updates, params,
                                   jax.tree.map(lambda p: 0.01 * p, params))
    assert n == 3 * 4


# --------------------------------------------------------------------------
# A rule traced once per kind of leaf


def _rule(g, m):
    m = 0.5 * m + g
    return g / (_kernels.safe_sqrt(m * m) + 1e-3), m


def test_a_rule_is_traced_once_per_leaf_signature():
    calls = []

    def counted(g, m):
        calls.append(g.shape)
        return _rule(g, m)

    g = {"layers": [jnp.ones((4, 3)) for _ in range(10)], "b": [jnp.ones(3) for _ in range(5)], "s": jnp.ones(())}
    m = jax.tree.map(jnp.zeros_like, g)
    jax.jit(lambda g, m: _leafwise.per_leaf("test", counted, (g, m), ("updates", "state.m")))(g, m)
    assert sorted(calls) == [(), (3,), (4, 3)]


def test_one_trace_for_many_leaves_gives_each_leafs_numbers_and_a_finite_derivative_at_zero():
    g = {"a": jnp.asarray([0.0, 1.5, -3.0], jnp.float32), "b": [jnp.asarray([[2.0, -0.0]], jnp.bfloat16), None],
         "c": jnp.asarray([0.25, -1.0, 4.0], jnp.float32)}
    m = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), g)
    names = ("updates", "state.m")
    for jit in (False, True):
        wrap = jax.jit if jit else (lambda f: f)
        got = wrap(lambda g, m: _leafwise.per_leaf("test", _rule, (g, m), names))(g, m)
        want = wrap(lambda g, m: _each_on_its_own(g, m))(g, m)
        assert jax.tree.structure(got) == jax.tree.structure(want)
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))
    # The derivative through the root at a zero radicand is finite (g = 0 at a[0]).
    grad = jax.grad(lambda g: jnp.sum(_leafwise.per_leaf("test", _rule, (g, m), names)[0]["a"]))(g)
    assert np.all(np.isfinite(np.asarray(grad["a"])))


def test_a_root_with_its_own_derivative_is_one_call_per_leaf_signature_and_differentiates_as_each_leafs():
    """The rule's ``safe_sqrt`` (a ``jax.custom_jvp``) is bound once for the leaves of one signature, not once per
    leaf; the derivative, jitted inside or outside, is each leaf's own (finite at the zero radicand)."""
    g = {"a": jnp.asarray([0.0, 1.5, -3.0]), "b": jnp.ones((2, 2)), "c": jnp.asarray([0.25, 0.0, 4.0]),
         "d": [jnp.asarray([1.0, 2.0, 0.0]) for _ in range(5)]}
    m = jax.tree.map(jnp.zeros_like, g)
    names = ("updates", "state.m")

    def loss(rule):
        return lambda g: sum(jnp.sum(jnp.sin(u)) for u in jax.tree.leaves(rule(g)))

    together = loss(lambda g: _leafwise.per_leaf("test", _rule, (g, m), names)[0])
    alone = loss(lambda g: _each_on_its_own(g, m)[0])
    text = str(jax.make_jaxpr(together)(g))
    assert text.count("custom_jvp_call[") == 2  # (f32[3] for seven leaves, f32[2,2] for one)
    want = jax.grad(alone)(g)
    assert np.isfinite(np.asarray(want["a"])).all()
    for got in (jax.grad(together)(g), jax.jit(jax.grad(together))(g), jax.grad(jax.jit(together))(g)):
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(x, y, rtol=1e-6)


def _each_on_its_own(g, m):
    """``_rule`` leaf by leaf with a tree map (each leaf traced on its own), cast and stored as per_leaf does."""
    def leaf(g, m):
        c = jnp.promote_types(jnp.promote_types(g.dtype, m.dtype), jnp.float32)
        u, m2 = _rule(g.astype(c), m.astype(c))
        return u.astype(g.dtype), m2.astype(m.dtype)

    pairs = jax.tree.map(leaf, g, m)
    return (jax.tree.map(lambda g, pair: pair[0], g, pairs), jax.tree.map(lambda g, pair: pair[1], g, pairs))


def test_per_leaf_names_the_call_and_path_of_a_mismatch_and_takes_an_empty_tree():
    with pytest.raises(ValueError, match=r"scale_by_x: state.m does not match updates: \['b'\] is in updates"):
        _leafwise.per_leaf("scale_by_x", _rule, ({"a": jnp.ones(2), "b": jnp.ones(2)}, {"a": jnp.ones(2)}),
                           ("updates", "state.m"))
    assert _leafwise.per_leaf("scale_by_x", _rule, ({}, {}), ("updates", "state.m")) == ({}, {})
