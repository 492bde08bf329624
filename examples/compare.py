"""Compare recipes: the same MLP on scikit-learn's digits, trained by six optimizers side by side.

Run it from the repository root (needs the examples extra: scikit-learn, tqdm, matplotlib)::

    python examples/compare.py                      # 12 epochs per recipe, writes compare.png
    python examples/compare.py --quick              # 2 epochs per recipe, a smoke run for CI
    python examples/compare.py --out docs/compare.png

Every recipe trains the 64-128-10 MLP of ``quickstart.py`` from the same
initial params on the same batches, in the same jitted step: the step takes
the optimizer object as an argument, so it is traced once per recipe (each
recipe is a pipeline of another shape) and never again. Five recipes are
``ux.optimizers`` presets (adam, adamw, lamb, yogi, lion); the sixth is a
pipeline written by hand from catalogue stages, with a warmup-cosine
schedule. A progress bar runs over all the steps; at the end the script
prints each recipe's pipeline and a Markdown table (mean training loss of
the first and the last epoch, test accuracy, median time of one step after
compilation, time of the first call, which traces and compiles, and the
trace count), and saves a PNG of the training loss and test accuracy curves.

The step times are wall-clock medians on this machine, each step waited for
with ``block_until_ready``: compare them with each other, not with other
machines. ``benchmarks/run.py`` is the place for careful timings.
"""

import argparse
import itertools
import statistics
import time

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
from quickstart import BATCH_SIZE, SIZES, init_mlp, load_data, loss_fn, predict
from tqdm import tqdm

import updax as ux

matplotlib.use("Agg")  # files only, no display needed: chosen before pyplot is imported
import matplotlib.pyplot as plt

EPOCHS = 12
QUICK_EPOCHS = 2


def recipes(total_steps, steps_per_epoch):
    """Each recipe's name and pipeline. Learning rates are each preset's usual scale for a small MLP."""
    warmup_cosine = ux.schedules.warmup_cosine_decay(init_value=0.0, peak_value=3e-3, warmup_steps=steps_per_epoch,
                                                     decay_steps=total_steps)
    return {
        "adam": ux.optimizers.adam(learning_rate=3e-3),
        "adamw": ux.optimizers.adamw(learning_rate=3e-3, decay=1e-2),
        "lamb": ux.optimizers.lamb(learning_rate=1e-2, decay=1e-2),
        "yogi": ux.optimizers.yogi(learning_rate=1e-2),
        "lion": ux.optimizers.lion(learning_rate=1e-3, decay=1e-2),
        # By hand: clip, AdaBelief's moments, decoupled decay, and a warmup-cosine learning rate.
        "custom": (ux.clip_by_global_norm(max_norm=1.0).scale_by_belief().add_decayed_weights(decay=1e-4)
                   .scale_by_learning_rate(warmup_cosine)),
    }


TRACES = []  # grows each time train_step is traced (compiled), not each time it runs


@jax.jit
def train_step(opt, params, opt_state, x, y):
    TRACES.append(1)
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = opt.update(grads, opt_state, params)
    return ux.apply_updates(params, updates), opt_state, loss


def accuracy(params, x, y):
    return float(jnp.mean(jnp.argmax(predict(params, x), axis=-1) == y))


def train(name, opt, data, epochs, bar):
    """Train one recipe; returns its per-step losses, per-epoch test accuracies and step times."""
    x_train, y_train, x_test, y_test = data
    traces_before = len(TRACES)
    params = init_mlp(jax.random.key(0), SIZES)  # the same start for every recipe
    opt_state = opt.init(params)
    rng = np.random.default_rng(0)  # the same batches for every recipe
    losses, accuracies, seconds = [], [], []
    for _ in range(epochs):
        order = rng.permutation(len(x_train))
        for i in range(0, len(order) - BATCH_SIZE + 1, BATCH_SIZE):  # drop the ragged last batch
            batch = order[i:i + BATCH_SIZE]
            start = time.perf_counter()
            params, opt_state, loss = train_step(opt, params, opt_state, x_train[batch], y_train[batch])
            loss = float(jax.block_until_ready(loss))
            seconds.append(time.perf_counter() - start)
            losses.append(loss)
            bar.update()
        accuracies.append(accuracy(params, x_test, y_test))
        bar.set_postfix(recipe=name, loss=f"{np.mean(losses[-len(order) // BATCH_SIZE:]):.3f}")
    return {"losses": losses, "accuracies": accuracies, "first_call": seconds[0],
            "step_ms": 1e3 * statistics.median(seconds[1:]),
            "traces": len(TRACES) - traces_before}


def smooth(values, window):
    """Trailing mean over `window` steps (the first ones over what there is), to see the trend through the noise."""
    sums = np.cumsum(np.insert(np.asarray(values, dtype=np.float64), 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    return (sums[1:] - sums[np.arange(1, len(values) + 1) - counts]) / counts


def plot(results, steps_per_epoch, out):
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    for (name, result), style in zip(results.items(), itertools.cycle(["-", "--", "-.", ":"])):
        # adam and adamw nearly coincide here (the decay is small next to the gradients): the line styles differ.
        left.plot(smooth(result["losses"], steps_per_epoch // 2), style, label=name, linewidth=1.4)
        epochs = np.arange(1, len(result["accuracies"]) + 1)
        right.plot(epochs, result["accuracies"], style, marker="o", markersize=3, label=name, linewidth=1.4)
    left.set(yscale="log", xlabel="step", ylabel="training loss (mean of the last half epoch)",
             title="Training loss")
    right.set(xlabel="epoch", ylabel="test accuracy", title="Test accuracy")
    for axes in (left, right):
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    fig.suptitle("updax recipes on scikit-learn's digits (64-128-10 MLP, same init and batches)")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EPOCHS} epochs instead of {EPOCHS}")
    parser.add_argument("--out", default="compare.png", help="where to save the PNG (default: %(default)s)")
    args = parser.parse_args()
    epochs = QUICK_EPOCHS if args.quick else EPOCHS

    data = load_data()
    steps_per_epoch = len(data[0]) // BATCH_SIZE
    pipelines = recipes(epochs * steps_per_epoch, steps_per_epoch)
    results = {}
    with tqdm(total=len(pipelines) * epochs * steps_per_epoch, unit="step", desc="training") as bar:
        for name, opt in pipelines.items():
            results[name] = train(name, opt, data, epochs, bar)

    for name, opt in pipelines.items():
        print(f"{name}: {opt}")
    print()
    print("| recipe | train loss, first epoch | last epoch | test accuracy | step (ms, median) | first call (s) "
          "| traces |")
    print("|---|---|---|---|---|---|---|")
    for name, result in results.items():
        first_epoch, last_epoch = (np.mean(result["losses"][:steps_per_epoch]),
                                   np.mean(result["losses"][-steps_per_epoch:]))
        print(f"| {name} | {first_epoch:.4f} | {last_epoch:.4f} | {result['accuracies'][-1]:.3f} "
              f"| {result['step_ms']:.2f} "
              f"| {result['first_call']:.2f} | {result['traces']} |")
    plot(results, steps_per_epoch, args.out)
    print(f"\nsaved {args.out}")


if __name__ == "__main__":
    main()
