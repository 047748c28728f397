"""A dollar budget under contention (issue 34): can concurrent callers spend past it?

    python benches/bench_budget.py [--procs 4] [--threads 8] [--seconds 5] [--budget 1.0] [--tenant]

Several processes of several threads each spend from one budget of ``--budget`` dollars a
day for ``--seconds``: every call reserves a random $0.001–0.02 (its estimate at the
model's prices) and, when admitted, reports exactly its estimate. Three ways to hold the
budget, each on the same workload:

* ``quotaengine`` on a SQLite file and on a real redis-server: a ``cost`` limit
  (``Limit.dollars(budget, "day")``) in the one atomic admission; spend recorded plus in
  flight can never pass the budget, so the total admitted must be <= the budget and within
  one call's cost of it.
* ``read then increment`` on the same kind of SQLite file, the way a budget check is
  usually written beside a router (read the day's spend, compare, call, then add the
  cost): two statements, each its own transaction, so callers that read the same spend
  all pass. LiteLLM's proxy budget check has this shape (BerriAI/litellm#40095: "concurrent
  first requests ran far over a budget"); it is not run here, the machine being offline.

With ``--tenant`` the budget is a tenant's (SPEC 23.2): ``set_tenant_limits("acme",
[Limit.dollars(budget, "day")])``, every call a ``lease_any`` over two models at two
prices ($10 and $5 a million tokens) for the tenants ``acme`` and its caller's own
``user:<process>``: the tenant's gate holds across routes, each candidate at its own price.

Each worker logs what it was admitted for; the tally is checked after the run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

P, M, K = "openai", "gpt-4o", 1
CHEAP = "gpt-4o-mini"  # --tenant: the second route, at half the price
# 10 $ per million input tokens: a token is 10 µ$ (exact), so an estimate of n tokens
# reserves exactly 10 n µ$.
PRICE = 10.0
LOW, HIGH = 100, 2_000  # tokens: $0.001 to $0.02


def engine_worker(store: str, threads: int, seconds: float, seed: int, tenant: bool, out: Any) -> None:
    import quotaengine as q

    e = q.QuotaEngine(store, env={})
    admitted: list[int] = []
    refused = [0]
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        rng = random.Random(seed * 1_000 + i)
        while time.monotonic() < stop:
            n = rng.randint(LOW, HIGH)
            try:
                if tenant:
                    routes = [(P, M, K), (P, CHEAP, K)]
                    lease = e.lease_any(routes, n, strategy="spread", tenant=["acme", f"user:{seed}"])
                else:
                    lease = e.lease(P, M, K, n)
            except q.QuotaExceeded:
                with lock:
                    refused[0] += 1
                time.sleep(0.001)
                continue
            lease.success(input_tokens=n)
            with lock:
                admitted.append(n * (5 if lease.model_id == CHEAP else 10))

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    e.close()
    out.put((sum(admitted), len(admitted), refused[0]))


def naive_worker(path: str, threads: int, seconds: float, seed: int, budget: int, out: Any) -> None:
    admitted: list[int] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        con = sqlite3.connect(path, timeout=30, isolation_level=None)
        rng = random.Random(seed * 1_000 + i)
        while time.monotonic() < stop:
            cost = rng.randint(LOW, HIGH) * 10
            (spent,) = con.execute("SELECT COALESCE(SUM(cost), 0) FROM spend").fetchone()
            if spent + cost > budget:
                time.sleep(0.001)
                continue
            time.sleep(0.0005)  # the call itself, however short
            con.execute("INSERT INTO spend (cost) VALUES (?)", (cost,))
            with lock:
                admitted.append(cost)
        con.close()

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put((sum(admitted), len(admitted), 0))


def start_redis(workdir: str) -> tuple[subprocess.Popen[bytes], int]:
    exe = shutil.which("redis-server")
    if exe is None:
        sys.exit("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, port
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def run_pool(target: Any, args_of: Any, procs: int) -> tuple[int, int, int]:
    """Runs ``procs`` processes of ``target(*args_of(j), queue)``; sums what they put."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    pool = [ctx.Process(target=target, args=(*args_of(j), out)) for j in range(procs)]
    for p in pool:
        p.start()
    results = [out.get() for _ in pool]
    for p in pool:
        p.join()
    return sum(r[0] for r in results), sum(r[1] for r in results), sum(r[2] for r in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--budget", type=float, default=1.0)
    ap.add_argument("--tenant", action="store_true", help="the budget is a tenant's, over two routes")
    args = ap.parse_args()
    import quotaengine as q

    budget = round(args.budget * 1_000_000)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        redis, port = start_redis(d)
        try:
            stores = {"SQLite file": os.path.join(d, "budget.db"), "Redis": f"redis://127.0.0.1:{port}/0"}
            for name, store in stores.items():
                with q.QuotaEngine(store, env={}) as e:
                    e.set_model_prices(P, M, q.Prices(PRICE, PRICE))
                    e.set_model_prices(P, CHEAP, q.Prices(PRICE / 2, PRICE / 2))
                    if args.tenant:
                        e.set_tenant_limits("acme", [q.Limit.dollars(args.budget, "day")])
                    else:
                        e.set_model_limits(P, M, limits=[q.Limit.dollars(args.budget, "day")])
                spent, calls, refused = run_pool(
                    engine_worker, lambda j, s=store: (s, args.threads, args.seconds, j, args.tenant), args.procs
                )
                with q.QuotaEngine(store, env={}) as e:
                    if args.tenant:
                        recorded = e.tenant_usage("acme")["cost/day"]["used"]
                    else:
                        recorded = e.usage(P, M, K)["cost/day"]["used"]
                holder = "a tenant's cost limit over two routes" if args.tenant else "a model's cost limit"
                rows.append((f"quotaengine, {holder}, {name}", spent, recorded, calls, refused))
        finally:
            redis.terminate()
            redis.wait()
        naive = os.path.join(d, "naive.db")
        con = sqlite3.connect(naive)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("CREATE TABLE spend (cost INTEGER NOT NULL)")
        con.commit()
        con.close()
        spent, calls, _ = run_pool(naive_worker, lambda j: (naive, args.threads, args.seconds, j, budget), args.procs)
        rows.append(("read then increment, SQLite file", spent, spent, calls, 0))
    print(
        f"{args.procs} processes x {args.threads} threads, {args.seconds:g} s, a budget of "
        f"${args.budget:.2f}/day, calls of $0.001-0.02\n"
    )
    print("| holder | admitted | recorded | calls | refused | over the budget |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, spent, recorded, calls, refused in rows:
        over = max(0, spent - budget)
        print(
            f"| {name} | ${spent / 1e6:.6f} | ${recorded / 1e6:.6f} | {calls:,} | {refused:,} | "
            f"${over / 1e6:.6f} ({over / budget:.1%}) |"
        )


if __name__ == "__main__":
    main()
