"""GaLore (Zhao et al. 2024): parity with optax.contrib's ``scale_by_galore`` and ``galore`` over 24 jitted steps
on a nested tree (matrices with the projector on either side, a 3-axis leaf made a matrix by dimension numbers,
vectors, a scalar, None) across three projector refreshes, with the built-in Adam and with a ``base_optimizer``;
the projector's refresh schedule and orthonormality;
a batch of matrices equal to its matrices one by one; zero, rank-deficient and failed-SVD gradients giving no
NaN; state dtypes for bfloat16 params; errors naming the option.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest

import updax as ux
from updax.updates import _galore

D = ux.MuonDimensionNumbers
STEPS, GAP, RANK = 24, 8, 3  # refreshes at steps 1, 9 and 17
TOL = dict(rtol=1e-5, atol=1e-6)


def _tree(seed):
    """Matrices (6, 4): left projector; (3, 5): right, rank 3 = its smaller side; (2, 7): rank clipped to 2;
    a (4, 2, 3) leaf whose axes 1 and 2 are the columns: a (4, 6) matrix, right; vectors, a scalar, None."""
    rng = np.random.default_rng(seed)

    def arr(*shape):
        return jnp.asarray(rng.normal(size=shape), jnp.float32)

    return {"enc": {"w": arr(6, 4), "b": arr(4)}, "dec": [arr(3, 5), (arr(2, 7), None)],
            "attn": arr(4, 2, 3), "scalar": arr(), "nothing": None}


def _dims(cls):
    return {"enc": {"w": cls(0, 1), "b": None}, "dec": [cls(0, 1), (cls(0, 1), None)], "attn": cls(0, (1, 2)),
            "scalar": None, "nothing": None}


def _without_none(tree):
    """The tree with its None leaves dropped: optax 0.2.8's GaLore fails on them (it reads a None's dtype)."""
    return {"enc": tree["enc"], "dec": [tree["dec"][0], tuple(x for x in tree["dec"][1] if x is not None)],
            "attn": tree["attn"], "scalar": tree["scalar"]}


def _optax_dims(params):
    return _without_none(_dims(optax.contrib.GaLoreDimensionNumbers))


def _run(opt, params, steps=STEPS, apply=ux.apply_updates, grads=_tree):
    """``steps`` jitted steps on the gradients ``grads(t + 1)``; each step's updates and the last state."""
    state, step, out = opt.init(params), jax.jit(opt.update), []
    for t in range(steps):
        u, state = step(grads(t + 1), state, params)
        params = apply(params, u)
        out.append(u)
    return out, state, params


def _assert_same(ours, theirs):
    """Step by step, leaf by leaf (the same leaves in the same order: optax's tree is ours without its Nones)."""
    for t, (u1, u2) in enumerate(zip(ours, theirs)):
        assert len(jax.tree.leaves(u1)) == len(jax.tree.leaves(u2))
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            np.testing.assert_allclose(x, y, **TOL, err_msg=f"step {t + 1}")


# --------------------------------------------------------------------------
# Parity with optax.contrib


@pytest.mark.parametrize("scale, b1, b2, eps_root", [(1.0, 0.9, 0.999, 0.0), (0.25, 0.8, 0.95, 1e-6)])
def test_scale_by_galore_matches_optax_over_24_steps_and_three_refreshes(scale, b1, b2, eps_root):
    ours = ux.scale_by_galore(rank=RANK, update_proj_gap=GAP, scale=scale, b1=b1, b2=b2, eps_root=eps_root,
                              weight_dimension_numbers=_dims(D))
    theirs = optax.contrib.scale_by_galore(
        rank=RANK, update_proj_gap=GAP, scale=scale, base_optimizer=optax.scale_by_adam(b1, b2, eps_root=eps_root),
        weight_dimension_numbers=_optax_dims)
    u1, s1, _ = _run(ours, _tree(0))
    u2, s2, _ = _run(theirs, _without_none(_tree(0)), apply=optax.apply_updates,
                     grads=lambda t: _without_none(_tree(t)))
    _assert_same(u1, u2)
    # the same projectors (optax's for the vectors are (0, 0) placeholders) and projected moments
    for name in ("enc", "dec", "attn"):
        for q1, q2 in zip(jax.tree.leaves(ours.get_state(s1, "scale_by_galore.projector")[name]),
                          jax.tree.leaves(s2.projector[name])):
            if q2.size:
                np.testing.assert_allclose(q1, q2, **TOL)
    shapes = jax.tree.map(jnp.shape, ours.get_state(s1, "scale_by_galore.mu"))
    assert shapes == {"enc": {"w": (3, 4), "b": (4,)}, "dec": [(3, 3), ((2, 2), None)], "attn": (4, 3),
                      "scalar": (), "nothing": None}
    assert jax.tree.map(jnp.shape, s2.base_optimizer_state.mu) == _without_none(shapes)


