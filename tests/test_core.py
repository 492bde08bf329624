"""The object model: pipe forms, value semantics, pytree behaviour, state by name, errors."""

from __future__ import annotations

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import toolz

import updax as ux


def test_the_issue_example_prints_the_pipeline():
    opt = ux.scale_by_adam().clip_by_global_norm(max_norm=1.0).scale(-1e-3)
    assert repr(opt) == (
        "scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=1e-15) |> "
        "clip_by_global_norm(max_norm=1.0) |> scale(step_size=-0.001)"
    )
    assert str(opt) == repr(opt)


# --- the four pipe forms ------------------------------------------------------


def test_four_pipe_forms_and_thread_first_are_equal():
    parent = ux.scale_by_adam(b1=0.8)
    forms = [
        ux.compose(parent, ux.trace(decay=0.5)),
        ux.trace(parent, decay=0.5),
        parent.trace(decay=0.5),
        parent.pipe(ux.trace, decay=0.5),
        toolz.thread_first(parent, (ux.trace, 0.5)),
    ]
    assert all(form == forms[0] for form in forms)
    assert len({hash(form) for form in forms}) == 1


def test_thread_first_from_identity_matches_the_fluent_chain():
    threaded = toolz.thread_first(ux.identity(), ux.scale_by_adam, (ux.scale, -1e-3))
    assert threaded == ux.scale_by_adam().scale(-1e-3)
    assert ux.scale_by_adam(ux.identity()) == ux.scale_by_adam()


def test_positional_options_follow_axon():
    assert ux.scale(0.1) == ux.scale(step_size=0.1)
    assert ux.scale(ux.clip(), 0.1) == ux.clip().scale(0.1)
    assert ux.trace(0.5, True) == ux.trace(decay=0.5, nesterov=True)


def test_wrapper_pipe_forms_are_equal_and_print_unambiguously():
    inner = ux.scale_by_adam().scale(-0.1)
    forms = [inner.accumulate_gradients(4), ux.accumulate_gradients(inner, 4), inner.pipe(ux.accumulate_gradients, 4),
             toolz.thread_first(inner, (ux.accumulate_gradients, 4))]
    assert all(f == forms[0] for f in forms)
    assert len(forms[0].stages) == 1
    assert repr(forms[0]).endswith("scale(step_size=-0.1) |> accumulate_gradients(steps=4, mean=True)")
    # Composed after another stage, the wrapper wraps only its own pipeline; the repr says so.
    composed = ux.compose(ux.clip(1.0), forms[0])
    assert repr(composed) == (
        "clip(delta=1.0) |> accumulate_gradients(scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=1e-15)"
        " |> scale(step_size=-0.1), steps=4, mean=True)"
    )


def test_ints_become_floats_so_the_leaf_dtype_is_stable():
    assert repr(ux.scale(-1)) == "scale(step_size=-1.0)"
    assert jax.tree.leaves(ux.scale(-1)) == [-1.0]


# --- the primitives -------------------------------------------------------------


def _double(updates, params):
    return jax.tree.map(lambda g: 2 * g, updates)


def test_stateless_with_a_parent_and_as_a_method():
    assert ux.stateless(ux.clip(), _double) == ux.clip().stateless(_double)
    assert repr(ux.clip().stateless(_double)) == "clip(delta=2.0) |> stateless(test_core._double)"
    out, state = ux.clip(1.0).stateless(_double).update({"w": jnp.array([3.0, 0.25])}, ((), ()))
    np.testing.assert_array_equal(out["w"], [2.0, 0.5])


def test_identity_and_compose():
    g = {"w": jnp.array([1.0, 2.0])}
    assert ux.identity().update(g, ux.identity().init(g))[0] is g
    assert ux.compose() == ux.identity()
    assert ux.compose(ux.identity(), ux.clip(), ux.identity()) == ux.clip()
    with pytest.raises(TypeError, match="compose: argument 1 is int"):
        ux.compose(ux.clip(), 3)


def test_apply_updates_keeps_each_params_dtype():
    params = {"a": jnp.ones(3, jnp.bfloat16), "b": [jnp.ones(2, jnp.float32)], "c": None}
    updates = {"a": jnp.full(3, 1e-3, jnp.float32), "b": [jnp.full(2, 0.5, jnp.float32)], "c": None}
    new = ux.apply_updates(params, updates)
    assert new["a"].dtype == jnp.bfloat16 and new["b"][0].dtype == jnp.float32 and new["c"] is None
    np.testing.assert_allclose(new["b"][0], 1.5)
    # The sum is done in the wider dtype: bf16(1 + 1e-3) rounds to 1.0, as it should.
    np.testing.assert_array_equal(np.asarray(new["a"], np.float32), np.asarray(jnp.bfloat16(1.001), np.float32))
    with pytest.raises(ValueError, match=r"apply_updates: updates does not match params: .*\['b'\]\[1\]"):
        ux.apply_updates(params, {"a": updates["a"], "b": [updates["b"][0], jnp.ones(1)], "c": None})


