"""Wrappers that move the params along a path of their own (lookahead, SAM) or mask the steps of the pipeline they
wrap (cautious updates), and optimistic gradients."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import NON_NEGATIVE, Count, Flag, FlagField, FloatDtype, Integer, Pipeline, Real, Valid, fail
from updax._primitives import apply_updates, stateful
from updax._typing import DType, ScalarOrSchedule
from updax._update import Update
from updax.updates._clipping import global_norm
from updax._leafwise import per_leaf
from updax.updates._kernels import filled


def _optional_pipeline(call, name, value):
    if value is not None and not isinstance(value, Update):
        fail(call, name, value, "must be None or an update object", TypeError)
    return value


#: What the options of the wrappers and of the optimistic gradient hold. (A sync period sizes no state or loop:
#: it is compared with a step counter.)
_WRAPPER_DOMAINS = dict(
    inner=Pipeline(), sync_period=Integer(1), slow_step_size=Real(0.0, 1.0, lo_open=True), reset_state=Flag(),
    accumulator_dtype=FloatDtype(), rho=NON_NEGATIVE,
    adversary=Valid(rule=_optional_pipeline, text="must be None or an update object"),
    alpha=NON_NEGATIVE, beta=NON_NEGATIVE, eps=NON_NEGATIVE, descent=Flag())


def _domains(options):
    return {k: _WRAPPER_DOMAINS[k] for k in options}


# --------------------------------------------------------------------------
# Lookahead


class LookaheadState(NamedTuple):
    """The wrapped (fast) pipeline's state, the slow weights, and the fast steps taken since they were synced."""

    inner: tuple
    slow: Any
    steps_since_sync: Count


def _init_lookahead(params, *, inner, accumulator_dtype):
    return LookaheadState(inner=inner.init(params), slow=filled("lookahead", params, params, accumulator_dtype),
                          steps_since_sync=_tree.zero_count())


def _apply_lookahead(updates, state, params, *, inner, sync_period, slow_step_size, reset_state,
                     accumulator_dtype, **extra):
    del accumulator_dtype  # (named, so that it does not reach the wrapped pipeline among the extra keywords)
    steps, inner_state = inner.update(updates, state.inner, params, **extra)
    sync = state.steps_since_sync >= sync_period - 1

    def leaf(p, u, s):
        c = _tree.compute_dtype(p.dtype, u.dtype, s.dtype)
        s_c = s.astype(c)
        fast = p.astype(c) + u.astype(c)  # the k-th fast weights
        synced = s_c + jnp.asarray(slow_step_size).astype(c) * (fast - s_c)  # φ ← φ + α·(θ_k - φ)
        out = jnp.where(sync, synced - p.astype(c), u.astype(c)).astype(u.dtype)  # on a sync, θ restarts at φ
        if s.dtype != p.dtype or jnp.iscomplexobj(p) or jnp.dtype(u.dtype).itemsize < jnp.dtype(p.dtype).itemsize:
            # φ' itself where the params' sum would round it: a wider φ, or updates narrower than the params
            # (bfloat16 updates of float32 params would round every slow step to bfloat16).
            return out, jnp.where(sync, synced, s_c).astype(s.dtype)
        # φ is the new param itself, as apply_updates computes it (θ and φ then equal bit for bit): XLA merges the
        # two, so φ's kernel reads the params' new buffer, runs after the params' kernel and writes φ in place,
        # where from synced it would read the old params and φ, which the params' kernel reads too (both copied).
        return out, jnp.where(sync, _tree.place_like(_tree.summed(p, out), s), s)

    out, slow = _tree.tree_map_unzip("lookahead", leaf, 2, params, steps, state.slow,
                                     names=("params", "updates", "state.slow"))
    if reset_state:  # the fast pipeline starts afresh from the synchronised point
        inner_state = jax.lax.cond(sync, lambda s: inner.init(apply_updates(params, out)), lambda s: s, inner_state)
    count = jnp.where(sync, 0, state.steps_since_sync + 1).astype(state.steps_since_sync.dtype)
    return out, LookaheadState(inner=inner_state, slow=slow, steps_since_sync=count)


