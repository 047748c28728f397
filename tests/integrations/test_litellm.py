"""SPEC 20: quotaengine.litellm in the real LiteLLM Router, against a local server that
answers as the providers do, sync and async, streamed and not, on both backends."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import quotaengine as q

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import litellm  # noqa: E402
import quotaengine.litellm as qel  # noqa: E402
from litellm_server import LiteLLMProviders  # noqa: E402

MESSAGES = [{"role": "user", "content": "hello there"}]
# LiteLLM's own warnings (its pydantic types, its deprecations) are not ours to fail on.
pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning:pydantic.*"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
    # LiteLLM makes event loops of its own for callbacks and leaves them open.
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]


@pytest.fixture(scope="module", autouse=True)
def collect_litellm_leftovers() -> Iterator[None]:
    """LiteLLM leaves event loops and sockets of its own open: collect them here, so that
    their ResourceWarnings never land in a later module's test."""
    import gc
    import warnings

    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gc.collect()


@pytest.fixture(scope="module")
def server() -> Iterator[LiteLLMProviders]:
    with LiteLLMProviders() as s:
        yield s


@pytest.fixture
def live_engine(store: str) -> Iterator[q.QuotaEngine]:
    """An engine on the real clock (LiteLLM's calls take real time)."""
    e = q.QuotaEngine(store, env={})
    yield e
    e.close()


def deployment(server: LiteLLMProviders, group: str, model: str, dep_id: str, key_id: int, **params: Any) -> dict:
    return {
        "model_name": group,
        "litellm_params": {"model": f"openai/{model}", "api_base": server.url, "api_key": f"sk-{dep_id}", **params},
        "model_info": {"id": dep_id, "quotaengine": {"platform": "local", "key_id": key_id}},
    }


def router(model_list: list[dict], **kw: Any) -> litellm.Router:
    return litellm.Router(model_list=model_list, num_retries=kw.pop("num_retries", 0), **kw)


def in_flight(e: q.QuotaEngine, route: tuple[str, str, int]) -> int:
    n: int = e.usage(*route)["in_flight"]
    return n


def settle(cond: Any, timeout_s: float = 5.0) -> None:
    """LiteLLM logs outcomes on its own threads and tasks: wait for what they do."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("LiteLLM never logged the outcome")
        time.sleep(0.01)


# ---- routes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "platform", "model_id"),
    [
        ({"model": "groq/llama-3.1-8b-instant"}, "groq", "llama-3.1-8b-instant"),
        (
            {"model": "openai/llama-3.1-8b-instant", "api_base": "https://api.groq.com/openai/v1"},
            "groq",
            "llama-3.1-8b-instant",
        ),
        ({"model": "gemini/gemini-2.0-flash"}, "google", "gemini-2.0-flash"),
        ({"model": "vertex_ai/gemini-2.0-flash"}, "google", "gemini-2.0-flash"),
        (
            {"model": "openai/gemini-2.0-flash", "api_base": "https://generativelanguage.googleapis.com/v1beta/openai"},
            "google",
            "gemini-2.0-flash",
        ),
        ({"model": "openai/llama3.1-8b", "api_base": "https://api.cerebras.ai/v1"}, "cerebras", "llama3.1-8b"),
        (
            {"model": "openrouter/meta-llama/llama-3.3-70b-instruct:free"},
            "openrouter",
            "meta-llama/llama-3.3-70b-instruct:free",
        ),
        (
            {"model": "openai/meta/llama-3.1-8b-instruct", "api_base": "https://integrate.api.nvidia.com/v1"},
            "nvidia",
            "meta/llama-3.1-8b-instruct",
        ),
        ({"model": "openai/mistral-small", "api_base": "https://api.mistral.ai/v1"}, "mistral", "mistral-small"),
        ({"model": "gpt-4o-mini", "api_base": "https://api.openai.com/v1"}, "openai", "gpt-4o-mini"),
        (
            {"model": "anthropic/claude-sonnet-4", "api_base": "https://api.anthropic.com"},
            "anthropic",
            "claude-sonnet-4",
        ),
        ({"model": "ollama/llama3.2", "api_base": "http://gpu-box:11434"}, "ollama", "llama3.2"),
        ({"model": "openai/ok", "api_base": "http://127.0.0.1:8000/v1"}, "openai", "ok"),
        ({"model": "mistral/mistral-small"}, "mistral", "mistral-small"),
    ],
)
def test_a_route_is_derived_from_provider_and_api_base(params: dict, platform: str, model_id: str) -> None:
    route = qel.derive_route({"litellm_params": params, "model_info": {"id": "dep-1"}})
    assert route[:2] == (platform, model_id)
    assert route[2] == qel.key_id_of("dep-1")


def test_a_derived_key_id_is_stable_across_processes() -> None:
    code = "import quotaengine.litellm as m; print(m.key_id_of('groq-key-7'))"
    out = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()}
    out.add(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip())
    assert out == {str(qel.key_id_of("groq-key-7"))}
    assert 0 <= qel.key_id_of("groq-key-7") < 2**63
    assert qel.key_id_of("groq-key-7") != qel.key_id_of("groq-key-8")


def test_a_derived_key_id_is_the_platform_and_api_key_and_never_reveals_it() -> None:
    """SPEC 25.1: two deployments on one key are one key; another platform or another key
    is another; without an api_key the deployment's id is hashed as in SPEC 20."""

    def dep(model: str, dep_id: str, **params: Any) -> dict:
        return {"litellm_params": {"model": model, **params}, "model_info": {"id": dep_id}}

    a = qel.derive_route(dep("groq/llama-3.1-8b-instant", "a", api_key="gsk_secret"))
    b = qel.derive_route(dep("groq/llama-3.3-70b-versatile", "b", api_key="gsk_secret"))
    c = qel.derive_route(dep("groq/llama-3.3-70b-versatile", "c", api_key="gsk_other"))
    d = qel.derive_route(dep("cerebras/llama3.1-8b", "d", api_key="gsk_secret"))
    assert a[2] == b[2] == qel.credential_key_id("groq", "gsk_secret")
    assert len({a[2], c[2], d[2]}) == 3
    assert 0 <= a[2] < 2**63
    assert qel.derive_route(dep("groq/m", "e"))[2] == qel.key_id_of("e")
    assert qel.derive_route(dep("groq/m", "e", api_key=""))[2] == qel.key_id_of("e")
    # The hash is of the key, not a piece of it: nothing of the key is in its id.
    assert "secret" not in str(a) and "gsk" not in hex(a[2])
    # model_info["quotaengine"] still wins.
    given = dep("groq/m", "f", api_key="gsk_secret")
    given["model_info"]["quotaengine"] = {"platform": "groq", "key_id": 7}
    r = litellm.Router(model_list=[{"model_name": "g", **given}])
    assert qel._route_of(r.get_model_list()[0], {})[0] == ("groq", "m", 7)


