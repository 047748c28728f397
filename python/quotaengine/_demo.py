"""``python -m quotaengine demo``: a simulated router against simulated providers.

Router threads admit every call through ``engine.lease_any()`` over four candidate
routes (the engine picks the one with the most room, in one atomic step) and report
the outcome with ``success()`` / ``failure()``. The providers enforce their own limits and
answer over-limit calls as the real ones do: 429 bodies Groq style (a
``Retry-After`` and the true limit in the text), a daily allocation error
(Cloudflare style), Gemini's ``RESOURCE_EXHAUSTED`` for a spent daily quota with
a ``retryDelay`` of a few seconds (which the engine does not believe, SPEC 15.1),
a local Ollama that takes two requests at a time and answers a third with
503 "server busy ... maximum pending requests exceeded" (the engine learns the
cap, SPEC 15.4), and an OpenRouter-like aggregator (SPEC 21) whose accounts share a
pool of free-model requests a minute (its 429 "free-models-per-min" carries
X-RateLimit-Limit and -Reset in the body: the engine learns the account's cap) and
one of whose models is congested upstream for every key for a stretch ("...
temporarily rate-limited upstream": the engine benches the model, not the keys). Some published limits are looser than the provider's real ones,
or missing, so the engine has to learn them from the error bodies. The summary
prints the refused answers per provider and what was learned, and proves zero
overshoot of every published limit from the usage rows in the database.

Two kinds of callers share the keys (SPEC 22.1): a few interactive threads at priority
0 and batch threads at priority 1, which leave ``BATCH_RESERVE`` of every limit to the
interactive ones and wait their turn behind them. The summary shows the interactive
callers served while the batch ones waited.

Every call is made for a user and the user's team (SPEC 23.2, ``tenant=``), and the
demo's paid models have prices (SPEC 23.1; the free OpenRouter models and the local
Ollama cost nothing): ``team:*`` gives each team its own budget of ``TEAM_BUDGET``
dollars a day, and one user is held to ``ALICE_RPM`` requests a minute. A team whose
budget is spent is still served by the free routes among its candidates (a call that
reserves nothing passes a spent budget). The summary says what each tenant spent and
who was refused for which of its limits.
"""

from __future__ import annotations

import json
import random
import re
import sys
import threading
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field

from . import Limit, Prices, QuotaEngine, QuotaExceeded
from ._bodies import read
from ._snapshot import fmt_amount, fmt_dollars

KEY_BASE = 9000  # demo key ids, away from a real router's


@dataclass
class Model:
    name: str
    published: dict[str, int | None]
    true_rpm: int | None = None  # what the provider really enforces (hidden)
    true_tpm: int | None = None
    prices: Prices | None = None  # dollars per million tokens (SPEC 23.1); None: free


