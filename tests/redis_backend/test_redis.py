"""The Redis backend's own behaviour (the shared contract runs on both backends
through the ``store`` fixture): URLs, passwords and prefixes, the server going away
and coming back, a fleet of processes racing through one server, and round trips."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import quotaengine as q
from moments import TEN_AM
from outages import (
    assert_one_row_per_request,
    buffer_events_past_merging,
    buffer_tenant_events_past_merging,
    declare_tenant_days,
    tenant_days,
)
from redis_servers import RedisServer, RedisTarget, command, free_port, tls_files
from stores import BACKENDS

P, M, K = "groq", "llama", 1

pytestmark = pytest.mark.skipif("redis" not in BACKENDS, reason="QE_BACKENDS leaves Redis out")


def evalsha_calls(port: int) -> int:
    """How many script calls (EVALSHA and EVAL) the server has answered."""
    info = command(port, "INFO", "commandstats").decode()
    n = 0
    for line in info.splitlines():
        if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:")):
            n += int(line.split("calls=")[1].split(",")[0])
    return n


def test_nothing_listening_is_a_database_error() -> None:
    port = free_port()
    start = time.monotonic()
    with pytest.raises(q.DatabaseError, match="redis"):
        q.QuotaEngine(f"redis://127.0.0.1:{port}/0", env={})
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:notaport/0", "redis://127.0.0.1:6379/0?prefix=", "redis://127.0.0.1:6379/0?prefix=a b"],
)
def test_bad_urls_are_database_errors(url: str) -> None:
    with pytest.raises(q.DatabaseError):
        q.QuotaEngine(url, env={})


def test_a_prefix_holding_other_data_is_refused(redis_target: RedisTarget) -> None:
    prefix = redis_target.own_prefix("foreign")
    port, log = redis_target.port(prefix), redis_target.key(prefix, "log")
    command(port, "SET", log, "not ours")
    with pytest.raises(q.DatabaseError, match="prefix"):
        q.QuotaEngine(redis_target.url(prefix), env={})
    assert command(port, "GET", log) == b"$8\r\nnot ours\r\n"


def test_prefixes_keep_engines_apart(redis_target: RedisTarget) -> None:
    clock = q.ManualClock(TEN_AM)
    a_url, b_url = redis_target.url(), redis_target.url()
    with q.QuotaEngine(a_url, clock=clock, env={}) as a, q.QuotaEngine(b_url, clock=clock, env={}) as b:
        a.set_model_limits(P, M, rpm=1)
        a.lease(P, M, K, 10).success(tokens=10)
        a.set_cooldown(P, "other", K, 60_000)
        assert b.usage(P, M, K)["rpm"]["used"] == 0
        assert b.model_limits(P, M) is None and b.active_cooldowns() == []
        with q.QuotaEngine(a_url, clock=clock, env={}) as a2:
            assert a2.usage(P, M, K)["rpm"] == {"used": 1, "limit": 1}
            assert not a2.can_make_request(P, M, K)


def test_password(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", password="s3cret")
    try:
        with q.QuotaEngine(server.url, env={}) as e:
            e.record_request(P, M, K)
            assert e.usage(P, M, K)["rpd"]["used"] == 1
        with pytest.raises(q.DatabaseError):
            q.QuotaEngine(f"redis://:wrong@127.0.0.1:{server.port}/0", env={})
        with pytest.raises(q.DatabaseError):
            q.QuotaEngine(f"redis://127.0.0.1:{server.port}/0", env={})
    finally:
        server.kill()


def test_rediss_with_a_private_ca(tmp_path: Path) -> None:
    """rediss:// with ?ssl_ca_certs= (redis-py's name) trusts that CA; without it the server's
    certificate is not trusted, and a plain redis:// client gets no answer: DatabaseError both."""
    ca, cert, key = tls_files(tmp_path / "tls")
    server = RedisServer(tmp_path / "redis", tls=(ca, cert, key))
    try:
        url = f"{server.url}?ssl_ca_certs={ca}&prefix=tls"
        clock = q.ManualClock(TEN_AM)
        with q.QuotaEngine(url, clock=clock, env={}) as a, q.QuotaEngine(url, clock=clock, env={}) as b:
            a.set_model_limits(P, M, rpm=2)
            a.lease(P, M, K, 10).success(tokens=10)
            b.lease(P, M, K, 10).success(tokens=10)
            with pytest.raises(q.QuotaExceeded):
                a.lease(P, M, K, 10)
            assert b.usage(P, M, K)["rpm"]["used"] == 2
        with pytest.raises(q.DatabaseError):
            q.QuotaEngine(server.url, env={})  # the built-in roots do not include the private CA
        with pytest.raises(q.DatabaseError):
            q.QuotaEngine(f"redis://127.0.0.1:{server.port}/0", env={}, busy_timeout_ms=300)
        with pytest.raises(q.DatabaseError, match="ssl_ca_certs"):
            q.QuotaEngine(f"{server.url}?ssl_ca_certs={tmp_path / 'missing.pem'}", env={})
    finally:
        server.kill()


