"""Properties over random inputs (hypothesis): closed-form facts every input must satisfy."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import updax as ux

finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=32)
vectors = arrays(np.float32, st.integers(1, 6), elements=finite)
trees = st.dictionaries(st.sampled_from(["a", "b", "c"]), vectors, min_size=1)


@settings(max_examples=40, deadline=None)
@given(trees, st.floats(0.1, 10.0))
def test_clip_by_global_norm_bounds_the_norm_and_keeps_directions(tree, max_norm):
    tree = {k: jnp.asarray(v) for k, v in tree.items()}
    opt = ux.clip_by_global_norm(max_norm)
    out, _ = opt.update(tree, opt.init(tree))
    norm = float(ux.global_norm(tree))
    assert float(ux.global_norm(out)) <= max_norm * (1 + 1e-5) + 1e-6
    scale = 1.0 if norm < max_norm else max_norm / norm
    for k in tree:
        np.testing.assert_allclose(out[k], np.asarray(tree[k]) * scale, rtol=1e-5, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(trees)
def test_adam_first_step_is_the_sign_up_to_eps(tree):
    tree = {k: jnp.asarray(v) for k, v in tree.items()}
    opt = ux.scale_by_adam(eps=1e-8, eps_root=0.0)
    out, _ = opt.update(tree, opt.init(tree))
    for k in tree:
        g = np.asarray(tree[k])
        # g / (|g| + eps): the sign wherever |g| >> eps, and exactly 0 where g = 0.
        big = np.abs(g) > 1e-2
        np.testing.assert_allclose(np.asarray(out[k])[big], np.sign(g)[big], atol=1e-5)
        assert np.all(np.asarray(out[k])[g == 0] == 0) and np.all(np.abs(np.asarray(out[k])) <= 1)


@settings(max_examples=40, deadline=None)
@given(trees, st.floats(0.0, 0.99))
def test_rms_equals_adam_with_b1_zero_and_no_bias_correction_after_one_step(tree, decay):
    # scale_by_rms: g / sqrt(nu + eps) with nu = (1-decay) g^2 after one step; scale_by_adam with b1 = 0 and
    # b2 = decay divides by sqrt(nu / (1 - decay)) = |g|: the ratio of the two is sqrt(1 - decay) exactly.
    tree = {k: jnp.asarray(v) for k, v in tree.items()}
    rms, adam = ux.scale_by_rms(decay=decay, eps=0.0), ux.scale_by_adam(b1=0.0, b2=decay, eps=0.0, eps_root=0.0)
    a, _ = rms.update(tree, rms.init(tree))
    b, _ = adam.update(tree, adam.init(tree))
    for k in tree:
        nonzero = np.asarray(tree[k]) != 0
        np.testing.assert_allclose(np.asarray(a[k])[nonzero] * np.sqrt(1 - decay), np.asarray(b[k])[nonzero],
                                   rtol=1e-4)


@settings(max_examples=30, deadline=None)
@given(trees)
def test_apply_updates_keeps_dtypes_and_adds(tree):
    params = {k: jnp.asarray(v, jnp.bfloat16) for k, v in tree.items()}
    updates = {k: jnp.ones_like(v, jnp.float32) for k, v in tree.items()}
    new = ux.apply_updates(params, updates)
    for k in tree:
        assert new[k].dtype == jnp.bfloat16
        expected = (np.asarray(params[k], np.float32) + 1.0).astype(jnp.bfloat16)
        np.testing.assert_array_equal(np.asarray(new[k], np.float32), np.asarray(expected, np.float32))
