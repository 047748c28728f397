#!/usr/bin/env python3
"""Wasted dispatches: a simulated day of free-tier providers, before and after.

    python benches/bench_waste.py --pkg before=DIR_A --pkg after=DIR_B [--seeds 3] [--hours 24]

Each ``DIR`` holds an installed build of the package (``pip install --target DIR
wheel.whl``): the build before SPEC 15 and this one. For each seed, one child process
per build runs the same day (the same arrivals, the same provider randomness),
builds interleaved; the figures are summed over the seeds.

What a day is: requests arrive (Poisson, 0.4 a second) at a router that tries its
routes in preference order through ``engine.lease()``: two Gemini keys, two Groq keys,
one OpenAI key, then a local Ollama. A refused lease tries the next route; when all
are refused the request waits until the earliest ``retry_at_ms`` (at least 1 s). A
dispatch that comes back refused is reported with ``lease.failure(status,
retry_after, message)`` and the request tries again. The providers enforce their
real limits in simulated time and answer as the real ones do:

* Gemini (``google``, days from midnight Pacific): 15 RPM and 200 requests a day per
  key; a spent day answers ``RESOURCE_EXHAUSTED`` for
  ``GenerateRequestsPerDayPerProjectPerModel-FreeTier`` with ``quotaValue`` and a
  ``retryDelay`` of a few seconds, a spent minute the ``PerMinute`` id with the real
  delay. The engine is told the RPM only.
* Groq: 30 RPM, 1,000 a day, 6,000 tokens a minute (not told: learned from the body);
  a TPM 429 says "Please try again in 7.66s" (the real delay) with the "Upgrade to Dev
  Tier today" upsell, and a ``retry-after`` header.
* OpenAI: 4,000 tokens a minute (not told); a 429 states the delay in ms or s.
* Ollama on localhost: two requests at a time (not told); a third gets 503 "server
  busy, please try again. maximum pending requests exceeded".

The clock is a ``ManualClock`` stepped from event to event; the store is ``:memory:``
(this measures what reaches the providers, not speed). Reported per build: dispatches,
refused answers (429 and 503) per provider and per 1,000 dispatches, requests served,
and goodput (served per 1,000 dispatches).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r'''
import heapq, json, math, random, sys
from collections import Counter, deque
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo
sys.path.insert(0, sys.argv[1])
import quotaengine as q

seed, hours = int(sys.argv[2]), float(sys.argv[3])
START = 1_767_225_600_000  # 2026-01-01 00:00 UTC (16:00 Pacific the day before)
PACIFIC = ZoneInfo("America/Los_Angeles")
clock = q.ManualClock(START)
e = q.QuotaEngine(":memory:", clock=clock, env={})
rng = random.Random(seed)
arrivals = random.Random(seed * 7919 + 1)


def pacific_day(ms):
    return datetime.fromtimestamp(ms / 1000, PACIFIC).date()


def gemini_body(quota_id, value, delay_s):
    return (
        '{"error": {"code": 429, "message": "You exceeded your current quota, please check your '
        'plan and billing details. For more information on this error, head to: '
        'https://ai.google.dev/gemini-api/docs/rate-limits.", "status": "RESOURCE_EXHAUSTED", '
        '"details": [{"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": '
        '[{"quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests", '
        f'"quotaId": "{quota_id}", "quotaDimensions": {{"location": "global", '
        f'"model": "gemini-2.0-flash"}}, "quotaValue": "{value}"}}]}}, '
        '{"@type": "type.googleapis.com/google.rpc.Help", "links": [{"description": '
        '"Learn more about Gemini API quotas", "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}]}, '
        f'{{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "{delay_s}s"}}]}}}}'
    )


class Minute:
    """A provider's own sliding minute: (time, tokens) of what it served."""

    def __init__(self):
        self.q = deque()

    def trim(self, now):
        while self.q and self.q[0][0] <= now - 60_000:
            self.q.popleft()

    def requests(self, now):
        self.trim(now)
        return len(self.q)

    def tokens(self, now):
        self.trim(now)
        return sum(t for _, t in self.q)


class Provider:
    def __init__(self, platform, model, keys, latency):
        self.platform, self.model, self.keys, self.latency = platform, model, keys, latency
        self.minute = {k: Minute() for k in keys}
        self.refused = 0
        self.dispatched = 0

    def answer(self, key, tokens, now):
        """(status, headers, body) of a refusal, or None to serve."""
        return None


class Gemini(Provider):
    RPM, RPD = 15, 200

    def __init__(self, keys):
        super().__init__("google", "gemini-2.0-flash", keys, (600, 1_800))
        self.day = {k: (None, 0) for k in keys}

    def answer(self, key, tokens, now):
        today = pacific_day(now)
        d, n = self.day[key]
        if d != today:
            d, n = today, 0
        if n >= self.RPD:
            return 429, {}, gemini_body("GenerateRequestsPerDayPerProjectPerModel-FreeTier", self.RPD, rng.randint(5, 40))
        m = self.minute[key]
        if m.requests(now) >= self.RPM:
            wait = math.ceil((m.q[0][0] + 60_000 - now) / 1000)
            return 429, {}, gemini_body("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", self.RPM, wait)
        self.day[key] = (d, n + 1)
        return None


