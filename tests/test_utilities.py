"""zero_nans, keep_params_nonnegative, snapshot and updax.projections: parity with optax over several steps and
inputs on nested trees with None leaves, and independent checks (closed forms, a float64 NumPy bisection for the
simplex and L1-ball thresholds, the projection's optimality condition, idempotence, membership, exactness inside).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from registry import nested_tree

import updax as ux

P = ux.projections

#: float32 results against optax (same formulas, another order of operations) and against float64 NumPy.
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(autouse=True)
def strict_promotion():
    """Kernels cast explicitly: no silent bf16 -> f32 upcasts slip through."""
    with jax.numpy_dtype_promotion("strict"):
        yield


def _leaves64(tree):
    return [np.asarray(x, np.float64) for x in jax.tree.leaves(tree)]


def _vector(tree):
    leaves = _leaves64(tree)
    return np.concatenate([x.ravel() for x in leaves]) if leaves else np.zeros(0)


def assert_trees_close(actual, expected, rtol=RTOL, atol=ATOL, msg=""):
    assert jax.tree.structure(actual) == jax.tree.structure(expected), msg
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        assert jnp.shape(a) == jnp.shape(e), msg
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(e, np.float64), rtol=rtol, atol=atol,
                                   err_msg=msg)


def assert_trees_equal(actual, expected):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        assert a.dtype == e.dtype and a.shape == e.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def _with_nans(tree, seed, fraction=0.3):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.where(jnp.asarray(rng.random(x.shape) < fraction), jnp.nan, x), tree)


# --------------------------------------------------------------------------
# zero_nans


def test_zero_nans_matches_optax_over_steps():
    params = nested_tree()
    opt, ref = ux.zero_nans(), optax.zero_nans()
    state, ref_state = opt.init(params), ref.init(params)
    step = jax.jit(opt.update)
    seen_nan = seen_clean = False
    for t in range(5):
        grads = nested_tree(seed=t + 1) if t == 2 else _with_nans(nested_tree(seed=t + 1), seed=t)
        updates, state = step(grads, state)
        with jax.numpy_dtype_promotion("standard"):
            expected, ref_state = ref.update(grads, ref_state)
        assert_trees_equal(updates, expected)
        found = opt.get_state(state, "zero_nans.found_nan")
        assert jax.tree.structure(found) == jax.tree.structure(ref_state.found_nan)
        assert [bool(f) for f in jax.tree.leaves(found)] == [bool(f) for f in jax.tree.leaves(ref_state.found_nan)]
        flags = [bool(f) for f in jax.tree.leaves(found)]
        seen_nan |= any(flags)
        seen_clean |= not any(flags)
        assert not any(np.any(np.isnan(np.asarray(u, np.float32))) for u in jax.tree.leaves(updates))
    assert seen_nan and seen_clean  # the flags were set by NaNs and cleared by the clean step 3


def test_zero_nans_keeps_infinities_dtypes_and_the_init_state():
    grads = {"a": jnp.asarray([jnp.nan, jnp.inf, -jnp.inf, 1.5], jnp.bfloat16), "n": None,
             "b": jnp.asarray([2.0], jnp.float16)}
    opt = ux.zero_nans()
    state = opt.init(grads)
    assert {k: bool(v) for k, v in state[0].found_nan.items() if v is not None} == {"a": False, "b": False}
    updates, state = opt.update(grads, state)
    assert updates["a"].dtype == jnp.bfloat16 and updates["b"].dtype == jnp.float16 and updates["n"] is None
    np.testing.assert_array_equal(np.asarray(updates["a"], np.float32), [0.0, np.inf, -np.inf, 1.5])
    assert bool(state[0].found_nan["a"]) and not bool(state[0].found_nan["b"])


def test_zero_nans_names_a_tree_that_does_not_match_its_state():
    opt = ux.zero_nans()
    with pytest.raises(ValueError, match=r"zero_nans\(\): the state does not fit these updates: at "
                                         r"state\[0\].found_nan\['c'\]"):
        opt.update({"a": jnp.ones(1), "c": jnp.ones(1)}, opt.init({"a": jnp.ones(1)}))


# --------------------------------------------------------------------------
# keep_params_nonnegative


def test_keep_params_nonnegative_matches_optax_over_steps():
    params = jax.tree.map(jnp.abs, nested_tree())
    opt = ux.scale(-1.0).keep_params_nonnegative()
    ref = optax.chain(optax.scale(-1.0), optax.keep_params_nonnegative())
    state, ref_state = opt.init(params), ref.init(params)
    ref_params = params
    step = jax.jit(opt.update)
    clamped = 0
    for t in range(5):
        grads = nested_tree(seed=t + 1)
        updates, state = step(grads, state, params)
        with jax.numpy_dtype_promotion("standard"):
            expected, ref_state = ref.update(grads, ref_state, ref_params)
            ref_params = optax.apply_updates(ref_params, expected)
        assert_trees_equal(updates, expected)
        raw = jax.tree.map(lambda p, g: p - g, params, grads)
        clamped += sum(int(np.sum(np.asarray(r) < 0)) for r in jax.tree.leaves(raw))
        params = ux.apply_updates(params, updates)
        assert_trees_equal(params, ref_params)
        assert all(np.all(np.asarray(p) >= 0) for p in jax.tree.leaves(params))
    assert clamped > 10  # the rule was exercised, not only the pass-through


def test_keep_params_nonnegative_moves_a_negative_param_to_zero():
    opt = ux.keep_params_nonnegative()
    params = {"w": jnp.asarray([-0.5, -0.5, 1.0])}
    updates, _ = opt.update({"w": jnp.asarray([0.1, 1.0, -2.0])}, opt.init(params), params)
    np.testing.assert_array_equal(ux.apply_updates(params, updates)["w"], [0.0, 0.5, 0.0])


def test_keep_params_nonnegative_rounds_minus_p_towards_zero_in_a_narrower_update_dtype():
    # -p is not a bfloat16: round to nearest gives -1.0078125, and p + that would be -0.002.
    p = 1.0 + 0.75 * 2.0 ** -7
    params = {"w": jnp.asarray([p, 2.0 * p, 3.0], jnp.float32)}
    grads = {"w": jnp.asarray([-5.0, -5.0, 1.0], jnp.bfloat16)}
    opt = ux.keep_params_nonnegative()
    updates, _ = opt.update(grads, opt.init(params), params)
    assert updates["w"].dtype == jnp.bfloat16
    new = np.asarray(ux.apply_updates(params, updates)["w"])
    assert np.all(new >= 0) and new[0] < 2 ** -6 and new[1] < 2 ** -5 and new[2] == 4.0


def test_keep_params_nonnegative_needs_params_and_real_numbers():
    opt = ux.keep_params_nonnegative()
    with pytest.raises(ValueError, match="keep_params_nonnegative needs params"):
        opt.update({"w": jnp.ones(1)}, opt.init(None))
    with pytest.raises(TypeError, match="keep_params_nonnegative: complex updates are not supported"):
        opt.update({"w": jnp.ones(1, jnp.complex64)}, opt.init(None), {"w": jnp.ones(1, jnp.complex64)})
    with pytest.raises(ValueError, match=r"keep_params_nonnegative\(\): updates do not fit params: at \['c'\]"):
        opt.update({"w": jnp.ones(1)}, opt.init(None), {"w": jnp.ones(1), "c": jnp.ones(1)})


# --------------------------------------------------------------------------
# snapshot


def test_snapshot_matches_optax_snapshot_and_passes_updates_through():
    params = nested_tree()
    opt = ux.scale_by_adam().snapshot("adam_direction").snapshot("adam_norm", measure=ux.global_norm).clip(0.1)
    plain = ux.scale_by_adam().clip(0.1)
    ref = optax.chain(optax.scale_by_adam(eps_root=1e-15), optax.snapshot("adam_direction", lambda u: u),
                      optax.snapshot("adam_norm", optax.tree.norm), optax.clip(0.1))
    state, plain_state, ref_state = opt.init(params), plain.init(params), ref.init(params)
    step = jax.jit(opt.update)
    for t in range(4):
        grads = nested_tree(seed=t + 1)
        updates, state = step(grads, state)
        plain_updates, plain_state = jax.jit(plain.update)(grads, plain_state)
        with jax.numpy_dtype_promotion("standard"):
            _, ref_state = ref.update(grads, ref_state)
        assert_trees_close(updates, plain_updates, rtol=0, atol=0)
        assert_trees_close(opt.get_state(state, "adam_direction.value"), optax.tree.get(ref_state, "adam_direction"),
                           msg=f"step {t + 1}")
        np.testing.assert_allclose(opt.get_state(state, "adam_norm.value"), optax.tree.get(ref_state, "adam_norm"),
                                   rtol=RTOL)


def test_snapshot_starts_at_zero_keeps_the_init_dtypes_and_copies():
    params = {"w": jnp.ones((2, 3), jnp.bfloat16), "n": None, "s": [jnp.ones(())]}
    opt = ux.snapshot()
    state = opt.init(params)
    value = opt.get_state(state, "snapshot.value")
    assert_trees_equal(value, jax.tree.map(jnp.zeros_like, params))
    # One more params-sized tree: the memory a full copy costs.
    assert sum(x.nbytes for x in jax.tree.leaves(state)) == sum(x.nbytes for x in jax.tree.leaves(params))
    grads = jax.tree.map(lambda p: p * 3, params)
    updates, state = opt.update(grads, state)
    value = opt.get_state(state, "snapshot.value")
    assert_trees_equal(value, grads)
    pointers = {x.unsafe_buffer_pointer() for x in jax.tree.leaves(updates)}
    assert not pointers & {x.unsafe_buffer_pointer() for x in jax.tree.leaves(value)}


def test_two_snapshots_of_one_name_are_told_apart_by_index():
    opt = ux.snapshot().scale(2.0).snapshot()
    g = {"w": jnp.asarray([1.0, -2.0])}
    _, state = opt.update(g, opt.init(g))
    np.testing.assert_array_equal(opt.get_state(state, "snapshot[0].value")["w"], [1.0, -2.0])
    np.testing.assert_array_equal(opt.get_state(state, "snapshot[1].value")["w"], [2.0, -4.0])
    with pytest.raises(KeyError, match="2 stages are named 'snapshot'"):
        opt.get_state(state, "snapshot.value")


def test_snapshot_value_semantics_and_pipe_forms():
    a = ux.scale(2.0).snapshot("snap_forms", measure=ux.global_norm)
    assert a == ux.snapshot(ux.scale(2.0), "snap_forms", measure=ux.global_norm) == ux.scale(2.0).pipe(
        ux.snapshot, name="snap_forms", measure=ux.global_norm)
    assert repr(a) == "scale(step_size=2.0) |> snap_forms(measure=updax.updates._clipping.global_norm)"
    assert a != ux.scale(2.0).snapshot("snap_forms") and a != ux.scale(2.0).snapshot(measure=ux.global_norm)


def test_snapshot_refuses_bad_names_and_functions():
    with pytest.raises(TypeError, match=r"snapshot\(name=3\): name must be a Python identifier"):
        ux.snapshot(3)
    with pytest.raises(TypeError, match=r"snapshot\(name='a b'\): name must be a Python identifier"):
        ux.snapshot("a b")
    with pytest.raises(ValueError, match=r"snapshot\(name='scale'\): stage name 'scale' is updax's \(ux.scale\)"):
        ux.snapshot("scale")
    with pytest.raises(ValueError, match=r"snapshot\(name='class'\)"):
        ux.snapshot("class")
    with pytest.raises(TypeError, match=r"snapshot\(measure=1\): measure must be callable"):
        ux.snapshot(measure=1)


# --------------------------------------------------------------------------
# Projections: parity with optax


def _trees(n=4):
    """Nested trees with None leaves and empty subtrees, at several scales."""
    return [jax.tree.map(lambda x, s=s: x * s, nested_tree(seed=seed)) for seed, s in zip(range(n), [1.0, 0.1, 3.0, 0.02])]


def _full_like(tree, value):
    return jax.tree.map(lambda x: jnp.full(x.shape, value, x.dtype), tree)


OPTAX_CASES = {
    "non_negative": (lambda t, s: P.projection_non_negative(t), lambda t, s: optax.projections.projection_non_negative(t)),
    "box": (lambda t, s: P.projection_box(t, -0.3 * s, 0.5 * s),
            lambda t, s: optax.projections.projection_box(t, _full_like(t, -0.3 * s), _full_like(t, 0.5 * s))),
    "box_trees": (lambda t, s: P.projection_box(t, _full_like(t, -s), _full_like(t, 0.2)),
                  lambda t, s: optax.projections.projection_box(t, _full_like(t, -s), _full_like(t, 0.2))),
    "hypercube": (lambda t, s: P.projection_hypercube(t, s),
                  # leaf by leaf: optax's passes lower=0 to jax.tree.map, which takes no scalar for a tree
                  lambda t, s: jax.tree.map(lambda x: optax.projections.projection_hypercube(x, s), t)),
    "simplex": (lambda t, s: P.projection_simplex(t, s), lambda t, s: optax.projections.projection_simplex(t, s)),
    "l1_ball": (lambda t, s: P.projection_l1_ball(t, s), lambda t, s: optax.projections.projection_l1_ball(t, s)),
    "l2_ball": (lambda t, s: P.projection_l2_ball(t, s), lambda t, s: optax.projections.projection_l2_ball(t, s)),
    "linf_ball": (lambda t, s: P.projection_linf_ball(t, s), lambda t, s: optax.projections.projection_linf_ball(t, s)),
    "l1_sphere": (lambda t, s: P.projection_l1_sphere(t, s), lambda t, s: optax.projections.projection_l1_sphere(t, s)),
    "l2_sphere": (lambda t, s: P.projection_l2_sphere(t, s), lambda t, s: optax.projections.projection_l2_sphere(t, s)),
    # (the offset b = ±scale: the trees' points fall on both sides of the sets)
    "halfspace": (lambda t, s: P.projection_halfspace(t, _normal(t), s),
                  lambda t, s: optax.projections.projection_halfspace(t, _normal(t), s)),
    "halfspace_below": (lambda t, s: P.projection_halfspace(t, _normal(t), -s),
                        lambda t, s: optax.projections.projection_halfspace(t, _normal(t), -s)),
    "hyperplane": (lambda t, s: P.projection_hyperplane(t, _normal(t), s),
                   lambda t, s: optax.projections.projection_hyperplane(t, _normal(t), s)),
    "vector": (lambda t, s: P.projection_vector(t, _normal(t)),
               lambda t, s: optax.projections.projection_vector(t, _normal(t))),
}


def _normal(tree):
    """A fixed direction shaped like ``tree``: cos(1), cos(2), ... along its elements."""
    leaves, treedef = jax.tree.flatten(tree)
    out, start = [], 1
    for x in leaves:
        out.append(jnp.cos(jnp.arange(start, start + x.size, dtype=jnp.float32)).reshape(x.shape).astype(x.dtype))
        start += x.size
    return treedef.unflatten(out)


@pytest.mark.parametrize("name", sorted(OPTAX_CASES))
def test_projections_match_optax(name):
    ours, theirs = OPTAX_CASES[name]
    for i, tree in enumerate(_trees()):
        for scale in (0.5, 1.0, 4.0):
            got = ours(tree, scale)
            with jax.numpy_dtype_promotion("standard"):
                expected = theirs(tree, scale)
            assert_trees_close(got, expected, msg=f"{name}, tree {i}, scale {scale}")
            assert all(a.dtype == x.dtype for a, x in zip(jax.tree.leaves(got), jax.tree.leaves(tree)))


# --------------------------------------------------------------------------
# Projections: independent checks


def _threshold64(v, z):
    """The θ with sum(max(v - θ, 0)) = z, by bisection in float64 (no sort: independent of Duchi's algorithm)."""
    lo, hi = np.min(v) - z / v.size - 1.0, np.max(v)  # the sum is >= z at lo and 0 at hi
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if np.sum(np.maximum(v - mid, 0)) > z else (lo, mid)
    return (lo + hi) / 2


def _apply_vector(tree, fn):
    """``fn`` on the float64 vector of ``tree``'s leaves, back into its shape."""
    leaves, treedef = jax.tree.flatten(tree)
    out, flat, i = [], fn(_vector(tree)), 0
    for x in leaves:
        out.append(flat[i:i + x.size].reshape(x.shape))
        i += x.size
    return treedef.unflatten(out)


def _simplex64(v, z):
    return np.maximum(v - _threshold64(v, z), 0)


def _l1_ball64(v, z):
    if np.sum(np.abs(v)) <= z:
        return v
    return np.sign(v) * np.maximum(np.abs(v) - _threshold64(np.abs(v), z), 0)


def _l2_ball64(v, z):
    return v * min(1.0, z / np.linalg.norm(v))


CLOSED_FORMS = {
    "non_negative": (lambda t, s: P.projection_non_negative(t), lambda v, s: np.maximum(v, 0)),
    "box": (lambda t, s: P.projection_box(t, -0.3 * s, 0.5 * s), lambda v, s: np.clip(v, -0.3 * s, 0.5 * s)),
    "hypercube": (lambda t, s: P.projection_hypercube(t, s), lambda v, s: np.clip(v, 0, s)),
    "simplex": (lambda t, s: P.projection_simplex(t, s), _simplex64),
    "l1_ball": (lambda t, s: P.projection_l1_ball(t, s), _l1_ball64),
    "l2_ball": (lambda t, s: P.projection_l2_ball(t, s), _l2_ball64),
    "linf_ball": (lambda t, s: P.projection_linf_ball(t, s), lambda v, s: np.clip(v, -s, s)),
}

#: Membership in the set, for a float64 vector, with a tolerance for float32 rounding.
IN_SET = {
    "non_negative": lambda v, s: np.all(v >= 0),
    "box": lambda v, s: np.all((v >= np.float32(-0.3 * s)) & (v <= np.float32(0.5 * s))),  # bounds as float32s
    "hypercube": lambda v, s: np.all((v >= 0) & (v <= s)),
    "simplex": lambda v, s: np.all(v >= 0) and abs(np.sum(v) - s) <= 1e-5 * max(1.0, s),
    "l1_ball": lambda v, s: np.sum(np.abs(v)) <= s * (1 + 1e-5),
    "l2_ball": lambda v, s: np.linalg.norm(v) <= s * (1 + 1e-6),
    "linf_ball": lambda v, s: np.all(np.abs(v) <= s),
}

def _unit(d):
    return d / np.linalg.norm(d)


#: Random points of each set (float64 vectors of size n), for the optimality condition.
RNG = np.random.default_rng(0)
SAMPLES = {
    "non_negative": lambda n, s: np.abs(RNG.normal(size=n)) * RNG.exponential(),
    "box": lambda n, s: RNG.uniform(-0.3 * s, 0.5 * s, size=n),
    "hypercube": lambda n, s: RNG.uniform(0, s, size=n),
    "simplex": lambda n, s: RNG.dirichlet(np.full(n, 0.3)) * s,
    "l1_ball": lambda n, s: RNG.choice([-1, 1], size=n) * RNG.dirichlet(np.full(n, 0.3)) * s * RNG.uniform(),
    "l2_ball": lambda n, s: _unit(RNG.normal(size=n)) * s * RNG.uniform() ** (1 / n),
    "linf_ball": lambda n, s: RNG.uniform(-s, s, size=n),
}


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_projections_are_the_closest_point_of_the_set(name):
    """The float64 closed form or bisection agrees; the result is in the set; and it is the closest point:
    <x - p, q - p> <= 0 for every q in the set (the projection's optimality condition), checked on samples."""
    ours, reference = CLOSED_FORMS[name]
    for i, tree in enumerate(_trees()):
        for scale in (0.5, 1.0, 4.0):
            got = ours(tree, scale)
            expected = _apply_vector(tree, lambda v, s=scale: reference(v, s))
            assert_trees_close(got, expected, msg=f"{name} {i} {scale}")
            x, p = _vector(tree), _vector(got)
            assert IN_SET[name](p, scale), (name, i, scale)
            for _ in range(20):
                q = SAMPLES[name](x.size, scale)
                assert np.dot(x - p, q - p) <= 1e-5 * max(1.0, np.abs(x).max()) * np.abs(q - p).sum()
                assert np.linalg.norm(x - p) <= np.linalg.norm(x - q) + 1e-6


def _sphere64(v, z, norm):
    return v * z / norm(v)


def _l1_sphere64(v, z):
    """sign(x)·(the simplex projection of |x|), the threshold by bisection (negative inside the ball)."""
    return np.sign(v) * np.maximum(np.abs(v) - _threshold64(np.abs(v), z), 0)


#: The sets a vector a defines and the spheres, in float64, with what makes a point the projection there.
VECTOR_SETS = {
    "hyperplane": (lambda t, s: P.projection_hyperplane(t, _normal(t), s),
                   lambda v, a, s: v - (a @ v - s) / (a @ a) * a,
                   lambda x, p, a, s: abs(a @ p - s) <= 1e-5 * max(1.0, abs(s)) * np.linalg.norm(a)),
    "halfspace": (lambda t, s: P.projection_halfspace(t, _normal(t), s),
                  lambda v, a, s: v - max(a @ v - s, 0) / (a @ a) * a,
                  lambda x, p, a, s: a @ p <= s + 1e-5 * max(1.0, abs(s)) * np.linalg.norm(a)),
    "vector": (lambda t, s: P.projection_vector(t, _normal(t)), lambda v, a, s: (v @ a) / (a @ a) * a,
               lambda x, p, a, s: abs((x - p) @ a) <= 1e-5 * np.linalg.norm(x) * np.linalg.norm(a)),
    "l2_sphere": (lambda t, s: P.projection_l2_sphere(t, s), lambda v, a, s: v * s / np.linalg.norm(v),
                  lambda x, p, a, s: abs(np.linalg.norm(p) - s) <= 1e-5 * s),
    "l1_sphere": (lambda t, s: P.projection_l1_sphere(t, s), lambda v, a, s: _l1_sphere64(v, s),
                  lambda x, p, a, s: abs(np.sum(np.abs(p)) - s) <= 1e-5 * max(1.0, s)),
}


@pytest.mark.parametrize("name", sorted(VECTOR_SETS))
def test_spheres_and_the_sets_of_a_vector_in_float64(name):
    """The rule in float64 agrees, the result is in the set, and (with x - p along a, or x on the ray of p for the
    L2 sphere) it is the closest point; under jax.jit with a traced offset or radius too."""
    ours, reference, member = VECTOR_SETS[name]
    for i, tree in enumerate(_trees()):
        a = _vector(_normal(tree))
        for scale in (0.5, 1.0, 4.0):
            got = ours(tree, scale)
            expected = _apply_vector(tree, lambda v, s=scale: reference(v, a, s))
            assert_trees_close(got, expected, msg=f"{name} {i} {scale}")
            assert member(_vector(tree), _vector(got), a, scale), (name, i, scale)
            assert_trees_close(jax.jit(ours)(tree, jnp.float32(scale)), got, rtol=1e-6, atol=1e-6)
            assert [x.dtype for x in jax.tree.leaves(got)] == [x.dtype for x in jax.tree.leaves(tree)]
        assert_trees_close(ours(ours(tree, 1.0), 1.0), ours(tree, 1.0), rtol=1e-5, atol=1e-6)  # idempotent


def test_the_sets_of_a_zero_vector_and_the_centre_of_a_sphere():
    x, zero = {"w": jnp.array([1.0, -2.0])}, {"w": jnp.zeros(2)}
    assert_trees_equal(P.projection_vector(x, zero), zero)  # the line of 0 is the point 0
    assert_trees_equal(P.projection_hyperplane(x, zero, 0.0), x)  # {p : 0 = 0}: all of space
    assert_trees_equal(P.projection_halfspace(x, zero, 1.0), x)
    for project in (P.projection_hyperplane, P.projection_halfspace):
        with pytest.raises(ValueError, match=f"{project.__name__}: a is zero and b is -1.0, so the set is empty"):
            project(x, zero, -1.0)
    # every point of the sphere is closest to 0: the one with equal coordinates, on the sphere
    np.testing.assert_allclose(P.projection_l2_sphere({"a": jnp.zeros(3), "b": jnp.zeros(1)}, 2.0)["a"], [1.0] * 3)
    with pytest.raises(ValueError, match="projection_vector: a.* has shape"):
        P.projection_vector(x, {"w": jnp.zeros(3)})
    with pytest.raises(ValueError, match="projection_halfspace: a does not match x"):
        P.projection_halfspace(x, {"v": jnp.zeros(2)}, 1.0)


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_projections_are_idempotent_and_keep_none_leaves(name):
    ours, _ = CLOSED_FORMS[name]
    for tree in _trees():
        once = ours(tree, 1.0)
        assert jax.tree.structure(once) == jax.tree.structure(tree)
        assert_trees_close(ours(once, 1.0), once, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["non_negative", "box", "hypercube", "l1_ball", "l2_ball", "linf_ball"])
def test_points_inside_are_returned_exactly(name):
    ours, _ = CLOSED_FORMS[name]
    # 0.99: a sample of the ball stays inside after rounding to float32
    inside = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32),
                          _apply_vector(nested_tree(), lambda v: 0.99 * SAMPLES[name](v.size, 1.0)))
    assert_trees_equal(ours(inside, 1.0), inside)


