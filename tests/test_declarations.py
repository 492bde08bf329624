"""Every option's rules are declared once, beside the stage's other declarations, and enforced on every path.

The catalogue and the optimizers declare a domain for every option of every stage (tests/registry.py builds
each entry, ``updax.optimizers`` each optimizer at its defaults); a stored value checks again to itself, so
that any path may check it; and each path a value enters by (the constructor, ``replace_state`` for held
hyperparameters and state fields, ``hyperparams_in_state``, a tree map, the eager step, ``checked`` under
``jax.jit``, a schedule's or a user callable's value) refuses what the declaration refuses, with one message.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import updax as ux
from registry import ENTRIES
from updax._stage import Stage

O = ux.optimizers


def _stages(opt):
    """The stages of ``opt`` and of every pipeline its options hold, depth first."""
    for stage in opt.stages:
        yield stage
        for _, (_, inner) in stage.nested().items():
            yield from _stages(inner)


def _optimizer(name):
    fn = getattr(O, name)
    required = [p for p in inspect.signature(fn).parameters.values()
                if p.default is inspect.Parameter.empty and p.kind is not p.VAR_KEYWORD]
    args = [0.1] * len(required)  # (a learning rate, where one has no default)
    if name == "lbfgs":
        args = []
    return fn(*args)


BUILT = {**{name: build for name, build in ENTRIES.items()},
         **{f"optimizers.{name}": (lambda name=name: _optimizer(name)) for name in O.__all__}}


@pytest.mark.parametrize("name", sorted(BUILT))
def test_every_option_of_every_stage_has_a_domain(name):
    for stage in _stages(BUILT[name]()):
        declared = {key for key, _ in stage.declaration.domains}
        missing = sorted({key for key, _ in stage.options} - declared)
        assert not missing, f"{name}: {stage.label} declares no domain for {missing}"


@pytest.mark.parametrize("name", sorted(BUILT))
def test_a_stored_option_checks_again_to_itself(name):
    """A path that checks a value again (a stage rebuilt with one option replaced) keeps every stored value."""
    for stage in _stages(BUILT[name]()):
        for key, value in stage.options:
            domain = stage.declaration.domain(key)
            again = domain.check(stage.label, key, stage.option(key), schedulable=key in stage.schedulable)
            rebuilt = Stage(stage.name, stage.init_fn, stage.apply_fn,
                            {**{k: stage.option(k) for k, _ in stage.options}, key: again},
                            needs_params=stage.needs_params, wraps=stage.wraps, static=stage.static,
                            schedulable=stage.schedulable, per_example=stage.per_example,
                            elementwise=stage.elementwise, state_last=stage.state_last,
                            domains=dict(stage.declaration.domains), relations=stage.declaration.relations)
            assert rebuilt == stage, f"{name}: {stage.label}.{key}={value!r} does not check again to itself"


# --- one message, every path ------------------------------------------------------------------------------

PARAMS = {"w": jnp.zeros(3)}
GRADS = {"w": jnp.array([0.1, -0.2, 0.3])}


def test_the_constructor_refuses_by_the_declaration():
    with pytest.raises(ValueError, match=r"^scale_by_adam\(b1=1\.5\): b1 must be in \[0, 1\)$"):
        ux.scale_by_adam(b1=1.5)
    with pytest.raises(ValueError, match=r"^adam\(learning_rate=-0\.1\): learning_rate must be in \[0, inf\); the "
                                         r"step's sign is the optimizer's: for gradient ascent pass maximize=True$"):
        ux.optimizers.adam(-0.1)
    for bad in (float("nan"), float("inf"), -1e-12):
        with pytest.raises(ValueError, match=r"learning_rate must be in \[0, inf\)"):
            ux.optimizers.sgd(bad)
        with pytest.raises(ValueError, match=r"^scale_by_learning_rate\(learning_rate="):
            ux.scale_by_learning_rate(bad)


def test_a_tree_map_out_of_the_domain_is_refused_when_the_object_is_used():
    opt = jax.tree.map(lambda x: x * 10, ux.optimizers.adam(0.1))  # b1 = 9.0
    assert repr(opt).startswith("scale_by_adam(b1=9.0")
    with pytest.raises(ValueError, match=r"^scale_by_adam\(b1=9\.0\): b1 must be in \[0, 1\) \(an update object "
                                         r"rebuilt by a tree map\)$"):
        opt.init(PARAMS)
    state = ux.optimizers.adam(0.1).init(PARAMS)
    with pytest.raises(ValueError, match=r"b1 must be in \[0, 1\)"):
        opt.update(GRADS, state, PARAMS)
    with pytest.raises(ValueError, match=r"b1 must be in \[0, 1\)"):  # closed over by a jitted step: concrete
        jax.jit(lambda g, s: opt.update(g, s)[0])(GRADS, state)
    with pytest.raises(ValueError, match=r"^scale_by_adam\(b1=9\.0\): b1 must be in \[0, 1\) \(hyperparams_in_"):
        ux.hyperparams_in_state(opt)
    # a tree map inside the domain is as good as the constructor's object
    halved = jax.tree.map(lambda x: x / 2, ux.optimizers.adam(0.1))
    assert halved == ux.optimizers.adam(0.05, b1=0.45, b2=0.4995, eps=5e-9, eps_root=5e-16)
    np.testing.assert_array_equal(halved.update(GRADS, halved.init(PARAMS))[0]["w"],
                                  ux.optimizers.adam(0.05, b1=0.45, b2=0.4995, eps=5e-9, eps_root=5e-16)
                                  .update(GRADS, halved.init(PARAMS))[0]["w"])


def test_gradients_with_respect_to_an_update_object_are_not_refused():
    """A cotangent is shaped like the object but is not an optimizer: it is never used as one, so never checked."""
    opt = ux.optimizers.sgd(jnp.float32(0.5))

    def loss(o):
        u, _ = o.update(GRADS, o.init(PARAMS))
        return jnp.sum(u["w"])

    d = jax.grad(loss)(opt)
    assert isinstance(d, ux.Update)
    np.testing.assert_allclose(d.stages[0].option("learning_rate"), -float(jnp.sum(GRADS["w"])), rtol=1e-6)


def _held_sgd():
    opt = ux.hyperparams_in_state(ux.optimizers.sgd(0.1))
    return opt, opt.init(PARAMS)


def test_replace_state_refuses_a_held_value_out_of_its_domain():
    opt, state = _held_sgd()
    path = "scale_by_learning_rate.learning_rate"
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"^scale_by_learning_rate\(learning_rate=.*\): learning_rate must be "
                                             r"in \[0, inf\).*\(written by replace_state\('scale_by_learning_rate"
                                             r"\.learning_rate'\)\)$"):
            opt.replace_state(state, path, bad)
    with pytest.raises(ValueError, match=r"must fit the float32 state"):
        opt.replace_state(state, path, 1e40)
    state = opt.replace_state(state, path, 0.5)
    assert float(opt.get_state(state, path)) == 0.5
    adam = ux.hyperparams_in_state(ux.scale_by_adam())
    with pytest.raises(ValueError, match=r"^scale_by_adam\(b1=1\.5\): b1 must be in \[0, 1\)"):
        adam.replace_state(adam.init(PARAMS), "scale_by_adam.b1", 1.5)


def test_an_option_init_reads_is_not_held():
    """Prodigy's ``estim_lr0`` starts its distance estimate at ``init`` (and is its d₀ after): held, a write
    would disagree with the estimate ``init`` made from the old value, so it stays a constant and the write is
    refused by name; the other numbers are held. The held object's first step equals the plain one's."""
    plain = ux.scale_by_prodigy(estim_lr0=0.5)
    opt = ux.hyperparams_in_state(plain)
    assert opt.stages[0].held == {"learning_rate", "b1", "b2", "eps", "estim_lr_coef", "decay"}
    assert "init_step" not in ux.hyperparams_in_state(ux.scale_by_dog()).stages[0].held
    state = opt.init(PARAMS)
    with pytest.raises(KeyError, match=r"estim_lr0 is read by init, which makes the state from it"):
        opt.replace_state(state, "scale_by_prodigy.estim_lr0", 1.0)
    grads = {"w": jnp.array([0.5, -1.0, 2.0])}
    held_u, _ = opt.update(grads, state, PARAMS)
    plain_u, _ = plain.update(grads, plain.init(PARAMS), PARAMS)
    # the first step is d₀·g/|g|, up to float32 rounding of 1 - b2 (a Python float or a held float32)
    for u in (held_u, plain_u):
        np.testing.assert_allclose(u["w"], 0.5 * np.sign(grads["w"]), rtol=3e-5)


def _written_in_place(state, value):
    """The state with the held learning rate set as a framework sets a variable: no updax call sees it."""
    state[0].hyperparams["learning_rate"] = value
    return state


def test_an_eager_step_refuses_a_held_value_written_behind_its_back():
    opt, state = _held_sgd()
    state = _written_in_place(state, jnp.float32(-2.0))
    with pytest.raises(ValueError, match=r"^scale_by_learning_rate\(learning_rate=-2\.0\): learning_rate must be "
                                         r"in \[0, inf\).* \(held in the state\)$"):
        opt.update(GRADS, state, PARAMS)


def test_the_checked_step_raises_the_same_error_under_jit():
    from jax.experimental import checkify

    opt, state = _held_sgd()
    checked = ux.checked(opt)
    assert repr(checked) == "checked(hyperparams_in_state(scale_by_learning_rate(learning_rate=0.1)))"
    assert checked.checked() == checked and checked != opt
    step = checkify.checkify(jax.jit(checked.update))
    err, (u, _) = step(GRADS, state, PARAMS)
    err.throw()
    np.testing.assert_array_equal(u["w"], opt.update(GRADS, state, PARAMS)[0]["w"])  # the same numbers
    err, _ = step(GRADS, _written_in_place(state, jnp.float32(-2.0)), PARAMS)
    with pytest.raises(checkify.JaxRuntimeError, match=r"scale_by_learning_rate\(learning_rate=-2\.0\): "
                                                       r"learning_rate must be in \[0, inf\).*\(held in the state\)"):
        err.throw()
    # unchecked, the jitted step cannot tell: it trains uphill (documented in docs/errors.md)
    u, _ = jax.jit(opt.update)(GRADS, _written_in_place(opt.init(PARAMS), jnp.float32(-2.0)), PARAMS)
    np.testing.assert_allclose(u["w"], 2.0 * GRADS["w"], rtol=1e-6)


def test_the_checked_step_checks_options_passed_into_the_step_and_schedules_values():
    from jax.experimental import checkify

    bad = jax.tree.map(lambda x: -x, ux.checked(ux.optimizers.adam(0.1)))  # the object is an argument of the step

    @jax.jit
    def step(opt, grads, state):
        return opt.update(grads, state)[0]

    err, _ = checkify.checkify(step)(bad, GRADS, ux.optimizers.adam(0.1).init(PARAMS))
    with pytest.raises(checkify.JaxRuntimeError, match=r"scale_by_adam\(b1=-0\.89999\d*\): b1 must be in \[0, 1\) "
                                                       r"\(an option traced under jax.jit\)"):
        err.throw()
    scheduled = ux.checked(ux.scale_by_learning_rate(ux.schedules.linear_schedule(0.1, -0.1, 4)))
    state = scheduled.init(PARAMS)
    run = checkify.checkify(jax.jit(scheduled.update))
    for t in range(4):
        err, (_, state) = run(GRADS, state)
        if t < 2:
            err.throw()  # 0.1, 0.05: fine
    with pytest.raises(checkify.JaxRuntimeError, match=r"learning_rate must be in \[0, inf\).*\(the value its "
                                                       r"schedule returned at the step's count\)"):
        err.throw()


def test_a_schedule_value_out_of_the_domain_is_refused_on_an_eager_step():
    opt = ux.scale_by_learning_rate(lambda count: 0.1 - 0.1 * count)
    state = opt.init(PARAMS)
    _, state = opt.update(GRADS, state)  # 0.1, 0.0 are fine
    _, state = opt.update(GRADS, state)
    with pytest.raises(ValueError, match=r"^scale_by_learning_rate\(learning_rate=-0\.1.*\): learning_rate must be "
                                         r"in \[0, inf\).*\(the value its schedule returned at count 2\)$"):
        opt.update(GRADS, state)
    with pytest.raises(ValueError, match=r"^warmup_cosine_decay: the count must be a step count >= 0, got -1$"):
        ux.schedules.warmup_cosine_decay(0.0, 1.0, 10, 100)(-1)


def test_a_scheduled_value_of_a_user_callable_option_is_checked_when_concrete():
    opt = ux.scale_by_schedule(lambda count: jnp.where(count < 1, 1.0, jnp.nan))
    state = opt.init(PARAMS)
    _, state = opt.update(GRADS, state)
    with pytest.raises(ValueError, match=r"^scale_by_schedule\(schedule_fn\(\.\.\.\)=nan\): schedule_fn\(\.\.\.\) "
                                         r"must be a finite number \(the value it returned at count 1\)$"):
        opt.update(GRADS, state)


# --- state fields declare what they hold --------------------------------------------------------------------


def test_replace_state_refuses_what_a_field_cannot_hold_whatever_its_name():
    opt = ux.optimizers.adam(0.1)
    state = opt.init(PARAMS)
    with pytest.raises(ValueError, match=r"must be a non-negative integer"):
        opt.replace_state(state, "scale_by_adam.count", -3)
    with pytest.raises(ValueError, match=r"must be in \[0, inf\)"):
        opt.replace_state(state, "scale_by_adam.nu", {"w": jnp.array([1.0, -1.0, 0.0])})
    with pytest.raises(ValueError, match=r"must fit the float32 state"):
        opt.replace_state(state, "scale_by_adam.mu", {"w": np.full(3, 1e40)})
    with pytest.raises(ValueError, match=r"must be a non-negative integer"):  # the whole entry: fields inside
        opt.replace_state(state, "scale_by_adam", state[0]._replace(count=jnp.int32(-1)))
    scheduled = ux.scale_by_learning_rate(ux.schedules.constant(0.1))
    with pytest.raises(ValueError, match=r"must be a non-negative integer"):  # ScheduledState.count
        scheduled.replace_state(scheduled.init(PARAMS), "scale_by_learning_rate",
                                scheduled.init(PARAMS)[0]._replace(count=jnp.int32(-5)))
    accepted = opt.replace_state(state, "scale_by_adam.mu", {"w": jnp.array([1.0, -1.0, 3e38])})
    np.testing.assert_array_equal(opt.get_state(accepted, "scale_by_adam.mu")["w"],
                                  np.array([1.0, -1.0, 3e38], np.float32))


def test_a_bool_field_holds_only_true_or_false():
    opt = ux.scale(-1.0).accumulate_gradients(2)
    state = opt.init(PARAMS)
    with pytest.raises(ValueError, match=r"must be True or False \(or 1 or 0\)"):
        opt.replace_state(state, "accumulate_gradients.updated", 5)
    assert bool(opt.get_state(opt.replace_state(state, "accumulate_gradients.updated", 1),
                              "accumulate_gradients.updated"))


def test_another_optimizers_state_of_the_same_shapes_is_refused():
    adam_state = ux.optimizers.adam(0.1).init(PARAMS)
    with pytest.raises(ValueError, match=r"at state\[0\] init\(\) gives ScaleByAdamaxState\(mu, nu, count\), the "
                                         r"state has ScaleByAdamState\(mu, nu, count\)"):
        ux.optimizers.adamax(0.1).update(GRADS, adam_state, PARAMS)
    ux.optimizers.nadam(0.1).update(GRADS, adam_state, PARAMS)  # (NAdam's moments are Adam's: the same numbers)


# --- user stages --------------------------------------------------------------------------------------------


def test_a_misspelt_option_of_a_user_stage_is_refused_when_it_is_built():
    def init(params):
        return ()

    def apply(updates, state, params, *, decay):
        return updates, state

    with pytest.raises(ValueError, match=r"^decaying\(options=\.\.\.\): 'decya' is not a parameter of its kernels "
                                         r"\(init_fn takes \[\]; apply_fn takes \['decay'\]\)$"):
        ux.stateful(init, apply, name="decaying", options={"decya": 0.5})


SOURCE = '''
import jax
import updax as ux

def times(updates, params, *, factor):
    return jax.tree.map(lambda g: g * factor, updates)

opt = ux.stateless(times, name="cell_times", options={"factor": 2.0}, domains={"factor": ux.domains.ANY_REAL})
quick = ux.stateless(lambda updates, params: updates, name="cell_lambda")
'''


def test_running_a_definition_again_binds_its_name_again():
    """A notebook cell run twice defines new function objects with the same names (and a lambda with the same
    code): the name binds again, and the new objects work."""
    first, second = {"__name__": "__main__"}, {"__name__": "__main__"}
    exec(compile(SOURCE, "<cell>", "exec"), first)
    exec(compile(SOURCE, "<cell>", "exec"), second)
    assert first["times"] is not second["times"]
    assert repr(second["opt"]) == "cell_times(factor=2.0)"
    np.testing.assert_array_equal(second["opt"].update(GRADS, second["opt"].init(PARAMS))[0]["w"], 2.0 * GRADS["w"])


def test_catalogue_names_are_kept_from_import_on():
    def trace(updates, params):
        return updates

    for name in ("trace", "sma", "scale_by_adam"):
        with pytest.raises(ValueError, match=rf"^stage name '{name}' is updax's \(ux\.{name}\); give your stage "
                                             r"another name$"):
            ux.stateless(trace, name=name)


def test_optax_spellings_get_a_hint():
    with pytest.raises(AttributeError, match=r"^module 'updax' has no attribute 'chain': optax's name; updax's is "
                                             r"ux\.compose$"):
        ux.chain  # noqa: B018
    with pytest.raises(TypeError, match=r"^adamw\(\) got an unexpected keyword argument 'weight_decay': optax's "
                                        r"name; updax's is decay \(adamw\(decay=\.\.\.\)\)$"):
        ux.optimizers.adamw(0.1, weight_decay=0.1)
    with pytest.raises(TypeError, match=r"updax's is decay \(add_decayed_weights\(decay=\.\.\.\)\)"):
        ux.add_decayed_weights(weight_decay=0.1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'wieght_decay'$"):  # not optax's: Python's
        ux.optimizers.adamw(0.1, wieght_decay=0.1)


# --- ascent ---------------------------------------------------------------------------------------------------


def test_maximize_negates_the_gradients_first():
    params = {"w": jnp.array([1.0, -2.0, 0.5])}
    up = ux.optimizers.adamw(0.1, decay=0.5, maximize=True)
    down = ux.optimizers.adamw(0.1, decay=0.5)
    assert repr(up) == "scale(step_size=-1.0) |> " + repr(down)
    u_up, _ = up.update(GRADS, up.init(params), params)
    u_down, _ = down.update(jax.tree.map(jnp.negative, GRADS), down.init(params), params)
    np.testing.assert_array_equal(u_up["w"], u_down["w"])  # ascent on f is descent on -f
    # decoupled weight decay still decays: with a zero gradient both move the weights toward 0
    zero = {"w": jnp.zeros(3)}
    np.testing.assert_array_equal(up.update(zero, up.init(params), params)[0]["w"],
                                  down.update(zero, down.init(params), params)[0]["w"])
    # an ascent step increases f(w) = sum(w): its gradient is all ones
    sgd = ux.optimizers.sgd(0.1, maximize=True)
    step, _ = sgd.update({"w": jnp.ones(3)}, sgd.init(params), params)
    assert float(jnp.sum(ux.apply_updates(params, step)["w"])) > float(jnp.sum(params["w"]))


# --- masks and labels: one validator ---------------------------------------------------------------------------

TWO = {"w": jnp.ones(2), "b": jnp.ones(1)}


def test_a_mask_holds_bools_only():
    for build in (lambda m: ux.masked(ux.scale(2.0), m), lambda m: ux.scale(2.0).freeze(m),
                  lambda m: ux.add_decayed_weights(0.1, mask=m), lambda m: ux.optimizers.adamw(0.1, mask=m)):
        with pytest.raises(TypeError, match=r"mask must be a pytree of bools or a function of the params returning "
                                            r"one; at mask\['w'\] it has str 'False'"):
            build({"w": "False", "b": True})
        with pytest.raises(TypeError, match=r"at mask\['b'\] it has int 1"):
            build({"w": True, "b": 1})
        with pytest.raises(TypeError, match=r"has a boolean array of shape \(2,\) at mask\['w'\]: a mask selects "
                                            r"whole leaves"):
            build({"w": jnp.array([True, False]), "b": True})


def test_a_mask_function_is_checked_as_a_mask():
    opt = ux.masked(ux.scale(2.0), lambda p: {"w": "False", "b": True})
    with pytest.raises(TypeError, match=r"at mask\(params\)\['w'\] it has str 'False'"):
        opt.update(TWO, opt.init(TWO))


def test_a_jnp_boolean_mask_works_under_jit_with_the_optimizer_as_an_argument():
    opt = ux.masked(ux.scale(2.0), {"w": jnp.array(True), "b": np.bool_(False)})
    assert opt == ux.masked(ux.scale(2.0), {"w": True, "b": False})  # (static: the bool it holds)

    @jax.jit
    def step(o, g, s):
        return o.update(g, s)[0]

    out = step(opt, TWO, opt.init(TWO))
    np.testing.assert_array_equal(out["w"], 2.0) and np.testing.assert_array_equal(out["b"], 1.0)


def test_a_mask_computed_from_values_under_jit_is_refused_by_name():
    opt = ux.masked(ux.scale(2.0), lambda p: jax.tree.map(lambda x: jnp.all(x > 0), p))
    eager, _ = opt.update(TWO, opt.init(TWO))  # eagerly the values are there: the mask is concrete
    np.testing.assert_array_equal(eager["w"], 2.0)
    with pytest.raises(TypeError, match=r"is traced at mask\(params\)\['b'\]: a mask decides which leaves a stage "
                                        r"touches, so it must follow from the params' structure and shapes"):
        jax.jit(opt.update)(TWO, opt.init(TWO))
    by_shape = ux.masked(ux.scale(2.0), lambda p: jax.tree.map(lambda x: x.ndim == 1 and x.shape[0] > 1, p))
    out, _ = jax.jit(by_shape.update)(TWO, by_shape.init(TWO))
    np.testing.assert_array_equal(out["w"], 2.0) and np.testing.assert_array_equal(out["b"], 1.0)


def test_a_prefix_mask_covers_its_subtree():
    params = {"enc": {"w": jnp.ones(2), "b": jnp.ones(1)}, "dec": jnp.ones(3)}
    opt = ux.scale(2.0).freeze({"enc": True, "dec": False})
    out, _ = opt.update(params, opt.init(params))
    assert [float(x.sum()) for x in jax.tree.leaves(out)] == [6.0, 0.0, 0.0]


def test_partition_labels_are_any_hashable_matched_as_dict_keys():
    opt = ux.partition({1: ux.scale(2.0), 2: ux.scale(3.0)}, {"w": 1, "b": 2})
    out, _ = opt.update(TWO, opt.init(TWO))
    np.testing.assert_array_equal(out["w"], 2.0) and np.testing.assert_array_equal(out["b"], 3.0)
    with pytest.raises(ValueError, match=r"^partition: labels\['b'\] is '2', which names no pipeline \(labels are "
                                         r"matched to the transforms' keys by ==, as dict keys are"):
        bad = ux.partition({1: ux.scale(2.0), 2: ux.scale(3.0)}, {"w": 1, "b": "2"})
        bad.init(TWO)
    with pytest.raises(TypeError, match=r"transforms must have labels of one kind \(JAX sorts a dict's keys\), got "
                                        r"\['int', 'str'\]"):
        ux.partition({1: ux.scale(2.0), "1": ux.scale(3.0)}, {"w": 1, "b": "1"})
    with pytest.raises(TypeError, match=r"labels must have hashable labels; at labels\['w'\] it has set"):
        ux.partition({"a": ux.scale(2.0)}, {"w": {"a"}, "b": "a"})


def test_held_options_of_partition_groups_are_reachable_by_path():
    params = {"w": jnp.ones((3, 3)), "b": jnp.ones(3)}
    opt = ux.hyperparams_in_state(ux.optimizers.muon(0.1))
    state = opt.init(params)
    path = "partition/muon/scale_by_learning_rate.learning_rate"
    assert float(opt.get_state(state, path)) == pytest.approx(0.1)
    state = opt.replace_state(state, path, 0.0)
    assert float(opt.get_state(state, path)) == 0.0
    assert float(opt.get_state(state, "partition/adam/scale_by_learning_rate.learning_rate")) == pytest.approx(0.1)
    u, _ = opt.update(jax.tree.map(jnp.ones_like, params), state, params)
    np.testing.assert_array_equal(u["w"], 0.0)  # the muon group's rate is 0 now; adam's is not
    assert float(jnp.abs(u["b"]).min()) > 0
    with pytest.raises(ValueError, match=r"learning_rate must be in \[0, inf\)"):
        opt.replace_state(state, path, -0.1)
    with pytest.raises(KeyError, match=r"partition has no group 'sgd' \(groups: \['adam', 'muon'\]\)"):
        opt.get_state(state, "partition/sgd/scale_by_learning_rate.learning_rate")


# --- the docs say what the declarations say ---------------------------------------------------------------------


def _as_range(domain):
    """A declared numeric domain as the fuzz's documented ``Range``, or None for one that is not a number's."""
    from test_fuzz import Range

    from updax._domains import Integer, Real, Valid

    if isinstance(domain, Valid):
        domain = domain.values
    if isinstance(domain, Real):
        return Range(False, domain.lo, domain.hi, domain.lo_open, domain.hi_open)
    if isinstance(domain, Integer):
        return Range(True, domain.lo, domain.hi)
    return None


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_the_documented_range_of_an_option_is_its_declared_domain(name):
    """Where a catalogue entry's docstring states an option's range (``in [0, 1)``, ``>= 0``, ``an integer in
    [1, 100]``), it is the range the stage declares: two independent statements of one rule that must agree."""
    from test_fuzz import args_section, parse_range

    stage = ENTRIES[name]().stages[-1]
    factory = getattr(ux, stage.label, None) if stage.label == name.split("_bias_corrected")[0] else None
    for option, text in args_section(factory or getattr(ux, name, lambda: None)).items():
        documented = parse_range(text)
        if documented is None or documented.at_least or option not in dict(stage.options):
            continue
        declared = _as_range(stage.declaration.domain(option))
        if declared is None:  # not a number (adaptive_grad_clip's axis "for leaves of rank >= 2")
            continue
        if documented.lo is None and documented.hi is None and not documented.integer:
            continue  # "any real number"
        assert (declared.integer, declared.lo, declared.hi, declared.lo_open, declared.hi_open) == \
            (documented.integer, documented.lo, documented.hi, documented.lo_open, documented.hi_open), \
            f"{name}.{option}: the docstring says {text!r}, the declaration {stage.declaration.domain(option)}"


def test_a_fused_run_checks_its_stages_too():
    """LAMB's stages run through a fused path (updax._fused), not Stage.apply: a tree map out of the domain is
    refused there as well, and a checked pipeline runs stage by stage, so its checks are in the step."""
    from jax.experimental import checkify

    params = {"w": jnp.ones((2, 2)), "b": jnp.ones(2)}
    lamb = ux.optimizers.lamb(0.1)
    bad = jax.tree.map(lambda x: x * 10, lamb)
    with pytest.raises(ValueError, match=r"^scale_by_adam\(b1=9\.0\): b1 must be in \[0, 1\)"):
        bad.update(params, lamb.init(params), params)

    @jax.jit
    def step(o, g, s, p):
        return o.update(g, s, p)[0]

    with pytest.raises(ValueError, match=r"b1 must be in \[0, 1\) \(checked\)"):
        ux.checked(bad)
    err, _ = checkify.checkify(step)(jax.tree.map(lambda x: x * 10, ux.checked(lamb)), params, lamb.init(params),
                                     params)
    with pytest.raises(checkify.JaxRuntimeError, match=r"scale_by_adam\(b1=9\.0\): b1 must be in \[0, 1\)"):
        err.throw()
