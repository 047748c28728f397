#!/usr/bin/env python3
"""What a Prometheus scrape of an engine costs (SPEC 27.2): its time at 100, 1,000 and
10,000 routes.

    python benches/bench_metrics.py [--routes 100,1000,10000] [--runs 5] [--db PATH_OR_URL]

Each route (a platform of 20, a model of 50, a key) has usage today (a lease taken and
ended with tokens), rpm/rpd/tpm limits and a 5-hour limit declared per model, so that
every route reports its windows, its in-flight gauge and (the day windows having a pace)
a forecast; one route in ten is cooling down and one tenant in a hundred routes has a
daily dollar budget. Reported per size, the median of ``--runs`` scrapes (after one to
warm up): ``read`` (``engine._metrics_read()``, the one engine call, GIL released),
``scrape`` (``generate_latest`` of a registry holding the ``Collector``: the read and the
exposition), and the exposition's size. ``--db``: a SQLite file (default: a new one in a
temporary directory) or a ``redis://`` URL (a fresh prefix per size).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid

import quotaengine as q
from prometheus_client import CollectorRegistry, generate_latest
from quotaengine.metrics import Collector


def fill(e: q.QuotaEngine, n: int) -> None:
    """`n` routes with usage today, limits, some cooldowns and tenants."""
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--routes", default="100,1000,10000")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--db", default=None)
    args = ap.parse_args()
    print(f"quotaengine from {os.path.dirname(q.__file__)}; python {sys.version.split()[0]}")
    print(f"{'routes':>8} {'read ms':>9} {'scrape ms':>10} {'samples':>8} {'bytes':>9} {'fill s':>7}")
    for n in (int(x) for x in args.routes.split(",")):
        clock = q.ManualClock(1_767_261_600_000)
        with q.QuotaEngine(location(args.db, n), clock=clock, env={}, flush_interval_ms=50) as e:
            t0 = time.perf_counter()
            fill(e, n)
            filled = time.perf_counter() - t0
            clock.advance(1_000)
            registry = CollectorRegistry()
            registry.register(Collector(e))
            generate_latest(registry)  # warm up
            reads, scrapes = [], []
            for _ in range(args.runs):
                t = time.perf_counter()
                m = e._metrics_read()
                reads.append(time.perf_counter() - t)
                t = time.perf_counter()
                text = generate_latest(registry)
                scrapes.append(time.perf_counter() - t)
            assert len(m["routes"]) == n, (len(m["routes"]), n)
            lines = sum(1 for line in text.decode().splitlines() if not line.startswith("#"))
            print(
                f"{n:>8} {statistics.median(reads) * 1e3:>9.1f} {statistics.median(scrapes) * 1e3:>10.1f}"
                f" {lines:>8} {len(text):>9} {filled:>7.1f}"
            )


if __name__ == "__main__":
    main()
