"""Every row of docs/errors.md is a test: its code raises the error shown, or makes its check true.

A row's cells are: what the input is, the code (one backticked line, run
after the page's first python block in a fresh namespace), and what the user
gets: either a backticked exception name followed by a quoted part of its
message, or a description ending with a backticked check that must be true.
"""

from __future__ import annotations

import pathlib
import re

import pytest

PAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "errors.md"
TEXT = PAGE.read_text()
PRELUDE = re.search(r"^```python\n(.*?)^```", TEXT, re.S | re.M).group(1)


def _rows():
    rows = []
    for line in TEXT.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| ") else []
        if len(cells) == 3 and cells[1].startswith("`") and cells[1].endswith("`"):
            rows.append(pytest.param(cells[1][1:-1], cells[2], id=cells[0]))
    return rows


ROWS = _rows()


def test_the_page_has_its_rows():
    assert len(ROWS) >= 35


@pytest.mark.parametrize("code, outcome", ROWS)
def test_row(code, outcome):
    namespace: dict = {}
    exec(PRELUDE, namespace)
    error = re.match(r'^`(\w+Error)`: "(.*)"$', outcome)
    if error:
        name, message = error.groups()
        with pytest.raises(BaseException) as caught:
            exec(code, namespace)
        assert type(caught.value).__name__ == name, caught.value
        assert message in str(caught.value), str(caught.value)
    else:
        check = re.search(r"`([^`]*)`$", outcome)
        assert check, f"row outcome has neither an error nor a final check: {outcome}"
        exec(code, namespace)
        assert eval(check.group(1), namespace) is True, check.group(1)
