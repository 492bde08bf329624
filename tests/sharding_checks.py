"""Multi-device checks of every catalogue entry and of the optimizers that are more than a chain of its stages
(tests/registry.py's ``SWEPT_OPTIMIZERS``), run by tests/test_sharding.py in a subprocess.

JAX fixes its number of host devices when its backend starts, so these run in
a fresh interpreter started with ``--xla_force_host_platform_device_count=8``;
:func:`main` prints one JSON line per target and mesh with what it found, and
the test asserts on those lines. Importing this module does nothing.

For each target, on an Explicit and on an Auto mesh of 4 x 2 devices
(``data`` x ``model``), with params of several shardings in a nested tree:

- ``init`` (eager, and jitted) gives every state leaf that mirrors a param
  that param's sharding (jitted on the Auto mesh: those leaves only); every other array state leaf
  of a param is placed on the param's mesh, and a stage's own values (counts,
  keys) are replicated over it;
- three jitted, donated steps on the sharded params give the single-device
  numbers within float32 rounding, and keep the sharding of every update and
  of every state leaf init placed. A target with a line search takes the
  gradients of its objective and moves its params (see :func:`_run`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import updax as ux
from registry import ENTRIES, SWEPT_OPTIMIZERS, updates_for

#: Each param's partition spec: both mesh axes, one, none, and a None leaf; ``w2`` shares ``w``'s shape and
#: spec (LAMB traces such leaves once, updax._backend._lamb).
SPECS = {"w": P("data", "model"), "w2": P("data", "model"), "layers": [P(None, "data", None), (P("model"), None)],
         "s": P()}
SHAPES = {"w": (8, 4), "w2": (8, 4), "layers": [(2, 4, 3), ((4,), None)], "s": ()}
#: The stages that choose a step size from evaluations of their objective.
LINE_SEARCHES = {"scale_by_zoom_linesearch", "scale_by_backtracking_linesearch"}
STEPS = 3


def quartic(params):
    """``Σ w²/2 + w⁴/4`` over the tree: L-BFGS's objective, whose curvature varies from point to point."""
    return sum((jnp.sum(p**2 / 2 + p**4 / 4) for p in jax.tree.leaves(params)), jnp.zeros([], jnp.float32))


def coupled(params):
    """``quartic`` plus ``(Σ w)²/2``: Sophia's objective, whose Hessian is not diagonal, so that Hutchinson's
    estimate depends on the Rademacher vectors drawn for each sharded leaf."""
    return quartic(params) + sum(jnp.sum(p) for p in jax.tree.leaves(params)) ** 2 / 2


def _tree(seed):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda shape: jnp.asarray(rng.normal(size=shape), jnp.float32), SHAPES,
                        is_leaf=lambda x: isinstance(x, tuple) and all(isinstance(n, int) for n in x))


def _place(tree, mesh):
    return jax.tree.map(lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec)), tree, SPECS,
                        is_leaf=lambda x: isinstance(x, P))


def targets():
    out = {name: build for name, build in ENTRIES.items()}
    out.update({f"optimizers.{name}": (lambda name=name: getattr(ux.optimizers, name)(0.1))
                for name in SWEPT_OPTIMIZERS})
    # Its line search needs an objective. Not half_squared_norm: its Hessian is the identity, so L-BFGS's direction
    # is the gradient's times the learning rate, and with 0.1 a step of 1 is on the edge of the curvature test
    # (1 - 0.1 = curv_rtol), a decision the rounding of a sharded sum can flip.
    out["optimizers.lbfgs"] = lambda: ux.optimizers.lbfgs(0.1, objective=quartic)
    out["optimizers.sophia"] = lambda: ux.optimizers.sophia(0.1, objective=coupled)  # (its estimate then needs z)
    del out["flat_state"]  # its state is not shaped like the params: flat_state_on_a_mesh checks it
    del out["quantized_state"]  # its state is codes and scales: tests/quantized_sharding.py checks it
    return out


def _spec(x):
    """A NamedSharding's spec, one entry per axis (so equal specs are equal shardings), else the type's name."""
    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, NamedSharding):
        return type(sharding).__name__
    return str(tuple(sharding.spec) + (None,) * (jnp.ndim(x) - len(sharding.spec)))


def _params_by_path(params):
    return {jax.tree_util.keystr(path): x for path, x in jax.tree_util.tree_flatten_with_path(params)[0]}


