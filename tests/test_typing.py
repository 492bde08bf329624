"""The public API is typed: ``py.typed`` ships, every public callable is annotated, the fluent methods are
declared in a stub kept in sync with the registry, and a type checker sees them."""

from __future__ import annotations

import ast
import inspect
import pathlib
import subprocess
import sys
import tomllib

import pytest

import stubgen
import updax as ux

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_stub_is_what_stubgen_writes():
    """After adding a combinator, run ``python tests/stubgen.py``."""
    assert stubgen.STUB.read_text() == stubgen.render()


def test_the_stub_declares_a_method_for_every_catalogue_combinator():
    tree = ast.parse(stubgen.STUB.read_text())
    (update,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Update"]
    methods = {node.name for node in update.body if isinstance(node, ast.FunctionDef)}
    combinators = {name for name in ux.updates.__all__ if hasattr(ux.Update, name)}
    assert combinators <= methods
    assert {"accumulate_gradients", "scale_by_adam", "identity", "stateless", "stateful"} <= methods


def test_every_name_in_the_stub_s_annotations_is_imported():
    tree = ast.parse(stubgen.STUB.read_text())
    imported = {alias.asname or alias.name for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names} | {"Update", "None", "tuple", "str", "bool", "int", "float", "object",
                                            "dict", "list", "type"}
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            used |= {n.id for n in ast.walk(node.annotation) if isinstance(n, ast.Name)}
        if isinstance(node, ast.FunctionDef) and node.returns is not None:
            used |= {n.id for n in ast.walk(node.returns) if isinstance(n, ast.Name)}
    assert used - imported == set()


def test_py_typed_and_the_stub_ship_with_the_package():
    package = ROOT / "src" / "updax"
    assert (package / "py.typed").exists() and (package / "_update.pyi").exists()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["updax"]
    assert {"py.typed", "*.pyi"} <= set(data)


def _public_callables():
    """(label, function) for every public function, method and class constructor of the API."""
    seen = []
    for module in (ux, ux.updates, ux.optimizers, ux.schedules):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if not str(getattr(member, "__module__", "updax")).startswith("updax"):
                        continue  # a fluent method that a user's combinator attached
                    if inspect.isfunction(member) and (not attr.startswith("_") or attr in ("__init__", "__call__")):
                        seen.append((f"{module.__name__}.{name}.{attr}", member))
            elif callable(obj):
                seen.append((f"{module.__name__}.{name}", inspect.unwrap(obj)))
    return seen


@pytest.mark.parametrize("label, fn", _public_callables(), ids=[label for label, _ in _public_callables()])
def test_every_public_callable_is_annotated(label, fn):
    signature = inspect.signature(fn)
    missing = [p.name for p in signature.parameters.values() if p.name != "self" and p.annotation is p.empty]
    assert not missing, f"{label}: parameters without annotations: {missing}"
    assert signature.return_annotation is not signature.empty, f"{label}: no return annotation"


USAGE = '''
import jax.numpy as jnp
import updax as ux
import updax.schedules as uxs

opt = ux.scale_by_adam(b1=0.9).clip_by_global_norm(max_norm=1.0).scale(uxs.cosine_decay(-1e-3, decay_steps=10))
reveal_type(opt.apply_if_finite())
reveal_type(ux.scale(opt, 0.1))
reveal_type(ux.optimizers.adamw(1e-3, decay=1e-2).accumulate_gradients(4))
params = {"w": jnp.zeros(3)}
updates, state = opt.update(params, opt.init(params), params)
opt.scale_by_adamm()
ux.scale_by_adam(b1="high")
'''


def test_a_type_checker_sees_the_fluent_methods_and_flags_mistakes(tmp_path):
    script = tmp_path / "use.py"
    script.write_text(USAGE)
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
                           "--hide-error-context", "--no-error-summary", script.name],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    lines = [line.split(":", 2)[1:] for line in done.stdout.splitlines() if line.startswith(script.name + ":")]
    found = {(int(number), text.strip()) for number, text in lines}
    revealed = {number for number, text in found if text.startswith("note: Revealed type")}
    assert revealed == {7, 8, 9}, done.stdout
    assert all('"updax._update.Update"' in text for number, text in found if number in revealed), done.stdout
    errors = {number: text for number, text in found if text.startswith("error")}
    assert set(errors) == {12, 13}, done.stdout
    assert '"Update" has no attribute "scale_by_adamm"' in errors[12]
    assert 'No overload variant of "__call__" of "Combinator" matches argument type "str"' in errors[13]