@dataclass
class Provider:
    platform: str
    models: list[Model]
    keys: list[int]
    base_url: str = "https://api.example.invalid/v1"
    latency: tuple[float, float] = (0.004, 0.02)
    daily_allocation: int | None = None  # provider-side daily request allocation (per key)
    gemini: bool = False  # answers like Gemini: RESOURCE_EXHAUSTED with a quota id and a retryDelay
    max_concurrency: int | None = None  # a local server that takes this many requests at a time
    # OpenRouter-like (SPEC 21): an account-wide pool of requests a minute per key,
    # answered "free-models-per-min" with the X-RateLimit-* headers in the body, and
    # models whose upstream is congested for every key between two offsets (seconds
    # from the start) of the run.
    pool_rpm: int | None = None
    congested: dict[str, tuple[float, float]] = field(default_factory=dict)
    _t0: float = field(default_factory=time.monotonic)
    _pool: dict[int, deque[float]] = field(default_factory=lambda: defaultdict(deque))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _minute: dict[tuple[str, int], deque[tuple[float, int]]] = field(default_factory=lambda: defaultdict(deque))
    _day: Counter[int] = field(default_factory=Counter)
    _active: int = 0

    def call(self, model: Model, key: int, est: int, rng: random.Random) -> tuple[int, dict[str, str], str, int]:
        """Returns (status, headers, body, tokens used)."""
        now = time.monotonic()
        tokens = max(1, int(est * rng.uniform(0.55, 1.15)))
        with self._lock:
            if self.max_concurrency is not None and self._active >= self.max_concurrency:
                return 503, {}, OLLAMA_BUSY, 0
            span = self.congested.get(model.name)
            if span is not None and span[0] <= now - self._t0 < span[1]:
                return 429, {}, openrouter_upstream_body(model.name), 0
            if self.pool_rpm is not None:
                pool = self._pool[key]
                while pool and pool[0] <= now - 60:
                    pool.popleft()
                if len(pool) >= self.pool_rpm:
                    reset_ms = int((time.time() + 60 - (now - pool[0])) * 1000)
                    return 429, {}, openrouter_pool_body("free-models-per-min", self.pool_rpm, reset_ms), 0
            if self.daily_allocation is not None and self._day[key] >= self.daily_allocation:
                if self.gemini:
                    quota = "GenerateRequestsPerDayPerProjectPerModel-FreeTier"
                    return 429, {}, gemini_body(quota, model.name, self.daily_allocation, rng.randint(2, 6)), 0
                return 429, {}, CLOUDFLARE_DAILY, 0
            window = self._minute[(model.name, key)]
            while window and window[0][0] <= now - 60:
                window.popleft()
            used_req = len(window)
            used_tok = sum(t for _, t in window)
            true_rpm = model.true_rpm or model.published.get("rpm")
            true_tpm = model.true_tpm or model.published.get("tpm")
            if true_rpm is not None and used_req >= true_rpm:
                wait = 60 - (now - window[0][0])
                if self.gemini:
                    quota = "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"
                    return 429, {}, gemini_body(quota, model.name, true_rpm, max(1, round(wait))), 0
                body = groq_body("rpm_429.txt", model.name, true_rpm, used_req, 1, wait)
                return 429, {"retry-after": str(max(1, int(wait)))}, body, 0
            if true_tpm is not None and used_tok + tokens > true_tpm:
                body = groq_body("tpm_429.json", model.name, true_tpm, used_tok, tokens, 20)
                return 429, {"retry-after": "20"}, body, 0
            window.append((now, tokens))
            if self.pool_rpm is not None:
                self._pool[key].append(now)
            self._day[key] += 1
            self._active += 1
        try:
            time.sleep(rng.uniform(*self.latency))
        finally:
            with self._lock:
                self._active -= 1
        return 200, {}, "", tokens


# The bodies are the corpus' (`_bodies/<provider>/`), restated for the demo's models,
# limits and times.
OLLAMA_BUSY = read("ollama", "busy_503.json")
CLOUDFLARE_DAILY = read("cloudflare", "neurons_4006.txt")


def groq_body(name: str, model: str, limit: int, used: int, requested: int, wait_s: float) -> str:
    """Groq's 429 (`groq/<name>`): the model, the limit and its use, the delay."""
    body = read("groq", name)
    body = re.sub(r"model `[^`]*`", f"model `{model}`", body, count=1)
    numbers = f"Limit {limit}, Used {used}, Requested {requested}"
    body = re.sub(r"Limit \d+, Used \d+, Requested \d+", numbers, body, count=1)
    return re.sub(r"try again in (?:\d+m)?[\d.]+s", f"try again in {wait_s:.2f}s", body, count=1)


def openrouter_upstream_body(model: str) -> str:
    """OpenRouter's 429 when a free model's upstream is congested, for every key."""
    body = json.loads(read("openrouter", "upstream_429.json"))
    metadata = body["error"]["metadata"]
    metadata["raw"] = model + metadata["raw"][metadata["raw"].index(" is temporarily") :]
    return json.dumps(body)


def openrouter_pool_body(pool: str, limit: int, reset_ms: int) -> str:
    """OpenRouter's 429 for its account-wide free pool, the X-RateLimit-* headers in the body."""
    body = json.loads(read("openrouter", "free_per_day_429.json"))
    body["error"]["message"] = f"Rate limit exceeded: {pool}. "
    headers = body["error"]["metadata"]["headers"]
    headers["X-RateLimit-Limit"] = str(limit)
    headers["X-RateLimit-Reset"] = str(reset_ms)
    return json.dumps(body)