def _placement(state, params, mesh, mirrors_only=False):
    """Problems with where init put the state: a mirror leaf not sharded like its param, or a leaf of a param
    off the param's mesh. Also the (path, spec) of every non-mirror leaf of a param, for the record."""
    by_path = _params_by_path(params)
    problems, derived = [], {}
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        key = jax.tree_util.keystr(path)
        # The param a leaf belongs to: its path ends with the param's, or with it and indices (sm3's per-axis
        # accumulators are a tuple per param, Shampoo's blocked statistics a tuple of tuples).
        owner = next((p for p in sorted(by_path, key=len, reverse=True)
                      if re.search(re.escape(p) + r"(\[\d+\])*$", key)), None)
        if mirrors_only and (owner is None or jnp.shape(x) != by_path[owner].shape):
            continue
        if owner is None:  # a stage's own value (a count, a key): replicated over the params' mesh
            if not isinstance(x.sharding, NamedSharding) or x.sharding.mesh != mesh or _spec(x).strip("(None,) "):
                problems.append(f"{key}: {x.sharding} is not replicated over the params' mesh")
            continue
        param = by_path[owner]
        if jnp.shape(x) == param.shape:
            if _spec(x) != _spec(param) or x.sharding.mesh != mesh:
                problems.append(f"{key}: {_spec(x)}, its param {_spec(param)}")
        else:
            derived[key] = _spec(x)
            if not isinstance(x.sharding, NamedSharding) or x.sharding.mesh != mesh:
                problems.append(f"{key}: {x.sharding} is not on the param's mesh")
    return problems, derived


def _run(opt, params, grads):
    """The updates and the final state of jitted steps on ``grads``, at ``params``.

    A target with a line search instead descends the objective it was built with: each step takes the
    objective's gradient and moves the params. Random gradients are not a descent direction of it half of the
    time, and a line search along an uphill direction fails and takes the last step it tried, a step whose
    size rounding decides (see ``scale_by_zoom_linesearch``): a mesh may then end elsewhere than one device.
    """
    step = jax.jit(lambda g, s, p: opt.update(g, s, p, loss=jnp.float32(1.0)), donate_argnums=1)
    objective = next((stage.option("objective") for stage in opt.stages if stage.name in LINE_SEARCHES), None)
    state = opt.init(params)
    outs = []
    for g in grads:
        if objective is not None:
            g = jax.grad(objective)(params)
        u, state = step(updates_for(opt, g), state, params)
        if objective is not None:
            params = ux.apply_updates(params, u)
        outs.append(u)
    return outs, state


def check(name, build, axis_type, expected):
    """``expected``: the single-device updates of :func:`single_device`."""
    opt = build()
    params, grads = _tree(0), [_tree(t + 1) for t in range(STEPS)]
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)
    result = {"name": name, "mesh": axis_type.name}
    with jax.set_mesh(mesh):
        sharded, sharded_grads = _place(params, mesh), [_place(g, mesh) for g in grads]
        state0 = opt.init(sharded)
        problems, result["derived"] = _placement(state0, sharded, mesh)
        jitted = jax.jit(opt.init)(sharded)
        if axis_type == AxisType.Explicit:  # the types carry every sharding
            problems += [f"jit(init) {path}: {a} where init gives {b}"
                         for (path, a), (_, b) in zip(_flat_specs(jitted), _flat_specs(state0)) if a != b]
        else:  # no sharding is known while tracing: the leaves shaped like their param still follow it
            problems += [f"jit(init) {p}" for p in _placement(jitted, sharded, mesh, mirrors_only=True)[0]]
        outs, state = _run(opt, sharded, sharded_grads)
        for (path, a), (_, b) in zip(_flat_specs(state), _flat_specs(state0)):
            if b.startswith("(") and a != b:
                problems.append(f"after the steps state{path}: {a} where init gave {b}")
        for path, x in _params_by_path(outs[-1]).items():
            if _spec(x) != _spec(_params_by_path(sharded)[path]):
                problems.append(f"updates{path}: {_spec(x)}")
    error = 0.0
    for out, ref in zip(outs, expected):
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            scale = max(float(np.max(np.abs(b), initial=0.0)), 1e-6)  # relative to the leaf's largest value
            error = max(error, float(np.max(np.abs(a - b), initial=0.0)) / scale)
    result.update(problems=problems, error=error)
    return result


def single_device(build):
    """The updates of :data:`STEPS` jitted steps on one device, the reference for both meshes."""
    return _run(build(), _tree(0), [_tree(t + 1) for t in range(STEPS)])[0]


