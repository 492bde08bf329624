"""Flax NNX: an updax optimizer inside ``nnx.Optimizer``, its learning rate lowered mid-training with one compilation.

Run it from the repository root (needs flax; the digits set ships with scikit-learn)::

    python examples/flax_nnx.py            # 12 epochs
    python examples/flax_nnx.py --quick    # 3 epochs, a smoke run for CI

It trains a 64-128-10 ``nnx.Module`` MLP on scikit-learn's digits with
``nnx.Optimizer(model, ux.hyperparams_in_state(<pipeline>), wrt=nnx.Param)``
and an ``nnx.jit`` train step. ``nnx.Optimizer`` holds the optimizer as a
static value, so rebuilding it with a new learning rate would compile a new
step. ``ux.hyperparams_in_state`` keeps every number of the pipeline in the
optimizer state instead; the state holds NNX variables, so halfway through
the script writes the lower learning rate into the state in place, by path,
and the step keeps running without a new trace. It prints the loss per
epoch, how many times the step was traced (once), Adam's step count and the
learning rate read back from the state, and the test accuracy.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from quickstart import BATCH_SIZE, load_data

import updax as ux

EPOCHS = 12
QUICK_EPOCHS = 3
LEARNING_RATES = (3e-3, 1e-3)  # before and after the halfway point
PATH = "scale_by_learning_rate.learning_rate"  # where the learning rate lives in the state


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(64, 128, rngs=rngs)
        self.out = nnx.Linear(128, 10, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.relu(self.hidden(x)))  # logits


def loss_fn(model, x, y):
    log_probs = jax.nn.log_softmax(model(x))
    return -jnp.mean(jnp.take_along_axis(log_probs, y[:, None], axis=-1))


TRACES = []  # grows each time train_step is traced (compiled), not each time it runs


@nnx.jit
def train_step(model, optimizer, x, y):
    TRACES.append(1)
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)  # updates the model's params and the optimizer state in place
    return loss


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EPOCHS} epochs instead of {EPOCHS}")
    epochs = QUICK_EPOCHS if parser.parse_args(argv).quick else EPOCHS

    start = time.perf_counter()
    x_train, y_train, x_test, y_test = load_data()
    model = MLP(nnx.Rngs(0))
    opt = ux.hyperparams_in_state(ux.compose(ux.clip_by_global_norm(max_norm=1.0),
                                             ux.optimizers.adamw(LEARNING_RATES[0], decay=1e-4)))
    print(f"optimizer: {opt}")
    optimizer = nnx.Optimizer(model, opt, wrt=nnx.Param)

    rng = np.random.default_rng(0)
    for epoch in range(1, epochs + 1):
        if epoch == epochs // 2 + 1:
            # The state holds NNX variables: write the new value in place. Same shape and dtype, so the jitted
            # step is not traced again, and the Adam moments carry over.
            opt.get_state(optimizer.opt_state, PATH)[...] = LEARNING_RATES[1]
            print(f"epoch {epoch}: learning rate lowered to {LEARNING_RATES[1]} in the optimizer state")
        order = rng.permutation(len(x_train))
        losses = []
        for i in range(0, len(order) - BATCH_SIZE + 1, BATCH_SIZE):  # drop the ragged last batch
            batch = order[i:i + BATCH_SIZE]
            losses.append(train_step(model, optimizer, x_train[batch], y_train[batch]))
        print(f"epoch {epoch:2d}  loss {float(jnp.mean(jnp.stack(losses))):.4f}")

    steps = int(opt.get_state(optimizer.opt_state, "scale_by_adam.count")[...])
    learning_rate = float(opt.get_state(optimizer.opt_state, PATH)[...])
    print(f"Adam steps taken: {steps}; learning rate in the state: {learning_rate:g}; "
          f"train_step compiled {len(TRACES)} time(s)")
    accuracy = float(jnp.mean(jnp.argmax(model(x_test), axis=-1) == y_test))
    print(f"test accuracy: {accuracy:.3f}")
    print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
