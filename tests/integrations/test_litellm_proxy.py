"""SPEC 25.3 against the real LiteLLM proxy: ``litellm --config`` with the one config line,
no database, in front of a local server that answers as the providers do; real HTTP
clients (httpx for the headers, the openai SDK for a stream). Two proxies for the module
(each takes seconds to start): two gunicorn workers (``--run_gunicorn``) on one SQLite
file, and two uvicorn workers (``--num_workers 2`` alone) on one Redis."""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import quotaengine as q

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import quotaengine.litellm as qel  # noqa: E402
from litellm_proxy import AUTH, MASTER_KEY, LiteLLMProxy  # noqa: E402
from litellm_server import LiteLLMProviders  # noqa: E402
from redis_servers import RedisServer, redis_location  # noqa: E402
from stores import BACKENDS  # noqa: E402

pytestmark = [pytest.mark.timeout(240)]
MESSAGES = [{"role": "user", "content": "hello there"}]
RESET = re.compile(r"^(\d+h)?(\d+m)?\d+s$")  # OpenAI's "6m0s", "1s"


class Proxy:
    def __init__(self, proxy: LiteLLMProxy, providers: LiteLLMProviders, db: str) -> None:
        self.proxy, self.providers, self.db = proxy, providers, db
        self.url = proxy.url


def dep(server: LiteLLMProviders, group: str, model: str, key: str, **params: Any) -> dict[str, Any]:
    p = {"model": f"openai/{model}", "api_base": server.url, "api_key": key, **params}
    return {"model_name": group, "litellm_params": p}


