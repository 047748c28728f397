"""SPEC 24.4 on Redis: a store that lost its data (a restart without persistence, a
``FLUSHALL``, an empty server in its place) under a running fleet is never trusted empty.
The engines that find it log an error and write back what they know (configuration,
cooldowns, learned limits, their own usage of the windows still open), once each, and
no limit is ever lifted meanwhile."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
import quotaengine as q
from moments import TEN_AM
from redis_servers import RedisServer, command
from stores import BACKENDS

pytestmark = pytest.mark.skipif("redis" not in BACKENDS, reason="QE_BACKENDS leaves Redis out")

P, M, K = "groq", "llama", 1
BENCHED = "mixtral"  # a route of key K benched for an hour
HOUR = 3_600_000

WORKER = """
    import sys
    import quotaengine as q
    url, now = sys.argv[1], int(sys.argv[2])
    e = q.QuotaEngine(url, clock=q.ManualClock(now), env={}, busy_timeout_ms=2000)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "lease":  # up to N leases on the rpm=5 route: how many were admitted
            n = 0
            for _ in range(int(cmd[1])):
                try:
                    e.lease("groq", "llama", 1, 10).success(tokens=10)
                    n += 1
                except q.QuotaExceeded:
                    pass
            print(n, flush=True)
        elif cmd[0] == "used":
            print(e.usage("groq", "llama", 1)["rpm"]["used"], flush=True)
        elif cmd[0] == "benched":
            try:
                e.lease("groq", "mixtral", 1, 10).success(tokens=10)
                print("admitted", flush=True)
            except q.QuotaExceeded as x:
                print("refused", x.reason, flush=True)
        elif cmd[0] == "degraded":
            print(int(e.degraded), flush=True)
        elif cmd[0] == "quit":
            break
    e.close()
