"""``apply_updates(..., rounding="stochastic")``: bfloat16 and float16 sums rounded at random, without bias.

The oracle is the definition (Gupta et al. 2015; Zamirai et al. 2020, arXiv
2010.06192), written here in float64 NumPy with ml_dtypes' formats: a sum
``x`` between its two neighbours ``lo < x < hi`` in the param's format
rounds to ``hi`` with probability ``(x - lo) / (hi - lo)``. Three kinds of
check: the probability itself, exactly, by sweeping every value of the
random bits through the kernel (``_rounding.rounded``); the mean of 10^5
draws through ``apply_updates``, within 3 sigma of the sum; and the
contract of ``apply_updates`` (exact sums, nearest rounding as before, jit
equal to eager, trees, keys, errors).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from compile_options import host_devices

import updax as ux
from updax import _rounding

BF16, F16 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)
N = 100_000


def _neighbours(x: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The float64 values of ``lo <= |x| <= hi``, the two values of ``dtype`` around ``|x|`` (``lo == hi`` where
    ``|x|`` is one), read from the format itself; past the largest finite value ``hi`` is the next step up
    (2**128 for bfloat16, 2**16 for float16), which the format writes as infinity."""
    mag = np.abs(x.astype(np.float64))
    with np.errstate(over="ignore"):  # (past the largest value both give infinity, replaced below)
        near = np.abs(x.astype(np.float32)).astype(dtype)  # round to nearest even: one of the two neighbours
        other = np.where(near.astype(np.float64) > mag, np.nextafter(near, np.zeros((), dtype)),
                         np.nextafter(near, np.full((), np.inf, dtype)))
    big = float(ml_dtypes.finfo(dtype).max)
    past_max = 2 * big - float(np.nextafter(np.asarray(big, dtype), np.zeros((), dtype)))  # max plus its step
    near64, other64 = (np.where(np.isinf(v), past_max, v.astype(np.float64)) for v in (near, other))
    other64 = np.where(near64 == mag, near64, other64)
    return np.minimum(near64, other64), np.maximum(near64, other64)


