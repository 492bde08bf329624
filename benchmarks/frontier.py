"""The frontier's optimizers against AdamW: the amortized step, the compile and the state, on T and B.

Run from the repository root (``pip install -e ".[bench]"`` first)::

    python benchmarks/frontier.py                 # T and B, 3 rounds: about 30 minutes on 2 quiet cores
    python benchmarks/frontier.py --workloads T --recipes shampoo,soap --rounds 5
    python benchmarks/frontier.py --quick         # small workloads, 2 rounds: a smoke run

Shampoo, SOAP, PSGD and Sophia do more work on some steps than on others
(a root, a basis, a factor or a Hessian estimate every ``period`` steps),
so a step is timed as the mean of ``period`` consecutive calls (10: every
entry's default refresh period), the **amortized step**. Each round times
one such block of AdamW's (the baseline, updax's own) and one of each
recipe's, beside optax's where optax 0.2.8 has the rule (Muon, Sophia), on
buffers of their own, the order of the recipes rotating from round to
round; the ratio is the medians' recipe/AdamW. The compile is
``jit(step).lower(...).compile()`` from cold caches, the median of
``--rounds`` compiles, beside AdamW's compiled in the same round. State
bytes are those of ``init``'s output. Results go to
``benchmarks/results/frontier.json`` and ``frontier.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import optax

import updax as ux

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402  (the workloads and the measurement helpers of the main benchmark)

O = ux.optimizers

#: The steps a block of calls covers: every refresh period below is 10 (the entries' defaults).
PERIOD = 10


def half_squared_norm(params):
    """Sophia's objective: ``|w|²/2`` over the tree (its Hessian-vector product is cheap, like a real model's is
    not: the step measured is the optimizer's part)."""
    return sum((0.5 * jnp.sum(p * p) for p in jax.tree.leaves(params)), jnp.zeros([], jnp.float32))


#: name -> (updax's optimizer, optax's or None), both built on call.
RECIPES = {
    "adamw": (lambda: O.adamw(1e-3, eps_root=0.0, decay=1e-4), lambda: optax.adamw(1e-3, weight_decay=1e-4)),
    "adamw/cautious": (lambda: O.adamw(1e-3, eps_root=0.0, decay=1e-4).cautious(), None),
    "adamw/cautious_decay": (lambda: O.adamw(1e-3, eps_root=0.0, decay=1e-4, cautious_decay=True), None),
    "mars_adamw": (lambda: O.mars_adamw(1e-3), None),
    "mars_lion": (lambda: O.mars_lion(1e-4), None),
    "muon": (lambda: O.muon(), lambda: optax.contrib.muon(0.02)),
    "normuon": (lambda: O.normuon(), None),
    "sophia": (lambda: O.sophia(objective=half_squared_norm),
               lambda: optax.contrib.sophia(3e-4)),
    "shampoo": (lambda: O.shampoo(), None),
    "soap": (lambda: O.soap(), None),
}
if hasattr(O, "psgd_kron"):
    RECIPES["psgd_kron"] = (lambda: O.psgd_kron(), None)


#: What optax's side takes at each update (its Sophia takes the objective there, updax's at construction).
OPTAX_EXTRA = {"sophia": {"obj_fn": half_squared_norm}}


def make_step(opt, extra):
    """The donated jitted step, ``extra`` passed to each update."""

    def step(params, state, grads):
        updates, state = opt.update(grads, state, params, **extra)
        return run.apply_fn(opt)(params, updates), state

    return jax.jit(step, donate_argnums=(0, 1))


def compile_seconds(opt, params, grads, extra):
    state = opt.init(params)
    jax.clear_caches()
    start = time.perf_counter()
    compiled = make_step(opt, extra).lower(params, state, grads).compile()
    return compiled, time.perf_counter() - start, run.nbytes(state)


def block(compiled, carry, grads):
    """Seconds per call over ``PERIOD`` consecutive calls, and the carry after them."""
    params, state = carry
    start = time.perf_counter()
    for _ in range(PERIOD):
        params, state = compiled(params, state, grads)
    jax.block_until_ready((params, state))
    return (time.perf_counter() - start) / PERIOD, (params, state)


