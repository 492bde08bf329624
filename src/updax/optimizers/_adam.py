"""Optimizers of the Adam family: Adam, AdamW, AdaBelief, RAdam, Yogi, AMSGrad, AdaMax, NAdam, Adan,
and schedule-free AdamW."""

from __future__ import annotations

from collections.abc import Callable

from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer, warmed_up
from updax.updates import (
    scale_by_adam,
    scale_by_adamax,
    scale_by_adan,
    scale_by_amsgrad,
    scale_by_belief,
    scale_by_nadam,
    scale_by_radam,
    scale_by_rms,
    scale_by_yogi,
)


@optimizer
def adam(learning_rate: ScalarOrSchedule = 1e-3, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
         eps: ScalarOrSchedule = 1e-8, eps_root: ScalarOrSchedule = 1e-15, *, mu_dtype: DType = None,
         nu_dtype: DType = None, nesterov: bool = False, maximize: bool = False) -> Update:
    """Adam.

    Pipeline: ``scale_by_adam(b1, b2, eps, eps_root) |> scale_by_learning_rate(learning_rate)``.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.001``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root (Axon's default). Default: ``1e-15``.
        mu_dtype: storage dtype of the first moment. Default: ``None``.
        nu_dtype: storage dtype of the second moment. Default: ``None``.
        nesterov: Nesterov's look-ahead first moment (as optax's
            ``nesterov=True``). Default: ``False``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.adam(3e-4)
        scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=1e-15) |> scale_by_learning_rate(learning_rate=0.0003)

    References:
        Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015.
        https://arxiv.org/abs/1412.6980
    """
    pipeline = scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype,
                             nesterov=nesterov).scale_by_learning_rate(learning_rate)
    return maximized(maximize, pipeline)


@optimizer
def adamw(learning_rate: ScalarOrSchedule = 1e-3, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
          eps: ScalarOrSchedule = 1e-8, eps_root: ScalarOrSchedule = 1e-15, decay: ScalarOrSchedule = 0.0, *,
          mu_dtype: DType = None, nu_dtype: DType = None, nesterov: bool = False, mask: PyTree | Callable[[PyTree],
          PyTree] | None = None, cautious_decay: bool = False, maximize: bool = False) -> Update:
    """AdamW: Adam with decoupled weight decay.

    Pipeline: ``scale_by_adam(...) |> add_decayed_weights(decay) |> scale_by_learning_rate(learning_rate)``.
    (Axon's default ``decay`` is 0; optax's is 1e-4.)

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.001``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``1e-15``.
        decay: weight-decay rate. Default: ``0.0``.
        mu_dtype: storage dtype of the first moment. Default: ``None``.
        nu_dtype: storage dtype of the second moment. Default: ``None``.
        nesterov: Nesterov's look-ahead first moment (as optax's
            ``nesterov=True``). Default: ``False``.
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

    Returns:
        An update object; ``update`` needs ``params``.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.adamw(decay=1e-2)
        scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=1e-15) |> add_decayed_weights(decay=0.01) |> scale_by_learning_rate(learning_rate=0.001)

    References:
        Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR
        2019. https://arxiv.org/abs/1711.05101
    """
    pipeline = (scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype,
                              nesterov=nesterov)
                .add_decayed_weights(decay=decay, mask=mask, cautious=cautious_decay)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)


@optimizer
def adabelief(learning_rate: ScalarOrSchedule = 1e-3, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
              eps: ScalarOrSchedule = 0.0, eps_root: ScalarOrSchedule = 1e-16, *, nesterov: bool = False,
              maximize: bool = False) -> Update:
    """AdaBelief: Adam whose second moment tracks the spread of the gradient around its mean.

    Pipeline: ``scale_by_belief(b1, b2, eps, eps_root) |> scale_by_learning_rate(learning_rate)``.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.001``.
        b1: first-moment decay. Default: ``0.9``.
        b2: belief decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``0.0``.
        eps_root: added to the belief at every step. Default: ``1e-16``.
        nesterov: Nesterov's look-ahead first moment (as optax's
            ``nesterov=True``). Default: ``False``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.adabelief(1e-2)
        scale_by_belief(b1=0.9, b2=0.999, eps=0.0, eps_root=1e-16) |> scale_by_learning_rate(learning_rate=0.01)

    References:
        Zhuang et al., "AdaBelief Optimizer", NeurIPS 2020. https://arxiv.org/abs/2010.07468
    """
    pipeline = scale_by_belief(b1=b1, b2=b2, eps=eps, eps_root=eps_root, nesterov=nesterov).scale_by_learning_rate(
            learning_rate)
    return maximized(maximize, pipeline)


