#!/usr/bin/env python3
"""What limits as data cost (Part 10, SPEC 14.1).

    python benches/bench_limits.py speed --a DIR_A --b DIR_B [--runs 5] [--ops 50000]
    python benches/bench_limits.py memory --pkg DIR [--events 10000000] [--routes 1000]

``speed``: per-call cost, one fresh child process per build and workload, A and B
interleaved (A, B, A, B, ...); the median over runs of ns per call. ``DIR_A`` / ``DIR_B``
are directories a wheel was installed into with ``pip install --target DIR wheel.whl``
(the previous commit's build and this one's). Workloads, on one route with limits high
enough that nothing is refused and a ``ManualClock`` stepped 10 ms per op:

* ``classic check`` / ``classic lease+success flush=0`` / ``flush=10``: the classic four
  (rpm, rpd, tpm, tpd) declared;
* ``eight check`` / ``eight lease+success ...``: eight declared limits, requests and
  tokens per 1 s, minute, 5 h, day, week and month (two of them the classic rpm and tpm);
  B only (A has no ``Limit``);
* ``split lease+success ...``: the classic four, a lease with ``estimated_output_tokens``
  and ``success(input_tokens=, output_tokens=, cached_tokens=)`` (SPEC 14.4), B only;
* ``account10 lease+success ...``: the classic four on a key that is one of 10 keys of
  one account (SPEC 14.3: the limits count the account's usage), B only.

``memory``: a month limit on ``--routes`` routes with ``--events`` usage rows in the month.
The rows are written into the engine's file with plain ``sqlite3`` (as a notebook or
another tool may), then a fresh process opens an engine on the file, which loads the
month to count it (its retention sweep keeps the month's rows), and reports its peak
RSS, the load time and what the month counts; the same file opened read-only by an
engine whose models declare only the classic four (it loads today's rows) is the
baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ab import interleave  # noqa: E402

SPEED_CHILD = r"""
import json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import quotaengine as q
workload, ops = sys.argv[2], int(sys.argv[3])
clock = q.ManualClock(1_796_119_200_000)
big = {"rpm": 10**12, "rpd": 10**15, "tpm": 10**15, "tpd": 10**18}
if workload.startswith("eight"):
    L = q.Limit
    decl = {"limits": [L("requests", 10**12, "1s"), L("requests", 10**12, "minute"),
                       L("requests", 10**13, "5h"), L("requests", 10**14, "week"),
                       L("tokens", 10**15, "1s"), L("tokens", 10**15, "minute"),
                       L("tokens", 10**16, "day"), L("tokens", 10**17, "month")]}
else:
    decl = big
if workload.endswith("check"):
    e = q.QuotaEngine(":memory:", clock=clock, env={})
    e.set_model_limits("p", "m", **decl)
    for _ in range(1000):
        e.check("p", "m", 1, 500)
    t = time.perf_counter_ns()
    for _ in range(ops):
        e.check("p", "m", 1, 500)
    ns = (time.perf_counter_ns() - t) / ops
else:
    flush = int(workload.rsplit("=", 1)[1])
    path = os.path.join(tempfile.mkdtemp(), "ab.db")
    e = q.QuotaEngine(path, clock=clock, env={}, flush_interval_ms=flush)
    e.set_model_limits("p", "m", **decl)
    if workload.startswith("account10"):
        for k in range(1, 11):  # key 1 is one of the 10 keys of one account
            e.register_key(k, "p", account="acct")
    t = time.perf_counter_ns()
    if workload.startswith("split"):
        for _ in range(ops):
            clock.advance(10)
            e.lease("p", "m", 1, 500, estimated_output_tokens=200).success(
                input_tokens=300, output_tokens=150, cached_tokens=100
            )
    else:
        for _ in range(ops):
            clock.advance(10)
            e.lease("p", "m", 1, 500).success(tokens=450)
    ns = (time.perf_counter_ns() - t) / ops
