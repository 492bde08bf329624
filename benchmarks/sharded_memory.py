"""Optimizer state per device on 8 devices: replicated, ZeRO-1 and FSDP-style layouts, and their step time.

Run from the repository root::

    python benchmarks/sharded_memory.py           # 8 host CPU devices, about a minute
    python benchmarks/sharded_memory.py --quick   # a smaller model

The model is an MLP of ``--layers`` square ``--width`` x ``--width`` layers with
biases (float32), trained by ``clip_by_global_norm(1.0)`` then ``adamw``, on a
data-parallel mesh of 8 devices. Three layouts:

- replicated: params and state on every device (plain data parallelism);
- ZeRO-1: params replicated, the state split over the data axis by
  ``ux.sharding.zero1_shardings`` (each device updates its slice;
  ``apply_updates`` gathers the update into the replicated params);
- FSDP-style: the params themselves split over the data axis; ``opt.init``
  creates the state split the same way.

For each it records the bytes of params and of optimizer state held by
device 0 (from the arrays' addressable shards), XLA's temporary bytes for
the jitted, donated step (``memory_analysis``), the median step time over
``--repeats`` calls (the layouts interleaved call by call), and the largest
difference of the params after the timed steps from the replicated run's.
Host devices share one CPU, so step times show the cost of the collectives'
bookkeeping, not a real interconnect. Results go to
``benchmarks/results/sharded_memory.json`` and ``sharded_memory.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEVICES = 8
RESULTS = Path(__file__).resolve().parent / "results"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 2 x 256 model and 5 repeats")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.width, args.repeats = 2, 256, 5
    flag = f"--xla_force_host_platform_device_count={DEVICES}"
    if flag not in os.environ.get("XLA_FLAGS", ""):  # JAX fixes its devices at start-up: run again with 8
        env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flag}", "JAX_PLATFORMS": "cpu"}
        sys.exit(subprocess.call([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])],
                                 env=env))
    run(args)


def run(args):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import updax as ux

    mesh = jax.make_mesh((DEVICES,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rng = np.random.default_rng(0)
    host = {f"layer{i}": {"w": rng.normal(size=(args.width, args.width)).astype(np.float32) / args.width**0.5,
                          "b": np.zeros(args.width, np.float32)} for i in range(args.layers)}
    x = rng.normal(size=(64, args.width)).astype(np.float32)
    y = rng.normal(size=(64, args.width)).astype(np.float32)
    opt = ux.clip_by_global_norm(1.0).pipe(ux.compose, ux.optimizers.adamw(1e-3, decay=1e-4))

    def loss(params, x, y):
        h = x
        for i in range(args.layers):
            h = jnp.tanh(h @ params[f"layer{i}"]["w"] + params[f"layer{i}"]["b"])
        return jnp.mean((h - y) ** 2)

    def step(params, state, x, y):
        grads = jax.grad(loss)(params, x, y)
        updates, state = opt.update(grads, state, params)
        return ux.apply_updates(params, updates), state

    replicated = NamedSharding(mesh, P())
    batch = NamedSharding(mesh, P("data"))
    xs, ys = jax.device_put(x, batch), jax.device_put(y, batch)
    device = jax.devices()[0]

    def on_device_0(tree):
        return sum(s.data.nbytes for leaf in jax.tree.leaves(tree) for s in leaf.addressable_shards
                   if s.device == device)

    layouts = {}
    for name in ("replicated", "zero1", "fsdp"):
        if name == "fsdp":
            params = jax.device_put(host, ux.sharding.zero1_shardings(host, mesh, "data"))
        else:
            params = jax.device_put(host, replicated)
        state = opt.init(params)  # created with the params' shardings
        if name == "zero1":
            state = jax.device_put(state, ux.sharding.zero1_shardings(state, mesh, "data"))
        shardings = (jax.tree.map(lambda a: a.sharding, params), jax.tree.map(lambda a: a.sharding, state))
        jitted = jax.jit(step, in_shardings=(*shardings, batch, batch), out_shardings=shardings,
                         donate_argnums=(0, 1))
        compiled = jitted.lower(params, state, xs, ys).compile()
        memory = compiled.memory_analysis()
        layouts[name] = {"fn": compiled, "params": params, "state": state,
                         "params_bytes": on_device_0(params), "state_bytes": on_device_0(state),
                         "temp_bytes": int(getattr(memory, "temp_size_in_bytes", -1)), "times": []}

    for _ in range(3):  # warm-up
        for layout in layouts.values():
            layout["params"], layout["state"] = layout["fn"](layout["params"], layout["state"], xs, ys)
    for _ in range(args.repeats):
        for layout in layouts.values():
            start = time.perf_counter()
            layout["params"], layout["state"] = layout["fn"](layout["params"], layout["state"], xs, ys)
            jax.block_until_ready(layout["params"])
            layout["times"].append(time.perf_counter() - start)

    reference = layouts["replicated"]["params"]
    rows = []
    for name, layout in layouts.items():
        diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                   for a, b in zip(jax.tree.leaves(layout["params"]), jax.tree.leaves(reference)))
        rows.append({"layout": name, "params_bytes_device0": layout["params_bytes"],
                     "state_bytes_device0": layout["state_bytes"], "step_temp_bytes": layout["temp_bytes"],
                     "step_ms_median": 1e3 * statistics.median(layout["times"]),
                     "max_param_difference_from_replicated": diff})
    base = rows[0]
    for row in rows:
        row["state_vs_replicated"] = row["state_bytes_device0"] / base["state_bytes_device0"]
        row["step_time_vs_replicated"] = row["step_ms_median"] / base["step_ms_median"]
    total = sum(a.size for a in jax.tree.leaves(host))
    meta = {"devices": DEVICES, "backend": jax.default_backend(), "device_kind": device.device_kind,
            "jax": jax.__version__, "machine": platform.machine(), "cpus": os.cpu_count(),
            "layers": args.layers, "width": args.width, "params": total, "repeats": args.repeats,
            "command": "python benchmarks/sharded_memory.py" + (" --quick" if args.quick else "")}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sharded_memory.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    title = (f"{args.layers} x {args.width}² MLP ({total:,} float32 params), adamw with global-norm clipping, "
             f"{DEVICES} {jax.default_backend()} devices, jax {jax.__version__}; `{meta['command']}`")
    header = ("| layout | params on device 0 | state on device 0 | state vs replicated | step temporaries "
              "| step (median) | vs replicated | params differ by |")
    lines = [title, "", header, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['layout']} | {r['params_bytes_device0'] / 2**20:.2f} MiB | "
                     f"{r['state_bytes_device0'] / 2**20:.2f} MiB | {r['state_vs_replicated']:.3f} | "
                     f"{r['step_temp_bytes'] / 2**20:.2f} MiB | {r['step_ms_median']:.2f} ms | "
                     f"{r['step_time_vs_replicated']:.2f}x | {r['max_param_difference_from_replicated']:.1e} |")
    (RESULTS / "sharded_memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
