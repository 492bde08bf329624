"""Declared domains of the layer-wise, orthogonalising, privacy, flat-state, utility, skipping and wrapper stages
and of ``from_optax`` (issue 38): each option refused by name when the object is built, and on the paths that
let a value in afterwards (a tree map, ``replace_state`` of a held option or a state field, the eager step)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import updax as ux
from updax._stage import Stage

PARAMS = {"w": jnp.array([[0.5, -1.0], [2.0, 0.25]]), "b": jnp.array([0.1, -0.3])}
GRADS = {"w": jnp.array([[0.3, -0.2], [0.1, 0.4]]), "b": jnp.array([-0.5, 0.2])}


def _refused(exc, text, build):
    with pytest.raises(exc, match="^" + re.escape(text) + "$"):
        build()


# --- the constructor: one message per option --------------------------------------------------------------

REFUSALS = [
    (ValueError, "scale_by_trust_ratio(min_norm=-1.0): min_norm must be in [0, inf)",
     lambda: ux.scale_by_trust_ratio(min_norm=-1.0)),
    (ValueError, "scale_by_trust_ratio(trust_coefficient=nan): trust_coefficient must be a finite number",
     lambda: ux.scale_by_trust_ratio(trust_coefficient=float("nan"))),
    (ValueError, "scale_by_novograd(b2=1.0): b2 must be in [0, 1)", lambda: ux.scale_by_novograd(b2=1.0)),
    (TypeError, "scale_by_novograd(mu_dtype='int32'): mu_dtype must be None or a floating dtype",
     lambda: ux.scale_by_novograd(mu_dtype="int32")),
    (ValueError, "scale_by_newton_schulz(ns_steps=101): ns_steps must be an integer in [1, 100] (each iteration "
                 "is unrolled into the compiled step)", lambda: ux.scale_by_newton_schulz(ns_steps=101)),
    (TypeError, "scale_by_newton_schulz(ns_coeffs=(1.0, 2.0)): ns_coeffs must be a tuple of three finite real "
                "numbers", lambda: ux.scale_by_newton_schulz(ns_coeffs=(1.0, 2.0))),
    (ValueError, "scale_by_muon(ns_coeffs=(1.0, inf, 2.0)): ns_coeffs must be a tuple of three finite real numbers",
     lambda: ux.scale_by_muon(ns_coeffs=(1.0, float("inf"), 2.0))),
    (TypeError, "scale_by_muon(ns_coeffs=(1.0, 'a', 2.0)): ns_coeffs must be a tuple of three finite real numbers",
     lambda: ux.scale_by_muon(ns_coeffs=(1.0, "a", 2.0))),
    (ValueError, "scale_by_muon(beta=1.0): beta must be in [0, 1)", lambda: ux.scale_by_muon(beta=1.0)),
    (TypeError, "scale_by_muon(adaptive=1): adaptive must be True or False", lambda: ux.scale_by_muon(adaptive=1)),
    (TypeError, "scale_by_shape(weight_dimension_numbers=3): weight_dimension_numbers must be a pytree of "
                "MuonDimensionNumbers or None, or a function of the params returning one; at the root it has int 3",
     lambda: ux.scale_by_shape(3)),
    (ValueError, "per_example_global_norm_clip(l2_norm_clip=-1.0): l2_norm_clip must be in [0, inf)",
     lambda: ux.per_example_global_norm_clip(-1.0)),
    (ValueError, "per_example_clipped_sum(l2_norm_clip=-1.0): l2_norm_clip must be in [0, inf)",
     lambda: ux.per_example_clipped_sum({"w": jnp.ones((2, 1))}, -1.0)),
    (ValueError, "differentially_private_aggregate(noise_multiplier=-0.5): noise_multiplier must be in [0, inf)",
     lambda: ux.differentially_private_aggregate(noise_multiplier=-0.5)),
    (ValueError, "differentially_private_aggregate(key=-1): key must be an int seed in [0, 2**32), a PRNG key "
                 "(jax.random.key) or its raw data (jax.random.key_data); seeds outside it wrap onto other seeds' keys",
     lambda: ux.differentially_private_aggregate(key=-1)),
    (ValueError, "flat_state(max_shared=0): max_shared must be a positive integer",
     lambda: ux.scale(-1.0).flat_state(max_shared=0)),
    (TypeError, "flat_state(max_join_size=1.5): max_join_size must be a non-negative integer",
     lambda: ux.scale(-1.0).flat_state(max_join_size=1.5)),
    (ValueError, "flat_state(min_joined=0): min_joined must be a positive integer",
     lambda: ux.scale(-1.0).flat_state(min_joined=0)),
    (ValueError, "apply_if_finite(max_consecutive_errors=-1): max_consecutive_errors must be a non-negative integer",
     lambda: ux.scale(-1.0).apply_if_finite(-1)),
    (ValueError, "lookahead(sync_period=0): sync_period must be a positive integer",
     lambda: ux.scale(-1.0).lookahead(0)),
    (ValueError, "lookahead(slow_step_size=0.0): slow_step_size must be in (0, 1]",
     lambda: ux.scale(-1.0).lookahead(2, 0.0)),
    (TypeError, "lookahead(reset_state=1): reset_state must be True or False",
     lambda: ux.scale(-1.0).lookahead(2, reset_state=1)),
    (ValueError, "sam(rho=-0.1): rho must be in [0, inf)", lambda: ux.scale(-1.0).sam(-0.1)),
    (TypeError, "sam(adversary=3): adversary must be None or an update object",
     lambda: ux.scale(-1.0).sam(adversary=3)),
    (ValueError, "scale_by_optimistic_gradient(beta=-1.0): beta must be in [0, inf)",
     lambda: ux.scale_by_optimistic_gradient(beta=-1.0)),
    (ValueError, "skip_large_updates(max_squared_norm=-1.0): max_squared_norm must be in [0, inf)",
     lambda: ux.skip_large_updates(-1.0)),
    (TypeError, "snapshot(measure=1): measure must be callable or None", lambda: ux.snapshot(measure=1)),
    (ValueError, "snapshot(name='class'): name must be a Python identifier other than a keyword, stateless and "
                 "stateful (state paths use it)", lambda: ux.snapshot("class")),
    (TypeError, "from_optax(transformation=3): transformation must be an optax transformation (an object with init "
                "and update functions)", lambda: ux.from_optax(3)),
]


@pytest.mark.parametrize("exc, text, build", REFUSALS, ids=[text.partition(":")[0] for _, text, _ in REFUSALS])
def test_each_option_is_refused_by_name(exc, text, build):
    _refused(exc, text, build)


def test_a_mask_is_bools_only_and_a_0d_boolean_array_is_the_bool_it_holds():
    for build in (lambda m: ux.scale_by_trust_ratio(mask=m), lambda m: ux.scale_by_novograd(mask=m)):
        assert build({"w": jnp.array(True), "b": np.bool_(False)}) == build({"w": True, "b": False})
        with pytest.raises(TypeError, match=r"mask must be a pytree of bools .*; at mask\['b'\] it has int 0$"):
            build({"w": True, "b": 0})
        with pytest.raises(TypeError, match=r"has a boolean array of shape \(2,\) at mask\['b'\]: a mask selects "
                                            r"whole leaves"):
            build({"w": True, "b": jnp.array([True, False])})


# --- the paths after the constructor ------------------------------------------------------------------------


def test_a_tree_map_out_of_the_domain_is_refused_when_the_object_is_used():
    """Before the declarations, a tree map made lookahead's slow step negative and the slow weights walked away."""
    opt = jax.tree.map(lambda x: -x, ux.scale(-1.0).lookahead(2, 0.5))
    with pytest.raises(ValueError, match=r"^lookahead\(slow_step_size=-0\.5\): slow_step_size must be in \(0, 1\] "
                                         r"\(an update object rebuilt by a tree map\)$"):
        opt.init(PARAMS)
    sam = jax.tree.map(lambda x: x - 1.0, ux.scale(-1.0).sam(0.5))  # rho = -0.5
    with pytest.raises(ValueError, match=r"^sam\(rho=-0\.5\): rho must be in \[0, inf\)"):
        sam.init(PARAMS)
    muon = jax.tree.map(lambda x: x * 2.0, ux.scale_by_muon(beta=0.6))  # beta = 1.2; ns_coeffs doubled: fine
    with pytest.raises(ValueError, match=r"^scale_by_muon\(beta=1\.2\): beta must be in \[0, 1\)"):
        muon.init(PARAMS)


