"""Learning-rate-free optimizers: Prodigy, D-Adaptation AdamW, DoG, DoWG, COCOB, SGD with Polyak's step, MoMo.

Their learning rate is a multiplier (1 by default, or a schedule peaking at
1) of a step size the rule finds itself. For Mechanic, which learns the scale
of any optimizer's steps, wrap it: ``ux.optimizers.adam(1.0).mechanize()``.
"""

from __future__ import annotations

from collections.abc import Callable

from updax._typing import PyTree, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer
from updax.updates import (
    add_decayed_weights,
    scale,
    scale_by_dadapt_adamw,
    scale_by_momo,
    scale_by_momo_adam,
    scale_by_polyak,
    scale_by_prodigy,
)


@optimizer
def prodigy(learning_rate: ScalarOrSchedule = 1.0, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
            b3: ScalarOrSchedule | None = None, eps: ScalarOrSchedule = 1e-8, estim_lr0: float = 1e-6,
            estim_lr_coef: ScalarOrSchedule = 1.0, decay: ScalarOrSchedule = 0.0, *,
            safeguard_warmup: bool = False, mask: PyTree | Callable[[PyTree], PyTree] | None = None,
            maximize: bool = False) -> Update:
    """Prodigy: AdamW whose learning rate is an estimate of the distance to the solution.

    Pipeline: ``scale_by_prodigy(learning_rate, ...) |> scale(-1.0)``: the
    learning rate weighs the estimate too, so it is an option of the stage,
    which emits the step's size. optax's ``betas`` are ``b1, b2``, its
    ``beta3`` is ``b3`` and its ``weight_decay`` is ``decay``.

    Args:
        learning_rate: a multiplier of the estimated step, a number >= 0 or a
            schedule (best 1 at its peak, e.g. a cosine decay from 1).
            Default: ``1.0``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        b3: decay of the estimate's sums; None for ``sqrt(b2)``. Default: ``None``.
        eps: added to the denominator (times the estimate). Default: ``1e-08``.
        estim_lr0: the initial (under-)estimate of the distance. Default: ``1e-06``.
        estim_lr_coef: multiplies each new estimate. Default: ``1.0``.
        decay: decoupled weight decay. Default: ``0.0``.
        safeguard_warmup: leave the learning rate out of the estimate's
            denominator, for schedules that warm up from 0. Default: ``False``.
        mask: which leaves decay: a pytree of bools shaped like the params (or
            a prefix of it), or a function of the params returning one; None
            decays every leaf. Default: ``None``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object; ``update`` needs ``params``, and ``init`` the real
        params (their starting point is kept).

    Example:
        >>> import updax as ux
        >>> ux.optimizers.prodigy()
        scale_by_prodigy(learning_rate=1.0, b1=0.9, b2=0.999, eps=1e-08, estim_lr0=1e-06, estim_lr_coef=1.0, decay=0.0, safeguard_warmup=False) |> scale(step_size=-1.0)

    References:
        Mishchenko & Defazio, "Prodigy: An Expeditiously Adaptive
        Parameter-Free Learner", ICML 2024. https://arxiv.org/abs/2306.06101
    """
    pipeline = scale_by_prodigy(learning_rate=learning_rate, b1=b1, b2=b2, b3=b3, eps=eps, estim_lr0=estim_lr0,
                                estim_lr_coef=estim_lr_coef, decay=decay, safeguard_warmup=safeguard_warmup,
                                mask=mask).scale(-1.0)
    return maximized(maximize, pipeline)


