"""Fused execution paths give what running their stages one by one gives.

The oracle runs each stage as its own one-stage pipeline, which no fused path
can match, so it is the plain stage-by-stage computation. Eagerly the two are
bit-identical (a fused path recomputes with the same arithmetic); under jit
they are two different XLA programs, which may round an op an ulp apart.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import updax as ux
from compile_options import DEFAULT_COMPILE
from updax import _fused
from updax._backend import _lamb as _fused_lamb


def one_by_one(opt, grads, state, params):
    new_state = []
    for stage, stage_state in zip(opt.stages, state):
        grads, (stage_state,) = ux.Update((stage,)).update(grads, (stage_state,), params)
        new_state.append(stage_state)
    return grads, tuple(new_state)


def tree(rng, dtype=jnp.float32, big=False):
    def arr(*shape):
        return jnp.asarray(rng.normal(size=shape).astype(np.float32), dtype)

    out = {"dense": {"w": arr(6, 5), "b": arr(5)}, "seq": [arr(7), (arr(2, 3), None)], "s": arr(), "empty": {},
           # enough leaves of one shape for their updates to be recomputed rather than kept
           "layers": [{"w": arr(4, 3), "b": arr(3)} for _ in range(_fused_lamb.RECOMPUTE_MIN_SHARED)]}
    if big:  # above the size up to which the update is recomputed
        out["seq"].append(arr(_fused_lamb.RECOMPUTE_MAX_SIZE + 8))
    return out


def _matrices(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


CASES = {
    "lamb": lambda: ux.optimizers.lamb(1e-2, decay=1e-2, min_norm=1e-3),
    "lamb, bf16 moments": lambda: ux.optimizers.lamb(1e-2, decay=1e-2, mu_dtype=jnp.bfloat16),
    "adam |> trust ratio": lambda: ux.scale_by_adam(b1=0.8, eps_root=1e-12).scale_by_trust_ratio(
        min_norm=0.5, trust_coefficient=0.7, eps=1e-6).scale(-0.1),
    "clip |> lamb": lambda: ux.clip_by_global_norm(0.5).pipe(ux.compose, ux.optimizers.lamb(1e-2, decay=0.1)),
    # On the whole-tree path the recomputed update is plain Adam's: a decay mask goes through it, Nesterov and a
    # trust-ratio mask take the ordinary path. Leaf by leaf every stage runs as it is, masks resolved per leaf.
    "lamb, decay mask": lambda: ux.optimizers.lamb(1e-2, decay=0.1, mask=_matrices),
    "lamb, decay mask as a tree prefix": lambda: ux.optimizers.lamb(1e-2, decay=0.1, mask={
        "dense": True, "seq": False, "s": True, "empty": {},
        "layers": [{"w": True, "b": False}] * _fused_lamb.RECOMPUTE_MIN_SHARED}),
    "nesterov adam |> trust ratio": lambda: ux.scale_by_adam(nesterov=True).scale_by_trust_ratio(
    ).scale(-0.1),
    "adam |> masked trust ratio": lambda: ux.scale_by_adam().scale_by_trust_ratio(
        mask=_matrices).scale(-0.1),
    "adam |> masked decay |> masked trust ratio, masks as trees": lambda: ux.scale_by_adam().add_decayed_weights(
        0.1, mask={"dense": {"w": True, "b": False}, "seq": True, "s": False, "empty": {}, "layers": True}
    ).scale_by_trust_ratio(mask={"dense": False, "seq": True, "s": True, "empty": {}, "layers": True}).scale(-0.1),
}


def test_every_registered_path_is_covered_here():
    covered = set()
    for make in CASES.values():
        stages = make().stages
        for i in range(len(stages)):
            run, width = _fused.find(stages[i:], params={})
            if run is not None:
                covered.add(tuple(stage.name for stage in stages[i:i + width]))
    assert covered == set(_fused.registered())


@pytest.fixture(params=[True, False], ids=["leaf order", "whole tree"])
def leaf_order(request, monkeypatch):
    """Traced on CPU, LAMB runs leaf by leaf; the whole-tree path (other backends) is tested here by switching it off."""
    if not request.param:
        monkeypatch.setattr(_fused_lamb, "in_leaf_order", lambda updates: False)
    return request.param


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("mode", ["eager", "jit", "jit, whole tree"])
def test_fused_equals_one_by_one(name, dtype, mode, monkeypatch):
    jit = mode != "eager"  # (eagerly there is no schedule: the leaf order is for traced steps only)
    if mode == "jit, whole tree":
        monkeypatch.setattr(_fused_lamb, "in_leaf_order", lambda updates: False)
    rng = np.random.default_rng(0)
    opt = CASES[name]()
    params = tree(rng, dtype, big=jit and dtype == jnp.float32)
    state = opt.init(params)
    update = jax.jit(opt.update) if jit else opt.update
    for step in range(3):  # each step from the same incoming state, so an ulp cannot compound
        grads = jax.tree.map(lambda p: p * 0.1 + jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
        ref_updates, ref_state = one_by_one(opt, grads, state, params)
        updates, state = update(grads, state, params)
        for a, b in zip(jax.tree.leaves((updates, state)), jax.tree.leaves((ref_updates, ref_state))):
            assert a.dtype == b.dtype
            rtol = 2e-6 if a.dtype == jnp.float32 else 1e-2  # a few float32 ulps, one bfloat16 ulp
            a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
            if jit:  # two different XLA programs: each may round an op differently (an ulp or so)
                scale = float(np.max(np.abs(b), initial=0.0))
                np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-6 * scale, err_msg=f"step {step}")
            else:
                np.testing.assert_array_equal(a, b, err_msg=f"step {step}")
        params = ux.apply_updates(params, updates)


def test_without_params_it_says_which_stage_needs_them():
    opt = ux.optimizers.lamb(1e-2)
    params = {"w": jnp.ones(3)}
    with pytest.raises(ValueError, match="add_decayed_weights needs params"):
        opt.update(params, opt.init(params))


def test_lamb_step_stores_no_update_per_layer(leaf_order):
    """The update the trust ratio measures is not stored for the whole model.

    One by one, XLA keeps the whole update tree as a temporary: it grows with
    the model. Leaf by leaf, one leaf's temporary serves every leaf in turn;
    on the whole-tree path the update is recomputed and what is left is per
    distinct leaf shape (XLA's reduction kernel writes out its broadcast
    scalars). Either way, more layers add nothing.
    """
    opt = ux.optimizers.lamb(1e-3, decay=1e-4)

    def temp_bytes(layers, run):
        params = [{"w1": jnp.ones((128, 256)), "w2": jnp.ones((256, 128)), "b": jnp.zeros(128)}
                  for _ in range(layers)]

        def step(p, s, g):
            u, s = run(g, s, p)
            return ux.apply_updates(p, u), s

        compiled = jax.jit(step, donate_argnums=(0, 1), compiler_options=DEFAULT_COMPILE).lower(
            params, opt.init(params), params).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    layer_bytes = (2 * 128 * 256 + 128) * 4
    layers = (_fused_lamb.RECOMPUTE_MIN_SHARED, _fused_lamb.RECOMPUTE_MIN_SHARED + 8)
    unfused = [temp_bytes(n, lambda g, s, p: one_by_one(opt, g, s, p)) for n in layers]
    fused = [temp_bytes(n, opt.update) for n in layers]
    assert unfused[1] - unfused[0] >= 8 * layer_bytes
    assert fused[1] - fused[0] < layer_bytes / 8


def test_leaf_order_keeps_at_most_one_leaf_of_temporaries():
    """Traced for the CPU, the leaves run one after another: the temporaries fit one leaf, not the model."""
    assert jax.default_backend() == "cpu"
    opt = ux.optimizers.lamb(1e-3, decay=1e-4, mask=lambda p: [{"w": True, "b": False} for _ in p])
    params = [{"w": jnp.ones((128 + i, 256)), "b": jnp.zeros(256)} for i in range(12)]  # every shape different

    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return ux.apply_updates(p, u), s

    compiled = jax.jit(step, donate_argnums=(0, 1), compiler_options=DEFAULT_COMPILE).lower(
            params, opt.init(params), params).compile()
    largest = max(p.nbytes for p in jax.tree.leaves(params))
    assert compiled.memory_analysis().temp_size_in_bytes <= 1.5 * largest


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_ordered_after_changes_no_value(dtype):
    """Bit for bit ``x``: signed zeros, infinities and NaNs kept, whatever the token.

    (A subnormal may come out flushed to zero, as XLA CPU's arithmetic leaves it in every kernel it then feeds.)
    """
    x = jnp.array([1.5, -0.0, 0.0, jnp.inf, -jnp.inf, jnp.nan, -2.0, 1e-41 if dtype == jnp.float32 else 1e-7], dtype)
    bits = np.uint16 if x.itemsize == 2 else np.uint32
    for token in [2.0, -0.0, jnp.nan, -jnp.inf, 3e38, 1e-45]:
        for f in (_fused_lamb.ordered_after, jax.jit(_fused_lamb.ordered_after)):
            y = f(x, jnp.float32(token))
            assert y.dtype == x.dtype
            np.testing.assert_array_equal(np.asarray(y[:-1]).view(bits), np.asarray(x[:-1]).view(bits))
            assert y[-1] in (x[-1], 0)
    z = jnp.array([1 + 2j, complex(jnp.inf, 1.0)], jnp.complex64)
    assert _fused_lamb.ordered_after(z, jnp.float32(1.0)) is z  # complex: returned as it is


def test_leaf_order_differentiates_like_the_whole_tree_path(monkeypatch):
    """Differentiating through the update (as meta-learning does): the exact-1 factor of ordered_after adds no
    derivative, so the leaf-ordered step's gradient is the whole-tree path's."""
    opt = ux.optimizers.lamb(1e-2, decay=0.1)
    rng = np.random.default_rng(1)
    params = tree(rng)
    state = opt.init(params)
    for _ in range(3):  # moments of their own (at the first step Adam's update is about sign(g): flat, ill-conditioned)
        state = opt.update(jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params), state,
                           params)[1]

    def loss(grads):
        updates, _ = opt.update(grads, state, params)
        return sum(jnp.sum(jnp.sin(u)) for u in jax.tree.leaves(updates))

    grads = jax.tree.map(lambda p: 0.3 * p + 0.1, params)
    leaf_ordered = jax.jit(jax.grad(loss))(grads)
    monkeypatch.setattr(_fused_lamb, "in_leaf_order", lambda updates: False)
    whole_tree = jax.jit(jax.grad(loss))(grads)
    for a, b in zip(jax.tree.leaves(leaf_ordered), jax.tree.leaves(whole_tree)):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_leaves_of_one_signature_are_traced_once_and_compute_the_same_bits(monkeypatch):
    """12 layers of 3 leaf shapes: LAMB's leaf function is traced once per shape (and once more for the first
    leaf, which follows no other), not once per leaf, and the step's numbers are those of tracing every leaf
    on its own, bit for bit (XLA inlines the calls)."""
    traces = []
    counted = _fused_lamb.trust_ratio
    monkeypatch.setattr(_fused_lamb, "trust_ratio", lambda *a, **k: traces.append(1) or counted(*a, **k))
    rng = np.random.default_rng(3)
    params = [{"w": jnp.asarray(rng.normal(size=(16, 16)), jnp.float32), "w1": jnp.asarray(rng.normal(size=(16, 32)),
               jnp.float32), "b": jnp.asarray(rng.normal(size=16), jnp.float32)} for _ in range(12)]
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    opt = ux.optimizers.lamb(1e-2, decay=0.1, mask=lambda p: jax.tree.map(lambda x: x.ndim == 2, p))

    def three_steps():
        @jax.jit
        def step(p, s, g):
            u, s = opt.update(g, s, p)
            return ux.apply_updates(p, u), s

        p, s = params, opt.init(params)
        for _ in range(3):
            p, s = step(p, s, grads)
        return jax.tree.leaves((p, s))

    shared = three_steps()
    assert len(traces) == 4, len(traces)
    traces.clear()
    monkeypatch.setattr(_fused_lamb, "_signature", lambda arrays: object())  # every leaf a signature of its own
    alone = three_steps()
    assert len(traces) == 36
    for a, b in zip(shared, alone):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_with_few_leaves_per_shape_it_is_the_ordinary_computation(monkeypatch):
    """Unique shapes (as in a model of many different layers): recomputing would cost more than it saves."""
    monkeypatch.setattr(_fused_lamb, "in_leaf_order", lambda updates: False)  # (the whole-tree path)
    opt = ux.optimizers.lamb(1e-3, decay=1e-4)
    params = {f"l{i}": jnp.ones((3, 4 + i)) for i in range(_fused_lamb.RECOMPUTE_MIN_SHARED)}
    state = opt.init(params)
    fused = jax.make_jaxpr(opt.update)(params, state, params)
    ordinary = jax.make_jaxpr(lambda g, s, p: one_by_one(opt, g, s, p))(params, state, params)
    assert str(fused) == str(ordinary)
    layers = [jnp.ones(3)] * _fused_lamb.RECOMPUTE_MIN_SHARED  # one shape, enough leaves: recomputed
    assert "optimization_barrier" in str(jax.make_jaxpr(opt.update)(layers, opt.init(layers), layers))
