"""Muon on batches of matrices (``weight_dimension_numbers``) and adaptive Muon.

Parity with optax.contrib's ``muon`` / ``scale_by_muon`` on stacked 3-D and 4-D leaves over 20 jitted steps;
each matrix of a batch orthogonalised on its own (closed form: Newton-Schulz slice by slice); adaptive Muon
against optax on matrices and, on batches, against a float64 NumPy transcription of the paper's rule (optax
0.2.8 takes one dual norm per leaf, batch axes included); errors; the Explicit-mesh gather on 8 host devices.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest
from compile_options import DEFAULT_COMPILE, host_devices
from registry import nested_tree

import updax as ux

D = ux.MuonDimensionNumbers
STEPS = 20
#: As tests/test_optimizers.py's parity over 20 steps.
TOL = dict(rtol=2e-5, atol=1e-6)
NS_COEFFS = (3.4445, -4.7750, 2.0315)


def _tree(seed):
    """registry's nested tree (its ``layers[0]`` is (2, 2, 3): two stacked (2, 3) layers) and a 4-D leaf."""
    tree = nested_tree(seed=seed)
    tree["stack"] = jnp.asarray(np.random.default_rng(1000 + seed).normal(size=(2, 3, 4, 5)), jnp.float32)
    return tree


def _dims(cls):
    """A plain matrix, stacked layers (batch axis 0), and a 4-D leaf whose batch axis (1) sits between the two
    reduction axes (a batch of three (2·4, 5) matrices); None for the leaves Adam takes."""
    return {"dense": {"w": cls(0, 1), "b": None}, "layers": [cls(1, 2), (None, None)], "empty": {}, "nothing": None,
            "empty_list": [], "scalar": None, "stack": cls((0, 2), 3)}


def _last_two(params):
    """Every leaf with two axes or more is a batch of matrices over its last two axes (4-D: two batch axes)."""
    return jax.tree.map(lambda p: D(-2, -1) if p.ndim >= 2 else None, params)


def _last_two_optax(params):
    return jax.tree.map(lambda p: optax.contrib.MuonDimensionNumbers(-2, -1) if p.ndim >= 2 else None, params)


def _parity(ours, theirs, tree=_tree, tol=TOL):
    """``STEPS`` jitted steps of both on the same params and gradients; every update and the params compared (to
    ``tol``); returns the largest difference of an update's element."""
    params = tree(0)
    p1, p2 = params, params
    s1, s2 = ours.init(params), theirs.init(params)
    # (five Newton-Schulz iterations amplify the last bit: TOL is set by the default program's rounding)
    step1, step2 = (jax.jit(opt.update, compiler_options=DEFAULT_COMPILE) for opt in (ours, theirs))
    worst = 0.0
    for t in range(STEPS):
        factor = 1.0 + 0.5 * np.sin(t)
        grads = jax.tree.map(lambda g, f=factor: g * f, tree(t + 1))
        u1, s1 = step1(grads, s1, p1)
        u2, s2 = step2(grads, s2, p2)
        p1, p2 = ux.apply_updates(p1, u1), optax.apply_updates(p2, u2)
        assert jax.tree.structure(u1) == jax.tree.structure(u2)
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            np.testing.assert_allclose(x, y, **tol, err_msg=f"step {t}")
            worst = max(worst, float(np.max(np.abs(np.asarray(x) - np.asarray(y)), initial=0.0)))
    for x, y in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_allclose(x, y, **tol)
    return worst


# --------------------------------------------------------------------------
# Parity with optax.contrib


@pytest.mark.parametrize("form, nesterov", [("tree", True), ("function", False)])
def test_muon_matches_optax_on_stacked_3d_and_4d_leaves(form, nesterov):
    ours = ux.optimizers.muon(0.02, beta=0.9, eps=1e-7, decay=0.01, nesterov=nesterov, adam_b1=0.8, adam_b2=0.95,
                              adam_decay=0.02,
                              weight_dimension_numbers=_dims(D) if form == "tree" else _last_two)
    theirs = optax.contrib.muon(0.02, beta=0.9, eps=1e-7, weight_decay=0.01, nesterov=nesterov, adam_b1=0.8,
                                adam_b2=0.95, adam_weight_decay=0.02,
                                muon_weight_dimension_numbers=(_dims(optax.contrib.MuonDimensionNumbers)
                                                               if form == "tree" else _last_two_optax))
    _parity(ours, theirs)


