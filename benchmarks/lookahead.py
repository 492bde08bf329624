"""Lookahead in place: updax's ``lookahead(adam)`` step against optax's, on the transformer-like workload T.

Run from the repository root (``pip install -e ".[bench]"`` first)::

    python benchmarks/lookahead.py            # about 2 minutes on 2 cores
    python benchmarks/lookahead.py --quick    # a small T, a smoke run

optax keeps the slow weights in the params (``optax.LookaheadParams``: its
step updates both), updax in the state, so the two steps take different
arguments and ``run.py``'s harness, which hands every side the same ones,
does not fit: each side here is its own donated jitted step (``update``
then the library's ``apply_updates``), timed call by call in turn, the
order alternating, in ``--rounds`` rounds. A third side is updax's step
with the slow weights computed as they were before they became the new
params themselves (``φ + α·(θ + u - φ)``, which reads the old params and
the old ``φ`` that the params' kernel reads too: XLA copied both). Each
row gives the median step time, the copies of full-size arrays and the
temporary bytes of XLA's compiled program. Results go to
``benchmarks/results/lookahead.json`` and ``lookahead.md``.
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
from updax import _tree
from updax.updates import _wrappers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402  (the workloads, the kernel count and the results' environment)

SYNC_PERIOD, SLOW_STEP_SIZE, LR = 5, 0.5, 1e-3


def _apply_former(updates, state, params, *, inner, sync_period, slow_step_size, reset_state, accumulator_dtype,
                  **extra):
    """updax's lookahead before the slow weights became the new params: ``φ' = φ + α·(θ + u - φ)``."""
    del reset_state, accumulator_dtype
    steps, inner_state = inner.update(updates, state.inner, params, **extra)
    sync = state.steps_since_sync >= sync_period - 1

    def leaf(p, u, s):
        synced = s + slow_step_size * (p + u - s)
        return jnp.where(sync, synced - p, u), jnp.where(sync, synced, s)

    out, slow = _tree.tree_map_unzip("lookahead", leaf, 2, params, steps, state.slow)
    count = jnp.where(sync, 0, state.steps_since_sync + 1).astype(state.steps_since_sync.dtype)
    return out, _wrappers.LookaheadState(inner=inner_state, slow=slow, steps_since_sync=count)


def sides(params):
    """``{side: (jitted donated step, its params, its state)}``: updax's, its former formula's, optax's."""
    updax = ux.optimizers.adam(LR).lookahead(SYNC_PERIOD, SLOW_STEP_SIZE)
    former = ux.stateful(_wrappers._init_lookahead, _apply_former, name="lookahead_former", wraps="inner",
                         options=dict(inner=ux.optimizers.adam(LR), sync_period=SYNC_PERIOD,
                                      slow_step_size=SLOW_STEP_SIZE, reset_state=False, accumulator_dtype=None))
    theirs = optax.lookahead(optax.adam(LR), SYNC_PERIOD, SLOW_STEP_SIZE)

    def ours(opt):
        def step(p, s, g):
            u, s = opt.update(g, s, p)
            return ux.apply_updates(p, u), s
        return jax.jit(step, donate_argnums=(0, 1)), params, opt.init(params)

    def optax_step(p, s, g):
        u, s = theirs.update(g, s, p)
        return optax.apply_updates(p, u), s

    synced = optax.LookaheadParams.init_synced(params)
    return {"updax": ours(updax), "former": ours(former),
            "optax": (jax.jit(optax_step, donate_argnums=(0, 1)), synced, theirs.init(synced))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small T, few calls (a smoke run)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None, help="timed calls a side per round")
    parser.add_argument("--out", default=str(run.ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    rounds, repeats = args.rounds or (2 if args.quick else 5), args.repeats or (3 if args.quick else 20)
    params = run.transformer_like(layers=4, d=128) if args.quick else run.transformer_like()
    grads = run.grads_like(params, 0)
    rows = {}
    for name, (step, p, s) in sides(params).items():
        compiled = step.lower(p, s, grads).compile()
        rows[name] = {"side": name, "copies": run.kernels(compiled)["copies"],
                      "temp_mb": compiled.memory_analysis().temp_size_in_bytes / 2**20, "times": [],
                      "carry": (run.copy(p), run.copy(s)), "compiled": compiled}
    names = list(rows)
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for i in range(repeats + 2):  # two warm-up calls a round
            for name in order:
                row = rows[name]
                start = time.perf_counter()
                row["carry"] = row["compiled"](*row["carry"], grads)
                jax.block_until_ready(row["carry"])
                if i >= 2:
                    row["times"].append(time.perf_counter() - start)
    table = []
    for name in names:
        row = rows[name]
        table.append({"side": name, "step_ms": 1e3 * statistics.median(row["times"]), "copies": row["copies"],
                      "temp_mb": row["temp_mb"]})
    base = table[names.index("optax")]["step_ms"]
    for row in table:
        row["ratio"] = row["step_ms"] / base
        print(f"{row['side']:8s} step {row['step_ms']:7.2f} ms ({row['ratio']:.2f}x optax)  copies {row['copies']}  "
              f"temp {row['temp_mb']:.1f} MB", flush=True)
    result = {**run.environment(), "quick": args.quick, "params": sum(x.size for x in jax.tree.leaves(params)),
              "rounds": rounds, "repeats": repeats, "rows": table}
    text = (f"updax {result['updax']} vs optax {result['optax']}, jax {result['jax']}, {result['machine']}; "
            f"workload T, `lookahead(adam({LR}), {SYNC_PERIOD}, {SLOW_STEP_SIZE})`; median of {rounds} rounds of "
            f"{repeats} calls a side.\n\n| side | step | vs optax | copies | temp MB |\n"
            "| --- | --- | --- | --- | --- |\n"
            + "".join(f"| {r['side']} | {r['step_ms']:.2f} ms | {r['ratio']:.2f}x | {r['copies']} | "
                      f"{r['temp_mb']:.1f} |\n" for r in table))
    run.write_results(args.out, "lookahead", result, text)
    return result


if __name__ == "__main__":
    main()
