"""Compile time alone, updax against optax, in rounds: how far apart they are, against how far one program is
from itself.

Run from the repository root (``pip install -e ".[bench]"`` first)::

    python benchmarks/compile_times.py                    # T and B, 7 rounds: about 25 minutes on 2 cores
    python benchmarks/compile_times.py --workloads S --recipes lion --rounds 3
    python benchmarks/compile_times.py --quick            # small workloads, 3 rounds: a smoke run
    python benchmarks/compile_times.py --catalogue        # every optimizer on T, 3 rounds: about 50 minutes

``run.py`` compiles each side once (three times below 5 s) and its table
gives one ratio per case; a single compile of a few seconds moves by 10-20%
from one try to the next on this machine, as much as most of the gaps. Here
each round compiles, for each recipe, updax's step, optax's and updax's
again (the order rotating from round to round, caches cleared before each,
as ``run.py`` does). Per case it reports the median compile time of each
side, the median over rounds of updax/optax, and the same for updax against
its own second compile (A/A: the same program, so only noise), and each
side's kernels (XLA's fusions, and the full-size copies). A case is
*above* optax when the lower quartile of its round ratios is above 1 and
above the upper quartile of its A/A ratios, *below* in the mirror case, and
*level* otherwise. Results go to ``benchmarks/results/compile_times.json``
and ``compile_times.md``.

``--catalogue`` takes the recipes from ``catalogue.py`` instead: every
optimizer of ``updax.optimizers`` beside optax's with the same rule, by
default on T, 3 rounds (results: ``compile_times_catalogue.*``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import catalogue  # noqa: E402  (every optimizer beside optax's)
import run  # noqa: E402  (the side-by-side machinery of the main benchmark)

#: The order of the three compiles of a round, by round number modulo 3: 0 is updax, 1 optax, 2 updax again.
ORDERS = [(0, 1, 2), (1, 2, 0), (2, 0, 1)]


def quartiles(values):
    """The lower quartile, the median and the upper quartile (of at least one value)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    low, mid, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, mid, high


def verdict(ratios, aa):
    low, _, high = quartiles(ratios)
    aa_low, _, aa_high = quartiles(aa)
    if low > 1.0 and low > aa_high:
        return "above"
    if high < 1.0 and high < aa_low:
        return "below"
    return "level"


def case(workload, params, recipe, rounds, recipes=run.RECIPES):
    """One workload and recipe (of ``recipes``: name -> (updax's, optax's)): ``rounds`` rounds of three
    compiles."""
    grads = run.grads_like(params, 0)
    seconds, kernels = [[], [], []], [None, None, None]
    for r in range(rounds):
        for i in ORDERS[r % 3]:
            opt = recipes[recipe][1 if i == 1 else 0]()
            compiled, took = run.compile_step(opt, params, grads)[:2]
            seconds[i].append(took)
            kernels[i] = kernels[i] or run.kernels(compiled)  # (after the timing; one program a side)
    ratios = [u / o for u, o in zip(seconds[0], seconds[1])]
    aa = [u / again for u, again in zip(seconds[0], seconds[2])]
    row = {"workload": workload, "recipe": recipe, "rounds": rounds,
           "updax_s": statistics.median(seconds[0]), "optax_s": statistics.median(seconds[1]),
           "ratio_quartiles": quartiles(ratios), "aa_quartiles": quartiles(aa), "verdict": verdict(ratios, aa),
           "updax_compiles_s": seconds[0], "optax_compiles_s": seconds[1], "updax_again_s": seconds[2],
           "updax_kernels": kernels[0], "optax_kernels": kernels[1]}
    q, a = row["ratio_quartiles"], row["aa_quartiles"]
    print(f"{workload:3s} {recipe:18s} updax {row['updax_s']:7.2f} s  optax {row['optax_s']:7.2f} s  "
          f"{kernels_cell(row, 'updax')} / {kernels_cell(row, 'optax')}  "
          f"ratio {q[1]:.2f}x [{q[0]:.2f}, {q[2]:.2f}]  A/A {a[1]:.2f}x [{a[0]:.2f}, {a[2]:.2f}]  {row['verdict']}",
          flush=True)
    return row


