"""Schedules: closed forms and optax parity, jit, no retracing, value semantics, errors, docs.

Every parity case sets every option explicitly, runs counts 0..N (past the end
of every schedule) and compares with a numpy closed form written here and
with the optax schedule of the same meaning.
"""

from __future__ import annotations

import functools
import inspect
import math
import pickle
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax._src import factorized as optax_factorized

import updax as ux
import updax.schedules as uxs

N = 40
T = np.arange(N + 1, dtype=np.float64)
RTOL, ATOL = 1e-5, 1e-7
#: float32's smallest normal number.
TINY = float(np.finfo(np.float32).tiny)


@pytest.fixture(autouse=True)
def strict_promotion():
    """Schedules cast explicitly: an int32 count never meets a float by implicit promotion."""
    with jax.numpy_dtype_promotion("strict"):
        yield


# --------------------------------------------------------------------------
# numpy closed forms


def np_warmup_cosine(t, init, peak, warmup, decay_steps, end, exponent):
    k = decay_steps - warmup
    c = 0.5 * (1 + np.cos(np.pi * np.minimum(t - warmup, k) / k))
    return np.where(t < warmup, init + (peak - init) * t / max(warmup, 1), end + (peak - end) * c**exponent)


def np_cosine_interp(t, xs, ys):
    out = np.full_like(t, ys[-1])
    for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]):
        inside = (x0 <= t) & (t < x1)
        out[inside] = y1 + (y0 - y1) / 2 * (np.cos(np.pi * (t[inside] - x0) / (x1 - x0)) + 1)
    return out


def np_exponential(t, init, rate, steps, begin, staircase, end, floor):
    p = (t - begin) / steps
    p = np.floor(p) if staircase else p
    value = np.where(t - begin <= 0, init, init * rate**p)
    return value if end is None else (np.maximum if floor else np.minimum)(value, end)


CYCLES = [
    dict(init_value=0.0, peak_value=1.0, warmup_steps=2, decay_steps=10, end_value=0.0, exponent=1.0),
    dict(init_value=0.1, peak_value=0.5, warmup_steps=0, decay_steps=12, end_value=0.05, exponent=1.0),
    dict(init_value=0.2, peak_value=0.4, warmup_steps=3, decay_steps=8, end_value=0.01, exponent=2.0),
]


def np_sgdr(t):
    out, begin = np.zeros_like(t), 0
    for c in CYCLES:
        values = np_warmup_cosine(t - begin, c["init_value"], c["peak_value"], c["warmup_steps"],
                                  c["decay_steps"], c["end_value"], c["exponent"])
        out = np.where(t >= begin, values, out)
        begin += c["decay_steps"]
    return out


def np_wsd(t, init, peak, warmup, stable, cooldown, end, kind):
    """Warmup-stable-decay from Hägele et al. (arXiv 2405.18392), section 2: the cooldown's shapes."""
    p = np.clip(t - warmup - stable, 0, cooldown) / cooldown
    left = {"linear": 1 - p, "cosine": 0.5 * (1 + np.cos(np.pi * p)), "1-sqrt": 1 - np.sqrt(p)}[kind]
    return np.where(t < warmup, init + (peak - init) * t / max(warmup, 1), end + (peak - end) * left)


def torch_cyclic(t, base, top, up, down, mode, gamma):
    """torch.optim.lr_scheduler.CyclicLR's documented formula, one count at a time."""
    out = []
    for epoch in t:
        total = up + down
        cycle = math.floor(1 + epoch / total)
        x = 1.0 + epoch / total - cycle
        ratio = up / total
        factor = x / ratio if x <= ratio else (x - 1) / (ratio - 1)
        scale = {"triangular": 1.0, "triangular2": 0.5 ** (cycle - 1), "exp_range": gamma**epoch}[mode]
        out.append(base + (top - base) * factor * scale)
    return np.array(out)


def torch_warm_restarts(t, init, period, mult, end):
    """CosineAnnealingWarmRestarts's documented rule: T_cur counts the steps since the last restart, T_i grows by
    T_mult at each (the restarts found by walking the cycles, not by a logarithm)."""
    out = []
    for epoch in t:
        cur, length = epoch, period
        if mult == 1:  # (a fixed period: the walk in one step, so that a count near 2**31 is quick)
            cur = epoch % period
        while cur >= length:
            cur, length = cur - length, length * mult
        out.append(end + (init - end) * (1 + math.cos(math.pi * cur / length)) / 2)
    return np.array(out)


def torch_swalr(t, init, swa, steps, strategy):
    """SWALR's documented annealing: alpha(t / anneal_epochs) of the way from the initial rate to swa_lr."""
    p = np.ones_like(t) if steps == 0 else np.minimum(t / steps, 1.0)
    alpha = p if strategy == "linear" else (1 - np.cos(np.pi * p)) / 2
    return swa * alpha + init * (1 - alpha)


def _jnp_triangle(base, top, up, down):
    """The triangle wave written apart from torch's formula: up over [0, up), down over [up, up + down)."""
    def value(count):
        pos = jnp.mod(count, up + down).astype(jnp.float32)
        h = jnp.where(pos < up, pos / up, (up + down - pos) / down)
        return base + (top - base) * h
    return value


def _restart_cycles(init, period, mult, end, n):
    """Cosine restarts as optax's sgdr: cycles without warmup, each mult times longer, enough to pass n."""
    cycles, total, length = [], 0, period
    while total <= n:
        cycles.append(dict(init_value=init, peak_value=init, warmup_steps=0, decay_steps=length, end_value=end))
        total, length = total + length, length * mult
    return cycles


def _plain_halving(count):
    return 0.5 ** jnp.asarray(count, jnp.float32)


