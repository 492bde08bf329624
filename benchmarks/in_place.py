"""The state in place: each optimizer whose state updax orders, with and without the order, and optax's.

Run from the repository root (``pip install -e ".[bench]"`` first)::

    python benchmarks/in_place.py            # the transformer-like workload T, about 5 minutes on 2 cores
    python benchmarks/in_place.py --quick    # a small T, a smoke run
    python benchmarks/in_place.py --wrapped  # such stages inside masked, partition, ... (in_place_wrapped.*)

For each optimizer whose pipeline has a stage that declares ``state_last``
(updax._backend._order), that computes a state field once before the params'
kernel (``_apart.computed_once``: COCOB's reward), or that traces its
step again for the params' kernel (schedule-free), three jitted steps (``update`` then ``apply_updates``,
params and state donated) are compiled and timed side by side, as in
``run.py``: updax's, updax's with the order switched off (what it compiled
before: XLA copies the declared fields first), and optax's. Each row gives
the step times (median of the interleaved calls), the copies of full-size
arrays and the temporary bytes in XLA's compiled program, the compile times
(median of three a side),
and whether the ordered step's params and state after 3 steps equal the
unordered one's bit for bit (a step traced again, ``_apart.stored_step``,
is another formula of the same step: its largest difference is given).
Results go to
``benchmarks/results/in_place.json`` and ``in_place.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import jax
import numpy as np
import optax

import updax as ux
from updax._backend import _apart, _order

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402  (the side-by-side machinery of the main benchmark)

#: optax's optimizer with the same rule, by updax's name.
OPTAX = {"adabelief": optax.adabelief, "adan": optax.adan, "adopt": optax.contrib.adopt,
         "dadapt_adamw": optax.contrib.dadapt_adamw, "lion": optax.lion, "cocob": optax.contrib.cocob, "optimistic_adam": optax.optimistic_adam_v2,
         "optimistic_gradient_descent": optax.optimistic_gradient_descent,
         "schedule_free_adamw": optax.contrib.schedule_free_adamw}


def _matrices(params):
    """True for the leaves of two or more axes (the matrices), False for the layer norms' vectors."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def _groups(params):
    return jax.tree.map(lambda p: "matrices" if p.ndim >= 2 else "vectors", params)


#: Wrappers around a stage that declares ``state_last``, with optax's same pipeline: named with --optimizers (or
#: --wrapped for all of them). Inside a wrapper the inner stage's field is ordered after the param its leaf
#: belongs to (updax._backend._order._ordered_stage); unordered is how updax compiled them before.
WRAPPED = {
    "masked(lion)": (lambda lr: ux.masked(ux.optimizers.lion(lr), _matrices),
                     lambda lr: optax.masked(optax.lion(lr), _matrices)),
    "partition(lion,adam)": (lambda lr: ux.partition({"matrices": ux.optimizers.lion(lr),
                                                      "vectors": ux.optimizers.adam(lr)}, _groups),
                             lambda lr: optax.partition({"matrices": optax.lion(lr), "vectors": optax.adam(lr)},
                                                        _groups)),
    "accumulate_gradients(lion,4)": (lambda lr: ux.accumulate_gradients(ux.optimizers.lion(lr), 4),
                                     lambda lr: optax.MultiSteps(optax.lion(lr), 4)),
    "apply_if_finite(lion)": (lambda lr: ux.apply_if_finite(ux.optimizers.lion(lr)),
                              lambda lr: optax.apply_if_finite(optax.lion(lr), 5)),
}


#: The optimizers whose stage computes a state field once, before the params' kernel (_apart.computed_once).
COMPUTED_ONCE = ["cocob"]
#: The optimizers whose stage traces a step a second time for the params' kernel (_apart.stored_step).
RECOMPUTED = ["schedule_free_adamw"]


def declaring():
    """The optimizers (names of ``ux.optimizers``) with a stage that declares ``state_last``."""
    names = []
    for name in ux.optimizers.__all__:
        try:
            opt = getattr(ux.optimizers, name)(1e-3)
        except (TypeError, ValueError):  # (one that needs an objective or another first argument)
            continue
        if any(stage.state_last for stage in opt.stages):
            names.append(name)
    return names


def _unordered(stages, old, new, params, updates):
    return new


def _unordered_reading(token, old, new):
    return new


def _not_again(fn):
    return None


