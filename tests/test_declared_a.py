"""Declared domains of the second-moment, sign, accumulation, clipping, noise-and-decay, Adam-variant and factored
stages (issue 38), and the defects found on the way: the value ``accumulate_gradients``' steps function returns,
the noise two ``partition`` groups draw, ``global_norm`` on leaves that are not numbers, and the state types of
ADOPT and simplified AdEMAMix.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import updax as ux

PARAMS = {"w": jnp.zeros(3)}
GRADS = {"w": jnp.array([0.1, -0.2, 0.3])}


# --- every option declared once: the constructor refuses by the declaration ---------------------------------------

REFUSED = [
    (ValueError, r"scale_by_rms(decay=1.0): decay must be in [0, 1)", lambda: ux.scale_by_rms(decay=1.0)),
    (TypeError, r"scale_by_rms(eps_in_sqrt=0): eps_in_sqrt must be True or False",
     lambda: ux.scale_by_rms(eps_in_sqrt=0)),
    (ValueError, r"scale_by_stddev(initial_scale=-0.5): initial_scale must be in [0, inf)",
     lambda: ux.scale_by_stddev(initial_scale=-0.5)),
    (ValueError, r"scale_by_adadelta(eps=0.0): eps must be in (0, inf)", lambda: ux.scale_by_adadelta(eps=0.0)),
    (TypeError, r"scale_by_rss(accumulator_dtype='int32'): accumulator_dtype must be None or a floating dtype",
     lambda: ux.scale_by_rss(accumulator_dtype="int32")),
    (ValueError, r"scale_by_lion(b2=1.0): b2 must be in [0, 1)", lambda: ux.scale_by_lion(b2=1.0)),
    (ValueError, r"scale_by_rprop(eta_minus=0.0): eta_minus must be in (0, 1]", lambda: ux.scale_by_rprop(0.1, 0.0)),
    (ValueError, r"scale_by_rprop(min_step_size=1.0, max_step_size=0.5): min_step_size must be <= max_step_size",
     lambda: ux.scale_by_rprop(0.1, min_step_size=1.0, max_step_size=0.5)),
    (ValueError, r"trace(decay=1.5): decay must be in [0, 1]", lambda: ux.trace(decay=1.5)),
    (ValueError, r"accumulate_gradients(steps=0): steps must be a positive integer",
     lambda: ux.accumulate_gradients(steps=0)),
    (TypeError, r"accumulate_gradients(steps=True): steps must be a positive integer",
     lambda: ux.accumulate_gradients(steps=True)),
    (ValueError, r"accumulate_gradients(steps=2147483648): steps must be at most 2**31 - 1 (step counters are int32; "
                 r"int64 under jax_enable_x64)",
     lambda: ux.accumulate_gradients(steps=2**31)),
    (TypeError, r"accumulate_gradients(should_skip=3): should_skip must be callable or None",
     lambda: ux.accumulate_gradients(steps=2, should_skip=3)),
    (TypeError, r"accumulate_gradients(mean=1): mean must be True or False",
     lambda: ux.accumulate_gradients(2, mean=1)),
    (ValueError, r"clip(delta=-1.0): delta must be in [0, inf)", lambda: ux.clip(-1.0)),
    (ValueError, r"clip_by_global_norm(max_norm=0.0): max_norm must be in (0, inf)",
     lambda: ux.clip_by_global_norm(0.0)),
    (TypeError, r"adaptive_grad_clip(axis=(0, 0)): axis must be None, an int or a non-empty tuple of distinct ints",
     lambda: ux.adaptive_grad_clip(0.1, axis=(0, 0))),
    (TypeError, r"add_decayed_weights(mask='no'): mask must be a pytree of bools",
     lambda: ux.add_decayed_weights(0.1, mask="no")),
    (ValueError, r"add_noise(key=-1): key must be an int seed in [0, 2**32)", lambda: ux.add_noise(key=-1)),
    (ValueError, r"scale_by_adopt(clip_value=0.0): clip_value must be in (0, inf)",
     lambda: ux.scale_by_adopt(clip_value=0.0)),
    (TypeError, r"scale_by_adopt(use_clipping=None): use_clipping must be True or False",
     lambda: ux.scale_by_adopt(use_clipping=None)),
    (ValueError, r"scale_by_ademamix(alpha=-1.0): alpha must be in [0, inf)", lambda: ux.scale_by_ademamix(alpha=-1.0)),
    (ValueError, r"scale_by_simplified_ademamix(b1=1.0): b1 must be in [0, 1)",
     lambda: ux.scale_by_simplified_ademamix(b1=1.0)),
    (ValueError, r"scale_by_factored_rms(step_offset=-1): step_offset must be a non-negative integer",
     lambda: ux.scale_by_factored_rms(step_offset=-1)),
    (ValueError, r"scale_by_factored_rms(min_dim_size_to_factor=0): min_dim_size_to_factor must be a positive integer",
     lambda: ux.scale_by_factored_rms(min_dim_size_to_factor=0)),
    (ValueError, r"clip_by_block_rms(threshold=0.0): threshold must be in (0, inf)", lambda: ux.clip_by_block_rms(0.0)),
    (ValueError, r"scale_by_sm3(b2=1.5): b2 must be in [0, 1]", lambda: ux.scale_by_sm3(b2=1.5)),
]


@pytest.mark.parametrize("exc, text, build", REFUSED, ids=[text.split(":")[0] for _, text, _ in REFUSED])
def test_the_constructor_refuses_by_the_declaration(exc, text, build):
    with pytest.raises(exc) as info:
        build()
    assert str(info.value).startswith(text), str(info.value)


def test_values_at_the_edges_of_the_domains_are_taken_and_print_as_before():
    assert repr(ux.scale_by_rms()) == "scale_by_rms(decay=0.9, eps=1e-08, initial_scale=0.0)"
    assert repr(ux.scale_by_rms(eps_in_sqrt=True, bias_correction=False)) == repr(ux.scale_by_rms())
    assert repr(ux.scale_by_adopt()) == ("scale_by_adopt(b1=0.9, b2=0.9999, eps=1e-06, nesterov=False, "
                                         "use_clipping=True)")
    assert repr(ux.scale_by_adopt(clip_value=2)) == ("scale_by_adopt(b1=0.9, b2=0.9999, eps=1e-06, clip_value=2.0, "
                                                     "nesterov=False, use_clipping=True)")
    assert repr(ux.scale_by_sm3(b2=1.0)) == "scale_by_sm3(b1=0.9, b2=1.0, eps=1e-08)"
    assert repr(ux.scale_by_rprop(0.1, min_step_size=0.5, max_step_size=0.5)).endswith("max_step_size=0.5)")
    assert repr(ux.trace(decay=1.0)) == "trace(decay=1.0, nesterov=False)"
    assert repr(ux.adaptive_grad_clip(0.1, axis=-1)) == "adaptive_grad_clip(clipping=0.1, eps=0.001, axis=(-1,))"


# --- the declaration on the other paths: tree maps, held hyperparameters, checked, state fields ---------------------


def test_a_tree_map_out_of_the_domain_is_refused_when_the_object_is_used():
    opt = jax.tree.map(lambda x: x * 10, ux.scale_by_lion())  # b1 = 9.0
    with pytest.raises(ValueError, match=r"^scale_by_lion\(b1=9\.0\): b1 must be in \[0, 1\) \(an update object "
                                         r"rebuilt by a tree map\)$"):
        opt.init(PARAMS)
    # Rprop's relation, after a tree map that raises the lower bound only
    rprop = jax.tree_util.tree_map_with_path(
        lambda path, x: 100.0 if jax.tree_util.keystr(path).endswith("min_step_size") else x, ux.scale_by_rprop(0.1))
    with pytest.raises(ValueError, match=r"^scale_by_rprop\(min_step_size=100\.0, max_step_size=50\.0\): "
                                         r"min_step_size must be <= max_step_size \(an update object rebuilt"):
        rprop.init(PARAMS)


def test_held_hyperparameters_are_refused_by_their_domains_and_relations():
    opt = ux.hyperparams_in_state(ux.scale_by_rprop(0.1))
    state = opt.init(PARAMS)
    with pytest.raises(ValueError, match=r"^scale_by_rprop\(min_step_size=100\.0, max_step_size=.*50.*\): "
                                         r"min_step_size must be <= max_step_size \(written by "
                                         r"replace_state\('scale_by_rprop\.min_step_size'\)\)$"):
        opt.replace_state(state, "scale_by_rprop.min_step_size", 100.0)
    with pytest.raises(ValueError, match=r"^scale_by_rprop\(eta_plus=0\.5\): eta_plus must be in \[1, inf\)"):
        opt.replace_state(state, "scale_by_rprop.eta_plus", 0.5)
    # a value inside is taken, and the step is the one of the object built with it
    written = opt.replace_state(state, "scale_by_rprop.min_step_size", 0.25)
    u, _ = opt.update(GRADS, written)
    ref, _ = ux.scale_by_rprop(0.1, min_step_size=0.25).update(GRADS, ux.scale_by_rprop(0.1).init(PARAMS))
    np.testing.assert_array_equal(u["w"], ref["w"])
    # accumulate_gradients' steps, held: the same domain as the constructor's
    acc = ux.hyperparams_in_state(ux.scale(-1.0).accumulate_gradients(2))
    with pytest.raises(ValueError, match=r"^accumulate_gradients\(steps=0\): steps must be a positive integer "
                                         r"\(written by replace_state"):
        acc.replace_state(acc.init(PARAMS), "accumulate_gradients.steps", 0)


def test_checked_refuses_a_traced_hyperparameter_out_of_its_domain():
    opt = ux.checked(ux.hyperparams_in_state(ux.scale_by_lion()))
    state = opt.init(PARAMS)
    step = checkify.checkify(jax.jit(opt.update))
    err, _ = step(GRADS, state)
    err.throw()
    bad = jax.tree.map(lambda x: x, state)
    bad[0].hyperparams["b2"] = jnp.float32(1.0)
    err, _ = step(GRADS, bad)
    with pytest.raises(checkify.JaxRuntimeError, match=r"scale_by_lion\(b2=1\.0\): b2 must be in \[0, 1\) \(held in "
                                                       r"the state\)"):
        err.throw()


FIELDS = [  # (pipeline, state path, a value the field's annotation refuses, what it must be)
    (ux.scale_by_rms(bias_correction=True), "scale_by_rms.count", -1, "must be a non-negative integer"),
    (ux.scale_by_rms(), "scale_by_rms.nu", {"w": -jnp.ones(3)}, r"must be in \[0, inf\)"),
    (ux.scale_by_stddev(bias_correction=True), "scale_by_stddev.nu", {"w": -jnp.ones(3)}, r"must be in \[0, inf\)"),
    (ux.scale_by_rss(), "scale_by_rss.sum_of_squares", {"w": -jnp.ones(3)}, r"must be in \[0, inf\)"),
    (ux.scale_by_adadelta(), "scale_by_adadelta.avg_sq_step", {"w": -jnp.ones(3)}, r"must be in \[0, inf\)"),
    (ux.scale_by_rprop(0.1), "scale_by_rprop.step_sizes", {"w": -jnp.ones(3)}, r"must be in \[0, inf\)"),
    (ux.scale(-1.0).accumulate_gradients(2), "accumulate_gradients.mini_step", -1, "must be a non-negative integer"),
    (ux.scale(-1.0).accumulate_gradients(2), "accumulate_gradients.gradient_step", -3, "must be a non-negative"),
    (ux.scale(-1.0).accumulate_gradients(2), "accumulate_gradients.updated", 5, "must be True or False"),
    (ux.add_noise(), "add_noise.count", -1, "must be a non-negative integer"),
    (ux.scale_by_adopt(), "scale_by_adopt.nu", {"w": -jnp.ones(3)}, r"must be in \[0, inf\)"),
    (ux.scale_by_ademamix(), "scale_by_ademamix.count", -1, "must be a non-negative integer"),
    (ux.scale_by_simplified_ademamix(), "scale_by_simplified_ademamix.nu", {"w": -jnp.ones(3)}, r"must be in \[0, "),
    (ux.scale_by_factored_rms(), "scale_by_factored_rms.v", {"w": -jnp.ones(3)}, r"must be in \[0, inf\)"),
    (ux.scale_by_factored_rms(), "scale_by_factored_rms.count", -2, "must be a non-negative integer"),
    (ux.scale_by_sm3(), "scale_by_sm3.accumulators", {"w": (-jnp.ones(3),)}, r"must be in \[0, inf\)"),
]


@pytest.mark.parametrize("opt, path, bad, what", FIELDS, ids=[f[1] for f in FIELDS])
def test_replace_state_refuses_what_a_state_field_declares_it_cannot_hold(opt, path, bad, what):
    state = opt.init(PARAMS)
    with pytest.raises(ValueError, match=rf"^replace_state\({path}.*\): {path}.* {what}"):
        opt.replace_state(state, path, bad)
    # the field's own values check again to themselves
    again = opt.replace_state(state, path, opt.get_state(state, path))
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), again, state))


# --- ADOPT and simplified AdEMAMix have states of their own -------------------------------------------------------


@pytest.mark.parametrize("stage, fed", [
    (ux.scale_by_adam, ux.scale_by_adopt), (ux.scale_by_adopt, ux.scale_by_adam),
    (ux.scale_by_adam, ux.scale_by_simplified_ademamix), (ux.scale_by_simplified_ademamix, ux.scale_by_adopt)])
def test_a_state_of_other_numbers_is_refused_by_its_type(stage, fed):
    state = fed().init(PARAMS)
    with pytest.raises(ValueError, match=rf"state\[0\] init\(\) gives {type(stage().init(PARAMS)[0]).__name__}\(mu, "
                                         rf"nu, count\), the state has {type(state[0]).__name__}\(mu, nu, count\)"):
        stage().update(GRADS, state)


def test_adopt_and_simplified_ademamix_states_hold_their_own_moments():
    g1, g2 = np.array([2.0, -4.0, 0.5]), np.array([1.0, -8.0, 0.25])
    adopt = ux.scale_by_adopt(b1=0.5, b2=0.75)
    state = adopt.init(PARAMS)
    for g in (g1, g2):
        _, state = adopt.update({"w": jnp.asarray(g, jnp.float32)}, state)
    assert type(state[0]).__name__ == "ScaleByAdoptState"
    # ADOPT's v: g1² on the first call, then an EMA (Adam's would be 0.25·g1² then bias-corrected)
    np.testing.assert_allclose(adopt.get_state(state, "scale_by_adopt.nu")["w"], 0.75 * g1**2 + 0.25 * g2**2,
                               rtol=1e-6)
    simplified = ux.scale_by_simplified_ademamix(b1=0.5)
    state = simplified.init(PARAMS)
    for g in (g1, g2):
        _, state = simplified.update({"w": jnp.asarray(g, jnp.float32)}, state)
    assert type(state[0]).__name__ == "ScaleBySimplifiedAdemamixState"
    np.testing.assert_allclose(simplified.get_state(state, "scale_by_simplified_ademamix.mu")["w"], 0.5 * g1 + g2,
                               rtol=1e-6)


# --- accumulate_gradients: what the steps function returns --------------------------------------------------------


def _accumulate(steps):
    return ux.scale(-1.0).accumulate_gradients(steps)


@pytest.mark.parametrize("returns, shown", [(0, "0"), (-1, "-1"), (1.5, "1.5"), (float("nan"), "nan"),
                                            (jnp.int32(0), "0"), (np.float32(2.5), "2.5")])
def test_a_steps_function_returning_no_positive_integer_is_refused_by_name(returns, shown):
    opt = _accumulate(lambda gradient_step: returns)
    with pytest.raises(ValueError, match=rf"^accumulate_gradients\(steps\(\.\.\.\)={shown}\): steps\(\.\.\.\) must be "
                                         r"a positive integer \(the value it returned at count 0\)$"):
        opt.update(GRADS, opt.init(PARAMS))
    # a constant is concrete under jax.jit too
    with pytest.raises(ValueError, match=r"steps\(\.\.\.\) must be a positive integer \(the value it returned\)\n"):
        jax.jit(opt.update)(GRADS, opt.init(PARAMS))


def test_a_steps_function_returning_an_array_or_a_traced_float_is_refused_while_tracing():
    opt = _accumulate(lambda gradient_step: jnp.array([2, 2]))
    for update in (opt.update, jax.jit(opt.update)):
        with pytest.raises(TypeError, match=r"^accumulate_gradients\(steps\(\.\.\.\)=.*\): steps\(\.\.\.\) must be a "
                                            r"positive integer, not an array of shape \(2,\) \(the value it "
                                            r"returned\)(\n|$)"):
            update(GRADS, opt.init(PARAMS))
    for returns in (True, 1j, "2"):
        opt = _accumulate(lambda gradient_step, returns=returns: returns)
        with pytest.raises(TypeError, match=r"^accumulate_gradients\(steps\(\.\.\.\)=.*\): steps\(\.\.\.\) must be a "
                                            r"positive integer"):
            opt.update(GRADS, opt.init(PARAMS))
    # a float computed from the traced step: not known to be whole while tracing
    opt = _accumulate(lambda gradient_step: gradient_step / 1 + 2)
    with pytest.raises(TypeError, match=r"^accumulate_gradients\(steps\(\.\.\.\)=<traced float32\[\]>\): "
                                        r"steps\(\.\.\.\) must be a positive integer: return an integer dtype under "
                                        r"jax\.jit"):
        jax.jit(opt.update)(GRADS, opt.init(PARAMS))


def test_a_traced_steps_value_out_of_the_domain_is_refused_under_checked():
    opt = ux.checked(_accumulate(lambda gradient_step: gradient_step * 0))  # int32 0, traced
    step = checkify.checkify(jax.jit(opt.update))
    err, _ = step(GRADS, opt.init(PARAMS))
    with pytest.raises(checkify.JaxRuntimeError, match=r"accumulate_gradients\(steps\(\.\.\.\)=0\): "
                                                       r"steps\(\.\.\.\) must be a positive integer \(the value "
                                                       r"it returned\)"):
        err.throw()


@pytest.mark.parametrize("returns", [2, 2.0, jnp.int32(2), np.int64(2), jnp.float32(2.0)])
def test_a_steps_function_returning_a_positive_integer_steps_on_the_mean(returns):
    opt = _accumulate(lambda gradient_step: returns)
    g1, g2 = np.array([1.0, 2.0, 3.0]), np.array([3.0, -2.0, 0.5])
    for update in (opt.update, jax.jit(opt.update)):
        state = opt.init(PARAMS)
        u1, state = update({"w": jnp.asarray(g1, jnp.float32)}, state)
        u2, state = update({"w": jnp.asarray(g2, jnp.float32)}, state)
        np.testing.assert_array_equal(u1["w"], np.zeros(3))
        np.testing.assert_allclose(u2["w"], -(g1 + g2) / 2, rtol=1e-7)
        assert bool(ux.has_updated(state))


def test_a_traced_integer_steps_value_varies_the_accumulation_under_jit():
    opt = _accumulate(lambda gradient_step: 1 + gradient_step % 2)  # 1 call, then 2, then 1, ...
    step = jax.jit(opt.update)
    state = opt.init(PARAMS)
    stepped = []
    for _ in range(6):
        _, state = step(GRADS, state)
        stepped.append(bool(ux.has_updated(state)))
    assert stepped == [True, False, True, True, False, True]


# --- add_noise: a leaf's noise is that of its position in the whole tree ------------------------------------------


def _noise(opt, tree, steps=2):
    state = opt.init(tree)
    draws = []
    for _ in range(steps):
        u, state = opt.update(tree, state)
        draws.append(u)
    return draws


def test_two_partition_groups_with_one_key_draw_the_whole_tree_s_noise():
    zeros = {"x": jnp.zeros(4), "y": jnp.zeros(4)}
    groups = ux.partition({"a": ux.add_noise(key=0), "b": ux.add_noise(key=0)}, {"x": "a", "y": "b"})
    whole = ux.add_noise(key=0)
    split, together = _noise(groups, zeros), _noise(whole, zeros)
    for s, t in zip(split, together):  # (before: s["x"] == s["y"], each group numbering its leaves from 0)
        assert not np.array_equal(s["x"], s["y"])
        np.testing.assert_array_equal(s["x"], t["x"])
        np.testing.assert_array_equal(s["y"], t["y"])
    # the same under jax.jit, and through masked
    state, ref_state = groups.init(zeros), whole.init(zeros)
    u, _ = jax.jit(groups.update)(zeros, state)
    ref, _ = jax.jit(whole.update)(zeros, ref_state)
    np.testing.assert_array_equal(u["x"], ref["x"])
    np.testing.assert_array_equal(u["y"], ref["y"])
    masked = ux.add_noise(key=0).masked({"x": False, "y": True})
    (m,) = _noise(masked, zeros, steps=1)
    np.testing.assert_array_equal(m["x"], np.zeros(4))
    np.testing.assert_array_equal(m["y"], together[0]["y"])


def test_the_noise_of_a_tree_without_none_leaves_is_unchanged():
    """Each leaf's key is the (i+1)-th of ``split(key, n + 1)``, i its position: the numbers before the fix."""
    tree = {"a": jnp.zeros(3), "b": [jnp.zeros((2, 2)), jnp.zeros(1)]}
    (u,) = _noise(ux.add_noise(eta=0.5, gamma=0.0, key=5), tree, steps=1)
    keys = jax.random.split(jax.random.key(5), 4)
    std = np.float32(np.sqrt(0.5))  # sqrt(eta / t^gamma) at t = 1, in float32 as the draws
    for got, key, x in zip(jax.tree.leaves(u), keys[1:], jax.tree.leaves(tree)):
        np.testing.assert_array_equal(got, std * np.asarray(jax.random.normal(key, x.shape, jnp.float32)))


