"""updax vs optax, side by side in one process: compile time, step time, memory, bandwidth floor.

Run from the repository root (``pip install -e ".[bench]"`` first)::

    python benchmarks/run.py              # everything, about 35 minutes on 2 cores
    python benchmarks/run.py --quick      # small sizes and fewer repeats, a smoke run

Each case jits one optimizer step, ``update`` then ``apply_updates``, with the
params and the optimizer state donated (as a training loop does), for updax
and for optax with the same hyperparameters. It reports

- compile time: trace + lower + compile of that step, once per side (after a
  warm-up, the side that compiles first alternating from case to case);
- step time: the median over ``--repeats`` timed calls, the two sides
  interleaved call by call so machine noise hits both alike, and updax's
  step a second time beside them (A/A: the same program against itself,
  the scatter of this run's ratios where nothing differs);
- memory: the optimizer state's bytes, XLA's temporary buffer bytes for the
  step and its peak (``compiled.memory_analysis()``; with donation the
  temporaries are what a step needs beyond params, grads and state);
- the bandwidth floor: the bytes the update rule must read and write
  (``FLOOR_PASSES`` full-size float32 passes) over the streaming bandwidth of
  a donated jitted elementwise kernel, timed inside the same interleaved loop;
- numerical equality: the largest difference of both sides' params after 3
  steps, relative to the largest change optax made to that leaf.

Results go to ``benchmarks/results/results.json`` and ``results.md`` (``figures.py`` draws the docs' pictures
from them and from ``step_times.py``'s and ``compile_times.py``'s). Eager (un-jitted) ``update`` is timed too,
each library in a fresh process (its first call compiles every op per leaf shape).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import logging
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

import updax as ux

ROOT = Path(__file__).resolve().parent.parent
O = ux.optimizers

# --------------------------------------------------------------------------
# Recipes: (updax, optax), the same rule and hyperparameters on both sides.

RECIPES = {
    "adam": (lambda: O.adam(1e-3, eps_root=0.0), lambda: optax.adam(1e-3)),
    "adamw": (lambda: O.adamw(1e-3, eps_root=0.0, decay=1e-4), lambda: optax.adamw(1e-3, weight_decay=1e-4)),
    "clip+adamw": (lambda: ux.clip_by_global_norm(1.0).pipe(ux.compose, O.adamw(1e-3, eps_root=0.0, decay=1e-4)),
                   lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=1e-4))),
    "lamb": (lambda: O.lamb(1e-3, eps=1e-6, eps_root=0.0, decay=1e-4), lambda: optax.lamb(1e-3, weight_decay=1e-4)),
    "sgd+momentum": (lambda: O.sgd(1e-2, momentum=0.9), lambda: optax.sgd(1e-2, momentum=0.9)),
    "lion": (lambda: O.lion(1e-4, b1=0.9, b2=0.99, decay=1e-3),
             lambda: optax.lion(1e-4, b1=0.9, b2=0.99, weight_decay=1e-3)),
    "adafactor": (lambda: O.adafactor(1e-3), lambda: optax.adafactor(1e-3)),
    # updax's opt-in flat state layout (ux.flat_state), against optax's usual step.
    "adam/flat": (lambda: O.adam(1e-3, eps_root=0.0).flat_state(), lambda: optax.adam(1e-3)),
    "clip+adamw/flat": (lambda: ux.clip_by_global_norm(1.0).pipe(ux.compose, O.adamw(1e-3, eps_root=0.0, decay=1e-4))
                        .flat_state(),
                        lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=1e-4))),
    "sgd+momentum/flat": (lambda: O.sgd(1e-2, momentum=0.9).flat_state(), lambda: optax.sgd(1e-2, momentum=0.9)),
}

#: Full-size float32 passes the rule must make at least (reads + writes of params, grads and state).
FLOOR_PASSES = {
    "adam": 7,          # read g, p, m, v; write p, m, v
    "adamw": 7,
    "clip+adamw": 8,    # + one read of g for the global norm
    "lamb": 10,         # pass 1 reads g, p, m, v, writes m, v (+ norms); pass 2 reads p, m, v, writes p
    "sgd+momentum": 5,  # read g, p, t; write p, t
    "lion": 5,          # read g, p, m; write p, m
    "adafactor": 5,     # read g, p; write p, plus the factored moments' and block RMS's extra read of g and u
    "adam/flat": 7,
    "clip+adamw/flat": 8,
    "sgd+momentum/flat": 5,
}

# --------------------------------------------------------------------------
# Workloads


def transformer_like(layers=48, d=256):
    """T: ``layers`` blocks of 8 leaves (4 attention matrices, 2 MLP matrices, a layer norm)."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return jnp.asarray(rng.normal(size=shape).astype(np.float32) * 0.02)

    return [{"wq": w(d, d), "wk": w(d, d), "wv": w(d, d), "wo": w(d, d), "w1": w(d, 4 * d), "w2": w(4 * d, d),
             "ln_scale": jnp.ones(d), "ln_bias": jnp.zeros(d)} for _ in range(layers)]


