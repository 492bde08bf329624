"""NorMuon (Li et al. 2025, arXiv 2510.05491): ``scale_by_normuon`` and ``optimizers.normuon``.

Against a float64 NumPy transcription of the paper's Algorithm 1 over 20 steps on a nested tree (matrices both
ways round, stacked layers with dimension numbers; the other leaves against optax's AdamW), with and without
Nesterov's momentum; the paper's reduction cases (``beta2 = 0`` puts every output unit at RMS ``rms``; a matrix
whose orthogonalised update has orthonormal columns is Muon with Moonlight's RMS scaling); degenerate updates;
the state's shapes; how it prints and what it refuses.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from compile_options import DEFAULT_COMPILE

import updax as ux

D = ux.MuonDimensionNumbers
JORDAN = (3.4445, -4.7750, 2.0315)
CLASSICAL = (1.875, -1.25, 0.375)
STEPS = 20


def _tree(seed):
    """Matrices wide and tall, three stacked (4, 6) layers, and the leaves Adam takes (a vector, a scalar)."""
    rng = np.random.default_rng(seed)

    def arr(*shape):
        return jnp.asarray(rng.normal(size=shape), jnp.float32)

    return {"dense": {"w": arr(3, 5), "b": arr(5)}, "tall": arr(7, 2), "stack": arr(3, 4, 6),
            "blocks": [(arr(4), arr())]}


DIMS = {"dense": {"w": D(), "b": None}, "tall": D(), "stack": D(1, 2), "blocks": None}


# --------------------------------------------------------------------------
# The paper's algorithm, in float64


def _newton_schulz(x, eps, coeffs=(JORDAN,) * 5):
    x = np.asarray(x, np.float64)
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / (np.linalg.norm(x) + eps)
    for a, b, c in coeffs:
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


class _NorMuon:
    """Algorithm 1 of the paper on one matrix ``W`` of shape ``(d_in, d_out)`` (the paper writes ``Wᵀ``, an
    ``m × n`` matrix of ``m = d_out`` neurons): ``M ← β₁M + (1-β₁)G``, ``O = NS(M)``, ``v ← β₂v + (1-β₂)
    mean_cols(O²)`` (a mean over each neuron's inputs), ``Ô = O / (√v + ε)``, ``η̂ = 0.2·η·√(mn) / ‖Ô‖_F``,
    ``W ← W - ηλW - η̂·Ô``. With ``nesterov``, ``O`` is of Nesterov's bias-corrected look-ahead (Muon's) instead
    of ``M``."""

    def __init__(self, lr, beta1, beta2, eps, decay, rms, nesterov):
        self.lr, self.beta1, self.beta2, self.eps, self.decay, self.rms = lr, beta1, beta2, eps, decay, rms
        self.nesterov, self.m, self.v, self.t = nesterov, 0.0, 0.0, 0

    def step(self, w, g):
        g = np.asarray(g, np.float64)
        self.t += 1
        self.m = self.beta1 * self.m + (1 - self.beta1) * g
        if self.nesterov:
            b, t = self.beta1, self.t
            x = b * self.m / (1 - b ** (t + 1)) + (1 - b) * g / (1 - b**t)
        else:
            x = self.m
        o = _newton_schulz(x, self.eps).T  # the paper's layout: one row per neuron
        self.v = self.beta2 * self.v + (1 - self.beta2) * np.mean(o * o, axis=1, keepdims=True)
        o_hat = o / (np.sqrt(self.v) + self.eps)
        m, n = o.shape
        lr_hat = self.rms * self.lr * np.sqrt(m * n) / np.linalg.norm(o_hat)
        return w - self.lr * self.decay * w - lr_hat * o_hat.T


@pytest.mark.parametrize("nesterov", [False, True])
def test_normuon_follows_the_papers_algorithm_over_20_steps(nesterov):
    """Each matrix (and each layer of the stack) against its own float64 run of Algorithm 1; the vector and the
    scalar against optax's AdamW (NAdamW with Nesterov's momentum), as in Muon. updax bias-corrects the momentum
    also without Nesterov's: Newton-Schulz scales it away (all but ``eps``'s share, 1e-8 of the norm)."""
    lr, beta1, beta2, eps, decay = 0.01, 0.9, 0.8, 1e-8, 0.1
    opt = ux.optimizers.normuon(lr, beta=beta1, beta2=beta2, eps=eps, decay=decay, nesterov=nesterov,
                                weight_dimension_numbers=DIMS, adam_b1=0.8, adam_b2=0.95, adam_decay=0.02)
    adam = optax.adamw(lr, b1=0.8, b2=0.95, eps=eps, weight_decay=0.02, nesterov=nesterov)
    params = _tree(0)
    vectors = {"b": params["dense"]["b"], "blocks": params["blocks"]}
    matrices = {"w": [np.asarray(params["dense"]["w"], np.float64)], "tall": [np.asarray(params["tall"], np.float64)],
                "stack": [np.asarray(layer, np.float64) for layer in params["stack"]]}
    runs = {k: [_NorMuon(lr, beta1, beta2, eps, decay, 0.2, nesterov) for _ in v] for k, v in matrices.items()}
    state, adam_state = opt.init(params), adam.init(vectors)
    step = jax.jit(opt.update, compiler_options=DEFAULT_COMPILE)
    for t in range(STEPS):
        factor = 1.0 + 0.5 * np.sin(t)
        grads = jax.tree.map(lambda g, f=factor: g * f, _tree(t + 1))
        updates, state = step(grads, state, params)
        params = ux.apply_updates(params, updates)
        gm = {"w": [grads["dense"]["w"]], "tall": [grads["tall"]], "stack": list(grads["stack"])}
        matrices = {k: [run.step(w, g) for run, w, g in zip(runs[k], matrices[k], gm[k])] for k in matrices}
        ours = {"w": [params["dense"]["w"]], "tall": [params["tall"]], "stack": list(params["stack"])}
        for k in matrices:
            for w_ours, w_ref in zip(ours[k], matrices[k]):
                np.testing.assert_allclose(w_ours, w_ref, rtol=1e-5, atol=2e-6, err_msg=f"{k} step {t}")
        adam_updates, adam_state = adam.update({"b": grads["dense"]["b"], "blocks": grads["blocks"]}, adam_state,
                                               vectors)
        vectors = optax.apply_updates(vectors, adam_updates)
        for x, y in zip(jax.tree.leaves({"b": params["dense"]["b"], "blocks": params["blocks"]}),
                        jax.tree.leaves(vectors)):
            np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6, err_msg=f"adam step {t}")


# --------------------------------------------------------------------------
# The paper's reduction cases


def _run(opt, grads):
    state = opt.init(grads[0])
    out = []
    step = jax.jit(opt.update)
    for g in grads:
        u, state = step(g, state)
        out.append(u)
    return out, state


def _grads(shape, n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.normal(size=shape), jnp.float32) for _ in range(n)]


@pytest.mark.parametrize("shape, dims", [((3, 8), None), ((8, 3), None), ((2, 4, 6), D(1, 2)),
                                         ((6, 2, 4), D((0, 2), 1))])
def test_beta2_zero_puts_every_output_unit_at_rms(shape, dims):
    """``beta2 = 0``: ``v`` is the step's own mean square per unit, so each unit (column) of each matrix has RMS
    ``rms`` exactly, whatever the matrix."""
    opt = ux.scale_by_normuon(beta2=0.0, rms=0.3, weight_dimension_numbers=dims)
    out, _ = _run(opt, _grads(shape))
    rows = (0,) if dims is None else ((1,) if dims == D(1, 2) else (0, 2))
    for u in out:
        np.testing.assert_allclose(jnp.sqrt(jnp.mean(u**2, axis=rows)), 0.3, rtol=1e-5)


@pytest.mark.parametrize("beta2", [0.5, 0.95])
def test_each_matrix_update_has_rms_exactly_rms(beta2):
    opt = ux.scale_by_normuon(beta2=beta2, rms=0.2, weight_dimension_numbers=D(1, 2))
    out, _ = _run(opt, _grads((3, 5, 4)))
    for u in out:
        np.testing.assert_allclose(jnp.sqrt(jnp.mean(u**2, axis=(1, 2))), 0.2, rtol=1e-5)


@pytest.mark.parametrize("shape", [(6, 3), (5, 5)])
def test_with_orthonormal_columns_normuon_is_muon_at_moonlights_rms(shape):
    """A matrix with at least as many inputs as outputs, Newton-Schulz run to the polar factor: its columns
    (the units) are orthonormal, so every ``v_j`` is equal and NorMuon's step is ``rms·sqrt(d_in·d_out)·O /
    ‖O‖_F = rms·sqrt(max(d_in, d_out))·O``: Muon with ``consistent_rms=rms`` (Liu et al.'s scaling)."""
    exact = dict(ns_coeffs=CLASSICAL, ns_steps=40, beta=0.9, nesterov=False)
    normuon = ux.scale_by_normuon(**exact, beta2=0.7, rms=0.2)
    muon = ux.scale_by_muon(**exact).scale_by_shape(consistent_rms=0.2)
    grads = [g + 3 * jnp.eye(*shape) for g in _grads(shape, n=5, seed=1)]  # well conditioned: NS converges
    for a, b in zip(_run(normuon, grads)[0], _run(muon, grads)[0]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_a_batch_of_matrices_steps_as_its_matrices_apart():
    grads = _grads((3, 4, 6), n=3, seed=2)
    stacked = ux.scale_by_normuon(beta2=0.8, weight_dimension_numbers=D(1, 2))
    apart = ux.scale_by_normuon(beta2=0.8)
    out_stacked, state = _run(stacked, grads)
    out_apart, state_apart = _run(apart, [list(g) for g in grads])
    for a, b in zip(out_stacked, out_apart):
        np.testing.assert_allclose(a, jnp.stack(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stacked.get_state(state, "scale_by_normuon.nu"),
                               jnp.stack(apart.get_state(state_apart, "scale_by_normuon.nu")), rtol=1e-5)


# --------------------------------------------------------------------------
# State, degenerate updates, printing, refusals


def test_the_second_moment_has_one_number_per_output_unit():
    params = {"w": jnp.ones((3, 5)), "stack": jnp.ones((2, 4, 6)), "heads": jnp.ones((4, 2, 3)), "b": jnp.ones(5),
              "s": jnp.ones(())}
    dims = {"w": D(), "stack": D(1, 2), "heads": D(0, (1, 2)), "b": None, "s": None}
    opt = ux.scale_by_normuon(weight_dimension_numbers=dims)
    nu = opt.get_state(opt.init(params), "scale_by_normuon.nu")
    assert {k: v.shape for k, v in nu.items()} == {"w": (1, 5), "stack": (2, 1, 6), "heads": (1, 2, 3), "b": (1,),
                                                   "s": (1,)}
    assert all(v.dtype == jnp.float32 for v in nu.values())
    bf16 = ux.scale_by_normuon().init({"w": jnp.ones((3, 5), jnp.bfloat16)})
    assert ux.scale_by_normuon().get_state(bf16, "scale_by_normuon.nu")["w"].dtype == jnp.float32


def test_zero_updates_a_dead_unit_and_zero_size_leaves_stay_finite():
    opt = ux.scale_by_normuon()
    g = jnp.asarray(np.random.default_rng(3).normal(size=(4, 5)), jnp.float32).at[:, 2].set(0.0)
    grads = {"zero": jnp.zeros((3, 4)), "dead": g, "empty": jnp.zeros((0, 3)), "none": jnp.zeros((3, 0))}
    out, state = _run(opt, [grads] * 3)
    for u in out:
        assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(u))
        np.testing.assert_array_equal(u["zero"], 0.0)
        np.testing.assert_array_equal(u["dead"][:, 2], 0.0)  # a unit that never moved stays still
        assert float(jnp.abs(u["dead"]).max()) > 0
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(state))


def test_zero_eps_on_a_zero_update_gives_nan_as_documented():
    u, _ = _run(ux.scale_by_normuon(eps=0.0), [jnp.zeros((2, 3))])
    assert bool(jnp.all(jnp.isnan(u[0])))


def test_prints_its_options_and_the_optimizer_its_pipeline():
    assert repr(ux.scale_by_normuon()) == ("scale_by_normuon(ns_coeffs=(3.4445, -4.775, 2.0315), ns_steps=5, "
                                           "beta=0.95, beta2=0.95, eps=1e-08, rms=0.2, nesterov=True)")
    assert "preconditioning='aol'" in repr(ux.scale_by_normuon(preconditioning="aol"))
    opt = ux.optimizers.normuon(0.01, decay=0.1)
    from updax.optimizers._orthogonal import _muon_groups

    assert opt == ux.partition({
        "muon": ux.scale_by_normuon().add_decayed_weights(0.1).scale_by_learning_rate(0.01),
        "adam": ux.scale_by_nadam().add_decayed_weights(0.0).scale_by_learning_rate(0.01)}, _muon_groups)


@pytest.mark.parametrize("build, exc, message", [
    (lambda: ux.scale_by_normuon(beta2=1.0), ValueError, "scale_by_normuon(beta2=1.0): beta2 must be in [0, 1)"),
    (lambda: ux.scale_by_normuon(rms=-0.1), ValueError, "scale_by_normuon(rms=-0.1): rms must be in [0, inf)"),
    (lambda: ux.optimizers.normuon(preconditioning="qr"), ValueError,
     "scale_by_normuon(preconditioning='qr'): preconditioning must be 'frobenius' or"),
    (lambda: ux.optimizers.normuon(-1.0), ValueError, "normuon(learning_rate=-1.0): learning_rate must be in"),
], ids=["beta2", "rms", "preconditioning", "learning_rate"])
def test_bad_options_are_refused_by_name(build, exc, message):
    with pytest.raises(exc) as info:
        build()
    assert str(info.value).startswith(message)