def _chance_up(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The probability that ``|x|`` rounds to its upper neighbour, in float64 (0 where ``x`` is representable)."""
    lo, hi = _neighbours(x, dtype)
    mag = np.abs(x.astype(np.float64))
    with np.errstate(invalid="ignore"):
        return np.where(hi == lo, 0.0, (mag - lo) / (hi - lo))


def _from_bits(patterns) -> np.ndarray:
    return np.asarray(patterns, np.uint32).view(np.float32)


def _values(dtype: np.dtype) -> np.ndarray:
    """float32 values across the format: random ones of every magnitude and sign, subnormals of both formats
    (float32's for bfloat16), values at and past the largest finite value, the smallest steps, zeros."""
    rng = np.random.default_rng(0)
    spread = rng.uniform(-1, 1, 40) * np.exp2(rng.uniform(-30, 15, 40))
    big = float(ml_dtypes.finfo(dtype).max)
    tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
    special = [0.0, -0.0, 1.0, -1.0, 1.0 + 2**-10, -(1.0 + 3 * 2**-12), big, -big, tiny, -tiny, 0.3 * tiny,
               1.7 * tiny, 2**-14 - 2**-30, 0.999 * 2**-14]
    if dtype == BF16:
        # float32 subnormals (bfloat16's are its top 7 bits), the largest float32 (past bfloat16's largest) and a
        # sum just under it, written as bit patterns: float arithmetic here may flush them.
        special += list(_from_bits([0x00000001, 0x0001ABCD, 0x807FFFFF, 0x007F8001, 0x7F7FFFFF, 0xFF7F4000,
                                    0x7F7F0001, 0x00800000 - 1, 0x3F80FFFF, 0xBF80FFFF]))
    else:
        special += [65504.0 + 16.0, 65504.0 + 31.9, -65510.0, 65535.0, 2.0**-24 * 0.5, 2.0**-24 * 1023.7,
                    5e-6, -2.0**-20 * 1.2345, 2.0**-33, 2.0**-16 * 1.001]
    return np.concatenate([spread, np.asarray(special)]).astype(np.float32)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_the_chance_of_rounding_up_is_exact_over_every_value_of_the_bits(dtype):
    """Every x rounds to one of its two neighbours, the upper one for exactly the share (x - lo) / (hi - lo)
    of the values the random bits can take: all 2**16 for bfloat16; for float16 the 2**16 multiples of 2**16 out
    of 2**32, which decide it exactly wherever at most 16 bits are dropped (every |x| >= 2**-17)."""
    x = _values(dtype)
    sweep = np.arange(2**16, dtype=np.uint32) << (0 if dtype == BF16 else 16)
    out = np.asarray(jax.jit(jax.vmap(lambda b: _rounding.rounded(jnp.asarray(x), jnp.full(x.shape, b),
                                                                  jnp.dtype(dtype))))(sweep))
    lo, hi = _neighbours(x, dtype)
    got = np.abs(out.astype(np.float64))
    top = float(ml_dtypes.finfo(dtype).max)
    expected_hi = np.where(hi > top, np.inf, hi)  # the step past the largest value is infinity
    assert np.all((got == lo) | (got == expected_hi)), x[~np.all((got == lo) | (got == expected_hi), axis=0)]
    assert np.all(np.signbit(out) == np.signbit(x)), "the sign is kept (zeros included)"
    ups = np.sum(got == expected_hi, axis=0) - np.where(lo == hi, 2**16, 0)  # (lo == hi: every value is "up")
    exact = np.abs(x) >= 2.0**-17 if dtype == F16 else np.ones(x.shape, bool)
    np.testing.assert_array_equal(ups[exact], (_chance_up(x, dtype) * 2**16)[exact])


def test_float16s_smallest_values_round_up_with_their_chance():
    """Below 2**-17 more than 16 bits are dropped: the chance is checked by sampling all 32 bits, 10^5 draws
    per value, within 3 sigma; under 2**-33 it is floor'd to a multiple of 2**-32 (documented)."""
    x = np.asarray([2.0**-24 * 0.3, 2.0**-20 * 1.7, 2.0**-30, -2.0**-24 * 0.01], np.float32)
    bits = jax.random.bits(jax.random.key(1), (N, x.size), jnp.uint32)
    out = np.asarray(jax.jit(lambda b: _rounding.rounded(jnp.asarray(np.broadcast_to(x, b.shape)), b,
                                                         jnp.float16))(bits))
    lo, hi = _neighbours(x, F16)
    share = np.mean(np.abs(out.astype(np.float64)) == hi, axis=0)
    q = _chance_up(x, F16)
    assert np.all(np.abs(share - q) <= 3 * np.sqrt(q * (1 - q) / N) + 1 / N), (share, q)


def test_infinity_and_nan_pass_through():
    x = jnp.asarray([np.inf, -np.inf, np.nan, -np.nan], jnp.float32)
    x = jnp.concatenate([x, jax.lax.bitcast_convert_type(jnp.asarray([0x7F800001, 0xFFFFFFFF, 0x7FC00001],
                                                                     jnp.uint32), jnp.float32)])
    for dtype, bits in [(jnp.bfloat16, 0xFFFF), (jnp.bfloat16, 0), (jnp.float16, 0xFFFFFFFF), (jnp.float16, 0)]:
        out = np.asarray(_rounding.rounded(x, jnp.full(x.shape, bits, jnp.uint32), jnp.dtype(dtype)))
        assert list(out[:2]) == [np.inf, -np.inf], dtype
        assert np.all(np.isnan(out[2:].astype(np.float32))), (dtype, out)  # a NaN whose payload is low stays one


@pytest.mark.parametrize(("dtype", "p", "u_in_steps"), [
    (BF16, 1.0, 0.1),  # an update of 0.1 of a step (2**-7 at 1): to nearest, nothing moves
    (BF16, 1.0, -0.1),
    (BF16, -3.0, 0.37),
    (BF16, -3.0, -0.63),
    (BF16, 1000.0, 0.5),
    (BF16, 0.0123, 2.9),
    (F16, 1.0, 0.1),
    (F16, -0.75, -0.37),
    (F16, 2.0**-20, 0.4),  # float16's subnormal range, steps of 2**-24
], ids=str)
def test_the_mean_of_10_5_draws_is_the_sum_within_3_sigma(dtype, p, u_in_steps):
    """One param of N elements, all equal: each draws its own bits, so the mean of the N rounded sums is the
    mean of N independent draws. Its oracle is the float32 sum, its sigma sqrt(q (1 - q) / N) steps."""
    p = np.full(N, p, dtype)
    step = float(np.nextafter(np.abs(p[0]), np.full((), np.inf, dtype))) - float(np.abs(p[0]))
    u = np.full(N, u_in_steps * step, np.float32)
    out = ux.apply_updates({"w": jnp.asarray(p)}, {"w": jnp.asarray(u)}, rounding="stochastic",
                           key=jax.random.key(7))["w"]
    x = p.astype(np.float32) + u  # the float32 sum the rounding starts from
    q = float(_chance_up(x[:1], dtype)[0])
    assert 0.05 < q < 0.95
    lo, hi = _neighbours(x[:1], dtype)
    mean = float(np.mean(np.asarray(out).astype(np.float64)))
    sigma = float(hi[0] - lo[0]) * np.sqrt(q * (1 - q) / N)
    assert abs(mean - float(x[0])) <= 3 * sigma, (mean, float(x[0]), sigma)
    nearest = np.asarray(ux.apply_updates({"w": jnp.asarray(p)}, {"w": jnp.asarray(u)})["w"])
    if abs(u_in_steps) < 0.5:
        assert np.all(nearest == p)  # the counter-case: nearest drops the update, 10^5 times alike


def test_draws_over_steps_are_unbiased_too():
    """The step count as the key (as a jitted step reads it from the optimizer state): 10^5 steps of one
    scalar param, each from the same param and update, round up in the share q within 3 sigma."""
    p, u = jnp.asarray(1.0, jnp.bfloat16), jnp.asarray(0.1 * 2**-7, jnp.float32)
    steps = jax.jit(jax.vmap(lambda n: ux.apply_updates(p, u, rounding="stochastic", key=n)))(jnp.arange(N))
    q = 0.1
    share = float(np.mean(np.asarray(steps) != 1.0))
    assert abs(share - q) <= 3 * np.sqrt(q * (1 - q) / N), share


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bfloat16", "float16"])
def test_a_representable_sum_is_exact(dtype):
    rng = np.random.default_rng(1)
    p = (rng.standard_normal(10_000) * 3).astype(dtype)
    target = (rng.standard_normal(10_000) * 3).astype(dtype)
    u = target.astype(np.float32) - p.astype(np.float32)  # exact in float32: both are float32 values close by
    assert np.all(p.astype(np.float32) + u == target.astype(np.float32))
    for key in (jax.random.key(0), 5, jnp.int32(123)):
        out = ux.apply_updates([jnp.asarray(p)], [jnp.asarray(u)], rounding="stochastic", key=key)[0]
        np.testing.assert_array_equal(np.asarray(out).view(np.uint16), target.view(np.uint16))


def _tree(dtype=jnp.bfloat16):
    rng = np.random.default_rng(2)

    def arr(*shape, dt=dtype):
        return jnp.asarray(rng.standard_normal(shape), dt)

    params = {"a": arr(3, 4), "b": [arr(5), None, (arr(2, 2, dt=jnp.float16), arr(7, dt=jnp.float32))],
              "c": None, "d": {}, "e": arr(6, dt=jnp.complex64)}
    updates = jax.tree.map(lambda p: (jnp.asarray(rng.standard_normal(p.shape), jnp.float32) * 1e-3).astype(
        jnp.complex64 if p.dtype == jnp.complex64 else jnp.float32), params)
    return params, updates


def test_jit_equals_eager_bit_for_bit_on_a_nested_tree_with_none_leaves():
    params, updates = _tree()
    for key in (jax.random.key(3), 11):
        eager = ux.apply_updates(params, updates, rounding="stochastic", key=key)
        jitted = jax.jit(lambda p, u, k: ux.apply_updates(p, u, rounding="stochastic", key=k))(params, updates, key)
        assert jax.tree.structure(eager) == jax.tree.structure(params)
        for e, j, p in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), jax.tree.leaves(params)):
            assert e.dtype == j.dtype == p.dtype and e.shape == p.shape
            np.testing.assert_array_equal(np.asarray(e).view(np.uint8), np.asarray(j).view(np.uint8))


