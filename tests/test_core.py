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
    assert repr(ux.clip().stateless(_double)) == "clip(delta=2.0) |> stateless(_double)"
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
    assert repr(opt) == "scale(step_size=0.25)"
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
    with pytest.raises(KeyError, match=r"has no field 'sigma' \(fields: \['mu', 'nu', 'count'\]; hyperparameters: \['b1', 'b2', 'eps', 'eps_root'\]\)"):
        opt.get_state(state, "scale_by_adam.sigma")
    with pytest.raises(KeyError, match="scale_by_adam wraps no pipeline"):
        opt.get_state(state, "scale_by_adam/scale")
    with pytest.raises(ValueError, match=r"shape \(3,\) differs from the current \(\)"):
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
    (lambda: ux.scale_by_adam(eps=-1.0), ValueError, r"scale_by_adam(eps=-1.0): eps must be in [0, inf]"),
    (lambda: ux.scale_by_adam(mu_dtype=jnp.int32), TypeError, "mu_dtype must be None or a floating dtype"),
    (lambda: ux.scale_by_belief(b1=1.0), ValueError, r"scale_by_belief(b1=1.0): b1 must be in [0, 1)"),
    (lambda: ux.scale_by_radam(threshold="high"), TypeError, "scale_by_radam(threshold='high'): threshold must be a real"),
    (lambda: ux.scale_by_rms(decay=float("nan")), ValueError, "scale_by_rms(decay=nan): decay must be in [0, 1)"),
    (lambda: ux.scale_by_rss(initial_accumulator_value=-1), ValueError, "initial_accumulator_value must be in [0, inf]"),
    (lambda: ux.scale_by_stddev(initial_scale=-0.5), ValueError, "scale_by_stddev(initial_scale=-0.5)"),
    (lambda: ux.scale_by_schedule(0.1), TypeError, "scale_by_schedule(schedule_fn=0.1): schedule_fn must be callable"),
    (lambda: ux.scale_by_state(None), TypeError, "scale_by_state(step_size=None): step_size must be a real number"),
    (lambda: ux.scale_by_trust_ratio(min_norm=-1.0), ValueError, "scale_by_trust_ratio(min_norm=-1.0)"),
    (lambda: ux.scale_by_yogi(b2=1.0), ValueError, "scale_by_yogi(b2=1.0): b2 must be in [0, 1)"),
    (lambda: ux.trace(decay=1.5), ValueError, "trace(decay=1.5): decay must be in [0, 1]"),
    (lambda: ux.trace(nesterov=1), TypeError, "trace(nesterov=1): nesterov must be True or False"),
    (lambda: ux.clip(delta=-1.0), ValueError, "clip(delta=-1.0): delta must be in [0, inf]"),
    (lambda: ux.clip_by_global_norm(max_norm=0.0), ValueError, "clip_by_global_norm(max_norm=0.0): max_norm must be in (0, inf]"),
    (lambda: ux.add_decayed_weights(decay="x"), TypeError, "add_decayed_weights(decay='x')"),
    (lambda: ux.add_noise(eta=-0.1), ValueError, "add_noise(eta=-0.1): eta must be in [0, inf]"),
    (lambda: ux.add_noise(key=1.5), TypeError, "add_noise(key=1.5): key must be an int seed or a PRNG key"),
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
    with pytest.raises(ValueError, match=r"scale_by_adam: state.mu does not match updates: .*\['b'\]\[1\]"):
        opt.update({"a": jnp.zeros(2), "b": [jnp.zeros(1)]}, state)


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
    with pytest.raises(TypeError, match=r"affine\(names=\[\{1\}\]\): an option must be a number"):
        ux.stateless(_betas_kernel, name="affine", options={"names": [{1}]})


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

    with pytest.raises(ValueError, match=r"cannot register combinator 'scale' .*updax.updates._scaling.scale already"):
        ux.combinator(scale)
    assert repr(ux.clip().scale(3.0)) == "clip(delta=2.0) |> scale(step_size=3.0)"


def test_a_missing_key_is_named_as_missing():
    opt = ux.scale_by_adam()
    state = opt.init({"b": jnp.zeros(1), "w": jnp.zeros(1)})
    with pytest.raises(ValueError, match=r"\['b'\] is in state.mu but not in updates"):
        opt.update({"w": jnp.zeros(1)}, state)