@optimizer
def dadapt_adamw(learning_rate: ScalarOrSchedule = 1.0, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
                 eps: ScalarOrSchedule = 1e-8, estim_lr0: float = 1e-6, decay: ScalarOrSchedule = 0.0, *,
                 mask: PyTree | Callable[[PyTree], PyTree] | None = None, maximize: bool = False) -> Update:
    """D-Adaptation AdamW: AdamW whose learning rate is an estimate of the distance to the solution.

    Pipeline: ``scale_by_dadapt_adamw(learning_rate, ...) |> scale(-1.0)``:
    each step's learning rate weighs its update into the first moment, so it
    is an option of the stage, which emits the step. optax's ``betas`` are
    ``b1, b2`` and its ``weight_decay`` is ``decay``.

    Args:
        learning_rate: a multiplier of the estimated step, a number >= 0 or a
            schedule (best 1 at its peak). Default: ``1.0``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        estim_lr0: the initial (under-)estimate of the distance. Default: ``1e-06``.
        decay: decoupled weight decay. Default: ``0.0``.
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
        >>> ux.optimizers.dadapt_adamw()
        scale_by_dadapt_adamw(learning_rate=1.0, b1=0.9, b2=0.999, eps=1e-08, estim_lr0=1e-06, decay=0.0) |> scale(step_size=-1.0)

    References:
        Defazio & Mishchenko, "Learning-Rate-Free Learning by D-Adaptation",
        ICML 2023. https://arxiv.org/abs/2301.07733
    """
    pipeline = scale_by_dadapt_adamw(learning_rate=learning_rate, b1=b1, b2=b2, eps=eps, estim_lr0=estim_lr0,
                                     decay=decay, mask=mask).scale(-1.0)
    return maximized(maximize, pipeline)


@optimizer
def dog(learning_rate: ScalarOrSchedule = 1.0, init_step: float = 1e-6, init_step_type: str = "heuristic",
        eps: ScalarOrSchedule = 1e-8, decay: ScalarOrSchedule = 0.0, *,
        mask: PyTree | Callable[[PyTree], PyTree] | None = None, maximize: bool = False) -> Update:
    """DoG: SGD whose step is the distance travelled over the root of the summed squared gradient norms.

    Pipeline: ``add_decayed_weights(decay, mask) |> scale_by_dog(init_step,
    init_step_type, eps) |> scale_by_learning_rate(learning_rate)``. optax's
    ``init_step=(kind, value)`` is ``init_step_type=kind, init_step=value``
    and its ``weight_decay`` is ``decay``. The authors recommend averaging
    the iterates (``.ema_params(...)``).

    Args:
        learning_rate: a multiplier of the step, a number >= 0 or a schedule.
            Default: ``1.0``.
        init_step: the initial step's value. Default: ``1e-06``.
        init_step_type: ``"heuristic"``, ``"distance"`` or ``"learning_rate"``.
            Default: ``'heuristic'``.
        eps: added to the sum of squared norms. Default: ``1e-08``.
        decay: weight decay added to the gradients. Default: ``0.0``.
        mask: which leaves decay: a pytree of bools shaped like the params (or
            a prefix of it), or a function of the params returning one; None
            decays every leaf. Default: ``None``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object; ``update`` needs ``params``, and ``init`` the real
        params.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.dog()
        add_decayed_weights(decay=0.0) |> scale_by_dog(init_step=1e-06, init_step_type='heuristic', eps=1e-08) |> scale_by_learning_rate(learning_rate=1.0)

    References:
        Ivgi, Hinder & Carmon, "DoG is SGD's Best Friend: A Parameter-Free
        Dynamic Step Size Schedule", ICML 2023. https://arxiv.org/abs/2302.12022
    """
    pipeline = (add_decayed_weights(decay=decay, mask=mask)
                .scale_by_dog(init_step=init_step, init_step_type=init_step_type, eps=eps)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)


@optimizer
def dowg(learning_rate: ScalarOrSchedule = 1.0, init_estim_sq_dist: float | None = None,
         eps: ScalarOrSchedule = 1e-4, decay: ScalarOrSchedule = 0.0, *,
         mask: PyTree | Callable[[PyTree], PyTree] | None = None, maximize: bool = False) -> Update:
    """DoWG: SGD whose step is the squared distance travelled over the weighted gradient norms' root.

    Pipeline: ``add_decayed_weights(decay, mask) |> scale_by_dowg(
    init_estim_sq_dist, eps) |> scale_by_learning_rate(learning_rate)``.
    optax's ``weight_decay`` is ``decay``.

    Args:
        learning_rate: a multiplier of the step, a number >= 0 or a schedule.
            Default: ``1.0``.
        init_estim_sq_dist: the initial guess of the squared distance to the
            solution; None uses ``eps``. Default: ``None``.
        eps: added to the denominator. Default: ``0.0001``.
        decay: weight decay added to the gradients. Default: ``0.0``.
        mask: which leaves decay: a pytree of bools shaped like the params (or
            a prefix of it), or a function of the params returning one; None
            decays every leaf. Default: ``None``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object; ``update`` needs ``params``, and ``init`` the real
        params.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.dowg()
        add_decayed_weights(decay=0.0) |> scale_by_dowg(eps=0.0001) |> scale_by_learning_rate(learning_rate=1.0)

    References:
        Khaled, Mishchenko & Jin, "DoWG Unleashed: An Efficient Universal
        Parameter-Free Gradient Descent Method", NeurIPS 2023.
        https://arxiv.org/abs/2305.16284
    """
    pipeline = (add_decayed_weights(decay=decay, mask=mask)
                .scale_by_dowg(init_estim_sq_dist=init_estim_sq_dist, eps=eps)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)


