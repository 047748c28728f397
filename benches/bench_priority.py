#!/usr/bin/env python3
"""What priorities and forecasts cost (SPEC 22), figures in ``RESULTS-priority.md``.

    python benches/bench_priority.py ab --a DIR_A --b DIR_B [--runs 7] [--ops 50000]
    python benches/bench_priority.py instructions --a DIR_A --b DIR_B
    python benches/bench_priority.py forecast --pkg DIR_B [--calls 2000]

``DIR_A`` / ``DIR_B``: ``pip install --target DIR wheel.whl`` of two release wheels
(the previous commit's and this one's).

* ``ab``: ``lease()`` + ``success()`` at priority 0 with no reserve set, on a file with
  ``flush_interval_ms`` 0 and 10, A and B interleaved in fresh processes (as
  ``bench_ab.py``); then, on B alone, the same at priority 1 with
  ``set_priority_reserve(1, 0.2)``: the cost of a priority over priority 0.
* ``instructions``: the same workloads counted in instructions under
  ``valgrind --tool=callgrind`` (the whole process at N and at 3N calls, the difference
  divided by 2N, so start-up cancels out): repeatable on a loaded machine.
* ``forecast``: ``forecast()`` on a route with a day of events (a request and a tokens
  row every 10 s for 24 h, 17,280 rows; rpd, tpd, a 5 h and a week limit, provider
  daily caps, every one forecast to run out) on a file: microseconds per call, beside
  ``snapshot()`` (which forecasts its rows) and ``usage()`` of that route.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ab import interleave  # noqa: E402

CHILD = r"""
import json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import quotaengine as q
workload, ops = sys.argv[2], int(sys.argv[3])
clock = q.ManualClock(1_767_268_800_000)
big = {"rpm": 10**12, "rpd": 10**15, "tpm": 10**15, "tpd": 10**18}
flush = int(workload.split("flush=")[1].split()[0])
path = os.path.join(tempfile.mkdtemp(), "ab.db")
e = q.QuotaEngine(path, clock=clock, env={}, flush_interval_ms=flush)
e.set_model_limits("p", "m", **big)
if "priority=1" in workload:
    e.set_priority_reserve(1, 0.2)
    call = lambda: e.lease("p", "m", 1, 500, priority=1)
else:
    call = lambda: e.lease("p", "m", 1, 500)  # priority 0, the default (A has no priority=)
t = time.perf_counter_ns()
for _ in range(ops):
    clock.advance(10)
    call().success(tokens=450)
