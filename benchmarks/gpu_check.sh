#!/usr/bin/env bash
# The device check (issue 39), one command, under 8 minutes on one GPU where JAX, optax, flax and equinox are
# installed (nothing is downloaded):
#   bash benchmarks/gpu_check.sh                              # on a GPU: benchmarks/results/*-gpu.*
#   JAX_PLATFORMS=cpu OUT=/tmp/check bash benchmarks/gpu_check.sh --quick   # no GPU: proves that it runs
# 1. every optimizer's jitted step on the device against the CPU's and optax's (benchmarks/gpu_check.py);
# 2. step times in rounds on T, B and the train step, against optax (benchmarks/step_times.py);
# 3. compile times in rounds on T and B, against optax (benchmarks/compile_times.py).
# Each part has its own time limit, so that a slow one cannot take the others' time; the exit status is 1 when a
# part fails or runs out of time (its results are then missing).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${OUT:-benchmarks/results}
QUICK=${1:-}
status=0
timeout 210 "$PYTHON" benchmarks/gpu_check.py --out "$OUT" $QUICK || status=1
timeout 150 "$PYTHON" benchmarks/step_times.py --workloads T,B,train --rounds 3 --out "$OUT" $QUICK || status=1
timeout 90 "$PYTHON" benchmarks/compile_times.py --workloads T,B --rounds 3 --recipes adam,adamw,lion,lamb \
    --out "$OUT" $QUICK || status=1
exit $status
