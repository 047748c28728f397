#!/usr/bin/env python3
"""What choosing a route costs (SPEC 17): ``lease_any`` against ``lease()``, against the
loop a router writes today, and against that loop on ``limits`` and pyrate-limiter.

    python benches/bench_lease_any.py --a DIR_A --b DIR_B [--runs 5] [--ops 20000]

``DIR_A`` / ``DIR_B``: installed builds (``pip install --target DIR wheel.whl``), the
previous commit's and this one's. Run it with a Python that has ``limits`` and
``pyrate-limiter`` installed (``benches/README.md``). Each run is a fresh child per
build and workload, builds interleaved; the figure is the median over runs of ns per
admitted request (the admission, then ``success(tokens)``), on a file, with a
``ManualClock`` stepped 10 ms per request. Five candidates, each its own platform
with ``rpm``/``rpd``/``tpm``/``tpd`` declared:

* ``lease``: ``lease()`` on one route (the baseline, and the A/B of the hot path);
* ``lease wait_s=5``: the same with capacity there (a wait that never waits);
* ``any first``: ``lease_any`` over the five, all passing (``order``: the first is
  taken; ``headroom``: all five are scored);
* ``any last``: ``lease_any`` over the five, the first four refused (their day spent);
* ``loop last``: the router's loop: ``lease()`` on each in turn, catching
  ``QuotaExceeded``, the first four refused;
* ``limits loop`` / ``pyrate loop``: that loop on ``limits`` (sliding window counter, memory)
  and pyrate-limiter (in-memory bucket), per route a request and a token limit per
  minute and per day, the first four routes' day spent. In memory, not persisted, not
  shared by processes: what a router would use instead, at its cheapest.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ab import interleave  # noqa: E402

CHILD = r"""
import json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
workload, ops = sys.argv[2], int(sys.argv[3])
T0 = 1_767_268_800_000
ROUTES = [(f"p{i}", "m", i) for i in range(5)]
BIG = {"rpm": 10**9, "rpd": 10**12, "tpm": 10**12, "tpd": 10**15}


