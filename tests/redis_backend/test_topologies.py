"""SPEC 19.3 and 19.4 on real ``redis-server`` processes: Sentinel (a primary, replicas and three
sentinels) and Cluster (three primaries) URLs, failovers (``SENTINEL FAILOVER`` and the primary
SIGKILLed) followed without a restart, the prefix in one hash slot, MOVED and ASK during a
resharding, and ``?wait_replicas=``. The shared contract also runs on both topologies through
the ``store`` fixture (conftest)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import quotaengine as q
from moments import TEN_AM
from outages import assert_one_row_per_request, buffer_events_past_merging
from redis_servers import RedisServer, free_port, tls_files
from redis_topologies import SERVICE, Cluster, Sentinel, SentinelSet, calls, cli, info, wait_until
from stores import BACKENDS

P, M, K = "groq", "llama", 1

pytestmark = pytest.mark.skipif("redis" not in BACKENDS, reason="QE_BACKENDS leaves Redis out")


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelSet]:
    """A sentinel set of this test's own, which it may fail over."""
    topology = SentinelSet(tmp_path / "sentinel")
    yield topology
    topology.close()


def stored(url: str, key: int = K) -> tuple[int, int, int]:
    """(requests, tokens, live leases) of `key` as a fresh engine reads them."""
    with q.QuotaEngine(url, clock=q.ManualClock(TEN_AM), env={}) as e:
        u = e.usage(P, M, key)
        return u["rpd"]["used"], u["tpd"]["used"], u["in_flight"]


def until_recovered(e: q.QuotaEngine, timeout: float = 30) -> None:
    """Writes that count nothing until the engine is no longer degraded (reconnects are paced)."""
    deadline = time.monotonic() + timeout
    while e.degraded and time.monotonic() < deadline:
        time.sleep(0.1)
        e.set_platform_calendar(P, None)
    assert not e.degraded


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel:///qe", "no sentinel host"),
        ("redis+sentinel://127.0.0.1:26379", "no service name"),
        ("redis+sentinel://127.0.0.1:26379/?prefix=a", "no service name"),
        ("redis+cluster://?prefix=a", "no cluster node host"),
        ("redis+cluster://127.0.0.1:7000/0", "only database 0"),
        ("redis+cluster://127.0.0.1:7000/3?prefix=a", "only database 0"),
        ("redis+clusters://127.0.0.1:7000", "unknown Redis URL scheme"),
        ("rediss+sentinal://127.0.0.1:26379/qe", "unknown Redis URL scheme"),
        ("redis+sentinel://127.0.0.1:99999/qe", "bad port"),
        ("redis://127.0.0.1:6379/0?wait_replicas=many", "wait_replicas"),
        ("redis://127.0.0.1:6379/0?sentinel_password=x", r"for redis\+sentinel://"),
    ],
)
def test_bad_urls_are_value_errors_naming_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        q.QuotaEngine(url, env={})


def test_a_service_no_sentinel_knows_is_a_database_error(redis_sentinel: SentinelSet) -> None:
    url = redis_sentinel.url().replace("/qe?", "/nosuch?")
    with pytest.raises(q.DatabaseError, match='no sentinel knows a service named "nosuch"'):
        q.QuotaEngine(url, env={})


def test_sentinels_all_down_at_open_is_a_database_error() -> None:
    ports = [free_port() for _ in range(3)]
    url = f"redis+sentinel://{','.join(f'127.0.0.1:{p}' for p in ports)}/qe"
    with pytest.raises(q.DatabaseError, match=f"sentinel 127.0.0.1:{ports[2]}"):
        q.QuotaEngine(url, env={})


def test_sentinel_one_round_trip_per_call_and_sentinels_asked_only_at_open(redis_sentinel: SentinelSet) -> None:
    primary = redis_sentinel.primary_port()
    assert primary is not None
    asked = "sentinel|get-master-addr-by-name"
    with q.QuotaEngine(redis_sentinel.url(), clock=q.ManualClock(TEN_AM), env={}) as e:
        e.set_model_limits(P, M, rpm=1000)
        e.check(P, M, K)
        before = calls(primary, "evalsha", "eval")
        questions = sum(calls(s.port, asked) for s in redis_sentinel.sentinels)
        for _ in range(50):
            e.lease(P, M, K, 10).success(tokens=12)
        assert calls(primary, "evalsha", "eval") - before == 50 * 2
        assert sum(calls(s.port, asked) for s in redis_sentinel.sentinels) == questions
        assert e.usage(P, M, K)["rpm"]["used"] == 50