@optimizer
def radam(learning_rate: ScalarOrSchedule = 1e-3, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
          eps: ScalarOrSchedule = 1e-8, eps_root: ScalarOrSchedule = 0.0, threshold: ScalarOrSchedule = 5.0, *,
          nesterov: bool = False, maximize: bool = False) -> Update:
    """Rectified Adam.

    Pipeline: ``scale_by_radam(b1, b2, eps, eps_root, threshold) |> scale_by_learning_rate(learning_rate)``.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.001``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``0.0``.
        threshold: ``ρt`` from which the rectified step is used. Default: ``5.0``.
        nesterov: Nesterov's look-ahead first moment (as optax's
            ``nesterov=True``). Default: ``False``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.radam()
        scale_by_radam(b1=0.9, b2=0.999, eps=1e-08, eps_root=0.0, threshold=5.0) |> scale_by_learning_rate(learning_rate=0.001)

    References:
        Liu et al., "On the Variance of the Adaptive Learning Rate and Beyond",
        ICLR 2020. https://arxiv.org/abs/1908.03265
    """
    pipeline = scale_by_radam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, threshold=threshold,
                              nesterov=nesterov).scale_by_learning_rate(
            learning_rate)
    return maximized(maximize, pipeline)


@optimizer
def yogi(learning_rate: ScalarOrSchedule = 1e-2, initial_accumulator_value: ScalarOrSchedule = 1e-6,
         b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999, eps: ScalarOrSchedule = 1e-3,
         eps_root: ScalarOrSchedule = 0.0, *, maximize: bool = False) -> Update:
    """Yogi: Adam with an additive, sign-controlled second moment.

    Pipeline: ``scale_by_yogi(...) |> scale_by_learning_rate(learning_rate)``.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.01``.
        initial_accumulator_value: initial moments. Default: ``1e-06``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment rate. Default: ``0.999``.
        eps: added to the denominator. Default: ``0.001``.
        eps_root: added inside the square root. Default: ``0.0``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.yogi()
        scale_by_yogi(initial_accumulator_value=1e-06, b1=0.9, b2=0.999, eps=0.001, eps_root=0.0) |> scale_by_learning_rate(learning_rate=0.01)

    References:
        Zaheer et al., "Adaptive Methods for Nonconvex Optimization", NeurIPS 2018.
    """
    pipeline = scale_by_yogi(initial_accumulator_value=initial_accumulator_value, b1=b1, b2=b2, eps=eps,
                             eps_root=eps_root).scale_by_learning_rate(learning_rate)
    return maximized(maximize, pipeline)


@optimizer
def amsgrad(learning_rate: ScalarOrSchedule = 1e-3, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
            eps: ScalarOrSchedule = 1e-8, eps_root: ScalarOrSchedule = 0.0, *, mu_dtype: DType = None,
            nu_dtype: DType = None, maximize: bool = False) -> Update:
    """AMSGrad: Adam with a non-decreasing second moment.

    Pipeline: ``scale_by_amsgrad(b1, b2, eps, eps_root) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.001``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``0.0``.
        mu_dtype: storage dtype of the first moment. Default: ``None``.
        nu_dtype: storage dtype of the second moments. Default: ``None``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.amsgrad()
        scale_by_amsgrad(b1=0.9, b2=0.999, eps=1e-08, eps_root=0.0) |> scale_by_learning_rate(learning_rate=0.001)

    References:
        Reddi et al., "On the Convergence of Adam and Beyond", ICLR 2018.
    """
    pipeline = scale_by_amsgrad(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype,
                                nu_dtype=nu_dtype).scale_by_learning_rate(learning_rate)
    return maximized(maximize, pipeline)


