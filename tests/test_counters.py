"""Step counters at their limit: every counter saturates or stays in its range, and stays correct.

The registry-driven test finds every int32 scalar of every entry's state by
walking the state, starts each one at ``INT32_MAX - 2`` (a counter bounded
by an option, such as a mini-step counter, at its own limit instead), and
runs a few jitted steps. The same steps from the counters at 0 say how many
times each counter counts, so the expected end values follow without listing
them by hand. The specific tests check what depends on a counter past the
limit against references written here (numpy means, running means, closed
forms) and the schedules' closed forms in tests/test_schedules.py.

Under ``JAX_ENABLE_X64`` the counters are int64 and count past 2**31 - 1:
:func:`x64_counter_checks` (in a subprocess, as x64 must be set before JAX
starts) finds an int64 counter and no int32 one in every entry's state, runs
entries that cover every way a counter steps (saturating, cyclic, bounded,
reset, a scheduled option's own count) from just below 2**31 and from just
below 2**63, and checks integer options and schedules past 2**31 - 1
against closed forms.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import finish, finished, start_float64
from registry import ENTRIES, updates_for
from test_schedules import CASES as SCHEDULE_CASES

import updax as ux
import updax.schedules as uxs

INT32_MAX = int(jnp.iinfo(jnp.int32).max)
#: The step counters' dtype and its maximum: int32, or int64 in the x64 subprocess.
COUNT_DTYPE = jax.dtypes.canonicalize_dtype(jnp.int64)
TOP = int(jnp.iinfo(COUNT_DTYPE).max)
START = TOP - 2
STEPS = 5
LOSS = 1.0

RNG = np.random.default_rng(11)
PARAMS = {"w": jnp.asarray(RNG.normal(size=(2, 3)), jnp.float32)}  # one small matrix: one compile per entry is the cost
GRADS = [jax.tree.map(lambda p: jnp.asarray(RNG.normal(size=p.shape), p.dtype), PARAMS) for _ in range(STEPS)]

#: Scheduled options keep their own count (``ScheduledState.count``); the registry has none.
EXTRA = {
    "scheduled_adam": lambda: ux.scale_by_adam(b1=uxs.exponential_decay(0.9, decay_rate=0.5, transition_steps=1000,
                                                                        end_value=0.5)),
    "scheduled_learning_rate": lambda: ux.scale_by_learning_rate(
        uxs.warmup_cosine_decay(0.0, 0.1, warmup_steps=2, decay_steps=10)),
    "adafactor": lambda: ux.optimizers.adafactor(),
}
BUILDERS = {**ENTRIES, **EXTRA}
NAMES = sorted(BUILDERS)

#: Counters that must stay below a bound set by an option of their stage: (state type, field) -> (stage, the
#: largest value the counter may hold, from the stage's options). They start at that value.
BOUNDED = {
    ("AccumulateGradientsState", "mini_step"): ("accumulate_gradients", lambda s: s.option("steps") - 1),
    ("ReduceOnPlateauState", "count"): ("reduce_on_plateau", lambda s: s.option("accumulation_size") - 1),
    ("ReduceOnPlateauState", "plateau_count"): ("reduce_on_plateau", lambda s: s.option("patience") - 1),
    ("ReduceOnPlateauState", "cooldown_count"): ("reduce_on_plateau", lambda s: s.option("cooldown")),
    ("LookaheadState", "steps_since_sync"): ("lookahead", lambda s: s.option("sync_period") - 1),
    ("SamState", "steps_since_sync"): ("sam", lambda s: s.option("sync_period") - 1),
    ("ApplyEveryState", "count"): ("apply_every", lambda s: s.option("k") - 1),
    ("LossScaleState", "counter"): ("loss_scale", lambda s: s.option("period") - 1),  # finite steps since a change
    # (the conditional wrappers' step decides which calls run the pipeline inside: started at the limit in both
    # runs, it stays there, saturated, and both runs run the same calls)
    ("ConditionallyMaskState", "step"): ("conditionally_mask", lambda s: TOP),
    ("ConditionallyTransformState", "step"): ("conditionally_transform", lambda s: TOP),
    # (evaluations in the last line search: a diagnostic overwritten each call, bounded by its option)
    ("ScaleByBacktrackingLinesearchState", "num_linesearch_steps"): (
        "scale_by_backtracking_linesearch", lambda s: s.option("max_backtracking_steps") + 1),
    ("ScaleByZoomLinesearchState", "num_linesearch_steps"): (
        "scale_by_zoom_linesearch", lambda s: s.option("max_linesearch_steps")),
}
#: Counters that, past the limit, cycle through their last ``period`` values: (state type, field) -> (stage,
#: the option holding the period).
CYCLIC = {("SmaState", "count"): ("sma", "window"), ("SwaState", "count"): ("swa", "period"),
          ("ScaleBySophiaState", "count"): ("scale_by_sophia", "update_interval")}


@pytest.fixture(autouse=True)
def strict_promotion():
    with jax.numpy_dtype_promotion("strict"):
        yield


def _is_counter(leaf):
    return isinstance(leaf, jax.Array) and leaf.dtype == COUNT_DTYPE and leaf.ndim == 0


def _child(node, key):
    if isinstance(key, jax.tree_util.SequenceKey):
        return node[key.idx]
    if isinstance(key, jax.tree_util.DictKey):
        return node[key.key]
    return getattr(node, key.name)


def _owner(state, path):
    """``(type name of the node holding the leaf at path, the leaf's field)``."""
    node = state
    for key in path[:-1]:
        node = _child(node, key)
    last = path[-1]
    field = getattr(last, "name", getattr(last, "key", getattr(last, "idx", None)))
    return type(node).__name__, field


def _stage(opt, label):
    """The stage named ``label`` in ``opt``, looking inside wrappers."""
    for stage in opt.stages:
        if stage.label == label:
            return stage
        if stage.wraps is not None:
            found = _stage(stage.option(stage.wraps), label)
            if found is not None:
                return found
    return None


def _expected(opt, owner, unbounded):
    """Where a counter that would reach ``unbounded`` ends: saturated, or cycling through its last period."""
    if unbounded <= TOP:
        return unbounded
    if owner in CYCLIC:
        label, option = CYCLIC[owner]
        period = _stage(opt, label).option(option)
        low = TOP - period + 1
        return low + (unbounded - low) % period
    return TOP


def _counters(opt, state):
    """``{path: (owner, limit or None)}`` for every counter (a scalar of the counters' dtype) of ``state``."""
    found = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        if _is_counter(leaf):
            owner = _owner(state, path)
            limit = None
            if owner in BOUNDED:
                label, bound = BOUNDED[owner]
                limit = bound(_stage(opt, label))
            found[jax.tree_util.keystr(path)] = (owner, limit)
    return found


def _set_counters(state, counters, unbounded_start):
    def fill(path, leaf):
        if not _is_counter(leaf):
            return leaf
        _, limit = counters[jax.tree_util.keystr(path)]
        return jnp.asarray(unbounded_start if limit is None else limit, COUNT_DTYPE)

    return jax.tree_util.tree_map_with_path(fill, state)


def _counter_values(state):
    return {jax.tree_util.keystr(p): int(x) for p, x in jax.tree_util.tree_flatten_with_path(state)[0]
            if _is_counter(x)}


@functools.cache
def _counter_run(name, starts=(START,)):
    """Runs entry ``name`` from its counters at 0 and at each of ``starts`` (one jitted step function for all):
    the entry, its counters, their values after the run from 0, and the updates and the final state of each
    run from ``starts``."""
    opt = BUILDERS[name]()
    state = opt.init(PARAMS)
    counters = _counters(opt, state)
    step = jax.jit(lambda s, g: opt.update(updates_for(opt, g), s, PARAMS, loss=LOSS))

    def run(start):
        s, outs = _set_counters(state, counters, start), []
        for g in GRADS:
            u, s = step(s, g)
            outs.append(u)
        return outs, s

    fresh = _counter_values(run(0)[1])
    return opt, counters, fresh, [run(start) for start in starts]


def _floats(tree):
    return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]


