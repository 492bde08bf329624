"""quantized_state on 8 host devices, run by tests/test_quantized_state.py in a subprocess.

JAX fixes its number of host devices when its backend starts, so this runs in a
fresh interpreter started with ``--xla_force_host_platform_device_count=8``.
It prints one JSON line with what it found:

- ``blocks``: every quantized leaf whose blocks straddle a shard (a device's
  slice of the codes covering part of a block, or other blocks than its slice
  of the scales), after init and after the steps, with the params split over
  the mesh along their leading axes, and with replicated params and the state
  placed by ``zero1_shardings`` (ZeRO-1);
- ``differ``: with the params split, the leaves (params after the steps, and
  the stored codes and scales) that differ from one device's run, bit for bit
  (none with XLA's default flags; the test suite's cheaper compilation fuses
  otherwise, and a 1-d leaf's steps then differ by a rounding);
- ``vector_blocks`` and ``vector_differ``: with 1-d leaves split along their only axis
  on an Explicit and an Auto mesh (8192 elements: shards of 1024, half a block of
  8 bits; 12288: shards of 1536, neither a whole number of blocks nor a part of one),
  the leaves whose blocks straddle a shard (no shard may hold parts of two blocks;
  12288 is not checked: its shards cannot all hold whole blocks or parts of one),
  and those (params, codes, scales) that differ from one device's, bit for bit, the
  steps compiled with XLA's default options, as a user's are
  (12288 on the Auto mesh, whose uneven blocks XLA partitions with other kernels,
  within ``vector_error`` and ``vector_codes``, as ``split_error`` below);
- ``split_error`` and ``zero1_error``: the largest difference of the params from one
  device's, relative to how far that run moved them, with the params split
  and with ZeRO-1, and ``split_codes``, ``zero1_codes``: the fraction of
  stored codes that differ. (XLA fuses the sharded program's
  dequantization into other kernels than one device's, so the moments may
  differ by a rounding, and a value on the edge between two codes may take the
  other; plain Adam's ZeRO-1 step is bit for bit one device's.)

A shard shorter than a block holds part of one block (the block's scale is the
largest of its shards' maxima, exact); no shard holds parts of two blocks.
"""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
from compile_options import DEFAULT_COMPILE
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import updax as ux
from updax.updates._quantized import QuantizedArray

STEPS = 3
SHAPES = {"w": (64, 4096), "v": (16384,), "m": (4, 32, 640), "odd": (16, 300), "s": (7,)}
SPECS = {"w": P("data"), "v": P("data"), "m": P(None, "data"), "odd": P("data"), "s": P()}
OPTIMIZERS = {
    "8": lambda: ux.optimizers.adamw(1e-2).quantized_state(bits=8, min_size=1024),
    "4": lambda: ux.optimizers.adamw(1e-2).quantized_state(bits=4, min_size=1024),
    "float8": lambda: ux.optimizers.adamw(1e-2).quantized_state(bits="float8", min_size=1024),
    "8 flat": lambda: ux.optimizers.adam(1e-2).flat_state(max_join_size=512, min_joined=1)
    .quantized_state(bits=8, min_size=0, block_size=8),
}


def tree(seed):
    rng = np.random.default_rng(seed)
    return {k: jnp.asarray(rng.normal(size=s), jnp.float32) for k, s in SHAPES.items()}


def run(opt, params, grads, state=None, jit_kwargs=None):
    step = jax.jit(lambda g, s, p: _apply(opt, g, s, p), **(jit_kwargs or {}))
    state = opt.init(params) if state is None else state
    for g in grads:
        params, state = step(g, state, params)
    return params, state


def _apply(opt, grads, state, params):
    updates, state = opt.update(grads, state, params)
    return ux.apply_updates(params, updates), state


def _quantized(state):
    return [(jax.tree_util.keystr(path), x) for path, x in
            jax.tree_util.tree_flatten_with_path(state, is_leaf=lambda x: isinstance(x, QuantizedArray))[0]
            if isinstance(x, QuantizedArray)]


def straddling(state):
    """The quantized leaves some device holds part of a block of, or blocks whose scales it does not hold."""
    found = []
    for path, q in _quantized(state):
        codes, scales = q.codes, q.scales
        if isinstance(scales, tuple):
            continue  # (rank-1: no blocks; its maxima are reductions over the shards, exact on any layout)
        block = math.ceil(codes.shape[-1] / scales.shape[-1])  # (in stored elements: bytes for 4 bits)
        code_slices = codes.sharding.devices_indices_map(codes.shape)
        scale_slices = scales.sharding.devices_indices_map(scales.shape)
        for device, index in code_slices.items():
            last = index[-1].indices(codes.shape[-1])
            first_block, end_block = last[0] // block, math.ceil(last[1] / block)
            within = end_block - first_block == 1 and block % (last[1] - last[0]) == 0  # (part of one block)
            if not within and (last[0] % block or (last[1] % block and last[1] != codes.shape[-1])):
                found.append(f"{path}: {device} holds codes {last[:2]} of blocks of {block}")
                continue
            held = scale_slices[device][-1].indices(scales.shape[-1])
            if not held[0] <= first_block < end_block <= held[1] or \
                    [s.indices(n) for s, n in zip(index[:-1], codes.shape[:-1])] != \
                    [s.indices(n) for s, n in zip(scale_slices[device][:-1], scales.shape[:-1])]:
                found.append(f"{path}: {device} holds codes {index} and scales {scale_slices[device]}")
    return found


def differing(a, b):
    return [jax.tree_util.keystr(path) for (path, x), y in
            zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b))
            if np.asarray(x).tobytes() != np.asarray(y).tobytes()]


