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
* OpenRouter (SPEC 21): two accounts (keys 7 and 8) on three ``:free`` models. Each
  model's upstream is congested now and then (about one episode an hour per model,
  2 to 8 minutes long, the same schedule for every key): every call to it then gets
  OpenRouter's 429 "... is temporarily rate-limited upstream ..." with
  ``metadata.provider_name``. The accounts' free pool takes 20 requests a minute
  (not told) and 1,000 a day for key 7 but 50 for key 8 (no credits; the engine's
  default is 1,000): past them a 429 "Rate limit exceeded: free-models-per-min" /
  "free-models-per-day" with ``X-RateLimit-Limit``, ``-Remaining`` and ``-Reset`` in
  ``error.metadata.headers``, as OpenRouter sends them.

A request not served within 120 s of its arrival is lost; it is lost to benches when
every route refused it for a cooldown the last time it tried them all. The oracle runs
the same day knowing every provider's true state: it dispatches only what will be
served (in the same route order), so it never sees a refusal.

The clock is a ``ManualClock`` stepped from event to event; the store is ``:memory:``
(this measures what reaches the providers, not speed). Reported per build: dispatches,
refused answers (429 and 503) per provider and per cause, requests served and lost,
served against the oracle, and the Ollama concurrency cap over the day (SPEC 15.4:
learned, forgotten an hour later, learned again; SPEC 24.2: learned once, raised by one
after its wait, the wait doubled when a raise fails).
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

seed, hours, mode = int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
ORACLE = mode == "oracle"
DEADLINE_MS = 120_000
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


class OpenRouter(Provider):
    """Three :free models behind one account-wide pool per key (SPEC 21)."""

    MODELS = ["google/gemini-2.0-flash-exp:free", "meta-llama/llama-3.3-70b-instruct:free", "deepseek/deepseek-r1:free"]
    UPSTREAMS = {"google/gemini-2.0-flash-exp:free": "Google AI Studio",
                 "meta-llama/llama-3.3-70b-instruct:free": "Chutes", "deepseek/deepseek-r1:free": "Targon"}
    RPM = 20
    RPD = {7: 1_000, 8: 50}

    def __init__(self, keys, hours):
        super().__init__("openrouter", None, keys, (700, 2_500))
        self.day = Counter()
        self.minute = {k: Minute() for k in keys}
        # The congestion schedule: its own randomness, so every build and the oracle see
        # the same episodes.
        sched = random.Random(seed * 104_729 + 17)
        self.congested = {}
        for m in self.MODELS:
            t, spans = START, []
            while t < START + hours * 3_600_000:
                t += int(sched.expovariate(1 / 3_600_000))
                spans.append((t, t + sched.randint(120_000, 480_000)))
            self.congested[m] = spans
        self.cause = Counter()

    def is_congested(self, model, now):
        return any(a <= now < b for a, b in self.congested[model])

    def answer_model(self, model, key, tokens, now):
        if self.is_congested(model, now):
            raw = (f"{model} is temporarily rate-limited upstream. Please retry shortly, or add your own key "
                   "to accumulate your rate limits: https://openrouter.ai/settings/integrations")
            body = json.dumps({"error": {"message": "Provider returned error", "code": 429, "metadata": {
                "raw": raw, "provider_name": self.UPSTREAMS[model]}}, "user_id": "user_2zqGkqYQm1"})
            return 429, {}, body, "upstream"
        day = now // 86_400_000
        if self.day[(key, day)] >= self.RPD[key]:
            reset = (day + 1) * 86_400_000
            return 429, {}, pool_body("free-models-per-day", self.RPD[key], reset,
                                      "Add 10 credits to unlock 1000 free model requests per day"), "pool-day"
        m = self.minute[key]
        if m.requests(now) >= self.RPM:
            return 429, {}, pool_body("free-models-per-min", self.RPM, m.q[0][0] + 60_000, ""), "pool-minute"
        self.day[(key, day)] += 1
        return None


def pool_body(pool, limit, reset_ms, upsell):
    return json.dumps({"error": {"message": f"Rate limit exceeded: {pool}. {upsell}", "code": 429, "metadata": {
        "headers": {"X-RateLimit-Limit": str(limit), "X-RateLimit-Remaining": "0",
                    "X-RateLimit-Reset": str(reset_ms)}}}, "user_id": "user_2zqGkqYQm1"})


