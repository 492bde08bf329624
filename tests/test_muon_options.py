"""Muon's options after optax.contrib 0.2.8: per-iteration Newton-Schulz coefficients and their presets, the four
``preconditioning`` modes, ``consistent_rms``, and the Adam fallback of the other leaves.

Parity with ``optax.contrib.muon`` and ``optax.contrib.scale_by_muon`` over 20 jitted steps on nested trees
(plain matrices, stacked 3-D layers and a 4-D leaf with dimension numbers, vectors and a scalar on the Adam path),
option by option; each mode against a float64 NumPy transcription of its rule (the papers' rescalings, written
here) and against closed forms; degenerate matrices; how the options are checked, printed and compared.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.contrib
import pytest
from compile_options import DEFAULT_COMPILE
from test_muon_dims import _dims, _matrices_only, _matrix_dims, _parity, _tree

import updax as ux

D = ux.MuonDimensionNumbers
OD = optax.contrib.MuonDimensionNumbers
MODES = ["frobenius", "spectral", "aol", "schatten"]
JORDAN = (3.4445, -4.7750, 2.0315)
#: The classical quintic, which converges to the polar factor (its fixed point 1 is stable).
CLASSICAL = (1.875, -1.25, 0.375)
#: Three triples, one per iteration (optax 0.2.8 takes at most ``ns_steps`` of them: 5 by default). The first one's
#: slope at 0 is 4, as Dion's first is: a step carries the last bit of a small singular value further.
PER_STEP = ((4.0, -6.0, 2.5), JORDAN, CLASSICAL)
#: The parities' tolerance. Neither side's program is optax's to the bit even with the default options (a batch of
#: products where optax maps one product over the batch, a sum in another order): test_muon_dims' TOL, with room
#: for the per-iteration coefficients' steeper first step (one element in a few thousand at 3e-5 over 20 steps).
TOL = dict(rtol=5e-5, atol=2e-6)
#: Dion's preset, as optax.contrib names it.
DION = ((4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037), (2.8769, -3.1427, 1.2046),
        (2.8366, -3.0525, 1.2012))


# --------------------------------------------------------------------------
# Parity with optax.contrib.muon: each option on its own, then all together


def _both(ours=None, theirs=None, **shared):
    """``ux.optimizers.muon`` and ``optax.contrib.muon`` with the same options (and each its own extra ones) on the
    dimension numbers of :func:`test_muon_dims._dims`: plain matrices, stacked layers, a 4-D leaf, and None."""
    mine = ux.optimizers.muon(0.02, beta=0.9, eps=1e-7, weight_dimension_numbers=_dims(D), **shared, **(ours or {}))
    ref = optax.contrib.muon(0.02, beta=0.9, eps=1e-7, muon_weight_dimension_numbers=_dims(OD), **shared,
                             **(theirs or {}))
    return mine, ref


#: (The default options' parity on these trees is test_muon_dims'; ``"standard"`` is the default triple, as
#: test_defaults_print_and_compare_as_before_and_presets_are_their_numbers shows.)
OPTIONS = {
    **{f"preconditioning={mode}": dict(preconditioning=mode) for mode in MODES[1:]},
    "ns_coeffs=per_step": dict(ns_coeffs=PER_STEP),
    "ns_coeffs=dion": dict(ns_coeffs="dion"),
    "consistent_rms=0.2": dict(consistent_rms=0.2),
}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_each_option_matches_optax_muon_over_20_steps(name):
    ours, theirs = _both(**OPTIONS[name])
    _parity(ours, theirs, tol=TOL)


def test_all_options_at_once_and_the_adam_fallback_match_optax():
    """Every new option together with the Adam group's own (``adam_*``, the decays, ``nesterov=False``: plain
    AdamW for the other leaves)."""
    shared = dict(ns_coeffs="dion", preconditioning="aol", consistent_rms=0.3, nesterov=False, adam_b1=0.8,
                  adam_b2=0.95, adam_eps_root=1e-12, adam_learning_rate=0.005)
    ours, theirs = _both(dict(decay=0.01, adam_decay=0.02), dict(weight_decay=0.01, adam_weight_decay=0.02), **shared)
    _parity(ours, theirs, tol=TOL)


@pytest.mark.parametrize("mode", ["spectral", "schatten"])
def test_modes_on_the_2d_leaves_of_a_tree_without_dimension_numbers_match_optax(mode):
    """No dimension numbers: the leaves with two axes are Muon's, every other leaf (the stacked ones included)
    Adam's."""
    ours = ux.optimizers.muon(0.02, preconditioning=mode, ns_coeffs=PER_STEP, consistent_rms=0.2)
    theirs = optax.contrib.muon(0.02, preconditioning=mode, ns_coeffs=PER_STEP, consistent_rms=0.2)
    _parity(ours, theirs, tol=TOL)