@combinator(wraps=True)
def lookahead(inner: Update, sync_period: int = 5, slow_step_size: ScalarOrSchedule = 0.5,
              reset_state: bool = False, *, accumulator_dtype: DType = None) -> Update:
    r"""Lookahead: ``k`` steps of the pipeline before it, then one step of the slow weights towards them.

    The pipeline before it (the fast optimizer) moves the params, the fast
    weights $\theta$; the slow weights $\varphi$ live in the state, starting at the
    params. Every $k$-th call ($k$ = ``sync_period``) the slow weights step towards the fast ones
    and the emitted update puts the params at the new slow weights, where
    the next $k$ fast steps start (the paper's Algorithm 1). With $g$ the
    incoming update and $\alpha$ = ``slow_step_size``:

    $$
    \begin{align*}
    \theta' &= \theta + \text{inner}(g) \\
    u &= \theta' - \theta && \text{(not a sync)} \\
    \varphi &\gets \varphi + \alpha\, (\theta' - \varphi), \quad u = \varphi - \theta
        && \text{(every } k\text{-th call)}
    \end{align*}
    $$

    It works in the usual loop with plain params (take gradients at the
    params, apply the updates): unlike ``optax.lookahead``, which needs
    ``LookaheadParams(fast, slow)`` as params and returns updates for both,
    the slow weights are state, read with
    ``opt.get_state(state, "lookahead.slow")``; right after a sync the
    params equal them bit for bit (the new slow weights are the new params
    as :func:`apply_updates` computes them, $\theta + (\varphi' - \theta)$, within
    rounding of the paper's $\varphi'$; with a wider ``accumulator_dtype``, or
    updates narrower than the params, $\varphi'$ itself, and the params within
    the updates' rounding of it). Do not change the updates after this
    stage.

    Args:
        sync_period: $k$, the fast steps per slow step, an integer >= 1.
            Default: ``5``.
        slow_step_size: $\alpha$, the slow weights' step, in (0, 1].
            Default: ``0.5``.
        reset_state: after each sync, restart the pipeline before it from
            its ``init`` at the new params. Default: ``False``.
        accumulator_dtype: storage dtype of the slow weights; None keeps
            the params' dtype but at least float32. Default: ``None``.

    Returns:
        An update object with state ``LookaheadState(inner, slow,
        steps_since_sync)``; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale(-1.0).lookahead(2, 0.5)
        >>> opt
        scale(step_size=-1.0) |> lookahead(sync_period=2, slow_step_size=0.5, reset_state=False)
        >>> params = {"w": jnp.array([0.0])}
        >>> state = opt.init(params)
        >>> for _ in range(2):  # fast weights 1, 2; the slow ones go from 0 halfway to 2
        ...     u, state = opt.update({"w": jnp.array([-1.0])}, state, params)
        ...     params = ux.apply_updates(params, u)
        >>> params["w"], opt.get_state(state, "lookahead.slow")["w"]
        (Array([1.], dtype=float32), Array([1.], dtype=float32))

    References:
        Zhang et al., "Lookahead Optimizer: k steps forward, 1 step back",
        NeurIPS 2019, Algorithm 1. https://arxiv.org/abs/1907.08610
    """
    options = dict(inner=inner, sync_period=sync_period, slow_step_size=slow_step_size, reset_state=reset_state,
                   accumulator_dtype=accumulator_dtype)
    return stateful(_init_lookahead, _apply_lookahead, name="lookahead", options=options, domains=_domains(options),
                    wraps="inner", needs_params=True, schedulable=("slow_step_size",))


# --------------------------------------------------------------------------
# SAM


class SamState(NamedTuple):
    """The wrapped (outer) pipeline's state, the adversary's state, the params the ascent started from, and the
    calls since the last descent step."""

    inner: tuple
    adversary: Any
    outer_params: Any
    steps_since_sync: Count


