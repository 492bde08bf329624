"""Sophia: the momentum divided by a running estimate of the Hessian's diagonal, clipped coordinate by coordinate.

The estimate comes from the objective ``f`` the params minimise, as a line
search's does: give it to ``update`` as ``value_fn=f`` (other keywords of
``update`` that ``f`` names, a batch say, are passed to it), or build the
stage with ``objective=f`` for a fixed objective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import (NON_NEGATIVE, POSITIVE, UNIT, Count, Flag, FloatDtype, Function, Integer, Valid,
                            is_concrete)
from updax._leafwise import per_leaf
from updax._options import keywords
from updax._primitives import stateful
from updax._typing import DType, ScalarOrSchedule
from updax._update import Update
from updax.updates._kernels import bias_corrections, real_only
from updax.updates._linesearch import _scalar_output
from updax.updates._noise_decay import _KEY, _key_data

__all__ = ["ScaleBySophiaState", "scale_by_sophia"]

#: The keywords of ``update`` that are the objective or its evaluations (a line search's), not the objective's own.
_NOT_FOR_THE_OBJECTIVE = ("value", "grad", "value_fn")


class ScaleBySophiaState(NamedTuple):
    """The momentum ``mu``; ``hessian``, the moving average of the estimates of the Hessian's diagonal; the raw
    PRNG ``key`` data of the next estimate; steps taken ``count``."""

    mu: Any
    hessian: Any
    key: jax.Array
    count: Count


def hutchinson_diagonal(fn: Callable[[Any], Any], params: Any, key: jax.Array) -> Any:
    """Hutchinson's estimate of the diagonal of ``fn``'s Hessian at ``params``: ``z ⊙ (∇²fn(params) z)``.

    ``z`` is a Rademacher vector (each entry -1 or 1 with probability 1/2),
    one draw per leaf from ``jax.random.split(key, number of leaves)``, in
    the leaf's dtype; the Hessian-vector product is forward-over-reverse
    (``jax.jvp`` of ``jax.grad``), so no Hessian is formed. Unbiased:
    ``E[z ⊙ Hz] = diag(H)``, exactly ``diag(H)`` for a diagonal ``H`` (``z² = 1``).
    """
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    z = treedef.unflatten([jax.random.rademacher(k, jnp.shape(p), jnp.result_type(p)) for k, p in zip(keys, leaves)])
    _, hz = jax.jvp(jax.grad(fn), (params,), (z,))
    return jax.tree.map(lambda a, b: a * b, z, hz)


def _objective(call, objective, extra):
    """``f(params)``: ``update``'s ``value_fn``, else the stage's ``objective``, with the keywords of ``update``
    that its signature names (all of them but a line search's own, if it takes ``**kwargs``)."""
    value_fn = extra.get("value_fn")
    if value_fn is not None and objective is not None:
        raise ValueError(f"{call}: update got value_fn= and the stage was built with objective=; give one of them")
    fn = value_fn if value_fn is not None else objective
    if fn is None:
        optax = (" (obj_fn= is optax's name; updax's is value_fn=, as for the line searches)"
                 if "obj_fn" in extra else "")
        raise ValueError(f"{call} needs the objective for its Hessian estimate: call update(updates, state, params, "
                         f"value_fn=f), or build the stage with objective=f{optax}")
    accepted = keywords(fn)
    kwargs = {k: v for k, v in extra.items()
              if k not in _NOT_FOR_THE_OBJECTIVE and (accepted is None or k in accepted)}
    which = "value_fn" if value_fn is not None else "objective"
    return lambda p: _scalar_output(call, which, fn(p, **kwargs))


def _init_scale_by_sophia(params, *, key, mu_dtype, hessian_dtype):
    return ScaleBySophiaState(mu=_tree.accumulators(params, mu_dtype),
                              hessian=_tree.accumulators(params, hessian_dtype),
                              key=_key_data(key), count=_tree.zero_count())


def _win_rate(ratios, clip_threshold, count, every):
    """``verbose``: prints the fraction of the coordinates the clip left alone (the paper's "win rate") on the
    steps ``count`` that are a multiple of ``every`` > 0; under ``jax.jit`` through a ``lax.cond``."""
    leaves = jax.tree.leaves(ratios)
    inside = sum(jnp.sum(jnp.abs(r) < (jnp.inf if clip_threshold is None else clip_threshold)) for r in leaves)
    rate = inside / sum(r.size for r in leaves)

    def say():
        jax.debug.print("scale_by_sophia: win rate {rate} at step {count} (the fraction of coordinates not clipped; "
                        "the paper keeps it in [0.1, 0.5]: raise gamma if it is lower)", rate=rate, count=count)

    due = (every > 0) & (count % jnp.maximum(every, 1) == 0)
    if is_concrete(due):
        if bool(due):
            say()
    else:
        jax.lax.cond(due, say, lambda: None)


def _apply_scale_by_sophia(updates, state, params, *, b1, b2, eps, gamma, clip_threshold, update_interval,
                           objective, verbose=None, print_win_rate_every_n_steps=None, **extra):
    call = "scale_by_sophia"
    real_only(call, updates)
    count = _tree.cyclic_increment(state.count, update_interval)
    if not jax.tree.leaves(updates):  # (nothing to estimate; params may be None)
        return updates, state._replace(count=count)
    real_only(call, params, "params")
    _tree.check_same_structure(call, updates, params, "updates", "params")
    f = _objective(call, objective, extra)
    (c1,) = bias_corrections(count, b1)

    def rule(g, m, h):
        m = b1 * m + (1 - b1) * g
        m_hat = m / c1
        # max(γh, ε) is 0 only where eps = 0 and γh <= 0: there m̂/0 is ±inf, which the clip bounds, and 0/0 is 0.
        ratio = jnp.where(m_hat == 0, jnp.zeros_like(m_hat), m_hat / jnp.maximum(gamma * h, eps))
        u = ratio if clip_threshold is None else jnp.clip(ratio, -clip_threshold, clip_threshold)
        return u, m

    # The step reads the estimate before this step's refresh: the one refreshed at step t is used from step t + 1
    # on, as optax's and the authors' training script do it.
    u, mu = per_leaf(call, rule, (updates, state.mu, state.hessian), ("updates", "state.mu", "state.hessian"),
                     n_out=2)
    if verbose and print_win_rate_every_n_steps is not None:
        # (coordinates below the threshold are the ones the clip left alone; at it, the clip decided them)
        _win_rate(u, clip_threshold, count, print_win_rate_every_n_steps)

    def refreshed(hessian, raw_key):
        key, draw = jax.random.split(jax.random.wrap_key_data(raw_key))
        estimate = hutchinson_diagonal(f, params, draw)
        (hessian,) = per_leaf(call, lambda h, e: (b2 * h + (1 - b2) * e,), (hessian, estimate),
                              ("state.hessian", "the Hessian estimate"), n_out=1)
        return hessian, jax.random.key_data(key)

    refresh = state.count % update_interval == 0  # steps 1, k + 1, 2k + 1, ... (the count before this step)
    if is_concrete(refresh):  # (eagerly: a cond of new closures would be traced and compiled again at each step)
        hessian, key = refreshed(state.hessian, state.key) if refresh else (state.hessian, state.key)
    else:
        hessian, key = jax.lax.cond(refresh, refreshed, lambda h, k: (h, k), state.hessian, state.key)
    return u, ScaleBySophiaState(mu=mu, hessian=hessian, key=key, count=count)


def _none_or_positive(call, name, value):
    return None if value is None else POSITIVE.check(call, name, value, schedulable=True)


_DOMAINS = dict(
    b1=UNIT, b2=UNIT, eps=NON_NEGATIVE, gamma=NON_NEGATIVE,
    clip_threshold=Valid(rule=_none_or_positive, text="must be None or in (0, inf)", values=POSITIVE),
    update_interval=Integer(1), key=_KEY, objective=Function(optional=True), mu_dtype=FloatDtype(),
    hessian_dtype=FloatDtype(), verbose=Flag(late=True),
    print_win_rate_every_n_steps=Integer(0, arrays=True, late=True))


@combinator
def scale_by_sophia(b1: ScalarOrSchedule = 0.965, b2: ScalarOrSchedule = 0.99, eps: ScalarOrSchedule = 1e-8,
                    gamma: ScalarOrSchedule = 0.01, clip_threshold: ScalarOrSchedule | None = 1.0,
                    update_interval: int = 10, key: int | jax.Array = 0,
                    objective: Callable[..., Any] | None = None, *, mu_dtype: DType = None,
                    hessian_dtype: DType = None, verbose: bool = False,
                    print_win_rate_every_n_steps: int = 0) -> Update:
    r"""Scales updates by Sophia's clipped ratio of the momentum to an estimate of the Hessian's diagonal.

    Rule (Sophia-H), for an update $g$ at step $t$ (counting from 1), with
    $b_1$ = ``b1``, $b_2$ = ``b2``, $\epsilon$ = ``eps``, $\gamma$ = ``gamma``,
    $\rho$ = ``clip_threshold``, $k$ = ``update_interval``, $f$ the objective
    and $w$ the params:

    $$
    \begin{align*}
    m &\gets b_1 m + (1 - b_1)\, g \\
    u &= \operatorname{clip}\left(\frac{m / (1 - b_1^t)}{\max(\gamma h, \epsilon)}, -\rho, \rho\right) \\
    h &\gets b_2 h + (1 - b_2)\, z \odot \nabla^2 f(w)\, z \quad \text{at the steps } t = 1, k + 1, 2k + 1, \dots
    \end{align*}
    $$

    with $z$ a Rademacher vector (each entry $\pm 1$ with probability 1/2)
    drawn afresh from the state's key at each refresh: Hutchinson's
    estimator, unbiased, $\mathbb{E}[z \odot \nabla^2 f(w)\, z] = \operatorname{diag}(\nabla^2 f(w))$,
    computed as a Hessian-vector product (one more gradient's cost, every
    $k$ steps). The step reads $h$ before the refresh: the estimate of step
    $t$ is used from step $t + 1$ on, as in optax's ``sophia`` and the
    authors' training script (the paper's Algorithm 3 writes it used at
    once), so the first step, with $h = 0$, is $\pm\rho$ on every coordinate
    whose momentum exceeds $\epsilon \rho$ in size. Where the curvature is
    negative or zero the denominator is $\epsilon$ and the clip bounds the step
    by $\rho$; a zero momentum gives 0 even with ``eps=0``. Unlike the
    paper's $m$, the momentum is bias-corrected, as in optax.

    ``update`` takes the objective as ``value_fn=f`` (optax's ``obj_fn``),
    or the stage is built with ``objective=f``; ``f(params)`` must return a
    real scalar, and gets the other keywords of ``update`` that it names.
    It gets the params the stage gets: inside :func:`partition` or
    :func:`masked`, those of the stage's group, the others' leaves None.

    Args:
        b1: decay of the momentum, in [0, 1). Default: ``0.965``.
        b2: decay of the Hessian estimate's moving average, in [0, 1); it
            moves once per refresh, so its horizon is $k / (1 - b_2)$ steps.
            Default: ``0.99``.
        eps: the smallest denominator, >= 0. Default: ``1e-08``.
        gamma: the factor $\gamma$ of the Hessian estimate, >= 0 (the
            paper's, 0.01 for Sophia-H). Default: ``0.01``.
        clip_threshold: the bound $\rho$ of each output coordinate, > 0, or
            None for no clip (then a positive ``eps`` keeps the output
            finite). Default: ``1.0``.
        update_interval: the steps $k$ between refreshes of the Hessian
            estimate, a positive integer. Default: ``10``.
        key: an int seed in [0, 2**32), a JAX PRNG key or its raw key data,
            for the Rademacher vectors; the same key draws the same vectors
            as optax's ``hutchinson_estimator_diag_hessian(random_seed)``.
            Default: ``0``.
        objective: the objective ``f(params)``, for ``update`` calls without
            ``value_fn``; None to take it from ``update``. Default: ``None``.
        mu_dtype: storage dtype of ``mu``; None keeps the params' dtype but at
            least float32. Default: ``None``.
        hessian_dtype: storage dtype of ``hessian``, as ``mu_dtype``.
            Default: ``None``.
        verbose: print the win rate every
            ``print_win_rate_every_n_steps`` steps, with ``jax.debug.print``
            (optax's option); prints only when True. Default: ``False``.
        print_win_rate_every_n_steps: with ``verbose``, the steps between
            prints of the win rate, the fraction of the coordinates of $u$
            below $\rho$ (the clip left them alone; 1 without a clip), an
            integer >= 0 (0: never), which may be traced; the paper keeps
            the rate between 0.1 and 0.5 and raises $\gamma$ where it is lower.
            Prints at steps $t$ that are multiples of it; past the counters'
            maximum, where the count cycles, at some of those. Prints only
            when not 0. Default: ``0``.

    Returns:
        An update object with state ``ScaleBySophiaState(mu, hessian, key,
        count)``; it needs params and the objective.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import updax as ux
        >>> def f(w):  # curvatures 1 and 100
        ...     return 0.5 * jnp.sum(jnp.array([1.0, 100.0]) * w ** 2)
        >>> opt = ux.scale_by_sophia(b1=0.0, b2=0.0, gamma=1.0, clip_threshold=None, update_interval=1,
        ...                          objective=f)
        >>> w = jnp.array([1.0, 1.0])
        >>> state = opt.init(w)
        >>> _, state = opt.update(jax.grad(f)(w), state, w)  # the first step estimates the curvature
        >>> u, state = opt.update(jax.grad(f)(w), state, w)  # the second one is a Newton step
        >>> u
        Array([1., 1.], dtype=float32)

    References:
        Liu et al., "Sophia: A Scalable Stochastic Second-order Optimizer
        for Language Model Pre-training", ICLR 2024, Algorithm 3.
        https://arxiv.org/abs/2305.14342; Hutchinson, "A stochastic estimator
        of the trace of the influence matrix for Laplacian smoothing splines",
        1989; optax's ``contrib.sophia``.
    """
    options = dict(b1=b1, b2=b2, eps=eps, gamma=gamma, clip_threshold=clip_threshold,
                   update_interval=update_interval, key=key, objective=objective, mu_dtype=mu_dtype,
                   hessian_dtype=hessian_dtype, verbose=verbose,
                   print_win_rate_every_n_steps=print_win_rate_every_n_steps)
    return stateful(_init_scale_by_sophia, _apply_scale_by_sophia, name="scale_by_sophia", options=options,
                    domains=_DOMAINS, needs_params=True, schedulable=("b1", "b2", "eps", "gamma", "clip_threshold"))