@pytest.mark.parametrize("mode", MODES)
def test_the_stages_match_optax_scale_by_muon_and_scale_by_shape(mode):
    ours = (ux.scale_by_muon(ns_coeffs=PER_STEP, beta=0.9, preconditioning=mode,
                             weight_dimension_numbers=_matrix_dims(D))
            .scale_by_shape(weight_dimension_numbers=_matrix_dims(D), consistent_rms=0.2))
    theirs = optax.chain(
        optax.contrib.scale_by_muon(ns_coeffs=PER_STEP, beta=0.9, preconditioning=mode,
                                    weight_dimension_numbers=_matrix_dims(OD)),
        optax.contrib._muon.scale_by_shape(weight_dimension_numbers=_matrix_dims(OD), consistent_rms=0.2))
    _parity(ours, theirs, _matrices_only, tol=TOL)


# --------------------------------------------------------------------------
# The rules, in float64: a transcription of each mode's rescaling, and closed forms


def _reference(x, coeffs, mode, eps=1e-8):
    """Newton-Schulz on one matrix in float64 NumPy, as the docstring writes it: the mode's scaling (before, or
    within the first iteration from its Gram matrix), then one quintic step per triple."""
    x = np.asarray(x, np.float64)
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    if mode == "frobenius":
        x = x / (np.sqrt(np.sum(x * x)) + eps)
    elif mode == "spectral":
        x = x / (np.linalg.svd(x, compute_uv=False)[0] + eps)
    for k, (a, b, c) in enumerate(coeffs):
        gram = x @ x.T
        if k == 0 and mode == "aol":  # D = diag(max(sum_j |A_ij|, eps))^(-1/2); X <- D X, A <- D A D
            d = np.maximum(np.abs(gram).sum(axis=1), eps) ** -0.5
            x, gram = d[:, None] * x, d[:, None] * gram * d[None, :]
        elif k == 0 and mode == "schatten":  # s = max(||A||_F, eps)^(1/2), the Schatten-4 norm of X
            s = np.maximum(np.sqrt(np.sum(gram * gram)), eps) ** 0.5
            x, gram = x / s, gram / s**2
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def _ns(x, **options):
    opt = ux.scale_by_newton_schulz(**options)
    return jax.jit(opt.update, compiler_options=DEFAULT_COMPILE)(jnp.asarray(x, jnp.float32), opt.init(None))[0]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(6, 4), (4, 9), (5, 5)])
def test_each_mode_follows_its_float64_rule(mode, shape):
    rng = np.random.default_rng(sum(shape))
    x = rng.normal(size=shape) * np.exp(rng.normal(size=(shape[0], 1)))  # rows of unequal sizes (AOL's case)
    for coeffs, options in [((JORDAN,) * 5, dict()), (PER_STEP, dict(ns_coeffs=PER_STEP)),
                            (DION, dict(ns_coeffs="dion"))]:
        np.testing.assert_allclose(_ns(x, preconditioning=mode, **options), _reference(x, coeffs, mode),
                                   rtol=1e-4, atol=2e-5, err_msg=f"{mode} {coeffs}")


def _quintic(sigma, coeffs):
    a, b, c = coeffs
    return a * sigma + b * sigma**3 + c * sigma**5


@pytest.mark.parametrize("mode, norm", [("frobenius", lambda s: np.sqrt(np.sum(s**2))), ("spectral", np.max),
                                        ("schatten", lambda s: np.sum(s**4) ** 0.25)])
