#!/usr/bin/env python3
"""Per-call cost of the engine's boundary, A/B between two builds of the package.

    python benches/bench_ab.py --a DIR_A --b DIR_B [--runs 5] [--ops 100000]

``DIR_A`` / ``DIR_B`` are directories a wheel was installed into with
``pip install --target DIR wheel.whl`` (the previous commit's build and this one's).
Each run is a fresh child process per build and workload, A and B interleaved
(A, B, A, B, ...); reported: the median over runs of ns per call, and B/A.

Workloads, on one route with limits high enough that nothing is refused and a
``ManualClock`` stepped 10 ms per op:

* ``check``: ``check()`` on ``:memory:`` -- the cheapest call through the boundary,
  where a fixed per-call cost shows most;
* ``lease+success flush=0``: ``lease(est)`` then ``success(tokens)`` on a file, every
  call committed;
* ``lease+success flush=10``: the same with ``flush_interval_ms=10`` (an engine alone
  on its file keeps the write lock across calls);
* ``google lease+success flush=10``: the same on platform ``google``, whose day windows
  follow the America/Los_Angeles calendar (a zone, not UTC), ``rpd``/``tpd`` declared
  so that the day windows are read on every admission (builds without calendars count
  UTC days there: the figure is then the cost of a UTC day).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable

CHILD = r"""
import json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import quotaengine as q
workload, ops = sys.argv[2], int(sys.argv[3])
clock = q.ManualClock(1_767_268_800_000)
big = {"rpm": 10**12, "rpd": 10**15, "tpm": 10**15, "tpd": 10**18}
platform = "google" if workload.startswith("google") else "p"
if workload == "check":
    e = q.QuotaEngine(":memory:", clock=clock, env={})
    e.set_model_limits("p", "m", **big)
    t = time.perf_counter_ns()
    for _ in range(ops):
        e.check("p", "m", 1, 500)
    ns = (time.perf_counter_ns() - t) / ops
else:
    flush = int(workload.rsplit("=", 1)[1])
    path = os.path.join(tempfile.mkdtemp(), "ab.db")
    e = q.QuotaEngine(path, clock=clock, env={}, flush_interval_ms=flush)
    e.set_model_limits(platform, "m", **big)
    t = time.perf_counter_ns()
    for _ in range(ops):
        clock.advance(10)
        e.lease(platform, "m", 1, 500).success(tokens=450)
    ns = (time.perf_counter_ns() - t) / ops
e.close()
print(json.dumps({"ns": ns}))
"""

WORKLOADS = ["check", "lease+success flush=0", "lease+success flush=10", "google lease+success flush=10"]


def interleave(
    child: str,
    workloads: list[str],
    builds: dict[str, str],
    runs: int,
    ops_of: Callable[[str], int],
    skip: Callable[[str, str], bool] = lambda build, workload: False,
) -> dict[tuple[str, str], list[float]]:
    """Runs `child` (argv: build dir, workload, ops; prints {"ns": ...} last) once per
    build and workload per run, builds interleaved; returns ns per call by (workload,
    build name)."""
    ns: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            for w in workloads:
                for name, b in builds.items():
                    if skip(name, w):
                        continue
                    out = subprocess.run(
                        [sys.executable, "-c", child, b, w, str(ops_of(w))],
                        check=True,
                        capture_output=True,
                        text=True,
                        cwd=tmp,
                    ).stdout
                    ns.setdefault((w, name), []).append(json.loads(out.strip().splitlines()[-1])["ns"])
    return ns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ops", type=int, default=100_000)
    args = ap.parse_args()
    builds = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    ns = interleave(CHILD, WORKLOADS, builds, args.runs, lambda w: args.ops * (10 if w == "check" else 1))
    print_ab(ns, WORKLOADS)


def print_ab(ns: dict[tuple[str, str], list[float]], workloads: list[str]) -> None:
    """The A/B table of `interleave`'s figures: medians, B/A and every run."""
    print("| workload | A ns/call | B ns/call | B/A | runs (A; B) |")
    print("|---|---:|---:|---:|---|")
    for w in workloads:
        a, b = statistics.median(ns[(w, "A")]), statistics.median(ns[(w, "B")])
        runs = "; ".join(", ".join(f"{x:,.0f}" for x in ns[(w, n)]) for n in ("A", "B"))
        print(f"| {w} | {a:,.0f} | {b:,.0f} | {b / a:.3f} | {runs} |")


if __name__ == "__main__":
    main()
