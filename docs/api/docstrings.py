"""A griffe extension (mkdocs.yml loads it) that adapts updax's docstrings to the API reference.

The docstrings are written for ``help()`` and doctest: Google style with a
little reStructuredText. Before mkdocstrings parses them, this rewrites

- an ``Example:`` section as ``Examples:``, the name griffe knows, so its
  ``>>>`` lines render as code;
- a doctest block outside any section (a module docstring's) as a fenced
  ``pycon`` block;
- a role (``:func:`name```) as a cross-reference to what ``name`` means where
  it is written, else at the top of updax; as ``name`` in code if neither;
- ``::`` ending a line, before a literal block, as ``:``;
- a ``Returns:`` paragraph wrapped over several lines as one item: griffe's
  Google parser reads each line at the item's indentation as a new return
  value, which split a state's name over two table rows.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:$", re.M)
_DOCTEST = re.compile(r"^>>> .*(?:\n(?!\s*$).*)*", re.M)  # at column 0, so not in a section
_ROLE = re.compile(r":(?:func|class|meth|attr|mod|data|obj):`~?([\w.]+)`")
_LITERAL = re.compile(r"::$", re.M)
_RETURNS = re.compile(r"^(\s*)Returns:\n(\s+)(.*)\n((?:\2\S.*\n?)*)", re.M)


class UpdaxDocstrings(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.docstring is not None:
                text = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
                text = _DOCTEST.sub(lambda m: f"```pycon\n{m.group(0)}\n```", text)
                text = _ROLE.sub(lambda m: _reference(m.group(1), obj, loader), text)
                text = _RETURNS.sub(_one_return, text)
                obj.docstring.value = _LITERAL.sub(":", text)


def _one_return(match: re.Match) -> str:
    head, indent, first, rest = match.groups()
    continued = "".join(f"{indent}    {line[len(indent):]}\n" for line in rest.splitlines())
    return f"{head}Returns:\n{indent}{first}\n{continued}"


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)


def _reference(name: str, scope: griffe.Object, loader: griffe.GriffeLoader) -> str:
    head, dot, rest = name.partition(".")
    candidates = [name, f"updax.{name}"]
    try:
        candidates.insert(0, scope.resolve(head) + dot + rest)
    except griffe.NameResolutionError:
        pass
    for path in candidates:
        try:
            loader.modules_collection[path]
        except KeyError:
            continue
        return f"[`{name}`][{path}]"
    return f"`{name}`"
