"""Values XLA must compute apart: once in a kernel of their own, or again inside the one kernel that reads them.

XLA:CPU fuses a cheap value into every kernel that reads it, and stores a
value it will not duplicate (a division, a root) for all its readers. Both
can cost a full-size buffer a step: a temporary written and read, or a copy
of the state when two kernels each read what the other overwrites. The
device is the same in each trick: ``x / 1`` is ``x`` bit for bit (IEEE
division is correctly rounded), XLA does not duplicate a division into a
second kernel, and a 1 made behind an optimization barrier is one its
simplifier cannot drop. Every function here returns its input unchanged (or
None, "nothing to gain") when :func:`updax._backend._switch.hinted` is
false.

- :func:`computed_once`: COCOB's new reward, in its own kernel, written in
  place before the params' kernel reads it. Without it XLA copies the
  reward and the params on every step (as optax's step does).
- :func:`traced_apart`: ``apply_if_finite``'s check of the step, traced a
  second time from the old state so that XLA recomputes it inside the
  check's kernels instead of storing the step and every new state value.
- :func:`stored_step`: schedule-free's step for the params' kernel, traced
  again so that it reads the new state from its buffers instead of
  having XLA store the step for two readers.
- :func:`traced_pure`: a step added to the trace once more, only when it
  has no effects (``accumulate_gradients`` computes an elementwise step on
  every call).
- :func:`one_kernel_outputs`: stochastic rounding's per-leaf seeds, the
  outputs of one kernel rather than computed again in each leaf's
  (``tests/test_stochastic_rounding.py`` counts the kernels and checks the
  bits against the generic path).

What each saves: ``python benchmarks/in_place.py`` (results in
``benchmarks/results/in_place*.md``, summed up in docs/performance-xla.md, "The
state in place"). That they change no number and remove the copies:
``tests/test_in_place.py`` (bit for bit against the generic path, and the
copies read from XLA's compiled program).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Literal

from updax._backend import _switch

__all__ = ["computed_once", "one_kernel_outputs", "stored_step", "traced_apart", "traced_pure"]


def computed_once(values: Sequence[jax.Array]) -> list[jax.Array]:
    """``values``, each computed by a kernel of its own that every later kernel reads, rather than recomputed
    inside each of its readers.

    For a new state value the params' kernel also needs and that reads a buffer the params' kernel overwrites:
    COCOB's reward ``R' = max(R - g·(x - x₀), 0)`` reads the old params, and the params' update needs ``R'``.
    XLA fuses so cheap a value into both kernels, so the params' kernel reads the old reward while the reward's
    kernel reads the old params: neither can go first, and XLA copies both. Divided by a barrier'd 1, the value
    is its own kernel, written in place first, and the params' kernel reads it.
    """
    values = list(values)
    if not _switch.hinted(values):
        return values
    ones: dict = {}
    return [_over_one(x, ones) for x in values]


def one_kernel_outputs(values: Sequence[jax.Array], step: Any) -> list[jax.Array]:
    """``values``, unsigned integer scalars of a step that reads ``step``, as the outputs of one kernel that
    XLA neither folds nor duplicates into their readers: each reader reads its value from a buffer.

    For numbers that differ from leaf to leaf, such as stochastic rounding's seeds
    (:func:`updax._rounding.leaf_seeds`). Left to XLA, each leaf's kernel
    computes its seeds again (a chain of integer mixes per leaf) or slices them from a vector in a small kernel
    of its own, and XLA:CPU compiles every kernel apart (docs/memory.md, "What it costs"). Each value is divided by a
    barrier'd 1 (so that no constant is folded through) and paired with a 0, and one variadic reduction by
    ``xor`` gives each back as one of its outputs.
    """
    values = list(values)
    if not values or not _switch.hinted(step):
        return values
    one = jax.lax.optimization_barrier(jnp.ones((), values[0].dtype))
    zero = jnp.zeros((), values[0].dtype)
    pairs = [jnp.stack([jax.lax.div(v, one), zero]) for v in values]
    return list(jax.lax.reduce(pairs, [zero] * len(pairs), lambda xs, ys: [x ^ y for x, y in zip(xs, ys)], (0,)))


def _over_one(x: jax.Array, ones: dict) -> jax.Array:
    """``x / 1``, the 1 of ``x``'s dtype taken from ``ones``, made behind an optimization barrier the first time that
    dtype is asked for."""
    if x.dtype not in ones:
        ones[x.dtype] = jax.lax.optimization_barrier(jnp.ones((), x.dtype))
    return jax.lax.div(x, ones[x.dtype])


def _real_floating(x: Any) -> bool:
    return isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating)


def traced_apart(fn: Callable[..., Any], *trees: Any) -> Any:
    """``fn(*trees)`` traced a second time, each real floating leaf of ``trees`` divided by a barrier'd 1 of its
    dtype, and added to the current trace; or None when not hinted, or when the trace has effects.

    For a reduction over a step's result that the kernels writing the step's state must wait for
    (``apply_if_finite`` keeps the old state when the step is not finite). Over the first trace's result XLA
    stores the step and each new state value, and selects between them and the old state afterwards. Over this
    trace's, an expression of its own, XLA recomputes the step inside the reduction's kernels from the old
    values; with the state ordered after the params, each state kernel then writes its field in place. Worth it
    where the step is cheap to compute again: an elementwise rule, not a matrix product.
    """
    if not _switch.hinted(trees):
        return None
    ones: dict = {}
    marked = jax.tree.map(lambda x: _over_one(x, ones) if _real_floating(x) else x, trees)
    return traced_pure(lambda: fn(*marked))


def traced_pure(fn: Callable[[], Any]) -> Any:
    """``fn()`` added to the current trace, or None when its trace has effects (a ``jax.debug.print`` in a user's
    stage would run on calls whose result is thrown away)."""
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)()
    if closed.effects:
        return None
    outs = jax.core.eval_jaxpr(closed.jaxpr, closed.consts)
    return jax.tree.unflatten(jax.tree.structure(shapes), outs)


def stored_step(fn: Callable[[], tuple[Any, Any]]) -> Any:
    """The step of ``fn() -> (step, new_state)`` traced again, every value it reads that the new state also
    stores read back through ``x / 1``; or None (nothing stored is read, effects, not hinted).

    A wrapper that needs its pipeline's step ``u`` in two kernels (schedule-free: ``z' = z + u``, and the params'
    update) would have XLA store ``u``, a temporary of the params' size, for both readers. The first trace's
    values the new state stores (Adam's new moments) are, in this trace, expressions of their own, which XLA
    does not merge with the first trace's: it computes ``u`` inside the params' kernel, from the new state it
    reads from the buffers the state's kernels wrote in place. Found from the program itself, so that no rule
    marks anything: the step traced once into a jaxpr, and the jaxpr run again with the marks inserted.
    """
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)()
    if closed.effects:
        return None
    jaxpr = closed.jaxpr
    n_step = len(jax.tree.leaves(shapes[0]))
    stored = {v for v in jaxpr.outvars[n_step:] if not isinstance(v, Literal)}
    env: dict = {}
    ones: dict = {}
    reread: list = []  # (the marked values read by a later operation)

    def read(v: Any) -> Any:
        if isinstance(v, Literal):
            return v.val
        if v in stored and not reread:
            reread.append(v)
        return env[v]

    def write(v: Any, x: Any) -> None:
        env[v] = _over_one(x, ones) if v in stored and _real_floating(x) else x

    for v, x in zip(jaxpr.constvars, closed.consts):
        write(v, x)
    for eqn in jaxpr.eqns:
        with eqn.ctx.manager:
            out = eqn.primitive.bind(*map(read, eqn.invars), **eqn.primitive.get_bind_params(eqn.params))
        for v, x in zip(eqn.outvars, out if eqn.primitive.multiple_results else [out]):
            write(v, x)
    if not reread:  # (nothing the state stores is read: the trace is the first one again, which XLA merges)
        return None
    return jax.tree.unflatten(jax.tree.structure(shapes[0]), [env[v] if not isinstance(v, Literal) else v.val
                                                              for v in jaxpr.outvars[:n_step]])
