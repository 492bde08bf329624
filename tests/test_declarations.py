"""Every option's rules are declared once, beside the stage's other declarations, and enforced on every path.

The catalogue and the optimizers declare a domain for every option of every stage (tests/registry.py builds
each entry, ``updax.optimizers`` each optimizer at its defaults); a stored value checks again to itself, so
that any path may check it; and each path a value enters by (the constructor, ``replace_state`` for held
hyperparameters and state fields, ``hyperparams_in_state``, a tree map, the eager step, ``checked`` under
``jax.jit``, a schedule's or a user callable's value) refuses what the declaration refuses, with one message.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import updax as ux
from registry import ENTRIES
from updax._stage import Stage

O = ux.optimizers


def _stages(opt):
    """The stages of ``opt`` and of every pipeline its options hold, depth first."""
    for stage in opt.stages:
        yield stage
        for _, (_, inner) in stage.nested().items():
            yield from _stages(inner)


def _optimizer(name):
    fn = getattr(O, name)
    required = [p for p in inspect.signature(fn).parameters.values()
                if p.default is inspect.Parameter.empty and p.kind is not p.VAR_KEYWORD]
    args = [0.1] * len(required)  # (a learning rate, where one has no default)
    if name == "lbfgs":
        args = []
    return fn(*args)


BUILT = {**{name: build for name, build in ENTRIES.items()},
         **{f"optimizers.{name}": (lambda name=name: _optimizer(name)) for name in O.__all__}}


@pytest.mark.parametrize("name", sorted(BUILT))
def test_every_option_of_every_stage_has_a_domain(name):
    for stage in _stages(BUILT[name]()):
        declared = {key for key, _ in stage.declaration.domains}
        missing = sorted({key for key, _ in stage.options} - declared)
        assert not missing, f"{name}: {stage.label} declares no domain for {missing}"


@pytest.mark.parametrize("name", sorted(BUILT))
def test_a_stored_option_checks_again_to_itself(name):
    """A path that checks a value again (a stage rebuilt with one option replaced) keeps every stored value."""
    for stage in _stages(BUILT[name]()):
        for key, value in stage.options:
            domain = stage.declaration.domain(key)
            again = domain.check(stage.label, key, stage.option(key), schedulable=key in stage.schedulable)
            rebuilt = Stage(stage.name, stage.init_fn, stage.apply_fn, {**dict(stage.options), key: again},
                            needs_params=stage.needs_params, wraps=stage.wraps, static=stage.static,
                            schedulable=stage.schedulable, per_example=stage.per_example,
                            elementwise=stage.elementwise, state_last=stage.state_last,
                            domains=dict(stage.declaration.domains), relations=stage.declaration.relations)
            assert rebuilt == stage, f"{name}: {stage.label}.{key}={value!r} does not check again to itself"
