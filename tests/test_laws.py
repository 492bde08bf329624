"""The printed form is the identity: equal repr <=> ``==`` (same hash) => the same numbers.

A corpus of update objects is built every way the API allows (the four pipe
forms, ``compose``, ``toolz.thread_first``, pickling, pytree round trips)
from recipes that include the traps of the past: a wrapper composed after
stages, a wrapper around part of a pipeline, options equal in value but not
in type. Every pair is checked. Hypothesis then draws random pipelines, with
wrappers nested at random depths, and checks the same laws.
"""

from __future__ import annotations

import functools
import itertools
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import toolz
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import updax as ux

# --------------------------------------------------------------------------
# Recipes: ("stage", name, args, kwargs) or ("wrap", name, inner recipe, args, kwargs). A wrap step appends
# a wrapper around its inner recipe; with an empty inner recipe it wraps the steps before it.


def _affine(updates, params, *, scale, shift):
    return jax.tree.map(lambda g: g * scale + shift, updates)


def _soft_sign(updates, params):
    return jax.tree.map(lambda g: g / (1.0 + jnp.abs(g)), updates)


@ux.combinator
def affine(scale=1.0, shift=0.0):
    """A user combinator with two numeric options."""
    return ux.stateless(_affine, name="affine_shift", options={"scale": float(scale), "shift": float(shift)},
                        schedulable=("scale", "shift"))


@ux.combinator
def soft_sign():
    """A user combinator with no options and an unnamed stage."""
    return ux.stateless(_soft_sign)


def S(name, *args, **kwargs):  # noqa: N802  (a recipe step reads like a call)
    return ("stage", name, args, kwargs)


def W(name, inner, *args, **kwargs):  # noqa: N802
    return ("wrap", name, tuple(inner), args, kwargs)


def _factory(name):
    return {"affine": affine, "soft_sign": soft_sign}.get(name) or getattr(ux, name)


RECIPES = {
    "adam |> scale": [S("scale_by_adam", b1=0.8), S("scale", -0.1)],
    "adam |> scale(int)": [S("scale_by_adam", b1=0.8), S("scale", -1)],
    "adam |> scale(float)": [S("scale_by_adam", b1=0.8), S("scale", -1.0)],
    "adam |> scale(np.float32)": [S("scale_by_adam", b1=0.8), S("scale", np.float32(-1.0))],
    "adam |> scale(f32 array)": [S("scale_by_adam", b1=0.8), S("scale", jnp.asarray(-1.0, jnp.float32))],
    "clip |> trace, accumulated": [W("accumulate_gradients", [S("clip", 1.0), S("trace", 0.5)], 2)],
    "clip, then trace accumulated": [S("clip", 1.0), W("accumulate_gradients", [S("trace", 0.5)], 2)],
    "accumulate raw, then clip |> trace": [W("accumulate_gradients", [], 2), S("clip", 1.0), S("trace", 0.5)],
    "adam guarded": [W("apply_if_finite", [S("scale_by_adam"), S("scale", -0.1)], 2)],
    "adam, scale guarded": [S("scale_by_adam"), W("apply_if_finite", [S("scale", -0.1)], 2)],
    "adam unguarded": [S("scale_by_adam"), S("scale", -0.1)],
    "nested wrappers": [W("accumulate_gradients", [W("apply_if_finite", [S("trace", 0.5)], 1)], 2)],
    "nested wrappers, swapped": [W("apply_if_finite", [W("accumulate_gradients", [S("trace", 0.5)], 2)], 1)],
    "masked trace": [W("masked", [S("trace", 0.5)], {"w": True, "b": False})],
    "masked trace, other mask": [W("masked", [S("trace", 0.5)], {"w": False, "b": True})],
    "user affine": [S("affine", 2.0, 0.5), S("soft_sign")],
    "user affine, swapped options": [S("affine", 0.5, 2.0), S("soft_sign")],
    "zero": [S("scale", 0.0)],
    "negative zero": [S("scale", -0.0)],
    "identity": [],
    "identity stage": [S("identity")],
    "schedule-free sgd": [W("schedule_free", [S("scale_by_learning_rate", 0.1)], 0.1, b1=0.5)],
    "decayed sgd": [S("add_decayed_weights", 0.1), S("scale_by_learning_rate", 0.1)],
}


