"""Stochastic gradient descent: plain, with (Nesterov) momentum, and with annealed gradient noise."""

from __future__ import annotations

import jax

from updax import _validate as check
from updax._typing import DType, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer
from updax.updates import add_noise, scale_by_learning_rate, trace


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
