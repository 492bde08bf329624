"""A mkdocs hook (mkdocs.yml loads it) that ties the guide pages to the API reference.

Two jobs, both done when the site is built, so no page lists a name twice:

- **Families.** A reference page holding ``<!-- families: updax.updates from catalogue.md -->`` gets one
  section per ``##`` section of that page, in its order, with the module's public names the section lists (a
  table's first column, a heading, a list item's first code), each rendered by mkdocstrings. A public name
  that page lists nowhere stops the build: every name has a family.
- **Links.** In every other page, inline code that is a public name (``scale_by_adam``,
  ``ux.optimizers.adam(1e-3)``, ``updax.schedules.constant``, ``Update``) becomes a link to its entry. The
  link is an autorefs reference: a name the reference does not document fails the strict build. Code blocks,
  headings and code already inside a link are left alone.
"""

from __future__ import annotations

import importlib
import inspect
import re
from functools import cache

#: The documented modules, in the order a bare name is looked up (no two of them share a public name).
MODULES = ["updax.updates", "updax.optimizers", "updax.schedules", "updax.domains", "updax.projections",
           "updax.microbatching", "updax.sharding", "updax.interop"]

_FAMILIES = re.compile(r"^<!-- families: ([\w.]+) from ([\w./-]+) -->$", re.M)
_FENCE = re.compile(r"^(\s*)(```|~~~).*?^\1\2[ \t]*$", re.M | re.S)
#: Inline code not already inside a link's text: ``[`x`](...)`` / ``[`x`][...]`` are left alone.
_CODE = re.compile(r"(?<!\[)`([^`\n]+)`(?!\])")
_NAME_IN_CODE = re.compile(r"^(?:(?:ux|updax)\.)?"
                           r"(?:(updates|optimizers|schedules|domains|projections|microbatching|sharding|interop)\.)?"
                           r"([A-Za-z_]\w*)(\(.*\))?$")


@cache
def public_names() -> dict[str, str]:
    """{name: the anchor of its entry}, for every name the reference documents."""
    anchors = {}
    for module in MODULES:
        anchors |= {name: f"{module}.{name}" for name in importlib.import_module(module).__all__}
    updax = importlib.import_module("updax")  # its own names; the rest of its __all__ re-exports the modules
    return {name: f"updax.{name}" for name in updax.__all__
            if name not in anchors and not inspect.ismodule(getattr(updax, name))} | anchors


def _family_sections(module: str, source: str, source_name: str) -> str:
    names = list(importlib.import_module(module).__all__)
    parts = [part.partition("\n")[::2] for part in re.split(r"^## ", source, flags=re.M)[1:]]
    sections, placed = [], set()
    for title, body in parts:  # the names a section lists: a table's first column, its headings, list items
        listed = re.findall(r"^(?:\|\s*`|###\s+`?|- `)([A-Za-z_]\w*)", body, re.M)
        members = [n for n in dict.fromkeys(listed) if n in names and n not in placed]
        placed.update(members)
        sections.append((title.strip(), members))
    sections = [(title, members) for title, members in sections if members]
    rest = [n for n in names if n not in placed]
    if rest:
        raise ValueError(f"{source_name} lists no {rest} of {module} (in a table's first column, a heading or a "
                         f"list item's first code): the reference would not know their family")
    return "\n\n".join(f"## {title}\n\n" + "\n\n".join(f"::: {module}.{n}\n    options:\n      heading_level: 3"
                                                        for n in members)
                       for title, members in sections)


def _link(match: re.Match) -> str:
    code = match.group(1)
    name = _NAME_IN_CODE.match(code)
    if not name or (name.group(3) and _closing(code, code.index("(")) != len(code) - 1):
        return match.group(0)  # not a name, or a call followed by more (``adam(1e-3).init(params)``)
    module, bare = name.group(1), name.group(2)
    anchor = public_names().get(bare)
    if anchor is None or (module and not anchor.startswith(f"updax.{module}.")):
        return match.group(0)
    return f"[`{code}`][{anchor}]"


def _closing(text: str, opening: int) -> int:
    """The index of the bracket that closes ``text[opening]``, or -1."""
    depth = 0
    for i, char in enumerate(text[opening:], opening):
        depth += (char in "([{") - (char in ")]}")
        if depth == 0:
            return i
    return -1


def link_names(markdown: str) -> str:
    """``markdown`` with each inline-code public name linked to its entry (code blocks and headings untouched)."""
    out, last = [], 0
    for fence in _FENCE.finditer(markdown):
        out.append(_link_prose(markdown[last:fence.start()]))
        out.append(fence.group(0))
        last = fence.end()
    out.append(_link_prose(markdown[last:]))
    return "".join(out)


def _link_prose(text: str) -> str:
    return "\n".join(line if line.lstrip().startswith("#") else _CODE.sub(_link, line) for line in text.split("\n"))


def on_page_markdown(markdown: str, page, config, **kwargs) -> str:
    families = _FAMILIES.search(markdown)
    if families:
        source = (page.file.abs_src_path.rsplit("/api/", 1)[0] + "/" + families.group(2))
        with open(source, encoding="utf-8") as f:
            sections = _family_sections(families.group(1), f.read(), families.group(2))
        return markdown[:families.start()] + sections + markdown[families.end():]
    if page.file.src_uri.startswith("api/"):
        return markdown
    return link_names(markdown)