def test_user_combinators_register_as_methods():
    @ux.combinator
    def doubled():
        return ux.stateless(_double, name="doubled")

    assert ux.scale(3.0).doubled() == doubled(ux.scale(3.0)) == ux.scale(3.0).pipe(doubled)
    assert repr(ux.scale(3.0).doubled()) == "scale(step_size=3.0) |> doubled()"
    with pytest.raises(ValueError, match="would hide Update.update"):
        ux.combinator(lambda: ux.identity(), name="update")


def test_extra_keywords_reach_only_the_stages_that_name_them():
    seen = []

    def apply(updates, params, *, loss):
        seen.append(loss)
        return updates

    opt = ux.scale(2.0).stateless(apply)
    out, _ = opt.update({"w": jnp.ones(1)}, opt.init(None), loss=jnp.asarray(3.0))
    assert seen == [3.0] and float(out["w"][0]) == 2.0


# --- value semantics and pytree behaviour -------------------------------------


def test_equality_hash_and_pickle_see_the_numbers():
    assert ux.scale_by_adam(b1=0.8) != ux.scale_by_adam(b1=0.9)
    assert ux.trace(nesterov=True) != ux.trace(nesterov=False)
    opt = ux.add_noise(key=jax.random.key(7)).scale(-0.1)
    assert opt == ux.add_noise(key=jax.random.key(7)).scale(-0.1)
    assert hash(opt) == hash(ux.add_noise(key=jax.random.key(7)).scale(-0.1))
    assert opt != ux.add_noise(key=jax.random.key(8)).scale(-0.1)
    restored = pickle.loads(pickle.dumps(ux.clip_by_global_norm(2.0).scale_by_adam().accumulate_gradients(3)))
    assert restored == ux.clip_by_global_norm(2.0).scale_by_adam().accumulate_gradients(3)


def test_numeric_hyperparameters_are_the_leaves():
    opt = ux.scale_by_adam(b1=0.8).trace(decay=0.5, nesterov=True).scale(-0.1)
    assert jax.tree.leaves(opt) == [0.8, 0.999, 1e-8, 1e-15, 0.5, -0.1]
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(opt)[0]]
    assert paths[0] == "[0].b1" and paths[-1] == "[2].step_size"
    nested = ux.trace(0.5).accumulate_gradients(2)
    assert jax.tree.leaves(nested) == [0.5, 2]


def test_changing_the_learning_rate_does_not_retrace_and_takes_effect():
    traces = []

    @jax.jit
    def step(opt, grads, state):
        traces.append(1)
        return opt.update(grads, state)

    grads = {"w": jnp.array([1.0, -2.0])}
    outs = []
    for lr in [0.1, 0.01, 0.5]:
        opt = ux.scale_by_adam().scale(-lr)
        outs.append(step(opt, grads, opt.init(grads))[0]["w"])
    assert len(traces) == 1
    np.testing.assert_allclose(outs[1], outs[0] / 10, rtol=1e-6)
    np.testing.assert_allclose(outs[2], outs[0] * 5, rtol=1e-6)
    # Structure is static: a different flag retraces.
    step(ux.trace(nesterov=True), grads, ux.trace(nesterov=True).init(grads))
    step(ux.trace(nesterov=False), grads, ux.trace(nesterov=False).init(grads))
    assert len(traces) == 3


def test_hyperparameters_can_be_jax_values():
    lr = jnp.asarray(0.25)
    opt = ux.scale(lr)
    np.testing.assert_allclose(opt.update({"w": jnp.ones(2)}, opt.init(None))[0]["w"], 0.25)
    assert repr(opt) == "scale(step_size=array(0.25, dtype=float32))"  # not the Python float 0.25
    # built inside jit, from a traced value
    out = jax.jit(lambda s, g: ux.scale(s).update(g, ((),))[0])(jnp.asarray(3.0), {"w": jnp.ones(1)})
    np.testing.assert_allclose(out["w"], 3.0)