def test_one_iteration_maps_each_singular_value_through_the_quintic(mode, norm):
    """One step of ``(a, b, c)`` on ``U S Vᵀ`` is ``U p(S / ‖X‖) Vᵀ`` with ``p(σ) = aσ + bσ³ + cσ⁵``, ``‖X‖`` the
    mode's norm: Frobenius, spectral (the largest σ), Schatten-4."""
    u, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(5, 3)))
    v, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(3, 3)))
    s = np.array([4.0, 1.0, 0.25])
    x = u @ np.diag(s) @ v.T
    out = _ns(x, ns_coeffs=JORDAN, ns_steps=1, preconditioning=mode)
    expected = u @ np.diag(_quintic(s / norm(s), JORDAN)) @ v.T
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_aol_makes_orthogonal_rows_of_any_sizes_orthonormal_in_its_first_iteration():
    """``X = diag(d) Q`` with orthonormal rows ``Q``: ``A = diag(d²)``, so AOL's ``D = diag(1/d)`` gives ``X = Q``,
    ``A = I``, and one step gives ``(a + b + c) Q`` whatever ``d``; the Frobenius scaling does not."""
    q = np.linalg.qr(np.random.default_rng(2).normal(size=(7, 3)))[0].T  # (3, 7), orthonormal rows
    x = np.diag([100.0, 1.0, 0.01]) @ q
    np.testing.assert_allclose(_ns(x, ns_coeffs=JORDAN, ns_steps=1, preconditioning="aol"), sum(JORDAN) * q,
                               rtol=1e-5, atol=1e-6)
    assert not np.allclose(_ns(x, ns_coeffs=JORDAN, ns_steps=1), sum(JORDAN) * q, atol=1e-2)


def _polar(x):
    u, _, vt = np.linalg.svd(x, full_matrices=False)
    return u @ vt


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_converges_to_a_polar_factor_with_the_classical_quintic(mode):
    """To ``U Vᵀ`` of ``X = U S Vᵀ``, but with AOL: its row scaling changes the matrix, so the iteration converges
    to the polar factor of ``D X`` (of the wide orientation, here ``Xᵀ``)."""
    x = np.random.default_rng(3).normal(size=(6, 4)) + 2 * np.eye(6, 4)  # condition number about 6
    expected = _polar(x)
    if mode == "aol":
        d = np.abs(x.T @ x).sum(axis=1) ** -0.5
        expected = _polar(d[:, None] * x.T).T
        assert not np.allclose(expected, _polar(x), atol=1e-2)
    np.testing.assert_allclose(_ns(x, ns_coeffs=CLASSICAL, ns_steps=30, preconditioning=mode), expected, atol=1e-5)


def test_per_iteration_triples_are_the_single_triple_repeated():
    x = np.random.default_rng(4).normal(size=(3, 2, 5))
    for mode in MODES:
        options = dict(preconditioning=mode, weight_dimension_numbers=D(1, 2))
        np.testing.assert_array_equal(_ns(x, ns_coeffs=(CLASSICAL,) * 3, ns_steps=9, **options),
                                      _ns(x, ns_coeffs=CLASSICAL, ns_steps=3, **options))


def test_consistent_rms_scales_each_matrix_to_that_rms():
    """``ρ·sqrt(max(m, n))``: an orthogonal matrix (RMS ``1/sqrt(max(m, n))``) comes out with RMS ``ρ``, whatever
    its shape; a batch takes its matrices' sizes; other leaves pass."""
    rng = np.random.default_rng(5)
    tall = jnp.asarray(np.linalg.qr(rng.normal(size=(12, 4)))[0], jnp.float32)  # orthonormal columns
    wide = tall.T.reshape(4, 3, 4)  # each (3, 4) of the batch: not orthogonal, scaled by 0.2·2
    opt = ux.scale_by_shape(consistent_rms=0.2, weight_dimension_numbers={"tall": D(), "wide": D(1, 2), "b": None})
    u = opt.update({"tall": tall, "wide": wide, "b": jnp.ones(3)}, opt.init(None))[0]
    assert float(jnp.sqrt(jnp.mean(u["tall"] ** 2))) == pytest.approx(0.2, rel=1e-6)
    np.testing.assert_allclose(u["wide"], 0.2 * 2.0 * wide, rtol=1e-6)
    np.testing.assert_array_equal(u["b"], jnp.ones(3))


