"""Every Python block of the README and the docs runs, and the examples run."""

from __future__ import annotations

import contextlib
import doctest
import io
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```\s*$", re.S | re.M)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_python_block_of_a_page_runs(page):
    """Blocks run in order in one namespace; blocks with ``>>>`` are doctests, the others scripts."""
    text = page.read_text()
    blocks = FENCE.findall(text)
    namespace = {"__name__": "__docs__"}
    for i, code in enumerate(blocks):
        name = f"{page.name} block {i}"
        if ">>>" in code:
            test = doctest.DocTestParser().get_doctest(code, namespace, name, str(page), 0)
            runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
            out = io.StringIO()
            runner.run(test, out=out.write, clear_globs=False)
            assert runner.failures == 0, out.getvalue()
            namespace.update(test.globs)
        else:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(code, name, "exec"), namespace)


def _run(script):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_quickstart_trains_the_digits_mlp():
    out = _run("quickstart.py")
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)", out).group(1))
    assert accuracy >= 0.95, out


def test_custom_combinator_example_runs():
    assert "|>" in _run("custom_combinator.py")
