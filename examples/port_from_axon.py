"""Porting an Axon / Polaris training recipe to updax, line by line.

Run it from the repository root::

    python examples/port_from_axon.py            # 300 steps
    python examples/port_from_axon.py --quick    # 60 steps, a smoke run for CI

Each piece of Python sits under the Elixir it ports, quoted in comments: a
custom combinator written as a Polaris closure (an L1 penalty, which Polaris
does not ship), the recipe's pipeline of ``Polaris.Updates`` with a
``Polaris.Schedules`` learning rate, and the ``defn`` training step of the
``Polaris.Optimizers`` documentation. The recipe then fits a linear
regression with a sparse true weight vector, full batch, in plain JAX, and
prints the loss as it falls. See docs/porting.md for the whole translation
table and for where updax follows the papers instead of Polaris.
"""

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import updax as ux
import updax.schedules as uxs

STEPS = 300
QUICK_STEPS = 60
FEATURES = 8
TRUE_W = np.array([2.0, -1.0, 0.0, 0.0, 0.5, 0.0, 0.0, 3.0], np.float32)  # half of the weights are zero
TRUE_B = 0.5


# ---------------------------------------------------------------------------------------------------------------
# 1. A custom combinator. In Elixir the kernel is a defnp and the hyperparameter is captured by the closure that
#    `stateless` receives; the leading `combinator \\ identity()` argument is what lets it be piped.
#
#    def add_l1_decay(combinator \\ Polaris.Updates.identity(), decay) do
#      Polaris.Updates.stateless(combinator, &apply_l1_decay(&1, &2, decay))
#    end
#
#    defnp apply_l1_decay(updates, params, decay) do
#      deep_merge(updates, params, fn g, p -> g + decay * Nx.sign(p) end)
#    end
#
# In updax the kernel is a module-level function that takes the hyperparameter by keyword, and the captured value
# becomes an option: the stage prints it, compares by it, and holds it as a pytree leaf, so a new value does not
# recompile a jitted step. `@ux.combinator` does the work of `combinator \\ identity()` once: `add_l1_decay(parent,
# 1e-3)`, `parent.add_l1_decay(1e-3)` and `parent.pipe(add_l1_decay, 1e-3)` all mean `parent |> add_l1_decay(1e-3)`.

def apply_l1_decay(updates, params, *, decay):  # defnp apply_l1_decay(updates, params, decay)
    # deep_merge(updates, params, fn g, p -> g + decay * Nx.sign(p) end)
    return jax.tree.map(lambda g, p: g + decay * jnp.sign(p), updates, params)


@ux.combinator
def add_l1_decay(decay):
    """Adds ``decay`` times the sign of the params to the updates (an L1 penalty); ``decay >= 0`` or a schedule."""
    if not callable(decay):
        if not decay >= 0:  # validate when the object is built, and name the call
            raise ValueError(f"add_l1_decay(decay={decay!r}): decay must be >= 0")
        decay = float(decay)
    # Polaris.Updates.stateless(combinator, &apply_l1_decay(&1, &2, decay))
    return ux.stateless(apply_l1_decay, name="add_l1_decay", options={"decay": decay}, needs_params=True,
                        schedulable=("decay",))


# ---------------------------------------------------------------------------------------------------------------
# 2. The recipe: clipping, Adam, decoupled L2 and the custom L1 decay, and a cosine-decayed learning rate (negative:
#    scale_by_schedule multiplies the updates by it, and apply_updates adds them).
#
#    optimizer =
#      Polaris.Updates.clip_by_global_norm(max_norm: 1.0)
#      |> Polaris.Updates.scale_by_adam(b1: 0.9)
#      |> Polaris.Updates.add_decayed_weights(decay: 1.0e-4)
#      |> MyUpdates.add_l1_decay(1.0e-3)
#      |> Polaris.Updates.scale_by_schedule(Polaris.Schedules.cosine_decay(-5.0e-2, decay_steps: 300))

def make_optimizer():
    return (ux.clip_by_global_norm(max_norm=1.0)
            .scale_by_adam(b1=0.9)
            .add_decayed_weights(decay=1e-4)
            .add_l1_decay(1e-3)
            .scale_by_schedule(uxs.cosine_decay(-5e-2, decay_steps=STEPS)))


# ---------------------------------------------------------------------------------------------------------------
# 3. The training step, from the Polaris.Optimizers documentation. Polaris passes `update_fn` into the defn; the
#    updax object is a pytree (its numbers are leaves), so the whole optimizer goes into the jitted step.
#
#    defn objective(params, inputs, targets) do
#      preds = Nx.dot(inputs, params.w) + params.b
#      Nx.mean(Nx.pow(preds - targets, 2))
#    end

def objective(params, inputs, targets):
    preds = inputs @ params["w"] + params["b"]
    return jnp.mean((preds - targets) ** 2)


#    defn update(params, optimizer_state, inputs, targets, update_fn) do
#      {loss, gradient} = value_and_grad(params, &objective(&1, inputs, targets))
#      {scaled_updates, new_optimizer_state} = update_fn.(gradient, optimizer_state, params)
#      {Polaris.Updates.apply_updates(params, scaled_updates), new_optimizer_state, loss}
#    end

@jax.jit
def update(params, optimizer_state, inputs, targets, optimizer):
    loss, gradient = jax.value_and_grad(objective)(params, inputs, targets)
    scaled_updates, new_optimizer_state = optimizer.update(gradient, optimizer_state, params)
    return ux.apply_updates(params, scaled_updates), new_optimizer_state, loss


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps instead of {STEPS}")
    steps = QUICK_STEPS if parser.parse_args(argv).quick else STEPS

    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(256, FEATURES)).astype(np.float32)
    targets = (inputs @ TRUE_W + TRUE_B + 0.05 * rng.normal(size=256)).astype(np.float32)

    # params = %{w: Nx.broadcast(0.0, {8}), b: Nx.tensor(0.0)}
    params = {"w": jnp.zeros(FEATURES), "b": jnp.zeros(())}
    optimizer = make_optimizer()
    print(f"optimizer: {optimizer}")  # prints as the Elixir pipeline reads
    # {init_fn, update_fn} = optimizer
    # optimizer_state = init_fn.(params)
    optimizer_state = optimizer.init(params)  # `init_fn, update_fn = optimizer` unpacks too; `update` takes the object

    losses = []
    for step in range(steps):
        params, optimizer_state, loss = update(params, optimizer_state, inputs, targets, optimizer)
        losses.append(float(loss))
        if step % (steps // 6) == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {losses[-1]:.4f}")

    # State is read by path, not by position in the state tuple (Polaris's tuple reads backwards), and the
    # schedule is an option of the object, so the next step's learning rate can be read back.
    count = optimizer.get_state(optimizer_state, "scale_by_schedule.count")
    schedule = optimizer.stages[-1].option("schedule_fn")
    print(f"scale_by_schedule.count: {int(count)}; next learning rate: {-float(schedule(count)):.4f}")
    print(f"learned w: {' '.join(f'{v:+.2f}' for v in np.asarray(params['w']))}")
    print(f"true w:    {' '.join(f'{v:+.2f}' for v in TRUE_W)}")
    print(f"loss: {losses[0]:.4f} -> {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
