#!/usr/bin/env python3
"""What a reshaping of the core costs on the hot path: instructions per admission, A/B.

    python benches/bench_house.py --a DIR_A --b DIR_B [--calls 2000]
    python benches/bench_house.py --a DIR_A --b DIR_B --wall [--runs 5] [--ops 20000]
    python benches/bench_house.py --a DIR --b DIR --priced   # the same build, B priced
    python benches/bench_house.py --a DIR --b DIR --tenant   # the same build, B for a tenant
    python benches/bench_house.py --a DIR_A --b DIR_B --threaded [--repeat 3] [--only flush=10]

``DIR_A`` / ``DIR_B``: ``pip install --target DIR wheel.whl`` of two release wheels (the
previous commit's and this one's). A reshaping must leave the hot path where it was
(issue 33: within 2%); this bench counts it.

Workloads, each op the admission then ``success(tokens)``, on a file with
``flush_interval_ms`` 0 (every call committed) and 10 (an engine alone on its file
keeps the write lock across calls), a ``ManualClock`` stepped 10 ms per op:

* ``lease``: ``lease()`` on one route with ``rpm``, ``rpd``, ``tpm``, ``tpd`` and a
  5-hour limit declared, and provider caps set on its platform;
* ``any first``: ``lease_any`` over five such routes on five platforms, ``headroom``
  (every candidate scored; the first passes);
* ``any last``: the same with the four first candidates cooling down, ``order``
  (each refused in turn, the last passes).

By default each workload runs under ``valgrind --tool=callgrind`` at N and 3N
calls and reports (I(3N) - I(N)) / 2N, so start-up cancels out: exact and repeatable
on a loaded machine. ``--wall`` times the same in fresh processes, A and B interleaved.

``--threaded``: a thread runs and ends before the calls, in A and B alike. A process
that never started one runs glibc's single-threaded fast paths (``pwrite``, ``pread``,
mutexes); any thread, the engine's own lease renewer (SPEC 24.1) included, turns them
off for good, so a build that starts one pays them in this bench and not in a process
that has threads anyway. ``--repeat R``: the median of R counts per build and workload
(the ``flush=10`` counts vary by a few percent from run to run with the wall-clock
ticks of the background flusher; ``flush=0`` counts are exact).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ab import interleave, print_ab  # noqa: E402
from bench_priority import instructions_of  # noqa: E402

CHILD = r"""
import json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import quotaengine as q
workload, ops = sys.argv[2], int(sys.argv[3])
if workload.endswith(" threaded"):
    # --threaded: a thread ran before the calls, as in any process with one (glibc's
    # single-threaded fast paths, e.g. in pwrite and mutexes, are then off for good).
    import threading
    workload = workload.removesuffix(" threaded")
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
clock = q.ManualClock(1_767_268_800_000)
flush = int(workload.split("flush=")[1].split()[0])
path = os.path.join(tempfile.mkdtemp(), "house.db")
e = q.QuotaEngine(path, clock=clock, env={}, flush_interval_ms=flush)
routes = [(f"p{i}", "m", 1) for i in range(5)]
for p, m, _ in routes:
    e.set_model_limits(p, m, rpm=10**12, rpd=10**15, tpm=10**15, tpd=10**18,
                       limits=[q.Limit("requests", 10**15, "5h")])
    e.set_provider_caps(p, daily_requests=10**15, daily_tokens=10**18)
    if workload.endswith(" priced"):
        # SPEC 23.1: prices and a daily dollar budget never reached.
        e.set_model_prices(p, m, q.Prices(0.15, 0.6, cached_input=0.075, per_request=0.0001))
        e.set_model_limits(p, m, rpm=10**12, rpd=10**15, tpm=10**15, tpd=10**18,
                           limits=[q.Limit("requests", 10**15, "5h"), q.Limit.dollars(10**6, "day")])
kw = {}
if workload.endswith(" tenant"):
    # SPEC 23.2: priced routes, each call for a tenant with a daily dollar budget never reached.
    for p, m, _ in routes:
        e.set_model_prices(p, m, q.Prices(0.15, 0.6, cached_input=0.075, per_request=0.0001))
    e.set_tenant_limits("acme", [q.Limit.dollars(10**6, "day")])
    kw = {"tenant": "acme"}
if workload.startswith("lease "):
    call = lambda: e.lease("p0", "m", 1, 500, **kw)
elif workload.startswith("any first"):
    call = lambda: e.lease_any(routes, estimated_tokens=500, strategy="headroom", **kw)
else:
    for p, m, k in routes[:4]:
        e.set_cooldown(p, m, k, 10**12)
    call = lambda: e.lease_any(routes, estimated_tokens=500, strategy="order", **kw)
t = time.perf_counter_ns()
for _ in range(ops):
    clock.advance(10)
    call().success(tokens=450)
ns = (time.perf_counter_ns() - t) / ops
e.close()
print(json.dumps({"ns": ns}))
"""

WORKLOADS = [f"{w} flush={f}" for f in (0, 10) for w in ("lease", "any first", "any last")]


def instructions(builds: dict[str, str], n: int, variant: str, threaded: bool, repeat: int, only: str) -> None:
    print("| workload | A instructions/call | B instructions/call | B/A |")
    print("|---|---:|---:|---:|")
    for w in (w for w in WORKLOADS if only in w):
        per = {}
        for name, pkg in builds.items():
            # --priced / --tenant: B's calls priced with a dollar budget, or made for a
            # tenant with one (A's not).
            wl = f"{w} {variant}" if variant and name == "B" else w
            wl = f"{wl} threaded" if threaded else wl
            # --repeat: the median of several counts (flush=10 counts vary with the
            # wall-clock ticks of the background flusher).
            counts = []
            for _ in range(repeat):
                lo, hi = instructions_of(pkg, wl, n, CHILD), instructions_of(pkg, wl, 3 * n, CHILD)
                counts.append((hi - lo) / (2 * n))
            per[name] = statistics.median(counts)
        print(f"| {w} | {per['A']:,.0f} | {per['B']:,.0f} | {per['B'] / per['A']:.3f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--calls", type=int, default=2_000, help="N of the callgrind runs")
    ap.add_argument("--wall", action="store_true", help="time in fresh processes instead of counting")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ops", type=int, default=20_000)
    ap.add_argument("--priced", action="store_true", help="B's routes priced, with a dollar budget (Part 22)")
    ap.add_argument("--tenant", action="store_true", help="B's calls for a tenant with a dollar budget (Part 22)")
    ap.add_argument("--threaded", action="store_true", help="a thread runs (and ends) before the calls, A and B")
    ap.add_argument("--repeat", type=int, default=1, help="counts per build and workload (their median)")
    ap.add_argument("--only", default="", help="the workloads whose name contains this (e.g. flush=10)")
    args = ap.parse_args()
    builds = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    if args.wall:
        print_ab(interleave(CHILD, WORKLOADS, builds, args.runs, lambda w: args.ops), WORKLOADS)
    else:
        variant = "priced" if args.priced else "tenant" if args.tenant else ""
        instructions(builds, args.calls, variant, args.threaded, args.repeat, args.only)


if __name__ == "__main__":
    main()