@optimizer
def adamax(learning_rate: ScalarOrSchedule = 2e-3, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
           eps: ScalarOrSchedule = 1e-8, *, maximize: bool = False) -> Update:
    """AdaMax: Adam with the infinity norm in place of the second moment.

    Pipeline: ``scale_by_adamax(b1, b2, eps) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number >= 0 or a schedule (the paper's 0.002). Default: ``0.002``.
        b1: first-moment decay. Default: ``0.9``.
        b2: decay of the infinity norm. Default: ``0.999``.
        eps: added inside the maximum (optax's placement). Default: ``1e-08``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.adamax()
        scale_by_adamax(b1=0.9, b2=0.999, eps=1e-08) |> scale_by_learning_rate(learning_rate=0.002)

    References:
        Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015, section 7.
    """
    return maximized(maximize, scale_by_adamax(b1=b1, b2=b2, eps=eps).scale_by_learning_rate(learning_rate))


@optimizer
def adamaxw(learning_rate: ScalarOrSchedule = 2e-3, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
            eps: ScalarOrSchedule = 1e-8, decay: ScalarOrSchedule = 1e-4, *, mask: PyTree | Callable[[PyTree],
            PyTree] | None = None, cautious_decay: bool = False, maximize: bool = False) -> Update:
    """AdaMax with decoupled weight decay.

    Pipeline: ``scale_by_adamax(...) |> add_decayed_weights(decay) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.002``.
        b1: first-moment decay. Default: ``0.9``.
        b2: decay of the infinity norm. Default: ``0.999``.
        eps: added inside the maximum. Default: ``1e-08``.
        decay: decoupled weight decay (optax's default). Default: ``0.0001``.
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

    Returns:
        An update object; ``update`` needs ``params``.

    Example:
        >>> import updax as ux
        >>> len(ux.optimizers.adamaxw().stages)
        3

    References:
        Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019.
    """
    pipeline = (scale_by_adamax(b1=b1, b2=b2, eps=eps)
                .add_decayed_weights(decay=decay, mask=mask, cautious=cautious_decay)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)


@optimizer
def nadam(learning_rate: ScalarOrSchedule = 2e-3, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
          eps: ScalarOrSchedule = 1e-8, eps_root: ScalarOrSchedule = 0.0, *, mu_dtype: DType = None,
          nu_dtype: DType = None, maximize: bool = False) -> Update:
    """NAdam: Adam with Nesterov momentum.

    Pipeline: ``scale_by_nadam(b1, b2, eps, eps_root) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number >= 0 or a schedule (Dozat's 0.002). Default: ``0.002``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``0.0``.
        mu_dtype: storage dtype of the first moment. Default: ``None``.
        nu_dtype: storage dtype of the second moment. Default: ``None``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.nadam()
        scale_by_nadam(b1=0.9, b2=0.999, eps=1e-08, eps_root=0.0) |> scale_by_learning_rate(learning_rate=0.002)

    References:
        Dozat, "Incorporating Nesterov Momentum into Adam", ICLR 2016 workshop.
    """
    pipeline = scale_by_nadam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype,
                              nu_dtype=nu_dtype).scale_by_learning_rate(learning_rate)
    return maximized(maximize, pipeline)


@optimizer
def nadamw(learning_rate: ScalarOrSchedule = 2e-3, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
           eps: ScalarOrSchedule = 1e-8, eps_root: ScalarOrSchedule = 0.0, decay: ScalarOrSchedule = 1e-4, *,
           mu_dtype: DType = None, nu_dtype: DType = None, mask: PyTree | Callable[[PyTree],
           PyTree] | None = None, cautious_decay: bool = False, maximize: bool = False) -> Update:
    """NAdamW: NAdam with decoupled weight decay.

    Pipeline: ``scale_by_nadam(...) |> add_decayed_weights(decay) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.002``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``0.0``.
        decay: decoupled weight decay (optax's default). Default: ``0.0001``.
        mu_dtype: storage dtype of the first moment. Default: ``None``.
        nu_dtype: storage dtype of the second moment. Default: ``None``.
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

    Returns:
        An update object; ``update`` needs ``params``.

    Example:
        >>> import updax as ux
        >>> [s.label for s in ux.optimizers.nadamw().stages]
        ['scale_by_nadam', 'add_decayed_weights', 'scale_by_learning_rate']

    References:
        Dozat, 2016; Loshchilov & Hutter, 2019.
    """
    pipeline = (scale_by_nadam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype)
                .add_decayed_weights(decay=decay, mask=mask, cautious=cautious_decay)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)


