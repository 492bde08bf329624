"""Axon's optimizers: each one readable expression over the catalogue.

Learning rate first, with Axon 0.3's defaults; the learning rate is a number
or a schedule ``count -> value``; the other options pass through to the
stages under Axon's names. Printing an optimizer shows its pipeline.
"""

from __future__ import annotations

from updax import _validate as check
from updax.updates import (
    add_decayed_weights,
    add_noise,
    scale_by_adam,
    scale_by_belief,
    scale_by_learning_rate,
    scale_by_radam,
    scale_by_rms,
    scale_by_rss,
    scale_by_stddev,
    scale_by_trust_ratio,
    scale_by_yogi,
    trace,
)


def adabelief(learning_rate=1e-3, b1=0.9, b2=0.999, eps=0.0, eps_root=1e-16):
    """AdaBelief: Adam whose second moment tracks the spread of the gradient around its mean.

    Pipeline: ``scale_by_belief(b1, b2, eps, eps_root) |> scale_by_learning_rate(learning_rate)``.

    Args:
        learning_rate: a number or a schedule. Default: ``0.001``.
        b1: first-moment decay. Default: ``0.9``.
        b2: belief decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``0.0``.
        eps_root: added to the belief at every step. Default: ``1e-16``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.adabelief(1e-2)
        scale_by_belief(b1=0.9, b2=0.999, eps=0.0, eps_root=1e-16) |> scale_by_learning_rate(learning_rate=0.01)

    References:
        Zhuang et al., "AdaBelief Optimizer", NeurIPS 2020. https://arxiv.org/abs/2010.07468
    """
    return scale_by_belief(b1=b1, b2=b2, eps=eps, eps_root=eps_root).scale_by_learning_rate(learning_rate)


def adagrad(learning_rate=1e-3, initial_accumulator_value=0.1, eps=1e-7):
    """AdaGrad: steps scaled by the root of the sum of all squared gradients so far.

    Pipeline: ``scale_by_rss(initial_accumulator_value, eps) |> scale_by_learning_rate(learning_rate)``.

    Args:
        learning_rate: a number or a schedule. Default: ``0.001``.
        initial_accumulator_value: initial sum of squares. Default: ``0.1``.
        eps: added inside the square root. Default: ``1e-07``.

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
    return scale_by_rss(initial_accumulator_value=initial_accumulator_value, eps=eps).scale_by_learning_rate(
        learning_rate)


def adam(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-8, eps_root=1e-15, *, mu_dtype=None, nu_dtype=None):
    """Adam.

    Pipeline: ``scale_by_adam(b1, b2, eps, eps_root) |> scale_by_learning_rate(learning_rate)``.

    Args:
        learning_rate: a number or a schedule. Default: ``0.001``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root (Axon's default). Default: ``1e-15``.
        mu_dtype: storage dtype of the first moment. Default: ``None``.
        nu_dtype: storage dtype of the second moment. Default: ``None``.

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
    return scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype,
                         nu_dtype=nu_dtype).scale_by_learning_rate(learning_rate)


def adamw(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-8, eps_root=1e-15, decay=0.0, *, mu_dtype=None,
          nu_dtype=None):
    """AdamW: Adam with decoupled weight decay.

    Pipeline: ``scale_by_adam(...) |> add_decayed_weights(decay) |> scale_by_learning_rate(learning_rate)``.
    (Axon's default ``decay`` is 0; optax's is 1e-4.)

    Args:
        learning_rate: a number or a schedule. Default: ``0.001``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``1e-15``.
        decay: weight-decay rate. Default: ``0.0``.
        mu_dtype: storage dtype of the first moment. Default: ``None``.
        nu_dtype: storage dtype of the second moment. Default: ``None``.

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
    return (scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype)
            .add_decayed_weights(decay=decay).scale_by_learning_rate(learning_rate))


def lamb(learning_rate=1e-2, b1=0.9, b2=0.999, eps=1e-8, eps_root=1e-15, decay=0.0, min_norm=0.0, *,
         mu_dtype=None, nu_dtype=None):
    """LAMB: AdamW rescaled per leaf by the trust ratio.

    Pipeline: ``scale_by_adam(...) |> add_decayed_weights(decay) |> scale_by_trust_ratio(min_norm)
    |> scale_by_learning_rate(learning_rate)``.

    Args:
        learning_rate: a number or a schedule. Default: ``0.01``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``1e-15``.
        decay: weight-decay rate. Default: ``0.0``.
        min_norm: floor of the norms in the trust ratio. Default: ``0.0``.
        mu_dtype: storage dtype of the first moment. Default: ``None``.
        nu_dtype: storage dtype of the second moment. Default: ``None``.

    Returns:
        An update object; ``update`` needs ``params``.

    Example:
        >>> import updax as ux
        >>> print(ux.optimizers.lamb(1e-2))
        scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=1e-15) |> add_decayed_weights(decay=0.0) |> scale_by_trust_ratio(min_norm=0.0, trust_coefficient=1.0, eps=0.0) |> scale_by_learning_rate(learning_rate=0.01)

    References:
        You et al., "Large Batch Optimization for Deep Learning: Training BERT
        in 76 minutes", ICLR 2020. https://arxiv.org/abs/1904.00962
    """
    return (scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype)
            .add_decayed_weights(decay=decay).scale_by_trust_ratio(min_norm=min_norm)
            .scale_by_learning_rate(learning_rate))


def noisy_sgd(learning_rate=1e-2, eta=0.01, gamma=0.55, key=0):
    """SGD on gradients with annealed Gaussian noise added.

    Pipeline: ``add_noise(eta, gamma, key) |> scale_by_learning_rate(learning_rate)``:
    the noise is added to the gradient, as in the paper (Polaris adds it after
    the learning-rate scaling).

    Args:
        learning_rate: a number or a schedule. Default: ``0.01``.
        eta: the initial noise variance. Default: ``0.01``.
        gamma: the annealing exponent. Default: ``0.55``.
        key: an int seed or a JAX PRNG key. Default: ``0``.

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
    return add_noise(eta=eta, gamma=gamma, key=key).scale_by_learning_rate(learning_rate)