def test_consistent_rms_takes_a_schedule_and_can_be_held_in_the_state():
    schedule = ux.schedules.linear_schedule(0.2, 0.1, transition_steps=1)
    opt = ux.scale_by_shape(consistent_rms=schedule)
    g = {"w": jnp.ones((4, 9))}
    state = opt.init(g)
    first, state = opt.update(g, state)
    second, _ = opt.update(g, state)
    np.testing.assert_allclose([first["w"][0, 0], second["w"][0, 0]], [0.2 * 3, 0.1 * 3], rtol=1e-6)
    held = ux.hyperparams_in_state(ux.optimizers.muon(0.1, consistent_rms=0.2))
    path = "partition/muon/scale_by_shape.consistent_rms"
    params = {"w": jnp.ones((3, 4)), "b": jnp.ones(3)}
    state = held.replace_state(held.init(params), path, 0.0)
    u, _ = held.update(jax.tree.map(jnp.ones_like, params), state, params)
    np.testing.assert_array_equal(u["w"], 0.0)
    with pytest.raises(ValueError, match=r"consistent_rms must be in \[0, inf\) \(written by replace_state"):
        held.replace_state(state, path, -1.0)


# --------------------------------------------------------------------------
# Degenerate matrices: zero, rank one, a zero row, very large and very small entries, half precision


@pytest.mark.parametrize("mode", MODES)
def test_degenerate_matrices_give_finite_updates(mode):
    rng = np.random.default_rng(6)
    x = rng.normal(size=(4, 6)).astype(np.float32)
    cases = {"zero": np.zeros((4, 6)), "rank one": np.outer(x[0, :4], x[0]), "zero row": x * [[1], [1], [0], [1]],
             "one entry": np.eye(4, 6) * [[0], [0], [3], [0]], "tiny": x * 1e-30, "large": x * 1e30,
             "zero-size": np.zeros((0, 3))}
    ns = ux.scale_by_newton_schulz(preconditioning=mode)
    step, state = jax.jit(ns.update), ns.init(None)
    for name, g in cases.items():
        u = step({"w": jnp.asarray(g, jnp.float32)}, state)[0]["w"]
        assert bool(jnp.all(jnp.isfinite(u))), (mode, name)
        if name == "zero" or name == "zero row":  # a zero row (or matrix) stays zero
            np.testing.assert_array_equal(np.asarray(u)[np.all(g == 0, axis=1)], 0.0)
        if name == "large" and mode != "frobenius":  # scale-free: as the matrix at ordinary scale
            np.testing.assert_allclose(u, _ns(x, preconditioning=mode), rtol=1e-4, atol=1e-5)
    # Frobenius: a sum of squares past float32's largest number (entries about 1e19 and up) makes the update zero.
    if mode == "frobenius":
        np.testing.assert_array_equal(step({"w": jnp.asarray(x * 1e30)}, state)[0]["w"], 0.0)


@pytest.mark.parametrize("mode", MODES)
def test_zero_eps_on_a_zero_matrix_gives_nan_in_every_mode(mode):
    """As documented: ``eps`` is what keeps a zero matrix's scaling off 0/0 (``tests/test_fuzz.py`` draws it
    above 0)."""
    u = _ns(np.zeros((2, 3)), eps=0.0, preconditioning=mode)
    assert bool(jnp.all(jnp.isnan(u)))


@pytest.mark.parametrize("mode", ["spectral", "aol"])  # (every mode and dtype: tests/test_fuzz.py)
def test_muon_keeps_bfloat16_params_dtypes_and_jit_agrees_with_eager(mode):
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), _tree(0))
    opt = ux.optimizers.muon(0.02, ns_coeffs=PER_STEP, preconditioning=mode, consistent_rms=0.2,
                             weight_dimension_numbers=_dims(D))
    grads = jax.tree.map(lambda x: x.astype(jnp.bfloat16), _tree(1))
    eager, _ = opt.update(grads, opt.init(params), params)
    jitted, _ = jax.jit(opt.update)(grads, opt.init(params), params)
    for e, j, p in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), jax.tree.leaves(params)):
        assert e.dtype == j.dtype == p.dtype
        np.testing.assert_allclose(np.asarray(e, np.float32), np.asarray(j, np.float32), rtol=2e-2, atol=1e-4)
        assert bool(jnp.all(jnp.isfinite(e)))


# --------------------------------------------------------------------------
# Checked by name, printed only when set, compared by value