@optimizer
def cocob(learning_rate: ScalarOrSchedule = 1.0, alpha: ScalarOrSchedule = 100.0, eps: float = 1e-8,
          decay: ScalarOrSchedule = 0.0, *, mask: PyTree | Callable[[PyTree], PyTree] | None = None,
          maximize: bool = False) -> Update:
    """COCOB-Backprop: coordinate-wise coin betting, with no step size at all.

    Pipeline: ``add_decayed_weights(decay, mask) |> scale(learning_rate) |>
    scale_by_cocob(alpha, eps)``, as optax: the stage emits the step itself,
    so the learning rate weighs the gradients it bets on (a constant one
    changes nothing but the weight of ``eps``). optax's ``weight_decay`` is
    ``decay``.

    Args:
        learning_rate: a weight of the gradients, a number >= 0 or a schedule.
            Default: ``1.0``.
        alpha: bounds the early bets. Default: ``100.0``.
        eps: the initial bound on the gradients. Default: ``1e-08``.
        decay: weight decay added to the gradients. Default: ``0.0``.
        mask: which leaves decay: a pytree of bools shaped like the params (or
            a prefix of it), or a function of the params returning one; None
            decays every leaf. Default: ``None``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object; ``update`` needs ``params``, and ``init`` the real
        params.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.cocob()
        add_decayed_weights(decay=0.0) |> scale(step_size=1.0) |> scale_by_cocob(alpha=100.0, eps=1e-08)

    References:
        Orabona & Tommasi, "Training Deep Networks without Learning Rates
        Through Coin Betting", NeurIPS 2017. https://arxiv.org/abs/1705.07795
    """
    pipeline = add_decayed_weights(decay=decay, mask=mask).pipe(scale, learning_rate).scale_by_cocob(alpha=alpha, eps=eps)
    return maximized(maximize, pipeline)


def polyak_sgd(learning_rate: ScalarOrSchedule = 1.0, max_learning_rate: ScalarOrSchedule = 1.0,
               f_min: ScalarOrSchedule = 0.0, eps: ScalarOrSchedule = 0.0, variant: str = "sps") -> Update:
    """SGD with Polyak's step size, from the loss passed to ``update(..., loss=loss)``.

    Pipeline: ``scale_by_polyak(f_min, max_learning_rate, eps, variant) |>
    scale_by_learning_rate(learning_rate)``. The learning rate comes first,
    as for every optimizer: it is optax's ``scaling``, a multiplier of
    Polyak's step. optax passes the loss as ``value=`` and computes the norm
    after scaling the gradient by ``scaling``; here the norm is the
    gradient's, as optax's documented formula and the paper have it (the
    two agree when the learning rate is 1).

    Args:
        learning_rate: a multiplier of Polyak's step (optax's ``scaling``),
            a number >= 0 or a schedule. Default: ``1.0``.
        max_learning_rate: the largest step size. Default: ``1.0``.
        f_min: a lower bound of the loss. Default: ``0.0``.
        eps: added to the squared gradient norm. Default: ``0.0``.
        variant: ``"sps"``, or ``"sps+"`` to floor the gap to ``f_min`` at 0.
            Default: ``'sps'``.

    Returns:
        An update object; ``update`` needs ``loss=``.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.polyak_sgd()
        scale_by_polyak(f_min=0.0, max_learning_rate=1.0, eps=0.0, variant='sps') |> scale_by_learning_rate(learning_rate=1.0)

    References:
        Loizou et al., "Stochastic Polyak Step-size for SGD: An Adaptive
        Learning Rate for Fast Convergence", AISTATS 2021.
        https://arxiv.org/abs/2002.10542
    """
    return scale_by_polyak(f_min=f_min, max_learning_rate=max_learning_rate, eps=eps,
                           variant=variant).scale_by_learning_rate(learning_rate)