def test_drops_into_optax_chain_and_flax_style_code():
    opt = ux.scale_by_adam(b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0)
    chained = optax.chain(opt, optax.scale(-0.1))
    reference = optax.chain(optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0), optax.scale(-0.1))
    params = {"w": jnp.array([1.0, 2.0])}
    s1, s2 = chained.init(params), reference.init(params)
    for t in range(3):
        g = {"w": jnp.array([0.5, -1.0]) * (t + 1)}
        u1, s1 = chained.update(g, s1, params)
        u2, s2 = reference.update(g, s2, params)
        np.testing.assert_allclose(u1["w"], u2["w"], rtol=1e-6)


# --- state by name --------------------------------------------------------------


def test_get_and_replace_state_by_name():
    opt = ux.scale_by_adam().trace(decay=0.5).scale_by_state(-0.1)
    params = {"w": jnp.zeros(2)}
    state = opt.init(params)
    _, state = opt.update({"w": jnp.ones(2)}, state)
    assert int(opt.get_state(state, "scale_by_adam.count")) == 1
    assert opt.get_state(state, "trace") is state[1]
    new = opt.replace_state(state, "scale_by_state.step_size", -0.01)
    assert new[2].step_size.dtype == jnp.float32 and float(new[2].step_size) == pytest.approx(-0.01)
    assert new[0] is state[0] and new[1] is state[1]
    out, _ = opt.update({"w": jnp.ones(2)}, new)
    ref, _ = opt.update({"w": jnp.ones(2)}, state)
    np.testing.assert_allclose(out["w"], ref["w"] / 10, rtol=1e-6)


def test_replacing_state_does_not_recompile():
    traces = []

    @jax.jit
    def step(opt, grads, state):
        traces.append(1)
        return opt.update(grads, state)

    opt = ux.scale_by_state(-0.1)
    state = opt.init({"w": jnp.zeros(1)})
    for lr in [-0.1, -0.05, -1]:
        state = opt.replace_state(state, "scale_by_state.step_size", lr)
        out, state = step(opt, {"w": jnp.ones(1)}, state)
        assert float(out["w"][0]) == pytest.approx(lr)
    assert len(traces) == 1


def test_two_stages_of_one_kind_are_addressed_unambiguously():
    opt = ux.trace(decay=0.5).scale(2.0).trace(decay=0.25)
    state = opt.init({"w": jnp.zeros(1)})
    _, state = opt.update({"w": jnp.ones(1)}, state)
    with pytest.raises(KeyError, match=r"2 stages are named 'trace'; pick one with 'trace\[0\]', 'trace\[1\]'"):
        opt.get_state(state, "trace")
    assert float(opt.get_state(state, "trace[0].trace")["w"][0]) == 1.0
    assert float(opt.get_state(state, "trace[1].trace")["w"][0]) == 2.0
    state = opt.replace_state(state, "trace[1].trace", {"w": jnp.array([7.0])})
    assert float(state[2].trace["w"][0]) == 7.0 and float(state[0].trace["w"][0]) == 1.0
    with pytest.raises(KeyError, match="only 2 stages named 'trace'"):
        opt.get_state(state, "trace[2]")


def test_state_paths_reach_into_wrapped_pipelines():
    opt = ux.scale_by_adam().scale(-0.1).accumulate_gradients(2)
    state = opt.init({"w": jnp.zeros(1)})
    for _ in range(4):
        _, state = opt.update({"w": jnp.ones(1)}, state)
    assert int(opt.get_state(state, "accumulate_gradients.mini_step")) == 0
    assert int(opt.get_state(state, "accumulate_gradients/scale_by_adam.count")) == 2
    state = opt.replace_state(state, "accumulate_gradients/scale_by_adam.count", 10)
    assert int(state[0].inner[0].count) == 10 and state[0].inner[0].count.dtype == jnp.int32


def test_state_path_errors_are_clear():
    opt = ux.scale_by_adam().scale(-0.1)
    state = opt.init({"w": jnp.zeros(1)})
    with pytest.raises(KeyError, match=r"no stage named 'trace' .*stages: \['scale_by_adam', 'scale'\]"):
        opt.get_state(state, "trace")
    with pytest.raises(KeyError, match=r"has no field 'sigma' \(fields: \['mu', 'nu', 'count'\]; options: \['b1', 'b2', 'eps', 'eps_root', 'nesterov', 'mu_dtype', 'nu_dtype'\]\)"):
        opt.get_state(state, "scale_by_adam.sigma")
    with pytest.raises(KeyError, match="scale_by_adam runs no pipeline inside it"):
        opt.get_state(state, "scale_by_adam/scale")
    with pytest.raises(ValueError, match=r"has shape \(3,\), the state \(\); the new value must have the current shape"):
        opt.replace_state(state, "scale_by_adam.count", jnp.zeros(3))
    with pytest.raises(ValueError, match=r"does not match"):
        opt.replace_state(state, "scale_by_adam.mu", {"v": jnp.zeros(1)})


