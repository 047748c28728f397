"""LiteLLM's Router with and without quotaengine choosing (SPEC 20), side by side in one run.

    python benches/bench_litellm.py [--requests 600] [--rate 10] [--in-flight 8]
    python benches/bench_litellm.py --overhead 400

Workload: one model group of three deployments on local providers that answer as the
real ones do (their 429 bodies and headers):

* "groq": 30 requests per minute per key (sliding), a 429 with Groq's wording and a
  ``retry-after`` of the seconds until a slot frees;
* "gemini": 15 per minute per key (fixed minutes), Google's RESOURCE_EXHAUSTED with the
  PerMinute quota id and RetryInfo until the minute ends;
* "local": a server that takes two requests at once (each held 0.3 s) and answers a
  third with 429 "Too many concurrent requests".

Requests arrive at ``--rate`` per second with at most ``--in-flight`` outstanding; each
configuration gets fresh providers and a fresh engine:

* ``litellm default``: ``litellm.Router`` as a new user makes it (num_retries=2);
* ``litellm tuned``: every limit declared (rpm, max_parallel_requests) with
  ``usage-based-routing-v2``;
* ``quotaengine, nothing declared``: ``qel.install(router, engine, wait_s=5)``;
* ``quotaengine, limits declared``: the same with the limits in ``litellm_params``.

Printed: served, provider 429s, upstream calls, p50/p99 latency, wall time.

``--overhead N``: the cost per request of choosing, on deployments answered at once
(``mock_response``): LiteLLM's ``simple-shuffle`` and ``usage-based-routing-v2`` against
the plugin, interleaved rounds, median microseconds per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))

import litellm  # noqa: E402
import quotaengine as qe  # noqa: E402
import quotaengine.litellm as qel  # noqa: E402
from local_server import LocalServer  # noqa: E402
from provider_bodies import gemini_body  # noqa: E402

litellm.suppress_debug_info = True
USAGE = {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}
GROQ_RPM, GEMINI_RPM, LOCAL_CAP, LOCAL_HOLD_S = 30, 15, 2, 0.3


class Providers(LocalServer):
    """The three providers on one local server; the model names which one answers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.groq: deque[float] = deque()
        self.gemini_minute = (0, 0)
        self.local = 0
        self.calls = 0
        self.status: dict[int, int] = {}
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def on_post(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        status, payload, headers = self.answer(str(body.get("model")))
        self.send(h, status, json.dumps(payload).encode(), headers)

    def _done(self, status: int) -> None:
        with self.lock:
            self.calls += 1
            self.status[status] = self.status.get(status, 0) + 1

    def answer(self, model: str) -> tuple[int, object, dict[str, str]]:
        now = time.monotonic()
        ok = {
            "id": "x",
            "object": "chat.completion",
            "created": 1,
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": USAGE,
        }
        if model == "groq":
            with self.lock:
                while self.groq and self.groq[0] <= now - 60:
                    self.groq.popleft()
                if len(self.groq) >= GROQ_RPM:
                    wait = self.groq[0] + 60 - now
                    self._done_locked(429)
                    msg = (
                        "Rate limit reached for model `llama-3.1-8b-instant` in organization `org_01` service tier "
                        f"`on_demand` on requests per minute (RPM): Limit {GROQ_RPM}, Used {GROQ_RPM}, Requested 1. "
                        f"Please try again in {wait:.2f}s. Need more tokens? Upgrade to Dev Tier today at "
                        "https://console.groq.com/settings/billing"
                    )
                    err = {"error": {"message": msg, "type": "requests", "code": "rate_limit_exceeded"}}
                    return 429, err, {"retry-after": str(max(1, int(wait + 0.999)))}
                self.groq.append(now)
            self._done(200)
            return 200, ok, {}
        if model == "gemini":
            minute = int(time.time() // 60)
            with self.lock:
                m, n = self.gemini_minute
                if m != minute:
                    m, n = minute, 0
                if n >= GEMINI_RPM:
                    self._done_locked(429)
                    delay = f"{60 - time.time() % 60:.0f}s"
                    body = json.loads(
                        gemini_body("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", delay, str(GEMINI_RPM))
                    )
                    return 429, [body], {}
                self.gemini_minute = (m, n + 1)
            self._done(200)
            return 200, ok, {}
        with self.lock:  # local
            if self.local >= LOCAL_CAP:
                self._done_locked(429)
                return 429, {"error": {"message": "Too many concurrent requests", "type": "rate_limit"}}, {}
            self.local += 1
        try:
            time.sleep(LOCAL_HOLD_S)
        finally:
            with self.lock:
                self.local -= 1
        self._done(200)
        return 200, ok, {}

    def _done_locked(self, status: int) -> None:
        self.calls += 1
        self.status[status] = self.status.get(status, 0) + 1


def model_list(url: str, declared: bool) -> list[dict[str, Any]]:
    def dep(name: str, platform: str, key: int, **limits: int) -> dict[str, Any]:
        params: dict[str, Any] = {"model": f"openai/{name}", "api_base": url, "api_key": f"sk-{name}"}
        if declared:
            params.update(limits)
        return {
            "model_name": "llama",
            "litellm_params": params,
            "model_info": {"id": name, "quotaengine": {"platform": platform, "key_id": key}},
        }

    return [
        dep("groq", "groq", 1, rpm=GROQ_RPM),
        dep("gemini", "google", 2, rpm=GEMINI_RPM),
        dep("local", "local", 3, max_parallel_requests=LOCAL_CAP),
    ]


async def paced(one: Any, n: int, rate: float) -> float:
    """Starts ``one()`` ``n`` times at ``rate`` a second (each on schedule however long the
    others take) and waits for them all; returns when the first started
    (``time.perf_counter()``)."""
    t0 = time.perf_counter()
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(max(0.0, t0 + (i + 1) / rate - time.perf_counter()))
    await asyncio.gather(*tasks)
    return t0


async def drive(router: Any, n: int, rate: float, in_flight: int) -> tuple[int, list[float], float]:
    sem = asyncio.Semaphore(in_flight)
    latencies: list[float] = []
    served = 0

    async def one() -> None:
        nonlocal served
        async with sem:
            t = time.perf_counter()
            try:
                await router.acompletion(model="llama", messages=[{"role": "user", "content": "hi"}])
                served += 1
            except Exception:  # noqa: BLE001 - refused or failed: not served
                pass
            latencies.append(time.perf_counter() - t)

    t0 = await paced(one, n, rate)
    await asyncio.sleep(0.5)  # LiteLLM's late log events
    return served, latencies, time.perf_counter() - t0


def run(config: str, n: int, rate: float, in_flight: int, tmp: Path) -> dict[str, Any]:
    prov = Providers()
    declared = config in ("litellm tuned", "quotaengine, limits declared")
    kw: dict[str, Any] = {"num_retries": 2}
    if config == "litellm tuned":
        kw["routing_strategy"] = "usage-based-routing-v2"
    router = litellm.Router(model_list=model_list(prov.url, declared), **kw)
    engine = plugin = None
    if config.startswith("quotaengine"):
        engine = qe.QuotaEngine(str(tmp / f"{config.replace(' ', '_').replace(',', '')}.db"))
        plugin = qel.install(router, engine, wait_s=5)
    served, lat, wall = asyncio.run(drive(router, n, rate, in_flight))
    if plugin is not None:
        plugin.uninstall()
    if engine is not None:
        engine.close()
    prov.close()
    lat.sort()
    return {
        "config": config,
        "served": served,
        "429s": prov.status.get(429, 0),
        "upstream": prov.calls,
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "wall_s": wall,
    }


def overhead(n: int, rounds: int = 5) -> None:
    """Microseconds per request of choosing, providers answering at once (mock_response)."""

    def mk(strategy: str | None) -> tuple[Any, Any]:
        ml = [
            {
                "model_name": "m",
                "litellm_params": {"model": f"openai/k{i}", "api_key": f"sk-{i}", "rpm": 10**6, "tpm": 10**9},
                "model_info": {"id": f"k{i}", "quotaengine": {"platform": "p", "key_id": i}},
            }
            for i in range(4)
        ]
        kw = {"routing_strategy": strategy} if strategy else {}
        r = litellm.Router(model_list=ml, **kw)
        plugin = None
        if strategy is None:
            plugin = qel.install(r, qe.QuotaEngine(":memory:"))
        return r, plugin

    setups = {"simple-shuffle": mk("simple-shuffle"), "usage-based-routing-v2": mk("usage-based-routing-v2")}
    setups["quotaengine plugin"] = mk(None)
    msgs = [{"role": "user", "content": "hi"}]

    async def batch(r: Any) -> float:
        t = time.perf_counter()
        for _ in range(n):
            await r.acompletion(model="m", messages=msgs, mock_response="hi")
        return (time.perf_counter() - t) / n * 1e6

    results: dict[str, list[float]] = {k: [] for k in setups}

    async def main() -> None:
        for r, _ in setups.values():
            await batch(r)  # warm up
        for _ in range(rounds):
            for name, (r, _) in setups.items():
                results[name].append(await batch(r))

    asyncio.run(main())
    print(f"acompletion with mock_response, {n} requests x {rounds} interleaved rounds (us per request)")
    for name, v in results.items():
        print(f"  {name:24s} median {statistics.median(v):8.0f}  min {min(v):8.0f}  max {max(v):8.0f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--in-flight", type=int, default=8)
    ap.add_argument("--overhead", type=int, default=0)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    if a.overhead:
        overhead(a.overhead)
        return
    import tempfile

    configs = ["litellm default", "litellm tuned", "quotaengine, nothing declared", "quotaengine, limits declared"]
    if a.only:
        configs = [c for c in configs if a.only in c]
    print(f"{a.requests} requests at {a.rate}/s, at most {a.in_flight} in flight, LiteLLM {litellm_version()}")
    print(f"{'config':32s} {'served':>7s} {'429s':>5s} {'upstream':>8s} {'p50 ms':>7s} {'p99 ms':>8s} {'wall s':>7s}")
    with tempfile.TemporaryDirectory() as d:
        for c in configs:
            r = run(c, a.requests, a.rate, a.in_flight, Path(d))
            print(
                f"{r['config']:32s} {r['served']:7d} {r['429s']:5d} {r['upstream']:8d} "
                f"{r['p50_ms']:7.0f} {r['p99_ms']:8.0f} {r['wall_s']:7.1f}",
                flush=True,
            )


def litellm_version() -> str:
    from importlib.metadata import version

    return version("litellm")


if __name__ == "__main__":
    main()
