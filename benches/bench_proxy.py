"""The LiteLLM proxy with and without quotaengine's handler (SPEC 25.3), side by side in one run.

    python benches/bench_proxy.py [--requests 300] [--rate 10] [--in-flight 8] [--backend sqlite|redis]
        [--uvicorn] [--tenant-limit 10] [--burst 40] [--burst-gap 0.05]
    python benches/bench_proxy.py --overhead 200 [--rounds 5]

The real proxy (``python -m litellm.proxy.proxy_cli --config ... --num_workers 2``, no
database, gunicorn workers by default) in front of the Part 15 providers of
``bench_litellm.py`` ("groq" 30/min per key, "gemini" 15/min, "local" two at once), a
fresh proxy, provider server and store for each configuration:

* ``litellm alone``: LiteLLM's own limits declared (``rpm`` and ``max_parallel_requests``
  per deployment, ``usage-based-routing-v2``), no callback;
* ``quotaengine, nothing declared``: the one config line
  (``callbacks: ["quotaengine.litellm.proxy_handler"]``, ``QUOTAENGINE_WAIT_S=5``);
* ``quotaengine, limits declared``: the same with the limits in ``litellm_params``.
* with ``--backend redis``, ``litellm alone, coordination_redis``: LiteLLM alone with
  ``general_settings: coordination_redis`` on the same redis-server (LiteLLM keeps its
  usage counters there, its key limiter's included, without response caching).

``num_retries=2`` everywhere. Clients authenticate through a ``custom_auth`` function
(the proxy has no database, hence no virtual keys): it returns a ``UserAPIKeyAuth`` with a
``key_alias``, and for ``litellm alone`` the tenant key's ``rpm_limit``, so LiteLLM's own
per-key limiter (``parallel_request_limiter_v3``; without Redis its counters live in each
worker's memory) applies. For the handler the same key is the tenant ``key:tenant`` with
``set_tenant_limits(..., [Limit("requests", n, "minute")])`` on the shared store.

Two phases per configuration:

1. the workload: ``--requests`` at ``--rate`` per second, at most ``--in-flight``
   outstanding, on the key ``work`` (no limit): served, provider 429s, upstream calls,
   p50/p99 as the client sees them, wall time;
2. a tenant limit's exactness: ``--burst`` requests, one every ``--burst-gap`` seconds, on
   the key ``tenant`` (limit ``--tenant-limit`` requests a minute), each on a connection of
   its own so both workers take some (the custom_auth logs which worker took each), to a
   deployment that always answers: admitted against the limit.

``--overhead N``: the cost per request of the handler beside LiteLLM's own, on deployments
that answer at once (``mock_response`` in ``litellm_params``): two proxies up at once
(two workers each), the same config without and with the callback line, ``N`` sequential
requests per round on one keep-alive connection, ``--rounds`` interleaved rounds; the
median of the rounds' p50 (and mean) milliseconds per request, and the CPU the proxy's
processes spent per request (``/proc``, user + system).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler
from importlib.metadata import version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

import httpx  # noqa: E402
import quotaengine as qe  # noqa: E402
from bench_litellm import GEMINI_RPM, GROQ_RPM, LOCAL_CAP, Providers, paced  # noqa: E402
from litellm_proxy import LiteLLMProxy  # noqa: E402

CONFIGS = ["litellm alone", "quotaengine, nothing declared", "quotaengine, limits declared"]
LITELLM_REDIS = "litellm alone, coordination_redis"  # with --backend redis
MESSAGES = [{"role": "user", "content": "hi"}]

# The proxy's custom_auth (general_settings.custom_auth = "bench_auth.user_api_key_auth"):
# the bearer token names the key; BENCH_KEYS gives each its alias and LiteLLM limits.
AUTH_MODULE = r"""
import json, os
from litellm.proxy._types import UserAPIKeyAuth

KEYS = json.loads(os.environ["BENCH_KEYS"])


async def user_api_key_auth(request, api_key):
    token = api_key.removeprefix("Bearer ").strip()
    if token not in KEYS:
        raise Exception("unknown key")
    with open(os.environ["BENCH_AUTH_LOG"], "a") as f:  # which worker took the request
        f.write(f"{os.getpid()} {KEYS[token]['key_alias']}\n")
    return UserAPIKeyAuth(api_key=token, **KEYS[token])
