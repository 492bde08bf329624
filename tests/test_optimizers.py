"""Axon's optimizers: each equals its explicit pipeline, matches optax's alias, and converges."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import updax as ux
from registry import nested_tree
from updax.optimizers._orthogonal import _muon_groups

O = ux.optimizers


def test_each_optimizer_equals_its_explicit_pipeline():
    lr = 0.05
    assert O.adabelief(lr, b1=0.8) == ux.scale_by_belief(b1=0.8).scale_by_learning_rate(lr)
    assert O.adagrad(lr) == ux.scale_by_rss().scale_by_learning_rate(lr)
    assert O.adam(lr, b2=0.99) == ux.scale_by_adam(b2=0.99).scale_by_learning_rate(lr)
    assert O.adamw(lr, decay=1e-2) == ux.scale_by_adam().add_decayed_weights(1e-2).scale_by_learning_rate(lr)
    assert O.lamb(lr, decay=1e-2, min_norm=1e-3) == (
        ux.scale_by_adam().add_decayed_weights(1e-2).scale_by_trust_ratio(min_norm=1e-3).scale_by_learning_rate(lr))
    assert O.noisy_sgd(lr, eta=0.1, key=3) == ux.add_noise(eta=0.1, key=3).scale_by_learning_rate(lr)
    assert O.radam(lr, threshold=4.5) == ux.scale_by_radam(threshold=4.5).scale_by_learning_rate(lr)
    assert O.rmsprop(lr) == ux.scale_by_rms().scale_by_learning_rate(lr)
    assert O.rmsprop(lr, centered=True, momentum=0.9, nesterov=True) == (
        ux.scale_by_stddev().scale_by_learning_rate(lr).trace(0.9, nesterov=True))
    assert O.rmsprop(lr, centered=True, eps_in_sqrt=False, bias_correction=True) == (
        ux.scale_by_stddev(eps_in_sqrt=False, bias_correction=True).scale_by_learning_rate(lr))
    assert O.sgd(lr) == ux.scale_by_learning_rate(lr)
    assert O.sgd(lr, momentum=0.9) == ux.trace(decay=0.9).scale_by_learning_rate(lr)
    assert O.yogi(lr) == ux.scale_by_yogi().scale_by_learning_rate(lr)
    # the modern set
    assert O.lion(lr) == ux.scale_by_lion().add_decayed_weights(1e-3).scale_by_learning_rate(lr)
    assert O.adamax(lr) == ux.scale_by_adamax().scale_by_learning_rate(lr)
    assert O.adamaxw(lr) == ux.scale_by_adamax().add_decayed_weights(1e-4).scale_by_learning_rate(lr)
    assert O.amsgrad(lr) == ux.scale_by_amsgrad().scale_by_learning_rate(lr)
    assert O.nadam(lr) == ux.scale_by_nadam().scale_by_learning_rate(lr)
    assert O.nadamw(lr) == ux.scale_by_nadam().add_decayed_weights(1e-4).scale_by_learning_rate(lr)
    assert O.novograd(lr) == ux.scale_by_novograd(eps=1e-6).scale_by_learning_rate(lr)
    assert O.adadelta(lr) == ux.add_decayed_weights(0.0).scale_by_adadelta().scale_by_learning_rate(lr)
    assert O.rprop(lr) == ux.scale_by_rprop(lr).scale(-1.0)
    assert O.sign_sgd(lr) == ux.scale_by_sign().scale_by_learning_rate(lr)
    assert O.signum(lr) == ux.trace(0.9).scale_by_sign().scale_by_learning_rate(lr)
    assert O.adan(lr) == ux.scale_by_adan(eps_root=1e-8).add_decayed_weights(0.0).scale_by_learning_rate(lr)
    assert O.lars(lr) == (ux.add_decayed_weights(0.0).scale_by_trust_ratio(trust_coefficient=1e-3)
                          .scale_by_learning_rate(lr).trace(0.9))
    m = 1 / (1 + lr**2) ** 0.5
    assert O.adafactor(lr) == (ux.scale_by_factored_rms().clip_by_block_rms(1.0).scale(lr).scale_by_param_block_rms()
                               .scale(-1.0))
    assert O.muon(lr) == ux.partition({
        "muon": ux.scale_by_muon().scale_by_shape().add_decayed_weights(0.0).scale_by_learning_rate(lr),
        "adam": ux.scale_by_nadam().add_decayed_weights(0.0).scale_by_learning_rate(lr)}, _muon_groups)
    assert O.sm3(lr) == ux.scale_by_sm3(b1=0.9).scale_by_learning_rate(lr)
    assert O.madgrad(lr, decay=0.1) == ux.add_decayed_weights(0.1).scale_by_madgrad(lr).scale(-1.0)
    assert O.schedule_free_sgd(lr, decay=0.1, b1=0.8) == (
        ux.add_decayed_weights(0.1).scale_by_learning_rate(lr).schedule_free(lr, b1=0.8))
    warm = ux.schedules.polynomial_decay(0.0, end_value=lr, power=1.0, transition_steps=5)
    assert O.schedule_free_sgd(lr, warmup_steps=5) == (
        ux.add_decayed_weights(0.0).scale_by_learning_rate(warm).schedule_free(warm))
    assert O.optimistic_adam_v2(lr) == O.optimistic_adam(lr, nesterov=True)
    assert O.fromage(lr) == ux.scale_by_trust_ratio(min_norm=1e-6).scale_by_learning_rate(lr * m).add_decayed_weights(
        m - 1)


def test_optimizers_print_their_pipeline():
    assert repr(O.lamb(1e-2)) == (
        "scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=1e-15) |> add_decayed_weights(decay=0.0) |> "
        "scale_by_trust_ratio(min_norm=0.0, trust_coefficient=1.0, eps=0.0) |> "
        "scale_by_learning_rate(learning_rate=0.01)")


AXON_LEARNING_RATES = dict(adabelief=1e-3, adagrad=1e-3, adam=1e-3, adamw=1e-3, lamb=1e-2, noisy_sgd=1e-2,
                           radam=1e-3, rmsprop=1e-2, sgd=1e-2, yogi=1e-2)


def test_learning_rate_comes_first_with_axon_defaults():
    assert set(AXON_LEARNING_RATES) <= set(O.__all__)
    for name in O.__all__:
        first = next(iter(inspect.signature(getattr(O, name)).parameters.values()))
        assert first.name == "learning_rate", name
    for name, lr in AXON_LEARNING_RATES.items():
        first = next(iter(inspect.signature(getattr(O, name)).parameters.values()))
        assert (first.name, first.default) == ("learning_rate", lr), name


def _schedule(count):
    return 0.05 * 0.9 ** count


def _matrices(params):
    """A weight-decay mask: the leaves with two axes or more (no decay on biases and scalars)."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