def test_wait_replicas_rides_in_the_same_round_trip(redis_sentinel: SentinelSet) -> None:
    """With ?wait_replicas=1 every write is followed by WAIT: the script calls stay one per
    lease and one per success, each with its WAIT, and nothing is degraded."""
    primary = redis_sentinel.primary_port()
    assert primary is not None
    with q.QuotaEngine(redis_sentinel.url(query="wait_replicas=1"), clock=q.ManualClock(TEN_AM), env={}) as e:
        e.set_model_limits(P, M, rpm=1000)
        e.check(P, M, K)
        scripts, waits = calls(primary, "evalsha", "eval"), calls(primary, "wait")
        for _ in range(20):
            e.lease(P, M, K, 10).success(tokens=3)
        assert calls(primary, "evalsha", "eval") - scripts == 40
        assert calls(primary, "wait") - waits == 40
        assert not e.degraded


def test_sentinel_failover_is_followed_without_a_restart(sentinels: SentinelSet) -> None:
    """SENTINEL FAILOVER with ?wait_replicas=1: the engine follows the new primary (the demoted
    one refuses writes and drops its clients), degraded at most while it switches; what it
    wrote to the old primary after the replica was promoted was not confirmed, so it is sent
    again to the new one: the requests and tokens stored equal what the callers were told."""
    url = sentinels.url(query="wait_replicas=1")
    told = [0, 0]
    with q.QuotaEngine(url, clock=q.ManualClock(TEN_AM), env={}, busy_timeout_ms=300) as e:
        e.set_model_limits(P, M, rpm=10_000)

        def call(tokens: int) -> None:
            e.lease(P, M, K, 10).success(tokens=tokens)
            told[0] += 1
            told[1] += tokens

        for i in range(20):
            call(i)
        old = sentinels.primary_port()
        assert old is not None
        assert cli(sentinels.sentinels[0].port, "SENTINEL", "FAILOVER", "qe") == "OK"
        deadline = time.monotonic() + 30
        while sentinels.primary_port() == old and time.monotonic() < deadline:
            call(1)
            time.sleep(0.01)
        new = sentinels.wait_new_primary(old)
        # Until the demoted primary drops the engine, which then asks the sentinels again.
        while calls(new, "evalsha", "eval") == 0 and time.monotonic() < deadline:
            call(2)
            time.sleep(0.05)
        assert calls(new, "evalsha", "eval") > 0
        sentinels.wait_settled()
        until_recovered(e)
        call(5)
        assert not e.degraded
    assert stored(url) == (told[0], told[1], 0)


def listeners() -> int:
    """Threads of this process that listen to the sentinels (by their name)."""
    return sum(Path(t, "comm").read_text().strip() == "qe-sentinel" for t in Path("/proc/self/task").iterdir())


def subscribers(sentinel: Sentinel) -> int:
    """Clients subscribed to a channel on `sentinel` (``CLIENT LIST``'s ``sub=``)."""
    if sentinel.proc is None:
        return 0
    out = cli(sentinel.port, "CLIENT", "LIST", password=sentinel.password, ca=sentinel.ca)
    return sum(" sub=1 " in line for line in out.splitlines())


@pytest.mark.parametrize("tls", [False, True], ids=["redis", "rediss"])
def test_sentinel_failover_without_wait_replicas_writes_go_where_the_sentinels_announce(
    tmp_path: Path, tls: bool
) -> None:
    """SENTINEL FAILOVER without ?wait_replicas=: the demoted primary goes on answering as a
    primary, taking writes, for seconds after the promotion (until the sentinels reconfigure
    it). The engine hears the sentinels announce the new primary (+switch-master) and moves
    there at its next call: the calls made once every sentinel names the new primary land on
    it while the old one still says it is a primary, and what the callers were told of them is
    what the surviving primary holds after the old one resynchronised from it. `rediss`: every
    server, sentinels included, speaks only TLS (rediss+sentinel:// with ?ssl_ca_certs=)."""
    sentinels = SentinelSet(tmp_path / "sentinel", tls=tls_files(tmp_path / "tls") if tls else None)
    try:
        failover_without_wait_replicas(sentinels)
    finally:
        sentinels.close()


