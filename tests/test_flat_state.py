"""flat_state: an elementwise pipeline on the leaves joined into one buffer per dtype computes what it computes
on the leaves one by one.

Every registry entry and every optimizer made only of elementwise stages is
run both ways over several steps, eagerly and under jit, on nested trees
whose leaves are partly joined (small, in two dtypes) and partly kept apart
(large); the stages that are not elementwise, and masks, are refused by name.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from registry import ENTRIES, nested_tree

import updax as ux

O = ux.optimizers
STEPS = 5
#: Joined: the leaves of at most 5 elements (the registry's vectors of 4 and 5, its scalar); apart: the rest.
MAX_JOIN = 5


def _elementwise(opt):
    return all(stage.elementwise for stage in opt.stages)


ELEMENTWISE_ENTRIES = sorted(name for name, build in ENTRIES.items() if name != "flat_state" and
                             _elementwise(build()) and all(dict(s.options).get("mask") is None
                                                           for s in build().stages))
ELEMENTWISE_OPTIMIZERS = sorted(name for name in O.__all__ if _elementwise(getattr(O, name)()))


def test_the_elementwise_sets_are_what_they_should_be():
    assert {"scale_by_adam", "trace", "clip_by_global_norm", "scale_by_lion", "add_decayed_weights"} <= \
        set(ELEMENTWISE_ENTRIES)
    assert {"adam", "adamw", "sgd", "lion", "rmsprop", "adagrad", "nadamw"} <= set(ELEMENTWISE_OPTIMIZERS)
    assert not {"centralize", "scale_by_trust_ratio", "add_noise", "scale_by_factored_rms"} & set(ELEMENTWISE_ENTRIES)


def _tree(seed):
    """The registry's nested tree, with a bfloat16 vector: two joined groups, and leaves kept apart."""
    tree = nested_tree(seed=seed)
    tree["half"] = jnp.asarray(np.random.default_rng(seed).normal(size=3), jnp.bfloat16)
    return tree


def _run(opt, jit):
    params = _tree(0)
    state = opt.init(params)
    update = jax.jit(opt.update) if jit else opt.update
    outs = []
    for t in range(STEPS):
        grads = jax.tree.map(lambda g: g * (1.0 + 0.5 * np.sin(t)), _tree(t + 1))
        u, state = update(grads, state, params)
        params = ux.apply_updates(params, u)
        outs.append(u)
    return outs, params, state


def _compare(opt, jit):
    flat = opt.flat_state(max_join_size=MAX_JOIN, min_joined=1)
    (a, pa, _), (b, pb, state) = _run(opt, jit), _run(flat, jit)
    for x, y in zip(jax.tree.leaves((a, pa)), jax.tree.leaves((b, pb))):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=2e-6, atol=1e-7)
    return flat, state


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", ELEMENTWISE_ENTRIES)
def test_joined_equals_leaf_by_leaf_for_every_elementwise_entry(name, jit):
    _compare(ENTRIES[name](), jit)


@pytest.mark.parametrize("name", ELEMENTWISE_OPTIMIZERS)
def test_joined_equals_leaf_by_leaf_for_every_elementwise_optimizer(name):
    _compare(getattr(O, name)(), jit=True)


def test_the_state_is_joined_per_dtype_and_reads_back_like_the_params():
    flat, state = _compare(O.adam(0.1), jit=True)
    mu = flat.get_state(state, "flat_state/scale_by_adam.mu")
    params = _tree(0)
    sizes = {"float32": 4 + 5 + 1, "bfloat16": 3}  # the joined leaves, per dtype
    apart = [i for i, x in enumerate(jax.tree.leaves(params)) if x.size > MAX_JOIN]
    assert sorted(mu) == sorted([*sizes, *(f"leaf_{i:05d}" for i in apart)])
    for name, size in sizes.items():
        assert mu[name].shape == (size,) and mu[name].dtype == jnp.float32  # (moments of bfloat16: float32)
    # The same moments as the pipeline's own, shaped like the params again.
    _, _, plain = _run(O.adam(0.1), jit=True)
    for x, y in zip(jax.tree.leaves(ux.from_flat(mu, params)), jax.tree.leaves(O.adam(0.1).get_state(plain,
                                                                                                     "scale_by_adam.mu"))):
        np.testing.assert_allclose(x, y, rtol=2e-6, atol=1e-7)
    assert int(flat.get_state(state, "flat_state/scale_by_adam.count")) == STEPS