def _flat_specs(tree):
    return [(jax.tree_util.keystr(path), _spec(x)) for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def state_bytes_per_device(state):
    """Bytes of ``state`` on the first device."""
    device = jax.devices()[0]
    return sum(shard.data.nbytes for x in jax.tree.leaves(state) for shard in x.addressable_shards
               if shard.device == device)


#: The ZeRO-1 checks: the optimizer behind clip_by_global_norm in each.
ZERO1 = {"zero1": lambda: ux.optimizers.adamw(0.1, decay=0.01), "zero1_lion": lambda: ux.optimizers.lion(0.1),
         # their n x n statistics (and roots, bases) split too, the roots refreshed (eigh of the gathered statistic)
         # at every step, the bases at the first and by a power step at the third
         "zero1_shampoo": lambda: ux.optimizers.shampoo(0.1, precondition_frequency=1),
         "zero1_soap": lambda: ux.optimizers.soap(0.1, precondition_frequency=3)}


def zero1(axis_type, name="zero1"):
    """ZeRO-1: params replicated over 8 devices, adamw's state split over the data axis by zero1_shardings; the
    same params as the replicated run, the params stay replicated, the state stays split, and each device holds
    an eighth of the moments. As ``zero1_lion``, the same with lion, whose momentum is written after the
    params' update (updax._backend._order: its order must follow the state's sharding, not the params'). As
    ``zero1_shampoo`` and ``zero1_soap``, the same with their n x n statistics, roots and bases split too (each
    step gathers them for its products and its eigendecompositions)."""
    mesh = jax.make_mesh((8,), ("data",), axis_types=(axis_type,))
    replicated = NamedSharding(mesh, P())
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(64, 32)), jnp.float32), "b": jnp.asarray(rng.normal(size=(32,)),
                                                                                           jnp.float32),
              "small": jnp.asarray(rng.normal(size=(3,)), jnp.float32)}
    grads = [jax.tree.map(lambda p, t=t: jnp.cos(p * (t + 1)), params) for t in range(STEPS)]
    opt = ux.clip_by_global_norm(1.0).pipe(ux.compose, ZERO1[name]())
    result = {"name": name, "mesh": axis_type.name}
    with jax.set_mesh(mesh):
        params = jax.device_put(params, replicated)
        grads = [jax.device_put(g, replicated) for g in grads]

        def train(state_sharding):
            state = opt.init(params)
            if state_sharding is not None:
                state = jax.device_put(state, state_sharding)
            step = jax.jit(lambda g, s, p: _apply(opt, g, s, p), donate_argnums=(1, 2),
                           out_shardings=(replicated, state_sharding) if state_sharding is not None else None)
            bytes_at_init, p = state_bytes_per_device(state), jax.tree.map(jnp.copy, params)
            for g in grads:
                p, state = step(g, state, p)
            return p, state, bytes_at_init

        ref, ref_state, result["replicated_bytes"] = train(None)
        shardings = ux.sharding.zero1_shardings(opt.init(params), mesh, "data")
        out, state, result["zero1_bytes"] = train(shardings)
        problems = [f"params{path}: {_spec(x)}" for path, x in _params_by_path(out).items() if _spec(x) != "(None,)"
                    and _spec(x) != "(None, None)"]
        problems += [f"state{path}: {a} where zero1_shardings gives {b}" for (path, a), (_, b)
                     in zip(_flat_specs(state), _flat_specs(jax.tree.map(lambda s: _Placed(s), shardings)))
                     if a != b]
        result["specs"] = dict(_flat_specs(state))
        result["error"] = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b
                              in zip(jax.tree.leaves(out), jax.tree.leaves(ref)))
    result["problems"] = problems
    return result


class _Placed:
    """An object with a sharding and the number of axes of its spec, for :func:`_spec`."""

    def __init__(self, sharding):
        self.sharding = sharding
        self.ndim = len(sharding.spec)

    def __jax_array__(self):  # pragma: no cover - never converted
        raise TypeError


def _apply(opt, grads, state, params):
    updates, state = opt.update(grads, state, params)
    return ux.apply_updates(params, updates), state


def checkpoint(axis_type):
    """An orbax round trip of a sharded state: restored with ``opt.init(params)`` as the target, every leaf
    comes back with its sharding and its bits, and the next steps equal the uninterrupted run's."""
    import tempfile

    import orbax.checkpoint as ocp

    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)
    opt = ux.optimizers.adafactor(0.1, min_dim_size_to_factor=2).pipe(ux.ema_params, 0.9)
    params, grads = _tree(0), [_tree(t + 1) for t in range(2 * STEPS)]
    result = {"name": "checkpoint", "mesh": axis_type.name}
    with jax.set_mesh(mesh), tempfile.TemporaryDirectory() as tmp:
        params, grads = _place(params, mesh), [_place(g, mesh) for g in grads]
        step = jax.jit(lambda g, s, p: _apply(opt, g, s, p))
        state = opt.init(params)
        for g in grads[:STEPS]:
            params, state = step(g, state, params)
        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(f"{tmp}/state", state)
            checkpointer.wait_until_finished()
            target = jax.tree.map(ocp.utils.to_shape_dtype_struct, opt.init(params))
            restored = checkpointer.restore(f"{tmp}/state", target)
        problems = [f"state{path}: restored {a}, saved {b}" for (path, a), (_, b)
                    in zip(_flat_specs(restored), _flat_specs(state)) if a != b]
        problems += [f"state{jax.tree_util.keystr(path)}: other bits" for path, a, b
                     in zip(*zip(*jax.tree_util.tree_flatten_with_path(restored)[0]), jax.tree.leaves(state))
                     if np.asarray(a).tobytes() != np.asarray(b).tobytes()]
        resumed, uninterrupted = params, params
        for g in grads[STEPS:]:
            resumed, restored = step(g, restored, resumed)
            uninterrupted, state = step(g, state, uninterrupted)
        problems += [f"after resuming: {path}" for (path, a), b in zip(_params_by_path(resumed).items(),
                                                                        jax.tree.leaves(uninterrupted))
                     if np.asarray(a).tobytes() != np.asarray(b).tobytes()]
        result["specs"] = dict(_flat_specs(restored))
    result["problems"] = problems
    return result


