"""SPEC §12, logging half: Rust `log` records reach Python's `logging` under `quotaengine`;
warnings, errors and `cooldown_recovered` also land in `server_logs`, read newest first.

Real SQLite files under tmp_path, a ManualClock, env={}.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import quotaengine as q
from moments import MINUTE, NOON
from outages import exclusive_lock

MIDNIGHT = 1_767_225_600_000  # 2026-01-01 00:00:00.000 UTC
P, M = "groq", "llama-3.1-8b-instant"
COLUMNS = {"id", "level", "source", "provider", "model", "event", "request_id", "message", "created_at_ms"}
LEVELS = {"info", "warn", "error"}


@pytest.fixture
def lclock() -> q.ManualClock:
    return q.ManualClock(NOON)


@pytest.fixture
def ldb(tmp_path: Path) -> Path:
    return tmp_path / "logs.db"


@pytest.fixture
def lengine(ldb: Path, lclock: q.ManualClock) -> Iterator[q.QuotaEngine]:
    e = q.QuotaEngine(ldb, clock=lclock, env={}, busy_timeout_ms=50)
    yield e
    e.close()


def engine_records(caplog: pytest.LogCaptureFixture, level: int | None = None) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if (r.name == "quotaengine" or r.name.startswith("quotaengine.")) and (level is None or r.levelno == level)
    ]


def degrade_and_recover(e: q.QuotaEngine, db: Path) -> None:
    """A write that fails (locked past busy_timeout_ms), then writes until the engine recovers."""
    e.record_request(P, M, 1)  # the file works
    assert not e.degraded
    with exclusive_lock(db):
        e.record_request(P, M, 1)
        assert e.degraded
    deadline = time.monotonic() + 5
    while True:
        e.record_request(P, M, 1)
        if not e.degraded or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert not e.degraded


def recover_key(e: q.QuotaEngine, clock: q.ManualClock, key: int) -> int:
    """Bench `key` heuristically, let half of it pass and have the probe clear it; returns when."""
    e.set_cooldown(P, M, key, 10 * MINUTE, "heuristic")
    clock.advance(5 * MINUTE)
    e.run_probe_pass(lambda k: True, jitter=lambda: 0.0)
    result = e.run_probe_pass(lambda k: True, jitter=lambda: 0.0)
    assert result.probed_key_ids == [key]
    return clock.now_ms()


def table_columns(db: Path) -> set[str]:
    con = sqlite3.connect(db)
    try:
        return {row[1] for row in con.execute("PRAGMA table_info(server_logs)")}
    finally:
        con.close()


def check_rows(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        assert isinstance(r, dict)
        assert set(r) == COLUMNS
        assert r["level"] in LEVELS, r


# --------------------------------------------------------------------------- Python logging


def test_set_cooldown_logs_under_the_quotaengine_logger(
    ldb: Path, lclock: q.ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="quotaengine")
    with q.QuotaEngine(ldb, clock=lclock, env={}) as e:
        caplog.clear()
        e.set_cooldown(P, M, 1, 10 * MINUTE, "heuristic")
    records = engine_records(caplog)
    assert records, [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert any(r.levelno == logging.INFO for r in records)


def test_info_level_set_after_the_engine_exists_takes_effect(
    lengine: q.QuotaEngine, caplog: pytest.LogCaptureFixture
) -> None:
    lengine.set_cooldown(P, M, 1, 10 * MINUTE, "heuristic")  # before INFO is on
    caplog.set_level(logging.INFO, logger="quotaengine")
    caplog.clear()
    lengine.set_cooldown(P, M, 2, 10 * MINUTE, "heuristic")
    assert engine_records(caplog, logging.INFO)


def test_degraded_write_logs_a_warning_to_python_and_server_logs(
    lengine: q.QuotaEngine, ldb: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="quotaengine")
    caplog.clear()
    degrade_and_recover(lengine, ldb)
    assert len(engine_records(caplog, logging.WARNING)) == 1
    rows = lengine.server_logs()
    check_rows(rows)
    warns = [r for r in rows if r["level"] == "warn"]
    assert len(warns) == 1, rows
    assert warns[0]["message"]
    # What server_logs returns is the table's content, visible to a plain sqlite3 reader.
    con = sqlite3.connect(ldb)
    try:
        levels = [lv for (lv,) in con.execute("SELECT level FROM server_logs")]
    finally:
        con.close()
    assert "warn" in levels


# --------------------------------------------------------------------------- server_logs


def test_server_logs_keys_are_the_table_columns(lengine: q.QuotaEngine, lclock: q.ManualClock, ldb: Path) -> None:
    recover_key(lengine, lclock, 1)
    rows = lengine.server_logs()
    assert rows
    assert table_columns(ldb) == COLUMNS
    for r in rows:
        assert set(r) == table_columns(ldb)
    row = [r for r in rows if r["event"] == "cooldown_recovered"][0]
    assert row["level"] == "info"
    assert isinstance(row["id"], int)
    assert isinstance(row["created_at_ms"], int)
    assert isinstance(row["message"], str)


def test_server_logs_newest_first_and_limit(lengine: q.QuotaEngine, lclock: q.ManualClock, ldb: Path) -> None:
    times = [recover_key(lengine, lclock, k) for k in (1, 2, 3)]
    lclock.advance(MINUTE)
    outage_at = lclock.now_ms()
    degrade_and_recover(lengine, ldb)

    rows = lengine.server_logs()
    check_rows(rows)
    stamps = [r["created_at_ms"] for r in rows]
    assert stamps == sorted(stamps, reverse=True)
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == len(ids)
    recovered = [r["created_at_ms"] for r in rows if r["event"] == "cooldown_recovered"]
    assert recovered == times[::-1]
    assert rows[0]["level"] == "warn"
    assert rows[0]["created_at_ms"] >= outage_at

    one = lengine.server_logs(limit=1)
    assert len(one) == 1
    assert one[0] == rows[0]
    assert lengine.server_logs(limit=2) == rows[:2]
    assert lengine.server_logs(2) == rows[:2]
    assert len(lengine.server_logs(limit=1000)) == len(rows)


def test_server_logs_default_limit_is_100(lengine: q.QuotaEngine, lclock: q.ManualClock) -> None:
    for k in range(105):
        lengine.set_cooldown(P, M, k, 10 * MINUTE, "heuristic")
    lclock.advance(5 * MINUTE)
    lengine.run_probe_pass(lambda k: True, jitter=lambda: 0.0, max_probes=200)
    assert lengine.run_probe_pass(lambda k: True, jitter=lambda: 0.0, max_probes=200).cleared_cooldowns == 105
    assert len(lengine.server_logs()) == 100
    assert len(lengine.server_logs(limit=1000)) >= 105


def test_server_logs_are_shared_through_the_file(ldb: Path, lclock: q.ManualClock) -> None:
    with q.QuotaEngine(ldb, clock=lclock, env={}) as a, q.QuotaEngine(ldb, clock=lclock, env={}) as b:
        at = recover_key(a, lclock, 1)
        rows = [r for r in b.server_logs() if r["event"] == "cooldown_recovered"]
        assert [r["created_at_ms"] for r in rows] == [at]
    with q.QuotaEngine(ldb, clock=lclock, env={}) as c:
        assert [r["created_at_ms"] for r in c.server_logs() if r["event"] == "cooldown_recovered"] == [at]


@pytest.mark.parametrize("flush_interval_ms", [0, 10])
def test_a_construction_warning_lands_in_server_logs_for_every_reader(
    store: str, lclock: q.ManualClock, flush_interval_ms: int, caplog: pytest.LogCaptureFixture
) -> None:
    """SPEC §12: an unparsable PROVIDER_*_CAP_* override is a warning in Python's logging AND a
    `server_logs` row, so a second engine on the same store (or a notebook) sees why a cap is not
    what the operator set. It is written by the constructor, before any other call."""
    env = {"PROVIDER_DAILY_REQUEST_CAP_OPENROUTER": "lots", "PROVIDER_DAILY_TOKEN_CAP_GROQ": "1000"}
    with caplog.at_level(logging.WARNING, logger="quotaengine"):
        first = q.QuotaEngine(store, clock=lclock, env=env, flush_interval_ms=flush_interval_ms)
    try:
        assert any("PROVIDER_DAILY_REQUEST_CAP_OPENROUTER" in r.getMessage() for r in caplog.records)
        with q.QuotaEngine(store, clock=lclock, env={}) as second:
            rows = [r for r in second.server_logs() if "PROVIDER_" in r["message"]]
        assert len(rows) == 1, rows  # only the bad one; a valid override is no warning
        row = rows[0]
        assert row["level"] == "warn" and row["event"] == "config" and row["source"] == "quotaengine"
        assert "PROVIDER_DAILY_REQUEST_CAP_OPENROUTER" in row["message"] and '"lots"' in row["message"]
        assert row["created_at_ms"] == NOON
        assert first.provider_caps("openrouter").daily_requests == 1000  # the default stands
        assert first.provider_caps(P).daily_tokens == 1000
    finally:
        first.close()
    if "://" not in store:
        with sqlite3.connect(store) as con:
            n = con.execute("SELECT COUNT(*) FROM server_logs WHERE message LIKE '%CAP_OPENROUTER%'").fetchone()
        assert n == (1,)


def test_a_readonly_engine_logs_a_construction_warning_without_writing(
    ldb: Path, lclock: q.ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    q.QuotaEngine(ldb, clock=lclock, env={}).close()
    with caplog.at_level(logging.WARNING, logger="quotaengine"):
        ro = q.QuotaEngine(ldb, clock=lclock, env={"PROVIDER_MINUTE_REQUEST_CAP_NVIDIA": "x"}, readonly=True)
    try:
        assert any("PROVIDER_MINUTE_REQUEST_CAP_NVIDIA" in r.getMessage() for r in caplog.records)
        assert ro.server_logs() == []
    finally:
        ro.close()
