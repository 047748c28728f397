"""The SQLite file (SPEC §3, §10): WAL, table layout, schema version, refusing foreign or newer files
untouched, read-only engines, :memory:, the default path, close(), and the retention sweep."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import quotaengine as q
from moments import HOUR, MINUTE, SECOND, TEN_AM
from old_schemas import downgrade_schema

P, M, K = "groq", "llama-3.1-8b", 1


def sql(db_path: Path, query: str, *params: object) -> list[tuple]:
    con = sqlite3.connect(db_path, isolation_level=None)
    try:
        return con.execute(query, params).fetchall()
    finally:
        con.close()


def snapshot(db_path: Path) -> tuple[bytes, int]:
    """The main file's bytes and the -wal file's size (0 when absent)."""
    wal = Path(f"{db_path}-wal")
    return db_path.read_bytes(), (wal.stat().st_size if wal.exists() else 0)


# ---------------------------------------------------------------------------- layout


@pytest.mark.sqlite_only
def test_wal_mode(engine: q.QuotaEngine, db_path: Path) -> None:
    engine.record_request(P, M, K)
    assert sql(db_path, "PRAGMA journal_mode") == [("wal",)]


@pytest.mark.sqlite_only
@pytest.mark.parametrize(
    ("table", "columns"),
    [
        ("rate_limit_usage", {"platform", "model_id", "key_id", "kind", "tokens", "created_at_ms"}),
        ("rate_limit_cooldowns", {"platform", "model_id", "key_id", "expires_at_ms", "source", "set_at_ms"}),
        (
            "server_logs",
            {"id", "level", "source", "provider", "model", "event", "request_id", "message", "created_at_ms"},
        ),
    ],
)
def test_spec_tables_and_columns(engine: q.QuotaEngine, db_path: Path, table: str, columns: set[str]) -> None:
    cols = {row[1] for row in sql(db_path, f"PRAGMA table_info({table})")}
    assert columns <= cols


@pytest.mark.sqlite_only
def test_usage_rows_readable_with_sqlite3(engine: q.QuotaEngine, db_path: Path, clock: q.ManualClock) -> None:
    engine.record_request(P, M, K)
    clock.advance(5)
    engine.record_tokens(P, M, K, 42)
    rows = sql(
        db_path,
        "SELECT platform, model_id, key_id, kind, tokens, created_at_ms FROM rate_limit_usage ORDER BY created_at_ms",
    )
    assert rows == [(P, M, K, "request", 0, TEN_AM), (P, M, K, "tokens", 42, TEN_AM + 5)]
    engine.set_cooldown(P, M, K, duration_ms=30_000, source="credit")
    rows = sql(db_path, "SELECT platform, model_id, key_id, expires_at_ms, source, set_at_ms FROM rate_limit_cooldowns")
    assert rows == [(P, M, K, TEN_AM + 5 + 30_000, "credit", TEN_AM + 5)]


@pytest.mark.sqlite_only
def test_schema_version(engine: q.QuotaEngine, db_path: Path) -> None:
    ((version,),) = sql(db_path, "PRAGMA user_version")
    assert version > 0


def test_version_1_request_rows_are_migrated_to_one_row_per_request(db_path: Path, clock: q.ManualClock) -> None:
    """Version 1 stored 1 in a request row's tokens, or N for N requests merged while degraded.
    Opening such a file rewrites it forward: one row per request, tokens 0, at the row's time,
    so a plain sqlite3 reader's COUNT(*) and SUM(tokens) are right; the engine's counts hold."""
    with q.QuotaEngine(db_path, clock=clock, env={}):
        pass
    con = sqlite3.connect(db_path)
    with con:
        # Back to what version 1 had: the tables of later versions go.
        downgrade_schema(con, 1)
        con.executemany(
            "INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [
                (P, M, K, "request", 1, TEN_AM - 120_000),
                (P, M, K, "request", 3, TEN_AM - 60_000),  # three requests merged in one row
                (P, M, K, "tokens", 40, TEN_AM - 60_000),
                (P, M, K, "request", 1, TEN_AM - 10),
                (P, M, 2, "request", 1, TEN_AM - 10),
            ],
        )
    con.close()
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        assert sql(db_path, "PRAGMA user_version") >= [(2,)]
        assert e.usage(P, M, K)["rpd"]["used"] == 5
        assert e.usage(P, M, K)["rpm"]["used"] == 1
        assert e.usage(P, M, K)["tpd"]["used"] == 40
        requests = [ev for ev in e.usage_events() if ev["kind"] == "request"]
        assert len(requests) == 6 and {ev["tokens"] for ev in requests} == {0}
    assert sql(
        db_path,
        "SELECT key_id, created_at_ms, COUNT(*), SUM(tokens) FROM rate_limit_usage WHERE kind = 'request' "
        "GROUP BY 1, 2 ORDER BY 1, 2",
    ) == [(K, TEN_AM - 120_000, 1, 0), (K, TEN_AM - 60_000, 3, 0), (K, TEN_AM - 10, 1, 0), (2, TEN_AM - 10, 1, 0)]
    assert sql(db_path, "SELECT SUM(tokens) FROM rate_limit_usage WHERE kind = 'tokens'") == [(40,)]
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:  # opening again changes nothing
        assert e.usage(P, M, K)["rpd"]["used"] == 5


def test_a_version_10_file_opens_with_the_same_model_limits_and_provider_caps(
    db_path: Path, clock: q.ManualClock
) -> None:
    """Version 11 folds provider_caps' three columns (NULL not set, -1 no cap, >= 0 the cap) into
    one declaration, `caps`: a version-10 file opens with the same limits and caps."""
    platforms = [P, "google", "cerebras"]

    def caps(e: q.QuotaEngine) -> list[tuple[int | None, ...]]:
        return [(c.daily_requests, c.minute_requests, c.daily_tokens) for c in map(e.provider_caps, platforms)]

    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        e.set_model_limits(P, M, rpm=5, tpd=1000, limits=[q.Limit("requests", 1, "1s")])
        e.set_provider_caps(P, daily_requests=100, minute_requests=None)
        e.set_provider_caps("google", daily_tokens=7)
        e.set_provider_caps("cerebras", daily_requests=0, minute_requests=None, daily_tokens=None)
        before = caps(e)
    con = sqlite3.connect(db_path)
    with con:
        downgrade_schema(con, 10)
        old = con.execute("SELECT platform, daily_requests, minute_requests, daily_tokens FROM provider_caps")
        assert sorted(old) == [("cerebras", 0, -1, -1), ("google", None, None, 7), (P, 100, -1, None)]
    con.close()
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        limits = e.model_limits(P, M)
        assert limits is not None and (limits.rpm, limits.rpd, limits.tpm, limits.tpd) == (5, None, None, 1000)
        assert q.Limit("requests", 1, "1s") in e.model_limit_list(P, M)
        assert caps(e) == before
    assert sorted(
        sql(db_path, "SELECT platform, caps, daily_requests, minute_requests, daily_tokens FROM provider_caps")
    ) == [
        ("cerebras", "requests/day=0 requests/minute=none tokens/day=none", None, None, None),
        ("google", "tokens/day=7", None, None, None),
        (P, "requests/day=100 requests/minute=none", None, None, None),
    ]
    assert sql(db_path, "PRAGMA user_version") == [(13,)]


def test_a_version_12_file_opens_with_its_usage_and_leases_and_gains_the_tenants(
    db_path: Path, clock: q.ManualClock
) -> None:
    """Version 13 (SPEC 23.2) adds the tenants of a usage row and of a lease (NULL: none) and the
    tenant declarations: a version-12 file opens with its usage and live leases counted as before."""
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        e.set_model_limits(P, M, rpm=5, tpm=1000)
        e.record_request(P, M, K)
        e.record_tokens(P, M, K, 42)
        lease_id = e.acquire_lease(P, M, K, estimated_tokens=10)
        before = e.usage(P, M, K)
    con = sqlite3.connect(db_path)
    with con:
        downgrade_schema(con, 12)
    assert con.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'tenant_limits'").fetchone() == (0,)
    con.close()
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        after = e.usage(P, M, K)
        assert (after["rpm"]["used"], after["tpm"]["used"], after["in_flight"]) == (1, 42, 1)
        assert after == before
        assert [ev["kind"] for ev in e.usage_events()] == ["request", "tokens"]
        e.release_lease(lease_id)
        e.record_request(P, M, K)
    assert sql(db_path, "PRAGMA user_version") == [(13,)]
    assert sql(db_path, "SELECT kind, tenants FROM rate_limit_usage ORDER BY id") == [
        ("request", None),
        ("tokens", None),
        ("request", None),
    ]
    assert sql(db_path, "SELECT tenant, limits, tz FROM tenant_limits") == []
    assert sql(db_path, "SELECT name FROM pragma_table_info('quota_leases') WHERE name = 'tenants'") == [("tenants",)]


# ---------------------------------------------------------------------------- refusing files


def test_newer_schema_refused_and_file_untouched(db_path: Path, clock: q.ManualClock) -> None:
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        e.record_request(P, M, K)
    ((version,),) = sql(db_path, "PRAGMA user_version")
    sql(db_path, f"PRAGMA user_version = {version + 1}")
    before = db_path.read_bytes()
    with pytest.raises(q.DatabaseError):
        q.QuotaEngine(db_path, clock=clock, env={})
    assert db_path.read_bytes() == before
    with pytest.raises(q.DatabaseError):
        q.QuotaEngine(db_path, clock=clock, env={}, readonly=True)
    assert db_path.read_bytes() == before
    assert sql(db_path, "PRAGMA user_version") == [(version + 1,)]


def test_newer_schema_in_rollback_journal_file_untouched(db_path: Path, clock: q.ManualClock) -> None:
    # A file made by someone else, not in WAL mode: switching it to WAL would rewrite its header.
    con = sqlite3.connect(db_path)
    con.execute("CREATE TABLE notes(x)")
    con.execute("INSERT INTO notes VALUES ('keep me')")
    con.commit()
    con.execute("PRAGMA user_version = 999999")
    con.close()
    before = db_path.read_bytes()
    with pytest.raises(q.DatabaseError):
        q.QuotaEngine(db_path, clock=clock, env={})
    assert db_path.read_bytes() == before
    assert not Path(f"{db_path}-wal").exists() or Path(f"{db_path}-wal").stat().st_size == 0
    assert sql(db_path, "PRAGMA journal_mode") == [("delete",)]


@pytest.mark.parametrize(
    "content",
    [b"this is not a database\n" * 200, b"SQLite format 3\x00" + b"\xff" * 4080, bytes(range(256)) * 16],
)
def test_not_sqlite_refused_and_file_untouched(db_path: Path, clock: q.ManualClock, content: bytes) -> None:
    db_path.write_bytes(content)
    with pytest.raises(q.DatabaseError):
        q.QuotaEngine(db_path, clock=clock, env={})
    assert db_path.read_bytes() == content
    with pytest.raises(q.DatabaseError):
        q.QuotaEngine(db_path, clock=clock, env={}, readonly=True)
    assert db_path.read_bytes() == content
    assert not Path(f"{db_path}-wal").exists()


def test_database_error_is_a_quotaengine_error() -> None:
    assert issubclass(q.DatabaseError, q.QuotaEngineError)
    assert issubclass(q.EngineClosed, q.QuotaEngineError)


# ---------------------------------------------------------------------------- read-only


def test_readonly_reads_and_never_writes(db_path: Path, clock: q.ManualClock) -> None:
    with q.QuotaEngine(db_path, clock=clock, env={}) as writer:
        writer.set_model_limits(P, M, rpm=10)
        writer.record_request(P, M, K)
        writer.record_tokens(P, M, K, 99)
        writer.set_cooldown(P, "m2", K, duration_ms=MINUTE)
    before = snapshot(db_path)
    with q.QuotaEngine(db_path, clock=clock, env={}, readonly=True) as ro:
        assert ro.readonly
        u = ro.usage(P, M, K)
        assert (u["rpm"]["used"], u["tpm"]["used"], u["rpm"]["limit"]) == (1, 99, 10)
        assert ro.model_limits(P, M) == q.Limits(rpm=10)
        assert ro.is_on_cooldown(P, "m2", K)
        assert ro.check(P, M, K).allowed
        assert ro.can_make_request(P, M, K)
        clock.advance(2 * MINUTE)  # reads at a later time (a sweep would be due) change nothing either
        assert ro.usage(P, M, K)["rpd"]["used"] == 1
        for write in (
            lambda: ro.record_request(P, M, K),
            lambda: ro.record_tokens(P, M, K, 1),
            lambda: ro.lease(P, M, K),
            lambda: ro.acquire_lease(P, M, K),
            lambda: ro.set_cooldown(P, M, K, duration_ms=1000),
            lambda: ro.set_model_limits(P, M, rpm=1),
            lambda: ro.register_key(3, P),
            lambda: ro.set_provider_caps(P, daily_requests=1),
        ):
            with pytest.raises(q.DatabaseError):
                write()
        assert ro.usage(P, M, K)["rpd"]["used"] == 1
        assert ro.usage(P, M, K)["in_flight"] == 0
        assert ro.model_limits(P, M) == q.Limits(rpm=10)
    assert snapshot(db_path) == before


def test_readonly_sees_a_live_writer(db_path: Path, clock: q.ManualClock) -> None:
    with q.QuotaEngine(db_path, clock=clock, env={}) as writer:
        writer.record_request(P, M, K)
        with q.QuotaEngine(db_path, clock=clock, env={}, readonly=True) as ro:
            assert ro.usage(P, M, K)["rpm"]["used"] == 1
            writer.record_request(P, M, K)
            writer.acquire_lease(P, M, K)
            u = ro.usage(P, M, K)
            assert (u["rpm"]["used"], u["in_flight"]) == (2, 1)


# ---------------------------------------------------------------------------- paths


def test_memory_database(clock: q.ManualClock) -> None:
    with q.QuotaEngine(":memory:", clock=clock, env={}) as a, q.QuotaEngine(":memory:", clock=clock, env={}) as b:
        a.set_model_limits(P, M, rpm=2)
        a.record_request(P, M, K)
        with a.lease(P, M, K, 10):
            pass
        with pytest.raises(q.QuotaExceeded):
            a.lease(P, M, K)
        assert a.usage(P, M, K)["rpm"] == {"used": 2, "limit": 2}
        assert b.usage(P, M, K)["rpm"] == {"used": 0, "limit": None}  # each :memory: engine is its own
    assert not Path(":memory:").exists()


def test_default_path_from_env_mapping(tmp_path: Path, clock: q.ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "from-env.db"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUOTAENGINE_DB", str(tmp_path / "from-os-environ.db"))
    with q.QuotaEngine(clock=clock, env={"QUOTAENGINE_DB": str(target)}) as e:
        e.record_request(P, M, K)
        assert Path(e.path) == target
    assert sql(target, "SELECT COUNT(*) FROM rate_limit_usage") == [(1,)]
    assert not (tmp_path / "quota.db").exists()
    assert not (tmp_path / "from-os-environ.db").exists()


def test_default_path_is_cwd_quota_db(tmp_path: Path, clock: q.ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUOTAENGINE_DB", str(tmp_path / "from-os-environ.db"))
    with q.QuotaEngine(clock=clock, env={}) as e:
        e.record_request(P, M, K)
    assert sql(tmp_path / "quota.db", "SELECT COUNT(*) FROM rate_limit_usage") == [(1,)]
    assert not (tmp_path / "from-os-environ.db").exists()


def test_path_like_and_str(tmp_path: Path, clock: q.ManualClock) -> None:
    with q.QuotaEngine(tmp_path / "a.db", clock=clock, env={}) as e:
        e.record_request(P, M, K)
    with q.QuotaEngine(str(tmp_path / "a.db"), clock=clock, env={}) as e:
        assert e.usage(P, M, K)["rpm"]["used"] == 1


# ---------------------------------------------------------------------------- close


def test_close_then_every_method_raises(engine: q.QuotaEngine) -> None:
    lease_id = engine.acquire_lease(P, M, K)
    engine.close()
    assert engine.closed
    engine.close()  # idempotent
    calls = [
        lambda: engine.record_request(P, M, K),
        lambda: engine.record_tokens(P, M, K, 1),
        lambda: engine.usage(P, M, K),
        lambda: engine.check(P, M, K),
        lambda: engine.lease(P, M, K),
        lambda: engine.acquire_lease(P, M, K),
        lambda: engine.release_lease(lease_id),
        lambda: engine.can_make_request(P, M, K),
        lambda: engine.can_use_tokens(P, M, K, 1),
        lambda: engine.can_use_provider(P, K),
        lambda: engine.can_use_key_concurrency(P, K),
        lambda: engine.is_on_cooldown(P, M, K),
        lambda: engine.set_cooldown(P, M, K),
        lambda: engine.set_model_limits(P, M, rpm=1),
        lambda: engine.model_limits(P, M),
        lambda: engine.register_key(1, P),
        lambda: engine.provider_caps(P),
        lambda: engine.set_provider_caps(P, daily_requests=1),
    ]
    for call in calls:
        with pytest.raises(q.EngineClosed):
            call()


def test_context_manager_closes(db_path: Path, clock: q.ManualClock) -> None:
    e = q.QuotaEngine(db_path, clock=clock, env={})
    with e as entered:
        assert entered is e
        e.record_request(P, M, K)
    assert e.closed
    with pytest.raises(q.EngineClosed):
        e.usage(P, M, K)


def test_context_manager_closes_on_exception(db_path: Path, clock: q.ManualClock) -> None:
    with pytest.raises(ZeroDivisionError):
        with q.QuotaEngine(db_path, clock=clock, env={}) as e:
            e.record_request(P, M, K)
            1 / 0  # noqa: B018
    assert e.closed
    with q.QuotaEngine(db_path, clock=clock, env={}) as e2:
        assert e2.usage(P, M, K)["rpm"]["used"] == 1


def test_clean_close_with_grouped_writes_loses_nothing(db_path: Path, clock: q.ManualClock) -> None:
    with q.QuotaEngine(db_path, clock=clock, env={}, flush_interval_ms=60_000) as e:
        for _ in range(5):
            e.record_request(P, M, K)
        e.record_tokens(P, M, K, 77)
    assert sql(db_path, "SELECT COUNT(*), SUM(tokens) FROM rate_limit_usage WHERE kind = 'request'") == [(5, 0)]
    assert sql(db_path, "SELECT SUM(tokens) FROM rate_limit_usage WHERE kind = 'tokens'") == [(77,)]


# ---------------------------------------------------------------------------- retention


def created_times(db_path: Path) -> list[int]:
    return [r[0] for r in sql(db_path, "SELECT created_at_ms FROM rate_limit_usage ORDER BY created_at_ms")]


def test_retention_sweep_at_most_once_a_minute(db_path: Path) -> None:
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(db_path, clock=clock, env={}, retention_ms=HOUR) as e:
        e.record_request(P, M, K)  # X at 10:00:00
        clock.set(TEN_AM + 30 * SECOND)
        y = clock.now_ms()
        e.record_request(P, M, K)  # Y at 10:00:30

        # 11:00:10: X is past retention, Y is not; more than a minute since any earlier sweep.
        clock.set(TEN_AM + HOUR + 10 * SECOND)
        z = clock.now_ms()
        e.record_request(P, M, K)
        assert created_times(db_path) == [y, z]

        # 11:00:40: Y is now past retention, but only 30 s since the last sweep: not swept.
        clock.set(TEN_AM + HOUR + 40 * SECOND)
        w = clock.now_ms()
        e.record_request(P, M, K)
        assert created_times(db_path) == [y, z, w]

        # 11:01:10: a minute since the last sweep: Y goes.
        clock.set(TEN_AM + HOUR + 70 * SECOND)
        v = clock.now_ms()
        e.record_request(P, M, K)
        assert created_times(db_path) == [z, w, v]

        # A stale row from elsewhere; 10 s later it is not swept yet...
        stale = TEN_AM - 2 * HOUR
        sql(
            db_path,
            "INSERT INTO rate_limit_usage(platform, model_id, key_id, kind, tokens, created_at_ms) "
            "VALUES (?, ?, ?, 'request', 1, ?)",
            P,
            M,
            K,
            stale,
        )
        clock.set(TEN_AM + HOUR + 80 * SECOND)
        u = clock.now_ms()
        e.record_request(P, M, K)
        assert created_times(db_path) == [stale, z, w, v, u]

        # ... but the clock steps back 30 s: the next write sweeps again.
        clock.set(TEN_AM + HOUR + 50 * SECOND)
        t = clock.now_ms()
        e.record_request(P, M, K)
        assert created_times(db_path) == [z, w, t, v, u]
        # Events "in the future" still count after the step back.
        assert e.usage(P, M, K)["rpm"]["used"] == 5


def test_the_sweep_runs_again_at_the_first_write_after_every_step_back_of_the_clock(store: str) -> None:
    """SPEC 24.3 on every backend: a row stamped before ``now - retention_ms`` that was written
    after the clock stepped back (here by an engine whose clock is behind) is gone after the
    next writing call that follows a step back; otherwise the sweep runs at most once a minute,
    counted from the last sweep by the clock as it now reads."""
    ca, cb = q.ManualClock(TEN_AM), q.ManualClock(TEN_AM - 3 * HOUR)
    with (
        q.QuotaEngine(store, clock=ca, env={}, retention_ms=HOUR) as a,
        q.QuotaEngine(store, clock=cb, env={}, retention_ms=HOUR) as b,
    ):

        def seconds() -> list[int]:
            return sorted((r["created_at_ms"] - TEN_AM) // SECOND for r in a.usage_events(since_ms=0))

        a.record_request(P, M, K)  # 10:00, a sweep
        b.record_request(P, M, K)  # 07:00: b's own sweep keeps it
        ca.advance(40 * SECOND)
        a.record_request(P, M, K)  # 40 s after a's last sweep: none
        assert seconds() == [-3 * 3600, 0, 40]
        ca.advance(-5 * SECOND)  # a's clock steps back 5 s: its next write sweeps
        a.record_request(P, M, K)
        assert seconds() == [0, 35, 40]
        cb.set(TEN_AM - 2 * HOUR)
        b.record_request(P, M, K)  # 08:00 (b's clock moved on: no step back)
        ca.advance(50 * SECOND)  # 50 s after the sweep at 10:00:35
        a.record_request(P, M, K)
        assert seconds() == [-2 * 3600, 0, 35, 40, 85]
        ca.advance(10 * SECOND)  # a minute after it: the 08:00 row goes
        a.record_request(P, M, K)
        assert seconds() == [0, 35, 40, 85, 95]
        assert a.usage(P, M, K)["rpm"]["used"] == 3  # 10:00:40, 10:01:25 and 10:01:35


def test_a_row_written_behind_another_engines_sweep_goes_at_the_next_sweep(store: str) -> None:
    """SPEC 24.3: b's clock is 3 h behind a's. A row b writes after a swept (stamped before
    where a's sweep had got to) is gone at the next sweep that finds it past the retention,
    also while a week limit keeps another model's rows (on Redis the sweep of rows written
    after a step back went on from where the last sweep stopped, by time, and never came
    back for it)."""
    ca, cb = q.ManualClock(TEN_AM + 3 * HOUR), q.ManualClock(TEN_AM)
    with (
        q.QuotaEngine(store, clock=ca, env={}, retention_ms=HOUR) as a,
        q.QuotaEngine(store, clock=cb, env={}, retention_ms=HOUR) as b,
    ):
        a.set_model_limits(P, "weekly", limits=[q.Limit("requests", 100, "week")])  # 13:00, a's sweep
        b.record_request(P, M, K)  # 10:00 by b's clock: b's sweep
        ca.advance(2 * MINUTE)
        a.record_request(P, "weekly", K)  # 13:02 by a's: a's sweep, past every row of b's
        cb.advance(30 * SECOND)
        b.record_request(P, M, K)  # 10:00:30, 30 s after b's sweep: none
        cb.advance(HOUR + 30 * SECOND)  # 11:01: a sweep; the rows of 10:00 are past the hour
        b.record_request(P, M, K)
        assert [(r["created_at_ms"] - TEN_AM) // SECOND for r in b.usage_events(since_ms=0, model_id=M)] == [3660]
        assert len(a.usage_events(since_ms=0, model_id="weekly")) == 1


def test_retention_default_keeps_a_day(db_path: Path) -> None:
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        e.record_request(P, M, K)
        clock.advance(23 * HOUR)
        e.record_request(P, M, K)
        assert len(created_times(db_path)) == 2
        clock.advance(HOUR + MINUTE)
        e.record_request(P, M, K)
        assert created_times(db_path) == [TEN_AM + 23 * HOUR, TEN_AM + 24 * HOUR + MINUTE]


def insert_raw(db_path: Path, rows: list[tuple[str, str, int, str, int, int]]) -> None:
    """Rows written by a plain sqlite3 connection (another writer of the file)."""
    con = sqlite3.connect(db_path)
    with con:
        con.executemany(
            "INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            rows,
        )
    con.close()


def stale_rows(db_path: Path, cutoff: int) -> int:
    ((n,),) = sql(db_path, "SELECT COUNT(*) FROM rate_limit_usage WHERE created_at_ms < ?", cutoff)
    return int(n)


@pytest.mark.parametrize("case", ["newest-row", "among-newer-rows", "just-past-the-cutoff", "before-open"])
def test_retention_deletes_every_stale_row_at_the_next_sweep(db_path: Path, case: str) -> None:
    """SPEC §10: a row older than retention_ms is gone after the next sweep, also one that a plain
    sqlite3 connection inserted out of id order (an old created_at_ms under a new id), also when
    it is the newest row of the table, also one stamped just past the cutoff next to newer rows."""
    clock = q.ManualClock(TEN_AM)
    if case == "before-open":
        with q.QuotaEngine(db_path, clock=clock, env={}, retention_ms=HOUR) as e:
            e.record_request(P, M, K)
        insert_raw(db_path, [(P, M, K, "tokens", 5, TEN_AM - 3 * HOUR)])
    with q.QuotaEngine(db_path, clock=clock, env={}, retention_ms=HOUR) as e:
        e.record_request(P, M, K)  # the first sweep
        clock.advance(MINUTE + 1)
        if case == "newest-row":
            insert_raw(db_path, [(P, M, K, "request", 0, TEN_AM - 2 * HOUR)])
            e.set_cooldown(P, M, K, duration_ms=1_000)  # a write section with no usage row
        elif case == "among-newer-rows":
            insert_raw(db_path, [(P, M, K, "request", 0, TEN_AM - 2 * HOUR)])
            for _ in range(3):
                e.record_request(P, M, K)
        elif case == "just-past-the-cutoff":
            # Rows of the last hour, then (at 11:00:30) one stamped 10:00:20: within a minute
            # of the newest row, so no straggler, but 10 s past the cutoff of 11:00:30.
            for i in range(60):
                clock.set(TEN_AM + i * MINUTE)
                e.record_request(P, M, K)
            clock.set(TEN_AM + HOUR + 30_000)
            insert_raw(db_path, [(P, M, K, "request", 0, TEN_AM + 20_000)])
            e.record_request(P, M, K)
            clock.advance(MINUTE)
            e.record_request(P, M, K)
        else:
            e.record_request(P, M, K)
        cutoff = clock.now_ms() - HOUR
        assert stale_rows(db_path, cutoff) == 0
        # Nothing else went: every row of the last hour is there and counted.
        ((kept,),) = sql(db_path, "SELECT COUNT(*) FROM rate_limit_usage WHERE kind = 'request'")
        assert e.usage(P, M, K)["rpd"]["used"] >= kept - 1  # the rpd window starts at midnight


def test_rows_after_a_sweep_took_the_newest_ids_are_counted_by_every_engine(db_path: Path) -> None:
    """When a sweep deletes the newest rows, SQLite hands their ids out again: an engine that
    follows the table by id must still see the rows that reuse them."""
    clock = q.ManualClock(TEN_AM)
    with (
        q.QuotaEngine(db_path, clock=clock, env={}, retention_ms=HOUR) as a,
        q.QuotaEngine(db_path, clock=clock, env={}, retention_ms=HOUR) as b,
    ):
        a.record_request(P, M, K)
        clock.advance(MINUTE + 1)
        insert_raw(db_path, [(P, "old", K, "request", 0, TEN_AM - 2 * HOUR)] * 3)  # the newest ids
        assert b.usage(P, M, K)["rpm"]["used"] == 0  # b has followed the table up to them
        a.set_cooldown(P, "x", K, duration_ms=1)  # sweeps: the three newest rows go
        assert stale_rows(db_path, TEN_AM) == 0
        for _ in range(3):
            a.record_request(P, M, K)  # the same ids again
        insert_raw(db_path, [(P, M, K, "request", 0, clock.now_ms())])
        assert b.usage(P, M, K)["rpm"]["used"] == 4
        assert b.usage(P, M, K)["rpd"]["used"] == 5
        assert a.usage(P, M, K)["rpd"]["used"] == 5
        for _ in range(2):
            b.record_request(P, M, K)
        assert a.usage(P, M, K)["rpd"]["used"] == 7


def test_usage_buffered_past_the_retention_is_not_written(store: str) -> None:
    """Events buffered longer than retention_ms (grouped writes here) are past the retention when
    they reach the store: no backend keeps them."""
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(store, clock=clock, env={}, retention_ms=HOUR, flush_interval_ms=600_000) as e:
        e.record_request(P, M, K)
        e.record_tokens(P, M, K, 9)
        clock.advance(HOUR + MINUTE)
        e.record_request(P, M, K)
    with q.QuotaEngine(store, clock=clock, env={}, retention_ms=HOUR) as other:
        events = other.usage_events()
    assert [(ev["kind"], ev["created_at_ms"]) for ev in events] == [("request", TEN_AM + HOUR + MINUTE)]
