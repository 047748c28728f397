#!/usr/bin/env python3
"""Redis topologies (SPEC 19.3, 19.4): one server against Sentinel and Cluster, and failovers.

    python benches/bench_redis_topologies.py [--ops 8000] [--out benches/RESULTS-redis-topologies.md]

Starts real ``redis-server`` processes on loopback (tests/support/redis_topologies.py): one server; a
primary, a replica and three sentinels (down-after 1000 ms); three cluster primaries. Then:

* the stream of ``bench_compare.py`` (routes, Zipf models, four limits per route, about 10%
  refused; op = ``lease(est)`` then ``success(tokens)``) split over 4 processes (op i to process
  i mod 4), on each topology and on Sentinel with ``?wait_replicas=1``: ops/s of the 4 together
  (each process times its own ops) and script calls per op on the data node
  (``INFO commandstats``: a script call, with its ``WAIT`` when asked, is one round trip);
* a forced failover (``SENTINEL FAILOVER``) and the primary SIGKILLed, under one engine looping
  ``lease()`` + ``success()`` (wall clock): how long the sentinels took to name the new primary,
  and how long the engine was degraded (from its first degraded call to its first call that
  was not);
* the same forced failover without ``?wait_replicas=`` (``--switch-only`` runs just this):
  when the replica became a primary (its ``ROLE``, polled every millisecond), when the first
  sentinel announced it (``+switch-master``, subscribed on every sentinel), and when the
  engine's first write reached it (the first usage entry on the new primary after the
  promotion: stream ids are the writers' clocks, here the wall clock); and how many of the
  engine's writes the demoted primary took after the promotion (lost when it resynchronises).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))

PROCS = 4


def worker(url: str, n: int, idx: int, out: Any) -> None:
    import quotaengine as qe
    from bench_compare import T0_MS, Workload, _qe_admit, drive

    wl = Workload(n)
    clock = qe.ManualClock(T0_MS)
    e = qe.QuotaEngine(url, clock=clock, env={})
    r = drive(wl.ops[idx::PROCS], clock.set, _qe_admit(e), start_index=idx, stride=PROCS)
    r["degraded"] = e.degraded
    e.close()
    out.put(r)


def stream(url: str, n: int) -> dict[str, float]:
    import quotaengine as qe
    from bench_compare import T0_MS, Workload, _qe_setup_limits

    with qe.QuotaEngine(url, clock=qe.ManualClock(T0_MS), env={}) as e:
        _qe_setup_limits(e, Workload(n))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(url, n, i, out)) for i in range(PROCS)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    assert not any(r["degraded"] for r in results), "an engine was degraded"
    return {
        "ops_s": sum(r["ops_s"] for r in results),
        "p50_us": statistics.median(r["p50_us"] for r in results),
        "p99_us": max(r["p99_us"] for r in results),
        "refused": sum(r["refused"] for r in results) / n,
    }


def sequential(url: str, n: int = 3000) -> float:
    """One process, one thread: `lease()` + `success()` on one route, ops/s."""
    import quotaengine as qe

    with qe.QuotaEngine(url, clock=qe.ManualClock(1_767_261_600_000), env={}) as e:
        e.set_model_limits("p", "m", rpm=10**9, rpd=10**9)
        for _ in range(200):
            e.lease("p", "m", 1, 10).success(tokens=1)
        t = time.perf_counter()
        for _ in range(n):
            e.lease("p", "m", 1, 10).success(tokens=1)
        return n / (time.perf_counter() - t)


def failover(topology: Any, kill: bool, query: str = "", seconds: float = 20.0) -> dict[str, float]:
    """One engine leasing as fast as it can through a failover; times from the event."""
    import quotaengine as qe

    url = topology.url(query=query)
    e = qe.QuotaEngine(url, env={}, busy_timeout_ms=300)
    e.set_model_limits("p", "m", rpm=10**9, rpd=10**9)
    for _ in range(200):
        e.lease("p", "m", 1, 10).success(tokens=5)
    old = topology.primary()
    t0 = time.monotonic()
    if kill:
        old.kill()
    else:
        from redis_topologies import cli

        assert cli(topology.sentinels[0].port, "SENTINEL", "FAILOVER", "qe") == "OK"
    named = None
    first_degraded = last_degraded = None
    calls = 0
    while time.monotonic() - t0 < seconds:
        lease = e.lease("p", "m", 1, 10)
        for step in range(2):
            if step:
                lease.success(tokens=5)
            now = time.monotonic()
            if e.degraded:
                first_degraded = first_degraded or now
                last_degraded = now
        calls += 1
        if not e.degraded and first_degraded is not None and named is not None:
            break
        if named is None and calls % 20 == 0 and topology.primary_port() != old.port:
            named = time.monotonic() - t0
        time.sleep(0.001)
    end = time.monotonic()
    e.close()
    if kill:
        old.start()
    topology.wait_settled()
    return {
        "sentinels_s": named if named is not None else float("nan"),
        "degraded_s": (last_degraded - first_degraded) if first_degraded and last_degraded else 0.0,
        "from_event_s": (last_degraded - t0) if last_degraded else 0.0,
        "calls": calls,
        "total_s": end - t0,
    }


class Watcher(threading.Thread):
    """Records the wall-clock time of the first reply of a raw RESP connection that holds
    `needle`: a subscription (`SUBSCRIBE +switch-master` on a sentinel), or `INFO replication`
    polled every millisecond (`poll`). The sentinels promote a replica and kill its clients in
    one transaction: a polled connection closed before the needle is seen is opened again, and
    the time it closed is the one recorded."""

    def __init__(self, port: int, command: bytes, needle: bytes, poll: bool) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=0.5)
        self.command, self.needle, self.poll = command, needle, poll
        self.at: float | None = None
        self.closed_at: float | None = None
        self.done = threading.Event()
        if not poll:
            self.sock.sendall(command)
            self.sock.recv(4096)  # the subscription's confirmation
        self.start()

    def run(self) -> None:
        while not self.done.is_set() and self.at is None:
            try:
                if self.poll:
                    self.sock.sendall(self.command)
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                if not self.poll:
                    return
                self.closed_at = self.closed_at or time.time()
                self.sock.close()
                try:
                    self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=0.5)
                except OSError:
                    time.sleep(0.001)
                continue
            if self.needle in data:
                self.at = self.closed_at or time.time()
            if self.poll:
                time.sleep(0.001)

    def stop(self) -> None:
        self.done.set()
        self.join(2)
        self.sock.close()


def stream_ids(port: int, key: str, since_ms: int) -> list[int]:
    """The ms part of the ids of `key`'s entries from `since_ms` on, on one server."""
    from redis_topologies import cli

    out = cli(port, "XRANGE", key, str(since_ms), "+")
    return [int(line.split("-")[0]) for line in out.splitlines() if re.fullmatch(r"\d+-\d+", line.strip())]


