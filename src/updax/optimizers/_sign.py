"""Sign-based optimizers: Lion, signSGD, Signum and Rprop."""

from __future__ import annotations

from collections.abc import Callable

from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer
from updax.updates import scale_by_lion, scale_by_rprop, scale_by_sign, trace


@optimizer
def lion(learning_rate: ScalarOrSchedule = 1e-4, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.99,
         decay: ScalarOrSchedule = 1e-3, *, mu_dtype: DType = None, mask: PyTree | Callable[[PyTree],
         PyTree] | None = None, cautious_decay: bool = False, maximize: bool = False, mode: str = "hard",
         smooth_beta: ScalarOrSchedule = 1.0) -> Update:
    """Lion: the sign of an interpolated momentum, with decoupled weight decay.

    Pipeline: ``scale_by_lion(b1, b2) |> add_decayed_weights(decay) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number >= 0 or a schedule; the paper advises 3-10x below
            AdamW's. Default: ``0.0001``.
        b1: interpolation weight of the momentum. Default: ``0.9``.
        b2: momentum decay. Default: ``0.99``.
        decay: decoupled weight decay (optax's default). Default: ``0.001``.
        mu_dtype: storage dtype of the momentum. Default: ``None``.
        mask: which leaves decay: a pytree of bools shaped like the params (or
            a prefix of it), or a function of the params returning one; None
            decays every leaf. Default: ``None``.
        cautious_decay: decay a coordinate only where the update and the
            param agree in sign (cautious weight decay,
            ``add_decayed_weights(cautious=True)``); prints only when True.
            Default: ``False``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.
        mode: the map of the interpolated momentum: ``"hard"`` (its sign,
            the paper's), ``"smooth"`` (tanh) or ``"refined"`` (clipped to
            [-1, 1]); see ``scale_by_lion``. Default: ``'hard'``.
        smooth_beta: the slope of ``"smooth"``'s tanh, > 0; only with
            ``mode="smooth"``. Default: ``1.0``.

    Returns:
        An update object; ``update`` needs ``params``.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.lion()
        scale_by_lion(b1=0.9, b2=0.99) |> add_decayed_weights(decay=0.001) |> scale_by_learning_rate(learning_rate=0.0001)

    References:
        Chen et al., "Symbolic Discovery of Optimization Algorithms", NeurIPS 2023.
        https://arxiv.org/abs/2302.06675
    """
    pipeline = (scale_by_lion(b1=b1, b2=b2, mu_dtype=mu_dtype, mode=mode, smooth_beta=smooth_beta)
                .add_decayed_weights(decay=decay, mask=mask, cautious=cautious_decay)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)


@optimizer
def sign_sgd(learning_rate: ScalarOrSchedule = 1e-3, *, maximize: bool = False) -> Update:
    """signSGD: descend along the sign of the gradient.

    Pipeline: ``scale_by_sign() |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.001``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.sign_sgd()
        scale_by_sign() |> scale_by_learning_rate(learning_rate=0.001)

    References:
        Bernstein et al., "signSGD: Compressed Optimisation for Non-Convex
        Problems", ICML 2018. https://arxiv.org/abs/1802.04434
    """
    return maximized(maximize, scale_by_sign().scale_by_learning_rate(learning_rate))


@optimizer
def signum(learning_rate: ScalarOrSchedule = 1e-3, momentum: ScalarOrSchedule = 0.9, *,
           accumulator_dtype: DType = None, maximize: bool = False) -> Update:
    """Signum: signSGD on a momentum of the gradients.

    Pipeline: ``trace(momentum) |> scale_by_sign() |> scale_by_learning_rate(lr)``.
    The trace is the EMA of the paper times ``1/(1-momentum)``, so its sign
    is the same.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.001``.
        momentum: the momentum decay. Default: ``0.9``.
        accumulator_dtype: storage dtype of the momentum. Default: ``None``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.signum()
        trace(decay=0.9, nesterov=False) |> scale_by_sign() |> scale_by_learning_rate(learning_rate=0.001)

    References:
        Bernstein et al., "signSGD: Compressed Optimisation for Non-Convex
        Problems", ICML 2018.
    """
    pipeline = trace(decay=momentum, accumulator_dtype=accumulator_dtype).scale_by_sign().scale_by_learning_rate(
            learning_rate)
    return maximized(maximize, pipeline)


@optimizer
def rprop(learning_rate: ScalarOrSchedule = 1e-3, eta_minus: ScalarOrSchedule = 0.5, eta_plus: ScalarOrSchedule = 1.2,
          min_step_size: ScalarOrSchedule = 1e-6, max_step_size: ScalarOrSchedule = 50.0,
          *, maximize: bool = False) -> Update:
    """Rprop (iRprop-): per-element steps grown or shrunk by sign agreement.

    Pipeline: ``scale_by_rprop(...) |> scale(-1.0)``; the step sizes are the
    learning rate, so there is no ``scale_by_learning_rate``.

    Args:
        learning_rate: the initial step size. Default: ``0.001``.
        eta_minus: shrink factor on a sign change. Default: ``0.5``.
        eta_plus: growth factor on agreement. Default: ``1.2``.
        min_step_size: the smallest step. Default: ``1e-06``.
        max_step_size: the largest step. Default: ``50.0``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.rprop()
        scale_by_rprop(learning_rate=0.001, eta_minus=0.5, eta_plus=1.2, min_step_size=1e-06, max_step_size=50.0) |> scale(step_size=-1.0)

    References:
        Riedmiller & Braun, 1993; Igel & Hüsken, "Improving the Rprop Learning
        Algorithm", 2000.
    """
    pipeline = scale_by_rprop(learning_rate=learning_rate, eta_minus=eta_minus, eta_plus=eta_plus,
                              min_step_size=min_step_size, max_step_size=max_step_size).scale(-1.0)
    return maximized(maximize, pipeline)
