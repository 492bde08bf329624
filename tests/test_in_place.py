"""State fields declared ``state_last`` are written after the params' update: in place, to the same numbers.

With the params and the state donated, XLA updates both in place. When the
params' update reads a state field's old value (Lion's momentum), XLA copies
that field first unless its new value is computed after the params' kernel
(updax._in_place). The tests read XLA's own compiled program: its copies and
its temporary buffers. optax's steps for the same rules make those copies,
which is the counter-case here.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import updax as ux
from updax import _in_place


def params(dtype=jnp.float32):
    rng = np.random.default_rng(0)

    def arr(*shape):
        return jnp.asarray(rng.normal(size=shape).astype(np.float32), dtype)

    return {"w": arr(64, 128), "layers": [arr(32, 16), (arr(128), None)], "s": arr()}


def grads_like(tree, t):
    return jax.tree.map(lambda p: jnp.cos(p * (t + 1)).astype(p.dtype), tree)


#: The optimizers with a stage that declares state_last, by name.
DECLARING = sorted(name for name in ux.optimizers.__all__
                   if name not in ("lbfgs", "polyak_sgd", "dpsgd")  # (they need an objective, a loss, examples)
                   and any(stage.state_last for stage in getattr(ux.optimizers, name)(1e-3).stages))
#: The optimizers written in place by computing a state field once, before the params' kernel
#: (updax._in_place.computed_once), and all of them.
COMPUTED_ONCE = ["cocob"]
IN_PLACE = sorted(DECLARING + COMPUTED_ONCE)

#: optax's optimizer for each: the same rule, which copies the state.
OPTAX = {"adabelief": optax.adabelief, "adan": optax.adan, "lion": optax.lion, "optimistic_adam": optax.optimistic_adam_v2,
         "optimistic_gradient_descent": optax.optimistic_gradient_descent, "adopt": optax.contrib.adopt,
         "dadapt_adamw": optax.contrib.dadapt_adamw, "cocob": optax.contrib.cocob}


def step_fn(opt, apply=ux.apply_updates):
    def step(p, s, g):
        updates, s = opt.update(g, s, p)
        return apply(p, updates), s

    return jax.jit(step, donate_argnums=(0, 1))


def copies(opt, p, apply=ux.apply_updates):
    """The full-size arrays the compiled, donated step copies (shapes of copy instructions with 2+ elements)."""
    text = step_fn(opt, apply).lower(p, opt.init(p), p).compile().as_text()
    entry = text[text.index("ENTRY"):]
    return [shape for shape in re.findall(r"= (?:f32|bf16)\[([\d,]*)\]\S* copy\(", entry) if shape and shape != "1"]


def temporaries(opt, p, apply=ux.apply_updates):
    """The bytes of XLA's temporary buffers for the compiled, donated step."""
    return step_fn(opt, apply).lower(p, opt.init(p), p).compile().memory_analysis().temp_size_in_bytes


def lowered(opt, p, apply=ux.apply_updates):
    """The step's program as JAX hands it to XLA."""
    return step_fn(opt, apply).lower(p, opt.init(p), p).as_text()


def _unordered(stages, old, new, params, updates):
    return new


def switch_order_off(patch):
    """Switches the order off (``patch``: pytest's monkeypatch): after the params' update and after a reduction."""
    patch.setattr(_in_place, "after_params", _unordered)
    patch.setattr(_in_place, "after_reading", lambda token, old, new: new)
    patch.setattr(_in_place, "computed_once", list)


def test_the_declaring_optimizers_are_the_ones_optax_copies_for():
    assert IN_PLACE == sorted(OPTAX)
    for name in IN_PLACE:
        assert copies(OPTAX[name](1e-3), params(), optax.apply_updates), name  # optax's step copies state


@pytest.mark.parametrize("apply", [ux.apply_updates, optax.apply_updates, eqx.apply_updates],
                         ids=["updax", "optax", "equinox"])
@pytest.mark.parametrize("name", IN_PLACE)
def test_the_state_is_updated_in_place(name, apply, monkeypatch):
    opt = getattr(ux.optimizers, name)(1e-3)
    assert copies(opt, params(), apply) == []
    ordered = temporaries(opt, params(), apply)
    switch_order_off(monkeypatch)
    assert ordered < temporaries(opt, params(), apply)  # (the copies were temporary buffers)


@pytest.mark.parametrize("name", IN_PLACE)
def test_without_the_order_xla_copies_the_state(name, monkeypatch):
    """The counter-case: with the ordering switched off, the same step copies state, as optax's does."""
    switch_order_off(monkeypatch)
    assert copies(getattr(ux.optimizers, name)(1e-3), params())


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("name", IN_PLACE)
def test_the_numbers_are_the_same_bit_for_bit(name, dtype, monkeypatch):
    def run():
        opt = getattr(ux.optimizers, name)(1e-2)
        step = step_fn(opt)
        p, s = params(dtype), opt.init(params(dtype))
        for t in range(3):
            p, s = step(p, s, grads_like(params(dtype), t))
        return p, s

    assert copies(getattr(ux.optimizers, name)(1e-2), params(dtype)) == []  # (narrow params too)
    ordered = run()
    switch_order_off(monkeypatch)
    plain = run()
    for a, b in zip(jax.tree.leaves(ordered), jax.tree.leaves(plain)):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_scheduled_and_held_options_keep_the_order():
    """A stage whose options are scheduled or held keeps its own state inside a ScheduledState."""
    scheduled = ux.scale_by_lion(b1=ux.schedules.linear_schedule(0.8, 0.9, 10)).scale(-1e-3)
    held = ux.hyperparams_in_state(ux.optimizers.lion(1e-3))
    for opt in (scheduled, held):
        assert copies(opt, params()) == []


