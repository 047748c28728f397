"""Several processes on one file behave as one engine (SPEC §10): atomic admission across processes,
rows written elsewhere seen by the next call, reopening keeps state, leases of a killed process expire,
and every call that returned survives a SIGKILL."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest
import quotaengine as q
from moments import TEN_AM
from subprocesses import finish, race, spawn, stderr_of

P, M, K = "groq", "llama-3.1-8b", 1


def usage_at(db_path: Path | str, now_ms: int = TEN_AM, **kwargs: int) -> dict:
    with q.QuotaEngine(db_path, clock=q.ManualClock(now_ms), env={}, **kwargs) as e:
        return e.usage(P, M, K)


RACE = """
    import random, sys, threading, time
    import quotaengine as q
    db, now, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    flush = 50 if mode == "success" else 0
    e = q.QuotaEngine(db, clock=q.ManualClock(now), env={}, flush_interval_ms=flush)
    held = []
    counts = [0] * 8
    errors = []
    barrier = threading.Barrier(8)

    def worker(i):
        try:
            barrier.wait()
            while True:
                try:
                    lease = e.lease("groq", "llama-3.1-8b", 1, 10)
                    if mode == "success":
                        lease.success(tokens=10)
                    else:
                        held.append(lease)
                    counts[i] += 1
                    # spreads the admissions over time so that every process takes part in the race
                    time.sleep(random.uniform(0, 0.004))
                except q.QuotaExceeded as exc:
                    if exc.reason != "rpm":
                        errors.append(exc.reason)
                    return
        except BaseException as exc:
            errors.append(repr(exc))

    print("ready", flush=True)
    sys.stdin.readline()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if mode == "success":
        e.close()
    print("admitted", sum(counts), "errors", len(errors), *errors, flush=True)
    # In "hold" mode the leases stay held: the process exits without releasing them.
    import os
    os._exit(0)
"""


@pytest.mark.parametrize("mode", ["hold", "success"])
def test_four_processes_eight_threads_admit_exactly_rpm(store: str, mode: str) -> None:
    # "hold": every admitted lease stays live. "success": each is completed at once, with grouped
    # writes (flush_interval_ms=50), which must not loosen admission across processes.
    with q.QuotaEngine(store, clock=q.ManualClock(TEN_AM), env={}) as e:
        e.set_model_limits(P, M, rpm=100)  # the children read it from the file
    per_process = []
    for words in race(RACE, [[store, str(TEN_AM), mode]] * 4, timeout=20):
        assert words[0] == "admitted" and words[2] == "errors" and words[3] == "0", words
        per_process.append(int(words[1]))
    assert sum(per_process) == 100
    assert sum(1 for n in per_process if n) >= 2, per_process  # it was a race
    u = usage_at(store)
    assert u["rpm"]["limit"] == 100
    if mode == "hold":
        assert (u["in_flight"], u["rpm"]["used"]) == (100, 0)
    else:
        assert (u["in_flight"], u["rpm"]["used"], u["tpm"]["used"]) == (0, 100, 1000)


def test_grouped_writes_keep_admission_exact_between_engines(store: str) -> None:
    clock = q.ManualClock(TEN_AM)
    with (
        q.QuotaEngine(store, clock=clock, env={}, flush_interval_ms=60_000) as a,
        q.QuotaEngine(store, clock=clock, env={}, flush_interval_ms=60_000) as b,
    ):
        a.set_model_limits(P, M, rpm=3)
        outcomes = []
        for e in (a, b, a, b, a, b):
            try:
                with e.lease(P, M, K, 10):
                    pass
                outcomes.append("ok")
            except q.QuotaExceeded as exc:
                outcomes.append(exc.reason)
        assert outcomes == ["ok", "ok", "ok", "rpm", "rpm", "rpm"]
        # Until the other engine's grouped events land, its finished lease still
        # counts (as in flight): each engine sees all three requests.
        for e in (a, b):
            u = e.usage(P, M, K)
            assert u["rpm"]["used"] + u["in_flight"] == 3
    # after a clean close everything is in the file
    with q.QuotaEngine(store, clock=clock, env={}) as c:
        u = c.usage(P, M, K)
        assert (u["rpm"]["used"], u["in_flight"]) == (3, 0)


WRITE_ONE = """
    import sys
    import quotaengine as q
    db, now = sys.argv[1], int(sys.argv[2])
    with q.QuotaEngine(db, clock=q.ManualClock(now), env={}) as e:
        e.record_request("groq", "llama-3.1-8b", 1)
        e.record_tokens("groq", "llama-3.1-8b", 1, 70)
        e.acquire_lease("groq", "llama-3.1-8b", 1, 30)
        e.set_cooldown("groq", "other-model", 1, duration_ms=60_000)
        e.set_model_limits("groq", "llama-3.1-8b", rpm=2)