def test_float32_and_complex_leaves_are_summed_as_to_nearest():
    params, updates = _tree()
    stochastic = ux.apply_updates(params, updates, rounding="stochastic", key=0)
    nearest = ux.apply_updates(params, updates)
    for path in (lambda t: t["b"][2][1], lambda t: t["e"]):
        np.testing.assert_array_equal(path(stochastic), path(nearest))


def test_nearest_is_the_default_and_unchanged():
    """The default rounds to nearest even, as a float32 sum cast by ml_dtypes/NumPy does."""
    params, updates = _tree()
    default, nearest = ux.apply_updates(params, updates), ux.apply_updates(params, updates, rounding="nearest")
    for d, n, p, u in zip(jax.tree.leaves(default), jax.tree.leaves(nearest), jax.tree.leaves(params),
                          jax.tree.leaves(updates)):
        wide = np.complex64 if p.dtype == jnp.complex64 else np.float32
        oracle = (np.asarray(p).astype(wide) + np.asarray(u).astype(wide)).astype(p.dtype)
        np.testing.assert_array_equal(np.asarray(d), oracle)
        np.testing.assert_array_equal(np.asarray(n), oracle)


def test_each_leaf_and_each_key_draws_its_own_bits():
    """Two leaves with the same param and update round apart; so do two steps; the same key repeats."""
    p, u = jnp.ones(1000, jnp.bfloat16), jnp.full(1000, 0.5 * 2**-7, jnp.float32)

    def moved(key):
        out = ux.apply_updates({"x": p, "y": p}, {"x": u, "y": u}, rounding="stochastic", key=key)
        return np.asarray(out["x"]) != 1, np.asarray(out["y"]) != 1

    (x1, y1), (x2, _), (x1_again, _) = moved(1), moved(2), moved(1)
    assert 400 < x1.sum() < 600 and 400 < y1.sum() < 600
    assert (x1 != y1).sum() > 300 and (x1 != x2).sum() > 300  # independent halves differ in about half
    np.testing.assert_array_equal(x1, x1_again)


