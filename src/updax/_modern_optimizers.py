"""What users reach for today: each optimizer one readable expression over the catalogue.

Options and defaults follow the paper and optax's aliases (the established
JAX reference). Where optax has no default learning rate, the one given is
the paper's suggestion and says so. Weight decay is ``weight_decay`` here, as
in optax (Axon's ``adamw`` / ``lamb`` call it ``decay``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from updax import _validate as check
from updax import schedules
from updax.updates import (
    add_decayed_weights,
    partition,
    scale_by_adam,
    scale_by_adamax,
    scale_by_adan,
    scale_by_amsgrad,
    scale_by_factored_rms,
    scale_by_lion,
    scale_by_muon,
    scale_by_nadam,
    scale_by_novograd,
    scale_by_rprop,
    scale_by_sign,
    scale_by_sm3,
    scale_by_trust_ratio,
    trace,
)


def lion(learning_rate=1e-4, b1=0.9, b2=0.99, weight_decay=1e-3, *, mu_dtype=None):
    """Lion: the sign of an interpolated momentum, with decoupled weight decay.

    Pipeline: ``scale_by_lion(b1, b2) |> add_decayed_weights(weight_decay) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number or a schedule; the paper advises 3-10x below
            AdamW's. Default: ``0.0001``.
        b1: interpolation weight of the momentum. Default: ``0.9``.
        b2: momentum decay. Default: ``0.99``.
        weight_decay: decoupled weight decay (optax's default). Default: ``0.001``.
        mu_dtype: storage dtype of the momentum. Default: ``None``.

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
    return (scale_by_lion(b1=b1, b2=b2, mu_dtype=mu_dtype).add_decayed_weights(decay=weight_decay)
            .scale_by_learning_rate(learning_rate))


def adamax(learning_rate=2e-3, b1=0.9, b2=0.999, eps=1e-8):
    """AdaMax: Adam with the infinity norm in place of the second moment.

    Pipeline: ``scale_by_adamax(b1, b2, eps) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number or a schedule (the paper's 0.002). Default: ``0.002``.
        b1: first-moment decay. Default: ``0.9``.
        b2: decay of the infinity norm. Default: ``0.999``.
        eps: added inside the maximum (optax's placement). Default: ``1e-08``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.adamax()
        scale_by_adamax(b1=0.9, b2=0.999, eps=1e-08) |> scale_by_learning_rate(learning_rate=0.002)

    References:
        Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015, section 7.
    """
    return scale_by_adamax(b1=b1, b2=b2, eps=eps).scale_by_learning_rate(learning_rate)


def adamaxw(learning_rate=2e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-4):
    """AdaMax with decoupled weight decay.

    Pipeline: ``scale_by_adamax(...) |> add_decayed_weights(weight_decay) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number or a schedule. Default: ``0.002``.
        b1: first-moment decay. Default: ``0.9``.
        b2: decay of the infinity norm. Default: ``0.999``.
        eps: added inside the maximum. Default: ``1e-08``.
        weight_decay: decoupled weight decay (optax's default). Default: ``0.0001``.

    Returns:
        An update object; ``update`` needs ``params``.

    Example:
        >>> import updax as ux
        >>> len(ux.optimizers.adamaxw().stages)
        3

    References:
        Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019.
    """
    return (scale_by_adamax(b1=b1, b2=b2, eps=eps).add_decayed_weights(decay=weight_decay)
            .scale_by_learning_rate(learning_rate))


def amsgrad(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, *, mu_dtype=None, nu_dtype=None):
    """AMSGrad: Adam with a non-decreasing second moment.

    Pipeline: ``scale_by_amsgrad(b1, b2, eps, eps_root) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number or a schedule. Default: ``0.001``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``0.0``.
        mu_dtype: storage dtype of the first moment. Default: ``None``.
        nu_dtype: storage dtype of the second moments. Default: ``None``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.amsgrad()
        scale_by_amsgrad(b1=0.9, b2=0.999, eps=1e-08, eps_root=0.0) |> scale_by_learning_rate(learning_rate=0.001)

    References:
        Reddi et al., "On the Convergence of Adam and Beyond", ICLR 2018.
    """
    return scale_by_amsgrad(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype,
                            nu_dtype=nu_dtype).scale_by_learning_rate(learning_rate)


def nadam(learning_rate=2e-3, b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, *, mu_dtype=None, nu_dtype=None):
    """NAdam: Adam with Nesterov momentum.

    Pipeline: ``scale_by_nadam(b1, b2, eps, eps_root) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number or a schedule (Dozat's 0.002). Default: ``0.002``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``0.0``.
        mu_dtype: storage dtype of the first moment. Default: ``None``.
        nu_dtype: storage dtype of the second moment. Default: ``None``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.nadam()
        scale_by_nadam(b1=0.9, b2=0.999, eps=1e-08, eps_root=0.0) |> scale_by_learning_rate(learning_rate=0.002)

    References:
        Dozat, "Incorporating Nesterov Momentum into Adam", ICLR 2016 workshop.
    """
    return scale_by_nadam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype,
                          nu_dtype=nu_dtype).scale_by_learning_rate(learning_rate)


