"""A tiny character-level language model trained by several optimizers side by side.

Run it from the repository root (the examples extra: matplotlib)::

    python examples/tiny_lm.py                 # 400 steps, a learning-rate grid per optimizer, writes tiny_lm.png/.md
    python examples/tiny_lm.py --quick         # a few steps at one learning rate: a smoke run for CI
    python examples/tiny_lm.py --optimizers adamw,muon --steps 300

The text is one every machine with Python has: the source of the Python standard library's own modules, read as
bytes (a vocabulary of 256). The model is a small pre-norm transformer in plain JAX (2 blocks, width 64, 4 heads,
a context of 64 bytes), the same initial params and batches for every optimizer. Each optimizer trains at each
learning rate of its grid; its best rate (the lowest mean loss over the last tenth of the steps) is the one
reported. The script prints, and writes as Markdown, a table of the final loss, the steps and seconds to reach a
loss target, the median step time after compilation and the optimizer state's bytes per parameter, and draws the
loss against steps and against seconds.

Which optimizers run: every name of ``OPTIMIZERS`` that this updax has (the frontier entries of issue 41 appear as
they land); a name it lacks is skipped with a note. Step times are wall-clock medians on this machine: compare them
with each other, not with other machines.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import statistics
import sysconfig
import time

import jax
import jax.numpy as jnp
import numpy as np

import updax as ux

CONTEXT, WIDTH, HEADS, BLOCKS, BATCH = 64, 64, 4, 2, 32


def corpus(max_bytes: int = 2_000_000) -> np.ndarray:
    """The standard library's source, concatenated in a fixed order, as uint8."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    text, size = [], 0
    for path in sorted(stdlib.glob("*.py")):
        data = path.read_bytes()
        text.append(data)
        size += len(data)
        if size >= max_bytes:
            break
    return np.frombuffer(b"\n".join(text), dtype=np.uint8)


def init_params(key: jax.Array) -> dict:
    keys = iter(jax.random.split(key, 4 + 6 * BLOCKS))

    def dense(shape, scale=None):
        return jax.random.normal(next(keys), shape) * (scale or 1 / math.sqrt(shape[0]))

    blocks = [{"norm1": jnp.ones(WIDTH), "qkv": dense((WIDTH, 3 * WIDTH)), "proj": dense((WIDTH, WIDTH)),
               "norm2": jnp.ones(WIDTH), "up": dense((WIDTH, 4 * WIDTH)), "down": dense((4 * WIDTH, WIDTH))}
              for _ in range(BLOCKS)]
    return {"embed": dense((256, WIDTH), 0.02), "position": dense((CONTEXT, WIDTH), 0.02), "blocks": blocks,
            "norm": jnp.ones(WIDTH), "head": dense((WIDTH, 256))}


def _norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale


