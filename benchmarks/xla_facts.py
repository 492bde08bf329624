"""The XLA-on-CPU facts behind docs/performance-xla.md, measured: what limits an optimizer step and its compile.

Run from the repository root (``pip install -e ".[bench]"`` first)::

    python benchmarks/xla_facts.py     # about two minutes on 2 cores

It uses a hand-written Adam step (no library), so what it shows is XLA's
behaviour, not updax's or optax's:

1. kernels per leaf: XLA's CPU backend writes one output per fused kernel,
   so Adam is three kernels per leaf (``mu``, ``nu``, the params) that read
   the gradient and the new moments twice: 10 full-size passes, not 7;
2. compile time follows the number of distinct kernels: the same number of
   leaves compiles several times faster when they share one shape;
3. one flat buffer instead of per-leaf arrays does not cut the kernel count
   (every leaf's slice is a kernel of its own) and costs extra passes;
4. a norm whose expression divides and takes roots (LAMB's ``‖u‖`` from the
   moments) is slow as one reduction kernel, and stored instead, the update
   is a temporary the size of the tree that is faulted in afresh on every
   call; run leaf after leaf (each leaf's kernels made to depend on the
   previous leaf's norm), one leaf's temporary serves every leaf, in cache.

Results go to ``benchmarks/results/xla_facts.json`` and are printed.
"""

from __future__ import annotations

import json
import re
import resource
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def adam_leaf(g, p, m, v, t):
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    return p - 1e-3 * (m / (1 - 0.9**t)) / (jnp.sqrt(v / (1 - 0.999**t)) + 1e-8), m, v


def unzip3(treedef, out):
    leaves = treedef.flatten_up_to(out)
    return tuple(treedef.unflatten([leaf[k] for leaf in leaves]) for k in range(3))


def per_leaf(p, state, g):
    m, v, t = state
    t = t + 1
    out = jax.tree.map(lambda g, p, m, v: adam_leaf(g, p, m, v, t.astype(jnp.float32)), g, p, m, v)
    p, m, v = unzip3(jax.tree.structure(p), out)
    return p, (m, v, t)


def flat(p, state, g):
    """The same step on one concatenated buffer per tree, split back into the leaves."""
    m, v, t = state
    t = t + 1
    leaves, treedef = jax.tree.flatten(p)
    offsets = np.cumsum([x.size for x in leaves])[:-1]

    def cat(tree):
        return jnp.concatenate([x.reshape(-1) for x in jax.tree.leaves(tree)])

    def split(x):
        return treedef.unflatten([a.reshape(leaf.shape) for a, leaf in zip(jnp.split(x, offsets), leaves)])

    new = adam_leaf(cat(g), cat(p), cat(m), cat(v), t.astype(jnp.float32))
    return split(new[0]), (split(new[1]), split(new[2]), t)


def leaves_of(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return {f"l{i:04d}": jnp.asarray(rng.normal(size=s).astype(np.float32)) for i, s in enumerate(shapes)}


def measure(fn, params, repeats=9):
    """Compile seconds, fused kernels in the optimized HLO, median step seconds (donated params and state)."""
    state = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params), jnp.zeros([], jnp.int32))
    grads = leaves_of([x.shape for x in jax.tree.leaves(params)], seed=1)
    grads = jax.tree.unflatten(jax.tree.structure(params), jax.tree.leaves(grads))
    start = time.perf_counter()
    compiled = jax.jit(fn, donate_argnums=(0, 1)).lower(params, state, grads).compile()
    compile_s = time.perf_counter() - start
    entry = compiled.as_text()
    entry = entry[entry.index("ENTRY"):]
    kernels = len(re.findall(r" fusion\(", entry))
    # Kernels that write an array of a leaf's shape (not the step count's or the bias corrections' scalars).
    shapes = {str(list(x.shape)).replace(" ", "") for x in jax.tree.leaves(params)}
    full_size = sum(len(re.findall(rf"= f32{re.escape(shape)}\{{[^}}]*\}} fusion\(", entry)) for shape in shapes)
    p, s = jax.tree.map(lambda x: jnp.array(x, copy=True), (params, state))
    times = []
    for r in range(repeats + 2):
        start = time.perf_counter()
        p, s = compiled(p, s, grads)
        jax.block_until_ready(p)
        if r >= 2:
            times.append(time.perf_counter() - start)
    return {"compile_s": compile_s, "kernels": kernels, "full_size_kernels": full_size,
            "step_ms": 1e3 * statistics.median(times)}


