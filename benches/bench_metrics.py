#!/usr/bin/env python3
"""What a Prometheus scrape of an engine costs (SPEC 27.2): its time at 100, 1,000 and
10,000 routes.

    python benches/bench_metrics.py [--routes 100,1000,10000] [--runs 5] [--db PATH_OR_URL] [--pkg DIR]
    python benches/bench_metrics.py --callgrind A_DIR,B_DIR [--routes 1000]

Each route (a platform of 20, a model of 50, a key) has usage today (a lease taken and
ended with tokens), rpm/rpd/tpm limits and a 5-hour limit declared per model, so that
every route reports its windows, its in-flight gauge and (the day windows having a pace)
a forecast; one route in ten is cooling down and one tenant in a hundred routes has a
daily dollar budget. Reported per size, the median of ``--runs`` scrapes (after one to
warm up): ``read`` (``engine._metrics_read()``, the one engine call, GIL released),
``families`` (the ``Collector``'s ``collect()`` less its read: building the families'
samples), ``format`` (``prometheus_client.generate_latest`` of those ready families: the
client's text formatting alone), ``scrape`` (``generate_latest`` of a registry holding
the ``Collector``: all three), each as wall time and, in brackets, this process's CPU
time (what the machine's other load does not inflate); and the exposition's size and
the start of its SHA-256 (the same fill gives the same text: two builds can be compared).
``--db``: a SQLite file (default: a new one in a temporary directory) or a ``redis://``
URL (a fresh prefix per size). ``--pkg DIR``: import ``quotaengine`` from ``DIR`` (e.g. a
release wheel installed with ``pip install --no-deps --target DIR``) instead of the
environment's.

``--callgrind A_DIR,B_DIR``: the same stages counted in instructions under ``valgrind
--tool=callgrind`` for two builds (each a ``--pkg`` directory), exact on a loaded machine:
per stage, a process fills the engine and runs the stage once, another twice; the
difference is one scrape's stage (``families``: ``collect()``, the read included).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

CHILD = r"""
import os, sys, tempfile
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, BENCHES)
import quotaengine as q
from prometheus_client import CollectorRegistry, generate_latest
from quotaengine import metrics
from quotaengine.metrics import Collector
from bench_metrics import Ready, fill
stage, n = sys.argv[2].split()
ops = int(sys.argv[3])
clock = q.ManualClock(1_767_261_600_000)
with q.QuotaEngine(os.path.join(tempfile.mkdtemp(), "m.db"), clock=clock, env={}, flush_interval_ms=0) as e:
    fill(e, int(n))
    clock.advance(1_000)
    collector = Collector(e)
    registry = CollectorRegistry()
    registry.register(collector)
    ready = CollectorRegistry(auto_describe=False)
    ready.register(Ready(list(collector.collect())))
    step = {
        "read": e._metrics_read,
        "families": lambda: list(collector.collect()),
        "format": lambda: generate_latest(ready),
        "scrape": lambda: generate_latest(registry),
        "text": lambda: metrics.exposition(e),
    }[stage]
    for _ in range(ops):
        step()
"""


def callgrind(builds: list[str], n: int) -> None:
    """Instructions per scrape of each stage, build A against build B."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_priority import instructions_of

    child = CHILD.replace("BENCHES", repr(os.path.dirname(os.path.abspath(__file__))))
    a, b = (os.path.abspath(x) for x in builds)
    print(f"{n} routes; A = {a}, B = {b}; instructions per scrape, I(2 stages) - I(1 stage)")
    print("| stage | A | B | B/A |")
    print("|---|---:|---:|---:|")
    for stage in ("read", "families", "format", "scrape", "text"):
        per: list[int | None] = []
        for pkg in (a, b):
            try:
                per.append(
                    instructions_of(pkg, f"{stage} {n}", 2, child) - instructions_of(pkg, f"{stage} {n}", 1, child)
                )
            except subprocess.CalledProcessError:  # a build without the stage (`text` before it)
                per.append(None)
        shown = [f"{x:,}" if x is not None else "—" for x in per]
        ratio = f"{per[1] / per[0]:.3f}" if per[0] and per[1] else "—"
        print(f"| {stage} | {shown[0]} | {shown[1]} | {ratio} |", flush=True)


def fill(e: Any, n: int) -> None:
    """`n` routes with usage today, limits, some cooldowns and tenants."""
    import quotaengine as q

    models: set[tuple[str, str]] = set()
    for i in range(n):
        p, m, k = f"p{i % 20}", f"m{(i // 20) % 50}", 1 + i // 1000
        if (p, m) not in models:
            models.add((p, m))
            e.set_model_limits(p, m, rpm=10**9, rpd=10**12, tpm=10**12, limits=[q.Limit("requests", 10**9, "5h")])
        tenant = f"t{i // 100}"
        if i % 100 == 0:
            e.set_tenant_limits(tenant, [q.Limit.dollars(1_000, "day")])
        e.lease(p, m, k, tenant=tenant).success(tokens=100)
        if i % 10 == 0:
            e.set_cooldown(p, m, k, 60_000, "heuristic")