# The same mask as a pytree of bools, and as a prefix of the params (one bool for the whole "layers" list).
_MATRIX_TREE = _matrices(nested_tree())
_PREFIX = {"dense": {"w": True, "b": False}, "layers": True, "empty": {}, "nothing": None, "empty_list": [],
           "scalar": False}


PARITY = [
    ("adabelief", lambda: O.adabelief(0.05, b1=0.8, b2=0.99, eps=1e-8, eps_root=1e-14),
     lambda: optax.adabelief(0.05, b1=0.8, b2=0.99, eps=1e-8, eps_root=1e-14)),
    ("adagrad", lambda: O.adagrad(0.05, initial_accumulator_value=0.2, eps=1e-6),
     lambda: optax.adagrad(0.05, initial_accumulator_value=0.2, eps=1e-6)),
    ("adam", lambda: O.adam(0.05, b1=0.8, b2=0.99, eps=1e-7, eps_root=0.0),
     lambda: optax.adam(0.05, b1=0.8, b2=0.99, eps=1e-7, eps_root=0.0)),
    ("adam_schedule", lambda: O.adam(_schedule, b1=0.8, b2=0.99, eps=1e-7, eps_root=0.0),
     lambda: optax.adam(_schedule, b1=0.8, b2=0.99, eps=1e-7, eps_root=0.0)),
    ("adamw", lambda: O.adamw(0.05, b1=0.8, b2=0.99, eps=1e-7, eps_root=0.0, decay=0.01),
     lambda: optax.adamw(0.05, b1=0.8, b2=0.99, eps=1e-7, eps_root=0.0, weight_decay=0.01)),
    ("lamb", lambda: O.lamb(0.05, b1=0.8, b2=0.99, eps=1e-6, eps_root=0.0, decay=0.01),
     lambda: optax.lamb(0.05, b1=0.8, b2=0.99, eps=1e-6, eps_root=0.0, weight_decay=0.01)),
    ("noisy_sgd_without_noise", lambda: O.noisy_sgd(0.05, eta=0.0, gamma=0.55),
     lambda: optax.noisy_sgd(0.05, eta=0.0, gamma=0.55, key=jax.random.key(0))),
    ("radam", lambda: O.radam(0.05, b1=0.8, b2=0.9, eps=1e-7, eps_root=0.0, threshold=5.0),
     lambda: optax.radam(0.05, b1=0.8, b2=0.9, eps=1e-7, eps_root=0.0, threshold=5.0)),
    ("rmsprop", lambda: O.rmsprop(0.05, decay=0.8, eps=1e-6, initial_scale=0.1),
     lambda: optax.rmsprop(0.05, decay=0.8, eps=1e-6, initial_scale=0.1)),
    ("rmsprop_centered_momentum", lambda: O.rmsprop(0.05, centered=True, momentum=0.9, nesterov=True, decay=0.8,
                                                    eps=1e-6, initial_scale=0.1),
     lambda: optax.rmsprop(0.05, centered=True, momentum=0.9, nesterov=True, decay=0.8, eps=1e-6,
                           initial_scale=0.1)),
    *[(f"rmsprop_{label}_eps_outside_bias_corrected",
       lambda kw=kw: O.rmsprop(0.05, decay=0.8, eps=1e-6, initial_scale=0.1, eps_in_sqrt=False, bias_correction=True,
                               **kw),
       lambda kw=kw: optax.rmsprop(0.05, decay=0.8, eps=1e-6, initial_scale=0.1, eps_in_sqrt=False,
                                   bias_correction=True, **kw))
      for label, kw in [("plain", {}), ("centered_momentum", dict(centered=True, momentum=0.9))]],
    ("sgd", lambda: O.sgd(0.05), lambda: optax.sgd(0.05)),
    ("sgd_nesterov", lambda: O.sgd(0.05, momentum=0.9, nesterov=True),
     lambda: optax.sgd(0.05, momentum=0.9, nesterov=True)),
    ("yogi", lambda: O.yogi(0.05, initial_accumulator_value=1e-6, b1=0.8, b2=0.99, eps=1e-3, eps_root=0.0),
     lambda: optax.yogi(0.05, b1=0.8, b2=0.99, eps=1e-3)),
    # the modern set
    ("lion", lambda: O.lion(0.01, b1=0.8, b2=0.95, decay=0.01),
     lambda: optax.lion(0.01, b1=0.8, b2=0.95, weight_decay=0.01)),
    ("adamax", lambda: O.adamax(0.05, b1=0.8, b2=0.95, eps=1e-7), lambda: optax.adamax(0.05, b1=0.8, b2=0.95, eps=1e-7)),
    ("adamaxw", lambda: O.adamaxw(0.05, b1=0.8, b2=0.95, eps=1e-7, decay=0.01),
     lambda: optax.adamaxw(0.05, b1=0.8, b2=0.95, eps=1e-7, weight_decay=0.01)),
    ("amsgrad", lambda: O.amsgrad(0.05, b1=0.8, b2=0.95, eps=1e-7, eps_root=0.0),
     lambda: optax.amsgrad(0.05, b1=0.8, b2=0.95, eps=1e-7, eps_root=0.0)),
    ("nadam", lambda: O.nadam(0.05, b1=0.8, b2=0.95, eps=1e-7, eps_root=0.0),
     lambda: optax.nadam(0.05, b1=0.8, b2=0.95, eps=1e-7, eps_root=0.0)),
    ("nadamw", lambda: O.nadamw(0.05, b1=0.8, b2=0.95, eps=1e-7, eps_root=0.0, decay=0.01),
     lambda: optax.nadamw(0.05, b1=0.8, b2=0.95, eps=1e-7, eps_root=0.0, weight_decay=0.01)),
    ("novograd", lambda: O.novograd(0.05, b1=0.8, b2=0.3, eps=1e-6, eps_root=0.0, decay=0.01),
     lambda: optax.novograd(0.05, b1=0.8, b2=0.3, eps=1e-6, eps_root=0.0, weight_decay=0.01)),
    ("adadelta", lambda: O.adadelta(0.5, rho=0.8, eps=1e-5, decay=0.01),
     lambda: optax.adadelta(0.5, rho=0.8, eps=1e-5, weight_decay=0.01)),
    ("sign_sgd", lambda: O.sign_sgd(0.05), lambda: optax.sign_sgd(0.05)),
    ("signum", lambda: O.signum(0.05, momentum=0.8), lambda: optax.signum(0.05, beta=0.8)),
    # b2 = 0.5: optax 0.2.8's Adan weights the gradient difference by 1 - b2 where the paper has b2 (see
    # tests/test_adaptive.py); they agree only there.
    ("adan", lambda: O.adan(0.05, b1=0.9, b2=0.5, b3=0.95, eps=1e-7, eps_root=1e-8, decay=0.01),
     lambda: optax.adan(0.05, b1=0.9, b2=0.5, b3=0.95, eps=1e-7, eps_root=1e-8, weight_decay=0.01)),
    ("lars", lambda: O.lars(0.05, decay=0.01, trust_coefficient=0.01, eps=1e-6, momentum=0.8, nesterov=True),
     lambda: optax.lars(0.05, weight_decay=0.01, trust_coefficient=0.01, eps=1e-6, momentum=0.8, nesterov=True)),
    ("fromage", lambda: O.fromage(0.05, min_norm=1e-5), lambda: optax.fromage(0.05, min_norm=1e-5)),
    ("adafactor", lambda: O.adafactor(0.05, min_dim_size_to_factor=2, decay_rate=0.8, decay_offset=0,
                                      multiply_by_parameter_scale=True, clipping_threshold=1.0, momentum=0.9,
                                      decay=0.01, eps=1e-30, factored=True),
     lambda: optax.adafactor(0.05, min_dim_size_to_factor=2, decay_rate=0.8, decay_offset=0,
                             multiply_by_parameter_scale=True, clipping_threshold=1.0, momentum=0.9,
                             weight_decay_rate=0.01, eps=1e-30, factored=True)),
    ("adafactor_unfactored", lambda: O.adafactor(0.05, clipping_threshold=None, multiply_by_parameter_scale=False,
                                                 factored=False),
     lambda: optax.adafactor(0.05, clipping_threshold=None, multiply_by_parameter_scale=False, factored=False)),
    ("sm3", lambda: O.sm3(0.05, momentum=0.8), lambda: optax.sm3(0.05, momentum=0.8)),
    ("muon", lambda: O.muon(0.02, beta=0.9, eps=1e-7, decay=0.01, adam_b1=0.8, adam_b2=0.95,
                            adam_decay=0.02),
     lambda: optax.contrib.muon(0.02, beta=0.9, eps=1e-7, weight_decay=0.01, adam_b1=0.8, adam_b2=0.95,
                                adam_weight_decay=0.02)),
    ("muon_without_nesterov", lambda: O.muon(0.02, nesterov=False, adam_learning_rate=0.01),
     lambda: optax.contrib.muon(0.02, nesterov=False, adam_learning_rate=0.01)),
    ("schedule_free_adamw", lambda: O.schedule_free_adamw(0.05, b1=0.8, b2=0.95, eps=1e-7, decay=0.01),
     lambda: optax.contrib.schedule_free_adamw(0.05, b1=0.8, b2=0.95, eps=1e-7, weight_decay=0.01)),
    ("schedule_free_sgd", lambda: ux.scale_by_learning_rate(0.05).schedule_free(0.05, b1=0.7, weight_lr_power=1.0),
     lambda: optax.contrib.schedule_free(optax.sgd(0.05), 0.05, b1=0.7, weight_lr_power=1.0)),
    # optax's spellings
    ("schedule_free_sgd", lambda: O.schedule_free_sgd(0.05, b1=0.8, decay=0.01, weight_lr_power=1.0),
     lambda: optax.contrib.schedule_free_sgd(0.05, b1=0.8, weight_decay=0.01, weight_lr_power=1.0)),
    ("schedule_free_sgd_defaults", lambda: O.schedule_free_sgd(0.05), lambda: optax.contrib.schedule_free_sgd(0.05)),
    ("optimistic_adam_v2", lambda: O.optimistic_adam_v2(0.05, alpha=0.7, beta=0.9, b1=0.8, b2=0.95, eps=1e-7),
     lambda: optax.optimistic_adam_v2(0.05, alpha=0.7, beta=0.9, b1=0.8, b2=0.95, eps=1e-7)),
    ("optimistic_adam_v2_defaults", lambda: O.optimistic_adam_v2(0.05), lambda: optax.optimistic_adam_v2(0.05)),
    ("madgrad", lambda: O.madgrad(0.05, momentum=0.8, decay=0.01, eps=1e-6),
     lambda: optax.contrib.madgrad(0.05, momentum=0.8, weight_decay=0.01, eps=1e-6)),
    # Nesterov's first moment on the Adam family, and weight-decay masks (a function, a pytree, a prefix).
    ("adam_nesterov", lambda: O.adam(0.05, b1=0.8, b2=0.99, eps=1e-7, eps_root=0.0, nesterov=True),
     lambda: optax.adam(0.05, b1=0.8, b2=0.99, eps=1e-7, eps_root=0.0, nesterov=True)),
    ("adamw_nesterov_masked", lambda: O.adamw(0.05, b1=0.8, b2=0.99, eps=1e-7, eps_root=0.0, decay=0.1,
                                              nesterov=True, mask=_matrices),
     lambda: optax.adamw(0.05, b1=0.8, b2=0.99, eps=1e-7, eps_root=0.0, weight_decay=0.1, nesterov=True,
                         mask=_matrices)),
    ("radam_nesterov", lambda: O.radam(0.05, b1=0.8, b2=0.9, eps=1e-7, eps_root=0.0, threshold=5.0, nesterov=True),
     lambda: optax.radam(0.05, b1=0.8, b2=0.9, eps=1e-7, eps_root=0.0, threshold=5.0, nesterov=True)),
    ("adabelief_nesterov", lambda: O.adabelief(0.05, b1=0.8, b2=0.99, eps=1e-8, eps_root=1e-14, nesterov=True),
     lambda: optax.adabelief(0.05, b1=0.8, b2=0.99, eps=1e-8, eps_root=1e-14, nesterov=True)),
    ("adamaxw_masked", lambda: O.adamaxw(0.05, b1=0.8, b2=0.95, eps=1e-7, decay=0.1, mask=_MATRIX_TREE),
     lambda: optax.adamaxw(0.05, b1=0.8, b2=0.95, eps=1e-7, weight_decay=0.1, mask=_MATRIX_TREE)),
    ("nadamw_masked", lambda: O.nadamw(0.05, b1=0.8, b2=0.95, eps=1e-7, eps_root=0.0, decay=0.1, mask=_matrices),
     lambda: optax.nadamw(0.05, b1=0.8, b2=0.95, eps=1e-7, eps_root=0.0, weight_decay=0.1, mask=_matrices)),
    ("lamb_masked", lambda: O.lamb(0.05, b1=0.8, b2=0.99, eps=1e-6, eps_root=0.0, decay=0.1, mask=_matrices),
     lambda: optax.lamb(0.05, b1=0.8, b2=0.99, eps=1e-6, eps_root=0.0, weight_decay=0.1, mask=_matrices)),
    ("lion_masked_by_a_prefix", lambda: O.lion(0.01, b1=0.8, b2=0.95, decay=0.1, mask=_PREFIX),
     lambda: optax.lion(0.01, b1=0.8, b2=0.95, weight_decay=0.1, mask=_PREFIX)),
    ("adan_masked", lambda: O.adan(0.05, b1=0.9, b2=0.5, b3=0.95, eps=1e-7, eps_root=1e-8, decay=0.1, mask=_matrices),
     lambda: optax.adan(0.05, b1=0.9, b2=0.5, b3=0.95, eps=1e-7, eps_root=1e-8, weight_decay=0.1, mask=_matrices)),
    ("lars_masked", lambda: O.lars(0.05, decay=0.1, trust_coefficient=0.01, eps=1e-6, momentum=0.8, mask=_matrices,
                                   trust_ratio_mask=_PREFIX),
     lambda: optax.lars(0.05, weight_decay=0.1, trust_coefficient=0.01, eps=1e-6, momentum=0.8,
                        weight_decay_mask=_matrices, trust_ratio_mask=_PREFIX)),
    ("adafactor_masked", lambda: O.adafactor(0.05, min_dim_size_to_factor=2, decay=0.1, mask=_matrices),
     lambda: optax.adafactor(0.05, min_dim_size_to_factor=2, weight_decay_rate=0.1, weight_decay_mask=_matrices)),
    ("adadelta_masked", lambda: O.adadelta(0.5, rho=0.8, eps=1e-5, decay=0.1, mask=_MATRIX_TREE),
     lambda: optax.adadelta(0.5, rho=0.8, eps=1e-5, weight_decay=0.1, weight_decay_mask=_MATRIX_TREE)),
    # optax's mask reaches the matrices' decay only; with adam_decay = 0 the two agree.
    ("muon_masked", lambda: O.muon(0.02, beta=0.9, eps=1e-7, decay=0.1, mask=lambda p: jax.tree.map(
        lambda x: x.ndim == 2 and x.shape[0] == 3, p)),
     lambda: optax.contrib.muon(0.02, beta=0.9, eps=1e-7, weight_decay=0.1, weight_decay_mask=lambda p: jax.tree.map(
         lambda x: x.ndim == 2 and x.shape[0] == 3, p))),
]


