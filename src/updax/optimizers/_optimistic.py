"""Optimistic methods for min-max problems: optimistic gradient descent and Optimistic Adam (two spellings)."""

from __future__ import annotations

from updax._typing import DType, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer
from updax.updates import scale_by_adam, scale_by_optimistic_gradient


@optimizer
def optimistic_gradient_descent(learning_rate: ScalarOrSchedule = 1e-2, alpha: ScalarOrSchedule = 1.0,
                                beta: ScalarOrSchedule = 1.0, *, maximize: bool = False) -> Update:
    r"""Optimistic gradient descent: each step corrects by the change of the gradient since the last one.

    Pipeline: ``scale_by_optimistic_gradient(alpha, beta) |> scale_by_learning_rate(learning_rate)``,
    i.e., with $\eta$ = ``learning_rate``, $\alpha$ = ``alpha``, $\beta$ = ``beta``,
    $w \gets w - \eta\, ((\alpha + \beta)\, g_t - \beta\, g_{t-1})$; with $\alpha = \beta = 1$ it is
    optimistic mirror descent, whose last iterate converges in bilinear
    games where gradient descent cycles. The first step is $-\eta \alpha\, g$.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.01``.
        alpha: the weight of the current gradient. Default: ``1.0``.
        beta: the optimism (negative momentum). Default: ``1.0``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.optimistic_gradient_descent(0.1)
        scale_by_optimistic_gradient(alpha=1.0, beta=1.0) |> scale_by_learning_rate(learning_rate=0.1)

    References:
        Daskalakis et al., "Training GANs with Optimism", ICLR 2018.
        https://arxiv.org/abs/1711.00141; Mokhtari et al., "A Unified
        Analysis of Extra-gradient and Optimistic Gradient Methods for Saddle
        Point Problems", AISTATS 2020. https://arxiv.org/abs/1901.08511
    """
    pipeline = scale_by_optimistic_gradient(alpha=alpha, beta=beta).scale_by_learning_rate(learning_rate)
    return maximized(maximize, pipeline)


@optimizer
def optimistic_adam(learning_rate: ScalarOrSchedule = 1e-3, alpha: ScalarOrSchedule = 1.0,
                    beta: ScalarOrSchedule = 1.0, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
                    eps: ScalarOrSchedule = 1e-8, eps_root: ScalarOrSchedule = 0.0, *, mu_dtype: DType = None,
                    nu_dtype: DType = None, nesterov: bool = False, maximize: bool = False) -> Update:
    r"""Optimistic Adam: optimistic steps along Adam's direction.

    Pipeline: ``scale_by_adam(b1, b2, eps, eps_root) |> scale_by_optimistic_gradient(alpha, beta)
    |> scale_by_learning_rate(learning_rate)``. With $\eta$ = ``learning_rate``, $\alpha$ = ``alpha``,
    $\beta$ = ``beta``, $\epsilon$ = ``eps``, $\epsilon_\text{root}$ = ``eps_root`` and
    $r_t = \hat m_t / (\sqrt{\hat v_t + \epsilon_\text{root}} + \epsilon)$ Adam's direction (see
    :func:`updax.scale_by_adam`), $w \gets w - \eta\, ((\alpha + \beta)\, r_t - \beta\, r_{t-1})$: the
    paper's Algorithm 1 at $\alpha = \beta = 1$ ($w \gets w - 2\eta\, r_t + \eta\, r_{t-1}$). The first
    step is $-\eta \alpha\, r_1$.
    ``nesterov`` is False by default, as in the paper; optax's
    ``optimistic_adam_v2`` defaults to True.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.001``.
        alpha: the weight of the current direction. Default: ``1.0``.
        beta: the optimism (negative momentum). Default: ``1.0``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``0.0``.
        mu_dtype: storage dtype of the first moment. Default: ``None``.
        nu_dtype: storage dtype of the second moment. Default: ``None``.
        nesterov: Nesterov's look-ahead first moment (optax's default).
            Default: ``False``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.optimistic_adam(2e-4)
        scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=0.0) |> scale_by_optimistic_gradient(alpha=1.0, beta=1.0) |> scale_by_learning_rate(learning_rate=0.0002)

    References:
        Daskalakis et al., "Training GANs with Optimism", ICLR 2018,
        Algorithm 1. https://arxiv.org/abs/1711.00141
    """
    pipeline = scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype,
                             nesterov=nesterov).scale_by_optimistic_gradient(alpha=alpha, beta=beta).scale_by_learning_rate(
            learning_rate)
    return maximized(maximize, pipeline)


@optimizer
def optimistic_adam_v2(learning_rate: ScalarOrSchedule = 1e-3, *, alpha: ScalarOrSchedule = 1.0,
                       beta: ScalarOrSchedule = 1.0, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
                       eps: ScalarOrSchedule = 1e-8, eps_root: ScalarOrSchedule = 0.0, mu_dtype: DType = None,
                       nu_dtype: DType = None, nesterov: bool = True, maximize: bool = False) -> Update:
    r"""Optimistic Adam as optax's ``optimistic_adam_v2`` spells it: keyword options, Nesterov by default.

    The same pipeline as :func:`optimistic_adam`, ``scale_by_adam(b1, b2, eps, eps_root, nesterov)
    |> scale_by_optimistic_gradient(alpha, beta) |> scale_by_learning_rate(learning_rate)``, with
    optax's signature: every option after the learning rate is a keyword, and
    ``nesterov`` is True (``optimistic_adam``'s is False, as in the paper).

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.001``.
        alpha: the weight of the current direction. Default: ``1.0``.
        beta: the optimism (negative momentum). Default: ``1.0``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``0.0``.
        mu_dtype: storage dtype of the first moment. Default: ``None``.
        nu_dtype: storage dtype of the second moment. Default: ``None``.
        nesterov: Nesterov's look-ahead first moment. Default: ``True``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.optimistic_adam_v2(2e-4) == ux.optimizers.optimistic_adam(2e-4, nesterov=True)
        True

    References:
        Daskalakis et al., "Training GANs with Optimism", ICLR 2018,
        Algorithm 1. https://arxiv.org/abs/1711.00141
    """
    return optimistic_adam(learning_rate, alpha=alpha, beta=beta, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                           mu_dtype=mu_dtype, nu_dtype=nu_dtype, nesterov=nesterov, maximize=maximize)