def compare(result, case, out, state, one_params, one_state, params):
    """The largest difference of the params from one device's, relative to how far that run moved them, and the
    fraction of stored codes that differ, over the optimizers (``<case>_error``, ``<case>_codes``)."""
    error = result.get(f"{case}_error", 0.0)
    for a, b, p0 in zip(jax.tree.leaves(out), jax.tree.leaves(one_params), jax.tree.leaves(params)):
        moved = float(np.max(np.abs(np.asarray(b) - np.asarray(p0))))
        error = max(error, float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) / moved)
    codes = [(np.asarray(a.codes).view(np.uint8), np.asarray(b.codes).view(np.uint8)) for (_, a), (_, b)
             in zip(_quantized(state), _quantized(one_state))]
    result[f"{case}_error"] = error
    result[f"{case}_codes"] = max(result.get(f"{case}_codes", 0.0), sum(int(np.sum(a != b)) for a, b in codes)
                                  / sum(a.size for a, _ in codes))


def main():
    assert jax.device_count() == 8, jax.devices()
    mesh = jax.make_mesh((8,), ("data",))
    params, grads = tree(0), [tree(t + 1) for t in range(STEPS)]
    result = {"blocks": [], "differ": [], "quantized": 0, "zero1_split": 0}
    for name, build in OPTIMIZERS.items():
        opt = build()
        with jax.default_device(jax.devices()[0]):
            one_params, one_state = run(opt, params, grads)
        result["quantized"] += len(_quantized(one_state))
        # The params split along their leading axes: the state follows them.
        place = lambda t: jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), t, SPECS)
        split_params = place(params)
        init = opt.init(split_params)
        result["blocks"] += [f"{name} init: {p}" for p in straddling(init)]
        out, state = run(opt, split_params, [place(g) for g in grads])
        result["blocks"] += [f"{name} split: {p}" for p in straddling(state)]
        result["differ"] += [f"{name} split: {p}" for p in differing((out, state), (one_params, one_state))]
        compare(result, "split", out, state, one_params, one_state, params)
        # ZeRO-1: replicated params, the state split by zero1_shardings and kept there.
        replicated = jax.device_put(params, NamedSharding(mesh, P()))
        state0 = opt.init(replicated)
        where = ux.sharding.zero1_shardings(state0, mesh)
        state0 = jax.device_put(state0, where)
        result["zero1_split"] += sum("data" in str(q.codes.sharding.spec) for _, q in _quantized(state0))
        result["blocks"] += [f"{name} zero1 init: {p}" for p in straddling(state0)]
        out, state = run(opt, replicated, [jax.device_put(g, NamedSharding(mesh, P())) for g in grads], state0,
                         dict(out_shardings=(NamedSharding(mesh, P()), where)))
        result["blocks"] += [f"{name} zero1: {p}" for p in straddling(state)]
        compare(result, "zero1", out, state, one_params, one_state, params)
    vectors(result)
    print("RESULT " + json.dumps(result), flush=True)


VECTORS = {"a": (8192,), "b": (12288,)}
VECTOR_OPTIMIZERS = {"8": lambda: ux.optimizers.adamw(1e-2).quantized_state(bits=8, min_size=1024),
                     "4": lambda: ux.optimizers.adamw(1e-2).quantized_state(bits=4, min_size=1024),
                     "float8": lambda: ux.optimizers.adamw(1e-2).quantized_state(bits="float8", min_size=1024),
                     "8 stochastic": lambda: ux.optimizers.adamw(1e-2).quantized_state(min_size=1024,
                                                                                      rounding="stochastic")}


#: The steps compiled as a user's are (the suite's cheaper compilation rounds a 1-d leaf's steps otherwise).
DEFAULT = {"compiler_options": DEFAULT_COMPILE}


def vectors(result):
    """1-d leaves split along their only axis, on an Explicit and an Auto mesh: bit for bit one device's."""
    rng = np.random.default_rng(7)
    make = lambda: {k: jnp.asarray(rng.normal(size=s), jnp.float32) for k, s in VECTORS.items()}
    params, grads = make(), [make() for _ in range(STEPS)]
    result["vector_blocks"], result["vector_differ"] = [], []
    for name, build in VECTOR_OPTIMIZERS.items():
        opt = build()
        with jax.default_device(jax.devices()[0]):
            one = run(opt, params, grads, jit_kwargs=DEFAULT)
        for kind in (AxisType.Explicit, AxisType.Auto):
            mesh = jax.make_mesh((8,), ("data",), axis_types=(kind,))
            place = lambda t, mesh=mesh: jax.device_put(t, NamedSharding(mesh, P("data")))
            with jax.set_mesh(mesh):
                init = opt.init(place(params))
                out = run(opt, place(params), [place(g) for g in grads], init, DEFAULT)
            where = f"{name} {kind.name}"
            # (12288 in blocks of 2048 over 8 shards of 1536: some shard holds parts of two blocks whatever the
            # layout; on an Explicit mesh each block's maximum is taken over parts of 512, exact.)
            result["vector_blocks"] += [f"{where} init: {p}" for p in straddling(init) if "['b']" not in p]
            result["vector_blocks"] += [f"{where}: {p}" for p in straddling(out[1]) if "['b']" not in p]
            differ = [f"{where}: {p}" for p in differing(out, one)]
            if kind == AxisType.Auto:  # (XLA partitions the uneven blocks of b: its moments by other kernels)
                compare(result, "vector", out[0], out[1], one[0], one[1], params)
                differ = [p for p in differ if "['b']" not in p]
            result["vector_differ"] += differ


if __name__ == "__main__":
    main()