def test_count_saturates_instead_of_overflowing():
    opt = ux.scale_by_adam()
    state = opt.init({"w": jnp.zeros(1)})
    state = opt.replace_state(state, "scale_by_adam.count", np.iinfo(np.int32).max - 1)
    for _ in range(3):
        _, state = opt.update({"w": jnp.ones(1)}, state)
    assert int(opt.get_state(state, "scale_by_adam.count")) == np.iinfo(np.int32).max


# --- bad input ------------------------------------------------------------------

BAD_OPTIONS = [
    (lambda: ux.scale_by_adam(b1=1.5), ValueError, r"scale_by_adam(b1=1.5): b1 must be in [0, 1)"),
    (lambda: ux.scale_by_adam(b2=-0.1), ValueError, r"scale_by_adam(b2=-0.1): b2 must be in [0, 1)"),
    (lambda: ux.scale_by_adam(eps=-1.0), ValueError, r"scale_by_adam(eps=-1.0): eps must be in [0, inf)"),
    (lambda: ux.scale_by_adam(mu_dtype=jnp.int32), TypeError, "mu_dtype must be None or a floating or complex dtype"),
    (lambda: ux.scale_by_belief(b1=1.0), ValueError, r"scale_by_belief(b1=1.0): b1 must be in [0, 1)"),
    (lambda: ux.scale_by_radam(threshold="high"), TypeError, "scale_by_radam(threshold='high'): threshold must be a real"),
    (lambda: ux.scale_by_rms(decay=float("nan")), ValueError, "scale_by_rms(decay=nan): decay must be in [0, 1)"),
    (lambda: ux.scale_by_rms(eps_in_sqrt=0), TypeError, "scale_by_rms(eps_in_sqrt=0): eps_in_sqrt must be True or False"),
    (lambda: ux.scale_by_rms(bias_correction="yes"), TypeError,
     "scale_by_rms(bias_correction='yes'): bias_correction must be True or False"),
    (lambda: ux.scale_by_rss(initial_accumulator_value=-1), ValueError, "initial_accumulator_value must be in [0, inf)"),
    (lambda: ux.scale_by_stddev(initial_scale=-0.5), ValueError, "scale_by_stddev(initial_scale=-0.5)"),
    (lambda: ux.scale_by_stddev(bias_correction=1), TypeError,
     "scale_by_stddev(bias_correction=1): bias_correction must be True or False"),
    (lambda: ux.optimizers.rmsprop(eps_in_sqrt="no"), TypeError, "scale_by_rms(eps_in_sqrt='no'): eps_in_sqrt must be True or False"),
    (lambda: ux.scale_by_schedule(0.1), TypeError, "scale_by_schedule(schedule_fn=0.1): schedule_fn must be callable"),
    (lambda: ux.scale_by_state(None), TypeError, "scale_by_state(step_size=None): step_size must be a real number"),
    (lambda: ux.scale_by_trust_ratio(min_norm=-1.0), ValueError, "scale_by_trust_ratio(min_norm=-1.0)"),
    (lambda: ux.scale_by_yogi(b2=1.0), ValueError, "scale_by_yogi(b2=1.0): b2 must be in [0, 1)"),
    (lambda: ux.trace(decay=1.5), ValueError, "trace(decay=1.5): decay must be in [0, 1]"),
    (lambda: ux.trace(nesterov=1), TypeError, "trace(nesterov=1): nesterov must be True or False"),
    (lambda: ux.clip(delta=-1.0), ValueError, "clip(delta=-1.0): delta must be in [0, inf)"),
    (lambda: ux.clip_by_global_norm(max_norm=0.0), ValueError, "clip_by_global_norm(max_norm=0.0): max_norm must be in (0, inf)"),
    (lambda: ux.add_decayed_weights(decay="x"), TypeError, "add_decayed_weights(decay='x')"),
    (lambda: ux.add_noise(eta=-0.1), ValueError, "add_noise(eta=-0.1): eta must be in [0, inf)"),
    (lambda: ux.add_noise(key=1.5), TypeError, "add_noise(key=1.5): key must be an int seed in [0, 2**32), a PRNG key"),
    (lambda: ux.accumulate_gradients(steps=0), ValueError, "accumulate_gradients(steps=0): steps must be a positive integer"),
    (lambda: ux.accumulate_gradients(steps=2.0), TypeError, "steps must be a positive integer"),
    (lambda: ux.scale(jnp.ones(3)), TypeError, "step_size must be a real scalar"),
    (lambda: ux.stateless(3), TypeError, r"stateless(apply_fn=3): apply_fn must be callable"),
]


