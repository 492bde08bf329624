"""Wrappers that run the pipeline before them on the calls a function of the step count picks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from updax import _tree
from updax._combinators import combinator
from updax._domains import Count, Flag, Function, Pipeline, fail, is_concrete
from updax._primitives import stateful
from updax._update import Update

#: What the options of the conditional wrappers hold.
_CONDITIONAL_DOMAINS = dict(inner=Pipeline(), should_transform_fn=Function(), forward_extra_args=Flag())


class ConditionallyTransformState(NamedTuple):
    """The wrapped pipeline's state, and the calls so far (the count ``should_transform_fn`` gets)."""

    inner: tuple
    step: Count


class ConditionallyMaskState(NamedTuple):
    """The wrapped pipeline's state, and the calls so far (the count ``should_transform_fn`` gets)."""

    inner: tuple
    step: Count


def _should_run(call, should_transform_fn, step, forward_extra_args, extra):
    """``should_transform_fn(step)`` (with the extra keywords where forwarded) as a bool scalar; anything else it
    returns (an array with elements, a float, a string) is refused by name, under ``jax.jit`` too."""
    value = should_transform_fn(step, **extra) if forward_extra_args else should_transform_fn(step)
    try:
        dtype, shape = jnp.result_type(value), jnp.shape(value)
    except TypeError:
        fail(call, "should_transform_fn(...)", value, "must return a bool scalar", TypeError, "the value it returned")
    if dtype != jnp.bool_ or shape != ():
        shown = np.asarray(value) if is_concrete(value) else f"<traced {dtype.name}{list(shape)}>"
        fail(call, "should_transform_fn(...)", shown, f"must return a bool scalar, not {dtype.name}{list(shape)}",
             TypeError, "the value it returned")
    return jnp.asarray(value)


def _conditional_step(call, updates, state, params, inner, should_transform_fn, forward_extra_args, extra, zero):
    run = _should_run(call, should_transform_fn, state.step, forward_extra_args, extra)

    def transform(operand):
        return inner.update(updates, operand, params, **extra)

    shapes = jax.eval_shape(transform, state.inner)[0]
    _tree.check_same_structure(call, shapes, updates, "the wrapped pipeline's output", "updates")

    def skip(operand):  # zeros, or the updates unchanged, in the dtypes (and shardings) the pipeline returns
        out = jax.tree.map(lambda s, u: _tree.zeros_of(s) if zero else jnp.asarray(u, s.dtype), shapes, updates)
        return out, operand

    out, inner_state = jax.lax.cond(run, transform, skip, state.inner)
    return out, inner_state, _tree.safe_increment(state.step)


def _init_conditionally_transform(params, *, inner):
    return ConditionallyTransformState(inner=inner.init(params), step=_tree.zero_count())


def _apply_conditionally_transform(updates, state, params, *, inner, should_transform_fn, forward_extra_args,
                                   **extra):
    out, inner_state, step = _conditional_step("conditionally_transform", updates, state, params, inner,
                                               should_transform_fn, forward_extra_args, extra, zero=False)
    return out, ConditionallyTransformState(inner=inner_state, step=step)


@combinator(wraps=True)
def conditionally_transform(inner: Update, should_transform_fn: Callable[..., Any],
                            forward_extra_args: bool = False) -> Update:
    r"""Runs the pipeline before it on the calls ``should_transform_fn`` picks; the others pass through.

    With $t$ the number of earlier calls (``step``, from 0) and $f$ =
    ``should_transform_fn``:

    $$
    u = \begin{cases} \text{inner}(g) & \text{if } f(t) \\ g & \text{otherwise} \end{cases}
    $$

    On a call it skips, the wrapped pipeline's state is kept bit for bit
    (the pipeline does not run: a ``lax.cond``). The updates go on in the
    dtypes the wrapped pipeline would return. :func:`conditionally_mask`
    emits zeros instead.

    Args:
        should_transform_fn: a jittable function of the step count (an
            int32 scalar) returning a bool scalar (anything else is refused
            by name), e.g. ``lambda step: step % 2 == 0``. No default.
        forward_extra_args: also pass ``update``'s extra keywords
            (``loss=``, ...) to ``should_transform_fn``; they reach the
            wrapped pipeline either way. Default: ``False``.

    Returns:
        An update object with state ``ConditionallyTransformState(inner,
        step)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale(-0.5).conditionally_transform(lambda step: step >= 1)
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> u1, state = opt.update({"w": jnp.array([2.0])}, state)
        >>> u2, state = opt.update({"w": jnp.array([2.0])}, state)
        >>> u1["w"], u2["w"], opt.get_state(state, "conditionally_transform.step")
        (Array([2.], dtype=float32), Array([-1.], dtype=float32), Array(2, dtype=int32))

    References:
        optax.transforms.conditionally_transform (same rule and options).
    """
    options = dict(inner=inner, should_transform_fn=should_transform_fn, forward_extra_args=forward_extra_args)
    return stateful(_init_conditionally_transform, _apply_conditionally_transform, name="conditionally_transform",
                    options=options, domains=_CONDITIONAL_DOMAINS, wraps="inner")


def _init_conditionally_mask(params, *, inner):
    return ConditionallyMaskState(inner=inner.init(params), step=_tree.zero_count())


def _apply_conditionally_mask(updates, state, params, *, inner, should_transform_fn, forward_extra_args, **extra):
    out, inner_state, step = _conditional_step("conditionally_mask", updates, state, params, inner,
                                               should_transform_fn, forward_extra_args, extra, zero=True)
    return out, ConditionallyMaskState(inner=inner_state, step=step)


@combinator(wraps=True)
def conditionally_mask(inner: Update, should_transform_fn: Callable[..., Any],
                       forward_extra_args: bool = False) -> Update:
    r"""Runs the pipeline before it on the calls ``should_transform_fn`` picks; the others emit zeros.

    With $t$ the number of earlier calls (``step``, from 0) and $f$ =
    ``should_transform_fn``:

    $$
    u = \begin{cases} \text{inner}(g) & \text{if } f(t) \\ 0 & \text{otherwise} \end{cases}
    $$

    On a call it skips, the wrapped pipeline's state is kept bit for bit
    (the pipeline does not run: a ``lax.cond``), and the params do not move.
    :func:`conditionally_transform` passes the updates on instead.

    Args:
        should_transform_fn: a jittable function of the step count (an
            int32 scalar) returning a bool scalar (anything else is refused
            by name), e.g. ``lambda step: step % 2 == 0``. No default.
        forward_extra_args: also pass ``update``'s extra keywords
            (``loss=``, ...) to ``should_transform_fn``; they reach the
            wrapped pipeline either way. Default: ``False``.

    Returns:
        An update object with state ``ConditionallyMaskState(inner, step)``.

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.trace(0.5).scale(-1.0).conditionally_mask(lambda step: step % 2 == 0)
        >>> state = opt.init({"w": jnp.zeros(1)})
        >>> for _ in range(3):
        ...     u, state = opt.update({"w": jnp.array([1.0])}, state)
        ...     print(u["w"])
        [-1.]
        [0.]
        [-1.5]

    References:
        optax.transforms.conditionally_mask (same rule and options).
    """
    options = dict(inner=inner, should_transform_fn=should_transform_fn, forward_extra_args=forward_extra_args)
    return stateful(_init_conditionally_mask, _apply_conditionally_mask, name="conditionally_mask",
                    options=options, domains=_CONDITIONAL_DOMAINS, wraps="inner")
