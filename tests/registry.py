"""One registry of every catalogue entry: it drives the contract tests.

Each entry builds the combinator with options that exercise it (all numbers
explicit), and says whether ``update`` needs params. A test checks that the
registry covers the whole public catalogue, so a new entry cannot skip the
contract.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import updax as ux


def _by_rank(params):
    return jax.tree.map(lambda p: "adam" if p.ndim >= 2 else "sgd", params)


def _matrices(params):
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def _halving(count):
    return 0.5 ** (count / 2)


ENTRIES = {
    "scale": lambda: ux.scale(-0.5),
    "scale_by_adam": lambda: ux.scale_by_adam(b1=0.8, b2=0.95, eps=1e-8, eps_root=1e-15),
    "scale_by_belief": lambda: ux.scale_by_belief(b1=0.8, b2=0.95, eps=1e-8, eps_root=1e-16),
    "scale_by_radam": lambda: ux.scale_by_radam(b1=0.8, b2=0.9, eps=1e-8, eps_root=0.0, threshold=5.0),
    "scale_by_rms": lambda: ux.scale_by_rms(decay=0.9, eps=1e-8, initial_scale=0.0),
    "scale_by_rss": lambda: ux.scale_by_rss(initial_accumulator_value=0.1, eps=1e-7),
    "scale_by_stddev": lambda: ux.scale_by_stddev(decay=0.9, eps=1e-8, initial_scale=0.0),
    "scale_by_schedule": lambda: ux.scale_by_schedule(_halving),
    "scale_by_state": lambda: ux.scale_by_state(-0.1),
    "scale_by_learning_rate": lambda: ux.scale_by_learning_rate(0.1),
    "reduce_on_plateau": lambda: ux.reduce_on_plateau(factor=0.5, patience=2, rtol=1e-4, atol=0.0, cooldown=1,
                                                      accumulation_size=1, min_scale=0.01),
    "scale_by_trust_ratio": lambda: ux.scale_by_trust_ratio(min_norm=0.0, trust_coefficient=0.5, eps=1e-6),
    "scale_by_yogi": lambda: ux.scale_by_yogi(initial_accumulator_value=1e-6, b1=0.9, b2=0.999, eps=1e-3,
                                              eps_root=0.0),
    "trace": lambda: ux.trace(decay=0.9, nesterov=False),
    "trace_nesterov": lambda: ux.trace(decay=0.5, nesterov=True),
    "clip": lambda: ux.clip(delta=0.5),
    "clip_by_global_norm": lambda: ux.clip_by_global_norm(max_norm=1.0),
    "centralize": lambda: ux.centralize(),
    "add_decayed_weights": lambda: ux.add_decayed_weights(decay=0.1),
    "add_noise": lambda: ux.add_noise(eta=0.01, gamma=0.55, key=3),
    "accumulate_gradients": lambda: ux.scale_by_adam().scale(-0.1).accumulate_gradients(
        2, should_skip=ux.skip_large_updates(1e6)),
    "apply_if_finite": lambda: ux.scale_by_adam().scale(-0.1).apply_if_finite(3),
    "ema": lambda: ux.ema(0.9, debias=True, init=0.5, decay_min=True, keep_previous=True),
    "sma": lambda: ux.sma(3),
    "weighted_moving_average": lambda: ux.weighted_moving_average(0.8),
    "ema_params": lambda: ux.scale(-0.1).ema_params(0.9, decay_min=True),
    "swa": lambda: ux.scale(-0.1).swa(start=2, period=1),
    "freeze": lambda: ux.scale(-0.1).freeze(_matrices),
    "scale_by_lion": lambda: ux.scale_by_lion(b1=0.9, b2=0.99),
    "scale_by_amsgrad": lambda: ux.scale_by_amsgrad(b1=0.8, b2=0.95, eps=1e-8, eps_root=0.0),
    "scale_by_adamax": lambda: ux.scale_by_adamax(b1=0.8, b2=0.95, eps=1e-8),
    "scale_by_nadam": lambda: ux.scale_by_nadam(b1=0.8, b2=0.95, eps=1e-8, eps_root=0.0),
    "scale_by_novograd": lambda: ux.scale_by_novograd(b1=0.9, b2=0.25, eps=1e-8, eps_root=0.0, decay=1e-3),
    "scale_by_adadelta": lambda: ux.scale_by_adadelta(rho=0.9, eps=1e-6),
    "scale_by_rprop": lambda: ux.scale_by_rprop(learning_rate=1e-3, eta_minus=0.5, eta_plus=1.2, min_step_size=1e-6,
                                                max_step_size=50.0),
    "scale_by_sign": lambda: ux.scale_by_sign(),
    "partition": lambda: ux.partition({"adam": ux.scale_by_adam(), "sgd": ux.scale(-0.1)}, _by_rank),
    "masked": lambda: ux.scale_by_adam().masked(_matrices),
    "scale_by_factored_rms": lambda: ux.scale_by_factored_rms(factored=True, decay_rate=0.8, step_offset=0,
                                                              min_dim_size_to_factor=2, epsilon=1e-30),
    "scale_by_param_block_rms": lambda: ux.scale_by_param_block_rms(min_scale=1e-3),
    "scale_by_shape": lambda: ux.scale_by_shape(),
    "clip_by_block_rms": lambda: ux.clip_by_block_rms(threshold=1.0),
    "scale_by_sm3": lambda: ux.scale_by_sm3(b1=0.9, b2=1.0, eps=1e-8),
    "scale_by_newton_schulz": lambda: ux.scale_by_newton_schulz(ns_coeffs=(3.4445, -4.7750, 2.0315), ns_steps=5,
                                                                eps=1e-8),
    "scale_by_muon": lambda: ux.scale_by_muon(ns_coeffs=(3.4445, -4.7750, 2.0315), ns_steps=5, beta=0.95, eps=1e-8,
                                              nesterov=True),
    "schedule_free": lambda: ux.scale_by_adam(b1=0.0).scale_by_learning_rate(0.1).schedule_free(0.1, b1=0.9),
    "scale_by_adan": lambda: ux.scale_by_adan(b1=0.98, b2=0.92, b3=0.99, eps=1e-8, eps_root=0.0),
    "zero_nans": lambda: ux.zero_nans(),
    "keep_params_nonnegative": lambda: ux.keep_params_nonnegative(),
    "snapshot": lambda: ux.scale(-0.5).snapshot(),
}

#: Entries whose ``update`` needs ``params``.
NEEDS_PARAMS = {"scale_by_trust_ratio", "add_decayed_weights", "scale_by_novograd", "schedule_free",
                "scale_by_param_block_rms", "ema_params", "swa", "keep_params_nonnegative"}

#: Entries with no per-param state and no params argument: they accept any update tree.
ANY_TREE = {"scale", "clip", "clip_by_global_norm", "centralize", "scale_by_schedule", "scale_by_state", "add_noise",
            "scale_by_learning_rate", "reduce_on_plateau", "scale_by_sign", "clip_by_block_rms",
            "scale_by_newton_schulz", "scale_by_shape", "freeze"}

#: Public names of ``updax.updates`` that are not catalogue combinators.
NOT_COMBINATORS = {"apply_updates", "combinator", "compose", "identity", "stateful", "stateless", "global_norm",
                   "schedule_free_eval_params", "averaged_params", "has_updated", "skip_not_finite",
                   "skip_large_updates"}


def catalogue_names():
    return sorted(set(ux.updates.__all__) - NOT_COMBINATORS)


def nested_tree(dtype=jnp.float32, seed=0):
    """Dicts, lists, tuples, None leaves, empty subtrees and a scalar."""
    key = iter(range(seed * 100, seed * 100 + 100))

    def arr(*shape):
        import numpy as np

        return jnp.asarray(np.random.default_rng(next(key)).normal(size=shape), dtype)

    return {
        "dense": {"w": arr(3, 4), "b": arr(4)},
        "layers": [arr(2, 2, 3), (arr(5), None)],
        "empty": {},
        "nothing": None,
        "empty_list": [],
        "scalar": arr(),
    }
