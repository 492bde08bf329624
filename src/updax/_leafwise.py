"""How a leafwise rule runs over trees: the catalogue writes a rule for one leaf, this runs it for every leaf.

A rule ``fn(g, m, v) -> (u, m, v)`` receives each tree's leaf cast to the
widest of their dtypes (at least float32, :func:`updax._tree.compute_dtype`)
and its ``i``-th result is stored in the dtype of the ``i``-th tree's leaf:
the update in the update's dtype, each moment in its storage dtype.

Tracing is paid once per kind of leaf, here, so that no rule has to write
its arithmetic for the tracer: the leaves with one signature (shape, dtype,
weak type and sharding of every argument) share one trace of ``fn``, which
is then run for each of them, operation by operation, as the tracing of
each would have added them. A model of a thousand layers of a few shapes
traces its rule a few times. Under ``jax.jit`` the program, and so every
number, is the one tracing each leaf on its own gives
(``tests/test_held_numbers.py``). Eagerly, the rule of each kind of leaf
runs as one compiled program, the one a jitted step runs for that leaf,
kept from step to step, rather than one small program per operation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Literal, Var

from updax import _tree

__all__ = ["per_leaf", "store"]


def per_leaf(call: str, fn: Callable[..., tuple], trees: Sequence[Any], names: Sequence[str],
             n_out: int | None = None) -> tuple:
    """Runs ``fn`` leaf by leaf over ``trees``, in the compute dtype; returns one tree per output of ``fn``.

    ``fn`` receives each tree's leaf cast to the widest of their dtypes (at
    least float32) and returns ``n_out`` values (default: one per tree); the
    ``i``-th is stored in the dtype of the ``i``-th tree's leaf, so
    ``fn(g, m, v) -> (u, m, v)`` keeps the update's dtype and each moment's
    storage dtype. The trees must match ``trees[0]``; a mismatch names
    ``call`` and the first differing path.
    """
    treedef, columns = _tree.side_by_side(call, tuple(trees), tuple(names))
    traces: dict = {}
    outs = []
    for xs in columns:
        c = _tree.compute_dtype(*(x.dtype for x in xs))
        results = _traced_once(fn, tuple(_tree.cast(x, c) for x in xs), traces)
        outs.append(tuple(store(call, name, out, x) for out, x, name in zip(results, xs, names)))
    n_out = len(trees) if n_out is None else n_out
    return tuple(treedef.unflatten([out[i] for out in outs]) for i in range(n_out))


def _traced_once(fn: Callable[..., tuple], args: tuple, traces: dict) -> tuple:
    """``fn(*args)``, from the one trace of ``fn`` kept in ``traces`` for the arguments' signature: run inside the
    current trace, or eagerly as one compiled program (:func:`_program`)."""
    signature = tuple(jax.typeof(a) for a in args)
    if signature not in traces:
        closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
        traced = any(isinstance(a, jax.core.Tracer) for a in (*args, *closed.consts))
        run = (lambda *a: jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *a)) if traced else _program(closed)
        traces[signature] = (run, jax.tree.structure(shapes))
    run, structure = traces[signature]
    return tuple(jax.tree.unflatten(structure, run(*args)))


#: Eager steps' compiled rules, by the text of the rule's program (its numbers lifted out) and its constants' types.
_PROGRAMS: dict[tuple, Callable[..., Any]] = {}
_MAX_PROGRAMS = 1024


def _program(closed: Any) -> Callable[..., Any]:
    """The rule of an eager step, compiled once, as ``program(*args)``: the same program a jitted step
    runs for the leaf, with its constants (the step's schedule values, bias corrections) and the numbers written
    into it (a Python float option) passed as arguments, so that the next step, or a new value of an option,
    runs it again rather than compiling one program per operation and leaf shape."""
    jaxpr, numbers = _numbers_lifted(closed.jaxpr)
    key = (str(jaxpr), tuple(jax.typeof(c) for c in closed.consts))
    if key not in _PROGRAMS:
        if len(_PROGRAMS) >= _MAX_PROGRAMS:
            _PROGRAMS.pop(next(iter(_PROGRAMS)))
        _PROGRAMS[key] = jax.jit(lambda consts, numbers, *args: jax.core.eval_jaxpr(jaxpr, consts, *numbers, *args))
    program, consts = _PROGRAMS[key], closed.consts
    return lambda *args: program(consts, numbers, *args)


def _numbers_lifted(jaxpr: Any) -> tuple[Any, list]:
    """``jaxpr`` with each scalar number written into its operations (a literal) made an input of its own, first,
    and those numbers: two rules that differ in their numbers only have the same program."""
    numbers, invars, eqns = [], [], []
    for eqn in jaxpr.eqns:
        operands = []
        for v in eqn.invars:
            if isinstance(v, Literal) and not jnp.shape(v.val):
                operands.append(Var(v.aval))
                invars.append(operands[-1])
                numbers.append(v.val)
            else:
                operands.append(v)
        eqns.append(eqn.replace(invars=operands))
    if not numbers:
        return jaxpr, numbers
    return jaxpr.replace(invars=[*invars, *jaxpr.invars], eqns=eqns), numbers


def store(call: str, name: str, out: jax.Array, like: jax.Array) -> jax.Array:
    """``out`` in the dtype of ``like``, the leaf it replaces; a complex ``out`` for a real ``like`` is refused
    by name (its imaginary part would be dropped)."""
    if jnp.iscomplexobj(out) and not jnp.iscomplexobj(like):
        raise TypeError(f"{call}: {name} is stored as {like.dtype} but holds complex values; keep the "
                        "accumulators of complex params complex (leave the *_dtype option at None)")
    return _tree.cast(out, like.dtype)