def _init_sam(params, *, inner, adversary):
    return SamState(inner=inner.init(params), adversary=() if adversary is None else adversary.init(params),
                    outer_params=filled("sam", params, params, None), steps_since_sync=_tree.zero_count())


def _apply_sam(updates, state, params, *, inner, adversary, rho, sync_period, reset_state, **extra):
    start = state.steps_since_sync == 0
    descend = state.steps_since_sync >= sync_period - 1
    outer = _tree.tree_map("sam", lambda p, o: jnp.where(start, p.astype(o.dtype), o), params, state.outer_params,
                           names=("params", "state.outer_params"))

    def ascend(operand):
        inner_state, adversary_state = operand
        if adversary is None:
            direction = updates
        else:
            direction, adversary_state = adversary.update(updates, adversary_state, params, **extra)
        norm = global_norm(direction)
        scale = jnp.where(norm > 0, rho / jnp.where(norm > 0, norm, 1.0), 0.0)  # ε = ρ·d/‖d‖, 0 at d = 0

        def leaf(d):
            c = _tree.compute_dtype(d.dtype, scale.dtype)
            return (scale.astype(c) * d.astype(c)).astype(d.dtype)

        return jax.tree.map(leaf, direction), inner_state, adversary_state

    def descent(operand):
        inner_state, adversary_state = operand
        at = jax.tree.map(lambda o, p: o.astype(p.dtype), outer, params)
        steps, inner_state = inner.update(updates, inner_state, at, **extra)

        def leaf(o, p, u):  # back to the outer params, then the outer step: o + u - p
            c = _tree.compute_dtype(o.dtype, p.dtype, u.dtype)
            return (o.astype(c) - p.astype(c) + u.astype(c)).astype(u.dtype)

        out = jax.tree.map(leaf, outer, params, steps)
        if adversary is not None and reset_state:
            adversary_state = adversary.init(params)
        return out, inner_state, adversary_state

    out, inner_state, adversary_state = jax.lax.cond(descend, descent, ascend, (state.inner, state.adversary))
    count = jnp.where(descend, 0, state.steps_since_sync + 1).astype(state.steps_since_sync.dtype)
    return out, SamState(inner=inner_state, adversary=adversary_state, outer_params=outer, steps_since_sync=count)