# --------------------------------------------------------------------------
# Builders: every way to turn a recipe into an update object


def fluent(recipe):
    opt = ux.identity()
    for step in recipe:
        if step[0] == "stage":
            _, name, args, kwargs = step
            opt = getattr(opt, name)(*args, **kwargs)  # user combinators are methods too
        else:
            _, name, inner, args, kwargs = step
            opt = ux.compose(opt, getattr(fluent(inner), name)(*args, **kwargs))
    return opt


def leading_parent(recipe):
    opt = ux.identity()
    for step in recipe:
        if step[0] == "stage":
            _, name, args, kwargs = step
            opt = _factory(name)(opt, *args, **kwargs)
        else:
            _, name, inner, args, kwargs = step
            opt = ux.compose(opt, getattr(ux, name)(leading_parent(inner), *args, **kwargs))
    return opt


def composed(recipe):
    """Each step built alone, then composed; a wrapper is built empty and composed after what it wraps."""
    parts = []
    for step in recipe:
        if step[0] == "stage":
            _, name, args, kwargs = step
            parts.append(_factory(name)(*args, **kwargs))
        else:
            _, name, inner, args, kwargs = step
            parts.append(ux.compose(composed(inner), getattr(ux, name)(*args, **kwargs)))
    return ux.compose(*parts)


def piped(recipe):
    opt = ux.identity()
    for step in recipe:
        if step[0] == "stage":
            _, name, args, kwargs = step
            opt = opt.pipe(_factory(name), *args, **kwargs)
        else:
            _, name, inner, args, kwargs = step
            opt = ux.compose(opt, piped(inner).pipe(getattr(ux, name), *args, **kwargs))
    return opt


def threaded(recipe):
    forms = []
    for step in recipe:
        if step[0] == "stage":
            _, name, args, kwargs = step
            forms.append((functools.partial(_factory(name), **kwargs), *args))
        else:
            _, name, inner, args, kwargs = step
            built = toolz.thread_first(threaded(inner), (functools.partial(getattr(ux, name), **kwargs), *args))
            forms.append((ux.compose, built))
    return toolz.thread_first(ux.identity(), *forms)


def pickled(recipe):
    return pickle.loads(pickle.dumps(fluent(recipe)))


def unflattened(recipe):
    leaves, treedef = jax.tree.flatten(fluent(recipe))
    return jax.tree.unflatten(treedef, leaves)


def mapped(recipe):
    return jax.tree.map(lambda x: x, fluent(recipe))


BUILDERS = [fluent, leading_parent, composed, piped, threaded, pickled, unflattened, mapped]


# --------------------------------------------------------------------------
# Numbers: a fingerprint of what an object computes


PARAMS = {"w": jnp.array([0.5, -1.0, 2.0]), "b": jnp.array([0.1])}
GRADS = [{"w": jnp.array([3.0, -1.0, 0.5]), "b": jnp.array([2.0])},
         {"w": jnp.array([-1.0, jnp.nan, 1.0]), "b": jnp.array([0.5])},
         {"w": jnp.array([0.25, 2.0, -3.0]), "b": jnp.array([-1.0])},
         {"w": jnp.array([1.0, 1.0, 1.0]), "b": jnp.array([4.0])}]


def numbers(opt) -> bytes:
    """The bytes of every update and state leaf over a few steps (one with a NaN)."""
    state, params, out = opt.init(PARAMS), PARAMS, []
    for grads in GRADS:
        updates, state = opt.update(grads, state, params)
        params = ux.apply_updates(params, updates)
        out += [np.asarray(x).tobytes() for x in jax.tree.leaves((updates, state))]
    return b"".join(out)


def check_laws(objects):
    """equal repr <=> == ; == => same hash and same numbers."""
    fingerprints = [numbers(o) for o in objects]
    for (a, fa), (b, fb) in itertools.combinations(zip(objects, fingerprints), 2):
        same_repr, equal = repr(a) == repr(b), a == b
        assert same_repr == equal, (repr(a), repr(b))
        if equal:
            assert hash(a) == hash(b), repr(a)
            assert fa == fb, f"equal objects computed different numbers: {a!r}"


# --------------------------------------------------------------------------
# The corpus


