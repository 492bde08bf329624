"""Skipping bad steps (non-finite or too large updates leave the state untouched), and the loss scale of
mixed-precision training that finds them."""

from __future__ import annotations

import dataclasses
import functools
from typing import Annotated, Any, NamedTuple

import jax
import jax.numpy as jnp

from updax import _tree
from updax._combinators import combinator
from updax._domains import NON_NEGATIVE, POSITIVE, Count, Flag, FlagField, Integer, Pipeline, Real
from updax._primitives import stateful
from updax._typing import ArrayLike, PyTree, ScalarOrSchedule
from updax._update import Update
from updax.updates._clipping import global_norm


def _count_not_finite(tree) -> jax.Array:
    counts = [jnp.sum(~jnp.isfinite(x)).astype(jnp.int32) for x in jax.tree.leaves(tree)]
    return sum(counts, jnp.zeros([], jnp.int32))


def _all_finite(*trees) -> jax.Array:
    """Whether every element of ``trees`` is finite: an ``and`` of booleans, which XLA reduces through a byte per
    element where a count goes through a 32-bit integer. Trees of the same leaf shapes (a step and its input)
    are checked leaf by leaf together, one reduction for each pair of leaves (a third fewer kernels)."""
    leaves = [jax.tree.leaves(tree) for tree in trees]
    shapes = {tuple(jnp.shape(x) for x in group) for group in leaves}
    if len(shapes) == 1:
        checks = [functools.reduce(jnp.logical_and, [jnp.isfinite(x) for x in group]) for group in zip(*leaves)]
    else:
        checks = [jnp.isfinite(x) for group in leaves for x in group]
    return functools.reduce(jnp.logical_and, [jnp.all(c) for c in checks], jnp.ones([], bool))


def skip_not_finite(updates: PyTree, gradient_step: ArrayLike,
                    params: PyTree) -> tuple[jax.Array, dict[str, jax.Array]]:
    """A skip function for :func:`accumulate_gradients`: skip updates holding a NaN or an infinity.

    Args:
        updates: the updates of this call. No default.
        gradient_step: the wrapped pipeline's step count (unused). No default.
        params: the params (unused). No default.

    Returns:
        ``(skip, record)`` with ``record = {"should_skip", "num_not_finite"}``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale(-1.0).accumulate_gradients(1, should_skip=ux.skip_not_finite)
        >>> state = opt.init({"w": jnp.zeros(2)})
        >>> u, state = opt.update({"w": jnp.array([1.0, jnp.nan])}, state)
        >>> u["w"], state[0].skip["num_not_finite"], ux.has_updated(state)
        (Array([0., 0.], dtype=float32), Array(1, dtype=int32), Array(False, dtype=bool))
    """
    del gradient_step, params
    num = _count_not_finite(updates)
    skip = num > 0
    return skip, {"should_skip": skip, "num_not_finite": num}


@dataclasses.dataclass(frozen=True)
class skip_large_updates:
    """A skip function for :func:`accumulate_gradients`: skip updates whose squared global norm exceeds a bound.

    ``skip_large_updates(max_squared_norm)`` is the skip function; it is a
    value (equal for equal bounds), so pipelines holding it compare equal.

    Args:
        max_squared_norm: the largest squared global norm accepted, >= 0;
            a non-finite norm is always skipped. No default.

    Returns:
        A skip function returning ``(skip, {"should_skip", "norm_squared"})``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> skip = ux.skip_large_updates(10.0)
        >>> skip({"w": jnp.array([3.0, 1.0])}, 0, None)[0], skip({"w": jnp.array([3.0, 2.0])}, 0, None)[0]
        (Array(False, dtype=bool), Array(True, dtype=bool))
    """

    max_squared_norm: float

    def __post_init__(self) -> None:
        bound = NON_NEGATIVE.check("skip_large_updates", "max_squared_norm", self.max_squared_norm)
        object.__setattr__(self, "max_squared_norm", float(bound))

    def __call__(self, updates: PyTree, gradient_step: ArrayLike,
                 params: PyTree) -> tuple[jax.Array, dict[str, jax.Array]]:
        del gradient_step, params
        norm_squared = jnp.square(global_norm(updates))
        skip = ~(norm_squared <= self.max_squared_norm)  # also skips NaN
        return skip, {"should_skip": skip, "norm_squared": norm_squared}


