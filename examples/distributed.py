"""Data-parallel training over two processes with JAX's multi-process runtime, on CPU.

Run it from the repository root::

    python examples/distributed.py            # 2 processes x 2 CPU devices each
    python examples/distributed.py --quick    # 5 steps instead of 20

With no process id, the script is a launcher: it picks a free port on
localhost, starts itself as two worker processes that meet there through
``jax.distributed.initialize``, runs a third copy as a single-process,
single-device reference on the same data, and prints each process's loss and
whether the params agree. Each worker is what one host of a real cluster
would run, and can be started by hand in two terminals (each prints its
result as one JSON line)::

    python examples/distributed.py --process-id 0 --num-processes 2 --coordinator localhost:12345
    python examples/distributed.py --process-id 1 --num-processes 2 --coordinator localhost:12345

What it shows: the updax optimizer needs nothing special to run on many
hosts. Every process builds the same global mesh over all devices (a
``"data"`` axis), keeps the params and the optimizer state replicated, and
loads only its own rows of each global batch, which
``jax.make_array_from_process_local_data`` assembles into one global array.
The loss is the mean over the global batch, so the gradients that the
jitted step hands to ``opt.update`` are already averaged over every
device of every process: jit's SPMD partitioning inserts the all-reduce.
The params therefore end up identical on both processes, and equal to
float32 rounding (about 1e-7: the sums run in another order) to one
process training on the whole batch.

CPU collectives between processes go through gloo
(``jax_cpu_collectives_implementation``: JAX 0.10's default, set here so the
requirement shows; set to None, every multi-process computation fails with
"Multiprocess computations aren't implemented on the CPU backend"), and
``jax_num_cpu_devices`` gives each process several CPU devices. Both must be
set before JAX creates its devices. Written against JAX 0.10; only jax,
numpy and updax are used.
"""

import argparse
import json
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import updax as ux

STEPS = 20
QUICK_STEPS = 5
GLOBAL_BATCH = 64  # rows per step, split over all devices of all processes
FEATURES = 8
HIDDEN = 32
SEED = 0
TEACHER = np.random.default_rng(SEED).standard_normal(FEATURES).astype(np.float32) / np.sqrt(FEATURES)


def make_optimizer():
    return ux.clip_by_global_norm(max_norm=1.0).pipe(ux.compose, ux.optimizers.adamw(3e-2, decay=1e-4))


def load_rows(step, rows):
    """Rows ``rows`` of step ``step``'s global batch: each row has its own seed, so a process reads only its own."""
    x = np.stack([np.random.default_rng((SEED, step, r)).standard_normal(FEATURES, dtype=np.float32)
                  for r in rows])
    return x, np.sin(x @ TEACHER)[:, None]  # a smooth target the MLP can fit


def init_train_state(opt, key):
    k1, k2 = jax.random.split(key)
    params = {"w1": jax.random.normal(k1, (FEATURES, HIDDEN)) / np.sqrt(FEATURES), "b1": jnp.zeros(HIDDEN),
              "w2": jax.random.normal(k2, (HIDDEN, 1)) / np.sqrt(HIDDEN), "b2": jnp.zeros(1)}
    return params, opt.init(params)


def loss_fn(params, x, y):
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] + params["b2"] - y) ** 2)  # the mean over the *global* batch


@jax.jit
def train_step(opt, params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)  # grads averaged over all processes
    updates, opt_state = opt.update(grads, opt_state, params)
    return ux.apply_updates(params, updates), opt_state, loss


def local_rows(sharding):
    """The rows of the global batch that live on this process's devices under ``sharding``."""
    slices = [index[0].indices(GLOBAL_BATCH)
              for index in sharding.addressable_devices_indices_map((GLOBAL_BATCH,)).values()]
    return range(min(s[0] for s in slices), max(s[1] for s in slices))


def train(steps, distributed):
    """Trains on ``steps`` global batches; returns this process's view of the result as plain lists."""
    opt = make_optimizer()
    if distributed:
        mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
        replicated, batch_sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
        params, opt_state = jax.jit(init_train_state, out_shardings=replicated)(opt, jax.random.key(SEED))
        rows = local_rows(batch_sharded)
    else:
        params, opt_state = jax.jit(init_train_state)(opt, jax.random.key(SEED))
        rows = range(GLOBAL_BATCH)

    losses = []
    for step in range(steps):
        x, y = load_rows(step, rows)
        if distributed:  # this process's rows become its part of one global (GLOBAL_BATCH, ...) array
            x = jax.make_array_from_process_local_data(batch_sharded, x, (GLOBAL_BATCH, FEATURES))
            y = jax.make_array_from_process_local_data(batch_sharded, y, (GLOBAL_BATCH, 1))
        params, opt_state, loss = train_step(opt, params, opt_state, x, y)
        losses.append(loss)
    return {"process_id": jax.process_index(), "devices": jax.device_count(),
            "local_devices": jax.local_device_count(), "rows": [rows.start, rows.stop],
            # Replicated arrays: each process reads its own copy (a sharded one would need a gather first).
            "losses": [float(loss) for loss in losses],
            "params": {name: np.asarray(p).tolist() for name, p in params.items()}}


