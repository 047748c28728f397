"""Soak test: mixed router load with the background probe on, for a long time; RSS and open file descriptors
must stay flat. NOT part of CI. See benches/SOAK.md.

    python benches/soak.py --minutes 30            # the documented run
    python benches/soak.py --minutes 3             # a quick look

One measured process runs ``--threads`` router threads (lease/success, lease/failure, check, cooldowns,
record_failure, quota headers, reads, the guardrail) and the background probe; ``--peers`` more processes run the
same load on the same file (not measured) so that cross-process syncing is part of the picture. Every process
reads a simulated clock that runs ``--speed`` times faster than the wall clock (all processes share its origin),
so that a 30-minute soak crosses several UTC midnights, retention sweeps and probe schedules; ``--speed 1``
uses the real clock. The load is paced to ``--rate`` operations per second per process.

Every ``--every`` seconds the measured process samples its RSS (VmRSS) and its open file descriptors
(``len(os.listdir('/proc/self/fd'))``), prints a table row, and at the end prints the least-squares slope of
both over the whole run and over its second half (after warm-up: the first simulated day fills the day windows).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import quotaengine as q

DAY = 86_400_000
ORIGIN = 1_767_225_600_000  # 2026-01-01 00:00 UTC: the simulated clock starts here
PLATFORMS = ["groq", "cerebras", "nvidia", "openrouter", "mistral"]
MODELS = [f"model-{i}" for i in range(8)]
KEYS = {p: [100 * i + k for k in range(1, 5)] for i, p in enumerate(PLATFORMS)}
MESSAGES = [
    None,
    "Rate limit reached for model on tokens per minute (TPM): Limit 6000, Used 5990, Requested 120. "
    "Please try again in 1.2s",
    "Too many requests, try again in 30 seconds",
    "daily quota exceeded",
    "connection reset by peer",
]


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value), per hour."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    sxx = sum((t - mx) ** 2 for t, _ in points)
    if sxx == 0:
        return float("nan")
    sxy = sum((t - mx) * (v - my) for t, v in points)
    return sxy / sxx * 3600


class SimClock:
    """A ManualClock driven from the wall clock: ORIGIN + (now - start) * speed, set every 2 ms by a thread."""

    def __init__(self, start_wall: float, speed: float) -> None:
        self.start_wall, self.speed = start_wall, speed
        self.clock = q.ManualClock(self.sim_now())
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="soak-clock", daemon=True)
        self.thread.start()

    def sim_now(self) -> int:
        return ORIGIN + int((time.time() - self.start_wall) * 1000 * self.speed)

    def run(self) -> None:
        while not self.stop.wait(0.002):
            self.clock.set(max(self.clock.now_ms(), self.sim_now()))


def setup(db: str) -> None:
    with q.QuotaEngine(db, env={}) as e:
        for p in PLATFORMS:
            for k in KEYS[p]:
                e.register_key(k, p, label=f"{p}-{k}")
            for i, m in enumerate(MODELS):
                e.set_model_limits(p, m, rpm=30 + 10 * i, rpd=2_000 + 500 * i, tpm=40_000, tpd=2_000_000)


def router_thread(
    e: q.QuotaEngine,
    rng: random.Random,
    stop: threading.Event,
    rate: float,
    counts: list[int],
    slot: int,
    errors: list[str],
) -> None:
    interval = 1.0 / rate if rate > 0 else 0.0
    next_at = time.monotonic()
    while not stop.is_set():
        if interval:
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -1:
                next_at = time.monotonic()  # fell behind: do not burst
        p = rng.choice(PLATFORMS)
        m = rng.choice(MODELS)
        k = rng.choice(KEYS[p])
        r = rng.random()
        try:
            if r < 0.60:
                est = rng.randint(50, 800)
                lease = e.lease(p, m, k, est)
                lease.success(tokens=rng.randint(0, est))
            elif r < 0.63:
                e.lease(p, m, k, 100).failure(
                    status=rng.choice((429, 503)),
                    retry_after=rng.choice((None, "2", "20")),
                    message=rng.choice(MESSAGES),
                )
            elif r < 0.73:
                e.check(p, m, k, rng.randint(0, 500))
            elif r < 0.75:
                e.set_cooldown(
                    p, m, k, duration_ms=rng.randint(1_000, 300_000), source=rng.choice(("heuristic", "authoritative"))
                )
            elif r < 0.77:
                e.record_failure(p, m, k, status=rng.choice((429, 500, 408, 401, None)), message=rng.choice(MESSAGES))
            elif r < 0.82:
                e.record_quota_headers(
                    p,
                    k,
                    {
                        "x-ratelimit-limit-requests": "1000",
                        "x-ratelimit-remaining-requests": str(rng.randint(0, 1000)),
                        "x-ratelimit-reset-requests": "45s",
                        "x-ratelimit-limit-tokens": "100000",
                        "x-ratelimit-remaining-tokens": str(rng.randint(0, 100000)),
                    },
                    model_id=m,
                    status=rng.choice((200, 200, 200, 429)),
                )
            elif r < 0.90:
                e.usage(p, m, k)
            elif r < 0.91:
                e.snapshot()
            elif r < 0.92:
                e.usage_events(since_ms=e.now_ms() - 1_000, platform=p, model_id=m)
            elif r < 0.97:
                e.model_window_used_fraction(p, m)
            elif r < 0.99:
                e.key_quota_headroom(p)
            else:
                e.active_cooldowns()
                e.server_logs(limit=20)
            counts[slot] += 1
        except q.QuotaExceeded:
            counts[slot] += 1
        except Exception as exc:  # noqa: BLE001 - reported at the end
            errors.append(f"{type(exc).__name__}: {exc}")


def run_load(
    db: str,
    seconds: float,
    threads: int,
    rate: float,
    speed: float,
    start_wall: float,
    seed: int,
    sample_every: float | None,
) -> int:
    sim = SimClock(start_wall, speed) if speed != 1 else None
    e = q.QuotaEngine(db, clock=sim.clock if sim else None, env={})
    rng = random.Random(seed)

    def validator(key_id: int) -> bool:
        return rng.random() < 0.7

    e.start_probe(validator, interval_s=1.0)
    stop = threading.Event()
    counts = [0] * threads
    errors: list[str] = []
    workers = [
        threading.Thread(
            target=router_thread,
            args=(e, random.Random(seed * 100 + i), stop, rate / threads, counts, i, errors),
            daemon=True,
        )
        for i in range(threads)
    ]
    for w in workers:
        w.start()
    rss_points: list[tuple[float, float]] = []
    fd_points: list[tuple[float, float]] = []
    t_start = time.monotonic()
    last_ops, last_t = 0, t_start
    if sample_every:
        print(
            f"{'t (s)':>7} {'sim time (UTC)':>17} {'ops':>9} {'ops/s':>7} {'RSS MB':>7} {'fds':>4} "
            f"{'db MB':>7} {'pending':>7} {'degraded':>8}",
            flush=True,
        )
    while True:
        elapsed = time.monotonic() - t_start
        if sample_every:
            now = time.monotonic()
            ops = sum(counts)
            rate_now = (ops - last_ops) / (now - last_t) if now - last_t > 0.5 else 0.0
            last_ops, last_t = ops, now
            rss, fds = rss_mb(), open_fds()
            rss_points.append((elapsed, rss))
            fd_points.append((elapsed, fds))
            sim_now = e.now_ms()
            db_mb = sum(os.path.getsize(db + s) for s in ("", "-wal") if os.path.exists(db + s)) / 2**20
            print(
                f"{elapsed:7.0f} {time.strftime('%m-%d %H:%M:%S', time.gmtime(sim_now / 1000)):>17} {ops:9d} "
                f"{rate_now:7.0f} {rss:7.1f} {fds:4d} {db_mb:7.1f} {e._pending_writes():7d} "
                f"{str(e.degraded):>8}",
                flush=True,
            )
        if elapsed >= seconds:
            break
        time.sleep(min(sample_every or 1.0, max(seconds - elapsed, 0.01)))
    stop.set()
    for w in workers:
        w.join(30)
    e.stop_probe()
    e.close()
    if sim:
        sim.stop.set()
    if errors:
        print(f"{len(errors)} unexpected exceptions, first: {errors[0]}", flush=True)
    if sample_every:
        half = [p for p in rss_points if p[0] >= seconds / 2]
        half_fd = [p for p in fd_points if p[0] >= seconds / 2]
        print()
        print(
            f"operations: {sum(counts)} in {seconds:.0f} s ({sum(counts) / seconds:.0f}/s), unexpected exceptions: "
            f"{len(errors)}"
        )
        print(
            f"RSS: first {rss_points[0][1]:.1f} MB, max {max(v for _, v in rss_points):.1f} MB, "
            f"last {rss_points[-1][1]:.1f} MB; slope {slope_per_hour(rss_points):+.2f} MB/h overall, "
            f"{slope_per_hour(half):+.2f} MB/h over the second half"
        )
        quarter = max(len(rss_points) // 4, 1)
        med = lambda vals: sorted(vals)[len(vals) // 2]  # noqa: E731
        print(
            f"RSS median over the 2nd quarter {med([v for _, v in rss_points[quarter : 2 * quarter]]):.1f} MB, "
            f"over the last quarter {med([v for _, v in rss_points[-quarter:]]):.1f} MB"
        )
        print(
            f"fds: first {fd_points[0][1]:.0f}, max {max(v for _, v in fd_points):.0f}, "
            f"last {fd_points[-1][1]:.0f}; slope {slope_per_hour(fd_points):+.2f}/h overall, "
            f"{slope_per_hour(half_fd):+.2f}/h over the second half"
        )
    return 1 if errors else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--db", help="database file (default: a new temporary file)")
    ap.add_argument("--threads", type=int, default=4, help="router threads in each process")
    ap.add_argument("--peers", type=int, default=1, help="extra load processes on the same file (not measured)")
    ap.add_argument("--rate", type=float, default=800.0, help="operations per second per process")
    ap.add_argument(
        "--speed",
        type=float,
        default=480.0,
        help="simulated clock speed-up (1 = real clock); 480: 30 min = 10 simulated days",
    )
    ap.add_argument("--every", type=float, default=10.0, help="sampling interval in seconds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--worker", nargs=2, metavar=("START_WALL", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    seconds = args.minutes * 60
    if args.worker:
        return run_load(
            args.db, seconds, args.threads, args.rate, args.speed, float(args.worker[0]), int(args.worker[1]), None
        )
    tmp = None
    if args.db is None:
        tmp = tempfile.TemporaryDirectory(prefix="qe-soak-")
        args.db = str(Path(tmp.name) / "soak.db")
    setup(args.db)
    print(
        f"quotaengine {q.__version__} (SQLite {q.sqlite_version()}), db {args.db}: {args.minutes:g} min, "
        f"{args.threads} threads + probe, {args.peers} peer process(es), {args.rate:g} ops/s per process, "
        f"clock x{args.speed:g}",
        flush=True,
    )
    start_wall = time.time()
    peers = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--db",
                args.db,
                "--minutes",
                str(args.minutes),
                "--threads",
                str(args.threads),
                "--rate",
                str(args.rate),
                "--speed",
                str(args.speed),
                "--worker",
                repr(start_wall),
                str(args.seed * 1000 + i + 1),
            ]
        )
        for i in range(args.peers)
    ]
    try:
        rc = run_load(args.db, seconds, args.threads, args.rate, args.speed, start_wall, args.seed, args.every)
        for p in peers:
            rc |= p.wait(seconds + 120)
    finally:
        for p in peers:
            if p.poll() is None:
                p.kill()
                p.wait()
        if tmp is not None:
            tmp.cleanup()
    return rc


if __name__ == "__main__":
    sys.exit(main())