def flat_state_on_a_mesh(axis_type):
    """flat_state refuses to join a leaf split over the mesh, by name; joining only replicated leaves, its steps
    equal one device's and the leaves kept apart keep their params' shardings in the state."""
    def build(max_join_size):
        return lambda: ux.optimizers.adam(0.1).flat_state(max_join_size=max_join_size, min_joined=1)

    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)
    problems, params, grads = [], _tree(0), [_tree(t + 1) for t in range(STEPS)]
    expected = single_device(build(3))
    with jax.set_mesh(mesh):
        sharded, sharded_grads = _place(params, mesh), [_place(g, mesh) for g in grads]
        try:
            build(8)().init(sharded)
            problems.append("a split leaf was joined")
        except ValueError as e:
            if "is split over the devices of a mesh" not in str(e):
                problems.append(f"another error: {e}")
        opt = build(3)()  # only the scalar "s", replicated, is joined
        state = opt.init(sharded)
        mu = opt.get_state(state, "flat_state/scale_by_adam.mu")
        for i, (path, x) in enumerate(jax.tree_util.tree_flatten_with_path(sharded)[0]):
            if x.size > 3 and _spec(mu[f"leaf_{i:05d}"]) != _spec(x):
                problems.append(f"mu of {jax.tree_util.keystr(path)}: {_spec(mu[f'leaf_{i:05d}'])}, its param {_spec(x)}")
        outs, _ = _run(opt, sharded, sharded_grads)
    for got, want in zip(jax.tree.leaves(outs), jax.tree.leaves(expected)):
        if not np.allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7):
            problems.append("the steps differ from one device's")
            break
    return {"name": "flat_state_on_a_mesh", "mesh": axis_type.name, "problems": problems}


def main(names):
    assert jax.device_count() == 8, jax.devices()
    for check_fn in (checkpoint, flat_state_on_a_mesh):
        if not names or check_fn.__name__ in names:
            for axis_type in (AxisType.Explicit, AxisType.Auto):
                try:
                    result = check_fn(axis_type)
                except Exception as e:
                    result = {"name": check_fn.__name__, "mesh": axis_type.name,
                              "problems": [f"{type(e).__name__}: {e}"]}
                print("RESULT " + json.dumps(result), flush=True)
    for zero1_name in ZERO1:
        if names and zero1_name not in names:
            continue
        for axis_type in (AxisType.Explicit, AxisType.Auto):
            try:
                result = zero1(axis_type, zero1_name)
            except Exception as e:
                result = {"name": zero1_name, "mesh": axis_type.name, "problems": [f"{type(e).__name__}: {e}"]}
            print("RESULT " + json.dumps(result), flush=True)
    for name, build in targets().items():
        if names and name not in names:
            continue
        expected = None
        for axis_type in (AxisType.Explicit, AxisType.Auto):
            try:
                expected = single_device(build) if expected is None else expected
                result = check(name, build, axis_type, expected)
            except Exception as e:  # reported, and asserted on, by the test
                result = {"name": name, "mesh": axis_type.name, "problems": [f"{type(e).__name__}: {e}"]}
            print("RESULT " + json.dumps(result), flush=True)


def _main_to_file(path, names):
    """``main`` with its RESULT lines written to ``path``, which appears (by a rename) only once they are all
    there: a test in another pytest worker process waits for it. A crash is written there too."""
    try:
        with open(path + ".part", "w") as out, contextlib.redirect_stdout(out):
            try:
                main(names)
            except BaseException:
                print("CRASHED " + json.dumps(traceback.format_exc()), flush=True)
                raise
    finally:
        os.replace(path + ".part", path)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--out"]:
        _main_to_file(sys.argv[2], sys.argv[3:])
    else:
        main(sys.argv[1:])
