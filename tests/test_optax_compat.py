"""What optax users' code relies on (issue 43): complex params in Adafactor, Muon and the line searches, complex
first-moment dtypes, ``increase_factor=inf``, a traced ``decay_offset``, a scheduled Fromage, and ``to_optax``
objects taking a stateless transformation's state. Each against optax 0.2.8's numbers."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from compile_options import DEFAULT_COMPILE
from registry import nested_tree
from test_complex import PARAMS, complex_tree

import updax as ux

O = ux.optimizers
STEPS = 20


def _close(actual, expected, what, rtol=2e-5, atol=2e-6):
    assert jax.tree.structure(actual) == jax.tree.structure(expected), what
    for (path, a), e in zip(jax.tree_util.tree_flatten_with_path(actual)[0], jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol,
                                   err_msg=f"{what}{jax.tree_util.keystr(path)}")


def _parity(ours, theirs, params, grads_at, steps=STEPS, convert=lambda u: u, **tol):
    """Both sides from ``params`` over ``steps`` steps, each on its own params' gradients, every step's updates
    compared (optax's through ``convert``)."""
    p1 = p2 = params
    s1, s2 = ours.init(p1), theirs.init(p2)
    for t in range(steps):
        u1, s1 = ours.update(grads_at(p1, t), s1, p1)
        u2, s2 = theirs.update(grads_at(p2, t), s2, p2)
        u2 = jax.tree.map(convert, u2)
        _close(u1, u2, f"step {t + 1}: ", **tol)
        p1, p2 = ux.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    return s1, s2


def _complex_grads(params, t):
    """Changing complex gradients that depend on the params (so that the two sides' params must agree)."""
    return jax.tree.map(lambda p, g: g + 0.1 * p, params, complex_tree(t + 7))


# --------------------------------------------------------------------------
# Complex params


@pytest.mark.parametrize("ours, theirs", [
    (lambda: O.adafactor(0.05, min_dim_size_to_factor=2), lambda: optax.adafactor(0.05, min_dim_size_to_factor=2)),
    # optax keeps Adafactor's momentum in float32 by default, which drops a complex momentum's imaginary part
    (lambda: O.adafactor(0.05, min_dim_size_to_factor=2, momentum=0.9, decay=0.01),
     lambda: optax.adafactor(0.05, min_dim_size_to_factor=2, momentum=0.9, weight_decay_rate=0.01,
                             dtype_momentum=jnp.complex64)),
    (lambda: ux.scale_by_factored_rms(min_dim_size_to_factor=2, decay_rate=0.7),
     lambda: optax.scale_by_factored_rms(min_dim_size_to_factor=2, decay_rate=0.7)),
    (lambda: O.muon(0.02), lambda: optax.contrib.muon(0.02)),
    (lambda: O.muon(0.02, adaptive=True, nesterov=False), lambda: optax.contrib.muon(0.02, adaptive=True,
                                                                                      nesterov=False)),
], ids=["adafactor", "adafactor_momentum", "scale_by_factored_rms", "muon", "muon_adaptive"])
def test_complex_params_match_optax(ours, theirs):
    _parity(ours(), theirs(), PARAMS, _complex_grads)


def test_adafactor_statistics_of_complex_params_are_real():
    opt = ux.scale_by_factored_rms(min_dim_size_to_factor=2)
    state = opt.update(complex_tree(1), opt.init(PARAMS), PARAMS)[1]
    for leaf in jax.tree.leaves((state[0].v_row, state[0].v_col, state[0].v)):
        assert leaf.dtype == jnp.complex64 and not np.any(np.imag(leaf)) and np.all(np.real(leaf) >= 0)


MATRICES = {"a": PARAMS["dense"]["w"], "b": [PARAMS["seq"][1][0], jnp.zeros((3, 2), jnp.complex64)]}


@pytest.mark.parametrize("preconditioning", ["frobenius", "spectral", "aol"])
def test_complex_newton_schulz_matches_optax(preconditioning):
    dims = optax.contrib.MuonDimensionNumbers(0, 1)
    theirs = optax.contrib.scale_by_muon(beta=0.0, nesterov=False, preconditioning=preconditioning,
                                         weight_dimension_numbers={"a": dims, "b": [dims, dims]})
    ours = ux.scale_by_newton_schulz(preconditioning=preconditioning)

    def grads(params, t):
        tree = complex_tree(t + 3)
        return {"a": tree["dense"]["w"], "b": [tree["seq"][1][0], jnp.zeros((3, 2), jnp.complex64)]}

    _parity(ours, theirs, MATRICES, grads, steps=3)


@pytest.mark.parametrize("preconditioning", ["frobenius", "spectral", "aol", "schatten"])
def test_complex_newton_schulz_is_unitary_and_commutes_with_a_phase(preconditioning):
    """Many iterations of (2, -1.5, 0.5) give a matrix with orthonormal columns (optax's test), and turning the
    input by a phase turns the output by it. (optax's Schatten-4 first step squares x without the conjugate and
    gives NaN on complex matrices: this identity is its check.)"""
    x = complex_tree(4)["dense"]["w"].T  # (3, 2)
    opt = ux.scale_by_newton_schulz((2.0, -1.5, 0.5), ns_steps=25, eps=1e-12, preconditioning=preconditioning)
    o = opt.update({"x": x}, opt.init(None))[0]["x"]
    np.testing.assert_allclose(o.conj().T @ o, np.eye(2), atol=1e-4)
    phase = jnp.exp(0.9j).astype(jnp.complex64)
    turned = opt.update({"x": x * phase}, opt.init(None))[0]["x"]
    np.testing.assert_allclose(turned, o * phase, atol=1e-5)


TARGET = complex_tree(50)


def _objective(params):
    return sum(jnp.sum(jnp.abs(x - t) ** 2 + 0.1 * jnp.abs(x) ** 4)
               for x, t in zip(jax.tree.leaves(params), jax.tree.leaves(TARGET)))


def _searched(opt, conj_grad, steps=STEPS):
    """The jitted steps of a line-search pipeline on the complex objective, from PARAMS: the updates are the
    conjugate of JAX's gradient (the descent direction, as optax's tests pass them); ``grad=`` is JAX's gradient
    (updax) or its conjugate (optax's zoom reads it so)."""
    @jax.jit(compiler_options=DEFAULT_COMPILE)  # (the searches' branches follow the default program's rounding)
    def step(params, state):
        value, grad = jax.value_and_grad(_objective)(params)
        descent = jax.tree.map(jnp.conj, grad)
        updates, state = opt.update(descent, state, params, value=value, grad=descent if conj_grad else grad,
                                    value_fn=_objective)
        return jax.tree.map(lambda p, u: p + u, params, updates), state, updates

    params, state, out = PARAMS, opt.init(PARAMS), []
    for _ in range(steps):
        params, state, updates = step(params, state)
        out.append(updates)
    return out, params


@pytest.mark.parametrize("ours, theirs, conj_grad", [
    (lambda: ux.scale(-1.0).scale_by_backtracking_linesearch(15, store_grad=True),
     lambda: optax.chain(optax.scale(-1.0), optax.scale_by_backtracking_linesearch(15, store_grad=True)), False),
    (lambda: ux.scale(-1.0).scale_by_backtracking_linesearch(15, increase_factor=math.inf),
     lambda: optax.chain(optax.scale(-1.0), optax.scale_by_backtracking_linesearch(15, increase_factor=math.inf)),
     False),
    (lambda: ux.scale(-1.0).scale_by_zoom_linesearch(15),
     lambda: optax.chain(optax.scale(-1.0), optax.scale_by_zoom_linesearch(15)), True),
    (lambda: O.lbfgs(), lambda: optax.lbfgs(), True),
], ids=["backtracking", "backtracking_increase_inf", "zoom", "lbfgs"])
def test_complex_line_searches_match_optax(ours, theirs, conj_grad):
    """optax's backtracking search reads ``grad=`` as JAX's gradient and its zoom search as its conjugate; updax
    reads JAX's gradient in both (what ``value_and_grad_from_state`` and the searches' own gradients are)."""
    mine, end = _searched(ours(), False)
    reference, reference_end = _searched(theirs(), conj_grad)
    for t, (a, b) in enumerate(zip(mine, reference)):
        _close(a, b, f"step {t + 1}: ", rtol=1e-4, atol=1e-5)
    _close(end, reference_end, "final params: ", rtol=1e-4, atol=1e-5)
    assert float(_objective(end)) < 0.2 * float(_objective(PARAMS))


def test_a_complex_line_search_descends_along_the_conjugate_gradient():
    """The slope along the conjugate of JAX's gradient is -‖g‖² (the search's first try is accepted on a
    quadratic whose exact step it is)."""
    target = complex_tree(9)

    def f(p):
        return sum(jnp.sum(jnp.abs(x - t) ** 2) for x, t in zip(jax.tree.leaves(p), jax.tree.leaves(target)))

    opt = ux.scale(-0.5).scale_by_backtracking_linesearch(5, max_learning_rate=1.0, objective=f)
    state = opt.init(PARAMS)
    grad = jax.grad(f)(PARAMS)
    updates, state = opt.update(jax.tree.map(jnp.conj, grad), state, PARAMS)
    _close(ux.apply_updates(PARAMS, updates), target, "one exact step: ", rtol=1e-5, atol=1e-5)
    assert int(opt.get_state(state, "scale_by_backtracking_linesearch.num_linesearch_steps")) == 1


# --------------------------------------------------------------------------
# Options optax takes


@pytest.mark.parametrize("ours, theirs", [
    (lambda: O.adam(0.1, b1=0.8, mu_dtype=jnp.complex64), lambda: optax.adam(0.1, b1=0.8, mu_dtype=jnp.complex64)),
    (lambda: O.adamw(0.1, decay=0.01, mu_dtype=jnp.complex64),
     lambda: optax.adamw(0.1, weight_decay=0.01, mu_dtype=jnp.complex64)),
    (lambda: O.sgd(0.1, momentum=0.9, accumulator_dtype=jnp.complex64),
     lambda: optax.sgd(0.1, momentum=0.9, accumulator_dtype=jnp.complex64)),
], ids=["adam", "adamw", "sgd_momentum"])
def test_a_complex_first_moment_of_real_params_matches_optax(ours, theirs):
    """The moment is stored complex (its imaginary part 0); updax's updates stay real, optax's are complex with a
    zero imaginary part."""
    params = nested_tree(seed=1)
    opt = ours()
    state, _ = _parity(opt, theirs(), params, lambda p, t: jax.tree.map(lambda x: jnp.sin(x * (t + 1)), p),
                       convert=lambda u: u.real)
    moments = [x for x in jax.tree.leaves(state) if jnp.ndim(x) > 0]
    assert moments and all(x.dtype in (jnp.complex64, jnp.float32) for x in moments)
    assert any(x.dtype == jnp.complex64 and not np.any(np.imag(x)) for x in moments)


def test_a_complex_second_moment_dtype_is_still_refused():
    with pytest.raises(TypeError, match=r"scale_by_adam\(nu_dtype=.*\): nu_dtype must be None or a floating dtype"):
        ux.scale_by_adam(nu_dtype=jnp.complex64)


def test_adafactor_takes_a_traced_decay_offset():
    """decay_offset passed into a jitted function (as optax.inject_hyperparams does), against optax with the same
    offset, from a count at the offset."""
    params = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": jnp.ones(4)}

    def run(offset):
        opt = O.adafactor(0.05, decay_offset=offset, min_dim_size_to_factor=2)
        state = opt.replace_state(opt.init(params), "scale_by_factored_rms.count", 3)
        out = []
        for t in range(STEPS):
            g = jax.tree.map(lambda x: jnp.cos(x * (t + 1)), params)
            u, state = opt.update(g, state, params)
            out.append(u)
        return out

    traced = jax.jit(run)(jnp.asarray(3))
    reference = optax.adafactor(0.05, decay_offset=3, min_dim_size_to_factor=2)
    state = reference.init(params)
    state = optax.tree.set(state, count=jnp.asarray(3, jnp.int32))
    for t in range(STEPS):
        g = jax.tree.map(lambda x: jnp.cos(x * (t + 1)), params)
        u, state = reference.update(g, state, params)
        _close(traced[t], u, f"step {t + 1}: ", rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"scale_by_factored_rms\(step_offset=-1\)"):
        O.adafactor(decay_offset=jnp.asarray(-1))


def _real_grads(params, t):
    """Changing real gradients that depend on the params, of a size that varies with the step."""
    return jax.tree.map(lambda p: jnp.cos(p * (t + 1)) * (0.1 + t % 4), params)


def test_adafactor_dtype_momentum_matches_optax():
    """optax's ``dtype_momentum``, bfloat16, over 20 steps on a nested tree (matrices factored, vectors and a
    scalar not, None leaves), with decay, both sides at updax's params each step.

    The rule: the stored momentum is ``bf16(0.9·m + 0.1·x)`` summed in float32, ``x`` what Adafactor without
    momentum would step by (its update plus the decay, negated), and updax's step is ``-(m + decay·p)`` of it:
    checked to float32's precision. optax 0.2.8 differs by bfloat16's rounding: it rounds ``0.9·m`` to
    bfloat16 before the sum (a bfloat16 ``m`` times a Python float stays bfloat16) and steps with the momentum
    before it is rounded; so against optax the momentum and the step agree to a few bfloat16 steps of the
    momentum's size."""
    params = nested_tree()
    ours = O.adafactor(0.05, min_dim_size_to_factor=2, momentum=0.9, decay=0.01, dtype_momentum=jnp.bfloat16)
    plain = O.adafactor(0.05, min_dim_size_to_factor=2, decay=0.01)
    theirs = optax.adafactor(0.05, min_dim_size_to_factor=2, momentum=0.9, weight_decay_rate=0.01,
                             dtype_momentum=jnp.bfloat16)
    s1, s2, s3 = ours.init(params), theirs.init(params), plain.init(params)
    m = jax.tree.map(lambda p: jnp.zeros_like(p, jnp.bfloat16), params)

    def optax_ema(state):
        return next(x for x in jax.tree.leaves(state, is_leaf=lambda x: hasattr(x, "ema")) if hasattr(x, "ema")).ema

    as32 = lambda tree: jax.tree.map(lambda a: a.astype(jnp.float32), tree)  # noqa: E731
    for t in range(STEPS):
        g = _real_grads(params, t)
        u1, s1 = ours.update(g, s1, params)
        u2, s2 = theirs.update(g, s2, params)
        u3, s3 = plain.update(g, s3, params)
        x = jax.tree.map(lambda u, p: -u - 0.01 * p, u3, params)
        m = jax.tree.map(lambda m, x: (0.9 * m.astype(jnp.float32) + 0.1 * x).astype(jnp.bfloat16), m, x)
        m1 = ours.get_state(s1, "ema.ema")
        assert {a.dtype for a in jax.tree.leaves(m1)} == {a.dtype for a in jax.tree.leaves(optax_ema(s2))} == {
            jnp.dtype(jnp.bfloat16)}
        _close(as32(m1), as32(m), f"step {t + 1} momentum: ", rtol=2 ** -7, atol=1e-7)  # one bfloat16 step
        _close(u1, jax.tree.map(lambda m, p: -(m.astype(jnp.float32) + 0.01 * p), m1, params), f"step {t + 1}: ",
               rtol=1e-6, atol=1e-7)
        scale = max(float(jnp.max(jnp.abs(a.astype(jnp.float32)))) for a in jax.tree.leaves(m1))
        _close(as32(m1), as32(optax_ema(s2)), f"step {t + 1} momentum vs optax: ", rtol=0, atol=2 ** -5 * scale)
        _close(u1, u2, f"step {t + 1} vs optax: ", rtol=0, atol=2 ** -5 * scale)
        params = ux.apply_updates(params, u1)
        m = m1  # the reference goes on from updax's momentum: one step's rounding at a time
    with pytest.raises(TypeError, match=r"adafactor\(dtype_momentum='int32'\): dtype_momentum must be None or a "
                                        "floating dtype"):
        O.adafactor(momentum=0.9, dtype_momentum="int32")
    with pytest.raises(TypeError, match=r"adafactor\(dtype_momentum='int32'\)"):
        O.adafactor(dtype_momentum="int32")  # checked though unread without momentum


def test_fromage_takes_a_schedule():
    schedule = ux.schedules.cosine_decay(0.1, decay_steps=15)
    opt = O.fromage(schedule)
    assert opt == O.fromage(ux.schedules.cosine_decay(0.1, decay_steps=15))
    params = nested_tree(seed=2)
    _parity(opt, optax.fromage(optax.cosine_decay_schedule(0.1, 15)), params,
            lambda p, t: jax.tree.map(lambda x: jnp.sin(x * (t + 1)), p), rtol=1e-5, atol=1e-6)


def test_increase_factor_inf_starts_every_backtracking_search_at_the_largest_step():
    opt = ux.scale(-1.0).scale_by_backtracking_linesearch(10, increase_factor=math.inf, max_learning_rate=0.7,
                                                          objective=lambda p: jnp.sum(p["w"] ** 2))
    params = {"w": jnp.array([1.0, -2.0])}
    state = opt.init(params)
    for _ in range(3):
        updates, state = opt.update({"w": 2 * params["w"]}, state, params)
        params = ux.apply_updates(params, updates)
        # the first try, 0.7, overshoots (|1 - 1.4| = 0.4 < 1 decreases: accepted), each search starts there
        assert float(opt.get_state(state, "scale_by_backtracking_linesearch.learning_rate")) == pytest.approx(0.7)
    for bad in (math.nan, -math.inf, 0.5):
        with pytest.raises(ValueError, match=r"increase_factor must be in \[1, inf\]"):
            ux.scale_by_backtracking_linesearch(5, increase_factor=bad)


# --------------------------------------------------------------------------
# to_optax and optax's stateless transformations' state


@pytest.mark.parametrize("state", [None, optax.EmptyState(), (), ux.EmptyState()], ids=["None", "optax", "tuple",
                                                                                          "updax"])
def test_to_optax_of_a_stateless_pipeline_takes_an_empty_state(state):
    grads = nested_tree(seed=3)
    tx = ux.to_optax(ux.clip_by_global_norm(1.0).scale(-0.5))
    reference = optax.chain(optax.clip_by_global_norm(1.0), optax.scale(-0.5))
    updates, new_state = tx.update(grads, state)
    _close(updates, reference.update(grads, reference.init(grads))[0], "")
    assert not jax.tree.leaves(new_state)
    jitted, _ = jax.jit(tx.update)(grads, state)
    _close(jitted, updates, "jit: ")


def test_to_optax_of_a_stateful_pipeline_still_wants_its_state():
    tx = ux.to_optax(ux.scale_by_adam())
    with pytest.raises(ValueError, match=r"state must be the tuple of 1 stage states that init\(\) returns"):
        tx.update({"w": jnp.ones(2)}, None)