# --- global_norm: leaves that are not numbers are named ---------------------------------------------------------


@pytest.mark.parametrize("tree, text", [
    ({"a": "x"}, "global_norm: tree['a'] is 'x', not an array or a number"),
    ("x", "global_norm: tree is 'x', not an array or a number"),
    ([jnp.ones(2), True], "global_norm: tree[1] is True, not an array or a number"),
    ({"a": {"b": object}}, "global_norm: tree['a']['b'] is <class 'object'>, not an array or a number"),
    ({"m": jnp.array([True, False])}, "global_norm: tree['m'] is an array of bool, not of numbers"),
    ({"k": jax.random.key(0)}, "global_norm: tree['k'] is an array of key<fry>, not of numbers"),
])
def test_global_norm_names_a_leaf_that_is_not_a_number(tree, text):
    with pytest.raises(TypeError) as info:
        ux.global_norm(tree)
    assert str(info.value) == text


def test_global_norm_takes_numbers_arrays_and_none_leaves():
    assert float(ux.global_norm({"a": 3.0, "b": None, "c": [4]})) == 5.0
    np.testing.assert_allclose(ux.global_norm({"a": jnp.array([1.0, 2.0]), "b": np.array([2.0]), "c": 3 + 4j}),
                               np.sqrt(1 + 4 + 4 + 25), rtol=1e-7)
    assert float(jax.jit(ux.global_norm)({"a": jnp.array([3.0]), "b": None, "c": jnp.array([[4.0]])})) == 5.0


# --- a PRNG key option through the paths that read its values ------------------------------------------------------


def test_an_add_noise_with_a_typed_key_goes_through_a_tree_map_and_hyperparams_in_state():
    zeros = {"w": jnp.zeros(3)}
    opt = ux.add_noise(key=jax.random.key(7))
    (want,) = _noise(opt, zeros, steps=1)
    for other in (jax.tree.map(lambda x: x, opt), ux.hyperparams_in_state(opt)):
        (got,) = _noise(other, zeros, steps=1)
        np.testing.assert_array_equal(got["w"], want["w"])