def direction(m, v):
    """Adam's direction from the moments (the update LAMB's trust ratio measures)."""
    return (m / 0.9) / (jnp.sqrt(v / 0.99) + 1e-6)


def after(x, token):
    """``x`` (times an exact 1) as a value that depends on ``token``: XLA must compute ``token`` first."""
    bits = jax.lax.bitcast_convert_type(token, jnp.int32)
    return x * (1 + jax.lax.shift_right_logical(jax.lax.population_count(bits), 6)).astype(x.dtype)


def norms(stored, ordered):
    """The squared norm of Adam's direction per leaf; ``stored``: the direction is a kernel of its own (a
    stored temporary, the elementwise kernel cut off by an identity ``reduce_precision``), ``ordered``: each
    leaf after the previous leaf's norm."""
    def fn(ms, vs):
        out, token = [], None
        for m, v in zip(ms, vs):
            u = direction(m, v)
            if ordered and token is not None:
                u = after(u, token)
            if stored:
                u = jax.lax.reduce_precision(u, exponent_bits=8, mantissa_bits=23)  # (float32: the identity)
            token = jnp.sum(u * u)
            out.append(token)
        return out
    return jax.jit(fn)


def measure_norms(repeats=15):
    """Per variant: median ms, temporaries MB, page faults per call (MB), interleaved calls."""
    rng = np.random.default_rng(2)
    shapes = [(256, 256)] * 4 + [(256, 1024), (1024, 256)]  # half of the benchmark's T: 24 blocks
    ms, vs = ([jnp.asarray(np.abs(rng.normal(size=s)).astype(np.float32)) for _ in range(24) for s in shapes]
              for _ in range(2))
    variants = {"one reduction": norms(False, False), "stored": norms(True, False),
                "stored, leaf after leaf": norms(True, True)}
    times, faults = {k: [] for k in variants}, dict.fromkeys(variants, 0)
    for fn in variants.values():
        jax.block_until_ready(fn(ms, vs))
    for r in range(repeats):
        for name, fn in variants.items():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            jax.block_until_ready(fn(ms, vs))
            times[name].append(time.perf_counter() - start)
            faults[name] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return {name: {"ms": 1e3 * statistics.median(times[name]),
                   "temp_mb": fn.lower(ms, vs).compile().memory_analysis().temp_size_in_bytes / 1e6,
                   "faulted_mb_per_call": faults[name] * resource.getpagesize() / repeats / 1e6}
            for name, fn in variants.items()}


def main():
    rng = np.random.default_rng(0)
    facts = {}
    one = measure(per_leaf, leaves_of([(256, 1024)]))
    facts["kernels per Adam leaf"] = one["full_size_kernels"]
    print(f"1. Adam on one leaf compiles to {facts['kernels per Adam leaf']} full-size kernels", flush=True)

    n = 250
    same = measure(per_leaf, leaves_of([(4096,)] * n))
    varied = measure(per_leaf, leaves_of([(int(k),) for k in rng.integers(1024, 7168, size=n)]))
    facts["compile, 250 leaves of one shape"] = same
    facts["compile, 250 leaves of 250 shapes"] = varied
    print(f"2. {n} leaves: one shape compiles in {same['compile_s']:.2f} s, {n} shapes in "
          f"{varied['compile_s']:.2f} s ({same['kernels']} and {varied['kernels']} kernels)", flush=True)

    flat_varied = measure(flat, leaves_of([(int(k),) for k in rng.integers(1024, 7168, size=n)]))
    facts["flat buffer, 250 leaves of 250 shapes"] = flat_varied
    print(f"3. one flat buffer: {flat_varied['kernels']} kernels, compile {flat_varied['compile_s']:.2f} s, step "
          f"{flat_varied['step_ms']:.2f} ms; per leaf: {varied['kernels']} kernels, compile "
          f"{varied['compile_s']:.2f} s, step {varied['step_ms']:.2f} ms", flush=True)

    facts["norm of Adam's direction, 144 leaves"] = lamb = measure_norms()
    print("4. the norm of Adam's direction on 144 leaves (75 MB): " + "; ".join(
        f"{name} {v['ms']:.1f} ms, {v['temp_mb']:.1f} MB of temporaries, {v['faulted_mb_per_call']:.1f} MB "
        "faulted per call" for name, v in lamb.items()), flush=True)

    out = ROOT / "benchmarks" / "results" / "xla_facts.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"jax": jax.__version__, "facts": facts}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