def timed(step):
    for _ in range(min(2000, ops // 10)):  # warm up
        step()
    t = time.perf_counter_ns()
    for _ in range(ops):
        step()
    return (time.perf_counter_ns() - t) / ops


if workload.startswith(("limits", "pyrate")):
    clock_ms = [T0]
    if workload.startswith("limits"):
        import limits
        import limits.storage.memory as lmem
        import limits.strategies as lstrat

        class Sim:
            @staticmethod
            def time():
                return clock_ms[0] / 1000

            @staticmethod
            def sleep(s):
                pass

        lmem.time = Sim
        lstrat.time = Sim
        strat = lstrat.SlidingWindowCounterRateLimiter(limits.storage.storage_from_string("memory://"))
        per_route = {
            r: [limits.parse(s) for s in (["1/day"] if i < 4 else ["1000000000/minute", "1000000000000/day"])]
            for i, r in enumerate(ROUTES)
        }
        tok = {r: [limits.parse("1000000000000/minute"), limits.parse("1000000000000000/day")] for r in ROUTES}
        for r in ROUTES[:4]:
            strat.hit(per_route[r][0], *r)  # the day spent

        def admit(r):
            if not all(strat.test(l, *r) for l in per_route[r]):
                return False
            for l in per_route[r]:
                strat.hit(l, *r)
            for l in tok[r]:
                strat.hit(l, *r, cost=500)
            return True
    else:
        from pyrate_limiter import Duration, InMemoryBucket, Limiter, Rate, RateItem, BucketFactory

        buckets = {}
        for i, r in enumerate(ROUTES):
            req = [Rate(1, Duration.DAY)] if i < 4 else [Rate(10**9, Duration.MINUTE), Rate(10**12, Duration.DAY)]
            buckets["req" + str(r)] = InMemoryBucket(req)
            buckets["tok" + str(r)] = InMemoryBucket([Rate(10**12, Duration.MINUTE), Rate(10**15, Duration.DAY)])

        class Factory(BucketFactory):
            def wrap_item(self, name, weight=1):
                return RateItem(name, clock_ms[0], weight=weight)

            def get(self, item):
                return buckets[item.name]

        acquire = Limiter(Factory()).try_acquire
        for r in ROUTES[:4]:
            acquire("req" + str(r), 1, blocking=False)

        def admit(r):
            return acquire("req" + str(r), 1, blocking=False) and acquire("tok" + str(r), 500, blocking=False)

    def step():
        clock_ms[0] += 10
        for r in ROUTES:
            if admit(r):
                return
        raise SystemExit("nothing admitted")

    print(json.dumps({"ns": timed(step)}))
    raise SystemExit(0)

import quotaengine as q

flush = int(workload.rsplit("=", 1)[1])
clock = q.ManualClock(T0)
path = os.path.join(tempfile.mkdtemp(), "b.db")
e = q.QuotaEngine(path, clock=clock, env={}, flush_interval_ms=flush)
for i, (p, m, k) in enumerate(ROUTES):
    if "last" in workload and i < 4:
        e.set_model_limits(p, m, rpm=10**9, rpd=1, tpm=10**12, tpd=10**15)
        e.record_request(p, m, k)  # its day is spent
    else:
        e.set_model_limits(p, m, **BIG)
p, m, k = ROUTES[0]

if workload.startswith("lease wait"):
    def step():
        clock.advance(10)
        e.lease(p, m, k, 500, wait_s=5).success(tokens=450)
elif workload.startswith("lease"):
    def step():
        clock.advance(10)
        e.lease(p, m, k, 500).success(tokens=450)
elif workload.startswith("any"):
    strategy = "order" if "order" in workload else "headroom"
    def step():
        clock.advance(10)
        e.lease_any(ROUTES, 500, strategy=strategy).success(tokens=450)
elif workload.startswith("loop"):
    def step():
        clock.advance(10)
        for r in ROUTES:
            try:
                lease = e.lease(*r, 500)
            except q.QuotaExceeded:
                continue
            lease.success(tokens=450)
            return
        raise SystemExit("nothing admitted")

ns = timed(step)
e.close()
print(json.dumps({"ns": ns}))
"""

ENGINE = [
    "lease",
    "lease wait_s=5",
    "any first order",
    "any first headroom",
    "any last order",
    "any last headroom",
    "loop last",
]
WORKLOADS = [f"{w} flush={f}" for f in (0, 10) for w in ENGINE] + ["limits loop", "pyrate loop"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ops", type=int, default=20_000)
    args = ap.parse_args()
    builds = {"A": os.path.abspath(args.a), "B": os.path.abspath(args.b)}

    def skip(build: str, w: str) -> bool:
        # A (before lease_any) runs the workloads it has; the others are the same code.
        return build == "A" and not w.startswith(("lease flush", "loop"))

    def ops_of(w: str) -> int:
        return args.ops * (5 if "flush=10" in w or w.endswith("loop") else 1)

    ns = interleave(CHILD, WORKLOADS, builds, args.runs, ops_of, skip)
    med = {key: statistics.median(v) for key, v in ns.items()}
    print("| workload | A ns | B ns | B/A | B / lease() of B | runs B |")
    print("|---|---:|---:|---:|---:|---|")
    for w in WORKLOADS:
        flush = w.rsplit("=", 1)[1] if "flush=" in w else "10"
        base = med[(f"lease flush={flush}", "B")]
        a = med.get((w, "A"))
        b = med[(w, "B")]
        runs = ", ".join(f"{x:,.0f}" for x in ns[(w, "B")])
        a_s = "" if a is None else f"{a:,.0f}"
        ab = "" if a is None else f"{b / a:.3f}"
        print(f"| {w} | {a_s} | {b:,.0f} | {ab} | {b / base:.2f} | {runs} |")


if __name__ == "__main__":
    main()