def test_a_held_option_is_checked_by_replace_state_and_by_the_eager_step():
    opt = ux.hyperparams_in_state(ux.scale(-1.0).lookahead(3, 0.5))
    state = opt.init(PARAMS)
    with pytest.raises(ValueError, match=r"^lookahead\(sync_period=0\): sync_period must be a positive integer "
                                         r"\(written by replace_state\('lookahead\.sync_period'\)\)$"):
        opt.replace_state(state, "lookahead.sync_period", 0)
    with pytest.raises(ValueError, match=r"slow_step_size must be in \(0, 1\]"):
        opt.replace_state(state, "lookahead.slow_step_size", 1.5)
    state[-1].hyperparams["slow_step_size"] = jnp.float32(2.0)  # written behind updax's back
    with pytest.raises(ValueError, match=r"^lookahead\(slow_step_size=2\.0\): slow_step_size must be in \(0, 1\] "
                                         r"\(held in the state\)$"):
        opt.update(GRADS, state, PARAMS)


@pytest.mark.parametrize("opt, path, bad, text", [
    (ux.scale(-1.0).lookahead(2), "lookahead.steps_since_sync", -1, "must be a non-negative integer"),
    (ux.scale(-1.0).sam(0.1), "sam.steps_since_sync", -2, "must be a non-negative integer"),
    (ux.scale(-1.0).apply_if_finite(2), "apply_if_finite.notfinite_count", -1, "must be a non-negative integer"),
    (ux.scale(-1.0).apply_if_finite(2), "apply_if_finite.last_finite", 5, "must be True or False (or 1 or 0)"),
    (ux.zero_nans(), "zero_nans.found_nan", {"w": 2, "b": 0}, "must be True or False (or 1 or 0)"),
    (ux.scale_by_optimistic_gradient(), "scale_by_optimistic_gradient.is_initial_step", 3,
     "must be True or False (or 1 or 0)"),
    (ux.scale_by_muon(), "scale_by_muon.count", -1, "must be a non-negative integer"),
    (ux.scale_by_novograd(), "scale_by_novograd.nu", {"w": -1.0, "b": 0.0}, "must be in [0, inf)"),
    (ux.scale_by_novograd(), "scale_by_novograd.count", -4, "must be a non-negative integer"),
])
def test_a_state_field_refuses_what_it_cannot_hold(opt, path, bad, text):
    state = opt.init(PARAMS)
    with pytest.raises(ValueError, match=re.escape(text)):
        opt.replace_state(state, path, bad)