@pytest.mark.parametrize("name, ours, theirs", PARITY, ids=[p[0] for p in PARITY])
def test_parity_with_optax_over_20_steps(name, ours, theirs):
    opt, ref = ours(), theirs()
    # optax 0.2.8's sm3 fails on 0-d leaves (updax's handles them: tests/test_factored.py).
    tree = (lambda seed: {k: v for k, v in nested_tree(seed=seed).items() if k != "scalar"}) if name == "sm3" else (
        lambda seed: nested_tree(seed=seed))
    params = tree(0)
    p1, p2 = params, params
    s1, s2 = opt.init(params), ref.init(params)
    step1, step2 = jax.jit(opt.update), jax.jit(ref.update)
    for t in range(20):
        grads = jax.tree.map(lambda g: g * (1.0 + 0.5 * np.sin(t)), tree(t + 1))
        u1, s1 = step1(grads, s1, p1)
        u2, s2 = step2(grads, s2, p2)
        p1, p2 = ux.apply_updates(p1, u1), optax.apply_updates(p2, u2)
        for x, y in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
            np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6, err_msg=f"{name} step {t}")
    for x, y in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6)


def test_every_optimizer_with_a_weight_decay_takes_a_mask():
    # (rmsprop's decay is Axon's name for its average's decay, not a weight decay; MoMo's is the l2 term of the
    # model whose proximal step it takes, one step size over the whole tree from inner products over all leaves, so
    # a leaf left out would be another model than the paper's and optax's, neither of which has a mask)
    unmasked = {"rmsprop", "momo", "momo_adam"}
    with_decay = [name for name in O.__all__ if name not in unmasked
                  and "decay" in inspect.signature(getattr(O, name)).parameters]
    assert len(with_decay) >= 19
    assert [name for name in with_decay if "mask" not in inspect.signature(getattr(O, name)).parameters] == []