def nadamw(learning_rate=2e-3, b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, weight_decay=1e-4, *, mu_dtype=None,
           nu_dtype=None):
    """NAdamW: NAdam with decoupled weight decay.

    Pipeline: ``scale_by_nadam(...) |> add_decayed_weights(weight_decay) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number or a schedule. Default: ``0.002``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``0.0``.
        weight_decay: decoupled weight decay (optax's default). Default: ``0.0001``.
        mu_dtype: storage dtype of the first moment. Default: ``None``.
        nu_dtype: storage dtype of the second moment. Default: ``None``.

    Returns:
        An update object; ``update`` needs ``params``.

    Example:
        >>> import updax as ux
        >>> [s.label for s in ux.optimizers.nadamw().stages]
        ['scale_by_nadam', 'add_decayed_weights', 'scale_by_learning_rate']

    References:
        Dozat, 2016; Loshchilov & Hutter, 2019.
    """
    return (scale_by_nadam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype)
            .add_decayed_weights(decay=weight_decay).scale_by_learning_rate(learning_rate))


def novograd(learning_rate=1e-3, b1=0.9, b2=0.25, eps=1e-6, eps_root=0.0, weight_decay=0.0):
    """NovoGrad: momentum of updates normalised by a layer-wise second moment.

    Pipeline: ``scale_by_novograd(b1, b2, eps, eps_root, weight_decay) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number or a schedule. Default: ``0.001``.
        b1: first-moment decay. Default: ``0.9``.
        b2: decay of the layer-wise second moment. Default: ``0.25``.
        eps: added to the denominator (optax's alias default). Default: ``1e-06``.
        eps_root: added inside the square root. Default: ``0.0``.
        weight_decay: weight decay inside the normalised step. Default: ``0.0``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> [s.label for s in ux.optimizers.novograd().stages]
        ['scale_by_novograd', 'scale_by_learning_rate']

    References:
        Ginsburg et al., "Stochastic Gradient Methods with Layer-wise Adaptive
        Moments for Training of Deep Networks", 2019. https://arxiv.org/abs/1905.11286
    """
    return scale_by_novograd(b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                             weight_decay=weight_decay).scale_by_learning_rate(learning_rate)


