"""L-BFGS with a line search, for deterministic (full-batch) objectives: scientific fitting, PINNs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from updax import _validate as check
from updax._typing import ScalarOrSchedule
from updax._update import Update
from updax.updates import (
    compose,
    scale,
    scale_by_backtracking_linesearch,
    scale_by_lbfgs,
    scale_by_learning_rate,
    scale_by_zoom_linesearch,
)


def lbfgs(learning_rate: ScalarOrSchedule | None = None, memory_size: int = 10, scale_init_precond: bool = True,
          linesearch: str | Update | None = "zoom", objective: Callable[..., Any] | None = None) -> Update:
    """L-BFGS: the limited-memory quasi-Newton direction, with its step chosen by a line search.

    Pipeline, as optax's ``lbfgs``: ``scale_by_lbfgs(memory_size,
    scale_init_precond) |> scale(-1.0) |> <line search>``, with
    ``scale_by_learning_rate(learning_rate)`` in place of ``scale(-1.0)`` when
    a learning rate is given (it scales the direction the line search starts
    from). The line search needs the objective: call
    ``update(grad, state, params, value=value, grad=grad, value_fn=f)``, or
    build the optimizer with ``objective=f``; :func:`updax.value_and_grad_from_state`
    reuses the value and gradient the line search computed. The learning rate
    comes first but the pipeline ends with the line search: the step it picks
    is the last word.

    Args:
        learning_rate: a number >= 0 or a schedule scaling the direction, or None
            for none (the line search picks the step). Default: ``None``.
        memory_size: the number of past steps kept, a positive integer.
            Default: ``10``.
        scale_init_precond: scale the initial inverse Hessian by
            ``<s, y>/<y, y>`` (see :func:`updax.scale_by_lbfgs`). Default: ``True``.
        linesearch: ``"zoom"`` for ``scale_by_zoom_linesearch(max_linesearch_steps=20,
            initial_guess_strategy="one")`` (optax's default), ``"backtracking"``
            for ``scale_by_backtracking_linesearch(max_backtracking_steps=20,
            store_grad=True)``, an update object of one's own, or None for no
            line search. Default: ``'zoom'``.
        objective: the objective ``f(params)``, given to the named line search
            (see :func:`updax.scale_by_zoom_linesearch`). Default: ``None``.

    Returns:
        An update object; it needs params.

    Example:
        >>> import updax as ux
        >>> print(ux.optimizers.lbfgs(memory_size=5))
        scale_by_lbfgs(memory_size=5, scale_init_precond=True) |> scale(step_size=-1.0) |> scale_by_zoom_linesearch(max_linesearch_steps=20, tol=0.0, increase_factor=2.0, slope_rtol=0.0001, curv_rtol=0.9, approx_dec_rtol=1e-06, stepsize_precision=1e-05, initial_guess_strategy='one')

    References:
        Nocedal & Wright, "Numerical Optimization", 2nd ed., 2006,
        Algorithms 7.4 and 7.5; Liu & Nocedal, "On the limited memory BFGS
        method for large scale optimization", Math. Programming 45, 1989;
        optax's ``lbfgs``.
    """
    call = "lbfgs"
    if isinstance(linesearch, Update):
        if objective is not None:
            check.fail(call, "objective", objective, "is for the named line searches; build your line search "
                       "with its own objective")
        search = linesearch
    elif linesearch == "zoom":
        search = scale_by_zoom_linesearch(max_linesearch_steps=20, initial_guess_strategy="one", objective=objective)
    elif linesearch == "backtracking":
        search = scale_by_backtracking_linesearch(max_backtracking_steps=20, store_grad=True, objective=objective)
    elif linesearch is None:
        if objective is not None:
            check.fail(call, "objective", objective, "needs a line search (linesearch=None)")
        search = Update()
    else:
        check.fail(call, "linesearch", linesearch, "must be 'zoom', 'backtracking', an update object or None",
                   TypeError if not isinstance(linesearch, str) else ValueError)
    direction = scale(-1.0) if learning_rate is None else scale_by_learning_rate(learning_rate)
    return compose(scale_by_lbfgs(memory_size=memory_size, scale_init_precond=scale_init_precond), direction, search)
