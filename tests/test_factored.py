"""Adafactor, SM3 and Muon stages: parity with optax over 20 steps, dtypes, errors and defaults."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest

import updax as ux
from updax.updates import (
    clip_by_block_rms,
    scale_by_factored_rms,
    scale_by_muon,
    scale_by_newton_schulz,
    scale_by_param_block_rms,
    scale_by_sm3,
)

STEPS = 20
TOL = dict(rtol=1e-5, atol=1e-6)
NS_COEFFS = (3.4445, -4.7750, 2.0315)
# With min_dim_size_to_factor=32: (96, 40) and (3, 40, 36) are factored; (20, 50), (40,) and the
# scalar are not (their second largest axis is below 32, or they have fewer than 2 axes).
MIN_DIM = 32


@pytest.fixture(autouse=True)
def strict_promotion():
    """The kernels cast explicitly: no silent bf16 -> f32 upcasts slip through."""
    with jax.numpy_dtype_promotion("strict"):
        yield


def _tree(seed, dtype=jnp.float32, scalar=True):
    """Nested containers with factored, unfactored, tall, wide, 3-D and 0-d leaves; leaf scales vary.

    (Sizes are small, and there are few leaves: compiling dominates the run time.)
    """
    rng = np.random.default_rng(seed)

    def arr(*shape):
        return jnp.asarray(rng.normal(size=shape) * rng.uniform(0.3, 3.0), dtype)

    last = (arr(3, 40, 36), arr()) if scalar else (arr(3, 40, 36),)
    return {"dense": {"w": arr(96, 40), "b": arr(40)}, "layers": [last], "wide": arr(20, 50)}


def _small_tree(seed, dtype=jnp.float32):
    """Fewer leaves (eager runs compile every operation for every shape): a factored matrix, 1-D, 0-d."""
    rng = np.random.default_rng(seed)
    return {"m": jnp.asarray(rng.normal(size=(40, 36)), dtype),
            "rest": [jnp.asarray(rng.normal(size=5), dtype), (jnp.asarray(rng.normal(), dtype),)]}


def _matrices(tree):
    """The 2-D leaves of :func:`_tree`: optax's Muon takes matrices only."""
    return {"tall": tree["dense"]["w"], "wide": tree["wide"]}


def _as_matrices(updates):
    """optax's Muon needs to be told that every leaf is a (rows, columns) matrix."""
    return jax.tree.map(lambda _: optax.contrib.MuonDimensionNumbers(reduction_axis=0, output_axis=1), updates)


def _assert_trees_close(actual, expected, what, **tol):
    a, e = jax.tree.leaves(actual), jax.tree.leaves(expected)
    assert len(a) == len(e), what
    for x, y in zip(a, e):
        assert x.shape == y.shape, what
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), err_msg=what, **(tol or TOL))


# One jitted step for every updax object: objects of the same structure share its compilations.
_STEP = jax.jit(lambda opt, g, s, p: opt.update(g, s, p))


def _run_both(ours, theirs, params, *, grads=_tree, params_per_step=None, our_state=None, their_state=None,
              compare=None, **tol):
    """``STEPS`` jitted steps of both, every step's updates compared; returns our updates and both final states."""
    compare = compare or (lambda tree: tree)
    step = jax.jit(theirs.update)
    s1 = ours.init(params) if our_state is None else our_state
    with jax.numpy_dtype_promotion("standard"):  # optax is not written for strict promotion
        s2 = theirs.init(compare(params)) if their_state is None else their_state
    outs = []
    for t in range(STEPS):
        g = grads(t + 1)
        p = params if params_per_step is None else params_per_step(t + 1)
        u1, s1 = _STEP(ours, g, s1, p)
        with jax.numpy_dtype_promotion("standard"):
            u2, s2 = step(compare(g), s2, compare(p))
        _assert_trees_close(compare(u1), u2, f"updates at step {t}", **tol)
        outs.append(u1)
    return outs, s1, s2


# --------------------------------------------------------------------------
# Parity with optax