def gemini_body(quota_id: str, model: str, value: int, delay_s: int) -> str:
    """Gemini's 429: which quota ran out (its CamelCase id and value), and RetryInfo."""
    body = json.loads(read("google", "per_day_17s.json"))
    details = body["error"]["details"]
    violation = details[0]["violations"][0]
    violation["quotaId"] = quota_id
    violation["quotaDimensions"]["model"] = model
    violation["quotaValue"] = str(value)
    details[-1]["retryDelay"] = f"{delay_s}s"
    return json.dumps(body)


def _providers() -> list[Provider]:
    return [
        Provider(
            "demo-groq",
            [
                Model(
                    "llama-3.1-8b-instant",
                    {"rpm": 30, "rpd": 14_400, "tpm": 6_000, "tpd": 500_000},
                    prices=Prices(0.05, 0.08),
                ),
                # published 30 rpm, but this key's real limit is 12: the engine learns it
                Model(
                    "llama-3.3-70b-versatile",
                    {"rpm": 30, "rpd": 1_000, "tpm": None, "tpd": None},
                    true_rpm=12,
                    prices=Prices(0.59, 0.79),
                ),
            ],
            keys=[KEY_BASE + 1, KEY_BASE + 2],
        ),
        Provider(
            "demo-cerebras",
            [
                Model(
                    "qwen-3-32b",
                    {"rpm": 20, "rpd": 14_400, "tpm": 60_000, "tpd": 1_000_000},
                    prices=Prices(0.4, 0.8),
                )
            ],
            keys=[KEY_BASE + 3, KEY_BASE + 4],
        ),
        Provider(
            "demo-workers-ai",
            # no published limits at all: only the provider's daily allocation stops it
            [
                Model(
                    "llama-3.1-8b",
                    {"rpm": None, "rpd": None, "tpm": None, "tpd": None},
                    prices=Prices(0.28, 0.83),
                )
            ],
            keys=[KEY_BASE + 5],
            daily_allocation=40,
        ),
        Provider(
            "demo-gemini",
            # only the RPM is published; the daily quota is learned from the error body
            [
                Model(
                    "gemini-2.0-flash",
                    {"rpm": 15, "rpd": None, "tpm": None, "tpd": None},
                    prices=Prices(0.1, 0.4),
                )
            ],
            keys=[KEY_BASE + 8, KEY_BASE + 9],
            daily_allocation=8,
            gemini=True,
        ),
        Provider(
            "demo-openrouter",
            [
                Model("deepseek-chat:free", {"rpm": 20, "rpd": None, "tpm": None, "tpd": None}),
                Model("llama-3.3-70b-instruct:free", {"rpm": 20, "rpd": None, "tpm": None, "tpd": None}),
            ],
            keys=[KEY_BASE + 6, KEY_BASE + 10],
            # each key's account takes 12 free-model requests a minute (not published)
            pool_rpm=12,
            # llama's upstream is congested for every key for a stretch of the run
            congested={"llama-3.3-70b-instruct:free": (1.0, 4.0)},
        ),
        Provider(
            "demo-ollama",
            [Model("llama3.2:3b", {"rpm": None, "rpd": None, "tpm": None, "tpd": None})],
            keys=[KEY_BASE + 7],
            base_url="http://localhost:11434/v1",
            latency=(0.25, 0.6),  # a local model is slow: three at once happen
            max_concurrency=2,
        ),
    ]


OPENROUTER_DAILY_CAP = 60
# SPEC 22.1: batch calls (priority 1) leave this much of every limit to interactive ones.
BATCH_RESERVE = 0.3
BATCH_PRIORITY = 1
# SPEC 23.2: every call is for a user and the user's team. `team:*` gives each team its
# own budget a day (each team its own window, not one shared pool); alice, on a trial plan,
# has a few requests a minute.
USERS = [
    ("user:alice", "team:search"),
    ("user:bob", "team:search"),
    ("user:carol", "team:support"),
    ("user:dave", "team:support"),
]
TEAM_BUDGET = 0.005  # dollars a day, per team
ALICE_RPM = 5


@dataclass
class Callers:
    """What one kind of caller asked for and got."""

    asked: int = 0
    served: int = 0
    waited_s: float = 0.0