class Groq(Provider):
    RPM, RPD, TPM = 30, 1_000, 6_000

    def __init__(self, keys):
        super().__init__("groq", "llama-3.3-70b-versatile", keys, (300, 900))
        self.day = Counter()

    def answer(self, key, tokens, now):
        m = self.minute[key]
        if self.day[(key, now // 86_400_000)] >= self.RPD:
            return 429, {"retry-after": "3600"}, (
                "Rate limit reached for model `llama-3.3-70b-versatile` in organization `org_01jq3xk5ev` "
                "service tier `on_demand` on requests per day (RPD): Limit 1000, Used 1000, Requested 1. "
                "Please try again in 1h0m0s. Need more tokens? Upgrade to Dev Tier today at "
                "https://console.groq.com/settings/billing"
            )
        used = m.tokens(now)
        if used + tokens > self.TPM:
            wait = delay_until_fits(m, now, tokens, self.TPM)
            return 429, {"retry-after": str(math.ceil(wait / 1000))}, (
                "Rate limit reached for model `llama-3.3-70b-versatile` in organization `org_01jq3xk5ev` "
                f"service tier `on_demand` on tokens per minute (TPM): Limit {self.TPM}, Used {used}, "
                f"Requested {tokens}. Please try again in {wait / 1000:.2f}s. Need more tokens? Upgrade "
                "to Dev Tier today at https://console.groq.com/settings/billing"
            )
        if m.requests(now) >= self.RPM:
            wait = m.q[0][0] + 60_000 - now
            return 429, {"retry-after": str(math.ceil(wait / 1000))}, (
                "Rate limit reached for model `llama-3.3-70b-versatile` in organization `org_01jq3xk5ev` "
                f"service tier `on_demand` on requests per minute (RPM): Limit {self.RPM}, Used {self.RPM}, "
                f"Requested 1. Please try again in {wait / 1000:.2f}s."
            )
        self.day[(key, now // 86_400_000)] += 1
        return None


class OpenAI(Provider):
    TPM = 4_000

    def __init__(self, keys):
        super().__init__("openai", "gpt-4o-mini", keys, (500, 1_500))

    def answer(self, key, tokens, now):
        m = self.minute[key]
        used = m.tokens(now)
        if used + tokens > self.TPM:
            wait = delay_until_fits(m, now, tokens, self.TPM)
            stated = f"{wait}ms" if wait < 1_000 else f"{wait / 1000:.3f}s"
            return 429, {}, (
                '{"error": {"message": "Rate limit reached for gpt-4o-mini in organization '
                f"org-3Kq9ZPcRz1hW8yL0 on tokens per min (TPM): Limit {self.TPM}, Used {used}, "
                f"Requested {tokens}. Please try again in {stated}. Visit "
                'https://platform.openai.com/account/rate-limits to learn more.", "type": "tokens", '
                '"param": null, "code": "rate_limit_exceeded"}}'
            )
        return None


class Ollama(Provider):
    SLOTS = 2

    def __init__(self, keys):
        super().__init__("ollama", "llama3.2:3b", keys, (2_000, 6_000))
        self.active = 0

    def answer(self, key, tokens, now):
        if self.active >= self.SLOTS:
            return 503, {}, '{"error":"server busy, please try again.  maximum pending requests exceeded"}'
        return None


def delay_until_fits(m, now, need, limit):
    """ms until `need` more tokens fit in the minute `m` under `limit`."""
    total = m.tokens(now)
    for t, n in m.q:
        total -= n
        if total + need <= limit:
            return max(1, t + 60_000 - now)
    return 60_000


gemini, groq, openai, ollama = Gemini([1, 2]), Groq([3, 4]), OpenAI([5]), Ollama([6])
providers = [gemini, groq, openai, ollama]
routes = [(p, k) for p in providers for k in p.keys]
e.register_key(6, "ollama", base_url="http://localhost:11434")
e.set_model_limits("google", "gemini-2.0-flash", rpm=Gemini.RPM)
e.set_model_limits("groq", "llama-3.3-70b-versatile", rpm=Groq.RPM, rpd=Groq.RPD)

events = []
seq = 0


def at(t, fn, *args):
    global seq
    seq += 1
    heapq.heappush(events, (t, seq, fn, args))


served = 0
dispatches = 0
arrived = 0


def attempt(now, est, born):
    """A request tries the routes in order; refused everywhere, it waits."""
    global dispatches
    soonest = None  # the earliest retry_at_ms; `now` when a refusal names none (poll)
    for p, k in routes:
        try:
            lease = e.lease(p.platform, p.model, k, est)
        except q.QuotaExceeded as exc:
            retry_at = now if exc.retry_at_ms is None else exc.retry_at_ms
            soonest = retry_at if soonest is None else min(soonest, retry_at)
            continue
        dispatches += 1
        p.dispatched += 1
        tokens = max(1, int(est * rng.uniform(0.6, 1.1)))
        refusal = p.answer(k, tokens, now)
        if refusal is not None:
            p.refused += 1
            at(now + rng.randint(80, 250), refused, lease, refusal, est, born)
        else:
            p.minute[k].q.append((now, tokens))
            if p is ollama:
                ollama.active += 1
            at(now + rng.randint(*p.latency), done, p, lease, tokens)
        return
    wait = max(1_000, (soonest or 0) - now)
    at(now + min(wait, 60_000), attempt, est, born)


def refused(now, lease, refusal, est, born):
    status, headers, body = refusal
    lease.failure(status=status, retry_after=headers.get("retry-after"), message=body)
    attempt(now, est, born)


def done(now, p, lease, tokens):
    global served
    if p is ollama:
        ollama.active -= 1
    lease.success(tokens=tokens)
    served += 1


def arrive(now):
    global arrived
    arrived += 1
    at(now, attempt, int(arrivals.lognormvariate(6.3, 0.5)), now)
    at(now + int(arrivals.expovariate(0.4) * 1000) + 1, arrive)


end = START + int(hours * 3_600_000)
at(START, arrive)
while events:
    t, _, fn, args = heapq.heappop(events)
    if t > end:
        break
    clock.set(t)
    fn(t, *args)

caps = {}
if hasattr(e, "key_concurrency_cap"):
    caps = {"ollama/6": e.key_concurrency_cap("ollama", 6)}
learned = {
    f"{p.platform}/{p.model}": (lambda l: None if l is None else {"rpm": l.rpm, "rpd": l.rpd, "tpm": l.tpm, "tpd": l.tpd})(
        e.model_limits(p.platform, p.model)
    )
    for p in providers
}
e.close()
print(json.dumps({
    "dispatches": dispatches,
    "served": served,
    "arrived": arrived,
    "by_provider": {p.platform: [p.dispatched, p.refused] for p in providers},
    "learned": learned,
    "caps": caps,
}))
'''


def run(pkg: str, seed: int, hours: float) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, pkg, str(seed), str(hours)], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"child failed for {pkg}:\n{out.stderr}")
    result: dict = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pkg", action="append", required=True, metavar="NAME=DIR", help="an installed build")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--hours", type=float, default=24.0)
    args = ap.parse_args()
    builds = dict(p.split("=", 1) for p in args.pkg)
    totals: dict[str, dict] = {}
    for seed in range(1, args.seeds + 1):
        for name, pkg in builds.items():  # interleaved: one day per build per seed
            r = run(pkg, seed, args.hours)
            t = totals.setdefault(name, {"dispatches": 0, "served": 0, "arrived": 0, "by_provider": {}, "last": r})
            t["dispatches"] += r["dispatches"]
            t["served"] += r["served"]
            t["arrived"] += r["arrived"]
            for prov, (d, refused) in r["by_provider"].items():
                acc = t["by_provider"].setdefault(prov, [0, 0])
                acc[0] += d
                acc[1] += refused
            t["last"] = r
    print(f"{args.seeds} simulated day(s) of {args.hours:g} h, summed\n")
    header = f"{'build':<10}{'arrived':>9}{'dispatches':>11}{'refused':>9}{'/1000':>8}{'served':>9}{'goodput/1000':>14}"
    print(header)
    for name, t in totals.items():
        refused = sum(r for _, r in t["by_provider"].values())
        d = t["dispatches"]
        print(
            f"{name:<10}{t['arrived']:>9}{d:>11}{refused:>9}{1000 * refused / max(d, 1):>8.1f}{t['served']:>9}"
            f"{1000 * t['served'] / max(d, 1):>14.1f}"
        )
    print("\nrefused answers (429/503) per provider: dispatches, refused, per 1000 dispatches")
    provs = list(next(iter(totals.values()))["by_provider"])
    print(f"{'provider':<10}" + "".join(f"{name:>28}" for name in totals))
    for prov in provs:
        cells = []
        for t in totals.values():
            d, r = t["by_provider"][prov]
            cells.append(f"{d:>9} {r:>7} {1000 * r / max(d, 1):>9.1f}")
        print(f"{prov:<10}" + "".join(f"{c:>28}" for c in cells))
    print("\nlearned by the end of the last day:")
    for name, t in totals.items():
        print(f"  {name}: limits {t['last']['learned']} caps {t['last']['caps'] or 'n/a'}")


if __name__ == "__main__":
    main()