@optimizer
def momo(learning_rate: ScalarOrSchedule = 1.0, momentum: ScalarOrSchedule = 0.9, lower_bound: ScalarOrSchedule = 0.0,
         decay: ScalarOrSchedule = 0.0, adapt_lower_bound: bool = False, decay_form: str = "proximal") -> Update:
    """MoMo: SGD with momentum and a Polyak-type step size from the loss, passed as ``loss=``.

    Pipeline: ``scale_by_momo(learning_rate, ...) |> scale(-1.0)``: the
    learning rate caps the step size and weighs the weight decay, so it is
    an option of the stage, which emits the step. optax's ``beta`` is
    ``momentum``, its ``weight_decay`` is ``decay`` and its ``value=`` is
    ``loss=``; the weight decay is the paper's proximal step, and
    ``decay_form="decoupled"`` is optax's form (see
    :func:`updax.scale_by_momo`).

    Args:
        learning_rate: the largest step size, a number >= 0 or a schedule
            (the authors recommend 1). Default: ``1.0``.
        momentum: the averaging of the losses and gradients. Default: ``0.9``.
        lower_bound: a lower bound of the loss. Default: ``0.0``.
        decay: weight decay. Default: ``0.0``.
        adapt_lower_bound: estimate the lower bound on the fly. Default: ``False``.
        decay_form: ``"proximal"`` (the paper's) or ``"decoupled"`` (optax's).
            Default: ``'proximal'``.

    Returns:
        An update object; ``update`` needs ``params`` and ``loss=``.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.momo()
        scale_by_momo(learning_rate=1.0, momentum=0.9, lower_bound=0.0, decay=0.0, adapt_lower_bound=False, decay_form='proximal') |> scale(step_size=-1.0)

    References:
        Schaipp et al., "MoMo: Momentum Models for Adaptive Learning Rates",
        ICML 2024. https://arxiv.org/abs/2305.07583
    """
    return scale_by_momo(learning_rate=learning_rate, momentum=momentum, lower_bound=lower_bound, decay=decay,
                         adapt_lower_bound=adapt_lower_bound, decay_form=decay_form).scale(-1.0)


@optimizer
def momo_adam(learning_rate: ScalarOrSchedule = 1e-2, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
              eps: ScalarOrSchedule = 1e-8, lower_bound: ScalarOrSchedule = 0.0, decay: ScalarOrSchedule = 0.0,
              adapt_lower_bound: bool = False, decay_form: str = "proximal") -> Update:
    """MoMo-Adam: Adam with a Polyak-type step size from the loss, passed as ``loss=``.

    Pipeline: ``scale_by_momo_adam(learning_rate, ...) |> scale(-1.0)``.
    optax's ``weight_decay`` is ``decay`` and its ``value=`` is ``loss=``;
    the weight decay is the paper's proximal step, and
    ``decay_form="decoupled"`` is optax's AdamW-like form (see
    :func:`updax.scale_by_momo_adam`).

    Args:
        learning_rate: the largest step size (before Adam's bias
            correction), a number >= 0 or a schedule. Default: ``0.01``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the root of the second moment. Default: ``1e-08``.
        lower_bound: a lower bound of the loss. Default: ``0.0``.
        decay: weight decay. Default: ``0.0``.
        adapt_lower_bound: estimate the lower bound on the fly. Default: ``False``.
        decay_form: ``"proximal"`` (the paper's) or ``"decoupled"`` (optax's).
            Default: ``'proximal'``.

    Returns:
        An update object; ``update`` needs ``params`` and ``loss=``.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.momo_adam()
        scale_by_momo_adam(learning_rate=0.01, b1=0.9, b2=0.999, eps=1e-08, lower_bound=0.0, decay=0.0, adapt_lower_bound=False, decay_form='proximal') |> scale(step_size=-1.0)

    References:
        Schaipp et al., "MoMo: Momentum Models for Adaptive Learning Rates",
        ICML 2024. https://arxiv.org/abs/2305.07583
    """
    return scale_by_momo_adam(learning_rate=learning_rate, b1=b1, b2=b2, eps=eps, lower_bound=lower_bound,
                              decay=decay, adapt_lower_bound=adapt_lower_bound, decay_form=decay_form).scale(-1.0)
