"""Provider-wide pools (SPEC §8): cap defaults, env overrides, set/reset_provider_caps, the three provider
counts, billed tokens with per-model multipliers, the provider gates inside check()/lease(), and the quota
pool keys of SPEC §8.1."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import quotaengine as q
from moments import DAY, MINUTE, SECOND, T0, TEN_AM

NEXT_MIDNIGHT = T0 + DAY
K = 1

DAILY = "PROVIDER_DAILY_REQUEST_CAP_"
MINUTELY = "PROVIDER_MINUTE_REQUEST_CAP_"
TOKENS = "PROVIDER_DAILY_TOKEN_CAP_"


def caps_of(e: q.QuotaEngine, platform: str) -> tuple[int | None, int | None, int | None]:
    c = e.provider_caps(platform)
    assert isinstance(c, q.ProviderCaps)
    return (c.daily_requests, c.minute_requests, c.daily_tokens)


def open_engine(db: Path, clock: q.ManualClock, env: dict[str, str] | None = None) -> q.QuotaEngine:
    return q.QuotaEngine(db, clock=clock, env={} if env is None else env)


# ============================================================================ defaults and env overrides


def test_default_caps_table(engine: q.QuotaEngine) -> None:
    assert caps_of(engine, "openrouter") == (1000, None, None)
    assert caps_of(engine, "modelscope") == (1800, None, None)
    assert caps_of(engine, "nvidia") == (None, 40, None)
    assert caps_of(engine, "navy") == (None, None, 150_000)
    for other in ("groq", "google", "cerebras", "some-unknown-platform"):
        assert caps_of(engine, other) == (None, None, None), other


def test_default_modelscope_daily_cap_is_enforced(clock: q.ManualClock) -> None:
    with q.QuotaEngine(":memory:", clock=clock, env={}) as e:
        for i in range(1799):
            e.record_request("modelscope", f"m{i % 4}", K)
        assert e.can_use_provider("modelscope", K)
        assert e.check("modelscope", "m9", K).allowed
        e.record_request("modelscope", "m0", K)
        assert e.provider_daily_request_count("modelscope", K) == 1800
        assert not e.can_use_provider("modelscope", K)
        adm = e.check("modelscope", "m9", K)
        assert (adm.allowed, adm.reason, adm.retry_at_ms) == (False, "provider_daily_requests", NEXT_MIDNIGHT)
        assert e.can_use_provider("modelscope", 2)


def test_env_overrides_each_cap(store: str, clock: q.ManualClock) -> None:
    env = {
        DAILY + "OPENROUTER": "5",  # replaces a default
        MINUTELY + "NVIDIA": "7",
        TOKENS + "NAVY": "1234",
        DAILY + "GROQ": "11",  # a platform without defaults
        MINUTELY + "GROQ": "12",
        TOKENS + "GROQ": "13",
    }
    with open_engine(store, clock, env) as e:
        assert caps_of(e, "openrouter") == (5, None, None)
        assert caps_of(e, "nvidia") == (None, 7, None)
        assert caps_of(e, "navy") == (None, None, 1234)
        assert caps_of(e, "groq") == (11, 12, 13)
        assert caps_of(e, "modelscope") == (1800, None, None)  # untouched default


def test_env_platform_name_is_upper_cased(store: str, clock: q.ManualClock) -> None:
    # The variable for platform "cerebras" is ..._CEREBRAS; a lower-case variable name is not it.
    with open_engine(store, clock, {DAILY + "CEREBRAS": "3", MINUTELY + "cerebras": "9"}) as e:
        assert caps_of(e, "cerebras") == (3, None, None)


def test_env_override_is_enforced(store: str, clock: q.ManualClock) -> None:
    with open_engine(store, clock, {DAILY + "OPENROUTER": "2"}) as e:
        e.record_request("openrouter", "a:free", K)
        assert e.can_use_provider("openrouter", K)
        e.record_request("openrouter", "b", K)
        assert not e.can_use_provider("openrouter", K)


def test_env_zero_disables_each_default_cap(store: str, clock: q.ManualClock) -> None:
    env = {DAILY + "OPENROUTER": "0", DAILY + "MODELSCOPE": "0", MINUTELY + "NVIDIA": "0", TOKENS + "NAVY": "0"}
    with open_engine(store, clock, env) as e:
        assert caps_of(e, "openrouter") == (None, None, None)
        assert caps_of(e, "modelscope") == (None, None, None)
        assert caps_of(e, "nvidia") == (None, None, None)
        assert caps_of(e, "navy") == (None, None, None)
        for _ in range(50):
            e.record_request("nvidia", "m", K)
        e.record_tokens("navy", "m", K, 1_000_000)
        assert e.can_use_provider_minute("nvidia", K)
        assert e.check("nvidia", "m", K).allowed
        assert e.can_use_provider_tokens("navy", K, "m", 1_000_000)
        assert e.check("navy", "m", K, 1_000_000).allowed


@pytest.mark.parametrize("garbage", ["lots", "1.5", "-3", "12abc", "0x10"])
def test_env_garbage_is_ignored_with_a_warning(
    store: str, clock: q.ManualClock, caplog: pytest.LogCaptureFixture, garbage: str
) -> None:
    env = {
        DAILY + "OPENROUTER": garbage,
        MINUTELY + "NVIDIA": garbage,
        TOKENS + "NAVY": garbage,
        DAILY + "GROQ": garbage,
    }
    with caplog.at_level(logging.WARNING):
        e = open_engine(store, clock, env)
    try:
        # The defaults stand; a platform without a default keeps no cap.
        assert caps_of(e, "openrouter") == (1000, None, None)
        assert caps_of(e, "nvidia") == (None, 40, None)
        assert caps_of(e, "navy") == (None, None, 150_000)
        assert caps_of(e, "groq") == (None, None, None)
        warned = [
            r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("quotaengine")
        ]
        for var in (DAILY + "OPENROUTER", MINUTELY + "NVIDIA", TOKENS + "NAVY", DAILY + "GROQ"):
            assert any(var in m for m in warned), (var, warned)
    finally:
        e.close()


def test_valid_env_gives_no_warning(store: str, clock: q.ManualClock, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        e = open_engine(store, clock, {DAILY + "GROQ": "10", MINUTELY + "NVIDIA": "0"})
    e.close()
    assert not [r for r in caplog.records if "PROVIDER_" in r.getMessage()]


# ============================================================================ set_provider_caps / reset


def test_set_provider_caps_int_none_and_omitted(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_provider_caps("groq", daily_requests=10)
    assert caps_of(e, "groq") == (10, None, None)
    e.set_provider_caps("groq", minute_requests=3)  # daily omitted: kept
    assert caps_of(e, "groq") == (10, 3, None)
    e.set_provider_caps("groq", daily_tokens=500)
    assert caps_of(e, "groq") == (10, 3, 500)
    e.set_provider_caps("groq", daily_requests=None)  # None: no cap, the others kept
    assert caps_of(e, "groq") == (None, 3, 500)
    e.set_provider_caps("groq")  # nothing given: nothing changes
    assert caps_of(e, "groq") == (None, 3, 500)
    assert caps_of(e, "cerebras") == (None, None, None)  # per platform


def test_set_provider_caps_omitted_keeps_default(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_provider_caps("nvidia", daily_requests=100)
    assert caps_of(e, "nvidia") == (100, 40, None)
    e.set_provider_caps("openrouter", minute_requests=5)
    assert caps_of(e, "openrouter") == (1000, 5, None)


def test_set_provider_caps_none_removes_a_default(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_provider_caps("nvidia", minute_requests=None)
    assert caps_of(e, "nvidia") == (None, None, None)
    for _ in range(60):
        e.record_request("nvidia", "m", K)
    assert e.can_use_provider_minute("nvidia", K)
    assert e.check("nvidia", "m", K).allowed


def test_cap_of_zero_refuses_everything(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_provider_caps("groq", daily_requests=0)
    assert caps_of(e, "groq") == (0, None, None)
    assert not e.can_use_provider("groq", K)
    adm = e.check("groq", "m", K)
    assert (adm.allowed, adm.reason) == (False, "provider_daily_requests")
    with pytest.raises(q.QuotaExceeded) as exc:
        e.lease("groq", "m", K)
    assert exc.value.reason == "provider_daily_requests"

    e.set_provider_caps("cerebras", minute_requests=0)
    assert not e.can_use_provider_minute("cerebras", K)
    assert e.check("cerebras", "m", K).reason == "provider_minute_requests"

    e.set_provider_caps("mistral", daily_tokens=0)
    assert not e.can_use_provider_tokens("mistral", K, "m", 1)
    assert e.check("mistral", "m", K, 1).reason == "provider_daily_tokens"


def test_set_provider_caps_wins_over_env(store: str, clock: q.ManualClock) -> None:
    env = {DAILY + "GROQ": "5", MINUTELY + "NVIDIA": "7", TOKENS + "NAVY": "0", DAILY + "OPENROUTER": "0"}
    with open_engine(store, clock, env) as e:
        assert caps_of(e, "groq") == (5, None, None)
        e.set_provider_caps("groq", daily_requests=50)
        assert caps_of(e, "groq") == (50, None, None)
        e.set_provider_caps("nvidia", minute_requests=None)  # None beats an env value
        assert caps_of(e, "nvidia") == (None, None, None)
        # An env value of 0 means no cap; an explicit setting still wins over it.
        assert caps_of(e, "navy") == (None, None, None)
        e.set_provider_caps("navy", daily_tokens=99)
        assert caps_of(e, "navy") == (None, None, 99)
        e.set_provider_caps("openrouter", daily_requests=3)
        assert caps_of(e, "openrouter") == (3, None, None)
        for _ in range(3):
            e.record_request("openrouter", "x:free", K)
        assert not e.can_use_provider("openrouter", K)


def test_set_provider_caps_persisted_across_reopen(store: str, clock: q.ManualClock) -> None:
    with open_engine(store, clock) as e:
        e.set_provider_caps("groq", daily_requests=10, minute_requests=0, daily_tokens=777)
        e.set_provider_caps("openrouter", daily_requests=None)
    # A later engine, with an env that says otherwise, still sees the set caps.
    env = {DAILY + "GROQ": "1", MINUTELY + "GROQ": "2", TOKENS + "GROQ": "3", DAILY + "OPENROUTER": "4"}
    with open_engine(store, clock, env) as e:
        assert caps_of(e, "groq") == (10, 0, 777)
        assert caps_of(e, "openrouter") == (None, None, None)
        assert not e.can_use_provider_minute("groq", K)  # minute cap 0 refuses


def test_set_provider_caps_visible_to_second_engine(store: str, clock: q.ManualClock) -> None:
    with open_engine(store, clock) as a, open_engine(store, clock, {DAILY + "GROQ": "100"}) as b:
        assert caps_of(b, "groq") == (100, None, None)
        a.set_provider_caps("groq", daily_requests=2)
        assert caps_of(b, "groq") == (2, None, None)
        a.record_request("groq", "m1", K)
        b.record_request("groq", "m2", K)
        assert not a.can_use_provider("groq", K)
        assert not b.can_use_provider("groq", K)
        assert b.check("groq", "m3", K).reason == "provider_daily_requests"
        # The reset is shared too: each engine falls back to its own env and defaults.
        a.reset_provider_caps("groq")
        assert caps_of(a, "groq") == (None, None, None)
        assert caps_of(b, "groq") == (100, None, None)
        assert b.can_use_provider("groq", K)


def test_reset_provider_caps_restores_env_and_defaults(store: str, clock: q.ManualClock) -> None:
    env = {DAILY + "GROQ": "5", DAILY + "MODELSCOPE": "0"}
    with open_engine(store, clock, env) as e:
        e.set_provider_caps("groq", daily_requests=50, minute_requests=6, daily_tokens=7)
        e.set_provider_caps("openrouter", daily_requests=None, daily_tokens=10)
        e.set_provider_caps("modelscope", daily_requests=9)
        e.set_provider_caps("nvidia", minute_requests=1)
        e.reset_provider_caps("groq")
        assert caps_of(e, "groq") == (5, None, None)
        assert caps_of(e, "openrouter") == (None, None, 10)  # other platforms untouched
        e.reset_provider_caps("openrouter")
        assert caps_of(e, "openrouter") == (1000, None, None)
        e.reset_provider_caps("modelscope")
        assert caps_of(e, "modelscope") == (None, None, None)  # env 0: no cap
        assert caps_of(e, "nvidia") == (None, 1, None)
        e.reset_provider_caps("cerebras")  # nothing set: harmless
        assert caps_of(e, "cerebras") == (None, None, None)
    with open_engine(store, clock) as e:  # the reset is persisted
        assert caps_of(e, "groq") == (None, None, None)
        assert caps_of(e, "openrouter") == (1000, None, None)
        assert caps_of(e, "modelscope") == (1800, None, None)
        assert caps_of(e, "nvidia") == (None, 1, None)


# ============================================================================ the three counts


def test_daily_request_count_all_models_since_midnight(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    e = engine
    clock.set(T0 - 1)  # 23:59:59.999 the day before: not today
    e.record_request("groq", "a", K)
    clock.set(T0)  # exactly midnight: today
    e.record_request("groq", "a", K)
    clock.set(TEN_AM)
    e.record_request("groq", "b", K)
    e.record_request("groq", "c", K)
    e.record_tokens("groq", "c", K, 500)  # tokens are not requests
    e.record_request("groq", "a", 2)  # another key
    e.record_request("cerebras", "a", K)  # another platform
    assert e.provider_daily_request_count("groq", K) == 3
    assert e.provider_daily_request_count("groq", 2) == 1
    assert e.provider_daily_request_count("cerebras", K) == 1
    assert e.provider_daily_request_count("mistral", K) == 0
    clock.set(NEXT_MIDNIGHT - 1)
    assert e.provider_daily_request_count("groq", K) == 3
    clock.set(NEXT_MIDNIGHT)
    assert e.provider_daily_request_count("groq", K) == 0


def test_minute_request_count_slides(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    e = engine
    t = TEN_AM
    e.record_request("groq", "a", K)
    clock.set(t + 20 * SECOND)
    e.record_request("groq", "b", K)
    e.record_request("groq", "b", 2)
    clock.set(t + 40 * SECOND)
    e.record_request("groq", "c", K)
    assert e.provider_minute_request_count("groq", K) == 3
    clock.set(t + MINUTE - 1)
    assert e.provider_minute_request_count("groq", K) == 3
    clock.set(t + MINUTE)  # t > now - 60_000 no longer holds for the first
    assert e.provider_minute_request_count("groq", K) == 2
    clock.set(t + 20 * SECOND + MINUTE)
    assert e.provider_minute_request_count("groq", K) == 1
    assert e.provider_minute_request_count("groq", 2) == 0
    clock.set(t + 40 * SECOND + MINUTE)
    assert e.provider_minute_request_count("groq", K) == 0
    assert e.provider_daily_request_count("groq", K) == 3


def test_counts_include_lease_success(engine: q.QuotaEngine) -> None:
    e = engine
    with e.lease("groq", "a", K, 40) as lease:
        lease.success(tokens=123)
    with e.lease("groq", "b", K, 10):
        pass  # a normal exit is success(tokens=estimated_tokens)
    assert e.provider_daily_request_count("groq", K) == 2
    assert e.provider_minute_request_count("groq", K) == 2
    assert e.provider_daily_token_count("groq", K) == 133


def test_daily_token_count_raw_without_a_token_cap(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    e = engine
    # groq has no daily token cap: the label's multiplier does not apply.
    e.set_model_limits("groq", "a", tpd=100, monthly_token_budget="150K/day · 2x")
    clock.set(T0 - 1)
    e.record_tokens("groq", "a", K, 1000)  # yesterday
    clock.set(TEN_AM)
    e.record_tokens("groq", "a", K, 7)
    e.record_tokens("groq", "b", K, 5)
    e.record_tokens("groq", "b", 2, 100)
    e.record_request("groq", "b", K)  # requests are not tokens
    assert e.provider_daily_token_count("groq", K) == 12
    assert e.provider_daily_token_count("groq", 2) == 100
    clock.set(NEXT_MIDNIGHT)
    assert e.provider_daily_token_count("groq", K) == 0


# ============================================================================ billed tokens


def test_billed_tokens_multiplier_from_label(engine: q.QuotaEngine) -> None:
    e = engine  # navy: daily token cap 150_000 by default
    e.set_model_limits("navy", "double", monthly_token_budget="150K/day · 2x")
    e.set_model_limits("navy", "triple", monthly_token_budget="3x")
    e.set_model_limits("navy", "plain")
    e.record_tokens("navy", "double", K, 100)
    assert e.provider_daily_token_count("navy", K) == 200
    e.record_tokens("navy", "triple", K, 10)
    e.record_tokens("navy", "plain", K, 5)
    e.record_tokens("navy", "unknown-model", K, 1)  # no stored row: multiplier 1
    assert e.provider_daily_token_count("navy", K) == 200 + 30 + 5 + 1


def test_billed_tokens_multiplier_from_tpd(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_model_limits("navy", "third", tpd=50_000)  # 150_000 / 50_000 = 3
    e.set_model_limits("navy", "equal", tpd=150_000)  # not below the cap: 1
    e.set_model_limits("navy", "above", tpd=300_000)  # 1
    e.set_model_limits("navy", "zero", tpd=0)  # 1
    e.record_tokens("navy", "third", K, 10)
    e.record_tokens("navy", "equal", K, 10)
    e.record_tokens("navy", "above", K, 10)
    e.record_tokens("navy", "zero", K, 10)
    assert e.provider_daily_token_count("navy", K) == 30 + 10 + 10 + 10


def test_label_multiplier_wins_over_tpd(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_model_limits("navy", "m", tpd=30_000, monthly_token_budget="150K/day · 2x")  # tpd would give 5
    e.record_tokens("navy", "m", K, 10)
    assert e.provider_daily_token_count("navy", K) == 20


def test_label_without_multiplier_falls_back_to_tpd(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_model_limits("navy", "m", tpd=75_000, monthly_token_budget="150K/day")  # no "Nx": 150_000 / 75_000
    e.record_tokens("navy", "m", K, 10)
    assert e.provider_daily_token_count("navy", K) == 20


def test_billed_tokens_rounded_up_per_model(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_model_limits("navy", "a", tpd=100_000)  # multiplier 1.5
    e.set_model_limits("navy", "b", tpd=100_000)  # multiplier 1.5
    # Per model: two events of 1 token on "a" bill ceil(2 * 1.5) = 3 (not ceil(1.5) + ceil(1.5) = 4).
    e.record_tokens("navy", "a", K, 1)
    e.record_tokens("navy", "a", K, 1)
    assert e.provider_daily_token_count("navy", K) == 3
    e.record_tokens("navy", "b", K, 1)  # b: ceil(1.5) = 2
    assert e.provider_daily_token_count("navy", K) == 3 + 2
    # Rounded per model, not once over the total: a: ceil(4.5) = 5, b: 2 -> 7 (the total ceil(6.0) would be 6).
    e.record_tokens("navy", "a", K, 1)
    assert e.provider_daily_token_count("navy", K) == 5 + 2


def test_billed_tokens_use_the_current_cap(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_model_limits("navy", "m", tpd=50_000)
    e.record_tokens("navy", "m", K, 10)
    assert e.provider_daily_token_count("navy", K) == 30  # 150_000 / 50_000
    e.set_provider_caps("navy", daily_tokens=100_000)
    assert e.provider_daily_token_count("navy", K) == 20  # 100_000 / 50_000
    e.set_provider_caps("navy", daily_tokens=None)
    assert e.provider_daily_token_count("navy", K) == 10  # no cap: raw tokens
    e.set_provider_caps("groq", daily_tokens=1000)
    e.set_model_limits("groq", "g", monthly_token_budget="4x")
    e.record_tokens("groq", "g", K, 10)
    assert e.provider_daily_token_count("groq", K) == 40


def test_token_gate_bills_the_estimate_at_its_model_multiplier(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_provider_caps("navy", daily_tokens=1000)
    e.set_model_limits("navy", "double", monthly_token_budget="150K/day · 2x")
    assert e.can_use_provider_tokens("navy", K, "double", 500)  # 1000 > 1000 is false
    assert not e.can_use_provider_tokens("navy", K, "double", 501)
    assert e.can_use_provider_tokens("navy", K, "plain", 1000)
    e.record_tokens("navy", "double", K, 200)  # billed 400
    assert e.can_use_provider_tokens("navy", K, "plain", 600)
    assert not e.can_use_provider_tokens("navy", K, "plain", 601)
    assert e.can_use_provider_tokens("navy", K, "double", 300)
    assert not e.can_use_provider_tokens("navy", K, "double", 301)
    assert e.can_use_provider_tokens("navy", 2, "double", 500)  # other key


def test_lease_billed_at_its_own_model_multiplier(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_provider_caps("navy", daily_tokens=1000)
    e.set_model_limits("navy", "double", monthly_token_budget="2x")
    e.record_tokens("navy", "plain", K, 800)
    lease = e.acquire_lease("navy", "double", K, 100)  # billed 200, not 100
    assert not e.can_use_provider_tokens("navy", K, "plain", 1)  # 800 + 200 + 1 > 1000
    adm = e.check("navy", "plain", K, 1)
    assert (adm.allowed, adm.reason) == (False, "provider_daily_tokens")
    assert e.can_use_provider_tokens("navy", K, "plain", 0)
    e.release_lease(lease)
    assert e.can_use_provider_tokens("navy", K, "plain", 200)
    assert not e.can_use_provider_tokens("navy", K, "plain", 201)


def test_leases_billed_rounded_up_per_lease(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_provider_caps("navy", daily_tokens=12)
    e.set_model_limits("navy", "half", tpd=8)  # 12 / 8 = 1.5
    e.record_tokens("navy", "plain", K, 6)
    a = e.acquire_lease("navy", "half", K, 1)  # ceil(1.5) = 2
    b = e.acquire_lease("navy", "half", K, 1)  # ceil(1.5) = 2, so 4 in flight (3 if summed first)
    assert e.can_use_provider_tokens("navy", K, "plain", 2)  # 6 + 4 + 2 = 12
    assert not e.can_use_provider_tokens("navy", K, "plain", 3)  # 6 + 4 + 3 = 13 (12 if summed)
    e.release_lease(a)
    assert e.can_use_provider_tokens("navy", K, "plain", 4)  # 6 + 2 + 4
    assert not e.can_use_provider_tokens("navy", K, "plain", 5)
    e.release_lease(b)


# ============================================================================ provider gates in check()/lease()


def test_check_daily_request_cap_reason_and_retry(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    e = engine
    e.set_provider_caps("groq", daily_requests=2)
    e.record_request("groq", "a", K)
    assert e.check("groq", "b", K).allowed
    e.record_request("groq", "b", K)
    adm = e.check("groq", "c", K)
    assert (adm.allowed, adm.reason, adm.retry_at_ms) == (False, "provider_daily_requests", NEXT_MIDNIGHT)
    with pytest.raises(q.QuotaExceeded) as exc:
        e.lease("groq", "c", K)
    err = exc.value
    assert (err.reason, err.retry_at_ms) == ("provider_daily_requests", NEXT_MIDNIGHT)
    assert (err.platform, err.model_id, err.key_id) == ("groq", "c", K)
    assert e.check("groq", "c", 2).allowed
    clock.set(NEXT_MIDNIGHT)
    assert e.check("groq", "c", K).allowed


def test_check_minute_request_cap_reason_and_sliding_retry(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    e = engine
    e.set_provider_caps("groq", minute_requests=2)
    t = TEN_AM
    e.record_request("groq", "a", K)
    clock.set(t + 10 * SECOND)
    e.record_request("groq", "b", K)
    clock.set(t + 20 * SECOND)
    e.record_request("groq", "c", K)
    # 3 in the minute, cap 2: two of the oldest must leave, the second at t + 10 s + 60 s.
    adm = e.check("groq", "d", K)
    assert (adm.allowed, adm.reason, adm.retry_at_ms) == (False, "provider_minute_requests", t + 10 * SECOND + MINUTE)
    with pytest.raises(q.QuotaExceeded) as exc:
        e.lease("groq", "d", K)
    assert (exc.value.reason, exc.value.retry_at_ms) == ("provider_minute_requests", t + 10 * SECOND + MINUTE)
    clock.set(t + MINUTE)
    adm = e.check("groq", "d", K)
    assert (adm.reason, adm.retry_at_ms) == ("provider_minute_requests", t + 10 * SECOND + MINUTE)
    clock.set(t + 10 * SECOND + MINUTE)
    assert e.check("groq", "d", K).allowed


def test_minute_cap_retry_is_none_when_only_leases_block(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_provider_caps("groq", minute_requests=1)
    lease = e.acquire_lease("groq", "a", K)
    adm = e.check("groq", "b", K)
    assert (adm.allowed, adm.reason, adm.retry_at_ms) == (False, "provider_minute_requests", None)
    e.release_lease(lease)
    assert e.check("groq", "b", K).allowed


def test_check_daily_token_cap_reason_and_retry(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    e = engine  # navy default daily token cap 150_000
    e.set_model_limits("navy", "double", monthly_token_budget="150K/day · 2x")
    e.record_tokens("navy", "double", K, 70_000)  # billed 140_000
    assert e.check("navy", "plain", K, 10_000).allowed
    adm = e.check("navy", "plain", K, 10_001)
    assert (adm.allowed, adm.reason, adm.retry_at_ms) == (False, "provider_daily_tokens", NEXT_MIDNIGHT)
    adm = e.check("navy", "double", K, 5_001)  # billed estimate 10_002
    assert (adm.allowed, adm.reason, adm.retry_at_ms) == (False, "provider_daily_tokens", NEXT_MIDNIGHT)
    assert e.check("navy", "double", K, 5_000).allowed
    with pytest.raises(q.QuotaExceeded) as exc:
        e.lease("navy", "double", K, 5_001)
    assert (exc.value.reason, exc.value.retry_at_ms) == ("provider_daily_tokens", NEXT_MIDNIGHT)
    clock.set(NEXT_MIDNIGHT)
    assert e.check("navy", "double", K, 75_000).allowed


def test_route_gates_come_before_provider_gates(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_provider_caps("groq", daily_requests=1)
    e.record_request("groq", "a", K)
    assert e.check("groq", "a", K, limits={"rpm": 1}).reason == "rpm"
    assert e.check("groq", "a", K, limits={"rpd": 1}).reason == "rpd"
    assert e.check("groq", "a", K).reason == "provider_daily_requests"


def test_lease_counts_in_provider_gates(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_provider_caps("groq", daily_requests=3, minute_requests=3, daily_tokens=100)
    with e.lease("groq", "a", K, 30):
        with e.lease("groq", "b", K, 30):
            assert e.can_use_provider("groq", K)
            assert e.can_use_provider_minute("groq", K)
            assert e.can_use_provider_tokens("groq", K, "c", 40)
            assert not e.can_use_provider_tokens("groq", K, "c", 41)  # 60 in flight
            with e.lease("groq", "c", K, 0):
                assert not e.can_use_provider("groq", K)  # 0 recorded + 3 in flight >= 3
                assert not e.can_use_provider_minute("groq", K)
                assert e.check("groq", "d", K).reason == "provider_daily_requests"
                with pytest.raises(q.QuotaExceeded):
                    e.lease("groq", "d", K)
                assert e.can_use_provider("groq", 2)  # leases count on their own key only
    # The leases were recorded on exit: 3 requests, 60 tokens.
    assert e.provider_daily_request_count("groq", K) == 3
    assert e.provider_daily_token_count("groq", K) == 60


def test_lease_refused_by_provider_gate_takes_nothing(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_provider_caps("groq", daily_requests=1)
    held = e.lease("groq", "a", K)
    for _ in range(5):
        with pytest.raises(q.QuotaExceeded):
            e.lease("groq", "b", K)
    held.release()
    # The refused attempts left no lease behind.
    lease = e.lease("groq", "b", K)
    lease.release()


def test_provider_caps_visible_across_engines_for_gates(store: str, clock: q.ManualClock) -> None:
    with (
        open_engine(store, clock, {MINUTELY + "GROQ": "2"}) as a,
        open_engine(store, clock, {MINUTELY + "GROQ": "2"}) as b,
    ):
        a.record_request("groq", "x", K)
        lease = b.acquire_lease("groq", "y", K)
        assert a.provider_minute_request_count("groq", K) == 1
        assert not a.can_use_provider_minute("groq", K)
        assert a.check("groq", "z", K).reason == "provider_minute_requests"
        b.release_lease(lease)
        assert a.can_use_provider_minute("groq", K)


# ============================================================================ SPEC §8.1 pool keys

FIXED_POOLS = {
    "google": "google::project",
    "groq": "groq::account",
    "cerebras": "cerebras::shared",
    "sambanova": "sambanova::shared",
    "nvidia": "nvidia::account",
    "mistral": "mistral::experiment-pool",
    "github": "github::account",
    "cohere": "cohere::trial-pool",
    "cloudflare": "cloudflare::account",
    "zhipu": "zhipu::account",
    "ollama": "ollama::cloud",
    "huggingface": "huggingface::router",
    "modelscope": "modelscope::account",
}
FREE_POOL_AGGREGATORS = [
    "routeway",
    "bazaarlink",
    "unorouter",
    "orcarouter",
    "xkiro",
    "anyapi",
    "navy",
    "nara",
    "sealion",
    "aion",
    "requesty",
]


@pytest.mark.parametrize(
    ("model_id", "pool"),
    [
        ("meta-llama/llama-3.3-70b-instruct:free", "openrouter::free"),
        ("deepseek/deepseek-r1:free", "openrouter::free"),
        ("openai/gpt-4o", "openrouter::account"),
        ("meta-llama/llama-3.3-70b-instruct", "openrouter::account"),
        ("free", "openrouter::account"),
        ("openrouter/free-model", "openrouter::account"),
        (None, "openrouter::account"),
    ],
)
def test_openrouter_pool(model_id: str | None, pool: str) -> None:
    assert q.infer_quota_pool_key("openrouter", model_id) == pool


def test_openrouter_pool_model_defaults_to_none() -> None:
    assert q.infer_quota_pool_key("openrouter") == "openrouter::account"


@pytest.mark.parametrize(("platform", "pool"), sorted(FIXED_POOLS.items()))
def test_fixed_pools(platform: str, pool: str) -> None:
    assert q.infer_quota_pool_key(platform, "some/model-1") == pool
    assert q.infer_quota_pool_key(platform, "other:free") == pool
    assert q.infer_quota_pool_key(platform, None) == pool
    assert q.infer_quota_pool_key(platform) == pool
    assert q.is_shared_pool(platform) is True


@pytest.mark.parametrize("platform", FREE_POOL_AGGREGATORS)
def test_aggregator_free_pools(platform: str) -> None:
    pool = f"{platform}::free"
    assert q.infer_quota_pool_key(platform, "gpt-4o") == pool
    assert q.infer_quota_pool_key(platform, "deepseek/deepseek-r1:free") == pool
    assert q.infer_quota_pool_key(platform, None) == pool
    assert q.infer_quota_pool_key(platform) == pool
    assert q.is_shared_pool(platform) is True


@pytest.mark.parametrize("platform", ["openai", "anthropic", "together", "fireworks", "my-local-llm"])
def test_unknown_platform_pools(platform: str) -> None:
    assert q.infer_quota_pool_key(platform, "gpt-4o-mini") == f"{platform}::gpt-4o-mini"
    assert q.infer_quota_pool_key(platform, "org/model:free") == f"{platform}::org/model:free"
    assert q.infer_quota_pool_key(platform, None) == f"{platform}::account"
    assert q.infer_quota_pool_key(platform) == f"{platform}::account"
    assert q.is_shared_pool(platform) is False


# ============================================================================ bad input (SPEC §13)


def test_set_provider_caps_bad_input(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_provider_caps("groq", daily_requests=5, minute_requests=6, daily_tokens=7)
    with pytest.raises(ValueError):
        e.set_provider_caps("groq", daily_requests=-1)
    with pytest.raises(ValueError):
        e.set_provider_caps("groq", daily_tokens=-100)
    with pytest.raises(TypeError):
        e.set_provider_caps("groq", minute_requests=True)
    with pytest.raises(TypeError):
        e.set_provider_caps("groq", daily_requests=1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        e.set_provider_caps("groq", daily_requests="5")  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        e.set_provider_caps("groq", daily_tokens=2**63)
    with pytest.raises(ValueError):
        e.set_provider_caps("", daily_requests=1)
    # A refused call changed nothing, not even the valid arguments given with the bad one.
    with pytest.raises(ValueError):
        e.set_provider_caps("groq", daily_requests=1, minute_requests=-1)
    assert caps_of(e, "groq") == (5, 6, 7)


def test_pool_functions_refuse_an_empty_platform() -> None:
    with pytest.raises(ValueError):
        q.infer_quota_pool_key("")
    with pytest.raises(ValueError):
        q.infer_quota_pool_key("", "gpt-4o")
    with pytest.raises(ValueError):
        q.is_shared_pool("")
