#!/usr/bin/env python3
"""Hot-path benchmark: quotaengine against what a Python user would pick instead.

    python benches/bench_compare.py [--ops N] [--quick] [--out benches/results.md]

One deterministic stream of ``lease()`` + ``success(tokens)`` ops (see ``Workload``)
goes through every system, each in its own child process (so that each child's
peak RSS is its own):

* quotaengine, file database, default durability (``flush_interval_ms=0``), and with
  ``flush_interval_ms=10``; driven by ``quotaengine.ManualClock`` (100 ms per op: 200k
  ops span 06:00 to 11:33 UTC of one simulated day);
* ``limits`` moving window and sliding-window counter, ``memory://`` storage, four
  limits per route (test all four, then hit all four);
* ``pyrate-limiter`` in-memory and SQLite buckets (a request bucket and a token
  bucket per route, weight = tokens);
* ``baseline_sqlite.py``: quotaengine's design hand-written over stdlib ``sqlite3``.

The baselines are fed the same simulated time (``limits`` through its storage
module's ``time``, ``pyrate`` through the items' timestamps), so every system sees
the same stream and limits; the wall-clock time of each run is real time.
Also: 4 threads sharing one engine, 2 processes sharing one file (with an overshoot
check from the file), and the floor cost of a PyO3 call.

Run with the release build (see benches/README.md); a debug build is ~10-50x slower.
"""

from __future__ import annotations

import argparse
import array
import bisect
import calendar
import collections
import json
import math
import os
import platform as _platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

SEED = 20240601
N_PLATFORMS, N_MODELS, N_KEYS = 10, 20, 5
ZIPF_S = 1.1
STEP_MS = 100
T0_MS = calendar.timegm((2025, 3, 3, 6, 0, 0)) * 1000  # a Monday, 06:00 UTC
MINUTE_MS = 60_000
DAY_MS = 86_400_000


# ----------------------------------------------------------------------------- workload


class Workload:
    """The stream: ``ops[i] = (platform, model_id, key_id, estimated, actual)`` at time
    ``T0_MS + i * STEP_MS``, and ``limits[(platform, model_id)] = (rpm, rpd, tpm, tpd)``.

    Platforms uniform, models Zipf(s=1.1) by rank, keys uniform; estimated tokens
    lognormal (median 600, sigma 0.5, clipped to 20..8000); actual 0.55-1.15x the
    estimate. Limits are set per model from its expected per-route traffic so that
    about 10% of admissions are refused over the stream (all four gates bind).
    """

    def __init__(self, n: int, seed: int = SEED) -> None:
        self.n = n
        rng = random.Random(seed)
        self.platforms = [f"plat{p}" for p in range(N_PLATFORMS)]
        self.models = [f"model-{m:02d}" for m in range(N_MODELS)]
        w = [1.0 / (r**ZIPF_S) for r in range(1, N_MODELS + 1)]
        total = sum(w)
        z = [x / total for x in w]
        cum = list(_accumulate(z))
        cum[-1] = 1.0
        key_ids = [[100 + p * N_KEYS + k for k in range(N_KEYS)] for p in range(N_PLATFORMS)]
        ops = []
        for _ in range(n):
            p = rng.randrange(N_PLATFORMS)
            m = min(bisect.bisect_left(cum, rng.random()), N_MODELS - 1)
            k = rng.randrange(N_KEYS)
            est = max(20, min(8000, int(rng.lognormvariate(math.log(600), 0.5))))
            act = max(1, int(est * rng.uniform(0.55, 1.15)))
            ops.append((self.platforms[p], self.models[m], key_ids[p][k], est, act))
        self.ops = ops
        self.limits = {}
        for p in range(N_PLATFORMS):
            for m in range(N_MODELS):
                per_min = (MINUTE_MS / STEP_MS) * z[m] / (N_PLATFORMS * N_KEYS)  # requests/min/route
                per_run = n * z[m] / (N_PLATFORMS * N_KEYS)  # requests/route over the stream
                rpm = max(1, round(per_min * 1.4 + 2))
                tpm = max(1000, round(per_min * 600 * 1.1 + 1500))
                rpd = max(rpm + 1, round(per_run * 0.95))
                tpd = max(tpm + 1, round(per_run * 600 * 0.95))
                self.limits[(self.platforms[p], self.models[m])] = (rpm, rpd, tpm, tpd)

    @staticmethod
    def time_ms(i: int) -> int:
        return T0_MS + i * STEP_MS


def _accumulate(xs):
    c = 0.0
    for x in xs:
        c += x
        yield c


def reference_refusals(wl: Workload, n: int) -> dict:
    """Exact single-thread semantics of SPEC section 4 in plain Python: the refusal
    count (by reason) every exact system must reproduce on the first ``n`` ops."""
    minute = collections.defaultdict(collections.deque)
    m_tok = collections.Counter()
    d_req = collections.Counter()
    d_tok = collections.Counter()
    reasons = collections.Counter()
    for i, (p, m, k, est, act) in enumerate(wl.ops[:n]):
        t = T0_MS + i * STEP_MS
        r = (p, m, k)
        q = minute[r]
        while q and q[0][0] <= t - MINUTE_MS:
            m_tok[r] -= q.popleft()[1]
        rpm, rpd, tpm, tpd = wl.limits[(p, m)]
        if len(q) >= rpm:
            reasons["rpm"] += 1
        elif d_req[r] >= rpd:
            reasons["rpd"] += 1
        elif m_tok[r] + est > tpm:
            reasons["tpm"] += 1
        elif d_tok[r] + est > tpd:
            reasons["tpd"] += 1
        else:
            q.append((t, act))
            m_tok[r] += act
            d_req[r] += 1
            d_tok[r] += act
    return {"refused": sum(reasons.values()), "by_reason": dict(reasons)}


# ----------------------------------------------------------------------------- helpers


def rss_now_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def percentile(sorted_vals, q: float) -> float:
    if not sorted_vals:
        return float("nan")
    idx = min(len(sorted_vals) - 1, max(0, int(math.ceil(q * len(sorted_vals))) - 1))
    return sorted_vals[idx]


