"""A script run in a fresh interpreter (the same venv), as another process of a fleet would be."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator


@contextlib.contextmanager
def spawn(script: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """Runs `script` in a fresh interpreter (the same venv) with `args` in sys.argv[1:]; kills it and
    closes its pipes on the way out."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    with proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


def stderr_of(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.kill()
    return proc.communicate()[1] or ""


def finish(proc: subprocess.Popen[str], timeout: float = 20) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


def race(script: str, runs: list[list[str]], timeout: float = 120) -> list[list[str]]:
    """Runs one process of `script` per entry of `runs` (its `sys.argv[1:]`), each printing
    "ready" once set up and waiting for "go" on stdin; starts them all at once and returns
    what each printed last, split into words."""
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(spawn(script, *args)) for args in runs]
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready", stderr_of(proc)
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        return [finish(proc, timeout=timeout).split() for proc in procs]
