"""Hyperparameters in the state: changed by path, without recompiling, by frameworks that hold the optimizer
as a static value."""

from __future__ import annotations

from updax._update import Update

__all__ = ["hyperparams_in_state"]


def hyperparams_in_state(opt: Update) -> Update:
    """Keeps every stage's numeric hyperparameters in the state, to change them without recompiling.

    Frameworks that hold the optimizer as a static value (Flax NNX's
    ``Optimizer``, Linen's ``TrainState``, ``equinox.filter_jit`` with Python
    floats) compile a new step for every new hyperparameter of an ordinary
    update object. With this, every number option of every stage (of
    wrapped pipelines and partition groups too) is stored in the state at
    ``init`` and read from it by ``update``: read and write it by path
    (``opt.get_state(state, "scale_by_learning_rate.learning_rate")``,
    ``opt.replace_state(state, ..., 3e-4)``), and it is saved with the state
    in checkpoints. A scheduled option stays a schedule (part of the
    object); the value it took on the last step is in the state, readable by
    the same path. The object's own numbers are only the starting values.

    Args:
        opt: an update object. No default.

    Returns:
        The same pipeline, printed inside ``hyperparams_in_state(...)``; each
        stage holding a number keeps a ``ScheduledState`` whose
        ``hyperparams`` hold them.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.hyperparams_in_state(ux.optimizers.sgd(0.1))
        >>> opt
        hyperparams_in_state(scale_by_learning_rate(learning_rate=0.1))
        >>> params = {"w": jnp.ones(2)}
        >>> state = opt.init(params)
        >>> step = jax.jit(opt.update)  # the object is static here, as in a framework
        >>> u, state = step({"w": jnp.ones(2)}, state, params)
        >>> state = opt.replace_state(state, "scale_by_learning_rate.learning_rate", 0.01)
        >>> u, state = step({"w": jnp.ones(2)}, state, params)  # no new compilation
        >>> u["w"]
        Array([-0.01, -0.01], dtype=float32)
    """
    if not isinstance(opt, Update):
        raise TypeError(f"hyperparams_in_state(opt={opt!r}): expected an update object")
    return Update(stage._holding(hyperparams_in_state) for stage in opt.stages)
