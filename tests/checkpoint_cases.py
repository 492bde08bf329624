"""The cases of tests/test_checkpoints.py, and the fresh process that resumes them.

``python checkpoint_cases.py DIR`` restores every case's state saved in DIR
(with orbax, and with flax.serialization), takes the remaining steps, and
writes the final params to DIR/<case>.<format>.npz.
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

import updax as ux
from registry import _odd_epochs_decay, half_squared_norm, nested_tree, updates_for

BEFORE, AFTER = 2, 2  # steps before the checkpoint, and after it

CASES = {name: (lambda name=name: getattr(ux.optimizers, name)(0.05)) for name in ux.optimizers.__all__}
CASES["hyperparams_in_state.adamw"] = lambda: ux.hyperparams_in_state(ux.optimizers.adamw(0.05))
CASES["schedule.adam"] = lambda: ux.optimizers.adam(ux.schedules.cosine_decay(0.05, decay_steps=10))
CASES["lbfgs"] = lambda: ux.optimizers.lbfgs(0.05, objective=half_squared_norm)  # its line search needs one
CASES["sophia"] = lambda: ux.optimizers.sophia(0.05, objective=half_squared_norm)  # its Hessian estimate needs one
CASES["multiplicative_lr.adam"] = lambda: ux.scale_by_adam().scale_by_multiplicative_lr(0.05, _odd_epochs_decay)


def params():
    return nested_tree()


def grads(p, t):
    return jax.tree.map(lambda x: jnp.cos(x * (t + 1)) + 0.01 * t, p)


def run(opt, p, state, steps, start):
    step = _jitted(opt)
    for t in range(start, start + steps):
        p, state = step(grads(p, t), state, p)
    return p, state


@functools.cache
def _jitted(opt):
    """One jitted step per optimizer (equal optimizers are equal keys), so each compiles once per process."""
    return jax.jit(lambda g, s, p: _step(opt, g, s, p))


def _step(opt, g, s, p):
    updates, s = opt.update(updates_for(opt, g), s, p, loss=jnp.asarray(1.0))
    return ux.apply_updates(p, updates), s


def flat(tree):
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def resume(directory):
    import orbax.checkpoint as ocp
    from flax import serialization

    for name, build in CASES.items():
        opt = build()
        p0 = {k: v for k, v in np.load(f"{directory}/{name}.params.npz").items()}
        p = jax.tree.unflatten(jax.tree.structure(params()), [jnp.asarray(p0[k]) for k in flat(params())])
        target = opt.init(p)
        with ocp.StandardCheckpointer() as checkpointer:
            restored = checkpointer.restore(f"{directory}/{name}.orbax",
                                            jax.tree.map(ocp.utils.to_shape_dtype_struct, target))
        with open(f"{directory}/{name}.flax", "rb") as f:
            from_bytes = serialization.from_bytes(target, f.read())
        for fmt, state in (("orbax", restored), ("flax", from_bytes)):
            final, _ = run(opt, p, state, AFTER, BEFORE)
            np.savez(f"{directory}/{name}.{fmt}.npz", **flat(final))


if __name__ == "__main__":
    import xla_cache

    xla_cache.write_atomically()  # (it shares the test run's compile cache: tests/conftest.py)
    resume(sys.argv[1])
