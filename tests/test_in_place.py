"""State fields declared ``state_last`` are written after the params' update: in place, to the same numbers.

With the params and the state donated, XLA updates both in place. When the
params' update reads a state field's old value (Lion's momentum), XLA copies
that field first unless its new value is computed after the params' kernel
(updax._backend). The tests read XLA's own compiled program: its copies and
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
from compile_options import DEFAULT_COMPILE
from updax._backend import _apart, _half, _order


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
#: (updax._backend._apart.computed_once).
COMPUTED_ONCE = ["cocob"]
#: The optimizers written in place by tracing a step a second time for the params' kernel, which then reads the
#: state's new value rather than its old one (updax._backend._apart.stored_step); and all of them.
RECOMPUTED = ["schedule_free_adamw"]
IN_PLACE = sorted(DECLARING + COMPUTED_ONCE + RECOMPUTED)

#: optax's optimizer for each: the same rule, which copies the state.
OPTAX = {"adabelief": optax.adabelief, "adan": optax.adan, "lion": optax.lion, "optimistic_adam": optax.optimistic_adam_v2,
         "optimistic_gradient_descent": optax.optimistic_gradient_descent, "adopt": optax.contrib.adopt,
         "dadapt_adamw": optax.contrib.dadapt_adamw, "cocob": optax.contrib.cocob,
         "schedule_free_adamw": optax.contrib.schedule_free_adamw,
         "optimistic_adam_v2": optax.optimistic_adam_v2}
#: The declaring optimizers optax 0.2.8 does not have: the counter-case is updax's own step with the order off.
NOT_IN_OPTAX = ["mars_adamw", "mars_lion"]


def step_fn(opt, apply=ux.apply_updates):
    def step(p, s, g):
        updates, s = opt.update(g, s, p)
        return apply(p, updates), s

    return jax.jit(step, donate_argnums=(0, 1), compiler_options=DEFAULT_COMPILE)  # (a user's program)


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
    """Switches the order off (``patch``: pytest's monkeypatch): after the params' update, after a reduction, a
    value computed once and a step traced again from the stored state. (``accumulate_gradients``' step on every
    call and ``apply_if_finite``'s check traced apart stay: tests below switch them off on their own.)"""
    patch.setattr(_order, "after_params", _unordered)
    patch.setattr(_order, "after_reading", lambda token, old, new: new)
    patch.setattr(_apart, "computed_once", list)
    patch.setattr(_apart, "stored_step", lambda fn: None)


def test_the_declaring_optimizers_are_the_ones_optax_copies_for():
    assert IN_PLACE == sorted([*OPTAX, *NOT_IN_OPTAX])
    for name in OPTAX:
        assert copies(OPTAX[name](1e-3), params(), optax.apply_updates), name  # optax's step copies state


#: Each optimizer with updax's apply_updates; with optax's and Equinox's, one optimizer of each way of ordering
#: (a declared field, a value computed once, a step traced again): the order is the pipeline's, whichever function
#: adds the updates, so the other optimizers would repeat the same check at XLA's default compile (0.7 s each).
APPLIES = [(name, ux.apply_updates) for name in IN_PLACE] + [
    (name, apply) for apply in (optax.apply_updates, eqx.apply_updates) for name in ("lion", *COMPUTED_ONCE,
                                                                                     *RECOMPUTED)]


@pytest.mark.parametrize("name, apply", APPLIES,
                         ids=[f"{name}-{apply.__module__.split('.')[0]}" for name, apply in APPLIES])
def test_the_state_is_updated_in_place(name, apply, monkeypatch):
    opt = getattr(ux.optimizers, name)(1e-3)
    assert copies(opt, params(), apply) == []
    ordered = temporaries(opt, params(), apply)
    switch_order_off(monkeypatch)
    assert ordered < temporaries(opt, params(), apply)  # (the copies were temporary buffers)


@pytest.mark.parametrize("name", sorted(set(IN_PLACE) - set(RECOMPUTED)))
def test_without_the_order_xla_copies_the_state(name, monkeypatch):
    """The counter-case: with the ordering switched off, the same step copies state, as optax's does."""
    switch_order_off(monkeypatch)
    assert copies(getattr(ux.optimizers, name)(1e-3), params())


@pytest.mark.parametrize("name", RECOMPUTED)
def test_without_the_second_trace_xla_stores_the_step(name, monkeypatch):
    """The counter-case of a step traced again: without it, XLA stores the step for both of its kernels, a
    temporary the size of the params (the old z is not read, so it is not copied)."""
    switch_order_off(monkeypatch)
    opt = getattr(ux.optimizers, name)(1e-3)
    assert copies(opt, params()) == []
    assert temporaries(opt, params()) >= sum(x.size * 4 for x in jax.tree.leaves(params()))


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
        if name in RECOMPUTED:  # (the step computed in two kernels, not stored: on T they differ by ~1e-7)
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-6, atol=1e-7)
        else:
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_schedule_free_steps_y_from_the_new_z_with_its_step_traced_again():
    """Schedule-free's params' update reads the new ``z`` (written in place first) and the inner step traced a
    second time, which XLA computes inside the params' kernel from the new second moment: no copy, and no stored
    step either (the largest leaf is 64x128). The same with the inner rule's options scheduled and a weight decay
    (which reads y in both kernels), and with Adam's rule inside (optax's ``schedule_free`` of Adam copies z)."""
    for opt in (ux.optimizers.schedule_free_adamw(1e-3), ux.optimizers.schedule_free_adamw(1e-3, warmup_steps=10, decay=0.1),
                ux.scale_by_adam(b1=0.0).scale_by_learning_rate(1e-3).schedule_free(1e-3)):
        assert copies(opt, params()) == [] and temporaries(opt, params()) < 64 * 128 * 4, opt
    assert copies(optax.contrib.schedule_free(optax.adam(1e-3, b1=0.0), 1e-3), params(), optax.apply_updates)


def _soft(updates, params):
    return jax.tree.map(lambda g: g / (1 + jnp.abs(g)), updates)


def test_schedule_free_with_other_rules_copies_nothing_and_stores_at_most_the_step():
    """A step XLA duplicates into both kernels (SGD's) needs no second trace: nothing stored. A rule of one's
    own that divides and marks nothing has its step stored once, a temporary the size of the params, and no copy."""
    size = sum(x.size * 4 for x in jax.tree.leaves(params()))
    sgd = ux.scale_by_learning_rate(1e-3).schedule_free(1e-3)
    assert copies(sgd, params()) == [] and temporaries(sgd, params()) < 64 * 128 * 4
    soft = ux.stateless(_soft).scale_by_learning_rate(1e-3).schedule_free(1e-3)
    assert copies(soft, params()) == [] and temporaries(soft, params()) >= size


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("state_dtype", [None, jnp.bfloat16], ids=["z as y", "z narrower"])
def test_schedule_free_follows_the_papers_iterates(state_dtype, jit):
    """Against the three iterates of the paper kept apart in float64 (z stored in its dtype, x the average of the
    stored z's, y interpolated): SGD inside, 6 steps. Where ``z`` is stored narrower than the params, ``y`` moves
    with the step ``z`` took as stored, which reads the old ``z``: XLA copies it."""
    lr, b1 = 0.1, 0.7
    opt = ux.scale_by_learning_rate(lr).schedule_free(lr, b1=b1, state_dtype=state_dtype)
    p = params()
    step = step_fn(opt) if jit else (lambda p, s, g: (lambda u, s: (ux.apply_updates(p, u), s))(*opt.update(g, s, p)))
    z_dtype = np.float32 if state_dtype is None else jnp.bfloat16
    y = [np.asarray(x, np.float64) for x in jax.tree.leaves(p)]
    z = [np.asarray(yi.astype(z_dtype), np.float64) for yi in y]  # (z starts at the params, as stored)
    x = [(yi - (1 - b1) * zi) / b1 for yi, zi in zip(y, z)]  # (so that y = b1·x + (1 - b1)·z)
    s, weights = opt.init(p), 0.0
    for t in range(6):
        g = grads_like(params(), t)
        p, s = step(p, s, g)
        weights += lr**2
        c = lr**2 / weights
        for i, gi in enumerate(jax.tree.leaves(g)):
            z[i] = np.asarray((z[i] - lr * np.asarray(gi, np.float64)).astype(z_dtype), np.float64)
            x[i] = (1 - c) * x[i] + c * z[i]
            y[i] = b1 * x[i] + (1 - b1) * z[i]
    for got, want in zip(jax.tree.leaves(p), y):
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-6)
    for got, want in zip(jax.tree.leaves(ux.schedule_free_eval_params(opt, s, p)), x):
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5)
    if jit and state_dtype is not None:
        assert sorted(copies(opt, params())) == sorted(["64,128", "32,16", "128"])


