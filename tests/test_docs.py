"""Docstrings follow one template, and the documented defaults are the signature's.

One check for every public function with options: the catalogue, the
primitives, the optimizers and the schedules.
"""

from __future__ import annotations

import ast
import inspect
import re

import pytest

import updax as ux
from registry import catalogue_names

PUBLIC = catalogue_names() + ["stateless", "stateful", "hyperparams_in_state", "checked"]
DOCUMENTED = ([(ux, name) for name in PUBLIC] + [(ux.optimizers, name) for name in ux.optimizers.__all__]
              + [(ux.schedules, name) for name in ux.schedules.__all__ if name != "Schedule"]
              + [(ux.sharding, name) for name in ux.sharding.__all__]
              + [(ux.interop, name) for name in ux.interop.__all__]
              + [(ux.microbatching, name) for name in ux.microbatching.__all__
                 if name not in ("Accumulator", "AccumulationType", "MicroGradAux")])


def _args_section(doc):
    match = re.search(r"\n\s*Args:\n(.*?)\n\s*(?:Returns|Example):", doc, re.S)
    if not match:
        return {}
    entries, current = {}, None
    for line in match.group(1).splitlines():
        head = re.match(r"^ {4}(\w+): (.*)$", line)
        if head:
            current = head.group(1)
            entries[current] = head.group(2)
        elif current:
            entries[current] += " " + line.strip()
    return entries


@pytest.mark.parametrize("module, name", DOCUMENTED, ids=[f"{m.__name__}.{n}" for m, n in DOCUMENTED])
def test_docstring_has_the_template_sections(module, name):
    doc = inspect.getdoc(getattr(module, name))
    summary = doc.splitlines()[0]
    assert summary.endswith(".") and len(summary) < 100
    primitive = module is ux and name not in catalogue_names()
    sections = ["Returns:", "Example:"] + ([] if primitive else ["References:"])
    positions = [doc.index(s) for s in sections]
    assert positions == sorted(positions)
    assert ">>> " in doc


@pytest.mark.parametrize("module, name", DOCUMENTED, ids=[f"{m.__name__}.{n}" for m, n in DOCUMENTED])
def test_documented_defaults_equal_the_signature(module, name):
    fn = getattr(module, name)
    documented = _args_section(inspect.getdoc(fn))
    parameters = [p for p in inspect.signature(fn).parameters.values() if p.name != "inner"]
    assert sorted(documented) == sorted(p.name for p in parameters)
    for p in parameters:
        text = documented[p.name]
        if p.default is inspect.Parameter.empty:
            assert "No default." in text, (name, p.name)
        else:
            found = re.search(r"Default: ``(.+?)``", text)
            assert found, (name, p.name, text)
            assert ast.literal_eval(found.group(1)) == p.default, (name, p.name)


def test_axon_defaults_are_the_ones_documented_in_the_design():
    sig = {n: {k: v.default for k, v in inspect.signature(getattr(ux, n)).parameters.items()} for n in PUBLIC}
    assert sig["scale_by_adam"] == dict(b1=0.9, b2=0.999, eps=1e-8, eps_root=1e-15, mu_dtype=None, nu_dtype=None,
                                        nesterov=False)
    assert sig["clip"] == dict(delta=2.0)
    assert sig["clip_by_global_norm"] == dict(max_norm=1.0)
    assert sig["trace"] == dict(decay=0.9, nesterov=False, accumulator_dtype=None)
    assert sig["add_decayed_weights"] == dict(decay=0.0, mask=None, cautious=False)
    assert sig["scale_by_trust_ratio"] == dict(min_norm=0.0, trust_coefficient=1.0, eps=0.0, mask=None)
    assert {k: sig["add_noise"][k] for k in ("eta", "gamma")} == dict(eta=0.01, gamma=0.55)
