"""Gradients through ``update`` are finite wherever the maths is.

Meta-learning, learned optimizers and learning-rate hypergradients
differentiate through the optimizer. For every catalogue entry
(tests/registry.py) a scalar function of the updates of 3 steps (an unrolled
inner loop: ``init``, then each step's updates applied to the params) is
differentiated with respect to the gradients fed in, the params, and every
numeric option of the update object (its learning rate or step size among
them, traced), at random inputs, at zero updates and at zero params.

At a rule's own case split (the trust ratio is 1 when a norm is 0) the
gradient is that of the branch taken, as in optax. :data:`SINGULAR` lists
where a gradient is not finite, and why. Float64 is checked in a subprocess,
since ``JAX_ENABLE_X64`` must be set before JAX starts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import updax as ux
from compile_options import FAST_COMPILE
from conftest import finish, finished, start_float64
from registry import ENTRIES, NEEDS_PARAMS, nested_tree, updates_for

#: Its module-scoped fixture starts a subprocess: with pytest-xdist, one worker runs the whole module, once.
pytestmark = pytest.mark.xdist_group("gradients")

O = ux.optimizers
NAMES = sorted(ENTRIES)
STEPS = 3
LOSS = 1.0  # for reduce_on_plateau; the other stages ignore it


def _tree(seed, dtype=jnp.float32):
    """A matrix and a vector: the kinds of leaf the kernels tell apart, few enough to compile fast."""
    return nested_tree(dtype, seed=seed)["dense"]


def _steps(first_seed, dtype=jnp.float32):
    """``STEPS`` trees stacked along a leading axis, one per step."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *(_tree(first_seed + t, dtype) for t in range(STEPS)))


def _points(dtype=jnp.float32):
    grads, params = _steps(1, dtype), _tree(0, dtype)
    zero_grads, zero_params = jax.tree.map(jnp.zeros_like, grads), jax.tree.map(jnp.zeros_like, params)
    return {"random": (grads, params), "zero updates": (zero_grads, params), "zero params": (grads, zero_params),
            "zeros": (zero_grads, zero_params)}


WEIGHTS = _steps(10)
POINTS = _points()

#: Where the gradient is not finite, and why; checked to be still not finite, so that the list stays honest.
SINGULAR = {
    # Finite in exact arithmetic, not in float32. At g = 0 the second moment is epsilon = 1e-30 (Adafactor's
    # default) and rsqrt's derivative there, 0.5·epsilon^-1.5 = 5e44, overflows float32 (max 3.4e38) before the
    # chain rule multiplies it by the zero tangent of g². The step's own derivative, about 1/sqrt(epsilon) =
    # 1e15, is representable; in float64 the gradient is finite (float64_checks checks it).
    "scale_by_factored_rms": {"zero updates", "zeros"},
}

#: Entries whose step is a loop of data-dependent length (the line searches' ``lax.while_loop``): JAX cannot
#: differentiate it in reverse mode, and says so.
WHILE_LOOPS = {"scale_by_zoom_linesearch", "scale_by_backtracking_linesearch"}

#: Entries whose updates are signs: their derivative is 0 wherever it exists.
PIECEWISE_CONSTANT = {"scale_by_lion", "scale_by_sign"}


