"""MARS: a variance-reduced gradient, for the preconditioned step after it.

MARS (Yuan et al. 2024) is a framework: a scaled stochastic recursive
momentum correction of the gradient, clipped, then any preconditioned step on
it (AdamW's, Lion's, an orthogonalised one). The correction is a stage of its
own here, so that it composes with :func:`updax.scale_by_adam`,
:func:`updax.scale_by_lion` or any other stage, as the paper's framework does;
``updax.optimizers.mars_adamw`` and ``mars_lion`` are its two instances.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import NON_NEGATIVE, POSITIVE, UNIT, Count
from updax._leafwise import per_leaf
from updax._primitives import stateful
from updax._typing import ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import abs_sq, safe_sqrt


class ScaleByMarsState(NamedTuple):
    """The previous call's updates ``prev_grads``, steps taken ``count``."""

    prev_grads: Any
    count: Count


def _init_scale_by_mars(params):
    return ScaleByMarsState(prev_grads=_tree.accumulators(params, None), count=_tree.zero_count())


def _clipped_to_norm(c, max_norm):
    """``c`` rescaled to L2 norm ``max_norm`` where its norm is larger (the paper's Clip(c, 1)), else ``c``.

    The norm is ``max|c|`` times the norm of ``c / max|c|``, and the clipped ``c`` is ``c / max|c|`` scaled, so
    that a ``c`` whose squares (above about 1e19 in float32) or whose norm overflow is still clipped along its
    direction, not to zeros.
    """
    peak = jnp.max(jnp.abs(c), initial=0.0)
    unit = jnp.where(peak > 0, peak, 1.0)
    rest = safe_sqrt(jnp.sum(abs_sq(c / unit)))  # >= 1 unless c is 0
    over = peak * rest > max_norm
    # Double where: the discarded branch divides by 1, not by a norm that may be 0, so its gradient stays finite.
    return jnp.where(over, c / unit * (max_norm / jnp.where(over, rest, 1.0)), c)


def _apply_scale_by_mars(updates, state, params, *, gamma, b1, max_norm):
    first = state.count == 0
    weight = gamma * b1 / (1 - b1)

    def rule(g, g_prev):
        g_prev = jnp.where(first, g, g_prev)  # x_1 = x_0 in the paper: no correction on the first step
        c = g + weight * (g - g_prev)
        return _clipped_to_norm(c, max_norm), g

    c, prev = per_leaf("scale_by_mars", rule, (updates, state.prev_grads), ("updates", "state.prev_grads"))
    return c, ScaleByMarsState(prev_grads=prev, count=_tree.safe_increment(state.count))


@combinator
def scale_by_mars(gamma: ScalarOrSchedule = 0.025, b1: ScalarOrSchedule = 0.95,
                  max_norm: ScalarOrSchedule = 1.0) -> Update:
    r"""Replaces each update by MARS's variance-reduced gradient, clipped per leaf.

    Update rule, for an update $g$ and the previous call's $g_\text{prev}$ ($g_\text{prev} = g$ on the first
    call, as the paper's $x_1 = x_0$ makes it), with $\gamma$ = ``gamma``, $b_1$ = ``b1``, $c_\text{max}$ =
    ``max_norm`` and $\lVert c \rVert$ the L2 norm of the leaf:

    $$
    \begin{align*}
    c &= g + \gamma\, \frac{b_1}{1 - b_1}\, (g - g_\text{prev}) \\
    u &= \begin{cases}
    c_\text{max}\, c / \lVert c \rVert & \text{if } \lVert c \rVert > c_\text{max} \\
    c & \text{otherwise}
    \end{cases} \\
    g_\text{prev} &\gets g
    \end{align*}
    $$

    This is the paper's MARS-approx (one gradient per step: $g_\text{prev}$
    is the previous step's gradient, at the previous params and batch), the
    form the authors train with. Follow it with the momentum it was derived
    for, whose decay is the same $b_1$: ``scale_by_adam(b1=b1)`` gives
    MARS-AdamW, ``scale_by_lion(b1=b1, b2=b1)`` MARS-Lion (see
    ``updax.optimizers.mars_adamw`` and ``mars_lion``). With $\gamma = 0$ and
    leaves whose norm stays within $c_\text{max}$ it passes the updates
    through unchanged. The norm is per leaf, as in the authors' code (the
    paper writes it over all params as one vector). The authors' code starts
    from $g_\text{prev} = 0$, so its first $c$ is $(1 + \gamma b_1 / (1 - b_1))\, g$;
    here the correction is 0 on the first call, as in the paper's
    Algorithm 1. The output is finite for any finite $c$: the clip is
    computed from $c / \max |c|$, so that a $c$ whose norm overflows
    float32 is still clipped to norm $c_\text{max}$ along its direction
    rather than to zeros, and a zero $c$ passes as zeros.

    Args:
        gamma: the scale $\gamma$ of the gradient correction, >= 0 (the
            paper's value for GPT-2; 0 turns the correction off). Default: ``0.025``.
        b1: the decay of the momentum after it, in [0, 1); the correction
            is weighted by $b_1 / (1 - b_1)$ (the paper's value). Default: ``0.95``.
        max_norm: the largest L2 norm of a leaf of $c$, > 0 (the paper's
            Clip(c, 1)). Default: ``1.0``.

    Returns:
        An update object with state ``ScaleByMarsState(prev_grads, count)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_mars(gamma=0.5, b1=0.5)
        >>> opt
        scale_by_mars(gamma=0.5, b1=0.5, max_norm=1.0)
        >>> state = opt.init({"w": jnp.zeros(2)})
        >>> u, state = opt.update({"w": jnp.array([0.3, 0.4])}, state)
        >>> u["w"]  # the first call: no correction, norm 0.5
        Array([0.3, 0.4], dtype=float32)
        >>> u, state = opt.update({"w": jnp.array([0.5, 0.0])}, state)
        >>> u["w"]  # c = g + 0.5·(g - g_prev) = (0.6, -0.2), within the norm
        Array([ 0.6, -0.2], dtype=float32)
        >>> u, state = opt.update({"w": jnp.array([3.0, 4.0])}, state)
        >>> u["w"]  # c = (4.25, 6), of norm 7.35: clipped to norm 1
        Array([0.5780, 0.8161], dtype=float32)

    References:
        Yuan et al., "MARS: Unleashing the Power of Variance Reduction for
        Training Large Models", ICML 2025, Algorithm 1.
        https://arxiv.org/abs/2411.10438
    """
    # The update reads the previous gradient: prev_grads is written after the params' update (``state_last``).
    return stateful(_init_scale_by_mars, _apply_scale_by_mars, name="scale_by_mars",
                    options=dict(gamma=gamma, b1=b1, max_norm=max_norm),
                    domains=dict(gamma=NON_NEGATIVE, b1=UNIT, max_norm=POSITIVE),
                    schedulable=("gamma", "b1", "max_norm"), state_last=("prev_grads",))