def worker(args):
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_num_cpu_devices", args.local_devices)
    distributed = args.process_id is not None
    if distributed:
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes,
                                   process_id=args.process_id)
    result = train(args.steps, distributed)
    if distributed:
        jax.distributed.shutdown()
    print("RESULT " + json.dumps(result), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(num_processes=2, local_devices=2, steps=STEPS, timeout=300):
    """Runs the workers and a single-process reference in subprocesses; returns their results.

    Logs go to a temporary directory, deleted on return. If a process fails or
    the time runs out, the others are stopped and the failure's stderr raised.
    """
    coordinator = f"localhost:{free_port()}"
    common = [sys.executable, str(pathlib.Path(__file__).resolve()), "--steps", str(steps)]
    commands = [[*common, "--process-id", str(i), "--num-processes", str(num_processes),
                 "--coordinator", coordinator, "--local-devices", str(local_devices)]
                for i in range(num_processes)]
    commands.append([*common, "--reference", "--local-devices", "1"])
    with tempfile.TemporaryDirectory() as tmp:
        logs = [pathlib.Path(tmp, str(i)) for i in range(len(commands))]
        procs = []
        for command, log in zip(commands, logs):
            with open(log.with_suffix(".out"), "w") as out, open(log.with_suffix(".err"), "w") as err:
                procs.append(subprocess.Popen(command, stdout=out, stderr=err))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            if None not in codes or any(codes):  # all done, or one failed (the others may wait for it forever)
                break
            time.sleep(0.1)
        killed = [p.poll() is None for p in procs]
        for p, was_killed in zip(procs, killed):
            if was_killed:
                p.kill()
                p.wait()
        outputs = [(log.with_suffix(".out").read_text(), log.with_suffix(".err").read_text()) for log in logs]
    for command, p, was_killed, (_, errors) in zip(commands, procs, killed, outputs):
        if p.returncode and not was_killed:
            raise RuntimeError(f"{' '.join(command[2:])}: exit code {p.returncode}\n{errors[-5000:]}")
    if any(killed):
        raise RuntimeError(f"timed out after {timeout} s\n" + "\n".join(errors[-2000:] for _, errors in outputs))
    results = [json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
               for out, _ in outputs]  # gloo prints its own lines to stdout too
    return {"workers": results[:-1], "reference": results[-1]}


def max_difference(a, b):
    return max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) for k in a)


def report(results):
    """Prints the losses and the two checks; returns True if both hold."""
    workers, reference = results["workers"], results["reference"]
    for w in workers:
        print(f"process {w['process_id']} (rows {w['rows'][0]}-{w['rows'][1] - 1}, {w['local_devices']} of "
              f"{w['devices']} devices): loss {w['losses'][0]:.4f} -> {w['losses'][-1]:.4f} "
              f"after {len(w['losses'])} steps")
    print(f"single process, one device: loss {reference['losses'][0]:.4f} -> {reference['losses'][-1]:.4f}")
    across = max(max_difference(w["params"], workers[0]["params"]) for w in workers)
    against = max(max_difference(w["params"], reference["params"]) for w in workers)
    close = all(np.allclose(w["params"][k], reference["params"][k], rtol=1e-5, atol=1e-6)
                for w in workers for k in w["params"])
    print(f"params identical across processes: {across == 0.0}")
    print(f"params match the single-process run: {close} (largest difference {against:.1e})")
    return across == 0.0 and close


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--process-id", type=int, help="run as this worker (default: launch all of them)")
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--coordinator", default="localhost:12345", help="host:port of process 0")
    parser.add_argument("--local-devices", type=int, default=2, help="CPU devices per process")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps")
    parser.add_argument("--reference", action="store_true", help="run the single-process reference")
    args = parser.parse_args(argv)
    if GLOBAL_BATCH % (args.num_processes * args.local_devices):
        parser.error(f"the global batch of {GLOBAL_BATCH} rows must split evenly over all devices")
    if args.quick:
        args.steps = QUICK_STEPS
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.process_id is not None or args.reference:
        worker(args)
        return None
    start = time.perf_counter()
    print(f"optimizer: {make_optimizer()}")
    results = launch(args.num_processes, args.local_devices, args.steps)
    results["agree"] = report(results)
    print(f"done in {time.perf_counter() - start:.1f} s")
    return results


if __name__ == "__main__":
    results = main()
    sys.exit(0 if results is None or results["agree"] else 1)
