"""The generic path (the backend's hints off, as on any backend but the CPU): the same numbers as the CPU's.

Traced for the CPU, updax's backend seam (updax._backend) orders XLA's
kernels so that a donated step writes its state in place, runs LAMB leaf
after leaf, and lets ``apply_if_finite``, ``accumulate_gradients`` and
schedule-free averaging compute their steps again or select rather than
store. Every such hint asks ``updax._backend._switch.hinted``. On a GPU it
is false, and so it is with ``ux.backend_hints(False)``: the same jitted
step takes the generic path, which these tests trace and compare with the
CPU's step, over every catalogue entry and optimizer.

Which entries have a CPU path is pinned (``CPU_PATHS``): an entry whose
traced program does not change when the branch is switched has nothing to
compare, and a new CPU path must be added there, so that it is compared too.
(No jitted function inside updax asks ``hinted`` on a path the switched
trace takes, so JAX's caches of inner traces cannot mix the two.)
"""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import updax as ux
from registry import ENTRIES, nested_tree, updates_for

LOSS = 1.0
STEPS = 3


def quartic(params):
    """L-BFGS's objective (its line search needs one): ``Σ w⁴/4 + w²/2`` over the tree."""
    return sum(jnp.sum(0.25 * w**4 + 0.5 * w**2) for w in jax.tree.leaves(params))


def _matrices(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def _by_rank(params):
    return jax.tree.map(lambda p: "m" if p.ndim >= 2 else "v", params)


OPTIMIZERS = {f"optimizers.{name}": (lambda name=name: getattr(ux.optimizers, name)(1e-2))
              for name in ux.optimizers.__all__}
OPTIMIZERS["optimizers.lbfgs"] = lambda: ux.optimizers.lbfgs(1e-2, objective=quartic)
OPTIMIZERS["optimizers.sophia"] = lambda: ux.optimizers.sophia(1e-2, objective=quartic)
#: CPU paths the registry's options do not reach: a moving average at a decay of one half, and stages that declare
#: ``state_last`` inside the wrappers.
EXTRA = {
    "adam(b1=0.5)": lambda: ux.optimizers.adam(1e-2, b1=0.5),
    "masked(lion)": lambda: ux.masked(ux.optimizers.lion(1e-2), _matrices),
    "partition(lion, adopt)": lambda: ux.partition({"m": ux.optimizers.lion(1e-2), "v": ux.optimizers.adopt(1e-2)},
                                                   _by_rank),
    "accumulate_gradients(lion)": lambda: ux.accumulate_gradients(ux.optimizers.lion(1e-2), 2),
    "apply_if_finite(lion)": lambda: ux.apply_if_finite(ux.optimizers.lion(1e-2)),
    "hyperparams_in_state(masked(lion))": lambda: ux.hyperparams_in_state(ux.masked(ux.optimizers.lion(1e-2),
                                                                                    _matrices)),
}
TARGETS = {**ENTRIES, **OPTIMIZERS, **EXTRA}

#: The targets whose jitted step the CPU traces otherwise: the state written in place (stages declaring
#: ``state_last``, alone or inside a wrapper; D-Adaptation's after a reduction), a value computed once or again
#: (COCOB; schedule-free), LAMB leaf by leaf, apply_if_finite's second trace, accumulate_gradients' select, a
#: moving average's weight at a decay of one half.
CPU_PATHS = {
    "accumulate_gradients", "apply_if_finite", "schedule_free", "scale_by_adan", "scale_by_adopt", "scale_by_belief",
    "scale_by_cocob", "scale_by_dadapt_adamw", "scale_by_lion", "scale_by_optimistic_gradient",
    "optimizers.adabelief", "optimizers.adan", "optimizers.adopt", "optimizers.cocob", "optimizers.dadapt_adamw",
    "optimizers.lamb", "optimizers.lion", "optimizers.optimistic_adam", "optimizers.optimistic_gradient_descent",
    "optimizers.schedule_free_adamw", "optimizers.optimistic_adam_v2", "optimizers.schedule_free_sgd", *EXTRA,
    # a declared decay (a schedulable option whose domain lies in [0, 1]) at 0.5, made opaque (updax._backend._half)
    "trace_nesterov", "lookahead", "sam", "reduce_on_plateau", "scale_by_rprop", "optimizers.rprop",
    # MARS reads the previous gradient (state_last), and MARS-Lion has Lion's momentum too
    "scale_by_mars", "optimizers.mars_adamw", "optimizers.mars_lion",
    # its registry entry wraps apply_if_finite, whose check the backend computes apart
    "loss_scale",
}


def _step(opt):
    def step(params, state, grads):
        updates, state = opt.update(grads, state, params, loss=LOSS)
        return ux.apply_updates(params, updates), state

    return step


def _inputs(opt):
    params = nested_tree()
    return params, opt.init(params), [updates_for(opt, nested_tree(seed=t + 1)) for t in range(STEPS)]


def _run(opt, params, state, grads):
    step = jax.jit(_step(opt))
    for g in grads:
        params, state = step(params, state, g)
    return params, state


def _program(opt, params, state, grads, hints=True):
    """The step's jaxpr as text, traced as for the CPU or, with ``hints=False``, on the generic path."""
    with ux.backend_hints(hints):
        return str(jax.make_jaxpr(_step(opt))(params, state, grads[0]))


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_the_cpu_paths_are_the_listed_ones(name):
    """A target's program changes with the backend exactly when it is in CPU_PATHS; the others trace one program
    for every backend, and so give the same numbers on all of them."""
    opt = TARGETS[name]()
    params, state, grads = _inputs(opt)
    cpu, other = _program(opt, params, state, grads), _program(opt, params, state, grads, hints=False)
    assert (cpu != other) == (name in CPU_PATHS), name


@pytest.mark.parametrize("name", sorted(CPU_PATHS))
def test_the_step_traced_for_another_backend_gives_the_cpus_numbers(name):
    """Params and state after 3 jitted steps (update and apply_updates in one jit, as in training), traced as for
    the CPU and as for another backend: equal to float32 rounding, leaf by leaf, dtypes and shapes kept."""
    opt = TARGETS[name]()
    params, state, grads = _inputs(opt)
    cpu = _run(opt, params, state, grads)
    with ux.backend_hints(False):
        other = _run(opt, params, state, grads)
    assert jax.tree.structure(cpu) == jax.tree.structure(other)
    for a, b in zip(jax.tree.leaves(cpu), jax.tree.leaves(other)):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        if np.issubdtype(a.dtype, np.inexact):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


@pytest.mark.parametrize("value, out", [("0", "False"), ("1", "True"), ("false", "must be 0 (the generic path) or 1")])
def test_the_environment_switches_the_hints_for_the_process_and_refuses_anything_else(value, out):
    code = "import updax; from updax._backend import _switch; print(_switch.enabled())"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "UPDAX_BACKEND_HINTS": value, "JAX_PLATFORMS": "cpu"})
    assert out in run.stdout + run.stderr
    assert (run.returncode == 0) == (value in ("0", "1"))
