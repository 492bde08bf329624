"""The package's layers: the catalogue never reaches the backend's seam, and no two modules import each other.

Read from the source (every import statement, at module level or inside a
function), so a late import cannot hide a dependency.
"""

from __future__ import annotations

import ast
import pathlib

import updax

SRC = pathlib.Path(updax.__file__).parent


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = ("updax", *path.relative_to(SRC).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: pathlib.Path, modules: dict[str, pathlib.Path]) -> set[str]:
    """The updax modules ``path`` imports (``from updax.x import y`` counts as ``updax.x.y`` where that is a
    module, else ``updax.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "updax":
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "updax")
    return found


def test_the_catalogue_never_imports_the_backend_seam():
    modules = _modules()
    catalogue = {name: path for name, path in modules.items()
                 if name.startswith(("updax.updates", "updax.optimizers"))}
    assert len(catalogue) > 30
    reached = {name: sorted(i for i in _imports(path, modules) if i.startswith("updax._backend"))
               for name, path in catalogue.items()}
    assert {name: found for name, found in reached.items() if found} == {}


def test_the_catalogue_asks_no_backend_question():
    """No rule asks which backend it runs on or steers XLA itself: no default_backend, optimization barrier,
    second trace or prefix arithmetic helper in updates/ and optimizers/."""
    words = ("default_backend", "optimization_barrier", "make_jaxpr", "eval_jaxpr", "traced_for_cpu")
    for name, path in _modules().items():
        if name.startswith(("updax.updates", "updax.optimizers")):
            text = path.read_text()
            assert [w for w in words if w in text] == [], name


def test_no_two_modules_import_each_other():
    modules = _modules()
    graph = {name: {i for i in _imports(path, modules) if i in modules and i != name}
             for name, path in modules.items()}
    # A package's __init__ re-exports its modules: an edge from a module to its own package is an import of a
    # sibling through it, kept (updax.updates' modules import none of updax.updates' public names).
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(name: str, trail: list[str]) -> bool:
        state[name] = 1
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                cycle.extend(trail[trail.index(dep):] + [name, dep] if dep in trail else [name, dep])
                return True
            if dep not in state and visit(dep, trail + [name]):
                return True
        state[name] = 2
        return False

    for name in sorted(graph):
        if name not in state and visit(name, []):
            break
    assert cycle == []


def test_no_prefix_arithmetic_in_the_catalogue():
    """The rules are infix ``jnp`` arithmetic: the catalogue's shared helpers define no ``add``, ``mul``, ``div``,
    ... wrappers, and no rule imports one (tracing is saved once, in updax._leafwise). (``clip`` is also a
    catalogue entry, the combinator, which is not a wrapper of arithmetic.)"""
    wrappers = {"add", "sub", "mul", "div", "maximum", "minimum", "where", "sqrt", "sign", "absolute", "clip"}
    modules = _modules()
    kernels = ast.parse(modules["updax.updates._kernels"].read_text())
    assert {node.name for node in kernels.body if isinstance(node, ast.FunctionDef)} & wrappers == set()
    for name, path in modules.items():
        if name.startswith(("updax.updates", "updax.optimizers")):
            imported = {alias.name for node in ast.walk(ast.parse(path.read_text()))
                        if isinstance(node, ast.ImportFrom) and node.module == "updax.updates._kernels"
                        for alias in node.names}
            assert imported & wrappers == set(), name
