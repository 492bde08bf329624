"""partition and masked: parity with optax, state only for touched leaves, untouched leaves unchanged."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import updax as ux
from registry import nested_tree


def _labels(params):
    return jax.tree.map(lambda p: "adam" if p.ndim >= 2 else "sgd", params)


def _mask(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def _compare(opt, ref, steps=12):
    p1 = p2 = nested_tree(seed=0)
    s1, s2 = opt.init(p1), ref.init(p2)
    for t in range(steps):
        g = nested_tree(seed=t + 1)
        u1, s1 = jax.jit(opt.update)(g, s1, p1)
        u2, s2 = ref.update(g, s2, p2)
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
        p1, p2 = ux.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    return s1


def test_partition_matches_optax_and_stores_state_only_for_its_group():
    opt = ux.partition({"adam": ux.scale_by_adam(eps_root=0.0).scale(-0.01), "sgd": ux.trace(0.5).scale(-0.1)},
                       _labels)
    ref = optax.partition({"adam": optax.chain(optax.scale_by_adam(), optax.scale(-0.01)),
                           "sgd": optax.chain(optax.trace(0.5), optax.scale(-0.1))}, _labels)
    state = _compare(opt, ref)
    mu = opt.get_state(state, "partition").inner["adam"][0].mu
    assert all(leaf.ndim >= 2 for leaf in jax.tree.leaves(mu))
    assert mu["dense"]["b"] is None and mu["scalar"] is None
    trace = opt.get_state(state, "partition").inner["sgd"][0].trace
    assert all(leaf.ndim < 2 for leaf in jax.tree.leaves(trace))


def test_masked_matches_optax_and_leaves_the_rest_unchanged():
    opt = ux.masked(ux.scale_by_adam(eps_root=0.0), _mask).scale(-0.01)
    ref = optax.chain(optax.masked(optax.scale_by_adam(), _mask), optax.scale(-0.01))
    _compare(opt, ref)
    g = nested_tree(seed=3)
    out, state = opt.update(g, opt.init(g), g)
    np.testing.assert_allclose(out["dense"]["b"], -0.01 * g["dense"]["b"], rtol=1e-6)
    assert state[0].inner[0].mu["dense"]["b"] is None


def test_a_mask_tree_and_a_callable_pytree_are_not_functions():
    class Module:  # a callable pytree, as an Equinox module is
        def __init__(self, tree):
            self.tree = tree

        def __call__(self, x):
            return x

    jax.tree_util.register_pytree_node(Module, lambda m: ((m.tree,), None), lambda _, c: Module(c[0]))
    from updax._masks import is_function as _is_function

    assert _is_function(_mask)
    assert not _is_function(Module({"w": True}))
    assert not _is_function({"w": True})
    opt = ux.masked(ux.scale(2.0), {"w": True, "b": False})
    out, _ = opt.update({"w": jnp.ones(1), "b": jnp.ones(1)}, opt.init({"w": jnp.ones(1), "b": jnp.ones(1)}))
    assert float(out["w"][0]) == 2.0 and float(out["b"][0]) == 1.0


def test_a_mask_for_the_whole_params_applies_inside_another_masked():
    """The inner mask is written for all the params; the outer masked hands it only its own leaves."""
    params = {"w": jnp.ones(2), "b": jnp.ones(1), "e": jnp.ones(3)}
    grads = {"w": jnp.full(2, 2.0), "b": jnp.full(1, 3.0), "e": jnp.full(3, 4.0)}
    opt = ux.trace(0.5).masked({"w": True, "b": False, "e": True}).masked({"w": True, "b": True, "e": False})
    state = opt.init(params)
    assert jax.tree.leaves(state) and all(x.shape == (2,) for x in jax.tree.leaves(state))  # a trace for w only
    for _ in range(2):
        updates, state = opt.update(grads, state, params)
    np.testing.assert_allclose(updates["w"], 2.0 * 1.5)  # traced: 2, then 2 + 0.5·2
    np.testing.assert_allclose(updates["b"], 3.0)  # masked out by the inner mask
    np.testing.assert_allclose(updates["e"], 4.0)  # masked out by the outer mask
    with pytest.raises(ValueError, match=r"masked: mask does not match params: \['x'\] is in mask but not in params"):
        ux.trace().masked({"w": True, "b": True, "e": True, "x": True}).init(params)


# A prefix of nested_tree's structure: one entry for the whole "layers" list and for each of "dense"'s leaves.
_PREFIX_MASK = {"dense": {"w": True, "b": False}, "layers": True, "empty": {}, "nothing": None, "empty_list": [],
                "scalar": False}
_PREFIX_LABELS = {"dense": "adam", "layers": "sgd", "empty": {}, "nothing": None, "empty_list": [], "scalar": "adam"}


def test_a_prefix_mask_or_prefix_labels_cover_whole_subtrees_as_in_optax():
    _compare(ux.scale_by_adam().scale(-0.1).masked(_PREFIX_MASK),
             optax.masked(optax.chain(optax.scale_by_adam(eps_root=1e-15), optax.scale(-0.1)), _PREFIX_MASK))
    _compare(ux.partition({"adam": ux.scale_by_adam().scale(-0.1), "sgd": ux.trace(0.9).scale(-0.1)}, _PREFIX_LABELS),
             optax.partition({"adam": optax.chain(optax.scale_by_adam(eps_root=1e-15), optax.scale(-0.1)),
                              "sgd": optax.chain(optax.trace(0.9), optax.scale(-0.1))}, _PREFIX_LABELS))
    # The prefix reaches every leaf under it: the masked-out "layers" list keeps its gradient unchanged.
    opt = ux.scale(0.0).masked({**_PREFIX_MASK, "layers": False})
    params = nested_tree(seed=0)
    out, _ = opt.update(params, opt.init(params), params)
    assert jax.tree.leaves(out["layers"]) == jax.tree.leaves(params["layers"])
    assert float(jnp.max(jnp.abs(out["dense"]["w"]))) == 0.0


def test_a_decay_mask_names_what_is_wrong():
    with pytest.raises(TypeError, match=r"add_decayed_weights\(mask=.*at mask\['w'\] it has str 'False'"):
        ux.add_decayed_weights(0.1, mask={"w": "False"})
    with pytest.raises(TypeError, match=r"scale_by_trust_ratio\(mask='w'\): mask must be a pytree of bools"):
        ux.scale_by_trust_ratio(mask="w")
    opt = ux.optimizers.lion(0.1, mask={"a": True, "b": {"c": False}})
    params = {"a": jnp.ones(2), "b": jnp.ones(2)}
    with pytest.raises(ValueError, match=r"add_decayed_weights: mask does not match params"):
        opt.update(params, opt.init(params), params)