def location(db: str | None, n: int) -> str:
    if db is None:
        return os.path.join(tempfile.mkdtemp(), f"metrics-{n}.db")
    if db.startswith("redis"):
        sep = "&" if "?" in db else "?"
        return f"{db}{sep}prefix=bench{uuid.uuid4().hex[:8]}"
    return db


class Ready:
    """A collector yielding families already collected (to time the formatting alone)."""

    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> Any:
        return iter(self.families)


def timed(fn: Callable[[], Any], runs: int) -> tuple[float, float, Any]:
    """The median wall and CPU seconds of ``runs`` calls of ``fn``, and its last result."""
    walls, cpus = [], []
    out = None
    for _ in range(runs):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus), out


def served(e: Any, runs: int) -> tuple[float, float, Any]:
    """``timed`` GETs of ``/metrics`` from ``quotaengine serve``'s server on ``e``, uncached."""
    import threading
    import urllib.request

    from quotaengine._serve import Server

    server = Server(e, "127.0.0.1", 0, ttl_s=0)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    url = server.url.rstrip("/") + "/metrics"

    def get() -> bytes:
        with urllib.request.urlopen(url) as r:
            return bytes(r.read())

    try:
        get()  # warm up
        return timed(get, runs)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routes", default="100,1000,10000")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--db", default=None)
    ap.add_argument("--pkg", default=None, help="import quotaengine from this directory")
    ap.add_argument("--callgrind", default=None, metavar="A_DIR,B_DIR", help="count instructions of two builds")
    args = ap.parse_args()
    if args.callgrind:
        callgrind(args.callgrind.split(","), int(args.routes.split(",")[0]) if "," not in args.routes else 1_000)
        return
    if args.pkg:
        sys.path.insert(0, os.path.abspath(args.pkg))
    import quotaengine as q
    import quotaengine.metrics
    from prometheus_client import CollectorRegistry, generate_latest
    from quotaengine.metrics import Collector

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))
    from expositions import parsed

    exposition = getattr(quotaengine.metrics, "exposition", None)  # None in a build before it
    print(f"quotaengine from {os.path.dirname(q.__file__)}; python {sys.version.split()[0]}")
    print("ms, median wall (CPU)")
    cols = ("read", "families", "format", "scrape", "text", "serve")
    if exposition is None:
        cols = tuple(c for c in cols if c != "text")
    print(
        f"{'routes':>8} "
        + " ".join(f"{c:>15}" for c in cols)
        + f" {'samples':>8} {'bytes':>9} {'sha256':>12} {'fill s':>7}"
    )
    for n in (int(x) for x in args.routes.split(",")):
        clock = q.ManualClock(1_767_261_600_000)
        with q.QuotaEngine(location(args.db, n), clock=clock, env={}, flush_interval_ms=50) as e:
            t0 = time.perf_counter()
            fill(e, n)
            filled = time.perf_counter() - t0
            clock.advance(1_000)
            collector = Collector(e)
            registry = CollectorRegistry()
            registry.register(collector)
            generate_latest(registry)  # warm up
            read = timed(e._metrics_read, args.runs)
            routes = read[2]["in_flight" if "in_flight" in read[2] else "routes"]  # one row per route (both shapes)
            assert len(routes) == n, (len(routes), n)
            collect = timed(lambda c=collector: list(c.collect()), args.runs)
            families = collect[2]
            ready = CollectorRegistry(auto_describe=False)
            ready.register(Ready(families))
            fmt = timed(lambda r=ready: generate_latest(r), args.runs)
            scrape = timed(lambda r=registry: generate_latest(r), args.runs)
            text = scrape[2]
            assert text == fmt[2]
            build = (max(0.0, collect[0] - read[0]), max(0.0, collect[1] - read[1]))
            figures = [read[:2], build, fmt[:2], scrape[:2]]
            if exposition is not None:
                written = timed(lambda e=e: exposition(e), args.runs)
                assert parsed(written[2]) == parsed(text), "the text says what the client's scrape says"
                figures.append(written[:2])
            figures.append(served(e, args.runs)[:2])
            lines = sum(1 for line in text.decode().splitlines() if not line.startswith("#"))
            print(
                f"{n:>8} "
                + " ".join(f"{w * 1e3:>7.1f} ({c * 1e3:>5.0f})" for w, c in figures)
                + f" {lines:>8} {len(text):>9} {hashlib.sha256(text).hexdigest()[:12]:>12} {filled:>7.1f}"
            )


if __name__ == "__main__":
    main()
