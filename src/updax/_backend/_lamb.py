"""A fused execution path for LAMB: Adam, then decoupled weight decay, then the trust ratio.

Run one by one, the update ``u`` that Adam produces feeds both the per-leaf
norm of the trust ratio and the rescaling, so XLA stores all of it in
between. This path gives the same numbers without that temporary: traced on
CPU, by running the leaves one after another (see :func:`_in_leaf_order`),
and otherwise by recomputing ``u`` where that pays (see
:func:`_run_adam_then_trust_ratio`). ``tests/test_fused.py`` checks both
against the stage-by-stage computation, bit for bit on the leaf-order path.
What it saves: docs/performance-xla.md, "Fused execution paths" and "One leaf
after another" (``python benchmarks/run.py``'s ``lamb`` rows: step time,
temporaries and compile time against the stage-by-stage path and optax's).
With the hints off (:func:`updax.backend_hints`) no fused path is taken
(:func:`updax._fused.find`): LAMB runs stage by stage.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp

from updax import _tree
from updax._backend import _switch
from updax._fused import register_fused_path
from updax._masks import leaf_mask
from updax.updates._adam import adam_direction
from updax.updates._kernels import bias_corrections, trust_ratio, trust_ratios, trust_scaled

#: A leaf's update is recomputed when at least this many leaves share its shape and dtype ...
RECOMPUTE_MIN_SHARED = 16
#: ... and it has at most this many elements (see _run_adam_then_trust_ratio).
RECOMPUTE_MAX_SIZE = 2**20


def _trust_options(trust):
    """The trust-ratio stage's options, as :func:`trust_ratio` takes them (concrete: a fused path has no schedules)."""
    return {k: trust.option(k) for k in ("min_norm", "trust_coefficient", "eps")}


def ordered_after(x: jax.Array, token: jax.Array) -> jax.Array:
    """``x`` itself, as a value XLA can only compute once ``token`` is computed.

    ``x·(1 + (popcount(bits of token) >> 6))``: a 32-bit word has at most 32
    bits set, so the factor is exactly 1 and ``x`` keeps every value (signed
    zeros, infinities and NaNs too; a subnormal is flushed to zero on CPU, as
    by the arithmetic of any kernel it then feeds), but XLA sees a dependency
    it cannot fold away, where it drops an optimization barrier before it
    schedules. A kernel that reads ``ordered_after(g, token)`` is scheduled
    after whatever ``token`` comes from. A complex ``x`` is returned as it
    is (``x·(1+0j)`` is not ``x`` when a part is infinite), without the
    order.
    """
    if jnp.iscomplexobj(x):
        return x
    bits = jax.lax.bitcast_convert_type(jnp.asarray(token, jnp.float32), jnp.int32)
    zero = jax.lax.shift_right_logical(jax.lax.population_count(bits), jnp.int32(6))
    return (1 + zero).astype(x.dtype) * x


def in_leaf_order(updates: object) -> bool:
    """Whether LAMB's stages run leaf after leaf: when traced (under ``jax.jit``) for the CPU, with 2+ leaves."""
    return len(jax.tree.leaves(updates)) > 1 and _switch.hinted(updates)


def _in_leaf_order(stages, updates, states, params, extra):
    """LAMB's stages run on one leaf after another, each leaf's kernels after the previous leaf's.

    Left to itself, XLA CPU runs Adam's kernels for every leaf, then every
    norm, then every rescaling. Between them it keeps each leaf's update
    (a temporary as large as the params, which the runtime allocates afresh
    and the OS faults in on every step), or, on the recomputing path below,
    streams the moments from memory a second and third time. Here each
    leaf's first kernel reads its gradient through :func:`ordered_after` the
    previous leaf's trust ratio, so XLA runs a leaf's Adam step, its two
    norms and its rescaling back to back while its moments and params are
    still in cache, and one leaf's temporary serves them all. The stages
    themselves run as they are, on one leaf at a time: the same arithmetic,
    so Nesterov's moment, narrow moments and masks need no special case (a
    mask is resolved over the whole params first, then applied per leaf).

    What it saves (step and compile time against the stage-by-stage path
    and optax's): docs/performance-xla.md, "Fused execution paths" and "One
    leaf after another" (``benchmarks/run.py``). Eagerly there is no
    schedule to order, and on other backends it is not measured, so those
    keep the path below.
    """
    adam, *middle, trust = stages
    treedef = jax.tree.structure(params)
    flat = treedef.flatten_up_to

    def mask(stage):
        return stage.option("mask") if "mask" in dict(stage.options) else None

    def plain(stage):  # the stage, and per leaf whether its mask (if it has one) selects the leaf
        selected = leaf_mask(stage.label, mask(stage), params)
        return (stage if mask(stage) is None else stage._with_option("mask", None)), selected

    middle = [(*plain(stage), state) for stage, state in zip(middle, states[1:-1])]
    _, trusted = plain(trust)
    options = _trust_options(trust)
    adam_state = states[0]

    def one_leaf(g, token, state, p, selected, rescaled):
        """One leaf's stages (``selected``: by each middle stage's mask), and its trust ratio if it is
        ``rescaled`` (else None)."""
        if token is not None:
            g = ordered_after(g, token)
        u, state = adam.apply(g, state, p, extra)
        for (stage, _, stage_state), chosen in zip(middle, selected):
            if chosen:
                u, _ = stage.apply(u, stage_state, p, extra)
        if not rescaled:
            return u, state, None
        ratio = trust_ratio(u, p, **options)
        return trust_scaled(u, ratio), state, ratio

    # A signature many leaves share (a model's layers have a few shapes) is traced once, as a jitted function
    # called for each of them; XLA inlines the calls, so the program is the one tracing every leaf gives (the
    # same kernels, bit for bit), and tracing a 48-layer model's LAMB takes 0.4 s instead of 2.5 s. A leaf of
    # its own signature is traced in place (through jit, tracing and lowering it would take 10% longer).
    leaves = list(zip(flat(updates), flat(adam_state.mu), flat(adam_state.nu), flat(params)))
    flags = [(tuple(bool(chosen[i]) for _, chosen, _ in middle), bool(trusted[i])) for i in range(len(leaves))]
    keys = [(_signature(arrays), flag) for arrays, flag in zip(leaves, flags)]
    sharing = collections.Counter(keys)
    shared = jax.jit(one_leaf, static_argnames=("selected", "rescaled"))
    out, mus, nus, token = [], [], [], None
    for (g, m, v, p), key in zip(leaves, keys):
        selected, rescaled = key[1]
        run = shared if sharing[key] > 1 else one_leaf
        u, leaf_state, ratio = run(g, token, adam_state._replace(mu=m, nu=v), p, selected=selected,
                                   rescaled=rescaled)
        token = token if ratio is None else ratio
        out.append(u)
        mus.append(leaf_state.mu)
        nus.append(leaf_state.nu)
    # (every leaf's step count is the same new count)
    new_adam = leaf_state._replace(mu=treedef.unflatten(mus), nu=treedef.unflatten(nus))
    return treedef.unflatten(out), (new_adam, *states[1:])