def test_readonly_engine_writes_nothing(redis_target: RedisTarget) -> None:
    url = redis_target.url()
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(url, clock=clock, env={}) as w, q.QuotaEngine(url, clock=clock, readonly=True) as r:
        w.record_request(P, M, K)
        assert r.usage(P, M, K)["rpd"]["used"] == 1
        with pytest.raises(q.DatabaseError):
            r.record_request(P, M, K)
        assert w.usage(P, M, K)["rpd"]["used"] == 1


def test_round_trips_per_operation(redis_target: RedisTarget) -> None:
    """An admitted lease() is one round trip (decided on what the engine knows, written
    if nothing it read has changed); success() writes in one; check() reads in one; a
    refusal is confirmed by one read."""
    prefix = f"t{uuid.uuid4().hex[:12]}"
    url, port = redis_target.url(prefix), redis_target.port(prefix)
    with q.QuotaEngine(url, clock=q.ManualClock(TEN_AM), env={}) as e:
        e.set_model_limits(P, M, rpm=1000)
        e.check(P, M, K)
        before = evalsha_calls(port)
        for _ in range(50):
            e.lease(P, M, K, 10)
        assert evalsha_calls(port) - before == 50
        before = evalsha_calls(port)
        for _ in range(50):
            e.lease(P, M, K, 10).success(tokens=12)
        assert evalsha_calls(port) - before == 50 * 2
        before = evalsha_calls(port)
        for _ in range(50):
            e.check(P, M, K)
        assert evalsha_calls(port) - before == 50
        before = evalsha_calls(port)
        with pytest.raises(q.QuotaExceeded):
            e.lease(P, M, K, 10, limits={"rpm": 1})
        assert evalsha_calls(port) - before == 1


def test_lease_conflicts_only_on_the_same_account(redis_target: RedisTarget) -> None:
    """Another engine's writes to the same (platform, key) since this engine last read
    make its optimistic lease conflict: it takes in what changed and decides again (one
    more round trip). Writes to other keys do not."""
    prefix = f"t{uuid.uuid4().hex[:12]}"
    url, port = redis_target.url(prefix), redis_target.port(prefix)
    clock = q.ManualClock(TEN_AM)
    with (
        q.QuotaEngine(url, clock=clock, env={}) as a,
        q.QuotaEngine(url, clock=clock, env={}) as b,
    ):
        a.set_model_limits(P, M, rpm=1000)
        a.check(P, M, K)
        b.check(P, M, K)
        before = evalsha_calls(port)
        for _ in range(20):
            b.lease(P, M, K + 1, 1).success(tokens=1)  # 2 round trips
            a.lease(P, M, K, 1).success(tokens=1)  # 2: no conflict
        assert evalsha_calls(port) - before == 20 * 4
        before = evalsha_calls(port)
        for _ in range(20):
            b.lease(P, M, K, 1).success(tokens=1)  # conflicts on a's rows: 3
            a.lease(P, M, K, 1).success(tokens=1)  # conflicts on b's rows: 3
        assert evalsha_calls(port) - before == 20 * 6
        assert a.usage(P, M, K)["rpd"]["used"] == 60
        assert b.usage(P, M, K)["rpd"]["used"] == 60


def test_a_refusal_is_confirmed_on_fresh_data(redis_target: RedisTarget) -> None:
    """A lease that what the engine knows would refuse is decided again after a read:
    capacity another host freed meanwhile is used, not refused."""
    url = redis_target.url()
    clock = q.ManualClock(TEN_AM)
    with (
        q.QuotaEngine(url, clock=clock, env={}) as a,
        q.QuotaEngine(url, clock=clock, env={}) as b,
    ):
        held = a.lease(P, M, K, 1, limits={"rpm": 1})
        assert not b.check(P, M, K, limits={"rpm": 1}).allowed  # b knows a's lease
        held.release()
        b.lease(P, M, K, 1, limits={"rpm": 1}).success(tokens=1)
        with pytest.raises(q.QuotaExceeded):
            a.lease(P, M, K, 1, limits={"rpm": 1})