def delay_until_fits(m, now, need, limit):
    """ms until `need` more tokens fit in the minute `m` under `limit`."""
    total = m.tokens(now)
    for t, n in m.q:
        total -= n
        if total + need <= limit:
            return max(1, t + 60_000 - now)
    return 60_000


gemini, groq, openai, ollama = Gemini([1, 2]), Groq([3, 4]), OpenAI([5]), Ollama([6])
openrouter = OpenRouter([7, 8], hours)
providers = [gemini, groq, openrouter, openai, ollama]
# (provider, model, key) in preference order: OpenRouter's models after Groq's.
routes = []
for p in providers:
    for model in (p.MODELS if p is openrouter else [p.model]):
        routes += [(p, model, k) for k in p.keys]
CAUSES = {"google": lambda b: "day" if "PerDay" in b else "minute", "groq": lambda b: "tpm" if "(TPM)" in b else "rpm/rpd",
          "openai": lambda b: "tpm", "ollama": lambda b: "busy"}
causes = Counter()
lost = Counter()
ollama_cap = Counter()  # ms spent at each learned cap (None: none in force)
cap_state = [START, None]


def note_cap(now, last=False):
    if ORACLE or not hasattr(e, "key_concurrency_cap"):
        return
    cap = e.key_concurrency_cap("ollama", 6)
    if last:  # the day's last stretch at its cap
        ollama_cap[str(cap_state[1])] += now - cap_state[0]
    elif cap != cap_state[1]:
        ollama_cap[str(cap_state[1])] += now - cap_state[0]
        cap_state[0], cap_state[1] = now, cap
        ollama_cap["changes"] += 1
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


def answer(p, model, k, tokens, now):
    """(status, headers, body, cause) of a refusal, or None to serve."""
    if p is openrouter:
        return p.answer_model(model, k, tokens, now)
    r = p.answer(k, tokens, now)
    return None if r is None else (*r, CAUSES[p.platform](r[2]))


def attempt(now, est, born, benched=False):
    """A request tries the routes in order; refused everywhere, it waits (until its
    deadline: then it is lost)."""
    global dispatches
    if now - born > DEADLINE_MS:
        lost["benched" if benched else "other"] += 1
        return
    soonest = None  # the earliest retry_at_ms; `now` when a refusal names none (poll)
    all_cooldown = True
    tokens = max(1, int(est * rng.uniform(0.6, 1.1)))
    for p, model, k in routes:
        if ORACLE:
            refusal = answer(p, model, k, tokens, now)
            if refusal is not None:
                continue
            lease = None
        else:
            if p is ollama:
                note_cap(now)
            try:
                lease = e.lease(p.platform, model, k, est)
            except q.QuotaExceeded as exc:
                all_cooldown &= exc.reason == "cooldown"
                retry_at = now if exc.retry_at_ms is None else exc.retry_at_ms
                soonest = retry_at if soonest is None else min(soonest, retry_at)
                continue
            refusal = answer(p, model, k, tokens, now)
        dispatches += 1
        p.dispatched += 1
        if refusal is not None:
            p.refused += 1
            cause = refusal[3]
            if p is ollama and not ORACLE:  # SPEC 15.4's cost: a 503 while no learned cap is in force
                cause += " (no cap in force)" if cap_state[1] is None else f" (cap {cap_state[1]} in force)"
            causes[f"{p.platform} {cause}"] += 1
            at(now + rng.randint(80, 250), refused, lease, refusal, est, born)
        else:
            p.minute[k].q.append((now, tokens))
            if p is ollama:
                ollama.active += 1
            at(now + rng.randint(*p.latency), done, p, lease, tokens)
        return
    wait = 1_000 if ORACLE else max(1_000, (soonest or 0) - now)
    at(now + min(wait, 60_000), attempt, est, born, all_cooldown and not ORACLE)


def refused(now, lease, refusal, est, born):
    status, headers, body, _ = refusal
    lease.failure(status=status, retry_after=headers.get("retry-after"), message=body)
    if lease.platform == "ollama":
        note_cap(now)
    attempt(now, est, born)


def done(now, p, lease, tokens):
    global served
    if p is ollama:
        ollama.active -= 1
    if lease is not None:
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

note_cap(end, last=True)
caps = {}
if hasattr(e, "key_concurrency_cap"):
    caps = {"ollama/6": e.key_concurrency_cap("ollama", 6)}
if hasattr(e, "learned_provider_caps"):
    for k in openrouter.keys:
        c = e.learned_provider_caps("openrouter", k)
        caps[f"openrouter/{k}"] = {"daily": c.daily_requests, "minute": c.minute_requests}