@pytest.mark.parametrize("mask", [_matrices, _MATRIX_TREE], ids=["function", "pytree"])
def test_novograd_mask_matches_optax_leaf_by_leaf(mask):
    """optax's novograd has no mask; its rule is layer-wise (each leaf on its own), so a masked run equals, leaf by
    leaf, optax's with the weight decay on the leaves the mask selects and optax's without it on the others."""
    opt = O.novograd(0.05, b1=0.8, b2=0.5, eps=1e-6, decay=0.1, mask=mask)
    refs = [optax.novograd(0.05, b1=0.8, b2=0.5, eps=1e-6, weight_decay=wd) for wd in (0.1, 0.0)]
    params = nested_tree(seed=0)
    p1, ps = params, [params, params]
    s1, ss = opt.init(params), [ref.init(params) for ref in refs]
    selected = jax.tree.leaves(_matrices(params))
    assert any(selected) and not all(selected)
    for t in range(20):
        grads = jax.tree.map(lambda g: g * (1.0 + 0.5 * np.sin(t)), nested_tree(seed=t + 1))
        u1, s1 = jax.jit(opt.update)(grads, s1, p1)
        p1 = ux.apply_updates(p1, u1)
        for i, ref in enumerate(refs):
            u, ss[i] = ref.update(grads, ss[i], ps[i])
            ps[i] = optax.apply_updates(ps[i], u)
        for x, decayed, plain, decays in zip(jax.tree.leaves(p1), *map(jax.tree.leaves, ps), selected):
            np.testing.assert_allclose(x, decayed if decays else plain, rtol=2e-5, atol=1e-6, err_msg=f"step {t}")


