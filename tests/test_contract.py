"""The contract every catalogue entry keeps, driven by tests/registry.py."""

from __future__ import annotations

import pickle
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import updax as ux
from registry import ANY_TREE, ENTRIES, NEEDS_PARAMS, PER_EXAMPLE, catalogue_names, nested_tree, updates_for

NAMES = sorted(ENTRIES)
# Every update gets a loss: stages that take no extra keywords must ignore it.
LOSS = 1.0


def _tol(dtype):
    return dict(rtol=2e-2, atol=2e-2) if dtype == jnp.bfloat16 else dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(autouse=True)
def strict_promotion():
    """Kernels cast explicitly: no silent bf16 -> f32 upcasts slip through."""
    with jax.numpy_dtype_promotion("strict"):
        yield


def _run(opt, steps, dtype, jit):
    """Runs ``steps`` updates on nested trees; returns the list of updates and the final state."""
    params = nested_tree(dtype, seed=0)
    state = opt.init(params)

    def step(opt, grads, state, params):
        return opt.update(grads, state, params, loss=LOSS)

    step = jax.jit(step) if jit else step
    outs = []
    for t in range(steps):
        grads = updates_for(opt, nested_tree(dtype, seed=t + 1))  # (per-example entries: a batch of examples)
        updates, state = step(opt, grads, state, params)
        outs.append(updates)
    return outs, state


def test_registry_covers_the_catalogue():
    builders = {name.removesuffix("_nesterov").removesuffix("_bias_corrected").removesuffix("_with_base")
                for name in ENTRIES}
    assert builders == set(catalogue_names())


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [jnp.bfloat16], ids=["bf16"])  # (float32: tests/test_held_numbers.py's sweep)
def test_jit_and_eager_agree_and_keep_shapes_dtypes(name, dtype):
    opt = ENTRIES[name]()
    eager, eager_state = _run(opt, 3, dtype, jit=False)
    jitted, jitted_state = _run(opt, 3, dtype, jit=True)
    reference = nested_tree(dtype)
    for e, j in zip(eager, jitted):
        assert jax.tree.structure(e) == jax.tree.structure(reference)
        for x, y, r in zip(jax.tree.leaves(e), jax.tree.leaves(j), jax.tree.leaves(reference)):
            assert x.shape == r.shape and x.dtype == r.dtype
            assert y.shape == r.shape and y.dtype == r.dtype
            assert np.all(np.isfinite(np.asarray(x, np.float32)))
            np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32), **_tol(dtype))
    assert jax.tree.structure(eager_state) == jax.tree.structure(jitted_state)


@pytest.mark.parametrize("name", NAMES)
def test_state_is_a_tuple_of_named_tuples_in_pipeline_order(name):
    opt = ENTRIES[name]()
    state = opt.init(nested_tree())
    assert isinstance(state, tuple) and len(state) == len(opt.stages)
    for stage, stage_state in zip(opt.stages, state):
        assert isinstance(stage_state, tuple) and hasattr(stage_state, "_fields")
        assert opt.get_state(state, stage.label) is stage_state


def _buffers(tree):
    def raw(x):
        return jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x

    return [raw(x).unsafe_buffer_pointer() for x in jax.tree.leaves(tree) if isinstance(x, jax.Array) and x.size]


@pytest.mark.parametrize("name", NAMES)
def test_init_state_can_be_donated_with_the_params(name):
    """No buffer appears twice in the state or in both state and params (donation would fail)."""
    params = nested_tree()
    state = ENTRIES[name]().init(params)
    pointers = _buffers(state) + _buffers(params)
    assert len(pointers) == len(set(pointers))


@pytest.mark.parametrize("name", ux.optimizers.__all__)
def test_optimizer_init_state_can_be_donated_with_the_params(name):
    params = nested_tree()
    pointers = _buffers(getattr(ux.optimizers, name)().init(params)) + _buffers(params)
    assert len(pointers) == len(set(pointers))


@pytest.mark.parametrize("name", ["scale_by_adam", "scale_by_rms", "trace", "scale_by_yogi"])
def test_accumulators_default_to_float32_for_bf16_params(name):
    opt = ENTRIES[name]()
    state = opt.init(nested_tree(jnp.bfloat16))
    for leaf in jax.tree.leaves(state[0]):
        if leaf.ndim or leaf.dtype != jnp.int32:
            assert leaf.dtype == jnp.float32


def test_dtype_options_store_moments_as_asked():
    opt = ux.scale_by_adam(mu_dtype=jnp.bfloat16, nu_dtype="float32")
    state = opt.init(nested_tree(jnp.float32))
    assert {x.dtype for x in jax.tree.leaves(state[0].mu)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(state[0].nu)} == {jnp.dtype(jnp.float32)}
    updates, state = opt.update(nested_tree(seed=1), state)
    assert {x.dtype for x in jax.tree.leaves(state[0].mu)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(updates)} == {jnp.dtype(jnp.float32)}