"""


class BenchProviders(Providers):
    """The Part 15 providers, plus "free": a model that always answers at once (the tenant
    phase measures the tenant limit alone)."""

    def on_post(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        if body.get("model") == "free":
            self._done(200)
            ok = {
                "id": "x",
                "object": "chat.completion",
                "created": 1,
                "model": "free",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20},
            }
            self.send(h, 200, json.dumps(ok).encode(), {})
            return
        super().on_post(h, body)


def model_list(url: str, declared: bool) -> list[dict[str, Any]]:
    """bench_litellm's deployments as proxy config entries, and the "free" one."""

    def dep(group: str, name: str, platform: str, key: int, **limits: int) -> dict[str, Any]:
        params: dict[str, Any] = {"model": f"openai/{name}", "api_base": url, "api_key": f"sk-{name}"}
        if declared:
            params.update(limits)
        return {
            "model_name": group,
            "litellm_params": params,
            "model_info": {"id": name, "quotaengine": {"platform": platform, "key_id": key}},
        }

    return [
        dep("llama", "groq", "groq", 1, rpm=GROQ_RPM),
        dep("llama", "gemini", "google", 2, rpm=GEMINI_RPM),
        dep("llama", "local", "local", 3, max_parallel_requests=LOCAL_CAP),
        dep("exact", "free", "free", 4),
    ]


def start_proxy(
    workdir: Path,
    model_list: list[dict[str, Any]],
    handler: bool,
    keys: dict[str, dict[str, Any]],
    env: dict[str, str],
    strategy: str | None = None,
    general: dict[str, Any] | None = None,
) -> LiteLLMProxy:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "bench_auth.py").write_text(AUTH_MODULE)
    config: dict[str, Any] = {
        "model_list": model_list,
        "router_settings": {"num_retries": 2},
        "general_settings": {"custom_auth": "bench_auth.user_api_key_auth", **(general or {})},
    }
    if handler:
        config["litellm_settings"] = {"callbacks": ["quotaengine.litellm.proxy_handler"]}
    if strategy:
        config["router_settings"]["routing_strategy"] = strategy
    full_env = {"BENCH_KEYS": json.dumps(keys), "BENCH_AUTH_LOG": str(workdir / "auth.log"), **env}
    return LiteLLMProxy(workdir, config, full_env, workers=2, gunicorn=GUNICORN, start_timeout_s=240)


GUNICORN = True


async def workload(url: str, n: int, rate: float, in_flight: int) -> dict[str, Any]:
    sem = asyncio.Semaphore(in_flight)
    latencies: list[float] = []
    codes: dict[int, int] = {}
    why: Counter[str] = Counter()
    headers = {"authorization": "Bearer sk-work"}
    async with httpx.AsyncClient(timeout=120, headers=headers) as c:

        async def one() -> None:
            async with sem:
                t = time.perf_counter()
                try:
                    r = await c.post(f"{url}/v1/chat/completions", json={"model": "llama", "messages": MESSAGES})
                    code = r.status_code
                    if code != 200:
                        why[reason(r.text)] += 1
                except httpx.HTTPError:
                    code = 0
                    why["no answer"] += 1
                latencies.append(time.perf_counter() - t)
                codes[code] = codes.get(code, 0) + 1

        t0 = await paced(one, n, rate)
        wall = time.perf_counter() - t0
    latencies.sort()
    return {
        "served": codes.get(200, 0),
        "codes": codes,
        "why": dict(why),
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "wall_s": wall,
    }


def reason(text: str) -> str:
    """A refusal's cause, from the proxy's error message."""
    if "No deployments available" in text:
        return "no deployment available (LiteLLM)"
    if "quotaengine" in text:
        return "refused by quotaengine"
    try:
        message = str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        message = text
    SAMPLES.setdefault(message[:70], message[:400])
    return message[:70]


SAMPLES: dict[str, str] = {}


async def burst(url: str, n: int, gap_s: float) -> dict[int, int]:
    """``n`` requests on the tenant key, one every ``gap_s`` seconds (all within the minute),
    each on a fresh connection so that both workers take some (a burst sent at once tends to
    land on one worker). ``num_retries: 0`` in the request: the tenant's 429 goes back to the
    client instead of the Router retrying it after its ``retry-after``, in the next minute."""
    limits = httpx.Limits(max_keepalive_connections=0, max_connections=None)
    headers = {"authorization": "Bearer sk-tenant"}
    body = {"model": "exact", "messages": MESSAGES, "num_retries": 0}
    async with httpx.AsyncClient(timeout=120, headers=headers, limits=limits) as c:
        tasks = []
        for _ in range(n):
            tasks.append(asyncio.create_task(c.post(f"{url}/v1/chat/completions", json=body)))
            await asyncio.sleep(gap_s)
        rs = await asyncio.gather(*tasks, return_exceptions=True)
    codes: dict[int, int] = {}
    for r in rs:
        code = r.status_code if isinstance(r, httpx.Response) else 0
        codes[code] = codes.get(code, 0) + 1
    return codes


