"""Processes sharing one file, free-running (real clock): each worker loops on
`lease()` + `success()` as fast as it can; per-process rates are measured inside
each worker, so process start-up is not counted.

    python benches/bench_processes.py [--ops 10000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time
from typing import Any


def worker(path: str, n: int, out: Any) -> None:
    import quotaengine as qe

    e = qe.QuotaEngine(path, env={})
    t = time.perf_counter()
    for i in range(n):
        lease = e.lease("groq", f"m{i % 20}", i % 5, 600)
        lease.success(500)
    out.put(n / (time.perf_counter() - t))
    e.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=10_000)
    args = ap.parse_args()
    import quotaengine as qe

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "procs.db")
        with qe.QuotaEngine(path, env={}) as e:
            for m in range(20):
                e.set_model_limits("groq", f"m{m}", rpm=10**9, rpd=10**9)
        ctx = mp.get_context("spawn")
        print("| processes | per-process ops/s | total ops/s |")
        print("|---:|---|---:|")
        for procs in (1, 2, 4):
            out = ctx.Queue()
            pool = [ctx.Process(target=worker, args=(path, args.ops, out)) for _ in range(procs)]
            for p in pool:
                p.start()
            for p in pool:
                p.join()
            rates = [out.get() for _ in pool]
            print(f"| {procs} | {', '.join(f'{r:,.0f}' for r in rates)} | {sum(rates):,.0f} |")


if __name__ == "__main__":
    main()
