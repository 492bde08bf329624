"""SOAP: Adam in the eigenbasis of Shampoo's preconditioner, with decoupled weight decay."""

from __future__ import annotations

from collections.abc import Callable

from updax._typing import PyTree, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer
from updax.updates import scale_by_soap


@optimizer
def soap(learning_rate: ScalarOrSchedule = 3e-3, b1: ScalarOrSchedule = 0.95, b2: ScalarOrSchedule = 0.95,
         shampoo_beta: ScalarOrSchedule = 0.95, eps: ScalarOrSchedule = 1e-8, decay: ScalarOrSchedule = 0.01,
         precondition_frequency: int = 10, max_precond_dim: int = 10000, merge_dims: bool = False, *,
         mask: PyTree | Callable[[PyTree], PyTree] | None = None, cautious_decay: bool = False,
         maximize: bool = False) -> Update:
    """SOAP: Adam run in the eigenbasis of Shampoo's preconditioner, refreshed every few steps.

    Pipeline: ``scale_by_soap(...) |> add_decayed_weights(decay) |> scale_by_learning_rate(learning_rate)``.
    The defaults are the paper's code's. Leaves of fewer than two axes (biases, norms' scales) take AdamW.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.003``.
        b1: first-moment decay. Default: ``0.95``.
        b2: second-moment decay. Default: ``0.95``.
        shampoo_beta: decay of Shampoo's statistics. Default: ``0.95``.
        eps: added to the denominator. Default: ``1e-08``.
        decay: decoupled weight-decay rate. Default: ``0.01``.
        precondition_frequency: steps between refreshes of the eigenbases. Default: ``10``.
        max_precond_dim: the largest axis that gets an eigenbasis. Default: ``10000``.
        merge_dims: merge neighbouring axes up to ``max_precond_dim`` elements first. Default: ``False``.
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
        >>> ux.optimizers.soap()
        scale_by_soap(b1=0.95, b2=0.95, shampoo_beta=0.95, eps=1e-08, precondition_frequency=10, max_precond_dim=10000, merge_dims=False) |> add_decayed_weights(decay=0.01) |> scale_by_learning_rate(learning_rate=0.003)

    References:
        Vyas et al., "SOAP: Improving and Stabilizing Shampoo using Adam", ICLR 2025.
        https://arxiv.org/abs/2409.11321
    """
    pipeline = (scale_by_soap(b1=b1, b2=b2, shampoo_beta=shampoo_beta, eps=eps,
                              precondition_frequency=precondition_frequency, max_precond_dim=max_precond_dim,
                              merge_dims=merge_dims)
                .add_decayed_weights(decay=decay, mask=mask, cautious=cautious_decay)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)
