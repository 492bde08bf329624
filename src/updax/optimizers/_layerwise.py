"""Layer-wise optimizers: LAMB, LARS, Fromage and NovoGrad."""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp

from updax import _validate as check
from updax._schedules import Schedule, _Function
from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer
from updax.updates import add_decayed_weights, scale_by_adam, scale_by_novograd, scale_by_trust_ratio


@optimizer
def lamb(learning_rate: ScalarOrSchedule = 1e-2, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
         eps: ScalarOrSchedule = 1e-8, eps_root: ScalarOrSchedule = 1e-15, decay: ScalarOrSchedule = 0.0,
         min_norm: ScalarOrSchedule = 0.0, *, mu_dtype: DType = None, nu_dtype: DType = None,
         mask: PyTree | Callable[[PyTree], PyTree] | None = None, cautious_decay: bool = False,
         maximize: bool = False) -> Update:
    """LAMB: AdamW rescaled per leaf by the trust ratio.

    Pipeline: ``scale_by_adam(...) |> add_decayed_weights(decay) |> scale_by_trust_ratio(min_norm)
    |> scale_by_learning_rate(learning_rate)``.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.01``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``1e-15``.
        decay: weight-decay rate. Default: ``0.0``.
        min_norm: floor of the norms in the trust ratio. Default: ``0.0``.
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
        >>> print(ux.optimizers.lamb(1e-2))
        scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=1e-15) |> add_decayed_weights(decay=0.0) |> scale_by_trust_ratio(min_norm=0.0, trust_coefficient=1.0, eps=0.0) |> scale_by_learning_rate(learning_rate=0.01)

    References:
        You et al., "Large Batch Optimization for Deep Learning: Training BERT
        in 76 minutes", ICLR 2020. https://arxiv.org/abs/1904.00962
    """
    pipeline = (scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype)
                .add_decayed_weights(decay=decay, mask=mask, cautious=cautious_decay)
                .scale_by_trust_ratio(min_norm=min_norm)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)