def test_the_scheduled_learning_rate_applied_last_is_readable():
    opt = O.adam(_schedule)
    params = {"w": jnp.zeros(2)}
    state = opt.init(params)
    for t in range(5):
        _, state = opt.update({"w": jnp.ones(2)}, state, params)
        np.testing.assert_allclose(opt.get_state(state, "scale_by_learning_rate.learning_rate"), _schedule(t),
                                   rtol=1e-6)
    assert O.adam(3e-4).get_state(O.adam(3e-4).init(params), "scale_by_learning_rate.learning_rate") == 3e-4


def test_axon_defaults_that_differ_from_optax():
    # adam: Axon's eps_root is 1e-15, optax's 0; adamw/lamb: Axon's decay is 0, optax's weight_decay 1e-4.
    assert O.adam().stages[0].option("eps_root") == 1e-15
    assert O.adamw().stages[1].option("decay") == 0.0
    assert O.lamb().stages[1].option("decay") == 0.0
    # yogi: Axon's learning rate is 1e-2 and its accumulators start at 1e-6, as scale_by_yogi's.
    assert O.yogi().stages[0].option("initial_accumulator_value") == 1e-6
    # noisy_sgd: the noise is added to the gradient before the learning rate (the paper), not after.
    assert [s.label for s in O.noisy_sgd().stages] == ["add_noise", "scale_by_learning_rate"]


