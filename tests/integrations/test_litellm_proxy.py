"""SPEC 25 against the real LiteLLM proxy: ``litellm --config`` with the one config line,
no database, in front of a local server that answers as the providers do; real HTTP
clients (httpx for the headers, the openai SDK for a stream). Per backend, two proxies on
one engine (each takes seconds to start; both start at once): on a SQLite file, A with two
gunicorn workers (``--run_gunicorn``) and B with two uvicorn workers; on Redis, A with two
uvicorn workers (``--num_workers 2`` alone) and B with two gunicorn workers. A
authenticates with LiteLLM's own master key check; B with a ``custom_auth``
(tests/support/litellm_custom_auth.py) that gives the proxy virtual keys with aliases,
teams, organisations and users without a database, and cancels a call whose client
disconnects (``cancel_on_disconnect``)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
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


SUPPORT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support")
PROVIDER_KEYS = [
    "sk-e0",
    "sk-e1",
    "sk-e2",
    "sk-t",
    "sk-k",
    "sk-s",
    "sk-groq",
    "sk-slow-a",
    "sk-slow-b",
    "sk-ss",
    "sk-shared",
]
ALPHA, BETA = "sk-vk-alpha", "sk-vk-beta"  # tests/support/litellm_custom_auth.py's virtual keys


class Proxy:
    def __init__(self, proxy: LiteLLMProxy, other: LiteLLMProxy, providers: LiteLLMProviders, db: str) -> None:
        self.proxy, self.other, self.providers, self.db = proxy, other, providers, db
        self.url, self.url_b = proxy.url, other.url


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
        e.set_tenant_limits("end_user:erin", [q.Limit("requests", 6, "minute")])
        e.set_tenant_limits("end_user:frank", [q.Limit("requests", 50, "minute")])
        e.set_tenant_limits("end_user:kiri", [q.Limit("requests", 50, "day")], tz="Pacific/Kiritimati")
        e.set_tenant_limits("tag:batch", [q.Limit("requests", 1, "minute")])
        e.set_tenant_limits("vip", [q.Limit("requests", 1, "minute")])
        e.set_tenant_limits("key:alpha", [q.Limit("requests", 4, "minute")])
        e.set_tenant_limits("team:red", [q.Limit("requests", 6, "minute")])
        for pattern in ("key:*", "org:*", "user:*"):  # to read their usage
            e.set_tenant_limits(pattern, [q.Limit("requests", 1000, "minute")])
    with LiteLLMProviders() as server:
        config: dict[str, Any] = {
            "model_list": [
                *(dep(server, "exact", f"ok-e{i}", f"sk-e{i}", rpm=4) for i in range(3)),
                dep(server, "tenant", "ok-t", "sk-t"),
                dep(server, "keys", "ok-k", "sk-k"),
                dep(server, "stream", "ok-s", "sk-s"),
                dep(server, "groq", "groq-429", "sk-groq"),
                dep(server, "slow-a", "slow", "sk-slow-a"),
                dep(server, "slow-b", "slow", "sk-slow-b"),
                dep(server, "slow-stream", "slow-stream", "sk-ss"),
                # SPEC 25.1: two models on one key, one concurrency cap (imported from the first).
                dep(server, "shared-1", "slow-stream", "sk-shared", max_parallel_requests=1),
                dep(server, "shared-2", "ok-2", "sk-shared"),
            ],
            "router_settings": {"num_retries": 0},
            # SPEC 25.3: the one line.
            "litellm_settings": {"callbacks": ["quotaengine.litellm.proxy_handler"]},
        }
        other_dir = tmp_path_factory.mktemp("proxy-b")
        shutil.copy(os.path.join(SUPPORT, "litellm_custom_auth.py"), other_dir)  # found next to the config
        other_config = {
            **config,
            "general_settings": {
                "custom_auth": "litellm_custom_auth.user_api_key_auth",
                "cancel_on_disconnect": True,
            },
        }
        gunicorn = request.param == "sqlite"
        env = {"QUOTAENGINE_DB": db}
        p = LiteLLMProxy(workdir, config, env, workers=2, gunicorn=gunicorn, start_timeout_s=150, wait=False)
        b = LiteLLMProxy(
            other_dir, other_config, env, workers=2, gunicorn=not gunicorn, start_timeout_s=150, wait=False
        )
        try:
            p.wait_ready()
            b.wait_ready()
            yield Proxy(p, b, server, db)
        finally:
            p.kill()
            b.kill()


@pytest.fixture
def engine_on(proxy: Proxy) -> Iterator[q.QuotaEngine]:
    e = q.QuotaEngine(proxy.db, env={})
    yield e
    e.close()


def no_provider_key(headers: httpx.Headers) -> None:
    """SPEC 25.3: no header reveals a provider key."""
    for name, value in headers.items():
        assert not any(k in value for k in PROVIDER_KEYS), (name, value)


def post_many(
    proxy: Proxy, bodies: list[dict[str, Any]], *, urls: list[str] | None = None, key: str = MASTER_KEY
) -> list[httpx.Response]:
    """All at once; the i-th body to ``urls[i % len(urls)]`` (proxy A by default)."""
    urls = urls or [proxy.url]

    async def main() -> list[httpx.Response]:
        headers = {"authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(timeout=60, headers=headers) as c:
            posts = (c.post(f"{urls[i % len(urls)]}/v1/chat/completions", json=b) for i, b in enumerate(bodies))
            return await asyncio.gather(*posts)

    responses = asyncio.run(main())
    for r in responses:
        no_provider_key(r.headers)
    return responses


def settle(cond: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("the proxy never logged the outcome")
        time.sleep(0.05)


def refused_by(r: httpx.Response, tenant: str, limit: str) -> None:
    """A tenant's refusal: 429, retry-after in whole seconds, the message naming the tenant
    and its limit, and the rate-limit headers of the tightest limits (none left)."""
    assert r.status_code == 429, r.text
    assert re.fullmatch(r"\d+", r.headers["retry-after"]) and 1 <= int(r.headers["retry-after"]) <= 60
    message = r.json()["error"]["message"]
    assert f"'{tenant}'" in message and limit in message, message
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    assert RESET.match(r.headers["x-ratelimit-reset-requests"])


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
    # A daily limit declared in a zone resets at that zone's midnight (UTC+14, no DST).
    before = int(time.time())
    (kiri,) = post_many(proxy, [{"model": "tenant", "messages": MESSAGES, "user": "kiri"}])
    after = int(time.time()) + 1
    h, m, sec = (
        int(x or 0)
        for x in re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(\d+)s", kiri.headers["x-ratelimit-reset-requests"]).groups()
    )  # type: ignore[union-attr]
    to_local_midnight = [(-(t + 14 * 3600)) % 86_400 for t in (after, before)]
    assert to_local_midnight[0] <= h * 3600 + m * 60 + sec <= to_local_midnight[1] + 1, kiri.headers
    # Tenants named by the caller in metadata.quotaengine_tenants.
    vip = [{"model": "tenant", "messages": MESSAGES, "metadata": {"quotaengine_tenants": ["vip"]}}] * 2
    vip_answers = post_many(proxy, vip)
    assert sorted(r.status_code for r in vip_answers) == [200, 429]
    refused_by(next(r for r in vip_answers if r.status_code == 429), "vip", "limit 1 requests per minute")
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
    no_provider_key(raw.headers)
    text = "".join((c.choices[0].delta.content or "") for c in raw.parse() if c.choices)
    assert text == "hi"
    route = ("openai", "ok-s", qel.credential_key_id("openai", "sk-s"))
    settle(lambda: engine_on.usage(*route)["in_flight"] == 0 and engine_on.usage(*route)["rpm"]["used"] == 1)
    assert engine_on.usage(*route)["tpm"]["used"] == 20  # the stream's usage, not the estimate
    assert engine_on.tenant_usage("end_user:carol")["tokens/minute"] == {"used": 20, "limit": 1000, "in_flight": 0}


def test_a_providers_429_is_learned_through_the_proxy(proxy: Proxy, engine_on: q.QuotaEngine) -> None:
    """Groq's 429 (its body states the limit, Retry-After 8 s) benches the deployment in
    the shared engine: the next request is refused without calling the provider."""
    (first,) = post_many(proxy, [{"model": "groq", "messages": MESSAGES, "user": "frank"}])
    assert first.status_code == 429
    # A failure carries the tenant's headers too.
    assert first.headers["x-ratelimit-limit-requests"] == "50"
    route = ("openai", "groq-429", qel.credential_key_id("openai", "sk-groq"))
    settle(lambda: engine_on.cooldown(*route) is not None)
    cd = engine_on.cooldown(*route)
    assert cd is not None and cd.source == "authoritative"
    assert engine_on.model_limits("openai", "groq-429").tpm == 6000  # type: ignore[union-attr]
    sent = proxy.providers.total("groq-429")
    (second,) = post_many(proxy, [{"model": "groq", "messages": MESSAGES, "user": "frank"}])
    assert second.status_code == 429 and "quotaengine" in second.json()["error"]["message"]
    assert re.fullmatch(r"\d+", second.headers["retry-after"]) and 1 <= int(second.headers["retry-after"]) <= 9
    assert second.headers["x-ratelimit-limit-requests"] == "50"  # a refusal: the same headers
    assert proxy.providers.total("groq-429") == sent


def test_the_keys_tenants_hold_across_two_workers_and_the_master_key_names_none(
    proxy: Proxy, engine_on: q.QuotaEngine
) -> None:
    """SPEC 25.2: proxy B's virtual keys (custom_auth) name ``key:<alias, else the hashed
    key>``, ``team:``, ``org:``, ``user:``; ``key:alpha`` may send 4 a minute and team
    ``red`` 6, across B's two workers: 10 at once from alpha are 4 served, then 10 from
    beta (same team, no alias) are the team's 2 left. The master key, through LiteLLM's
    own check (A) and through the custom auth (B), names no tenant."""
    body = {"model": "keys", "messages": MESSAGES}
    alpha = post_many(proxy, [body] * 10, urls=[proxy.url_b], key=ALPHA)
    assert Counter(r.status_code for r in alpha) == {200: 4, 429: 6}, proxy.other.output()
    for r in alpha:
        assert r.headers["x-ratelimit-limit-requests"] == "4"  # key:alpha's, the tightest
        if r.status_code == 429:
            refused_by(r, "key:alpha", "limit 4 requests per minute")
    beta = post_many(proxy, [body] * 10, urls=[proxy.url_b], key=BETA)
    assert Counter(r.status_code for r in beta) == {200: 2, 429: 8}, proxy.other.output()
    for r in beta:
        assert r.headers["x-ratelimit-limit-requests"] == "6"
        if r.status_code == 429:
            refused_by(r, "team:red", "limit 6 requests per minute")
    assert proxy.providers.count("ok-k", 200) == 6
    for url in (proxy.url, proxy.url_b):  # the master key: no tenant, no header of ours
        (r,) = post_many(proxy, [{"model": "tenant", "messages": MESSAGES}], urls=[url])
        assert r.status_code == 200 and r.headers["x-ratelimit-limit-requests"] == "30"  # the provider's
    hashed = "key:" + hashlib.sha256(BETA.encode()).hexdigest()
    want = {"key:alpha": 4, hashed: 2, "team:red": 6, "org:acme": 4, "user:ann": 4, "user:ben": 2}
    settle(lambda: all(engine_on.tenant_usage(t)["requests/minute"]["in_flight"] == 0 for t in want))
    assert {t: engine_on.tenant_usage(t)["requests/minute"]["used"] for t in want} == want
    named = {t for t in engine_on.tenants() if t.startswith(("key:", "team:", "org:", "user:"))}
    assert named == set(want)  # nothing for the master key, its hash or default_user_id
    assert not any(ALPHA in t or BETA in t or MASTER_KEY in t for t in engine_on.tenants())


def test_two_proxies_on_one_engine_are_one_engine(proxy: Proxy, engine_on: q.QuotaEngine) -> None:
    """SPEC 25.3: several proxies on one file or one Redis are one engine: end_user:erin's
    6 a minute admits 6 of 16 sent at once to A and B (two workers each)."""
    responses = post_many(
        proxy, [{"model": "tenant", "messages": MESSAGES, "user": "erin"}] * 16, urls=[proxy.url, proxy.url_b]
    )
    assert Counter(r.status_code for r in responses) == {200: 6, 429: 10}, proxy.other.output()
    for r in responses:
        assert r.headers["x-ratelimit-limit-requests"] == "6"
        if r.status_code == 429:
            refused_by(r, "end_user:erin", "limit 6 requests per minute")
    settle(lambda: engine_on.tenant_usage("end_user:erin")["requests/minute"]["in_flight"] == 0)
    assert engine_on.tenant_usage("end_user:erin")["requests/minute"]["used"] == 6


def test_a_client_that_disconnects_ends_its_lease(proxy: Proxy, engine_on: q.QuotaEngine) -> None:
    """A client closing its socket mid-request never leaves a lease behind until its max
    age: on A (LiteLLM's default) the call goes on and its lease ends at the provider's
    answer with the real usage; on B (``cancel_on_disconnect``) the call is cancelled and
    its lease ends at once with the estimate (SPEC 18.4); a stream whose client leaves
    after the first chunk ends its lease then, with what was streamed (not the full usage)."""

    routes = {
        name: ("openai", model, qel.credential_key_id("openai", key))
        for name, model, key in (("a", "slow", "sk-slow-a"), ("b", "slow", "sk-slow-b"), ("s", "slow-stream", "sk-ss"))
    }

    async def give_up(url: str, model: str, route: tuple[str, str, int]) -> None:
        async with httpx.AsyncClient(timeout=30, headers=AUTH) as c:
            post = asyncio.ensure_future(
                c.post(f"{url}/v1/chat/completions", json={"model": model, "messages": MESSAGES})
            )
            while engine_on.usage(*route)["in_flight"] == 0:  # leased: the call is on its way
                assert not post.done(), post.result()
                await asyncio.sleep(0.02)
            post.cancel()  # and close the connection while the provider takes its 3 s
            with pytest.raises(asyncio.CancelledError):
                await post

    async def first_chunk(url: str) -> None:
        body = {"model": "slow-stream", "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}}
        async with httpx.AsyncClient(timeout=30, headers=AUTH) as c:
            async with c.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    break  # and close the connection

    async def main() -> None:
        await asyncio.wait_for(
            asyncio.gather(
                give_up(proxy.url, "slow-a", routes["a"]),
                give_up(proxy.url_b, "slow-b", routes["b"]),
                first_chunk(proxy.url),
            ),
            30,
        )

    asyncio.run(main())
    for route in routes.values():
        settle(lambda route=route: engine_on.usage(*route)["in_flight"] == 0, timeout_s=20)
    used = {
        name: (engine_on.usage(*r)["rpm"]["used"], engine_on.usage(*r)["tpm"]["used"]) for name, r in routes.items()
    }
    assert used["a"] == (1, 20), used  # the provider's answer, after the client left
    assert used["b"][0] == 1 and used["b"][1] != 20, used  # cancelled: the estimate
    assert used["s"][0] == 1 and used["s"][1] < 20, used  # the part streamed


def test_two_models_on_one_key_are_one_key_across_workers(proxy: Proxy, engine_on: q.QuotaEngine) -> None:
    """SPEC 25.1 in the proxy: shared-1 and shared-2 are two models on one provider key, so
    they share its one concurrency slot (``max_parallel_requests: 1`` of the first): while
    a stream on shared-1 is open, shared-2 is refused; once it is closed, served."""
    shared = qel.credential_key_id("openai", "sk-shared")
    body = {"model": "shared-1", "messages": MESSAGES, "stream": True}

    async def main() -> None:
        async with httpx.AsyncClient(timeout=30, headers=AUTH) as c:
            async with c.stream("POST", f"{proxy.url}/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                async for _ in r.aiter_bytes():
                    break  # the first chunk: the stream holds the key's slot
                assert engine_on.usage("openai", "slow-stream", shared)["in_flight"] == 1
                other = await c.post(
                    f"{proxy.url_b}/v1/chat/completions", json={"model": "shared-2", "messages": MESSAGES}
                )
                assert other.status_code == 429 and "key_concurrency" in other.json()["error"]["message"], other.text

    asyncio.run(main())
    assert engine_on.key_concurrency_cap("openai", shared) == 1
    settle(lambda: engine_on.usage("openai", "slow-stream", shared)["in_flight"] == 0)
    (served,) = post_many(proxy, [{"model": "shared-2", "messages": MESSAGES}], urls=[proxy.url_b])
    assert served.status_code == 200


def test_the_environment_sets_the_handlers_options_in_the_real_proxy(
    proxy: Proxy, engine_on: q.QuotaEngine, tmp_path: Any
) -> None:
    """SPEC 25.3: ``QUOTAENGINE_TENANTS``, ``_HEADERS``, ``_STRATEGY`` and ``_WAIT_S`` set the
    one-line handler's options. A third proxy (one worker) on the module's engine, with
    tenants and headers off, strategy ``order`` and a wait of 20 s, in front of a provider
    server of its own:

    * tenants off: ``user="quiet"`` names no tenant, so end_user:quiet's 1 a minute does
      not refuse 3 requests; the default proxy A then counts quiet's first request and
      refuses the second (nothing was counted before);
    * headers off: the rate-limit headers are the provider's (A answers with quiet's);
    * ``order``: the first deployment (rpm 2) takes 2 of 3 requests sent at once where
      ``headroom`` would give all 3 to the second (rpm 100, more room);
    * the wait: a request made while the only deployment's one slot
      (``max_parallel_requests: 1``) is held by a 3 s call is served after it, where the
      default wait (0) refuses it at once."""
    engine_on.set_tenant_limits("end_user:quiet", [q.Limit("requests", 1, "minute")])
    with LiteLLMProviders() as server:
        config: dict[str, Any] = {
            "model_list": [
                dep(server, "plain", "ok-p", "sk-env-p"),
                dep(server, "ordered", "ok-o1", "sk-env-o1", rpm=2),
                dep(server, "ordered", "ok-o2", "sk-env-o2", rpm=100),
                dep(server, "held", "slow", "sk-env-held", max_parallel_requests=1),
            ],
            "router_settings": {"num_retries": 0},
            "litellm_settings": {"callbacks": ["quotaengine.litellm.proxy_handler"]},
        }
        env = {
            "QUOTAENGINE_DB": proxy.db,
            "QUOTAENGINE_TENANTS": "0",
            "QUOTAENGINE_HEADERS": "0",
            "QUOTAENGINE_STRATEGY": "order",
            "QUOTAENGINE_WAIT_S": "20",
        }
        p = LiteLLMProxy(tmp_path, config, env, workers=1, start_timeout_s=150)
        try:
            env_proxy = Proxy(p, p, server, proxy.db)
            # Tenants off: 3 served; headers off: the provider's headers, not quiet's.
            quiet = post_many(env_proxy, [{"model": "plain", "messages": MESSAGES, "user": "quiet"}] * 3)
            assert [r.status_code for r in quiet] == [200] * 3, p.output()
            for r in quiet:  # LiteLLM passes the provider's limit and remaining, not its reset
                assert r.headers["x-ratelimit-limit-requests"] == "30"
                assert r.headers["x-ratelimit-remaining-requests"] == "29"
                assert "x-ratelimit-reset-requests" not in r.headers, r.headers
                assert "x-ratelimit-reset-tokens" not in r.headers, r.headers
                assert r.headers["llm_provider-x-ratelimit-reset-requests"] == "2s"
            assert server.count("ok-p", 200) == 3
            assert engine_on.tenant_usage("end_user:quiet")["requests/minute"]["used"] == 0
            # The default proxy (tenants and headers on) on the same engine: quiet's first.
            at_a = post_many(proxy, [{"model": "tenant", "messages": MESSAGES, "user": "quiet"}] * 2)
            assert sorted(r.status_code for r in at_a) == [200, 429], proxy.proxy.output()
            for r in at_a:
                assert r.headers["x-ratelimit-limit-requests"] == "1"  # quiet's, from quotaengine
                assert RESET.match(r.headers["x-ratelimit-reset-requests"])
                if r.status_code == 429:
                    refused_by(r, "end_user:quiet", "limit 1 requests per minute")
            # Strategy order: the first deployment while it has room, then the next.
            ordered = post_many(env_proxy, [{"model": "ordered", "messages": MESSAGES}] * 3)
            assert [r.status_code for r in ordered] == [200] * 3, p.output()
            assert (server.count("ok-o1", 200), server.count("ok-o2", 200)) == (2, 1)
            # The wait: the second request waits for the first's slot instead of a 429.
            route = ("openai", "slow", qel.credential_key_id("openai", "sk-env-held"))

            async def held() -> list[httpx.Response]:
                async with httpx.AsyncClient(timeout=60, headers=AUTH) as c:
                    body = {"model": "held", "messages": MESSAGES}
                    first = asyncio.ensure_future(c.post(f"{p.url}/v1/chat/completions", json=body))
                    while engine_on.usage(*route)["in_flight"] == 0:  # leased: the slot is taken
                        assert not first.done(), first.result().text
                        await asyncio.sleep(0.02)
                    second = await c.post(f"{p.url}/v1/chat/completions", json=body)
                    return [await first, second]

            answers = asyncio.run(held())
            assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
            assert engine_on.key_concurrency_cap("openai", route[2]) == 1
            assert server.count("slow", 200) == 2 and server.total("slow") == 2
        finally:
            p.kill()


def test_a_proxy_on_memory_refuses_to_start_with_a_clear_error(tmp_path: Any) -> None:
    """SPEC 25.3: ``QUOTAENGINE_DB=:memory:`` would give each worker limits of its own: the
    proxy does not start, and says why."""
    config = {
        "model_list": [{"model_name": "ok", "litellm_params": {"model": "openai/ok", "api_key": "sk-x"}}],
        "litellm_settings": {"callbacks": ["quotaengine.litellm.proxy_handler"]},
    }
    with pytest.raises(RuntimeError, match="proxy exited") as refused:
        LiteLLMProxy(tmp_path, config, {"QUOTAENGINE_DB": ":memory:"}, start_timeout_s=150)
    assert "QUOTAENGINE_DB=':memory:': the proxy's workers must share one engine" in str(refused.value)