@optimizer
def lars(learning_rate: ScalarOrSchedule = 1e-1, decay: ScalarOrSchedule = 0.0,
         trust_coefficient: ScalarOrSchedule = 1e-3, eps: ScalarOrSchedule = 0.0, momentum: ScalarOrSchedule = 0.9,
         nesterov: bool = False, *, mask: PyTree | Callable[[PyTree], PyTree] | None = None,
         trust_ratio_mask: PyTree | Callable[[PyTree], PyTree] | None = None, maximize: bool = False) -> Update:
    """LARS: momentum SGD with a per-layer trust ratio.

    Pipeline: ``add_decayed_weights(decay) |> scale_by_trust_ratio(trust_coefficient=…, eps=…)
    |> scale_by_learning_rate(lr) |> trace(momentum, nesterov)``.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.1``.
        decay: weight decay added before the trust ratio. Default: ``0.0``.
        trust_coefficient: the trust coefficient (the paper's 0.001). Default: ``0.001``.
        eps: added to the update norm. Default: ``0.0``.
        momentum: the momentum decay. Default: ``0.9``.
        nesterov: Nesterov momentum. Default: ``False``.
        mask: which leaves decay: a pytree of bools shaped like the params (or
            a prefix of it), or a function of the params returning one; None
            decays every leaf. Default: ``None``.
        trust_ratio_mask: which leaves the trust ratio scales, in the same
            forms; None scales every leaf. Default: ``None``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

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
    pipeline = (add_decayed_weights(decay=decay, mask=mask)
                .scale_by_trust_ratio(trust_coefficient=trust_coefficient, eps=eps, mask=trust_ratio_mask)
                .scale_by_learning_rate(learning_rate).trace(decay=momentum, nesterov=nesterov))
    return maximized(maximize, pipeline)


class fromage_step(Schedule):
    r"""Fromage's step with a scheduled learning rate: $\eta_t / \sqrt{1 + \eta_t^2}$ (what
    ``scale_by_learning_rate`` takes)."""

    def __init__(self, learning_rate):
        self._set(learning_rate=learning_rate if isinstance(learning_rate, Schedule) else _Function(learning_rate))

    def __call__(self, count):
        rate = jnp.asarray(self.learning_rate(count))
        return rate / jnp.sqrt(1 + rate**2)


class fromage_shrink(Schedule):
    r"""Fromage's weight decay with a scheduled learning rate: $1 / \sqrt{1 + \eta_t^2} - 1$ (what
    ``add_decayed_weights`` takes)."""

    def __init__(self, learning_rate):
        self._set(learning_rate=learning_rate if isinstance(learning_rate, Schedule) else _Function(learning_rate))

    def __call__(self, count):
        rate = jnp.asarray(self.learning_rate(count))
        return 1 / jnp.sqrt(1 + rate**2) - 1


@optimizer
def fromage(learning_rate: ScalarOrSchedule = 1e-2, min_norm: ScalarOrSchedule = 1e-6, *, maximize: bool = False) -> Update:
    r"""Fromage: steps in relative (Frobenius) distance, shrinking the weights to stay on the sphere.

    Pipeline, with $\eta$ = ``learning_rate`` and $m = 1 / \sqrt{1 + \eta^2}$:
    ``scale_by_trust_ratio(min_norm) |> scale_by_learning_rate(learning_rate * m) |> add_decayed_weights(m - 1)``,
    so that, with the norms taken per leaf,

    $$
    p \gets m \left(p - \eta\, \frac{\lVert p \rVert}{\lVert g \rVert}\, g\right)
    $$

    With a schedule $\eta_t$, $m$ follows it: the step and the decay are
    schedules of $\eta_t$ (as optax's ``fromage`` takes one).

    Args:
        learning_rate: a positive number or a schedule. Default: ``0.01``.
        min_norm: floor of both norms in the trust ratio. Default: ``1e-06``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

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
    if callable(learning_rate) and not isinstance(learning_rate, type):
        pipeline = (scale_by_trust_ratio(min_norm=min_norm).scale_by_learning_rate(fromage_step(learning_rate))
                    .add_decayed_weights(decay=fromage_shrink(learning_rate)))
        return maximized(maximize, pipeline)
    learning_rate = check.number("fromage", "learning_rate", learning_rate, 0.0, lo_open=True)
    mult = 1.0 / (1.0 + learning_rate**2) ** 0.5
    pipeline = (scale_by_trust_ratio(min_norm=min_norm).scale_by_learning_rate(learning_rate * mult)
                .add_decayed_weights(decay=mult - 1.0))
    return maximized(maximize, pipeline)


@optimizer
def novograd(learning_rate: ScalarOrSchedule = 1e-3, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.25,
             eps: ScalarOrSchedule = 1e-6, eps_root: ScalarOrSchedule = 0.0, decay: ScalarOrSchedule = 0.0, *,
             mask: PyTree | Callable[[PyTree], PyTree] | None = None, maximize: bool = False) -> Update:
    """NovoGrad: momentum of updates normalised by a layer-wise second moment.

    Pipeline: ``scale_by_novograd(b1, b2, eps, eps_root, decay) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.001``.
        b1: first-moment decay. Default: ``0.9``.
        b2: decay of the layer-wise second moment. Default: ``0.25``.
        eps: added to the denominator (optax's alias default). Default: ``1e-06``.
        eps_root: added inside the square root. Default: ``0.0``.
        decay: weight decay inside the normalised step. Default: ``0.0``.
        mask: which leaves decay: a pytree of bools shaped like the params (or
            a prefix of it), or a function of the params returning one; None
            decays every leaf. Default: ``None``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

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
    pipeline = scale_by_novograd(b1=b1, b2=b2, eps=eps, eps_root=eps_root, decay=decay,
                                 mask=mask).scale_by_learning_rate(learning_rate)
    return maximized(maximize, pipeline)
