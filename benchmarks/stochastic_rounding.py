"""What stochastic rounding costs: a donated Adam step on bfloat16 params, rounded to nearest or stochastically.

Run from the repository root (``pip install -e ".[bench]"`` first)::

    python benchmarks/stochastic_rounding.py            # a few minutes on 2 cores
    python benchmarks/stochastic_rounding.py --quick    # small workloads, a smoke run

The workloads of ``run.py`` with their params in bfloat16: T (transformer-like,
384 leaves) and B (4 large leaves). Each side is a jitted step
(``update``, then ``apply_updates``) with the params and the state donated:

- ``nearest``: ``ux.apply_updates(params, updates)``;
- ``stochastic``: ``ux.apply_updates(params, updates, rounding="stochastic",
  key=count)``, the bits hashed in the sum's kernel;
- ``threefry`` (B only): the same rounding (``updax._rounding.rounded``) with
  bits drawn per leaf by ``jax.random.bits`` (Threefry), the obvious way,
  kept as the reference the design is measured against. On T's 384 leaves
  its compile takes minutes, so it is left out there.

Each row gives the compile time (lower and compile, once), the median step
time over ``--rounds`` rounds (the sides in turn, the order alternating),
the compiled program's top-level kernels and full-size copies, and its
temporary bytes. Results go to ``benchmarks/results/stochastic_rounding.json``
and ``.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

import updax as ux
from updax import _rounding, _tree

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402  (the workloads, the kernel count and the results' environment)

OPT = ux.optimizers.adam(1e-3)


def _threefry_apply(params, updates, count):
    """The reference side: each bfloat16 leaf rounded by ``jax.random.bits`` of the count's key folded with
    the leaf's index."""
    key = jax.random.key(count)
    leaves, treedef = jax.tree.flatten(params)
    out = []
    for i, (p, u) in enumerate(zip(leaves, treedef.flatten_up_to(updates))):
        x = p.astype(jnp.float32) + u.astype(jnp.float32)
        bits = jax.random.bits(jax.random.fold_in(key, i), p.shape, jnp.uint16).astype(jnp.uint32)
        out.append(_rounding.rounded(x, bits, p.dtype))
    return treedef.unflatten(out)


def make_step(side):
    def step(params, state, grads):
        updates, state = OPT.update(grads, state, params)
        count = OPT.get_state(state, "scale_by_adam.count")
        if side == "nearest":
            return ux.apply_updates(params, updates), state
        if side == "stochastic":
            return ux.apply_updates(params, updates, rounding="stochastic", key=count), state
        return _threefry_apply(params, updates, count), state

    return jax.jit(step, donate_argnums=(0, 1))


def measure(params, grads, sides, rounds):
    compiled, rows = {}, {}
    for side in sides:
        state = OPT.init(params)
        start = time.perf_counter()
        compiled[side] = make_step(side).lower(params, state, grads).compile()
        seconds = time.perf_counter() - start
        memory = compiled[side].memory_analysis()
        rows[side] = {"compile_s": seconds, **run.kernels(compiled[side]), "temp_bytes": memory.temp_size_in_bytes,
                      "times": []}
    carried = {side: (run.copy(params), OPT.init(params)) for side in sides}
    for r in range(rounds):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            p, s = carried[side]
            start = time.perf_counter()
            p, s = compiled[side](p, s, grads)
            jax.block_until_ready((p, s))
            rows[side]["times"].append(time.perf_counter() - start)
            carried[side] = (p, s)
    for row in rows.values():
        row["step_ms"] = 1e3 * statistics.median(row.pop("times")[1:])
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small workloads, few rounds")
    parser.add_argument("--rounds", type=int, default=None, help="timed steps per side (default 30, quick 5)")
    parser.add_argument("--out", default=str(run.ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    rounds = args.rounds or (5 if args.quick else 30)
    loads = run.workloads(args.quick)
    result = {**run.environment(), "quick": args.quick, "rounds": rounds, "workloads": {}}
    lines = [f"Adam, donated step, params in bfloat16, {rounds} rounds ({result['machine']}, jax {jax.__version__})",
             "", "| workload | leaves | side | compile (s) | step (ms, median) | kernels | copies | temp (MB) |",
             "|---|---|---|---|---|---|---|---|"]
    for name in ("T", "B"):
        params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), loads[name])
        grads = jax.tree.map(lambda g: g.astype(jnp.bfloat16), run.grads_like(loads[name], 0))
        sides = ["nearest", "stochastic"] + (["threefry"] if name == "B" else [])
        rows = measure(params, grads, sides, rounds)
        result["workloads"][name] = {"leaves": len(jax.tree.leaves(params)), "rows": rows}
        for side, row in rows.items():
            lines.append(f"| {name} | {len(jax.tree.leaves(params))} | {side} | {row['compile_s']:.2f} | "
                         f"{row['step_ms']:.2f} | {row['fusions']} | {row['copies']} | "
                         f"{row['temp_bytes'] / 2**20:.1f} |")
        print("\n".join(lines[-len(rows):]), flush=True)
    run.write_results(args.out, "stochastic_rounding", result, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