def test_factored_rms_matches_optax():
    options = dict(factored=True, decay_rate=0.5, step_offset=0, min_dim_size_to_factor=MIN_DIM, epsilon=1e-30)
    ours, theirs = scale_by_factored_rms(**options), optax.scale_by_factored_rms(**options)
    _, s1, s2 = _run_both(ours, theirs, _tree(0))
    state = ours.get_state(s1, "scale_by_factored_rms")
    for field in ("v_row", "v_col", "v"):
        _assert_trees_close(getattr(state, field), getattr(s2, field), field)
    assert int(state.count) == int(s2.count) == STEPS
    # v_row averages over the largest axis, v_col over the second largest; v is a placeholder there.
    assert state.v_row["dense"]["w"].shape == (40,) and state.v_col["dense"]["w"].shape == (96,)
    assert state.v_row["layers"][0][0].shape == (3, 36) and state.v_col["layers"][0][0].shape == (3, 40)
    assert state.v["dense"]["w"].shape == (1,) and state.v["wide"].shape == (20, 50)


def test_factored_false_keeps_full_second_moments_everywhere():
    # The unfactored rule itself is compared with optax on the unfactored leaves above.
    opt = scale_by_factored_rms(factored=False, min_dim_size_to_factor=MIN_DIM)
    state = opt.get_state(jax.eval_shape(opt.init, _tree(0)), "scale_by_factored_rms")
    assert [v.shape for v in jax.tree.leaves(state.v)] == [x.shape for x in jax.tree.leaves(_tree(0))]
    assert {x.shape for x in jax.tree.leaves((state.v_row, state.v_col))} == {(1,)}


def test_factored_rms_step_offset_matches_optax_from_a_restored_count():
    options = dict(factored=True, decay_rate=0.8, step_offset=7, min_dim_size_to_factor=MIN_DIM, epsilon=1e-30)
    ours, theirs = scale_by_factored_rms(**options), optax.scale_by_factored_rms(**options)
    params = _tree(0)
    # A fine-tuning run resumes at count 10 (>= step_offset): set the count on both sides.
    s1 = ours.replace_state(ours.init(params), "scale_by_factored_rms.count", 10)
    s2 = theirs.init(params)._replace(count=jnp.asarray(10, jnp.int32))
    _, s1, s2 = _run_both(ours, theirs, params, our_state=s1, their_state=s2)
    _assert_trees_close(ours.get_state(s1, "scale_by_factored_rms.v_row"), s2.v_row, "v_row")
    assert int(ours.get_state(s1, "scale_by_factored_rms.count")) == int(s2.count) == 10 + STEPS


def test_param_block_rms_matches_optax():
    def params(seed):
        tree = _tree(seed + 100)
        tree["dense"]["b"] = jnp.zeros(40)  # rms 0: the factor is min_scale
        return tree

    _run_both(scale_by_param_block_rms(min_scale=1e-3), optax.scale_by_param_block_rms(min_scale=1e-3), params(0),
              params_per_step=params)


def test_clip_by_block_rms_matches_optax():
    # Leaf scales vary in [0.3, 3]: some leaves are clipped, others are not.
    _run_both(clip_by_block_rms(threshold=1.0), optax.clip_by_block_rms(threshold=1.0), _tree(0))


@pytest.mark.parametrize("b1, b2", [(0.9, 1.0), (0.5, 0.95)])
def test_sm3_matches_optax(b1, b2):
    # optax's SM3 fails on 0-d leaves; they are checked against 1-element vectors below.
    def grads(seed):
        return _tree(seed, scalar=False)

    ours, theirs = scale_by_sm3(b1=b1, b2=b2, eps=1e-8), optax.scale_by_sm3(b1=b1, b2=b2, eps=1e-8)
    _, s1, s2 = _run_both(ours, theirs, grads(0), grads=grads)
    state = ours.get_state(s1, "scale_by_sm3")
    # optax calls the per-axis accumulators mu (a list per leaf) and the momentum nu.
    _assert_trees_close(state.accumulators, s2.mu, "accumulators")
    _assert_trees_close(state.mu, s2.nu, "mu")
    assert [a.shape for a in state.accumulators["layers"][0][0]] == [(3,), (40,), (36,)]