def failover_without_wait_replicas(sentinels: SentinelSet) -> None:
    ca = sentinels.ca
    url = sentinels.url()
    assert url.startswith("rediss+sentinel://" if ca else "redis+sentinel://")
    log = f"{url.split('prefix=')[1].split('&')[0]}:log"
    told = {key: [0, 0] for key in (1, 2, 3)}
    with q.QuotaEngine(url, clock=q.ManualClock(TEN_AM), env={}, busy_timeout_ms=300) as e:
        e.set_model_limits(P, M, rpm=10_000)

        def call(key: int, tokens: int) -> None:
            e.lease(P, M, key, 10).success(tokens=tokens)
            told[key][0] += 1
            told[key][1] += tokens

        for i in range(10):  # key 1: before the failover, replicated
            call(1, i)
        sentinels.wait_replicated()
        old = sentinels.primary_port()
        assert old is not None
        new = sentinels.failover()
        # Key 3: from the FAILOVER until every sentinel names the new primary (each announces
        # it as it switches) and the engine's listener has heard one of them.
        wait_until(
            lambda: all(
                cli(s.port, "SENTINEL", "get-master-addr-by-name", SERVICE, ca=ca).split() == ["127.0.0.1", str(new)]
                for s in sentinels.sentinels
            ),
            10,
            "every sentinel to name the new primary",
        )
        deadline = time.monotonic() + 2
        while calls(new, "evalsha", "eval", ca=ca) == 0:
            assert time.monotonic() < deadline, "the engine still writes to the demoted primary"
            call(3, 1)
            time.sleep(0.01)
        # Key 2: after the announcement, while the demoted primary still says it is one.
        on_old = calls(old, "evalsha", "eval", ca=ca)
        in_log = int(cli(new, "XLEN", log, ca=ca))
        for i in range(30):
            call(2, 1 + i % 5)
        assert calls(old, "evalsha", "eval", ca=ca) == on_old  # none of them went to the old primary
        assert info(old, "replication", ca)["role"] == "master"  # which was still taking writes
        assert int(cli(new, "XLEN", log, ca=ca)) >= in_log + 30  # each a usage entry there
        assert not e.degraded
    sentinels.wait_settled()  # the old primary is a replica of the new one, resynchronised
    assert info(old, "replication", ca)["role"] == "slave"
    assert stored(url, 2) == (told[2][0], told[2][1], 0)
    assert stored(url, 1) == (told[1][0], told[1][1], 0)
    requests, tokens, _ = stored(url, 3)  # what went to the old primary before the announcement is lost
    assert requests <= told[3][0] and tokens <= told[3][1]


def test_the_sentinel_listener_moves_to_a_live_sentinel_and_ends_with_the_engine(sentinels: SentinelSet) -> None:
    """The engine's listener subscribes on one sentinel; when that sentinel dies it subscribes
    on another; closing the engine ends it (its subscription and its thread are gone)."""
    e = q.QuotaEngine(sentinels.url(), clock=q.ManualClock(TEN_AM), env={})
    try:
        e.record_request(P, M, K)
        wait_until(lambda: sum(subscribers(s) for s in sentinels.sentinels) == 1, 10, "the listener to subscribe")
        running = listeners()
        assert running >= 1
        heard = next(s for s in sentinels.sentinels if subscribers(s) == 1)
        heard.kill()
        wait_until(lambda: sum(subscribers(s) for s in sentinels.sentinels) == 1, 10, "it to move to another sentinel")
        e.record_request(P, M, K)
        assert not e.degraded
    finally:
        e.close()
    wait_until(lambda: sum(subscribers(s) for s in sentinels.sentinels) == 0, 5, "the subscription to end")
    wait_until(lambda: listeners() <= running - 1, 5, "the listener thread to end")


# Python 3.12+ warns about fork() in a process with threads: forking such a process is the case.
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_a_forked_child_listens_to_the_sentinels_with_a_thread_of_its_own(sentinels: SentinelSet) -> None:
    """The parent's listener thread is not in a forked child: the child's engine, opened anew
    at its first call there, starts its own (a second subscription while the child lives); the
    parent's goes on."""
    with q.QuotaEngine(sentinels.url(), env={}) as e:
        e.record_request(P, M, K)
        wait_until(lambda: sum(subscribers(s) for s in sentinels.sentinels) == 1, 10, "the listener to subscribe")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                os.close(r)
                before = listeners()
                e.record_request(P, M, K)
                wait_until(lambda: listeners() == before + 1, 5, "the child's listener")
                wait_until(lambda: sum(subscribers(s) for s in sentinels.sentinels) == 2, 10, "its subscription")
                os.write(w, f"{before} {listeners()}".encode())
                q._close_engines_at_exit()
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        out = b""
        while chunk := os.read(r, 1024):
            out += chunk
        os.close(r)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert out.decode().split() == ["0", "1"]  # none inherited, its own started
        wait_until(lambda: sum(subscribers(s) for s in sentinels.sentinels) == 1, 5, "the child's to end")
        e.record_request(P, M, K)
        assert e.usage(P, M, K)["rpd"]["used"] == 3


