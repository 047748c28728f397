"""Routing guardrail cost (SPEC §9): `model_window_used_fraction` with a warm snapshot,
and the snapshot rebuild, against the number of usage rows in the file and of routes.

    python benches/bench_guardrail.py            # 10k / 100k / 1M rows, 100 / 1000 / 10000 routes
    python benches/bench_guardrail.py --quick

Rows are inserted with plain sqlite3 (as another process would), then a fresh engine
opens the file, so the rebuild includes loading today's window state.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time

import quotaengine as qe

T0 = 1_767_261_600_000  # 2026-01-01 10:00 UTC


def build(path: str, rows: int, routes: int) -> list[tuple[str, str, int]]:
    platforms = [f"p{i}" for i in range(10)]
    keys_per = 5
    models_per = max(1, routes // (len(platforms) * keys_per))
    route_list = [(p, f"m{m}", k) for p in platforms for m in range(models_per) for k in range(keys_per)]
    with qe.QuotaEngine(path, clock=qe.ManualClock(T0), env={}) as e:
        for p in platforms:
            for k in range(keys_per):
                e.register_key(hash((p, k)) & 0x7FFFFFFF, p)
            for m in range(models_per):
                e.set_model_limits(p, f"m{m}", rpm=1000, rpd=100_000, tpm=10**7, tpd=10**9)
    c = sqlite3.connect(path)
    # spread over the morning (00:00 .. 10:00), one request row per event
    step = 36_000_000 // rows
    batch = [(*route_list[i % len(route_list)], "request", 1, T0 - 36_000_000 + i * step) for i in range(rows)]
    c.executemany(
        "INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms) VALUES (?,?,?,?,?,?)",
        batch,
    )
    c.commit()
    c.close()
    return route_list


def measure(rows: int, routes: int, calls: int) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "g.db")
        route_list = build(path, rows, routes)
        clock = qe.ManualClock(T0)
        t = time.perf_counter()
        e = qe.QuotaEngine(path, clock=clock, env={}, window_usage_ttl_ms=5_000)
        open_ms = (time.perf_counter() - t) * 1e3
        models = [(p, m) for p, m, _ in route_list]
        rebuilds = []
        for _ in range(5):
            e.invalidate_window_usage()
            t = time.perf_counter()
            e.model_window_used_fraction(*models[0])
            rebuilds.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        for i in range(calls):
            e.model_window_used_fraction(*models[i % len(models)])
        per_call_us = (time.perf_counter() - t) / calls * 1e6
        e.close()
        return open_ms, statistics.median(rebuilds), per_call_us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    route_counts = [100, 1000] if args.quick else [100, 1000, 10_000]
    calls = 50_000 if args.quick else 200_000
    print(f"quotaengine {qe.__version__}, SQLite {qe.sqlite_version()}")
    print("| usage rows | routes | open (load today) ms | snapshot rebuild ms | warm call µs |")
    print("|---:|---:|---:|---:|---:|")
    for rows in sizes:
        for routes in route_counts:
            o, r, c = measure(rows, routes, calls)
            print(f"| {rows:,} | {routes:,} | {o:.1f} | {r:.3f} | {c:.3f} |")


if __name__ == "__main__":
    main()