def test_sm3_on_a_scalar_equals_sm3_on_a_one_element_vector():
    opt = scale_by_sm3(b1=0.9, b2=0.95, eps=1e-8)
    rng = np.random.default_rng(0)
    s0, s1 = opt.init({"x": jnp.zeros(())}), opt.init({"x": jnp.zeros(1)})
    for _ in range(STEPS):
        g = jnp.asarray(rng.normal(), jnp.float32)
        u0, s0 = opt.update({"x": g}, s0)
        u1, s1 = opt.update({"x": g.reshape(1)}, s1)
        assert u0["x"].shape == ()
        np.testing.assert_allclose(u0["x"].reshape(1), u1["x"], **TOL)


def test_newton_schulz_matches_optax_muon_without_momentum():
    # optax.contrib.scale_by_muon with beta = 0 and no Nesterov is its orthogonalize_via_newton_schulz alone.
    ours = scale_by_newton_schulz(ns_coeffs=NS_COEFFS, ns_steps=5, eps=1e-8)
    theirs = optax.contrib.scale_by_muon(ns_coeffs=NS_COEFFS, ns_steps=5, beta=0.0, eps=1e-8, nesterov=False,
                                         adaptive=False, preconditioning="frobenius",
                                         weight_dimension_numbers=_as_matrices)
    # Same float32 operations in the same order: the default tolerance holds.
    outs, _, _ = _run_both(ours, theirs, _tree(0), compare=_matrices)
    # Leaves that are not matrices pass unchanged.
    u, g = outs[0], _tree(1)
    for path in (("dense", "b"), ("layers", 0, 0), ("layers", 0, 1)):
        x, y = u, g
        for key in path:
            x, y = x[key], y[key]
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_matches_optax_and_non_matrices_get_the_momentum(nesterov):
    beta = 0.9
    options = dict(ns_coeffs=NS_COEFFS, ns_steps=5, beta=beta, eps=1e-8, nesterov=nesterov)
    ours = scale_by_muon(**options, mu_dtype=None)
    theirs = optax.contrib.scale_by_muon(**options, mu_dtype=None, adaptive=False, preconditioning="frobenius",
                                         weight_dimension_numbers=_as_matrices)
    outs, s1, s2 = _run_both(ours, theirs, _tree(0), compare=_matrices)
    state = ours.get_state(s1, "scale_by_muon")
    _assert_trees_close(_matrices(state.mu), s2.mu, "mu")
    assert int(state.count) == int(s2.count) == STEPS

    # The other leaves: the bias-corrected (Nesterov) momentum in closed form, in float64.
    m = np.zeros(40)
    for t, u in enumerate(outs, start=1):
        x = np.asarray(_tree(t)["dense"]["b"], np.float64)
        m = beta * m + (1 - beta) * x
        expected = (beta * m / (1 - beta ** (t + 1)) + (1 - beta) * x / (1 - beta**t)) if nesterov else (
            m / (1 - beta**t))
        np.testing.assert_allclose(u["dense"]["b"], expected, **TOL)


def test_adafactor_equals_its_explicit_pipeline():
    lr = 0.05
    ours = (scale_by_factored_rms(factored=True, decay_rate=0.8, step_offset=0, min_dim_size_to_factor=MIN_DIM,
                                  epsilon=1e-30)
            .pipe(clip_by_block_rms, threshold=1.0)
            .scale(lr)
            .pipe(scale_by_param_block_rms, min_scale=1e-3)
            .scale(-1.0))
    theirs = optax.adafactor(learning_rate=lr, min_dim_size_to_factor=MIN_DIM, decay_rate=0.8, decay_offset=0,
                             multiply_by_parameter_scale=True, clipping_threshold=1.0, momentum=None,
                             weight_decay_rate=None, eps=1e-30, factored=True)
    _run_both(ours, theirs, _small_tree(0), grads=_small_tree)


# --------------------------------------------------------------------------
# jit, dtypes, errors, documented defaults

BUILDERS = {
    "scale_by_factored_rms": lambda: scale_by_factored_rms(factored=True, decay_rate=0.8, step_offset=0,
                                                           min_dim_size_to_factor=MIN_DIM, epsilon=1e-30),
    "scale_by_param_block_rms": lambda: scale_by_param_block_rms(min_scale=1e-3),
    "clip_by_block_rms": lambda: clip_by_block_rms(threshold=1.0),
    "scale_by_sm3": lambda: scale_by_sm3(b1=0.9, b2=1.0, eps=1e-8),
    "scale_by_newton_schulz": lambda: scale_by_newton_schulz(ns_coeffs=NS_COEFFS, ns_steps=5, eps=1e-8),
    "scale_by_muon": lambda: scale_by_muon(ns_coeffs=NS_COEFFS, ns_steps=5, beta=0.95, eps=1e-8, nesterov=True),
}


