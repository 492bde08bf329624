"""Domains: what an option or a state field may hold, declared once where a stage is defined.

A stage declares its options' domains beside its other declarations, and
updax checks every value against them wherever it enters: when the object is
built, when ``replace_state`` writes a held hyperparameter or a state field,
on every eager step (held values, a schedule's values), on an object rebuilt
by a tree map, and under ``jax.jit`` through :func:`updax.checked`. The
message is always ``call(option=value): option must ...``.

>>> import jax, jax.numpy as jnp
>>> import updax as ux
>>> from updax.domains import UNIT
>>> def scale_by_sign_momentum_kernel(updates, params, *, decay):
...     return jax.tree.map(lambda g: decay * g, updates)
>>> opt = ux.stateless(scale_by_sign_momentum_kernel, name="decayed", options={"decay": 1.5},
...                    domains={"decay": UNIT})
Traceback (most recent call last):
...
ValueError: decayed(decay=1.5): decay must be in [0, 1)

A state NamedTuple declares what a field holds with an annotation: a field
annotated ``Count`` refuses a negative or fractional step count in
``replace_state``; every field refuses what its dtype cannot hold. A field
annotated ``MomentField`` (first moments) or ``SecondMomentField`` (second
moments, never negative) may be stored in 8 or 4 bits by
:func:`updax.quantized_state`; any other field never is.
"""

from updax._domains import (
    ANY_REAL,
    COUNT,
    LEARNING_RATE,
    NON_NEGATIVE,
    POSITIVE,
    UNIT,
    Count,
    Domain,
    Flag,
    FlagField,
    FloatDtype,
    Function,
    Integer,
    MomentField,
    NonNegativeField,
    OneOf,
    Pipeline,
    Pipelines,
    Quantizable,
    Real,
    Relation,
    SecondMomentField,
    Unchecked,
    Valid,
)
from updax._masks import Labels, Mask

__all__ = ["ANY_REAL", "COUNT", "Count", "Domain", "Flag", "FlagField", "FloatDtype", "Function", "Integer",
           "LEARNING_RATE", "Labels", "Mask", "MomentField", "NON_NEGATIVE", "NonNegativeField", "OneOf", "POSITIVE",
           "Pipeline", "Pipelines", "Quantizable", "Real", "Relation", "SecondMomentField", "UNIT", "Unchecked", "Valid"]