def test_two_models_on_one_key_are_one_key_in_the_router(server: LiteLLMProviders, live_engine: q.QuotaEngine) -> None:
    """SPEC 25.1 through the real Router: two deployments (two models) on one api_key share
    one concurrency cap; a third on another key has its own."""
    e = live_engine

    def dep(group: str, model: str, dep_id: str, key: str, **params: Any) -> dict:
        p = {"model": f"openai/{model}", "api_base": server.url, "api_key": key, **params}
        return {"model_name": group, "litellm_params": p, "model_info": {"id": dep_id}}

    ml = [
        dep("one", "ok", "a", "sk-shared", max_parallel_requests=1),
        dep("two", "ok-2", "b", "sk-shared"),
        dep("three", "ok-3", "c", "sk-own"),
    ]
    plugin = qel.install(router(ml), e)
    r = plugin._router
    shared = qel.credential_key_id("openai", "sk-shared")
    assert plugin.route_of("a")[2] == plugin.route_of("b")[2] == shared
    assert e.key_concurrency_cap("openai", shared) == 1
    # A stream on the first model holds the key's one slot while it is read...
    stream = r.completion(model="one", messages=MESSAGES, stream=True, stream_options={"include_usage": True})
    assert in_flight(e, ("openai", "ok", shared)) == 1
    # ...so the other model on the same key is refused; the model on its own key is not.
    with pytest.raises(litellm.RateLimitError) as refused:
        r.completion(model="two", messages=MESSAGES)
    assert "key_concurrency" in str(refused.value)
    assert r.completion(model="three", messages=MESSAGES).usage.total_tokens == 20
    for _ in stream:
        pass
    settle(lambda: in_flight(e, ("openai", "ok", shared)) == 0)
    assert r.completion(model="two", messages=MESSAGES).usage.total_tokens == 20
    plugin.uninstall()


def test_routes_come_from_routes_then_model_info_then_derivation(
    server: LiteLLMProviders, live_engine: q.QuotaEngine
) -> None:
    e = live_engine
    ml = [
        deployment(server, "g", "ok", "a", 1),
        {"model_name": "g", "litellm_params": {"model": "groq/ok", "api_key": "x"}, "model_info": {"id": "b"}},
        deployment(server, "g", "ok", "c", 3),
    ]
    ml[0]["model_info"]["quotaengine"]["account"] = "org-1"
    r = router(ml)
    plugin = qel.install(r, e, routes={"c": ("cerebras", "llama3.1-8b", 33)})
    assert plugin.route_of("a") == ("local", "ok", 1)
    # SPEC 25.1: a derived key id is the deployment's credential (platform and api_key).
    assert plugin.route_of("b") == ("groq", "ok", qel.credential_key_id("groq", "x"))
    assert plugin.route_of("c") == ("cerebras", "llama3.1-8b", 33)
    with pytest.raises(KeyError):
        plugin.route_of("nope")
    # Keys are registered with their account.
    assert e.key_account("local", 1) == "org-1"
    kb = qel.credential_key_id("groq", "x")
    assert e.key_account("groq", kb) == f"key:{kb}"
    plugin.uninstall()


