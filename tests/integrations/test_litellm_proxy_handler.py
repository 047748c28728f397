"""SPEC 25.3 in one process: the proxy handler's configuration, the tenants of LiteLLM's
authenticated key, the headers, and staying installed on a real Router whose routing
strategy changes under it (the proxy process itself: test_litellm_proxy.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest
import quotaengine as q

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import litellm  # noqa: E402
import quotaengine.litellm as qel  # noqa: E402
from litellm.integrations.custom_logger import CustomLogger  # noqa: E402
from litellm_server import LiteLLMProviders  # noqa: E402

MESSAGES = [{"role": "user", "content": "hello there"}]
pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning:pydantic.*"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[LiteLLMProviders]:
    with LiteLLMProviders() as s:
        yield s


def test_the_handler_is_configured_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for name in ("QUOTAENGINE_DB", "QUOTAENGINE_WAIT_S", "QUOTAENGINE_STRATEGY"):
        monkeypatch.delenv(name, raising=False)
    h = qel.proxy_handler_for()
    assert isinstance(h, CustomLogger) and isinstance(h, qel.QuotaEngineProxyHandler)
    assert h.quotaengine_location == "./quota.db"
    assert h.quotaengine_options == {"wait_s": 0.0, "strategy": "headroom", "tenants": True}
    assert h.plugin is None  # nothing opened nor installed before the first request
    assert h._qe_engine is None
    monkeypatch.setenv("QUOTAENGINE_DB", str(tmp_path / "q.db"))
    monkeypatch.setenv("QUOTAENGINE_WAIT_S", "2.5")
    monkeypatch.setenv("QUOTAENGINE_STRATEGY", "order")
    h = qel.proxy_handler_for(tenants=False, headers=False)
    assert h.quotaengine_location == str(tmp_path / "q.db")
    assert h.quotaengine_options == {"wait_s": 2.5, "strategy": "order", "tenants": False}
    assert h.quotaengine_headers is False
    assert h._qe_engine is None
    assert isinstance(h.engine, q.QuotaEngine)  # opened at its first use
    h.engine.close()
    # ':memory:' would give each worker limits of its own: refused, clearly.
    monkeypatch.setenv("QUOTAENGINE_DB", ":memory:")
    with pytest.raises(ValueError, match="share one engine"):
        qel.proxy_handler_for()
    monkeypatch.setenv("QUOTAENGINE_DB", str(tmp_path / "q.db"))
    for name, bad in (("QUOTAENGINE_WAIT_S", "soon"), ("QUOTAENGINE_STRATEGY", "fastest")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name):
            qel.proxy_handler_for()
        monkeypatch.delenv(name)
    monkeypatch.setenv("QUOTAENGINE_TENANTS", "maybe")
    with pytest.raises(ValueError, match="QUOTAENGINE_TENANTS"):
        qel._flag("QUOTAENGINE_TENANTS", True)
    # SPEC 27.2: metrics= is a registry or True; anything else is refused before anything opens.
    with pytest.raises(TypeError, match="CollectorRegistry"):
        qel.proxy_handler_for(metrics=object())


def test_the_one_config_line_names_a_ready_handler(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """``quotaengine.litellm.proxy_handler`` is made at its first use (LiteLLM imports it by
    name), from QUOTAENGINE_*; the same object after."""
    from litellm.proxy.types_utils.utils import get_instance_fn

    monkeypatch.delitem(vars(qel), "proxy_handler", raising=False)
    monkeypatch.setenv("QUOTAENGINE_DB", str(tmp_path / "q.db"))
    monkeypatch.setenv("QUOTAENGINE_TENANTS", "0")
    monkeypatch.setenv("QUOTAENGINE_HEADERS", "0")
    handler = get_instance_fn("quotaengine.litellm.proxy_handler")
    assert isinstance(handler, qel.QuotaEngineProxyHandler)
    assert handler.quotaengine_options["tenants"] is False and handler.quotaengine_headers is False
    assert qel.proxy_handler is handler
    del vars(qel)["proxy_handler"]  # made again from the environment at its next use


def test_the_authenticated_keys_tenants() -> None:
    from litellm.proxy._types import UserAPIKeyAuth

    k = UserAPIKeyAuth(api_key="sk-virtual-1", key_alias="ci", team_id="t1", org_id="o1", user_id="u1")
    assert qel.key_tenants(k) == ["key:ci", "team:t1", "org:o1", "user:u1"]
    # Without an alias, the hashed key (never the key itself).
    k = UserAPIKeyAuth(api_key="sk-virtual-2", team_id="t1")
    found = qel.key_tenants(k)
    assert found[0] == f"key:{k.token}" and "sk-virtual-2" not in found[0] and found[1:] == ["team:t1"]
    # The master key and LiteLLM's placeholder user name no tenant.
    master = UserAPIKeyAuth(api_key="litellm_proxy_master_key", user_id="default_user_id")
    assert qel.key_tenants(master) == []
    assert qel.key_tenants(UserAPIKeyAuth(api_key="sk-master-x", user_id="default_user_id"), "sk-master-x") == []
    assert qel.key_tenants(None) == []


def test_openai_durations_and_tenant_headers(store: str) -> None:
    assert [qel.openai_duration(ms) for ms in (0, 1, 1000, 59_001, 360_000, 3_723_000)] == [
        "0s",
        "1s",
        "1s",
        "1m0s",
        "6m0s",
        "1h2m3s",
    ]
    clock = q.ManualClock(1_767_268_800_000)  # 2026-01-01 12:00 UTC
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        e.set_tenant_limits("a", [q.Limit("requests", 10, "minute"), q.Limit("tokens", 1000, "day")])
        e.set_tenant_limits("b", [q.Limit("requests", 3, "10s"), q.Limit("tokens", 5000, "minute")])
        assert qel.tenant_headers(e, ["nobody"]) == {}
        live = e.lease("p", "m", 1, estimated_tokens=100, tenant=["a", "b"])
        e.record_request("p", "m", 1, tenant="b")
        h = qel.tenant_headers(e, ["a", "b"])
        # requests: b has 3 - 1 - 1 = 1 left (a has 8); tokens: a has 900 (b 4900).
        assert h == {
            "x-ratelimit-limit-requests": "3",
            "x-ratelimit-remaining-requests": "1",
            "x-ratelimit-reset-requests": "10s",
            "x-ratelimit-limit-tokens": "1000",
            "x-ratelimit-remaining-tokens": "900",
            "x-ratelimit-reset-tokens": "12h0m0s",  # the next UTC day
        }
        live.success(tokens=100)


@pytest.mark.parametrize(
    ("tenants", "headers", "expected"), [(True, True, "1"), (False, True, None), (True, False, None)]
)
def test_the_response_headers_follow_the_tenants_and_headers_options(
    store: str, tenants: bool, headers: bool, expected: str | None
) -> None:
    """SPEC 25.3: the rate-limit headers are those of the request's tenants, with headers on;
    with tenants off the handler leases no tenant, so no tenant's limit is reported as if it
    held the request."""
    with q.QuotaEngine(store, env={}) as e:
        e.set_tenant_limits("end_user:bob", [q.Limit("requests", 1, "minute")])
        h = qel.proxy_handler_for(e, tenants=tenants, headers=headers)
        out = asyncio.run(h.async_post_call_response_headers_hook({"user": "bob"}, None, None))
        assert (out or {}).get("x-ratelimit-limit-requests") == expected
        assert asyncio.run(h.async_post_call_response_headers_hook({}, None, None)) is None  # no tenant


def test_calendar_resets_count_to_the_tenants_own_local_period_start(store: str) -> None:
    """SPEC 23.2/25.3: a tenant's calendar periods start at 00:00 in the zone of its
    declaration (its own or its pattern's), so ``x-ratelimit-reset-*`` counts to the next
    local day, week (Monday) or month start, daylight saving time included."""
    clock = q.ManualClock(1_767_268_800_000)  # Thursday 2026-01-01 12:00 UTC
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        e.set_tenant_limits("ny", [q.Limit("requests", 10, "day")], tz="America/New_York")
        e.set_tenant_limits("tokyo", [q.Limit("tokens", 1000, "week")], tz="Asia/Tokyo")
        e.set_tenant_limits("team:*", [q.Limit("requests", 5, "month")], tz="Asia/Kolkata")
        e.set_tenant_limits("utc", [q.Limit("requests", 3, "day")])
        for t in ("ny", "tokyo", "team:x", "utc"):
            e.record_request("p", "m", 1, tenant=t)
        e.record_tokens("p", "m", 1, 10, tenant="tokyo")
        h = qel.tenant_headers(e, ["ny", "tokyo"])
        # 07:00 in New York: its next day starts at 05:00 UTC; 21:00 Thursday in Tokyo: its
        # week ends Monday 00:00 JST (Sunday 15:00 UTC).
        assert h["x-ratelimit-reset-requests"] == "17h0m0s"
        assert h["x-ratelimit-reset-tokens"] == "75h0m0s"
        # A pattern's zone: February starts 2026-01-31 18:30 UTC in Kolkata.
        assert qel.tenant_headers(e, ["team:x"])["x-ratelimit-reset-requests"] == "726h30m0s"
        assert qel.tenant_headers(e, ["utc"])["x-ratelimit-reset-requests"] == "12h0m0s"
        # The day daylight saving time starts in New York is 23 hours long.
        clock.set(1_772_971_200_000)  # 2026-03-08 12:00 UTC, 08:00 EDT
        e.record_request("p", "m", 1, tenant="ny")
        assert qel.tenant_headers(e, ["ny"])["x-ratelimit-reset-requests"] == "16h0m0s"


def _model_list(server: LiteLLMProviders) -> list[dict[str, Any]]:
    return [
        {
            "model_name": "g",
            "litellm_params": {"model": f"openai/ok-{i}", "api_base": server.url, "api_key": f"sk-{i}"},
            "model_info": {"id": f"d{i}"},
        }
        for i in range(2)
    ]


def test_the_handler_installs_at_the_first_request_and_again_after_a_strategy_change(
    server: LiteLLMProviders, store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC 25.3: installed on the proxy's router at the first request (llm_router is None
    before), and again when LiteLLM dropped the plugin's strategy (a routing-strategy
    change): the request LiteLLM routed on its own is seen, the next is the engine's."""
    from litellm.proxy import proxy_server
    from litellm.proxy._types import UserAPIKeyAuth
    from litellm.router_api import ChangeSet

    e = q.QuotaEngine(store, env={})
    handler = qel.proxy_handler_for(e)
    monkeypatch.setattr(proxy_server, "llm_router", None)
    monkeypatch.setattr(litellm, "callbacks", [handler])
    auth = UserAPIKeyAuth(api_key="sk-v", key_alias="ci")

    async def request(router: Any, **kw: Any) -> Any:
        data: dict[str, Any] = {"model": "g", "messages": MESSAGES, **kw}
        data = await handler.async_pre_call_hook(auth, None, data, "acompletion")
        return await router.acompletion(**data)

    async def main() -> None:
        stamped = await handler.async_pre_call_hook(auth, None, {}, "acompletion")
        assert stamped == {"metadata": {"quotaengine_key_tenants": ["key:ci"]}}
        assert handler.plugin is None  # no router yet: nothing to install on
        router = litellm.Router(model_list=_model_list(server), num_retries=0)
        monkeypatch.setattr(proxy_server, "llm_router", router)
        await request(router, user="bob")
        first = handler.plugin
        assert first is not None and first._router is router and first._installed
        await request(router, user="bob")  # the engine's choice again: no reinstall
        assert handler.plugin is first and first._installed
        await asyncio.sleep(0.2)
        assert e.tenant_usage("key:ci") == {} and "key:ci" in e.tenants()
        served = sum(
            e.usage("openai", f"ok-{i}", qel.credential_key_id("openai", f"sk-{i}"))["rpm"]["used"] for i in range(2)
        )
        assert served == 2
        # The routing strategy changes under the plugin: LiteLLM drops it silently.
        router.apply(ChangeSet(settings={"routing_strategy": "least-busy"}))
        await request(router)  # LiteLLM's own pick: the handler sees it and reinstalls
        second = handler.plugin
        assert second is not None and second is not first and second._installed and not first._installed
        await request(router)
        await asyncio.sleep(0.2)
        served = sum(
            e.usage("openai", f"ok-{i}", qel.credential_key_id("openai", f"sk-{i}"))["rpm"]["used"] for i in range(2)
        )
        # The one LiteLLM chose was leased on its choice; the next chosen by the engine.
        assert served == 4
        routes = [("openai", f"ok-{i}", qel.credential_key_id("openai", f"sk-{i}")) for i in range(2)]
        assert [e.usage(*r)["in_flight"] for r in routes] == [0, 0]  # each lease ended
        assert e.usage(*routes[0])["tpm"]["used"] + e.usage(*routes[1])["tpm"]["used"] == 4 * 20
        # A router replaced: installed on the new one at its first request.
        other = litellm.Router(model_list=_model_list(server), num_retries=0)
        monkeypatch.setattr(proxy_server, "llm_router", other)
        await request(other)
        assert handler.plugin is not None and handler.plugin._router is other and not second._installed
        handler.plugin.uninstall()

    try:
        asyncio.run(main())
    finally:
        e.close()