def _matrices_only(seed):
    """The leaves with dimension numbers in :func:`_dims` (and a None leaf): optax's ``scale_by_muon`` takes
    nothing else."""
    tree = _tree(seed)
    return {"dense": {"w": tree["dense"]["w"]}, "layers": [tree["layers"][0]], "nothing": None, "stack": tree["stack"]}


def _matrix_dims(cls):
    return {"dense": {"w": cls(0, 1)}, "layers": [cls(1, 2)], "nothing": None, "stack": cls((0, 2), 3)}


def test_scale_by_muon_and_scale_by_shape_match_optax_with_dimension_numbers():
    options = dict(ns_coeffs=NS_COEFFS, ns_steps=5, beta=0.9, eps=1e-8, nesterov=True)
    ours = (ux.scale_by_muon(**options, weight_dimension_numbers=_matrix_dims(D))
            .scale_by_shape(weight_dimension_numbers=_matrix_dims(D)))
    theirs_dims = _matrix_dims(optax.contrib.MuonDimensionNumbers)
    theirs = optax.chain(optax.contrib.scale_by_muon(**options, weight_dimension_numbers=theirs_dims),
                         optax.contrib._muon.scale_by_shape(weight_dimension_numbers=theirs_dims))
    _parity(ours, theirs, _matrices_only)


def test_adaptive_muon_matches_optax_on_matrices():
    """Leaves with two axes: one matrix each, where optax's dual norm per leaf is the paper's."""
    ours = ux.optimizers.muon(0.02, beta=0.9, eps=1e-7, adaptive=True)
    theirs = optax.contrib.muon(0.02, beta=0.9, eps=1e-7, adaptive=True)
    worst = _parity(ours, theirs)
    assert worst < 1e-5


# --------------------------------------------------------------------------
# Closed forms: each matrix of a batch on its own


def _ns(x):
    opt = ux.scale_by_newton_schulz()
    return opt.update({"x": x}, opt.init(None))[0]["x"]


def test_each_matrix_of_a_batch_is_orthogonalised_on_its_own():
    rng = np.random.default_rng(0)
    stacked = jnp.asarray(rng.normal(size=(3, 5, 4)), jnp.float32)  # three tall (5, 4) layers
    four = jnp.asarray(rng.normal(size=(4, 2, 3, 5)), jnp.float32)  # batch axis 1: two (4·3, 5) matrices
    opt = ux.scale_by_newton_schulz(weight_dimension_numbers={"stacked": D(1, 2), "four": D((0, 2), 3)})
    u = jax.jit(opt.update)({"stacked": stacked, "four": four}, opt.init(None))[0]
    for i in range(3):
        np.testing.assert_allclose(u["stacked"][i], _ns(stacked[i]), rtol=1e-5, atol=1e-6)
    for j in range(2):
        matrix = four[:, j].reshape(12, 5)  # axes (0, 2) flattened in that order: rows
        np.testing.assert_allclose(u["four"][:, j], _ns(matrix).reshape(4, 3, 5), rtol=1e-5, atol=1e-6)
    # Output axes listed in another order than the leaf's: the matrix's columns follow the order given.
    swapped = ux.scale_by_newton_schulz(weight_dimension_numbers=D(0, (2, 1)))
    x = jnp.asarray(rng.normal(size=(6, 2, 3)), jnp.float32)
    expected = _ns(x.transpose(0, 2, 1).reshape(6, 6)).reshape(6, 3, 2).transpose(0, 2, 1)
    np.testing.assert_allclose(swapped.update(x, swapped.init(None))[0], expected, rtol=1e-5, atol=1e-6)


def test_stacked_layers_step_as_separate_leaves_adaptive_included():
    """A stack of layers with dimension numbers is the same optimizer as its layers as separate 2-D leaves."""
    rng = np.random.default_rng(1)
    grads = [jnp.asarray(rng.normal(size=(3, 4, 6)), jnp.float32) for _ in range(4)]
    stacked = ux.scale_by_muon(beta=0.8, adaptive=True, weight_dimension_numbers=D(1, 2))
    apart = ux.scale_by_muon(beta=0.8, adaptive=True)
    s1, s2 = stacked.init(grads[0]), apart.init(list(grads[0]))
    for g in grads:
        u1, s1 = stacked.update(g, s1)
        u2, s2 = apart.update(list(g), s2)
        np.testing.assert_allclose(u1, jnp.stack(u2), rtol=1e-5, atol=1e-6)