def test_every_builder_gives_the_same_object_for_a_recipe():
    for label, recipe in RECIPES.items():
        built = [build(recipe) for build in BUILDERS]
        assert all(b == built[0] for b in built), (label, [repr(b) for b in built])
        assert len({repr(b) for b in built}) == 1 and len({hash(b) for b in built}) == 1, label


def test_the_laws_hold_over_the_corpus():
    corpus = [build(recipe) for recipe in RECIPES.values() for build in (fluent, composed, pickled)]
    check_laws(corpus)


@pytest.mark.parametrize("a, b, differ", [
    ("clip |> trace, accumulated", "clip, then trace accumulated", True),
    ("clip, then trace accumulated", "accumulate raw, then clip |> trace", True),
    ("adam guarded", "adam, scale guarded", True),
    ("adam guarded", "adam unguarded", True),
    ("nested wrappers", "nested wrappers, swapped", True),
    ("zero", "negative zero", True),
    ("adam |> scale(int)", "adam |> scale(float)", False),
    ("adam |> scale(np.float32)", "adam |> scale(f32 array)", False),
    ("adam |> scale(float)", "adam |> scale(f32 array)", True),
    ("identity", "identity stage", False),
])
def test_the_traps_print_as_what_they_compute(a, b, differ):
    x, y = fluent(RECIPES[a]), fluent(RECIPES[b])
    assert (repr(x) != repr(y)) == differ and (x != y) == differ


def test_guarded_and_unguarded_adam_compute_differently():
    """The trap of the issue: the wrapper composed after Adam guards it (Adam's state stays finite)."""
    guarded, unguarded = composed(RECIPES["adam guarded"]), composed(RECIPES["adam unguarded"])
    assert numbers(guarded) != numbers(unguarded)
    state = guarded.init(PARAMS)
    for grads in GRADS[:2]:
        _, state = guarded.update(grads, state, PARAMS)
    assert np.all(np.isfinite(guarded.get_state(state, "apply_if_finite/scale_by_adam.mu")["w"]))


# --------------------------------------------------------------------------
# Random pipelines

_NUMBER = st.sampled_from([0.0, -0.0, 0.5, 1.0, 1, 2, np.float32(0.5), jnp.asarray(0.5, jnp.float32)])
_UNIT = st.sampled_from([0.0, 0.5, 0.9])

_STAGES = st.one_of(
    st.builds(lambda s: S("scale", s), _NUMBER),
    st.builds(lambda d, n: S("trace", d, n), _UNIT, st.booleans()),
    st.builds(lambda d: S("clip", d), st.sampled_from([0.5, 1.0, 1])),
    st.builds(lambda b1: S("scale_by_adam", b1=b1), _UNIT),
    st.builds(lambda d: S("add_decayed_weights", d), st.sampled_from([0.0, 0.1])),
    st.builds(lambda a, b: S("affine", a, b), _NUMBER, _NUMBER),
    st.just(S("soft_sign")),
    st.just(S("scale_by_sign")),
    st.just(S("identity")),
)


def _wrapper(inner):
    return st.one_of(
        st.builds(lambda r, n: W("apply_if_finite", r, n), inner, st.sampled_from([0, 2])),
        st.builds(lambda r, k: W("accumulate_gradients", r, k), inner, st.sampled_from([1, 2])),
        st.builds(lambda r, m: W("masked", r, {"w": m, "b": not m}), inner, st.booleans()),
    )


_RECIPES = st.recursive(st.lists(_STAGES, max_size=3),
                        lambda inner: st.lists(st.one_of(_STAGES, _wrapper(inner)), max_size=3), max_leaves=6)
_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(_RECIPES, st.sampled_from(BUILDERS), st.sampled_from(BUILDERS))
def test_any_two_builds_of_a_random_pipeline_are_one_object(recipe, build_a, build_b):
    a, b = build_a(recipe), build_b(recipe)
    assert a == b and repr(a) == repr(b) and hash(a) == hash(b)
    assert numbers(a) == numbers(b)


@_SETTINGS
@given(st.lists(_RECIPES, min_size=2, max_size=4))
def test_the_laws_hold_for_random_pipelines(recipes):
    check_laws([fluent(recipe) for recipe in recipes] + [composed(recipe) for recipe in recipes])
