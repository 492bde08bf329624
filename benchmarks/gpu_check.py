"""The device check: every optimizer's jitted step on the accelerator against the same step traced for the CPU
and against optax's, then the step and compile benchmarks on T, B and the train step.

Run from the repository root on a machine with one GPU where JAX, optax, flax and equinox are installed (nothing
is downloaded)::

    bash benchmarks/gpu_check.sh                     # the whole check, under 8 minutes on one H100 (budgeted)
    JAX_PLATFORMS=cpu bash benchmarks/gpu_check.sh --quick   # where there is no GPU: proves that it runs

This script is the first part: for every pair of ``catalogue.py`` (each optimizer of ``updax.optimizers``
beside optax's with the same rule), three jitted steps on the nested params of ``run.py``'s small transformer,
(a) updax's step compiled for the default device, (b) the same step compiled for the CPU, (c) optax's on the
default device. It reports the largest difference of (a) from (b) and from (c), relative to the largest change
of each leaf (``run.check_equal``'s measure), with matrix products at full float32 precision on both
devices (``jax_default_matmul_precision=highest``: a GPU's default rounds them to TF32). A pair passes when
both are below ``TOLERANCE`` (``ESTIMATED_STEP``'s bound for the optimizers that estimate their step size); the
pairs whose rules differ by design (``catalogue.LAGGED``) are compared with the CPU only. Results:
``benchmarks/results/gpu_check[-<platform>][-quick].json`` and ``.md``; the exit status is 1 when a pair fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import catalogue  # noqa: E402  (every optimizer beside optax's)
import run  # noqa: E402  (the side-by-side machinery of the main benchmark)

#: The largest relative difference a pair may show, on either comparison: the catalogue smoke test's bound
#: (tests/test_pages_and_examples.py), float32 rounding of three steps on devices that fuse and sum otherwise.
TOLERANCE = 1e-3
#: The optimizers whose step size is a ratio of norms of the run so far (distances, gradient sums): the rounding of
#: those sums, which two devices or two libraries take in other orders, reaches the step through the ratio. On
#: the small transformer DoG is 2.2e-3 from optax's on the CPU itself.
ESTIMATED_STEP = {"dog": 1e-2, "dowg": 1e-2, "prodigy": 1e-2, "dadapt_adamw": 1e-2}
STEPS = 3


def _params(quick):
    return run.transformer_like(layers=2, d=64) if quick else run.transformer_like(layers=4, d=128)


def _final_params(opt, params, device):
    """The params after ``STEPS`` jitted steps compiled for ``device``, as numpy."""
    with jax.default_device(device):
        p = run.copy(jax.device_put(params, device))  # (the step donates its params)
        step, state = run.make_step(opt), run.copy(opt.init(p))  # (optax's may share a buffer with the params)
        for t in range(STEPS):
            p, state = step(p, state, jax.device_put(run.grads_like(params, t), device))
        return jax.tree.map(np.asarray, p)


def _largest_difference(got, want, start):
    """The largest ``|got - want|`` over every leaf, relative to the largest change ``want`` made to that leaf."""
    worst = 0.0
    for g, w, s in zip(jax.tree.leaves(got), jax.tree.leaves(want), jax.tree.leaves(start)):
        change = float(np.max(np.abs(w.astype(np.float64) - np.asarray(s, np.float64)))) or 1.0
        worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w))) / change)
    return worst


def check(name, params):
    ours, theirs = (make() for make in catalogue.ALL[name])
    here, cpu = jax.devices()[0], jax.devices("cpu")[0]
    on_device = _final_params(ours, params, here)
    row = {"optimizer": name, "vs_cpu": _largest_difference(on_device, _final_params(ours, params, cpu), params)}
    row["vs_optax"] = (None if name in catalogue.LAGGED else
                       _largest_difference(on_device, _final_params(theirs, params, here), params))
    bound = row["bound"] = ESTIMATED_STEP.get(name, TOLERANCE)
    row["ok"] = row["vs_cpu"] <= bound and (row["vs_optax"] is None or row["vs_optax"] <= bound)
    return row


def markdown(result):
    lines = [f"# The device check: {result['machine']}", "",
             f"updax {result['updax']}, optax {result['optax']}, jax {result['jax']}; {STEPS} jitted steps a "
             f"side, matrix products at full float32 precision; a pair passes below its bound (the largest "
             f"difference relative to the largest change of a leaf). {result['seconds']:.0f} s.", "",
             "| optimizer | vs the CPU's step | vs optax's | bound | passes |", "|---|---|---|---|---|"]
    for row in result["rows"]:
        theirs = "(differs by design)" if row["vs_optax"] is None else f"{row['vs_optax']:.1e}"
        lines.append(f"| {row['optimizer']} | {row['vs_cpu']:.1e} | {theirs} | {row['bound']:g} | "
                     f"{'yes' if row['ok'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller model (a smoke run)")
    parser.add_argument("--optimizers", default=None, help="of catalogue.py's pairs; default all of them")
    parser.add_argument("--out", default=str(run.ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    names = args.optimizers.split(",") if args.optimizers else sorted(catalogue.ALL)
    unknown = sorted(set(names) - set(catalogue.ALL))
    if unknown:
        parser.error(f"unknown optimizers {unknown}; choose from {sorted(catalogue.ALL)}")
    params, start, rows = _params(args.quick), time.perf_counter(), []
    for name in names:
        with jax.default_matmul_precision("highest"):
            rows.append(check(name, params))
        row = rows[-1]
        print(f"{name:28s} vs CPU {row['vs_cpu']:.1e}  vs optax "
              f"{'-' if row['vs_optax'] is None else format(row['vs_optax'], '.1e')}  {'ok' if row['ok'] else 'FAIL'}",
              flush=True)
    result = {**run.environment(), "quick": args.quick, "seconds": time.perf_counter() - start, "rows": rows}
    run.write_results(args.out, "gpu_check", result, markdown(result))
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
