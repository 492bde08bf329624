"""L-BFGS and the line searches: parity with optax step by step, convergence, and how the objective is given."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from compile_options import DEFAULT_COMPILE
from registry import nested_tree

import updax as ux

O = ux.optimizers
STEPS = 25
TOL = {"rtol": 2e-5, "atol": 1e-6}


def rosenbrock(x):
    return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)


def _curvatures():
    """A positive curvature per leaf of the nested tree (from 0.5 to 20), and the minimiser."""
    rng = np.random.default_rng(7)
    return (jax.tree.map(lambda x: jnp.asarray(rng.uniform(0.5, 20.0, size=x.shape), jnp.float32), nested_tree()),
            nested_tree(seed=3))


CURVATURES, CENTRE = _curvatures()


def quadratic(params):
    """``Σ a·(w - c)²/2`` over the nested tree (dicts, lists, tuples, None leaves, a 0-d leaf)."""
    terms = jax.tree.map(lambda w, a, c: 0.5 * jnp.sum(a * (w - c) ** 2), params, CURVATURES, CENTRE)
    return sum(jax.tree.leaves(terms))


PROBLEMS = {
    "rosenbrock2": (rosenbrock, jnp.asarray([-1.2, 1.0]), jnp.ones(2)),
    "rosenbrock10": (rosenbrock, jnp.zeros(10), jnp.ones(10)),
    "nested_quadratic": (quadratic, nested_tree(seed=0), CENTRE),
}

LINESEARCHES = {
    "zoom": (lambda: O.lbfgs(), lambda: optax.lbfgs()),
    "backtracking": (lambda: O.lbfgs(linesearch="backtracking"),
                     lambda: optax.lbfgs(linesearch=optax.scale_by_backtracking_linesearch(20, store_grad=True))),
    "zoom_keep_lr_memory3": (
        lambda: O.lbfgs(0.5, memory_size=3, scale_init_precond=False,
                        linesearch=ux.scale_by_zoom_linesearch(15, max_learning_rate=4.0, curv_rtol=0.5)),
        lambda: optax.lbfgs(0.5, memory_size=3, scale_init_precond=False,
                            linesearch=optax.scale_by_zoom_linesearch(15, max_learning_rate=4.0, curv_rtol=0.5))),
}


def _solver(opt, fn, value_and_grad_from_state, apply):
    value_and_grad = value_and_grad_from_state(fn)

    @jax.jit(compiler_options=DEFAULT_COMPILE)  # (the line search's branches follow the default program's rounding)
    def step(params, state):
        value, grad = value_and_grad(params, state=state)
        updates, state = opt.update(grad, state, params, value=value, grad=grad, value_fn=fn)
        return apply(params, updates), state, updates

    return step


def _run(opt, fn, start, steps, reference=False):
    step = _solver(opt, fn, optax.value_and_grad_from_state if reference else ux.value_and_grad_from_state,
                   optax.apply_updates if reference else ux.apply_updates)
    params, state, trajectory = start, opt.init(start), []
    for _ in range(steps):
        params, state, updates = step(params, state)
        trajectory.append(updates)
    return params, state, trajectory


@pytest.mark.parametrize("problem", sorted(PROBLEMS))
@pytest.mark.parametrize("search", sorted(LINESEARCHES))
def test_parity_with_optax_lbfgs_over_25_steps(problem, search):
    fn, start, _ = PROBLEMS[problem]
    ours, theirs = (build() for build in LINESEARCHES[search])
    p1, s1, u1 = _run(ours, fn, start, STEPS)
    p2, s2, u2 = _run(theirs, fn, start, STEPS, reference=True)
    for t, (a, b) in enumerate(zip(u1, u2)):
        assert jax.tree.structure(a) == jax.tree.structure(b)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_allclose(x, y, **TOL, err_msg=f"{search} on {problem}, step {t + 1}")
    for x, y in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_allclose(x, y, **TOL)
    ls = ours.stages[-1].label
    reference_ls = s2[-1]
    np.testing.assert_allclose(ours.get_state(s1, f"{ls}.learning_rate"), reference_ls.learning_rate, **TOL)
    np.testing.assert_allclose(ours.get_state(s1, f"{ls}.value"), reference_ls.value, **TOL)


def test_the_stage_matches_optax_on_nested_trees_with_changing_gradients():
    """scale_by_lbfgs alone on the nested tree, fed the quadratic's gradients with a changing scale (so the pairs
    are not those of one objective), and params moved by a fixed fraction of its own steps."""
    opt, ref = ux.scale_by_lbfgs(memory_size=4), optax.scale_by_lbfgs(memory_size=4)
    params = nested_tree(seed=0)
    p1 = p2 = params
    s1, s2 = opt.init(params), ref.init(params)
    step1, step2 = jax.jit(opt.update), jax.jit(ref.update)
    for t in range(20):
        grads = jax.tree.map(lambda a, c, p, t=t: a * (p - c) * (1.0 + 0.2 * np.sin(t)), CURVATURES, CENTRE, p1)
        u1, s1 = step1(grads, s1, p1)
        u2, s2 = step2(grads, s2, p2)
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            np.testing.assert_allclose(x, y, **TOL, err_msg=f"step {t + 1}")
        p1 = ux.apply_updates(p1, jax.tree.map(lambda u: -0.1 * u, u1))
        p2 = optax.apply_updates(p2, jax.tree.map(lambda u: -0.1 * u, u2))


@pytest.mark.parametrize("search, problem, steps", [
    ("zoom", "rosenbrock2", 60), ("zoom", "rosenbrock10", 100), ("zoom", "nested_quadratic", 40),
    # Not rosenbrock2: from (-1.2, 1), Armijo steps (no curvature condition) let a pair with <s, y> < 0 into the
    # memory by step 27, and the float32 direction degenerates; optax's lbfgs stalls at the same point (f = 3.76).
    ("backtracking", "rosenbrock10", 100), ("backtracking", "nested_quadratic", 40),
])
def test_converges_to_the_known_minimum(problem, steps, search):
    fn, start, minimum = PROBLEMS[problem]
    params, _, _ = _run(O.lbfgs(linesearch=search), fn, start, steps)
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(minimum)):
        np.testing.assert_allclose(x, y, atol=2e-3)
    assert float(fn(params)) < 1e-6


def test_with_near_exact_line_searches_a_quadratic_is_solved_in_n_steps():
    """BFGS with exact line searches ends on an n-dimensional strictly convex quadratic in n steps (Nocedal & Wright,
    chapter 6); a zoom search with a tight curvature condition is near exact, and the memory (10) holds them all."""
    a = jnp.asarray([1.0, 3.0, 10.0, 0.3, 5.0])

    def fn(w):
        return 0.5 * jnp.sum(a * (w - 2.0) ** 2)

    opt = O.lbfgs(linesearch=ux.scale_by_zoom_linesearch(30, curv_rtol=0.01, initial_guess_strategy="one"))
    params, _, _ = _run(opt, fn, jnp.zeros(5), 5)
    np.testing.assert_allclose(params, jnp.full(5, 2.0), atol=1e-5)
    loose, _, _ = _run(O.lbfgs(), fn, jnp.zeros(5), 5)  # curv_rtol=0.9: cheaper searches, more steps
    assert float(jnp.max(jnp.abs(loose - 2.0))) > 1e-2


def test_built_with_the_objective_it_needs_nothing_else():
    fn, start, _ = PROBLEMS["nested_quadratic"]
    given = O.lbfgs(objective=fn)
    state, params = given.init(start), start
    reference, ref_state, ref_params = O.lbfgs(), O.lbfgs().init(start), start
    for _ in range(5):
        updates, state = given.update(jax.grad(fn)(params), state, params)
        value, grad = jax.value_and_grad(fn)(ref_params)
        expected, ref_state = reference.update(grad, ref_state, ref_params, value=value, grad=grad, value_fn=fn)
        for x, y in zip(jax.tree.leaves(updates), jax.tree.leaves(expected)):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
        params, ref_params = ux.apply_updates(params, updates), ux.apply_updates(ref_params, expected)


def test_keywords_of_update_that_the_objective_names_reach_it():
    """As optax: a batch passed to update reaches value_fn; keywords it does not name (loss=) do not."""
    x, y = jnp.asarray([[3.0, 2.0, 1.0], [1.0, 0.0, 2.0]]), jnp.asarray([1.0, 2.0])

    def fn(w, inputs, targets):
        return jnp.sum((inputs @ w - targets) ** 2)

    opt = O.lbfgs().reduce_on_plateau(patience=5)
    w = jnp.zeros(3)
    state = opt.init(w)
    for _ in range(6):
        value, grad = jax.value_and_grad(fn)(w, x, y)
        updates, state = opt.update(grad, state, w, value=value, grad=grad, value_fn=fn, inputs=x, targets=y,
                                    loss=value)
        w = ux.apply_updates(w, updates)
    assert float(fn(w, x, y)) < 1e-8


def test_value_and_grad_from_state_reuses_the_line_search_evaluation():
    fn, start, _ = PROBLEMS["rosenbrock2"]
    opt = O.lbfgs()
    value_and_grad = ux.value_and_grad_from_state(fn)
    state, params = opt.init(start), start
    value, grad = value_and_grad(params, state=state)  # after init: computed
    np.testing.assert_allclose(value, fn(params), rtol=1e-6)
    updates, state = opt.update(grad, state, params, value=value, grad=grad, value_fn=fn)
    params = ux.apply_updates(params, updates)
    stored = opt.get_state(state, "scale_by_zoom_linesearch")
    value, grad = value_and_grad(params, state=state)
    assert value == stored.value and np.array_equal(grad, stored.grad)
    expected_value, expected_grad = jax.value_and_grad(fn)(params)
    np.testing.assert_allclose(value, expected_value, rtol=1e-6)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5)
    with pytest.raises(ValueError, match="value_and_grad_from_state: the state holds 0 line-search states"):
        value_and_grad(params, state=ux.scale_by_lbfgs().init(params))
    plain = ux.scale(-1.0).scale_by_backtracking_linesearch(5)  # store_grad=False keeps no gradient
    with pytest.raises(ValueError, match="store_grad=True"):
        value_and_grad(params, state=plain.init(params))


@pytest.mark.parametrize("build", [
    lambda: ux.scale(-1.0).scale_by_zoom_linesearch(5),
    lambda: ux.scale(-1.0).scale_by_backtracking_linesearch(5),
], ids=["zoom", "backtracking"])
def test_the_line_searches_ask_for_the_objective_by_name(build):
    opt = build()
    name = opt.stages[-1].label
    w = jnp.ones(2)
    with pytest.raises(ValueError, match=rf"{name} needs the objective: call update\(updates, state, params, "
                                         r"value=value, grad=grad, value_fn=fn\)"):
        opt.update(w, opt.init(w), w, loss=1.0)
    with pytest.raises(ValueError, match=rf"{name}: update got value= alone"):
        opt.update(w, opt.init(w), w, value=1.0, value_fn=jnp.sum)
    both = opt.stages[-1]._with_option("objective", jnp.sum)
    both = ux.Update(opt.stages[:-1] + (both,))
    with pytest.raises(ValueError, match=rf"{name}: update got value_fn= and the stage was built with objective="):
        both.update(w, both.init(w), w, value_fn=jnp.sum)
    with pytest.raises(ValueError, match=rf"{name} needs params"):
        opt.update(w, opt.init(w), value_fn=jnp.sum)


@pytest.mark.parametrize("build, message", [
    (lambda: ux.scale_by_lbfgs(memory_size=0), r"scale_by_lbfgs\(memory_size=0\): memory_size must be an integer in"),
    (lambda: ux.scale_by_lbfgs(scale_init_precond=1), r"scale_by_lbfgs\(scale_init_precond=1\): .* True or False"),
    (lambda: ux.scale_by_zoom_linesearch(0), r"scale_by_zoom_linesearch\(max_linesearch_steps=0\)"),
    (lambda: ux.scale_by_zoom_linesearch(5, curv_rtol=-1.0), r"scale_by_zoom_linesearch\(curv_rtol=-1.0\)"),
    (lambda: ux.scale_by_zoom_linesearch(5, increase_factor=1.0), r"increase_factor must be in \(1, inf\)"),
    (lambda: ux.scale_by_zoom_linesearch(5, initial_guess_strategy="two"), r"must be 'keep' or 'one'"),
    (lambda: ux.scale_by_zoom_linesearch(5, objective=3.0), r"scale_by_zoom_linesearch\(objective=3.0\)"),
    (lambda: ux.scale_by_backtracking_linesearch(-1), r"max_backtracking_steps=-1\)"),
    (lambda: ux.scale_by_backtracking_linesearch(5, decrease_factor=1.0), r"decrease_factor must be in \(0, 1\)"),
    (lambda: O.lbfgs(linesearch="wolfe"), r"lbfgs\(linesearch='wolfe'\): linesearch must be 'zoom'"),
    (lambda: O.lbfgs(linesearch=None, objective=jnp.sum), r"lbfgs\(objective=.*needs a line search"),
])
def test_options_are_checked_when_built(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_the_optimizer_is_its_pipeline():
    assert O.lbfgs() == ux.scale_by_lbfgs().scale(-1.0).scale_by_zoom_linesearch(20, initial_guess_strategy="one")
    assert O.lbfgs(0.5, memory_size=3, linesearch="backtracking") == ux.scale_by_lbfgs(3).scale_by_learning_rate(
        0.5).scale_by_backtracking_linesearch(20, store_grad=True)
    assert O.lbfgs(linesearch=None) == ux.scale_by_lbfgs().scale(-1.0)
    assert O.lbfgs(objective=rosenbrock).stages[-1].option("objective") is rosenbrock


def test_a_failed_backtracking_search_takes_no_step():
    """Every value tried is NaN: the step is 0, and the stored value and gradient are those at the params."""
    def fn(w):
        return jnp.where(jnp.all(w == 1.0), jnp.sum(w), jnp.nan)

    opt = ux.scale(-1.0).scale_by_backtracking_linesearch(3, store_grad=True)
    w = jnp.ones(2)
    updates, state = opt.update(jnp.ones(2), opt.init(w), w, value=2.0, grad=jnp.ones(2), value_fn=fn)
    np.testing.assert_array_equal(updates, jnp.zeros(2))
    stored = opt.get_state(state, "scale_by_backtracking_linesearch")
    assert float(stored.learning_rate) == 0.0 and float(stored.value) == 2.0
    np.testing.assert_array_equal(stored.grad, jnp.ones(2))


@pytest.mark.parametrize("build, reference", [
    (lambda: ux.scale(-1.0).scale_by_backtracking_linesearch(3),
     lambda: optax.chain(optax.scale(-1.0), optax.scale_by_backtracking_linesearch(3))),
    (lambda: ux.scale(-1.0).scale_by_zoom_linesearch(3),
     lambda: optax.chain(optax.scale(-1.0), optax.scale_by_zoom_linesearch(3))),
], ids=["backtracking", "zoom_keep"])
def test_after_a_failed_search_the_next_one_starts_again(build, reference):
    """A search that finds only NaN takes a step of 0; optax then tries 0 (its last step, grown) forever."""
    def undefined(w):
        return jnp.full([], jnp.nan)

    def fn(w):
        return jnp.sum(w**2)

    w = jnp.ones(2)
    value, grad = jax.value_and_grad(fn)(w)
    steps = []
    for opt in [build(), reference()]:
        u, state = opt.update(grad, opt.init(w), w, value=value, grad=grad, value_fn=undefined)
        np.testing.assert_array_equal(u, jnp.zeros(2))
        u, _ = opt.update(grad, state, w, value=value, grad=grad, value_fn=fn)
        steps.append(float(fn(w + u)))
    assert steps[0] < float(value) and steps[1] == float(value)


@pytest.mark.parametrize("build, reference", [
    (lambda: ux.scale_by_backtracking_linesearch(20),
     lambda: optax.scale_by_backtracking_linesearch(20)),
    (lambda: ux.scale_by_zoom_linesearch(20),
     lambda: optax.scale_by_zoom_linesearch(20)),
    (lambda: ux.scale_by_zoom_linesearch(12, initial_guess_strategy="one"),
     lambda: optax.scale_by_zoom_linesearch(12, initial_guess_strategy="one")),
], ids=["backtracking", "zoom_keep", "zoom_one"])
def test_along_an_uphill_direction_the_search_fails_and_steps_uphill_as_optax_does(build, reference):
    """The gradient itself as the direction: no step has sufficient decrease. Both searches use all their steps
    and take the last one tried (uphill), as optax's do, and say so in the state (decrease_error > 0)."""
    w = nested_tree(seed=0)
    value, grad = jax.value_and_grad(quadratic)(w)
    opt, ref = build(), reference()
    updates, state = jax.jit(lambda: opt.update(grad, opt.init(w), w, value=value, grad=grad,
                                                value_fn=quadratic))()
    expected, ref_state = jax.jit(lambda: ref.update(grad, ref.init(w), w, value=value, grad=grad,
                                                     value_fn=quadratic))()
    for a, b in zip(jax.tree.leaves(updates), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, **TOL)
    stage = state[0]
    assert int(stage.num_linesearch_steps) == int(ref_state.info.num_linesearch_steps)
    np.testing.assert_allclose(stage.decrease_error, ref_state.info.decrease_error, rtol=1e-4)
    assert float(stage.decrease_error) > 0.0
    assert float(quadratic(ux.apply_updates(w, updates))) > float(value)  # a step uphill
    if not hasattr(stage, "curvature_error"):  # backtracking: 20 reductions by 0.8 from 1
        np.testing.assert_allclose(stage.learning_rate, 0.8**20, rtol=1e-6)
    else:  # shrunk towards 0
        assert 0.0 < float(stage.learning_rate) < 1e-3