ns = (time.perf_counter_ns() - t) / ops
e.close()
print(json.dumps({"ns": ns}))
"""

P0 = ["lease+success flush=0", "lease+success flush=10"]
P1 = ["lease+success flush=0 priority=1", "lease+success flush=10 priority=1"]


def ab(args: argparse.Namespace) -> None:
    builds = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    ns = interleave(
        CHILD, P0 + P1, builds, args.runs, lambda w: args.ops, skip=lambda b, w: b == "A" and "priority=1" in w
    )
    print("| workload (priority 0, no reserve) | A ns/call | B ns/call | B/A | runs (A; B) |")
    print("|---|---:|---:|---:|---|")
    for w in P0:
        a, b = statistics.median(ns[(w, "A")]), statistics.median(ns[(w, "B")])
        runs = "; ".join(", ".join(f"{x:,.0f}" for x in ns[(w, n)]) for n in ("A", "B"))
        print(f"| {w} | {a:,.0f} | {b:,.0f} | {b / a:.3f} | {runs} |")
    print()
    print("| B workload | priority 0 ns/call | priority 1 (reserve 0.2) ns/call | ratio |")
    print("|---|---:|---:|---:|")
    for w0, w1 in zip(P0, P1, strict=True):
        a, b = statistics.median(ns[(w0, "B")]), statistics.median(ns[(w1, "B")])
        print(f"| {w0} | {a:,.0f} | {b:,.0f} | {b / a:.3f} |")


def instructions_of(pkg: str, workload: str, ops: int, child: str = CHILD) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-c", child]
            + [pkg, workload, str(ops)],
            check=True,
            capture_output=True,
            text=True,
            cwd=tmp,
        )
        with open(out) as f:
            text = f.read()
    m = re.search(r"^summary:\s+(\d+)", text, re.M) or re.search(r"^totals:\s+(\d+)", text, re.M)
    if m is None:
        raise RuntimeError("no callgrind summary")
    return int(m.group(1))


def instructions(args: argparse.Namespace) -> None:
    builds = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    n = args.calls
    per: dict[tuple[str, str], float] = {}
    for w in P0 + P1:
        for name, pkg in builds.items():
            if name == "A" and "priority=1" in w:
                continue
            lo, hi = instructions_of(pkg, w, n), instructions_of(pkg, w, 3 * n)
            per[(w, name)] = (hi - lo) / (2 * n)
            print(f"# {w} {name}: {per[(w, name)]:,.0f} instructions/call", file=sys.stderr)
    print("| workload (priority 0, no reserve) | A instructions/call | B instructions/call | B/A |")
    print("|---|---:|---:|---:|")
    for w in P0:
        a, b = per[(w, "A")], per[(w, "B")]
        print(f"| {w} | {a:,.0f} | {b:,.0f} | {b / a:.3f} |")
    print()
    print("| B workload | priority 0 instructions/call | priority 1 (reserve 0.2) | ratio |")
    print("|---|---:|---:|---:|")
    for w0, w1 in zip(P0, P1, strict=True):
        a, b = per[(w0, "B")], per[(w1, "B")]
        print(f"| {w0} | {a:,.0f} | {b:,.0f} | {b / a:.3f} |")


FORECAST_CHILD = r"""
import json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import quotaengine as q
calls = int(sys.argv[2])
START = 1_767_182_400_000  # 2025-12-31 12:00 UTC: the day of events ends at 12:00 on 2026-01-01
clock = q.ManualClock(START)
path = os.path.join(tempfile.mkdtemp(), "fc.db")
e = q.QuotaEngine(path, clock=clock, env={}, flush_interval_ms=10)
# limits that the pace spends before they reset, so that every forecast is a time
e.set_model_limits("p", "m", rpd=6_320, tpd=2_528_000,
                   limits=[q.Limit("requests", 10**6, "5h"), q.Limit("tokens", 5_000_000, "week")])
e.set_provider_caps("p", daily_requests=6_320, daily_tokens=2_528_000)
for i in range(8_640):  # a day: a request and its tokens every 10 s
    clock.advance(10_000)
    e.record_request("p", "m", 1)
    e.record_tokens("p", "m", 1, 400)
e.usage_events(since_ms=clock.now_ms())  # every buffered write in the file
f = e.forecast("p", "m", 1)
assert all(v is not None for v in f.values()), f
t = time.perf_counter_ns()
for _ in range(calls):
    e.forecast("p", "m", 1)
fc = (time.perf_counter_ns() - t) / calls
t = time.perf_counter_ns()
for _ in range(calls // 10):
    e.snapshot()
snap = (time.perf_counter_ns() - t) / (calls // 10)
t = time.perf_counter_ns()
for _ in range(calls):
    e.usage("p", "m", 1)
usage = (time.perf_counter_ns() - t) / calls
print(json.dumps({"forecast": fc, "snapshot": snap, "usage": usage, "keys": sorted(f)}))
e.close()
"""


def forecast(args: argparse.Namespace) -> None:
    import json

    runs = []
    for _ in range(args.runs):
        r = subprocess.run(
            [sys.executable, "-c", FORECAST_CHILD, os.path.abspath(args.pkg), str(args.calls)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            raise SystemExit(r.stderr)
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    print(f"windows forecast: {runs[0]['keys']}")
    print("| call (a route with a day of events, file) | µs/call (median) | runs |")
    print("|---|---:|---|")
    for k in ("forecast", "snapshot", "usage"):
        vals = [r[k] / 1000 for r in runs]
        print(f"| `{k}()` | {statistics.median(vals):,.1f} | {', '.join(f'{v:,.1f}' for v in vals)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("ab")
    a.add_argument("--a", required=True)
    a.add_argument("--b", required=True)
    a.add_argument("--runs", type=int, default=7)
    a.add_argument("--ops", type=int, default=50_000)
    i = sub.add_parser("instructions")
    i.add_argument("--a", required=True)
    i.add_argument("--b", required=True)
    i.add_argument("--calls", type=int, default=2_000)
    f = sub.add_parser("forecast")
    f.add_argument("--pkg", required=True)
    f.add_argument("--calls", type=int, default=2_000)
    f.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    {"ab": ab, "instructions": instructions, "forecast": forecast}[args.cmd](args)


if __name__ == "__main__":
    main()
