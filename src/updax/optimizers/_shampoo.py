"""Shampoo: Kronecker-factored preconditioning grafted onto a diagonal method's step size, with momentum."""

from __future__ import annotations

from collections.abc import Callable

from updax._typing import PyTree, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer
from updax.updates import scale_by_shampoo


@optimizer
def shampoo(learning_rate: ScalarOrSchedule = 1e-3, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
            eps: ScalarOrSchedule = 1e-8, decay: ScalarOrSchedule = 0.0, *, matrix_eps: ScalarOrSchedule = 1e-6,
            precondition_frequency: int = 10, start_preconditioning_step: int = 1, max_preconditioner_dim: int = 1024,
            graft: str = "adam", block_size: int | None = None, root_method: str = "eigh",
            mask: PyTree | Callable[[PyTree], PyTree] | None = None,
            cautious_decay: bool = False, maximize: bool = False) -> Update:
    """Shampoo: a Kronecker factor per axis, its inverse root refreshed every few steps, grafted.

    Pipeline: ``scale_by_shampoo(...) |> ema(b1, debias=True) |> add_decayed_weights(decay)
    |> scale_by_learning_rate(learning_rate)``: the momentum of the grafted update (as Anil et al.'s), then
    decoupled weight decay. Leaves with fewer than two axes take the graft's step alone (Adam's, by default).

    Args:
        learning_rate: a number >= 0 or a schedule; with the default Adam graft, Adam's rates. Default: ``0.001``.
        b1: decay of the momentum, in [0, 1); 0 takes none. Default: ``0.9``.
        b2: decay of the statistics and of the graft's second moment, in [0, 1]. Default: ``0.999``.
        eps: the graft's denominator term. Default: ``1e-08``.
        decay: decoupled weight-decay rate. Default: ``0.0``.
        matrix_eps: added to the statistics' eigenvalues, relative to the largest one. Default: ``1e-06``.
        precondition_frequency: the steps between refreshes of the roots. Default: ``10``.
        start_preconditioning_step: the first step that uses the roots; before it the graft alone.
            Default: ``1``.
        max_preconditioner_dim: the largest axis that gets a statistic. Default: ``1024``.
        graft: the step size's method, ``"adagrad"``, ``"rmsprop"``, ``"adam"`` or ``"sgd"``. Default: ``'adam'``.
        block_size: None, or the longest block along an axis: a leaf with a longer axis is cut into blocks, each
            preconditioned and grafted on its own. Default: ``None``.
        root_method: ``"eigh"`` or ``"newton"`` (the coupled Newton iteration). Default: ``'eigh'``.
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
        >>> ux.optimizers.shampoo(precondition_frequency=20).stages[0].option("precondition_frequency")
        20

    References:
        Gupta, Koren & Singer, "Shampoo: Preconditioned Stochastic Tensor Optimization", ICML 2018.
        https://arxiv.org/abs/1802.09568;
        Anil et al., "Scalable Second Order Optimization for Deep Learning", 2020.
        https://arxiv.org/abs/2002.09018
    """
    pipeline = (scale_by_shampoo(b2=b2, eps=eps, matrix_eps=matrix_eps, precondition_frequency=precondition_frequency,
                                 start_preconditioning_step=start_preconditioning_step,
                                 max_preconditioner_dim=max_preconditioner_dim, graft=graft, block_size=block_size,
                                 root_method=root_method)
                .ema(b1, debias=True)
                .add_decayed_weights(decay=decay, mask=mask, cautious=cautious_decay)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)