@pytest.mark.parametrize(
    ("kwargs", "info"),
    [
        ({"routes": {"missing": ("p", "m", 1)}}, None),
        ({"routes": {"a": ("p", "m")}}, None),
        ({"routes": {"a": ("p", "m", "1")}}, None),
        ({}, ["not", "a", "mapping"]),
        ({}, {"platform": 3, "key_id": 1}),
        ({}, {"platform": "p", "key_id": "1"}),
        ({}, {"platform": "p"}),
        ({"strategy": "fastest"}, None),
        ({"wait_s": -1}, None),
    ],
)
def test_a_bad_setup_is_a_value_error_before_anything_changes(
    server: LiteLLMProviders, live_engine: q.QuotaEngine, kwargs: dict, info: object
) -> None:
    ml = [deployment(server, "g", "ok", "a", 1, rpm=7)]
    ml[0]["litellm_params"]["max_parallel_requests"] = 2
    if info is not None:
        ml[0]["model_info"]["quotaengine"] = info
    r = router(ml)
    with pytest.raises(ValueError):
        qel.install(r, live_engine, **kwargs)
    assert live_engine.model_limits("local", "ok") is None
    assert live_engine.key_concurrency_cap("local", 1) is None
    # The router still routes as it did.
    assert r.completion(model="g", messages=MESSAGES).usage.total_tokens == 20


def test_a_second_install_on_one_router_is_a_value_error(server: LiteLLMProviders, live_engine: q.QuotaEngine) -> None:
    r = router([deployment(server, "g", "ok", "a", 1)])
    plugin = qel.install(r, live_engine)
    with pytest.raises(ValueError, match="already installed"):
        qel.install(r, live_engine)
    plugin.uninstall()
    again = qel.install(r, live_engine)  # after uninstall it can be installed again
    again.uninstall()


# ---- limits --------------------------------------------------------------------------


def test_import_limits_takes_what_the_deployment_declares_never_raising_what_was_learned(
    server: LiteLLMProviders, live_engine: q.QuotaEngine
) -> None:
    e = live_engine
    # What the engine learned (or was told) before: a lower rpm, and an rpd.
    e.set_model_limits("local", "ok", rpm=5, rpd=100)
    ml = [deployment(server, "g", "ok", "a", 1, rpm=30, tpm=6000, max_parallel_requests=3)]
    plugin = qel.install(r := router(ml), e)
    limits = e.model_limits("local", "ok")
    assert limits is not None
    assert (limits.rpm, limits.rpd, limits.tpm, limits.tpd) == (5, 100, 6000, None)
    assert e.key_concurrency_cap("local", 1) == 3
    plugin.uninstall()
    # Without import_limits nothing is taken.
    e.set_model_limits("local", "ok")
    e.set_key_concurrency_cap("local", 1, None)
    plugin = qel.install(r, e, import_limits=False)
    assert e.model_limits("local", "ok") == q.Limits()
    assert e.key_concurrency_cap("local", 1) is None
    plugin.uninstall()


def test_set_key_concurrency_cap_is_persisted_shared_and_the_lowest_cap_wins(store: str) -> None:
    env = {"MAX_CONCURRENT_REQUESTS_PER_KEY": "3"}
    a = q.QuotaEngine(store, env=env)
    b = q.QuotaEngine(store, env=env)
    try:
        assert a.key_concurrency_cap("groq", 1) == 3
        a.register_key(1, "groq", account="org")
        a.set_key_concurrency_cap("groq", 1, 2)
        assert b.key_concurrency_cap("groq", 1) == 2  # shared
        a.register_key(1, "groq", account="org", label="again")  # registering again keeps it
        assert b.key_concurrency_cap("groq", 1) == 2
        l1 = b.lease("groq", "m", 1)
        l2 = b.lease("groq", "m", 1)
        with pytest.raises(q.QuotaExceeded) as refused:
            a.lease("groq", "m", 1)
        assert refused.value.reason == "key_concurrency"
        l1.success(tokens=1)
        l2.success(tokens=1)
        a.set_key_concurrency_cap("groq", 1, 5)  # above the env cap: the env cap holds
        assert a.key_concurrency_cap("groq", 1) == 3
        a.set_key_concurrency_cap("groq", 1, None)
        assert a.key_concurrency_cap("groq", 1) == 3
        a.set_key_concurrency_cap("groq", 2, 1)  # an unregistered key is registered
        assert a.key_account("groq", 2) == "key:2"
        for bad in (-1,):
            with pytest.raises(ValueError):
                a.set_key_concurrency_cap("groq", 1, bad)
        with pytest.raises(ValueError, match="registered for platform"):
            a.set_key_concurrency_cap("google", 1, 1)
        with pytest.raises(TypeError):
            a.set_key_concurrency_cap("groq", 1, "2")  # type: ignore[arg-type]
        assert a.key_concurrency_cap("groq", 1) == 3  # bad input changed nothing
    finally:
        a.close()
        b.close()
    c = q.QuotaEngine(store, env={})  # persisted
    try:
        assert c.key_concurrency_cap("groq", 2) == 1
    finally:
        c.close()


def test_now_ms_is_the_engine_clock(store: str) -> None:
    clock = q.ManualClock(1_767_225_600_000)
    with q.QuotaEngine(store, clock=clock) as e:
        assert e.now_ms() == 1_767_225_600_000
        clock.advance(1500)
        assert e.now_ms() == 1_767_225_601_500


# ---- choosing and outcomes, sync ----------------------------------------------------------