def _rosenbrock(p):
    # b = 10 keeps the curvature at the optimum (~100) within reach of SGD's default learning rate 1e-2.
    return (1 - p["x"]) ** 2 + 10 * (p["y"] - p["x"] ** 2) ** 2


def _quadratic(p):
    return jnp.sum(jnp.asarray([1.0, 10.0]) * (p["v"] - jnp.asarray([1.0, -2.0])) ** 2)


def _minimise(opt, loss, params, steps):
    per_example = any(stage.per_example for stage in opt.stages)

    def body(carry, _):
        params, state = carry
        # (loss= is for polyak_sgd, value_fn= for lbfgs's line search; the others ignore them)
        value, grads = jax.value_and_grad(loss)(params)
        if per_example:  # dpsgd: a batch of identical examples
            grads = jax.tree.map(lambda g: jnp.broadcast_to(g, (EXAMPLES, *g.shape)), grads)
        updates, state = opt.update(grads, state, params, loss=value, value_fn=loss)
        return (ux.apply_updates(params, updates), state), None

    (params, _), _ = jax.jit(lambda c: jax.lax.scan(body, c, None, length=steps))((params, opt.init(params)))
    return params


# Steps for the convergence test and, where a method does not reach the optimum with its default constant
# learning rate, why (both behaviours are optax's too: the parity tests pin the numbers).
STEPS = {name: 20_000 for name in O.__all__}
# AdaDelta's step grows with its running average of steps: it reaches the optimum within ~1000 steps on this
# Rosenbrock and then drifts away again.
STEPS["adadelta"] = 1_000
# L-BFGS with its line search ends within ~50 steps (tests/test_lbfgs.py); 20,000 would only repeat evaluations.
STEPS["lbfgs"] = 200
# Fromage's weight shrinkage 1/sqrt(1+lr^2) balances its relative step at a point short of the optimum unless
# the learning rate decays; it gets within that neighbourhood.
# D-Adaptation's estimate settles at d ≈ 0.6, and Adam at a constant learning rate of 0.6 hovers around the
# optimum (the loss goes between 5e-4 and 0.05 over the run; optax's dadapt_adamw ends at a loss of 0.03).
NEAR = {"fromage": 0.35, "adadelta": 0.1, "dadapt_adamw": 0.1}
# DP-SGD's examples: its noise has standard deviation l2_norm_clip·noise_multiplier / EXAMPLES per step.
EXAMPLES = 64
#: Optimizers run with another learning rate than their default, and why.
LEARNING_RATES = {
    # Adagrad's steps shrink like lr/sqrt(t): with Axon's default lr 1e-3 it covers ~2e-3*sqrt(T), far too
    # little to reach an optimum 2 units away in a test budget.
    "adagrad": 0.5,
    # Optimistic gradient descent x' = x - η(2g - g_prev) is stable on a curvature L only for ηL < 2/3 (gradient
    # descent: ηL < 2); at the optimum L ≈ 102, so its default η = 0.01 circles around it, as optax's does.
    "optimistic_gradient_descent": 0.005,
    # optax's default 1.0 is SGD's step on a curvature of ~100 at the optimum: it diverges there (NaN after 20,000
    # steps), as optax's does; sgd's default 0.01 converges.
    "schedule_free_sgd": 0.01,
}


