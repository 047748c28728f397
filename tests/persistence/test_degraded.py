"""Degraded mode (SPEC §10) with a real lock: another connection holds BEGIN EXCLUSIVE past
busy_timeout_ms. Also the proof that the GIL is released while the engine waits on that lock (STYLE §10)."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import quotaengine as q
from moments import TEN_AM
from outages import buffer_tenant_events_past_merging, declare_tenant_days, exclusive_lock, tenant_days

P, M, K = "groq", "llama-3.1-8b", 1


def rows(db_path: Path) -> list[tuple]:
    con = sqlite3.connect(db_path)
    try:
        return con.execute(
            "SELECT platform, model_id, key_id, kind, tokens, created_at_ms FROM rate_limit_usage "
            "ORDER BY created_at_ms, kind"
        ).fetchall()
    finally:
        con.close()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("quotaengine")]


def test_degraded_mode_keeps_enforcing_and_flushes(db_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = q.ManualClock(TEN_AM)
    caplog.set_level(logging.INFO, logger="quotaengine")
    with q.QuotaEngine(db_path, clock=clock, env={}, busy_timeout_ms=50) as e:
        e.set_model_limits(P, M, rpm=3)
        e.record_request("cerebras", "m", K)  # the file works
        assert not e.degraded
        caplog.clear()

        with exclusive_lock(db_path):
            e.record_request("cerebras", "m", K)  # fails to write: served from memory
            assert e.degraded
            clock.advance(1_000)
            with e.lease(P, M, K, 10):  # 1st admission, success(tokens=10)
                pass
            clock.advance(1_000)
            second = e.lease(P, M, K)
            second.success(tokens=5)  # 2nd
            clock.advance(1_000)
            held = e.lease(P, M, K, 7)  # 3rd, held
            with pytest.raises(q.QuotaExceeded) as exc:  # 4th refused
                e.lease(P, M, K)
            assert exc.value.reason == "rpm"
            adm = e.check(P, M, K)
            assert (adm.allowed, adm.reason, adm.retry_at_ms) == (False, "rpm", TEN_AM + 1_000 + 60_000)
            u = e.usage(P, M, K)
            assert (u["rpm"]["used"], u["tpm"]["used"], u["in_flight"]) == (2, 15, 1)
            assert e.usage("cerebras", "m", K)["rpd"]["used"] == 2
            assert e.degraded
            # The file still holds only what was written before the lock.
            assert rows(db_path) == [("cerebras", "m", K, "request", 0, TEN_AM)]

        assert len(warnings_of(caplog)) == 1

        # The lock is gone: the next write call lands everything, with the original timestamps.
        clock.advance(5_000)
        e.record_request("cerebras", "m", K)
        assert not e.degraded
        assert rows(db_path) == [
            ("cerebras", "m", K, "request", 0, TEN_AM),
            ("cerebras", "m", K, "request", 0, TEN_AM),
            (P, M, K, "request", 0, TEN_AM + 1_000),
            (P, M, K, "tokens", 10, TEN_AM + 1_000),
            (P, M, K, "request", 0, TEN_AM + 2_000),
            (P, M, K, "tokens", 5, TEN_AM + 2_000),
            ("cerebras", "m", K, "request", 0, TEN_AM + 8_000),
        ]
        assert len(warnings_of(caplog)) == 1
        held.success(tokens=7)
        u = e.usage(P, M, K)
        assert (u["rpm"]["used"], u["tpm"]["used"], u["in_flight"]) == (3, 22, 0)
        assert (P, M, K, "tokens", 7, TEN_AM + 8_000) in rows(db_path)


def test_lease_taken_while_degraded_is_shared_after_recovery(db_path: Path) -> None:
    # All state, leases included, lives in the file once it answers again: another process (here
    # another engine) must count the lease, or the two together admit past the limit.
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(db_path, clock=clock, env={}, busy_timeout_ms=50) as e:
        e.set_model_limits(P, M, rpm=2)
        e.record_request(P, M, K)
        with exclusive_lock(db_path):
            held = e.lease(P, M, K, 7)
            assert e.degraded
        e.record_request("cerebras", "m", K)  # the next write call flushes
        assert not e.degraded
        assert e.usage(P, M, K)["in_flight"] == 1
        with q.QuotaEngine(db_path, clock=clock, env={}) as other:
            u = other.usage(P, M, K)
            assert (u["rpm"]["used"], u["in_flight"]) == (1, 1)
            with pytest.raises(q.QuotaExceeded):
                other.lease(P, M, K)
        held.release()
        with q.QuotaEngine(db_path, clock=clock, env={}) as other:
            assert other.usage(P, M, K)["in_flight"] == 0


def test_one_warning_per_outage(db_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = q.ManualClock(TEN_AM)
    caplog.set_level(logging.WARNING, logger="quotaengine")
    with q.QuotaEngine(db_path, clock=clock, env={}, busy_timeout_ms=50) as e:
        e.record_request(P, M, K)
        caplog.clear()
        with exclusive_lock(db_path):
            for _ in range(5):
                e.record_request(P, M, K)
                clock.advance(10)
            assert e.degraded
        assert len(warnings_of(caplog)) == 1
        e.record_request(P, M, K)
        assert not e.degraded
        with exclusive_lock(db_path):
            e.record_request(P, M, K)
            assert e.degraded
        assert len(warnings_of(caplog)) == 2
        e.record_request(P, M, K)
        assert not e.degraded
    assert len(rows(db_path)) == 9


RECOVERY_LOG = """
    import logging, sqlite3, sys
    import quotaengine as q
    db = sys.argv[1]
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            if record.name.startswith("quotaengine"):
                records.append(record.levelname)
    logging.getLogger().addHandler(Keep())
    logging.getLogger("quotaengine").setLevel(logging.INFO)
    with q.QuotaEngine(db, env={}, busy_timeout_ms=50) as e:
        e.record_request("groq", "m", 1)
        con = sqlite3.connect(db, isolation_level=None)
        con.execute("BEGIN EXCLUSIVE")
        for _ in range(3):
            e.record_request("groq", "m", 1)
        con.execute("ROLLBACK")
        con.close()
        e.record_request("groq", "m", 1)
        e.record_request("groq", "m", 1)
    print(" ".join(records))