def test_a_raw_key_and_its_typed_key_draw_the_same_bits_and_so_do_a_count_and_its_prngkey():
    params, updates = _tree()
    by_typed = ux.apply_updates(params, updates, rounding="stochastic", key=jax.random.key(4))
    by_raw = ux.apply_updates(params, updates, rounding="stochastic", key=jax.random.PRNGKey(4))
    by_count = jax.jit(lambda n: ux.apply_updates(params, updates, rounding="stochastic", key=n))(9)
    by_prngkey = ux.apply_updates(params, updates, rounding="stochastic", key=jax.random.PRNGKey(9))
    for a, b in [(by_typed, by_raw), (by_count, by_prngkey)]:
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_array_equal(x, y)


def test_a_jitted_training_step_reads_the_count_from_the_state_and_compiles_once():
    """Adam at a rate of a tenth of a step: bfloat16 params of 1 reach 1 - 200 * 1e-3 in expectation after 200
    steps, the count from Adam's state as the key; to nearest they never leave 1."""
    opt = ux.optimizers.adam(1e-3)
    traces = []

    def step(params, state, rounding):
        traces.append(1)
        grads = jax.tree.map(jnp.ones_like, params)
        updates, state = opt.update(grads, state, params)
        key = opt.get_state(state, "scale_by_adam.count") if rounding else None
        return ux.apply_updates(params, updates, rounding="stochastic" if rounding else "nearest", key=key), state

    step = jax.jit(step, static_argnums=2)
    for rounding in (True, False):
        params = {"w": jnp.ones(4096, jnp.bfloat16), "skip": None}
        state = opt.init(params)
        for _ in range(200):
            params, state = step(params, state, rounding)
        mean = float(jnp.mean(params["w"].astype(jnp.float32)))
        if rounding:
            # Each step moves the mean by 1e-3 in expectation; the spread over 4096 elements and 200 steps
            # of independent draws is well under 1e-3 (steps of 2**-8 below 1, chances near 1/4 each).
            assert mean == pytest.approx(0.8, abs=3e-3), mean
        else:
            assert mean == 1.0
    assert len(traces) == 2  # one trace per rounding, none per step


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"rounding": "stochastik", "key": 0}, ValueError,
     r"apply_updates\(rounding='stochastik'\): rounding must be 'nearest' or 'stochastic'"),
    ({"rounding": None}, ValueError, r"rounding must be 'nearest' or 'stochastic'"),
    ({"rounding": "stochastic"}, ValueError, r"apply_updates\(rounding='stochastic'\): needs a key"),
    ({"key": 0}, ValueError, r"apply_updates\(rounding='nearest'\): a key was given"),
    ({"rounding": "stochastic", "key": 0.5}, TypeError, r"key must be a PRNG key .* got float"),
    ({"rounding": "stochastic", "key": True}, TypeError, r"key must be a PRNG key .* got bool"),
    ({"rounding": "stochastic", "key": jnp.arange(3)}, TypeError, r"integer scalar .* shape \(3,\)"),
    ({"rounding": "stochastic", "key": jax.random.split(jax.random.key(0), 2)}, ValueError,
     r"key must be one PRNG key, got keys of shape \(2,\)"),
], ids=["unknown", "none", "no key", "key with nearest", "float key", "bool key", "vector key", "keys"])
def test_bad_input_is_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        ux.apply_updates({"w": jnp.ones(2, jnp.bfloat16)}, {"w": jnp.ones(2)}, **kwargs)