def test_the_engine_chooses_and_a_success_ends_the_lease_with_usage_and_headers(
    server: LiteLLMProviders, live_engine: q.QuotaEngine
) -> None:
    e = live_engine
    ml = [deployment(server, "g", "ok", "a", 1), deployment(server, "g", "ok", "b", 2)]
    e.set_model_limits("local", "ok", rpm=100)
    plugin = qel.install(router(ml), e, strategy="order")
    r = plugin._router
    resp = r.completion(model="g", messages=MESSAGES, max_tokens=50)
    assert resp.usage.total_tokens == 20
    a = ("local", "ok", 1)
    settle(lambda: in_flight(e, a) == 0)
    u = e.usage(*a)
    assert u["rpm"]["used"] == 1
    assert u["tpm"]["used"] == 20  # the response's usage, not the estimate
    assert e.usage("local", "ok", 2)["rpm"]["used"] == 0  # "order": the first
    # The x-ratelimit-* headers LiteLLM keeps were recorded for the key.
    settle(lambda: 1 in e.key_quota_headroom("local"))
    plugin.uninstall()


def test_the_estimate_is_the_prompt_plus_max_tokens(server: LiteLLMProviders, live_engine: q.QuotaEngine) -> None:
    e = live_engine
    prompt = litellm.token_counter(messages=MESSAGES)
    assert prompt > 0
    # A token limit that admits the prompt plus 100 tokens and no more.
    e.set_model_limits("local", "ok", limits=[q.Limit("tokens", prompt + 100, "minute", scope="key")])
    plugin = qel.install(router([deployment(server, "g", "ok", "a", 1)]), e)
    r = plugin._router
    for kw in ({"max_tokens": 101}, {"max_completion_tokens": 101}):
        with pytest.raises(litellm.RateLimitError):
            r.completion(model="g", messages=MESSAGES, **kw)
    assert server.total("ok") == 0 or e.usage("local", "ok", 1)["rpm"]["used"] == 0
    r.completion(model="g", messages=MESSAGES, max_completion_tokens=100)
    settle(lambda: in_flight(e, ("local", "ok", 1)) == 0)
    assert e.usage("local", "ok", 1)["rpm"]["used"] == 1
    plugin.uninstall()


def test_a_groq_429_benches_the_deployment_with_its_retry_after_and_learns_the_limit(
    server: LiteLLMProviders, live_engine: q.QuotaEngine
) -> None:
    e = live_engine
    ml = [deployment(server, "g", "groq-429", "a", 1), deployment(server, "g", "ok", "b", 2)]
    plugin = qel.install(router(ml), e, strategy="order")
    r = plugin._router
    with pytest.raises(litellm.RateLimitError):
        r.completion(model="g", messages=MESSAGES)
    a = ("local", "groq-429", 1)
    settle(lambda: in_flight(e, a) == 0)
    cd = e.cooldown(*a)
    assert cd is not None
    # Groq's retry-after: 8 s (stated, authoritative), from litellm_response_headers.
    assert 7_000 <= cd.expires_at_ms - e.now_ms() <= 8_500
    limits = e.model_limits("local", "groq-429")
    assert limits is not None and limits.tpm == 6000  # "Limit 6000" in the body
    # The next request goes to the other deployment without calling the benched one.
    before = server.total("groq-429")
    assert r.completion(model="g", messages=MESSAGES).usage.total_tokens == 20
    assert server.total("groq-429") == before
    plugin.uninstall()


def test_google_retry_info_and_quota_ids_are_learned_through_litellm(
    server: LiteLLMProviders, live_engine: q.QuotaEngine
) -> None:
    e = live_engine
    plugin = qel.install(router([deployment(server, "g", "gemini-day", "a", 1)]), e)
    with pytest.raises(litellm.RateLimitError):
        plugin._router.completion(model="g", messages=MESSAGES)
    route = ("local", "gemini-day", 1)
    settle(lambda: in_flight(e, route) == 0)
    cd = e.cooldown(*route)
    assert cd is not None
    # A spent daily quota with a short RetryInfo (17 s): the ladder's 2 min, not 17 s (SPEC 15.1).
    assert (cd.source, cd.expires_at_ms - cd.set_at_ms) == ("heuristic", 120_000)
    assert e.model_limits("local", "gemini-day").rpd == 200  # type: ignore[union-attr]
    plugin.uninstall()


def test_a_refusal_raises_rate_limit_error_with_retry_after_and_fallbacks_still_work(
    server: LiteLLMProviders, live_engine: q.QuotaEngine
) -> None:
    e = live_engine
    ml = [deployment(server, "g", "ok", "a", 1), deployment(server, "other", "ok", "b", 2)]
    e.set_model_limits("local", "ok", limits=[q.Limit("requests", 1, "minute", scope="key")])
    plugin = qel.install(router(ml), e)
    r = plugin._router
    r.completion(model="g", messages=MESSAGES)
    with pytest.raises(litellm.RateLimitError) as refused:
        r.completion(model="g", messages=MESSAGES)
    retry_after = int(refused.value.response.headers["retry-after"])
    assert 1 <= retry_after <= 60
    assert "quotaengine" in str(refused.value)
    # With a fallback group, LiteLLM falls back to it.
    r2 = router(ml, fallbacks=[{"g": ["other"]}])
    plugin.uninstall()
    plugin = qel.install(r2, e)
    resp = r2.completion(model="g", messages=MESSAGES)
    assert resp.usage.total_tokens == 20
    settle(lambda: e.usage("local", "ok", 2)["rpm"]["used"] == 1)
    plugin.uninstall()