def switch(topology: Any, prefix: str) -> dict[str, float]:
    """SENTINEL FAILOVER without ?wait_replicas=, one engine (wall clock) leasing every ms or so:
    times from the promotion, in ms."""
    import quotaengine as qe
    from redis_topologies import SERVICE, cli

    url = topology.url(prefix)
    e = qe.QuotaEngine(url, env={}, busy_timeout_ms=300)
    e.set_model_limits("p", "m", rpm=10**9, rpd=10**9)
    for _ in range(50):
        e.lease("p", "m", 1, 10).success(tokens=5)
    topology.wait_replicated()
    old = topology.primary_port()
    replica = next(s.port for s in topology.servers if s.proc is not None and s.port != old)
    promoted = Watcher(replica, b"INFO replication\r\n", b"role:master", poll=True)
    announced = [
        Watcher(s.port, b"SUBSCRIBE +switch-master\r\n", b"+switch-master", poll=False) for s in topology.sentinels
    ]
    assert cli(topology.sentinels[0].port, "SENTINEL", "FAILOVER", SERVICE) == "OK"
    t0 = time.monotonic()
    ended: list[float] = []  # wall-clock end of each call
    while time.monotonic() - t0 < 6:
        e.lease("p", "m", 1, 10).success(tokens=5)
        ended.append(time.time())
        time.sleep(0.001)
    degraded = e.degraded
    for w in (promoted, *announced):
        w.stop()
    assert promoted.at is not None, "no promotion seen"
    at_ms = int(promoted.at * 1000)
    on_new = stream_ids(replica, f"{prefix}:log", at_ms)
    on_old = stream_ids(old, f"{prefix}:log", at_ms)  # before the sentinels demote it (about 10 s)
    still_primary = "role:master" in cli(old, "INFO", "replication")
    e.close()
    topology.wait_settled()
    first_heard = min(w.at for w in announced if w.at is not None)
    # The calls that ended after the promotion and before the first write on the new primary
    # went to the demoted one.
    first_new = on_new[0] / 1000 if on_new else float("inf")
    return {
        "announced_ms": (first_heard - promoted.at) * 1000,
        "engine_on_new_ms": (on_new[0] - promoted.at * 1000) if on_new else float("nan"),
        "after_announcement_ms": (on_new[0] - first_heard * 1000) if on_new else float("nan"),
        "lost_entries": len(on_old),
        "lost_calls": sum(promoted.at <= t < first_new for t in ended),
        "old_still_primary": float(still_primary),
        "calls": len(ended),
        "degraded": float(degraded),
    }