"""


def test_rows_from_another_process_are_seen_by_the_next_call(store: str, engine: q.QuotaEngine) -> None:
    # The fixture engine has already read the (empty) file.
    assert engine.usage(P, M, K)["rpm"]["used"] == 0
    assert engine.can_make_request(P, M, K)
    with spawn(WRITE_ONE, store, str(TEN_AM)) as proc:
        finish(proc)
    u = engine.usage(P, M, K)
    assert (u["rpm"]["used"], u["rpd"]["used"], u["tpm"]["used"], u["tpd"]["used"]) == (1, 1, 70, 70)
    assert u["in_flight"] == 1
    assert u["rpm"]["limit"] == 2
    assert engine.model_limits(P, M) == q.Limits(rpm=2)
    assert not engine.can_make_request(P, M, K)  # 1 used + 1 leased >= 2
    assert engine.is_on_cooldown(P, "other-model", K)
    assert engine.check(P, "other-model", K).reason == "cooldown"


@pytest.mark.sqlite_only
def test_rows_from_plain_sqlite3_are_seen_by_the_next_call(db_path: Path, engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=3, tpm=500)
    engine.record_request(P, M, K)
    assert engine.can_make_request(P, M, K)
    now = engine.now_ms()
    con = sqlite3.connect(db_path, isolation_level=None)
    try:
        con.execute(
            "INSERT INTO rate_limit_usage(platform, model_id, key_id, kind, tokens, created_at_ms) "
            "VALUES (?, ?, ?, 'request', 1, ?)",
            (P, M, K, now),
        )
        con.execute(
            "INSERT INTO rate_limit_usage(platform, model_id, key_id, kind, tokens, created_at_ms) "
            "VALUES (?, ?, ?, 'tokens', 450, ?)",
            (P, M, K, now),
        )
    finally:
        con.close()
    u = engine.usage(P, M, K)
    assert (u["rpm"]["used"], u["rpd"]["used"], u["tpm"]["used"], u["tpd"]["used"]) == (2, 2, 450, 450)
    assert engine.can_use_tokens(P, M, K, 50)
    assert not engine.can_use_tokens(P, M, K, 51)
    # One more from sqlite3 fills rpm: the very next gate call must refuse.
    con = sqlite3.connect(db_path, isolation_level=None)
    try:
        con.execute(
            "INSERT INTO rate_limit_usage(platform, model_id, key_id, kind, tokens, created_at_ms) "
            "VALUES (?, ?, ?, 'request', 1, ?)",
            (P, M, K, now),
        )
    finally:
        con.close()
    assert not engine.can_make_request(P, M, K)
    with pytest.raises(q.QuotaExceeded):
        engine.lease(P, M, K)


@pytest.mark.sqlite_only
def test_cooldown_from_plain_sqlite3_is_seen(db_path: Path, engine: q.QuotaEngine) -> None:
    assert not engine.is_on_cooldown(P, M, K)
    now = engine.now_ms()
    con = sqlite3.connect(db_path, isolation_level=None)
    try:
        con.execute(
            "INSERT INTO rate_limit_cooldowns(platform, model_id, key_id, expires_at_ms, source, set_at_ms) "
            "VALUES (?, ?, ?, ?, 'heuristic', ?)",
            (P, M, K, now + 30_000, now),
        )
    finally:
        con.close()
    assert engine.is_on_cooldown(P, M, K)
    adm = engine.check(P, M, K)
    assert (adm.reason, adm.retry_at_ms) == ("cooldown", now + 30_000)


def all_cells(db_path: Path) -> set[object]:
    """Every value in every table of the file, read with plain sqlite3."""
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        cells: set[object] = set()
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for t in tables:
            for row in con.execute(f'SELECT * FROM "{t}"'):
                cells.update(row)
        return cells
    finally:
        con.close()


def test_reopening_keeps_everything(db_path: Path) -> None:
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        e.register_key(7, P, base_url="https://api.groq.example/v1", label="team-key-seven")
        e.set_model_limits(P, M, rpm=5, rpd=100, tpm=1000, tpd=None)
        e.record_request(P, M, K)
        e.record_tokens(P, M, K, 321)
        e.set_cooldown(P, "m2", K, duration_ms=90_000, source="authoritative")
        e.acquire_lease(P, M, K, 10)
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        assert e.model_limits(P, M) == q.Limits(rpm=5, rpd=100, tpm=1000, tpd=None)
        u = e.usage(P, M, K)
        assert (u["rpm"]["used"], u["rpd"]["used"], u["tpm"]["used"], u["tpd"]["used"]) == (1, 1, 321, 321)
        assert u["in_flight"] == 1
        cd = e.cooldown(P, "m2", K)
        assert cd is not None
        assert (cd.expires_at_ms, cd.source) == (TEN_AM + 90_000, "authoritative")
        assert e.is_on_cooldown(P, "m2", K)
    cells = all_cells(db_path)
    assert "team-key-seven" in cells and "https://api.groq.example/v1" in cells


SIGKILL_LEASES = """
    import sys, time
    import quotaengine as q
    db = sys.argv[1]
    e = q.QuotaEngine(db, env={}, lease_max_age_ms=2_000)
    held = [e.lease("groq", "llama-3.1-8b", 1, 10) for _ in range(3)]
    print("leased", flush=True)
    time.sleep(60)