@pytest.mark.parametrize("ours_base, theirs_base", [
    (lambda: ux.scale_by_lion(b1=0.9, b2=0.99), lambda: optax.scale_by_lion(b1=0.9, b2=0.99)),
    (lambda: ux.scale_by_rms(decay=0.9, eps=1e-8).trace(decay=0.8),
     lambda: optax.chain(optax.scale_by_rms(decay=0.9, eps=1e-8), optax.trace(decay=0.8))),
], ids=["lion", "rms-trace"])
def test_a_base_optimizer_matches_optax_over_24_steps_and_three_refreshes(ours_base, theirs_base):
    """optax's base_optimizer: the pipeline runs on the projected matrices and the other leaves, its state on the
    projected shapes, read by path."""
    ours = ux.scale_by_galore(rank=RANK, update_proj_gap=GAP, scale=0.25, weight_dimension_numbers=_dims(D),
                              base_optimizer=ours_base())
    theirs = optax.contrib.scale_by_galore(rank=RANK, update_proj_gap=GAP, scale=0.25, base_optimizer=theirs_base(),
                                           weight_dimension_numbers=_optax_dims)
    u1, s1, _ = _run(ours, _tree(0))
    u2, s2, _ = _run(theirs, _without_none(_tree(0)), apply=optax.apply_updates,
                     grads=lambda t: _without_none(_tree(t)))
    _assert_same(u1, u2)
    label = ours.stages[0].option("base_optimizer").stages[0].label
    field = "mu" if label == "scale_by_lion" else "nu"
    moment = ours.get_state(s1, f"scale_by_galore/{label}.{field}")
    assert jax.tree.map(jnp.shape, moment) == {"enc": {"w": (3, 4), "b": (4,)}, "dec": [(3, 3), ((2, 2), None)],
                                               "attn": (4, 3), "scalar": (), "nothing": None}
    theirs_state = s2.base_optimizer_state if label == "scale_by_lion" else s2.base_optimizer_state[0]
    for x, y in zip(jax.tree.leaves(moment), jax.tree.leaves(getattr(theirs_state, field))):
        np.testing.assert_allclose(x, y, **TOL)
    assert type(s1[0]).__name__ == "ScaleByGaloreBaseState"


def test_a_base_optimizer_gets_the_extra_arguments_and_the_built_in_adam_is_the_scale_by_adam_base():
    """With ``scale_by_adam`` as its base GaLore is its built-in Adam; a base taking the loss gets it."""
    builtin = ux.scale_by_galore(rank=RANK, update_proj_gap=GAP, weight_dimension_numbers=_dims(D))
    based = ux.scale_by_galore(rank=RANK, update_proj_gap=GAP, weight_dimension_numbers=_dims(D),
                               base_optimizer=ux.scale_by_adam())
    _assert_same(_run(builtin, _tree(0))[0], _run(based, _tree(0))[0])
    polyak = ux.scale_by_galore(rank=1, base_optimizer=ux.scale_by_polyak(max_learning_rate=10.0))
    g = {"w": jnp.array([[2.0, 0.0], [0.0, 1.0], [0.0, 0.0]])}
    u, _ = polyak.update(g, polyak.init(g), loss=jnp.float32(3.0))
    # rank 1: the projected gradient is [2, 0] (the top singular direction); Polyak's step (f - 0)/|r|² r = 3/4 r
    np.testing.assert_allclose(u["w"], [[1.5, 0.0], [0.0, 0.0], [0.0, 0.0]], atol=1e-6)


