"""Optimizers of the recent Adam variants: ADOPT, AdEMAMix, simplified AdEMAMix, LaProp and ACProp."""

from __future__ import annotations

from collections.abc import Callable

from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer
from updax.updates import (
    scale_by_acprop,
    scale_by_ademamix,
    scale_by_adopt,
    scale_by_laprop,
    scale_by_simplified_ademamix,
)


@optimizer
def adopt(learning_rate: ScalarOrSchedule = 1e-3, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.9999,
          eps: ScalarOrSchedule = 1e-6, clip_value: ScalarOrSchedule | None = None, *, mu_dtype: DType = None,
          nu_dtype: DType = None, nesterov: bool = False, use_clipping: bool = True, maximize: bool = False) -> Update:
    """ADOPT: Adam that normalises each update by the previous second moment.

    Pipeline: ``scale_by_adopt(b1, b2, eps, clip_value) |> scale_by_learning_rate(learning_rate)``.
    The first step only measures the second moment and leaves the params.

    Args:
        learning_rate: a number >= 0 or a schedule (the paper's 1e-3). Default: ``0.001``.
        b1: first-moment decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.9999``.
        eps: the smallest normaliser. Default: ``1e-06``.
        clip_value: the clipping bound, a number or a schedule; None is the
            paper's ``t^(1/4)``. Default: ``None``.
        mu_dtype: storage dtype of the first moment. Default: ``None``.
        nu_dtype: storage dtype of the second moment. Default: ``None``.
        nesterov: Nesterov's look-ahead (optax's option). Default: ``False``.
        use_clipping: clip the normalised updates. Default: ``True``.
        maximize: ascend instead of descending (PyTorch's name): the
            gradients are negated first, ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.adopt()
        scale_by_adopt(b1=0.9, b2=0.9999, eps=1e-06, nesterov=False, use_clipping=True) |> scale_by_learning_rate(learning_rate=0.001)

    References:
        Taniguchi et al., "ADOPT: Modified Adam Can Converge with Any β2 with
        the Optimal Rate", NeurIPS 2024. https://arxiv.org/abs/2411.02853
    """
    pipeline = scale_by_adopt(b1=b1, b2=b2, eps=eps, clip_value=clip_value, mu_dtype=mu_dtype, nu_dtype=nu_dtype,
                              nesterov=nesterov, use_clipping=use_clipping).scale_by_learning_rate(learning_rate)
    return maximized(maximize, pipeline)


@optimizer
def ademamix(learning_rate: ScalarOrSchedule = 1e-3, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
             b3: ScalarOrSchedule = 0.9999, alpha: ScalarOrSchedule = 5.0, eps: ScalarOrSchedule = 1e-8,
             eps_root: ScalarOrSchedule = 0.0, decay: ScalarOrSchedule = 0.0, *, mu_dtype: DType = None,
             nu_dtype: DType = None, mask: PyTree | Callable[[PyTree], PyTree] | None = None,
             cautious_decay: bool = False, maximize: bool = False) -> Update:
    """AdEMAMix: AdamW with a second, slow EMA of the gradients mixed in.

    Pipeline: ``scale_by_ademamix(...) |> add_decayed_weights(decay) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number >= 0 or a schedule. Default: ``0.001``.
        b1: decay of the fast EMA. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        b3: decay of the slow EMA, a number or a schedule (the paper's warm-up). Default: ``0.9999``.
        alpha: weight of the slow EMA, a number or a schedule (the paper's warm-up). Default: ``5.0``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``0.0``.
        decay: decoupled weight decay (optax's default). Default: ``0.0``.
        mu_dtype: storage dtype of the two EMAs. Default: ``None``.
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
        >>> [s.label for s in ux.optimizers.ademamix().stages]
        ['scale_by_ademamix', 'add_decayed_weights', 'scale_by_learning_rate']

    References:
        Pagliardini et al., "The AdEMAMix Optimizer: Better, Faster, Older",
        2024. https://arxiv.org/abs/2409.03137
    """
    pipeline = (scale_by_ademamix(b1=b1, b2=b2, b3=b3, alpha=alpha, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype,
                                  nu_dtype=nu_dtype)
                .add_decayed_weights(decay=decay, mask=mask, cautious=cautious_decay)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)


