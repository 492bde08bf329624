"""Cautious updates (Liang et al. 2024) and cautious weight decay (Chen et al. 2025) against float64 NumPy
implementations written from the papers' algorithms, over 20 steps on a nested tree, and their identities."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import updax as ux

LR, B1, B2, EPS, DECAY, CAUTIOUS_EPS = 0.05, 0.9, 0.999, 1e-8, 0.1, 1e-8
STEPS = 20


def _params():
    return {"dense": {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4), "b": jnp.array([0.5, -0.25, 0.0])},
            "scale": [jnp.array(1.5), None]}


def _grads(step, params):
    """Gradients whose signs keep changing, so that Adam's momentum disagrees with them on some coordinates (a
    function of the step and the leaves' shapes only: both sides get the same numbers)."""
    def leaf(p):
        phase = np.arange(np.size(p), dtype=np.float64).reshape(np.shape(p))
        return np.float32(np.sin(1.7 * step + phase) - 0.3)
    return jax.tree.map(leaf, params)


def _run(opt, steps=STEPS):
    params = _params()
    state = opt.init(params)
    for t in range(steps):
        grads = jax.tree.map(lambda g: jnp.asarray(g, jnp.float32), _grads(t, params))
        updates, state = opt.update(grads, state, params)
        params = ux.apply_updates(params, updates)
    return params


def _reference(*, cautious_update, cautious_decay, steps=STEPS):
    """AdamW as PyTorch writes it, in float64, with the two papers' one-line changes (Algorithm 1 of each):
    the update u masked where it disagrees with g and rescaled by the kept fraction; the decay masked where u and
    the param disagree in sign."""
    params = jax.tree.map(lambda p: np.asarray(p, np.float64), _params())
    leaves, treedef = jax.tree.flatten(params)
    m = [np.zeros_like(p) for p in leaves]
    v = [np.zeros_like(p) for p in leaves]
    for t in range(1, steps + 1):
        grads = jax.tree.leaves(_grads(t - 1, treedef.unflatten(leaves)))
        new = []
        for i, (x, g) in enumerate(zip(leaves, grads)):
            g = np.asarray(g, np.float64)
            m[i] = B1 * m[i] + (1 - B1) * g
            v[i] = B2 * v[i] + (1 - B2) * g * g
            u = (m[i] / (1 - B1 ** t)) / (np.sqrt(v[i] / (1 - B2 ** t) + 1e-15) + EPS)
            if cautious_update:
                phi = (u * g > 0).astype(np.float64)
                u = u * phi / (phi.mean() + CAUTIOUS_EPS)
            decayed = (u * x >= 0) * x if cautious_decay else x
            new.append(x - LR * (u + DECAY * decayed))
        leaves = new
    return treedef.unflatten(leaves)


def _close(actual, expected):
    jax.tree.map(lambda a, e: np.testing.assert_allclose(np.asarray(a, np.float64), e, rtol=2e-4, atol=2e-5),
                 actual, expected)


@pytest.mark.parametrize("cautious_update, cautious_decay", [(True, False), (False, True), (True, True)])
def test_cautious_adamw_follows_the_papers_algorithms_over_20_steps(cautious_update, cautious_decay):
    direction = ux.scale_by_adam()
    if cautious_update:
        direction = direction.cautious(CAUTIOUS_EPS, descent=False)
    opt = direction.add_decayed_weights(DECAY, cautious=cautious_decay).scale_by_learning_rate(LR)
    _close(_run(opt), _reference(cautious_update=cautious_update, cautious_decay=cautious_decay))
    plain = _run(ux.optimizers.adamw(LR, decay=DECAY))  # the masks change the path: the test can fail
    assert not np.allclose(np.asarray(plain["dense"]["w"]), np.asarray(_run(opt)["dense"]["w"]), atol=1e-4)


def test_a_cautious_optimizer_equals_its_cautious_direction_scaled():
    """``descent=True`` around a whole optimizer (its output a step) keeps what ``descent=False`` keeps around its
    direction (which the positive learning rate then negates)."""
    step = ux.scale_by_adam().scale_by_learning_rate(LR).cautious()
    direction = ux.scale_by_adam().cautious(descent=False).scale_by_learning_rate(LR)
    _close(_run(step), jax.tree.map(lambda p: np.asarray(p, np.float64), _run(direction)))


def test_every_coordinate_a_cautious_step_keeps_descends():
    opt = ux.optimizers.sgd(0.1, momentum=0.9).cautious()
    params = _params()
    state = opt.init(params)
    kept = 0
    for t in range(STEPS):
        grads = jax.tree.map(lambda g: jnp.asarray(g, jnp.float32), _grads(t, params))
        updates, state = opt.update(grads, state, params)
        products = jax.tree.leaves(jax.tree.map(lambda u, g: u * g, updates, grads))
        assert all(bool(jnp.all(p <= 0)) for p in products)
        kept += sum(int(jnp.sum(p < 0)) for p in products)
        params = ux.apply_updates(params, updates)
    assert 0 < kept < STEPS * 16  # some coordinates were dropped, some kept


