"""The switch between the generic path and the backend's hints.

Every hint in :mod:`updax._backend` asks :func:`hinted` before it changes a
trace: the hints apply to a step traced under ``jax.jit`` with the CPU as
the default backend (the only backend they were measured on), unless
switched off. Switched off, every step is traced in its generic form: the
catalogue's rules as written, XLA's own schedule. The numbers are the same
either way (``tests/test_held_numbers.py`` runs the whole registry both
ways); the compiled program differs in its copies and temporaries.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator
from typing import Any

import jax

__all__ = ["backend_hints", "enabled", "hinted"]

def _from_environment() -> bool:
    """``UPDAX_BACKEND_HINTS``: ``0`` switches the hints off for the process, ``1`` (or unset) leaves them on;
    anything else is refused by name rather than read as one or the other."""
    value = os.environ.get("UPDAX_BACKEND_HINTS", "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"UPDAX_BACKEND_HINTS={value!r}: must be 0 (the generic path) or 1 (the hints, the default)")
    return value == "1"


#: Whether the hints are on (:func:`backend_hints` switches them for a block, the environment for the process).
_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar("updax_backend_hints", default=_from_environment())


@contextlib.contextmanager
def backend_hints(enabled: bool = True) -> Iterator[None]:
    """Switches the backend's hints on or off for the steps traced inside (the generic path is ``False``).

    updax steers XLA:CPU's schedule and buffer reuse where a rule would make
    it copy the state on every step (see docs/performance-xla.md, "The state
    in place"). The hints change no number; off, each step is traced as the
    catalogue writes it and compiled as XLA schedules it, as on any other
    backend. The environment variable ``UPDAX_BACKEND_HINTS=0`` switches
    them off for a whole process. The switch is read while a step is traced:
    a function ``jax.jit`` traced already keeps the program it compiled.

    Args:
        enabled: whether the hints apply inside the block. Default: ``True``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import updax as ux
        >>> opt = ux.optimizers.lion(1e-3)
        >>> params = {"w": jnp.ones(3)}
        >>> step = lambda s: opt.update({"w": jnp.ones(3)}, s, params)[0]
        >>> with ux.backend_hints(False):
        ...     generic = jax.jit(step)(opt.init(params))
        >>> bool((generic["w"] == jax.jit(step)(opt.init(params))["w"]).all())
        True
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"backend_hints(enabled={enabled!r}): enabled must be True or False")
    token = _ENABLED.set(enabled)
    try:
        yield
    finally:
        _ENABLED.reset(token)


def enabled() -> bool:
    """Whether the hints are switched on (whatever the backend: a hint measured on every backend asks this)."""
    return _ENABLED.get()


def hinted(tree: Any) -> bool:
    """Whether the hints apply to a step that reads ``tree``: switched on, and ``tree`` traced (under
    ``jax.jit``) with the CPU as the default backend. Eagerly there is no schedule to steer."""
    return (_ENABLED.get() and jax.default_backend() == "cpu"
            and any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree)))