@pytest.mark.parametrize("options, exc, message", [
    (dict(base_optimizer=ux.scale_by_lion(), b1=0.5), ValueError,
     "scale_by_galore(b1=0.5): b1 is the built-in Adam's: with base_optimizer, set it on the base"),
    (dict(base_optimizer=ux.scale_by_lion(), mu_dtype=jnp.bfloat16), ValueError, "mu_dtype is the built-in Adam's"),
    (dict(base_optimizer=ux.scale_by_adam().add_decayed_weights(0.1)), ValueError,
     "base_optimizer must not need params (add_decayed_weights does): it runs on the projected gradients"),
    (dict(base_optimizer=ux.add_decayed_weights(0.1).apply_if_finite()), ValueError,  # (a wrapper's pipeline)
     "base_optimizer must not need params (apply_if_finite does)"),
    (dict(base_optimizer=optax.scale_by_lion()), TypeError, "base_optimizer must be an update object or None"),
])
def test_a_bad_base_optimizer_is_refused_by_name(options, exc, message):
    with pytest.raises(exc, match=message.replace("(", r"\(").replace(")", r"\)")):
        ux.scale_by_galore(**options)


def test_default_dimension_numbers_are_the_2d_leaves_as_optax():
    """None: every leaf with two axes is an (in, out) matrix; the 3-axis leaf takes Adam (and no scale)."""
    ours = ux.scale_by_galore(rank=2, update_proj_gap=5, scale=0.5)
    theirs = optax.contrib.scale_by_galore(rank=2, update_proj_gap=5, scale=0.5)
    u1, _, _ = _run(ours, _tree(0), steps=20)
    u2, _, _ = _run(theirs, _without_none(_tree(0)), steps=20, apply=optax.apply_updates,
                    grads=lambda t: _without_none(_tree(t)))
    _assert_same(u1, u2)


@pytest.mark.parametrize("ours_base, theirs_base", [
    (lambda: None, lambda: None),
    (lambda: ux.scale_by_lion(b1=0.9, b2=0.99), lambda: optax.scale_by_lion(b1=0.9, b2=0.99)),
], ids=["adam", "lion base"])
def test_the_optimizer_matches_optax_galore_with_weight_decay(ours_base, theirs_base):
    ours = ux.optimizers.galore(0.05, rank=RANK, update_proj_gap=GAP, decay=0.1, weight_dimension_numbers=_dims(D),
                                base_optimizer=ours_base())
    theirs = optax.contrib.galore(0.05, rank=RANK, update_proj_gap=GAP, weight_decay=0.1,
                                  base_optimizer=theirs_base(), weight_dimension_numbers=_optax_dims(None))
    u1, _, p1 = _run(ours, _tree(0))
    u2, _, p2 = _run(theirs, _without_none(_tree(0)), apply=optax.apply_updates,
                     grads=lambda t: _without_none(_tree(t)))
    _assert_same(u1, u2)
    for x, y in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_allclose(x, y, **TOL)


def test_the_optimizer_is_its_pipeline():
    opt = ux.optimizers.galore(0.1, rank=2, update_proj_gap=3, scale=0.5, decay=0.01)
    pipe = (ux.scale_by_galore(rank=2, update_proj_gap=3, scale=0.5).add_decayed_weights(0.01)
            .scale_by_learning_rate(0.1))
    assert opt == pipe
    u1, _, _ = _run(opt, _tree(0), steps=4)
    u2, _, _ = _run(pipe, _tree(0), steps=4)
    _assert_same(u1, u2)


# --------------------------------------------------------------------------
# The projector