def adadelta(learning_rate=1.0, rho=0.9, eps=1e-6, weight_decay=0.0):
    """AdaDelta: steps sized by the RMS of past steps over the RMS of gradients.

    Pipeline: ``add_decayed_weights(weight_decay) |> scale_by_adadelta(rho, eps) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number or a schedule; the paper has none, i.e. 1.
            Default: ``1.0``.
        rho: decay of both running averages. Default: ``0.9``.
        eps: added inside both roots. Default: ``1e-06``.
        weight_decay: weight decay added to the gradient. Default: ``0.0``.

    Returns:
        An update object; ``update`` needs ``params``.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.adadelta()
        add_decayed_weights(decay=0.0) |> scale_by_adadelta(rho=0.9, eps=1e-06) |> scale_by_learning_rate(learning_rate=1.0)

    References:
        Zeiler, "ADADELTA: An Adaptive Learning Rate Method", 2012. https://arxiv.org/abs/1212.5701
    """
    return (add_decayed_weights(decay=weight_decay).scale_by_adadelta(rho=rho, eps=eps)
            .scale_by_learning_rate(learning_rate))


def rprop(learning_rate=1e-3, eta_minus=0.5, eta_plus=1.2, min_step_size=1e-6, max_step_size=50.0):
    """Rprop (iRprop-): per-element steps grown or shrunk by sign agreement.

    Pipeline: ``scale_by_rprop(...) |> scale(-1.0)``; the step sizes are the
    learning rate, so there is no ``scale_by_learning_rate``.

    Args:
        learning_rate: the initial step size. Default: ``0.001``.
        eta_minus: shrink factor on a sign change. Default: ``0.5``.
        eta_plus: growth factor on agreement. Default: ``1.2``.
        min_step_size: the smallest step. Default: ``1e-06``.
        max_step_size: the largest step. Default: ``50.0``.

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
    return scale_by_rprop(learning_rate=learning_rate, eta_minus=eta_minus, eta_plus=eta_plus,
                          min_step_size=min_step_size, max_step_size=max_step_size).scale(-1.0)


def sign_sgd(learning_rate=1e-3):
    """signSGD: descend along the sign of the gradient.

    Pipeline: ``scale_by_sign() |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number or a schedule. Default: ``0.001``.

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
    return scale_by_sign().scale_by_learning_rate(learning_rate)


