"""SPEC 16: `Lease.observe`, with the real openai, anthropic, httpx and requests packages
talking to a real local server that answers like the providers (tests/support/provider_server.py),
on both backends. Asserted: what lands in the engine (the cooldown and its source, the
learned limit, the quota state, the recorded tokens)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import quotaengine as q
import requests
from provider_server import ProviderServer

P, M, K = "groq", "llama-3.3-70b-versatile", 1
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as s:
        yield s


@pytest.fixture
def e(store: str, server: ProviderServer) -> Iterator[q.QuotaEngine]:
    server.reset()
    with q.QuotaEngine(store, env={}) as engine:
        yield engine


CLIENTS: list[openai.OpenAI | anthropic.Anthropic] = []


@pytest.fixture(autouse=True)
def close_clients() -> Iterator[None]:
    yield
    while CLIENTS:
        CLIENTS.pop().close()


def oai(server: ProviderServer, **kw: object) -> openai.OpenAI:
    retries = kw.pop("max_retries", 0)
    c = openai.OpenAI(api_key="k", base_url=server.url + "/v1", max_retries=retries, **kw)  # type: ignore[arg-type]
    CLIENTS.append(c)
    return c


def claude(server: ProviderServer) -> anthropic.Anthropic:
    c = anthropic.Anthropic(api_key="k", base_url=server.url, max_retries=0)
    CLIENTS.append(c)
    return c


def tokens_of(
    e: q.QuotaEngine, platform: str = P, key: int = K
) -> list[tuple[int, int | None, int | None, int | None]]:
    return [
        (r["tokens"], r["input_tokens"], r["output_tokens"], r["cached_tokens"])
        for r in e.usage_events(platform=platform, key_id=key)
        if r["kind"] == "tokens"
    ]


def requests_of(e: q.QuotaEngine, platform: str = P, key: int = K) -> int:
    return sum(1 for r in e.usage_events(platform=platform, key_id=key) if r["kind"] == "request")


def state(e: q.QuotaEngine, platform: str, metric: str) -> q.QuotaState:
    return next(s for s in e.quota_state() if s.platform == platform and s.metric == metric)


def cooldown(e: q.QuotaEngine, platform: str = P, model: str = M, key: int = K) -> tuple[int, str] | None:
    c = e.cooldown(platform, model, key)
    return None if c is None else (c.expires_at_ms - c.set_at_ms, c.source)


# ------------------------------------------------------------------ HTTP responses


def test_openai_raw_response_200(e: q.QuotaEngine, server: ProviderServer) -> None:
    lease = e.lease(P, M, K, 500)
    raw = oai(server).chat.completions.with_raw_response.create(model="ok", messages=[{"role": "user", "content": "x"}])
    assert lease.observe(raw) is None
    assert lease.done
    assert tokens_of(e) == [(150, 120, 30, 100)]
    assert requests_of(e) == 1
    s = state(e, P, "tokens")
    assert (s.limit, s.remaining) == (6000, 5850)
    assert e.usage(P, M, K)["in_flight"] == 0


def test_openai_parsed_completion_and_a_dict(e: q.QuotaEngine, server: ProviderServer) -> None:
    completion = oai(server).chat.completions.create(model="ok", messages=[{"role": "user", "content": "x"}])
    e.lease(P, M, K, 500).observe(completion)
    e.lease(P, M, K, 500).observe({"usage": {"prompt_tokens": 7, "completion_tokens": 3}})
    e.lease(P, M, K, 500).observe(completion, tokens=999)  # tokens= overrides the total
    assert tokens_of(e) == [(150, 120, 30, 100), (10, 7, 3, None), (999, 120, 30, 100)]


def test_openai_status_error_groq_429(e: q.QuotaEngine, server: ProviderServer) -> None:
    lease = e.lease(P, M, K, 500)
    with pytest.raises(openai.RateLimitError) as exc:
        oai(server).chat.completions.create(model="groq-429", messages=[{"role": "user", "content": "x"}])
    out = lease.observe(exc.value)
    assert out is not None and out.kind == "rate_limit"
    # The first transient bench believes the 8 s Retry-After (SPEC 15.2).
    assert (out.cooldown.duration_ms, out.cooldown.source) == (8_000, "authoritative")  # type: ignore[union-attr]
    assert cooldown(e) == (8_000, "authoritative")
    assert out.learned is not None and (out.learned.kind, out.learned.limit) == ("tpm", 6000)
    assert state(e, P, "tokens").remaining == 550  # the error response's headers
    assert requests_of(e) == 0  # a failure records no usage
    assert e.usage(P, M, K)["in_flight"] == 0


def test_anthropic_raw_200_counts_cache_reads_as_input(e: q.QuotaEngine, server: ProviderServer) -> None:
    lease = e.lease("anthropic", "claude-sonnet-4", 2, 500)
    raw = claude(server).messages.with_raw_response.create(
        model="ok", max_tokens=50, messages=[{"role": "user", "content": "x"}]
    )
    assert lease.observe(raw) is None
    assert tokens_of(e, "anthropic", 2) == [(260, 220, 40, 200)]
    assert state(e, "anthropic", "output_tokens").limit == 8000
    assert state(e, "anthropic", "input_tokens").remaining == 39000


def test_anthropic_429(e: q.QuotaEngine, server: ProviderServer) -> None:
    lease = e.lease("anthropic", "claude-sonnet-4", 2, 500)
    with pytest.raises(anthropic.RateLimitError) as exc:
        claude(server).messages.create(
            model="anthropic-429", max_tokens=50, messages=[{"role": "user", "content": "x"}]
        )
    out = lease.observe(exc.value)
    assert out is not None and out.kind == "rate_limit"
    assert cooldown(e, "anthropic", "claude-sonnet-4", 2) == (20_000, "authoritative")
    assert state(e, "anthropic", "requests").remaining == 0


def test_402_and_503(e: q.QuotaEngine, server: ProviderServer) -> None:
    lease = e.lease("openrouter", "m", 3)
    with pytest.raises(openai.APIStatusError) as exc:
        oai(server).chat.completions.create(model="402", messages=[])
    out = lease.observe(exc.value)
    assert out is not None and out.kind == "payment"
    assert cooldown(e, "openrouter", "m", 3) == (86_400_000, "credit")
    lease = e.lease(P, M, K)
    with pytest.raises(openai.InternalServerError) as exc2:
        oai(server).chat.completions.create(model="503", messages=[])
    out = lease.observe(exc2.value)
    assert out is not None and out.kind == "server_error"
    assert cooldown(e) is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_connection_refused_and_read_timeout(e: q.QuotaEngine, server: ProviderServer) -> None:
    lease = e.lease(P, M, K)
    dead = openai.OpenAI(api_key="k", base_url=f"http://127.0.0.1:{free_port()}/v1", max_retries=0)
    CLIENTS.append(dead)
    with pytest.raises(openai.APIConnectionError) as exc:
        dead.chat.completions.create(model="ok", messages=[])
    out = lease.observe(exc.value)
    assert out is not None and out.kind == "transport"
    assert cooldown(e) == (90_000, "heuristic")
    lease = e.lease(P, M, 2)
    with pytest.raises(openai.APITimeoutError) as exc2:
        oai(server, timeout=0.3).chat.completions.create(model="slow", messages=[])
    out = lease.observe(exc2.value)
    assert out is not None and out.kind == "timeout"
    assert e.cooldown(P, M, 2) is not None


def test_httpx_responses_and_status_error(e: q.QuotaEngine, server: ProviderServer) -> None:
    with httpx.Client(base_url=server.url) as client:
        r = client.post("/v1/chat/completions", json={"model": "ok"})
        e.lease(P, M, K, 500).observe(r)
        r = client.post("/v1/chat/completions", json={"model": "groq-429"})
        with pytest.raises(httpx.HTTPStatusError) as exc:
            r.raise_for_status()
        out = e.lease(P, M, 2).observe(exc.value)
        assert out is not None and out.kind == "rate_limit"
        with pytest.raises(httpx.ConnectError) as exc2:
            httpx.post(f"http://127.0.0.1:{free_port()}/v1/chat/completions", json={})
        out = e.lease(P, M, 3).observe(exc2.value)
        assert out is not None and out.kind == "transport"
        with pytest.raises(httpx.ReadTimeout) as exc3:
            client.post("/v1/chat/completions", json={"model": "slow"}, timeout=0.3)
        out = e.lease(P, M, 4).observe(exc3.value)
        assert out is not None and out.kind == "timeout"
    assert tokens_of(e) == [(150, 120, 30, 100)]
    assert e.cooldown(P, M, 2) is not None


def test_requests_responses(e: q.QuotaEngine, server: ProviderServer) -> None:
    r = requests.post(server.url + "/v1/messages", json={"model": "ok"}, timeout=5)
    e.lease("anthropic", "claude-sonnet-4", 2).observe(r)
    assert tokens_of(e, "anthropic", 2) == [(260, 220, 40, 200)]
    r = requests.post(server.url + "/v1/chat/completions", json={"model": "groq-429"}, timeout=5)
    out = e.lease(P, M, K).observe(r)
    assert out is not None and out.kind == "rate_limit" and out.learned is not None
    with pytest.raises(requests.ConnectionError) as exc:
        requests.post(f"http://127.0.0.1:{free_port()}/", timeout=5)
    out = e.lease(P, M, 5).observe(exc.value)
    assert out is not None and out.kind == "transport"


def test_bodies_without_usage_record_the_estimate(e: q.QuotaEngine, server: ProviderServer) -> None:
    for model in ("no-usage", "not-json"):
        r = requests.post(server.url + "/v1/chat/completions", json={"model": model}, timeout=5)
        e.lease(P, M, K, 321).observe(r)
    # SPEC 23.1: the estimate with its split (E - Eo input, Eo output), so it costs its
    # reservation.
    assert tokens_of(e) == [(321, 321, 0, None), (321, 321, 0, None)]
    r = requests.post(server.url + "/v1/chat/completions", json={"model": "no-usage"}, timeout=5)
    e.lease(P, M, K, 321).observe(r, tokens=50)
    assert tokens_of(e)[-1] == (50, None, None, None)


def test_a_two_megabyte_error_body_is_read_only_as_far_as_the_parsers_go(
    e: q.QuotaEngine, server: ProviderServer
) -> None:
    r = requests.post(server.url + "/v1/chat/completions", json={"model": "huge-429"}, timeout=5)
    out = e.lease(P, M, K).observe(r)
    assert out is not None and out.kind == "rate_limit"
    assert out.learned is None  # the limit sits past the 1 MiB read
    assert e.model_limits(P, M) is None


def test_anything_else_is_a_type_error_and_the_lease_stays_live(e: q.QuotaEngine) -> None:
    lease = e.lease(P, M, K)
    for junk in (None, 42, "200 OK", object(), {"status": 200}):
        with pytest.raises(TypeError):
            lease.observe(junk)
    with pytest.raises(TypeError):
        lease.observe({"usage": {}}, tokens="5")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        lease.observe({"usage": {}}, tokens=-1)
    assert not lease.done and e.usage(P, M, K)["in_flight"] == 1
    lease.release()
    assert e.usage(P, M, K)["in_flight"] == 0


def test_sdk_retries_left_on_still_record_the_final_outcome_once(e: q.QuotaEngine, server: ProviderServer) -> None:
    """A client with max_retries=2 retries the two 429s itself; observe sees the final 200
    and records one request. (The README says to set max_retries=0 behind the engine.)"""
    lease = e.lease(P, M, K, 500)
    raw = oai(server, max_retries=2).chat.completions.with_raw_response.create(
        model="flaky", messages=[{"role": "user", "content": "x"}]
    )
    lease.observe(raw)
    assert server.hits["flaky"] == 3
    assert requests_of(e) == 1
    assert tokens_of(e) == [(150, 120, 30, 100)]
    assert cooldown(e) is None


def test_async_openai_inside_lease_any_async(e: q.QuotaEngine, server: ProviderServer) -> None:
    routes = [(P, M, K), (P, M, 2)]

    async def main() -> list[int]:
        client = openai.AsyncOpenAI(api_key="k", base_url=server.url + "/v1", max_retries=0)
        used = []
        for model in ("ok", "groq-429", "ok"):
            async with await e.lease_any_async(routes, 500, strategy="order") as lease:
                used.append(lease.key_id)
                try:
                    raw = await client.chat.completions.with_raw_response.create(
                        model=model, messages=[{"role": "user", "content": "x"}]
                    )
                except openai.APIStatusError as exc:
                    lease.observe(exc)
                    continue
                lease.observe(raw)
        await client.close()
        return used

    assert asyncio.run(main()) == [K, K, 2]  # the 429 benched key 1, the third went to key 2
    assert tokens_of(e, P, K) == [(150, 120, 30, 100)]
    assert tokens_of(e, P, 2) == [(150, 120, 30, 100)]


def test_the_example_router_runs(server: ProviderServer, tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "router.py"), server.url, str(tmp_path / "quota.db")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "served 6 of 6" in r.stdout, r.stdout


def test_a_streamed_response_is_observed_without_reading_its_body(e: q.QuotaEngine, server: ProviderServer) -> None:
    with httpx.Client(base_url=server.url) as client:
        with client.stream("POST", "/v1/chat/completions", json={"model": "ok"}) as r:
            e.lease(P, M, K, 500).observe(r, tokens=77)  # the body is not read
            assert not r.is_stream_consumed
        with client.stream("POST", "/v1/chat/completions", json={"model": "ok"}) as r:
            lease = e.lease(P, M, K, 500)
            chunks = list(r.iter_bytes())
            assert chunks
            # after the stream: the final chunk's usage object
            lease.observe({"usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}})
    assert tokens_of(e) == [(77, None, None, None), (13, 9, 4, None)]
    assert state(e, P, "tokens").remaining == 5850  # the headers are read all the same
