"""Hints for optax spellings: an option or a name a user brings from optax, said the updax way.

An unknown keyword or attribute that optax spells otherwise gets one short
sentence naming updax's spelling; anything else keeps Python's own error.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["OPTAX_NAMES", "OPTAX_OPTIONS", "check_keywords", "missing_name"]

#: optax's option names that updax spells otherwise (Axon's names), with what to write instead.
OPTAX_OPTIONS = {
    "weight_decay": "decay",
    "weight_decay_rate": "decay",
    "weight_decay_mask": "mask",
    "adam_weight_decay": "adam_decay",
    "muon_weight_dimension_numbers": "weight_dimension_numbers",
    "max_delta": "delta",
    "seed": "key",
    "betas": "b1 and b2",
    "beta3": "b3",
    "beta": "momentum",
    "scaling": "learning_rate",
    "clip_value_fn": "clip_value",
}

#: optax's names of things updax has under another name.
OPTAX_NAMES = {
    "chain": "ux.compose",
    "named_chain": "ux.compose (stages are named already)",
    "inject_hyperparams": "ux.hyperparams_in_state",
    "multi_transform": "ux.partition",
    "MultiSteps": "ux.accumulate_gradients",
    "GradientTransformation": "ux.Update",
    "GradientTransformationExtraArgs": "ux.Update",
    "set_to_zero": "ux.scale(0.0)",
    "contrib": "ux.updates and ux.optimizers (updax keeps one namespace per kind)",
}


def check_keywords(call: str, fn: Callable[..., Any], kwargs: dict) -> None:
    """Raises a TypeError with updax's spelling for a keyword of ``kwargs`` that ``fn`` does not take and optax
    spells that way; other unknown keywords are left to Python's own error."""
    parameters = _parameters(fn)
    if parameters is None:
        return
    for key in kwargs:
        if key not in parameters and key in OPTAX_OPTIONS:
            raise TypeError(f"{call}() got an unexpected keyword argument {key!r}: optax's name; updax's is "
                            f"{OPTAX_OPTIONS[key]} ({call}({OPTAX_OPTIONS[key].split()[0]}=...))")


@functools.lru_cache(maxsize=None)
def _parameters(fn: Callable[..., Any]) -> frozenset[str] | None:
    """The names ``fn`` takes, or None when it takes ``**kwargs`` (read once per function)."""
    parameters = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters)


def missing_name(module: str, name: str) -> AttributeError:
    """The AttributeError for ``module.name``, with updax's name where optax has ``name``."""
    if name in OPTAX_NAMES:
        return AttributeError(f"module {module!r} has no attribute {name!r}: optax's name; updax's is "
                              f"{OPTAX_NAMES[name]}")
    return AttributeError(f"module {module!r} has no attribute {name!r}")