def switch_rows(topology: Any, rounds: int) -> list[str]:
    runs = []
    for k in range(rounds):
        r = switch(topology, f"sw{k}")
        print("switch", r, flush=True)
        runs.append(r)

    def med(name: str) -> float:
        return statistics.median(r[name] for r in runs)

    return [
        "",
        f"`SENTINEL FAILOVER` without `?wait_replicas=` (median of {rounds}; times from the replica's promotion,",
        "its `ROLE` polled every ms; one engine on the wall clock calling `lease()` + `success()` about",
        "every 2 ms):",
        "",
        "| first sentinel announced it (`+switch-master`) | engine's first write on the new primary | "
        "of which after the announcement | calls that went to the demoted primary (lost) | their feed entries |",
        "|---:|---:|---:|---:|---:|",
        f"| {med('announced_ms'):.0f} ms | {med('engine_on_new_ms'):.0f} ms | {med('after_announcement_ms'):.0f} ms "
        f"| {med('lost_calls'):.0f} | {med('lost_entries'):.0f} |",
        "",
        "All rounds: "
        + "; ".join(
            f"{r['announced_ms']:.0f} / {r['engine_on_new_ms']:.0f} / {r['after_announcement_ms']:.0f} ms, "
            f"{r['lost_calls']:.0f} calls lost"
            for r in runs
        )
        + ". The demoted primary still said it was a primary when its feed was read: "
        + ("every round" if all(r["old_still_primary"] for r in runs) else "not every round")
        + "; the engine was degraded at the end: "
        + ("in no round" if not any(r["degraded"] for r in runs) else "in some round")
        + ".",
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--switch-only", action="store_true", help="only the +switch-master timing")
    args = ap.parse_args()
    from redis_servers import RedisServer
    from redis_topologies import Cluster, SentinelSet, calls

    if args.switch_only:
        with tempfile.TemporaryDirectory() as d:
            sentinel = SentinelSet(Path(d) / "sentinel")
            try:
                text = "\n".join(switch_rows(sentinel, args.rounds))
            finally:
                sentinel.close()
        print(text)
        if args.out:
            Path(args.out).write_text(text.lstrip("\n") + "\n")
        return

    rows = []
    with tempfile.TemporaryDirectory() as d:
        single = RedisServer(Path(d) / "single")
        sentinel = SentinelSet(Path(d) / "sentinel")
        cluster = Cluster(Path(d) / "cluster")
        try:
            cases = [
                ("one server, redis://", f"{single.url}?prefix=bench", lambda: [single.port]),
                (
                    "the Sentinel primary as redis://",
                    f"redis://127.0.0.1:{sentinel.primary_port()}/0?prefix=pbench",
                    lambda: [sentinel.primary_port()],
                ),
                ("Sentinel, redis+sentinel://", sentinel.url("bench"), lambda: [sentinel.primary_port()]),
                (
                    "Sentinel, ?wait_replicas=1",
                    sentinel.url("benchw", "wait_replicas=1"),
                    lambda: [sentinel.primary_port()],
                ),
                ("Cluster, redis+cluster://", cluster.url("bench"), lambda: [n.port for n in cluster.nodes]),
            ]
            runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in cases}
            for k in range(args.rounds):  # the topologies interleaved, each on a fresh prefix
                for name, url, nodes in cases:
                    url = url.replace("bench", f"r{k}bench")
                    before = sum(calls(p, "evalsha", "eval") for p in nodes())
                    r = stream(url, args.ops)
                    r["scripts_per_op"] = (sum(calls(p, "evalsha", "eval") for p in nodes()) - before) / args.ops
                    runs[name].append(r)
                    print(name, r, flush=True)
            seq: dict[str, list[float]] = {name: [] for name, _, _ in cases}
            for k in range(2 * args.rounds + 1):
                for name, url, _ in cases:
                    seq[name].append(sequential(url.replace("bench", f"s{k}bench")))
            print("sequential", seq, flush=True)
            for name, rs in runs.items():
                median = sorted(rs, key=lambda r: r["ops_s"])[len(rs) // 2]
                rows.append((name, median | {"all": [r["ops_s"] for r in rs], "seq": statistics.median(seq[name])}))
            forced = failover(sentinel, kill=False)
            print("SENTINEL FAILOVER", forced, flush=True)
            forced_wait = failover(sentinel, kill=False, query="wait_replicas=1")
            print("SENTINEL FAILOVER, wait_replicas=1", forced_wait, flush=True)
            killed = failover(sentinel, kill=True)
            print("primary SIGKILLed", killed, flush=True)
            switched = switch_rows(sentinel, args.rounds)
        finally:
            cluster.close()
            sentinel.close()
            single.kill()

    base = rows[0][1]["ops_s"]
    lines = [
        "# Redis topologies: one server, Sentinel, Cluster; failovers",
        "",
        f"`python benches/bench_redis_topologies.py --ops {args.ops} --rounds {args.rounds}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())},",
        f"redis-server 7.0 on loopback (no persistence), Python {sys.version.split()[0]}, {os.cpu_count()} cores shared",
        f"with other work (load average {os.getloadavg()[0]:.1f} at the end). Median of {args.rounds} rounds, the",
        "topologies interleaved in each round.",
        "",
        f"The bench_compare stream ({args.ops:,} ops: `lease(est)` then `success(tokens)`, about 10% refused),",
        "op i in process i mod 4, 4 processes at once; ops/s is the sum of each process's own rate.",
        "Script calls per op: `EVALSHA` on the data node(s) (`INFO commandstats`), setup included;",
        "each is one round trip (with `?wait_replicas=` its `WAIT` travels in the same pipeline).",
        "",
        "| topology | ops/s (4 processes) | vs one server | p50 µs | p99 µs | refused | script calls / op |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in rows:
        lines.append(
            f"| {name} | {r['ops_s']:,.0f} | {r['ops_s'] / base:.2f}× | {r['p50_us']:.0f} | {r['p99_us']:.0f} "
            f"| {r['refused']:.1%} | {r['scripts_per_op']:.2f} |"
        )
    lines += [
        "",
        f"One process, one thread, `lease()` + `success()` on one route (median of {2 * args.rounds + 1} interleaved",
        "runs of 3,000): the cost of the topology itself, less exposed to the machine's other load.",
        "",
        "| topology | ops/s | vs one server |",
        "|---|---:|---:|",
    ]
    seq_base = rows[0][1]["seq"]
    for name, r in rows:
        lines.append(f"| {name} | {r['seq']:,.0f} | {r['seq'] / seq_base:.2f}× |")
    lines += [
        "",
        "All rounds (ops/s, 4 processes): "
        + "; ".join(f"{n}: " + ", ".join(f"{v:,.0f}" for v in r["all"]) for n, r in rows),
    ]
    lines += [
        "",
        "Failovers (primary + 1 replica + 3 sentinels, quorum 2, down-after-milliseconds 1000), one engine",
        "looping `lease()` + `success()` on the wall clock, times from the event:",
        "",
        "| event | sentinels named the new primary after | engine degraded for | engine back after |",
        "|---|---:|---:|---:|",
        f"| SENTINEL FAILOVER | {forced['sentinels_s']:.2f} s | {forced['degraded_s']:.2f} s | "
        f"{forced['from_event_s']:.2f} s |",
        f"| SENTINEL FAILOVER, ?wait_replicas=1 | {forced_wait['sentinels_s']:.2f} s | "
        f"{forced_wait['degraded_s']:.2f} s | {forced_wait['from_event_s']:.2f} s |",
        f"| primary SIGKILLed | {killed['sentinels_s']:.2f} s | {killed['degraded_s']:.2f} s | "
        f"{killed['from_event_s']:.2f} s |",
        *switched,
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