def test_litellm_cooldowns_are_off_and_come_back_on_uninstall(
    server: LiteLLMProviders, live_engine: q.QuotaEngine
) -> None:
    r = router([deployment(server, "g", "ok", "a", 1)])
    assert not r.settings().disable_cooldowns
    plugin = qel.install(r, live_engine)
    assert r.settings().disable_cooldowns
    plugin.uninstall()
    assert not r.settings().disable_cooldowns
    # Uninstalled: the router picks on its own and the engine hears nothing.
    r.completion(model="g", messages=MESSAGES)
    assert live_engine.usage("local", "ok", 1)["rpm"]["used"] == 0


@pytest.fixture
def outcomes(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What each Lease.observe the plugin made returned (observe looks its Python half up
    on every call)."""
    import quotaengine._observe as obs

    seen: list[Any] = []
    original = obs.observe

    def spy(lease: Any, outcome: object, tokens: int | None = None) -> Any:
        out = original(lease, outcome, tokens)
        seen.append(out)
        return out

    monkeypatch.setattr(obs, "observe", spy)
    return seen


def test_a_refused_connection_is_transport(live_engine: q.QuotaEngine, outcomes: list[Any]) -> None:
    e = live_engine
    ml = [
        {
            "model_name": "dead",
            "litellm_params": {"model": "openai/ok", "api_base": "http://127.0.0.1:9/v1", "api_key": "x"},
            "model_info": {"id": "dead", "quotaengine": {"platform": "local", "key_id": 9}},
        }
    ]
    plugin = qel.install(router(ml), e)
    with pytest.raises(litellm.InternalServerError):  # LiteLLM's "Connection error."
        plugin._router.completion(model="dead", messages=MESSAGES)
    settle(lambda: in_flight(e, ("local", "ok", 9)) == 0)
    assert [o.kind for o in outcomes] == ["transport"]
    assert e.cooldown("local", "ok", 9) is not None
    plugin.uninstall()


def test_a_litellm_timeout_is_a_timeout_failure(
    server: LiteLLMProviders, live_engine: q.QuotaEngine, outcomes: list[Any]
) -> None:
    e = live_engine
    plugin = qel.install(router([deployment(server, "g", "slow", "a", 1, timeout=0.3)]), e)
    with pytest.raises(litellm.Timeout):
        plugin._router.completion(model="g", messages=MESSAGES)
    settle(lambda: in_flight(e, ("local", "slow", 1)) == 0)
    assert [o.kind for o in outcomes] == ["timeout"]
    plugin.uninstall()


def test_an_upstream_429_benches_the_model_for_every_key(server: LiteLLMProviders, live_engine: q.QuotaEngine) -> None:
    """SPEC 21.1 through the plugin: once the failure is logged, no key is sent the
    congested model; the next call goes to another model."""
    e = live_engine
    ml = [
        deployment(server, "g", "or-upstream", "a", 1),
        deployment(server, "g", "or-upstream", "b", 2),
        deployment(server, "g", "ok", "c", 3),
    ]
    plugin = qel.install(router(ml, num_retries=2), e, strategy="order")
    resp = plugin._router.completion(model="g", messages=MESSAGES)
    assert resp.usage.total_tokens == 20
    settle(lambda: e.cooldown("local", "or-upstream", 2) is not None)
    for key in (1, 2):
        cd = e.cooldown("local", "or-upstream", key)
        assert cd is not None and (cd.key_id, cd.source) == (None, "upstream")
    settle(lambda: in_flight(e, ("local", "or-upstream", 1)) == in_flight(e, ("local", "or-upstream", 2)) == 0)
    sent = server.total("or-upstream")
    for _ in range(3):
        plugin._router.completion(model="g", messages=MESSAGES)
    assert server.total("or-upstream") == sent
    plugin.uninstall()


def test_a_pool_429s_headers_teach_the_account_its_cap(server: LiteLLMProviders, live_engine: q.QuotaEngine) -> None:
    """SPEC 21.2 through the plugin: the cap and reset in the response's headers."""
    e = live_engine
    ml = [deployment(server, "g", "or-pool", "a", 4), deployment(server, "g", "ok", "b", 5)]
    plugin = qel.install(router(ml, num_retries=1), e, strategy="order")
    plugin._router.completion(model="g", messages=MESSAGES)
    settle(lambda: e.learned_provider_caps("local", 4).minute_requests == 20)
    cd = e.cooldown("local", "or-pool", 4)
    assert cd is not None and cd.source == "authoritative" and 25_000 <= cd.remaining_ms <= 30_000
    assert e.learned_provider_caps("local", 5).minute_requests is None
    plugin.uninstall()


def test_each_litellm_retry_is_a_new_choice(server: LiteLLMProviders, live_engine: q.QuotaEngine) -> None:
    e = live_engine
    ml = [deployment(server, "g", "groq-429", "a", 1), deployment(server, "g", "ok", "b", 2)]
    plugin = qel.install(router(ml, num_retries=2), e, strategy="order")
    resp = plugin._router.completion(model="g", messages=MESSAGES)
    assert resp.usage.total_tokens == 20
    settle(lambda: e.usage("local", "ok", 2)["rpm"]["used"] == 1)
    assert server.count("groq-429", 429) >= 1
    assert e.cooldown("local", "groq-429", 1) is not None
    assert in_flight(e, ("local", "groq-429", 1)) == 0
    plugin.uninstall()


def on(server: LiteLLMProviders, model: str, dep_id: str, platform: str, model_id: str, key_id: int) -> dict:
    """A deployment of group "g" asking the server for `model`, as the route given."""
    d = deployment(server, "g", model, dep_id, key_id)
    d["model_info"]["quotaengine"] = {"platform": platform, "key_id": key_id, "model_id": model_id}
    return d


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_retry_skips_the_platform_after_a_500_and_the_model_after_a_403(
    server: LiteLLMProviders, live_engine: q.QuotaEngine, mode: str
) -> None:
    """SPEC 24.7 through the plugin: a 500 of one provider makes LiteLLM's retry of the
    request skip that platform, a 403 the model on every key (a 404 too, which LiteLLM
    does not retry in the group); each request has its own skips."""
    e = live_engine

    def call(plugin: qel.QuotaEnginePlugin) -> Any:
        if mode == "sync":
            return plugin._router.completion(model="g", messages=MESSAGES)
        return asyncio.run(plugin._router.acompletion(model="g", messages=MESSAGES))

    # "order" would retry on p1's next deployment: the 500 makes it skip p1.
    ml = [on(server, "e500", "a", "p1", "e500", 1), on(server, "ok", "b", "p1", "ok", 2)]
    ml.append(on(server, "ok", "c", "p2", "ok", 3))
    plugin = qel.install(router(ml, num_retries=2), e, strategy="order")
    assert call(plugin).usage.total_tokens == 20
    settle(lambda: e.usage("p2", "ok", 3)["rpm"]["used"] == 1)
    assert e.usage("p1", "ok", 2)["rpm"]["used"] == 0
    assert server.count("e500", 500) >= 1
    plugin.uninstall()

    # "order" would retry on the model's other key: the 403 makes it skip the model.
    ml = [on(server, "m403", "d", "p3", "m403", 4), on(server, "m403", "e", "p3", "m403", 5)]
    ml.append(on(server, "ok", "f", "p3", "ok", 6))
    plugin = qel.install(router(ml, num_retries=2), e, strategy="order")
    sent = server.count("m403", 403)
    assert call(plugin).usage.total_tokens == 20
    settle(lambda: e.usage("p3", "ok", 6)["rpm"]["used"] == 1)
    assert server.count("m403", 403) == sent + 1
    assert e.cooldown("p3", "m403", 5) is None and e.usage("p3", "m403", 5)["in_flight"] == 0
    plugin.uninstall()

    # LiteLLM raises a 404 at once (no retry in the group): the plugin still records
    # the request's skip, and the next request has none of it.
    ml = [on(server, "m404", "g1", "p4", "m404", 7), on(server, "ok", "g2", "p4", "ok", 8)]
    plugin = qel.install(router(ml, num_retries=2), e, strategy="order")
    for _ in range(2):
        with pytest.raises(litellm.NotFoundError):
            call(plugin)
    assert server.count("m404", 404) >= 2
    assert [skips for _, skips in plugin._skips.values() if ("p4", "m404") in skips]
    plugin.uninstall()


def test_a_sync_stream_ends_its_lease_when_litellm_logs_it_complete(
    server: LiteLLMProviders, live_engine: q.QuotaEngine
) -> None:
    e = live_engine
    plugin = qel.install(router([deployment(server, "g", "ok", "a", 1)]), e)
    route = ("local", "ok", 1)
    stream = plugin._router.completion(
        model="g", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    assert in_flight(e, route) == 1  # the lease lives while the stream is read
    text = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    assert text == "hi"
    settle(lambda: in_flight(e, route) == 0)
    assert e.usage(*route)["tpm"]["used"] == 20  # the final chunk's usage
    plugin.uninstall()


# ---- async -----------------------------------------------------------------------------


def test_async_completion_and_async_stream(server: LiteLLMProviders, live_engine: q.QuotaEngine) -> None:
    e = live_engine
    ml = [deployment(server, "g", "ok", "a", 1), deployment(server, "g", "groq-429", "b", 2)]
    plugin = qel.install(router(ml), e, strategy="order")
    r = plugin._router
    route = ("local", "ok", 1)

    async def main() -> None:
        resp = await r.acompletion(model="g", messages=MESSAGES)
        assert resp.usage.total_tokens == 20
        stream = await r.acompletion(model="g", messages=MESSAGES, stream=True, stream_options={"include_usage": True})
        async for _ in stream:
            pass
        for _ in range(500):
            if in_flight(e, route) == 0 and e.usage(*route)["rpm"]["used"] == 2:
                break
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert e.usage(*route)["rpm"]["used"] == 2
    assert e.usage(*route)["tpm"]["used"] == 40
    assert in_flight(e, route) == 0
    plugin.uninstall()


def test_async_waits_for_capacity_and_concurrency_429s_are_learned(
    server: LiteLLMProviders, live_engine: q.QuotaEngine
) -> None:
    """Calls arriving faster than a provider that takes two at once serves them: the
    first concurrency 429 teaches the key's cap, then the plugin waits for a free slot
    instead of calling."""
    e = live_engine
    server.busy_hold_s = 0.3
    ml = [deployment(server, "g", "busy", "a", 1), deployment(server, "warm", "ok", "w", 2)]
    plugin = qel.install(router(ml), e, wait_s=10)
    r = plugin._router
    # LiteLLM's first failure takes it a few hundred ms to log (imports): warm it up.
    with pytest.raises(litellm.RateLimitError):
        asyncio.run(r.acompletion(model="warm", messages=MESSAGES, mock_response="litellm.RateLimitError"))
    before_429, before_200 = server.count("busy", 429), server.count("busy", 200)

    async def one(i: int) -> bool:
        await asyncio.sleep(i * 0.1)  # ten a second
        try:
            await r.acompletion(model="g", messages=MESSAGES)
            return True
        except litellm.RateLimitError:
            return False

    async def main() -> list[bool]:
        return await asyncio.gather(*(one(i) for i in range(16)))

    results = asyncio.run(main())
    answered_429 = server.count("busy", 429) - before_429
    # SPEC 24.2: the cap is the leases live when the failing one was admitted: 2 when
    # it reached the server as admitted, 1 when LiteLLM (slow on a loaded machine)
    # sent it only after another call had taken the second slot.
    assert e.key_concurrency_cap("local", 1) in (1, 2)
    assert 1 <= answered_429 <= 4  # LiteLLM takes ~20 ms to report each failure
    assert sum(results) == 16 - answered_429 == server.count("busy", 200) - before_200
    settle(lambda: in_flight(e, ("local", "busy", 1)) == 0)
    plugin.uninstall()


def test_a_cancelled_call_ends_its_lease_without_a_failure(
    server: LiteLLMProviders, live_engine: q.QuotaEngine
) -> None:
    e = live_engine
    plugin = qel.install(router([deployment(server, "g", "slow", "a", 1, timeout=10)]), e)
    route = ("local", "slow", 1)

    async def main() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(plugin._router.acompletion(model="g", messages=MESSAGES), 0.3)

    asyncio.run(main())
    settle(lambda: in_flight(e, route) == 0)
    assert e.cooldown(*route) is None  # no failure, no bench
    assert e.usage(*route)["rpm"]["used"] == 1  # the estimate is recorded
    plugin.uninstall()


def test_two_routers_in_one_process_each_get_their_own_plugin(
    server: LiteLLMProviders, live_engine: q.QuotaEngine
) -> None:
    e = live_engine
    r1 = router([deployment(server, "g", "ok", "a", 1)])
    r2 = router([deployment(server, "g", "ok", "b", 2)])
    p1, p2 = qel.install(r1, e), qel.install(r2, e)
    r1.completion(model="g", messages=MESSAGES)
    r2.completion(model="g", messages=MESSAGES)
    settle(lambda: in_flight(e, ("local", "ok", 1)) == 0 and in_flight(e, ("local", "ok", 2)) == 0)
    assert e.usage("local", "ok", 1)["tpm"]["used"] == 20
    assert e.usage("local", "ok", 2)["tpm"]["used"] == 20
    p1.uninstall()
    p2.uninstall()


# ---- Lease.observe learns LiteLLM's shapes -------------------------------------------------


def test_observe_reads_litellm_exceptions_and_responses(server: LiteLLMProviders, engine: q.QuotaEngine) -> None:
    e = engine
    route = ("local", "groq-429", 5)
    try:
        litellm.completion(model="openai/groq-429", api_base=server.url, api_key="x", messages=MESSAGES, max_retries=0)
    except litellm.RateLimitError as exc:
        error = exc
    lease = e.lease(*route)
    out = lease.observe(error)
    assert out is not None and out.kind == "rate_limit"
    cd = e.cooldown(*route)
    assert cd is not None and cd.source == "authoritative"
    assert cd.expires_at_ms - e.now_ms() == 8_000  # retry-after from litellm_response_headers
    assert e.model_limits("local", "groq-429").tpm == 6000  # type: ignore[union-attr]
    # A success: usage and the headers in _hidden_params.
    ok = litellm.completion(model="openai/ok", api_base=server.url, api_key="x", messages=MESSAGES)
    lease = e.lease("local", "ok", 5)
    assert lease.observe(ok) is None
    assert e.usage("local", "ok", 5)["tpm"]["used"] == 20
    assert 5 in e.key_quota_headroom("local")


def test_observe_strips_litellm_message_prefix_when_there_is_no_body(engine: q.QuotaEngine) -> None:
    msg = (
        'GroqException - {"error":{"message":"Rate limit reached for model `m` in organization `o` on '
        'requests per day (RPD): Limit 1000, Used 1000, Requested 1. Please try again in 1m26.4s."}}'
    )
    exc = litellm.RateLimitError(message=msg, llm_provider="groq", model="groq/m")
    assert str(exc).startswith("litellm.RateLimitError: ")
    lease = engine.lease("groq", "m", 1)
    out = lease.observe(exc)
    assert out is not None
    assert engine.model_limits("groq", "m").rpd == 1000  # type: ignore[union-attr]


def test_observe_of_a_cancellation_records_the_estimate_and_benches_nothing(engine: q.QuotaEngine) -> None:
    for outcome in (asyncio.CancelledError(), KeyboardInterrupt(), SystemExit(0), GeneratorExit()):
        lease = engine.lease("groq", "m", 1, estimated_tokens=30)
        assert lease.observe(outcome) is None
        assert engine.cooldown("groq", "m", 1) is None
    u = engine.usage("groq", "m", 1)
    assert (u["rpm"]["used"], u["tpm"]["used"], u["in_flight"]) == (4, 120, 0)


def test_the_example_runs(server: LiteLLMProviders, tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "litellm_router.py"
    r = subprocess.run(
        [sys.executable, str(example), server.url, str(tmp_path / "quota.db")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "sync: 20 tokens" in out
    assert "stream: hi" in out
    assert "async: 12 served" in out


# ---- tenants from the request (SPEC 25.2) ------------------------------------------------


def test_tenants_of_a_request_in_order_each_once() -> None:
    request = {
        "user": "bob",
        "metadata": {"quotaengine_tenants": ["team-a", "app-1", "team-a"], "tags": ["batch", "eu"]},
    }
    assert qel.tenants_of(request) == ["team-a", "app-1", "end_user:bob", "tag:batch", "tag:eu"]
    assert qel.tenants_of({"metadata": {"quotaengine_tenants": "solo"}}) == ["solo"]
    assert qel.tenants_of({"litellm_metadata": {"tags": ["x"]}, "user": ""}) == ["tag:x"]
    # The proxy's authenticated key comes last (SPEC 25.3).
    stamped = {"metadata": {"quotaengine_key_tenants": ["key:ci", "team:t1"], "tags": ["b"]}, "user": "u"}
    assert qel.tenants_of(stamped) == ["end_user:u", "tag:b", "key:ci", "team:t1"]
    assert qel.tenants_of(None) == [] and qel.tenants_of({"metadata": "not a mapping"}) == []


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_tenant_limit_from_user_tags_and_metadata_holds_in_the_router(
    server: LiteLLMProviders, live_engine: q.QuotaEngine, mode: str
) -> None:
    """SPEC 25.2: with tenants=True each request is leased for its end user, tags and named
    tenants; a tenant gate's refusal is a RateLimitError naming the tenant and the limit,
    with retry-after."""
    e = live_engine
    e.set_tenant_limits("end_user:bob", [q.Limit("requests", 2, "minute")])
    e.set_tenant_limits("tag:batch", [q.Limit("requests", 1, "minute")])
    e.set_tenant_limits("team-a", [q.Limit("tokens", 1000, "day")])
    ml = [deployment(server, "g", "ok", "a", 1), deployment(server, "g", "ok", "b", 2)]
    plugin = qel.install(router(ml), e, tenants=True)
    r = plugin._router

    def call(**kw: Any) -> Any:
        if mode == "sync":
            return r.completion(model="g", messages=MESSAGES, **kw)
        return asyncio.run(r.acompletion(model="g", messages=MESSAGES, **kw))

    for _ in range(2):
        assert call(user="bob").usage.total_tokens == 20
    with pytest.raises(litellm.RateLimitError) as refused:
        call(user="bob")
    assert "'end_user:bob'" in str(refused.value) and "limit 2 requests per minute" in str(refused.value)
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 60
    assert call(user="alice").usage.total_tokens == 20  # another end user has room
    # Tags: one request a minute for the "batch" tag, whoever sends it.
    call(user="carol", metadata={"tags": ["batch"]})
    with pytest.raises(litellm.RateLimitError, match="tag:batch"):
        call(user="dave", metadata={"tags": ["batch"]})
    # Named tenants: counted (the response's usage) whether or not they refuse.
    call(metadata={"quotaengine_tenants": ["team-a"]})
    settle(lambda: e.tenant_usage("team-a")["tokens/day"]["used"] == 20)
    settle(lambda: e.tenant_usage("end_user:bob")["requests/minute"]["in_flight"] == 0)
    assert e.tenant_usage("end_user:bob")["requests/minute"]["used"] == 2
    # A name the engine cannot take is the caller's mistake: a 400, nothing leased.
    with pytest.raises(litellm.BadRequestError, match="quotaengine"):
        call(metadata={"quotaengine_tenants": "x" * 300})
    plugin.uninstall()
    # Without tenants=True the request's tenants are not the router's business.
    plugin = qel.install(r, e)
    assert call(user="bob").usage.total_tokens == 20
    plugin.uninstall()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_tenant_refusal_is_answered_at_once_whatever_the_routers_retries(
    server: LiteLLMProviders, live_engine: q.QuotaEngine, mode: str
) -> None:
    """SPEC 25.2: a tenant gate's refusal is the caller's RateLimitError, raised to it then.
    LiteLLM retries a 429 after its retry-after when a group has no other deployment; no
    deployment can serve the tenant before its window frees, so the Router's retries must
    not hold the request until then and serve it after the caller was refused."""
    e = live_engine
    e.set_tenant_limits("end_user:bob", [q.Limit("requests", 1, "minute")])
    plugin = qel.install(router([deployment(server, "g", "ok", "a", 1)], num_retries=2), e, tenants=True)
    r = plugin._router

    def call() -> Any:
        if mode == "sync":
            return r.completion(model="g", messages=MESSAGES, user="bob", timeout=90)
        return asyncio.run(r.acompletion(model="g", messages=MESSAGES, user="bob", timeout=90))

    assert call().usage.total_tokens == 20
    sent = server.total("ok")
    with pytest.raises(litellm.RateLimitError, match="'end_user:bob'"):
        call()
    assert server.total("ok") == sent  # never sent: not served after the refusal
    settle(lambda: e.tenant_usage("end_user:bob")["requests/minute"]["in_flight"] == 0)
    assert e.tenant_usage("end_user:bob")["requests/minute"]["used"] == 1
    plugin.uninstall()