def worker_split(log: Path, alias: str) -> list[int]:
    """Requests of the key per worker process, from the custom_auth's log, most first."""
    pids = Counter(pid for pid, a in (line.split() for line in log.read_text().splitlines()) if a == alias)
    return sorted(pids.values(), reverse=True)


def store_location(backend: str, tmp: Path, name: str, redis_url: str | None) -> str:
    if backend == "redis":
        assert redis_url is not None
        return f"{redis_url}?prefix=b{name}{int(time.time() * 1000)}"
    return str(tmp / f"{name}.db")


def run(config: str, a: argparse.Namespace, tmp: Path, redis_url: str | None) -> dict[str, Any]:
    prov = BenchProviders()
    handler = config.startswith("quotaengine")
    declared = config != "quotaengine, nothing declared"
    keys: dict[str, dict[str, Any]] = {"sk-work": {"key_alias": "work"}, "sk-tenant": {"key_alias": "tenant"}}
    env: dict[str, str] = {}
    slug = config.replace(" ", "_").replace(",", "")
    if handler:
        db = store_location(a.backend, tmp, slug, redis_url)
        with qe.QuotaEngine(db, env={}) as e:  # the operator's declaration, before the start
            e.set_tenant_limits("key:tenant", [qe.Limit("requests", a.tenant_limit, "minute")])
        env = {"QUOTAENGINE_DB": db, "QUOTAENGINE_WAIT_S": "5"}
    else:
        keys["sk-tenant"]["rpm_limit"] = a.tenant_limit
    t = time.perf_counter()
    strategy = None if handler else "usage-based-routing-v2"
    general = None
    if config == LITELLM_REDIS:  # LiteLLM's counters (its key limiter's, its Router's) on the Redis
        assert redis_url is not None
        host, port = redis_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
        general = {"coordination_redis": {"host": host, "port": int(port)}}
    proxy = start_proxy(tmp / slug, model_list(prov.url, declared), handler, keys, env, strategy, general)
    start_s = time.perf_counter() - t
    try:
        r = asyncio.run(workload(proxy.url, a.requests, a.rate, a.in_flight))
        r["429s"] = prov.status.get(429, 0)
        r["upstream"] = prov.calls
        before = prov.status.get(200, 0)
        codes = asyncio.run(burst(proxy.url, a.burst, a.burst_gap))
        r["tenant_codes"] = codes
        r["admitted"] = codes.get(200, 0)
        r["tenant_upstream"] = prov.status.get(200, 0) - before
        r["split"] = worker_split(tmp / slug / "auth.log", "tenant")
        r["work_split"] = worker_split(tmp / slug / "auth.log", "work")
    finally:
        proxy.kill()
        prov.close()
    r["config"] = config
    r["start_s"] = start_s
    return r


