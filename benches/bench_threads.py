"""Free-running threads sharing one engine (group commit), real clock, file database.

    python benches/bench_threads.py [--ops 20000]

Unlike bench_compare.py's ordered stream (threads take turns on one simulated
clock), the threads here run as a router's workers would: each loops on
`lease()` + `success()` on its own routes as fast as it can.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

import quotaengine as qe


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=20_000)
    args = ap.parse_args()
    print("| threads | ops/s | vs 1 thread |")
    print("|---:|---:|---:|")
    base = None
    for threads in (1, 2, 4, 8):
        with tempfile.TemporaryDirectory() as d:
            e = qe.QuotaEngine(os.path.join(d, "t.db"), env={})
            for m in range(20):
                e.set_model_limits("groq", f"m{m}", rpm=10**9, rpd=10**9, tpm=10**12, tpd=10**12)
            per = args.ops // threads

            def work(tid: int, e: qe.QuotaEngine = e, per: int = per) -> None:
                for i in range(per):
                    lease = e.lease("groq", f"m{(i + tid) % 20}", i % 5, 600)
                    lease.success(500)

            pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
            t0 = time.perf_counter()
            for t in pool:
                t.start()
            for t in pool:
                t.join()
            rate = per * threads / (time.perf_counter() - t0)
            e.close()
        base = base or rate
        print(f"| {threads} | {rate:,.0f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
