"""Checks an installed quotaengine wheel in the running interpreter (SPEC 26).

Run by scripts/check_wheel.sh inside a fresh venv, from a directory outside the
repository (so the installed package is the one imported). Prints one JSON line.

* the engine runs on the SQLite that Python's sqlite3 uses: same version, and one
  libsqlite3 mapped in the process (Linux);
* a plain sqlite3 connection opened and closed beside a live engine on its file leaves
  the WAL alone: the -wal file is still there, no row is lost, the engine keeps writing
  (the check of tests/persistence/test_one_sqlite.py);
* the README's quickstart runs and prints what its comments say (as tests/analysis/test_readme.py);
* import time: median of 7 fresh `import quotaengine` minus a bare interpreter start, and
  the median of 7 `python -X importtime -c "import quotaengine"` (quotaengine's cumulative
  line: its own import and everything it imports that was not imported yet).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import quotaengine as q
    from quotaengine import _sqlite

P, M, K = "groq", "llama-3.1-8b", 1
# The command that starts this Python in a child process: QE_CHECK_PYTHON where an
# emulator runs it (scripts/check_wheel_qemu.sh: qemu-user cannot exec a foreign binary).
PYTHON = shlex.split(os.environ.get("QE_CHECK_PYTHON", "")) or [sys.executable]


def rows(db: Path) -> int:
    con = sqlite3.connect(db)
    try:
        return int(con.execute("SELECT COUNT(*) FROM rate_limit_usage").fetchone()[0])
    finally:
        con.close()


def coexistence(tmp: Path) -> None:
    db = tmp / "quota.db"
    clock = q.ManualClock(1_767_261_600_000)
    e = q.QuotaEngine(str(db), clock=clock, env={})
    try:
        expected = 0
        for cycle in range(3):
            for _ in range(20):
                e.record_request(P, M, K)
                clock.advance(1)
                expected += 1
            assert Path(f"{db}-wal").exists(), "the engine's file is not in WAL mode"
            con = sqlite3.connect(db)  # a notebook peeks at the file, in this process
            assert con.execute("SELECT COUNT(*) FROM rate_limit_usage").fetchone()[0] == expected
            con.close()
            # With two SQLite copies the close checkpoints and deletes the live WAL.
            assert Path(f"{db}-wal").exists(), f"cycle {cycle}: closing a sqlite3 connection removed the WAL"
            for _ in range(20):
                e.record_request(P, M, K)
                clock.advance(1)
                expected += 1
            assert e.usage(P, M, K)["rpd"]["used"] == expected, cycle
        assert rows(db) == expected
    finally:
        e.close()
    assert rows(db) == expected
    with q.QuotaEngine(str(db), clock=clock, env={}) as fresh:
        assert fresh.usage(P, M, K)["rpd"]["used"] == expected


def mapped_sqlite_libraries() -> set[str]:
    maps = Path("/proc/self/maps").read_text().splitlines()
    return {line.split()[-1] for line in maps if "libsqlite3" in line}


def quickstart(readme: Path, tmp: Path) -> None:
    text = readme.read_text(encoding="utf-8")
    start = re.search(r"^#+ Quickstart", text, re.M)
    blocks = re.findall(r"```python\n(.*?)```", text[start.start() if start else 0 :], re.S)
    code = blocks[0]
    r = subprocess.run([*PYTHON, "-c", code], cwd=tmp, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for want in (m.strip() for m in re.findall(r"^print\(.*\)[ \t]+# (.+)$", code, re.M)):
        value = want.split(":")[0].split(" ")[0]
        assert any(value in line for line in r.stdout.splitlines()), (want, r.stdout)


def import_ms() -> float:
    def run(code: str) -> float:
        times = []
        for _ in range(7):
            t = time.perf_counter()
            subprocess.run([*PYTHON, "-c", code], check=True)
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    return round((run("import quotaengine") - run("pass")) * 1000, 1)


def importtime_ms() -> float:
    """Median over 7 fresh processes of `-X importtime`'s cumulative time for quotaengine."""
    times = []
    for _ in range(7):
        r = subprocess.run(
            [*PYTHON, "-X", "importtime", "-c", "import quotaengine"], capture_output=True, text=True, check=True
        )
        # "import time: self [us] | cumulative | imported package"
        line = next(x for x in r.stderr.splitlines() if x.rstrip().endswith("| quotaengine"))
        times.append(int(line.split("|")[1]) / 1000)
    return round(statistics.median(times), 1)


def main() -> None:
    readme = Path(sys.argv[1])
    out: dict[str, object] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "sqlite_version": q.sqlite_version(),
        "sqlite3.sqlite_version": sqlite3.sqlite_version,
        "sqlite_source": _sqlite.source,
        "import_warnings": [str(w.message) for w in caught],
    }
    if sys.platform.startswith("linux"):
        out["libsqlite3_mapped"] = sorted(mapped_sqlite_libraries())
    fallback = any("system SQLite" in str(w.message) for w in caught)
    if fallback:
        # sqlite3 has SQLite built in and does not export it: the engine runs on the
        # system's copy, says so once, and sqlite_version() names that copy's version.
        assert len(caught) == 1, out
        assert q.sqlite_version() == _sqlite._version_of(_sqlite.source), out
        out["coexistence"] = "skipped: two SQLite copies (the import warning names the risk)"
    elif sys.platform.startswith("linux"):
        assert not caught, out
        assert q.sqlite_version() == sqlite3.sqlite_version, out
        assert len(out["libsqlite3_mapped"]) <= 1, out  # type: ignore[arg-type]
    elif sys.platform == "darwin" and q.sqlite_version() != sqlite3.sqlite_version:
        # The macOS wheel links /usr/lib/libsqlite3.dylib; this Python's sqlite3 has its own.
        assert len(caught) == 1, out
        fallback = True
        out["coexistence"] = "skipped: two SQLite copies (the import warning names the risk)"
    # Windows wheels carry their own SQLite: Windows locks are per handle, so the
    # coexistence check below must pass there too.
    with tempfile.TemporaryDirectory() as d:
        if not fallback:
            coexistence(Path(d))
            out["coexistence"] = "ok"
        quickstart(readme, Path(d))
        out["quickstart"] = "ok"
    out["import_ms"] = import_ms()
    out["importtime_ms"] = importtime_ms()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