def test_the_projector_is_refreshed_on_steps_one_and_every_gap_after_and_is_orthonormal():
    opt = ux.scale_by_galore(rank=2, update_proj_gap=3)
    params = {"w": jnp.zeros((5, 3)), "v": jnp.zeros((3, 5))}
    state, seen = opt.init(params), []
    for t in range(7):
        rng = np.random.default_rng(t)
        g = {"w": jnp.asarray(rng.normal(size=(5, 3)), jnp.float32),
             "v": jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)}
        _, state = opt.update(g, state)
        q = opt.get_state(state, "scale_by_galore.projector")
        seen.append(q)
        for name, x in g.items():
            np.testing.assert_allclose(q[name].T @ q[name], np.eye(2), atol=1e-5)
            if t % 3 == 0:  # a refresh step: the top singular vectors of this step's gradient
                u, _, vt = np.linalg.svd(np.asarray(x, np.float64))
                top = u[:, :2] if name == "w" else vt[:2].T
                np.testing.assert_allclose(np.abs(q[name].T @ top), np.eye(2), atol=1e-5)
    for t in range(1, 7):
        same = all(np.array_equal(seen[t][k], seen[t - 1][k]) for k in ("w", "v"))
        assert same == (t % 3 != 0), t


def test_each_matrix_of_a_batch_has_its_own_projector():
    """A leaf (2, 5, 3) with axis 0 a batch: the same as its two (5, 3) matrices as separate leaves."""
    rng = np.random.default_rng(0)
    gs = [jnp.asarray(rng.normal(size=(2, 5, 3)), jnp.float32) for _ in range(6)]
    batched = ux.scale_by_galore(rank=2, update_proj_gap=4, weight_dimension_numbers={"w": D(1, 2)})
    split = ux.scale_by_galore(rank=2, update_proj_gap=4)
    u1, s1, _ = _run(batched, {"w": gs[0]}, steps=6, grads=lambda t: {"w": gs[t - 1]})
    u2, _, _ = _run(split, {"w": list(gs[0])}, steps=6, grads=lambda t: {"w": list(gs[t - 1])})
    for a, b in zip(u1, u2):
        np.testing.assert_allclose(a["w"], jnp.stack(b["w"]), **TOL)
    assert batched.get_state(s1, "scale_by_galore.projector")["w"].shape == (2, 5, 2)
    assert batched.get_state(s1, "scale_by_galore.mu")["w"].shape == (2, 2, 3)


# --------------------------------------------------------------------------
# Degenerate gradients


@pytest.mark.parametrize("shape", [(6, 4), (4, 6)])
def test_zero_and_rank_deficient_gradients_give_orthonormal_projectors_and_no_nan(shape):
    opt = ux.scale_by_galore(rank=3, update_proj_gap=2)
    state = opt.init({"w": jnp.zeros(shape)})
    rank_one = np.outer(np.arange(1.0, shape[0] + 1), np.ones(shape[1]))
    for g in (np.zeros(shape), rank_one, np.zeros(shape), rank_one):
        u, state = jax.jit(opt.update)({"w": jnp.asarray(g, jnp.float32)}, state)
        q = opt.get_state(state, "scale_by_galore.projector")["w"]
        assert np.all(np.isfinite(u["w"])) and np.all(np.isfinite(q))
        np.testing.assert_allclose(q.T @ q, np.eye(3), atol=1e-5)
    u, state = opt.update({"w": jnp.zeros(shape)}, opt.init({"w": jnp.zeros(shape)}))
    np.testing.assert_array_equal(u["w"], 0.0)  # a zero matrix keeps a zero update