@combinator(wraps=True)
def sam(inner: Update, rho: ScalarOrSchedule = 0.05, sync_period: int = 2, *, reset_state: bool = True,
        adversary: Update | None = None) -> Update:
    r"""Sharpness-aware minimisation: ascent steps, then the step of the pipeline before it from the start.

    Each cycle of $k$ = ``sync_period`` calls takes $k - 1$ adversarial
    (ascent) steps from the outer params $w$ and then one descent step of
    the pipeline before it (the outer optimizer) with the gradient at the
    perturbed params, applied at $w$; one gradient per call, as in the
    usual loop (optax.contrib.sam's default, non-opaque mode). With $p$ the
    params the call gets (after the ascent steps, $w$ plus their $\epsilon$),
    $g$ the gradient there, $\rho$ = ``rho`` and $\lVert \cdot \rVert$ the
    global norm over all leaves:

    $$
    \begin{align*}
    \text{ascent:} \quad u &= \epsilon = \rho\, d / \lVert d \rVert, \quad d = g \text{ (or adversary}(g)\text{)};
        \quad \epsilon = 0 \text{ if } d = 0 \\
    \text{descent:} \quad u &= w - p + \text{inner}(g), \quad \text{and the cycle restarts}
    \end{align*}
    $$

    With $k = 2$ that is the paper's SAM in the 2-norm (its $p = 2$). The gradients of
    the ascent calls (and any loss or metric at the perturbed params) are
    not the model's: read ``steps_since_sync`` (0 after a descent) to tell
    them apart. ``adversary`` shapes the ascent direction (``rho`` sets its
    length): ``adversary=ux.scale_by_adam()`` is optax's
    ``adv_optimizer=chain(scale_by_adam(), normalize(), sgd(rho))``.

    Args:
        rho: $\rho$, the length of each ascent step, >= 0. Default: ``0.05``.
        sync_period: $k$, the calls per descent step, an integer >= 1
            (1: no ascent, the pipeline before it alone). Default: ``2``.
        reset_state: restart the adversary from its ``init`` after each
            descent step. Default: ``True``.
        adversary: a pipeline whose output is the ascent direction, or None
            for the gradient itself. Default: ``None``.

    Returns:
        An update object with state ``SamState(inner, adversary,
        outer_params, steps_since_sync)``; ``update`` needs ``params``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale(-0.1).sam(rho=0.5)
        >>> opt
        scale(step_size=-0.1) |> sam(rho=0.5, sync_period=2, reset_state=True)
        >>> params = {"w": jnp.array([3.0, 4.0])}
        >>> state = opt.init(params)
        >>> u, state = opt.update({"w": jnp.array([3.0, 4.0])}, state, params)
        >>> u["w"]  # ascend by 0.5 along g/|g|
        Array([0.3, 0.4], dtype=float32)
        >>> perturbed = ux.apply_updates(params, u)
        >>> u, state = opt.update({"w": jnp.array([1.0, 2.0])}, state, perturbed)
        >>> ux.apply_updates(perturbed, u)["w"]  # w - 0.1·g(w + ε)
        Array([2.9, 3.8], dtype=float32)

    References:
        Foret et al., "Sharpness-Aware Minimization for Efficiently Improving
        Generalization", ICLR 2021. https://arxiv.org/abs/2010.01412;
        optax.contrib.sam.
    """
    options = dict(inner=inner, rho=rho, sync_period=sync_period, reset_state=reset_state, adversary=adversary)
    return stateful(_init_sam, _apply_sam, name="sam", options=options, domains=_domains(options), wraps="inner",
                    needs_params=True, schedulable=("rho",))


# --------------------------------------------------------------------------
# Cautious updates


class CautiousState(NamedTuple):
    """The wrapped pipeline's state."""

    inner: tuple


def _init_cautious(params, *, inner, eps, descent):
    return CautiousState(inner=inner.init(params))


def _apply_cautious(updates, state, params, *, inner, eps, descent, **extra):
    out, inner_state = inner.update(updates, state.inner, params, **extra)

    def leaf(u, g):  # the wrapped pipeline's output u for one leaf, and the gradient g it came from
        c = _tree.compute_dtype(u.dtype, g.dtype)
        uc = _tree.cast(u, c)
        agree = jnp.real(uc * jnp.conj(_tree.cast(g, c)))
        keep = agree < 0 if descent else agree > 0
        scale = 1 / (jnp.mean(keep.astype(agree.dtype)) + eps)  # (inf only where nothing is kept, at eps = 0)
        return _tree.cast(jnp.where(keep, uc * scale, 0), u.dtype)

    out = _tree.tree_map("cautious", leaf, out, updates, names=("the wrapped pipeline's output", "updates"))
    return out, CautiousState(inner=inner_state)