def test_scheduled_and_held_options_keep_the_order():
    """A stage whose options are scheduled or held keeps its own state inside a ScheduledState."""
    scheduled = ux.scale_by_lion(b1=ux.schedules.linear_schedule(0.8, 0.9, 10)).scale(-1e-3)
    held = ux.hyperparams_in_state(ux.optimizers.lion(1e-3))
    for opt in (scheduled, held):
        assert copies(opt, params()) == []


def test_the_same_stage_inside_an_optax_chain_keeps_xla_order(monkeypatch):
    """Inside an optax pipeline (``ux.to_optax``) the updates are not the ones added to the params: ordering after
    them would read the old params, and XLA would copy those too. The program is the unordered one (where for the
    bare optimizer it is not)."""
    bare = ux.optimizers.lion(1e-3)
    chained = optax.chain(ux.to_optax(bare), optax.scale(0.5))
    ordered = [lowered(bare, params()), lowered(chained, params(), optax.apply_updates)]
    switch_order_off(monkeypatch)
    unordered = [lowered(bare, params()), lowered(chained, params(), optax.apply_updates)]
    assert ordered[0] != unordered[0]
    assert ordered[1] == unordered[1]


def _matrices(tree):
    return jax.tree.map(lambda x: x.ndim >= 2, tree)


