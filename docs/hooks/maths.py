"""A mkdocs hook (mkdocs.yml loads it) that renders the site's maths as MathML when the site is built.

Pages and docstrings write maths as LaTeX: ``$...$`` inline, ``$$`` on their
own lines around a display. ``pymdownx.arithmatex`` (generic mode) marks it;
this hook turns each mark into a ``<math>`` element with ``latex2mathml`` (a
package of the ``docs`` extra). Browsers draw MathML themselves, so the built
site loads no maths script and works with no network.

latex2mathml passes what it does not understand through as text (a command it
does not know, an escaped underscore inside a text, a sized brace) and closes
an unbalanced brace silently; a page with either would show broken maths, so
the build stops on both and names the page and the formula.
"""

from __future__ import annotations

import html
import re

from latex2mathml.converter import convert

_MARK = re.compile(r'<(span|div) class="arithmatex">\\([(\[])(.*?)\\[)\]]</\1>', re.S)
_LEFT_AS_TEXT = re.compile(r">[^<]*(\\[^<\s]*)")  # a backslash in a MathML element's text: LaTeX not understood


def to_mathml(latex: str, *, display: bool = False, where: str = "") -> str:
    """``latex`` as one MathML element; ValueError (naming ``where``) on what would render wrong."""
    depth = 0
    for char in re.sub(r"\\[{}]", "", latex):
        depth += (char == "{") - (char == "}")
        if depth < 0:
            break
    if depth:
        raise ValueError(f"{where}: unbalanced braces in the formula {latex!r}")
    mathml = convert(latex, display="block" if display else "inline")
    unknown = _LEFT_AS_TEXT.findall(mathml)
    if unknown:
        raise ValueError(f"{where}: latex2mathml does not know {sorted(set(unknown))} in the formula {latex!r}")
    return mathml


def on_page_content(html_text: str, page, **kwargs) -> str:
    def render(match: re.Match) -> str:
        latex = html.unescape(match.group(3)).strip()
        return to_mathml(latex, display=match.group(2) == "[", where=page.file.src_uri)

    return _MARK.sub(render, html_text)