class ApplyIfFiniteState(NamedTuple):
    """The wrapped pipeline's state and the counts of non-finite steps (optax's names)."""

    inner: tuple
    notfinite_count: Count
    last_finite: FlagField
    total_notfinite: Count


def _refuse_dynamic_loss_scale(inner):
    """apply_if_finite around a dynamic loss scale would keep its scale on the steps that should back it off:
    refused when the wrapper is built, and when it is initialised (composed after the stages it wraps)."""
    if isinstance(inner, Update) and _wraps_dynamic_loss_scale(inner):
        raise ValueError("apply_if_finite: the pipeline it wraps holds a dynamic loss_scale, whose back-off on a "
                         "non-finite step it would undo; put apply_if_finite inside the loss scale "
                         "(optimizer.apply_if_finite().loss_scale(dynamic=True))")


def _init_apply_if_finite(params, *, inner):
    _refuse_dynamic_loss_scale(inner)
    return ApplyIfFiniteState(inner=inner.init(params), notfinite_count=_tree.zero_count(),
                              last_finite=jnp.ones([], bool), total_notfinite=_tree.zero_count())


def _apply_apply_if_finite(updates, state, params, *, inner, max_consecutive_errors, **extra):
    return if_finite(updates, state, params, inner, max_consecutive_errors, extra)


def if_finite(updates, state, params, inner, max_consecutive_errors, extra, recheck=None):
    """The step, kept where it is finite. ``recheck(updates, inner_state, params)``, where given, returns the step
    the check reads instead of the one returned: the same values, computed apart (a backend's path)."""
    out, inner_state = inner.update(updates, state.inner, params, **extra)
    checked = None if recheck is None else recheck(updates, state.inner, params)
    finite = _all_finite(updates, out if checked is None else checked)
    notfinite_count = jnp.where(finite, 0, _tree.safe_increment(state.notfinite_count))
    apply = finite | (notfinite_count > max_consecutive_errors)
    out = jax.tree.map(lambda u: jnp.where(apply, u, _tree.zeros_like(u)), out)
    inner_state = jax.tree.map(lambda new, old: jax.lax.select(apply, new, old), inner_state, state.inner)
    total = jnp.where(finite, state.total_notfinite, _tree.safe_increment(state.total_notfinite))
    notfinite_count = notfinite_count.astype(state.notfinite_count.dtype)
    return out, ApplyIfFiniteState(inner=inner_state, notfinite_count=notfinite_count,
                                   last_finite=finite, total_notfinite=total)


@combinator(wraps=True)
def apply_if_finite(inner: Update, max_consecutive_errors: int = 5) -> Update:
    """Drops steps whose updates are not finite, leaving the pipeline before it untouched.

    The wrapped pipeline runs on every call; when its input or its output
    holds a NaN or an infinity, the call emits zeros and its state is kept
    bit-identical, unless more than ``max_consecutive_errors`` such calls
    came in a row: then the update is applied anyway (so a run that keeps
    failing fails loudly). The counts are kept in the state.

    Args:
        max_consecutive_errors: non-finite calls in a row that are dropped,
            an integer >= 0. Default: ``5``.

    Returns:
        An update object with state ``ApplyIfFiniteState(inner,
        notfinite_count, last_finite, total_notfinite)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_adam().scale(-0.1).apply_if_finite(3)
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> u, state = opt.update({"w": jnp.array([jnp.inf])}, state)
        >>> u["w"], opt.get_state(state, "apply_if_finite/scale_by_adam.count")
        (Array([0.], dtype=float32), Array(0, dtype=int32))
        >>> opt.get_state(state, "apply_if_finite.total_notfinite")
        Array(1, dtype=int32)

    References:
        optax.apply_if_finite; the loss-scaling skip of mixed-precision
        training (Micikevicius et al., "Mixed Precision Training", ICLR 2018).
    """
    _refuse_dynamic_loss_scale(inner)
    return stateful(_init_apply_if_finite, _apply_apply_if_finite, name="apply_if_finite",
                    options=dict(inner=inner, max_consecutive_errors=max_consecutive_errors),
                    domains=dict(inner=Pipeline(), max_consecutive_errors=Integer(0)), wraps="inner",
                    state_last=("inner",))


