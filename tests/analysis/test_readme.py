"""The README's Python examples run as written, and print what their comments say; the
README stays the front door (SPEC 26: at most 250 lines, the install and the two set-up
commands), the rest of the manual being the docs site (tests/analysis/test_docs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_examples import ROOT, python_blocks, run_example

README = ROOT / "README.md"
BLOCKS = python_blocks(README)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_example_runs(i: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    run_example(BLOCKS[i], tmp_path, request)


def test_readme_is_the_front_door() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    # the two set-up commands, verbatim: install and run the demo on the default SQLite
    # file, and install the test dependencies and run the tests
    assert "\npip install . && python -m quotaengine demo\n" in text
    assert "\nbash .ci/run\n" in text
    # the install starts with the package index, then the extras
    assert "pip install quotaengine\n" in text
    for extra in ("litellm", "analysis", "metrics"):
        assert f"quotaengine[{extra}]" in text, extra