def _steps(opt, jit, n=2):
    """``n`` steps on small trees."""
    params = _small_tree(0)
    state = opt.init(params)
    step = _STEP if jit else (lambda opt, g, s, p: opt.update(g, s, p))
    out = []
    for t in range(n):
        u, state = step(opt, _small_tree(t + 1), state, params)
        out.append(u)
    return out, state


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_jit_and_eager_agree(name):
    opt = BUILDERS[name]()
    eager, s_eager = _steps(opt, jit=False)
    jitted, s_jitted = _steps(opt, jit=True)
    for e, j in zip(eager, jitted):
        _assert_trees_close(e, j, name)
    _assert_trees_close(s_eager, s_jitted, name)


def _shapes_after_one_step(opt, dtype, with_params=True):
    """Output shapes and dtypes of init + update, traced without compiling anything."""
    def run(params, grads):
        return opt.update(grads, opt.init(params), params if with_params else None)

    return jax.eval_shape(run, _small_tree(0, dtype), _small_tree(1, dtype))


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_bf16_updates_stay_bf16_and_accumulators_are_float32(name):
    updates, state = _shapes_after_one_step(BUILDERS[name](), jnp.bfloat16)
    for u, r in zip(jax.tree.leaves(updates), jax.tree.leaves(_small_tree(0, jnp.bfloat16)), strict=True):
        assert u.dtype == jnp.bfloat16 and u.shape == r.shape
    for leaf in jax.tree.leaves(state):
        assert leaf.dtype in (jnp.float32, jnp.int32), (name, leaf.dtype)


@pytest.mark.parametrize("opt, path", [
    (scale_by_sm3(mu_dtype="bfloat16", accumulator_dtype="bfloat16"), "scale_by_sm3"),
    (scale_by_muon(mu_dtype=jnp.bfloat16), "scale_by_muon.mu"),
    (scale_by_factored_rms(min_dim_size_to_factor=32, accumulator_dtype="bfloat16"), "scale_by_factored_rms"),
], ids=["sm3", "muon", "factored_rms"])
def test_dtype_options_set_the_storage_dtype(opt, path):
    updates, state = _shapes_after_one_step(opt, jnp.float32)
    floats = [x for x in jax.tree.leaves(opt.get_state(state, path)) if x.dtype != jnp.int32]
    assert floats and all(x.dtype == jnp.bfloat16 for x in floats)
    assert all(u.dtype == jnp.float32 for u in jax.tree.leaves(updates))


def test_needs_params_only_where_the_rule_reads_them():
    # optax's scale_by_factored_rms needs params too; here the updates' shapes suffice.
    with pytest.raises(ValueError, match="scale_by_param_block_rms needs params"):
        _shapes_after_one_step(scale_by_param_block_rms(), jnp.float32, with_params=False)
    for name in sorted(set(BUILDERS) - {"scale_by_param_block_rms"}):
        _shapes_after_one_step(BUILDERS[name](), jnp.float32, with_params=False)


def test_repr_and_fluent_forms():
    assert repr(BUILDERS["scale_by_sm3"]()) == "scale_by_sm3(b1=0.9, b2=1.0, eps=1e-08)"
    assert repr(scale_by_newton_schulz()) == "scale_by_newton_schulz(ns_coeffs=(3.4445, -4.775, 2.0315), " \
                                            "ns_steps=5, eps=1e-08)"
    assert ux.scale(2.0).scale_by_muon(beta=0.9) == scale_by_muon(ux.scale(2.0), beta=0.9)


def test_static_structure_and_numeric_leaves():
    # The factoring threshold and the iteration count shape the computation: not leaves.
    assert jax.tree.leaves(scale_by_factored_rms(min_dim_size_to_factor=64)) == [0.8, 0, 1e-30]
    assert jax.tree.leaves(scale_by_newton_schulz()) == [3.4445, -4.775, 2.0315, 1e-8]


