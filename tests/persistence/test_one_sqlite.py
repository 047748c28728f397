"""One SQLite per process (SPEC §1): the engine runs on the SQLite library Python's sqlite3 uses, so a
notebook's sqlite3 connection closing beside a live engine cannot delete its WAL and lose rows."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
import quotaengine as q
from moments import TEN_AM

P, M, K = "groq", "llama-3.1-8b", 1


def test_sqlite_version_is_pythons() -> None:
    v = q.sqlite_version()
    assert isinstance(v, str)
    assert v == sqlite3.sqlite_version


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_one_sqlite_library_mapped(engine: q.QuotaEngine) -> None:
    engine.record_request(P, M, K)
    sqlite3.connect(":memory:").close()
    maps = Path("/proc/self/maps").read_text().splitlines()
    libs = {line.split()[-1] for line in maps if "libsqlite3" in line}
    assert len(libs) <= 1, libs
    # The extension asks the dynamic loader for the shared library instead of carrying its own copy.
    ext = Path(q._quotaengine.__file__).read_bytes()
    assert b"libsqlite3.so" in ext


def count_rows(db_path: Path) -> int:
    con = sqlite3.connect(db_path)
    try:
        return con.execute("SELECT COUNT(*) FROM rate_limit_usage").fetchone()[0]
    finally:
        con.close()


def test_closing_a_sqlite3_connection_loses_no_engine_rows(db_path: Path) -> None:
    clock = q.ManualClock(TEN_AM)
    e = q.QuotaEngine(db_path, clock=clock, env={})
    try:
        expected = 0
        for cycle in range(3):
            for _ in range(20):
                e.record_request(P, M, K)
                clock.advance(1)
                expected += 1
            # A notebook peeks at the file, in this process, and closes its connection.
            con = sqlite3.connect(db_path)
            assert con.execute("SELECT COUNT(*) FROM rate_limit_usage").fetchone()[0] == expected
            con.close()
            # The engine keeps writing.
            for _ in range(20):
                e.record_request(P, M, K)
                clock.advance(1)
                expected += 1
            assert e.usage(P, M, K)["rpd"]["used"] == expected, cycle

        # While the first engine is still open, a fresh engine and sqlite3 see every row.
        assert count_rows(db_path) == expected
        with q.QuotaEngine(db_path, clock=clock, env={}) as fresh:
            assert fresh.usage(P, M, K)["rpd"]["used"] == expected
    finally:
        e.close()
    assert count_rows(db_path) == expected
    with q.QuotaEngine(db_path, clock=clock, env={}) as fresh:
        assert fresh.usage(P, M, K)["rpd"]["used"] == expected


def test_sqlite3_writer_beside_engine_loses_nothing(db_path: Path) -> None:
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        for _ in range(10):
            e.record_request(P, M, K)
        con = sqlite3.connect(db_path, isolation_level=None)
        con.execute(
            "INSERT INTO rate_limit_usage(platform, model_id, key_id, kind, tokens, created_at_ms) "
            "VALUES (?, ?, ?, 'request', 1, ?)",
            (P, M, K, TEN_AM),
        )
        con.close()
        for _ in range(10):
            e.record_request(P, M, K)
        assert e.usage(P, M, K)["rpd"]["used"] == 21
        assert count_rows(db_path) == 21
    assert count_rows(db_path) == 21
