"""PSGD Kron: the momentum whitened by a Kronecker-factored preconditioner fitted on a Lie group, with decoupled
weight decay."""

from __future__ import annotations

from collections.abc import Callable

import jax

from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer
from updax.updates import scale_by_psgd_kron


@optimizer
def psgd_kron(learning_rate: ScalarOrSchedule = 1e-3, b1: ScalarOrSchedule = 0.9, decay: ScalarOrSchedule = 0.0,
              precond_lr: ScalarOrSchedule = 0.1, precond_update_prob: ScalarOrSchedule = 1.0, *,
              max_size_triangular: int = 8192, preconditioner_init_scale: float | None = None,
              momentum_into_precond_update: bool = True, key: int | jax.Array = 0, mu_dtype: DType | None = None,
              mask: PyTree | Callable[[PyTree], PyTree] | None = None, cautious_decay: bool = False,
              maximize: bool = False) -> Update:
    """PSGD Kron: Li's preconditioned SGD, Kronecker-factored, as psgd_jax's ``kron``.

    Pipeline: ``scale_by_psgd_kron(...) |> add_decayed_weights(decay) |> scale_by_learning_rate(learning_rate)``.
    The preconditioned momentum has an RMS of about 1 (it is whitened), so Adam's learning rates are the place to
    start (psgd_jax suggests about half of them). There is no ``b2`` or ``eps``. Vectors and scalars get diagonal
    preconditioners, axes above ``max_size_triangular`` too.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.001``.
        b1: decay of the momentum, in [0, 1). Default: ``0.9``.
        decay: decoupled weight-decay rate. Default: ``0.0``.
        precond_lr: the preconditioner's step size on its Lie group, in [0, 1). Default: ``0.1``.
        precond_update_prob: the probability of fitting the preconditioner at a step, or a schedule of the count
            (psgd_jax anneals it from 1 to 0.03 to save time on large models). Default: ``1.0``.
        max_size_triangular: the largest axis that gets a triangular factor. Default: ``8192``.
        preconditioner_init_scale: the first preconditioner's scale, or None to set it from the first gradients.
            Default: ``None``.
        momentum_into_precond_update: fit the preconditioner to the momentum (True) or to the gradient.
            Default: ``True``.
        key: the seed or PRNG key of the probes and of the fits' draws. Default: ``0``.
        mu_dtype: storage dtype of the momentum. Default: ``None``.
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
        >>> ux.optimizers.psgd_kron(3e-4, decay=0.1)
        scale_by_psgd_kron(b1=0.9, precond_lr=0.1, precond_update_prob=1.0, max_size_triangular=8192, momentum_into_precond_update=True, key=0) |> add_decayed_weights(decay=0.1) |> scale_by_learning_rate(learning_rate=0.0003)

    References:
        Li, "Preconditioned Stochastic Gradient Descent", IEEE TNNLS 2018. https://arxiv.org/abs/1512.04202;
        Li, "Black Box Lie Group Preconditioners for SGD", 2022. https://arxiv.org/abs/2211.04422
    """
    pipeline = (scale_by_psgd_kron(b1=b1, precond_lr=precond_lr, precond_update_prob=precond_update_prob,
                                   max_size_triangular=max_size_triangular,
                                   preconditioner_init_scale=preconditioner_init_scale,
                                   momentum_into_precond_update=momentum_into_precond_update, key=key,
                                   mu_dtype=mu_dtype)
                .add_decayed_weights(decay=decay, mask=mask, cautious=cautious_decay)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)