@combinator(wraps=True)
def cautious(inner: Update, eps: ScalarOrSchedule = 1e-8, *, descent: bool = True) -> Update:
    r"""Keeps the coordinates of the pipeline before it that move against the gradient (cautious updates).

    For each leaf, with $u$ the wrapped pipeline's output, $g$ the gradient
    it got (this stage's input), $\epsilon$ = ``eps`` and $n$ the leaf's
    size, the paper's mask and its mean-preserving rescale:

    $$
    \begin{align*}
    \phi &= \mathbb{I}(u \odot g < 0) \\
    u &\gets \frac{u \odot \phi}{\tfrac{1}{n} \sum_i \phi_i + \epsilon}
    \end{align*}
    $$

    Every kept coordinate descends, $\langle u, g \rangle \le 0$, whatever
    the momentum of the rule inside. With ``descent=True`` (the default) the
    wrapped pipeline is a whole optimizer: its output is the step added to
    the params, which descends where $u \odot g < 0$. With ``descent=False``
    it is a direction that a later negative scale turns into a step
    (``scale_by_adam``'s, which points along the gradient), and the mask is
    $\mathbb{I}(u \odot g > 0)$: the paper's C-AdamW, whose weight decay is
    not masked, is
    ``scale_by_adam().cautious(descent=False).add_decayed_weights(decay).scale_by_learning_rate(lr)``.
    For complex leaves the sign is that of $\operatorname{Re}(u \bar g)$. A
    leaf with no kept coordinate gets a zero update.

    Args:
        eps: added to the kept fraction (the paper's stabiliser), >= 0.
            Default: ``1e-08``.
        descent: whether the wrapped pipeline's output is a step (True) or a
            direction along the gradient (False). Default: ``True``.

    Returns:
        An update object with state ``CautiousState(inner)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_adam().scale_by_learning_rate(0.1).cautious()
        >>> opt
        scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=1e-15) |> scale_by_learning_rate(learning_rate=0.1) |> cautious(eps=1e-08, descent=True)
        >>> g = {"w": jnp.array([1.0, -1.0])}
        >>> state = opt.update(g, opt.init(g))[1]
        >>> u, _ = opt.update({"w": jnp.array([1.0, 0.05])}, state)
        >>> u["w"]  # Adam alone: [-0.1, 0.063], its momentum climbing on the second; kept half, doubled
        Array([-0.199998,  0.      ], dtype=float32)

    References:
        Liang et al., "Cautious Optimizers: Improving Training with One Line
        of Code", 2024. https://arxiv.org/abs/2411.16085
    """
    return stateful(_init_cautious, _apply_cautious, name="cautious",
                    options=dict(inner=inner, eps=eps, descent=descent), wraps="inner",
                    domains=_domains(("inner", "eps", "descent")), schedulable=("eps",))


# --------------------------------------------------------------------------
# Optimistic gradients


class ScaleByOptimisticGradientState(NamedTuple):
    """The previous call's input (the gradient, or the direction of the stage before), and whether none came yet."""

    previous_gradient: Any
    is_initial_step: FlagField


def _init_optimistic(params, *, accumulator_dtype):
    return ScaleByOptimisticGradientState(previous_gradient=_tree.accumulators(params, accumulator_dtype),
                                          is_initial_step=jnp.ones([], bool))


def _apply_optimistic(updates, state, params, *, alpha, beta):
    first = state.is_initial_step

    def rule(g, previous):
        previous = jnp.where(first, g, previous)  # before the first step there is no previous one: take g
        return (alpha + beta) * g - beta * previous, g

    u, previous = per_leaf("scale_by_optimistic_gradient", rule, (updates, state.previous_gradient),
                           ("updates", "state.previous_gradient"))
    return u, ScaleByOptimisticGradientState(previous_gradient=previous, is_initial_step=jnp.zeros([], bool))