@pytest.fixture(scope="module", params=BACKENDS)
def proxy(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    workdir = tmp_path_factory.mktemp("proxy")
    if request.param == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        db = redis_location(redis)
    else:
        db = str(workdir / "quota.db")
    with q.QuotaEngine(db, env={}) as e:  # the operator's declarations, before the start
        e.set_tenant_limits("end_user:bob", [q.Limit("requests", 5, "minute"), q.Limit("tokens", 10_000, "minute")])
        e.set_tenant_limits("end_user:carol", [q.Limit("tokens", 1000, "minute")])
        e.set_tenant_limits("tag:batch", [q.Limit("requests", 1, "minute")])
    with LiteLLMProviders() as server:
        config = {
            "model_list": [
                *(dep(server, "exact", f"ok-e{i}", f"sk-e{i}", rpm=4) for i in range(3)),
                dep(server, "tenant", "ok-t", "sk-t"),
                dep(server, "stream", "ok-s", "sk-s"),
                dep(server, "groq", "groq-429", "sk-groq"),
            ],
            "router_settings": {"num_retries": 0},
            # SPEC 25.3: the one line.
            "litellm_settings": {"callbacks": ["quotaengine.litellm.proxy_handler"]},
        }
        gunicorn = request.param == "sqlite"
        env = {"QUOTAENGINE_DB": db}
        p = LiteLLMProxy(workdir, config, env, workers=2, gunicorn=gunicorn, start_timeout_s=150)
        try:
            yield Proxy(p, server, db)
        finally:
            p.kill()


@pytest.fixture
def engine_on(proxy: Proxy) -> Iterator[q.QuotaEngine]:
    e = q.QuotaEngine(proxy.db, env={})
    yield e
    e.close()


def post_many(proxy: Proxy, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60, headers=AUTH) as c:
            return await asyncio.gather(*(c.post(f"{proxy.url}/v1/chat/completions", json=b) for b in bodies))

    return asyncio.run(main())


def settle(cond: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("the proxy never logged the outcome")
        time.sleep(0.05)


def test_sixteen_requests_on_three_keys_at_rpm_4_are_twelve_served_across_two_workers(proxy: Proxy) -> None:
    """The rpm of each deployment (imported from the config) holds across the two workers:
    exactly 12 answered by the provider, 4 refused with 429 and retry-after."""
    responses = post_many(proxy, [{"model": "exact", "messages": MESSAGES}] * 16)
    assert Counter(r.status_code for r in responses) == {200: 12, 429: 4}, proxy.proxy.output()
    assert sum(proxy.providers.count(f"ok-e{i}", 200) for i in range(3)) == 12
    for r in responses:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            assert "quotaengine" in r.json()["error"]["message"]


def test_a_tenant_limit_holds_across_workers_with_openai_headers(proxy: Proxy, engine_on: q.QuotaEngine) -> None:
    """SPEC 25.2/25.3: end_user:bob (from the OpenAI user field) may send 5 a minute; 12 at
    once are 5 served and 7 refused naming the tenant and the limit; every answer carries
    OpenAI's x-ratelimit-* headers for bob's tightest limits, the provider's under the
    llm_provider- prefix."""
    responses = post_many(proxy, [{"model": "tenant", "messages": MESSAGES, "user": "bob"}] * 12)
    assert Counter(r.status_code for r in responses) == {200: 5, 429: 7}, proxy.proxy.output()
    for r in responses:
        h = r.headers
        assert h["x-ratelimit-limit-requests"] == "5"
        assert h["x-ratelimit-limit-tokens"] == "10000"
        assert 0 <= int(h["x-ratelimit-remaining-requests"]) <= 5
        assert 0 <= int(h["x-ratelimit-remaining-tokens"]) < 10_000
        assert RESET.match(h["x-ratelimit-reset-requests"]) and RESET.match(h["x-ratelimit-reset-tokens"])
        if r.status_code == 429:
            assert h["x-ratelimit-remaining-requests"] == "0"
            assert 1 <= int(h["retry-after"]) <= 60
            message = r.json()["error"]["message"]
            assert "'end_user:bob'" in message and "limit 5 requests per minute" in message
        else:
            assert h["llm_provider-x-ratelimit-limit-requests"] == "30"  # the provider's own
    settle(lambda: engine_on.tenant_usage("end_user:bob")["requests/minute"]["in_flight"] == 0)
    assert engine_on.tenant_usage("end_user:bob")["requests/minute"]["used"] == 5
    # A tag is a tenant too: one request a minute for "batch", whoever sends it.
    tagged = [{"model": "tenant", "messages": MESSAGES, "user": u, "metadata": {"tags": ["batch"]}} for u in "xy"]
    assert sorted(r.status_code for r in post_many(proxy, tagged)) == [200, 429]
    # Without tenant limits, no header of ours: the provider's stay.
    (plain,) = post_many(proxy, [{"model": "tenant", "messages": MESSAGES, "user": "dora"}])
    assert plain.status_code == 200 and plain.headers["x-ratelimit-limit-requests"] == "30"


def test_a_stream_ends_its_lease_at_the_logged_success_with_real_usage(proxy: Proxy, engine_on: q.QuotaEngine) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=MASTER_KEY)
    raw = client.chat.completions.with_raw_response.create(
        model="stream", messages=MESSAGES, user="carol", stream=True, stream_options={"include_usage": True}
    )
    assert raw.headers["x-ratelimit-limit-tokens"] == "1000"
    text = "".join((c.choices[0].delta.content or "") for c in raw.parse() if c.choices)
    assert text == "hi"
    route = ("openai", "ok-s", qel.credential_key_id("openai", "sk-s"))
    settle(lambda: engine_on.usage(*route)["in_flight"] == 0 and engine_on.usage(*route)["rpm"]["used"] == 1)
    assert engine_on.usage(*route)["tpm"]["used"] == 20  # the stream's usage, not the estimate
    assert engine_on.tenant_usage("end_user:carol")["tokens/minute"] == {"used": 20, "limit": 1000, "in_flight": 0}


def test_a_providers_429_is_learned_through_the_proxy(proxy: Proxy, engine_on: q.QuotaEngine) -> None:
    """Groq's 429 (its body states the limit, Retry-After 8 s) benches the deployment in
    the shared engine: the next request is refused without calling the provider."""
    (first,) = post_many(proxy, [{"model": "groq", "messages": MESSAGES}])
    assert first.status_code == 429
    route = ("openai", "groq-429", qel.credential_key_id("openai", "sk-groq"))
    settle(lambda: engine_on.cooldown(*route) is not None)
    cd = engine_on.cooldown(*route)
    assert cd is not None and cd.source == "authoritative"
    assert engine_on.model_limits("openai", "groq-429").tpm == 6000  # type: ignore[union-attr]
    sent = proxy.providers.total("groq-429")
    (second,) = post_many(proxy, [{"model": "groq", "messages": MESSAGES}])
    assert second.status_code == 429 and "quotaengine" in second.json()["error"]["message"]
    assert 1 <= int(second.headers["retry-after"]) <= 9
    assert proxy.providers.total("groq-429") == sent