def test_a_large_leaf_keeps_its_buffer_and_a_joined_one_is_a_slice():
    params = {"big": jnp.ones((64, 64)), "small": [jnp.ones(3), jnp.ones((2, 2))]}
    opt = ux.trace(0.9).flat_state(max_join_size=16, min_joined=2)
    state = opt.init(params)
    trace = opt.get_state(state, "flat_state/trace.trace")
    assert trace["leaf_00000"].shape == (64, 64) and trace["float32"].shape == (7,)


def test_leaves_of_a_shape_many_share_keep_their_buffers_unless_asked():
    # 9 layer-norm-like vectors of one shape (more than max_shared=8: XLA compiles their kernels once, joined
    # each would get a slice kernel of its own), 8 of another (joined), and a bfloat16 one of the first shape.
    params = {"ln": [jnp.full(4, float(i)) for i in range(9)], "b": [jnp.ones(3) for _ in range(8)],
              "half": jnp.ones(4, jnp.bfloat16)}
    leaves = jax.tree.leaves(params)
    ln = [i for i, x in enumerate(leaves) if x.shape == (4,) and x.dtype == jnp.float32]
    grads = jax.tree.map(lambda x: x + 1.0, params)
    for max_shared, apart in [(8, ln), (9, []), (None, [])]:
        opt = O.adam(0.1).flat_state(max_shared=max_shared, min_joined=1)
        state = opt.init(params)
        u, state = jax.jit(opt.update)(grads, state, params)
        mu = opt.get_state(state, "flat_state/scale_by_adam.mu")
        assert sorted(mu) == sorted(["float32", "bfloat16", *(f"leaf_{i:05d}" for i in apart)])
        assert mu["float32"].shape == (8 * 3 + (0 if apart else 9 * 4),)
        # The same updates either way, and the state shaped like the params again.
        expected, plain = O.adam(0.1).update(grads, O.adam(0.1).init(params), params)
        for x, y in zip(jax.tree.leaves(u), jax.tree.leaves(expected)):
            np.testing.assert_allclose(x, y, rtol=2e-6)
        for x, y in zip(jax.tree.leaves(ux.from_flat(mu, params)), jax.tree.leaves(plain[0].mu)):
            np.testing.assert_allclose(x, y, rtol=2e-6)


