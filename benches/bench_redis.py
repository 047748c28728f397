#!/usr/bin/env python3
"""Redis backend: quotaengine against what a router fleet would use instead.

    python benches/bench_redis.py [--ops N] [--runs R] [--out benches/RESULTS-redis.md]

Starts its own ``redis-server`` on a free loopback port (no persistence) and runs,
in one process session, the deterministic stream of ``bench_compare.py`` (1000
routes, Zipf models, four limits per route, about 10% refused; op = admit, then
record the actual tokens) through:

* quotaengine on ``redis://`` (``lease(est)`` then ``success(tokens)``), committing every call
  and with ``flush_interval_ms=10``;
* ``limits`` moving window on its Redis storage (test all four limits, then hit
  all four: the same as ``bench_compare``'s memory rows);
* ``pyrate-limiter``'s ``RedisBucket`` (a request and a token bucket per route).

Every system gets the same simulated time. Round trips are the requests clients
sent, seen by ``MONITOR`` in a separate pass (commands a script runs inside the
server are not round trips), per op.
Each system runs ``--runs`` times on a fresh prefix/database; the table shows the
median run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench_compare import (  # noqa: E402
    T0_MS,
    SimTime,
    Workload,
    _limits_admit,
    _pyrate_admit,
    _qe_admit,
    _qe_setup_limits,
    drive,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(workdir: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    exe = shutil.which("redis-server")
    if exe is None:
        sys.exit("redis-server is not installed (apt-get install redis-server)")
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import redis

    r = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            r.ping()
            return proc, port
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def count_round_trips(fn, wl, port: int, run: int, n: int = 500) -> float:
    """Requests the clients sent per op over ``n`` ops, seen by ``MONITOR`` (commands
    a Lua script runs inside the server are tagged ``lua`` and not counted)."""
    import threading

    import redis

    seen = []
    stop = threading.Event()
    conn = redis.Redis(port=port)

    def watch() -> None:
        with conn.monitor() as m:
            ready.set()
            while not stop.is_set():
                cmd = m.next_command()
                if cmd.get("client_type") != "lua" and "STOP-COUNTING" not in cmd["command"]:
                    seen.append(cmd["command"])
                elif "STOP-COUNTING" in cmd["command"]:
                    return

    ready = threading.Event()
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    ready.wait(5)
    time.sleep(0.1)
    fn(wl, n, port, run)
    stop.set()
    redis.Redis(port=port).echo("STOP-COUNTING")
    t.join(10)
    return len(seen) / n


def run_qe(wl, n: int, port: int, run: int, flush_ms: int = 0) -> dict:
    import quotaengine

    clock = quotaengine.ManualClock(T0_MS)
    url = f"redis://127.0.0.1:{port}/0?prefix=qe{flush_ms}-{run}"
    eng = quotaengine.QuotaEngine(url, clock=clock, env={}, flush_interval_ms=flush_ms)
    _qe_setup_limits(eng, wl)
    res = drive(wl.ops[:n], clock.set, _qe_admit(eng))
    eng.close()
    return res


def run_limits(wl, n: int, port: int, run: int) -> dict:
    import limits
    import limits.storage.redis as lredis
    import limits.strategies as lstrat

    sim = SimTime(T0_MS)
    lredis.time = sim  # the storage reads time.time(): feed it the simulated clock
    lstrat.time = sim
    storage = limits.storage.storage_from_string(f"redis://127.0.0.1:{port}/{run % 16}")
    admit = _limits_admit(lstrat.MovingWindowRateLimiter(storage), wl)

    res = drive(wl.ops[:n], sim.set, admit)
    res["note"] = f"limits {limits.__version__}, moving window, redis storage"
    return res


def run_pyrate(wl, n: int, port: int, run: int) -> dict:
    import pyrate_limiter
    import redis
    from pyrate_limiter import BucketFactory, Duration, Limiter, Rate, RateItem, RedisBucket

    sim = SimTime(T0_MS)
    conn = redis.Redis(port=port, db=run % 16)
    buckets: dict = {}

    class Factory(BucketFactory):
        def wrap_item(self, name, weight=1):
            return RateItem(name, sim.ms, weight=weight)

        def get(self, item):
            b = buckets.get(item.name)
            if b is None:
                what, p, m, k = item.name.split("|")
                rpm, rpd, tpm, tpd = wl.limits[(p, m)]
                rates = (
                    [Rate(rpm, Duration.MINUTE), Rate(rpd, Duration.DAY)]
                    if what == "req"
                    else [Rate(tpm, Duration.MINUTE), Rate(tpd, Duration.DAY)]
                )
                b = buckets[item.name] = RedisBucket.init(rates, conn, item.name)
            return b

    res = drive(wl.ops[:n], sim.set, _pyrate_admit(Limiter(Factory()).try_acquire))
    res["note"] = f"pyrate-limiter {getattr(pyrate_limiter, '__version__', '?')}, RedisBucket"
    return res


def run_qe_grouped(wl, n: int, port: int, run: int) -> dict:
    return run_qe(wl, n, port, run, flush_ms=10)


SYSTEMS = {
    "quotaengine redis://": run_qe,
    "quotaengine redis://, flush_interval_ms=10": run_qe_grouped,
    "limits moving window, redis": run_limits,
    "pyrate-limiter RedisBucket": run_pyrate,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "RESULTS-redis.md"))
    args = ap.parse_args()
    wl = Workload(args.ops)
    workdir = tempfile.mkdtemp(prefix="bench-redis-")
    proc, port = start_server(workdir)
    results: dict[str, list[dict]] = {name: [] for name in SYSTEMS}
    try:
        trips = {name: count_round_trips(fn, wl, port, 100) for name, fn in SYSTEMS.items()}
        for run in range(args.runs):
            for name, fn in SYSTEMS.items():
                r = fn(wl, args.ops, port, run)
                results[name].append(r)
                print(f"run {run} {name}: {r['ops_s']:,.0f} ops/s", flush=True)
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)

    def median_run(rs: list[dict]) -> dict:
        return sorted(rs, key=lambda r: r["ops_s"])[len(rs) // 2]

    med = {name: median_run(rs) for name, rs in results.items()}
    ours = med["quotaengine redis://"]["ops_s"]
    grouped = med["quotaengine redis://, flush_interval_ms=10"]["ops_s"]
    lines = [
        "# Redis backend: lease() + success() against limits and pyrate-limiter on Redis",
        "",
        f"`python benches/bench_redis.py --ops {args.ops} --runs {args.runs}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())},",
        f"redis-server on loopback (no persistence), Python {sys.version.split()[0]}, {os.cpu_count()} cores.",
        f"Median of {args.runs} runs of {args.ops:,} ops (same stream and simulated time for every system).",
        "",
        "| system | ops/s | p50 µs | p99 µs | refused | round trips / op | quotaengine is | with flush 10 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in med.items():
        ratios = (
            "– | –" if name.startswith("quotaengine") else f"{ours / r['ops_s']:.1f}× | {grouped / r['ops_s']:.1f}×"
        )
        lines.append(
            f"| {name} | {r['ops_s']:,.0f} | {r['p50_us']:.0f} | {r['p99_us']:.0f} | {r['refused_frac']:.1%} "
            f"| {trips[name]:.2f} | {ratios} |"
        )
    lines += [
        "",
        "Round trips: the requests clients sent, seen by `MONITOR` over the first 500 ops of the stream",
        "(a separate pass; commands a script runs inside the server are not round trips), divided by ops.",
        "quotaengine makes 1 per admission (decided on what the engine knows, written if nothing it read",
        "has changed) and 1 per `success()`; a refusal is confirmed by 1 read. The setup calls",
        "(`set_model_limits`) are included. With `flush_interval_ms=10` a `success()` waits in memory",
        "and travels with a later admission's round trip (a crash may lose the last 10 ms of events).",
        "",
        "All runs (ops/s): "
        + "; ".join(name + ": " + ", ".join(f"{r['ops_s']:,.0f}" for r in rs) for name, rs in results.items()),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
    print("median ops/s", {k: round(statistics.median(r["ops_s"] for r in v)) for k, v in results.items()})


if __name__ == "__main__":
    main()