def test_primary_killed_degrades_then_replays_once_to_the_new_primary(sentinels: SentinelSet) -> None:
    """The primary SIGKILLed: the engine serves from memory and enforces the limit while the
    sentinels fail over, then writes its buffer, once, to the promoted replica."""
    url = sentinels.url()
    with q.QuotaEngine(url, clock=q.ManualClock(TEN_AM), env={}, busy_timeout_ms=300) as e:
        for _ in range(3):
            e.lease(P, M, K, 10, limits={"rpm": 8}).success(tokens=10)
        sentinels.wait_replicated()  # the replica holds those three
        old = sentinels.primary()
        old.kill()
        for _ in range(2):
            e.lease(P, M, K, 10, limits={"rpm": 8}).success(tokens=10)
        assert e.degraded
        sentinels.wait_new_primary(old.port)
        # Still counting from memory until it reconnects: 5 of 8 used.
        deadline = time.monotonic() + 30
        while e.degraded and time.monotonic() < deadline:
            time.sleep(0.1)
            e.usage(P, M, K)
            e.set_platform_calendar(P, None)
        assert not e.degraded
        for _ in range(3):
            e.lease(P, M, K, 10, limits={"rpm": 8}).success(tokens=10)
        with pytest.raises(q.QuotaExceeded):
            e.lease(P, M, K, 10, limits={"rpm": 8})
    assert stored(url) == (8, 80, 0)


def test_wait_replicas_keeps_an_unconfirmed_write_until_a_replica_holds_it(tmp_path: Path) -> None:
    """?wait_replicas=1 on a primary without a replica: the write is applied but unconfirmed,
    so the engine is degraded and keeps it; once a replica holds it, it is confirmed (applied
    once) and the engine recovers."""
    primary = RedisServer(tmp_path / "primary", extra=("--appendonly", "no"))
    replica: RedisServer | None = None
    try:
        url = f"{primary.url}?wait_replicas=1&wait_timeout_ms=50"
        with q.QuotaEngine(url, clock=q.ManualClock(TEN_AM), env={}, busy_timeout_ms=300) as e:
            e.lease(P, M, K, 10).success(tokens=7)
            assert e.degraded  # the success was applied on the primary, not confirmed
            e.record_request(P, M, K)  # buffered: the unconfirmed write goes again first
            assert e.degraded
            replica = RedisServer(tmp_path / "replica", extra=("--replicaof", "127.0.0.1", str(primary.port)))
            wait_until(lambda: info(primary.port, "replication").get("connected_slaves") == "1", 20, "a replica")
            until_recovered(e)
        plain = primary.url
        assert stored(plain) == (2, 7, 0)
        assert stored(f"redis://127.0.0.1:{replica.port}/0") == (2, 7, 0)  # the replica holds it all
    finally:
        primary.kill()
        if replica is not None:
            replica.kill()


def test_cluster_keeps_a_prefix_in_one_slot_and_spreads_prefixes(redis_cluster: Cluster) -> None:
    """Every key of a prefix hashes to one slot ({prefix} is the hash tag), so each call is one
    round trip on one node; many prefixes spread over all three primaries."""
    owners = set()
    for i in range(24):
        prefix = f"fleet{i}"
        with q.QuotaEngine(redis_cluster.url(prefix), clock=q.ManualClock(TEN_AM), env={}) as e:
            e.set_model_limits(P, M, rpm=100)
            e.set_cooldown(P, M, K + 1, 60_000)
            e.lease(P, M, K, 10).success(tokens=1)
        slot = redis_cluster.slot(f"{{{prefix}}}")
        owner = redis_cluster.owner(slot)
        keys = redis_cluster.keys_in(owner, slot)
        assert {f"{{{prefix}}}:log", f"{{{prefix}}}:models", f"{{{prefix}}}:cooldowns"} <= set(keys)
        assert all(k.startswith(f"{{{prefix}}}:") for k in keys if prefix in k)
        owners.add(owner)
    assert owners == {n.port for n in redis_cluster.nodes}
    prefix = "rt"
    url = redis_cluster.url(prefix)
    owner = redis_cluster.owner(redis_cluster.slot("{rt}"))
    with q.QuotaEngine(url, clock=q.ManualClock(TEN_AM), env={}) as e:
        e.set_model_limits(P, M, rpm=1000)
        e.check(P, M, K)
        before = calls(owner, "evalsha", "eval")
        others = [calls(n.port, "evalsha", "eval") for n in redis_cluster.nodes if n.port != owner]
        for _ in range(50):
            e.lease(P, M, K, 10).success(tokens=12)
        assert calls(owner, "evalsha", "eval") - before == 100
        assert [calls(n.port, "evalsha", "eval") for n in redis_cluster.nodes if n.port != owner] == others


