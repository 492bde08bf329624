"""Update objects: immutable pipelines of stages that print as what they compute.

The fluent methods (``opt.scale_by_adam(...)``) are attached to
:class:`Update` by :func:`updax.combinator` when each combinator is
registered; ``_update.pyi`` declares them for IDEs and type checkers (a test
keeps it in sync with the registry).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax

from updax import _domains, _execute, _paths
from updax._stage import Stage

__all__ = ["Update"]


def _absorb(stages: tuple[Stage, ...]) -> tuple[Stage, ...]:
    """Each wrapper stage that wraps an empty pipeline and has stages before it wraps those stages.

    So ``compose(a, b, wrapper())`` is ``wrapper(compose(a, b))``: the same
    object as ``a.b().wrapper()``, and a pipeline has one printed form.
    """
    out: list[Stage] = []
    for stage in stages:
        if stage.wraps is not None and out and not stage.option(stage.wraps).stages:
            stage = stage._with_option(stage.wraps, Update(out))
            out = []
        out.append(stage)
    return tuple(out)


class Update:
    """An update object: an immutable pipeline of stages.

    Build one with the catalogue (``ux.scale_by_adam().scale(-1e-3)``) or the
    primitives :func:`updax.stateless` / :func:`updax.stateful`. It has
    ``init(params)`` and ``update(updates, state, params=None)``, unpacks into
    ``(init_fn, update_fn)`` like Axon's tuple, prints in pipe notation, and is
    a pytree whose numeric hyperparameters are leaves.

    Its printed form is its identity: two update objects that print the same
    are equal (``==``, same hash) and compute the same numbers, and two that
    compute differently print differently. A wrapper stage that wraps
    everything before it prints after it (``a |> b |> apply_if_finite()``);
    one that wraps only part of a pipeline shows what it wraps in its
    parentheses (``a |> apply_if_finite(b)``).

    Example:
        >>> import jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.scale_by_adam().scale(-1e-3)
        >>> opt
        scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=1e-15) |> scale(step_size=-0.001)
        >>> params = {"w": jnp.ones(2)}
        >>> state = opt.init(params)
        >>> updates, state = opt.update({"w": jnp.array([1.0, -1.0])}, state, params)
        >>> updates["w"]
        Array([-0.001,  0.001], dtype=float32)
        >>> opt.get_state(state, "scale_by_adam.count")
        Array(1, dtype=int32)
    """

    __slots__ = ("stages", "_state_shapes")

    stages: tuple[Stage, ...]
    _state_shapes: dict[Any, Any]  # the shapes init() gives, by the params' structure, shapes and dtypes

    def __init__(self, stages: Iterable[Stage] = ()) -> None:
        """The pipeline of ``stages``; a wrapper stage with nothing to wrap wraps the stages before it."""
        stages = tuple(stages)
        for stage in stages:
            if not isinstance(stage, Stage):
                raise TypeError(f"Update(stages=...): expected Stage objects, got {stage!r}")
        object.__setattr__(self, "stages", _absorb(stages))
        object.__setattr__(self, "_state_shapes", {})

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("update objects are immutable")

    # --- the optax-compatible interface -------------------------------------

    def init(self, params: Any) -> tuple[Any, ...]:
        """Returns the initial state: a tuple with one entry per stage, in pipeline order."""
        return _execute.init(self, params)

    def update(self, updates: Any, state: Any, params: Any = None, **extra: Any) -> tuple[Any, tuple[Any, ...]]:
        """Transforms ``updates``; returns ``(updates, new_state)``.

        Extra keyword arguments (e.g. ``loss=``) reach the stages whose kernels
        name them and are ignored by the others.
        """
        return _execute.step(self, updates, state, params, extra)

    def __iter__(self) -> Iterator[Callable[..., Any]]:
        """Yields ``init`` and ``update``: ``init_fn, update_fn = opt`` works like Axon's tuple."""
        yield self.init
        yield self.update

    def pipe(self, fn: Callable[..., Update], *args: Any, **kwargs: Any) -> Update:
        """``fn(self, *args, **kwargs)``: pipes this object into any combinator."""
        return fn(self, *args, **kwargs)

    # --- reading and replacing state by name --------------------------------

    def get_state(self, state: Any, path: str) -> Any:
        """Reads a stage's state, one field of it, or one of its options, by name.

        ``path`` is a stage name (``"scale_by_adam"``), optionally with a field
        (``"scale_by_adam.count"``). ``"trace[1]"`` picks the second of two
        stages of the same kind; ``"accumulate_gradients/scale_by_adam.mu"``
        reaches into the pipeline a wrapper stage runs. An option name
        (``"scale_by_learning_rate.learning_rate"``) gives the value used on
        the last step: from the state when it is scheduled, else the option.
        """
        return _paths.get_state(self, state, path)

    def replace_state(self, state: Any, path: str, value: Any) -> Any:
        """Returns ``state`` with the stage state or field at ``path`` replaced.

        The new value keeps the old one's tree structure, shapes and dtypes (a
        Python number becomes an array of the old dtype), so a jitted step does
        not recompile. See :meth:`get_state` for paths. Options are not state:
        build the object with a new value instead (passed into a jitted step
        as an argument, that does not recompile either).
        """
        return _paths.replace_state(self, state, path, value)

    # --- value semantics ---------------------------------------------------

    def __eq__(self, other: object) -> bool:
        """Equal stages with equal options: exactly when the printed forms are the same."""
        return type(other) is Update and self.stages == other.stages

    def __hash__(self) -> int:
        """A hash consistent with ``==``."""
        return hash(("Update", self.stages))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Update, (self.stages,))

    def __repr__(self) -> str:
        """The pipeline in pipe notation, its identity (see the class docstring).

        Stages whose hyperparameters live in the state (:func:`updax.hyperparams_in_state`) print inside
        ``hyperparams_in_state(...)``: each run of them, with the stages after them that hold no number. Stages
        checked under ``jax.jit`` (:func:`updax.checked`) print inside ``checked(...)``, each run of them.
        """
        if not self.stages:
            return "identity()"
        parts: list[str] = []
        start = 0
        for end in range(1, len(self.stages) + 1):
            if end == len(self.stages) or self.stages[end].checked != self.stages[start].checked:
                text = _held_runs(self.stages, start, end)
                parts.append(f"checked({text})" if self.stages[start].checked else text)
                start = end
        return " |> ".join(parts)

    def hyperparams_in_state(self) -> Update:
        """This pipeline with its numeric hyperparameters kept in the state (see
        :func:`updax.hyperparams_in_state`)."""
        return Update(stage._holding(Update.hyperparams_in_state) for stage in self.stages)

    def checked(self) -> Update:
        """This pipeline with its traced values checked under ``jax.jit`` (see :func:`updax.checked`)."""
        return Update(stage._checking(Update.checked) for stage in self.stages)