def _ns64(x, steps=5):
    """Newton-Schulz in float64 NumPy, as Jordan's Muon writes it."""
    a, b, c = NS_COEFFS
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / (np.linalg.norm(x) + 1e-8)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def test_adaptive_muon_on_a_batch_follows_the_paper_per_matrix():
    """Bernstein & Newhouse's step for one matrix is ``<G, UVᵀ>·UVᵀ`` (the nuclear norm of G times its polar
    factor, Newton-Schulz standing in for UVᵀ); each matrix of a batch takes its own. A float64 NumPy
    transcription of that rule, 20 steps, Nesterov momentum."""
    beta, shape = 0.9, (3, 6, 4)  # three tall matrices
    rng = np.random.default_rng(2)
    grads = [rng.normal(size=shape) * (1.0 + 0.5 * np.sin(t)) for t in range(STEPS)]
    opt = ux.scale_by_muon(beta=beta, adaptive=True, weight_dimension_numbers=D(1, 2))
    step = jax.jit(opt.update, compiler_options=DEFAULT_COMPILE)  # (see _parity)
    state = opt.init(jnp.zeros(shape, jnp.float32))
    m, worst = np.zeros(shape), 0.0
    for t, g in enumerate(grads, start=1):
        u, state = step(jnp.asarray(g, jnp.float32), state)
        m = beta * m + (1 - beta) * g
        m_hat = beta * m / (1 - beta ** (t + 1)) + (1 - beta) * g / (1 - beta**t)
        expected = np.stack([np.sum(mh * o) * o for mh, o in ((mh, _ns64(mh)) for mh in m_hat)])
        # float32 against float64: atol relative to the leaf's largest value (the dual norm scales it up to ~5)
        scale = float(np.max(np.abs(expected)))
        np.testing.assert_allclose(u, expected, rtol=TOL["rtol"], atol=TOL["atol"] * scale, err_msg=f"step {t}")
        worst = max(worst, float(np.max(np.abs(np.asarray(u, np.float64) - expected))) / scale)
    print(f"worst deviation relative to the largest entry: {worst:.2e}")
    assert worst < 5e-6
    # optax 0.2.8 sums <m̂, u> over the whole leaf: every matrix of the stack gets the stack's total.
    theirs = optax.contrib.scale_by_muon(beta=beta, adaptive=True,
                                         weight_dimension_numbers=optax.contrib.MuonDimensionNumbers(1, 2))
    u_theirs, _ = theirs.update(jnp.asarray(grads[0], jnp.float32), theirs.init(jnp.zeros(shape, jnp.float32)))
    ours, _ = opt.update(jnp.asarray(grads[0], jnp.float32), opt.init(jnp.zeros(shape, jnp.float32)))
    orthogonal = _ns(jnp.asarray(grads[0], jnp.float32)[0])
    ratio = float(jnp.sum(u_theirs[0] * orthogonal) / jnp.sum(ours[0] * orthogonal))
    totals = [float(np.sum(g * _ns64(g))) for g in grads[0]]
    np.testing.assert_allclose(ratio, sum(totals) / totals[0], rtol=1e-4)


def test_scale_by_shape_uses_the_sizes_of_the_reduction_and_output_axes():
    x = jnp.ones((2, 3, 4, 5))
    for dims, factor in [(D((0, 2), 3), 1.0), (D(3, (1, 2)), (12 / 5) ** 0.5), (D(1, 3), (5 / 3) ** 0.5)]:
        opt = ux.scale_by_shape(weight_dimension_numbers={"x": dims, "b": None})
        u = opt.update({"x": x, "b": jnp.ones(3)}, opt.init(None))[0]
        np.testing.assert_allclose(u["x"], factor * x, rtol=1e-6)
        np.testing.assert_array_equal(u["b"], jnp.ones(3))


# --------------------------------------------------------------------------
# The default is unchanged


def _matrices_2d(params):
    return jax.tree.map(lambda p: D() if p.ndim == 2 else None, params)


