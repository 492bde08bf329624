"""Writing your own combinator: sign momentum (signum) as a fluent updax method.

Run it from the repository root::

    python examples/custom_combinator.py

A combinator is a small factory around two pure kernels: ``init`` builds the
stage's state (a NamedTuple, so its fields can be read by name) and ``apply``
transforms the updates. ``ux.stateful`` turns them into an update object and
``@ux.combinator`` registers the factory, so it works in all four pipe forms
and becomes a method of every update object: ``ux.clip(1.0).scale_by_sign_momentum()``.

Update rule (signSGD with momentum, Bernstein et al., ICML 2018)::

    m ← decay·m + (1-decay)·g        u = sign(m)
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

import updax as ux


class SignMomentumState(NamedTuple):
    momentum: object  # a tree shaped like the params


# Kernels live at module level: update objects compare their kernels by
# identity, so a fresh lambda per call would make equal-looking objects differ.
def _init_sign_momentum(params):
    return SignMomentumState(momentum=jax.tree.map(jnp.zeros_like, params))


def _apply_sign_momentum(updates, state, params, *, decay):
    momentum = jax.tree.map(lambda m, g: decay * m + (1 - decay) * g, state.momentum, updates)
    return jax.tree.map(jnp.sign, momentum), SignMomentumState(momentum=momentum)


@ux.combinator
def scale_by_sign_momentum(decay=0.9):
    """Replaces the updates by the sign of their EMA; ``decay`` in [0, 1), or a schedule ``count -> decay``."""
    # `domains` declares what `decay` may hold, once: updax checks it when the object is built (naming the
    # call), and wherever a value enters later (a held value, a tree map, a schedule's value on a step).
    # `schedulable` declares that `decay` may be a schedule: the stage then evaluates it at its own step
    # count and the kernel sees a number. Any other callable option would reach the kernel as a function.
    return ux.stateful(_init_sign_momentum, _apply_sign_momentum, name="scale_by_sign_momentum",
                       options={"decay": decay}, domains={"decay": ux.domains.UNIT}, schedulable=("decay",))


def loss_fn(params):
    return jnp.sum((params["w"] - jnp.array([1.0, -2.0, 0.5])) ** 2)


@jax.jit
def step(opt, params, state):
    grads = jax.grad(loss_fn)(params)
    updates, state = opt.update(grads, state, params)
    return ux.apply_updates(params, updates), state


def main():
    opt = ux.clip_by_global_norm(max_norm=1.0).scale_by_sign_momentum(decay=0.9).scale(-0.05)
    print(f"pipeline: {opt}")

    # The four pipe forms give equal objects, as for the built-in catalogue.
    parent = ux.clip_by_global_norm(max_norm=1.0)
    forms = [parent.scale_by_sign_momentum(decay=0.9),
             scale_by_sign_momentum(parent, decay=0.9),
             parent.pipe(scale_by_sign_momentum, decay=0.9),
             ux.compose(parent, scale_by_sign_momentum(decay=0.9))]
    print(f"four pipe forms equal: {all(f == forms[0] for f in forms)}")

    # A sign method moves every coordinate by exactly the step size (0.05), so
    # it does not settle on the optimum but oscillates within a few steps of it.
    params = {"w": jnp.zeros(3)}
    state = opt.init(params)
    for t in range(1, 101):
        params, state = step(opt, params, state)
        if t in (1, 2, 3, 25, 50, 100):
            print(f"step {t:2d}  loss {float(loss_fn(params)):.4f}  w {params['w']}")

    momentum = opt.get_state(state, "scale_by_sign_momentum.momentum")
    print(f"momentum read by name: {momentum['w']}")

    # The decay as a schedule: from 0.5 to 0.9 over the first 10 steps.
    ramp = ux.schedules.polynomial_decay(0.5, end_value=0.9, power=1.0, transition_steps=10)
    scheduled = ux.clip_by_global_norm(max_norm=1.0).scale_by_sign_momentum(decay=ramp).scale(-0.05)
    state = scheduled.init(params)
    for _ in range(3):
        params, state = step(scheduled, params, state)
    print(f"scheduled decay on the last step: {float(scheduled.get_state(state, 'scale_by_sign_momentum.decay')):.2f}")

    try:
        scale_by_sign_momentum(decay=1.5)
    except ValueError as error:
        print(f"bad option caught at build time: {error}")


if __name__ == "__main__":
    main()