def _held_runs(stages: tuple[Stage, ...], start: int, end: int) -> str:
    """``stages[start:end]`` in pipe notation, each run of held stages inside ``hyperparams_in_state(...)``."""
    parts: list[str] = []
    run: list[str] | None = None  # the held run being printed
    for i in range(start, end):
        stage = stages[i]
        if i == 0 and stage.wraps is not None and stage.option(stage.wraps).stages:
            # A leading wrapper wraps everything before it: that prints first.
            parts.append(repr(stage.option(stage.wraps)))
            text = stage._arguments(with_wrapped=False)
        else:
            text = repr(stage)
        if stage.held or (run is not None and not stage.holdable()):
            run = [] if run is None else run
            run.append(text)
            continue
        if run is not None:
            parts.append(f"hyperparams_in_state({' |> '.join(run)})")
            run = None
        parts.append(text)
    if run is not None:
        parts.append(f"hyperparams_in_state({' |> '.join(run)})")
    return " |> ".join(parts)


jax.tree_util.register_pytree_with_keys(
    Update,
    lambda u: ([(jax.tree_util.SequenceKey(i), s) for i, s in enumerate(u.stages)], None),
    lambda _, stages: Update(stages),
)
_domains.PIPELINE_TYPES.append(Update)  # (the Pipeline domain's type: _domains cannot import this module)