#: Wrappers around stages that declare state_last: the inner field is ordered after the param its leaf belongs to.
WRAPPED = {
    "masked": lambda: ux.masked(ux.optimizers.lion(1e-2), _matrices),
    "partition": lambda: ux.partition({"m": ux.optimizers.lion(1e-2), "v": ux.optimizers.adopt(1e-2)},
                                      lambda p: jax.tree.map(lambda x: "m" if x.ndim >= 2 else "v", p)),
    "accumulate_gradients": lambda: ux.accumulate_gradients(ux.optimizers.lion(1e-2), 2),
    "apply_if_finite": lambda: ux.apply_if_finite(ux.optimizers.adopt(1e-2)),
    "masked in masked": lambda: ux.masked(ux.masked(ux.optimizers.lion(1e-2), _matrices), _matrices),
    "held, masked": lambda: ux.hyperparams_in_state(ux.masked(ux.optimizers.lion(1e-2), _matrices)),
}
#: Those whose unordered step copies state (apply_if_finite's selects between the new and the old state write it last).
WRAPPED_COPYING = ["masked", "partition", "accumulate_gradients", "masked in masked", "held, masked"]


@pytest.mark.parametrize("name", sorted(WRAPPED))
def test_a_stage_inside_a_wrapper_is_ordered_after_the_param_its_leaf_belongs_to(name, monkeypatch):
    """``masked`` and ``partition`` run the inner stage on the params with None for the leaves left out, and the
    wrapper's updates are the ones added to the params: each inner field's leaf is written after its own param.
    No copy; the same numbers bit for bit as without the order, over steps that apply and steps that wait."""
    opt = WRAPPED[name]()

    def run():
        p, s = params(), opt.init(params())
        step = step_fn(opt)
        for t in range(4):
            p, s = step(p, s, grads_like(params(), t))
        return p, s

    assert copies(opt, params()) == []
    ordered = run()
    switch_order_off(monkeypatch)
    if name in WRAPPED_COPYING:
        assert copies(opt, params())  # (the counter-case)
    plain = run()
    for a, b in zip(jax.tree.leaves(ordered), jax.tree.leaves(plain)):
        np.testing.assert_array_equal(a, b)


def test_a_wrong_field_inside_a_wrapper_is_named(monkeypatch):
    """A stage's misnamed state_last field fails inside a wrapper as it does outside, eagerly and jitted."""
    stage = ux.stateful(_pair_init, _pair_apply, name="pair_misnamed_in_wrapper", state_last=("b",))
    p = params()
    for opt in (ux.masked(stage, _matrices),
                ux.partition({"x": stage, "y": ux.optimizers.sgd(1e-2)}, _matrices_labelled)):
        for update in (opt.update, jax.jit(opt.update)):
            with pytest.raises(ValueError, match=r"pair_misnamed_in_wrapper: state_last names \['b'\]"):
                update(grads_like(p, 0), opt.init(p), p)