def _printed(capsys, opt, w, direction, jit):
    f = lambda p: jnp.sum(p**2)  # noqa: E731
    def step(direction, state, w):
        return opt.update(direction, state, w, value_fn=f)

    _, state = (jax.jit(step) if jit else step)(direction, opt.init(w), w)
    jax.effects_barrier()
    return capsys.readouterr().out, state[-1]


def _numbers(text):
    import re

    return [float(x) for x in re.findall(r"-?\d+\.?\d*(?:e-?\d+)?", text.splitlines()[0].split(":", 1)[1])]


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_verbose_prints_a_failed_search_and_nothing_else(capsys, jit):
    """optax's ``verbose``: f(w) = |w|² at w = (1, 2, 3), f = 14 and ∇f = 2w. Along +∇f (uphill) backtracking
    fails: 4 tries (1, then 3 reductions by 0.8), slope |∇f|² = 56, step 0.8³, and decrease error
    f(w + 0.512·2w) - 14 - 1e-4·0.512·56. Zoom with one evaluation and c₂ = 0 along -∇f: the step 1 lands on -w,
    decrease error 14 - 14 + 1e-4·56 and curvature error |⟨∇f(-w), -∇f⟩| = 56. A search that succeeds, or one
    built without ``verbose``, prints nothing."""
    w = jnp.array([1.0, 2.0, 3.0])
    g = 2 * w
    out, state = _printed(capsys, ux.scale_by_backtracking_linesearch(3, verbose=True), w, g, jit)
    assert out.startswith("scale_by_backtracking_linesearch: no step with sufficient decrease in 4 tries"), out
    tries, value, slope, step, error = _numbers(out)
    assert (tries, value, slope) == (4, 14.0, 56.0)
    np.testing.assert_allclose([step, error], [0.8**3, 14 * (1 + 2 * 0.8**3) ** 2 - 14 - 1e-4 * 0.8**3 * 56],
                               rtol=1e-6)
    np.testing.assert_allclose(error, state.decrease_error, rtol=1e-6)
    assert out.splitlines()[1:] == ["  the update is not a descent direction: its slope is not below 0"], out
    out, state = _printed(capsys, ux.scale_by_zoom_linesearch(1, curv_rtol=0.0, verbose=True), w, -g, jit)
    assert out.startswith("scale_by_zoom_linesearch: no step meeting both conditions after 1 evaluations"), out
    tries, value, slope, step, decrease, curvature = _numbers(out)
    assert (tries, value, slope, step, curvature) == (1, 14.0, -56.0, 1.0, 56.0)
    np.testing.assert_allclose(decrease, 1e-4 * 56, rtol=1e-5)
    assert len(out.splitlines()) == 1, out
    # Capped at 0.01 along -∇f: the step lands on 0.98·w, slope ⟨1.96·w, -2·w⟩ = -54.88, curvature error
    # 54.88 - 0.9·56 = 4.48 (sufficient decrease holds), and the hint to raise max_learning_rate.
    out, state = _printed(capsys, ux.scale_by_zoom_linesearch(20, max_learning_rate=0.01, verbose=True), w, -g, jit)
    tries, value, slope, step, decrease, curvature = _numbers(out)
    assert (tries, value, slope, decrease) == (1, 14.0, -56.0, 0.0)
    np.testing.assert_allclose([step, curvature], [0.01, 54.88 - 0.9 * 56], rtol=1e-5)
    assert out.splitlines()[1].startswith("  the step reached max_learning_rate (0.0099999"), out
    for quiet, direction in [(ux.scale_by_backtracking_linesearch(15, verbose=True), -g),
                             (ux.scale_by_zoom_linesearch(20, verbose=True), -g),
                             (ux.scale_by_backtracking_linesearch(3), g),
                             (ux.scale_by_zoom_linesearch(1, curv_rtol=0.0), -g)]:
        out, state = _printed(capsys, quiet, w, direction, jit)
        assert out == "", (quiet, out)


def test_verbose_is_a_late_flag():
    """Built without it, or with False, a search prints, compares and hashes as it did before the option."""
    for make in (ux.scale_by_zoom_linesearch, ux.scale_by_backtracking_linesearch):
        assert make(5) == make(5, verbose=False) and "verbose" not in repr(make(5, verbose=False))
        assert make(5, verbose=True) != make(5) and "verbose=True" in repr(make(5, verbose=True))
        with pytest.raises(TypeError, match=r"verbose must be True or False"):
            make(5, verbose="yes")