def test_the_same_stage_inside_a_wrapper_or_optax_chain_keeps_xla_order(monkeypatch):
    """Inside a wrapper, or an optax pipeline (``ux.to_optax``), the updates are not the ones added to the params:
    ordering after them would read the old params, and XLA would copy those too. The program is the unordered one
    (where for the bare optimizer it is not)."""
    bare = ux.optimizers.lion(1e-3)
    wrapped = bare.apply_if_finite()
    chained = optax.chain(ux.to_optax(bare), optax.scale(0.5))
    ordered = [lowered(bare, params()), lowered(wrapped, params()), lowered(chained, params(), optax.apply_updates)]
    switch_order_off(monkeypatch)
    unordered = [lowered(bare, params()), lowered(wrapped, params()), lowered(chained, params(), optax.apply_updates)]
    assert ordered[0] != unordered[0]
    assert ordered[1:] == unordered[1:]


def test_unwrapped_inside_optax_chain_the_params_are_copied_too():
    """Documented in docs/guide.md and docs/performance.md: an updax object put into ``optax.chain`` bare, followed
    by another transform, orders its state after updates that are not the final ones, so XLA copies the params as
    well as the state; wrapped with ``ux.to_optax`` it copies only the state, as optax's own Lion does."""
    bare = optax.chain(ux.scale_by_lion(), optax.scale(-1e-3))
    wrapped = optax.chain(ux.to_optax(ux.scale_by_lion()), optax.scale(-1e-3))
    state_copies = sorted(["64,128", "32,16", "128"])
    assert sorted(copies(wrapped, params(), optax.apply_updates)) == state_copies
    assert sorted(copies(optax.lion(1e-3), params(), optax.apply_updates)) == state_copies
    assert sorted(copies(bare, params(), optax.apply_updates)) == sorted(state_copies * 2)


def test_updates_applied_otherwise_copy_the_params_instead():
    """Documented in docs/performance.md: with ``p - (-u)`` the params' kernel is not the one the state waits for,
    so XLA copies the params; the numbers are the same."""
    opt = ux.optimizers.lion(1e-3)

    def apply(p, u):
        return jax.tree.map(lambda a, b: a - (-b), p, u)

    assert sorted(copies(opt, params(), apply)) == sorted(["64,128", "32,16", "128"] * 2)
    p = params()
    got, _ = step_fn(opt, apply)(p, opt.init(p), grads_like(p, 0))
    want, _ = step_fn(opt)(params(), opt.init(params()), grads_like(params(), 0))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(a, b)


def test_eagerly_nothing_changes():
    opt = ux.optimizers.lion(1e-2)
    p = params()
    eager = opt.update(grads_like(p, 0), opt.init(p), p)
    jitted = jax.jit(opt.update)(grads_like(p, 0), opt.init(p), p)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


class _PairState(NamedTuple):
    a: object
    n: jax.Array


def _pair_init(params):
    return _PairState(a=jax.tree.map(jnp.zeros_like, params), n=jnp.zeros([], jnp.int32))


def _pair_apply(updates, state, params):
    return jax.tree.map(lambda g, a: g + a, updates, state.a), _PairState(a=updates, n=state.n + 1)


def test_the_declaration_is_checked_where_the_stage_is_built():
    with pytest.raises(TypeError, match=r"state_last must be a collection of field names, not a string"):
        ux.stateful(_pair_init, _pair_apply, state_last="a")
    with pytest.raises(TypeError, match=r"state_last=...\): 3 are not field names"):
        ux.stateful(_pair_init, _pair_apply, state_last=(3,))
    with pytest.raises(ValueError, match=r"a wrapper stage's state is its pipeline's"):
        ux.stateful(_pair_init, _pair_apply, options={"inner": ux.identity()}, wraps="inner", state_last=("a",))
    stage = ux.stateful(_pair_init, _pair_apply, name="pair_in_place", state_last=("a",)).stages[0]
    assert stage.state_last == frozenset({"a"})
    with pytest.raises(ValueError, match=r"stage 'pair_in_place' is declared two ways"):
        ux.stateful(_pair_init, _pair_apply, name="pair_in_place", state_last=("n",))


def test_a_user_stage_is_ordered_and_a_wrong_field_is_named(monkeypatch):
    p = params()
    opt = ux.stateful(_pair_init, _pair_apply, name="pair_previous", state_last=("a",)).scale(-0.1)
    assert copies(opt, p) == []
    with monkeypatch.context() as patched:
        switch_order_off(patched)
        # The counter-case, unordered: the old gradient is copied before the new one is copied into its buffer.
        assert sorted(copies(opt, p)) == sorted(["64,128", "32,16", "128"] * 2)
    missing = ux.stateful(_pair_init, _pair_apply, name="pair_missing", state_last=("b",))
    with pytest.raises(ValueError, match=r"pair_missing: state_last names \['b'\], which its state _PairState does "
                                         r"not have \(its fields: \['a', 'n'\]\)"):
        step_fn(missing)(p, missing.init(p), p)
    with pytest.raises(ValueError, match=r"pair_missing: state_last names \['b'\]"):  # (eagerly too)
        missing.update(p, missing.init(p), p)
    scalar = ux.stateful(_pair_init, _pair_apply, name="pair_scalar", state_last=("n",))
    with pytest.raises(ValueError, match=r"pair_scalar: state_last field 'n' must be a tree shaped like the params"):
        step_fn(scalar)(p, scalar.init(p), p)