e.close()
print(json.dumps({"ns": ns}))
"""

SPEED = [
    "classic check",
    "eight check",
    "classic lease+success flush=0",
    "eight lease+success flush=0",
    "classic lease+success flush=10",
    "eight lease+success flush=10",
    "split lease+success flush=0",
    "split lease+success flush=10",
    "account10 lease+success flush=0",
    "account10 lease+success flush=10",
]


def speed(args: argparse.Namespace) -> None:
    builds = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    b_only = ("eight", "split", "account10")
    ns = interleave(
        SPEED_CHILD,
        SPEED,
        builds,
        args.runs,
        lambda w: args.ops * (10 if w.endswith("check") else 1),
        skip=lambda build, w: build == "A" and w.startswith(b_only),
    )
    print("| workload | A ns/call | B ns/call | B/A | B / B classic | runs (A; B) |")
    print("|---|---:|---:|---:|---:|---|")
    for w in SPEED:
        b = statistics.median(ns[(w, "B")])
        a_runs = ns.get((w, "A"))
        a = statistics.median(a_runs) if a_runs else None
        vs_classic = ""
        if w.startswith(("eight", "split", "account10")):
            base = w.split(" ", 1)[1]
            classic = statistics.median(ns[(f"classic {base}", "B")])
            vs_classic = f"{b / classic:.3f}"
        runs = "; ".join(", ".join(f"{x:,.0f}" for x in ns.get((w, n), [])) for n in ("A", "B"))
        a_txt = "-" if a is None else f"{a:,.0f}"
        ratio = "-" if a is None else f"{b / a:.3f}"
        print(f"| {w} | {a_txt} | {b:,.0f} | {ratio} | {vs_classic} | {runs} |")


MEMORY_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[5])
import quotaengine as q
path, now, routes, month = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "month"
t = time.perf_counter()
# The baseline reads only (a read-only engine never sweeps the month's rows away).
e = q.QuotaEngine(path, clock=q.ManualClock(now), env={}, readonly=not month)
e.check("p", "m0", 0)
load_s = time.perf_counter() - t
used = e.usage("p", "m0", 0)
e.close()
# Peak RSS of this process image: VmHWM (ru_maxrss would carry the parent's over exec).
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"rss_mb": hwm / 1024, "load_s": load_s,
                  "month_tokens": used.get("tokens/month", {}).get("used"), "day_tokens": used["tpd"]["used"]}))
"""


def memory(args: argparse.Namespace) -> None:
    import sqlite3

    sys.path.insert(0, os.path.abspath(args.pkg))
    import quotaengine as q

    month_start = 1_796_083_200_000  # 2026-12-01 00:00 UTC
    now = month_start + 20 * 86_400_000  # the 21st: 20 days of rows in the month
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "month.db")
        with q.QuotaEngine(path, clock=q.ManualClock(now), env={}) as e:
            for r in range(args.routes):  # every model declares the month limit
                e.set_model_limits("p", f"m{r}", limits=[q.Limit("tokens", 10**15, "month")])
        con = sqlite3.connect(path)
        step = (now - month_start) // args.events
        t0 = time.perf_counter()
        batch = 200_000
        for start in range(0, args.events, batch):
            rows = [
                ("p", f"m{i % args.routes}", 0, "tokens", 3, month_start + i * step)
                for i in range(start, min(args.events, start + batch))
            ]
            con.executemany(
                "INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            con.commit()
        con.close()
        print(
            f"wrote {args.events:,} rows over {args.routes:,} routes in {time.perf_counter() - t0:.1f} s; "
            f"file {os.path.getsize(path) / 1e6:,.0f} MB"
        )
        expected = 3 * len(range(0, args.events, args.routes))
        for label, flag in (("month limit declared", "month"), ("classic four only (day windows)", "classic")):
            if flag == "classic":
                con = sqlite3.connect(path)
                con.execute("UPDATE models SET limits = NULL")
                con.commit()
                con.close()
            out = subprocess.run(
                [sys.executable, "-c", MEMORY_CHILD, path, str(now), str(args.routes), flag, os.path.abspath(args.pkg)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(
                f"| {label} | {r['rss_mb']:,.1f} MB | {r['load_s']:.1f} s | month tokens of route m0: "
                f"{r['month_tokens']} (expected {expected if flag == 'month' else '-'}) |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("speed")
    s.add_argument("--a", required=True)
    s.add_argument("--b", required=True)
    s.add_argument("--runs", type=int, default=5)
    s.add_argument("--ops", type=int, default=50_000)
    m = sub.add_parser("memory")
    m.add_argument("--pkg", required=True, help="where a release wheel was installed (pip install --target)")
    m.add_argument("--events", type=int, default=10_000_000)
    m.add_argument("--routes", type=int, default=1_000)
    args = ap.parse_args()
    speed(args) if args.cmd == "speed" else memory(args)


if __name__ == "__main__":
    main()