def test_a_stored_option_checks_again_to_itself_outside_the_registry():
    """The stages the registry builds at one setting, at others: masks, dimension numbers, a held optax
    transformation, an adversary, no max_shared."""
    built = [ux.scale_by_trust_ratio(mask={"w": jnp.array(True), "b": False}),
             ux.scale_by_novograd(decay=np.float32(0.1), mask=lambda p: jax.tree.map(lambda x: x.ndim == 2, p)),
             ux.scale_by_muon(ns_coeffs=[3, -4, 2], weight_dimension_numbers={"w": ux.MuonDimensionNumbers(0, 1),
                                                                              "b": None}),
             ux.scale_by_newton_schulz(weight_dimension_numbers=ux.MuonDimensionNumbers((0,), -1)),
             ux.from_optax(optax.sgd(0.1), "sgd"),
             ux.scale(-1.0).sam(adversary=ux.trace(0.5)),
             ux.scale(-1.0).flat_state(max_shared=None),
             ux.differentially_private_aggregate(key=jax.random.key(3)),
             ux.scale(-1.0).snapshot("kept", measure=ux.global_norm)]
    for opt in built:
        for stage in opt.stages:
            for key, _ in stage.options:
                domain = stage.declaration.domain(key)
                assert domain is not None, (stage.label, key)
                again = domain.check(stage.label, key, stage.option(key), schedulable=key in stage.schedulable)
                given = {k: stage.option(k) for k, _ in stage.options}  # (a static tree is stored frozen)
                rebuilt = Stage(stage.name, stage.init_fn, stage.apply_fn, {**given, key: again},
                                needs_params=stage.needs_params, wraps=stage.wraps, static=stage.static,
                                schedulable=stage.schedulable, per_example=stage.per_example,
                                elementwise=stage.elementwise, state_last=stage.state_last,
                                domains=dict(stage.declaration.domains), relations=stage.declaration.relations)
                assert rebuilt == stage, (stage.label, key)


# --- names ------------------------------------------------------------------------------------------------