learned = {
    f"{p.platform}/{p.model}": (lambda l: None if l is None else {"rpm": l.rpm, "rpd": l.rpd, "tpm": l.tpm, "tpd": l.tpd})(
        e.model_limits(p.platform, p.model)
    )
    for p in providers if p is not openrouter
}
e.close()
print(json.dumps({
    "dispatches": dispatches,
    "served": served,
    "arrived": arrived,
    "lost": dict(lost),
    "causes": dict(causes),
    "ollama_cap": dict(ollama_cap),
    "by_provider": {p.platform: [p.dispatched, p.refused] for p in providers},
    "learned": learned,
    "caps": caps,
}))
'''


def run(pkg: str, seed: int, hours: float, mode: str = "engine") -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, pkg, str(seed), str(hours), mode], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"child failed for {pkg}:\n{out.stderr}")
    result: dict = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def add(acc: dict, r: dict) -> None:
    for k in ("dispatches", "served", "arrived"):
        acc[k] = acc.get(k, 0) + r[k]
    for table in ("lost", "causes", "ollama_cap"):
        t = acc.setdefault(table, {})
        for k, v in r[table].items():
            t[k] = t.get(k, 0) + v
    for prov, (d, refused) in r["by_provider"].items():
        a = acc.setdefault("by_provider", {}).setdefault(prov, [0, 0])
        a[0] += d
        a[1] += refused
    acc["last"] = r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pkg", action="append", required=True, metavar="NAME=DIR", help="an installed build")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--hours", type=float, default=24.0)
    args = ap.parse_args()
    builds = dict(p.split("=", 1) for p in args.pkg)
    totals: dict[str, dict] = {}
    oracle: dict = {}
    for seed in range(1, args.seeds + 1):
        add(oracle, run(next(iter(builds.values())), seed, args.hours, "oracle"))
        for name, pkg in builds.items():  # interleaved: one day per build per seed
            add(totals.setdefault(name, {}), run(pkg, seed, args.hours))
    days = args.seeds * args.hours / 24
    print(f"{args.seeds} simulated day(s) of {args.hours:g} h, summed\n")
    header = (
        f"{'build':<10}{'arrived':>9}{'dispatches':>11}{'refused':>9}{'/day':>8}{'/1000':>7}{'served':>9}"
        f"{'lost':>6}{'benched':>8}{'vs oracle':>10}"
    )
    print(header)
    for name, t in [("oracle", oracle), *totals.items()]:
        refused = sum(r for _, r in t["by_provider"].values())
        d = t["dispatches"]
        lost = sum(t["lost"].values())
        print(
            f"{name:<10}{t['arrived']:>9}{d:>11}{refused:>9}{refused / days:>8.0f}{1000 * refused / max(d, 1):>7.1f}"
            f"{t['served']:>9}{lost:>6}{t['lost'].get('benched', 0):>8}{100 * t['served'] / max(oracle['served'], 1):>9.2f}%"
        )
    print("\nrefused answers (429/503) per cause, per day")
    causes = sorted({c for t in totals.values() for c in t["causes"]})
    print(f"{'cause':<24}" + "".join(f"{name:>10}" for name in totals))
    for c in causes:
        print(f"{c:<24}" + "".join(f"{t['causes'].get(c, 0) / days:>10.1f}" for t in totals.values()))
    print("\ndispatches, refused per provider")
    provs = list(next(iter(totals.values()))["by_provider"])
    print(f"{'provider':<12}" + "".join(f"{name:>20}" for name in ["oracle", *totals]))
    for prov in provs:
        cells = [f"{t['by_provider'][prov][0]:>10} {t['by_provider'][prov][1]:>8}" for t in [oracle, *totals.values()]]
        print(f"{prov:<12}" + "".join(f"{c:>20}" for c in cells))
    print("\nthe Ollama key's learned concurrency cap (SPEC 15.4, 24.2): hours at each value, changes, per day")
    for name, t in totals.items():
        oc = t["ollama_cap"]
        spent = {k: round(v / 3_600_000 / days, 1) for k, v in sorted(oc.items()) if k != "changes"}
        print(f"  {name}: {spent} changes {oc.get('changes', 0) / days:.1f}")
    print("\nlearned by the end of the last day:")
    for name, t in totals.items():
        print(f"  {name}: limits {t['last']['learned']} caps {t['last']['caps'] or 'n/a'}")


if __name__ == "__main__":
    main()