@optimizer
def adan(learning_rate: ScalarOrSchedule = 1e-3, b1: ScalarOrSchedule = 0.98, b2: ScalarOrSchedule = 0.92,
         b3: ScalarOrSchedule = 0.99, eps: ScalarOrSchedule = 1e-8, eps_root: ScalarOrSchedule = 1e-8,
         decay: ScalarOrSchedule = 0.0, *, mask: PyTree | Callable[[PyTree], PyTree] | None = None,
         cautious_decay: bool = False, maximize: bool = False) -> Update:
    """Adan: adaptive Nesterov momentum estimated from gradient differences.

    Pipeline: ``scale_by_adan(...) |> add_decayed_weights(decay) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.001``.
        b1: decay of the gradient average. Default: ``0.98``.
        b2: decay of the gradient-difference average. Default: ``0.92``.
        b3: decay of the second moment. Default: ``0.99``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root (optax's alias default). Default: ``1e-08``.
        decay: decoupled weight decay. Default: ``0.0``.
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

    Returns:
        An update object; ``update`` needs ``params``.

    Example:
        >>> import updax as ux
        >>> [s.label for s in ux.optimizers.adan().stages]
        ['scale_by_adan', 'add_decayed_weights', 'scale_by_learning_rate']

    References:
        Xie et al., "Adan: Adaptive Nesterov Momentum Algorithm for Faster
        Optimizing Deep Models", 2022. https://arxiv.org/abs/2208.06677
    """
    pipeline = (scale_by_adan(b1=b1, b2=b2, b3=b3, eps=eps, eps_root=eps_root)
                .add_decayed_weights(decay=decay, mask=mask, cautious=cautious_decay)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)


@optimizer
def schedule_free_adamw(learning_rate: ScalarOrSchedule = 2.5e-3, warmup_steps: int | None = None,
                        b1: float = 0.9, b2: ScalarOrSchedule = 0.999, eps: ScalarOrSchedule = 1e-8,
                        decay: ScalarOrSchedule = 0.0, weight_lr_power: ScalarOrSchedule = 2.0, *,
                        state_dtype: DType = None, mask: PyTree | Callable[[PyTree], PyTree] | None = None,
                        maximize: bool = False) -> Update:
    """Schedule-free AdamW: AdamW without momentum, wrapped in schedule-free averaging.

    Pipeline: ``scale_by_rms(b2, eps, eps_in_sqrt=False, bias_correction=True)
    |> add_decayed_weights(decay)
    |> scale_by_learning_rate(lr) |> schedule_free(lr, b1, weight_lr_power)``; with
    ``warmup_steps`` the learning rate rises linearly from 0 over that many
    steps, then stays. Evaluate at ``ux.schedule_free_eval_params(opt, state, params)``.
    The averaging weight uses the learning rate applied on the same step
    (optax evaluates the warm-up one step later there; with a constant rate
    the two agree exactly).

    Args:
        learning_rate: the peak learning rate (the reference's 0.0025), a number >= 0
            or, without ``warmup_steps``, a schedule. Default: ``0.0025``.
        warmup_steps: length of the linear warm-up, or None. Default: ``None``.
        b1: the interpolation weight, a number in (0, 1), not a schedule (see
            :func:`updax.schedule_free`). Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        decay: decoupled weight decay, applied at the interpolated
            params. Default: ``0.0``.
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
        >>> [s.label for s in ux.optimizers.schedule_free_adamw().stages]
        ['schedule_free']
        >>> ux.optimizers.schedule_free_adamw(warmup_steps=100).stages[0].option("learning_rate")
        polynomial_decay(init_value=0.0, end_value=0.0025, power=1.0, transition_steps=100, transition_begin=0)

    References:
        Defazio et al., "The Road Less Scheduled", NeurIPS 2024.
        https://arxiv.org/abs/2405.15682
    """
    learning_rate = warmed_up("schedule_free_adamw", learning_rate, warmup_steps)
    # Adam without momentum, without Adam's first-moment state (which would hold g: a params-sized field read
    # and written every step for nothing).
    inner = (scale_by_rms(decay=b2, eps=eps, eps_in_sqrt=False, bias_correction=True)
             .add_decayed_weights(decay=decay, mask=mask)
             .scale_by_learning_rate(learning_rate))
    pipeline = inner.schedule_free(learning_rate, b1=b1, weight_lr_power=weight_lr_power, state_dtype=state_dtype)
    return maximized(maximize, pipeline)