def logits(params: dict, tokens: jax.Array) -> jax.Array:
    x = params["embed"][tokens] + params["position"][: tokens.shape[-1]]
    t = tokens.shape[-1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    for block in params["blocks"]:
        q, k, v = jnp.split(_norm(x, block["norm1"]) @ block["qkv"], 3, -1)
        q, k, v = (a.reshape(*a.shape[:-1], HEADS, WIDTH // HEADS) for a in (q, k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(WIDTH // HEADS)
        attention = jax.nn.softmax(jnp.where(causal, scores, -1e9), -1)
        x = x + jnp.einsum("bhqk,bkhd->bqhd", attention, v).reshape(x.shape) @ block["proj"]
        x = x + jax.nn.gelu(_norm(x, block["norm2"]) @ block["up"]) @ block["down"]
    return _norm(x, params["norm"]) @ params["head"]


def loss_fn(params: dict, batch: jax.Array) -> jax.Array:
    out = logits(params, batch[:, :-1])
    return jnp.mean(-jnp.take_along_axis(jax.nn.log_softmax(out), batch[:, 1:, None], -1))


def batches(data: np.ndarray, steps: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(data) - CONTEXT - 1, size=(steps, BATCH))
    return [jnp.asarray(np.stack([data[s:s + CONTEXT + 1] for s in row]), jnp.int32) for row in starts]


def _matrices(params):
    return jax.tree.map(lambda p: p.ndim == 2, params)


#: Each optimizer's name, its learning-rate grid, and how to build it at a learning rate. A name this updax
#: lacks is skipped.
OPTIMIZERS = {
    "adamw": ([1e-3, 3e-3, 1e-2], lambda lr: ux.optimizers.adamw(lr, decay=0.01, mask=_matrices)),
    "cautious adamw": ([1e-3, 3e-3, 1e-2], lambda lr: ux.optimizers.adamw(lr, decay=0.01, mask=_matrices).cautious()),
    # (Muon's rate is for the hidden matrices, which it orthogonalises; the others take Adam at 3e-3)
    "muon": ([1e-2, 3e-2, 1e-1], lambda lr: ux.optimizers.muon(lr, adam_learning_rate=3e-3)),
    "normuon": ([1e-3, 3e-3, 1e-2], lambda lr: ux.optimizers.normuon(lr)),
    "mars_adamw": ([1e-3, 3e-3, 1e-2], lambda lr: ux.optimizers.mars_adamw(lr, decay=0.01, mask=_matrices)),
    "shampoo": ([1e-3, 3e-3, 1e-2], lambda lr: ux.optimizers.shampoo(lr)),
    "soap": ([1e-3, 3e-3, 1e-2], lambda lr: ux.optimizers.soap(lr)),
    # (its whitened step has an RMS about 1, as Adam's: Adam's grid)
    "psgd_kron": ([1e-3, 3e-3, 1e-2], lambda lr: ux.optimizers.psgd_kron(lr)),
}


def available(names):
    missing = {"normuon": "normuon", "mars_adamw": "mars_adamw", "shampoo": "shampoo", "soap": "soap",
               "psgd_kron": "psgd_kron"}
    kept = [n for n in names if n not in missing or hasattr(ux.optimizers, missing[n])]
    for n in names:
        if n not in kept:
            print(f"skipped {n}: this updax has no ux.optimizers.{missing[n]} yet")
    return kept


def train(opt: ux.Update, params: dict, data: list) -> dict:
    @jax.jit
    def step(opt, params, state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, state = opt.update(grads, state, params)
        return ux.apply_updates(params, updates), state, loss

    state = opt.init(params)
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(state) if hasattr(x, "nbytes"))
    losses, seconds, step_times, start = [], [], [], time.perf_counter()
    for batch in data:
        t0 = time.perf_counter()
        params, state, loss = step(opt, params, state, batch)
        loss = float(loss)  # (waits for the step)
        step_times.append(time.perf_counter() - t0)
        losses.append(loss)
        seconds.append(time.perf_counter() - start)
    return {"losses": losses, "seconds": seconds, "step_time": statistics.median(step_times[1:] or step_times),
            "state_bytes": state_bytes}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few steps at one learning rate: a smoke run")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--out", default=".", help="directory for tiny_lm.png and tiny_lm.md")
    args = parser.parse_args(argv)
    steps = args.steps or (4 if args.quick else 400)
    names = available([n.strip() for n in args.optimizers.split(",")])
    data = corpus(200_000 if args.quick else 2_000_000)
    train_batches = batches(data, steps)
    params = init_params(jax.random.key(0))
    n_params = sum(p.size for p in jax.tree.leaves(params))
    results = {}
    for name in names:
        grid, build = OPTIMIZERS[name]
        runs = {lr: train(build(lr), params, train_batches) for lr in (grid[1:2] if args.quick else grid)}
        tail = max(1, steps // 10)
        best = min(runs, key=lambda lr: np.mean(runs[lr]["losses"][-tail:]))
        results[name] = {**runs[best], "learning_rate": best, "final": float(np.mean(runs[best]["losses"][-tail:]))}
        print(f"{name}: lr {best:g}, final loss {results[name]['final']:.3f}")
    target = max(r["final"] for r in results.values())  # the loss every optimizer reached
    rows = ["| optimizer | learning rate | final loss | steps to {:.2f} | seconds to {:.2f} | step (ms) | state bytes "
            "per param |".format(target, target), "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        reached = next(i for i, loss in enumerate(r["losses"]) if loss <= target + 1e-9) if min(r["losses"]) <= target \
            else len(r["losses"]) - 1
        rows.append(f"| {name} | {r['learning_rate']:g} | {r['final']:.3f} | {reached + 1} | {r['seconds'][reached]:.1f} "
                    f"| {1e3 * r['step_time']:.1f} | {r['state_bytes'] / (4 * n_params):.2f} |")
    table = "\n".join(rows)
    print(f"{n_params} params, {steps} steps of {BATCH} x {CONTEXT} bytes\n{table}")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tiny_lm.md").write_text(table + "\n")
    _plot(results, out / "tiny_lm.png")
    return results


def _plot(results: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(8, 3.4), dpi=100, sharey=True)
    for name, r in results.items():
        smooth = np.convolve(r["losses"], np.ones(10) / 10, mode="valid") if len(r["losses"]) >= 10 else r["losses"]
        by_step.plot(np.arange(len(smooth)) + 1, smooth, label=f"{name} ({r['learning_rate']:g})")
        by_time.plot(r["seconds"][len(r["seconds"]) - len(smooth):], smooth)
    by_step.set(xlabel="step", ylabel="training loss (nats per byte)", title="loss against steps")
    by_time.set(xlabel="seconds on this machine", title="loss against time")
    by_step.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