def _signature(arrays):
    """What a jitted function's trace depends on, for the arrays it is called with (shape, dtype, weak type,
    sharding)."""
    return tuple(jax.typeof(x) for x in arrays)


def _run_adam_then_trust_ratio(stages, updates, states, params, extra):
    """LAMB's stages without a full-size temporary for the update the trust ratio measures.

    Run one by one, the update ``u`` feeds both the per-leaf norm and the
    rescaling, so XLA stores all of it in between. Here the norms are taken
    from ``u`` as usual, and the update that gets rescaled is recomputed from
    the new moments and the params (the same arithmetic) behind an
    optimization barrier, so XLA streams ``mu``, ``nu`` and the params once
    more instead of writing and reading ``u``.

    The recomputation has a cost of its own: XLA's reduction kernel writes its
    broadcast scalars out, once per distinct leaf shape. So it pays where many
    leaves share a shape, as the layers of a deep model do (the step times by
    leaves per shape and leaf size: docs/performance-xla.md, "Fused execution
    paths"). Leaves outside ``RECOMPUTE_MIN_SHARED`` /
    ``RECOMPUTE_MAX_SIZE`` keep the stored ``u``, and when none qualifies this
    is the ordinary path. Moments stored narrower than they are computed in
    would round differently, so those take the ordinary path too.
    """
    if in_leaf_order(updates):
        return _in_leaf_order(stages, updates, states, params, extra)
    adam, *middle, trust = stages

    def through_middle(u, params):  # the stateless stages between Adam and the trust ratio
        for stage, state in zip(middle, states[1:-1]):
            u, _ = stage.apply(u, state, params, extra)
        return u

    u, adam_state = adam.apply(updates, states[0], params, extra)
    u = through_middle(u, params)
    new_states = (adam_state, *states[1:])
    shared = collections.Counter((x.shape, x.dtype) for x in jax.tree.leaves(u))

    def recompute(x):
        return shared[(x.shape, x.dtype)] >= RECOMPUTE_MIN_SHARED and x.size <= RECOMPUTE_MAX_SIZE

    narrowed = any(m.dtype != v.dtype or m.dtype != _tree.compute_dtype(g.dtype, m.dtype) for g, m, v in
                   zip(jax.tree.leaves(updates), jax.tree.leaves(adam_state.mu), jax.tree.leaves(adam_state.nu)))
    # The recomputation below is plain Adam's step over every leaf: a mask or Nesterov's moment takes the ordinary path.
    other = trust.option("mask") is not None or adam.option("nesterov")
    if narrowed or other or not any(recompute(x) for x in jax.tree.leaves(u)):
        return trust.apply(u, states[-1], params, extra)[0], new_states
    ratios = trust_ratios(u, params, **_trust_options(trust))
    b1, b2, eps, eps_root = (adam.option(k) for k in ("b1", "b2", "eps", "eps_root"))
    c1, c2 = bias_corrections(adam_state.count, b1, b2)
    mu, nu, p = jax.lax.optimization_barrier((adam_state.mu, adam_state.nu, params))
    again = jax.tree.map(lambda g, m, v: adam_direction(m / c1, v, c2, eps, eps_root).astype(g.dtype), updates, mu, nu)
    again = through_middle(again, p)
    scaled = jax.tree.map(lambda u, again, r: trust_scaled(again if recompute(u) else u, r), u, again, ratios)
    return scaled, new_states


register_fused_path(("scale_by_adam", "add_decayed_weights", "scale_by_trust_ratio"), _run_adam_then_trust_ratio)
register_fused_path(("scale_by_adam", "scale_by_trust_ratio"), _run_adam_then_trust_ratio)
