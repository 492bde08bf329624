"""How a leafwise rule runs over trees: the catalogue writes a rule for one leaf, this runs it for every leaf.

A rule ``fn(g, m, v) -> (u, m, v)`` receives each tree's leaf cast to the
widest of their dtypes (at least float32, :func:`updax._tree.compute_dtype`)
and its ``i``-th result is stored in the dtype of the ``i``-th tree's leaf:
the update in the update's dtype, each moment in its storage dtype.

Tracing is paid once per kind of leaf, here, so that no rule has to write
its arithmetic for the tracer: the leaves with one signature (shape, dtype,
weak type and sharding of every argument) share one trace of ``fn``, whose
operations are then bound again for all of them, one operation after the
other, as the tracing of each would have added them. A model of a thousand
layers of a few shapes traces its rule a few times, and a root with a
derivative rule of its own (``safe_sqrt``, a ``jax.custom_jvp``, which JAX
traces and lowers as a sub-program per call) is one call per kind of leaf,
not one per leaf. Under ``jax.jit`` the numbers are the ones tracing each
leaf on its own gives (``tests/test_held_numbers.py``, bit for bit; the
derivatives: ``tests/test_tracing.py``). Eagerly, the rule of each kind of leaf
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
    kinds: dict[tuple, list[int]] = {}  # the leaves of each signature, in the trees' order
    args = []
    for i, xs in enumerate(columns):
        c = _tree.compute_dtype(*(x.dtype for x in xs))
        args.append(tuple(_tree.cast(x, c) for x in xs))
        kinds.setdefault(tuple(jax.typeof(a) for a in args[-1]), []).append(i)
    results: list = [None] * len(columns)
    for leaves in kinds.values():
        for i, out in zip(leaves, _run_together(fn, [args[i] for i in leaves])):
            # real updates: an output is complex only through an accumulator stored complex
            real = names[0] == "updates" and not jnp.iscomplexobj(columns[i][0])
            results[i] = tuple(store(call, name, o, x, real) for o, x, name in zip(out, columns[i], names))
    n_out = len(trees) if n_out is None else n_out
    return tuple(treedef.unflatten([out[i] for out in results]) for i in range(n_out))


def _run_together(fn: Callable[..., tuple], args: list[tuple]) -> list[tuple]:
    """``fn(*a)`` for each ``a`` of ``args`` (the leaves of one signature), from one trace of ``fn``: its
    operations bound again inside the current trace (:func:`_replay`), or eagerly one compiled program
    (:func:`_program`)."""
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args[0])
    structure = jax.tree.structure(shapes)
    if any(isinstance(a, jax.core.Tracer) for a in (*args[0], *closed.consts)):
        outs = _replay(closed.jaxpr, closed.consts, args)
    else:
        program = _program(closed)
        outs = [program(*a) for a in args]
    return [tuple(jax.tree.unflatten(structure, out)) for out in outs]


def _replay(jaxpr: Any, consts: Sequence[Any], args: list[tuple]) -> list[list]:
    """``jaxpr``'s operations bound again on each of ``args``, operation by operation: what tracing the rule on
    each would add to the current trace, at the cost of one ``bind`` per operation and leaf (the jaxpr was traced
    here, in this context, a moment ago, so the operations need neither their source locations nor their context
    restored, as ``jax.core.eval_jaxpr`` does for any jaxpr). A function with a rule of its own for derivatives
    (a ``jax.custom_jvp``, a root whose derivative at 0 is taken as 0) is bound once for all the leaves
    (:func:`_together`): one call per leaf would be traced and lowered once per leaf."""
    envs = [dict(zip(jaxpr.constvars, consts)) | dict(zip(jaxpr.invars, a)) for a in args]

    def read(env: dict, v: Any) -> Any:
        return v.val if isinstance(v, Literal) else env[v]

    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "custom_jvp_call" and len(envs) > 1:
            outs = _together(eqn, len(envs))(*(read(env, v) for env in envs for v in eqn.invars))
            k = len(eqn.outvars)
            for j, env in enumerate(envs):
                env.update(zip(eqn.outvars, outs[j * k:(j + 1) * k]))
            continue
        params = eqn.primitive.get_bind_params(eqn.params)
        for env in envs:
            out = eqn.primitive.bind(*(read(env, v) for v in eqn.invars), **params)
            env.update(zip(eqn.outvars, out) if eqn.primitive.multiple_results else ((eqn.outvars[0], out),))
    return [[read(env, v) for v in jaxpr.outvars] for env in envs]


def _together(eqn: Any, n: int) -> Callable[..., tuple]:
    """The ``custom_jvp`` call ``eqn``, once for ``n`` sets of operands (flat, one set after another): its
    function on each set for the values, and its own derivative rule on each set for the tangents."""
    call_jaxpr, params, k = eqn.params["call_jaxpr"], eqn.primitive.get_bind_params(eqn.params), len(eqn.invars)

    @jax.custom_jvp
    def together(*flat: Any) -> tuple:
        return tuple(out for j in range(n)
                     for out in jax.core.eval_jaxpr(call_jaxpr.jaxpr, call_jaxpr.consts, *flat[j * k:(j + 1) * k]))

    @together.defjvp
    def _(primals: tuple, tangents: tuple) -> tuple:
        outs, touts = [], []
        for j in range(n):
            out, tout = jax.jvp(lambda *a: eqn.primitive.bind(*a, **params), primals[j * k:(j + 1) * k],
                                tangents[j * k:(j + 1) * k])
            outs += out
            touts += tout
        return tuple(outs), tuple(touts)

    return together


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


def store(call: str, name: str, out: jax.Array, like: jax.Array, real: bool = False) -> jax.Array:
    """``out`` in the dtype of ``like``, the leaf it replaces; a complex ``out`` for a real ``like`` is refused
    by name (its imaginary part would be dropped), unless the step's input is ``real``: then ``out`` is complex
    only because an accumulator is stored complex (``mu_dtype=jnp.complex64``, as optax allows), its imaginary
    part 0, and its real part is kept."""
    if jnp.iscomplexobj(out) and not jnp.iscomplexobj(like) and real:
        return _tree.cast(out.real, like.dtype)
    if jnp.iscomplexobj(out) and not jnp.iscomplexobj(like):
        raise TypeError(f"{call}: {name} is stored as {like.dtype} but holds complex values; keep the "
                        "accumulators of complex params complex (leave the *_dtype option at None)")
    return _tree.cast(out, like.dtype)
