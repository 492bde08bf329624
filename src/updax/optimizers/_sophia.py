"""Sophia: a clipped, diagonal second-order step, for language-model pre-training."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import optimizer
from updax.updates import scale_by_sophia


@optimizer
def sophia(learning_rate: ScalarOrSchedule = 3e-4, b1: ScalarOrSchedule = 0.965, b2: ScalarOrSchedule = 0.99,
           eps: ScalarOrSchedule = 1e-8, decay: ScalarOrSchedule = 1e-4, gamma: ScalarOrSchedule = 0.01,
           clip_threshold: ScalarOrSchedule | None = 1.0, update_interval: int = 10, *, key: int | jax.Array = 0,
           objective: Callable[..., Any] | None = None, mu_dtype: DType = None, hessian_dtype: DType = None,
           mask: PyTree | Callable[[PyTree], PyTree] | None = None, verbose: bool = False,
           print_win_rate_every_n_steps: int = 0) -> Update:
    """Sophia-H: the momentum over a running Hessian-diagonal estimate, clipped, with weight decay.

    Pipeline: ``scale_by_sophia(b1, b2, eps, gamma, clip_threshold,
    update_interval, key, objective) |> add_decayed_weights(decay, mask) |>
    scale_by_learning_rate(learning_rate)``, as optax's ``contrib.sophia``
    composes it: each coordinate moves by at most ``learning_rate`` times
    ``clip_threshold``, plus the decay. The Hessian estimate needs the
    objective: call ``update(grads, state, params, value_fn=f)`` (optax's
    ``obj_fn=``), where ``f(params)`` returns the loss of the step's batch, or
    build the optimizer with ``objective=f`` for a fixed objective. optax's
    ``weight_decay`` and ``weight_decay_mask`` are ``decay`` and ``mask``
    here, its ``hutchinson_estimator_diag_hessian(random_seed)`` is ``key``;
    its win-rate printing is left out. No ``maximize``: the Hessian would be
    that of the function maximised, not of its negation.

    Args:
        learning_rate: a number >= 0 or a schedule; it bounds each
            coordinate's step. optax's has no default; 3e-4 is at the low end
            of the peak rates of the authors' GPT-2 small scripts (3e-4 to
            7e-4, with a warm-up). Default: ``0.0003``.
        b1: decay of the momentum. Default: ``0.965``.
        b2: decay of the Hessian estimate's moving average. Default: ``0.99``.
        eps: the smallest denominator. Default: ``1e-08``.
        decay: decoupled weight decay (optax's ``weight_decay``). Default: ``0.0001``.
        gamma: the factor of the Hessian estimate (the paper's 0.01 for
            Sophia-H). Default: ``0.01``.
        clip_threshold: the bound of each coordinate before the learning
            rate, or None for no clip. Default: ``1.0``.
        update_interval: the steps between refreshes of the Hessian
            estimate. Default: ``10``.
        key: the seed or PRNG key of the Rademacher vectors. Default: ``0``.
        objective: the objective ``f(params)``, for ``update`` calls without
            ``value_fn``. Default: ``None``.
        mu_dtype: storage dtype of the momentum. Default: ``None``.
        hessian_dtype: storage dtype of the Hessian estimate. Default: ``None``.
        mask: which leaves decay: a pytree of bools shaped like the params (or
            a prefix of it), or a function of the params returning one; None
            decays every leaf (optax's ``weight_decay_mask``). Default: ``None``.
        verbose: print the win rate, the fraction of coordinates not
            clipped, every ``print_win_rate_every_n_steps`` steps (see
            :func:`updax.scale_by_sophia`); prints only when True.
            Default: ``False``.
        print_win_rate_every_n_steps: the steps between prints, an integer >= 0
            (0: never); prints only when not 0. Default: ``0``.

    Returns:
        An update object; it needs params and the objective.

    Example:
        >>> import updax as ux
        >>> [s.label for s in ux.optimizers.sophia().stages]
        ['scale_by_sophia', 'add_decayed_weights', 'scale_by_learning_rate']

    References:
        Liu et al., "Sophia: A Scalable Stochastic Second-order Optimizer
        for Language Model Pre-training", ICLR 2024.
        https://arxiv.org/abs/2305.14342
    """
    return (scale_by_sophia(b1=b1, b2=b2, eps=eps, gamma=gamma, clip_threshold=clip_threshold,
                            update_interval=update_interval, key=key, objective=objective, mu_dtype=mu_dtype,
                            hessian_dtype=hessian_dtype, verbose=verbose,
                            print_win_rate_every_n_steps=print_win_rate_every_n_steps)
            .add_decayed_weights(decay=decay, mask=mask).scale_by_learning_rate(learning_rate))
