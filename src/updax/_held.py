"""Hyperparameters in the state (changed by path, without recompiling, by frameworks that hold the optimizer as
a static value), and the checked step that refuses a bad one under ``jax.jit``."""

from __future__ import annotations

from updax._update import Update

__all__ = ["checked", "hyperparams_in_state"]


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
    An option ``init`` reads (an initial accumulator, DoG's first distance,
    Prodigy's ``estim_lr0``) is spent making the state and stays a constant:
    change it by building a new object and state.

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
    return opt.hyperparams_in_state()


def checked(opt: Update) -> Update:
    """Checks the values a jitted step reads against their declared domains, through ``checkify``.

    Outside ``jax.jit`` every value that enters a pipeline is checked in
    Python: options when the object is built (or first used, after a tree
    map), held hyperparameters on every eager ``update``, a schedule's values
    when they are concrete. Under ``jax.jit`` those values are traced and
    cannot raise: a held learning rate written by a framework (an NNX
    variable set in place), a hyperparameter passed into the step, a
    schedule's value. A checked pipeline adds a ``checkify.check`` for each of
    them to the step, with the message an eager step raises. Run the step
    under ``checkify.checkify`` and call ``err.throw()``: it raises
    ``checkify.JaxRuntimeError`` naming the call, the option and the value.
    Without ``checkify.checkify`` around it, a jitted checked step does not
    trace (JAX asks for it). The numbers are the same as unchecked.

    Args:
        opt: an update object. No default.

    Returns:
        The same pipeline, printed inside ``checked(...)``, its wrapped
        pipelines and groups checked too.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from jax.experimental import checkify
        >>> import updax as ux
        >>> opt = ux.checked(ux.hyperparams_in_state(ux.optimizers.sgd(0.1)))
        >>> opt
        checked(hyperparams_in_state(scale_by_learning_rate(learning_rate=0.1)))
        >>> params = {"w": jnp.ones(2)}
        >>> state = opt.replace_state(opt.init(params), "scale_by_learning_rate.learning_rate", 0.5)
        >>> step = checkify.checkify(jax.jit(opt.update))
        >>> err, (u, state) = step({"w": jnp.ones(2)}, state, params)
        >>> err.throw()  # nothing to report
        >>> bad = jax.tree.map(lambda x: x, state)  # a framework writes a bad value in place:
        >>> bad[0].hyperparams["learning_rate"] = jnp.float32(-1.0)
        >>> err, _ = step({"w": jnp.ones(2)}, bad, params)
        >>> err.throw()
        Traceback (most recent call last):
        ...
        jax._src.checkify.JaxRuntimeError: scale_by_learning_rate(learning_rate=-1.0): learning_rate must be in [0, inf); the step's sign is the optimizer's: for gradient ascent pass maximize=True (held in the state) (`check` failed)
    """
    if not isinstance(opt, Update):
        raise TypeError(f"checked(opt={opt!r}): expected an update object")
    return opt.checked()