def test_cluster_resharding_ask_then_moved_is_followed(tmp_path: Path) -> None:
    """The prefix's slot migrated to another primary under a running engine. While its keys
    are on the importing node and the slot is not handed over, the old owner answers ASK: a
    one-key read follows it to the importing node; the script, which declares every key of the
    prefix, gets TRYAGAIN there (some of its keys do not exist yet) and the engine serves from
    memory. Once the slot is handed over the old owner answers MOVED: the engine follows,
    recovers, and nothing is lost or doubled."""
    cluster = Cluster(tmp_path / "cluster")
    try:
        url = cluster.url("moving")
        slot = cluster.slot("{moving}")
        src = cluster.owner(slot)
        dst = next(n.port for n in cluster.nodes if n.port != src)
        with q.QuotaEngine(url, clock=q.ManualClock(TEN_AM), env={}, busy_timeout_ms=300) as e:
            e.set_model_limits(P, M, rpm=12)
            for _ in range(5):
                e.lease(P, M, K, 10).success(tokens=2)
            cluster.begin_migration(slot, src, dst)
            assert cluster.keys_in(src, slot) == []
            assert "{moving}:log" in cluster.keys_in(dst, slot)
            # ASK followed: the usage feed read from the importing node.
            assert len([ev for ev in e.usage_events() if ev["kind"] == "request"]) == 5
            for _ in range(5):
                e.lease(P, M, K, 10).success(tokens=2)  # TRYAGAIN: from memory
            assert e.degraded
            cluster.end_migration(slot, dst)
            assert cluster.owner(slot) == dst
            until_recovered(e)  # MOVED: the connection moves to the new owner
            for _ in range(2):
                e.lease(P, M, K, 10).success(tokens=2)
            with pytest.raises(q.QuotaExceeded):
                e.lease(P, M, K, 10)  # the limit held throughout: 12
            assert not e.degraded
        assert stored(url) == (12, 24, 0)
        assert calls(dst, "evalsha", "eval") > 0
    finally:
        cluster.close()


LOAD = """
    import os, sys, threading, time
    import quotaengine as q
    url, now, phase_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    e = q.QuotaEngine(url, clock=q.ManualClock(now), env={}, busy_timeout_ms=300)
    print("ready", flush=True)
    told = [[0, 0] for _ in range(4)]
    served = [{"before": 0, "down": 0, "after": 0} for _ in range(4)]
    errors = []
    def work(i):
        n = 0
        while True:
            phase = open(phase_file).read().strip()
            if phase == "stop":
                return
            n += 1
            tokens = 1 + (n * 7 + i) % 13
            try:
                lease = e.lease("groq", "llama", 1, 10, limits={"rpm": 10**9})
                lease.success(tokens=tokens)
            except Exception as exc:
                errors.append(repr(exc))
                return
            told[i][0] += 1
            told[i][1] += tokens
            if phase in served[i]:
                served[i][phase] += 1
            time.sleep(0.002)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 30
    while e.degraded and time.monotonic() < deadline:
        time.sleep(0.1)
        e.set_platform_calendar("groq", None)  # a write that counts nothing: flushes
    down = sum(s["down"] for s in served)
    print(sum(t[0] for t in told), sum(t[1] for t in told), down, int(e.degraded), len(errors), flush=True)
    print(errors[:3], file=sys.stderr)
    e.close()
"""


def run_fleet(url: str, tmp_path: Path, disrupt: Callable[[Callable[[str], None]], None]) -> None:
    """4 processes × 4 threads lease and succeed on `url` while `disrupt(set_phase)` breaks the
    topology (it sets the phase "down" when it starts and "after" once the topology is whole
    again): every call succeeds, every process serves during the disruption (from memory while
    no primary holds the prefix), every engine recovers and flushes, and the requests and
    tokens stored equal what the callers were told, exactly."""
    phase_file = tmp_path / "phase"

    def set_phase(name: str) -> None:
        staged = tmp_path / "phase.new"
        staged.write_text(name)
        staged.replace(phase_file)

    set_phase("before")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(LOAD), url, str(TEN_AM), str(phase_file)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.communicate()[1]
        time.sleep(1.0)
        disrupt(set_phase)
        time.sleep(1.5)
        set_phase("stop")
        outs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    results = [[int(x) for x in out.split()] for out, _ in outs]
    assert all(r[4] == 0 for r in results), outs  # no call failed
    assert all(r[2] > 0 for r in results), results  # every process served while the primary was gone
    assert all(r[3] == 0 for r in results), results  # every engine recovered and flushed
    told_requests = sum(r[0] for r in results)
    told_tokens = sum(r[1] for r in results)
    assert stored(url) == (told_requests, told_tokens, 0)


