"""Optimizers scaled by a second moment alone: RMSProp, AdaGrad and AdaDelta."""

from __future__ import annotations

from collections.abc import Callable

from updax import _validate as check
from updax._typing import PyTree, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer
from updax.updates import add_decayed_weights, scale_by_rms, scale_by_rss, scale_by_stddev


@optimizer
def rmsprop(learning_rate: ScalarOrSchedule = 1e-2, centered: bool = False, momentum: ScalarOrSchedule | None = None,
            nesterov: bool = False, decay: ScalarOrSchedule = 0.9, eps: ScalarOrSchedule = 1e-8,
            initial_scale: ScalarOrSchedule = 0.0, *, eps_in_sqrt: bool = True,
            bias_correction: bool = False, maximize: bool = False) -> Update:
    """RMSProp, optionally centred and with momentum.

    Pipeline: ``scale_by_rms`` (or ``scale_by_stddev`` when centred)
    ``|> scale_by_learning_rate(learning_rate)``, then ``|> trace(momentum, nesterov)``
    when ``momentum`` is given (Axon's order).

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.01``.
        centered: scale by the centred second moment. Default: ``False``.
        momentum: the trace decay, or None for no momentum. Default: ``None``.
        nesterov: Nesterov momentum (with ``momentum`` set). Default: ``False``.
        decay: EMA decay of the squares. Default: ``0.9``.
        eps: added inside the square root. Default: ``1e-08``.
        initial_scale: initial second moment. Default: ``0.0``.
        eps_in_sqrt: add ``eps`` inside the square root rather than to it
            (optax's option). Default: ``True``.
        bias_correction: divide the moments by ``1-decay^t``, as Adam does
            (optax's option). Default: ``False``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.rmsprop(momentum=0.9)
        scale_by_rms(decay=0.9, eps=1e-08, initial_scale=0.0) |> scale_by_learning_rate(learning_rate=0.01) |> trace(decay=0.9, nesterov=False)

    References:
        Tieleman & Hinton, "Lecture 6.5 - RMSProp", 2012; Graves, "Generating
        Sequences With Recurrent Neural Networks", 2013.
    """
    check.flag("rmsprop", "centered", centered)
    scaling = scale_by_stddev if centered else scale_by_rms
    opt = scaling(decay=decay, eps=eps, initial_scale=initial_scale, eps_in_sqrt=eps_in_sqrt,
                  bias_correction=bias_correction).scale_by_learning_rate(learning_rate)
    if momentum is not None:
        opt = opt.trace(decay=momentum, nesterov=nesterov)
    return maximized(maximize, opt)


@optimizer
def adagrad(learning_rate: ScalarOrSchedule = 1e-3, initial_accumulator_value: ScalarOrSchedule = 0.1,
            eps: ScalarOrSchedule = 1e-7, *, maximize: bool = False) -> Update:
    """AdaGrad: steps scaled by the root of the sum of all squared gradients so far.

    Pipeline: ``scale_by_rss(initial_accumulator_value, eps) |> scale_by_learning_rate(learning_rate)``.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.001``.
        initial_accumulator_value: initial sum of squares. Default: ``0.1``.
        eps: added inside the square root. Default: ``1e-07``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.adagrad()
        scale_by_rss(initial_accumulator_value=0.1, eps=1e-07) |> scale_by_learning_rate(learning_rate=0.001)

    References:
        Duchi et al., "Adaptive Subgradient Methods for Online Learning and
        Stochastic Optimization", JMLR 2011.
    """
    pipeline = scale_by_rss(initial_accumulator_value=initial_accumulator_value, eps=eps).scale_by_learning_rate(
            learning_rate)
    return maximized(maximize, pipeline)


@optimizer
def adadelta(learning_rate: ScalarOrSchedule = 1.0, rho: ScalarOrSchedule = 0.9, eps: ScalarOrSchedule = 1e-6,
             decay: ScalarOrSchedule = 0.0, *, mask: PyTree | Callable[[PyTree], PyTree] | None = None,
             maximize: bool = False) -> Update:
    """AdaDelta: steps sized by the RMS of past steps over the RMS of gradients.

    Pipeline: ``add_decayed_weights(decay) |> scale_by_adadelta(rho, eps) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number >= 0 or a schedule; the paper has none, i.e. 1.
            Default: ``1.0``.
        rho: decay of both running averages. Default: ``0.9``.
        eps: added inside both roots. Default: ``1e-06``.
        decay: weight decay added to the gradient. Default: ``0.0``.
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
        >>> ux.optimizers.adadelta()
        add_decayed_weights(decay=0.0) |> scale_by_adadelta(rho=0.9, eps=1e-06) |> scale_by_learning_rate(learning_rate=1.0)

    References:
        Zeiler, "ADADELTA: An Adaptive Learning Rate Method", 2012. https://arxiv.org/abs/1212.5701
    """
    pipeline = (add_decayed_weights(decay=decay, mask=mask).scale_by_adadelta(rho=rho, eps=eps)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)