def test_a_snapshot_cannot_take_a_name_of_updax_and_the_name_keeps_working():
    """A snapshot named from_optax took that name from ux.from_optax for the rest of the session: it is kept
    from import on now, as the catalogue's names are."""
    for name, original in (("trace", lambda: ux.trace(0.9)), ("from_optax", lambda: ux.from_optax(optax.sgd(0.1)))):
        with pytest.raises(ValueError, match=rf"^snapshot\(name='{name}'\): stage name '{name}' is updax's"):
            ux.scale(2.0).snapshot(name)
        opt = original()
        u, _ = opt.update(GRADS, opt.init(PARAMS))
        scale = 1.0 if name == "trace" else -0.1  # (the first step of a trace is the gradient)
        np.testing.assert_allclose(u["w"], scale * GRADS["w"], rtol=1e-6)


# --- numbers ----------------------------------------------------------------------------------------------


def test_skip_large_updates_takes_its_bound_as_a_number_of_any_kind_and_skips_by_the_closed_form():
    assert ux.skip_large_updates(np.float32(0.25)) == ux.skip_large_updates(jnp.asarray(0.25)) == \
        ux.skip_large_updates(0.25)
    skip = ux.skip_large_updates(0.25)  # ‖u‖² = 0.09 + 0.16 = 0.25: kept; a hair more: skipped
    assert not bool(skip({"w": jnp.array([0.3, 0.4])}, 0, None)[0])
    assert bool(skip({"w": jnp.array([0.3, 0.41])}, 0, None)[0])
    assert bool(skip({"w": jnp.array([jnp.nan])}, 0, None)[0])


def test_lamb_with_masks_given_as_0d_boolean_arrays_is_optaxs_under_jit():
    """The fused LAMB path (leaf by leaf under jit on the CPU) resolves a mask the Mask domain has stored."""
    params = {"a": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3), "b": jnp.array([0.5, -0.25, 2.0]),
              "c": jnp.array([[1.0, 2.0], [3.0, -4.0]])}
    mask = {"a": jnp.array(True), "b": np.bool_(False), "c": True}
    opt = ux.optimizers.lamb(0.05, eps=1e-6, eps_root=0.0, decay=0.1, mask=mask)
    ref = optax.lamb(0.05, eps=1e-6, eps_root=0.0, weight_decay=0.1, mask={"a": True, "b": False, "c": True})
    p1 = p2 = params
    s1, s2 = opt.init(p1), ref.init(p2)
    step1, step2 = jax.jit(opt.update), jax.jit(ref.update)
    for t in range(3):
        g = jax.tree.map(lambda p, t=t: jnp.sin(p * (t + 1.0)) + 0.1, p1)
        u1, s1 = step1(g, s1, p1)
        u2, s2 = step2(g, s2, p2)
        p1, p2 = ux.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    for k in params:
        np.testing.assert_allclose(p1[k], p2[k], rtol=1e-6, atol=1e-7)


def test_the_private_aggregate_keeps_optaxs_noise_on_a_tree_with_none_leaves():
    """Its leaves are numbered as optax numbers them (None not counted): a per-example stage cannot run inside
    partition or masked, so no two groups of one key meet there, and the numbers stay optax's."""
    params = {"a": jnp.zeros(3), "none": None, "b": jnp.zeros((2, 2))}
    examples = {"a": jnp.arange(6.0).reshape(2, 3), "none": None, "b": -jnp.arange(8.0).reshape(2, 2, 2)}
    opt = ux.differentially_private_aggregate(1.0, 0.7, key=11)
    ref = optax.contrib.differentially_private_aggregate(1.0, 0.7, key=jax.random.key(11))
    s1, s2 = opt.init(params), ref.init(params)
    for _ in range(2):
        u1, s1 = opt.update(examples, s1, params)
        u2, s2 = ref.update(examples, s2, params)
        for k in ("a", "b"):
            np.testing.assert_allclose(u1[k], u2[k], rtol=1e-6)
        assert u1["none"] is None
    dp = ux.differentially_private_aggregate(1.0, 1.0, key=0)
    split = {"w": jnp.zeros(3), "v": jnp.zeros(3)}
    per_example = {"w": jnp.ones((2, 3)), "v": jnp.ones((2, 3))}
    for opt in (ux.partition({"a": dp, "b": dp}, {"w": "a", "v": "b"}), dp.masked({"w": True, "v": False})):
        with pytest.raises(ValueError, match=r"per-example|shaped like the updates it gets"):
            opt.update(per_example, opt.init(split))