def test_no_dimension_numbers_means_the_2d_leaves_and_prints_as_before():
    assert repr(ux.scale_by_muon()) == ("scale_by_muon(ns_coeffs=(3.4445, -4.775, 2.0315), ns_steps=5, beta=0.95, "
                                        "eps=1e-08, nesterov=True)")
    assert repr(ux.scale_by_shape()) == "scale_by_shape()"
    assert ux.scale_by_muon(adaptive=False) == ux.scale_by_muon()
    assert ux.optimizers.muon(adaptive=False, weight_dimension_numbers=None) == ux.optimizers.muon()
    assert "adaptive=True" in repr(ux.scale_by_muon(adaptive=True))
    params = _tree(0)
    for default, explicit in [(ux.scale_by_muon(), ux.scale_by_muon(weight_dimension_numbers=_matrices_2d)),
                              (ux.scale_by_newton_schulz(),
                               ux.scale_by_newton_schulz(weight_dimension_numbers=_matrices_2d)),
                              (ux.scale_by_shape(), ux.scale_by_shape(weight_dimension_numbers=_matrices_2d))]:
        a = default.update(_tree(1), default.init(params), params)[0]
        b = explicit.update(_tree(1), explicit.init(params), params)[0]
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_array_equal(x, y)


def test_dimension_numbers_are_static_printed_and_compared():
    opt = ux.scale_by_muon(weight_dimension_numbers={"w": D([1], (2,)), "b": None})
    assert repr(opt).endswith("weight_dimension_numbers={'b': None, 'w': MuonDimensionNumbers(reduction_axis=(1,), "
                              "output_axis=(2,))})")
    assert opt == ux.scale_by_muon(weight_dimension_numbers={"b": None, "w": D((1,), (2,))})
    assert hash(opt) == hash(ux.scale_by_muon(weight_dimension_numbers={"b": None, "w": D((1,), (2,))}))
    assert opt != ux.scale_by_muon(weight_dimension_numbers={"w": D(1, 2), "b": None})
    assert jax.tree.leaves(opt) == jax.tree.leaves(ux.scale_by_muon())  # no axis is a traced leaf
    labels = ux.optimizers.muon(weight_dimension_numbers=_last_two).stages[0].option("labels")
    assert labels(_tree(0))["stack"] == "muon" and labels(_tree(0))["dense"]["b"] == "adam"
    assert repr(labels) == "muon_groups(test_muon_dims._last_two)"


# --------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("build, exc, message", [
    (lambda: ux.scale_by_muon(weight_dimension_numbers={"w": (0, 1)}), TypeError,
     (r"^scale_by_muon\(weight_dimension_numbers=\{'w': \(0, 1\)\}\): weight_dimension_numbers must be a pytree of "
      r"MuonDimensionNumbers or None, or a function of the params returning one; at \['w'\]\[0\] it has int 0")),
    (lambda: ux.scale_by_newton_schulz(weight_dimension_numbers=D(0, 0)), ValueError,
     (r"^scale_by_newton_schulz\(weight_dimension_numbers=MuonDimensionNumbers\(reduction_axis=0, output_axis=0\)\): "
      r"weight_dimension_numbers must name different axes on each side: at the root it is")),
    (lambda: ux.scale_by_shape(weight_dimension_numbers={"w": D((0, 0), 1)}), ValueError,
     r"weight_dimension_numbers names an axis twice: at \['w'\] reduction_axis is \(0, 0\)"),
    (lambda: ux.optimizers.muon(weight_dimension_numbers={"w": D(0.5, 1)}), TypeError,
     (r"^muon\(weight_dimension_numbers=.*\): weight_dimension_numbers must hold integer axes: at \['w'\] "
      r"reduction_axis has 0.5")),
    (lambda: ux.scale_by_muon(weight_dimension_numbers=D((), 1)), TypeError, r"reduction_axis is empty"),
    (lambda: ux.scale_by_muon(adaptive=1), TypeError, r"^scale_by_muon\(adaptive=1\): adaptive must be True or False"),
])
def test_bad_dimension_numbers_are_refused_when_built(build, exc, message):
    with pytest.raises(exc, match=message):
        build()


@pytest.mark.parametrize("dims, message", [
    ({"w": D(0, 3), "b": None}, (r"^scale_by_muon: weight_dimension_numbers\['w'\] is MuonDimensionNumbers"
                                 r"\(reduction_axis=0, output_axis=3\), but updates\['w'\] has shape \(2, 3\): an axis "
                                 r"is out of range")),
    ({"w": D(0, -2), "b": None}, r"names axis 0 on both sides for updates\['w'\] of shape \(2, 3\)"),
    ({"w": D(), "b": D()}, r"updates\['b'\] has shape \(3,\): an axis is out of range"),
    ({"v": D()}, (r"^scale_by_muon: weight_dimension_numbers does not match the updates: \['b'\] is in updates but "
                  r"not in weight_dimension_numbers")),
    (lambda p: {"w": D(), "b": 3}, (r"^scale_by_muon\(weight_dimension_numbers\(params\)=.*\): "
                                    r"weight_dimension_numbers\(params\) must be a pytree of MuonDimensionNumbers")),
], ids=["out_of_range", "both_sides", "vector", "other_tree", "function_result"])
def test_dimension_numbers_that_do_not_fit_the_updates_name_the_leaf(dims, message):
    opt = ux.scale_by_muon(weight_dimension_numbers=dims)
    g = {"w": jnp.ones((2, 3)), "b": jnp.ones(3)}
    with pytest.raises((ValueError, TypeError), match=message):
        jax.jit(opt.update)(g, opt.init(g))