def many_small(leaves=1000, mean=4096):
    """S: ``leaves`` leaves of varied sizes (uniform in [mean/4, 7·mean/4], some matrices)."""
    rng = np.random.default_rng(1)
    tree = {}
    for i in range(leaves):
        n = int(rng.integers(mean // 4, 7 * mean // 4))
        shape = (n // 32, 32) if i % 2 else (n,)
        tree[f"leaf{i:04d}"] = jnp.asarray(rng.normal(size=shape).astype(np.float32))
    return tree


def big(leaves=4, size=4 * 2**20):
    """B: a few large leaves."""
    rng = np.random.default_rng(2)
    return [jnp.asarray(rng.normal(size=(size // 1024, 1024)).astype(np.float32)) for _ in range(leaves)]


def workloads(quick):
    if quick:
        return {"T": transformer_like(layers=4, d=128), "S": many_small(leaves=100, mean=1024),
                "B": big(leaves=2, size=2**20)}
    return {"T": transformer_like(), "S": many_small(), "B": big()}


def grads_like(params, seed):
    """Gaussian gradients of scale 1e-2 shaped like ``params`` (numpy: no compilation per leaf shape)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda p: jnp.asarray((1e-2 * rng.normal(size=p.shape)).astype(np.float32)), params)


def nbytes(tree):
    return int(sum(x.nbytes for x in jax.tree.leaves(tree)))


def apply_fn(opt):
    """Each library's own ``apply_updates``."""
    return ux.apply_updates if isinstance(opt, ux.Update) else optax.apply_updates


# --------------------------------------------------------------------------
# Measurement


def make_step(opt):
    def step(params, state, grads):
        updates, state = opt.update(grads, state, params)
        return apply_fn(opt)(params, updates), state

    return jax.jit(step, donate_argnums=(0, 1))


def copy(tree):
    return jax.tree.map(lambda x: jnp.array(x, copy=True), tree)


#: Cases whose first compile takes less than this (seconds, either side) are compiled 3 times, the median reported.
COMPILE_REPEAT_BELOW_S = 5.0


def compile_step(opt, params, grads):
    """The compiled step, its compile seconds, the state's bytes, XLA's temporary and peak bytes.

    Peak is what the step holds at once: its arguments and outputs (donated
    arguments counted once) plus its temporaries.
    """
    state = opt.init(params)
    step = make_step(opt)
    # Cold caches for both sides: jax.numpy's operators trace once per leaf shape and keep what they traced, so
    # the side that traced the same shapes second would otherwise get part of its tracing for free.
    jax.clear_caches()
    start = time.perf_counter()
    compiled = step.lower(params, state, grads).compile()
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    size = {k: int(getattr(memory, f"{k}_size_in_bytes", 0)) if memory is not None else 0
            for k in ("argument", "output", "alias", "temp")}
    peak = size["argument"] + size["output"] - size["alias"] + size["temp"]
    return compiled, seconds, nbytes(state), size["temp"], peak


def kernels(compiled):
    """The compiled program's top-level kernels: ``{"fusions": n, "copies": m}`` (copies of arrays of two or
    more elements: the full-size ones a donated step makes when it cannot write in place)."""
    entry = compiled.as_text()
    entry = entry[entry.index("ENTRY"):]
    copies = [s for s in re.findall(r"= \w+\[([\d,]*)\]\S* copy\(", entry) if s and s != "1"]
    return {"fusions": len(re.findall(r" fusion\(", entry)), "copies": len(copies)}


class Bandwidth:
    """The streaming kernel the floor is measured with: a donated jitted ``p ← 0.999·p + g`` (3 passes).

    It runs on the big-leaf workload, where per-leaf overheads vanish, and is
    timed inside every case's interleaved loop, so each case's floor comes from
    the same minutes as its step times.
    """

    def __init__(self, params):
        self.bytes = 3 * nbytes(params)
        self.kernel = jax.jit(lambda p, g: jax.tree.map(lambda a, b: 0.999 * a + b, p, g), donate_argnums=0)
        self.p, self.g = copy(params), grads_like(params, 9)
        self.seconds = []

    def __call__(self):
        start = time.perf_counter()
        self.p = jax.block_until_ready(self.kernel(self.p, self.g))
        return time.perf_counter() - start

    def bytes_per_second(self, since=0):
        return self.bytes / statistics.median(self.seconds[since:])


def time_side_by_side(fns, params, grads, repeats, bw=None):
    """Median seconds per call of each compiled step, interleaved call by call (and the bandwidth kernel).

    The order within a round goes through every permutation in turn (A B, B A; A B C, A C B, B A C, ...). The
    step that runs right after the bandwidth kernel finds the caches flushed by it, which measurably slowed
    whichever side always ran first; and a step run right after the same program (updax after updax's A/A
    copy) may find more of it warm, so each side follows each other side equally often, which rotating
    (A B C, B C A, C A B: A always after C, B after A) did not do.
    """
    carries = [(copy(params), copy(init)) for _, init in fns]
    times = [[] for _ in fns]
    orders = list(itertools.permutations(range(len(fns))))
    for r in range(repeats + 2):  # two warm-up rounds
        for i in orders[r % len(orders)]:
            fn = fns[i][0]
            p, s = carries[i]
            start = time.perf_counter()
            p, s = fn(p, s, grads)
            jax.block_until_ready((p, s))
            if r >= 2:
                times[i].append(time.perf_counter() - start)
            carries[i] = (p, s)
        if bw is not None:
            seconds = bw()
            if r >= 2:
                bw.seconds.append(seconds)
    return [statistics.median(t) for t in times]


def check_equal(steps, params):
    """Runs each compiled step 3 times from the same start.

    Returns the largest difference of the two sides' params, relative to the
    largest change optax made to that leaf (so it measures the updates).
    """
    results = []
    for step, state in steps:
        p, s = copy(params), copy(state)
        for t in range(3):
            p, s = step(p, s, grads_like(params, 100 + t))
        results.append(p)
    worst = 0.0
    for a, b, p in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1]), jax.tree.leaves(params)):
        a, b, p = (np.asarray(x, np.float64) for x in (a, b, p))
        worst = max(worst, float(np.max(np.abs(a - b)) / max(np.max(np.abs(b - p)), 1e-30)))
    return worst


class CompileLog(logging.Handler):
    """The distinct programs JAX compiles within ``with CompileLog() as log:`` (``log.programs``).

    It listens to JAX's compile log (``jax.log_compiles``) and puts the
    loggers' levels back on exit. tests/test_tracing.py counts with it too.
    """

    LOGGERS = ("jax._src.dispatch", "jax._src.interpreters.pxla")

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.programs = set()

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Compiling "):
            self.programs.add(message.split(". Argument")[0])

    def __enter__(self):
        self._loggers = [logging.getLogger(name) for name in self.LOGGERS]
        self._levels = [logger.level for logger in self._loggers]
        for logger in self._loggers:
            logger.addHandler(self)
            logger.setLevel(logging.DEBUG)
        self._log = jax.log_compiles(True)
        self._log.__enter__()
        return self

    def __exit__(self, *exc):
        self._log.__exit__(*exc)
        for logger, level in zip(self._loggers, self._levels):
            logger.removeHandler(self)
            logger.setLevel(level)


def eager_step_time(opt, params, grads, repeats=3):
    """Seconds of the first eager ``update`` (which compiles every op for every new leaf shape), the number of
    programs it compiled, and the median seconds of the next ``repeats`` calls."""
    state = opt.init(params)
    jax.block_until_ready(state)
    times = []
    with CompileLog() as log:  # (only the first call compiles)
        for _ in range(repeats + 1):
            start = time.perf_counter()
            updates, state = opt.update(grads, state, params)
            jax.block_until_ready(updates)
            times.append(time.perf_counter() - start)
    return times[0], len(log.programs), statistics.median(times[1:])


#: Eager cases: (workload, recipe, leaves kept). On S every op compiles once per leaf shape on first use,
#: so the first 100 leaves stand for the 1000.
EAGER_CASES = [("T", "adam", None), ("T", "clip+adamw", None), ("B", "adam", None), ("S", "adam", 100),
               ("S", "clip+adamw", 100)]


def eager_case(side, name, recipe, kept, quick):
    """One library's eager timings, in a fresh process: op programs compiled by the other library's calls
    would otherwise be reused (in one process, whichever side runs second meets a warm cache)."""
    command = [sys.executable, __file__, "--eager-case", f"{side},{name},{recipe},{kept}"]
    command += ["--quick"] if quick else []
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _run_eager_case(spec, quick):
    side, name, recipe, kept = spec.split(",")
    params = workloads(quick)[name]
    if kept != "None":
        params = dict(list(params.items())[:int(kept)])
    opt = RECIPES[recipe][0 if side == "updax" else 1]()
    print(json.dumps(eager_step_time(opt, params, grads_like(params, 0))))


def warm_up(recipes, table=RECIPES):
    """Compiles and runs each recipe (of ``table``: name -> (updax's, optax's)) once on a tiny tree, so one-time
    tracing costs hit neither side's timings."""
    params = {"w": jnp.ones((4, 4)), "b": jnp.zeros(4)}
    for recipe in recipes:
        for opt in (table[recipe][0](), table[recipe][1]()):
            # (copies: some of optax's states hold the params' own buffers, which a donated step cannot take twice)
            jax.block_until_ready(make_step(opt)(copy(params), copy(opt.init(params)), params))


def run_case(workload, params, recipe, repeats, bw, optax_first=False):
    ux_opt, ox_opt = RECIPES[recipe][0](), RECIPES[recipe][1]()
    grads = grads_like(params, 0)
    # Which library compiles first alternates from case to case, so neither always meets colder caches.
    compiled, seconds = [None, None], [[], []]
    order = (1, 0) if optax_first else (0, 1)
    for i in order:
        compiled[i] = compile_step((ux_opt, ox_opt)[i], params, grads)
        seconds[i].append(compiled[i][1])
    # A single compile of a second or two moves by 10-20% from one try to the next: cheap ones are compiled
    # twice more (in the other order, then the first) and the median is reported.
    if max(s[0] for s in seconds) < COMPILE_REPEAT_BELOW_S:
        for again in (order[::-1], order):
            for i in again:
                seconds[i].append(compile_step((ux_opt, ox_opt)[i], params, grads)[1])
    (ux_step, _, ux_state_bytes, ux_temp, ux_peak), (ox_step, _, ox_state_bytes, ox_temp, ox_peak) = compiled
    ux_compile, ox_compile = (statistics.median(s) for s in seconds)
    steps = [(ux_step, ux_opt.init(params)), (ox_step, ox_opt.init(params))]
    max_rel_diff = check_equal(steps, params)
    since = len(bw.seconds)
    # updax's step a second time, on buffers of its own: the same program against itself (A/A) shows how far
    # this run's timings scatter where nothing differs.
    ux_time, ox_time, ux_again = time_side_by_side(steps + steps[:1], params, grads, repeats, bw)
    bandwidth = bw.bytes_per_second(since)
    floor = FLOOR_PASSES[recipe] * nbytes(params) / bandwidth
    row = {
        "workload": workload, "recipe": recipe, "params": int(sum(x.size for x in jax.tree.leaves(params))),
        "leaves": len(jax.tree.leaves(params)),
        "updax_compile_s": ux_compile, "optax_compile_s": ox_compile,
        "updax_step_ms": 1e3 * ux_time, "optax_step_ms": 1e3 * ox_time, "floor_ms": 1e3 * floor,
        "step_ratio": ux_time / ox_time, "compile_ratio": ux_compile / ox_compile, "floor_ratio": ux_time / floor,
        "aa_step_ratio": ux_again / ux_time, "updax_compiles_s": seconds[0], "optax_compiles_s": seconds[1],
        "updax_state_mb": ux_state_bytes / 2**20, "optax_state_mb": ox_state_bytes / 2**20,
        "updax_temp_mb": ux_temp / 2**20, "optax_temp_mb": ox_temp / 2**20,
        "updax_peak_mb": ux_peak / 2**20, "optax_peak_mb": ox_peak / 2**20,
        "bandwidth_gb_s": bandwidth / 1e9, "max_rel_diff": max_rel_diff,
    }
    print(f"{workload:6s} {recipe:13s} step {row['updax_step_ms']:8.2f} ms vs {row['optax_step_ms']:8.2f} ms "
          f"({row['step_ratio']:.2f}x, A/A {row['aa_step_ratio']:.2f}x; floor {row['floor_ms']:.1f} ms, "
          f"{row['floor_ratio']:.2f}x)  "
          f"compile {ux_compile:6.2f} s vs {ox_compile:6.2f} s ({row['compile_ratio']:.2f}x)  "
          f"temp {row['updax_temp_mb']:.1f} vs {row['optax_temp_mb']:.1f} MB  diff {row['max_rel_diff']:.1e}",
          flush=True)
    return row


# --------------------------------------------------------------------------
# A real training step: forward + backward + update


def train_problem(quick):
    """A pre-norm transformer block stack in plain JAX: its params, and ``make(opt)``, the jitted step (loss,
    grads and the optimizer step in one jit, params and state donated; its third argument is unused)."""
    d, layers, tokens = (64, 2, 64) if quick else (256, 4, 256)
    rng = np.random.default_rng(3)

    def w(*shape):
        return jnp.asarray(rng.normal(size=shape).astype(np.float32) / np.sqrt(shape[0]))

    params = [{"wq": w(d, d), "wk": w(d, d), "wv": w(d, d), "wo": w(d, d), "w1": w(d, 4 * d), "w2": w(4 * d, d),
               "ln": jnp.ones(d)} for _ in range(layers)]
    x = jnp.asarray(rng.normal(size=(tokens, d)).astype(np.float32))

    def loss_fn(params):
        h = x
        for layer in params:
            z = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6) * layer["ln"]
            q, k, v = z @ layer["wq"], z @ layer["wk"], z @ layer["wv"]
            h = h + jax.nn.softmax(q @ k.T / np.sqrt(d), axis=-1) @ v @ layer["wo"]
            h = h + jax.nn.gelu(h @ layer["w1"]) @ layer["w2"]
        return jnp.mean((h - x) ** 2)

    def make(opt):
        def step(params, state, _):
            grads = jax.grad(loss_fn)(params)
            updates, state = opt.update(grads, state, params)
            return apply_fn(opt)(params, updates), state

        return jax.jit(step, donate_argnums=(0, 1))

    return params, make


def train_step_case(recipe, repeats, quick, optax_first=False, report=True):
    """The train step (``train_problem``) of both libraries: compile times and step times."""
    params, make = train_problem(quick)
    opts = [RECIPES[recipe][0](), RECIPES[recipe][1]()]
    fns, seconds = [None, None], [[], []]
    order = (1, 0) if optax_first else (0, 1)
    for i in (*order, *order[::-1], *order):  # three compiles a side, the median reported (as in run_case)
        state = opts[i].init(params)
        jax.clear_caches()  # (cold caches for both sides, as in compile_step)
        start = time.perf_counter()
        compiled = make(opts[i]).lower(params, state, None).compile()
        seconds[i].append(time.perf_counter() - start)
        fns[i] = (compiled, state)
    compiles = [statistics.median(s) for s in seconds]
    times = time_side_by_side(fns + fns[:1], params, None, repeats)  # (updax's step again: the A/A ratio)
    row = {"workload": "train", "recipe": recipe, "params": int(sum(p.size for p in jax.tree.leaves(params))),
           "leaves": len(jax.tree.leaves(params)), "updax_compile_s": compiles[0], "optax_compile_s": compiles[1],
           "updax_step_ms": 1e3 * times[0], "optax_step_ms": 1e3 * times[1], "step_ratio": times[0] / times[1],
           "compile_ratio": compiles[0] / compiles[1], "aa_step_ratio": times[2] / times[0],
           "updax_compiles_s": seconds[0], "optax_compiles_s": seconds[1]}
    if report:
        print(f"train  {recipe:13s} step {row['updax_step_ms']:8.2f} ms vs {row['optax_step_ms']:8.2f} ms "
              f"({row['step_ratio']:.2f}x, A/A {row['aa_step_ratio']:.2f}x)  compile {compiles[0]:.2f} s vs "
              f"{compiles[1]:.2f} s", flush=True)
    return row


# --------------------------------------------------------------------------
# Reports


def markdown(result):
    lines = [f"updax {result['updax']} vs optax {result['optax']}, jax {result['jax']}, {result['machine']}; "
             f"streaming bandwidth {result['bandwidth_gb_s']:.1f} GB/s; medians of {result['repeats']} steps.",
             "",
             "| workload | recipe | updax step | optax step | ratio | A/A | floor | updax/floor | updax compile | "
             "optax compile | ratio | state MB (updax/optax) | temp MB (updax/optax) | peak MB (updax/optax) | "
             "max rel diff |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    def cell(r, fmt, *keys):
        return fmt.format(*(r[k] for k in keys)) if all(k in r for k in keys) else "-"

    for r in result["rows"]:
        lines.append(" | ".join([
            f"| {r['workload']}", r["recipe"], f"{r['updax_step_ms']:.2f} ms", f"{r['optax_step_ms']:.2f} ms",
            f"{r['step_ratio']:.2f}x", cell(r, "{:.2f}x", "aa_step_ratio"), cell(r, "{:.1f} ms", "floor_ms"),
            cell(r, "{:.2f}x", "floor_ratio"),
            f"{r['updax_compile_s']:.2f} s", f"{r['optax_compile_s']:.2f} s", f"{r['compile_ratio']:.2f}x",
            cell(r, "{:.0f} / {:.0f}", "updax_state_mb", "optax_state_mb"),
            cell(r, "{:.1f} / {:.1f}", "updax_temp_mb", "optax_temp_mb"),
            cell(r, "{:.0f} / {:.0f}", "updax_peak_mb", "optax_peak_mb"),
            cell(r, "{:.0e}", "max_rel_diff")]) + " |")
    if result.get("eager"):
        lines += ["", "Eager (un-jitted) `update`: the first call and the programs it compiled, then the median of "
                  "the next 3:", "",
                  "| workload | recipe | updax first | optax first | updax programs | optax programs | updax then | "
                  "optax then |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {e['workload']} | {e['recipe']} | {e['updax_first_s']:.2f} s | {e['optax_first_s']:.2f} s | "
                  f"{e.get('updax_programs', '-')} | {e.get('optax_programs', '-')} | "
                  f"{1e3 * e['updax_s']:.0f} ms | {1e3 * e['optax_s']:.0f} ms |" for e in result["eager"]]
    return "\n".join(lines) + "\n"


def commit():
    """The checkout's commit, with ``+dirty`` when tracked files differ from it (None outside a git checkout)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def environment():
    """The versions, the machine and the device a result was measured with, when (UTC) and at which commit."""
    device = jax.devices()[0]
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit(),
            "updax": ux.__version__, "optax": optax.__version__, "jax": jax.__version__,
            "platform": device.platform, "device_kind": device.device_kind, "device_count": jax.device_count(),
            "machine": f"{platform.machine()}, {jax.device_count()} {device.platform} device(s) "
                       f"({device.device_kind}), python {sys.version.split()[0]}"}


def write_results(out, stem, result, text):
    """``result`` as ``stem.json`` and ``text`` as ``stem.md`` in ``out``. CPU and accelerator results are kept
    apart (``results.json`` is the CPU run, ``results-gpu.json`` a GPU run), and so are quick runs."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = ("" if result["platform"] == "cpu" else f"-{result['platform']}") + ("-quick" if result["quick"] else "")
    (out / f"{stem}{suffix}.json").write_text(json.dumps(result, indent=1))
    (out / f"{stem}{suffix}.md").write_text(text)
    print(f"wrote {out / f'{stem}{suffix}.json'} and {out / f'{stem}{suffix}.md'}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small workloads, few repeats (a smoke run)")
    parser.add_argument("--workloads", default="T,S,B,train")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--eager-case", help=argparse.SUPPRESS)  # internal: one side's eager timings
    args = parser.parse_args(argv)
    if args.eager_case:
        return _run_eager_case(args.eager_case, args.quick)
    repeats = args.repeats or (3 if args.quick else 15)
    chosen = args.workloads.split(",")
    recipes = args.recipes.split(",")
    data = workloads(args.quick)
    bw = Bandwidth(data["B"])
    warm_up(recipes)
    rows, eager = [], []
    for name in [w for w in ("T", "S", "B") if w in chosen]:
        for recipe in recipes:
            rows.append(run_case(name, data[name], recipe, repeats, bw, optax_first=len(rows) % 2 == 1))
    if "train" in chosen:
        train_step_case(recipes[0], 1, args.quick, report=False)  # warm-up: the first compile also traces the model
        for recipe in recipes:
            rows.append(train_step_case(recipe, repeats, args.quick, optax_first=len(rows) % 2 == 1))
    for name, recipe, kept in [case for case in EAGER_CASES if case[0] in chosen and case[1] in recipes]:
        (ux_first, ux_programs, ux_s), (ox_first, ox_programs, ox_s) = (
            eager_case(side, name, recipe, kept, args.quick) for side in ("updax", "optax"))
        eager.append({"workload": name if kept is None else f"{name} ({kept} leaves)", "recipe": recipe,
                      "updax_first_s": ux_first, "optax_first_s": ox_first, "updax_s": ux_s, "optax_s": ox_s,
                      "updax_programs": ux_programs, "optax_programs": ox_programs})
        print(f"eager  {eager[-1]['workload']} {recipe}: first call updax {ux_first:.2f} s ({ux_programs} programs), "
              f"optax {ox_first:.2f} s ({ox_programs}); then updax {1e3 * ux_s:.0f} ms, optax {1e3 * ox_s:.0f} ms",
              flush=True)
    result = {**environment(), "quick": args.quick, "repeats": repeats,
              "bandwidth_gb_s": bw.bytes_per_second() / 1e9 if bw.seconds else float("nan"),
              "rows": rows, "eager": eager}
    write_results(args.out, "results", result, markdown(result))
    return result


if __name__ == "__main__":
    main()
