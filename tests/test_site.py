"""The docs site builds with ``mkdocs build --strict``, and its API reference documents every public name."""

from __future__ import annotations

import importlib.util
import inspect
import os
import pathlib
import pkgutil
import re
import subprocess
import sys

import pytest

import updax as ux

#: Its module-scoped fixture starts a subprocess: with pytest-xdist, one worker runs the whole module, once.
pytestmark = pytest.mark.xdist_group("site")

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: The import names of the docs extra's packages (pyproject.toml).
DOCS_EXTRA = ["mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers", "pymdownx", "latex2mathml"]
#: updax and its public sub-modules: each one's ``__all__`` is documented.
MODULES = [ux] + [importlib.import_module(f"updax.{m.name}") for m in pkgutil.iter_modules(ux.__path__)
                  if not m.name.startswith("_")]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The directory of a strict build of the site."""
    missing = [name for name in DOCS_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        pytest.fail(f"the docs extra is not installed ({', '.join(missing)} missing): pip install -e '.[docs]'")
    site = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr
    return site


@pytest.fixture(scope="module")
def reference(site):
    """{page: html} of the API reference (docs/api/) in the strict build."""
    return {page.relative_to(site).as_posix(): page.read_text() for page in sorted((site / "api").rglob("*.html"))}


#: A script, a style sheet or a font fetched from outside the site: an HTML ``src``/``href`` of a ``<script>`` or
#: ``<link>``, or a CSS ``url(...)``/``@import``, that names a scheme or starts with ``//``.
_EXTERNAL = re.compile(r"<(?:script|link)\b[^>]*\b(?:src|href)=[\"']?((?:[a-z]+:)?//[^\"' >]+)"
                       r"|(?:url\(|@import\s+)[\"']?((?:[a-z]+:)?//[^\"')\s]+)", re.IGNORECASE)


def test_the_built_site_loads_no_script_style_or_font_from_outside_itself(site):
    """Read with no network, no page logs a failed script and none downloads one online: every script, style
    sheet and font the site uses is inside the site (mkdocs.yml: no CDN maths, theme.font false)."""
    files = sorted(site.rglob("*.html")) + sorted(site.rglob("*.css"))
    assert len(files) > 20
    found = {f"{f.relative_to(site)}: {''.join(m)}" for f in files for m in _EXTERNAL.findall(f.read_text())}
    assert not found, sorted(found)[:10]
    assert _EXTERNAL.search('<script src="https://cdn.example/x.js">') and _EXTERNAL.search("url(//fonts.x/a.woff)")


def _where_documented(module, name):
    """The reference anchors that document ``module.name``: its own, or that of the same object in another module."""
    obj = getattr(module, name)
    anchors = {f"{other.__name__}.{name}" for other in MODULES if getattr(other, name, None) is obj}
    return anchors | ({obj.__name__} if inspect.ismodule(obj) else set())


def test_the_reference_documents_every_public_name(reference):
    anchors = {a for html in reference.values() for a in re.findall(r'\bid="([\w.]+)"', html)}
    missing = [f"{m.__name__}.{n}" for m in MODULES for n in m.__all__ if not _where_documented(m, n) & anchors]
    assert not missing, f"docs/api/ does not document {missing}"
    # The fluent methods come from src/updax/_update.pyi: the reference shows each one with its signature.
    # updax's own methods and fluent methods; combinators other tests register (from docs, doctests) are not
    # updax's and are attached to Update in this process too.
    methods = [n for n, f in vars(ux.Update).items() if callable(f) and not n.startswith("_")
               and str(getattr(f, "__module__", "updax")).startswith("updax")]
    missing = [n for n in methods if f"updax.Update.{n}" not in anchors]
    assert not missing, f"docs/api/ does not document the methods {missing} of Update"


def test_the_reference_renders_the_docstrings_markup(reference):
    """docs/api/docstrings.py's work: examples are code, not quotes, and no reStructuredText role is left raw."""
    for page, html in reference.items():
        assert "<blockquote>" not in html, f"{page}: a docstring's >>> lines render as a quote, not as code"
        raw = re.findall(r":(?:func|class|meth|attr|mod|data|obj):<code>[^<]*</code>", html)
        assert not raw, f"{page}: reStructuredText roles left as text: {raw}"
        split = re.findall(r"<p>[^<]*``[^<]*</p>", html)
        assert not split, f"{page}: a literal split over two items (a Returns: paragraph read as two values?): {split[:2]}"


