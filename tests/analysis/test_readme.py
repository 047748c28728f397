"""The README's Python examples run as written, and print what their comments say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from stores import BACKENDS

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_example_runs(i: int, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    env = dict(os.environ)
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # the test machine is offline: LiteLLM's bundled map
    if "QE_REDIS_URL" in BLOCKS[i]:
        if "redis" not in BACKENDS:
            pytest.skip("QE_BACKENDS leaves Redis out")
        env["QE_REDIS_URL"] = request.getfixturevalue("redis_server").url
    r = subprocess.run(
        [sys.executable, "-c", BLOCKS[i]], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env
    )
    assert r.returncode == 0, r.stderr
    # a comment of the form `print(...)  # value` names what the line prints
    expected = [m.strip() for m in re.findall(r"^print\(.*\)[ \t]+# (.+)$", BLOCKS[i], re.M)]
    printed = r.stdout.splitlines()
    for want in expected:
        value = want.split(":")[0].split(" ")[0]
        assert any(value in line for line in printed), (want, printed)