# name: (updax schedule, optax schedule, closed form of T)
CASES = {
    # optax has no relative-step schedule (its adafactor takes a given rate): the "optax" side is the
    # paper's formula in jnp, next to the numpy closed form.
    "relative_step": (
        lambda: uxs.relative_step(0.2),
        lambda: (lambda c: jnp.minimum(0.2, jax.lax.rsqrt(c.astype(jnp.float32) + 1.0))),
        lambda t: np.minimum(0.2, 1.0 / np.sqrt(t + 1.0))),
    "constant": (
        lambda: uxs.constant(0.3),
        lambda: optax.constant_schedule(0.3),
        lambda t: np.full_like(t, 0.3)),
    "exponential_decay": (
        lambda: uxs.exponential_decay(0.5, decay_rate=0.8, transition_steps=3, transition_begin=5,
                                      staircase=False, end_value=None),
        lambda: optax.exponential_decay(0.5, transition_steps=3, decay_rate=0.8, transition_begin=5,
                                        staircase=False, end_value=None),
        lambda t: np_exponential(t, 0.5, 0.8, 3, 5, False, None, True)),
    "exponential_decay_staircase_floor": (
        lambda: uxs.exponential_decay(0.5, decay_rate=0.8, transition_steps=3, transition_begin=2,
                                      staircase=True, end_value=0.2),
        lambda: optax.exponential_decay(0.5, transition_steps=3, decay_rate=0.8, transition_begin=2,
                                        staircase=True, end_value=0.2),
        lambda t: np_exponential(t, 0.5, 0.8, 3, 2, True, 0.2, True)),
    "exponential_growth_ceiling": (
        lambda: uxs.exponential_decay(0.5, decay_rate=1.1, transition_steps=2, transition_begin=0,
                                      staircase=False, end_value=1.0),
        lambda: optax.exponential_decay(0.5, transition_steps=2, decay_rate=1.1, transition_begin=0,
                                        staircase=False, end_value=1.0),
        lambda t: np_exponential(t, 0.5, 1.1, 2, 0, False, 1.0, False)),
    "cosine_decay": (
        lambda: uxs.cosine_decay(0.2, decay_steps=30, alpha=0.1, exponent=1.0),
        lambda: optax.cosine_decay_schedule(0.2, decay_steps=30, alpha=0.1, exponent=1.0),
        lambda t: 0.2 * (0.9 * 0.5 * (1 + np.cos(np.pi * np.minimum(t, 30) / 30)) + 0.1)),
    "cosine_decay_exponent": (
        lambda: uxs.cosine_decay(0.2, decay_steps=30, alpha=0.1, exponent=2.5),
        lambda: optax.cosine_decay_schedule(0.2, decay_steps=30, alpha=0.1, exponent=2.5),
        lambda t: 0.2 * (0.9 * (0.5 * (1 + np.cos(np.pi * np.minimum(t, 30) / 30))) ** 2.5 + 0.1)),
    "cosine_decay_exponent_below_1": (
        lambda: uxs.cosine_decay(0.5, decay_steps=17, alpha=0.0, exponent=0.5),
        lambda: optax.cosine_decay_schedule(0.5, decay_steps=17, alpha=0.0, exponent=0.5),
        lambda t: 0.5 * np.sqrt(0.5 * (1 + np.cos(np.pi * np.minimum(t, 17) / 17)))),
    "polynomial_decay": (
        lambda: uxs.polynomial_decay(0.5, end_value=0.05, power=1.5, transition_steps=25, transition_begin=4),
        lambda: optax.polynomial_schedule(0.5, end_value=0.05, power=1.5, transition_steps=25, transition_begin=4),
        lambda t: 0.45 * (1 - np.clip(t - 4, 0, 25) / 25) ** 1.5 + 0.05),
    "polynomial_decay_power_1_is_linear": (
        lambda: uxs.polynomial_decay(0.5, end_value=0.1, power=1.0, transition_steps=20, transition_begin=3),
        lambda: optax.linear_schedule(0.5, end_value=0.1, transition_steps=20, transition_begin=3),
        lambda t: 0.5 + (0.1 - 0.5) * np.clip(t - 3, 0, 20) / 20),
    "linear_schedule": (
        lambda: uxs.linear_schedule(0.5, 0.05, transition_steps=25, transition_begin=6),
        lambda: optax.linear_schedule(0.5, 0.05, transition_steps=25, transition_begin=6),
        lambda t: 0.5 + (0.05 - 0.5) * np.clip(t - 6, 0, 25) / 25),
    # optax's start is 5e-8 above 1e-3 here: it computes (init - end)·1 + end, which loses init below end's rounding.
    "linear_schedule_up_from_0": (
        lambda: uxs.linear_schedule(1e-3, 2.0, transition_steps=12, transition_begin=0),
        lambda: optax.linear_schedule(1e-3, 2.0, transition_steps=12, transition_begin=0),
        lambda t: np.where(t < 12, 1e-3 + (2.0 - 1e-3) * t / 12, 2.0)),
    "linear_decay": (
        lambda: uxs.linear_decay(0.4, warmup=0, steps=30),
        lambda: optax.linear_schedule(0.4, end_value=0.0, transition_steps=30),
        lambda t: 0.4 * np.maximum(0, (30 - t) / 30)),
    "linear_decay_warmup": (
        lambda: uxs.linear_decay(0.4, warmup=5, steps=30),
        lambda: optax.join_schedules([optax.linear_schedule(0.0, 0.4, 5), optax.linear_schedule(0.4, 0.0, 25)], [5]),
        lambda t: 0.4 * np.where(t < 5, t / 5, np.maximum(0, (30 - t) / 25))),
    "piecewise_constant": (
        lambda: uxs.piecewise_constant(0.1, {4: 1.0, 8: 2.0, 20: 0.5}),
        lambda: optax.piecewise_constant_schedule(0.1, {4: 10.0, 8: 2.0, 20: 0.25}),  # scales = value ratios
        lambda t: np.select([t < 4, t < 8, t < 20], [0.1, 1.0, 2.0], 0.5)),
    "piecewise_interpolate_linear": (
        lambda: uxs.piecewise_interpolate("linear", 1.0, {5: 0.5, 15: 0.1, 30: 3.0}),
        lambda: optax.piecewise_interpolate_schedule("linear", 1.0, {5: 0.5, 15: 0.1, 30: 3.0}),
        lambda t: np.interp(t, [0, 5, 15, 30], [1.0, 0.5, 0.05, 0.15])),
    "piecewise_interpolate_linear_from_0": (
        lambda: uxs.piecewise_interpolate("linear", 1.0, {0: 2.0, 5: 0.5, 15: 0.2, 30: 3.0}),
        lambda: optax.piecewise_interpolate_schedule("linear", 1.0, {0: 2.0, 5: 0.5, 15: 0.2, 30: 3.0}),
        lambda t: np.interp(t, [0, 5, 15, 30], [2.0, 1.0, 0.2, 0.6])),
    "piecewise_interpolate_cosine": (
        lambda: uxs.piecewise_interpolate("cosine", 1.0, {5: 0.5, 15: 0.1, 30: 3.0}),
        lambda: optax.piecewise_interpolate_schedule("cosine", 1.0, {5: 0.5, 15: 0.1, 30: 3.0}),
        lambda t: np_cosine_interp(t, [0, 5, 15, 30], [1.0, 0.5, 0.05, 0.15])),
    "linear_onecycle": (
        lambda: uxs.linear_onecycle(30, 0.8, pct_start=0.2, pct_final=0.75, div_factor=8.0, final_div_factor=100.0),
        lambda: optax.linear_onecycle_schedule(30, 0.8, pct_start=0.2, pct_final=0.75, div_factor=8.0,
                                               final_div_factor=100.0),
        lambda t: np.interp(t, [0, 6, 22, 30], [0.1, 0.8, 0.1, 0.001])),
    "cosine_onecycle": (
        lambda: uxs.cosine_onecycle(30, 0.8, pct_start=0.25, div_factor=8.0, final_div_factor=100.0),
        lambda: optax.cosine_onecycle_schedule(30, 0.8, pct_start=0.25, div_factor=8.0, final_div_factor=100.0),
        lambda t: np_cosine_interp(t, [0, 7, 30], [0.1, 0.8, 0.001])),
    "warmup_constant": (
        lambda: uxs.warmup_constant(0.05, 0.6, warmup_steps=7),
        lambda: optax.warmup_constant_schedule(0.05, 0.6, warmup_steps=7),
        lambda t: np.where(t < 7, 0.05 + (0.6 - 0.05) * t / 7, 0.6)),
    # optax holds init_value when warmup_steps=0 (its linear ramp of 0 steps is a constant); updax starts at the
    # peak, as its other warmup schedules (and optax's warmup_cosine_decay_schedule) do.
    "warmup_constant_no_warmup": (
        lambda: uxs.warmup_constant(0.05, 0.6, warmup_steps=0),
        lambda: optax.constant_schedule(0.6),
        lambda t: np.full_like(t, 0.6)),
    "warmup_cosine_decay": (
        lambda: uxs.warmup_cosine_decay(0.05, 1.0, warmup_steps=5, decay_steps=25, end_value=0.1, exponent=2.0),
        lambda: optax.warmup_cosine_decay_schedule(0.05, 1.0, warmup_steps=5, decay_steps=25, end_value=0.1,
                                                   exponent=2.0),
        lambda t: np_warmup_cosine(t, 0.05, 1.0, 5, 25, 0.1, 2.0)),
    "warmup_cosine_decay_zero_peak": (
        lambda: uxs.warmup_cosine_decay(0.5, 0.0, warmup_steps=4, decay_steps=20, end_value=0.1, exponent=1.0),
        lambda: optax.warmup_cosine_decay_schedule(0.5, 0.0, warmup_steps=4, decay_steps=20, end_value=0.1,
                                                   exponent=1.0),
        lambda t: np.where(t < 4, 0.5 - 0.5 * t / 4, 0.0)),
    "warmup_exponential_decay": (
        lambda: uxs.warmup_exponential_decay(0.0, 1.0, warmup_steps=4, transition_steps=3, decay_rate=0.7,
                                             transition_begin=2, staircase=True, end_value=0.3),
        lambda: optax.warmup_exponential_decay_schedule(0.0, 1.0, warmup_steps=4, transition_steps=3,
                                                        decay_rate=0.7, transition_begin=2, staircase=True,
                                                        end_value=0.3),
        lambda t: np.where(t < 4, t / 4, np_exponential(t - 4, 1.0, 0.7, 3, 2, True, 0.3, True))),
    "sgdr": (
        lambda: uxs.sgdr(CYCLES),
        lambda: optax.sgdr_schedule(CYCLES),
        np_sgdr),
    "join_schedules": (
        lambda: uxs.join_schedules([uxs.constant(0.1), uxs.cosine_decay(0.5, decay_steps=10, alpha=0.0),
                                    uxs.linear_decay(0.3, warmup=0, steps=8)], [5, 20]),
        lambda: optax.join_schedules([optax.constant_schedule(0.1), optax.cosine_decay_schedule(0.5, 10),
                                      optax.linear_schedule(0.3, 0.0, 8)], [5, 20]),
        lambda t: np.select([t < 5, t < 20],
                            [0.1, 0.25 * (1 + np.cos(np.pi * np.minimum(t - 5, 10) / 10))],
                            0.3 * np.maximum(0, (8 - (t - 20)) / 8))),
    "join_schedules_with_a_function": (
        lambda: uxs.join_schedules([uxs.constant(0.1), _plain_halving], [10]),
        lambda: optax.join_schedules([optax.constant_schedule(0.1), lambda c: 0.5**c], [10]),
        lambda t: np.where(t < 10, 0.1, 0.5 ** (t - 10))),
    # Schedules optax does not have: the second oracle is optax's pieces joined where they exist, else the rule
    # written apart from the closed form (torch's documented formulas, at every count 0..N, boundaries included).
    "warmup_stable_decay_linear": (
        lambda: uxs.warmup_stable_decay(0.1, 1.0, warmup_steps=5, stable_steps=10, cooldown_steps=8, end_value=0.05,
                                        cooldown_type="linear"),
        lambda: optax.join_schedules([optax.linear_schedule(0.1, 1.0, 5), optax.constant_schedule(1.0),
                                      optax.linear_schedule(1.0, 0.05, 8)], [5, 15]),
        lambda t: np_wsd(t, 0.1, 1.0, 5, 10, 8, 0.05, "linear")),
    "warmup_stable_decay_cosine": (
        lambda: uxs.warmup_stable_decay(0.0, 0.8, warmup_steps=4, stable_steps=12, cooldown_steps=10, end_value=0.08,
                                        cooldown_type="cosine"),
        lambda: optax.join_schedules([optax.linear_schedule(0.0, 0.8, 4), optax.constant_schedule(0.8),
                                      optax.cosine_decay_schedule(0.8, 10, alpha=0.1)], [4, 16]),
        lambda t: np_wsd(t, 0.0, 0.8, 4, 12, 10, 0.08, "cosine")),
    "warmup_stable_decay_1_sqrt": (
        lambda: uxs.warmup_stable_decay(0.0, 0.5, warmup_steps=0, stable_steps=9, cooldown_steps=16, end_value=0.0,
                                        cooldown_type="1-sqrt"),
        lambda: (lambda c: jnp.where(c < 9, 0.5, 0.5 * (1 - jnp.sqrt(jnp.clip(c - 9, 0, 16) / 16.0)))),
        lambda t: np_wsd(t, 0.0, 0.5, 0, 9, 16, 0.0, "1-sqrt")),
    "cyclic_triangular": (
        lambda: uxs.cyclic(0.1, 0.9, step_size_up=4, step_size_down=6, mode="triangular", gamma=1.0),
        lambda: _jnp_triangle(0.1, 0.9, 4, 6),
        lambda t: torch_cyclic(t, 0.1, 0.9, 4, 6, "triangular", 1.0)),
    "cyclic_triangular2": (
        lambda: uxs.cyclic(0.2, 1.0, step_size_up=3, step_size_down=None, mode="triangular2", gamma=1.0),
        lambda: (lambda c: 0.2 + (_jnp_triangle(0.0, 0.8, 3, 3)(c)) * 0.5 ** jnp.floor(c / 6.0)),
        lambda t: torch_cyclic(t, 0.2, 1.0, 3, 3, "triangular2", 1.0)),
    "cyclic_exp_range": (
        lambda: uxs.cyclic(0.05, 0.5, step_size_up=5, step_size_down=2, mode="exp_range", gamma=0.97),
        lambda: (lambda c: 0.05 + _jnp_triangle(0.0, 0.45, 5, 2)(c) * 0.97 ** c.astype(jnp.float32)),
        lambda t: torch_cyclic(t, 0.05, 0.5, 5, 2, "exp_range", 0.97)),
    "cosine_warm_restarts": (
        lambda: uxs.cosine_warm_restarts(0.6, period=7, period_mult=1, end_value=0.1),
        lambda: optax.sgdr_schedule(_restart_cycles(0.6, 7, 1, 0.1, N)),
        lambda t: torch_warm_restarts(t, 0.6, 7, 1, 0.1)),
    "cosine_warm_restarts_mult_2": (
        lambda: uxs.cosine_warm_restarts(1.0, period=3, period_mult=2, end_value=0.0),
        lambda: optax.sgdr_schedule(_restart_cycles(1.0, 3, 2, 0.0, N)),
        lambda t: torch_warm_restarts(t, 1.0, 3, 2, 0.0)),
    "cosine_warm_restarts_mult_3": (
        lambda: uxs.cosine_warm_restarts(0.5, period=1, period_mult=3, end_value=0.02),
        lambda: optax.sgdr_schedule(_restart_cycles(0.5, 1, 3, 0.02, N)),
        lambda t: torch_warm_restarts(t, 0.5, 1, 3, 0.02)),
    "multiply_schedules": (
        lambda: uxs.multiply_schedules([uxs.constant(0.5), uxs.piecewise_constant(0.1, {3: 1.0}),
                                        uxs.exponential_decay(1.0, decay_rate=0.9, transition_steps=1)]),
        lambda: (lambda c: optax.constant_schedule(0.5)(c) * optax.piecewise_constant_schedule(0.1, {3: 10.0})(c)
                 * optax.exponential_decay(1.0, 1, 0.9)(c)),
        lambda t: 0.5 * np.where(t < 3, 0.1, 1.0) * 0.9**t),
    "swalr_cos": (
        lambda: uxs.swalr(0.4, 0.05, anneal_steps=12, anneal_strategy="cos"),
        lambda: optax.cosine_decay_schedule(0.4, 12, alpha=0.125),
        lambda t: torch_swalr(t, 0.4, 0.05, 12, "cos")),
    "swalr_linear": (
        lambda: uxs.swalr(0.4, 0.1, anneal_steps=9, anneal_strategy="linear"),
        lambda: optax.linear_schedule(0.4, 0.1, 9),
        lambda t: torch_swalr(t, 0.4, 0.1, 9, "linear")),
    "swalr_no_annealing": (
        lambda: uxs.swalr(0.4, 0.1, anneal_steps=0, anneal_strategy="cos"),
        lambda: optax.constant_schedule(0.1),
        lambda t: torch_swalr(t, 0.4, 0.1, 0, "cos")),
    # Adafactor's decay, which optax's factorized rule computes inside (PaLM's b2), capped from count 17 on.
    "power_decay_rate": (
        lambda: uxs.power_decay_rate(0.8, max_value=0.9),
        lambda: (lambda c: jnp.minimum(0.9, optax_factorized._decay_rate_pow(c, 0.8))),
        lambda t: np.minimum(0.9, 1 - (t + 1) ** -0.8)),
}

