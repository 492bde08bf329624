"""Dual averaging: MADGRAD's momentumised, adaptive step from the weighted sums of the gradients.

The iterate is rebuilt each step from the starting point and the sums of all the
gradients seen so far (``x0 - s / v^(1/3)``), and the params move a fraction of
the way towards it: the stage keeps a copy of the params it was initialised
with, so ``init`` must get the real params, not a template.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import LEARNING_RATE, NON_NEGATIVE, UNIT, Count, NonNegativeField
from updax._leafwise import per_leaf
from updax._primitives import stateful
from updax._typing import ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import filled, real_only


@jax.custom_jvp
def _cbrt(x):
    """``cbrt(x)`` for ``x >= 0`` whose derivative at ``x = 0`` is taken as 0 instead of infinite: ``v`` is a sum of
    squares, whose tangent is 0 where it is 0 (as :func:`updax.updates._kernels.safe_sqrt`)."""
    return jnp.cbrt(x)


@_cbrt.defjvp
def _cbrt_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    root = jnp.cbrt(x)
    nonzero = root != 0
    return root, dx * jnp.where(nonzero, 1 / (3 * jnp.where(nonzero, root, 1.0) ** 2), 0.0)


class ScaleByMadgradState(NamedTuple):
    """The weighted sum of the updates ``grad_sum`` ($s$), of their squares ``grad_sum_sq`` ($v$), the params
    ``init`` got ``init_params`` ($x_0$), steps taken ``count``."""

    grad_sum: Any
    grad_sum_sq: NonNegativeField
    init_params: Any
    count: Count


def _init_scale_by_madgrad(params):
    return ScaleByMadgradState(grad_sum=_tree.accumulators(params, None), grad_sum_sq=_tree.accumulators(params, None),
                               init_params=filled("scale_by_madgrad", params, params, None), count=_tree.zero_count())


def _apply_scale_by_madgrad(updates, state, params, *, learning_rate, momentum, eps):
    call = "scale_by_madgrad"
    real_only(call, updates)
    weight = (learning_rate + eps) * jnp.sqrt(_tree.float_count(state.count) + 1)  # λ_k, k from 0
    c = 1 - momentum

    def rule(g, s, v, x0, x):
        s = s + weight * g
        v = v + weight * g * g
        root = _cbrt(v) + eps
        z = x0 - s / jnp.where(root == 0, 1.0, root)  # (v = 0 only where every λg was 0: s is 0 there too)
        return c * (x - z), s, v  # x - x_new: the step along the gradient

    u, grad_sum, grad_sum_sq = per_leaf(call, rule, (updates, state.grad_sum, state.grad_sum_sq, state.init_params,
                                                     params),
                                        ("updates", "state.grad_sum", "state.grad_sum_sq", "state.init_params",
                                         "params"), n_out=3)
    return u, ScaleByMadgradState(grad_sum=grad_sum, grad_sum_sq=grad_sum_sq, init_params=state.init_params,
                                  count=_tree.safe_increment(state.count))


@combinator
def scale_by_madgrad(learning_rate: ScalarOrSchedule = 1e-2, momentum: ScalarOrSchedule = 0.9,
                     eps: ScalarOrSchedule = 1e-6) -> Update:
    r"""Scales updates by MADGRAD: momentumised dual averaging with a cube-root adaptive denominator.

    Update rule, for step $k = 0, 1, \ldots$, with $x$ the params, $x_0$ the params ``init`` got,
    $\gamma$ = ``learning_rate``, $\beta$ = ``momentum`` and $\epsilon$ = ``eps``:

    $$
    \begin{align*}
    \lambda_k &= (\gamma + \epsilon) \sqrt{k + 1} \\
    s &\gets s + \lambda_k g \\
    v &\gets v + \lambda_k g^2 \\
    z &= x_0 - s / (v^{1/3} + \epsilon) \\
    u &= (1 - \beta)\, (x - z)
    \end{align*}
    $$

    The emitted $u$ is the step along the gradient, so the descent step is $-u$, which moves the params to
    $\beta x + (1 - \beta) z$ (:func:`updax.optimizers.madgrad` ends in ``scale(-1.0)``). $\lambda$ uses
    $\gamma + \epsilon$, as the authors' implementation (and optax) do; ``momentum=0`` steps straight to $z$.
    Where $v = 0$ (no gradient yet, so $s = 0$ too) $z = x_0$, where optax divides 0 by 0 when $\epsilon = 0$.

    Args:
        learning_rate: the step size $\gamma$, >= 0, a number or a schedule.
            Default: ``0.01``.
        momentum: the momentum $\beta$, in [0, 1). Default: ``0.9``.
        eps: added to the denominator and to $\gamma$, >= 0. Default: ``1e-06``.

    Returns:
        An update object with state ``ScaleByMadgradState(grad_sum,
        grad_sum_sq, init_params, count)``; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_madgrad(learning_rate=1.0, momentum=0.0, eps=0.0)
        >>> params = {"w": jnp.array([1.0, 1.0])}
        >>> u, state = opt.update({"w": jnp.array([8.0, -1.0])}, opt.init(params), params)
        >>> u["w"]  # s / v^(1/3) = g / |g|^(2/3) on the first step
        Array([ 2., -1.], dtype=float32)

    References:
        Defazio & Jelassi, "Adaptivity without Compromise: A Momentumized,
        Adaptive, Dual Averaged Gradient Method for Stochastic Optimization",
        JMLR 2022, Algorithm 1. https://arxiv.org/abs/2101.11075
    """
    options = dict(learning_rate=learning_rate, momentum=momentum, eps=eps)
    return stateful(_init_scale_by_madgrad, _apply_scale_by_madgrad, name="scale_by_madgrad", options=options,
                    domains=dict(learning_rate=LEARNING_RATE, momentum=UNIT, eps=NON_NEGATIVE), needs_params=True,
                    elementwise=True, schedulable=("learning_rate", "momentum", "eps"))
