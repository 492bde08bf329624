"""The rules and wrappers whose hints need a hook inside their step, registered by stage name.

Each function here is the catalogue's own step with one hook filled in by a
trick of :mod:`updax._backend._apart` or :mod:`updax._backend._order`; each
trick returns its input unchanged unless
:func:`updax._backend._switch.hinted`. The catalogue's step function takes
the hook with the generic path as its default, so its rule reads as the
paper's, and these change no number (``tests/test_in_place.py`` checks each
bit for bit against the generic path and reads the copies from XLA's
compiled program; ``benchmarks/in_place.py`` measures them, summed up in
docs/performance-xla.md, "The state in place"). :mod:`updax._backend._variants`
runs them in place of the stage's own apply function.

- ``apply_if_finite``: around an elementwise pipeline, the finiteness check
  reads the step traced apart (:func:`~updax._backend._apart.traced_apart`),
  so XLA recomputes it in the check's kernels instead of storing the step
  and every new state value; the wrapper declares its pipeline's state
  ``state_last``, so each state kernel then writes in place.
- ``accumulate_gradients``: around an elementwise pipeline, the step runs
  on every call and is kept on the ``k``-th by a select, where a
  ``lax.cond`` would write its outputs to buffers of their own (a copy of
  the pipeline's state on every call).
- ``schedule_free``: the params' update reads the pipeline's step traced
  again from the state it stores (:func:`~updax._backend._apart.stored_step`),
  which XLA would otherwise store as a temporary of the params' size.
- ``scale_by_cocob``: the new reward computed once, in a kernel of its own
  (:func:`~updax._backend._apart.computed_once`): otherwise XLA copies the
  reward and the params on every step.
- ``scale_by_dadapt_adamw``: ``v`` and ``s`` written after the reductions
  that read their old values (:func:`~updax._backend._order.after_reading`):
  otherwise XLA copies both fields on every step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from updax import _tree
from updax._backend import _apart, _order, _switch, _variants
from updax.updates._accumulation import accumulated_step
from updax.updates._averaging import schedule_free_step
from updax.updates._lr_free import cocob_step, dadapt_adamw_step
from updax.updates._skipping import if_finite


def _apply_if_finite(updates, state, params, *, inner, max_consecutive_errors, **extra):
    def recheck(u, s, p):
        return _apart.traced_apart(lambda u, s, p: inner.update(u, s, p, **extra)[0], u, s, p)

    hinted = _order.elementwise(inner) and _switch.hinted(updates)
    return if_finite(updates, state, params, inner, max_consecutive_errors, extra, recheck if hinted else None)


def _on_every_call(ready, run, wait, operand):
    """The pipeline's step computed on every call and kept on the ready ones, element by element; in the
    conditional where its trace has effects."""
    stepped = _apart.traced_pure(lambda: run(operand))
    if stepped is None:
        return jax.lax.cond(ready, run, wait, operand)
    out = jax.tree.map(lambda u: jnp.where(ready, u, _tree.zeros_like(u)), stepped[0])
    return out, jax.tree.map(lambda new, old: jax.lax.select(ready, new, old), stepped[1], operand[1])


def _accumulate_gradients(updates, state, params, *, inner, steps, mean, should_skip, **extra):
    if not (_order.elementwise(inner) and _switch.hinted(updates)):
        return accumulated_step(updates, state, params, inner, steps, mean, should_skip, extra)
    return accumulated_step(updates, state, params, inner, steps, mean, should_skip, extra, _on_every_call)


def _schedule_free(updates, state, params, *, inner, learning_rate, b1, weight_lr_power, **extra):
    again = _apart.stored_step if _switch.hinted(updates) else None
    return schedule_free_step(updates, state, params, inner, learning_rate, b1, weight_lr_power, extra, again)


def _cocob(updates, state, params, *, alpha):
    return cocob_step(updates, state, params, alpha, _apart.computed_once)


def _dadapt_adamw(updates, state, params, *, learning_rate, b1, b2, eps, decay, mask):
    return dadapt_adamw_step(updates, state, params, learning_rate, b1, b2, eps, decay, mask, _order.after_reading)


_variants.register("apply_if_finite", _apply_if_finite)
_variants.register("accumulate_gradients", _accumulate_gradients)
_variants.register("schedule_free", _schedule_free)
_variants.register("scale_by_cocob", _cocob)
_variants.register("scale_by_dadapt_adamw", _dadapt_adamw)