def radam(learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, threshold=5.0):
    """Rectified Adam.

    Pipeline: ``scale_by_radam(b1, b2, eps, eps_root, threshold) |> scale_by_learning_rate(learning_rate)``.

    Args:
        learning_rate: a number or a schedule. Default: ``0.001``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``0.0``.
        threshold: ``ρt`` from which the rectified step is used. Default: ``5.0``.

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
    return scale_by_radam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, threshold=threshold).scale_by_learning_rate(
        learning_rate)


def rmsprop(learning_rate=1e-2, centered=False, momentum=None, nesterov=False, decay=0.9, eps=1e-8,
            initial_scale=0.0):
    """RMSProp, optionally centred and with momentum.

    Pipeline: ``scale_by_rms`` (or ``scale_by_stddev`` when centred)
    ``|> scale_by_learning_rate(learning_rate)``, then ``|> trace(momentum, nesterov)``
    when ``momentum`` is given (Axon's order).

    Args:
        learning_rate: a number or a schedule. Default: ``0.01``.
        centered: scale by the centred second moment. Default: ``False``.
        momentum: the trace decay, or None for no momentum. Default: ``None``.
        nesterov: Nesterov momentum (with ``momentum`` set). Default: ``False``.
        decay: EMA decay of the squares. Default: ``0.9``.
        eps: added inside the square root. Default: ``1e-08``.
        initial_scale: initial second moment. Default: ``0.0``.

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
    opt = scaling(decay=decay, eps=eps, initial_scale=initial_scale).scale_by_learning_rate(learning_rate)
    if momentum is not None:
        opt = opt.trace(decay=momentum, nesterov=nesterov)
    return opt


def sgd(learning_rate=1e-2, momentum=None, nesterov=False):
    """Stochastic gradient descent, optionally with (Nesterov) momentum.

    Pipeline: ``trace(momentum, nesterov) |> scale_by_learning_rate(learning_rate)``,
    without the trace when ``momentum`` is None.

    Args:
        learning_rate: a number or a schedule. Default: ``0.01``.
        momentum: the trace decay, or None for plain SGD. Default: ``None``.
        nesterov: Nesterov momentum (with ``momentum`` set). Default: ``False``.

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
        return scale_by_learning_rate(learning_rate)
    return trace(decay=momentum, nesterov=nesterov).scale_by_learning_rate(learning_rate)


def yogi(learning_rate=1e-2, initial_accumulator_value=1e-6, b1=0.9, b2=0.999, eps=1e-3, eps_root=0.0):
    """Yogi: Adam with an additive, sign-controlled second moment.

    Pipeline: ``scale_by_yogi(...) |> scale_by_learning_rate(learning_rate)``.

    Args:
        learning_rate: a number or a schedule. Default: ``0.01``.
        initial_accumulator_value: initial moments. Default: ``1e-06``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment rate. Default: ``0.999``.
        eps: added to the denominator. Default: ``0.001``.
        eps_root: added inside the square root. Default: ``0.0``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.yogi()
        scale_by_yogi(initial_accumulator_value=1e-06, b1=0.9, b2=0.999, eps=0.001, eps_root=0.0) |> scale_by_learning_rate(learning_rate=0.01)

    References:
        Zaheer et al., "Adaptive Methods for Nonconvex Optimization", NeurIPS 2018.
    """
    return scale_by_yogi(initial_accumulator_value=initial_accumulator_value, b1=b1, b2=b2, eps=eps,
                         eps_root=eps_root).scale_by_learning_rate(learning_rate)
