"""Every Python example of the docs site (docs/*.md) runs as written, and prints what its
comments say, with the README's machinery (tests/support/doc_examples.py): blocks that name
QE_REDIS_URL run against a real Redis server, LiteLLM's against its bundled cost map."""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_examples import ROOT, python_blocks, run_example

DOCS = ROOT / "docs"
ALL = [(page.name, i, block) for page in sorted(DOCS.glob("*.md")) for i, block in enumerate(python_blocks(page))]
# A block the README shows word for word runs once, in test_readme.py (the LiteLLM one takes 20 s).
README_BLOCKS = set(python_blocks(ROOT / "README.md"))
EXAMPLES = [(page, i, block) for page, i, block in ALL if block not in README_BLOCKS]


def test_docs_have_examples() -> None:
    pages = {page for page, _, _ in ALL}
    # the pages that teach by example: each has at least one
    for page in ("getting-started.md", "concepts.md", "failures.md", "routing.md", "tenants.md", "litellm.md"):
        assert page in pages, page
    assert "processes-and-redis.md" in pages and "analysis.md" in pages


@pytest.mark.parametrize(("page", "i", "block"), EXAMPLES, ids=[f"{page}-{i}" for page, i, _ in EXAMPLES])
def test_docs_example_runs(page: str, i: int, block: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    run_example(block, tmp_path, request)


@pytest.mark.parametrize("module", ["quotaengine.litellm", "quotaengine.analysis", "quotaengine.metrics"])
def test_the_api_reference_lists_every_public_function_and_class(module: str) -> None:
    """docs/api.md renders each public module's members by name: every function and class
    its ``__all__`` exports is listed (a new one is not left out of the reference)."""
    import importlib
    import re

    mod = importlib.import_module(module)
    page = (DOCS / "api.md").read_text(encoding="utf-8")
    section = page.split(f"::: {module}\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\s+- (\w+)$", section, re.M))
    public = {name for name in mod.__all__ if callable(getattr(mod, name))}
    assert public <= listed, sorted(public - listed)
