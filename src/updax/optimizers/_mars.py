"""MARS's two instances: MARS-AdamW and MARS-Lion."""

from __future__ import annotations

from collections.abc import Callable

from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer
from updax.updates import scale_by_mars


@optimizer
def mars_adamw(learning_rate: ScalarOrSchedule = 3e-3, gamma: ScalarOrSchedule = 0.025, b1: ScalarOrSchedule = 0.95,
               b2: ScalarOrSchedule = 0.99, eps: ScalarOrSchedule = 1e-8, eps_root: ScalarOrSchedule = 0.0,
               max_norm: ScalarOrSchedule = 1.0, decay: ScalarOrSchedule = 0.0, *, mu_dtype: DType = None,
               nu_dtype: DType = None, mask: PyTree | Callable[[PyTree], PyTree] | None = None,
               maximize: bool = False) -> Update:
    """MARS-AdamW: AdamW on MARS's variance-reduced, clipped gradient.

    Pipeline: ``scale_by_mars(gamma, b1, max_norm) |> scale_by_adam(b1, b2, eps, eps_root)
    |> add_decayed_weights(decay) |> scale_by_learning_rate(learning_rate)``, the two stages sharing ``b1``
    (the paper's β1). With ``gamma=0`` it is :func:`adamw` on the gradients clipped to ``max_norm`` per leaf,
    and :func:`adamw` itself where no leaf's norm exceeds it. The defaults are the authors' code's; their
    GPT-2 runs use learning rates of 6e-3 to 2e-3 with ``decay=0.01``.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.003``.
        gamma: the scale of the gradient correction. Default: ``0.025``.
        b1: first-moment decay, which also weighs the correction. Default: ``0.95``.
        b2: second-moment decay. Default: ``0.99``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``0.0``.
        max_norm: the largest L2 norm of a leaf of the corrected gradient. Default: ``1.0``.
        decay: decoupled weight decay. Default: ``0.0``.
        mu_dtype: storage dtype of the first moment. Default: ``None``.
        nu_dtype: storage dtype of the second moment. Default: ``None``.
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
        >>> ux.optimizers.mars_adamw(decay=0.01)
        scale_by_mars(gamma=0.025, b1=0.95, max_norm=1.0) |> scale_by_adam(b1=0.95, b2=0.99, eps=1e-08, eps_root=0.0) |> add_decayed_weights(decay=0.01) |> scale_by_learning_rate(learning_rate=0.003)

    References:
        Yuan et al., "MARS: Unleashing the Power of Variance Reduction for
        Training Large Models", ICML 2025 (MARS-AdamW). https://arxiv.org/abs/2411.10438
    """
    pipeline = (scale_by_mars(gamma=gamma, b1=b1, max_norm=max_norm)
                .scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype)
                .add_decayed_weights(decay=decay, mask=mask).scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)


@optimizer
def mars_lion(learning_rate: ScalarOrSchedule = 1e-4, gamma: ScalarOrSchedule = 0.025, b1: ScalarOrSchedule = 0.95,
              max_norm: ScalarOrSchedule = 1.0, decay: ScalarOrSchedule = 0.0, *, mu_dtype: DType = None,
              mask: PyTree | Callable[[PyTree], PyTree] | None = None, maximize: bool = False) -> Update:
    """MARS-Lion: the sign of a momentum of MARS's variance-reduced, clipped gradient.

    Pipeline: ``scale_by_mars(gamma, b1, max_norm) |> scale_by_lion(b1, b1) |> add_decayed_weights(decay)
    |> scale_by_learning_rate(learning_rate)``. The paper's MARS-Lion steps along the sign of a momentum of
    decay β1: Lion with both its decays β1. With ``gamma=0`` it is
    :func:`lion` with ``b1 = b2`` on the gradients clipped to ``max_norm`` per leaf. The authors tuned their
    hyperparameters on MARS-AdamW and advise tuning the learning rate of MARS-Lion again; the default is
    :func:`lion`'s, as sign steps move every coordinate by the whole learning rate.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.0001``.
        gamma: the scale of the gradient correction. Default: ``0.025``.
        b1: momentum decay, which also weighs the correction. Default: ``0.95``.
        max_norm: the largest L2 norm of a leaf of the corrected gradient. Default: ``1.0``.
        decay: decoupled weight decay. Default: ``0.0``.
        mu_dtype: storage dtype of the momentum. Default: ``None``.
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
        >>> ux.optimizers.mars_lion()
        scale_by_mars(gamma=0.025, b1=0.95, max_norm=1.0) |> scale_by_lion(b1=0.95, b2=0.95) |> add_decayed_weights(decay=0.0) |> scale_by_learning_rate(learning_rate=0.0001)

    References:
        Yuan et al., "MARS: Unleashing the Power of Variance Reduction for
        Training Large Models", ICML 2025 (MARS-Lion). https://arxiv.org/abs/2411.10438
    """
    pipeline = (scale_by_mars(gamma=gamma, b1=b1, max_norm=max_norm).scale_by_lion(b1=b1, b2=b1, mu_dtype=mu_dtype)
                .add_decayed_weights(decay=decay, mask=mask).scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)