def _matrices_labelled(tree):
    return jax.tree.map(lambda x: "x" if x.ndim >= 2 else "y", tree)


def test_optax_copies_inside_its_wrappers():
    """The counter-case in optax: its masked Lion and its partition copy the momentum of every leaf Lion runs on."""
    labels = lambda p: jax.tree.map(lambda x: "m" if x.ndim >= 2 else "v", p)  # noqa: E731
    masked = optax.masked(optax.lion(1e-2), _matrices)
    partition = optax.partition({"m": optax.lion(1e-2), "v": optax.adam(1e-2)}, labels)
    for opt in (masked, partition):
        assert sorted(copies(opt, params(), optax.apply_updates)) == ["32,16", "64,128"]


def test_a_field_inside_flat_state_keeps_xla_order(monkeypatch):
    """``flat_state``'s inner state is joined buffers, not shaped like the params: left in XLA's order (one copy of
    the joined momentum), not refused."""
    opt = ux.optimizers.lion(1e-2).flat_state(min_joined=2)
    ordered = lowered(opt, params())
    assert copies(opt, params()) == ["8833"]  # (all four leaves joined: 8192 + 512 + 128 + 1 elements)
    switch_order_off(monkeypatch)
    assert lowered(opt, params()) == ordered


def test_unwrapped_inside_optax_chain_the_params_are_copied_too():
    """Documented in docs/concepts.md and docs/performance.md: an updax object put into ``optax.chain`` bare, followed
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


def test_a_step_traced_again_from_the_stored_state_has_the_same_bits():
    """``stored_step`` runs the step again with each value the state stores read through ``x / 1``: the same bits,
    in an expression of its own; None where the step reads nothing the state stores."""
    x = jnp.asarray(np.random.default_rng(1).normal(size=100).astype(np.float32)) ** 2

    def step(x):
        v = 0.9 * x + 0.1 * x * x  # (stored, and read by the step)
        return jnp.sqrt(v) + 1e-8, v

    def again(x):
        return _apart.stored_step(lambda: step(x)), step(x)[0]

    text = str(jax.make_jaxpr(again)(x))
    assert "optimization_barrier" in text and "div" in text
    marked, plain = jax.jit(again)(x)
    np.testing.assert_array_equal(marked, plain)
    assert jax.jit(lambda x: _apart.stored_step(lambda: (jnp.sqrt(x), x + 1)) is None)(x) is not None  # (traced)
    seen = []
    jax.jit(lambda x: seen.append(_apart.stored_step(lambda: (jnp.sqrt(x), x + 1))) or x)(x)
    assert seen == [None]  # (the step reads nothing the state stores)


def test_a_step_with_an_effect_is_traced_once():
    """A user's stage that prints (a ``jax.debug`` callback) inside schedule-free: the step is not traced a second
    time, so the callback runs once a step, and XLA stores the step for both kernels."""
    calls = []

    def noted(updates, params):
        jax.debug.callback(lambda: calls.append(1))
        return updates

    opt = (ux.scale_by_rms(0.99, eps_in_sqrt=False, bias_correction=True).pipe(ux.compose, ux.stateless(noted))
           .scale_by_learning_rate(1e-3).schedule_free(1e-3))
    p = params()
    step = step_fn(opt)
    p, s = step(p, opt.init(p), grads_like(p, 0))
    jax.block_until_ready(p)
    assert calls == [1]
    size = sum(x.size * 4 for x in jax.tree.leaves(params()))
    assert copies(opt, params()) == [] and temporaries(opt, params()) >= size
    plain = ux.scale_by_rms(0.99, eps_in_sqrt=False, bias_correction=True).scale_by_learning_rate(1e-3).schedule_free(1e-3)
    assert temporaries(plain, params()) < 64 * 128 * 4  # (without the callback it is traced again)


#: Options that are an exponential moving average's decay, by optimizer: at 0.5 the weights of the old and the new
#: value are the same number, which XLA's simplifier factors out (updax._backend._half). These are all the options
#: named b1, b2, b3, beta, decay or momentum of updax.optimizers whose step copied state at 0.5 and not at 0.25
#: (32, of 20 optimizers) before the weights were kept apart; each case sets all of its optimizer's at once.
HALF = {"adabelief": ("b1",), "adam": ("b1", "b2"), "adamw": ("b1", "b2"), "lamb": ("b1", "b2"),
        "radam": ("b1", "b2"), "rmsprop": ("decay",), "yogi": ("b1",), "adafactor": ("momentum",), "adamax": ("b1",),
        "adamaxw": ("b1",), "adan": ("b1", "b2", "b3"), "amsgrad": ("b1", "b2"), "muon": ("beta",),
        "nadam": ("b1", "b2"), "nadamw": ("b1", "b2"), "optimistic_adam": ("b1", "b2"),
        "ademamix": ("b1", "b2", "b3"), "simplified_ademamix": ("b2",), "schedule_free_adamw": ("b2",),
        "sm3": ("momentum",)}


def _factored(monkeypatch):
    """The weights as plain numbers again, which XLA factors: ``0.5·(old + new)``."""
    monkeypatch.setattr(_half, "opaque_halves", lambda declaration, values, updates: values)


@pytest.mark.parametrize("name", sorted(HALF))
def test_a_decay_of_one_half_is_not_factored_so_the_state_is_written_in_place(name, monkeypatch):
    """At 0.5, XLA folds the common weight of ``0.5·old + 0.5·new`` into the params' kernel, which then recomputes
    the new average from the old one and XLA copies the old one on every step. Kept apart, no copy, and the
    same numbers as the factored form's and the eager step's, to rounding: the halves are exact, but XLA may
    round a sum inside the factored form apart (a second moment's ``v + g²``: a few elements an ulp apart)."""
    opt = getattr(ux.optimizers, name)(1e-2, **dict.fromkeys(HALF[name], 0.5))

    def run(step):
        p, s = params(), opt.init(params())
        for t in range(3):
            p, s = step(p, s, grads_like(params(), t))
        return p, s

    def eager(p, s, g):
        updates, s = opt.update(g, s, p)
        return ux.apply_updates(p, updates), s

    # No copy but those the step makes at any decay: SM3's of the two small accumulators of one leaf.
    elsewhere = copies(getattr(ux.optimizers, name)(1e-2, **dict.fromkeys(HALF[name], 0.25)), params())
    assert elsewhere == ([] if name != "sm3" else ["32", "16"])
    assert copies(opt, params()) == elsewhere
    apart = run(step_fn(opt))
    stepwise = run(eager)
    _factored(monkeypatch)
    assert len(copies(opt, params())) > len(elsewhere)  # (the counter-case: factored, the old average is copied)
    factored = run(step_fn(opt))
    for a, b, c in zip(jax.tree.leaves(apart), jax.tree.leaves(factored), jax.tree.leaves(stepwise)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(a, c, rtol=1e-6, atol=1e-6)  # (eager rounds apart too: params of scale 1)


def test_optax_copies_at_one_half_and_updax_follows_it():
    """DCGAN's ``adam(b1=0.5)`` and the catalogue's ``adan(b2=0.5)``: optax's steps copy the moments; updax's
    do not, and take optax's steps (10 of them, jitted)."""
    for ours, theirs in [(ux.optimizers.adam(1e-2, b1=0.5), optax.adam(1e-2, b1=0.5)),
                         (ux.optimizers.adan(1e-2, b2=0.5), optax.adan(1e-2, b2=0.5))]:
        assert copies(theirs, params(), optax.apply_updates)
        assert copies(ours, params()) == []
        (p, s), (q, r) = (params(), ours.init(params())), (params(), theirs.init(params()))
        step, their_step = step_fn(ours), step_fn(theirs, optax.apply_updates)
        for t in range(10):
            p, s = step(p, s, grads_like(params(), t))
            q, r = their_step(q, r, grads_like(params(), t))
        for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(q)):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_the_weight_is_hidden_only_where_it_would_be_factored():
    """Only a declared decay (schedulable, its domain in [0, 1]) given as the number 0.5, and only traced with the
    hints on: it becomes an opaque value of the same weak type; other values, and other options, stay numbers."""
    declaration = ux.scale_by_adam(b1=0.5, b2=0.25).stages[0].declaration
    values = {"b1": 0.5, "b2": 0.25, "eps": 0.5, "eps_root": 0.0}
    x = jnp.ones(3)
    assert _half.opaque_halves(declaration, values, x) is values  # (eager: numbers)
    seen = {}

    @jax.jit
    def f(x):
        seen.update(_half.opaque_halves(declaration, values, x))
        return x

    f(x)
    assert isinstance(seen["b1"], jax.core.Tracer) and jax.typeof(seen["b1"]).weak_type
    assert (seen["b2"], seen["eps"], seen["eps_root"]) == (0.25, 0.5, 0.0)  # (eps's domain is not a decay's)
    assert "optimization_barrier" in str(jax.make_jaxpr(lambda x: _half.opaque_halves(declaration, values, x))(x))
    with ux.backend_hints(False):
        assert "optimization_barrier" not in str(
            jax.make_jaxpr(lambda x: _half.opaque_halves(declaration, values, x))(x))


def test_apply_if_finite_selects_rather_than_store_its_outputs_apart():
    """apply_if_finite picks between the inner step and zeros, the new and the old state, leaf by leaf: no copies,
    and temporaries below the params' own bytes (the finiteness masks, a byte an element). Its former
    ``lax.cond`` wrote every output to a buffer of its own: four times the params' bytes on the benchmark's T."""
    opt = ux.apply_if_finite(ux.optimizers.lion(1e-2))
    size = sum(x.size * 4 for x in jax.tree.leaves(params()))
    assert copies(opt, params()) == []
    assert temporaries(opt, params()) < size
    p = params()
    bad = jax.tree.map(lambda x: x * jnp.nan, grads_like(p, 0))
    state = opt.init(p)
    new_p, new_state = step_fn(opt)(p, state, bad)  # (a dropped step: params and inner state as they were)
    before = (params(), opt.init(params())[0].inner)
    for a, b in zip(jax.tree.leaves((new_p, new_state[0].inner)), jax.tree.leaves(before)):
        np.testing.assert_array_equal(a, b)


def _check_once(monkeypatch):
    """Switches apply_if_finite's second trace off: the check then reads the inner step's own result."""
    monkeypatch.setattr(_apart, "traced_apart", lambda fn, *trees: None)


def test_apply_if_finite_checks_an_elementwise_step_computed_again_and_writes_the_state_in_place(monkeypatch):
    """Around an elementwise rule (Adam) the check reads the step traced a second time, which XLA recomputes
    inside the check's kernels; the inner state is ordered after the params, so the params' kernel recomputes it
    too and each state kernel writes in place. Temporaries: the finiteness masks (a byte an element). Each
    counter-case keeps more: without the second trace XLA stores the step and the new moments (three times the
    params' bytes), without the order it copies both moments."""
    opt = ux.apply_if_finite(ux.optimizers.adam(1e-2))
    size = sum(x.size * 4 for x in jax.tree.leaves(params()))
    assert copies(opt, params()) == []
    assert temporaries(opt, params()) < size / 2
    assert "optimization_barrier" in lowered(opt, params())
    monkeypatch.setattr(_order, "after_params", _unordered)
    assert sorted(copies(opt, params())) == ["128", "128", "32,16", "32,16", "64,128", "64,128"]
    monkeypatch.undo()
    _check_once(monkeypatch)
    assert copies(opt, params()) == [] and temporaries(opt, params()) >= 3 * size


def _run_donated(opt, steps):
    """The params and the state after each of ``steps`` (gradients) of the jitted donated step, as numpy."""
    p, s = params(), opt.init(params())
    step, seen = step_fn(opt), []
    for g in steps:
        p, s = step(p, s, g)
        seen.append(jax.tree.map(np.asarray, (p, s)))  # (the step donates its arguments)
    return seen


#: Per inner rule, what apply_if_finite(rule, 1) records after each of the steps below: (last_finite,
#: total_notfinite). A gradient of 1e38 overflows momentum SGD's step (times 10), a step finite in and not out,
#: dropped; Adam's second moment overflows instead and its step m / sqrt(inf) is 0, finite, applied. The infinity
#: of the last step comes after a NaN, more than max_consecutive_errors=1 in a row: applied anyway.
DROPS = {"sgd": [(False, 1), (True, 1), (False, 2), (False, 3)],
         "adam": [(True, 0), (True, 0), (False, 1), (False, 2)]}


@pytest.mark.parametrize("inner", sorted(DROPS))
def test_apply_if_finite_drops_the_same_steps_with_its_check_computed_again(inner, monkeypatch):
    """The same steps dropped as when the check reads the inner step's own result, and the same numbers to
    rounding (XLA fuses the step computed again otherwise); a dropped step leaves the params and the inner state
    bit for bit."""
    rule = ux.optimizers.sgd(10.0, momentum=0.9) if inner == "sgd" else ux.scale_by_adam().scale(-1e-2)
    opt = ux.apply_if_finite(rule, 1)
    g = grads_like(params(), 0)
    steps = [{**g, "w": g["w"].at[3, 5].set(1e38)}, g, jax.tree.map(lambda x: x.at[(0,) * x.ndim].set(jnp.nan), g),
             jax.tree.map(lambda x: x * jnp.inf, g)]
    again = _run_donated(opt, steps)
    with monkeypatch.context() as patch:
        switch_order_off(patch)
        _check_once(patch)
        once = _run_donated(opt, steps)
    for run in (again, once):
        assert [(bool(s[0].last_finite), int(s[0].total_notfinite)) for _, s in run] == DROPS[inner]
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(once)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)  # (1e-8: ulps of a 1e-2 step)
    before = [(params(), opt.init(params()))] + again
    for t, (finite, _) in enumerate(DROPS[inner][:3]):
        if not finite:
            for a, b in zip(jax.tree.leaves((again[t][0], again[t][1][0].inner)),
                            jax.tree.leaves((before[t][0], before[t][1][0].inner))):
                np.testing.assert_array_equal(a, b)