def test_every_formula_is_mathml_in_the_built_site(site):
    """docs/hooks/maths.py's work: LaTeX (``$...$``, ``$$``) in pages and docstrings is MathML when the site is
    built, so it renders with no script; no formula is left as text. Adam's rule is one display in its entry."""
    pages = {f.relative_to(site).as_posix(): f.read_text() for f in sorted(site.rglob("*.html"))}
    for page, html in pages.items():
        text = re.sub(r"<(pre|code|math)\b.*?</\1>", "", html, flags=re.S)  # code may show a dollar or a \\gets
        assert "arithmatex" not in text and "$$" not in text, f"{page}: a formula left as text"
        left = re.findall(r"\\(?:frac|gets|sqrt|begin|epsilon|hat)\b", text)
        assert not left, f"{page}: LaTeX left as text: {left[:5]}"
    adam = pages["api/updates/index.html"].split('id="updax.updates.scale_by_adam"')[1].split(' id="updax.')[0]
    display = re.findall(r'<math [^>]*display="block">.*?</math>', adam, re.S)
    assert len(display) == 1 and display[0].count("<mtr>") == 3 and "<msqrt>" in display[0] and "<mfrac>" in display[0]


def test_signatures_are_formatted_one_parameter_per_line(reference):
    """mkdocstrings formats a long signature with ruff (in the docs extra): one parameter a line, not one cut line."""
    adam = reference["api/updates/index.html"].split('id="updax.updates.scale_by_adam"')[1]
    signature = re.sub(r"<[^>]+>", "", adam.split('class="doc-signature')[1].split("</code>")[0])
    assert re.search(r"\(\n    b1: ScalarOrSchedule = 0\.9,\n    b2: ", signature), signature[:200]


def test_the_updates_reference_is_grouped_in_the_catalogues_families(reference):
    """docs/hooks/reference.py: the sections of api/updates are the catalogue's, in its order, each with its names."""
    catalogue = (ROOT / "docs" / "catalogue.md").read_text()
    titles = re.findall(r"^## (.+)$", catalogue, re.M)
    html = reference["api/updates/index.html"]
    sections = re.findall(r'<h2 id="[^"]*"[^>]*>(.*?)<', html)
    assert sections and sections == [t for t in titles if t in sections]
    assert len(sections) >= 15 and "Other names" not in sections
    family = {s: set(re.findall(r'id="updax\.updates\.(\w+)"', part))
              for s, part in zip(sections, re.split(r"<h2 id=", html)[1:])}
    assert {"scale_by_adam", "scale_by_rms"} <= family["Adaptive rules"] and "stateless" in family["Primitives"]
    assert set().union(*family.values()) == set(ux.updates.__all__)


def test_public_names_in_the_pages_link_to_their_entries(site):
    """docs/hooks/reference.py: inline code naming a public name links to its reference entry; code blocks do not."""
    catalogue = (site / "catalogue" / "index.html").read_text()
    assert re.search(r'<a class="autorefs[^"]*"[^>]*href="\.\./api/updates/#updax\.updates\.scale_by_adam"', catalogue)
    optimizers = (site / "optimizers" / "index.html").read_text()
    assert 'href="../api/optimizers/#updax.optimizers.adamw"' in optimizers
    blocks = re.findall(r"<pre.*?</pre>", catalogue + optimizers, re.S)
    assert blocks and not any("autorefs" in block for block in blocks)


def test_a_table_cells_statements_show_one_per_line(site):
    """docs/hooks/tables.py: the errors page's code cells break after each ``;``, not mid-call."""
    errors = (site / "errors" / "index.html").read_text()
    assert "adamw = ux.optimizers.adamw(0.1);<br>adamw.update(" in re.sub(r"<(?!br)[^>]+>", "", errors)


def _hook(name):
    spec = importlib.util.spec_from_file_location(f"updax_docs_{name}", ROOT / "docs" / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("latex, why", [(r"\foo{x}", r"does not know ['\\foo']"),
                                        (r"\text{eps\_root}", "does not know"),
                                        (r"\bigl\{ x \bigr\}", "does not know"),
                                        (r"\frac{a}{b", "unbalanced braces")])
def test_the_maths_hook_stops_the_build_on_a_formula_that_would_render_wrong(latex, why):
    pytest.importorskip("latex2mathml")
    maths = _hook("maths")
    with pytest.raises(ValueError, match=re.escape(why)):
        maths.to_mathml(latex, where="page.md")
    assert maths.to_mathml(r"\frac{m}{\sqrt{v} + \epsilon}").count("<mfrac>") == 1


def test_the_link_hook_links_names_and_leaves_code_and_other_calls_alone():
    reference = _hook("reference")
    text = ("Use `scale_by_adam` or `ux.optimizers.adam(1e-3)`, not `adam(1e-3).init(p)`, `b1` or [`adam`](x).\n"
            "```python\nscale_by_adam()\n```\n# `scale_by_adam`\n")
    assert reference.link_names(text) == (
        "Use [`scale_by_adam`][updax.updates.scale_by_adam] or [`ux.optimizers.adam(1e-3)`][updax.optimizers.adam], "
        "not `adam(1e-3).init(p)`, `b1` or [`adam`](x).\n```python\nscale_by_adam()\n```\n# `scale_by_adam`\n")