@pytest.mark.parametrize("dtype, expected", [(None, 2.0), (jnp.bfloat16, 1.0)], ids=["f32", "bf16"])
def test_adam_state_is_exactly_its_two_moments(dtype, expected):
    """Adam keeps 2x the float32 params' bytes (bf16 moments: half that) and a 4-byte step count, nothing else."""
    params = nested_tree(jnp.float32)
    state = ux.optimizers.adam(1e-3, mu_dtype=dtype, nu_dtype=dtype).init(params)
    params_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
    assert sum(x.nbytes for x in jax.tree.leaves(state)) == expected * params_bytes + 4


# No recompilation on the second call or for new hyperparameters: tests/test_held_numbers.py's sweep, whose jitted
# steps of every entry and optimizer take new values of the object's numbers without a second trace.


@pytest.mark.parametrize("name", [n for n in NAMES if n not in PER_EXAMPLE])  # (those: test_per_example_entries_...)
def test_composes_with_itself_and_with_a_stateless_stage(name):
    """compose(opt, opt).scale(0.5) equals running opt twice in a row, then halving, step after step."""
    opt = ENTRIES[name]()
    params = nested_tree()
    twice = ux.compose(opt, opt).scale(0.5)
    assert len(twice.stages) == 2 * len(opt.stages) + 1
    state, first_state, second_state = twice.init(params), opt.init(params), opt.init(params)
    nonzero = False
    for t in range(4):  # enough calls for accumulate_gradients(2) inside accumulate_gradients(2) to step
        grads = nested_tree(seed=t + 1)
        updates, state = twice.update(grads, state, params, loss=LOSS)
        first, first_state = opt.update(grads, first_state, params, loss=LOSS)
        second, second_state = opt.update(first, second_state, params, loss=LOSS)
        expected = jax.tree.map(lambda u: u * 0.5, second)
        for x, y in zip(jax.tree.leaves(updates), jax.tree.leaves(expected)):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7, err_msg=f"step {t + 1}")
            nonzero |= bool(np.any(np.asarray(x) != 0))
    assert nonzero, "every update was zero: the comparison above proved nothing"


#: Real-valued options that are not schedulable, and why.
NOT_SCHEDULABLE = {("ema", "init"): "the starting value, a number or a tree shaped like the values",
                   # Starting values of the learning-rate-free estimates, read by init (Prodigy's d0 also
                   # normalises the weights of its sums: a schedule would change what the sums mean).
                   ("scale_by_prodigy", "estim_lr0"): "d0", ("scale_by_dadapt_adamw", "estim_lr0"): "d0",
                   ("scale_by_dog", "init_step"): "r_eps", ("scale_by_dowg", "init_estim_sq_dist"): "r_eps²",
                   ("scale_by_cocob", "eps"): "the initial L", ("mechanize", "s_init"): "the initial scale",
                   ("loss_scale", "loss_scale"): "the initial loss scale",
                   ("scale_by_multiplicative_lr", "learning_rate"): "the first rate, multiplied on in the state",
                   # y = b1·x + (1 - b1)·z is carried from step to step with one b1.
                   ("schedule_free", "b1"): "the interpolation weight, fixed for the run"}


def _stages(opt):
    """The stages of a pipeline and of the pipelines its wrappers run."""
    for stage in opt.stages:
        yield stage
        if stage.wraps is not None:
            yield from _stages(stage.option(stage.wraps))


@pytest.mark.parametrize("name", NAMES)
def test_every_real_option_is_schedulable_and_a_constant_schedule_changes_nothing(name):
    opt = ENTRIES[name]()
    scheduled = []
    for stage in opt.stages:
        for key, value in stage.options:
            if isinstance(value, float) and (stage.label, key) not in NOT_SCHEDULABLE:
                assert key in stage.schedulable, f"{stage.label}.{key} is real-valued but not schedulable"
        for key in stage.schedulable:
            value = stage.option(key)
            if not callable(value) and value is not None:  # (None: the option is off, e.g. consistent_rms)
                stage = stage._with_option(key, lambda count, v=value: jnp.asarray(v, jnp.float32))
        assert stage.scheduled == {key for key in stage.schedulable if stage.option(key) is not None}
        scheduled.append(stage)
    for inner in _stages(opt):
        for key, value in inner.options:
            if isinstance(value, float) and (inner.label, key) not in NOT_SCHEDULABLE:
                assert key in inner.schedulable, f"{inner.label}.{key} is real-valued but not schedulable"
    with_schedules = ux.Update(scheduled)
    constant, _ = _run(opt, 3, jnp.float32, jit=False)
    schedule, _ = _run(with_schedules, 3, jnp.float32, jit=False)
    for a, b in zip(jax.tree.leaves(constant), jax.tree.leaves(schedule)):
        # A Python float's 1 - b is rounded once from double precision, a float32 schedule's in float32.
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=SCHEDULED_ATOL.get(name, 1e-6))


#: Where that last bit travels further: Shampoo's inverse roots of its statistics (on an AMD EPYC, 6.6e-6 on a
#: param of 0.19 after 3 steps).
SCHEDULED_ATOL = {"scale_by_shampoo": 2e-5}