def test_fleet_leasing_through_a_primary_killed_with_wait_replicas_stores_what_callers_were_told(
    sentinels: SentinelSet, tmp_path: Path
) -> None:
    """4 processes × 4 threads lease and succeed through a SIGKILL of the primary with
    ?wait_replicas=1: every process keeps serving (from memory while the sentinels fail over
    and the promoted replica has no replica of its own), and once the killed server is back
    as a replica, the requests and tokens stored equal what the callers were told, exactly."""

    def disrupt(set_phase: Callable[[str], None]) -> None:
        old = sentinels.primary()
        old.kill()  # SIGKILL, mid-call for some of the sixteen callers
        set_phase("down")
        sentinels.wait_new_primary(old.port)
        time.sleep(0.5)
        old.start()  # back, empty: the sentinels make it a replica of the new primary
        sentinels.wait_settled()
        set_phase("after")

    run_fleet(sentinels.url(prefix="load", query="wait_replicas=1"), tmp_path, disrupt)


@pytest.fixture
def replicated_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Three primaries with a replica each, of this test's own (which it may fail over); a node
    not answering for a second counts as failed."""
    cluster = Cluster(tmp_path / "cluster", replicas=1, node_timeout_ms=1000)
    yield cluster
    cluster.close()


@pytest.mark.parametrize("how", ["cluster-failover", "primary-killed"])
def test_fleet_leasing_through_a_cluster_failover_with_wait_replicas_stores_what_callers_were_told(
    replicated_cluster: Cluster, tmp_path: Path, how: str
) -> None:
    """The fleet of 16 callers on a cluster with a replica a primary, ?wait_replicas=1, while
    the shard holding the prefix fails over: `CLUSTER FAILOVER` on its replica (the old primary
    becomes a replica and answers MOVED), or its primary SIGKILLed (the other primaries count
    it failed after the node timeout and its replica takes over; the killed node comes back as
    the new primary's replica). The engines follow the slot to its new owner and the requests
    and tokens stored equal what the callers were told, exactly."""
    cluster = replicated_cluster
    slot = cluster.slot("{load}")
    old = cluster.owner(slot)
    replica = cluster.replica_of(old)

    def disrupt(set_phase: Callable[[str], None]) -> None:
        set_phase("down")
        if how == "cluster-failover":
            assert cli(replica, "CLUSTER", "FAILOVER") == "OK"
            assert cluster.wait_owner(slot, old) == replica
        else:
            cluster.node(old).kill()
            assert cluster.wait_owner(slot, old) == replica
            time.sleep(0.5)
            cluster.node(old).start()  # back, as the new primary's replica
        wait_until(cluster.ok, 30, "the cluster to be whole again")
        set_phase("after")

    before = calls(replica, "evalsha", "eval")
    run_fleet(cluster.url(prefix="load", query="wait_replicas=1"), tmp_path, disrupt)
    assert calls(replica, "evalsha", "eval") > before  # the new primary took the writes
    assert cluster.replica_of(replica) == old


@pytest.mark.parametrize("seeds", ["every-node", "the-primary-only"])
def test_cluster_primary_killed_degrades_then_replays_once_to_the_promoted_replica(
    replicated_cluster: Cluster, seeds: str
) -> None:
    """The primary of the prefix's shard SIGKILLed: the engine serves from memory and enforces
    the limit until the cluster promotes its replica, then writes its buffer, once, to it. It
    finds the new owner from any node it can reach: with a URL naming only the dead primary,
    from the nodes the cluster told it of when it opened."""
    cluster = replicated_cluster
    slot = cluster.slot("{killed}")
    old = cluster.node(cluster.owner(slot))
    url = cluster.url("killed")
    if seeds == "the-primary-only":
        url = f"redis+cluster://127.0.0.1:{old.port}/?prefix=killed"
    with q.QuotaEngine(url, clock=q.ManualClock(TEN_AM), env={}, busy_timeout_ms=300) as e:
        for _ in range(3):
            e.lease(P, M, K, 10, limits={"rpm": 8}).success(tokens=10)
        replica = cluster.replica_of(old.port)
        cluster.wait_replicated(old.port)  # the replica holds those three
        old.kill()
        for _ in range(2):
            e.lease(P, M, K, 10, limits={"rpm": 8}).success(tokens=10)
        assert e.degraded
        assert cluster.wait_owner(slot, old.port) == replica
        until_recovered(e)
        for _ in range(3):
            e.lease(P, M, K, 10, limits={"rpm": 8}).success(tokens=10)
        with pytest.raises(q.QuotaExceeded):
            e.lease(P, M, K, 10, limits={"rpm": 8})
        assert not e.degraded
    assert stored(cluster.url("killed")) == (8, 80, 0)
    assert calls(replica, "evalsha", "eval") > 0


def test_a_cluster_node_answering_clusterdown_is_left_for_the_slots_owner(replicated_cluster: Cluster) -> None:
    """The node the engine is connected to answers CLUSTERDOWN: it knows no node serving the
    prefix's slot (here: its replica took the slot over with `CLUSTER FAILOVER`, then the node
    was taken out of the cluster with `CLUSTER RESET`, before the engine sent anything). The
    engine leaves it, asks the nodes it knows who owns the slot, follows and recovers; the
    limit held throughout and nothing is lost or doubled."""
    cluster = replicated_cluster
    slot = cluster.slot("{reset}")
    old = cluster.owner(slot)
    replica = cluster.replica_of(old)
    url = cluster.url("reset")
    with q.QuotaEngine(url, clock=q.ManualClock(TEN_AM), env={}, busy_timeout_ms=300) as e:
        e.set_model_limits(P, M, rpm=10)
        for _ in range(3):
            e.lease(P, M, K, 10).success(tokens=2)
        cluster.wait_replicated(old)
        assert cli(replica, "CLUSTER", "FAILOVER") == "OK"
        assert cluster.wait_owner(slot, old) == replica
        wait_until(lambda: info(old, "replication").get("role") == "slave", 20, "the old primary to be a replica")
        assert cli(old, "CLUSTER", "RESET", "SOFT") == "OK"
        assert cli(old, "SET", "{reset}:x", "1").startswith("CLUSTERDOWN")
        for _ in range(2):
            e.lease(P, M, K, 10).success(tokens=2)
        until_recovered(e)
        for _ in range(5):
            e.lease(P, M, K, 10).success(tokens=2)
        with pytest.raises(q.QuotaExceeded):
            e.lease(P, M, K, 10)
        assert not e.degraded
    assert stored(url) == (10, 20, 0)
    assert calls(replica, "evalsha", "eval") > 0


def test_a_write_whose_wait_a_failover_cuts_short_is_kept_and_applied_once(replicated_cluster: Cluster) -> None:
    """?wait_replicas=2 on a shard of two replicas, one of them hung (SIGSTOP): a success the
    primary applied waits in `WAIT` (the other replica holds it and acknowledges). `CLUSTER
    FAILOVER` on that replica: it takes the slot over, holding the success, and the demoted
    primary ends the `WAIT` with an error (`UNBLOCKED`). The write was applied but not
    confirmed: the engine keeps it and sends it again under its identity (the new primary skips
    it), rather than buffering it as a write never made and so counting it twice. Once the hung
    replica wakes as the new primary's second replica the engine recovers, and the requests and
    tokens stored equal what the caller was told."""
    cluster = replicated_cluster
    slot = cluster.slot("{unblocked}")
    old = cluster.owner(slot)
    replica = cluster.replica_of(old)
    second = cluster.add_replica(old)
    url = cluster.url("unblocked", "wait_replicas=2&wait_timeout_ms=8000")
    with q.QuotaEngine(url, clock=q.ManualClock(TEN_AM), env={}, busy_timeout_ms=10_000) as e:
        lease = e.lease(P, M, K, 10)
        assert not e.degraded
        cluster.hang(second)
        try:
            t = threading.Thread(target=lambda: lease.success(tokens=5))
            t.start()
            wait_until(lambda: info(old, "clients").get("blocked_clients") == "1", 20, "the success's WAIT")
            assert cli(replica, "CLUSTER", "FAILOVER") == "OK"
            assert cluster.wait_owner(slot, old) == replica
            t.join(30)
            assert e.degraded
        finally:
            cluster.wake(second)
        wait_until(cluster.ok, 30, "the cluster to be whole again")
        until_recovered(e)
        e.lease(P, M, K, 10).success(tokens=3)
        assert not e.degraded
    assert stored(url) == (2, 8, 0)


@pytest.mark.parametrize("topology", ["sentinel", "cluster"])
def test_events_merged_while_the_primary_is_down_come_back_one_per_request(topology: str, tmp_path: Path) -> None:
    """SPEC 10 through a failover (test_redis's restart test with "the server dies" become "the
    primary dies"): events buffered while no primary answers may be merged in memory, but once
    the engine writes them to the promoted replica, usage_events() (and every other engine)
    sees one request row per request, tokens 0. The failover is forced once the events are
    buffered (`SENTINEL FAILOVER`, `CLUSTER FAILOVER TAKEOVER`), so that the engine is down for
    all of them."""
    clock = q.ManualClock(TEN_AM)
    if topology == "sentinel":
        where: SentinelSet | Cluster = SentinelSet(tmp_path / "sentinel", down_after_ms=60_000)
    else:
        where = Cluster(tmp_path / "cluster", replicas=1, node_timeout_ms=60_000)
    try:
        url = where.url("merged")
        with q.QuotaEngine(url, clock=clock, env={}, busy_timeout_ms=200) as e:
            e.record_request(P, M, K)
            if isinstance(where, SentinelSet):
                where.wait_replicated()
                old = where.primary()
            else:
                slot = where.slot("{merged}")
                old = where.node(where.owner(slot))
                replica = where.replica_of(old.port)
                where.wait_replicated(old.port)
            old.kill()
            # the first request is on the replica
            calls, tokens = buffer_events_past_merging(e, clock, (P, M, K), calls=1)
            if isinstance(where, SentinelSet):
                assert cli(where.sentinels[0].port, "SENTINEL", "FAILOVER", SERVICE) == "OK"
                where.wait_new_primary(old.port)
            else:
                assert cli(replica, "CLUSTER", "FAILOVER", "TAKEOVER") == "OK"
                assert where.wait_owner(slot, old.port) == replica
            deadline = time.monotonic() + 30
            while e.degraded and time.monotonic() < deadline:
                time.sleep(0.25)
                e.record_request(P, M, K)  # buffered until a primary answers, then written with the rest
                calls += 1
            assert not e.degraded
        assert_one_row_per_request(url, clock, (P, M, K), calls, tokens)
    finally:
        where.close()


def test_the_command_line_opens_sentinel_and_cluster_urls(redis_sentinel: SentinelSet, redis_cluster: Cluster) -> None:
    """`quotaengine status --db <url>` reads a Sentinel or Cluster store (not a file path)."""
    for url in (redis_sentinel.url(), redis_cluster.url()):
        with q.QuotaEngine(url, env={}) as e:  # the real clock, as the command line's
            e.set_model_limits("cli-groq", M, rpm=10)
            e.record_request("cli-groq", M, K)
        r = subprocess.run(
            [sys.executable, "-m", "quotaengine", "status", "--db", url], capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, r.stderr
        assert "cli-groq" in r.stdout


def test_passwords_for_the_data_nodes_and_for_the_sentinels(tmp_path: Path) -> None:
    """`user:password@` authenticates to the primary; ?sentinel_password= to sentinels that
    require one. Either missing is a DatabaseError at open."""
    pw, spw = "data-secret", "sentinel-secret"
    primary = RedisServer(tmp_path / "p", password=pw, extra=("--masterauth", pw))
    replica = RedisServer(
        tmp_path / "r", password=pw, extra=("--masterauth", pw, "--replicaof", "127.0.0.1", str(primary.port))
    )
    sentinels = [Sentinel(tmp_path / f"s{i}", primary.port, 1000, auth_pass=pw, requirepass=spw) for i in range(3)]
    try:

        def named() -> bool:
            out = cli(sentinels[0].port, "SENTINEL", "get-master-addr-by-name", SERVICE, password=spw).split()
            return out == ["127.0.0.1", str(primary.port)]

        wait_until(named, 20, "the sentinels")
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in sentinels)
        url = f"redis+sentinel://:{pw}@{hosts}/{SERVICE}?prefix=pw&sentinel_password={spw}"
        with q.QuotaEngine(url, clock=q.ManualClock(TEN_AM), env={}) as e:
            e.lease(P, M, K, 10).success(tokens=4)
            assert e.usage(P, M, K)["rpd"]["used"] == 1
            # The listener authenticates to the sentinels too.
            wait_until(lambda: sum(subscribers(s) for s in sentinels) == 1, 10, "the listener to subscribe")
        with pytest.raises(q.DatabaseError, match="sentinel"):
            q.QuotaEngine(url.replace(f"&sentinel_password={spw}", ""), env={})
        with pytest.raises(q.DatabaseError):
            q.QuotaEngine(url.replace(f":{pw}@", ""), env={})
        assert stored(f"redis://:{pw}@127.0.0.1:{primary.port}/0?prefix=pw") == (1, 4, 0)
    finally:
        for s in sentinels:
            s.kill()
        replica.kill()
        primary.kill()


def test_rediss_cluster_with_a_private_ca(tmp_path: Path) -> None:
    """rediss+cluster:// with ?ssl_ca_certs=: TLS to every node (the nodes speak only TLS, to
    each other too); without the CA the nodes' certificate is not trusted: DatabaseError."""
    cluster = Cluster(tmp_path / "cluster", tls=tls_files(tmp_path / "tls"))
    try:
        url = cluster.url("tls")
        assert url.startswith("rediss+cluster://")
        clock = q.ManualClock(TEN_AM)
        with q.QuotaEngine(url, clock=clock, env={}) as a, q.QuotaEngine(url, clock=clock, env={}) as b:
            a.set_model_limits(P, M, rpm=2)
            a.lease(P, M, K, 10).success(tokens=3)
            b.lease(P, M, K, 10).success(tokens=3)
            with pytest.raises(q.QuotaExceeded):
                a.lease(P, M, K, 10)
        assert stored(url) == (2, 6, 0)
        with pytest.raises(q.DatabaseError):
            q.QuotaEngine(url.split("&ssl_ca_certs=")[0], env={})
    finally:
        cluster.close()
