"""Equinox: an updax optimizer through ``eqx.filter_jit``, its learning rate lowered mid-training with one compilation.

Run it from the repository root (needs equinox; the digits set ships with scikit-learn)::

    python examples/equinox_mlp.py            # 12 epochs
    python examples/equinox_mlp.py --quick    # 3 epochs, a smoke run for CI

(The file is not called ``equinox.py``: run as a script, its own directory
comes first on ``sys.path``, and ``import equinox`` would import the script.)

It trains a 64-128-10 ``eqx.nn.MLP`` on scikit-learn's digits with an
``eqx.filter_jit`` train step that takes the model, the optimizer and its
state. The params are ``eqx.filter(model, eqx.is_array)``, the gradients
come from ``eqx.filter_value_and_grad`` and the updates go back into the
model with ``eqx.apply_updates``. ``filter_jit`` treats every non-array
leaf as static, the Python floats of an optimizer included, so rebuilding
the optimizer with a new learning rate would compile a new step.
``ux.hyperparams_in_state`` keeps every number of the pipeline in the
optimizer state instead, as arrays; halfway through, the script replaces the
learning rate in the state by path, and the step keeps running without a
new trace. It prints the loss per epoch, how many times the step was traced
(once), Adam's step count and the learning rate read back from the state,
and the test accuracy.
"""

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from quickstart import BATCH_SIZE, load_data

import updax as ux

EPOCHS = 12
QUICK_EPOCHS = 3
LEARNING_RATES = (3e-3, 1e-3)  # before and after the halfway point
PATH = "scale_by_learning_rate.learning_rate"  # where the learning rate lives in the state


def loss_fn(model, x, y):
    log_probs = jax.nn.log_softmax(jax.vmap(model)(x))  # an eqx.nn.MLP takes one example: vmap over the batch
    return -jnp.mean(jnp.take_along_axis(log_probs, y[:, None], axis=-1))


TRACES = []  # grows each time train_step is traced (compiled), not each time it runs


@eqx.filter_jit
def train_step(model, opt, opt_state, x, y):
    TRACES.append(1)
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    updates, opt_state = opt.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, loss


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EPOCHS} epochs instead of {EPOCHS}")
    epochs = QUICK_EPOCHS if parser.parse_args(argv).quick else EPOCHS

    start = time.perf_counter()
    x_train, y_train, x_test, y_test = load_data()
    model = eqx.nn.MLP(64, 10, width_size=128, depth=1, activation=jax.nn.relu, key=jax.random.key(0))
    opt = ux.hyperparams_in_state(ux.compose(ux.clip_by_global_norm(max_norm=1.0),
                                             ux.optimizers.adamw(LEARNING_RATES[0], decay=1e-4)))
    print(f"optimizer: {opt}")
    opt_state = opt.init(eqx.filter(model, eqx.is_array))

    rng = np.random.default_rng(0)
    for epoch in range(1, epochs + 1):
        if epoch == epochs // 2 + 1:
            # A new array of the same shape and dtype in the state: the jitted step is not traced again, and the
            # Adam moments carry over.
            opt_state = opt.replace_state(opt_state, PATH, LEARNING_RATES[1])
            print(f"epoch {epoch}: learning rate lowered to {LEARNING_RATES[1]} in the optimizer state")
        order = rng.permutation(len(x_train))
        losses = []
        for i in range(0, len(order) - BATCH_SIZE + 1, BATCH_SIZE):  # drop the ragged last batch
            batch = order[i:i + BATCH_SIZE]
            model, opt_state, loss = train_step(model, opt, opt_state, x_train[batch], y_train[batch])
            losses.append(loss)
        print(f"epoch {epoch:2d}  loss {float(jnp.mean(jnp.stack(losses))):.4f}")

    steps = int(opt.get_state(opt_state, "scale_by_adam.count"))
    learning_rate = float(opt.get_state(opt_state, PATH))
    print(f"Adam steps taken: {steps}; learning rate in the state: {learning_rate:g}; "
          f"train_step compiled {len(TRACES)} time(s)")
    accuracy = float(jnp.mean(jnp.argmax(jax.vmap(model)(x_test), axis=-1) == y_test))
    print(f"test accuracy: {accuracy:.3f}")
    print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