def case(name, params, repeats):
    grads = run.grads_like(params, 0)
    ours, theirs = WRAPPED[name] if name in WRAPPED else (getattr(ux.optimizers, name), OPTAX[name])
    ordered, theirs = ours(1e-3), theirs(1e-3)
    sides = {}
    after_params, after_reading, computed_once, stored_step = (_order.after_params, _order.after_reading,
                                                               _apart.computed_once, _apart.stored_step)
    options = (("updax", ordered), ("unordered", ordered), ("optax", theirs))
    # Three compiles a side, in rotating order, the median reported (one compile moves by 10-20% here).
    for turn in range(3):
        for side, opt in options[turn:] + options[:turn]:
            _order.after_params = _unordered if side == "unordered" else after_params
            _order.after_reading = _unordered_reading if side == "unordered" else after_reading
            _apart.computed_once = list if side == "unordered" else computed_once
            _apart.stored_step = _not_again if side == "unordered" else stored_step
            try:
                compiled, seconds, _, temp, _ = run.compile_step(opt, params, grads)
            finally:
                _order.after_params, _order.after_reading = after_params, after_reading
                _apart.computed_once, _apart.stored_step = computed_once, stored_step
            entry = sides.setdefault(side, {"init": opt.init(params), "compiles_s": [], "temp_mb": temp / 2**20,
                                            "copies": run.kernels(compiled)["copies"]})
            entry["compiled"] = compiled
            entry["compiles_s"].append(seconds)
    for entry in sides.values():
        entry["compile_s"] = statistics.median(entry["compiles_s"])
    sides = {side: sides[side] for side, _ in options}
    steps = [(sides[s]["compiled"], sides[s]["init"]) for s in sides]
    same, difference = _bit_for_bit(steps[:2], params)
    times = run.time_side_by_side(steps, params, grads, repeats)
    row = {"optimizer": name, "same_numbers": same, "largest_difference": difference}
    for side, seconds in zip(sides, times):
        row.update({f"{side}_step_ms": 1e3 * seconds, f"{side}_compile_s": sides[side]["compile_s"],
                    f"{side}_temp_mb": sides[side]["temp_mb"], f"{side}_copies": sides[side]["copies"]})
    row["step_ratio"] = row["updax_step_ms"] / row["optax_step_ms"]
    row["unordered_step_ratio"] = row["unordered_step_ms"] / row["optax_step_ms"]
    print(f"{name:28s} step {row['updax_step_ms']:7.2f} ms ({row['step_ratio']:.2f}x optax; unordered "
          f"{row['unordered_step_ratio']:.2f}x)  copies {row['updax_copies']} / {row['unordered_copies']} / "
          f"{row['optax_copies']}  temp {row['updax_temp_mb']:.1f} / {row['unordered_temp_mb']:.1f} / "
          f"{row['optax_temp_mb']:.1f} MB  compile {row['updax_compile_s']:.2f} / {row['unordered_compile_s']:.2f} / "
          f"{row['optax_compile_s']:.2f} s  same numbers: {_same(row)}", flush=True)
    return row


def _bit_for_bit(steps, params):
    """Whether two compiled steps give the same params and state after 3 steps, bit for bit, and their largest
    difference relative to the largest magnitude of its array (a recomputed step is another formula)."""
    results = []
    for step, state in steps:
        p, s = run.copy(params), run.copy(state)
        for t in range(3):
            p, s = step(p, s, run.grads_like(params, 100 + t))
        results.append([np.asarray(x, np.float64) for x in jax.tree.leaves((p, s))])
    same = all(np.array_equal(a, b) for a, b in zip(*results))
    difference = max((float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))
                      for a, b in zip(*results) if a.size), default=0.0)
    return same, difference


def _same(row):
    return "yes" if row["same_numbers"] else f"no, to {row['largest_difference']:.1e} of each array's scale"


def markdown(result):
    lines = [f"updax {result['updax']} vs optax {result['optax']}, jax {result['jax']}, {result['machine']}; "
             f"workload T ({result['params']} params in {result['leaves']} leaves); medians of {result['repeats']} "
             "steps. Three sides: updax, updax with the order switched off, optax.", "",
             "| optimizer | updax step | unordered | optax step | ratio | unordered ratio | copies | temp MB | "
             "compile s | same numbers |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        lines.append(
            f"| {r['optimizer']} | {r['updax_step_ms']:.2f} ms | {r['unordered_step_ms']:.2f} ms | "
            f"{r['optax_step_ms']:.2f} ms | {r['step_ratio']:.2f}x | {r['unordered_step_ratio']:.2f}x | "
            f"{r['updax_copies']} / {r['unordered_copies']} / {r['optax_copies']} | "
            f"{r['updax_temp_mb']:.1f} / {r['unordered_temp_mb']:.1f} / {r['optax_temp_mb']:.1f} | "
            f"{r['updax_compile_s']:.2f} / {r['unordered_compile_s']:.2f} / {r['optax_compile_s']:.2f} | "
            f"{_same(r)} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small T, few repeats (a smoke run)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--optimizers", default=None, help="a comma-separated subset (default: every one), or "
                                                           "of the wrapped cases (WRAPPED: 'masked(lion)', ...)")
    parser.add_argument("--wrapped", action="store_true",
                        help="the wrapped cases instead (results: in_place_wrapped.*)")
    parser.add_argument("--out", default=str(run.ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 15)
    params = run.transformer_like(layers=4, d=128) if args.quick else run.transformer_like()
    names = (list(WRAPPED) if args.wrapped else declaring() + COMPUTED_ONCE + RECOMPUTED) if args.optimizers is None \
        else args.optimizers.split(",")
    rows = [case(name, params, repeats) for name in names]
    result = {**run.environment(), "repeats": repeats, "quick": args.quick,
              "params": int(sum(x.size for x in jax.tree.leaves(params))), "leaves": len(jax.tree.leaves(params)),
              "rows": rows, "step_ratio_median": statistics.median(r["step_ratio"] for r in rows)}
    run.write_results(args.out, "in_place_wrapped" if args.wrapped else "in_place", result, markdown(result))
    return result


if __name__ == "__main__":
    main()