def test_server_restart_degrades_then_replays(own_server: RedisServer) -> None:
    """Redis killed: the engine enforces from memory and buffers; Redis back (empty,
    no persistence): the buffered rows are written again and other engines see them,
    with the rows of the minute the server lost (SPEC 24.4: written back)."""
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(own_server.url, clock=clock, env={}, busy_timeout_ms=200) as e:
        for _ in range(3):
            e.lease(P, M, K, 10, limits={"rpm": 5}).success(tokens=10)
        own_server.kill()
        # Degraded: counts from memory, two more admitted, then refused.
        for _ in range(2):
            e.lease(P, M, K, 10, limits={"rpm": 5}).success(tokens=10)
        assert e.degraded
        with pytest.raises(q.QuotaExceeded):
            e.lease(P, M, K, 10, limits={"rpm": 5})
        own_server.start()
        deadline = time.monotonic() + 5
        while e.degraded and time.monotonic() < deadline:
            time.sleep(0.25)  # reconnects are paced (200 ms)
            e.usage(P, M, K)
        e.record_request(P, M, K)  # a write: flushes what was buffered
        assert not e.degraded
        with q.QuotaEngine(own_server.url, clock=clock, env={}) as other:
            # The three rows the restart lost (written back, SPEC 24.4), the two written
            # while Redis was down, and the last one.
            assert other.usage(P, M, K)["rpm"]["used"] == 6


FLEET = """
    import sys, time
    import quotaengine as q
    url, now, phase_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    e = q.QuotaEngine(url, clock=q.ManualClock(now), env={}, busy_timeout_ms=300)
    print("ready", flush=True)
    admitted = {"before": 0, "down": 0, "after": 0}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        phase = open(phase_file).read().strip()
        if phase == "stop":
            break
        if phase == "before" and admitted["before"] >= 10:
            e.usage("groq", "llama", 1)  # idle, but reading what the others write
            time.sleep(0.005)
            continue
        try:
            e.lease("groq", "llama", 1, 10, limits={"rpm": 100}).success(tokens=10)
            admitted[phase] += 1
        except q.QuotaExceeded:
            time.sleep(0.005)
    print(admitted["before"], admitted["down"], admitted["after"], int(e.degraded), flush=True)
    e.close()
"""


@contextlib.contextmanager
def network_namespaces(n: int) -> Iterator[list[tuple[str, str]]]:
    """`n` network namespaces, each joined to this one by a veth pair: yields (namespace,
    address of this side). Skips the test where namespaces cannot be made (not root, no
    CAP_NET_ADMIN, no `ip`)."""
    tag = f"qe{os.getpid() % 100000}"
    made: list[str] = []

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)

    hosts = []
    try:
        if shutil.which("ip") is None:
            pytest.skip("no `ip` tool: network namespaces unavailable")
        for i in range(1, n + 1):
            ns, host_if, ns_if = f"{tag}n{i}", f"{tag}h{i}", f"{tag}p{i}"
            host_ip, ns_ip = f"10.213.{i}.1", f"10.213.{i}.2"
            try:
                ip("netns", "add", ns)
                made.append(ns)
                ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
                ip("link", "set", ns_if, "netns", ns)
                ip("addr", "add", f"{host_ip}/30", "dev", host_if)
                ip("link", "set", host_if, "up")
                for cmd in (["addr", "add", f"{ns_ip}/30", "dev", ns_if], ["link", "set", ns_if, "up"]):
                    ip("netns", "exec", ns, "ip", *cmd)
                ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
                err = getattr(e, "stderr", b"") or b""
                pytest.skip(f"network namespaces unavailable here: {err.decode(errors='replace').strip() or e}")
            hosts.append((ns, host_ip))
        yield hosts
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def in_namespace(ns: str | None, script: str, *args: str) -> subprocess.Popen[str]:
    """A Python process running `script`, inside network namespace `ns` when given."""
    cmd = [sys.executable, "-c", textwrap.dedent(script), *args]
    if ns is not None:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


NETNS_RACE = """
    import sys, threading
    import quotaengine as q
    url, now = sys.argv[1], int(sys.argv[2])
    e = q.QuotaEngine(url, clock=q.ManualClock(now), env={}, busy_timeout_ms=5000)
    print("ready", flush=True)
    sys.stdin.readline()
    admitted = [0] * 8
    def work(i):
        while True:
            try:
                e.lease("groq", "llama", 1, 10, limits={"rpm": 100}).success(tokens=10)
                admitted[i] += 1
            except q.QuotaExceeded:
                return
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(sum(admitted), int(e.degraded), flush=True)
    e.close()
"""