@pytest.mark.parametrize("build, error, message", BAD_OPTIONS, ids=[m[:40] for _, _, m in BAD_OPTIONS])
def test_bad_options_fail_at_build_time_naming_call_option_and_value(build, error, message):
    with pytest.raises(error) as info:
        build()
    assert message in str(info.value)


def test_unknown_options_are_a_type_error_at_build_time():
    with pytest.raises(TypeError, match="scale_by_adam.*unexpected keyword argument 'b3'"):
        ux.scale_by_adam(b3=0.5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'learning_rate'"):
        ux.scale_by_adam().scale(learning_rate=0.1)


def test_wrong_state_is_a_clear_error():
    opt = ux.scale_by_adam().scale(-0.1)
    with pytest.raises(ValueError, match=r"state must be the tuple of 2 stage states that init\(\) returns, got a tuple of length 1"):
        opt.update({"w": jnp.ones(1)}, (opt.init({"w": jnp.ones(1)})[0],))


def test_mismatched_trees_name_the_path_and_the_call():
    opt = ux.scale_by_adam()
    state = opt.init({"a": jnp.zeros(2), "b": [jnp.zeros(1), jnp.zeros(1)]})
    with pytest.raises(ValueError, match=r"scale_by_adam.*: the state does not fit these updates: at "
                                         r"state\[0\]\.mu\['b'\]\[1\] init\(\) gives nothing, the state has an array"):
        opt.update({"a": jnp.zeros(2), "b": [jnp.zeros(1)]}, state)


def test_the_state_check_reuses_the_shapes_init_gave_and_still_catches_a_wrong_state():
    # The step checks its state against init's shapes. After opt.init(params) it takes them from that call, so the
    # first trace of a jitted step does not trace init a second time; an object that never ran init works them out.
    inits = []

    def init_fn(params):
        inits.append(1)
        return {"m": jax.tree.map(jnp.zeros_like, params)}

    def apply_fn(updates, state, params):
        return updates, {"m": jax.tree.map(jnp.add, state["m"], updates)}

    def build():
        return ux.stateful(init_fn, apply_fn, name="counted").scale(-0.5)

    params = {"a": jnp.ones(3), "b": [jnp.ones((2, 2)), None]}
    grads = jax.tree.map(lambda p: 2 * p, params)
    opt = build()
    state = opt.init(params)
    step = jax.jit(opt.update)
    updates, state = step(grads, state, params)
    assert len(inits) == 1
    np.testing.assert_allclose(updates["b"][0], -np.ones((2, 2)))
    np.testing.assert_allclose(state[0]["m"]["a"], 2 * np.ones(3))
    # An equal object that never ran init: its first step traces init once (shapes only) for the check.
    other = build()
    other.update(grads, state, params)
    assert len(inits) == 2
    # Wrong states are caught either way, with the path named.
    bad = (state[0] | {"m": {"a": jnp.ones(4), "b": state[0]["m"]["b"]}}, state[1])
    for pipeline in (opt, other):
        with pytest.raises(ValueError, match=r"the state does not fit these params: at state\[0\]\['m'\]\['a'\] "
                                             r"init\(\) gives shape \(3,\), the state has shape \(4,\)"):
            pipeline.update(grads, bad, params)
    # Params of other shapes through the same object: init's shapes for those are worked out, not reused.
    small = {"a": jnp.ones(2), "b": [jnp.ones((2, 2)), None]}
    with pytest.raises(ValueError, match=r"at state\[0\]\['m'\]\['a'\] init\(\) gives shape \(2,\), the state has "
                                         r"shape \(3,\)"):
        opt.update(jax.tree.map(lambda p: 2 * p, small), state, small)
    # A state leaf that is not a JAX type (a user's tag) is carried through eagerly, unchecked, as before.
    tagged = ux.stateful(lambda p: {"tag": "x", "n": 0}, lambda u, s, p: (u, s), name="tagged")
    updates, new_state = tagged.update(grads, tagged.init(params), params)
    assert new_state == ({"tag": "x", "n": 0},)
    np.testing.assert_array_equal(updates["a"], grads["a"])


def _betas_kernel(updates, params, *, betas):
    return jax.tree.map(lambda g: g * betas[0] + betas[1], updates)


def test_user_options_that_are_trees_of_numbers_are_leaves():
    opt = ux.stateless(_betas_kernel, name="affine", options={"betas": (2.0, 0.5)})
    assert repr(opt) == "affine(betas=(2.0, 0.5))"
    assert jax.tree.leaves(opt) == [2.0, 0.5]
    assert opt == ux.stateless(_betas_kernel, name="affine", options={"betas": (2.0, 0.5)})
    assert hash(opt) == hash(ux.stateless(_betas_kernel, name="affine", options={"betas": (2.0, 0.5)}))
    traces = []

    @jax.jit
    def step(opt, g):
        traces.append(1)
        return opt.update(g, opt.init(None))[0]

    assert float(step(opt, {"w": jnp.ones(1)})["w"][0]) == 2.5
    other = ux.stateless(_betas_kernel, name="affine", options={"betas": (3.0, 0.0)})
    assert float(step(other, {"w": jnp.ones(1)})["w"][0]) == 3.0
    assert len(traces) == 1
    with pytest.raises(TypeError, match=r"affine\(betas=\[\{1\}\]\): an option must be a number"):
        ux.stateless(_betas_kernel, name="affine", options={"betas": [{1}]})


def _labelled(updates, params, *, labels):
    return jax.tree.map(lambda g, label: g * (2.0 if label == "double" else 1.0), updates, labels)


def test_static_pytree_options_are_frozen_and_given_back_as_trees():
    labels = {"a": "double", "b": ["keep", "double"]}
    opt = ux.stateless(_labelled, name="labelled", options={"labels": labels})
    assert repr(opt) == "labelled(labels={'a': 'double', 'b': ['keep', 'double']})"
    assert jax.tree.leaves(opt) == []
    assert opt == ux.stateless(_labelled, name="labelled", options={"labels": dict(labels)})
    assert hash(opt) == hash(pickle.loads(pickle.dumps(opt)))
    assert opt.stages[0].option("labels") == labels
    g = {"a": jnp.ones(1), "b": [jnp.ones(1), jnp.ones(1)]}
    out = jax.jit(lambda o, g: o.update(g, o.init(None))[0])(opt, g)
    assert [float(x[0]) for x in jax.tree.leaves(out)] == [2.0, 1.0, 2.0]


def test_a_user_combinator_cannot_take_over_a_catalogue_name():
    def scale(x):
        return ux.stateless(_double, name="myscale")

    with pytest.raises(ValueError, match=r"cannot register combinator 'scale' .*updax.updates._step_size.scale already"):
        ux.combinator(scale)
    assert repr(ux.clip().scale(3.0)) == "clip(delta=2.0) |> scale(step_size=3.0)"


def test_a_missing_key_is_named_as_missing():
    opt = ux.scale_by_adam()
    state = opt.init({"b": jnp.zeros(1), "w": jnp.zeros(1)})
    with pytest.raises(ValueError, match=r"at state\[0\]\.mu\['b'\] init\(\) gives nothing, the state has an array"):
        opt.update({"w": jnp.zeros(1)}, state)


# --- one printed pipeline, one meaning ------------------------------------------


def _nan_then_finite():
    return [{"w": jnp.array([jnp.nan, 1.0])}, {"w": jnp.array([0.5, 1.0])}]


@pytest.mark.parametrize("wrapper", ["apply_if_finite", "accumulate_gradients", "masked", "schedule_free"])
def test_a_wrapper_composed_after_stages_wraps_them(wrapper):
    """compose(a, wrapper()) is a.wrapper(): the same object, the same state, the same numbers."""
    options = {"apply_if_finite": (), "accumulate_gradients": (2,), "masked": ({"w": True},),
               "schedule_free": (0.1,)}[wrapper]
    parent = ux.optimizers.adam(0.1) if wrapper != "schedule_free" else ux.scale_by_learning_rate(0.1)
    composed = ux.compose(parent, getattr(ux, wrapper)(*options))
    fluent = getattr(parent, wrapper)(*options)
    assert composed == fluent and repr(composed) == repr(fluent) and hash(composed) == hash(fluent)
    assert len(composed.stages) == 1


def test_compose_after_stages_guards_them_from_a_nan():
    opt = ux.compose(ux.optimizers.adam(0.1), ux.apply_if_finite())
    params = {"w": jnp.zeros(2)}
    state = opt.init(params)
    for grads in _nan_then_finite():
        updates, state = opt.update(grads, state, params)
    mu = opt.get_state(state, "apply_if_finite/scale_by_adam.mu")["w"]
    assert np.all(np.isfinite(mu)) and int(opt.get_state(state, "apply_if_finite/scale_by_adam.count")) == 1


def test_a_wrapper_of_part_of_a_pipeline_prints_what_it_wraps():
    part = ux.compose(ux.scale(2.0), ux.trace().accumulate_gradients(2))
    whole = ux.scale(2.0).trace().accumulate_gradients(2)
    assert part != whole and repr(part) != repr(whole)
    assert repr(part) == ("scale(step_size=2.0) |> accumulate_gradients(trace(decay=0.9, nesterov=False), steps=2, "
                          "mean=True)")
    assert repr(whole) == "scale(step_size=2.0) |> trace(decay=0.9, nesterov=False) |> accumulate_gradients(steps=2, mean=True)"
    # Where it matters, the two compute differently: clipping each call, or the mean of two calls.
    part, whole = ux.compose(ux.clip(1.0), ux.trace().accumulate_gradients(2)), ux.clip(1.0).trace().accumulate_gradients(2)
    assert repr(part) != repr(whole)
    outs = []
    for opt in (part, whole):
        state = opt.init({"w": jnp.zeros(1)})
        for g in (3.0, -1.0):
            u, state = opt.update({"w": jnp.array([g])}, state)
        outs.append(float(u["w"][0]))
    assert outs == [0.0, 1.0]  # mean(clip(3), clip(-1)) = 0; clip(mean(3, -1)) = 1


def test_a_wrapper_with_nothing_before_it_wraps_nothing():
    alone = ux.apply_if_finite()
    assert repr(alone) == "apply_if_finite(max_consecutive_errors=5)"
    assert repr(ux.compose(alone, ux.scale(2.0))) == "apply_if_finite(max_consecutive_errors=5) |> scale(step_size=2.0)"
    assert len(ux.compose(alone, ux.scale(2.0)).stages) == 2


def test_identity_is_a_combinator_like_any_other():
    parent = ux.scale(2.0)
    assert ux.identity().identity() == ux.identity()
    assert ux.identity(parent) == parent.identity() == parent.pipe(ux.identity) == parent
    assert toolz.thread_first(ux.identity(), ux.identity, (ux.scale, 2.0)) == parent


# --- schedules are explicit ----------------------------------------------------------


def _activate(updates, params, *, fn):
    return jax.tree.map(fn, updates)


def _scaled_by(updates, params, *, factor):
    return jax.tree.map(lambda g: g * factor, updates)


def test_a_callable_option_reaches_the_kernel_as_a_function_unless_declared_schedulable():
    opt = ux.stateless(_activate, options={"fn": jnp.tanh})
    g = {"w": jnp.array([0.5, -2.0])}
    out, state = opt.update(g, opt.init(g))
    np.testing.assert_allclose(out["w"], np.tanh([0.5, -2.0]), rtol=1e-6)
    assert state == (ux.EmptyState(),)
    scheduled = ux.stateless(_scaled_by, options={"factor": lambda count: 2.0 ** count}, schedulable=["factor"])
    state = scheduled.init(g)
    assert isinstance(state[0], ux.ScheduledState)
    for t in range(3):
        out, state = scheduled.update(g, state)
        np.testing.assert_allclose(out["w"], np.array([0.5, -2.0]) * 2.0**t)
    constant = ux.stateless(_scaled_by, options={"factor": 3.0}, schedulable=["factor"])
    assert constant.init(g) == (ux.EmptyState(),)


def test_schedulable_and_static_names_are_checked():
    with pytest.raises(ValueError, match=r"stateless\(schedulable=...\): \['rate'\] are not options of the stage"):
        ux.stateless(_scaled_by, options={"factor": 1.0}, schedulable=["rate"])
    with pytest.raises(TypeError, match="schedulable must be a collection of option names, not a string"):
        ux.stateless(_scaled_by, options={"factor": 1.0}, schedulable="factor")
    with pytest.raises(ValueError, match=r"cannot be both static and schedulable"):
        ux.stateless(_scaled_by, options={"factor": 1.0}, schedulable=["factor"], static=["factor"])


def test_a_class_is_not_a_schedule():
    with pytest.raises(TypeError, match=r"scale\(step_size=<class 'float'>\): step_size must be a real number"):
        ux.scale(float)


# --- options are values --------------------------------------------------------------


def _masked_double(updates, params, *, mask):
    return jax.tree.map(lambda g, m: g * 2.0 if m else g, updates, mask)


def test_options_are_copied_when_the_object_is_built():
    mask = {"a": True, "b": False}
    opt = ux.stateless(_masked_double, name="masked_double", options={"mask": mask})
    before, before_hash = repr(opt), hash(opt)
    mask["b"] = True
    g = {"a": jnp.ones(1), "b": jnp.ones(1)}
    assert repr(opt) == before and hash(opt) == before_hash
    assert float(opt.update(g, opt.init(g))[0]["b"][0]) == 1.0

    lr = np.array(0.5, np.float32)
    scaled = ux.scale(lr)
    lr[...] = 5.0
    assert float(scaled.update({"w": jnp.ones(1)}, scaled.init(None))[0]["w"][0]) == 0.5
    assert scaled == ux.scale(np.array(0.5, np.float32)) and hash(scaled) == hash(ux.scale(np.array(0.5, np.float32)))
    with pytest.raises(ValueError, match="read-only"):
        scaled.stages[0].option("step_size")[...] = 1.0


def test_dict_options_print_in_the_order_they_compare_in():
    a = ux.masked(ux.scale(2.0), {"w": True, "b": False})
    b = ux.masked(ux.scale(2.0), {"b": False, "w": True})
    assert a == b and repr(a) == repr(b) == "scale(step_size=2.0) |> masked(mask={'b': False, 'w': True})"


@pytest.mark.parametrize("x, y", [(1, 1.0), (0.0, -0.0), (True, 1), (np.float32(0.5), 0.5),
                                  (np.float32(0.5), np.float64(0.5)), (jax.random.key(0), np.array([0, 0], np.uint32))])
def test_options_that_compute_differently_are_different_and_print_differently(x, y):
    a = ux.stateless(_scaled_by, options={"factor": x})
    b = ux.stateless(_scaled_by, options={"factor": y})
    assert a != b and repr(a) != repr(b)


def test_numpy_and_jax_arrays_of_one_value_and_dtype_are_one_option():
    a, b = ux.scale(np.asarray(0.25, np.float32)), ux.scale(jnp.asarray(0.25, jnp.float32))
    assert a == b and hash(a) == hash(b) and repr(a) == repr(b) == "scale(step_size=array(0.25, dtype=float32))"


def test_large_array_options_print_a_digest_of_their_values():
    a = ux.ema(0.9, init={"w": jnp.zeros(100)})
    b = ux.ema(0.9, init={"w": jnp.zeros(100).at[50].set(1.0)})
    assert a != b and repr(a) != repr(b)
    assert "array(shape=(100,), dtype=float32, digest=" in repr(a)


def _closure_kernel(factor):
    def kernel(updates, params):
        return jax.tree.map(lambda g: g * factor, updates)

    return kernel


def test_functions_print_as_where_they_are_found():
    assert repr(ux.stateless(_double)) == "stateless(test_core._double)"
    assert repr(ux.scale_by_schedule(jnp.exp)) == "scale_by_schedule(schedule_fn=jax.numpy.exp)"
    first, second = ux.stateless(_closure_kernel(2.0)), ux.stateless(_closure_kernel(2.0))  # both alive
    assert repr(first).startswith("stateless(<function _closure_kernel.<locals>.kernel at 0x")
    assert first != second and repr(first) != repr(second)


# --- a stage name binds its computation ----------------------------------------------


def test_a_stage_name_binds_its_kernels_and_declarations():
    ux.stateless(_double, name="doubling")
    with pytest.raises(ValueError, match=r"^stage name 'doubling' is taken by test_core._double; give the stage "
                                         r"with test_core._betas_kernel another name$"):
        ux.stateless(_betas_kernel, name="doubling")
    with pytest.raises(ValueError, match=r"^stage name 'scale' is updax's \(ux.scale\); give your stage another "
                                         r"name$"):
        ux.stateless(_double, name="scale")
    with pytest.raises(ValueError, match=r"stage 'doubling' is declared two ways"):
        ux.stateless(_double, name="doubling", elementwise=True)
    with pytest.raises(ValueError, match="a kernel that closes over values is a new computation on every call"):
        for _ in range(2):
            ux.stateless(_closure_kernel(2.0), name="closure_scaled")
    with pytest.raises(ValueError, match="a stage name must be a Python identifier other than stateless and stateful"):
        ux.stateless(_double, name="stateless")
    with pytest.raises(ValueError, match="a stage name must be a Python identifier"):
        ux.stateless(_double, name="two words")
