"""Hostile files (SPEC §3 "Opening a file that is not a SQLite database, or a database with a newer, unknown
schema version, raises quotaengine.DatabaseError and changes nothing in the file", §10, §13).

Every case: the constructor raises ``quotaengine.DatabaseError`` (never another exception type, never a crash),
the file is left byte-for-byte unchanged, and no ``-wal``/``-shm`` file is left where there was none. Cases:
a real engine database truncated to half, its header overwritten with random bytes, its middle overwritten with
random bytes (pages the engine reads when it opens: today's usage), a newer schema (user_version 999 on a copy of
a real database), files of other applications (the SPEC's table names with other columns; every table name the
engine uses; unrelated tables), a directory, a path in a missing directory. An empty (zero-length) file is a
valid empty SQLite database: the engine makes it a quotaengine database.

tests/persistence/test_persistence.py already covers a few non-SQLite byte patterns and version + 1; these are the
corruption and foreign-application cases.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import quotaengine as q
from moments import TEN_AM

P, M = "groq", "llama-3.1-8b"
ROWS = 2_000


def make_real_db(path: Path) -> int:
    """A real engine database with ROWS requests (and tokens) today, limits, a key and a cooldown; closed
    cleanly (so the WAL is checkpointed into the main file). Returns the clock time at the end."""
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(path, clock=clock, env={}) as e:
        e.register_key(1, P, label="k1")
        e.set_model_limits(P, M, rpm=100_000, rpd=100_000)
        for i in range(ROWS):
            e.record_request(P, M, 1 + i % 3)
            e.record_tokens(P, M, 1 + i % 3, 50)
            clock.advance(5)
        e.set_cooldown(P, M, 2, duration_ms=3_600_000)
    return clock.now_ms()


@pytest.fixture(scope="module")
def real_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, int]:
    path = tmp_path_factory.mktemp("real") / "real.db"
    now = make_real_db(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["real.db"]
    return path.read_bytes(), now


def listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def refuse(path: Path, now: int, readonly: bool) -> None:
    try:
        e = q.QuotaEngine(path, clock=q.ManualClock(now), env={}, readonly=readonly)
    except q.DatabaseError as exc:
        assert str(exc), "a clear message"
    else:
        u = e.usage(P, M, 1)
        e.close()
        pytest.fail(f"opened (readonly={readonly}) with usage {u}: expected DatabaseError")


def assert_refused_untouched(path: Path, now: int) -> None:
    """DatabaseError from a read-write and from a read-only engine; the file byte-for-byte unchanged; no side
    file left by the read-write attempt. (Side files of a read-only attempt on a WAL-mode file:
    test_readonly_refusal_leaves_no_side_files.)"""
    before = path.read_bytes()
    files = listing(path.parent)
    refuse(path, now, readonly=False)
    assert path.read_bytes() == before, "the file changed"
    # Nothing new is left behind. (Side files an earlier plain sqlite3 reader left may
    # be cleaned up by SQLite itself when the engine's connection closes.)
    assert set(listing(path.parent)) <= set(files), "files were left behind"
    refuse(path, now, readonly=True)
    assert path.read_bytes() == before, "the file changed (readonly=True)"
    for name in set(listing(path.parent)) - set(files):
        (path.parent / name).unlink()


# ---------------------------------------------------------------------------- corruption


def test_real_database_opens(tmp_path: Path, real_db: tuple[bytes, int]) -> None:
    # The control for the corruption cases: the intact copy opens and holds its state.
    data, now = real_db
    path = tmp_path / "q.db"
    path.write_bytes(data)
    with q.QuotaEngine(path, clock=q.ManualClock(now), env={}, readonly=True) as e:
        u = e.usage(P, M, 1)
        assert u["rpd"]["used"] == (ROWS + 2) // 3
        assert e.is_on_cooldown(P, M, 2)
        assert e.model_limits(P, M) == q.Limits(rpm=100_000, rpd=100_000)


def test_truncated_to_half(tmp_path: Path, real_db: tuple[bytes, int]) -> None:
    data, now = real_db
    path = tmp_path / "q.db"
    path.write_bytes(data[: len(data) // 2])
    assert_refused_untouched(path, now)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_header_overwritten_with_random_bytes(tmp_path: Path, real_db: tuple[bytes, int], seed: int) -> None:
    data, now = real_db
    rng = random.Random(seed)
    path = tmp_path / "q.db"
    path.write_bytes(rng.randbytes(100) + data[100:])
    assert_refused_untouched(path, now)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_middle_overwritten_with_random_bytes(tmp_path: Path, real_db: tuple[bytes, int], seed: int) -> None:
    # The middle of the file holds today's usage rows, which the engine reads when it opens. An engine that
    # cannot read them must not start from zero usage (it would admit past every limit): DatabaseError.
    data, now = real_db
    rng = random.Random(seed)
    mid = len(data) // 2
    corrupted = data[:mid] + rng.randbytes(4096) + data[mid + 4096 :]
    path = tmp_path / "q.db"
    path.write_bytes(corrupted)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        with pytest.raises(sqlite3.DatabaseError):  # it really is corrupt where the engine reads
            con.execute("SELECT COUNT(*), SUM(tokens) FROM rate_limit_usage").fetchall()
    finally:
        con.close()
    assert_refused_untouched(path, now)


def test_newer_schema_on_a_copy_of_a_real_database(tmp_path: Path, real_db: tuple[bytes, int]) -> None:
    data, now = real_db
    path = tmp_path / "q.db"
    path.write_bytes(data)
    con = sqlite3.connect(path)
    con.execute("PRAGMA user_version = 999")
    con.commit()
    con.close()
    assert listing(tmp_path) == ["q.db"]
    assert_refused_untouched(path, now)


# ---------------------------------------------------------------------------- other applications' files


def engine_tables(tmp_path: Path) -> list[str]:
    path = tmp_path / "probe.db"
    with q.QuotaEngine(path, clock=q.ManualClock(TEN_AM), env={}):
        pass
    con = sqlite3.connect(path)
    try:
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    finally:
        con.close()
    for p in tmp_path.glob("probe.db*"):
        p.unlink()
    return [n for n in names if not n.startswith("sqlite_")]


def foreign_db(path: Path, tables: list[str], user_version: int, wal: bool) -> None:
    con = sqlite3.connect(path)
    if wal:
        con.execute("PRAGMA journal_mode = WAL")
    for t in tables:
        con.execute(f'CREATE TABLE "{t}" (owner TEXT, payload BLOB, n INTEGER)')
        con.execute(f'INSERT INTO "{t}" VALUES (?, ?, ?)', ("someone-else", b"\x00\x01", 42))
    con.execute(f"PRAGMA user_version = {user_version}")
    con.commit()
    con.close()
    if wal:  # leave no -wal behind (closing the last connection checkpoints and removes it)
        assert not Path(f"{path}-wal").exists()


SPEC_TABLES = ["rate_limit_usage", "rate_limit_cooldowns", "server_logs"]


@pytest.mark.parametrize(
    ("case", "user_version", "wal"),
    [
        ("spec-tables", 0, False),
        ("spec-tables", 1, False),
        ("spec-tables", 7, True),
        ("all-engine-tables", 1, False),
        ("all-engine-tables", 1, True),
        ("engine-meta-table-only", 1, False),
        ("unrelated-tables", 0, False),
        ("unrelated-tables", 0, True),
        ("unrelated-tables", 1, True),
    ],
)
def test_another_applications_file(tmp_path: Path, case: str, user_version: int, wal: bool) -> None:
    if case == "spec-tables":
        tables = SPEC_TABLES
    elif case == "all-engine-tables":
        tables = engine_tables(tmp_path)
        assert set(SPEC_TABLES) < set(tables)
    elif case == "engine-meta-table-only":
        tables = [t for t in engine_tables(tmp_path) if t not in SPEC_TABLES and "meta" in t]
        assert tables, "the engine has a metadata table"
    else:
        tables = ["invoices", "customers"]
    path = tmp_path / "app.db"
    foreign_db(path, tables, user_version, wal)
    assert_refused_untouched(path, TEN_AM)


def test_readonly_refusal_leaves_no_side_files(tmp_path: Path, real_db: tuple[bytes, int]) -> None:
    # Refusing a WAL-mode file with readonly=True must not leave q.db-wal / q.db-shm behind either ("changes
    # nothing"): a real database truncated, one with a newer schema, another application's WAL-mode file.
    data, now = real_db
    cases = {}
    cases["truncated.db"] = data[: len(data) // 2]
    newer = tmp_path / "newer.db"
    newer.write_bytes(data)
    con = sqlite3.connect(newer)
    con.execute("PRAGMA user_version = 999")
    con.commit()
    con.close()
    cases["newer.db"] = newer.read_bytes()
    foreign = tmp_path / "foreign.db"
    foreign_db(foreign, ["invoices"], 0, wal=True)
    cases["foreign.db"] = foreign.read_bytes()
    left = {}
    for name, content in cases.items():
        d = tmp_path / name.replace(".db", "")
        d.mkdir()
        path = d / name
        path.write_bytes(content)
        refuse(path, now, readonly=True)
        assert path.read_bytes() == content
        left[name] = [n for n in listing(d) if n != name]
    assert left == {name: [] for name in cases}


# ---------------------------------------------------------------------------- odd paths


def test_zero_length_file_becomes_a_quotaengine_database(tmp_path: Path) -> None:
    # An empty file is a valid, empty SQLite database: the engine creates its schema in it, as for a new path.
    path = tmp_path / "empty.db"
    path.touch()
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(path, clock=clock, env={}) as e:
        e.set_model_limits(P, M, rpm=1)
        with e.lease(P, M, 1, 5):
            pass
        with pytest.raises(q.QuotaExceeded):
            e.lease(P, M, 1)
    assert path.stat().st_size > 0
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA user_version").fetchone()[0] > 0
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        con.close()
    with q.QuotaEngine(path, clock=clock, env={}, readonly=True) as e:
        u = e.usage(P, M, 1)
        assert (u["rpm"]["used"], u["tpm"]["used"], u["rpm"]["limit"]) == (1, 5, 1)


def test_zero_length_file_readonly_is_refused(tmp_path: Path) -> None:
    # A read-only engine cannot create the schema: an empty file is not (yet) a quotaengine database.
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(q.DatabaseError):
        q.QuotaEngine(path, clock=q.ManualClock(TEN_AM), env={}, readonly=True)
    assert path.read_bytes() == b""
    assert listing(tmp_path) == ["empty.db"]


@pytest.mark.parametrize("readonly", [False, True])
def test_directory_path(tmp_path: Path, readonly: bool) -> None:
    d = tmp_path / "a-directory.db"
    d.mkdir()
    (d / "inside.txt").write_text("keep")
    with pytest.raises(q.DatabaseError):
        q.QuotaEngine(d, clock=q.ManualClock(TEN_AM), env={}, readonly=readonly)
    assert listing(d) == ["inside.txt"]
    assert listing(tmp_path) == ["a-directory.db"]


@pytest.mark.parametrize("readonly", [False, True])
def test_path_in_a_missing_directory(tmp_path: Path, readonly: bool) -> None:
    path = tmp_path / "missing" / "deeper" / "q.db"
    with pytest.raises(q.DatabaseError):
        q.QuotaEngine(path, clock=q.ManualClock(TEN_AM), env={}, readonly=readonly)
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda p: p.write_bytes(b"\x00" * 4096), id="zeros"),
        pytest.param(lambda p: p.write_bytes(b"SQLite format 3\x00"), id="header-only"),
        pytest.param(lambda p: p.write_bytes(b"SQLite format 3\x00" + b"\x00" * 84), id="header-zeroed"),
        pytest.param(lambda p: p.write_text("PRAGMA user_version = 1;\n"), id="sql-text"),
    ],
)
def test_small_non_databases(tmp_path: Path, make: Callable[[Path], object]) -> None:
    path = tmp_path / "q.db"
    make(path)
    assert_refused_untouched(path, TEN_AM)


def test_refusals_leave_the_engine_usable_elsewhere(tmp_path: Path, real_db: tuple[bytes, int]) -> None:
    # After a string of refusals in this process, a good file still opens and works (no leaked lock or handle).
    data, now = real_db
    bad = tmp_path / "bad.db"
    bad.write_bytes(data[: len(data) // 3])
    for _ in range(20):
        with pytest.raises(q.DatabaseError):
            q.QuotaEngine(bad, clock=q.ManualClock(now), env={})
    good = tmp_path / "good.db"
    with q.QuotaEngine(good, clock=q.ManualClock(now), env={}) as e:
        e.record_request(P, M, 1)
        assert e.usage(P, M, 1)["rpd"]["used"] == 1
