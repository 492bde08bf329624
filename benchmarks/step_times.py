"""Step time alone, updax against optax, in rounds: how far apart they are, against how far one program is from
itself.

Run from the repository root (``pip install -e ".[bench]"`` first)::

    python benchmarks/step_times.py                       # T, S, B and train, 7 rounds: about 50 minutes on 2 cores
    python benchmarks/step_times.py --workloads S --recipes sgd+momentum,adam --rounds 11
    python benchmarks/step_times.py --quick               # small workloads, 3 rounds: a smoke run
    python benchmarks/step_times.py --catalogue           # every optimizer on T, 7 rounds: over 90 minutes

``run.py`` gives one step-time ratio per case, the median of 15 interleaved
calls, beside one A/A ratio (updax's step against itself); on this machine
the A/A ratios of one run span about 0.90-1.14x, so a single ratio of
1.04x says nothing either way. Here each case compiles both libraries'
steps once, then times them in rounds: each round is ``run.py``'s
interleaved loop (updax, optax and updax again on buffers of their own,
``--repeats`` calls each after two warm-up calls, the order going through
every permutation), on fresh copies of the params and state, and gives one ratio
(the medians' updax/optax) and one A/A ratio (updax/updax again). A case is
*above* optax when the lower quartile of its round ratios is above 1 and
above the upper quartile of its A/A ratios, *below* in the mirror case, and
*level* otherwise (``compile_times.py``'s rule). Results go to
``benchmarks/results/step_times.json`` and ``step_times.md``.

``--catalogue`` takes the recipes from ``catalogue.py`` instead: every
optimizer of ``updax.optimizers`` beside optax's with the same rule, by
default on T (results: ``step_times_catalogue.*``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import catalogue  # noqa: E402  (every optimizer beside optax's)
import run  # noqa: E402  (the side-by-side machinery of the main benchmark)
from compile_times import check_choices, kernels_cell, quartiles, verdict, verdict_table  # noqa: E402  (the same rule)

WORKLOADS = ("T", "S", "B", "train")


def compiled_steps(workload, data, recipe, quick, recipes=run.RECIPES):
    """Both libraries' compiled steps with their initial states, the params and the grads they are timed on
    (``recipes``: name -> (updax's, optax's))."""
    opts = [recipes[recipe][0](), recipes[recipe][1]()]
    if workload == "train":
        params, make = run.train_problem(quick)
        grads = None
    else:
        params, make, grads = data[workload], run.make_step, run.grads_like(data[workload], 0)
    steps = []
    for opt in opts:
        state = opt.init(params)
        steps.append((make(opt).lower(params, state, grads).compile(), state))
    return steps, params, grads


def _sides(row):
    return tuple(f"{row[f'{side}_ms']:.2f} ms ({kernels_cell(row, side)})" for side in ("updax", "optax"))


def case(workload, data, recipe, rounds, repeats, quick, recipes=run.RECIPES):
    """One workload and recipe: ``rounds`` rounds of ``repeats`` interleaved calls of each side."""
    steps, params, grads = compiled_steps(workload, data, recipe, quick, recipes)
    seconds = [[], [], []]
    for _ in range(rounds):
        for side, t in zip(seconds, run.time_side_by_side(steps + steps[:1], params, grads, repeats)):
            side.append(t)
    ratios = [u / o for u, o in zip(seconds[0], seconds[1])]
    aa = [u / again for u, again in zip(seconds[0], seconds[2])]
    row = {"workload": workload, "recipe": recipe, "rounds": rounds, "repeats": repeats,
           "updax_ms": 1e3 * statistics.median(seconds[0]), "optax_ms": 1e3 * statistics.median(seconds[1]),
           "ratio_quartiles": quartiles(ratios), "aa_quartiles": quartiles(aa), "verdict": verdict(ratios, aa),
           "updax_round_ms": [1e3 * s for s in seconds[0]], "optax_round_ms": [1e3 * s for s in seconds[1]],
           "updax_again_round_ms": [1e3 * s for s in seconds[2]],
           "updax_kernels": run.kernels(steps[0][0]), "optax_kernels": run.kernels(steps[1][0])}
    q, a = row["ratio_quartiles"], row["aa_quartiles"]
    print(f"{workload:5s} {recipe:18s} updax {row['updax_ms']:8.2f} ms  optax {row['optax_ms']:8.2f} ms  "
          f"{kernels_cell(row, 'updax')} / {kernels_cell(row, 'optax')}  "
          f"ratio {q[1]:.2f}x [{q[0]:.2f}, {q[2]:.2f}]  A/A {a[1]:.2f}x [{a[0]:.2f}, {a[2]:.2f}]  {row['verdict']}",
          flush=True)
    return row


def markdown(result):
    lines = [f"updax {result['updax']} vs optax {result['optax']}, jax {result['jax']}, {result['machine']}; "
             f"step time of the donated jitted step, {result['rounds']} rounds of {result['repeats']} interleaved "
             "calls a side; times: median over rounds of each round's median; ratios: median [lower quartile, "
             "upper quartile] over rounds.", ""]
    lines += verdict_table(result["rows"], "step", _sides)
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small workloads, 3 rounds of 3 calls (a smoke run)")
    parser.add_argument("--catalogue", action="store_true",
                        help="every optimizer beside optax's (catalogue.py) instead of run.py's recipes; "
                             "--recipes may also name its OPTIONS (adam/b1=0.5)")
    parser.add_argument("--workloads", default=None, help="of T, S, B, train (S: 20-170 s a compile); default all "
                                                          "(with --catalogue: T; train takes run.py's recipes only)")
    parser.add_argument("--recipes", default=None, help="default: all of them")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None, help="timed calls a side per round")
    parser.add_argument("--out", default=str(run.ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    table = catalogue.ALL if args.catalogue else run.RECIPES  # (by default catalogue.CATALOGUE's, not its OPTIONS)
    args.workloads = args.workloads or ("T" if args.catalogue else ",".join(WORKLOADS))
    args.recipes = args.recipes or ",".join(catalogue.CATALOGUE if args.catalogue else table)
    check_choices(parser, args, WORKLOADS[:3] if args.catalogue else WORKLOADS, table)
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    rounds = args.rounds if args.rounds is not None else (3 if args.quick else 7)
    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 15)
    data = run.workloads(args.quick)
    recipes = args.recipes.split(",")
    run.warm_up(recipes, table)
    rows = [case(name, data, recipe, rounds, repeats, args.quick, table)
            for name in WORKLOADS if name in args.workloads.split(",") for recipe in recipes]
    result = {**run.environment(), "quick": args.quick, "catalogue": args.catalogue, "rounds": rounds,
              "repeats": repeats, "rows": rows}
    run.write_results(args.out, "step_times_catalogue" if args.catalogue else "step_times", result,
                      markdown(result))
    return result


if __name__ == "__main__":
    main()