@pytest.mark.parametrize(("dtype", "error", "match"), [
    (jnp.int32, TypeError, r"params\['b'\]\[0\] has dtype int32: only floating or complex"),
    (jnp.float8_e4m3fn, TypeError, r"apply_updates\(rounding='stochastic'\): params\['b'\]\[0\] has dtype "
                                   r"float8_e4m3fn; stochastic rounding handles bfloat16 and float16"),
])
def test_a_param_that_cannot_be_rounded_is_named(dtype, error, match):
    params = {"a": jnp.ones(2, jnp.bfloat16), "b": [jnp.ones(2, dtype)]}
    with pytest.raises(error, match=match):
        ux.apply_updates(params, {"a": jnp.ones(2), "b": [jnp.ones(2)]}, rounding="stochastic", key=0)


def test_the_random_bits_are_uniform_and_uncorrelated_across_elements_leaves_and_keys():
    """The generator behind the rounding: 2**20 words per draw. Each of the 32 bits is set half the time and the
    top byte is uniform (chi-square, 255 degrees of freedom: 99.9% below 330); neighbouring elements, two
    leaves, two consecutive counts and two keys are uncorrelated (|r| under 5 / sqrt(n))."""
    n = 2**20

    def draw(words, index, shape=(1024, 1024)):
        (seeds,) = _rounding.leaf_seeds(jnp.asarray(words, jnp.uint32), [index], None)
        return np.asarray(_rounding.random_bits(*seeds, shape)).ravel()

    base = draw([0, 7], 0)
    ones = np.unpackbits(base.view(np.uint8)).reshape(n, 32).mean(axis=0)
    assert np.all(np.abs(ones - 0.5) < 5 * 0.5 / np.sqrt(n)), ones
    counts = np.bincount(base >> 24, minlength=256)
    assert np.sum((counts - n / 256) ** 2 / (n / 256)) < 330
    others = {"neighbour": np.roll(base, 1), "leaf 1": draw([0, 7], 1), "count 8": draw([0, 8], 0),
              "key (1, 7)": draw([1, 7], 0)}
    for name, other in others.items():
        r = np.corrcoef(base.astype(np.float64), other.astype(np.float64))[0, 1]
        assert abs(r) < 5 / np.sqrt(n), (name, r)
    np.testing.assert_array_equal(base, draw([0, 7], 0, (n,)))  # an element's bits follow its flat index


