#!/usr/bin/env python3
"""Retention sweep cost on a large file, A/B between two builds of the package.

    python benches/bench_sweep.py --a DIR_A --b DIR_B [--rows 1000000,10000000] [--runs 3]

``DIR_A`` / ``DIR_B`` are directories a wheel was installed into with
``pip install --target DIR wheel.whl`` (the previous commit's build and this one's).

Each run is a fresh child process on a fresh copy of a file that holds ``rows`` usage
rows spread evenly over the 24 h before the run (the steady state of a full file under
the default 24 h retention), plus 1,000 stragglers (rows stamped 25 h ago under the
newest ids, as a plain sqlite3 writer or an outage's replay would leave them). The
child opens an engine (``retention_ms`` default, ``ManualClock``), makes one
``record_request`` (the first write section: the first sweep, a full scan), then
``--minutes`` minutes of engine time at one ``record_request`` per simulated second.
The op that opens each new minute runs the once-a-minute sweep, which deletes the
rows that aged out in that minute (rows / 1440). Reported per build and size (median
over runs): the open, the first op, the median sweep op and the median other op, in
microseconds, and whether any stale row is left at the end. Runs alternate between
the builds (A, B, A, B, ...), so both see the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

DAY_MS = 86_400_000
MINUTE_MS = 60_000
T0_MS = 1_767_268_800_000  # 2026-01-01 12:00 UTC
STRAGGLERS = 1_000

CHILD = r"""
import json, sqlite3, sys, time
sys.path.insert(0, sys.argv[1])
import quotaengine as q
path, minutes, t0 = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
clock = q.ManualClock(t0)
t = time.perf_counter_ns()
e = q.QuotaEngine(path, clock=clock, env={})
open_us = (time.perf_counter_ns() - t) / 1000
t = time.perf_counter_ns()
e.record_request("bench", "m", 1)
first_us = (time.perf_counter_ns() - t) / 1000
sweeps, others = [], []
for i in range(1, minutes * 60 + 1):
    clock.advance(1_000)
    t = time.perf_counter_ns()
    e.record_request("bench", "m", 1)
    us = (time.perf_counter_ns() - t) / 1000
    # the last sweep ran at t0; the first op 60 s or more after it sweeps again
    (sweeps if i % 60 == 0 else others).append(us)
e.close()
con = sqlite3.connect(path)
cutoff = clock.now_ms() - 86_400_000
stale = con.execute("SELECT COUNT(*) FROM rate_limit_usage WHERE created_at_ms < ?", (cutoff,)).fetchone()[0]
con.close()
sweeps.sort(); others.sort()
print(json.dumps({"open_us": open_us, "first_us": first_us, "sweep_us": sweeps[len(sweeps) // 2],
                  "other_us": others[len(others) // 2], "stale_left": stale}))
"""


def template(build: str, rows: int, workdir: str) -> str:
    """A file made by `build` (its own schema version), then bulk-loaded with stdlib sqlite3."""
    path = os.path.join(workdir, f"template-{os.path.basename(build)}-{rows}.db")
    if os.path.exists(path):
        return path
    subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {build!r}); import quotaengine as q; "
            f"q.QuotaEngine({path!r}, env={{}}).close()",
        ],
        check=True,
    )
    con = sqlite3.connect(path)
    start = T0_MS - DAY_MS
    step = DAY_MS / rows
    with con:
        con.executemany(
            "INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms) "
            "VALUES ('bench', ?, ?, 'request', 0, ?)",
            ((f"m{i % 50}", i % 5, int(start + i * step)) for i in range(rows)),
        )
        con.executemany(
            "INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms) "
            "VALUES ('bench', 'late', 1, 'tokens', 7, ?)",
            ((start - 3_600_000 + i,) for i in range(STRAGGLERS)),
        )
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return path


def run(build: str, tpl: str, minutes: int, workdir: str) -> dict[str, float]:
    path = os.path.join(workdir, "run.db")
    for side in ("", "-wal", "-shm", "-engines"):
        if os.path.exists(path + side):
            os.remove(path + side)
    shutil.copyfile(tpl, path)
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    out = subprocess.run(
        [sys.executable, "-c", CHILD, build, path, str(minutes), str(T0_MS)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="build A (the previous commit): a pip --target directory")
    ap.add_argument("--b", required=True, help="build B (this commit)")
    ap.add_argument("--rows", default="1000000,10000000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--minutes", type=int, default=20)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="qe-sweep-")
    builds = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for rows in (int(float(r)) for r in args.rows.split(",")):
        tpls = {name: template(b, rows, workdir) for name, b in builds.items()}
        for _ in range(args.runs):
            for name, b in builds.items():
                results.setdefault((name, rows), []).append(run(b, tpls[name], args.minutes, workdir))
        for name in builds:
            os.remove(tpls[name])
    print("| build | rows | open ms | first op ms (full sweep) | sweep op µs | other op µs | stale rows left | runs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for (name, rows), rs in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):

        def med(k: str, rs: list[dict[str, float]] = rs) -> float:
            return statistics.median(r[k] for r in rs)

        print(
            f"| {name} | {rows:,} | {med('open_us') / 1000:,.0f} | {med('first_us') / 1000:,.0f} | "
            f"{med('sweep_us'):,.0f} | {med('other_us'):,.0f} | {max(r['stale_left'] for r in rs)} | {len(rs)} |"
        )


if __name__ == "__main__":
    t = time.monotonic()
    main()
    print(f"\n({time.monotonic() - t:.0f} s)", file=sys.stderr)
