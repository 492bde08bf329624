"""The seam to the backend: everything that exists only to steer one backend's compiler (XLA:CPU's).

The catalogue (:mod:`updax.updates`, :mod:`updax.optimizers`) writes each
rule as its paper does and declares what the execution needs to know
(``state_last``, ``elementwise``, ``wraps``); it never imports this package
(``tests/test_layers.py`` checks that). Here, and only here, are the tricks
that make XLA:CPU write the state in place instead of copying it on every
step, and skip temporaries the size of the params. Each is a hint: it
changes no number, and it applies only when :func:`_switch.hinted` says so
(traced under ``jax.jit`` for the CPU, and not switched off with
:func:`updax.backend_hints` or ``UPDAX_BACKEND_HINTS=0``). Off, every step
takes the generic path, which ``tests/test_held_numbers.py`` runs for the
whole registry.

One module per trick, each with what XLA does without it, what it saves,
the benchmark that measures it and the test that checks it:

- :mod:`._order`: a field a stage declares ``state_last`` is written after
  the params' update (read from the new param, so XLA orders the kernels);
  ``after_reading``, the same after a reduction.
- :mod:`._apart`: values computed in a kernel of their own, or again inside
  their one reader (a barrier'd ``x / 1``); a step traced a second time.
- :mod:`._half`: a decay of one half that XLA's simplifier would factor.
- :mod:`._lamb`: LAMB's leaves one after another (a fused path).
- :mod:`._paths`: the wrappers' and rules' paths that use the tricks above,
  registered by stage name (:mod:`updax._fused`): ``apply_if_finite``,
  ``accumulate_gradients``, ``schedule_free``, ``scale_by_cocob``,
  ``scale_by_dadapt_adamw``.

This module imports nothing, so that the core can import the one trick it
calls without the rest (:mod:`._paths` and :mod:`._lamb` import the catalogue,
and are imported by :mod:`updax` after it).
"""