NAMES = sorted(CASES)
PUBLIC = [name for name in uxs.__all__ if name != "Schedule"]


@functools.cache
def _values(name):
    """The eager and the jitted values of case ``name`` (each test reads them, they are computed once)."""
    schedule = CASES[name][0]()
    return _eager(schedule), _jitted(schedule)


def _eager(schedule):
    """Eager, on all counts at once (schedules broadcast over an array of counts)."""
    return np.asarray(schedule(jnp.arange(N + 1, dtype=jnp.int32)))


def _jitted(schedule):
    """Jitted, one traced int32 scalar count at a time."""
    fn = jax.jit(lambda s, c: s(c))
    return np.array([fn(schedule, jnp.int32(c)) for c in range(N + 1)])


def test_cases_cover_every_schedule():
    assert {type(CASES[name][0]()).__name__ for name in NAMES} == set(PUBLIC)


@pytest.mark.parametrize("name", NAMES)
def test_matches_the_closed_form_and_optax(name):
    _, make_optax, closed_form = CASES[name]
    with jax.numpy_dtype_promotion("standard"):  # optax relies on implicit promotion
        reference = np.asarray(jax.jit(jax.vmap(make_optax()))(jnp.arange(N + 1, dtype=jnp.int32)), dtype=np.float64)
    for values in _values(name):  # eager, then jitted
        np.testing.assert_allclose(values, closed_form(T), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(values, reference, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", NAMES)
def test_jit_equals_eager_and_returns_float32_scalars(name):
    schedule = CASES[name][0]()
    eager, jitted = _values(name)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6, atol=0)
    for count in (3, jnp.int32(3)):
        value = schedule(count)
        assert value.shape == () and value.dtype == jnp.float32
        assert value == pytest.approx(jitted[3], rel=1e-6)


def test_the_founding_piecewise_constant_example():
    sched = uxs.piecewise_constant(0.1, {4: 1.0, 8: 2.0})
    values = [float(sched(t)) for t in range(10)]
    assert values == pytest.approx([0.1] * 4 + [1.0] * 4 + [2.0] * 2)
    # optax's dict holds scales that multiply in: the same dict means something else there.
    optax_values = [float(optax.piecewise_constant_schedule(0.1, {4: 1.0, 8: 2.0})(t)) for t in range(10)]
    assert optax_values == pytest.approx([0.1] * 8 + [0.2] * 2)


# --------------------------------------------------------------------------
# Pytrees: numbers are leaves, structure is static


# name: (a second schedule that differs from CASES[name] only in numeric options)
NUMERIC_VARIANTS = {
    "constant": lambda: uxs.constant(0.7),
    "exponential_decay": lambda: uxs.exponential_decay(0.4, decay_rate=0.9, transition_steps=4, transition_begin=1,
                                                       staircase=False, end_value=None),
    "cosine_decay": lambda: uxs.cosine_decay(0.3, decay_steps=20, alpha=0.0, exponent=1.0),
    "cosine_decay_exponent": lambda: uxs.cosine_decay(0.2, decay_steps=30, alpha=0.1, exponent=1.5),
    "linear_schedule": lambda: uxs.linear_schedule(0.2, 0.9, transition_steps=5, transition_begin=1),
    "warmup_constant": lambda: uxs.warmup_constant(0.1, 0.3, warmup_steps=3),
    "polynomial_decay": lambda: uxs.polynomial_decay(0.6, end_value=0.0, power=2.0, transition_steps=5,
                                                     transition_begin=0),
    "linear_decay_warmup": lambda: uxs.linear_decay(1.0, warmup=2, steps=9),
    "piecewise_constant": lambda: uxs.piecewise_constant(0.2, {4: 3.0, 8: 4.0, 20: 5.0}),
    "piecewise_interpolate_cosine": lambda: uxs.piecewise_interpolate("cosine", 2.0, {5: 0.1, 15: 0.2, 30: 0.3}),
    "linear_onecycle": lambda: uxs.linear_onecycle(30, 0.5, pct_start=0.2, pct_final=0.75, div_factor=5.0,
                                                   final_div_factor=10.0),
    "cosine_onecycle": lambda: uxs.cosine_onecycle(30, 0.5, pct_start=0.25, div_factor=5.0, final_div_factor=10.0),
    "warmup_cosine_decay": lambda: uxs.warmup_cosine_decay(0.0, 2.0, warmup_steps=3, decay_steps=11, end_value=0.0,
                                                           exponent=1.0),
    "warmup_exponential_decay": lambda: uxs.warmup_exponential_decay(0.1, 2.0, warmup_steps=1, transition_steps=5,
                                                                     decay_rate=0.5, transition_begin=0,
                                                                     staircase=True, end_value=0.1),
    "sgdr": lambda: uxs.sgdr([dict(c, decay_steps=c["decay_steps"] + 1, peak_value=0.9) for c in CYCLES]),
    "join_schedules": lambda: uxs.join_schedules([uxs.constant(0.2), uxs.cosine_decay(0.1, decay_steps=3, alpha=0.5),
                                                  uxs.linear_decay(0.6, warmup=1, steps=4)], [2, 9]),
    "warmup_stable_decay_cosine": lambda: uxs.warmup_stable_decay(0.1, 0.5, warmup_steps=2, stable_steps=3,
                                                                  cooldown_steps=6, end_value=0.0,
                                                                  cooldown_type="cosine"),
    "cyclic_exp_range": lambda: uxs.cyclic(0.1, 0.3, step_size_up=2, step_size_down=9, mode="exp_range", gamma=0.9),
    "cosine_warm_restarts_mult_2": lambda: uxs.cosine_warm_restarts(0.3, period=5, period_mult=2, end_value=0.1),
    "multiply_schedules": lambda: uxs.multiply_schedules([uxs.constant(0.1), uxs.piecewise_constant(0.2, {3: 2.0}),
                                                          uxs.exponential_decay(2.0, decay_rate=0.5,
                                                                                transition_steps=3)]),
    "swalr_cos": lambda: uxs.swalr(1.0, 0.5, anneal_steps=3, anneal_strategy="cos"),
    "power_decay_rate": lambda: uxs.power_decay_rate(0.5, max_value=0.999),
}


@pytest.mark.parametrize("name", sorted(NUMERIC_VARIANTS))
def test_changing_a_numeric_option_does_not_retrace(name):
    traces = []

    @jax.jit
    def value(schedule, count):
        traces.append(1)
        return schedule(count)

    first, second = CASES[name][0](), NUMERIC_VARIANTS[name]()
    assert first != second
    assert jax.tree.structure(first) == jax.tree.structure(second)
    value(first, jnp.int32(7))
    np.testing.assert_allclose(value(second, jnp.int32(7)), second(7), rtol=1e-6)
    assert len(traces) == 1


def test_changing_structure_retraces():
    traces = []

    @jax.jit
    def value(schedule, count):
        traces.append(1)
        return schedule(count)

    for schedule in [uxs.exponential_decay(1.0, staircase=False), uxs.exponential_decay(1.0, staircase=True),
                     uxs.piecewise_constant(0.1, {4: 1.0}), uxs.piecewise_constant(0.1, {5: 1.0})]:
        value(schedule, jnp.int32(7))
    assert len(traces) == 4


def test_leaves_are_the_numeric_options():
    assert jax.tree.leaves(uxs.cosine_decay(0.1, decay_steps=10, alpha=0.0)) == [0.1, 10, 0.0, 1.0]
    assert jax.tree.leaves(uxs.exponential_decay(0.1, staircase=True)) == [0.1, 0.95, 10, 0]
    assert jax.tree.leaves(uxs.piecewise_constant(0.1, {8: 2.0, 4: 1.0})) == [0.1, 1.0, 2.0]
    assert jax.tree.leaves(uxs.linear_onecycle(10, 1.0)) == [1.0, 25.0, 1e4]
    joined = uxs.join_schedules([uxs.constant(0.1), uxs.constant(0.2), _plain_halving], [3, 5])
    assert jax.tree.leaves(joined) == [0.1, 0.2, 3, 5]
    doubled = jax.tree.map(lambda x: 2 * x, uxs.cosine_decay(0.1, decay_steps=10, alpha=0.0))
    assert doubled == uxs.cosine_decay(0.2, decay_steps=20, alpha=0.0, exponent=2.0)


def test_a_schedule_as_a_stage_option_is_data_for_a_jitted_step():
    traces = []

    @jax.jit
    def step(opt, grads, state):
        traces.append(1)
        return opt.update(grads, state)

    grads = {"w": jnp.ones(2)}
    outs = []
    for init_value in (-0.1, -0.2):
        opt = ux.scale(uxs.cosine_decay(init_value, decay_steps=4, alpha=0.0))
        state = opt.init(grads)
        for _ in range(3):
            updates, state = step(opt, grads, state)
        outs.append(float(updates["w"][0]))
    assert len(traces) == 1
    assert outs == pytest.approx([-0.1 * 0.5, -0.2 * 0.5])  # count 2 of 4: ½(1 + cos(π/2))
    assert repr(opt) == "scale(step_size=cosine_decay(init_value=-0.2, decay_steps=4, alpha=0.0, exponent=1.0))"


# --------------------------------------------------------------------------
# Value semantics


def test_repr_is_the_call():
    assert repr(uxs.cosine_decay(0.01, decay_steps=1000)) == (
        "cosine_decay(init_value=0.01, decay_steps=1000, alpha=0.0, exponent=1.0)")
    assert repr(uxs.linear_schedule(1, 0, 10)) == (
        "linear_schedule(init_value=1.0, end_value=0.0, transition_steps=10, transition_begin=0)")
    assert repr(uxs.warmup_constant(0, 1e-3, 100)) == "warmup_constant(init_value=0.0, peak_value=0.001, warmup_steps=100)"
    assert repr(uxs.piecewise_constant(0.1, {8: 2.0, 4: 1})) == (
        "piecewise_constant(init_value=0.1, boundaries_and_values={4: 1.0, 8: 2.0})")
    assert repr(uxs.exponential_decay(1)) == (
        "exponential_decay(init_value=1.0, decay_rate=0.95, transition_steps=10, transition_begin=0, staircase=False)")
    assert repr(uxs.join_schedules([uxs.constant(0.1), _plain_halving], [10])) == (
        "join_schedules(schedules=(constant(init_value=0.1), test_schedules._plain_halving), boundaries=(10,))")


@pytest.mark.parametrize("name", [n for n in NAMES if n != "join_schedules_with_a_function"])
def test_repr_evaluates_to_an_equal_schedule(name):
    schedule = CASES[name][0]()
    assert eval(repr(schedule), vars(uxs)) == schedule


@pytest.mark.parametrize("name", NAMES)
def test_equal_hashable_picklable_immutable(name):
    a, b = CASES[name][0](), CASES[name][0]()
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    restored = pickle.loads(pickle.dumps(a))
    assert restored == a and hash(restored) == hash(a)
    np.testing.assert_array_equal(_eager(restored), _values(name)[0])
    with pytest.raises(AttributeError, match="immutable"):
        a.init_value = 1.0


def test_unequal_when_an_option_or_the_kind_differs():
    assert uxs.cosine_decay(0.1, decay_steps=10) != uxs.cosine_decay(0.1, decay_steps=11)
    assert uxs.cosine_decay(0.1) != uxs.cosine_decay(0.1, exponent=2.0)
    assert uxs.exponential_decay(0.1) != uxs.exponential_decay(0.1, staircase=True)
    assert uxs.piecewise_constant(0.1, {4: 1.0}) != uxs.piecewise_constant(0.1, {5: 1.0})
    assert uxs.piecewise_interpolate("linear", 1.0) != uxs.piecewise_interpolate("cosine", 1.0)
    assert uxs.constant(0.1) != 0.1


# --------------------------------------------------------------------------
# Errors name the call, the option and the value


BAD = [
    (lambda: uxs.cosine_decay(0.1, decay_steps=0), ValueError,
     "cosine_decay(decay_steps=0): decay_steps must be a positive integer"),
    (lambda: uxs.cosine_decay(0.1, decay_steps=2.5), TypeError, "cosine_decay(decay_steps=2.5)"),
    (lambda: uxs.cosine_decay(0.1, alpha=1.5), ValueError, "cosine_decay(alpha=1.5): alpha must be in [0, 1]"),
    (lambda: uxs.cosine_decay(0.1, exponent=0.0), ValueError,
     "cosine_decay(exponent=0.0): exponent must be in (0, inf)"),
    (lambda: uxs.cosine_decay(0.1, exponent="2"), TypeError, "cosine_decay(exponent='2'): exponent must be a real"),
    (lambda: uxs.warmup_constant(0.0, 1.0, -1), ValueError,
     "warmup_constant(warmup_steps=-1): warmup_steps must be a non-negative integer"),
    (lambda: uxs.warmup_constant(0.0, 1.0, 2.0), TypeError, "warmup_constant(warmup_steps=2.0)"),
    (lambda: uxs.warmup_constant(0.0, None, 3), TypeError,
     "warmup_constant(peak_value=None): peak_value must be a real number"),
    (lambda: uxs.warmup_constant(float("nan"), 1.0, 3), ValueError, "warmup_constant(init_value=nan)"),
    (lambda: uxs.linear_schedule(1.0, 0.0, 0), ValueError,
     "linear_schedule(transition_steps=0): transition_steps must be a positive integer"),
    (lambda: uxs.linear_schedule(1.0, 0.0, 5, transition_begin=-2), ValueError,
     "linear_schedule(transition_begin=-2): transition_begin must be a non-negative integer"),
    (lambda: uxs.linear_schedule(1.0, "a", 5), TypeError, "linear_schedule(end_value='a'): end_value must be a real"),
    (lambda: uxs.linear_schedule(True, 0.0, 5), TypeError, "linear_schedule(init_value=True)"),
    (lambda: uxs.constant(None), TypeError, "constant(init_value=None): init_value must be a real number"),
    (lambda: uxs.constant(True), TypeError, "constant(init_value=True)"),
    (lambda: uxs.exponential_decay(0.1, decay_rate=0.0), ValueError, "exponential_decay(decay_rate=0.0)"),
    (lambda: uxs.exponential_decay(0.1, staircase=1), TypeError,
     "exponential_decay(staircase=1): staircase must be True or False"),
    (lambda: uxs.exponential_decay(0.1, transition_begin=-1), ValueError,
     "exponential_decay(transition_begin=-1): transition_begin must be a non-negative integer"),
    (lambda: uxs.polynomial_decay(0.1, power=0.0), ValueError, "polynomial_decay(power=0.0): power must be in (0, inf)"),
    (lambda: uxs.linear_decay(0.1, warmup=20, steps=10), ValueError, "linear_decay(warmup=20): warmup must be in [0, steps]"),
    (lambda: uxs.piecewise_constant(0.1, {-1: 0.5}), ValueError, "piecewise_constant(boundaries_and_values={-1: 0.5})"),
    (lambda: uxs.piecewise_constant(0.1, [(4, 1.0)]), TypeError,
     "piecewise_constant(boundaries_and_values=[(4, 1.0)]): boundaries_and_values must be a dict"),
    (lambda: uxs.piecewise_constant(0.1, {4: "a"}), TypeError, "piecewise_constant(boundaries_and_values[4]='a')"),
    (lambda: uxs.piecewise_interpolate("cubic", 1.0), ValueError,
     "piecewise_interpolate(interpolate_type='cubic'): interpolate_type must be 'linear' or 'cosine'"),
    (lambda: uxs.piecewise_interpolate("linear", 1.0, {4: -0.1}), ValueError,
     "piecewise_interpolate(boundaries_and_scales[4]=-0.1)"),
    (lambda: uxs.warmup_cosine_decay(0.0, 1.0, warmup_steps=10, decay_steps=10), ValueError,
     "warmup_cosine_decay(decay_steps=10): decay_steps must be greater than warmup_steps=10"),
    (lambda: uxs.warmup_exponential_decay(0.0, 1.0, 2, 0, 0.5), ValueError, "warmup_exponential_decay(transition_steps=0)"),
    (lambda: uxs.linear_onecycle(0, 1.0), ValueError, "linear_onecycle(transition_steps=0)"),
    (lambda: uxs.linear_onecycle(10, 1.0, pct_start=0.5, pct_final=0.4), ValueError,
     "linear_onecycle(pct_final=0.4): pct_final must be in [0.5, 1]"),
    (lambda: uxs.cosine_onecycle(10, 1.0, div_factor=0), ValueError, "cosine_onecycle(div_factor=0.0)"),
    (lambda: uxs.cosine_decay(uxs.constant(0.1)), TypeError, "cosine_decay(init_value=constant(init_value=0.1))"),
    (lambda: uxs.join_schedules([uxs.constant(1.0)], [3]), ValueError,
     "join_schedules(boundaries=(3,)): boundaries must hold len(schedules) - 1 = 0 steps"),
    (lambda: uxs.join_schedules([uxs.constant(1.0)] * 3, [5, 2]), ValueError,
     "join_schedules(boundaries=(5, 2)): boundaries must be non-decreasing"),
    (lambda: uxs.join_schedules([uxs.constant(1.0), 3], [1]), TypeError, "must hold callables, got 3"),
    (lambda: uxs.join_schedules([], []), ValueError, "join_schedules(schedules=()): schedules must hold at least one"),
    (lambda: uxs.sgdr([]), ValueError, "sgdr(cosine_kwargs=[]): cosine_kwargs must be a non-empty list"),
    (lambda: uxs.warmup_stable_decay(0.0, 1.0, 2, 3, 0), ValueError,
     "warmup_stable_decay(cooldown_steps=0): cooldown_steps must be a positive integer"),
    (lambda: uxs.warmup_stable_decay(0.0, 1.0, 2, -3, 4), ValueError,
     "warmup_stable_decay(stable_steps=-3): stable_steps must be a non-negative integer"),
    (lambda: uxs.warmup_stable_decay(0.0, 1.0, 2, 3, 4, cooldown_type="sqrt"), ValueError,
     "warmup_stable_decay(cooldown_type='sqrt'): cooldown_type must be 'linear', 'cosine' or '1-sqrt'"),
    (lambda: uxs.cyclic(0.1, 1.0, mode="exp"), ValueError,
     "cyclic(mode='exp'): mode must be 'triangular', 'triangular2' or 'exp_range'"),
    (lambda: uxs.cyclic(0.1, 1.0, step_size_down=0), ValueError,
     "cyclic(step_size_down=0): step_size_down must be a positive integer"),
    (lambda: uxs.cyclic(0.1, 1.0, gamma=1.5), ValueError, "cyclic(gamma=1.5): gamma must be in (0, 1]"),
    (lambda: uxs.cosine_warm_restarts(1.0, period=0), ValueError,
     "cosine_warm_restarts(period=0): period must be a positive integer"),
    (lambda: uxs.cosine_warm_restarts(1.0, period=3, period_mult=1.5), TypeError,
     "cosine_warm_restarts(period_mult=1.5)"),
    (lambda: uxs.multiply_schedules([]), ValueError,
     "multiply_schedules(schedules=[]): schedules must be a non-empty list"),
    (lambda: uxs.multiply_schedules([uxs.constant(1.0), "a"]), TypeError, "must hold schedules (callables), got 'a'"),
    (lambda: uxs.swalr(1.0, 0.1, anneal_strategy="cosine"), ValueError,
     "swalr(anneal_strategy='cosine'): anneal_strategy must be 'cos' or 'linear'"),
    (lambda: uxs.swalr(1.0, 0.1, anneal_steps=-1), ValueError, "swalr(anneal_steps=-1)"),
    (lambda: uxs.power_decay_rate(0.0), ValueError, "power_decay_rate(exponent=0.0): exponent must be in (0, inf)"),
    (lambda: uxs.power_decay_rate(max_value=1.5), ValueError,
     "power_decay_rate(max_value=1.5): max_value must be in (0, 1]"),
    (lambda: uxs.sgdr([dict(init_value=0, peak_value=1, warmup_steps=5, decay_steps=3)]), ValueError,
     "warmup_cosine_decay(decay_steps=3)"),
]


@pytest.mark.parametrize("build, exc, message", BAD, ids=[m.split("(")[0] + str(i) for i, (_, _, m) in enumerate(BAD)])
def test_bad_options_raise_naming_the_call(build, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        build()


# --------------------------------------------------------------------------
# Docs


def test_the_public_module_exports_the_implementation():
    from updax import _schedules

    assert uxs.__all__ == _schedules.__all__
    assert all(getattr(uxs, name) is getattr(_schedules, name) for name in uxs.__all__)


def test_polaris_names_and_defaults():
    def defaults(fn):
        return {k: v.default for k, v in inspect.signature(fn).parameters.items()}

    empty = inspect.Parameter.empty
    assert defaults(uxs.constant) == dict(init_value=empty)
    assert defaults(uxs.exponential_decay) == dict(init_value=empty, decay_rate=0.95, transition_steps=10,
                                                   transition_begin=0, staircase=False, end_value=None)
    assert defaults(uxs.cosine_decay) == dict(init_value=empty, decay_steps=10, alpha=0.0, exponent=1.0)
    assert defaults(uxs.polynomial_decay) == dict(init_value=empty, end_value=1e-3, power=2, transition_steps=10,
                                                  transition_begin=0)
    assert defaults(uxs.linear_decay) == dict(init_value=empty, warmup=0, steps=1000)


def test_a_schedule_keeps_a_copy_of_a_numpy_option():
    value = np.array(0.5, np.float32)
    schedule = uxs.constant(value)
    value[...] = 2.0
    assert float(schedule(3)) == 0.5


@pytest.mark.parametrize("schedule, at_start, at_end", [
    (uxs.polynomial_decay(5.960464477539063e-08, end_value=2.0, power=1.0, transition_steps=2), 5.960464477539063e-08,
     2.0),
    (uxs.polynomial_decay(2.220446049250313e-16, end_value=1.0, power=1.0, transition_steps=2), 2.220446049250313e-16,
     1.0),
    (uxs.polynomial_decay(3.0, end_value=1e-30, power=2.0, transition_steps=3), 3.0, 1e-30),
    (uxs.warmup_cosine_decay(1e-30, peak_value=4.0, warmup_steps=2, decay_steps=6, end_value=0.0), 1e-30, 0.0),
    (uxs.cosine_decay(1e-30, decay_steps=3, alpha=0.0, exponent=2.5), 1e-30, 0.0),
    (uxs.linear_schedule(5.960464477539063e-08, 2.0, 2), 5.960464477539063e-08, 2.0),
    (uxs.linear_schedule(3.0, 1e-30, 3), 3.0, 1e-30),
    (uxs.warmup_constant(1e-30, 4.0, 2), 1e-30, 4.0),
    (uxs.warmup_constant(4.0, 1e-30, 3), 4.0, 1e-30),
])
def test_interpolating_schedules_are_exact_at_both_ends(schedule, at_start, at_end):
    """A value far below the other end's rounding is kept: (a - b) + b would give 0 (found by the long fuzz:
    a polynomial eps schedule from 6e-8 to 2 started at eps = 0, and adadelta divided 0 by 0)."""
    assert float(schedule(0)) == np.float32(at_start)
    assert float(schedule(1000)) == np.float32(at_end)


@pytest.mark.parametrize("schedule", [uxs.linear_schedule(TINY, TINY, 2),
                                      uxs.polynomial_decay(TINY, end_value=TINY, power=1.0, transition_steps=2),
                                      uxs.warmup_constant(TINY, TINY, 2)], ids=["linear", "polynomial", "warmup"])
def test_a_ramp_between_equal_ends_is_that_value_all_along(schedule):
    """From float32's smallest normal to itself, the halves a·(1 - w) and b·w are subnormal and flushed to zero
    on the CPU, eagerly: the value halfway was 0, outside the "> 0" of the option it fed (found by the long fuzz:
    an rprop ``eta_minus`` schedule refused at its second step)."""
    for count in range(4):
        assert float(schedule(count)) == TINY
        assert float(jax.jit(schedule)(count)) == TINY


@pytest.mark.parametrize("schedule, exact", [
    (uxs.linear_schedule(0.1, 0.7, transition_steps=3, transition_begin=5), {0: 0.1, 5: 0.1, 8: 0.7, 1000: 0.7}),
    (uxs.linear_schedule(0.7, 0.1, transition_steps=1, transition_begin=0), {0: 0.7, 1: 0.1, 1000: 0.1}),
    (uxs.warmup_constant(0.1, 0.7, warmup_steps=3), {0: 0.1, 3: 0.7, 1000: 0.7}),
    (uxs.warmup_constant(0.1, 0.7, warmup_steps=0), {0: 0.7, 1000: 0.7}),
    (uxs.cosine_decay(0.1, decay_steps=3, alpha=0.25, exponent=2.5),
     {3: np.float32(0.1) * np.float32(0.25), 1000: np.float32(0.1) * np.float32(0.25)}),
], ids=["linear_schedule", "linear_schedule_1_step", "warmup_constant", "warmup_constant_0_steps", "cosine_decay"])
def test_ramps_are_exact_where_they_begin_and_end(schedule, exact):
    """The value is the given number exactly at the start and the end of a ramp, eager and jitted."""
    jitted = jax.jit(lambda s, c: s(c))
    for count, value in exact.items():
        assert schedule(count) == np.float32(value), count
        assert jitted(schedule, jnp.int32(count)) == np.float32(value), count



# --------------------------------------------------------------------------
# The schedules of torch and current practice, beyond the closed forms


def test_warm_restarts_start_each_cycle_exactly_where_float32_logs_round():
    """The cycle comes from a logarithm; at the restarts of long runs (counts up to 2**20) float32's log lands on
    either side of the integer: the value there is init_value exactly, one step before it the cycle's last step."""
    sched = uxs.cosine_warm_restarts(1.0, period=3, period_mult=2, end_value=0.0)
    starts = np.array([3 * (2**i - 1) for i in range(1, 19)])
    for fn in (sched, jax.jit(sched)):
        np.testing.assert_array_equal(np.asarray(fn(jnp.asarray(starts, jnp.int32))), 1.0)
        last = np.asarray(fn(jnp.asarray(starts - 1, jnp.int32)))
        lengths = 3 * 2.0 ** np.arange(0, 18)  # the cycle that ends there
        np.testing.assert_allclose(last, (1 + np.cos(np.pi * (lengths - 1) / lengths)) / 2, rtol=1e-4, atol=2e-7)


def test_power_decay_rate_is_adams_b2_as_palm_uses_it():
    """scale_by_adam(b2=power_decay_rate()) against Adam written out with PaLM's b2_k = 1 - k^-0.8 (float64)."""
    b1, eps = 0.9, 1e-8
    opt = ux.scale_by_adam(b1=b1, b2=uxs.power_decay_rate(0.8), eps=eps, eps_root=0.0)
    rng = np.random.default_rng(0)
    grads = [{"a": rng.normal(size=3), "b": [rng.normal(size=(2, 2))]} for _ in range(20)]
    state = opt.init(jax.tree.map(jnp.asarray, grads[0]))
    m = jax.tree.map(np.zeros_like, grads[0])
    v = jax.tree.map(np.zeros_like, grads[0])
    step = jax.jit(opt.update)
    for k, g in enumerate(grads, start=1):
        b2 = 1 - k**-0.8
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        want = jax.tree.map(lambda m, v: (m / (1 - b1**k)) / (np.sqrt(v / (1 - b2**k)) + eps), m, v)
        with jax.numpy_dtype_promotion("standard"):
            got, state = step(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g), state)
        for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