def test_defaults_print_and_compare_as_before_and_presets_are_their_numbers():
    assert ux.scale_by_muon(preconditioning="frobenius", ns_coeffs="standard") == ux.scale_by_muon()
    assert repr(ux.scale_by_muon(preconditioning="frobenius")) == repr(ux.scale_by_muon())
    assert ux.scale_by_shape(consistent_rms=None) == ux.scale_by_shape()
    assert ux.optimizers.muon(preconditioning="frobenius", consistent_rms=None, ns_coeffs="standard") == \
        ux.optimizers.muon()
    assert ux.scale_by_newton_schulz(ns_coeffs="dion") == ux.scale_by_newton_schulz(ns_coeffs=DION)
    assert ux.scale_by_newton_schulz(ns_coeffs=[list(k) for k in DION]).stages[0].option("ns_coeffs") == DION
    assert repr(ux.scale_by_muon(preconditioning="aol")).endswith("nesterov=True, preconditioning='aol')")
    assert repr(ux.scale_by_shape(consistent_rms=0.2)) == "scale_by_shape(consistent_rms=0.2)"
    assert repr(ux.scale_by_newton_schulz(ns_coeffs=((1.5, -0.5, 0.0),) * 2)) == \
        "scale_by_newton_schulz(ns_coeffs=((1.5, -0.5, 0.0), (1.5, -0.5, 0.0)), ns_steps=5, eps=1e-08)"
    # The coefficients and consistent_rms are numbers (pytree leaves: new values do not recompile); the mode is
    # structure.
    assert jax.tree.leaves(ux.scale_by_newton_schulz(ns_coeffs=DION, preconditioning="aol"))[:15] == \
        [k for triple in DION for k in triple]
    assert ux.scale_by_muon(preconditioning="aol") != ux.scale_by_muon(preconditioning="schatten")


@pytest.mark.parametrize("build, exc, message", [
    (lambda: ux.scale_by_muon(preconditioning="polar"), ValueError,
     ("scale_by_muon(preconditioning='polar'): preconditioning must be 'frobenius' or 'spectral' or 'aol' or "
      "'schatten'")),
    (lambda: ux.scale_by_newton_schulz(preconditioning=1), TypeError,
     ("scale_by_newton_schulz(preconditioning=1): preconditioning must be 'frobenius' or 'spectral' or 'aol' or "
      "'schatten'")),
    (lambda: ux.optimizers.muon(ns_coeffs="muon"), ValueError,
     ("scale_by_muon(ns_coeffs='muon'): ns_coeffs must be a tuple of three finite real numbers, a tuple of such "
      "triples (one per iteration, at most 100), or a preset's name ('standard' or 'dion')")),
    (lambda: ux.scale_by_muon(ns_coeffs=((1.0, 2.0, 3.0), (1.0, 2.0))), TypeError,
     ("scale_by_muon(ns_coeffs=((1.0, 2.0, 3.0), (1.0, 2.0))): ns_coeffs must be a tuple of three finite real "
      "numbers, a tuple of such triples")),
    (lambda: ux.scale_by_muon(ns_coeffs=((1.0, 2.0, float("nan")),)), ValueError,
     "scale_by_muon(ns_coeffs=((1.0, 2.0, nan),)): ns_coeffs must be a tuple of three finite real numbers, a tuple"),
    (lambda: ux.scale_by_newton_schulz(ns_coeffs=(JORDAN,) * 101), ValueError,
     ("2.0315))): ns_coeffs must be a tuple of three finite real numbers, a tuple of such triples (one per "
      "iteration, at most 100)")),
    (lambda: ux.scale_by_newton_schulz(ns_coeffs=3.0), TypeError,
     "scale_by_newton_schulz(ns_coeffs=3.0): ns_coeffs must be a tuple of three finite real numbers, a tuple"),
    (lambda: ux.scale_by_shape(consistent_rms=-0.2), ValueError,
     "scale_by_shape(consistent_rms=-0.2): consistent_rms must be in [0, inf)"),
    (lambda: ux.optimizers.muon(consistent_rms="0.2"), TypeError,
     "scale_by_shape(consistent_rms='0.2'): consistent_rms must be a real number"),
], ids=["mode", "mode_type", "preset", "short_triple", "nan", "too_many", "number", "rms", "rms_type"])
def test_bad_options_are_refused_by_name_when_built(build, exc, message):
    with pytest.raises(exc) as info:
        build()
    assert message in str(info.value)