def test_a_point_of_the_simplex_is_returned_up_to_rounding():
    point = jax.tree.map(lambda x: jnp.asarray(RNG.dirichlet(np.ones(x.size)).reshape(x.shape) / 6, jnp.float32),
                         nested_tree())
    total = float(np.sum(_vector(point)))
    assert_trees_close(P.projection_simplex(point, total), point, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_projections_under_jit_with_a_traced_scale(name):
    ours, _ = CLOSED_FORMS[name]
    jitted = jax.jit(ours)
    for tree in _trees(2):
        for scale in (0.5, 2.0):
            assert_trees_close(jitted(tree, jnp.float32(scale)), ours(tree, scale), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_low_precision_leaves_keep_their_dtype_and_land_in_the_set(name, dtype):
    ours, reference = CLOSED_FORMS[name]
    eps = float(jnp.finfo(dtype).eps)
    tree = jax.tree.map(lambda x: x.astype(dtype), nested_tree(seed=5))
    mixed = {"low": tree, "f32": jnp.asarray([0.25, -2.0], jnp.float32)}
    for t in (tree, mixed):
        got = ours(t, 1.0)
        assert [x.dtype for x in jax.tree.leaves(got)] == [x.dtype for x in jax.tree.leaves(t)]
        p = _vector(got)
        assert_trees_close(got, _apply_vector(t, lambda v: reference(v, 1.0)), rtol=2 * eps, atol=4 * eps)
        if name in ("non_negative", "box", "hypercube", "linf_ball"):
            assert IN_SET[name](p, 1.0)  # exact: bounds not exact in the dtype are rounded into the box
        else:
            norm = {"simplex": np.sum, "l1_ball": lambda v: np.sum(np.abs(v)), "l2_ball": np.linalg.norm}[name]
            assert norm(p) <= 1.0 + 4 * eps * np.sqrt(p.size) and np.all(p >= 0) | (name != "simplex")


def test_box_bounds_that_a_narrow_dtype_cannot_hold_are_rounded_inwards():
    x = {"w": jnp.linspace(-1, 1, 101).astype(jnp.bfloat16)}
    got = np.asarray(P.projection_box(x, 0.3, 0.7)["w"], np.float64)
    assert got.min() >= 0.3 and got.max() <= 0.7 and got.min() < 0.3 + 2 ** -7 and got.max() > 0.7 - 2 ** -7


def test_projections_in_float64():
    with jax.enable_x64(True):
        tree = {"a": jnp.asarray(RNG.normal(size=(5, 4))), "b": [jnp.asarray(RNG.normal(size=7)), None]}
        assert tree["a"].dtype == jnp.float64
        for name in ("simplex", "l1_ball", "l2_ball"):
            ours, reference = CLOSED_FORMS[name]
            got = ours(tree, 0.7)
            assert all(x.dtype == jnp.float64 for x in jax.tree.leaves(got))
            expected = _apply_vector(tree, lambda v, f=reference: f(v, 0.7))
            assert_trees_close(got, expected, rtol=1e-12, atol=1e-13)


def test_simplex_derivative_matches_optax_s_custom_jvp():
    x = jnp.asarray(RNG.normal(size=9), jnp.float32)
    ours = jax.jacobian(P.projection_simplex)(x)
    with jax.numpy_dtype_promotion("standard"):
        theirs = jax.jacobian(optax.projections.projection_simplex)(x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_empty_trees():
    empty = {"a": None, "b": [], "c": jnp.zeros((0, 3))}
    for name in ("non_negative", "box", "hypercube", "l1_ball", "l2_ball", "linf_ball"):
        got = CLOSED_FORMS[name][0](empty, 1.0)
        assert jax.tree.structure(got) == jax.tree.structure(empty) and got["c"].shape == (0, 3)
    with pytest.raises(ValueError, match="projection_simplex: the tree has no elements"):
        P.projection_simplex(empty)


def test_python_numbers_are_leaves():
    got = P.projection_simplex({"w": jnp.asarray([2.5, 3.2]), "b": 0.5})
    np.testing.assert_allclose(float(sum(jnp.sum(x) for x in jax.tree.leaves(got))), 1.0, rtol=1e-6)
    assert got["b"].shape == () and got["b"].dtype == jnp.float32


# --------------------------------------------------------------------------
# Projections: errors name the call and the argument


@pytest.mark.parametrize("call, error, message", [
    (lambda: P.projection_simplex({"a": jnp.ones(2, jnp.int32)}), TypeError,
     r"projection_simplex: tree\['a'\] has dtype int32; projections take real floating-point leaves"),
    (lambda: P.projection_l2_ball([jnp.ones(2, jnp.complex64)]), TypeError,
     r"projection_l2_ball: tree\[0\] has dtype complex64"),
    (lambda: P.projection_non_negative({"a": "x"}), TypeError, r"projection_non_negative: tree\['a'\] is 'x'"),
    (lambda: P.projection_simplex(jnp.ones(2), scale=0.0), ValueError,
     r"projection_simplex\(scale=0.0\): scale must be in \(0, inf\)"),
    (lambda: P.projection_l1_ball(jnp.ones(2), scale=-1.0), ValueError, r"projection_l1_ball\(scale=-1.0\)"),
    (lambda: P.projection_l2_ball(jnp.ones(2), scale=float("nan")), ValueError, r"projection_l2_ball\(scale=nan\)"),
    (lambda: P.projection_linf_ball(jnp.ones(2), scale=-0.5), ValueError,
     r"projection_linf_ball\(scale=-0.5\): scale must be in \[0, inf\)"),
    (lambda: P.projection_hypercube(jnp.ones(2), scale="1"), TypeError,
     r"projection_hypercube: scale is '1'; a bound must be a real number or array"),
    (lambda: P.projection_simplex(jnp.ones(2), scale=jnp.ones(2)), TypeError,
     r"projection_simplex\(scale=.*\): scale must be a real scalar"),
    (lambda: P.projection_box(jnp.ones(2), 1.0, 0.0), ValueError,
     r"projection_box: lower must be <= upper; the box is empty"),
    (lambda: P.projection_box({"a": jnp.ones(2)}, {"a": jnp.zeros(2)}, {"a": jnp.asarray([1.0, -1.0])}),
     ValueError, r"projection_box: lower must be <= upper \(at tree\['a'\]\)"),
    (lambda: P.projection_box({"a": jnp.ones(2), "b": jnp.ones(1)}, {"a": 0.0, "c": 0.0}, 1.0), ValueError,
     r"projection_box: lower does not match tree: \['b'\] is in tree but not in lower"),
    (lambda: P.projection_box({"a": jnp.ones(2)}, {"a": jnp.zeros(3)}, 1.0), ValueError,
     r"projection_box: lower\['a'\] has shape \(3,\), which does not broadcast to the shape \(2,\)"),
    (lambda: P.projection_box(jnp.ones(2), float("nan"), 1.0), ValueError, r"projection_box: lower must not be NaN"),
    (lambda: P.projection_box(jnp.ones(2), 0.0, True), TypeError, r"projection_box: upper is True; a bound must be a real"),
    (lambda: P.projection_box(jnp.ones(2), 0.0, 1j), TypeError, r"projection_box: upper is 1j"),
    (lambda: P.projection_hypercube({"a": jnp.ones(2)}, {"a": jnp.asarray(-1.0)}), ValueError,
     r"projection_hypercube: 0 must be <= scale \(at tree\['a'\]\)"),
], ids=lambda x: "" if callable(x) or isinstance(x, type) else x[:40])
def test_bad_inputs_name_the_call_and_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_box_takes_infinite_bounds_for_a_one_sided_box():
    got = P.projection_box({"w": jnp.asarray([-3.0, 3.0])}, -jnp.inf, 1.0)
    np.testing.assert_array_equal(got["w"], [-3.0, 1.0])