def case(workload, params, name, rounds):
    """One recipe on one workload: AdamW's (updax) and the recipe's (and optax's) compiles and amortized steps,
    side by side in each round."""
    grads = run.grads_like(params, 0)
    sides = {"adamw": RECIPES["adamw"][0], "updax": RECIPES[name][0]}
    if RECIPES[name][1] is not None:
        sides["optax"] = RECIPES[name][1]
    compiles = {side: [] for side in sides}
    compiled, carries, state_bytes = {}, {}, {}
    for r in range(rounds):
        order = list(sides)[r % len(sides):] + list(sides)[:r % len(sides)]
        for side in order:
            extra = OPTAX_EXTRA.get(name, {}) if side == "optax" else {}
            compiled[side], seconds, state_bytes[side] = compile_seconds(sides[side](), params, grads, extra)
            compiles[side].append(seconds)
    for side in sides:
        opt = sides[side]()
        carries[side] = (run.copy(params), opt.init(params))
        _, carries[side] = block(compiled[side], carries[side], grads)  # warm-up: the first refresh included
    steps = {side: [] for side in sides}
    for r in range(rounds):
        order = list(sides)[r % len(sides):] + list(sides)[:r % len(sides)]
        for side in order:
            seconds, carries[side] = block(compiled[side], carries[side], grads)
            steps[side].append(seconds)
    n = sum(p.size for p in jax.tree.leaves(params))
    row = {"workload": workload, "recipe": name, "rounds": rounds, "period": PERIOD,
           "step_s": {s: statistics.median(v) for s, v in steps.items()},
           "compile_s": {s: statistics.median(v) for s, v in compiles.items()},
           "steps_s": steps, "compiles_s": compiles,
           "state_bytes_per_param": {s: b / n for s, b in state_bytes.items()},
           "step_ratio": statistics.median(u / a for u, a in zip(steps["updax"], steps["adamw"])),
           "compile_ratio": statistics.median(u / a for u, a in zip(compiles["updax"], compiles["adamw"]))}
    if "optax" in sides:
        row["optax_step_ratio"] = statistics.median(u / o for u, o in zip(steps["updax"], steps["optax"]))
        row["optax_compile_ratio"] = statistics.median(u / o for u, o in zip(compiles["updax"], compiles["optax"]))
    print(f"{workload} {name:22s} step {row['step_s']['updax'] * 1e3:9.1f} ms ({row['step_ratio']:7.2f}x AdamW)  "
          f"compile {row['compile_s']['updax']:6.2f} s ({row['compile_ratio']:5.2f}x)  "
          f"state {row['state_bytes_per_param']['updax']:5.2f} B/param"
          + (f"  vs optax: step {row['optax_step_ratio']:.2f}x, compile {row['optax_compile_ratio']:.2f}x"
             if "optax" in sides else ""), flush=True)
    return row


def markdown(result):
    lines = [f"# The frontier against AdamW ({result['machine']})", "",
             f"Amortized step: the mean of {PERIOD} consecutive calls, the median of {result['rounds']} rounds; "
             "ratios are per round, recipe over updax's AdamW measured beside it. Compile: from cold caches.", "",
             "| workload | optimizer | step (ms) | vs AdamW | compile (s) | vs AdamW | state (B/param) | vs optax (step, compile) |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for row in result["rows"]:
        versus = (f"{row['optax_step_ratio']:.2f}x, {row['optax_compile_ratio']:.2f}x" if "optax_step_ratio" in row
                  else "(not in optax)")
        lines.append(f"| {row['workload']} | `{row['recipe']}` | {row['step_s']['updax'] * 1e3:.1f} | "
                     f"{row['step_ratio']:.2f}x | {row['compile_s']['updax']:.2f} | {row['compile_ratio']:.2f}x | "
                     f"{row['state_bytes_per_param']['updax']:.2f} | {versus} |")
    return "\n".join(lines) + "\n"


def workloads(quick):
    if quick:
        return {"T": run.transformer_like(layers=1, d=32), "B": run.big(leaves=1, size=2**14)}
    return {"T": run.transformer_like(), "B": run.big()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny workloads, 2 rounds (a smoke run)")
    parser.add_argument("--workloads", default="T,B")
    parser.add_argument("--recipes", default=",".join(name for name in RECIPES if name != "adamw"))
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = parser.parse_args(argv)
    chosen = workloads(args.quick)
    names = [w for w in args.workloads.split(",") if w]
    recipes = [r for r in args.recipes.split(",") if r]
    unknown = [w for w in names if w not in chosen] + [r for r in recipes if r not in RECIPES]
    if unknown:
        parser.error(f"unknown workload or recipe {unknown}; the recipes are {sorted(RECIPES)}")
    rounds = args.rounds or (2 if args.quick else 3)
    rows = [case(w, chosen[w], r, rounds) for w in names for r in recipes]
    result = {**run.environment(), "quick": args.quick, "rounds": rounds, "period": PERIOD, "rows": rows}
    run.write_results(args.out, "frontier", result, markdown(result))
    return result


if __name__ == "__main__":
    main()