@pytest.mark.parametrize("name", NAMES)
def test_value_semantics(name):
    opt = ENTRIES[name]()
    assert opt == ENTRIES[name]()
    assert hash(opt) == hash(ENTRIES[name]())
    assert pickle.loads(pickle.dumps(opt)) == opt
    assert repr(opt).split("(")[0] in {s.label for s in opt.stages} | {"scale_by_adam"}
    init_fn, update_fn = opt
    params = nested_tree()
    state = init_fn(params)
    grads = updates_for(opt, nested_tree(seed=1))
    assert jax.tree.structure(update_fn(grads, state, params, loss=LOSS)[1]) == jax.tree.structure(state)
    with pytest.raises(AttributeError):
        opt.stages = ()


@pytest.mark.parametrize("name", sorted(NEEDS_PARAMS))
def test_stages_needing_params_say_so_by_name(name):
    opt = ENTRIES[name]()
    with pytest.raises(ValueError, match=f"{name} needs params"):
        opt.update(nested_tree(seed=1), opt.init(nested_tree()), loss=LOSS)


PER_PARAM = [n for n in NAMES if n not in ANY_TREE]


@pytest.mark.parametrize("name", PER_PARAM)
def test_mismatched_update_tree_names_the_first_differing_path(name):
    opt = ENTRIES[name]()
    params = nested_tree()
    grads = nested_tree(seed=1)
    grads["dense"]["extra"] = jnp.ones(2)
    with pytest.raises(ValueError, match=r"\['dense'\]\['extra'\]"):
        opt.update(grads, opt.init(params), params, loss=LOSS)


class _Scalars(NamedTuple):
    a: jax.Array
    b: jax.Array


@pytest.mark.parametrize("name", NAMES)
def test_scalars_and_namedtuple_containers(name):
    opt = ENTRIES[name]()
    params = _Scalars(jnp.asarray(1.5), jnp.asarray([0.5, -2.0]))
    grads = updates_for(opt, _Scalars(jnp.asarray(0.25), jnp.asarray([1.0, 3.0])))
    updates, _ = opt.update(grads, opt.init(params), params, loss=LOSS)
    assert isinstance(updates, _Scalars) and updates.a.shape == ()
    assert np.all(np.isfinite(updates.b))


# --------------------------------------------------------------------------
# Per-example entries (registry.PER_EXAMPLE): their updates carry a leading axis of examples, which they reduce.
# The checks above feed them ``updates_for(opt, grads)`` and hold their outputs to the params' shapes; these check
# what only they have.


@pytest.mark.parametrize("name", sorted(PER_EXAMPLE))
def test_per_example_entries_compose_once_and_with_the_stages_after_them(name):
    """A pipeline reduces its examples once: the entry twice is refused by name. Followed by a stateful and a
    stateless stage, it equals running them one after the other, step after step."""
    opt = ENTRIES[name]()
    params = nested_tree()
    with pytest.raises(ValueError, match=f"{name} and {name} both take per-example updates"):
        ux.compose(opt, opt).update(updates_for(opt, nested_tree(seed=1)), ux.compose(opt, opt).init(params), params)
    after = ux.trace(decay=0.5).scale(0.5)
    both = ux.compose(opt, after)
    state, first_state, second_state = both.init(params), opt.init(params), after.init(params)
    for t in range(3):
        grads = updates_for(opt, nested_tree(seed=t + 1))
        updates, state = both.update(grads, state, params, loss=LOSS)
        first, first_state = opt.update(grads, first_state, params, loss=LOSS)
        expected, second_state = after.update(first, second_state, params)
        for x, y in zip(jax.tree.leaves(updates), jax.tree.leaves(expected)):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7, err_msg=f"step {t + 1}")


@pytest.mark.parametrize("name", sorted(PER_EXAMPLE))
def test_per_example_entries_name_the_leaf_without_the_examples_axis(name):
    opt = ENTRIES[name]()
    params = {"w": jnp.ones((2, 3)), "s": jnp.ones(())}
    state = opt.init(params)
    with pytest.raises(ValueError, match=rf"^{name}: it takes per-example updates, .* but updates\['s'\] is 0-d"):
        opt.update({"w": jnp.ones((4, 2, 3)), "s": jnp.ones(())}, state)
    with pytest.raises(ValueError, match=rf"^{name}: .* updates\['s'\] has 4 examples, updates\['w'\] has 5"):
        opt.update({"w": jnp.ones((5, 2, 3)), "s": jnp.ones(4)}, state)
    with pytest.raises(ValueError, match=r"updates do not fit params: at \['w'\] params have shape \(2, 3\), "
                                         r"updates have shape \(3, 2\) per example"):
        opt.update({"w": jnp.ones((4, 3, 2)), "s": jnp.ones(4)}, state, params)
    updates, _ = jax.jit(opt.update)({"w": jnp.ones((4, 2, 3)), "s": jnp.ones(4)}, state, params)
    assert jax.tree.map(jnp.shape, updates) == {"w": (2, 3), "s": ()}