def test_apply_if_finite_checks_a_step_once_where_computing_it_again_costs(monkeypatch):
    """A rule that is not elementwise (LAMB's per-leaf trust ratio; a matrix product would be computed twice) and
    a step with an effect (a callback would run twice a step) are traced once: no barrier'd 1 in the program,
    the callback run once a step."""
    assert "optimization_barrier" not in lowered(ux.apply_if_finite(ux.optimizers.lamb(1e-2)), params())
    calls = []

    def noted(updates, params):
        jax.debug.callback(lambda: calls.append(1))
        return updates

    def passed(updates, params):
        return updates

    plain = ux.apply_if_finite(ux.scale_by_adam().pipe(ux.compose, ux.stateless(passed, elementwise=True)).scale(-1e-2))
    assert "optimization_barrier" in lowered(plain, params())  # (the counter-case: without the callback)
    opt = ux.apply_if_finite(ux.scale_by_adam().pipe(ux.compose, ux.stateless(noted, elementwise=True)).scale(-1e-2))
    assert "optimization_barrier" not in lowered(opt, params())
    p = params()
    p, _ = step_fn(opt)(p, opt.init(p), grads_like(p, 0))
    jax.block_until_ready(p)
    assert calls == [1]


def test_apply_if_finite_orders_what_is_shaped_like_the_params_and_leaves_the_rest(monkeypatch):
    """The whole inner state is searched for trees shaped like the params: through masked (None for the leaves
    left out) and a bare array's params; flat_state's joined buffers are left alone, not refused. The same
    numbers as without the order."""
    cases = [ux.apply_if_finite(ux.masked(ux.optimizers.adam(1e-2), _matrices)),
             ux.apply_if_finite(ux.optimizers.adam(1e-2).flat_state(min_joined=2))]
    for opt in cases:
        ordered = _run_donated(opt, [grads_like(params(), t) for t in range(3)])
        with monkeypatch.context() as patch:
            switch_order_off(patch)
            plain = _run_donated(opt, [grads_like(params(), t) for t in range(3)])
        for a, b in zip(jax.tree.leaves(ordered), jax.tree.leaves(plain)):
            np.testing.assert_array_equal(a, b)
    assert copies(cases[0], params()) == []
    opt = ux.apply_if_finite(ux.optimizers.adam(1e-2))
    w = params()["w"]
    text = step_fn(opt).lower(w, opt.init(w), w).compile().as_text()
    assert " copy(" not in text[text.index("ENTRY"):]


