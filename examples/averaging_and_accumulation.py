"""Gradient accumulation, skipping bad steps, and an EMA of the params, all in the optimizer state.

Run it from the repository root::

    python examples/averaging_and_accumulation.py

The quickstart's digits MLP is trained with micro-batches of 16 accumulated
4 at a time (an effective batch of 64). Every 25th micro-batch is corrupted
with a NaN, and the skip function drops it without touching the state. An
EMA of the params, kept inside the accumulated pipeline so it advances once
per real step, is read out with ``averaged_params`` and evaluated next to the
training params. A simple moving average of the loss smooths the log. All of
it lives in one state tuple that checkpoints as a whole.
"""

import jax
import jax.numpy as jnp
import numpy as np
from quickstart import SIZES, init_mlp, load_data, loss_fn, predict

import updax as ux

MICRO_BATCH = 16
ACCUMULATE = 4
EPOCHS = 8


def make_optimizer():
    inner = ux.optimizers.adamw(3e-3, decay=1e-4).ema_params(0.95, decay_min=True)
    return inner.accumulate_gradients(ACCUMULATE, should_skip=ux.skip_not_finite)


@jax.jit
def train_step(opt, params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = opt.update(grads, opt_state, params)
    return ux.apply_updates(params, updates), opt_state, loss


def accuracy(params, x, y):
    return float(jnp.mean(jnp.argmax(predict(params, x), axis=-1) == y))


def main():
    x_train, y_train, x_test, y_test = load_data()
    params = init_mlp(jax.random.key(0), SIZES)
    opt = make_optimizer()
    print(f"optimizer: {opt}")
    opt_state = opt.init(params)
    loss_average = ux.sma(20)
    loss_state = loss_average.init(jnp.zeros(()))

    rng, calls, skipped = np.random.default_rng(0), 0, 0
    for epoch in range(1, EPOCHS + 1):
        order = rng.permutation(len(x_train))
        for i in range(0, len(order) - MICRO_BATCH + 1, MICRO_BATCH):
            x = x_train[order[i:i + MICRO_BATCH]]
            calls += 1
            if calls % 25 == 0:
                x = x.copy()
                x[0, 0] = np.nan  # a corrupted micro-batch: its gradients are NaN
            params, opt_state, loss = train_step(opt, params, opt_state, x, y_train[order[i:i + MICRO_BATCH]])
            skipped += int(opt.get_state(opt_state, "accumulate_gradients.skip")["should_skip"])
            if jnp.isfinite(loss):
                smoothed, loss_state = loss_average.update(loss, loss_state)
        print(f"epoch {epoch}  loss (moving average of 20) {float(smoothed):.4f}")

    steps = int(opt.get_state(opt_state, "accumulate_gradients.gradient_step"))
    averaged = ux.averaged_params(opt, opt_state, params, path="accumulate_gradients/ema_params")
    print(f"{calls} micro-batches, {skipped} skipped as non-finite, {steps} optimizer steps")
    print(f"test accuracy: {accuracy(params, x_test, y_test):.3f}")
    print(f"test accuracy (EMA of the params): {accuracy(averaged, x_test, y_test):.3f}")


if __name__ == "__main__":
    main()