"""


def test_leases_of_a_killed_process_expire(store: str) -> None:
    # The real clock: each process has its own clock.
    with q.QuotaEngine(store, env={}) as e:  # default max age 120 s in this engine
        with spawn(SIGKILL_LEASES, store) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "leased", stderr_of(proc)
            t_leased = time.monotonic()
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        assert proc.returncode == -signal.SIGKILL
        u = e.usage(P, M, K)
        if time.monotonic() - t_leased < 1.5:
            assert u["in_flight"] == 3
            assert not e.can_make_request(P, M, K, limits={"rpm": 3})
        deadline = time.monotonic() + 8
        while e.usage(P, M, K)["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert e.usage(P, M, K)["in_flight"] == 0
        assert time.monotonic() - t_leased >= 1.5  # not before their max age
        assert e.can_make_request(P, M, K, limits={"rpm": 1})
        assert e.usage(P, M, K)["rpm"]["used"] == 0  # the dead leases recorded nothing


DURABLE = """
    import sys
    import quotaengine as q
    db, now, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    e = q.QuotaEngine(db, clock=q.ManualClock(now), env={})
    print("ready", flush=True)
    i = 0
    while True:
        if how == "record":
            e.record_request("groq", "llama-3.1-8b", 1)
        else:
            e.lease("groq", "llama-3.1-8b", 1, 5).success(tokens=5)
        i += 1
        print(f"done {i}", flush=True)
"""


@pytest.mark.parametrize("how", ["record", "lease"])
def test_sigkill_loses_nothing_that_returned(db_path: Path, how: str) -> None:
    with spawn(DURABLE, str(db_path), str(TEN_AM), how) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", stderr_of(proc)
        last = 0
        while last < 150:
            line = proc.stdout.readline()
            assert line.startswith("done"), line + stderr_of(proc)
            last = int(line.split()[1])
        os.kill(proc.pid, signal.SIGKILL)
        rest = proc.stdout.read()  # lines printed before the kill landed
        proc.wait(10)
        assert proc.returncode == -signal.SIGKILL
    # The kill can land inside a write: only a line that ended was printed whole.
    for line in rest.splitlines(keepends=True):
        if line.startswith("done ") and line.endswith("\n"):
            last = max(last, int(line.split()[1]))
    u = usage_at(db_path)
    # Every call that returned is counted; at most the one in progress more.
    assert last <= u["rpd"]["used"] <= last + 1
    if how == "lease":
        assert u["tpd"]["used"] == 5 * u["rpd"]["used"]
    con = sqlite3.connect(db_path)
    try:
        (n,) = con.execute("SELECT COUNT(*) FROM rate_limit_usage WHERE kind = 'request'").fetchone()
    finally:
        con.close()
    assert n == u["rpd"]["used"]


# ------------------------------------------------------------------ a sole engine keeps the lock

PACED = """
    import sys, time
    import quotaengine as q
    db, now, seconds, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    e = q.QuotaEngine(db, clock=q.ManualClock(now), env={}, flush_interval_ms=50, busy_timeout_ms=1000)
    print("ready", flush=True)
    sys.stdin.readline()
    admitted, slowest = 0, 0.0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t = time.monotonic()
        try:
            e.lease("groq", "llama-3.1-8b", 1, 10).success(tokens=10)
            admitted += 1
        except q.QuotaExceeded:
            pass
        slowest = max(slowest, time.monotonic() - t)
        if pause:
            time.sleep(pause)
    print("admitted", admitted, "degraded", e.degraded, "slowest_ms", round(slowest * 1000, 1), flush=True)
    e.close()