def test_a_leaf_with_nothing_kept_gets_a_zero_update_and_the_rest_are_rescaled_by_their_fraction():
    opt = ux.scale(1.0).cautious(eps=0.0)  # a step along +g climbs everywhere: nothing is kept
    g = {"a": jnp.array([1.0, -2.0]), "b": jnp.array([3.0])}
    u, _ = opt.update(g, opt.init(g))
    assert jnp.array_equal(u["a"], jnp.zeros(2)) and jnp.array_equal(u["b"], jnp.zeros(1))
    u, _ = ux.scale(-1.0).cautious(eps=0.0).update(g, opt.init(g))  # descends everywhere: all kept, scale 1
    assert jnp.array_equal(u["a"], -g["a"])
    mixed = ux.stateless(lambda u, p: jax.tree.map(lambda x: -x * jnp.array([1.0, -1.0, 1.0, 1.0]), u))
    u, _ = mixed.cautious(eps=0.0).update({"w": jnp.ones(4)}, mixed.cautious().init({"w": jnp.ones(4)}))
    np.testing.assert_allclose(u["w"], [-4 / 3, 0.0, -4 / 3, -4 / 3])  # three of four kept: scaled by 4/3


def test_cautious_weight_decay_decays_only_where_the_update_and_the_param_agree():
    opt = ux.add_decayed_weights(0.5, cautious=True)
    params = {"w": jnp.array([2.0, 2.0, -2.0, -2.0, 0.0])}
    u, _ = opt.update({"w": jnp.array([1.0, -1.0, 1.0, -1.0, 1.0])}, opt.init(params), params)
    np.testing.assert_allclose(u["w"], [2.0, -1.0, 1.0, -2.0, 1.0])
    assert opt == ux.add_decayed_weights(0.5, cautious=True) != ux.add_decayed_weights(0.5)
    assert repr(ux.add_decayed_weights(0.5)) == "add_decayed_weights(decay=0.5)"  # prints as it did
    assert repr(opt) == "add_decayed_weights(decay=0.5, cautious=True)"


def test_cautious_on_complex_leaves_uses_the_real_part_of_u_times_conj_g():
    g = {"z": jnp.array([1 + 1j, 1 - 1j], jnp.complex64)}
    rotate = ux.stateless(lambda u, p: jax.tree.map(lambda x: -x * jnp.array([1j, 1.0], jnp.complex64), u))
    u, _ = rotate.cautious(eps=0.0).update(g, rotate.cautious().init(g))
    # -i g is orthogonal to g (Re = 0: not kept); -g descends (kept, half of the leaf: doubled)
    np.testing.assert_allclose(u["z"], [0.0, -2 * (1 - 1j)])


@pytest.mark.parametrize("build, message", [
    (lambda: ux.scale(-1.0).cautious(eps=-1.0), "cautious(eps=-1.0): eps must be"),
    (lambda: ux.scale(-1.0).cautious(descent=1), "cautious(descent=1): descent must be True or False"),
    (lambda: ux.add_decayed_weights(0.1, cautious="yes"), "add_decayed_weights(cautious='yes'): cautious must be"),
])
def test_bad_options_are_refused_by_name(build, message):
    with pytest.raises((TypeError, ValueError), match=message.replace("(", r"\(").replace(")", r"\)")):
        build()


DECOUPLED = ["adamw", "adamaxw", "nadamw", "adan", "ademamix", "simplified_ademamix", "lion", "muon", "lamb",
             "adafactor"]


def _decay_stages(opt):
    """Every add_decayed_weights stage of a pipeline, inside wrappers and partitions too."""
    found = []
    for stage in opt.stages:
        if stage.name == "add_decayed_weights":
            found.append(stage)
        for _, value in stage.options:
            inner = value.values() if isinstance(value, dict) else [value]
            found += [s for v in inner if isinstance(v, ux.Update) for s in _decay_stages(v)]
    return found


@pytest.mark.parametrize("name", DECOUPLED)
def test_every_decoupled_decay_optimizer_offers_cautious_decay(name):
    build = getattr(ux.optimizers, name)
    decay = {"decay": 0.1}
    cautious, plain = _decay_stages(build(**decay, cautious_decay=True)), _decay_stages(build(**decay))
    assert cautious and all(dict(s.options)["cautious"] for s in cautious)
    assert len(plain) == len(cautious) and not any(dict(s.options)["cautious"] for s in plain)
    assert "cautious" not in repr(build(**decay))  # a pipeline built before prints as it did


def test_adamw_with_cautious_decay_follows_the_papers_algorithm():
    opt = ux.optimizers.adamw(LR, b1=B1, b2=B2, eps=EPS, eps_root=1e-15, decay=DECAY, cautious_decay=True)
    _close(_run(opt), _reference(cautious_update=False, cautious_decay=True))