def _options(opt):
    """The update object's real-valued options (its pytree leaves), their paths, and a function rebuilding it.

    Integer options (a number of steps, a window, a PRNG key) are not differentiable and stay as they are.
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(opt)
    real = [isinstance(x, float) or (isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.floating))
            for _, x in leaves]
    values = [jnp.asarray(x) for (_, x), r in zip(leaves, real) if r]
    paths = [jax.tree_util.keystr(path) for (path, _), r in zip(leaves, real) if r]

    def rebuild(values):
        it = iter(values)
        return jax.tree.unflatten(treedef, [next(it) if r else x for (_, x), r in zip(leaves, real)])

    return values, paths, rebuild


def _objective(build):
    """``Σ_t <u_t, w_t>`` over ``STEPS`` steps of the update object ``build(options)``, from ``init``."""
    def objective(options, grads, params, weights):
        opt = build(options)

        def step(carry, xs):
            state, params, total = carry
            g, w = xs
            u, state = opt.update(updates_for(opt, g), state, params, loss=LOSS)
            total = total + sum(jnp.vdot(a, b) for a, b in zip(jax.tree.leaves(u), jax.tree.leaves(w)))
            return (state, ux.apply_updates(params, u), total), None

        total = jnp.zeros([], jax.tree.leaves(params)[0].dtype)
        (_, _, total), _ = jax.lax.scan(step, (opt.init(params), params, total), (grads, weights))
        return total

    return objective


def _gradient(build):
    """The jitted gradient of :func:`_objective` with respect to the options, the gradients and the params."""
    return jax.jit(jax.grad(_objective(build), argnums=(0, 1, 2)), compiler_options=FAST_COMPILE)


def _non_finite(tree):
    return [jax.tree_util.keystr(path) for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]
            if not np.all(np.isfinite(np.asarray(x)))]


@pytest.fixture(scope="module")
def float64_run():
    """:func:`float64_checks` in a subprocess with ``JAX_ENABLE_X64=1``, started early to run alongside."""
    proc = start_float64("test_gradients", "float64_checks")
    yield proc
    finish(proc)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_through_three_steps(name, float64_run):
    # (float64_run is requested here only to start the float64 subprocess while these compile.)
    options, paths, rebuild = _options(ENTRIES[name]())
    gradient = _gradient(rebuild)
    if name in WHILE_LOOPS:
        with pytest.raises(ValueError, match="Reverse-mode differentiation does not work for lax.while_loop"):
            gradient(options, *POINTS["random"], WEIGHTS)
        return
    for point, (grads, params) in POINTS.items():
        d_options, d_grads, d_params = gradient(options, grads, params, WEIGHTS)
        bad = _non_finite({"grads": d_grads, "params": d_params, "options": dict(zip(paths, d_options))})
        if point in SINGULAR.get(name, ()):
            assert bad, f"{name} at {point}: the gradient is finite now; remove it from SINGULAR"
        else:
            assert not bad, f"{name} at {point}: non-finite gradient with respect to {bad}"
        if point == "random":  # the objective does depend on what is differentiated
            if name not in PIECEWISE_CONSTANT:
                assert any(np.any(x != 0) for x in jax.tree.leaves((d_options, d_grads))), name
            # ema_params and swa average the params in their state only; schedule_free's steps depend on the
            # params only through y - z, and init sets z = y: a shift of the params shifts x, y, z alike. DoWG's and
            # COCOB's and MADGRAD's steps depend on the params only through x - x0, and init sets x0 = x; so do
            # Mechanic's first
            # steps (its weight decay reaches the scale through the reward only, clipped to eps on these steps).
            # L-BFGS sees the params only through w_{k+1} - w_k, which is its own last step. Lookahead's slow
            # weights and SAM's outer params start at the params, and their steps see the params only through the
            # distance to those (around a pipeline that does not read the params, as here). A monitor measures the
            # params into its state only.
            if name in NEEDS_PARAMS - {"ema_params", "swa", "schedule_free", "scale_by_dowg", "scale_by_cocob",
                                       "scale_by_madgrad", "mechanize", "scale_by_lbfgs", "lookahead", "sam", "monitor"}:
                assert any(np.any(x != 0) for x in jax.tree.leaves(d_params)), name


# --------------------------------------------------------------------------
# optax at zero: optax's trust ratio is finite where its eps or min_norm is > 0

LEARNING_RATE = 0.05
AT_ZERO = ("zero updates", "zero params", "zeros")
OPTAX_AT_ZERO = [
    ("lars", lambda lr: O.lars(lr, trust_coefficient=0.01, eps=1e-6, momentum=0.8),
     lambda lr: optax.lars(lr, trust_coefficient=0.01, eps=1e-6, momentum=0.8), AT_ZERO),
    # optax.lamb's trust ratio has eps = min_norm = 0: at a zero update its step, c·‖p‖·g/‖g‖, jumps (it has the
    # norm c·‖p‖ for every g ≠ 0), so optax gives NaN there and updax the derivative of the ratio-1 branch.
    ("lamb", lambda lr: O.lamb(lr, b1=0.8, b2=0.99, eps=1e-6, eps_root=0.0, decay=0.01),
     lambda lr: optax.lamb(lr, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.01), ("zero params",)),
    # ... with min_norm > 0 the step is linear near a zero update: optax.lamb's own chain with a min_norm.
    ("lamb_min_norm", lambda lr: O.lamb(lr, b1=0.8, b2=0.99, eps=1e-6, eps_root=1e-15, min_norm=1e-3),
     lambda lr: optax.chain(optax.scale_by_adam(b1=0.8, b2=0.99, eps=1e-6, eps_root=1e-15),
                            optax.scale_by_trust_ratio(min_norm=1e-3), optax.scale_by_learning_rate(lr)), AT_ZERO),
]


@pytest.mark.parametrize("name, ours, theirs, compared", OPTAX_AT_ZERO, ids=[c[0] for c in OPTAX_AT_ZERO])
def test_gradients_at_zero_match_optax(name, ours, theirs, compared):
    # optax's hyperparameters are closed over, not leaves: both are built from a traced learning rate.
    d_ours, d_theirs = _gradient(lambda options: ours(options[0])), _gradient(lambda options: theirs(options[0]))
    lr = [jnp.asarray(LEARNING_RATE)]
    for point in AT_ZERO:
        grads, params = POINTS[point]
        mine = d_ours(lr, grads, params, WEIGHTS)
        assert not _non_finite(mine), f"{name} at {point}: {_non_finite(mine)}"
        if point in compared:
            ref = d_theirs(lr, grads, params, WEIGHTS)
            assert not _non_finite(ref), f"optax's {name} at {point}"
            for x, y in zip(jax.tree.leaves(mine), jax.tree.leaves(ref)):
                np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=f"{name} at {point}")


# --------------------------------------------------------------------------
# float64

#: Float state that stays float32 under ``JAX_ENABLE_X64``: scalars a stage keeps about its own progress, not
#: moments. They bound those stages' float64 precision (noted, not fixed here).
FLOAT32_STATE = {
    "ema": {"[0].total_weight"},
    "loss_scale": {"[0].scale"},  # a power of two, float32 as Axon's (a loss in float16 or float32 is multiplied)
    "reduce_on_plateau": {"[0].scale", "[0].best_loss", "[0].avg_loss"},
    # one float32 absmax per block, as the papers' formats have (the codes are 8 or 4 bits whatever the params)
    "quantized_state": {f"[0].inner[0].{field}['{leaf}'].scales" for field in ("mu", "nu") for leaf in ("w", "b")},
    "scale_by_state": {"[0].step_size"},
    "scale_by_multiplicative_lr": {"[0].learning_rate"},  # the running product, float32 as scale_by_state's
    "schedule_free": {"[0].weight_sum", "[0].max_lr"},
}

#: Float64 parity with optax over 6 steps, and the relative tolerance that holds (the step count of the bias
#: corrections is float64 under x64: ``_tree.float_count``).
F64_PARITY = [
    ("adam", lambda: O.adam(0.05, b1=0.8, b2=0.99, eps=1e-7, eps_root=0.0),
     lambda: optax.adam(0.05, b1=0.8, b2=0.99, eps=1e-7), 1e-12),
    ("adamw", lambda: O.adamw(0.05, b1=0.8, b2=0.99, eps=1e-7, eps_root=0.0, decay=0.01),
     lambda: optax.adamw(0.05, b1=0.8, b2=0.99, eps=1e-7, weight_decay=0.01), 1e-12),
    ("sgd_momentum", lambda: O.sgd(0.05, momentum=0.9, nesterov=True),
     lambda: optax.sgd(0.05, momentum=0.9, nesterov=True), 1e-12),
    ("rmsprop", lambda: O.rmsprop(0.05, decay=0.8, eps=1e-6, initial_scale=0.1),
     lambda: optax.rmsprop(0.05, decay=0.8, eps=1e-6, initial_scale=0.1), 1e-12),
    ("lamb", lambda: O.lamb(0.05, b1=0.8, b2=0.99, eps=1e-6, eps_root=0.0, decay=0.01),
     lambda: optax.lamb(0.05, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.01), 1e-12),
]


def float64_checks():
    """Runs under ``JAX_ENABLE_X64=1`` (``test_float64`` starts it); raises on the first failure."""
    assert jax.config.jax_enable_x64
    f64 = jnp.float64
    params = _tree(0, f64)
    for name in NAMES:  # eagerly: one compiled op per primitive and shape, shared by all entries
        opt = ENTRIES[name]()
        state = opt.init(params)
        for t in range(STEPS):
            updates, state = opt.update(updates_for(opt, _tree(t + 1, f64)), state, params, loss=LOSS)
        for x in jax.tree.leaves(updates):
            assert x.dtype == f64 and np.all(np.isfinite(x)), (name, x.dtype)
        narrow = {jax.tree_util.keystr(path) for path, x in jax.tree_util.tree_flatten_with_path(state)[0]
                  if jnp.issubdtype(jnp.result_type(x), jnp.floating) and jnp.result_type(x) != f64}
        assert narrow == FLOAT32_STATE.get(name, set()), (name, narrow)
    # ... unless a *_dtype option says otherwise
    opt = ux.scale_by_adam(mu_dtype=jnp.float32)
    updates, state = opt.update(_tree(1, f64), opt.init(params))
    assert state[0].mu["w"].dtype == jnp.float32 and state[0].nu["w"].dtype == updates["w"].dtype == f64

    for name, ours, theirs, rtol in F64_PARITY:
        ours, theirs = ours(), theirs()
        p1 = p2 = params
        s1, s2 = ours.init(p1), theirs.init(p2)
        for t in range(6):
            u1, s1 = ours.update(_tree(t + 1, f64), s1, p1)
            u2, s2 = theirs.update(_tree(t + 1, f64), s2, p2)
            for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
                assert x.dtype == f64
                np.testing.assert_allclose(x, y, rtol=rtol, atol=0, err_msg=f"{name} step {t}")
            p1, p2 = ux.apply_updates(p1, u1), optax.apply_updates(p2, u2)

    weights = _steps(10, f64)
    for name, points in SINGULAR.items():  # finite in float64
        options, _, rebuild = _options(ENTRIES[name]())
        gradient = _gradient(rebuild)
        for point in points:
            assert not _non_finite(gradient(options, *_points(f64)[point], weights)), (name, point)
    print("float64 checks passed")


def test_float64(float64_run):
    assert "float64 checks passed" in finished(float64_run, timeout=600)
