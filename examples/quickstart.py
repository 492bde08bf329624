"""Quickstart: train a small MLP on scikit-learn's digits with an updax pipeline.

Run it from the repository root (no download: the digits set ships with
scikit-learn)::

    python examples/quickstart.py

It builds an optimizer as one fluent pipeline, trains a 64-128-10 MLP in plain
JAX with a jitted step that takes the optimizer object as an argument, lowers
the learning rate halfway through without recompiling the step, reads Adam's
step count from the state by name, and prints the test accuracy.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

import updax as ux

EPOCHS = 12
BATCH_SIZE = 64
SIZES = [64, 128, 10]


def make_optimizer(learning_rate):
    return ux.clip_by_global_norm(max_norm=1.0).scale_by_adam().add_decayed_weights(1e-4).scale(-learning_rate)


def load_data(seed=0):
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    scaler = StandardScaler().fit(x_train)
    return (scaler.transform(x_train).astype(np.float32), y_train,
            scaler.transform(x_test).astype(np.float32), y_test)


def init_mlp(key, sizes):
    params = []
    for layer_key, n_in, n_out in zip(jax.random.split(key, len(sizes) - 1), sizes[:-1], sizes[1:]):
        w = jax.random.normal(layer_key, (n_in, n_out)) * jnp.sqrt(2.0 / n_in)  # He initialisation
        params.append({"w": w, "b": jnp.zeros(n_out)})
    return params


def predict(params, x):
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]  # logits


def loss_fn(params, x, y):
    logits = predict(params, x)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, 10), axis=-1))


TRACES = []  # grows each time train_step is traced (compiled), not each time it runs


@jax.jit
def train_step(opt, params, opt_state, x, y):
    TRACES.append(1)
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = opt.update(grads, opt_state, params)  # add_decayed_weights needs params
    return ux.apply_updates(params, updates), opt_state, loss


def main():
    start = time.perf_counter()
    x_train, y_train, x_test, y_test = load_data()
    params = init_mlp(jax.random.key(0), SIZES)

    opt = make_optimizer(3e-3)
    print(f"optimizer: {opt}")
    opt_state = opt.init(params)

    rng = np.random.default_rng(0)
    for epoch in range(1, EPOCHS + 1):
        if epoch == EPOCHS // 2 + 1:
            # Same structure, another number: the jitted step is not recompiled
            # and the Adam moments in opt_state carry over.
            opt = make_optimizer(1e-3)
            print(f"epoch {epoch}: learning rate lowered, optimizer is now {opt}")
        order = rng.permutation(len(x_train))
        losses = []
        for i in range(0, len(order) - BATCH_SIZE + 1, BATCH_SIZE):  # drop the ragged last batch
            batch = order[i:i + BATCH_SIZE]
            params, opt_state, loss = train_step(opt, params, opt_state, x_train[batch], y_train[batch])
            losses.append(loss)
        print(f"epoch {epoch:2d}  loss {float(jnp.mean(jnp.stack(losses))):.4f}")

    steps = int(opt.get_state(opt_state, "scale_by_adam.count"))
    print(f"Adam steps taken (scale_by_adam.count): {steps}; train_step compiled {len(TRACES)} time(s)")
    accuracy = float(jnp.mean(jnp.argmax(predict(params, x_test), axis=-1) == y_test))
    print(f"test accuracy: {accuracy:.3f}")
    print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