def test_hosts_in_separate_network_namespaces_admit_exactly_rpm(tmp_path: Path) -> None:
    """4 "hosts" (network namespaces joined to this one by veth pairs, so each reaches Redis
    over its own link) × 8 threads race lease() on rpm=100 through one Redis: exactly 100."""
    with network_namespaces(4) as hosts:
        server = RedisServer(tmp_path / "redis", bind=("127.0.0.1", *(h for _, h in hosts)))
        procs = []
        try:
            for ns, host_ip in hosts:
                url = f"redis://{host_ip}:{server.port}/0?prefix=netns"
                procs.append(in_namespace(ns, NETNS_RACE, url, str(TEN_AM)))
            for p in procs:
                assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.communicate()[1]
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            outs = [p.communicate(timeout=60) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
            server.kill()
    results = [[int(x) for x in out.split()] for out, _ in outs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    assert sum(r[0] for r in results) == 100, results
    assert sum(1 for r in results if r[0]) >= 2, results  # it was a race
    assert all(r[1] == 0 for r in results), results


@pytest.mark.parametrize("network", ["loopback", "netns"])
def test_fleet_through_a_restart_overshoots_no_more_than_the_readme_says(
    own_server: RedisServer, tmp_path: Path, network: str
) -> None:
    """4 processes race on rpm=100 through one Redis (on loopback, or each in its own network
    namespace). Each admits 10, Redis is killed, each enforces from memory while it is down
    (the README's bound: each engine may use what remained of the limit as it last saw it),
    Redis comes back and replays: after that, nothing more is admitted within the minute."""
    with contextlib.ExitStack() as stack:
        if network == "netns":
            hosts: list[tuple[str | None, str]] = list(stack.enter_context(network_namespaces(4)))
            own_server.kill()
            own_server.bind = ("127.0.0.1", *(h for _, h in hosts))
            own_server.start()
        else:
            hosts = [(None, "127.0.0.1")] * 4
        fleet_through_a_restart(own_server, tmp_path, hosts)


def fleet_through_a_restart(own_server: RedisServer, tmp_path: Path, hosts: list[tuple[str | None, str]]) -> None:
    phase_file = tmp_path / "phase"

    def set_phase(name: str) -> None:
        # Atomically (write, then rename): a child reading the file mid-write would see "".
        staged = tmp_path / "phase.new"
        staged.write_text(name)
        os.replace(staged, phase_file)

    set_phase("before")
    n = len(hosts)
    procs = [
        in_namespace(ns, FLEET, f"redis://{host_ip}:{own_server.port}/0", str(TEN_AM), str(phase_file))
        for ns, host_ip in hosts
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 20
        with q.QuotaEngine(own_server.url, clock=q.ManualClock(TEN_AM), env={}) as watcher:
            while watcher.usage(P, M, K)["rpm"]["used"] < 10 * n and time.monotonic() < deadline:
                time.sleep(0.01)
            seen_before_kill = watcher.usage(P, M, K)["rpm"]["used"]
        time.sleep(0.3)  # every process has read all 40
        own_server.kill()
        set_phase("down")
        time.sleep(1.5)
        own_server.start()
        set_phase("after")
        time.sleep(2.5)
        set_phase("stop")
        results = []
        for p in procs:
            out, err = p.communicate(timeout=30)
            assert p.returncode == 0, err
            results.append([int(x) for x in out.split()])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            for stream in (p.stdin, p.stdout, p.stderr):
                if stream is not None:
                    stream.close()
    before = sum(r[0] for r in results)
    down = sum(r[1] for r in results)
    after = sum(r[2] for r in results)
    assert before == seen_before_kill == 10 * n
    # While Redis was down each engine admitted at most what remained as it last saw it.
    assert before + down <= 100 + (n - 1) * (100 - 10 * n), results
    assert down > 0  # it did run from memory
    # Once the rows were replayed, the fleet saw the minute was spent.
    assert after == 0, results
    assert all(r[3] == 0 for r in results), results  # all reconnected


def test_one_engine_of_a_fleet_probes_a_key(redis_target: RedisTarget) -> None:
    """Two engines on one Redis: the one that probes a benched key first keeps it for
    two minutes; the other leaves it alone (its validator is never called)."""
    url = redis_target.url()
    clock = q.ManualClock(TEN_AM)
    calls: dict[str, list[int]] = {"a": [], "b": []}

    def validator(name: str):  # type: ignore[no-untyped-def]
        def probe(key_id: int) -> bool:
            calls[name].append(key_id)
            return False  # still failing: the cooldown stays, so both would probe it

        return probe

    with q.QuotaEngine(url, clock=clock, env={}) as a, q.QuotaEngine(url, clock=clock, env={}) as b:
        a.set_cooldown(P, M, 1, 3_600_000, "heuristic")
        a.set_cooldown(P, M, 2, 3_600_000, "heuristic")
        clock.advance(30 * 60_000)
        for e, name in ((a, "a"), (b, "b")):
            e.run_probe_pass(validator(name), jitter=lambda: 0.0)  # first sightings
        assert a.run_probe_pass(validator("a"), jitter=lambda: 0.0).probed_key_ids == [1, 2]
        assert b.run_probe_pass(validator("b"), jitter=lambda: 0.0).probed_key_ids == []
        assert calls == {"a": [1, 2], "b": []}
        assert len(b.probeable_cooldowns()) == 2  # b does see them: it leaves them to a


def test_events_merged_while_redis_is_down_stay_with_their_tenants(own_server: RedisServer) -> None:
    """SPEC 23.2 with §10's merging on Redis: rows buffered while the server is down (and
    merged per minute) never merge across tenants; each tenant's day is what it was told, in
    this engine and in another once the server answers (it came back empty: written back)."""
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(own_server.url, clock=clock, env={}, busy_timeout_ms=200) as e:
        declare_tenant_days(e)
        e.record_request(P, M, K)
        own_server.kill()
        told = buffer_tenant_events_past_merging(e, clock, (P, M, K))
        own_server.start()
        deadline = time.monotonic() + 5
        while e.degraded and time.monotonic() < deadline:
            time.sleep(0.25)
            e.record_request(P, M, K)
        assert not e.degraded
        assert tenant_days(e) == told
        with q.QuotaEngine(own_server.url, clock=clock, env={}) as other:
            assert tenant_days(other) == told


def test_a_scrape_while_redis_is_down_says_degraded_and_what_the_engine_knows(own_server: RedisServer) -> None:
    """SPEC 27.2 with §10 on Redis: while the server does not answer, a scrape (the
    collector's and the text) still answers, with ``quotaengine_degraded`` 1, the routes and
    the tenants the engine serves from memory; ``snapshot()`` and ``tenants()`` too."""
    from expositions import families
    from prometheus_client import CollectorRegistry, generate_latest
    from quotaengine import metrics

    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(own_server.url, clock=clock, env={}, busy_timeout_ms=200) as e:
        e.set_model_limits(P, M, rpm=5)
        e.set_tenant_limits("acme", [q.Limit("requests", 10, "day")])
        e.lease(P, M, K, tenant="acme").success()
        own_server.kill()
        e.lease(P, M, K, tenant="acme").success()  # served from memory
        assert e.degraded
        registry = CollectorRegistry()
        registry.register(metrics.Collector(e))
        for text in (generate_latest(registry), metrics.exposition(e)):
            read = families(text)
            assert [s.value for s in read["quotaengine_degraded"].samples] == [1]
            used = {s.labels["window"]: s.value for s in read["quotaengine_window_used"].samples}
            assert used["rpm"] == 2
            tenant = {
                (s.labels["tenant"], s.labels["window"]): s.value for s in read["quotaengine_tenant_used"].samples
            }
            assert tenant == {("acme", "requests/day"): 2}
        assert [(r["platform"], r["model_id"], r["key_id"]) for r in e.snapshot()] == [(P, M, K)]
        assert e.tenants() == ["acme"]


def test_events_merged_while_redis_is_down_come_back_one_per_request(own_server: RedisServer) -> None:
    """SPEC §10 on Redis: events buffered during an outage may be merged in memory, but
    usage_events() (and every other engine) sees one request row per request, tokens 0."""
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(own_server.url, clock=clock, env={}, busy_timeout_ms=200) as e:
        e.record_request(P, M, K)
        own_server.kill()  # no persistence: the server comes back empty (the first row is written back)
        calls, tokens = buffer_events_past_merging(e, clock, (P, M, K), calls=1)
        own_server.start()
        deadline = time.monotonic() + 5
        while e.degraded and time.monotonic() < deadline:
            time.sleep(0.25)
            e.record_request(P, M, K)  # buffered until the server answers, then written with the rest
            calls += 1
        assert not e.degraded
    assert_one_row_per_request(own_server.url, clock, (P, M, K), calls, tokens)
