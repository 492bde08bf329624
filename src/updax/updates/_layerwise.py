"""The layer-wise family: each leaf (a layer) scaled by a statistic of the whole leaf.

The trust ratio of LARS and LAMB, and NovoGrad's layer-wise second moment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import ANY_REAL, NON_NEGATIVE, UNIT, Count, FloatDtype, MomentField, NonNegativeField
from updax._masks import Mask, leaf_mask
from updax._primitives import stateful, stateless
from updax._typing import DType, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.updates._masking import leafwise
from updax._leafwise import per_leaf
from updax.updates._kernels import abs_sq, safe_sqrt, trust_ratios, trust_scaled


class ScaleByNovogradState(NamedTuple):
    """Momentum of the normalized updates ``mu``, one scalar second moment per leaf ``nu``, steps taken ``count``."""

    mu: MomentField
    nu: NonNegativeField
    count: Count


#: What the options of the layer-wise stages hold.
_LAYERWISE_DOMAINS = dict(min_norm=NON_NEGATIVE, trust_coefficient=ANY_REAL, b1=UNIT, b2=UNIT, eps=NON_NEGATIVE,
                          eps_root=NON_NEGATIVE, decay=ANY_REAL, mu_dtype=FloatDtype(), mask=Mask())


def _domains(options):
    return {k: _LAYERWISE_DOMAINS[k] for k in options}


# --------------------------------------------------------------------------
# The trust ratio


def _apply_scale_by_trust_ratio(updates, params, *, min_norm, trust_coefficient, eps, mask=None):
    ratios = trust_ratios(updates, params, min_norm, trust_coefficient, eps)
    return leafwise("scale_by_trust_ratio", trust_scaled, mask, updates, params, other=ratios)


@combinator
def scale_by_trust_ratio(min_norm: ScalarOrSchedule = 0.0, trust_coefficient: ScalarOrSchedule = 1.0,
                         eps: ScalarOrSchedule = 0.0, mask: PyTree | Callable[[PyTree], PyTree] | None = None
                         ) -> Update:
    r"""Scales each leaf's update by the ratio of the param norm to the update norm (LARS/LAMB).

    Update rule, per leaf, with $c$ = ``trust_coefficient``, $\epsilon$ = ``eps``:
    $u \gets u \cdot c \lVert p \rVert / (\lVert u \rVert + \epsilon)$ with both norms
    floored at ``min_norm``; the ratio is 1 when either norm is 0. Leaves
    ``mask`` leaves out pass through unscaled.

    Args:
        min_norm: floor of both norms, >= 0. Default: ``0.0``.
        trust_coefficient: the factor $c$. Default: ``1.0``.
        eps: added to the update norm, >= 0. Default: ``0.0``.
        mask: which leaves are scaled: a pytree of bools shaped like the
            params, or a function of the params returning one; None scales
            every leaf. Default: ``None``.

    Returns:
        A stateless update object; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_trust_ratio()
        >>> params = {"w": jnp.array([3.0, 4.0])}
        >>> opt.update({"w": jnp.array([0.1, 0.0])}, opt.init(params), params)[0]["w"]  # ·5/0.1
        Array([5., 0.], dtype=float32)

    References:
        You et al., "Large Batch Optimization for Deep Learning: Training BERT
        in 76 minutes", ICLR 2020. https://arxiv.org/abs/1904.00962
    """
    options = dict(min_norm=min_norm, trust_coefficient=trust_coefficient, eps=eps, mask=mask)
    return stateless(_apply_scale_by_trust_ratio, name="scale_by_trust_ratio", options=options,
                     domains=_domains(options), needs_params=True, schedulable=("min_norm", "trust_coefficient", "eps"))


# --------------------------------------------------------------------------
# NovoGrad


def _init_scale_by_novograd(params, *, mu_dtype):
    nu = jax.tree.map(lambda p: _tree.full((), 0.0, _tree.compute_dtype(jnp.asarray(p).dtype), p, dims=()), params)
    return ScaleByNovogradState(mu=_tree.accumulators(params, mu_dtype), nu=nu, count=_tree.zero_count())


def _apply_scale_by_novograd(updates, state, params, *, b1, b2, eps, eps_root, decay, mask):
    call = "scale_by_novograd"
    count = _tree.safe_increment(state.count)
    # The first step sets both moments from the step itself rather than decaying zeros.
    first = count == 1
    b1_t, b2_t = jnp.where(first, 0.0, b1), jnp.where(first, 0.0, b2)

    def leaf(g, m, v, p=None, rate=decay):
        d1, d2 = b1_t.astype(g.dtype), b2_t.astype(g.dtype)
        v = d2 * v + (1 - d2) * jnp.sum(abs_sq(g))
        step = g / (safe_sqrt(v + eps_root) + eps)
        if p is not None:
            step = step + rate * p
        m = d1 * m + step
        return m, m, v

    trees, names = (updates, state.mu, state.nu), ("updates", "state.mu", "state.nu")
    if params is not None:
        trees, names = trees + (params,), names + ("params",)
        if mask is not None:  # each leaf's own rate: decay where the mask selects it, else 0
            rates = [jnp.where(selected, decay, 0.0).astype(_tree.compute_dtype(jnp.asarray(p).dtype))
                     for selected, p in zip(leaf_mask(call, mask, params), jax.tree.leaves(params))]
            trees, names = trees + (jax.tree.structure(params).unflatten(rates),), names + ("decay",)
    u, mu, nu = per_leaf(call, leaf, trees, names, n_out=3)
    return u, ScaleByNovogradState(mu=mu, nu=nu, count=count)


def _is_zero(value) -> bool:
    """True for a concrete 0 (already checked to be a real scalar); schedules and tracers may not be 0."""
    return not (callable(value) or isinstance(value, jax.core.Tracer)) and float(value) == 0.0


@combinator
def scale_by_novograd(b1: ScalarOrSchedule = 0.9, b2: ScalarOrSchedule = 0.25, eps: ScalarOrSchedule = 1e-8,
                      eps_root: ScalarOrSchedule = 0.0, decay: ScalarOrSchedule = 0.0, *,
                      mu_dtype: DType = None, mask: PyTree | Callable[[PyTree], PyTree] | None = None) -> Update:
    r"""Scales updates by NovoGrad: momentum of updates normalized by a layer-wise second moment.

    Update rule, per leaf (layer) $l$, with $b_1$ = ``b1``, $b_2$ = ``b2``, $\epsilon$ = ``eps``,
    $\epsilon_\text{root}$ = ``eps_root``, $d$ = ``decay``; on the first step $v$ and $m$
    start from the step itself ($b_1$, $b_2$ act as 0):

    $$
    \begin{align*}
    v_l &\gets b_2 v_l + (1 - b_2) \lVert g_l \rVert^2 \\
    m_l &\gets b_1 m_l + \frac{g_l}{\sqrt{v_l + \epsilon_\text{root}} + \epsilon} + d\, p_l \\
    u_l &= m_l
    \end{align*}
    $$

    ($v_l$ is a scalar per leaf; $d\, p_l$ on the leaves ``mask`` selects.)

    Args:
        b1: decay of the momentum, in [0, 1) (optax's default; the paper tunes
            it per task). Default: ``0.9``.
        b2: decay of the layer-wise second moment, in [0, 1) (optax's
            default). Default: ``0.25``.
        eps: added to the denominator, >= 0 (``optax.scale_by_novograd``'s
            default; ``optax.novograd`` passes 1e-6). Default: ``1e-8``.
        eps_root: added inside the square root, >= 0. Default: ``0.0``.
        decay: the decoupled weight-decay rate $d$, any real number;
            when it is not 0, ``update`` needs ``params``. Default: ``0.0``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. ``nu`` holds one scalar per leaf, at least float32.
            Default: ``None``.
        mask: which leaves decay: a pytree of bools shaped like the params
            (or a prefix of it), or a function of the params returning one;
            None decays every leaf. Default: ``None``.

    Returns:
        An update object with state ``ScaleByNovogradState(mu, nu, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_novograd(eps=0.0)
        >>> u, state = opt.update({"w": jnp.array([3.0, 4.0])}, opt.init({"w": jnp.zeros(2)}))
        >>> u["w"], opt.get_state(state, "scale_by_novograd.nu")["w"]  # g / ‖g‖, v = ‖g‖²
        (Array([0.6, 0.8], dtype=float32), Array(25., dtype=float32))

    References:
        Ginsburg et al., "Stochastic Gradient Methods with Layer-wise Adaptive
        Moments for Training of Deep Networks", 2019, Algorithm 1.
        https://arxiv.org/abs/1905.11286
    """
    call = "scale_by_novograd"
    # (checked first: whether update needs params follows from it)
    decay = _LAYERWISE_DOMAINS["decay"].check(call, "decay", decay, schedulable=True)
    options = dict(b1=b1, b2=b2, eps=eps, eps_root=eps_root, decay=decay, mu_dtype=mu_dtype, mask=mask)
    return stateful(_init_scale_by_novograd, _apply_scale_by_novograd, name=call, options=options,
                    domains=_domains(options), needs_params=not _is_zero(decay),
                    schedulable=("b1", "b2", "eps", "eps_root", "decay"))
