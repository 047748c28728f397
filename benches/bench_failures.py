"""`record_failure` throughput (SPEC §6.2) on a file database, by kind.

    python benches/bench_failures.py [--n 20000]

Each call infers the kind from a real provider body, decides the bench (ladder,
unknown-limit hits, Retry-After, learning) and commits.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import quotaengine as qe

BODIES = {
    "rate_limit (Groq TPM 429, learns)": (
        429,
        "Rate limit reached for model `llama-3.1-8b-instant` in organization `org_x` service tier `on_demand` "
        "on tokens per minute (TPM): Limit 6000, Used 5990, Requested 800. Please try again in 7.66s.",
    ),
    "payment (OpenAI insufficient_quota)": (
        429,
        '{"error": {"message": "You exceeded your current quota", "type": "insufficient_quota", '
        '"code": "insufficient_quota"}}',
    ),
    "daily_quota (Cloudflare neurons)": (429, "you have used up your daily free allocation of 10,000 neurons"),
    "server_error (503)": (503, "upstream connect error"),
    "other (400)": (400, "bad request"),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000)
    args = ap.parse_args()
    print("| kind | calls/s | µs/call |")
    print("|---|---:|---:|")
    for name, (status, body) in BODIES.items():
        with tempfile.TemporaryDirectory() as d:
            clock = qe.ManualClock(1_767_261_600_000)
            with qe.QuotaEngine(os.path.join(d, "f.db"), clock=clock, env={}) as e:
                t = time.perf_counter()
                for i in range(args.n):
                    clock.advance(50)
                    e.record_failure("groq", f"m{i % 50}", i % 20, status=status, message=body)
                dt = time.perf_counter() - t
        print(f"| {name} | {args.n / dt:,.0f} | {dt / args.n * 1e6:.1f} |")


if __name__ == "__main__":
    main()