"""


def test_one_warning_and_one_info_line_per_outage(db_path: Path) -> None:
    # In a fresh interpreter, logging set up before the engine exists.
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RECOVERY_LOG), str(db_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    assert out.count("WARNING") == 1, out
    assert out.count("INFO") == 1, out
    assert out.index("WARNING") < out.index("INFO")
    assert len(rows(db_path)) == 6


LEVEL_RAISED_LATER = """
    import logging, sqlite3, sys
    import quotaengine as q
    db = sys.argv[1]
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            if record.name.startswith("quotaengine"):
                records.append(record.levelname)
    logging.getLogger().addHandler(Keep())

    def outage(e):
        con = sqlite3.connect(db, isolation_level=None)
        con.execute("BEGIN EXCLUSIVE")
        e.record_request("groq", "m", 1)
        con.execute("ROLLBACK")
        con.close()
        e.record_request("groq", "m", 1)
        assert not e.degraded

    with q.QuotaEngine(db, env={}, busy_timeout_ms=50) as e:
        outage(e)  # logged at the default level (WARNING)
        records.append("|")
        logging.getLogger("quotaengine").setLevel(logging.INFO)
        outage(e)
    print(" ".join(records))
"""


def test_logging_level_raised_later_takes_effect(db_path: Path) -> None:
    # A notebook turns on INFO after the engine has already logged: the recovery line of the next
    # outage must reach Python's logging like any logger's would (SPEC §10 "one info line on recovery").
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LEVEL_RAISED_LATER), str(db_path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    assert out == ["WARNING", "|", "WARNING", "INFO"]


def test_gil_is_released_while_waiting_for_the_lock(db_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(db_path, clock=clock, env={}, busy_timeout_ms=2_000) as e:
        e.record_request(P, M, K)
        errors: list[BaseException] = []
        calling = threading.Event()

        def blocked_call() -> None:
            try:
                calling.set()
                e.record_request(P, M, K)  # waits up to busy_timeout_ms for the lock
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)

        with exclusive_lock(db_path):
            t = threading.Thread(target=blocked_call)
            t.start()
            assert calling.wait(5)
            time.sleep(0.05)  # let it enter the engine
            counter = 0
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                counter += 1
            # The engine call is still waiting on the lock, and Python ran meanwhile.
            assert t.is_alive()
            assert counter > 10_000
        t.join(10)
        assert not t.is_alive()
        assert not errors
        e.record_request(P, M, K)
        assert e.usage(P, M, K)["rpm"]["used"] == 3
    assert len(rows(db_path)) == 3


def test_rows_merged_during_an_outage_land_as_one_row_per_request(db_path: Path) -> None:
    """SPEC §10: while degraded, events older than the minute window are merged in memory (the
    memory bound); what lands in the file is still one `request` row per request with tokens 0,
    at its original minute, so a notebook's COUNT(*) and SUM(tokens) are right."""
    clock = q.ManualClock(TEN_AM)
    calls = 0
    tokens = 0
    per_minute: dict[int, int] = {}
    with q.QuotaEngine(db_path, clock=clock, env={}, busy_timeout_ms=20) as e:
        with exclusive_lock(db_path):
            for i in range(6_000):  # past the merge threshold, over 10 minutes
                e.record_request(P, M, K)
                e.record_tokens(P, M, K, 1 + i % 7)
                minute = clock.now_ms() // 60_000
                per_minute[minute] = per_minute.get(minute, 0) + 1
                calls += 1
                tokens += 1 + i % 7
                clock.advance(100)
            assert e.degraded
            assert e._pending_writes() < 2 * calls, "buffered events were merged"
            assert e.usage(P, M, K)["rpd"]["used"] == calls
        e.record_request(P, M, K)  # the file answers: everything buffered is written
        assert not e.degraded
        per_minute[clock.now_ms() // 60_000] = per_minute.get(clock.now_ms() // 60_000, 0) + 1
        calls += 1
    con = sqlite3.connect(db_path)
    try:
        assert con.execute("SELECT COUNT(*), SUM(tokens) FROM rate_limit_usage WHERE kind = 'request'").fetchone() == (
            calls,
            0,
        )
        assert con.execute("SELECT SUM(tokens) FROM rate_limit_usage WHERE kind = 'tokens'").fetchone() == (tokens,)
        landed = dict(
            con.execute(
                "SELECT created_at_ms / 60000, COUNT(*) FROM rate_limit_usage WHERE kind = 'request' GROUP BY 1"
            ).fetchall()
        )
    finally:
        con.close()
    assert landed == per_minute  # each request in the minute it was made
    with q.QuotaEngine(db_path, clock=clock, env={}) as again:
        events = again.usage_events()
        reqs = [ev for ev in events if ev["kind"] == "request"]
        assert len(reqs) == calls and {ev["tokens"] for ev in reqs} == {0}
        assert again.usage(P, M, K)["rpd"]["used"] == calls


def test_rows_merged_during_an_outage_stay_with_their_tenants(db_path: Path) -> None:
    """SPEC 23.2 with §10's merging: an outage long enough for the buffer to merge rows per
    minute never merges rows of different tenants, so each tenant's windows and budgets count
    what it was told, in this engine and in every other once the file answers."""
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(db_path, clock=clock, env={}, busy_timeout_ms=20) as e:
        declare_tenant_days(e)
        e.record_request(P, M, K)  # the file works
        with exclusive_lock(db_path):
            told = buffer_tenant_events_past_merging(e, clock, (P, M, K))
            assert tenant_days(e) == told
        e.record_request(P, M, K)  # the file answers: everything buffered is written
        assert not e.degraded
        assert tenant_days(e) == told
        with q.QuotaEngine(db_path, clock=clock, env={}) as other:
            assert tenant_days(other) == told


LONG_OUTAGE = """
    import resource, sqlite3, sys
    import quotaengine as q
    path, days, per_day = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    clock = q.ManualClock(1_767_225_600_000)
    e = q.QuotaEngine(path, clock=clock, env={}, retention_ms=3_600_000, busy_timeout_ms=0)
    e.set_model_limits("groq", "llama", rpm=1000)
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    step = 86_400_000 // per_day
    rss, most = [], 0
    for i in range(days * per_day):
        e.lease("groq", "llama", 1, 10).success(tokens=5)
        clock.advance(step)
        if i >= per_day // 12:  # past the first two hours: the retention is full
            most = max(most, e._pending_writes())
        if i + 1 in (per_day, days * per_day):
            rss.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    assert e.degraded
    print(most, rss[0], rss[1])
"""


def test_memory_stays_bounded_however_long_the_file_stays_locked(tmp_path: Path) -> None:
    """SPEC 18.2: four simulated days locked at 10k requests a day, only rpm declared and an
    hour of retention: the buffer holds about an hour of events (merged per minute), and the
    peak RSS (of a child process of its own) does not grow with the days."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LONG_OUTAGE), str(tmp_path / "q.db"), "4", "10000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    most, rss_day1_kib, rss_day4_kib = (int(x) for x in out.stdout.split())
    # An hour is 60 merged minutes × 2 rows; the last minute's events and the writes since the
    # last compaction (it runs every 4096 buffered writes) come on top. Unbounded, the buffer
    # held ~2.7 writes per request: 100k by the fourth day.
    assert most < 2 * 4096 + 200, most
    assert rss_day4_kib - rss_day1_kib < 12 * 1024, (rss_day1_kib, rss_day4_kib)


def test_what_an_outage_drops_is_what_the_sweep_after_replay_deletes(tmp_path: Path) -> None:
    """Two engines see the same four hours of requests (30 at each minute mark, retention one
    hour, rpm and a sliding 2 h limit declared); one has its file locked all along. After it
    replays, each file read afresh counts the same in every window, and the rows left are the
    same: what the outage dropped from the buffer is what the sweep deleted from the other."""
    limits = [q.Limit("requests", 10**9, "2h")]
    engines, clocks = [], []
    for name in ("steady", "locked"):
        clock = q.ManualClock(TEN_AM)
        e = q.QuotaEngine(tmp_path / f"{name}.db", clock=clock, env={}, retention_ms=3_600_000, busy_timeout_ms=0)
        e.set_model_limits(P, M, rpm=10**6, limits=limits)
        engines.append(e)
        clocks.append(clock)
    steady, locked = engines
    with exclusive_lock(tmp_path / "locked.db"):
        most = 0
        for _ in range(4 * 60):
            for e in engines:
                for i in range(30):
                    e.lease(P, M, K, 10).success(tokens=i)
            for c in clocks:
                c.advance(60_000)
            most = max(most, locked._pending_writes())
        assert locked.degraded
        assert most < 4 * 60 * 30  # rows older than the 2 h were dropped while waiting
    for e in engines:
        e.record_request(P, M, K)  # the locked one replays what it kept
        assert not e.degraded
        e.close()
    now = clocks[0].now_ms()

    def counts(db: Path) -> list[tuple[int, int]]:
        con = sqlite3.connect(db)
        try:
            return [
                con.execute(
                    "SELECT COUNT(*) FILTER (WHERE kind = 'request'), COALESCE(SUM(tokens), 0)"
                    " FROM rate_limit_usage WHERE created_at_ms >= ?",
                    (since,),
                ).fetchone()
                for since in (0, now - 2 * 3_600_000, now - 3_600_000, now - 60_000)
            ]
        finally:
            con.close()

    assert counts(tmp_path / "locked.db") == counts(tmp_path / "steady.db")
    usages = []
    for name in ("steady", "locked"):
        with q.QuotaEngine(tmp_path / f"{name}.db", clock=q.ManualClock(now), env={}, readonly=True) as e:
            usages.append(e.usage(P, M, K, limits={"rpm": 10**6}))
    assert usages[0] == usages[1]
    assert usages[1]["rpd"]["used"] > 0