@combinator
def scale_by_optimistic_gradient(alpha: ScalarOrSchedule = 1.0, beta: ScalarOrSchedule = 1.0, *,
                                 accumulator_dtype: DType = None) -> Update:
    r"""Optimistic gradients: the update extrapolates from the previous one, ``(α + β)·g - β·g_prev``.

    Update rule, for an update $g$, with $\alpha$ = ``alpha``, $\beta$ = ``beta``
    and $g_\text{prev}$ the previous call's input (on the first call
    $g_\text{prev} = g$, so the first update is $\alpha g$):

    $$
    u = (\alpha + \beta)\, g - \beta\, g_\text{prev}
    $$

    With $\alpha = \beta = 1$ and a learning rate $\eta$ after it, it is
    optimistic mirror descent, $w \gets w - 2\eta\, g_t + \eta\, g_{t-1}$; after
    ``scale_by_adam`` it is Optimistic Adam. Use it for min-max problems
    (GANs, games), where plain gradient steps cycle.

    Args:
        alpha: the weight of the current gradient, >= 0. Default: ``1.0``.
        beta: the optimism, the weight of the change since the previous
            gradient, >= 0. Default: ``1.0``.
        accumulator_dtype: storage dtype of ``previous_gradient``; None keeps
            the params' dtype but at least float32. Default: ``None``.

    Returns:
        An update object with state
        ``ScaleByOptimisticGradientState(previous_gradient, is_initial_step)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_optimistic_gradient()
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> u1, state = opt.update({"w": jnp.array([1.0])}, state)
        >>> u2, state = opt.update({"w": jnp.array([3.0])}, state)
        >>> u1["w"], u2["w"]  # g, then 2·3 - 1
        (Array([1.], dtype=float32), Array([5.], dtype=float32))

    References:
        Daskalakis et al., "Training GANs with Optimism", ICLR 2018.
        https://arxiv.org/abs/1711.00141; Mokhtari et al., "A Unified
        Analysis of Extra-gradient and Optimistic Gradient Methods for Saddle
        Point Problems", AISTATS 2020 (alpha, beta).
        https://arxiv.org/abs/1901.08511
    """
    options = dict(alpha=alpha, beta=beta, accumulator_dtype=accumulator_dtype)
    # The update reads the previous gradient: it is written after the params' update (``state_last``).
    return stateful(_init_optimistic, _apply_optimistic, name="scale_by_optimistic_gradient", options=options,
                    domains=_domains(options), schedulable=("alpha", "beta"), state_last=("previous_gradient",))


# --------------------------------------------------------------------------
# Complex leaves as pairs of real ones


class SplitRealAndImaginaryState(NamedTuple):
    """The wrapped pipeline's state, for the split tree: each complex leaf a pair ``(real, imaginary)``."""

    inner: tuple


def _split(tree):
    """Each complex leaf as the pair ``(real part, imaginary part)``; real leaves as they are."""
    return jax.tree.map(lambda x: (jnp.real(x), jnp.imag(x)) if jnp.iscomplexobj(x) else x, tree)


def _init_split_real_and_imaginary(params, *, inner):
    return SplitRealAndImaginaryState(inner=inner.init(_split(params)))


def _apply_split_real_and_imaginary(updates, state, params, *, inner, **extra):
    split_params = None if params is None else _split(params)
    out, inner_state = inner.update(_split(updates), state.inner, split_params, **extra)

    def merge(u, o):
        if jnp.iscomplexobj(u):
            real, imaginary = o
            return jax.lax.complex(real.astype(jnp.real(u).dtype), imaginary.astype(jnp.real(u).dtype))
        return o

    return jax.tree.map(merge, updates, out), SplitRealAndImaginaryState(inner=inner_state)


@combinator(wraps=True)
def split_real_and_imaginary(inner: Update) -> Update:
    r"""Runs the pipeline before it on the real and imaginary parts of complex leaves, as real leaves.

    Each complex leaf $z = x + iy$ of the updates and params becomes the
    pair of real leaves $(x, y)$ for the wrapped pipeline, and its output
    pair $(u_x, u_y)$ becomes the complex update $u = u_x + i\, u_y$; real
    leaves pass to it as they are. So a rule that squares its input
    elementwise (Adam's $g^2$) keeps one second moment per part,
    $x^2$ and $y^2$, where it would keep $|z|^2$ for the complex leaf. The
    wrapped pipeline's state holds the split tree: a complex leaf's state
    is a pair, read as ``opt.get_state(state,
    "split_real_and_imaginary/scale_by_adam.mu")["w"][0]`` (the real part).

    Returns:
        An update object with state ``SplitRealAndImaginaryState(inner)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_sign().split_real_and_imaginary()
        >>> g = {"w": jnp.array([3.0 - 0.5j])}
        >>> opt.update(g, opt.init(g))[0]  # the sign of each part
        {'w': Array([1.-1.j], dtype=complex64)}

    References:
        optax.contrib.split_real_and_imaginary (same rule).
    """
    return stateful(_init_split_real_and_imaginary, _apply_split_real_and_imaginary, name="split_real_and_imaginary",
                    options=dict(inner=inner), domains=dict(inner=Pipeline()), wraps="inner")