def test_a_wrapper_may_write_its_whole_pipeline_state_last():
    stage = ux.apply_if_finite(ux.optimizers.adam(1e-2)).stages[0]
    assert stage.state_last == frozenset({"inner"}) and stage.wraps == "inner"
    stage = ux.accumulate_gradients(ux.optimizers.adam(1e-2), 2).stages[0]
    assert stage.state_last == frozenset({"inner", "accumulated"})


@pytest.mark.parametrize("inner", ["adam", "lion"])
def test_accumulate_gradients_steps_an_elementwise_pipeline_on_every_call_and_keeps_the_kth(inner, monkeypatch):
    """Around an elementwise pipeline the step is computed on every call and selected, not run in a lax.cond:
    the same calls step (every 3rd, a NaN call skipped), zeros bit for bit on the others with the inner state
    unchanged, and the numbers of the conditional to rounding. The conditional's outputs are buffers of their own,
    written back on every call; selected, the state is written in place (the pipeline's state after the params,
    the sum after the pipeline's state, whose kernels read the old sum): no copies, and of temporaries only the
    skip function's count."""
    rule = ux.optimizers.adam(1e-2) if inner == "adam" else ux.optimizers.lion(1e-2)
    opt = ux.accumulate_gradients(rule, 3, should_skip=ux.skip_not_finite)
    calls = [grads_like(params(), t) for t in range(8)]
    calls[4] = jax.tree.map(lambda x: x * jnp.nan, calls[4])
    assert not re.search(r"stablehlo\.(case|if)", lowered(opt, params()))
    size = sum(x.size * 4 for x in jax.tree.leaves(params()))
    assert copies(opt, params()) == []
    assert temporaries(opt, params()) < size  # (skip_not_finite's count, in 32-bit integers)
    selected = _run_donated(opt, calls)
    with monkeypatch.context() as patch:
        patch.setattr(_apart, "traced_pure", lambda fn: None)
        assert re.search(r"stablehlo\.(case|if)", lowered(opt, params()))
        assert temporaries(opt, params()) > 2 * size
        conditional = _run_donated(opt, calls)
    assert [bool(s[0].updated) for _, s in selected] == [False, False, True, False, False, False, True, False]
    for (p_s, s_s), (p_c, s_c) in zip(selected, conditional):
        assert [int(s_s[0].mini_step), int(s_s[0].gradient_step)] == [int(s_c[0].mini_step), int(s_c[0].gradient_step)]
        for a, b in zip(jax.tree.leaves((p_s, s_s)), jax.tree.leaves((p_c, s_c))):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
    before = [(params(), opt.init(params()))] + selected
    for t, (p, s) in enumerate(selected):
        if not bool(s[0].updated):  # (a call that waits: the params and the inner state as they were)
            for a, b in zip(jax.tree.leaves((p, s[0].inner)), jax.tree.leaves((before[t][0], before[t][1][0].inner))):
                np.testing.assert_array_equal(a, b)