@pytest.mark.parametrize("build, message", [
    (lambda: ux.centralize().flat_state(), r"^flat_state: centralize is not elementwise"),
    (lambda: ux.scale_by_adam().scale_by_trust_ratio().flat_state(), r"^flat_state: scale_by_trust_ratio is not"),
    (lambda: ux.scale_by_adam().accumulate_gradients(2).flat_state(), r"^flat_state: accumulate_gradients is not"),
    (lambda: O.adamw(decay=0.1, mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)).flat_state(),
     r"^flat_state: add_decayed_weights has a mask"),
    (lambda: ux.scale(1.0).flat_state(max_join_size=-1), r"^flat_state\(max_join_size=-1\): max_join_size must be"),
    (lambda: ux.scale(1.0).flat_state(max_shared=0), r"^flat_state\(max_shared=0\): max_shared must be a positive"),
    (lambda: ux.scale(1.0).flat_state(max_shared=2.0), r"^flat_state\(max_shared=2.0\): max_shared must be a"),
    (lambda: ux.scale(1.0).flat_state(min_joined=0), r"^flat_state\(min_joined=0\): min_joined must be a positive"),
])
def test_what_cannot_run_joined_is_refused_by_name(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_a_pipeline_composed_before_it_is_checked_when_it_runs():
    opt = ux.compose(ux.centralize(), ux.flat_state())
    assert repr(opt) == "centralize() |> flat_state(max_join_size=32768, max_shared=8, min_joined=16)"
    with pytest.raises(ValueError, match=r"^flat_state: centralize is not elementwise"):
        opt.init({"w": jnp.ones(3)})


def test_a_stage_of_your_own_joins_in_when_declared_elementwise():
    def halve(updates, params):
        return jax.tree.map(lambda g: 0.5 * g, updates)

    ours = ux.stateless(halve, name="halve_flat_test", elementwise=True)
    params = {"a": jnp.ones(3), "b": jnp.ones((2, 2))}
    u, _ = ours.flat_state(min_joined=1).update(params, ours.flat_state(min_joined=1).init(params))
    assert jax.tree.map(lambda x: float(x.ravel()[0]), u) == {"a": 0.5, "b": 0.5}
    with pytest.raises(ValueError, match="halve_undeclared is not elementwise"):
        ux.stateless(halve, name="halve_undeclared").flat_state()


def test_updates_without_params_are_grouped_like_the_updates_and_need_params_when_a_stage_does():
    opt = ux.scale_by_adam().flat_state()
    grads = {"a": jnp.ones(3), "b": jnp.ones(2)}
    u, _ = opt.update(grads, opt.init(grads))
    np.testing.assert_allclose(u["a"], 1.0, rtol=1e-5)  # (eps)
    with pytest.raises(ValueError, match=r"^flat_state needs params \(add_decayed_weights reads them\)"):
        O.adamw(decay=0.1).flat_state().update(grads, O.adamw(decay=0.1).flat_state().init(grads))


@pytest.mark.parametrize("buffers, message", [
    ([jnp.ones(3)], r"^from_flat: buffers must be the dict"),
    ({"float16": jnp.ones(3)}, r"^from_flat: the buffers \['float16'\] are not those of these params"),
    ({"float32": jnp.ones(2)}, r"^from_flat: the float32 buffer has shape \(2,\), too small"),
    ({"float32": jnp.ones(9)}, r"^from_flat: the float32 buffer has 9 elements, the params' float32 leaves 7"),
])
def test_from_flat_names_what_does_not_fit(buffers, message):
    with pytest.raises((ValueError, TypeError), match=message):
        ux.from_flat(buffers, {"a": jnp.ones(3), "b": jnp.ones((2, 2))})


def test_a_handful_of_small_leaves_is_not_joined_unless_asked():
    # 15 small float32 leaves (below min_joined=16) and 16 bfloat16 ones: only the bfloat16 ones are joined.
    params = {"f": [jnp.full(2 + i, float(i)) for i in range(15)],
              "h": [jnp.full(2 + i, 1.0, jnp.bfloat16) for i in range(16)]}
    leaves = jax.tree.leaves(params)
    grads = jax.tree.map(lambda x: x + 1.0, params)
    expected, _ = O.adam(0.1).update(grads, O.adam(0.1).init(params), params)
    for min_joined, apart in [(16, [i for i, x in enumerate(leaves) if x.dtype == jnp.float32]), (15, [])]:
        opt = O.adam(0.1).flat_state(min_joined=min_joined)
        state = opt.init(params)
        u, state = jax.jit(opt.update)(grads, state, params)
        mu = opt.get_state(state, "flat_state/scale_by_adam.mu")
        assert sorted(mu) == sorted(["bfloat16", *(f"leaf_{i:05d}" for i in apart), *(["float32"] * (not apart))])
        assert mu["bfloat16"].shape == (sum(2 + i for i in range(16)),)
        for x, y in zip(jax.tree.leaves(u), jax.tree.leaves(expected)):
            np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32), rtol=2e-6)