def _wraps_dynamic_loss_scale(update: Update) -> bool:
    """Whether ``update`` holds a dynamic ``loss_scale`` stage, at any depth (wrapped pipelines included)."""
    for stage in update.stages:
        options = dict(stage.options)
        if stage.name == "loss_scale" and options.get("dynamic") is True:
            return True
        for value in options.values():
            inner = value.values() if isinstance(value, dict) else (value,)
            if any(isinstance(v, Update) and _wraps_dynamic_loss_scale(v) for v in inner):
                return True
    return False


# --------------------------------------------------------------------------
# Loss scaling (Axon.LossScale)


class LossScaleState(NamedTuple):
    """The wrapped pipeline's state, the loss scale and the finite steps counted towards its growth (Axon's
    ``counter``: always 0 for a static scale)."""

    inner: tuple
    scale: Annotated[Any, POSITIVE]
    counter: Count


def _init_loss_scale(params, *, inner, loss_scale):
    return LossScaleState(inner=inner.init(params), scale=jnp.asarray(loss_scale, jnp.float32),
                          counter=_tree.zero_count())


def _apply_loss_scale(updates, state, params, *, inner, dynamic, period, factor, min_loss_scale, **extra):
    scale = state.scale

    def unscale(g):
        return _tree.cast(_tree.cast(g, _tree.compute_dtype(g.dtype)) / scale, g.dtype)

    out, inner_state = inner.update(jax.tree.map(unscale, updates), state.inner, params, **extra)
    if not dynamic:
        return out, LossScaleState(inner=inner_state, scale=scale, counter=state.counter)
    finite = _all_finite(updates)
    grown = scale * factor
    grow = (state.counter == period - 1) & jnp.isfinite(grown)
    new_scale = jnp.where(finite, jnp.where(grow, grown, scale), jnp.maximum(min_loss_scale, scale / factor))
    counter = jnp.where(finite, (state.counter + 1) % period, 0).astype(state.counter.dtype)
    return out, LossScaleState(inner=inner_state, scale=new_scale.astype(jnp.float32), counter=counter)


_LOSS_SCALE_DOMAINS = dict(inner=Pipeline(), loss_scale=POSITIVE, dynamic=Flag(), period=Integer(1),
                           factor=Real(1.0), min_loss_scale=POSITIVE)


