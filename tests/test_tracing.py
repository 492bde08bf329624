"""What a step costs before it runs: the programs an eager ``update`` compiles, and the fast-tracing arithmetic.

Eagerly, every jax.numpy operation compiles a small program per distinct
operand signature (shapes, dtypes, weak types, and the order of a scalar
and an array), so the first ``update`` on a model of many leaf shapes is
mostly compilation. The kernels write each operation one way (a scalar
times an array, an array plus a scalar) and take Adam's direction for the
whole tree in one jitted function, as optax takes its bias correction.
These tests count the programs the first eager step compiles, against
optax's for the same rule, and check that the lax helpers the kernels use to
trace fast compute what jax.numpy's operators compute.
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
    "sgd+momentum": (lambda: O.sgd(1e-2, momentum=0.9), lambda: optax.sgd(1e-2, momentum=0.9)),
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


def test_adam_compiles_three_programs_per_leaf_shape_eagerly():
    """The moments (a scalar times an array, a sum, a square) per shape; the direction once for the tree."""
    def count(shapes):
        params = [jnp.ones(s) for s in shapes]
        return _first_eager_step_programs(ux.scale_by_adam(), lambda p, u: u, params, params)

    assert count([(3,), (4,), (5,), (6,)]) - count([(3,), (4,)]) == 2 * 3


# --------------------------------------------------------------------------
# The lax helpers compute what jax.numpy's operators compute

OPERANDS = {
    "f32 arrays": (lambda: jnp.asarray([1.5, -2.25, 3e-8], jnp.float32), lambda: jnp.asarray([0.1, 7.0, -3.0],
                                                                                             jnp.float32)),
    "f32 and a python float": (lambda: jnp.asarray([1.5, -2.25, 3e-8], jnp.float32), lambda: 0.1),
    "a python float and f32": (lambda: 0.999, lambda: jnp.asarray([1.5, -2.25, 3e-8], jnp.float32)),
    "f32 and a 0-d f32": (lambda: jnp.asarray([1.5, -2.25, 3e-8], jnp.float32), lambda: jnp.float32(0.3)),
    "f32 and a weak 0-d": (lambda: jnp.asarray([1.5, -2.25], jnp.float32), lambda: jnp.asarray(0.3)),
    "bf16 and a python float": (lambda: jnp.asarray([1.5, -2.25], jnp.bfloat16), lambda: 0.1),
    "complex and a python float": (lambda: jnp.asarray([1 + 2j, -3j], jnp.complex64), lambda: 0.5),
    "f32 and a python int": (lambda: jnp.asarray([1.5, -2.25], jnp.float32), lambda: 3),
    "f32 arrays that broadcast": (lambda: jnp.asarray([[1.5], [-2.25]], jnp.float32),
                                  lambda: jnp.asarray([[0.1, 7.0, -3.0]], jnp.float32)),
}


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("operands", sorted(OPERANDS))
@pytest.mark.parametrize("name, reference", [("mul", lambda a, b: a * b), ("add", lambda a, b: a + b),
                                             ("sub", lambda a, b: a - b), ("div", lambda a, b: a / b),
                                             ("maximum", jnp.maximum), ("minimum", jnp.minimum)])
def test_the_fast_helpers_equal_the_operators(name, reference, operands, jit):
    a, b = (make() for make in OPERANDS[operands])
    helper = getattr(_kernels, name)
    run = (lambda f: jax.jit(f)(a, b)) if jit else (lambda f: f(a, b))
    got, want = run(helper), run(reference)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


_VALUES = jnp.asarray([1.5, -2.25, jnp.nan, -0.0], jnp.float32)
WHERE_OPERANDS = {
    "a 0-d condition, two arrays": (lambda: jnp.bool_(True), lambda: _VALUES, lambda: -_VALUES),
    "a 0-d condition, a python float": (lambda: jnp.bool_(False), lambda: 0.0, lambda: _VALUES),
    "an array condition, a python float": (lambda: _VALUES > 0, lambda: _VALUES, lambda: 1.0),
    "an array condition, a 0-d array": (lambda: _VALUES < 0, lambda: jnp.float32(7.0), lambda: _VALUES),
    "a 0-d condition, a bf16 array": (lambda: jnp.bool_(True), lambda: 0.5, lambda: _VALUES.astype(jnp.bfloat16)),
    "an f32 and a bf16 array": (lambda: jnp.bool_(True), lambda: _VALUES, lambda: _VALUES.astype(jnp.bfloat16)),
    "arrays that broadcast": (lambda: jnp.bool_(True), lambda: _VALUES[:, None], lambda: _VALUES[None, :]),
    "a condition that is not boolean": (lambda: jnp.asarray(1), lambda: _VALUES, lambda: 2.0),
    "python numbers only": (lambda: jnp.bool_(False), lambda: 1.0, lambda: 2.0),
}


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("operands", sorted(WHERE_OPERANDS))
def test_the_fast_select_equals_jnp_where(operands, jit):
    args = tuple(make() for make in WHERE_OPERANDS[operands])
    run = (lambda f: jax.jit(f)(*args)) if jit else (lambda f: f(*args))
    got, want = run(_kernels.where), run(jnp.where)
    assert got.dtype == want.dtype and got.shape == want.shape and got.weak_type == want.weak_type
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert np.array_equal(np.signbit(np.asarray(got, np.float32)), np.signbit(np.asarray(want, np.float32)))


@pytest.mark.parametrize("bounds", [(-1.0, 1.0), (jnp.float32(-0.5), jnp.float32(2.0)), (0.0, 0.0)])
def test_the_fast_clip_equals_jnp_clip(bounds):
    got, want = _kernels.clip(_VALUES, *bounds), jnp.clip(_VALUES, *bounds)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


# --------------------------------------------------------------------------
# One root for the tree


def _custom_jvp_calls(fn, *args):
    return sum(eqn.primitive.name == "custom_jvp_call" for eqn in jax.make_jaxpr(fn)(*args).jaxpr.eqns)


@pytest.mark.parametrize("opt", [ux.scale_by_adam(nesterov=True), ux.scale_by_belief(), ux.scale_by_radam(),
                                 ux.scale_by_amsgrad(), ux.scale_by_adan(), ux.scale_by_adopt(),
                                 ux.scale_by_ademamix(), ux.scale_by_simplified_ademamix()],
                         ids=lambda opt: opt.stages[0].label)
def test_the_rooted_kernels_take_one_root_for_the_whole_tree(opt):
    """safe_sqrt's custom derivative traces a sub-program per call: the kernels call it once per tree, not once
    per leaf (a step on 384 leaves traced about 0.7 ms a leaf faster, docs/performance.md)."""
    params = _model()
    state = opt.init(params)
    assert _custom_jvp_calls(lambda g, s: opt.update(g, s, params), params, state) == 1


def _rooted_pieces():
    def before(g, m):
        m = 0.5 * m + g
        return m * m, g, m

    def after(root, g, m):
        return g / (root + 1e-3), m

    return before, after


def test_per_leaf_rooted_equals_one_function_per_leaf_bit_for_bit_with_a_finite_derivative_at_zero():
    before, after = _rooted_pieces()

    def one_function(g, m):
        radicand, *carry = before(g, m)
        return after(_kernels.safe_sqrt(radicand), *carry)

    g = {"a": jnp.asarray([0.0, 1.5, -3.0], jnp.float32), "b": [jnp.asarray([[2.0, -0.0]], jnp.bfloat16), None]}
    m = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), g)
    names = ("updates", "state.m")
    for jit in (False, True):
        wrap = jax.jit if jit else (lambda f: f)
        got = wrap(lambda g, m: _kernels.per_leaf_rooted("test", before, after, (g, m), names))(g, m)
        want = wrap(lambda g, m: _kernels.per_leaf("test", one_function, (g, m), names))(g, m)
        assert jax.tree.structure(got) == jax.tree.structure(want)
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))
    # The derivative through the root at a zero radicand is finite (g = 0 at a[0]), as per leaf.
    grad = jax.grad(lambda g: jnp.sum(_kernels.per_leaf_rooted("test", before, after, (g, m), names)[0]["a"]))(g)
    assert np.all(np.isfinite(np.asarray(grad["a"])))


def test_per_leaf_rooted_names_the_call_and_path_of_a_mismatch_and_takes_an_empty_tree():
    before, after = _rooted_pieces()
    with pytest.raises(ValueError, match=r"scale_by_x: state.m does not match updates: \['b'\] is in updates"):
        _kernels.per_leaf_rooted("scale_by_x", before, after, ({"a": jnp.ones(2), "b": jnp.ones(2)},
                                                                {"a": jnp.ones(2)}), ("updates", "state.m"))
    assert _kernels.per_leaf_rooted("scale_by_x", before, after, ({}, {}), ("updates", "state.m")) == ({}, {})
