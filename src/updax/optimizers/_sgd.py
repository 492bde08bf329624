"""Stochastic gradient descent: plain, with (Nesterov) momentum, with annealed gradient noise, schedule-free."""

from __future__ import annotations

from collections.abc import Callable

import jax

from updax import _validate as check
from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer, warmed_up
from updax.updates import add_decayed_weights, add_noise, scale_by_learning_rate, trace


@optimizer
def sgd(learning_rate: ScalarOrSchedule = 1e-2, momentum: ScalarOrSchedule | None = None,
        nesterov: bool = False, *, accumulator_dtype: DType = None, maximize: bool = False) -> Update:
    """Stochastic gradient descent, optionally with (Nesterov) momentum.

    Pipeline: ``trace(momentum, nesterov) |> scale_by_learning_rate(learning_rate)``,
    without the trace when ``momentum`` is None.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.01``.
        momentum: the trace decay, or None for plain SGD. Default: ``None``.
        nesterov: Nesterov momentum (with ``momentum`` set). Default: ``False``.
        accumulator_dtype: storage dtype of the momentum (``trace``'s, with
            ``momentum`` set): None (at least float32), a floating or a
            complex dtype. Default: ``None``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.sgd(0.1, momentum=0.9, nesterov=True)
        trace(decay=0.9, nesterov=True) |> scale_by_learning_rate(learning_rate=0.1)

    References:
        Robbins & Monro, 1951; Sutskever et al., "On the importance of
        initialization and momentum in deep learning", ICML 2013.
    """
    check.flag("sgd", "nesterov", nesterov)
    if momentum is None:
        return maximized(maximize, scale_by_learning_rate(learning_rate))
    momentum_stage = trace(decay=momentum, nesterov=nesterov, accumulator_dtype=accumulator_dtype)
    return maximized(maximize, momentum_stage.scale_by_learning_rate(learning_rate))


@optimizer
def noisy_sgd(learning_rate: ScalarOrSchedule = 1e-2, eta: ScalarOrSchedule = 0.01, gamma: ScalarOrSchedule = 0.55,
              key: int | jax.Array = 0, *, maximize: bool = False) -> Update:
    """SGD on gradients with annealed Gaussian noise added.

    Pipeline: ``add_noise(eta, gamma, key) |> scale_by_learning_rate(learning_rate)``:
    the noise is added to the gradient, as in the paper (Polaris adds it after
    the learning-rate scaling).

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.01``.
        eta: the initial noise variance. Default: ``0.01``.
        gamma: the annealing exponent. Default: ``0.55``.
        key: an int seed or a JAX PRNG key. Default: ``0``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.noisy_sgd(key=1)
        add_noise(eta=0.01, gamma=0.55, key=1) |> scale_by_learning_rate(learning_rate=0.01)

    References:
        Neelakantan et al., "Adding Gradient Noise Improves Learning for Very
        Deep Networks", 2015. https://arxiv.org/abs/1511.06807
    """
    return maximized(maximize, add_noise(eta=eta, gamma=gamma, key=key).scale_by_learning_rate(learning_rate))


@optimizer
def schedule_free_sgd(learning_rate: ScalarOrSchedule = 1.0, warmup_steps: int | None = None, b1: float = 0.9,
                      decay: ScalarOrSchedule = 0.0, weight_lr_power: ScalarOrSchedule = 2.0, *,
                      state_dtype: DType = None, mask: PyTree | Callable[[PyTree], PyTree] | None = None,
                      maximize: bool = False) -> Update:
    """Schedule-free SGD: SGD wrapped in schedule-free averaging (optax's ``schedule_free_sgd``).

    Pipeline: ``add_decayed_weights(decay) |> scale_by_learning_rate(lr)
    |> schedule_free(lr, b1, weight_lr_power)``; with ``warmup_steps`` the
    learning rate rises linearly from 0 over that many steps, then stays.
    Evaluate at ``ux.schedule_free_eval_params(opt, state, params)``. optax's
    ``weight_decay`` is ``decay`` here (its None is 0).

    Args:
        learning_rate: the peak learning rate (optax's 1.0), a number >= 0
            or, without ``warmup_steps``, a schedule. Default: ``1.0``.
        warmup_steps: length of the linear warm-up, or None. Default: ``None``.
        b1: the interpolation weight, a number in (0, 1), not a schedule (see
            :func:`updax.schedule_free`). Default: ``0.9``.
        decay: weight decay added to the gradients at the interpolated
            params (scaled by the learning rate, as in optax). Default: ``0.0``.
        weight_lr_power: power of the learning rate in the averaging weights.
            Default: ``2.0``.
        state_dtype: storage dtype of the base iterate ``z``. Default: ``None``.
        mask: which leaves decay: a pytree of bools shaped like the params (or
            a prefix of it), or a function of the params returning one; None
            decays every leaf. Default: ``None``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object; ``update`` needs ``params``.

    Example:
        >>> import updax as ux
        >>> [s.label for s in ux.optimizers.schedule_free_sgd().stages]
        ['schedule_free']
        >>> ux.optimizers.schedule_free_sgd(0.5, warmup_steps=10).stages[0].option("learning_rate")
        polynomial_decay(init_value=0.0, end_value=0.5, power=1.0, transition_steps=10, transition_begin=0)

    References:
        Defazio et al., "The Road Less Scheduled", NeurIPS 2024.
        https://arxiv.org/abs/2405.15682
    """
    learning_rate = warmed_up("schedule_free_sgd", learning_rate, warmup_steps)
    inner = add_decayed_weights(decay=decay, mask=mask).scale_by_learning_rate(learning_rate)
    pipeline = inner.schedule_free(learning_rate, b1=b1, weight_lr_power=weight_lr_power, state_dtype=state_dtype)
    return maximized(maximize, pipeline)
