"""updax: composable gradient transformations for JAX, after Elixir Axon's Axon.Updates.

An optimizer is a pipeline of stages, written as a fluent chain and printed as
the pipeline it is. Clip the gradients' global norm to 1, scale them by Adam's
moment ratio, then take a step of 1e-3 against them:

>>> import updax as ux
>>> print(ux.clip_by_global_norm(max_norm=1.0).scale_by_adam().scale(-1e-3))
clip_by_global_norm(max_norm=1.0) |> scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=1e-15) |> scale(step_size=-0.001)

The ready-made optimizers are such pipelines, with a positive learning rate:

>>> ux.optimizers.adam(1e-3) == ux.scale_by_adam().scale_by_learning_rate(1e-3)
True
"""

from updax import domains, microbatching, optimizers, projections, schedules, sharding, updates
from updax._stage import EmptyState, ScheduledState, Stage
from updax._held import checked, hyperparams_in_state
from updax._update import Update
from updax.interop import from_optax, to_optax
from updax.updates import *  # noqa: F403  (the catalogue is also reachable as updax.<name>)
from updax.updates import __all__ as _catalogue
from updax._backend import _lamb, _paths  # noqa: F401  (register the backend's hinted paths, by stage name)
from updax._backend._switch import backend_hints

__version__ = "0.1.0.dev0"

__all__ = ["EmptyState", "ScheduledState", "Stage", "Update", "backend_hints", "checked", "domains", "from_optax", "hyperparams_in_state", "microbatching", "optimizers", "projections", "schedules", "sharding", "to_optax", "updates", *_catalogue]


def __getattr__(name: str):
    """optax's names of what updax spells otherwise (``ux.chain`` is ``ux.compose``) say so."""
    from updax._hints import missing_name

    raise missing_name(__name__, name)