def test_lookahead_writes_its_slow_weights_in_place_as_the_new_params():
    """On a sync the slow weights are the new params as apply_updates computes them, so XLA's kernel for them
    reads the params' new buffer and runs after the params' kernel: no copies (the paper's φ + α·(θ + u - φ)
    read the old params and the old φ, which the params' kernel reads too, and XLA copied both; optax's step
    copies them: benchmarks/lookahead.py). After each sync the fast and the slow weights are equal bit for bit,
    as the paper's fast weights restart at φ; a wider accumulator_dtype keeps φ's own formula."""
    opt = ux.optimizers.adam(1e-2).lookahead(3, 0.5)
    assert copies(opt, params()) == [] and temporaries(opt, params()) < 1024
    seen = _run_donated(opt, [grads_like(params(), t) for t in range(6)])
    for t in (2, 5):
        p, s = seen[t]
        assert int(s[0].steps_since_sync) == 0
        for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(s[0].slow)):
            np.testing.assert_array_equal(a, b)
    assert np.abs(seen[3][0]["w"] - seen[3][1][0].slow["w"]).max() > 0  # (between syncs θ moves, φ stays)
    wide = ux.optimizers.adam(1e-2).lookahead(3, 0.5, accumulator_dtype=jnp.float32)
    p, s = params(jnp.bfloat16), wide.init(params(jnp.bfloat16))
    step = step_fn(wide)
    for t in range(3):
        p, s = step(p, s, grads_like(params(jnp.bfloat16), t))
    assert s[0].slow["w"].dtype == jnp.float32 and int(s[0].steps_since_sync) == 0
    assert np.abs(np.asarray(s[0].slow["w"]) - np.asarray(p["w"], np.float32)).max() > 0  # (φ in float32)