def signum(learning_rate=1e-3, momentum=0.9, *, accumulator_dtype=None):
    """Signum: signSGD on a momentum of the gradients.

    Pipeline: ``trace(momentum) |> scale_by_sign() |> scale_by_learning_rate(lr)``.
    The trace is the EMA of the paper times ``1/(1-momentum)``, so its sign
    is the same.

    Args:
        learning_rate: a number or a schedule. Default: ``0.001``.
        momentum: the momentum decay. Default: ``0.9``.
        accumulator_dtype: storage dtype of the momentum. Default: ``None``.

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
    return trace(decay=momentum, accumulator_dtype=accumulator_dtype).scale_by_sign().scale_by_learning_rate(
        learning_rate)


def adan(learning_rate=1e-3, b1=0.98, b2=0.92, b3=0.99, eps=1e-8, eps_root=1e-8, weight_decay=0.0):
    """Adan: adaptive Nesterov momentum estimated from gradient differences.

    Pipeline: ``scale_by_adan(...) |> add_decayed_weights(weight_decay) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number or a schedule. Default: ``0.001``.
        b1: decay of the gradient average. Default: ``0.98``.
        b2: decay of the gradient-difference average. Default: ``0.92``.
        b3: decay of the second moment. Default: ``0.99``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root (optax's alias default). Default: ``1e-08``.
        weight_decay: decoupled weight decay. Default: ``0.0``.

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
    return (scale_by_adan(b1=b1, b2=b2, b3=b3, eps=eps, eps_root=eps_root).add_decayed_weights(decay=weight_decay)
            .scale_by_learning_rate(learning_rate))


def lars(learning_rate=1e-1, weight_decay=0.0, trust_coefficient=1e-3, eps=0.0, momentum=0.9, nesterov=False):
    """LARS: momentum SGD with a per-layer trust ratio.

    Pipeline: ``add_decayed_weights(weight_decay) |> scale_by_trust_ratio(trust_coefficient=…, eps=…)
    |> scale_by_learning_rate(lr) |> trace(momentum, nesterov)``.

    Args:
        learning_rate: a number or a schedule. Default: ``0.1``.
        weight_decay: weight decay added before the trust ratio. Default: ``0.0``.
        trust_coefficient: the trust coefficient (the paper's 0.001). Default: ``0.001``.
        eps: added to the update norm. Default: ``0.0``.
        momentum: the momentum decay. Default: ``0.9``.
        nesterov: Nesterov momentum. Default: ``False``.

    Returns:
        An update object; ``update`` needs ``params``.

    Example:
        >>> import updax as ux
        >>> [s.label for s in ux.optimizers.lars().stages]
        ['add_decayed_weights', 'scale_by_trust_ratio', 'scale_by_learning_rate', 'trace']

    References:
        You et al., "Large Batch Training of Convolutional Networks", 2017.
        https://arxiv.org/abs/1708.03888
    """
    return (add_decayed_weights(decay=weight_decay)
            .scale_by_trust_ratio(trust_coefficient=trust_coefficient, eps=eps)
            .scale_by_learning_rate(learning_rate).trace(decay=momentum, nesterov=nesterov))


def fromage(learning_rate=1e-2, min_norm=1e-6):
    """Fromage: steps in relative (Frobenius) distance, shrinking the weights to stay on the sphere.

    Pipeline, with ``m = 1/sqrt(1 + lr²)``: ``scale_by_trust_ratio(min_norm)
    |> scale_by_learning_rate(lr·m) |> add_decayed_weights(m - 1)``, so that
    ``p ← m·(p - lr·‖p‖/‖g‖·g)``. The learning rate must be a number.

    Args:
        learning_rate: a positive number. Default: ``0.01``.
        min_norm: floor of both norms in the trust ratio. Default: ``1e-06``.

    Returns:
        An update object; ``update`` needs ``params``.

    Example:
        >>> import updax as ux
        >>> [s.label for s in ux.optimizers.fromage().stages]
        ['scale_by_trust_ratio', 'scale_by_learning_rate', 'add_decayed_weights']

    References:
        Bernstein et al., "On the distance between two neural networks and
        the stability of learning", NeurIPS 2020. https://arxiv.org/abs/2002.03432
    """
    learning_rate = check.positive("fromage", "learning_rate", learning_rate)
    if callable(learning_rate):
        raise TypeError(f"fromage(learning_rate={learning_rate!r}): learning_rate must be a number")
    mult = 1.0 / (1.0 + learning_rate**2) ** 0.5
    return (scale_by_trust_ratio(min_norm=min_norm).scale_by_learning_rate(learning_rate * mult)
            .add_decayed_weights(decay=mult - 1.0))


def schedule_free_adamw(learning_rate=2.5e-3, warmup_steps=None, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0,
                        weight_lr_power=2.0, *, state_dtype=None):
    """Schedule-free AdamW: AdamW without momentum, wrapped in schedule-free averaging.

    Pipeline: ``scale_by_adam(b1=0.0, b2, eps, eps_root=0.0) |> add_decayed_weights(weight_decay)
    |> scale_by_learning_rate(lr) |> schedule_free(lr, b1, weight_lr_power)``; with
    ``warmup_steps`` the learning rate rises linearly from 0 over that many
    steps, then stays. Evaluate at ``ux.schedule_free_eval_params(opt, state, params)``.
    The averaging weight uses the learning rate applied on the same step
    (optax evaluates the warm-up one step later there; with a constant rate
    the two agree exactly).

    Args:
        learning_rate: the peak learning rate (the reference's 0.0025). Default: ``0.0025``.
        warmup_steps: length of the linear warm-up, or None. Default: ``None``.
        b1: the interpolation weight, in (0, 1). Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        weight_decay: decoupled weight decay, applied at the interpolated
            params. Default: ``0.0``.
        weight_lr_power: power of the learning rate in the averaging weights.
            Default: ``2.0``.
        state_dtype: storage dtype of the base iterate ``z``. Default: ``None``.

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
    if warmup_steps is not None:
        check.positive_int("schedule_free_adamw", "warmup_steps", warmup_steps)
        learning_rate = schedules.polynomial_decay(0.0, end_value=learning_rate, power=1.0,
                                                   transition_steps=warmup_steps)
    inner = (scale_by_adam(b1=0.0, b2=b2, eps=eps, eps_root=0.0).add_decayed_weights(decay=weight_decay)
             .scale_by_learning_rate(learning_rate))
    return inner.schedule_free(learning_rate, b1=b1, weight_lr_power=weight_lr_power, state_dtype=state_dtype)


def adafactor(learning_rate=None, min_dim_size_to_factor=128, decay_rate=0.8, decay_offset=0,
              multiply_by_parameter_scale=True, clipping_threshold=1.0, momentum=None, weight_decay_rate=None,
              eps=1e-30, factored=True):
    """Adafactor: factored second moments, update clipping and relative step sizes.

    Pipeline: ``scale_by_factored_rms(...) |> clip_by_block_rms(clipping_threshold)
    |> scale(learning_rate) |> scale_by_param_block_rms() |> [ema(momentum, debias=False)]
    |> [add_decayed_weights(weight_decay_rate)] |> scale(-1.0)``; bracketed
    stages only when their option is set. With ``learning_rate=None`` the
    paper's relative step ``min(1e-2, 1/sqrt(t))`` is used, which together
    with ``multiply_by_parameter_scale`` gives the paper's default rule.

    Args:
        learning_rate: a number, a schedule, or None for
            ``schedules.relative_step()``. Default: ``None``.
        min_dim_size_to_factor: leaves whose two largest dimensions are both
            at least this are factored. Default: ``128``.
        decay_rate: exponent of the second-moment decay ``1 - t^-decay_rate``.
            Default: ``0.8``.
        decay_offset: step offset of that decay (for fine-tuning). Default: ``0``.
        multiply_by_parameter_scale: scale steps by ``max(rms(p), 1e-3)``.
            Default: ``True``.
        clipping_threshold: block-RMS clipping threshold, or None. Default: ``1.0``.
        momentum: EMA decay of the updates, or None. Default: ``None``.
        weight_decay_rate: weight decay, or None. Default: ``None``.
        eps: added to the squared gradient. Default: ``1e-30``.
        factored: factor the second moments at all. Default: ``True``.

    Returns:
        An update object; ``update`` needs ``params`` when
        ``multiply_by_parameter_scale`` or ``weight_decay_rate`` is set.

    Example:
        >>> import updax as ux
        >>> [s.label for s in ux.optimizers.adafactor().stages]
        ['scale_by_factored_rms', 'clip_by_block_rms', 'scale', 'scale_by_param_block_rms', 'scale']
        >>> ux.optimizers.adafactor().stages[2]
        scale(step_size=relative_step(max_value=0.01))

    References:
        Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear
        Memory Cost", ICML 2018. https://arxiv.org/abs/1804.04235
    """
    check.flag("adafactor", "multiply_by_parameter_scale", multiply_by_parameter_scale)
    opt = scale_by_factored_rms(factored=factored, decay_rate=decay_rate, step_offset=decay_offset,
                                min_dim_size_to_factor=min_dim_size_to_factor, epsilon=eps)
    if clipping_threshold is not None:
        opt = opt.clip_by_block_rms(threshold=clipping_threshold)
    opt = opt.scale(schedules.relative_step() if learning_rate is None else learning_rate)
    if multiply_by_parameter_scale:
        opt = opt.scale_by_param_block_rms()
    if momentum is not None:
        opt = opt.ema(momentum, debias=False)
    if weight_decay_rate is not None:
        opt = opt.add_decayed_weights(decay=weight_decay_rate)
    return opt.scale(-1.0)


def sm3(learning_rate=1e-1, momentum=0.9):
    """SM3: memory-efficient adaptive steps from per-axis accumulators.

    Pipeline: ``scale_by_sm3(b1=momentum) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number or a schedule; like AdaGrad's, SM3's steps
            shrink as its accumulators grow, so it takes rates well above
            Adam's. Default: ``0.1``.
        momentum: EMA decay of the scaled updates. Default: ``0.9``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.sm3()
        scale_by_sm3(b1=0.9, b2=1.0, eps=1e-08) |> scale_by_learning_rate(learning_rate=0.1)

    References:
        Anil et al., "Memory-Efficient Adaptive Optimization", NeurIPS 2019.
        https://arxiv.org/abs/1901.11150
    """
    return scale_by_sm3(b1=momentum).scale_by_learning_rate(learning_rate)


def _muon_groups(params):
    return jax.tree.map(lambda p: "muon" if jnp.ndim(p) == 2 else "adam", params)


def muon(learning_rate=0.02, ns_coeffs=(3.4445, -4.7750, 2.0315), ns_steps=5, beta=0.95, eps=1e-8,
         weight_decay=0.0, *, nesterov=True, mu_dtype=None, adam_b1=0.9, adam_b2=0.999, adam_eps_root=0.0,
         adam_weight_decay=0.0, adam_learning_rate=None):
    """Muon: Newton-Schulz-orthogonalised momentum for matrices, (N)AdamW for every other leaf.

    Pipeline: ``partition({"muon": scale_by_muon(...) |> scale_by_shape() |> add_decayed_weights(weight_decay)
    |> scale_by_learning_rate(lr), "adam": scale_by_nadam(...) |> add_decayed_weights(adam_weight_decay)
    |> scale_by_learning_rate(adam_lr)}, labels)`` with 2-D leaves labelled
    ``"muon"`` (input dimension first) and the rest ``"adam"`` (plain Adam
    when ``nesterov=False``).

    Args:
        learning_rate: a number or a schedule (Keller Jordan's 0.02). Default: ``0.02``.
        ns_coeffs: the quintic Newton-Schulz coefficients. Default: ``(3.4445, -4.775, 2.0315)``.
        ns_steps: Newton-Schulz iterations. Default: ``5``.
        beta: momentum decay. Default: ``0.95``.
        eps: Newton-Schulz normalisation and Adam's denominator term. Default: ``1e-08``.
        weight_decay: decoupled weight decay of the matrices. Default: ``0.0``.
        nesterov: Nesterov momentum in both groups. Default: ``True``.
        mu_dtype: storage dtype of the momenta. Default: ``None``.
        adam_b1: Adam's first-moment decay. Default: ``0.9``.
        adam_b2: Adam's second-moment decay. Default: ``0.999``.
        adam_eps_root: Adam's term inside the square root. Default: ``0.0``.
        adam_weight_decay: decoupled weight decay of the other leaves. Default: ``0.0``.
        adam_learning_rate: the other leaves' learning rate; None uses
            ``learning_rate``. Default: ``None``.

    Returns:
        An update object; ``update`` needs ``params``.

    Example:
        >>> import updax as ux
        >>> sorted(ux.optimizers.muon().stages[0].option("transforms"))
        ['adam', 'muon']

    References:
        Jordan et al., "Muon: An optimizer for hidden layers in neural
        networks", 2024. https://kellerjordan.github.io/posts/muon/
    """
    adam_learning_rate = learning_rate if adam_learning_rate is None else adam_learning_rate
    matrices = (scale_by_muon(ns_coeffs=ns_coeffs, ns_steps=ns_steps, beta=beta, eps=eps, nesterov=nesterov,
                              mu_dtype=mu_dtype)
                .scale_by_shape().add_decayed_weights(decay=weight_decay).scale_by_learning_rate(learning_rate))
    adam_like = scale_by_nadam if nesterov else scale_by_adam
    others = (adam_like(b1=adam_b1, b2=adam_b2, eps=eps, eps_root=adam_eps_root, mu_dtype=mu_dtype)
              .add_decayed_weights(decay=adam_weight_decay).scale_by_learning_rate(adam_learning_rate))
    return partition({"muon": matrices, "adam": others}, _muon_groups)