def kernels_cell(row, side):
    """A side's kernels as a cell: fusions, and the full-size copies when there are any (rows of results
    recorded before the count have none)."""
    k = row.get(f"{side}_kernels")
    return "-" if k is None else f"{k['fusions']} kernels" + (f", {k['copies']} copies" if k["copies"] else "")


def verdict_table(rows, what, times):
    """The table of judged cases (``compile_times.py``'s and ``step_times.py``'s): both sides' ``what`` (a row's
    two cells by ``times(row)``), the ratio and A/A quartiles and the verdict, then the count of verdicts."""
    lines = [f"| workload | recipe | updax {what} | optax {what} | updax / optax | A/A | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        q, a = r["ratio_quartiles"], r["aa_quartiles"]
        lines.append(f"| {r['workload']} | {r['recipe']} | {' | '.join(times(r))} | "
                     f"{q[1]:.2f}x [{q[0]:.2f}, {q[2]:.2f}] | {a[1]:.2f}x [{a[0]:.2f}, {a[2]:.2f}] | "
                     f"{r['verdict']} |")
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("below", "level", "above")}
    at_most_1 = sum(r["ratio_quartiles"][1] <= 1.0 for r in rows)
    return lines + ["", f"below optax: {counts['below']}, level: {counts['level']}, above: {counts['above']}; "
                        f"median ratio at most 1.00x: {at_most_1} of {len(rows)}."]


def markdown(result):
    lines = [f"updax {result['updax']} vs optax {result['optax']}, jax {result['jax']}, {result['machine']}; "
             f"compile time (trace, lower, XLA compile) of the donated step, {result['rounds']} rounds; "
             "ratios: median [lower quartile, upper quartile] over rounds.", ""]
    lines += verdict_table(result["rows"], "compile", lambda r: (f"{r['updax_s']:.2f} s ({kernels_cell(r, 'updax')})",
                                                                  f"{r['optax_s']:.2f} s ({kernels_cell(r, 'optax')})"))
    return "\n".join(lines) + "\n"


def check_choices(parser, args, workloads, recipes=run.RECIPES):
    """Refuses (exit 2) ``--rounds`` below 1 and workloads or recipes the benchmark does not have."""
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    unknown = sorted(set(args.recipes.split(",")) - set(recipes)) + sorted(
        set(args.workloads.split(",")) - set(workloads))
    if unknown:
        parser.error(f"unknown workloads or recipes: {unknown}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small workloads, 3 rounds (a smoke run)")
    parser.add_argument("--catalogue", action="store_true",
                        help="every optimizer beside optax's (catalogue.py) instead of run.py's recipes; "
                             "--recipes may also name its OPTIONS (adam/b1=0.5)")
    parser.add_argument("--workloads", default=None, help="of T, S, B (S: 20-170 s a compile); default T,B "
                                                          "(with --catalogue: T)")
    parser.add_argument("--recipes", default=None, help="default: all of them")
    parser.add_argument("--rounds", type=int, default=None, help="default 7 (--catalogue 3, --quick 3)")
    parser.add_argument("--out", default=str(run.ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    table = catalogue.ALL if args.catalogue else run.RECIPES  # (by default catalogue.CATALOGUE's, not its OPTIONS)
    args.workloads = args.workloads or ("T" if args.catalogue else "T,B")
    args.recipes = args.recipes or ",".join(catalogue.CATALOGUE if args.catalogue else table)
    check_choices(parser, args, ("T", "S", "B"), table)
    rounds = args.rounds if args.rounds is not None else (3 if args.quick or args.catalogue else 7)
    data = run.workloads(args.quick)
    recipes = args.recipes.split(",")
    run.warm_up(recipes, table)
    rows = [case(name, data[name], recipe, rounds, table)
            for name in ("T", "S", "B") if name in args.workloads.split(",") for recipe in recipes]
    result = {**run.environment(), "quick": args.quick, "catalogue": args.catalogue, "rounds": rounds, "rows": rows}
    run.write_results(args.out, "compile_times_catalogue" if args.catalogue else "compile_times", result,
                      markdown(result))
    return result


if __name__ == "__main__":
    main()
