"""Muon and NorMuon: orthogonalised momentum for the matrices (or batches of them), (N)AdamW for the other
leaves."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from updax._options import format_value
from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.optimizers._common import maximized, optimizer
from updax.updates import (
    partition,
    scale_by_adam,
    scale_by_muon,
    scale_by_nadam,
    scale_by_normuon,
)
from updax.updates._muon_dims import dimension_numbers, is_spec, leaf_axes


def _muon_groups(params):
    return jax.tree.map(lambda p: "muon" if jnp.ndim(p) == 2 else "adam", params)


def _group_of(spec):
    return "adam" if spec is None else "muon"


@dataclasses.dataclass(frozen=True)
class _MuonGroups:
    """The labels a function of the params giving dimension numbers implies: leaves with them are "muon"."""

    weight_dimension_numbers: Callable[[PyTree], PyTree]

    def __call__(self, params: PyTree) -> PyTree:
        axes = leaf_axes("muon", self.weight_dimension_numbers, params)
        return jax.tree.structure(params).unflatten([_group_of(a) for a in axes])

    def __repr__(self) -> str:
        return f"muon_groups({format_value(self.weight_dimension_numbers)})"


def _labels(weight_dimension_numbers: Any) -> Any:
    """The partition's labels: 2-D leaves by default, else the leaves that have dimension numbers (a tree of
    labels, a prefix where the dimension numbers are one, or a function of the params)."""
    if weight_dimension_numbers is None:
        return _muon_groups
    if callable(weight_dimension_numbers) and not is_spec(weight_dimension_numbers):
        return _MuonGroups(weight_dimension_numbers)
    return jax.tree.map(_group_of, weight_dimension_numbers, is_leaf=is_spec)


@optimizer
def muon(learning_rate: ScalarOrSchedule = 0.02,
         ns_coeffs: tuple[float, float, float] | tuple[tuple[float, float, float], ...] | str = (
             3.4445, -4.7750, 2.0315),
         ns_steps: int = 5, beta: ScalarOrSchedule = 0.95, eps: ScalarOrSchedule = 1e-8,
         decay: ScalarOrSchedule = 0.0, *,
         nesterov: bool = True, mu_dtype: DType = None, adam_b1: ScalarOrSchedule = 0.9,
         adam_b2: ScalarOrSchedule = 0.999, adam_eps_root: ScalarOrSchedule = 0.0, adam_decay: ScalarOrSchedule = 0.0,
         adam_learning_rate: ScalarOrSchedule | None = None, mask: PyTree | Callable[[PyTree],
         PyTree] | None = None, adaptive: bool = False, preconditioning: str = "frobenius",
         consistent_rms: ScalarOrSchedule | None = None,
         weight_dimension_numbers: PyTree | Callable[[PyTree], PyTree] | None = None,
         cautious_decay: bool = False, maximize: bool = False) -> Update:
    r"""Muon: Newton-Schulz-orthogonalised momentum for matrices, (N)AdamW for every other leaf.

    Pipeline: ``partition({"muon": scale_by_muon(...) |> scale_by_shape(...) |> add_decayed_weights(decay)
    |> scale_by_learning_rate(lr), "adam": scale_by_nadam(...) |> add_decayed_weights(adam_decay)
    |> scale_by_learning_rate(adam_lr)}, labels)`` with 2-D leaves labelled
    ``"muon"`` (input dimension first) and the rest ``"adam"`` (plain Adam
    when ``nesterov=False``). With ``weight_dimension_numbers`` the leaves
    that have dimension numbers are ``"muon"`` (batches of matrices, e.g.
    stacked layers) and those with None are ``"adam"``; ``scale_by_muon``
    and ``scale_by_shape`` take the same dimension numbers. The options are
    optax.contrib.muon's (``weight_decay`` is ``decay``,
    ``muon_weight_dimension_numbers`` is ``weight_dimension_numbers``),
    except that ``mask`` reaches both groups' decays where optax's
    ``weight_decay_mask`` reaches the matrices' only.

    Args:
        learning_rate: a number >= 0 or a schedule (Keller Jordan's 0.02). Default: ``0.02``.
        ns_coeffs: the quintic Newton-Schulz coefficients: a triple for
            every iteration, a tuple of triples (one per iteration;
            ``ns_steps`` is then ignored), or ``"standard"`` or ``"dion"``
            (see :func:`updax.scale_by_newton_schulz`).
            Default: ``(3.4445, -4.775, 2.0315)``.
        ns_steps: Newton-Schulz iterations of one triple, an integer in [1, 100]. Default: ``5``.
        beta: momentum decay. Default: ``0.95``.
        eps: Newton-Schulz normalisation and Adam's denominator term. Default: ``1e-08``.
        decay: decoupled weight decay of the matrices. Default: ``0.0``.
        nesterov: Nesterov momentum in both groups. Default: ``True``.
        mu_dtype: storage dtype of the momenta. Default: ``None``.
        adam_b1: Adam's first-moment decay. Default: ``0.9``.
        adam_b2: Adam's second-moment decay. Default: ``0.999``.
        adam_eps_root: Adam's term inside the square root. Default: ``0.0``.
        adam_decay: decoupled weight decay of the other leaves. Default: ``0.0``.
        adam_learning_rate: the other leaves' learning rate; None uses
            ``learning_rate``. Default: ``None``.
        mask: which leaves decay, in both groups (``decay`` for the matrices,
            ``adam_decay`` for the others): a pytree of bools shaped like the
            params (or a prefix of it), or a function of the params returning
            one; None decays every leaf. Default: ``None``.
        adaptive: scale each orthogonalised matrix by ``⟨m̂, u⟩``, about the
            nuclear norm of the momentum (see :func:`updax.scale_by_muon`).
            Default: ``False``.
        preconditioning: how each matrix is scaled before or in the first
            Newton-Schulz iteration: ``"frobenius"``, ``"spectral"``,
            ``"aol"`` or ``"schatten"`` (see
            :func:`updax.scale_by_newton_schulz`). Default: ``"frobenius"``.
        consistent_rms: None for Muon's width factor
            $\sqrt{\max(1, n / m)}$, or the RMS $\rho$ each matrix's update is
            scaled to, by $\rho \sqrt{\max(m, n)}$ (Moonlight's; 0.2 matches
            AdamW's), >= 0 or a schedule (see :func:`updax.scale_by_shape`).
            Default: ``None``.
        weight_dimension_numbers: which leaves get Muon and which of their
            axes form the matrix: a pytree of :class:`MuonDimensionNumbers`
            (Muon) or None (Adam) shaped like the params or a prefix of them,
            or a function of the params returning one; None gives Muon to the
            leaves with two axes. Default: ``None``.
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
        >>> sorted(ux.optimizers.muon().stages[0].option("transforms"))
        ['adam', 'muon']
        >>> stacked = {"layers": ux.MuonDimensionNumbers(1, 2), "bias": None}  # layers of shape (depth, in, out)
        >>> ux.optimizers.muon(weight_dimension_numbers=stacked).stages[0].option("labels")
        {'bias': 'adam', 'layers': 'muon'}
        >>> opt = ux.optimizers.muon(preconditioning="aol", consistent_rms=0.2)
        >>> matrices = opt.stages[0].option("transforms")["muon"]
        >>> matrices.stages[0].option("preconditioning"), matrices.stages[1]
        ('aol', scale_by_shape(consistent_rms=0.2))

    References:
        Jordan et al., "Muon: An optimizer for hidden layers in neural
        networks", 2024. https://kellerjordan.github.io/posts/muon/;
        Bernstein & Newhouse, "Old Optimizer, New Norm: An Anthology", 2024.
        https://arxiv.org/abs/2409.20325; Liu et al., "Muon is Scalable for
        LLM Training", 2025. https://arxiv.org/abs/2502.16982
    """
    dims = dimension_numbers("muon", weight_dimension_numbers)
    matrices = (scale_by_muon(ns_coeffs=ns_coeffs, ns_steps=ns_steps, beta=beta, eps=eps, nesterov=nesterov,
                              mu_dtype=mu_dtype, adaptive=adaptive, preconditioning=preconditioning,
                              weight_dimension_numbers=dims)
                .scale_by_shape(weight_dimension_numbers=dims, consistent_rms=consistent_rms))
    return _with_adam(matrices, dims, learning_rate=learning_rate, eps=eps, decay=decay, nesterov=nesterov,
                      mu_dtype=mu_dtype, adam_b1=adam_b1, adam_b2=adam_b2, adam_eps_root=adam_eps_root,
                      adam_decay=adam_decay, adam_learning_rate=adam_learning_rate, mask=mask,
                      cautious_decay=cautious_decay, maximize=maximize)


def _with_adam(matrices: Update, dims: Any, *, learning_rate: Any, eps: Any, decay: Any, nesterov: bool,
               mu_dtype: Any, adam_b1: Any, adam_b2: Any, adam_eps_root: Any, adam_decay: Any,
               adam_learning_rate: Any, mask: Any, cautious_decay: bool, maximize: bool) -> Update:
    """``matrices`` (decayed, at ``learning_rate``) for the leaves the dimension numbers make matrices, and
    (N)AdamW for the others: Muon's and NorMuon's partition."""
    adam_learning_rate = learning_rate if adam_learning_rate is None else adam_learning_rate
    matrices = (matrices.add_decayed_weights(decay=decay, mask=mask, cautious=cautious_decay)
                .scale_by_learning_rate(learning_rate))
    adam_like = scale_by_nadam if nesterov else scale_by_adam
    others = (adam_like(b1=adam_b1, b2=adam_b2, eps=eps, eps_root=adam_eps_root, mu_dtype=mu_dtype)
              .add_decayed_weights(decay=adam_decay, mask=mask, cautious=cautious_decay)
              .scale_by_learning_rate(adam_learning_rate))
    return maximized(maximize, partition({"muon": matrices, "adam": others}, _labels(dims)))


@optimizer
def normuon(learning_rate: ScalarOrSchedule = 1e-3,
            ns_coeffs: tuple[float, float, float] | tuple[tuple[float, float, float], ...] | str = (
                3.4445, -4.7750, 2.0315),
            ns_steps: int = 5, beta: ScalarOrSchedule = 0.95, beta2: ScalarOrSchedule = 0.95,
            eps: ScalarOrSchedule = 1e-8, decay: ScalarOrSchedule = 0.0, *, rms: ScalarOrSchedule = 0.2,
            nesterov: bool = True, mu_dtype: DType = None, adam_b1: ScalarOrSchedule = 0.9,
            adam_b2: ScalarOrSchedule = 0.999, adam_eps_root: ScalarOrSchedule = 0.0,
            adam_decay: ScalarOrSchedule = 0.0, adam_learning_rate: ScalarOrSchedule | None = None,
            mask: PyTree | Callable[[PyTree], PyTree] | None = None, preconditioning: str = "frobenius",
            weight_dimension_numbers: PyTree | Callable[[PyTree], PyTree] | None = None,
            cautious_decay: bool = False, maximize: bool = False) -> Update:
    r"""NorMuon: Muon with each output unit normalised by its second moment, (N)AdamW for other leaves.

    Pipeline: ``partition({"muon": scale_by_normuon(...) |> add_decayed_weights(decay)
    |> scale_by_learning_rate(lr), "adam": scale_by_nadam(...) |> add_decayed_weights(adam_decay)
    |> scale_by_learning_rate(adam_lr)}, labels)``, the groups and labels of
    :func:`muon` (2-D leaves, input dimension first, or the leaves
    ``weight_dimension_numbers`` gives numbers; plain Adam when
    ``nesterov=False``). Each matrix's update has RMS ``rms`` times the
    learning rate, 0.2 as AdamW's, so AdamW's learning rate and weight decay
    carry over, and one learning rate serves both groups.

    Args:
        learning_rate: a number >= 0 or a schedule (AdamW's 1e-3: the
            matrices' updates have AdamW's RMS). Default: ``0.001``.
        ns_coeffs: the quintic Newton-Schulz coefficients: a triple for
            every iteration, a tuple of triples (one per iteration;
            ``ns_steps`` is then ignored), or ``"standard"`` or ``"dion"``
            (see :func:`updax.scale_by_newton_schulz`).
            Default: ``(3.4445, -4.775, 2.0315)``.
        ns_steps: Newton-Schulz iterations of one triple, an integer in [1, 100]. Default: ``5``.
        beta: momentum decay. Default: ``0.95``.
        beta2: decay of the output units' second moments. Default: ``0.95``.
        eps: Newton-Schulz normalisation, the units' normalisation and Adam's denominator term. Default: ``1e-08``.
        decay: decoupled weight decay of the matrices. Default: ``0.0``.
        rms: the RMS of each matrix's update before the learning rate. Default: ``0.2``.
        nesterov: Nesterov momentum in both groups. Default: ``True``.
        mu_dtype: storage dtype of the momenta. Default: ``None``.
        adam_b1: Adam's first-moment decay. Default: ``0.9``.
        adam_b2: Adam's second-moment decay. Default: ``0.999``.
        adam_eps_root: Adam's term inside the square root. Default: ``0.0``.
        adam_decay: decoupled weight decay of the other leaves. Default: ``0.0``.
        adam_learning_rate: the other leaves' learning rate; None uses
            ``learning_rate``. Default: ``None``.
        mask: which leaves decay, in both groups, as in :func:`muon`.
            Default: ``None``.
        preconditioning: how each matrix is scaled before or in the first
            Newton-Schulz iteration: ``"frobenius"``, ``"spectral"``,
            ``"aol"`` or ``"schatten"`` (see
            :func:`updax.scale_by_newton_schulz`). Default: ``"frobenius"``.
        weight_dimension_numbers: which leaves get NorMuon and which of their
            axes form the matrix (its output axes are the units normalised),
            as in :func:`muon`. Default: ``None``.
        cautious_decay: decay a coordinate only where the update and the
            param agree in sign (``add_decayed_weights(cautious=True)``);
            prints only when True. Default: ``False``.
        maximize: ascend instead of descending: ``scale(-1.0)`` in front of
            the pipeline. Default: ``False``.

    Returns:
        An update object; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.optimizers.normuon(0.01)
        >>> params = {"w": jnp.ones((4, 8)), "b": jnp.zeros(8)}
        >>> u, _ = opt.update({"w": jnp.eye(4, 8), "b": jnp.ones(8)}, opt.init(params), params)
        >>> float(jnp.sqrt(jnp.mean(u["w"] ** 2)))  # rms · learning rate
        0.002

    References:
        Li et al., "NorMuon: Making Muon more efficient and scalable",
        2025. https://arxiv.org/abs/2510.05491
    """
    dims = dimension_numbers("normuon", weight_dimension_numbers)
    matrices = scale_by_normuon(ns_coeffs=ns_coeffs, ns_steps=ns_steps, beta=beta, beta2=beta2, eps=eps, rms=rms,
                                nesterov=nesterov, mu_dtype=mu_dtype, preconditioning=preconditioning,
                                weight_dimension_numbers=dims)
    return _with_adam(matrices, dims, learning_rate=learning_rate, eps=eps, decay=decay, nesterov=nesterov,
                      mu_dtype=mu_dtype, adam_b1=adam_b1, adam_b2=adam_b2, adam_eps_root=adam_eps_root,
                      adam_decay=adam_decay, adam_learning_rate=adam_learning_rate, mask=mask,
                      cautious_decay=cautious_decay, maximize=maximize)