"""


@pytest.mark.sqlite_only
def test_a_sole_engine_yields_the_lock_to_one_that_opens_later(tmp_path: Path) -> None:
    """With grouped writes an engine alone on a file keeps SQLite's write lock from one call to the
    next (at most 10 ms at a time). A second process that opens the file while it does must get its
    turns well within its busy timeout, never degrade, and the two together admit exactly the limit."""
    db = tmp_path / "q.db"
    with q.QuotaEngine(db, clock=q.ManualClock(TEN_AM), env={}) as e:
        e.set_model_limits(P, M, rpm=600)
    with spawn(PACED, str(db), str(TEN_AM), "1.5", "0.001") as first:
        assert first.stdout is not None and first.stdin is not None
        assert first.stdout.readline().strip() == "ready", stderr_of(first)
        first.stdin.write("go\n")
        first.stdin.flush()
        time.sleep(0.3)  # the first runs alone, holding the lock across calls
        with spawn(PACED, str(db), str(TEN_AM), "0.8", "0") as second:
            assert second.stdout is not None and second.stdin is not None
            assert second.stdout.readline().strip() == "ready", stderr_of(second)
            second.stdin.write("go\n")
            second.stdin.flush()
            outs = [finish(second), finish(first)]
    results = []
    for out in outs:
        words = out.split()
        assert words[0] == "admitted" and words[2] == "degraded", out
        results.append((int(words[1]), words[3], float(words[5])))
    assert [r[1] for r in results] == ["False", "False"], results
    assert all(r[0] > 0 for r in results), results
    assert sum(r[0] for r in results) == 600, results
    assert results[0][2] < 500, results  # the second never waited near its busy timeout
    assert usage_at(db)["rpm"]["used"] == 600


@pytest.mark.sqlite_only
def test_a_held_lock_ends_on_time_when_calls_stop(tmp_path: Path) -> None:
    """An idle engine does not keep the write lock: within its hold period (plus scheduling) its
    writes are committed and a plain sqlite3 writer gets the lock at once."""
    db = tmp_path / "q.db"
    with q.QuotaEngine(db, clock=q.ManualClock(TEN_AM), env={}, flush_interval_ms=60_000) as e:
        assert Path(f"{db}-engines").exists()  # its registration: others see it is not alone
        e.lease(P, M, K, 10).success(tokens=10)
        deadline = time.monotonic() + 5
        while True:
            con = sqlite3.connect(db, timeout=0)
            try:
                con.execute("BEGIN IMMEDIATE")
                rows = con.execute("SELECT kind, tokens FROM rate_limit_usage ORDER BY kind").fetchall()
                con.execute("ROLLBACK")
                break
            except sqlite3.OperationalError:
                assert time.monotonic() < deadline, "the engine kept the write lock"
                time.sleep(0.005)
            finally:
                con.close()
        assert rows == [("request", 0), ("tokens", 10)]
        assert e.usage(P, M, K)["rpm"]["used"] == 1
    assert not Path(f"{db}-engines").exists()  # the last engine out removes it


@pytest.mark.sqlite_only
def test_threads_of_a_sole_engine_holding_the_lock_admit_exactly_rpm(tmp_path: Path) -> None:
    """8 threads race one engine that keeps the write lock across calls (alone on its file,
    grouped writes): exactly rpm admitted, and every one of them is in the file after close."""
    import threading

    db = tmp_path / "q.db"
    admitted: list[int] = []
    with q.QuotaEngine(db, clock=q.ManualClock(TEN_AM), env={}, flush_interval_ms=10) as e:
        e.set_model_limits(P, M, rpm=100)

        def work() -> None:
            n = 0
            for _ in range(200):
                try:
                    with e.lease(P, M, K, 10) as lease:
                        lease.success(tokens=10)
                    n += 1
                except q.QuotaExceeded:
                    pass
            admitted.append(n)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(admitted) == 100, admitted
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT kind, COUNT(*), SUM(tokens) FROM rate_limit_usage GROUP BY kind").fetchall()
        leases = con.execute("SELECT COUNT(*) FROM quota_leases").fetchone()
    finally:
        con.close()
    assert sorted(rows) == [("request", 100, 0), ("tokens", 100, 1000)]
    assert leases == (0,)