def drive(ops, settime, admit, start_index: int = 0, stride: int = 1) -> dict:
    """Runs ``admit`` over ``ops`` (op j has global index start_index + j*stride),
    setting the simulated time before each op. Returns timings."""
    n = len(ops)
    lat = array.array("q", bytes(8 * n))
    tenth = max(1, n // 10)
    marks = []
    refused = 0
    pc = time.perf_counter_ns
    t_start = pc()
    wall_start = time.time()
    i = start_index
    for j, (p, m, k, est, act) in enumerate(ops):
        settime(T0_MS + i * STEP_MS)
        s = pc()
        if not admit(p, m, k, est, act):
            refused += 1
        e = pc()
        lat[j] = e - s
        i += stride
        if (j + 1) % tenth == 0:
            marks.append(e)
    t_end = pc()
    wall_end = time.time()
    return _summarise(n, refused, lat, t_start, t_end, marks, tenth) | {"wall_start": wall_start, "wall_end": wall_end}


def _summarise(n, refused, lat, t_start, t_end, marks, tenth) -> dict:
    elapsed = (t_end - t_start) / 1e9
    s = sorted(lat)
    out = {
        "ops": n,
        "elapsed_s": elapsed,
        "ops_s": n / elapsed if elapsed else float("nan"),
        "p50_us": percentile(s, 0.50) / 1000,
        "p99_us": percentile(s, 0.99) / 1000,
        "refused": refused,
        "refused_frac": refused / n if n else float("nan"),
    }
    if len(marks) >= 10:
        first = tenth / ((marks[0] - t_start) / 1e9)
        last = tenth / ((marks[9] - marks[8]) / 1e9)
        out |= {"first_tenth_ops_s": first, "last_tenth_ops_s": last, "flatness": last / first}
    return out


class SimTime:
    """A settable clock for the pure-Python baselines."""

    __slots__ = ("ms",)

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def set(self, ms: int) -> None:
        self.ms = ms

    def now_ms(self) -> int:
        return self.ms

    def time(self) -> float:  # the `time.time()` that limits' memory storage calls
        return self.ms / 1000.0


# ----------------------------------------------------------------------------- systems


def _qe_engine(path: str, clock, flush_ms: int):
    import quotaengine

    return quotaengine.QuotaEngine(path, clock=clock, env={}, flush_interval_ms=flush_ms)


def _qe_setup_limits(eng, wl: Workload) -> None:
    for (p, m), (rpm, rpd, tpm, tpd) in wl.limits.items():
        eng.set_model_limits(p, m, rpm=rpm, rpd=rpd, tpm=tpm, tpd=tpd)


def _qe_admit(eng):
    from quotaengine import QuotaExceeded

    lease = eng.lease

    def admit(p, m, k, est, act):
        try:
            lease(p, m, k, est).success(act)
            return True
        except QuotaExceeded:
            return False

    return admit


def run_qe(wl, n, db_dir, flush_ms: int = 0, memory: bool = False) -> dict:
    import quotaengine

    clock = quotaengine.ManualClock(T0_MS)
    path = ":memory:" if memory else os.path.join(db_dir, "qe.db")
    eng = _qe_engine(path, clock, flush_ms)
    _qe_setup_limits(eng, wl)
    res = drive(wl.ops[:n], clock.set, _qe_admit(eng))
    t = time.perf_counter()
    eng.close()
    res["close_s"] = time.perf_counter() - t
    if not memory:
        res["db_mb"] = (
            sum(os.path.getsize(os.path.join(db_dir, f)) for f in os.listdir(db_dir) if f.startswith("qe.db")) / 2**20
        )
    return res


def run_qe_threads(wl, n, db_dir, flush_ms: int = 0, threads: int = 4) -> dict:
    """``threads`` threads share one engine; thread t takes ops t, t+T, ...; each
    op advances the shared ManualClock by STEP_MS (so the clock stays monotonic)."""
    import quotaengine

    clock = quotaengine.ManualClock(T0_MS - STEP_MS)
    eng = _qe_engine(os.path.join(db_dir, "qe.db"), clock, flush_ms)
    _qe_setup_limits(eng, wl)
    admit = _qe_admit(eng)
    results = [None] * threads
    barrier = threading.Barrier(threads + 1)

    def worker(t):
        ops = wl.ops[t:n:threads]
        adv = clock.advance
        lat = array.array("q", bytes(8 * len(ops)))
        refused = 0
        pc = time.perf_counter_ns
        barrier.wait()
        for j, (p, m, k, est, act) in enumerate(ops):
            adv(STEP_MS)
            s = pc()
            if not admit(p, m, k, est, act):
                refused += 1
            lat[j] = pc() - s
        results[t] = (refused, lat)

    ths = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for th in ths:
        th.start()
    barrier.wait()
    t0 = time.perf_counter_ns()
    for th in ths:
        th.join()
    t1 = time.perf_counter_ns()
    eng.close()
    lat = array.array("q")
    refused = 0
    for r, la in results:
        refused += r
        lat.extend(la)
    out = _summarise(n, refused, lat, t0, t1, [], 1)
    out["threads"] = threads
    return out


def _limits_admit(limiter, wl):
    """``limits``' admission of one op: four items per route (RPM, RPD, TPM, TPD with
    ``cost=tokens``); test all four, then hit all four."""
    import limits

    items = {}
    for (p, m), (rpm, rpd, tpm, tpd) in wl.limits.items():
        items[(p, m)] = (
            limits.RateLimitItemPerMinute(rpm, namespace="rpm"),
            limits.RateLimitItemPerDay(rpd, namespace="rpd"),
            limits.RateLimitItemPerMinute(tpm, namespace="tpm"),
            limits.RateLimitItemPerDay(tpd, namespace="tpd"),
        )
    test, hit = limiter.test, limiter.hit

    def admit(p, m, k, est, act):
        rpm, rpd, tpm, tpd = items[(p, m)]
        ks = str(k)
        if not (
            test(rpm, p, m, ks)
            and test(rpd, p, m, ks)
            and test(tpm, p, m, ks, cost=est)
            and test(tpd, p, m, ks, cost=est)
        ):
            return False
        hit(rpm, p, m, ks)
        hit(rpd, p, m, ks)
        hit(tpm, p, m, ks, cost=est)
        hit(tpd, p, m, ks, cost=est)
        return True

    return admit


def run_limits(wl, n, strategy: str, real_clock: bool = False) -> dict:
    import limits
    import limits.storage.memory as lmem
    import limits.strategies as lstrat

    sim = SimTime(T0_MS)
    if not real_clock:
        lmem.time = sim  # the storage reads time.time(); feed it the simulated clock
        lstrat.time = sim
    storage = limits.storage.storage_from_string("memory://")
    cls = {
        "mw": lstrat.MovingWindowRateLimiter,
        "swc": lstrat.SlidingWindowCounterRateLimiter,
    }[strategy]
    admit = _limits_admit(cls(storage), wl)
    res = drive(wl.ops[:n], sim.set, admit)
    res["note"] = f"limits {limits.__version__}, memory://, {'real' if real_clock else 'simulated'} time"
    return res


class _RouteBuckets:
    """pyrate-limiter BucketFactory: a request bucket and a token bucket per route,
    created on first use; items stamped with the simulated time."""

    def __init__(self, wl, sim, kind: str, db_path: str | None = None, real_clock: bool = False):
        from pyrate_limiter import BucketFactory, Duration, InMemoryBucket, Rate, RateItem, SQLiteBucket
        from pyrate_limiter.buckets.sqlite_bucket import Queries

        outer = self

        class Factory(BucketFactory):
            if real_clock:

                def wrap_item(self, name, weight=1):
                    return RateItem(name, time.time_ns() // 1_000_000, weight=weight)

            else:

                def wrap_item(self, name, weight=1):
                    return RateItem(name, sim.ms, weight=weight)

            def get(self, item):
                b = outer.buckets.get(item.name)
                if b is None:
                    b = outer.make(item.name)
                return b

        self.factory = Factory()
        self.buckets = {}
        self.wl = wl
        self.kind = kind
        self.Rate, self.Duration = Rate, Duration
        self.InMemoryBucket, self.SQLiteBucket, self.Queries = InMemoryBucket, SQLiteBucket, Queries
        self.conn = None
        if kind == "sqlite":
            import sqlite3

            self.conn = sqlite3.connect(db_path, isolation_level="DEFERRED", check_same_thread=False)
            # the engine's and the hand-written baseline's settings (kinder than pyrate's default rollback journal)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")

    def make(self, name: str):
        what, p, m, k = name.split("|")
        rpm, rpd, tpm, tpd = self.wl.limits[(p, m)]
        R, D = self.Rate, self.Duration
        rates = [R(rpm, D.MINUTE), R(rpd, D.DAY)] if what == "req" else [R(tpm, D.MINUTE), R(tpd, D.DAY)]
        if self.kind == "memory":
            b = self.InMemoryBucket(rates)
        else:
            table = f"b{len(self.buckets)}"
            self.conn.execute(self.Queries.CREATE_BUCKET_TABLE.format(table=table))
            self.conn.execute(
                self.Queries.CREATE_INDEX_ON_TIMESTAMP.format(index_name=f"idx_{table}", table_name=table)
            )
            self.conn.commit()
            b = self.SQLiteBucket(rates, self.conn, table)
        self.buckets[name] = b
        return b


def _pyrate_admit(acquire):
    """Admission through pyrate-limiter: the route's request bucket, then its token bucket."""

    def admit(p, m, k, est, act):
        # two buckets, no atomicity between them: a request admitted by the first and
        # refused by the second stays counted (pyrate has no multi-bucket acquire)
        route = f"{p}|{m}|{k}"
        if not acquire("req|" + route, 1, blocking=False):
            return False
        return acquire("tok|" + route, est, blocking=False)

    return admit


def run_pyrate(wl, n, kind: str, db_dir: str, real_clock: bool = False) -> dict:
    import pyrate_limiter
    from pyrate_limiter import Limiter

    sim = SimTime(T0_MS)
    rb = _RouteBuckets(wl, sim, kind, os.path.join(db_dir, "pyrate.db"), real_clock)
    admit = _pyrate_admit(Limiter(rb.factory).try_acquire)
    res = drive(wl.ops[:n], sim.set, admit)
    res["note"] = (
        f"pyrate-limiter {getattr(pyrate_limiter, '__version__', '?')}, {kind}, {'real' if real_clock else 'simulated'} time"
    )
    return res


def run_baseline(wl, n, db_dir) -> dict:
    sys.path.insert(0, HERE)
    from baseline_sqlite import BaselineEngine, QuotaExceeded

    sim = SimTime(T0_MS)
    eng = BaselineEngine(os.path.join(db_dir, "baseline.db"), clock=sim.now_ms)
    for (p, m), (rpm, rpd, tpm, tpd) in wl.limits.items():
        eng.set_model_limits(p, m, rpm=rpm, rpd=rpd, tpm=tpm, tpd=tpd)
    lease = eng.lease

    def admit(p, m, k, est, act):
        try:
            lease(p, m, k, est).success(act)
            return True
        except QuotaExceeded:
            return False

    res = drive(wl.ops[:n], sim.set, admit)
    eng.close()
    return res


def run_floor() -> dict:
    import quotaengine

    reps = 1_000_000
    pc = time.perf_counter_ns
    f = quotaengine.sqlite_version
    clock = quotaengine.ManualClock(T0_MS)
    g = clock.now_ms
    out = {}
    for name, fn in (("empty", None), ("sqlite_version", f), ("clock_now_ms", g)):
        best = float("inf")
        for _ in range(5):
            if fn is None:
                s = pc()
                for _ in range(reps):
                    pass
                e = pc()
            else:
                s = pc()
                for _ in range(reps):
                    fn()
                e = pc()
            best = min(best, (e - s) / reps)
        out[name] = best
    # check() on a file engine against a no-op method taking the same arguments.
    with tempfile.TemporaryDirectory() as d:
        eng = quotaengine.QuotaEngine(os.path.join(d, "floor.db"), clock=clock, env={})
        eng.set_model_limits("groq", "llama-3.1-8b", rpm=30, rpd=14_400, tpm=6_000, tpd=500_000)
        for name, fn in (("check", eng.check), ("noop_check", eng._noop_check)):
            best = float("inf")
            for _ in range(5):
                s = pc()
                for _ in range(reps // 5):
                    fn("groq", "llama-3.1-8b", 1, 100)
                e = pc()
                best = min(best, (e - s) / (reps // 5))
            out[name] = best
        eng.close()
    return {
        "sqlite_version_ns": out["sqlite_version"] - out["empty"],
        "clock_now_ms_ns": out["clock_now_ms"] - out["empty"],
        "check_ns": out["check"] - out["empty"],
        "noop_check_ns": out["noop_check"] - out["empty"],
        "loop_ns": out["empty"],
    }


# ------------------------------------------------------------- multi-process workers


def proc_worker(system, n_full, n, w, db, flush_ms, counter, limits_set, barrier, results) -> None:
    """One of several processes on a shared file. Ops are claimed from a shared counter
    (a queue of work both processes pull from); op i runs at simulated time
    T0 + i * STEP_MS on this process's own ManualClock, so the processes' clocks stay
    within an op or two of each other."""
    try:
        wl = Workload(n_full)
        if w != 0:
            limits_set.wait()
        if system == "qe-proc":
            import quotaengine

            clock = quotaengine.ManualClock(T0_MS)
            eng = _qe_engine(db, clock, flush_ms)
            if w == 0:
                _qe_setup_limits(eng, wl)
            settime, admit = clock.set, _qe_admit(eng)
        else:
            sys.path.insert(0, HERE)
            from baseline_sqlite import BaselineEngine, QuotaExceeded

            sim = SimTime(T0_MS)
            eng = BaselineEngine(db, clock=sim.now_ms)
            if w == 0:
                for (p, m), (rpm, rpd, tpm, tpd) in wl.limits.items():
                    eng.set_model_limits(p, m, rpm=rpm, rpd=rpd, tpm=tpm, tpd=tpd)
            lease = eng.lease

            def admit(p, m, k, est, act):
                try:
                    lease(p, m, k, est).success(act)
                    return True
                except QuotaExceeded:
                    return False

            settime = sim.set
        if w == 0:
            limits_set.set()
        ops = wl.ops
        lat = array.array("q")
        refused = 0
        lock = counter.get_lock()
        pc = time.perf_counter_ns
        barrier.wait()
        wall_start = time.time()
        while True:
            with lock:
                i = counter.value
                counter.value = i + 1
            if i >= n:
                break
            settime(T0_MS + i * STEP_MS)
            p, m, k, est, act = ops[i]
            s = pc()
            if not admit(p, m, k, est, act):
                refused += 1
            lat.append(pc() - s)
        wall_end = time.time()
        eng.close()
        sl = sorted(lat)
        results.put(
            {
                "w": w, "ops": len(lat), "refused": refused, "wall_start": wall_start, "wall_end": wall_end,
                "ops_s": len(lat) / (wall_end - wall_start), "p50_us": percentile(sl, 0.5) / 1000,
                "p99_us": percentile(sl, 0.99) / 1000, "peak_rss_mb": peak_rss_mb(),
            }
        )  # fmt: skip
    except BaseException as e:  # noqa: BLE001 -- reported by the parent
        limits_set.set()
        barrier.abort()
        results.put({"w": w, "error": f"{type(e).__name__}: {e}"})


def overshoot(db: str, wl: Workload) -> dict:
    """From the file: for every route, requests in any sliding 60 s window never
    exceed rpm and requests in any UTC day never exceed rpd."""
    import sqlite3

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = conn.execute(
        "SELECT platform, model_id, key_id, created_at_ms FROM rate_limit_usage WHERE kind='request'"
        " ORDER BY platform, model_id, key_id, created_at_ms"
    ).fetchall()
    conn.close()
    by_route = collections.defaultdict(list)
    for p, m, k, t in rows:
        by_route[(p, m, k)].append(t)
    over_rpm = over_rpd = 0
    for (p, m, _k), ts in by_route.items():
        rpm, rpd, _, _ = wl.limits[(p, m)]
        lo = 0
        for j, t in enumerate(ts):
            while ts[lo] <= t - MINUTE_MS:
                lo += 1
            if j - lo + 1 > rpm:
                over_rpm += 1
        days = collections.Counter(t // DAY_MS for t in ts)
        over_rpd += sum(1 for c in days.values() if c > rpd)
    return {"request_rows": len(rows), "over_rpm": over_rpm, "over_rpd": over_rpd}


def run_procs(system: str, wl: Workload, n: int, workers: int, flush_ms: int = 0) -> dict:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # fresh interpreters: each worker's RSS is its own
    tmp = tempfile.mkdtemp(prefix="qebench-procs-")
    db = os.path.join(tmp, "shared.db")
    try:
        counter = ctx.Value("q", 0)
        limits_set = ctx.Event()
        barrier = ctx.Barrier(workers)
        results = ctx.Queue()
        procs = [
            ctx.Process(
                target=proc_worker, args=(system, wl.n, n, w, db, flush_ms, counter, limits_set, barrier, results)
            )
            for w in range(workers)
        ]
        for pr in procs:
            pr.start()
        outs = [results.get(timeout=900) for _ in procs]
        for pr in procs:
            pr.join(timeout=60)
        errs = [o["error"] for o in outs if "error" in o]
        if errs:
            raise RuntimeError("; ".join(errs))
        outs.sort(key=lambda o: o["w"])
        start = min(o["wall_start"] for o in outs)
        end = max(o["wall_end"] for o in outs)
        total = sum(o["ops"] for o in outs)
        refused = sum(o["refused"] for o in outs)
        check = overshoot(db, wl)
        return {
            "ops": total,
            "elapsed_s": end - start,
            "ops_s": total / (end - start),
            "per_worker_ops_s": [o["ops_s"] for o in outs],
            "p50_us": max(o["p50_us"] for o in outs),
            "p99_us": max(o["p99_us"] for o in outs),
            "refused": refused,
            "refused_frac": refused / total,
            "peak_rss_mb": max(o["peak_rss_mb"] for o in outs),
            "admitted_match_rows": check["request_rows"] == total - refused,
            **check,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- child entry

SYSTEMS = {
    "qe": "quotaengine (file, flush=0)",
    "qe-flush10": "quotaengine (file, flush_interval_ms=10)",
    "qe-memory": "quotaengine (:memory:)",
    "limits-swc": "limits sliding-window-counter (memory)",
    "limits-swc-rt": "limits sliding-window-counter (memory), real clock",
    "limits-mw": "limits moving-window (memory)",
    "pyrate-mem": "pyrate-limiter InMemoryBucket",
    "pyrate-mem-rt": "pyrate-limiter InMemoryBucket, real clock",
    "pyrate-sqlite": "pyrate-limiter SQLiteBucket (file)",
    "baseline": "hand-written sqlite3 baseline (file)",
    "qe-threads4": "quotaengine, 4 threads, one engine (flush=0)",
    "qe-flush10-threads4": "quotaengine, 4 threads, one engine (flush=10)",
}


def child_main(args) -> None:
    wl = Workload(args.ops)
    n = args.run_ops or args.ops
    rss_before = rss_now_mb()
    db_dir = tempfile.mkdtemp(prefix=f"qebench-{args.system}-")
    try:
        s = args.system
        if s == "qe":
            res = run_qe(wl, n, db_dir, 0)
        elif s == "qe-flush10":
            res = run_qe(wl, n, db_dir, 10)
        elif s == "qe-memory":
            res = run_qe(wl, n, db_dir, 0, memory=True)
        elif s == "limits-swc":
            res = run_limits(wl, n, "swc")
        elif s == "limits-swc-rt":
            res = run_limits(wl, n, "swc", real_clock=True)
        elif s == "pyrate-mem-rt":
            res = run_pyrate(wl, n, "memory", db_dir, real_clock=True)
        elif s == "limits-mw":
            res = run_limits(wl, n, "mw")
        elif s == "pyrate-mem":
            res = run_pyrate(wl, n, "memory", db_dir)
        elif s == "pyrate-sqlite":
            res = run_pyrate(wl, n, "sqlite", db_dir)
        elif s == "baseline":
            res = run_baseline(wl, n, db_dir)
        elif s == "qe-threads4":
            res = run_qe_threads(wl, n, db_dir, 0)
        elif s == "qe-flush10-threads4":
            res = run_qe_threads(wl, n, db_dir, 10)
        elif s == "floor":
            res = run_floor()
        else:
            raise SystemExit(f"unknown system {s}")
    finally:
        shutil.rmtree(db_dir, ignore_errors=True)
    res["peak_rss_mb"] = peak_rss_mb()
    res["rss_before_mb"] = rss_before
    print(json.dumps(res), flush=True)


def run_child(system: str, ops: int, run_ops: int, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--system", system, "--ops", str(ops), "--run-ops", str(run_ops)]
    t = time.perf_counter()
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f}s"}
    if cp.returncode != 0:
        return {"error": (cp.stderr.strip().splitlines() or ["?"])[-1]}
    res = json.loads(cp.stdout.strip().splitlines()[-1])
    res["child_s"] = time.perf_counter() - t
    return res


def combine(runs: list[dict]) -> dict:
    """Median over runs of the same system: every number (and every list of numbers,
    element by element) is the median across runs, except overshoot counts, which are
    the worst run's; ``runs_ops_s`` keeps each run's ops/s. An error in any run wins."""
    errs = [r for r in runs if "error" in r]
    if errs:
        return errs[0]
    if len(runs) == 1:
        return runs[0] | {"runs_ops_s": [runs[0].get("ops_s", float("nan"))]}
    out = {}
    for k, v in runs[0].items():
        vals = [r.get(k) for r in runs]
        if k.startswith("over_"):
            out[k] = max(vals)
        elif isinstance(v, bool):
            out[k] = all(vals)
        elif isinstance(v, int) and all(isinstance(x, int) for x in vals):
            out[k] = statistics.median_low(vals)  # counts stay integers
        elif isinstance(v, (int, float)) and all(isinstance(x, (int, float)) for x in vals):
            out[k] = statistics.median(vals)
        elif isinstance(v, list) and all(isinstance(x, list) and len(x) == len(v) for x in vals):
            out[k] = [statistics.median(col) for col in zip(*vals, strict=True)]
        else:
            out[k] = v
    out["runs_ops_s"] = [r.get("ops_s", float("nan")) for r in runs]
    return out


# ----------------------------------------------------------------------------- report


def fmt(x, spec=",.0f", missing="–"):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return missing
    return format(x, spec)


def build_report(args, wl, R, refs, floor, env) -> str:
    L = []
    L.append("# quotaengine hot-path benchmark\n")
    L.append(
        f"`python benches/bench_compare.py --ops {args.ops}{' --quick' if args.quick else ''} --runs {args.runs}` -- "
        f"{env['when']}, {env['machine']}, Python {env['python']}, quotaengine {env['qe_version']} "
        f"(SQLite {env['sqlite']}), {env['cpus']} CPUs, load average {env['load']:.1f} at start / "
        f"{os.getloadavg()[0]:.1f} at end (other work on the machine skews the figures).\n"
    )
    L.append(
        f"Stream: {wl.n:,} ops (lease + success), 1000 routes (10 platforms x 20 models x 5 keys), "
        f"Zipf(s={ZIPF_S}) models, estimated tokens lognormal ~600, actual 0.55-1.15x; simulated time "
        f"{STEP_MS} ms/op from 06:00 UTC. Reference (exact semantics, plain Python) refuses "
        f"{refs[wl.n]['refused'] / wl.n:.1%} of the stream ({refs[wl.n]['by_reason']}).\n"
    )
    if args.runs > 1:
        L.append(
            f"Every figure is the median of {args.runs} runs (each run a fresh child process); p50 and p99 are "
            "the medians of the runs' percentiles, 'last/first tenth' shows the medians of the first-tenth and "
            "last-tenth rates and the median of the runs' ratios (not the ratio of the two medians), and the "
            "per-run ops/s are listed under 'Runs'.\n"
        )
    L.append("## Single thread, same stream\n")
    L.append("| system | ops run | ops/s | p50 µs | p99 µs | refused | exact? | last/first tenth | peak RSS MB (Δ) |")
    L.append("|---|---:|---:|---:|---:|---:|:---:|---:|---:|")
    for key in (
        "qe",
        "qe-flush10",
        "qe-memory",
        "limits-swc",
        "limits-swc-rt",
        "limits-mw",
        "pyrate-mem",
        "pyrate-mem-rt",
        "pyrate-sqlite",
        "baseline",
    ):
        r = R.get(key)
        if r is None:
            continue
        if "error" in r:
            L.append(f"| {SYSTEMS[key]} | – | error: {r['error']} | | | | | | |")
            continue
        ref = refs.get(r["ops"])
        exact = "–"
        if ref is not None and key in ("qe", "qe-flush10", "qe-memory", "baseline"):
            exact = "yes" if r["refused"] == ref["refused"] else f"NO ({ref['refused']})"
        flat = (
            f"{fmt(r['first_tenth_ops_s'])} → {fmt(r['last_tenth_ops_s'])} ({r['flatness']:.2f}x)"
            if "flatness" in r and key in ("qe", "qe-flush10", "qe-memory", "baseline")
            else (f"{r['flatness']:.2f}x" if "flatness" in r else "–")
        )
        ops_note = f"{r['ops']:,}" + ("" if r["ops"] == wl.n else " *")
        L.append(
            f"| {SYSTEMS[key]} | {ops_note} | {fmt(r['ops_s'])} | {fmt(r['p50_us'], '.1f')} | "
            f"{fmt(r['p99_us'], '.1f')} | {r['refused_frac']:.1%} | {exact} | {flat} | "
            f"{fmt(r['peak_rss_mb'], '.0f')} ({fmt(r['peak_rss_mb'] - r['rss_before_mb'], '+.0f')}) |"
        )
    slow = [
        k for k in ("limits-mw", "pyrate-sqlite", "baseline") if k in R and "error" not in R[k] and R[k]["ops"] != wl.n
    ]
    if slow:
        L.append(
            "\n\\* run on a prefix of the same stream ("
            + ", ".join(f"{SYSTEMS[k]}: first {R[k]['ops']:,} ops" for k in slow)
            + f"), too slow for all {wl.n:,}; they slow down as the day's events pile up, so their "
            "full-stream figure would be lower and the ratios below are conservative."
        )
    L.append(
        "\nexact? = refusal count equals the plain-Python reference on the same ops. "
        "Δ = peak RSS minus RSS after the stream was generated (the child's own ru_maxrss)."
    )

    L.append("\n## Ratios (quotaengine ops/s ÷ other ops/s)\n")
    others = [
        k
        for k in (
            "limits-swc",
            "limits-swc-rt",
            "limits-mw",
            "pyrate-mem",
            "pyrate-mem-rt",
            "pyrate-sqlite",
            "baseline",
        )
        if k in R and "error" not in R[k]
    ]
    L.append("| | " + " | ".join(SYSTEMS[k] for k in others) + " |")
    L.append("|---|" + "---:|" * len(others))
    for q in ("qe", "qe-flush10"):
        if q in R and "error" not in R[q]:
            L.append(f"| {SYSTEMS[q]} | " + " | ".join(f"{R[q]['ops_s'] / R[k]['ops_s']:.1f}x" for k in others) + " |")

    L.append("\n## Concurrency\n")
    L.append(
        "| mode | ops | total ops/s | vs single thread | p50 µs | p99 µs | refused | overshoot (rpm / rpd windows over) |"
    )
    L.append("|---|---:|---:|---:|---:|---:|---:|---|")
    for key, single in (("qe-threads4", "qe"), ("qe-flush10-threads4", "qe-flush10")):
        r = R.get(key)
        if r is None:
            continue
        if "error" in r:
            L.append(f"| {SYSTEMS[key]} | error: {r['error']} | | | | | | |")
            continue
        vs = f"{r['ops_s'] / R[single]['ops_s']:.2f}x" if single in R and "error" not in R[single] else "–"
        L.append(
            f"| {SYSTEMS[key]} | {r['ops']:,} | {fmt(r['ops_s'])} | {vs} | {fmt(r['p50_us'], '.1f')} | "
            f"{fmt(r['p99_us'], '.1f')} | {r['refused_frac']:.1%} | – |"
        )
    for key, label in (
        ("procs-qe", "quotaengine, 2 processes, one file (flush=0)"),
        ("procs-baseline", "hand-written baseline, 2 processes, one file"),
    ):
        r = R.get(key)
        if r is None:
            continue
        if "error" in r:
            L.append(f"| {label} | error: {r['error']} | | | | | | |")
            continue
        ok = "zero" if r["over_rpm"] == 0 and r["over_rpd"] == 0 else f"**{r['over_rpm']} / {r['over_rpd']}**"
        rows_ok = "" if r["admitted_match_rows"] else " (request rows ≠ admitted!)"
        L.append(
            f"| {label} | {r['ops']:,} | {fmt(r['ops_s'])} (per process: {', '.join(fmt(x) for x in r['per_worker_ops_s'])}) | – | "
            f"{fmt(r['p50_us'], '.1f')} | {fmt(r['p99_us'], '.1f')} | {r['refused_frac']:.1%} | {ok}{rows_ok} |"
        )
    if (
        "procs-qe" in R
        and "procs-baseline" in R
        and "error" not in R["procs-qe"]
        and "error" not in R["procs-baseline"]
    ):
        L.append(
            f"\n2 processes: quotaengine / baseline = {R['procs-qe']['ops_s'] / R['procs-baseline']['ops_s']:.1f}x."
        )
    L.append(
        "\nThreads take every 4th op and advance the shared ManualClock by 100 ms per op. "
        "Processes pull ops from one shared counter (a lock-protected `multiprocessing.Value`, "
        "taken outside the per-op latency but inside the total); op i runs at its scheduled time "
        "T0 + i x 100 ms on the process's own ManualClock. Overshoot is checked afterwards from "
        "`rate_limit_usage` in the shared file: requests per route in every sliding 60 s window ≤ rpm "
        "and per UTC day ≤ rpd, and the request rows equal the admitted count."
    )
    if args.runs > 1:
        L.append(f"\n## Runs\n\nops/s of each run (the tables above show the median of the {args.runs}):\n")
        L.append("| system | " + " | ".join(f"run {i + 1}" for i in range(args.runs)) + " | spread (max/min) |")
        L.append("|---|" + "---:|" * (args.runs + 1))
        for key, r in R.items():
            if "error" in r or "runs_ops_s" not in r:
                continue
            xs = r["runs_ops_s"]
            label = SYSTEMS.get(key) or {
                "procs-qe": "quotaengine, 2 processes",
                "procs-baseline": "baseline, 2 processes",
            }.get(key, key)
            L.append(f"| {label} | " + " | ".join(fmt(x) for x in xs) + f" | {max(xs) / min(xs):.2f}x |")
    if floor and "error" not in floor:
        L.append(
            f"\n## Floor\n\nA no-op PyO3 call: `quotaengine.sqlite_version()` {floor['sqlite_version_ns']:.0f} ns, "
            f"`ManualClock.now_ms()` {floor['clock_now_ms_ns']:.0f} ns (empty Python loop iteration "
            f"{floor['loop_ns']:.0f} ns, subtracted).\n\n"
            f"`check(platform, model, key, 100)` on a file engine: {floor['check_ns']:.0f} ns; a no-op method "
            f"of the engine taking the same arguments (`_noop_check`): {floor['noop_check_ns']:.0f} ns "
            f"({floor['check_ns'] / floor['noop_check_ns']:.1f}x)."
        )

    # goals of issue 2
    G = []

    def goal(text, ok):
        G.append(f"| {text} | {'PASS' if ok else '**FAIL**'} |" if ok is not None else f"| {text} | n/a |")

    def ok(*keys):
        return all(k in R and "error" not in R[k] for k in keys)

    if ok("qe", "limits-swc"):
        goal(
            f"flush=0 ≥ 1x limits-swc, same stream ({R['qe']['ops_s'] / R['limits-swc']['ops_s']:.2f}x)",
            R["qe"]["ops_s"] >= R["limits-swc"]["ops_s"],
        )
    if ok("qe", "limits-swc-rt"):
        goal(
            f"flush=0 ≥ 1x limits-swc, real clock, mostly refusals ({R['qe']['ops_s'] / R['limits-swc-rt']['ops_s']:.2f}x)",
            R["qe"]["ops_s"] >= R["limits-swc-rt"]["ops_s"],
        )
    if ok("qe", "baseline"):
        goal(
            f"flush=0 ≥ 20x hand-written baseline ({R['qe']['ops_s'] / R['baseline']['ops_s']:.1f}x)",
            R["qe"]["ops_s"] >= 20 * R["baseline"]["ops_s"],
        )
    if ok("qe", "pyrate-sqlite"):
        goal(
            f"flush=0 ≥ 50x pyrate SQLite ({R['qe']['ops_s'] / R['pyrate-sqlite']['ops_s']:.0f}x)",
            R["qe"]["ops_s"] >= 50 * R["pyrate-sqlite"]["ops_s"],
        )
    if ok("qe-flush10", "limits-swc"):
        goal(
            f"flush=10 ≥ 2x limits-swc, same stream ({R['qe-flush10']['ops_s'] / R['limits-swc']['ops_s']:.2f}x)",
            R["qe-flush10"]["ops_s"] >= 2 * R["limits-swc"]["ops_s"],
        )
    if ok("qe-flush10", "limits-swc-rt"):
        goal(
            f"flush=10 ≥ 2x limits-swc, real clock ({R['qe-flush10']['ops_s'] / R['limits-swc-rt']['ops_s']:.2f}x)",
            R["qe-flush10"]["ops_s"] >= 2 * R["limits-swc-rt"]["ops_s"],
        )
    if ok("qe") and "flatness" in R["qe"]:
        goal(f"flat: last tenth ≥ 0.8x first (flush=0: {R['qe']['flatness']:.2f}x)", R["qe"]["flatness"] >= 0.8)
    if ok("qe"):
        goal(
            f"p50 ≤ 25 µs ({R['qe']['p50_us']:.1f}), p99 ≤ 250 µs ({R['qe']['p99_us']:.1f})",
            R["qe"]["p50_us"] <= 25 and R["qe"]["p99_us"] <= 250,
        )
        goal(
            f"peak RSS ≤ 100 MB beyond the stream ({R['qe']['peak_rss_mb'] - R['qe']['rss_before_mb']:.0f} MB)",
            R["qe"]["peak_rss_mb"] - R["qe"]["rss_before_mb"] <= 100,
        )
    if ok("procs-qe", "procs-baseline"):
        ratio = R["procs-qe"]["ops_s"] / R["procs-baseline"]["ops_s"]
        goal(f"2 processes ≥ 10x baseline in the same mode ({ratio:.1f}x)", ratio >= 10)
    if ok("procs-qe"):
        goal(
            "2 processes: zero overshoot",
            R["procs-qe"]["over_rpm"] == 0 and R["procs-qe"]["over_rpd"] == 0 and R["procs-qe"]["admitted_match_rows"],
        )
    if ok("qe-threads4", "qe"):
        ratio = R["qe-threads4"]["ops_s"] / R["qe"]["ops_s"]
        goal(f"4 threads ≥ 1.2x single thread ({ratio:.2f}x)", ratio >= 1.2)
    if ok("qe-flush10"):
        goal(
            f"flush=10 ≥ 100k ops/s, every event persisted within 10 ms ({R['qe-flush10']['ops_s']:,.0f})",
            R["qe-flush10"]["ops_s"] >= 100_000,
        )
    if floor is not None and "check_ns" in floor:
        ratio = floor["check_ns"] / floor["noop_check_ns"]
        goal(f"check() ≤ 3x a no-op method with the same arguments ({ratio:.1f}x)", ratio <= 3)
    if ok("qe-flush10-threads4", "qe-flush10"):
        ratio = R["qe-flush10-threads4"]["ops_s"] / R["qe-flush10"]["ops_s"]
        goal(f"4 threads ≥ 1.5x single thread, flush=10 ({ratio:.2f}x)", ratio >= 1.5)
    if ok("qe-flush10", "baseline"):
        goal(
            f"flush=10 ≥ 50x hand-written baseline ({R['qe-flush10']['ops_s'] / R['baseline']['ops_s']:.1f}x)",
            R["qe-flush10"]["ops_s"] >= 50 * R["baseline"]["ops_s"],
        )
    if G:
        L.append('\n## Goals (issues 2 and 7, "Speed")\n')
        L.append("| goal | |")
        L.append("|---|---|")
        L.extend(G)
    return "\n".join(L) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=200_000, help="ops in the stream (default 200000)")
    ap.add_argument("--quick", action="store_true", help="smoke test: 20k ops")
    ap.add_argument(
        "--slow-ops", type=int, default=None, help="ops for the hand-written baseline (default 50000, quick 5000)"
    )
    ap.add_argument(
        "--pyrate-sqlite-ops", type=int, default=None, help="ops for pyrate SQLite (default 10000, quick 2000)"
    )
    ap.add_argument("--mw-ops", type=int, default=None, help="ops for limits moving-window (default 50000)")
    ap.add_argument("--out", default=os.path.join(HERE, "results.md"))
    ap.add_argument("--only", default=None, help="comma-separated subset of systems (debugging)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each system; the report shows the median (default 3)")
    # child / worker mode
    ap.add_argument("--system", help=argparse.SUPPRESS)
    ap.add_argument("--run-ops", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.system:
        return child_main(args)

    if args.quick:
        args.ops = 20_000
    slow = args.slow_ops or (5_000 if args.quick else 50_000)
    pyr_sql = args.pyrate_sqlite_ops or (2_000 if args.quick else 10_000)
    mw = args.mw_ops or 50_000
    slow, pyr_sql, mw = min(slow, args.ops), min(pyr_sql, args.ops), min(mw, args.ops)
    only = set(args.only.split(",")) if args.only else None

    import quotaengine

    env = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{_platform.system()} {_platform.machine()}",
        "python": _platform.python_version(),
        "qe_version": quotaengine.__version__,
        "sqlite": quotaengine.sqlite_version(),
        "cpus": os.cpu_count(),
        "load": os.getloadavg()[0],
    }
    t_all = time.perf_counter()
    wl = Workload(args.ops)
    refs = {n: reference_refusals(wl, n) for n in sorted({args.ops, slow, pyr_sql, mw})}
    print(
        f"stream: {wl.n:,} ops; reference refuses {refs[wl.n]['refused'] / wl.n:.1%} {refs[wl.n]['by_reason']}",
        flush=True,
    )

    plan = [
        ("floor", args.ops, 0),
        ("qe", args.ops, args.ops),
        ("qe-flush10", args.ops, args.ops),
        ("qe-memory", args.ops, args.ops),
        ("limits-swc", args.ops, args.ops),
        ("limits-swc-rt", args.ops, args.ops),
        ("limits-mw", args.ops, mw),
        ("pyrate-mem", args.ops, args.ops),
        ("pyrate-mem-rt", args.ops, args.ops),
        ("pyrate-sqlite", args.ops, pyr_sql),
        ("baseline", args.ops, slow),
        ("qe-threads4", args.ops, args.ops),
        ("qe-flush10-threads4", args.ops, args.ops),
    ]
    R = {}
    floor = None
    runs_note = f", median of {args.runs} runs" if args.runs > 1 else ""
    for name, ops, run_ops in plan:
        if only and name not in only:
            continue
        print(f"running {name} ({run_ops or ops:,} ops{runs_note}) ...", end=" ", flush=True)
        r = combine([run_child(name, ops, run_ops, timeout=900) for _ in range(args.runs)])
        if name == "floor":
            floor = r
            print(r if "error" in r else f"{r['sqlite_version_ns']:.0f} ns/call", flush=True)
            continue
        R[name] = r
        print(
            r["error"]
            if "error" in r
            else f"{r['ops_s']:,.0f} ops/s ({' / '.join(f'{x:,.0f}' for x in r['runs_ops_s'])}), "
            f"refused {r['refused_frac']:.1%} ({r['child_s']:.1f}s)",
            flush=True,
        )
    for name, system, n in (("procs-qe", "qe-proc", args.ops), ("procs-baseline", "baseline-proc", slow)):
        if only and name not in only:
            continue
        print(f"running {name} ({n:,} ops, 2 processes{runs_note}) ...", end=" ", flush=True)
        try:
            R[name] = combine([run_procs(system, wl, n, 2) for _ in range(args.runs)])
            r = R[name]
            print(f"{r['ops_s']:,.0f} ops/s, overshoot rpm/rpd {r['over_rpm']}/{r['over_rpd']}", flush=True)
        except Exception as e:  # report and go on
            R[name] = {"error": str(e)}
            print(f"error: {e}", flush=True)

    report = build_report(args, wl, R, refs, floor, env)
    report += f"\n_Total benchmark time {time.perf_counter() - t_all:.0f} s._\n"
    print()
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
        print(f"written to {args.out}")


if __name__ == "__main__":
    main()