@pytest.mark.parametrize("name", NAMES)
def test_counters_at_the_int32_limit(name):
    opt, counters, fresh, [(outs, final)] = _counter_run(name)
    for x in _floats((outs, final)):
        assert bool(jnp.all(jnp.isfinite(x))), f"{name}: a non-finite value past the int32 limit"
    ended = _counter_values(final)
    for path, (owner, limit) in counters.items():
        got, counted = ended[path], fresh[path]
        assert got >= 0, f"{name}{path}: {got} (overflowed)"
        if limit is not None:  # started at its bound in both runs: the same trajectory, within the bound
            assert got == counted and 0 <= got <= limit, f"{name}{path}: {got}, bound {limit}"
        elif counted == 0:  # never counted: untouched, or reset (a consecutive-error count)
            assert got in (0, START), f"{name}{path}: {got}"
        else:
            want = _expected(opt, owner, START + counted)
            assert got == want, f"{name}{path} ({'.'.join(map(str, owner))}): {got}, want {want}"


def test_the_counter_test_sees_the_counters():
    saturated, bounded = set(), set()
    for name in NAMES:
        _, counters, fresh, [(_, final)] = _counter_run(name)
        ended = _counter_values(final)
        for path, (owner, limit) in counters.items():
            field = ".".join(map(str, owner))
            if limit is not None:
                bounded.add((name, field))
            elif START + fresh[path] >= TOP and ended[path] == TOP:
                saturated.add((name, field))
    known = {
        ("scale_by_adam", "ScaleByAdamState.count"), ("scale_by_radam", "ScaleByAdamState.count"),
        ("scale_by_nadam", "ScaleByAdamState.count"), ("scale_by_adan", "ScaleByAdanState.count"),
        ("scale_by_amsgrad", "ScaleByAmsgradState.count"), ("scale_by_novograd", "ScaleByNovogradState.count"),
        ("scale_by_muon", "ScaleByMuonState.count"), ("scale_by_schedule", "ScaleByScheduleState.count"),
        ("scale_by_multiplicative_lr", "ScaleByMultiplicativeLrState.count"),
        ("add_noise", "AddNoiseState.count"), ("ema", "EmaState.count"), ("ema_params", "EmaParamsState.count"),
        ("sma", "SmaState.count"), ("swa", "SwaState.count"), ("swa", "SwaState.snapshots"),
        ("scale_by_factored_rms", "ScaleByFactoredRmsState.count"),
        ("accumulate_gradients", "AccumulateGradientsState.gradient_step"),
        ("accumulate_gradients", "ScaleByAdamState.count"), ("apply_if_finite", "ScaleByAdamState.count"),
        ("schedule_free", "ScaleByAdamState.count"), ("scheduled_adam", "ScheduledState.count"),
        ("scheduled_learning_rate", "ScheduledState.count"), ("adafactor", "ScheduledState.count"),
    }
    assert known <= saturated, sorted(known - saturated)
    assert set(BOUNDED) <= {tuple(field.split(".")) for _, field in bounded}