def _setup(e: QuotaEngine, providers: list[Provider]) -> None:
    for p in providers:
        for k in p.keys:
            e.register_key(k, p.platform, base_url=p.base_url, label=f"{p.platform} demo key")
            e.clear_cooldowns_for_key(k)  # a fresh start for the demo's own keys
        for m in p.models:
            lim = m.published
            e.set_model_limits(
                p.platform, m.name, rpm=lim.get("rpm"), rpd=lim.get("rpd"), tpm=lim.get("tpm"), tpd=lim.get("tpd")
            )
            e.set_model_prices(p.platform, m.name, m.prices)
    e.set_provider_caps("demo-openrouter", daily_requests=OPENROUTER_DAILY_CAP)
    e.set_tenant_limits("team:*", [Limit.dollars(TEAM_BUDGET, "day")])
    e.set_tenant_limits("user:alice", [Limit("requests", ALICE_RPM, "minute")])


def _overshoot(e: QuotaEngine, providers: list[Provider], since_ms: int) -> tuple[int, int]:
    """Checks every published per-route limit over the run, from the usage rows.

    Returns (windows checked, requests over a limit)."""
    over = 0
    checked = 0
    day_start = since_ms - since_ms % 86_400_000
    for p in providers:
        for m in p.models:
            for k in p.keys:
                rows = [
                    r["created_at_ms"]
                    for r in e.usage_events(since_ms=day_start, platform=p.platform, model_id=m.name, key_id=k)
                    if r["kind"] == "request"
                ]
                rpm, rpd = m.published.get("rpm"), m.published.get("rpd")
                if rpm is not None:
                    window: deque[int] = deque()
                    for t in rows:
                        window.append(t)
                        while window[0] <= t - 60_000:
                            window.popleft()
                        checked += 1
                        over += max(0, len(window) - rpm)
                if rpd is not None:
                    checked += 1
                    over += max(0, len(rows) - rpd)
    cap_rows = [r for r in e.usage_events(since_ms=day_start, platform="demo-openrouter") if r["kind"] == "request"]
    checked += 1
    over += max(0, len(cap_rows) - OPENROUTER_DAILY_CAP)
    # SPEC 23.2: alice's requests a minute, over every route she was served by
    alice: deque[int] = deque()
    for r in e.usage_events(since_ms=day_start):
        if r["kind"] == "request" and "user:alice" in r["tenants"]:
            alice.append(r["created_at_ms"])
            while alice[0] <= r["created_at_ms"] - 60_000:
                alice.popleft()
            checked += 1
            over += max(0, len(alice) - ALICE_RPM)
    return checked, over


def _learned(e: QuotaEngine, providers: list[Provider]) -> dict[str, str]:
    """What the engine knows now that the provider did not publish: model -> "rpd=12 ..."."""
    out = {}
    for p in providers:
        for m in p.models:
            now = e.model_limits(p.platform, m.name)
            if now is None:
                continue
            changed = [
                f"{axis}={getattr(now, axis)}"
                for axis in ("rpm", "rpd", "tpm", "tpd")
                if getattr(now, axis) != m.published.get(axis)
            ]
            if changed:
                out[f"{p.platform}/{m.name}"] = " ".join(changed)
    return out


def _tenants(e: QuotaEngine, since_ms: int) -> list[str]:
    """Per tenant of the demo: what its calls cost in this run, and each limit in force for
    it as used / limit (dollars for cost; today's use, earlier runs included)."""
    spent: Counter[str] = Counter()
    for r in e.usage_events(since_ms=since_ms):
        for tenant in r["tenants"]:
            spent[tenant] += r["cost"]
    names = sorted({name for pair in USERS for name in pair})
    width = max(len(n) for n in names) + 2
    out = []
    for name in names:
        limits = [
            f"{window} {fmt_amount(window, u['used'])} / {fmt_amount(window, u['limit'])}"
            for window, u in e.tenant_usage(name).items()
        ]
        out.append(f"{name:<{width}}spent {fmt_dollars(spent[name]):<12}" + ("  ".join(limits) or "no limits"))
    return out