MESH_SCRIPT = r"""
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import updax as ux

rng = np.random.default_rng(0)
params = {"a": jnp.asarray(rng.standard_normal((16, 8)), jnp.bfloat16),
          "b": [jnp.asarray(rng.standard_normal(8), jnp.float16), None],
          "c": jnp.asarray(rng.standard_normal((4, 4)), jnp.float32)}
updates = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape) * 3e-3, jnp.float32), params)
step = lambda p, u, n: ux.apply_updates(p, u, rounding="stochastic", key=n)
reference = jax.jit(step)(params, updates, 5)
problems = []
for axis_type in (AxisType.Explicit, AxisType.Auto):
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)
    split = {"a": P("data", "model"), "b": [P("data"), None], "c": P(None, "model")}
    whole = {"a": P(), "b": [P(), None], "c": P()}
    with jax.set_mesh(mesh):
        place = lambda tree, specs: jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), tree, specs)
        # split like the params; then ZeRO-1's case, params whole and updates split over the data axis
        for name, p, u in [("split", place(params, split), place(updates, split)),
                           ("zero1", place(params, whole), place(updates, split))]:
            for how, out, near in [("jit", jax.jit(step)(p, u, 5), jax.jit(ux.apply_updates)(p, u)),
                                   ("eager", step(p, u, 5), ux.apply_updates(p, u))]:
                for x, y, q in zip(jax.tree.leaves(out), jax.tree.leaves(reference), jax.tree.leaves(near)):
                    if not np.array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8)):
                        problems.append(f"{axis_type.name} {name} {how}: bits differ for a {x.dtype} leaf")
                    if not x.sharding.is_equivalent_to(q.sharding, x.ndim):
                        problems.append(f"{axis_type.name} {name} {how}: {x.sharding} where nearest gives "
                                        f"{q.sharding}")
print("PROBLEMS", problems)
"""


def test_eight_devices_round_as_one_does_bit_for_bit():
    """On a 4x2 mesh of host devices (Explicit and Auto), with the params split and with ZeRO-1's updates split
    over the data axis, jitted and eager: the same bits as one device, each leaf placed as rounding to nearest
    places it (like its param; under jit on an Auto mesh, where no sharding is known while tracing, as XLA
    propagates it)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "XLA_FLAGS": host_devices(8), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", MESH_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "PROBLEMS []" in done.stdout, done.stdout[-3000:]


def _distinct_kernels(compiled) -> int:
    """The fused computations of a compiled program that differ in more than their names."""
    import re

    bodies = set()
    for block in re.findall(r"^(%?fused_computation[^\n]*\{\n.*?\n\})", compiled.as_text(), re.S | re.M):
        body = "\n".join(line.split("=", 1)[-1] for line in block.splitlines()[1:])
        bodies.add(re.sub(r", metadata=\{[^}]*\}", "", re.sub(r"%[\w.\-]+", "%x", body)))
    return len(bodies)


def test_the_seeds_come_from_one_kernel_and_the_backend_hint_changes_no_bit():
    """Each leaf's seeds are read from a buffer (updax._backend._apart.one_kernel_outputs), not computed in its
    kernel: twelve leaves of two shapes compile to kernels of as many kinds as nearest rounding's plus at most
    two (the seeds'), where seeds computed in each kernel make twelve kinds. The generic path (hints off) draws
    the same bits."""
    rng = np.random.default_rng(3)
    params = [jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for s in [(64, 32)] * 6 + [(48,)] * 6]
    updates = [jnp.asarray(rng.standard_normal(p.shape) * 1e-3, jnp.float32) for p in params]
    nearest = jax.jit(ux.apply_updates).lower(params, updates).compile()
    step = jax.jit(lambda p, u, n: ux.apply_updates(p, u, rounding="stochastic", key=n))
    stochastic = step.lower(params, updates, 3).compile()
    assert _distinct_kernels(stochastic) <= _distinct_kernels(nearest) + 2, (
        _distinct_kernels(stochastic), _distinct_kernels(nearest))
    with ux.backend_hints(False):
        generic = jax.jit(lambda p, u, n: ux.apply_updates(p, u, rounding="stochastic", key=n))(params, updates, 3)
        generic_kernels = _distinct_kernels(jax.jit(lambda p, u, n: ux.apply_updates(
            p, u, rounding="stochastic", key=n)).lower(params, updates, 3).compile())
    assert generic_kernels >= 12  # the counter-case: without the hint each leaf's kernel is its own program
    for a, b in zip(stochastic(params, updates, 3), generic):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))
