"""A mkdocs hook (mkdocs.yml loads it): a table cell's code with several statements shows one per line.

The errors page's rows are code a test runs (``tests/test_errors_page.py``), often two or three statements
joined by ``; `` on one markdown line. Code in a table never wraps (docs/stylesheets/extra.css), so that a
name or a call is not broken mid-word; this breaks the line after each ``;`` instead.
"""

from __future__ import annotations

import re

_CELL_CODE = re.compile(r"(<td>)(.*?)(</td>)", re.S)
_CODE = re.compile(r"(<code>)(.*?)(</code>)", re.S)


def _statements(code: re.Match) -> str:
    return code.group(1) + code.group(2).replace("; ", ";<br>") + code.group(3)


def on_page_content(html: str, **kwargs) -> str:
    return _CELL_CODE.sub(lambda cell: cell.group(1) + _CODE.sub(_statements, cell.group(2)) + cell.group(3), html)
