#!/usr/bin/env python3
"""Peak RSS of a long outage (SPEC 18.2): a SQLite file locked by another connection for
``--days`` simulated days (a ``ManualClock``) at ``--per-day`` requests a day, each a
``lease()`` and a ``success()``, only ``rpm`` declared and ``retention_ms`` one hour.

    python benches/bench_degraded_rss.py [--days 58] [--per-day 10000]

Prints, at the end of day 1, 7, 30 and the last day: the buffered writes and the peak RSS
of this process (``ru_maxrss``). Run it against builds installed with ``pip install
--target DIR wheel.whl`` by putting DIR first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import resource
import sqlite3
import tempfile
import time
from pathlib import Path

import quotaengine as q


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=58)
    ap.add_argument("--per-day", type=int, default=10_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "q.db"
        clock = q.ManualClock(1_767_225_600_000)
        e = q.QuotaEngine(path, clock=clock, env={}, retention_ms=3_600_000, busy_timeout_ms=0)
        e.set_model_limits("groq", "llama", rpm=1000)
        lock = sqlite3.connect(path, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
        step = 86_400_000 // args.per_day
        start = time.perf_counter()
        marks = {1, 7, 30, args.days}
        print(f"RSS at start: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
        for day in range(1, args.days + 1):
            for _ in range(args.per_day):
                e.lease("groq", "llama", 1, 10).success(tokens=5)
                clock.advance(step)
            if day in marks:
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                print(
                    f"day {day:>3}: {e._pending_writes():>9,} buffered writes, peak RSS {rss:6.0f} MiB"
                    f" ({time.perf_counter() - start:.0f} s)",
                    flush=True,
                )
        assert e.degraded
        lock.execute("ROLLBACK")
        e.record_request("groq", "llama", 1)  # replays what was kept
        assert not e.degraded
        e.close()


if __name__ == "__main__":
    main()