BAD = [
    (scale_by_sm3, dict(b1=1.5), ValueError, "scale_by_sm3(b1=1.5): b1 must be in [0, 1)"),
    (scale_by_sm3, dict(b2=1.5), ValueError, "scale_by_sm3(b2=1.5): b2 must be in [0, 1]"),
    (scale_by_sm3, dict(eps=-1.0), ValueError, "scale_by_sm3(eps=-1.0): eps must be in [0, inf)"),
    (scale_by_sm3, dict(mu_dtype=jnp.int32), TypeError, "mu_dtype must be None or a floating dtype"),
    (scale_by_factored_rms, dict(factored=1), TypeError, "scale_by_factored_rms(factored=1): factored must be True"),
    (scale_by_factored_rms, dict(decay_rate=-0.5), ValueError,
     "scale_by_factored_rms(decay_rate=-0.5): decay_rate must be in [0, inf)"),
    (scale_by_factored_rms, dict(step_offset=-1), ValueError,
     "scale_by_factored_rms(step_offset=-1): step_offset must be a non-negative integer"),
    (scale_by_factored_rms, dict(min_dim_size_to_factor=0), ValueError,
     "scale_by_factored_rms(min_dim_size_to_factor=0): min_dim_size_to_factor must be a positive integer"),
    (scale_by_factored_rms, dict(epsilon=float("nan")), ValueError, "epsilon must be in [0, inf)"),
    (scale_by_param_block_rms, dict(min_scale=-1.0), ValueError,
     "scale_by_param_block_rms(min_scale=-1.0): min_scale must be in [0, inf)"),
    (clip_by_block_rms, dict(threshold=0.0), ValueError,
     "clip_by_block_rms(threshold=0.0): threshold must be in (0, inf)"),
    (scale_by_newton_schulz, dict(ns_coeffs=(1.0, 2.0)), TypeError,
     "scale_by_newton_schulz(ns_coeffs=(1.0, 2.0)): ns_coeffs must be a tuple of three finite real numbers"),
    (scale_by_newton_schulz, dict(ns_coeffs=(1.0, 2.0, "x")), TypeError,
     "scale_by_newton_schulz(ns_coeffs=(1.0, 2.0, 'x')): ns_coeffs must be a tuple of three finite real numbers"),
    (scale_by_newton_schulz, dict(ns_steps=0), ValueError,
     "scale_by_newton_schulz(ns_steps=0): ns_steps must be an integer in [1, 100]"),
    (scale_by_muon, dict(beta=1.0), ValueError, "scale_by_muon(beta=1.0): beta must be in [0, 1)"),
    (scale_by_muon, dict(nesterov="yes"), TypeError, "scale_by_muon(nesterov='yes'): nesterov must be True or False"),
]


@pytest.mark.parametrize("factory, options, exc, message", BAD, ids=[m for *_, m in BAD])
def test_bad_options_raise_when_built_naming_the_call(factory, options, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        factory(**options)






# --------------------------------------------------------------------------
# Newton–Schulz property


@pytest.mark.parametrize("shape", [(64, 40), (40, 64)])
@pytest.mark.parametrize("seed", [0, 1])
def test_newton_schulz_puts_the_singular_values_near_one(shape, seed):
    # The default quintic trades convergence for speed: after 5 steps the singular values of a
    # well-conditioned matrix sit in a band around 1 (about [0.68, 1.13]), not exactly at 1.
    x = jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)
    opt = scale_by_newton_schulz()
    u, _ = _STEP(opt, {"x": x}, opt.init(None), None)
    singular_values = np.linalg.svd(np.asarray(u["x"], np.float64), compute_uv=False)
    assert u["x"].shape == shape
    assert singular_values.min() > 0.65 and singular_values.max() < 1.2, singular_values
    # The left and right singular vectors are those of x: u x^T is symmetric positive semi-definite.
    gram = np.asarray(u["x"], np.float64) @ np.asarray(x, np.float64).T
    np.testing.assert_allclose(gram, gram.T, atol=1e-3 * np.abs(gram).max())
    assert np.linalg.eigvalsh(gram).min() > -1e-3 * np.abs(gram).max()
