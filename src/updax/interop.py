"""optax both ways: an optax transformation as a stage of an updax pipeline, and an updax object where optax
expects a transformation.

optax is imported only when these functions are called: updax never requires it.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax

from updax import _execute
from updax._domains import Valid, fail
from updax._primitives import stateful
from updax._stage import reserve_name
from updax._update import Update

__all__ = ["from_optax", "to_optax"]


class OptaxTransformation:
    """An optax transformation held as an option: compared by identity (two transformations built alike are
    still two closures), and printed with its label and its identity."""

    __slots__ = ("transformation", "label", "extra_args")

    transformation: Any
    label: str | None
    extra_args: bool

    def __init__(self, transformation: Any, label: str | None, extra_args: bool) -> None:
        object.__setattr__(self, "transformation", transformation)
        object.__setattr__(self, "label", label)
        object.__setattr__(self, "extra_args", extra_args)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("update objects are immutable")

    def __eq__(self, other: object) -> bool:
        return (type(other) is OptaxTransformation and other.transformation is self.transformation
                and other.label == self.label)

    def __hash__(self) -> int:
        return hash((id(self.transformation), self.label))

    def __repr__(self) -> str:
        label = "" if self.label is None else f"{self.label!r} "
        return f"<optax {label}at {id(self.transformation):#x}>"


_OPTAX = "must be an optax transformation (an object with init and update functions)"


def _optax_transformation(call: str, name: str, value: Any) -> Any:
    """An optax transformation (anything with ``init`` and ``update`` functions, as optax's protocol), given or
    held (:class:`OptaxTransformation`), returned as it is; an updax object is refused. (optax itself is not
    imported: updax never requires it.)"""
    held = value.transformation if isinstance(value, OptaxTransformation) else value
    if isinstance(held, Update):
        fail(call, name, value, f"{_OPTAX}; this one is already an updax object, a pipeline as it is", TypeError)
    if not (callable(getattr(held, "init", None)) and callable(getattr(held, "update", None))):
        fail(call, name, value, _OPTAX, TypeError)
    return value


#: The domain of from_optax's option.
_TRANSFORMATION = Valid(rule=_optax_transformation, text=_OPTAX)

# The stage name is kept for from_optax's stage from import on, as the catalogue's are: no other stage (a
# snapshot named "from_optax") can take it.
reserve_name("from_optax", __name__)


def _init_from_optax(params, *, transformation):
    return transformation.transformation.init(params)


def _apply_from_optax(updates, state, params, *, transformation, **extra):
    tx = transformation.transformation
    if transformation.extra_args:
        return tx.update(updates, state, params, **extra)
    return tx.update(updates, state, params)


def _takes_extra_args(update: Any) -> bool:
    try:
        parameters = inspect.signature(update).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is p.VAR_KEYWORD for p in parameters)


def from_optax(transformation: Any, label: str | None = None) -> Update:
    """An optax transformation as one stage of an updax pipeline.

    The stage runs ``transformation.init`` and ``transformation.update``; its
    state is the transformation's state, at the path ``"from_optax"`` (a field
    of a NamedTuple state at ``"from_optax.<field>"``). Extra keywords given to
    ``update`` (``loss=``, ``value=``, ...) reach a transformation that takes
    extra arguments (an ``optax.GradientTransformationExtraArgs``, such as
    ``optax.chain`` or ``reduce_on_plateau``). The stage prints as the label
    and the transformation's identity, and equals only a stage holding the
    same transformation object with the same label. optax's closures cannot
    be pickled, so neither can the pipeline.

    Args:
        transformation: an ``optax.GradientTransformation`` (anything with
            ``init`` and ``update``). No default.
        label: how the stage prints, e.g. ``"optax.adam(1e-3)"``. Default:
            ``None``.

    Returns:
        An update object with the transformation's state.

    Example:
        >>> import jax.numpy as jnp
        >>> import optax
        >>> import updax as ux
        >>> opt = ux.clip_by_global_norm(max_norm=1.0).pipe(ux.compose, ux.from_optax(optax.sgd(0.1), "sgd"))
        >>> params = {"w": jnp.zeros(2)}
        >>> updates, state = opt.update({"w": jnp.array([3.0, 4.0])}, opt.init(params), params)
        >>> updates["w"].round(4)  # clipped to norm 1 by updax, then -0.1 times that by optax
        Array([-0.06, -0.08], dtype=float32)

    References:
        optax's ``GradientTransformation`` protocol.
        https://optax.readthedocs.io/en/latest/api/transformations.html
    """
    transformation = _TRANSFORMATION.check("from_optax", "transformation", transformation)
    if label is not None and not isinstance(label, str):  # (not an option: what the held transformation prints)
        fail("from_optax", "label", label, "must be a string or None", TypeError)
    held = OptaxTransformation(transformation, label, _takes_extra_args(transformation.update))
    return stateful(_init_from_optax, _apply_from_optax, name="from_optax", options=dict(transformation=held),
                    domains=dict(transformation=_TRANSFORMATION), static=("transformation",))


def to_optax(opt: Update) -> Any:
    """An updax object as an ``optax.GradientTransformationExtraArgs``.

    optax passes extra keywords (``loss=``, ``value=``) only to
    transformations of that type; it wraps anything else, including an updax
    object, in one that drops them. Wrap an updax object in ``to_optax`` where
    optax needs it to take extra arguments: inside ``optax.chain`` ahead of
    ``reduce_on_plateau``, for instance. Elsewhere (``optax.MultiSteps``, Flax's
    ``TrainState``) an updax object works as it is.

    Args:
        opt: an updax update object. No default.

    Returns:
        ``optax.GradientTransformationExtraArgs`` with ``opt.init`` and
        ``opt.update`` (whose updates, as a part of an optax pipeline, are
        not the ones added to the params, so no state is ordered after them:
        see ``stateful(state_last=...)``).

    Example:
        >>> import jax.numpy as jnp
        >>> import optax
        >>> import updax as ux
        >>> opt = ux.scale(-0.1).reduce_on_plateau(factor=0.5, patience=1)
        >>> tx = optax.chain(ux.to_optax(opt), optax.identity())
        >>> params = {"w": jnp.zeros(1)}
        >>> state = tx.init(params)
        >>> for _ in range(2):  # the loss sets the best on step 1, does not improve on step 2: the scale halves
        ...     updates, state = tx.update({"w": jnp.ones(1)}, state, params, loss=1.0)
        >>> updates["w"]
        Array([-0.05], dtype=float32)

    References:
        optax's ``GradientTransformationExtraArgs``.
        https://optax.readthedocs.io/en/latest/api/transformations.html
    """
    if not isinstance(opt, Update):
        raise TypeError(f"to_optax(opt={opt!r}): expected an updax update object")
    import optax  # only here: updax never requires optax

    def update(updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        if not jax.tree.leaves(state):  # None or an empty state, as optax's stateless transformations take
            fresh = opt.init(updates)
            state = fresh if not jax.tree.leaves(fresh) else state
        # Inside an optax pipeline these are not the updates added to the params: no state is ordered after them.
        with _execute.nested():
            return opt.update(updates, state, params, **extra)

    return optax.GradientTransformationExtraArgs(opt.init, update)
