"""Memory-light optimizers: Adafactor and SM3."""

from __future__ import annotations

from collections.abc import Callable

from updax import _validate as check
from updax import schedules
from updax._domains import FloatDtype
from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer
from updax.updates import scale_by_factored_rms, scale_by_sm3


@optimizer
def adafactor(learning_rate: ScalarOrSchedule | None = None, min_dim_size_to_factor: int = 128,
              decay_rate: ScalarOrSchedule = 0.8, decay_offset: int = 0, multiply_by_parameter_scale: bool = True,
              clipping_threshold: ScalarOrSchedule | None = 1.0, momentum: ScalarOrSchedule | None = None,
              decay: ScalarOrSchedule | None = None, eps: ScalarOrSchedule = 1e-30, factored: bool = True, *,
              mask: PyTree | Callable[[PyTree], PyTree] | None = None, cautious_decay: bool = False,
              maximize: bool = False, dtype_momentum: DType = None) -> Update:
    """Adafactor: factored second moments, update clipping and relative step sizes.

    Pipeline: ``scale_by_factored_rms(...) |> clip_by_block_rms(clipping_threshold)
    |> scale(learning_rate) |> scale_by_param_block_rms() |> [ema(momentum, debias=False)]
    |> [add_decayed_weights(decay)] |> scale(-1.0)``; bracketed
    stages only when their option is set. With ``learning_rate=None`` the
    paper's relative step ``min(1e-2, 1/sqrt(t))`` is used, which together
    with ``multiply_by_parameter_scale`` gives the paper's default rule.

    Args:
        learning_rate: a number >= 0, a schedule, or None for
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
        decay: weight decay, or None. Default: ``None``.
        eps: added to the squared gradient. Default: ``1e-30``.
        factored: factor the second moments at all. Default: ``True``.
        dtype_momentum: storage dtype of the momentum (optax's name; the
            ``accumulator_dtype`` of the ``ema`` stage); None keeps the
            params' dtype but at least float32, which is optax's float32 for
            float32 and bfloat16 params. Read only when ``momentum`` is set
            (checked either way). Default: ``None``.
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
        An update object; ``update`` needs ``params`` when
        ``multiply_by_parameter_scale`` or ``decay`` is set.

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
    FloatDtype().check("adafactor", "dtype_momentum", dtype_momentum)  # by its name here, read or not
    opt = scale_by_factored_rms(factored=factored, decay_rate=decay_rate, step_offset=decay_offset,
                                min_dim_size_to_factor=min_dim_size_to_factor, epsilon=eps)
    if clipping_threshold is not None:
        opt = opt.clip_by_block_rms(threshold=clipping_threshold)
    opt = opt.scale(schedules.relative_step() if learning_rate is None else learning_rate)
    if multiply_by_parameter_scale:
        opt = opt.scale_by_param_block_rms()
    if momentum is not None:
        opt = opt.ema(momentum, debias=False, accumulator_dtype=dtype_momentum)
    if decay is not None:
        opt = opt.add_decayed_weights(decay=decay, mask=mask, cautious=cautious_decay)
    return maximized(maximize, opt.scale(-1.0))


@optimizer
def sm3(learning_rate: ScalarOrSchedule = 1e-1, momentum: ScalarOrSchedule = 0.9, *, maximize: bool = False) -> Update:
    """SM3: memory-efficient adaptive steps from per-axis accumulators.

    Pipeline: ``scale_by_sm3(b1=momentum) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number >= 0 or a schedule; like AdaGrad's, SM3's steps
            shrink as its accumulators grow, so it takes rates well above
            Adam's. Default: ``0.1``.
        momentum: EMA decay of the scaled updates. Default: ``0.9``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

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
    return maximized(maximize, scale_by_sm3(b1=momentum).scale_by_learning_rate(learning_rate))