def overhead(a: argparse.Namespace, tmp: Path, redis_url: str | None) -> None:
    def mock_list() -> list[dict[str, Any]]:
        return [
            {
                "model_name": "m",
                "litellm_params": {"model": f"openai/k{i}", "api_key": f"sk-{i}", "mock_response": "hi"},
                "model_info": {"id": f"k{i}", "quotaengine": {"platform": "p", "key_id": i}},
            }
            for i in range(4)
        ]

    keys = {"sk-work": {"key_alias": "work"}}
    db = store_location(a.backend, tmp, "overhead", redis_url)
    with qe.QuotaEngine(db, env={}) as e:  # a tenant limit, so its gate and headers run too
        e.set_tenant_limits("key:work", [qe.Limit("requests", 10**9, "minute")])
    setups: dict[str, LiteLLMProxy] = {}
    try:
        setups["litellm alone"] = start_proxy(tmp / "ovh-alone", mock_list(), False, keys, {})
        env = {"QUOTAENGINE_DB": db}
        setups["with the handler"] = start_proxy(tmp / "ovh-handler", mock_list(), True, keys, env)
        p50s: dict[str, list[float]] = {k: [] for k in setups}
        means: dict[str, list[float]] = {k: [] for k in setups}
        cpu: dict[str, list[float]] = {k: [] for k in setups}
        clients = {k: httpx.Client(timeout=60, headers={"authorization": "Bearer sk-work"}) for k in setups}

        def batch(name: str, n: int) -> list[float]:
            c, url = clients[name], setups[name].url
            out = []
            for _ in range(n):
                t = time.perf_counter()
                r = c.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
                out.append(time.perf_counter() - t)
                if r.status_code != 200:
                    raise RuntimeError(f"{name}: {r.status_code} {r.text[:300]}")
            return out

        for name in setups:
            batch(name, 20)  # warm up (the handler installs itself at the first request)
        order = list(setups)
        for i in range(a.rounds):
            for name in order if i % 2 == 0 else order[::-1]:
                c0 = group_cpu_s(setups[name].proc.pid)
                v = batch(name, a.overhead)
                cpu[name].append(1000 * (group_cpu_s(setups[name].proc.pid) - c0) / a.overhead)
                p50s[name].append(1000 * statistics.median(v))
                means[name].append(1000 * statistics.fmean(v))
        for c in clients.values():
            c.close()
    finally:
        for p in setups.values():
            p.kill()
    print(f"\nper-request cost, mock_response deployments, {a.overhead} sequential requests x {a.rounds} rounds")
    print(f"{'proxy':20s} {'p50 ms':>8s} {'mean ms':>8s} {'CPU ms':>8s}  round p50s")
    for name in setups:
        rounds = " ".join(f"{x:.1f}" for x in p50s[name])
        p50, mean, c = (statistics.median(x[name]) for x in (p50s, means, cpu))
        print(f"{name:20s} {p50:8.2f} {mean:8.2f} {c:8.2f}  {rounds}")
    d = statistics.median(p50s["with the handler"]) - statistics.median(p50s["litellm alone"])
    paired = statistics.median(h - b for h, b in zip(p50s["with the handler"], p50s["litellm alone"], strict=True))
    print(f"handler's cost per request: {d:+.2f} ms (difference of the medians of p50); {paired:+.2f} ms (median")
    print("of each round's difference)")
    dc = statistics.median(h - b for h, b in zip(cpu["with the handler"], cpu["litellm alone"], strict=True))
    print(
        f"CPU of the proxy's processes per request: {dc:+.2f} ms with the handler (median of each round's difference)"
    )


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of the live processes of a process group (the proxy's
    master and workers), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ...
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def main() -> None:
    global GUNICORN
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--in-flight", type=int, default=8)
    ap.add_argument("--tenant-limit", type=int, default=10)
    ap.add_argument("--burst", type=int, default=40)
    ap.add_argument("--burst-gap", type=float, default=0.05)
    ap.add_argument("--backend", choices=["sqlite", "redis"], default="sqlite")
    ap.add_argument("--uvicorn", action="store_true", help="uvicorn workers instead of gunicorn")
    ap.add_argument("--overhead", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="")
    ap.add_argument("--verbose", action="store_true", help="print one refusal message of each kind")
    a = ap.parse_args()
    GUNICORN = not a.uvicorn
    redis = None
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        redis_url = None
        if a.backend == "redis":
            from redis_servers import RedisServer

            redis = RedisServer(tmp / "redis")
            redis_url = redis.url
        try:
            server = "uvicorn" if a.uvicorn else "gunicorn"
            head = f"LiteLLM {version('litellm')} proxy, 2 {server} workers, quotaengine on {a.backend}"
            if a.overhead:
                print(head)
                overhead(a, tmp, redis_url)
                return
            configs = [c for c in CONFIGS if a.only in c]
            if a.backend == "redis" and a.only in LITELLM_REDIS:
                configs.insert(1, LITELLM_REDIS)
            print(f"{head}; {a.requests} requests at {a.rate}/s, at most {a.in_flight} in flight")
            print(
                f"tenant phase: {a.burst} requests, one every {a.burst_gap} s, on a key limited to "
                f"{a.tenant_limit} a minute"
            )
            cols = ("served", "429s", "upstream", "p50 ms", "p99 ms", "wall s", "admitted", "limit", "per wkr")
            print(f"{'config':34s} " + " ".join(f"{c:>8s}" for c in cols))
            for c in configs:
                r = run(c, a, tmp, redis_url)
                print(
                    f"{r['config']:34s} {r['served']:8d} {r['429s']:8d} {r['upstream']:8d} {r['p50_ms']:8.0f} "
                    f"{r['p99_ms']:8.0f} {r['wall_s']:8.1f} {r['admitted']:8d} {a.tenant_limit:8d} "
                    f"{'+'.join(map(str, r['split'])):>8s}",
                    flush=True,
                )
                print(
                    f"    client codes {r['codes']} {r['why']}, workload per worker {r['work_split']}, tenant codes "
                    f"{r['tenant_codes']} ({r['tenant_upstream']} reached the provider), start {r['start_s']:.0f} s",
                    flush=True,
                )
                if a.verbose:
                    for message in SAMPLES.values():
                        print(f"      refusal: {message}")
                SAMPLES.clear()
        finally:
            if redis is not None:
                redis.kill()


if __name__ == "__main__":
    main()