# --------------------------------------------------------------------------
# What depends on a counter, past the limit


def _with(opt, state, stage, **fields):
    """``state`` with some fields of ``stage``'s state replaced (Python ints as int32 counters)."""
    for field, value in fields.items():
        value = jax.tree.map(lambda x: jnp.asarray(x, jnp.int32 if isinstance(x, int) else jnp.float32), value)
        state = opt.replace_state(state, f"{stage}.{field}", value)
    return state


def test_sma_averages_the_last_window_across_the_limit():
    rng = np.random.default_rng(1)
    window, values = 4, [rng.normal(size=(3,)).astype(np.float32) for _ in range(12)]
    opt = ux.sma(window)
    state = _with(opt, opt.init(jnp.zeros(3)), "sma", count=INT32_MAX - 5)
    step = jax.jit(opt.update)
    for i, x in enumerate(values):
        out, state = step(jnp.asarray(x), state)
        assert int(state[0].count) == _expected(opt, ("SmaState", "count"), INT32_MAX - 4 + i)
        if i >= window - 1:
            np.testing.assert_allclose(out, np.mean(values[i - window + 1:i + 1], axis=0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("period", [1, 2, 3])
def test_swa_keeps_its_snapshot_period_and_running_mean_across_the_limit(period):
    opt = ux.scale(-1.0).swa(start=1, period=period)
    params = {"w": jnp.asarray([0.5, -1.0])}
    taken = [np.array([1.0, 2.0]), np.array([3.0, -1.0]), np.array([0.0, 4.0])]  # snapshots before the limit
    count = INT32_MAX - 6
    state = _with(opt, opt.init(params), "swa", count=count, snapshots=len(taken),
                  average={"w": np.mean(taken, axis=0)})
    step = jax.jit(opt.update)
    rng = np.random.default_rng(period)
    for t in range(count + 1, count + 1 + 4 * period + 3):  # t: the step number, unbounded
        u, state = step({"w": jnp.asarray(rng.normal(size=2), jnp.float32)}, state, params)
        params = ux.apply_updates(params, u)
        if (t - 1) % period == 0:  # start=1: a snapshot of the params after steps 1, 1 + period, ...
            taken.append(np.asarray(params["w"]))
    assert int(state[1].snapshots) == len(taken)
    np.testing.assert_allclose(ux.averaged_params(opt, state)["w"], np.mean(taken, axis=0), rtol=1e-5, atol=1e-6)
    assert INT32_MAX - period < int(state[1].count) <= INT32_MAX


def test_swa_snapshots_saturate_without_moving_the_mean():
    opt = ux.scale(-1.0).swa(start=1, period=1)
    params = {"w": jnp.asarray([1.0, 2.0])}
    state = _with(opt, opt.init(params), "swa", count=INT32_MAX - 1, snapshots=INT32_MAX - 1)
    step = jax.jit(opt.update)
    for _ in range(3):
        _, state = step({"w": jnp.asarray([-100.0, 100.0])}, state, params)
    assert int(state[1].snapshots) == INT32_MAX and int(state[1].count) == INT32_MAX
    # Each new snapshot weighs 1/2^31 of the mean: it cannot move at float32 precision.
    np.testing.assert_allclose(ux.averaged_params(opt, state)["w"], [1.0, 2.0], rtol=1e-6)


def test_accumulate_gradients_keeps_emitting_every_steps_calls_past_the_limit():
    k = 3
    opt = ux.scale(-1.0).accumulate_gradients(k)
    state = _with(opt, opt.init({"w": jnp.zeros(2)}), "accumulate_gradients", gradient_step=INT32_MAX - 1)
    step = jax.jit(opt.update)
    rng = np.random.default_rng(2)
    grads = [np.asarray(rng.normal(size=2), np.float32) for _ in range(4 * k)]
    for i, g in enumerate(grads, 1):
        u, state = step({"w": jnp.asarray(g)}, state)
        assert bool(ux.has_updated(state)) == (i % k == 0)
        assert 0 <= int(state[0].mini_step) < k
        if i % k == 0:
            np.testing.assert_allclose(u["w"], -np.mean(grads[i - k:i], axis=0), rtol=1e-6)
        else:
            np.testing.assert_array_equal(u["w"], 0.0)
    assert int(state[0].gradient_step) == INT32_MAX


def test_accumulate_gradients_mini_step_at_the_int32_maximum_still_steps():
    """A mini_step put at the maximum by hand (or by a checkpoint) saturates and steps instead of wrapping."""
    opt = ux.scale(-1.0).accumulate_gradients(2)
    state = _with(opt, opt.init({"w": jnp.zeros(1)}), "accumulate_gradients", mini_step=INT32_MAX)
    u, state = jax.jit(opt.update)({"w": jnp.asarray([4.0])}, state)
    assert bool(ux.has_updated(state)) and int(state[0].mini_step) == 0
    np.testing.assert_allclose(u["w"], [-2.0])


def test_reduce_on_plateau_patience_and_accumulation_at_the_limit():
    # The plateau count reaches a patience of INT32_MAX: the scale drops, the count restarts.
    opt = ux.reduce_on_plateau(factor=0.5, patience=INT32_MAX)
    state = _with(opt, opt.init({"w": jnp.zeros(1)}), "reduce_on_plateau", plateau_count=INT32_MAX - 2,
                  best_loss=1.0)
    step = jax.jit(lambda g, s: opt.update(g, s, loss=LOSS))
    scales = []
    for _ in range(3):
        u, state = step({"w": jnp.ones(1)}, state)
        scales.append(float(state[0].scale))
    assert scales == [1.0, 0.5, 0.5] and int(state[0].plateau_count) == 1
    np.testing.assert_allclose(u["w"], [0.5])

    # Losses averaged over INT32_MAX calls: the average is evaluated when the count gets there.
    opt = ux.reduce_on_plateau(factor=0.5, patience=1, accumulation_size=INT32_MAX)
    state = _with(opt, opt.init({"w": jnp.zeros(1)}), "reduce_on_plateau", count=INT32_MAX - 3, avg_loss=2.0,
                  best_loss=3.0)
    step = jax.jit(lambda g, s, loss: opt.update(g, s, loss=loss))
    for count in (INT32_MAX - 2, INT32_MAX - 1):
        _, state = step({"w": jnp.ones(1)}, state, 2.0)
        assert int(state[0].count) == count and float(state[0].best_loss) == 3.0
    _, state = step({"w": jnp.ones(1)}, state, 2.0)
    assert int(state[0].count) == 0 and float(state[0].best_loss) == 2.0 and float(state[0].scale) == 1.0


def test_apply_if_finite_counts_saturate():
    opt = ux.scale(-1.0).apply_if_finite(INT32_MAX - 1)
    state = _with(opt, opt.init({"w": jnp.zeros(1)}), "apply_if_finite", notfinite_count=INT32_MAX - 2,
                  total_notfinite=INT32_MAX - 1)
    step = jax.jit(opt.update)
    nan = {"w": jnp.asarray([jnp.nan])}
    u, state = step(nan, state)  # the (INT32_MAX - 1)th error in a row: dropped
    assert int(state[0].notfinite_count) == INT32_MAX - 1 and bool(jnp.all(u["w"] == 0))
    for _ in range(2):  # more than INT32_MAX - 1 in a row: applied, and the counts stay at the maximum
        u, state = step(nan, state)
        assert int(state[0].notfinite_count) == INT32_MAX and bool(jnp.isnan(u["w"][0]))
        assert int(state[0].total_notfinite) == INT32_MAX
    u, state = step({"w": jnp.asarray([2.0])}, state)
    assert int(state[0].notfinite_count) == 0 and int(state[0].total_notfinite) == INT32_MAX
    np.testing.assert_allclose(u["w"], [-2.0])


@pytest.mark.parametrize("b2", [0.999, 1.0 - 1e-7])
def test_adam_bias_corrections_at_the_saturated_count_are_one(b2):
    b1, eps = 0.9, 1e-8
    opt = ux.scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=0.0)
    m, v = np.array([0.2, -0.1], np.float32), np.array([0.04, 0.09], np.float32)
    state = _with(opt, opt.init({"w": jnp.zeros(2)}), "scale_by_adam", count=INT32_MAX - 1, mu={"w": m},
                  nu={"w": v})
    step = jax.jit(opt.update)
    for g in (np.array([1.0, -2.0], np.float32), np.array([0.5, 0.5], np.float32)):
        u, state = step({"w": jnp.asarray(g)}, state)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        np.testing.assert_allclose(u["w"], m / (np.sqrt(v) + eps), rtol=1e-5)
        assert int(state[0].count) == INT32_MAX


def test_a_scheduled_option_near_the_limit():
    schedule = uxs.linear_decay(0.9, warmup=0, steps=INT32_MAX)  # 0.9 down to 0 at the int32 maximum
    opt = ux.scale_by_adam(b1=schedule)
    state = opt.init({"w": jnp.zeros(2)})
    state = (state[0]._replace(count=jnp.asarray(INT32_MAX - 2, jnp.int32)),)
    step = jax.jit(opt.update)
    for count in (INT32_MAX - 2, INT32_MAX - 1, INT32_MAX, INT32_MAX):
        u, state = step({"w": jnp.asarray([1.0, -1.0])}, state)
        assert float(opt.get_state(state, "scale_by_adam.b1")) == float(schedule(jnp.asarray(count, jnp.int32)))
        assert bool(jnp.all(jnp.isfinite(u["w"])))
    assert int(state[0].count) == INT32_MAX and int(state[0].state.count) == 4


@pytest.mark.parametrize("name", sorted(SCHEDULE_CASES))
def test_every_schedule_at_the_int32_maximum(name):
    build, _, closed_form = SCHEDULE_CASES[name]
    schedule = build()
    values = jax.jit(schedule)(jnp.asarray([INT32_MAX - 1, INT32_MAX], jnp.int32))
    assert bool(jnp.all(jnp.isfinite(values))), name
    with np.errstate(over="ignore"):  # a growth up to its ceiling overflows on the way in float64 too
        want = np.broadcast_to(closed_form(np.array([INT32_MAX - 1, INT32_MAX], np.float64)), (2,))
    np.testing.assert_allclose(values, want, rtol=1e-5, atol=1e-7)


def test_the_schedule_cases_cover_every_schedule():
    built = {type(build()).__name__ for build, _, _ in SCHEDULE_CASES.values()}
    assert built == set(uxs.__all__) - {"Schedule"}


# --------------------------------------------------------------------------
# Under x64 the counters are int64 and count past 2**31 - 1

#: Entries that cover every way a counter steps: saturating (adam, the conditional wrappers' step), cyclic (sma,
#: swa, sophia), bounded (accumulate_gradients' mini_step, lookahead, reduce_on_plateau), reset
#: (apply_if_finite's consecutive errors, loss_scale's counter), a scheduled option's own count.
X64_NAMES = ("scale_by_adam", "sma", "swa", "scale_by_sophia", "accumulate_gradients", "lookahead",
             "reduce_on_plateau", "apply_if_finite", "loss_scale", "conditionally_mask", "scheduled_adam")
#: Where the counters start in the x64 runs: just below the int32 maximum, and just below the int64 one.
X64_STARTS = (INT32_MAX - 2, TOP - 2)


def x64_counter_checks():
    """Runs under ``JAX_ENABLE_X64=1`` (:func:`test_counters_count_past_2_31_under_x64` starts it); raises on the
    first check that fails."""
    assert jax.config.jax_enable_x64 and COUNT_DTYPE == jnp.int64
    params = jax.ShapeDtypeStruct((2, 3), jnp.float32)
    for name, build in sorted({**BUILDERS, **{f"optimizers.{n}": getattr(ux.optimizers, n)
                                              for n in ("adamw", "lion", "muon")}}.items()):
        leaves = jax.tree_util.tree_flatten_with_path(jax.eval_shape(build().init, {"w": params}))[0]
        narrow = [jax.tree_util.keystr(p) for p, x in leaves if x.ndim == 0 and x.dtype == jnp.int32]
        assert not narrow, f"{name}: int32 counters under x64 at {narrow}"
    for name in X64_NAMES:
        opt, counters, fresh, runs = _counter_run(name, X64_STARTS)
        assert counters, f"{name}: no int64 counter"
        for start, (outs, final) in zip(X64_STARTS, runs):
            for x in _floats((outs, final)):
                assert bool(jnp.all(jnp.isfinite(x))), f"{name}: a non-finite value from {start}"
            ended = _counter_values(final)
            for path, (owner, limit) in counters.items():
                got, counted = ended[path], fresh[path]
                if limit is not None:
                    assert got == counted and 0 <= got <= limit, f"{name}{path}: {got}, bound {limit}"
                elif counted == 0:
                    assert got in (0, start), f"{name}{path}: {got}"
                elif start == INT32_MAX - 2:  # past the int32 maximum: counted on, neither saturated nor wrapped
                    # (a count of every step exactly; swa's snapshots, which count the steps its count picks,
                    # at most that)
                    want = start + counted
                    assert got == want if counted == STEPS else INT32_MAX < got <= start + STEPS, \
                        f"{name}{path}: {got}, want {want}"
                else:
                    want = _expected(opt, owner, start + counted)
                    assert got == want, f"{name}{path}: {got}, want {want} (at the int64 maximum)"

    # Integer options and schedules past 2**31 - 1: optax's giant-steps cosine decay and its closed form
    cosine = uxs.cosine_decay(1000.0, decay_steps=10**10, alpha=0.0)
    np.testing.assert_allclose(jax.jit(cosine)(10**9), 975.52826, rtol=1e-6)
    for t in (3 * 10**9, 2**31):
        np.testing.assert_allclose(cosine(t), 500.0 * (1.0 + np.cos(np.pi * t / 1e10)), rtol=1e-6)
    opt = ux.scale_by_adam(b1=uxs.linear_decay(0.9, warmup=0, steps=2**32))  # 0.9 down to 0 at 2**32
    state = opt.init({"w": jnp.zeros(2)})
    state = (state[0]._replace(count=jnp.asarray(2**31, jnp.int64)),)
    _, state = jax.jit(opt.update)({"w": jnp.ones(2)}, state)
    np.testing.assert_allclose(opt.get_state(state, "scale_by_adam.b1"), 0.9 * (1 - 2**31 / 2**32), rtol=1e-6)
    assert int(state[0].count) == 2**31 + 1
    # swa from a start past 2**31 - 1 is swa from a small start, shifted: the same snapshots and averages
    shifted, small = ux.scale(-1.0).swa(start=2**31 + 1, period=2), ux.scale(-1.0).swa(start=2, period=2)
    params = {"w": jnp.zeros(1)}
    a = shifted.init(params)
    a, b = (a[0], a[1]._replace(count=jnp.asarray(2**31 - 1, jnp.int64))), small.init(params)
    for g in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0):
        ua, a = jax.jit(shifted.update)({"w": jnp.full(1, g)}, a, params)
        ub, b = jax.jit(small.update)({"w": jnp.full(1, g)}, b, params)
        np.testing.assert_array_equal(ua["w"], ub["w"])
        np.testing.assert_array_equal(a[1].average["w"], b[1].average["w"])
    assert int(a[1].count) == 2**31 - 1 + 6 and int(a[1].snapshots) == int(b[1].snapshots) > 0
    for make, text in ((lambda: uxs.cosine_decay(1.0, decay_steps=2**63), "must be at most 2**63 - 1 (step "
                                                                           "counters are int64)"),):
        try:
            make()
        except ValueError as error:
            assert text in str(error), str(error)
        else:
            raise AssertionError(f"no error: {text}")
    print("x64 counter checks passed")


@pytest.fixture(scope="module")
def x64_run():
    proc = start_float64("test_counters", "x64_counter_checks")
    yield proc
    finish(proc)


def test_counters_count_past_2_31_under_x64(x64_run):
    assert "x64 counter checks passed" in finished(x64_run)


def test_integer_options_and_counts_past_int32_are_refused_by_name_without_x64():
    with pytest.raises(ValueError, match=r"^cosine_decay\(decay_steps=10000000000\): decay_steps must be at most "
                                         r"2\*\*31 - 1 \(step counters are int32; int64 under jax_enable_x64\)$"):
        uxs.cosine_decay(1000.0, decay_steps=10**10)
    with pytest.raises(ValueError, match=r"^cosine_decay: the count must fit the step counters' dtype, got "
                                         r"3000000000; must be at most 2\*\*31 - 1"):
        uxs.cosine_decay(1000.0, decay_steps=10**3)(3 * 10**9)
