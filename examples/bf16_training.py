"""bfloat16 params that still learn: the digits MLP trained by Adam with its params in bfloat16, rounded two ways.

Run it from the repository root (needs the examples extra, for scikit-learn
and matplotlib: ``pip install -e '.[examples]'``)::

    python examples/bf16_training.py             # 30 epochs, writes docs/bf16_rounding.png
    python examples/bf16_training.py --quick     # 8 epochs, a smoke run for CI
    python examples/bf16_training.py --out /tmp/b.png

The quickstart's 64-128-10 MLP is trained three times on scikit-learn's
digits, from the same initial params on the same batches, by Adam at its
usual rate of 1e-3:

- ``float32``: the params in float32, as the master weights of a
  mixed-precision recipe are kept;
- ``bfloat16, nearest``: the params in bfloat16, each step's update added
  and rounded to nearest (what a cast does, and every library's default);
- ``bfloat16, stochastic``: the same, rounded stochastically
  (``ux.apply_updates(params, updates, rounding="stochastic", key=count)``),
  the random bits drawn from Adam's step count, read from the optimizer
  state: the jitted step takes no new argument.

The forward pass computes in float32 from the params (cast up), and Adam's
moments are float32 in every run: the runs differ only in how an update is
rounded into the params. A bfloat16 param of magnitude in ``[2**e, 2**(e+1))``
moves in steps of ``2**(e-7)``; Adam's steps are about the learning rate, so
to nearest every weight above 0.25 in magnitude stops moving (its half step,
2**-9, is about 2e-3), and smaller steps late in training are lost for the
rest. Stochastic rounding keeps them in expectation (Zamirai et al. 2020,
arXiv 2010.06192).

The script prints, per run, the training loss (over the whole training set)
after the first and the last epoch, the test accuracy, the share of params
that changed during the last epoch, and the final loss over float32's; and
draws the loss and that share per epoch.
"""

import argparse
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import updax as ux
from quickstart import BATCH_SIZE, SIZES, init_mlp, load_data, loss_fn, predict

EPOCHS, QUICK_EPOCHS = 30, 8
LEARNING_RATE = 1e-3
RUNS = [("float32", jnp.float32, "nearest"), ("bfloat16, nearest", jnp.bfloat16, "nearest"),
        ("bfloat16, stochastic", jnp.bfloat16, "stochastic")]
OPT = ux.optimizers.adam(LEARNING_RATE)


def as_float32(params):
    return jax.tree.map(lambda p: p.astype(jnp.float32), params)


def train_step(params, opt_state, x, y, rounding):
    grads = jax.grad(lambda p: loss_fn(as_float32(p), x, y))(params)  # each grad in its param's dtype
    updates, opt_state = OPT.update(grads, opt_state, params)
    if rounding == "stochastic":
        count = OPT.get_state(opt_state, "scale_by_adam.count")  # new on every step: new random bits
        return ux.apply_updates(params, updates, rounding="stochastic", key=count), opt_state
    return ux.apply_updates(params, updates), opt_state


train_step = jax.jit(train_step, static_argnums=4)
full_loss = jax.jit(lambda params, x, y: loss_fn(as_float32(params), x, y))


def moved_share(before, after):
    """The share of params whose value changed."""
    changed = [jnp.sum(a != b) for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before))]
    return float(sum(changed)) / sum(p.size for p in jax.tree.leaves(after))


def train(dtype, rounding, epochs, data):
    x_train, y_train, x_test, y_test = data
    params = jax.tree.map(lambda p: p.astype(dtype), init_mlp(jax.random.key(0), SIZES))
    opt_state = OPT.init(params)
    rng = np.random.default_rng(0)  # the same batches for every run
    losses, moved = [], []
    for _ in range(epochs):
        start = params
        order = rng.permutation(len(x_train))
        for i in range(0, len(order) - BATCH_SIZE + 1, BATCH_SIZE):
            batch = order[i:i + BATCH_SIZE]
            params, opt_state = train_step(params, opt_state, x_train[batch], y_train[batch], rounding)
        losses.append(float(full_loss(params, x_train, y_train)))
        moved.append(moved_share(start, params))
    accuracy = float(jnp.mean(jnp.argmax(predict(as_float32(params), x_test), axis=-1) == y_test))
    return {"losses": losses, "moved": moved, "accuracy": accuracy}


def draw(results, out):
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    loss_ax, moved_ax = fig.subplots(1, 2)
    styles = {"float32": ("black", "-"), "bfloat16, nearest": ("tab:red", "-"),
              "bfloat16, stochastic": ("tab:blue", "--")}
    for name, result in results.items():
        epochs = np.arange(1, len(result["losses"]) + 1)
        color, line = styles[name]
        loss_ax.plot(epochs, result["losses"], color=color, linestyle=line, label=name)
        moved_ax.plot(epochs, 100 * np.asarray(result["moved"]), color=color, linestyle=line, label=name)
    loss_ax.set(yscale="log", xlabel="epoch", ylabel="training loss (whole training set)",
                title=f"Adam, learning rate {LEARNING_RATE:g}: loss")
    moved_ax.set(xlabel="epoch", ylabel="params changed during the epoch (%)", ylim=(0, 101),
                 title="params that moved")
    loss_ax.legend()
    moved_ax.legend(loc="lower left")
    fig.savefig(out, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EPOCHS} epochs instead of {EPOCHS}")
    parser.add_argument("--out", default="docs/bf16_rounding.png", help="where the picture goes")
    args = parser.parse_args(argv)
    epochs = QUICK_EPOCHS if args.quick else EPOCHS
    start = time.perf_counter()
    data = load_data()
    print(f"optimizer: {OPT}; {epochs} epochs of {len(data[0]) // BATCH_SIZE} steps")
    results = {name: train(dtype, rounding, epochs, data) for name, dtype, rounding in RUNS}
    reference = results["float32"]["losses"][-1]
    print("| run | loss, first epoch | last epoch | test accuracy | params moved in the last epoch | "
          "last loss / float32's |")
    print("|---|---|---|---|---|---|")
    for name, result in results.items():
        print(f"| {name} | {result['losses'][0]:.4f} | {result['losses'][-1]:.4f} | {result['accuracy']:.3f} | "
              f"{100 * result['moved'][-1]:.1f}% | {result['losses'][-1] / reference:.3f} |")
    draw(results, args.out)
    print(f"wrote {args.out}; done in {time.perf_counter() - start:.1f} s")
    return results


if __name__ == "__main__":
    main()
