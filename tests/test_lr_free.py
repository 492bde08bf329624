"""Learning-rate-free rules: parity with optax over many steps, a float64 transcription of the paper where
updax follows the paper instead, and the guards optax lacks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax import contrib
from registry import nested_tree

import updax as ux

O = ux.optimizers
STEPS = 25
RTOL, ATOL = 2e-5, 1e-6


def _loss(t):
    """A loss that falls, then dips below 1 (the sps+ cases take f_min = 1)."""
    return 3.0 / (1.0 + 0.3 * t) + 0.1 * np.sin(t)


def _warmup(count):
    return jnp.minimum(1.0, (count + 1) / 5.0)


def _grads(params, target, noise, t):
    """The gradient of ``|params - target|²/2``, scaled by a factor that varies with ``t``, plus noise."""
    return jax.tree.map(lambda x, y, n: (x - y) * (1.0 + 0.5 * np.sin(t)) + 0.1 * n, params, target, noise)


def _run_pair(ours, theirs, *, loss_key=None, steps=STEPS):
    """Both optimizers under jax.jit over ``steps`` steps on the registry's nested tree; every step compared.

    The gradients are those of a quadratic around ``nested_tree(seed=99)``, each side at its own params, plus
    noise: the distance estimates see progress to make and grow."""
    params, target = nested_tree(seed=0), nested_tree(seed=99)
    p1 = p2 = params
    s1, s2 = ours.init(params), theirs.init(params)
    step1 = jax.jit(lambda g, s, p, loss: ours.update(g, s, p, loss=loss))
    step2 = jax.jit(lambda g, s, p, loss: theirs.update(g, s, p, **({loss_key: loss} if loss_key else {})))
    worst = 0.0
    for t in range(steps):
        noise = nested_tree(seed=t + 1)

        loss = jnp.float32(_loss(t))
        u1, s1 = step1(_grads(p1, target, noise, t), s1, p1, loss)
        u2, s2 = step2(_grads(p2, target, noise, t), s2, p2, loss)
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL, err_msg=f"step {t}")
            worst = max(worst, float(np.max(np.abs(np.asarray(x) - np.asarray(y)) / (ATOL + RTOL * np.abs(np.asarray(y))),
                                            initial=0.0)))
        p1, p2 = ux.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    for x, y in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL)
    return s1, worst


PARITY = [
    ("prodigy", lambda: O.prodigy(), lambda: contrib.prodigy()),
    ("prodigy_options", lambda: O.prodigy(0.5, b1=0.8, b2=0.99, b3=0.9, eps=1e-6, estim_lr0=1e-3, estim_lr_coef=2.0,
                                          decay=0.1),
     lambda: contrib.prodigy(0.5, betas=(0.8, 0.99), beta3=0.9, eps=1e-6, estim_lr0=1e-3, estim_lr_coef=2.0,
                             weight_decay=0.1)),
    ("prodigy_schedule_safeguard", lambda: O.prodigy(_warmup, estim_lr0=1e-2, safeguard_warmup=True),
     lambda: contrib.prodigy(_warmup, estim_lr0=1e-2, safeguard_warmup=True)),
    ("dadapt_adamw", lambda: O.dadapt_adamw(), lambda: contrib.dadapt_adamw()),
    ("dadapt_adamw_options", lambda: O.dadapt_adamw(_warmup, b1=0.8, b2=0.99, eps=1e-6, estim_lr0=1e-2, decay=0.1),
     lambda: contrib.dadapt_adamw(_warmup, betas=(0.8, 0.99), eps=1e-6, estim_lr0=1e-2, weight_decay=0.1)),
    ("dog", lambda: O.dog(), lambda: contrib.dog()),
    ("dog_distance", lambda: O.dog(0.5, init_step=1e-2, init_step_type="distance", eps=1e-6, decay=0.1),
     lambda: contrib.dog(0.5, init_step=("distance", 1e-2), eps=1e-6, weight_decay=0.1)),
    ("dog_learning_rate", lambda: O.dog(_warmup, init_step=1e-3, init_step_type="learning_rate"),
     lambda: contrib.dog(_warmup, init_step=("learning_rate", 1e-3))),
    ("dowg", lambda: O.dowg(), lambda: contrib.dowg()),
    ("dowg_options", lambda: O.dowg(0.5, init_estim_sq_dist=1e-2, eps=1e-6, decay=0.1),
     lambda: contrib.dowg(0.5, init_estim_sq_dist=1e-2, eps=1e-6, weight_decay=0.1)),
    ("cocob", lambda: O.cocob(), lambda: contrib.cocob()),
    ("cocob_options", lambda: O.cocob(_warmup, alpha=10.0, eps=1e-4, decay=0.1),
     lambda: contrib.cocob(_warmup, alpha=10.0, eps=1e-4, weight_decay=0.1)),
    ("polyak_sgd", lambda: O.polyak_sgd(), lambda: optax.polyak_sgd()),
    ("polyak_sgd_sps_plus", lambda: O.polyak_sgd(max_learning_rate=0.05, f_min=1.0, eps=1e-3, variant="sps+"),
     lambda: optax.polyak_sgd(max_learning_rate=0.05, f_min=1.0, eps=1e-3, variant="sps+")),
    ("mechanize_adam", lambda: O.adam(1.0).mechanize(), lambda: contrib.mechanize(optax.adam(1.0, eps_root=1e-15))),
    ("mechanize_sgd_options", lambda: O.sgd(_warmup, momentum=0.9).mechanize(decay=0.1, eps=1e-6, s_init=1e-4,
                                                                              num_betas=3),
     lambda: contrib.mechanize(optax.sgd(_warmup, momentum=0.9), weight_decay=0.1, eps=1e-6, s_init=1e-4,
                               num_betas=3)),
]


@pytest.mark.parametrize("name, ours, theirs", PARITY, ids=[p[0] for p in PARITY])
def test_parity_with_optax_over_25_steps(name, ours, theirs):
    _, worst = _run_pair(ours(), theirs(), loss_key="value" if name.startswith("polyak") else None)
    print(f"{name}: the largest deviation uses {worst:.1%} of the tolerance")


def test_the_distance_estimates_grow_and_are_readable_by_path():
    opt = O.prodigy()
    state, _ = _run_pair(opt, contrib.prodigy())
    assert float(opt.get_state(state, "scale_by_prodigy.estim_lr")) > 1e-6
    assert int(opt.get_state(state, "scale_by_prodigy.count")) == STEPS
    opt = O.dog()
    state, _ = _run_pair(opt, contrib.dog(), steps=3)
    assert float(opt.get_state(state, "scale_by_dog.max_dist")) > 0
    params = nested_tree(seed=0)
    for x, y in zip(jax.tree.leaves(opt.get_state(state, "scale_by_dog.init_params")), jax.tree.leaves(params)):
        np.testing.assert_array_equal(x, y)


# --------------------------------------------------------------------------
# Where updax follows the paper: Polyak's step times a learning rate (optax's scaling), against a float64
# transcription


def _flat(tree):
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


@pytest.mark.parametrize("variant", ["sps", "sps+"])
def test_polyak_sgd_with_a_learning_rate_is_the_papers_step(variant):
    """optax computes the norm of the gradient scaled by its ``scaling``; the rule is
    s·min(gap/(‖g‖² + eps), γ_max)·g, with s the learning rate."""
    scaling, max_lr, f_min, eps = 0.3, 0.5, 1.0, 1e-3
    opt = O.polyak_sgd(scaling, max_learning_rate=max_lr, f_min=f_min, eps=eps, variant=variant)
    params = nested_tree(seed=0)
    state = opt.init(params)
    step = jax.jit(lambda g, s, p, loss: opt.update(g, s, p, loss=loss))
    x = _flat(params)
    for t in range(STEPS):
        grads = nested_tree(seed=t + 1)
        loss = _loss(t)
        u, state = step(grads, state, params, jnp.float32(loss))
        params = ux.apply_updates(params, u)
        g = _flat(grads)
        gap = np.float64(np.float32(loss)) - f_min
        gap = max(gap, 0.0) if variant == "sps+" else gap
        x = x - scaling * min(gap / (g @ g + eps), max_lr) * g
        np.testing.assert_allclose(_flat(params), x, rtol=RTOL, atol=ATOL, err_msg=f"step {t}")


def test_polyak_step_is_capped_and_zero_on_zero_gradients():
    opt = ux.scale_by_polyak(max_learning_rate=0.1)
    u, _ = opt.update({"w": jnp.array([1e-3])}, opt.init(None), loss=5.0)
    np.testing.assert_allclose(u["w"], [1e-4], rtol=1e-6)
    u, _ = opt.update({"w": jnp.zeros(2)}, opt.init(None), loss=5.0)
    np.testing.assert_array_equal(u["w"], [0.0, 0.0])


def test_polyak_needs_the_loss_by_name():
    opt = O.polyak_sgd()
    with pytest.raises(ValueError, match=r"^scale_by_polyak needs the loss: call update\(.*loss=loss\)"):
        opt.update({"w": jnp.ones(1)}, opt.init(None))


# --------------------------------------------------------------------------
# Guards: zero updates keep the estimate (optax divides 0 by 0)


@pytest.mark.parametrize("build", [O.prodigy, O.dadapt_adamw], ids=["prodigy", "dadapt_adamw"])
def test_zero_updates_keep_the_estimate_finite(build):
    opt = build()
    params = {"w": jnp.array([1.0, -2.0])}
    state = opt.init(params)
    for g in ([0.0, 0.0], [0.0, 0.0], [0.5, -0.5]):
        u, state = jax.jit(opt.update)({"w": jnp.array(g)}, state, params)
        assert np.all(np.isfinite(u["w"]))
    label = opt.stages[0].label
    assert opt.get_state(state, f"{label}.estim_lr") >= np.float32(1e-6)


def test_mechanize_wraps_the_pipeline_before_it_and_keeps_its_state_by_path():
    opt = ux.scale_by_adam().scale_by_learning_rate(1.0).mechanize()
    assert repr(opt) == ("scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=1e-15) |> scale_by_learning_rate("
                         "learning_rate=1.0) |> mechanize(decay=0.01, eps=1e-08, s_init=1e-06, num_betas=6)")
    assert opt == ux.mechanize(ux.scale_by_adam().scale_by_learning_rate(1.0))
    params = {"w": jnp.array([1.0, -2.0])}
    state = opt.init(params)
    _, state = opt.update({"w": jnp.array([0.5, 0.5])}, state, params)
    assert int(opt.get_state(state, "mechanize/scale_by_adam.count")) == 1
    assert opt.get_state(state, "mechanize.s").shape == (6,)


# --------------------------------------------------------------------------
# Options are checked when the object is built, naming the call


@pytest.mark.parametrize("build, message", [
    (lambda: ux.scale_by_prodigy(b1=1.0), r"^scale_by_prodigy\(b1=1\.0\): b1 must be in \[0, 1\)"),
    (lambda: ux.scale_by_prodigy(estim_lr0=0.0), r"^scale_by_prodigy\(estim_lr0=0\.0\): estim_lr0 must be in \(0"),
    (lambda: ux.scale_by_dadapt_adamw(eps=-1.0), r"^scale_by_dadapt_adamw\(eps=-1\.0\): eps must be in \[0"),
    (lambda: ux.scale_by_dog(init_step_type="lr"), (r"^scale_by_dog\(init_step_type='lr'\): init_step_type must be "
                                                   r"'heuristic' or 'distance' or 'learning_rate'")),
    (lambda: ux.scale_by_dowg(eps=0.0), r"^scale_by_dowg\(eps=0\.0\): eps must be in \(0"),
    (lambda: ux.scale_by_cocob(alpha=0.0), r"^scale_by_cocob\(alpha=0\.0\): alpha must be in \(0"),
    (lambda: ux.scale_by_polyak(variant="sps2"), r"^scale_by_polyak\(variant='sps2'\): variant must be 'sps' or "),
    (lambda: ux.scale(1.0).mechanize(num_betas=0), r"^mechanize\(num_betas=0\): num_betas must be an integer in \[1,"),
])
def test_bad_options_are_refused_by_name(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize("make", [O.prodigy, O.dadapt_adamw], ids=["prodigy", "dadapt_adamw"])
def test_the_decay_mask_keeps_leaves_out_of_the_decay(make):
    """With the params held fixed the state does not depend on the decay (it enters the emitted step only), so
    each leaf the mask leaves out steps as with ``decay=0``, and each it selects as with the mask absent."""
    def matrices(params):
        return jax.tree.map(lambda p: p.ndim >= 2, params)

    params = nested_tree(seed=0)
    runs = [make(decay=0.1, mask=matrices), make(decay=0.1), make(decay=0.0)]
    states = [opt.init(params) for opt in runs]
    for t in range(5):
        grads = nested_tree(seed=t + 1)
        masked, decayed, plain = [], [], []
        for i, (opt, out) in enumerate(zip(runs, (masked, decayed, plain))):
            u, states[i] = opt.update(grads, states[i], params)
            out.extend(jax.tree.leaves(u))
        selected = jax.tree.leaves(matrices(params))
        assert any(selected) and not all(selected)
        for m, d, z, leaf_decays in zip(masked, decayed, plain, selected):
            np.testing.assert_array_equal(m, d if leaf_decays else z)
        assert any(not np.array_equal(d, z) for d, z in zip(decayed, plain))  # the decay does act


@pytest.mark.parametrize("make", [O.prodigy, O.dadapt_adamw], ids=["prodigy", "dadapt_adamw"])
def test_a_decay_of_the_number_zero_adds_no_term(make):
    """The default ``decay=0.0`` leaves the decay term out of the trace (a multiply and an add per leaf fewer
    than a decay of 0 given traced, which computes ``+ 0·p``) and gives the same numbers; D-Adaptation's
    update reads the params for the decay only, so an infinite param no longer makes it NaN (``0·inf``)."""
    params, grads = nested_tree(seed=0), nested_tree(seed=1)

    def step(decay, g, p):
        opt = make(decay=decay)
        return opt.update(g, opt.init(p), p)[0]

    leaves = jax.tree.leaves(params)
    plain, traced = step(0.0, grads, params), jax.jit(step)(0.0, grads, params)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(traced)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=0)
    eqns = len(jax.make_jaxpr(lambda g, p: step(0.0, g, p))(grads, params).eqns)
    eqns_traced = len(jax.make_jaxpr(step)(0.0, grads, params).eqns)
    assert eqns + 2 * len(leaves) <= eqns_traced, (eqns, eqns_traced)
    if make is O.dadapt_adamw:
        p, g = {"w": jnp.array([jnp.inf, 1.0])}, {"w": jnp.array([0.5, -0.5])}
        assert np.all(np.isfinite(step(0.0, g, p)["w"]))
        assert np.isnan(jax.jit(step)(0.0, g, p)["w"][0])
