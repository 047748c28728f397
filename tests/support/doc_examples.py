"""Running the Python examples of the README and of docs/ as written (one machinery for both).

Each ```python block runs in a fresh interpreter in its own directory; a block that names
QE_REDIS_URL gets a real Redis server's URL (skipped when QE_BACKENDS leaves Redis out);
LiteLLM reads its bundled cost map (the test machine is offline). A line of the form
`print(...)  # value` names what it prints: the first word of the comment must appear in
some printed line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from stores import BACKENDS

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(path: Path) -> list[str]:
    """The ```python blocks of a Markdown file, in order."""
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def run_example(block: str, cwd: Path, request: pytest.FixtureRequest) -> None:
    env = dict(os.environ)
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # the test machine is offline: LiteLLM's bundled map
    if "QE_REDIS_URL" in block:
        if "redis" not in BACKENDS:
            pytest.skip("QE_BACKENDS leaves Redis out")
        env["QE_REDIS_URL"] = request.getfixturevalue("redis_server").url
    r = subprocess.run([sys.executable, "-c", block], cwd=cwd, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    # a comment of the form `print(...)  # value` names what the line prints
    expected = [m.strip() for m in re.findall(r"^print\(.*\)[ \t]+# (.+)$", block, re.M)]
    printed = r.stdout.splitlines()
    for want in expected:
        value = want.split(":")[0].split(" ")[0]
        assert any(value in line for line in printed), (want, printed)