@pytest.mark.parametrize("name", sorted(O.__all__))
def test_every_optimizer_converges_with_its_defaults(name):
    opt = getattr(O, name)(LEARNING_RATES[name]) if name in LEARNING_RATES else getattr(O, name)()
    near = NEAR.get(name, 0.1)
    p = _minimise(opt, _rosenbrock, {"x": jnp.asarray(0.0), "y": jnp.asarray(0.0)}, STEPS[name])
    assert abs(float(p["x"]) - 1) < near and abs(float(p["y"]) - 1) < 2 * near, (name, p)
    assert float(_rosenbrock(p)) < (50 if name in NEAR else 1) * 1e-2 * float(_rosenbrock({"x": 0.0, "y": 0.0}))
    q = _minimise(opt, _quadratic, {"v": jnp.zeros(2)}, STEPS[name])
    np.testing.assert_allclose(q["v"], [1.0, -2.0], atol=0.05)


def test_adafactor_defaults_to_the_papers_relative_step():
    opt = O.adafactor()
    params = {"w": jnp.ones((4, 3))}
    state = opt.init(params)
    used = []
    for _ in range(4):
        _, state = opt.update({"w": jnp.ones((4, 3))}, state, params)
        used.append(float(opt.get_state(state, "scale[0].step_size")))
    np.testing.assert_allclose(used, [1e-2] * 4)  # min(1e-2, 1/sqrt(t)) is capped for t < 10^4
    assert float(ux.schedules.relative_step()(39_999)) == pytest.approx(0.005)