def test_a_failed_svd_of_a_finite_gradient_falls_back_to_the_identity(monkeypatch):
    def failing(x):
        u, s, vh = jnp.linalg.svd(x, full_matrices=False)
        return jnp.full_like(u, jnp.nan), s, jnp.full_like(vh, jnp.nan)

    monkeypatch.setattr(_galore, "_svd", failing)
    opt = ux.scale_by_galore(rank=2, update_proj_gap=5)
    g = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(5, 3)), jnp.float32),
         "v": jnp.asarray(np.random.default_rng(1).normal(size=(3, 5)), jnp.float32)}
    u, state = opt.update(g, opt.init(g))
    q = opt.get_state(state, "scale_by_galore.projector")
    np.testing.assert_array_equal(q["w"], np.eye(5, 2))
    np.testing.assert_array_equal(q["v"], np.eye(5, 2))
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(u))
    # a non-finite gradient is not hidden: its projector and update are NaN
    u, state = opt.update({"w": g["w"].at[0, 0].set(jnp.inf), "v": g["v"]}, opt.init(g))
    assert np.all(np.isnan(opt.get_state(state, "scale_by_galore.projector")["w"]))


def test_the_step_is_differentiable_at_a_zero_gradient():
    """The projector is a constant to derivatives: no NaN from the SVD's derivative at repeated singular values."""
    opt = ux.scale_by_galore(rank=2, update_proj_gap=3, eps_root=1e-8)
    params = {"w": jnp.zeros((4, 3))}

    def f(g):
        u, _ = opt.update({"w": g}, opt.init(params))
        return jnp.sum(u["w"] ** 2)

    d = jax.grad(f)(jnp.zeros((4, 3)))
    assert np.all(np.isfinite(d))


# --------------------------------------------------------------------------
# Dtypes and errors


def test_bfloat16_params_keep_their_dtype_and_float32_state():
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), _tree(0))
    opt = ux.scale_by_galore(rank=2, update_proj_gap=2, weight_dimension_numbers=_dims(D))
    state = opt.init(params)
    for field in ("mu", "nu", "projector"):
        assert {x.dtype for x in jax.tree.leaves(opt.get_state(state, f"scale_by_galore.{field}"))} == {
            jnp.dtype(jnp.float32)}
    u, state = jax.jit(opt.update)(params, state)
    assert jax.tree.map(lambda x: x.dtype, u) == jax.tree.map(lambda x: x.dtype, params)
    low = ux.scale_by_galore(rank=2, mu_dtype=jnp.bfloat16)
    assert low.init({"w": jnp.zeros((3, 2))})[0].mu["w"].dtype == jnp.bfloat16


@pytest.mark.parametrize("options, exc, message", [
    (dict(rank=0), ValueError, "scale_by_galore(rank=0): rank must be a positive integer"),
    (dict(rank=2.0), TypeError, "rank must be a positive integer"),
    (dict(update_proj_gap=0), ValueError, "scale_by_galore(update_proj_gap=0): update_proj_gap must be a positive"),
    (dict(update_proj_gap=-3), ValueError, "update_proj_gap must be a positive integer"),
    (dict(scale=-1.0), ValueError, "scale_by_galore(scale=-1.0): scale must be in [0, inf)"),
    (dict(b1=1.0), ValueError, "b1 must be in [0, 1)"),
    (dict(eps=-1e-8), ValueError, "eps must be in [0, inf)"),
    (dict(weight_dimension_numbers={"w": (0, 1)}), TypeError, "weight_dimension_numbers"),
    (dict(weight_dimension_numbers={"w": D(0, 0)}), ValueError, "weight_dimension_numbers"),
])
def test_bad_options_are_refused_by_name(options, exc, message):
    with pytest.raises(exc, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ux.scale_by_galore(**options)


def test_dimension_numbers_that_do_not_fit_name_the_leaf_and_complex_updates_are_refused():
    opt = ux.scale_by_galore(weight_dimension_numbers={"w": D(0, 2)})
    with pytest.raises(ValueError, match=r"scale_by_galore: weight_dimension_numbers\['w'\].*out of range"):
        opt.init({"w": jnp.zeros((3, 2))})
    opt = ux.scale_by_galore(rank=1)
    with pytest.raises(TypeError, match="scale_by_galore"):
        opt.update({"w": jnp.zeros((3, 2), jnp.complex64)}, opt.init({"w": jnp.zeros((3, 2))}))
