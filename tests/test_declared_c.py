"""Declared domains for the learning-rate-free stages, L-BFGS and the line searches, the averages of the params
(schedule-free, EMA, SWA) and the moving averages; and the defects the declarations fixed there.

Each defect has its test: a scheduled ``b1`` of ``schedule_free`` refused by name (the step carries
``y = b1·x + (1 - b1)·z`` with one ``b1``); a negative learning rate of ``schedule_free`` refused (it turned the
averaging off); ``schedule_free_eval_params`` reaching a schedule-free stage inside a wrapper by path; every state
field keeping its dtype and shape across steps under ``JAX_ENABLE_X64`` (in a subprocess: x64 must be set before
JAX starts); a loss or value that is not a scalar refused by name; the options that size state or loops bounded;
the zoom line search stopping once its interval has collapsed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import updax as ux
from conftest import finish, finished, start_float64
from registry import nested_tree

#: Its module-scoped fixture starts a subprocess: with pytest-xdist, one worker runs the whole module, once.
pytestmark = pytest.mark.xdist_group("declared_c")

O = ux.optimizers


# --------------------------------------------------------------------------
# schedule_free: b1 is a number, the learning rate >= 0, the eval params by path


def test_a_scheduled_b1_of_schedule_free_is_refused_by_name_with_the_reason():
    message = (r"^schedule_free\(b1=.*\): b1 must be a number in \(0, 1\), not a schedule: each step carries "
               r"y = b1·x \+ \(1 - b1\)·z with one b1")
    with pytest.raises(TypeError, match=message):
        ux.scale_by_learning_rate(0.1).schedule_free(0.1, b1=lambda count: 0.9)
    with pytest.raises(TypeError, match=message):  # the optimizer passes its b1 on
        O.schedule_free_adamw(0.01, b1=ux.schedules.linear_schedule(0.9, 0.95, 10))
    with pytest.raises(ValueError, match=r"^schedule_free\(b1=1\.0\): b1 must be in \(0, 1\)$"):
        ux.scale_by_learning_rate(0.1).schedule_free(0.1, b1=1.0)
    opt = ux.scale_by_learning_rate(0.1).schedule_free(0.1, b1=0.5)
    assert opt.stages[-1].scheduled == frozenset() and "b1" not in opt.stages[-1].schedulable


def test_b1_is_fixed_for_the_run_so_it_is_not_held():
    """A b1 replaced between steps would move y off the average as a scheduled one does: b1 is static."""
    opt = ux.hyperparams_in_state(ux.scale_by_learning_rate(0.1).schedule_free(0.1, b1=0.5))
    state = opt.init({"w": jnp.zeros(2)})
    assert float(opt.get_state(state, "schedule_free.b1")) == 0.5
    with pytest.raises(KeyError, match=r"b1 is a hyperparameter, not state"):
        opt.replace_state(state, "schedule_free.b1", 0.25)
    assert not [p for p, _ in jax.tree_util.tree_flatten_with_path(opt)[0] if "b1" in jax.tree_util.keystr(p)]


def test_a_negative_learning_rate_of_schedule_free_is_refused():
    """It turned the averaging off: the weights are powers of the largest rate so far, which stayed 0."""
    with pytest.raises(ValueError, match=r"^schedule_free\(learning_rate=-0\.1\): learning_rate must be in "
                                         r"\[0, inf\)"):
        ux.scale_by_learning_rate(0.1).schedule_free(-0.1)
    opt = ux.scale_by_learning_rate(0.1).schedule_free(lambda count: 0.1 - 0.2 * count)
    params = {"w": jnp.zeros(2)}
    state = opt.init(params)
    _, state = opt.update({"w": jnp.ones(2)}, state, params)  # 0.1: fine
    with pytest.raises(ValueError, match=r"^schedule_free\(learning_rate=-0\.1.*\): learning_rate must be in "
                                         r"\[0, inf\).*\(the value its schedule returned at count 1\)$"):
        opt.update({"w": jnp.ones(2)}, state, params)


def _run(opt, params, steps, z_path):
    state, zs = opt.init(params), []
    for t in range(steps):
        u, state = opt.update(nested_tree(seed=t + 1), state, params)
        params = ux.apply_updates(params, u)
        zs.append([np.asarray(z, np.float64) for z in jax.tree.leaves(opt.get_state(state, z_path))])
    return params, state, zs


def test_schedule_free_eval_params_reaches_a_stage_inside_a_wrapper_by_path():
    """At a constant learning rate the averaging weights are equal: the eval params are the mean of the base
    iterates z_1..z_t (the paper's x_t), here read from the state of a schedule-free pipeline inside
    apply_if_finite, and equal to those of the same pipeline unwrapped."""
    inner = ux.scale_by_adam(b1=0.0).scale_by_learning_rate(0.1).schedule_free(0.1)
    wrapped = inner.apply_if_finite()
    path = "apply_if_finite/schedule_free"
    params, state, zs = _run(wrapped, nested_tree(seed=0), 4, f"{path}.z")
    with pytest.raises(ValueError, match=r"^schedule_free_eval_params: .* has 0 schedule_free stages at the top; "
                                         r"name the one to read with path= \(such stages: "
                                         r"'apply_if_finite/schedule_free'\)$"):
        ux.schedule_free_eval_params(wrapped, state, params)
    evaluated = ux.schedule_free_eval_params(wrapped, state, params, path=path)
    for got, *z in zip(jax.tree.leaves(evaluated), *zs):
        np.testing.assert_allclose(np.asarray(got, np.float64), np.mean(z, axis=0), rtol=2e-5, atol=2e-6)
    plain_params, plain_state, _ = _run(inner, nested_tree(seed=0), 4, "schedule_free.z")
    plain = ux.schedule_free_eval_params(inner, plain_state, plain_params)  # today's call
    for got, want in zip(jax.tree.leaves(evaluated), jax.tree.leaves(plain)):
        np.testing.assert_array_equal(got, want)


def test_schedule_free_eval_params_picks_one_of_two_stages_by_path():
    first = ux.scale_by_learning_rate(0.1).schedule_free(0.1, b1=0.5)
    second = ux.scale_by_learning_rate(0.1).schedule_free(0.1, b1=0.8)
    opt = ux.Update(first.stages + second.stages)
    params = {"w": jnp.ones(2)}
    state = opt.init(params)
    with pytest.raises(ValueError, match=r"has 2 schedule_free stages at the top; .*'schedule_free\[0\]', "
                                         r"'schedule_free\[1\]'"):
        ux.schedule_free_eval_params(opt, state, params)
    state = opt.replace_state(state, "schedule_free[1].z", {"w": jnp.full(2, 3.0)})
    # z + (y - z)/b1 with y = 1, z = 3, b1 = 0.8
    np.testing.assert_allclose(ux.schedule_free_eval_params(opt, state, params, path="schedule_free[1]")["w"],
                               3.0 + (1.0 - 3.0) / 0.8, rtol=1e-6)


# --------------------------------------------------------------------------
# Every state field keeps its dtype and shape across steps under x64


def _f64(value):
    """A schedule returning a float64 scalar (under x64): the value a user's schedule gives there."""
    return lambda count: jnp.full([], value, jnp.float64)


def _objective(params):
    return sum(jnp.sum((x - 1.0) ** 2) for x in jax.tree.leaves(params))


#: Every stage of these files, each schedulable option a float64 schedule (and at the defaults' numbers).
X64_CASES = {
    "scale_by_prodigy": lambda s: ux.scale_by_prodigy(learning_rate=s(1.0), b1=s(0.9), b2=s(0.99), b3=s(0.9),
                                                      eps=s(1e-8), estim_lr_coef=s(1.0), decay=s(0.1)),
    "scale_by_dadapt_adamw": lambda s: ux.scale_by_dadapt_adamw(learning_rate=s(1.0), b1=s(0.9), b2=s(0.99),
                                                                eps=s(1e-8), decay=s(0.1)),
    "scale_by_dog": lambda s: ux.scale_by_dog(init_step_type="learning_rate", eps=s(1e-8)),
    "scale_by_dowg": lambda s: ux.scale_by_dowg(eps=s(1e-4)),
    "scale_by_cocob": lambda s: ux.scale_by_cocob(alpha=s(10.0)),
    "scale_by_polyak": lambda s: ux.scale_by_polyak(f_min=s(0.0), max_learning_rate=s(0.5), eps=s(1e-6)),
    "mechanize": lambda s: ux.scale_by_learning_rate(1.0).mechanize(decay=s(0.01), eps=s(1e-8)),
    "scale_by_lbfgs": lambda s: ux.scale_by_lbfgs(3),
    "scale_by_zoom_linesearch": lambda s: ux.scale(-1.0).scale_by_zoom_linesearch(
        8, max_learning_rate=s(10.0), tol=s(0.0), increase_factor=s(2.0), slope_rtol=s(1e-4), curv_rtol=s(0.9),
        approx_dec_rtol=s(1e-6), stepsize_precision=s(1e-5)),
    "scale_by_backtracking_linesearch": lambda s: ux.scale(-1.0).scale_by_backtracking_linesearch(
        8, slope_rtol=s(1e-4), decrease_factor=s(0.8), increase_factor=s(1.5), max_learning_rate=s(1.0),
        atol=s(0.0), rtol=s(0.0), store_grad=True),
    "schedule_free": lambda s: ux.scale_by_learning_rate(s(0.1)).schedule_free(s(0.1), weight_lr_power=s(2.0)),
    "schedule_free_adamw_warmup": lambda s: O.schedule_free_adamw(0.01, warmup_steps=5),
    "ema": lambda s: ux.ema(s(0.9)),
    "ema_not_debiased": lambda s: ux.ema(s(0.9), debias=False, keep_previous=True),
    "ema_decay_min": lambda s: ux.ema(s(0.9), decay_min=True),
    "sma": lambda s: ux.sma(3),
    "weighted_moving_average": lambda s: ux.weighted_moving_average(s(0.8)),
    "ema_params": lambda s: ux.scale(-0.1).ema_params(s(0.9), decay_min=True),
    "swa": lambda s: ux.scale(-0.1).swa(start=1, period=1),
}


def _signature(tree):
    return [(jax.tree_util.keystr(path), jnp.result_type(x).name, jnp.shape(x))
            for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def x64_state_checks():
    """Runs under ``JAX_ENABLE_X64=1`` (:func:`test_every_state_field_keeps_its_dtype_and_shape_under_x64` starts
    it): each case, with float64 schedules, at numbers and with its numbers held in the state, for float32 and
    float64 params, an eager step and 2 steps of a ``lax.scan`` (whose carry must keep its types); raises on the
    first state whose dtypes or shapes differ from ``init``'s."""
    assert jax.config.jax_enable_x64

    def builds(make):
        yield "scheduled", make(_f64)
        plain = make(lambda value: value)
        yield "numbers", plain
        yield "held", ux.hyperparams_in_state(plain)

    for dtype in (jnp.float32, jnp.float64):
        start = {"a": jnp.arange(1.0, 4.0, dtype=dtype), "b": jnp.full((2, 2), 0.5, dtype)}
        for name, make in X64_CASES.items():
            for kind, opt in builds(make):
                def step(params, state, opt=opt):
                    value, grad = jax.value_and_grad(_objective)(params)
                    updates, state = opt.update(grad, state, params, loss=value, value=value, grad=grad,
                                                value_fn=_objective)
                    return jax.tree.map(lambda p, u: p - 0.01 * u, params, updates), state

                where = f"{name} ({kind}, {jnp.dtype(dtype).name} params)"
                state = opt.init(start)
                expected = _signature(state)
                _, after = step(start, state)  # eagerly
                assert _signature(after) == expected, (where, _signature(after), expected)
                (_, after), _ = jax.lax.scan(lambda carry, _: (step(*carry), None), (start, state), None, length=2)
                assert _signature(after) == expected, (where, "scan")
    print("x64 state checks passed")


@pytest.fixture(scope="module")
def x64_run():
    proc = start_float64("test_declared_c", "x64_state_checks")
    yield proc
    finish(proc)


def test_every_state_field_keeps_its_dtype_and_shape_under_x64(x64_run):
    """schedule_free_adamw's warm-up (a float64 schedule under x64) widened weight_sum and max_lr from float32 to
    float64 on the first step; mechanize's s and m and the zoom search's errors (a while loop's carry: an error)
    widened the same way with a float64 schedule."""
    assert "x64 state checks passed" in finished(x64_run)


# --------------------------------------------------------------------------
# A loss or a value that is not a scalar is refused by name


def test_polyak_refuses_a_loss_per_example():
    """A vector loss broadcast into a step per coordinate; a scalar one gives the closed form."""
    opt = ux.scale_by_polyak(max_learning_rate=10.0)
    g = {"w": jnp.array([1.0, 2.0, 2.0])}
    message = (r"^scale_by_polyak: update\(\.\.\., loss=\.\.\.\) got float32 of shape \(3,\); loss must be a real "
               r"scalar \(the mean over the batch, not one value per example\)")
    with pytest.raises(TypeError, match=message):
        opt.update(g, opt.init(None), loss=jnp.array([1.0, 2.0, 3.0]))
    with pytest.raises(TypeError, match=message):
        jax.jit(lambda g, loss: opt.update(g, opt.init(None), loss=loss))(g, jnp.array([1.0, 2.0, 3.0]))
    with pytest.raises(TypeError, match=r"^scale_by_polyak: update\(\.\.\., loss=\.\.\.\) got float32 of shape "):
        O.polyak_sgd().update(g, O.polyak_sgd().init(g), g, loss=jnp.ones(3))
    u, _ = opt.update(g, opt.init(None), loss=jnp.float32(4.5))
    np.testing.assert_allclose(u["w"], 4.5 / 9.0 * np.array([1.0, 2.0, 2.0]), rtol=1e-6)  # (f - f_min)/‖g‖²·g


@pytest.mark.parametrize("linesearch, call", [("zoom", "scale_by_zoom_linesearch"),
                                              ("backtracking", "scale_by_backtracking_linesearch")])
def test_lbfgs_and_the_line_searches_refuse_a_value_that_is_not_a_scalar(linesearch, call):
    opt = O.lbfgs(linesearch=linesearch)
    w = jnp.ones(3)
    value, grad = jax.value_and_grad(_objective)(w)
    with pytest.raises(TypeError, match=rf"^{call}: update\(\.\.\., value=\.\.\.\) got float32 of shape \(3,\); "
                                        r"value must be a real scalar"):
        opt.update(grad, opt.init(w), w, value=(w - 1.0) ** 2, grad=grad, value_fn=_objective)
    with pytest.raises(TypeError, match=rf"^{call}: value_fn\(params\) returned float32 of shape \(3,\); the "
                                        r"objective must return a real scalar"):
        jax.jit(lambda w: opt.update(grad, opt.init(w), w, value=value, grad=grad,
                                     value_fn=lambda p: (p - 1.0) ** 2))(w)
    built = O.lbfgs(linesearch=linesearch, objective=lambda p: (p - 1.0) ** 2)
    with pytest.raises(TypeError, match=rf"^{call}: objective\(params\) returned float32 of shape \(3,\)"):
        built.update(grad, built.init(w), w)


# --------------------------------------------------------------------------
# The options that size state or loops are bounded


@pytest.mark.parametrize("build, message", [
    (lambda: ux.scale_by_lbfgs(memory_size=10**9),
     r"^scale_by_lbfgs\(memory_size=1000000000\): memory_size must be an integer in \[1, 1000\] \(the state holds "
     r"2·memory_size copies of the params"),
    (lambda: O.lbfgs(memory_size=1001), r"^scale_by_lbfgs\(memory_size=1001\): memory_size must be an integer in "),
    (lambda: ux.sma(10**9),
     r"^sma\(window=1000000000\): window must be an integer in \[1, 100000\] \(the state holds window copies"),
    (lambda: ux.scale_by_zoom_linesearch(10**9),
     r"^scale_by_zoom_linesearch\(max_linesearch_steps=1000000000\): max_linesearch_steps must be an integer in "
     r"\[1, 1000\] \(each step evaluates the objective"),
    (lambda: ux.scale_by_backtracking_linesearch(1001),
     r"^scale_by_backtracking_linesearch\(max_backtracking_steps=1001\): max_backtracking_steps must be an integer "
     r"in \[0, 1000\]"),
    (lambda: ux.scale(1.0).mechanize(num_betas=10**9),
     r"^mechanize\(num_betas=1000000000\): num_betas must be an integer in \[1, 16\] \(the decays 1 - 10\^-i"),
], ids=["memory_size", "lbfgs_memory_size", "window", "max_linesearch_steps", "max_backtracking_steps",
        "num_betas"])
def test_what_sizes_state_or_a_loop_is_bounded(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_the_bounds_themselves_are_accepted():
    assert ux.scale_by_lbfgs(1000).init(jnp.zeros(2))[0].s_memory.shape == (1000, 2)
    window = ux.sma(100_000)
    mean, _ = window.update(jnp.float32(3.0), window.init(jnp.float32(0.0)))
    assert float(mean) == 3.0  # the mean of what has been seen
    assert ux.scale_by_zoom_linesearch(1000).stages[0].option("max_linesearch_steps") == 1000
    assert ux.scale_by_backtracking_linesearch(1000).stages[0].option("max_backtracking_steps") == 1000
    betas = ux.scale(1.0).mechanize(num_betas=16)
    assert betas.init({"w": jnp.zeros(2)})[0].s.shape == (16,)


# --------------------------------------------------------------------------
# The zoom line search stops once its interval has collapsed


def _quadratic(params):
    return 0.5 * sum(jnp.sum((i + 1.0) * (x - 0.25) ** 2) for i, x in enumerate(jax.tree.leaves(params)))


def _search(opt, w, fn, direction):
    value, grad = jax.value_and_grad(fn)(w)
    return jax.jit(lambda: opt.update(direction(grad), opt.init(w), w, value=value, grad=grad, value_fn=fn))()


@pytest.mark.parametrize("case", ["uphill", "flat at zero"])
def test_a_search_that_cannot_succeed_stops_once_its_interval_has_collapsed(case):
    """Along the gradient itself no step of a convex objective has sufficient decrease: the search shrinks its
    interval towards 0. Once no step in it moves the params (or, from params at 0, once it is below the smallest
    normal number), it stops with the last, finite step; optax's goes on evaluating the same point until
    max_linesearch_steps."""
    if case == "uphill":
        w, fn = nested_tree(seed=0), _quadratic
    else:  # w = 0: every step moves some param until it underflows
        w, fn = jnp.zeros(3), (lambda p: jnp.sum(p))
    updates, state = _search(ux.scale_by_zoom_linesearch(1000), w, fn, lambda g: g)
    _, ref_state = _search(optax.scale_by_zoom_linesearch(1000), w, fn, lambda g: g)
    assert int(ref_state.info.num_linesearch_steps) == 1000  # optax: every step
    steps = int(state[0].num_linesearch_steps)
    assert steps < (60 if case == "uphill" else 140), steps
    assert all(np.all(np.isfinite(u)) for u in jax.tree.leaves(updates))
    step = float(state[0].learning_rate)
    assert 0.0 < step < 1e-6
    moved = ux.apply_updates(w, updates)
    if case == "uphill":  # the step moves no param
        for a, b in zip(jax.tree.leaves(moved), jax.tree.leaves(w)):
            np.testing.assert_array_equal(a, b)
    else:
        assert step <= float(jnp.finfo(jnp.float32).tiny)


def test_on_an_ordinary_problem_the_search_is_optax_s_with_many_steps_allowed():
    """Five descent steps on Rosenbrock's function: the same steps and evaluations as optax's zoom search."""
    def rosenbrock(x):
        return jnp.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2)

    ours = ux.scale(-1.0).scale_by_zoom_linesearch(1000)
    theirs = optax.chain(optax.scale(-1.0), optax.scale_by_zoom_linesearch(1000))
    w1 = w2 = jnp.asarray([-1.2, 1.0])
    s1, s2 = ours.init(w1), theirs.init(w2)
    for t in range(5):
        v1, g1 = jax.value_and_grad(rosenbrock)(w1)
        v2, g2 = jax.value_and_grad(rosenbrock)(w2)
        u1, s1 = ours.update(g1, s1, w1, value=v1, grad=g1, value_fn=rosenbrock)
        u2, s2 = theirs.update(g2, s2, w2, value=v2, grad=g2, value_fn=rosenbrock)
        np.testing.assert_allclose(u1, u2, rtol=2e-5, atol=1e-6, err_msg=f"step {t + 1}")
        assert int(s1[1].num_linesearch_steps) == int(s2[1].info.num_linesearch_steps)
        w1, w2 = ux.apply_updates(w1, u1), optax.apply_updates(w2, u2)


# --------------------------------------------------------------------------
# State fields declare what they hold


@pytest.mark.parametrize("build, path, bad, message", [
    (lambda: ux.scale_by_lbfgs(3), "scale_by_lbfgs.count", -1, r"must be a non-negative integer"),
    (lambda: ux.scale_by_learning_rate(0.1).schedule_free(0.1), "schedule_free.max_lr", -1.0,
     r"must be in \[0, inf\)"),
    (lambda: ux.scale(-1.0).scale_by_zoom_linesearch(5), "scale_by_zoom_linesearch.learning_rate", -0.5,
     r"must be in \[0, inf\)"),
    (lambda: ux.ema(0.9), "ema.total_weight", 1.5, r"must be in \[0, 1\]"),
    (lambda: ux.swa(), "swa.snapshots", -2, r"must be a non-negative integer"),
    (lambda: ux.scale_by_prodigy(), "scale_by_prodigy.estim_lr", 0.0, r"must be in \(0, inf\)"),
    (lambda: ux.scale_by_cocob(), "scale_by_cocob.reward", {"w": jnp.array([1.0, -1.0])}, r"must be in \[0, inf\)"),
])
def test_replace_state_refuses_what_a_field_cannot_hold(build, path, bad, message):
    opt = build()
    state = opt.init({"w": jnp.zeros(2)})
    with pytest.raises(ValueError, match=message):
        opt.replace_state(state, path, bad)