@combinator(wraps=True)
def loss_scale(inner: Update, loss_scale: ArrayLike = 2.0**15, *, dynamic: bool = False, period: int = 2000,
               factor: ScalarOrSchedule = 2.0, min_loss_scale: ScalarOrSchedule = 1.0) -> Update:
    r"""Unscales the gradients of a scaled loss for the pipeline before it (Axon.LossScale).

    Mixed-precision training differentiates $s \cdot L$ rather than the loss
    $L$, so that small gradients do not underflow in float16; this stage
    holds the scale $s$ (read it with :func:`current_loss_scale`, or at the
    path ``"loss_scale.scale"``) and gives the wrapped pipeline $g / s$, the
    gradients of $L$. A static scale (``dynamic=False``, Axon's
    ``LossScale.static``) never changes. A dynamic one (Axon's
    ``LossScale.dynamic``) follows the gradients it gets, with $c$ the
    finite steps counted since the last change, $f$ = ``factor``,
    $P$ = ``period`` and $s_{\min}$ = ``min_loss_scale``:

    $$
    \begin{align*}
    s &\gets \begin{cases}
      f s & \text{all of } g \text{ finite, } c = P - 1 \text{ and } f s \text{ finite} \\
      s & \text{all of } g \text{ finite otherwise} \\
      \max(s_{\min}, s / f) & \text{otherwise}
    \end{cases} \\
    c &\gets \begin{cases} (c + 1) \bmod P & \text{all of } g \text{ finite} \\ 0 & \text{otherwise} \end{cases}
    \end{align*}
    $$

    so the scale grows by $f$ after every $P$ finite steps in a row and
    backs off by $f$ on a step holding a NaN or an infinity. The new scale
    applies from the next step on. This stage does not skip the step that
    overflowed: wrap the optimizer in :func:`apply_if_finite` *inside* it
    (``optimizer.apply_if_finite().loss_scale(dynamic=True)``), which drops
    it and keeps the optimizer's state. ``apply_if_finite`` around a dynamic
    loss scale is refused: it would undo the back-off of every step it drops.

    Args:
        loss_scale: the (initial) loss scale, > 0. Default: ``32768.0``
            ($2^{15}$, Axon's).
        dynamic: whether the scale follows the gradients (Axon's
            ``dynamic``) or stays (``static``). Default: ``False``.
        period: the finite steps in a row after which a dynamic scale
            grows, an integer >= 1. Default: ``2000``.
        factor: what a dynamic scale is multiplied by when it grows and
            divided by when it backs off, >= 1, or a schedule. Default:
            ``2.0``.
        min_loss_scale: the lowest a dynamic scale backs off to, > 0, or a
            schedule. Default: ``1.0``.

    Returns:
        An update object with state ``LossScaleState(inner, scale, counter)``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.optimizers.sgd(0.1).apply_if_finite().loss_scale(2.0**10, dynamic=True, period=2)
        >>> params = {"w": jnp.ones(2)}
        >>> state = opt.init(params)
        >>> loss = lambda p: jnp.sum(p["w"] ** 2)
        >>> for _ in range(2):  # two finite steps: the scale doubles
        ...     grads = jax.grad(lambda p: loss(p) * ux.current_loss_scale(state))(params)
        ...     updates, state = opt.update(grads, state, params)
        ...     params = ux.apply_updates(params, updates)
        >>> params["w"], ux.current_loss_scale(state)
        (Array([0.64, 0.64], dtype=float32), Array(2048., dtype=float32))
        >>> updates, state = opt.update({"w": jnp.array([jnp.inf, 1.0])}, state, params)
        >>> updates["w"], ux.current_loss_scale(state)  # overflow: the step is dropped, the scale halves
        (Array([0., 0.], dtype=float32), Array(1024., dtype=float32))

    References:
        Micikevicius et al., "Mixed Precision Training", ICLR 2018.
        https://arxiv.org/abs/1710.03740; Axon's ``Axon.LossScale``.
    """
    return stateful(_init_loss_scale, _apply_loss_scale, name="loss_scale",
                    options=dict(inner=inner, loss_scale=loss_scale, dynamic=dynamic, period=period, factor=factor,
                                 min_loss_scale=min_loss_scale),
                    domains=_LOSS_SCALE_DOMAINS, wraps="inner", schedulable=("factor", "min_loss_scale"))


def current_loss_scale(state: PyTree) -> jax.Array:
    """The scale of a pipeline's :func:`loss_scale` stage: what the loss is multiplied by before differentiation.

    Args:
        state: the state of a pipeline holding exactly one ``loss_scale``
            stage (at any depth), or that stage's ``LossScaleState``.
            No default.

    Returns:
        A float32 scalar array (usable under ``jax.jit``).

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.optimizers.adam(1e-3).loss_scale(2.0**12)
        >>> ux.current_loss_scale(opt.init({"w": jnp.zeros(2)}))
        Array(4096., dtype=float32)
    """
    found = [s for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, LossScaleState))
             if isinstance(s, LossScaleState)]
    if len(found) != 1:
        raise ValueError(f"current_loss_scale: the state holds {len(found)} loss_scale states; pass the one to read")
    return found[0].scale