def test_a_prefix_applies_to_its_subtree_and_none_subtrees_are_skipped():
    g = {"block": {"q": jnp.ones((2, 3, 4)), "k": jnp.ones((2, 3, 4))}, "b": jnp.ones(4), "gone": None}
    opt = ux.scale_by_newton_schulz(weight_dimension_numbers={"block": D(1, 2), "b": None, "gone": D()})
    u = opt.update(g, opt.init(None))[0]
    np.testing.assert_allclose(u["block"]["q"][1], _ns(jnp.ones((3, 4))), rtol=1e-6)
    np.testing.assert_array_equal(u["b"], g["b"])


# --------------------------------------------------------------------------
# Many devices: batch axes keep their sharding, the matrix axes are gathered and split again

_SHARDED = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    import updax as ux

    D = ux.MuonDimensionNumbers
    SPECS = {"stack": P("data", "model", None), "heads": P(None, "model", "data", None), "w": P("data", "model"),
             "b": P("model")}
    SHAPES = {"stack": (4, 6, 8), "heads": (3, 4, 8, 2), "w": (8, 6), "b": (6,)}
    DIMS = {"stack": D(1, 2), "heads": D(0, (2, 3)), "w": D(), "b": None}

    def tree(seed):
        rng = np.random.default_rng(seed)
        return {k: jnp.asarray(rng.normal(size=s), jnp.float32) for k, s in SHAPES.items()}

    def spec(x):
        return str(tuple(x.sharding.spec) + (None,) * (x.ndim - len(x.sharding.spec)))

    def run(opt, mesh=None):
        params, grads = tree(0), [tree(t) for t in (1, 2, 3)]
        if mesh is not None:
            put = lambda t: {k: jax.device_put(v, NamedSharding(mesh, SPECS[k])) for k, v in t.items()}
            params, grads = put(params), [put(g) for g in grads]
        step, state, outs = jax.jit(opt.update), opt.init(params), []
        for g in grads:
            u, state = step(g, state, params)
            outs.append(u)
        return params, outs, state

    builds = {"muon": lambda: ux.optimizers.muon(0.1, adaptive=True, weight_dimension_numbers=DIMS),
              "scale_by_newton_schulz": lambda: ux.scale_by_newton_schulz(weight_dimension_numbers=DIMS),
              "muon_spectral": lambda: ux.optimizers.muon(0.1, ns_coeffs="dion", preconditioning="spectral",
                                                          consistent_rms=0.2, weight_dimension_numbers=DIMS),
              "scale_by_newton_schulz_aol": lambda: ux.scale_by_newton_schulz(preconditioning="aol",
                                                                              weight_dimension_numbers=DIMS)}
    for name, build in builds.items():
        _, expected, _ = run(build())
        for axis_type in (AxisType.Explicit, AxisType.Auto):
            mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(axis_type,) * 2)
            result = {"name": name, "mesh": axis_type.name}
            try:
                with jax.set_mesh(mesh):
                    params, outs, state = run(build(), mesh)
                problems = [f"updates[{k!r}]: {spec(u)}, its param {spec(params[k])}"
                            for k, u in outs[-1].items() if spec(u) != spec(params[k])]
                error = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) / float(np.max(np.abs(b)))
                            for out, ref in zip(outs, expected) for a, b in zip(jax.tree.leaves(out),
                                                                                jax.tree.leaves(ref)))
                result.update(problems=problems, error=error)
            except Exception as e:
                result.update(problems=[f"{type(e).__name__}: {e}"], error=None)
            print("RESULT " + json.dumps(result), flush=True)
""")


def test_batches_of_matrices_on_explicit_and_auto_meshes():
    """Default Muon and Newton-Schulz, and the spectral (an SVD of each gathered matrix) and AOL modes."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} {host_devices(8)}"
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", _SHARDED], check=False, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"})
    results = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 8, done.stderr[-3000:]
    for r in results:
        assert r["problems"] == [], r
        assert r["error"] < 1e-5, r
