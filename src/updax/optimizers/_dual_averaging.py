"""Dual-averaging optimizers: MADGRAD."""

from __future__ import annotations

from collections.abc import Callable

from updax._typing import PyTree, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer
from updax.updates import add_decayed_weights


@optimizer
def madgrad(learning_rate: ScalarOrSchedule = 1e-2, momentum: ScalarOrSchedule = 0.9, decay: ScalarOrSchedule = 0.0,
            eps: ScalarOrSchedule = 1e-6, *, mask: PyTree | Callable[[PyTree], PyTree] | None = None,
            maximize: bool = False) -> Update:
    """MADGRAD: momentumised dual averaging with a cube-root adaptive denominator.

    Pipeline: ``add_decayed_weights(decay) |> scale_by_madgrad(learning_rate, momentum, eps) |> scale(-1.0)``:
    the learning rate weighs the sums of the gradients, so it is an option of
    the stage, which emits the step along the gradient. The weight decay is
    added to the gradient (L2, coupled), as in the paper's implementation and
    optax's (whose ``weight_decay`` is ``decay`` here).

    Args:
        learning_rate: a number >= 0 or a schedule (the authors' default
            0.01). Default: ``0.01``.
        momentum: the momentum, in [0, 1). Default: ``0.9``.
        decay: L2 weight decay added to the gradients. Default: ``0.0``.
        eps: added to the denominator and to the learning rate. Default: ``1e-06``.
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
        >>> ux.optimizers.madgrad()
        add_decayed_weights(decay=0.0) |> scale_by_madgrad(learning_rate=0.01, momentum=0.9, eps=1e-06) |> scale(step_size=-1.0)

    References:
        Defazio & Jelassi, "Adaptivity without Compromise: A Momentumized,
        Adaptive, Dual Averaged Gradient Method for Stochastic Optimization",
        JMLR 2022. https://arxiv.org/abs/2101.11075
    """
    pipeline = add_decayed_weights(decay=decay, mask=mask).scale_by_madgrad(learning_rate=learning_rate,
                                                                            momentum=momentum, eps=eps).scale(-1.0)
    return maximized(maximize, pipeline)