def test_schedule_free_eval_params_match_optax():
    opt = O.schedule_free_adamw(0.05, b1=0.8, b2=0.95, eps=1e-7, decay=0.01)
    ref = optax.contrib.schedule_free_adamw(0.05, b1=0.8, b2=0.95, eps=1e-7, weight_decay=0.01)
    p1 = p2 = nested_tree(seed=0)
    s1, s2 = opt.init(p1), ref.init(p2)
    for t in range(10):
        g = nested_tree(seed=t + 1)
        u1, s1 = opt.update(g, s1, p1)
        u2, s2 = ref.update(g, s2, p2)
        p1, p2 = ux.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    e1 = ux.schedule_free_eval_params(opt, s1, p1)
    e2 = optax.contrib.schedule_free_eval_params(s2, p2)
    for x, y in zip(jax.tree.leaves(e1), jax.tree.leaves(e2)):
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6)
    # The averaged params differ from the training params, which are left untouched.
    assert not np.allclose(jax.tree.leaves(e1)[0], jax.tree.leaves(p1)[0])


def test_schedule_free_adamw_keeps_no_first_moment():
    """Adam without momentum is RMSProp with Adam's bias correction and eps outside the root: the same numbers as
    ``scale_by_adam(b1=0, eps_root=0)``, whose ``mu`` (= g) the optimizer does not keep. Its state holds as many
    params-sized arrays as optax's: the base iterate z and the second moment."""
    params = nested_tree(seed=0)
    rms = ux.scale_by_rms(0.95, 1e-7, eps_in_sqrt=False, bias_correction=True)
    adam = ux.scale_by_adam(b1=0.0, b2=0.95, eps=1e-7, eps_root=0.0)
    s_rms, s_adam = rms.init(params), adam.init(params)
    for t in range(5):
        g = nested_tree(seed=t + 1)
        u_rms, s_rms = jax.jit(rms.update)(g, s_rms)
        u_adam, s_adam = jax.jit(adam.update)(g, s_adam)
        for x, y in zip(jax.tree.leaves(u_rms), jax.tree.leaves(u_adam)):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=0)

    def params_sized(state):
        return sum(x.size for x in jax.tree.leaves(state) if x.ndim > 0)

    n = params_sized(params)
    opt = O.schedule_free_adamw(0.05, decay=0.01)
    ref = optax.contrib.schedule_free_adamw(0.05, weight_decay=0.01)
    assert params_sized(opt.init(params)) == params_sized(ref.init(params)) == 2 * n
    assert opt.get_state(opt.init(params), "schedule_free/scale_by_rms.count") == 0


def test_schedule_free_averages_the_stored_base_iterates():
    """At a constant learning rate the averaging weights are equal, so the evaluated params are the mean of the
    base iterates z_1..z_t (the paper's x_t). The params move with the step z took as stored: with z kept in
    bfloat16 and the params in float32, the mean of the stored z's comes back to float32 rounding, where moving
    the params by the unrounded step would leave bfloat16's rounding divided by b1 in it."""
    b1 = 0.25
    opt = ux.scale_by_learning_rate(0.1).schedule_free(0.1, b1=b1, state_dtype=jnp.bfloat16)
    params = nested_tree(seed=0)
    state = opt.init(params)
    zs = []
    for t in range(4):
        u, state = jax.jit(opt.update)(nested_tree(seed=t + 1), state, params)
        params = ux.apply_updates(params, u)
        zs.append(jax.tree.map(lambda z: z.astype(jnp.float32), opt.get_state(state, "schedule_free.z")))
    mean = jax.tree.map(lambda *z: sum(z) / len(z), *zs)
    evaluated = ux.schedule_free_eval_params(opt, state, params)
    for x, m in zip(jax.tree.leaves(evaluated), jax.tree.leaves(mean)):
        np.testing.assert_allclose(x, m, rtol=2e-5, atol=2e-5)


def test_schedule_free_warmup_rises_linearly_then_holds():
    opt = O.schedule_free_adamw(0.01, warmup_steps=4)
    params = {"w": jnp.zeros(2)}
    state = opt.init(params)
    used = []
    for _ in range(6):
        _, state = opt.update({"w": jnp.ones(2)}, state, params)
        used.append(float(opt.get_state(state, "schedule_free/scale_by_learning_rate.learning_rate")))
    np.testing.assert_allclose(used, [0.0, 0.0025, 0.005, 0.0075, 0.01, 0.01], rtol=1e-6)


def test_schedule_free_adamw_warms_up_to_a_number_only():
    with pytest.raises(TypeError, match=r"schedule_free_adamw\(learning_rate=.*\): learning_rate must be a real number"):
        O.schedule_free_adamw(lambda count: 0.01, warmup_steps=10)
    assert O.schedule_free_adamw(lambda count: 0.01).stages[0].scheduled == {"learning_rate"}