def run_demo(db: str | None, *, seconds: float = 8.0, threads: int = 8, quiet: bool = False) -> int:
    providers = _providers()
    routes = [(p, m, k) for p in providers for m in p.models for k in p.keys]
    stats_lock = threading.Lock()
    admitted = 0
    succeeded = 0
    refused: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    benched: Counter[str] = Counter()
    answers: dict[str, Counter[int]] = defaultdict(Counter)  # platform -> status -> count
    per_key: Counter[str] = Counter()  # where lease_any sent the requests
    upstream_seen: dict[str, int] = {}  # platform/model -> the longest model-wide bench (ms)
    callers = {"interactive": Callers(), "batch": Callers()}
    tenant_refused: Counter[tuple[str, str]] = Counter()  # (tenant, reason) -> refusals
    interactive = max(1, threads // 4)  # the first threads; the rest run batch jobs
    with QuotaEngine(db) as e:
        path = e.path  # the engine's default when db is None
        _setup(e, providers)
        # the demo's reserve, for priority 1 only; the file gets its previous value back
        previous_reserve = e.priority_reserve(BATCH_PRIORITY)
        e.set_priority_reserve(BATCH_PRIORITY, BATCH_RESERVE)
        start_ms = e.now_ms()
        deadline = time.monotonic() + seconds
        stop = threading.Event()

        def worker(seed: int) -> None:
            nonlocal admitted, succeeded
            rng = random.Random(seed)
            kind = "interactive" if seed < interactive else "batch"
            # about 40 attempts a second in all, like a busy router's traffic; a batch job
            # asks twice as often and waits up to a second for room, a person 0.2 s
            pace = threads / 40 / (2 if kind == "batch" else 1)
            priority, wait_s = (BATCH_PRIORITY, 1.0) if kind == "batch" else (0, 0.2)
            while time.monotonic() < deadline:
                # the routes that can serve this request (a few models, all their keys),
                # and the engine picks the one with the most room, in one atomic step
                candidates = rng.sample(routes, 4)
                est = int(rng.lognormvariate(6.0, 0.5))
                user = rng.choice(USERS)  # the user and the team the call is made for
                asked_at = time.monotonic()
                try:
                    lease = e.lease_any(
                        [(p.platform, m.name, k) for p, m, k in candidates],
                        est,
                        priority=priority,
                        wait_s=wait_s,
                        tenant=user,
                    )
                except QuotaExceeded as exc:
                    with stats_lock:
                        refused[exc.reason] += 1
                        if exc.tenant is not None:
                            tenant_refused[(exc.tenant, exc.reason)] += 1
                        callers[kind].asked += 1
                        callers[kind].waited_s += time.monotonic() - asked_at
                    time.sleep(pace)
                    continue
                with stats_lock:
                    callers[kind].asked += 1
                    callers[kind].served += 1
                    callers[kind].waited_s += time.monotonic() - asked_at
                p, m, k = next(
                    c
                    for c in candidates
                    if (c[0].platform, c[1].name, c[2]) == (lease.platform, lease.model_id, lease.key_id)
                )
                with stats_lock:
                    admitted += 1
                    per_key[f"{p.platform} key {k}"] += 1
                with lease:
                    status, headers, body, tokens = p.call(m, k, est, rng)
                    with stats_lock:
                        answers[p.platform][status] += 1
                    if status == 200:
                        lease.success(tokens)
                        with stats_lock:
                            succeeded += 1
                    else:
                        out = lease.failure(status=status, retry_after=headers.get("retry-after"), message=body)
                        if out is not None:
                            with stats_lock:
                                failed[out.kind] += 1
                                if out.cooldown is not None:
                                    benched[f"{out.kind} ({out.cooldown.source})"] += 1
                                if out.kind == "upstream" and out.cooldown is not None:
                                    route = f"{p.platform}/{m.name}"
                                    upstream_seen[route] = max(upstream_seen.get(route, 0), out.cooldown.duration_ms)
                time.sleep(rng.uniform(0, 2 * pace))

        def progress() -> None:
            width = 30
            while not stop.wait(0.2):
                done = min(1.0, 1 - (deadline - time.monotonic()) / seconds)
                bar = "#" * int(done * width) + "." * (width - int(done * width))
                with stats_lock:
                    line = (
                        f"\r[{bar}] {done * seconds:4.1f}/{seconds:.0f}s  admitted {admitted}  "
                        f"refused {sum(refused.values())}  failed {sum(failed.values())}"
                    )
                sys.stderr.write(line)
                sys.stderr.flush()
            sys.stderr.write("\n")

        pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
        bar = None if quiet else threading.Thread(target=progress, daemon=True)
        if bar:
            bar.start()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        stop.set()
        if bar:
            bar.join()
        e.set_priority_reserve(BATCH_PRIORITY, previous_reserve)
        checked, over = _overshoot(e, providers, start_ms)
        cooldowns = [c for c in e.active_cooldowns() if c.platform.startswith("demo-")]
        learned = _learned(e, providers)
        tenants = _tenants(e, start_ms)
        caps = {f"{p.platform} key {k}": e.key_concurrency_cap(p.platform, k) for p in providers for k in p.keys}
        pool_caps = {f"{p.platform} key {k}": e.learned_provider_caps(p.platform, k) for p in providers for k in p.keys}
        pool_caps_text = {
            key: " ".join(
                f"{axis}={v}" for axis, v in (("daily", c.daily_requests), ("minute", c.minute_requests)) if v
            )
            for key, c in pool_caps.items()
            if c.daily_requests is not None or c.minute_requests is not None
        }

    print(f"quotaengine demo: {threads} router threads for {seconds:g}s on {path}")
    print(f"  admitted   {admitted} (succeeded {succeeded}, failed {sum(failed.values())})")
    print(f"  refused    {sum(refused.values())} (every candidate refused; the first gate of the earliest)")
    for reason, n in refused.most_common():
        print(f"    {reason:<26}{n}")
    print(f"  failures by kind: {dict(failed) or 'none'}")
    print(f"  benched by kind:  {dict(benched) or 'none'}")
    print("  requests per key (lease_any over 4 candidates, strategy headroom):")
    for key, n in sorted(per_key.items()):
        print(f"    {key:<26}{n}")
    print("  refused answers (429/503) per provider, of its answers:")
    for platform, by_status in answers.items():
        bad = sum(n for status, n in by_status.items() if status != 200)
        print(f"    {platform:<26}{bad} of {sum(by_status.values())}")
    print(
        f"  callers on the same keys (batch at priority {BATCH_PRIORITY} leaves {BATCH_RESERVE:.0%} of every "
        "limit to interactive at priority 0, and waits behind it):"
    )
    for kind, c in callers.items():
        threads_of = interactive if kind == "interactive" else threads - interactive
        share = f"{c.served / c.asked:.0%}" if c.asked else "-"
        wait = f"{c.waited_s / c.asked:.3f}s" if c.asked else "-"
        print(
            f"    {kind:<12} {threads_of} thread(s)  asked {c.asked:<5} served {c.served:<5} ({share})  "
            f"waited {wait} per call"
        )
    print(
        f"  tenants (each call for a user and its team; team:* gives each team its own "
        f"{fmt_dollars(round(TEAM_BUDGET * 1_000_000))} a day, user:alice {ALICE_RPM} requests a minute):"
    )
    for line in tenants:
        print(f"    {line}")
    print("  refused for a tenant's own limit (tenant, reason, refusals):")
    for (tenant, reason), n in sorted(tenant_refused.items()):
        print(f"    {tenant:<16}{reason:<26}{n}")
    if not tenant_refused:
        print("    none")
    print(f"  limits learned:   {learned or 'none'}")
    print(f"  concurrency caps: {({k: v for k, v in caps.items() if v is not None}) or 'none'}")
    print(f"  provider caps learned from pool 429s: {pool_caps_text or 'none'}")
    benches = {route: f"up to {ms / 1000:g}s" for route, ms in upstream_seen.items()} or "none"
    print(
        f"  upstream congestion: {failed.get('upstream', 0)} answer(s) benched the model on every key "
        f"(the keys' own ladders untouched): {benches}"
    )
    print(f"  active cooldowns: {len(cooldowns)}")
    print(f"  overshoot: {over} requests over a published limit ({checked} windows checked)")
    print(f"\nrun `python -m quotaengine status --db {path}` to see the windows and cooldowns")
    return 0 if over == 0 else 1