"""


class Worker:
    """An engine in a process of its own, driven line by line."""

    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(WORKER), url, str(TEN_AM)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.ask_nothing() == "ready"

    def ask_nothing(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def ask(self, cmd: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        answer = self.ask_nothing()
        if not answer:
            _, err = self.proc.communicate(timeout=10)
            raise AssertionError(f"worker died: {err}")
        return answer

    def stop(self) -> str:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        _, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err
        return err


@pytest.fixture
def workers(own_server: RedisServer) -> Iterator[list[Worker]]:
    configure(own_server.url)
    ws = [Worker(own_server.url), Worker(own_server.url)]
    yield ws
    for w in ws:
        if w.proc.poll() is None:
            w.proc.kill()
        w.proc.wait()


def configure(url: str) -> None:
    """Everything SPEC 24.4 names, declared once by an engine that then goes away."""
    with q.QuotaEngine(url, clock=q.ManualClock(TEN_AM), env={}) as e:
        e.register_key(K, P, account="org-1")
        e.register_key(2, P, account="org-1")
        e.set_model_limits(P, M, rpm=5)
        e.set_cooldown(P, BENCHED, K, HOUR, "heuristic")
        e.set_key_concurrency_cap(P, K, 8)
        e.set_model_prices(P, M, q.Prices(0.5, 1.5))
        e.set_priority_reserve(1, 0.25)
        e.set_platform_calendar(P, "Europe/Paris")
        e.set_platform_limits(P, [q.Limit("requests", 1_000, "day")])
        e.set_tenant_limits("team:*", [q.Limit("requests", 50, "day")])
        held = [e.acquire_lease(P, "m2", 2) for _ in range(3)]
        e.record_failure(P, "m2", 2, kind="concurrency")  # learns key 2's cap: 3
        assert e.key_concurrency_cap(P, 2) == 3
        for i in held:
            e.release_lease(i)


def assert_configured(e: q.QuotaEngine) -> None:
    """What `configure` declared, as a fresh engine reads it from the store."""
    assert e.key_account(P, K) == "org-1"
    limits = e.model_limits(P, M)
    assert limits is not None and limits.rpm == 5
    cooldown = e.cooldown(P, BENCHED, K)
    assert cooldown is not None and cooldown.source == "heuristic"
    assert e.key_concurrency_cap(P, K) == 8
    assert e.key_concurrency_cap(P, 2) == 3  # learned
    assert e.model_prices(P, M) == q.Prices(0.5, 1.5)
    assert e.priority_reserve(1) == 0.25
    assert e.platform_calendar(P) == "Europe/Paris"
    assert e.platform_limits(P) == [q.Limit("requests", 1_000, "day")]
    assert e.tenant_limits("team:a") == [q.Limit("requests", 50, "day")]


def flushall(server: RedisServer) -> None:
    assert command(server.port, "FLUSHALL") == b"+OK\r\n"


def test_a_flush_under_two_engines_lifts_no_limit(own_server: RedisServer, workers: list[Worker]) -> None:
    """Two engine processes on an rpm=5 route, 2 admitted; FLUSHALL: the minute still admits
    3 more in all, never more; the benched route stays benched; the engines agree with a third
    one opened afterwards; each logged the loss as an error (a `server_logs` row)."""
    a, b = workers
    assert [a.ask("lease 1"), b.ask("lease 1")] == ["1", "1"]
    assert [a.ask("used"), b.ask("used")] == ["2", "2"]
    flushall(own_server)
    admitted = [int(a.ask("lease 10")), int(b.ask("lease 10"))]
    admitted += [int(a.ask("lease 10")), int(b.ask("lease 10"))]
    assert sum(admitted) == 3, admitted
    assert a.ask("benched").startswith("refused")
    assert b.ask("benched").startswith("refused")
    assert [a.ask("degraded"), b.ask("degraded")] == ["0", "0"]
    with q.QuotaEngine(own_server.url, clock=q.ManualClock(TEN_AM), env={}) as third:
        assert third.usage(P, M, K)["rpm"]["used"] == 5  # counted once
        assert_configured(third)
        lost = [r for r in third.server_logs() if r["event"] == "store_lost"]
        assert len(lost) == 2 and {r["level"] for r in lost} == {"error"}, lost
        assert "lost its data" in lost[0]["message"]
    assert [a.ask("used"), b.ask("used")] == ["5", "5"]
    for w in workers:
        assert "lost its data" in w.stop()  # the error reached the process's log too


def test_both_engines_refilling_leave_one_copy(own_server: RedisServer, workers: list[Worker]) -> None:
    """Both engines write back after the same flush: each item once, each usage row once."""
    a, b = workers
    assert [a.ask("lease 3"), b.ask("lease 3")] == ["3", "2"]
    assert [a.ask("used"), b.ask("used")] == ["5", "5"]
    flushall(own_server)
    assert [a.ask("used"), b.ask("used")] == ["5", "5"]  # each found the loss and wrote back
    with q.QuotaEngine(own_server.url, clock=q.ManualClock(TEN_AM), env={}) as third:
        assert third.usage(P, M, K)["rpm"]["used"] == 5
        assert len([ev for ev in third.usage_events() if ev["kind"] == "request"]) == 5
        assert len(third.stored_cooldowns()) == 1
        assert_configured(third)
    for w in workers:
        w.stop()


def test_a_restart_without_persistence_is_refilled(own_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """The server killed and started again empty (no persistence): the engine logs an error,
    writes back what it knows, and its limits, cooldowns and usage hold as before."""
    configure(own_server.url)
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(own_server.url, clock=clock, env={}, busy_timeout_ms=200) as e:
        for _ in range(4):
            e.lease(P, M, K, 10).success(tokens=10)
        own_server.kill()
        own_server.start()
        with caplog.at_level(logging.ERROR, logger="quotaengine"):
            e.lease(P, M, K, 10).success(tokens=10)  # the fifth (through the store, or from memory)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                e.record_request(P, "other", K)  # a write: reaches the store once it answers
                if not e.degraded:
                    break
                time.sleep(0.25)  # reconnects are paced (200 ms)
            assert not e.degraded
            with pytest.raises(q.QuotaExceeded):
                e.lease(P, M, K, 10)
            with pytest.raises(q.QuotaExceeded):
                e.lease(P, BENCHED, K, 10)
        assert any("lost its data" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
        with q.QuotaEngine(own_server.url, clock=clock, env={}) as other:
            assert other.usage(P, M, K)["rpm"]["used"] == 5
            assert_configured(other)


def test_an_engine_that_cannot_write_back_stays_degraded_and_enforces(own_server: RedisServer) -> None:
    """While what the engine knows cannot be written back (another engine holds the store's
    lock past the busy timeout), it serves degraded and enforces every limit from memory."""
    configure(own_server.url)
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(own_server.url, clock=clock, env={}, busy_timeout_ms=100) as e:
        for _ in range(3):
            e.lease(P, M, K, 10).success(tokens=10)
        flushall(own_server)
        # Another engine's lock, as a write section holds it (the refill waits for it).
        assert command(own_server.port, "SET", "quotaengine:lock", "someone", "PX", "60000") == b"+OK\r\n"
        for _ in range(2):
            e.lease(P, M, K, 10).success(tokens=10)
        assert e.degraded
        with pytest.raises(q.QuotaExceeded):
            e.lease(P, M, K, 10)
        with pytest.raises(q.QuotaExceeded):
            e.lease(P, BENCHED, K, 10)
        assert command(own_server.port, "DEL", "quotaengine:lock") == b":1\r\n"
        e.record_request(P, "other", K)  # a write: writes back, then what was buffered
        assert not e.degraded
        with q.QuotaEngine(own_server.url, clock=clock, env={}) as other:
            assert other.usage(P, M, K)["rpm"]["used"] == 5
            assert_configured(other)
            assert [r["event"] for r in other.server_logs() if r["level"] == "error"] == ["store_lost"]


def test_a_version_counter_reset_to_a_cached_value_leaves_no_engine_stale(own_server: RedisServer) -> None:
    """After a flush, a new engine declares other limits with as many writes as the old store
    had seen, so the table's version counter is back at the value the old engine cached: the
    old engine still reads what the store now holds (and writes back only what is absent)."""
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(own_server.url, clock=clock, env={}) as old:
        old.set_model_limits(P, M, rpm=5)
        old.set_model_limits(P, "m2", rpm=7)
        assert old.model_limits(P, M) is not None
        flushall(own_server)
        with q.QuotaEngine(own_server.url, clock=clock, env={}) as new:
            new.set_model_limits(P, M, rpm=3)
            new.set_model_limits(P, "m3", rpm=9)  # models' version: 2 again
        old.usage(P, M, K)  # reads the store
        assert old.model_limits(P, M).rpm == 3  # type: ignore[union-attr]
        assert old.model_limits(P, "m3").rpm == 9  # type: ignore[union-attr]
        assert old.model_limits(P, "m2").rpm == 7  # type: ignore[union-attr]  # written back
        for _ in range(3):
            old.lease(P, M, K, 1).success(tokens=1)
        with pytest.raises(q.QuotaExceeded):
            old.lease(P, M, K, 1)


def test_a_version_counter_deleted_alone_leaves_no_engine_stale(own_server: RedisServer) -> None:
    """The table versions deleted (the data kept): the next change starts its counter where no
    engine's cached value can be, so every engine reads the table again."""
    clock = q.ManualClock(TEN_AM)
    with (
        q.QuotaEngine(own_server.url, clock=clock, env={}) as a,
        q.QuotaEngine(own_server.url, clock=clock, env={}) as b,
    ):
        a.set_model_limits(P, M, rpm=5)
        assert b.model_limits(P, M).rpm == 5  # type: ignore[union-attr]  # b caches the models' version
        assert command(own_server.port, "DEL", "quotaengine:ver") == b":1\r\n"
        a.set_model_limits(P, M, rpm=3)  # the models' counter starts again
        b.usage(P, M, K)  # reads what changed
        assert b.model_limits(P, M).rpm == 3  # type: ignore[union-attr]