@optimizer
def simplified_ademamix(learning_rate: ScalarOrSchedule = 1e-5, b1: ScalarOrSchedule = 0.99,
                        b2: ScalarOrSchedule = 0.95, alpha: ScalarOrSchedule = 0.0, eps: ScalarOrSchedule = 1e-8,
                        eps_root: ScalarOrSchedule = 0.0, decay: ScalarOrSchedule = 0.0, *, mu_dtype: DType = None,
                        nu_dtype: DType = None, mask: PyTree | Callable[[PyTree], PyTree] | None = None,
                        cautious_decay: bool = False, maximize: bool = False) -> Update:
    """Simplified AdEMAMix: one undamped momentum plus ``alpha`` times the gradient, Adam-normalised.

    Pipeline: ``scale_by_simplified_ademamix(...) |> add_decayed_weights(decay) |> scale_by_learning_rate(lr)``.

    Args:
        learning_rate: a number >= 0 or a schedule; the momentum is a sum, about
            ``1/(1-b1)`` times Adam's, so the default is Adam's 1e-3 times
            ``1 - b1``. Default: ``1e-05``.
        b1: momentum decay. Default: ``0.99``.
        b2: second-moment decay. Default: ``0.95``.
        alpha: weight of the current gradient. Default: ``0.0``.
        eps: added to the denominator. Default: ``1e-08``.
        eps_root: added inside the square root. Default: ``0.0``.
        decay: decoupled weight decay (optax's default). Default: ``0.0``.
        mu_dtype: storage dtype of the momentum. Default: ``None``.
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
        >>> [s.label for s in ux.optimizers.simplified_ademamix().stages]
        ['scale_by_simplified_ademamix', 'add_decayed_weights', 'scale_by_learning_rate']

    References:
        Morwani et al., "Connections between Schedule-Free Optimizers,
        AdEMAMix, and Accelerated SGD Variants", 2025.
        https://arxiv.org/abs/2502.02431
    """
    pipeline = (scale_by_simplified_ademamix(b1=b1, b2=b2, alpha=alpha, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype,
                                             nu_dtype=nu_dtype)
                .add_decayed_weights(decay=decay, mask=mask, cautious=cautious_decay)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)


@optimizer
def laprop(learning_rate: ScalarOrSchedule = 4e-4, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
           eps: ScalarOrSchedule = 1e-15, decay: ScalarOrSchedule = 0.0, *, mu_dtype: DType = None,
           nu_dtype: DType = None, mask: PyTree | Callable[[PyTree], PyTree] | None = None,
           cautious_decay: bool = False, maximize: bool = False) -> Update:
    """LaProp: the momentum of the gradients divided by the root of their second moment.

    Pipeline: ``scale_by_laprop(b1, b2, eps) |> add_decayed_weights(decay) |> scale_by_learning_rate(lr)``:
    the paper's Algorithm 1, with decoupled weight decay (as in the authors'
    code). The authors' code folds the learning rate into the momentum, so
    that a changing rate weighs past steps by the rate they were taken with;
    here, as in the paper, the rate scales the step: with a constant rate the
    two agree.

    Args:
        learning_rate: a number >= 0 or a schedule (the authors' 4e-4). Default: ``0.0004``.
        b1: momentum decay. Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-15``.
        decay: decoupled weight decay. Default: ``0.0``.
        mu_dtype: storage dtype of the momentum. Default: ``None``.
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
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.laprop()
        scale_by_laprop(b1=0.9, b2=0.999, eps=1e-15) |> add_decayed_weights(decay=0.0) |> scale_by_learning_rate(learning_rate=0.0004)

    References:
        Ziyin, Wang & Ueda, "LaProp: Separating Momentum and Adaptivity in
        Adam", 2020. https://arxiv.org/abs/2002.04839
    """
    pipeline = (scale_by_laprop(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype, nu_dtype=nu_dtype)
                .add_decayed_weights(decay=decay, mask=mask, cautious=cautious_decay)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)


@optimizer
def acprop(learning_rate: ScalarOrSchedule = 1e-3, b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.999,
           eps: ScalarOrSchedule = 1e-16, eps_root: ScalarOrSchedule = 1e-16, decay: ScalarOrSchedule = 0.0, *,
           mu_dtype: DType = None, nu_dtype: DType = None, mask: PyTree | Callable[[PyTree], PyTree] | None = None,
           cautious_decay: bool = False, maximize: bool = False) -> Update:
    """ACProp: each gradient divided by AdaBelief's centred second moment as it was before that gradient.

    Pipeline: ``scale_by_acprop(b1, b2, eps, eps_root) |> add_decayed_weights(decay)
    |> scale_by_learning_rate(lr)``, as ``optax.contrib.acprop`` (whose
    ``weight_decay`` is ``decay`` here). optax 0.2.8 centres on the previous
    momentum where its documentation and the paper take the new one (see
    :func:`updax.scale_by_acprop`); updax follows the documentation.

    Args:
        learning_rate: a number >= 0 or a schedule (the authors' 1e-3). Default: ``0.001``.
        b1: momentum decay (it centres the second moment). Default: ``0.9``.
        b2: second-moment decay. Default: ``0.999``.
        eps: added to the denominator. Default: ``1e-16``.
        eps_root: added to the second moment each step. Default: ``1e-16``.
        decay: decoupled weight decay. Default: ``0.0``.
        mu_dtype: storage dtype of the momentum. Default: ``None``.
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
        An update object.

    Example:
        >>> import updax as ux
        >>> ux.optimizers.acprop()
        scale_by_acprop(b1=0.9, b2=0.999, eps=1e-16, eps_root=1e-16) |> add_decayed_weights(decay=0.0) |> scale_by_learning_rate(learning_rate=0.001)

    References:
        Zhuang et al., "Momentum Centering and Asynchronous Update for
        Adaptive Gradient Methods", NeurIPS 2021.
        https://arxiv.org/abs/2110.05454
    """
    pipeline = (scale_by_acprop(b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype, nu_dtype=nu_dtype)
                .add_decayed_weights(decay=decay, mask=mask, cautious=cautious_decay)
                .scale_by_learning_rate(learning_rate))
    return maximized(maximize, pipeline)
