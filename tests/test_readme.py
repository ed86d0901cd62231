"""The README's Python example runs as written (needs pandas, like `table.to_pandas()` says)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_python_example_runs():
    pytest.importorskip("pandas")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has a Python example"
    scope: dict = {}
    for block in blocks:   # in order, in one scope, as a reader pastes them
        exec(compile(block, str(README), "exec"), scope)   # noqa: S102 (the project's own README)
    assert scope["df"].shape[0] == 2 * 3 * 3 * 3 * 2                     # the sweep: one row per configuration
    assert scope["grid"].shape == (2, 2) and (scope["grid"] > 1).all()   # drafts that are accepted pay off
