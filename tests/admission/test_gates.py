"""Hard gates, check() and its retry times (SPEC §4), provider caps (SPEC §8 table, set/reset) and the key
concurrency cap (SPEC §5)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import quotaengine as q
from moments import DAY, HOUR, MINUTE, T0, TEN_AM

NEXT_MIDNIGHT = T0 + DAY
P, M, K = "groq", "llama-3.1-8b", 1


def make(db_path: Path, clock: q.ManualClock, **env: str) -> q.QuotaEngine:
    return q.QuotaEngine(db_path, clock=clock, env=env)


# ---------------------------------------------------------------------------- route gates


def test_can_make_request_rpm_threshold(engine: q.QuotaEngine) -> None:
    lim = {"rpm": 3}
    engine.record_request(P, M, K)
    engine.record_request(P, M, K)
    assert engine.can_make_request(P, M, K, limits=lim)  # 2 < 3
    engine.record_request(P, M, K)
    assert not engine.can_make_request(P, M, K, limits=lim)  # 3 >= 3
    # Another key or model is not affected.
    assert engine.can_make_request(P, M, 2, limits=lim)
    assert engine.can_make_request(P, "other", K, limits=lim)


def test_can_make_request_counts_leases(engine: q.QuotaEngine) -> None:
    lim = {"rpm": 3}
    engine.record_request(P, M, K)
    a = engine.acquire_lease(P, M, K)
    assert engine.can_make_request(P, M, K, limits=lim)  # 1 + 1 < 3
    b = engine.acquire_lease(P, M, K)
    assert not engine.can_make_request(P, M, K, limits=lim)  # 1 + 2 >= 3
    engine.release_lease(b)
    assert engine.can_make_request(P, M, K, limits=lim)
    engine.release_lease(a)


def test_can_make_request_rpd_threshold(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    lim = {"rpd": 3}
    for _ in range(2):
        engine.record_request(P, M, K)
        clock.advance(10 * MINUTE)
    assert engine.can_make_request(P, M, K, limits=lim)
    lease = engine.lease(P, M, K)
    assert not engine.can_make_request(P, M, K, limits=lim)  # 2 recorded + 1 in flight
    lease.release()
    engine.record_request(P, M, K)
    clock.advance(10 * MINUTE)
    assert not engine.can_make_request(P, M, K, limits=lim)
    clock.set(NEXT_MIDNIGHT)
    assert engine.can_make_request(P, M, K, limits=lim)


def test_rpm_of_zero_refuses(engine: q.QuotaEngine) -> None:
    assert not engine.can_make_request(P, M, K, limits={"rpm": 0})
    assert engine.check(P, M, K, limits={"rpm": 0}).reason == "rpm"


def test_can_use_tokens_tpm_threshold(engine: q.QuotaEngine) -> None:
    lim = {"tpm": 100}
    engine.record_tokens(P, M, K, 60)
    assert engine.can_use_tokens(P, M, K, 40, limits=lim)  # 60 + 40 = 100, not > 100
    assert not engine.can_use_tokens(P, M, K, 41, limits=lim)
    lease = engine.lease(P, M, K, 10, limits=lim)
    assert engine.can_use_tokens(P, M, K, 30, limits=lim)  # 60 + 10 + 30 = 100
    assert not engine.can_use_tokens(P, M, K, 31, limits=lim)
    lease.release()
    assert engine.can_use_tokens(P, M, K, 40, limits=lim)


def test_can_use_tokens_tpd_threshold(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    lim = {"tpd": 1000}
    engine.record_tokens(P, M, K, 900)
    clock.advance(2 * HOUR)
    assert engine.can_use_tokens(P, M, K, 100, limits=lim)
    assert not engine.can_use_tokens(P, M, K, 101, limits=lim)
    lease = engine.lease(P, M, K, 50, limits=lim)
    assert engine.can_use_tokens(P, M, K, 50, limits=lim)
    assert not engine.can_use_tokens(P, M, K, 51, limits=lim)
    lease.release()
    clock.set(NEXT_MIDNIGHT)
    assert engine.can_use_tokens(P, M, K, 1000, limits=lim)


def test_estimate_alone_over_limit_refuses(engine: q.QuotaEngine) -> None:
    assert engine.can_use_tokens(P, M, K, 100, limits={"tpm": 100})
    assert not engine.can_use_tokens(P, M, K, 101, limits={"tpm": 100})
    adm = engine.check(P, M, K, 101, limits={"tpm": 100})
    assert (adm.allowed, adm.reason, adm.retry_at_ms) == (False, "tpm", None)


def test_is_on_cooldown_until_expiry(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    assert not engine.is_on_cooldown(P, M, K)
    engine.set_cooldown(P, M, K, duration_ms=1_000)
    assert engine.is_on_cooldown(P, M, K)
    assert not engine.is_on_cooldown(P, M, 2)
    clock.advance(999)
    assert engine.is_on_cooldown(P, M, K)
    clock.advance(1)
    assert not engine.is_on_cooldown(P, M, K)


# ---------------------------------------------------------------------------- provider gates


def test_provider_daily_cap_counts_all_models_of_the_key(db_path: Path, clock: q.ManualClock) -> None:
    with make(db_path, clock, PROVIDER_DAILY_REQUEST_CAP_GROQ="3") as e:
        assert e.provider_caps(P).daily_requests == 3
        e.record_request(P, "a", K)
        clock.advance(5 * MINUTE)
        e.record_request(P, "b", K)
        assert e.can_use_provider(P, K)
        assert e.provider_daily_request_count(P, K) == 2
        lease = e.acquire_lease(P, "c", K)
        assert not e.can_use_provider(P, K)  # 2 + 1 in flight >= 3
        assert e.can_use_provider(P, 2)  # other key
        assert e.can_use_provider("cerebras", K)  # other platform
        e.release_lease(lease)
        assert e.can_use_provider(P, K)
        e.record_request(P, "c", K)
        assert not e.can_use_provider(P, K)
        assert e.provider_daily_request_count(P, K) == 3
        clock.set(NEXT_MIDNIGHT)
        assert e.can_use_provider(P, K)
        assert e.provider_daily_request_count(P, K) == 0


def test_provider_minute_cap_slides(db_path: Path, clock: q.ManualClock) -> None:
    with make(db_path, clock, PROVIDER_MINUTE_REQUEST_CAP_GROQ="2") as e:
        t = clock.now_ms()
        e.record_request(P, "a", K)
        assert e.can_use_provider_minute(P, K)
        lease = e.acquire_lease(P, "b", K)
        assert not e.can_use_provider_minute(P, K)
        e.release_lease(lease)
        clock.advance(1000)
        e.record_request(P, "b", K)
        assert not e.can_use_provider_minute(P, K)
        assert e.provider_minute_request_count(P, K) == 2
        clock.set(t + 59_999)
        assert not e.can_use_provider_minute(P, K)
        clock.set(t + 60_000)
        assert e.can_use_provider_minute(P, K)
        assert e.provider_minute_request_count(P, K) == 1


def test_provider_daily_token_cap(db_path: Path, clock: q.ManualClock) -> None:
    with make(db_path, clock, PROVIDER_DAILY_TOKEN_CAP_GROQ="1000") as e:
        e.record_tokens(P, "a", K, 600)
        assert e.can_use_provider_tokens(P, K, "b", 400)
        assert not e.can_use_provider_tokens(P, K, "b", 401)
        lease = e.acquire_lease(P, "c", K, 100)
        assert e.can_use_provider_tokens(P, K, "b", 300)
        assert not e.can_use_provider_tokens(P, K, "b", 301)
        assert e.can_use_provider_tokens(P, 2, "b", 1000)
        e.release_lease(lease)
        assert e.provider_daily_token_count(P, K) == 600
        clock.set(NEXT_MIDNIGHT)
        assert e.can_use_provider_tokens(P, K, "b", 1000)


def test_default_caps(engine: q.QuotaEngine) -> None:
    def caps(p: str) -> tuple[int | None, int | None, int | None]:
        c = engine.provider_caps(p)
        return (c.daily_requests, c.minute_requests, c.daily_tokens)

    assert caps("openrouter") == (1000, None, None)
    assert caps("modelscope") == (1800, None, None)
    assert caps("nvidia") == (None, 40, None)
    assert caps("navy") == (None, None, 150_000)
    assert caps("groq") == (None, None, None)


def test_default_nvidia_minute_cap_is_40(engine: q.QuotaEngine) -> None:
    for i in range(40):
        assert engine.can_use_provider_minute("nvidia", K), i
        engine.record_request("nvidia", f"model-{i % 3}", K)
    assert not engine.can_use_provider_minute("nvidia", K)
    adm = engine.check("nvidia", "model-9", K)
    assert (adm.allowed, adm.reason) == (False, "provider_minute_requests")
    with pytest.raises(q.QuotaExceeded) as exc:
        engine.lease("nvidia", "model-9", K)
    assert exc.value.reason == "provider_minute_requests"
    assert engine.can_use_provider_minute("nvidia", 2)


def test_default_openrouter_daily_cap_is_1000() -> None:
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(":memory:", clock=clock, env={}) as e:
        for i in range(1000):
            if i % 100 == 0:
                assert e.can_use_provider("openrouter", K)
                clock.advance(MINUTE)
            e.record_request("openrouter", f"m{i % 7}:free", K)
        assert not e.can_use_provider("openrouter", K)
        assert e.check("openrouter", "x", K).reason == "provider_daily_requests"


def test_default_navy_daily_token_cap(engine: q.QuotaEngine) -> None:
    engine.record_tokens("navy", "some-model", K, 149_990)
    assert engine.can_use_provider_tokens("navy", K, "other-model", 10)
    assert not engine.can_use_provider_tokens("navy", K, "other-model", 11)


def test_env_zero_disables_a_default_cap(db_path: Path, clock: q.ManualClock) -> None:
    with make(db_path, clock, PROVIDER_MINUTE_REQUEST_CAP_NVIDIA="0", PROVIDER_DAILY_REQUEST_CAP_OPENROUTER="0") as e:
        assert e.provider_caps("nvidia").minute_requests is None
        assert e.provider_caps("openrouter").daily_requests is None
        for _ in range(45):
            e.record_request("nvidia", "m", K)
        assert e.can_use_provider_minute("nvidia", K)
        assert e.check("nvidia", "m", K).allowed


def test_env_garbage_is_ignored_with_a_warning(
    db_path: Path, clock: q.ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="quotaengine"):
        e = make(db_path, clock, PROVIDER_MINUTE_REQUEST_CAP_NVIDIA="lots", PROVIDER_DAILY_REQUEST_CAP_GROQ="-5")
    try:
        assert e.provider_caps("nvidia").minute_requests == 40  # default stands
        assert e.provider_caps(P).daily_requests is None  # no default for groq
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("quotaengine")]
        assert any("PROVIDER_MINUTE_REQUEST_CAP_NVIDIA" in r.getMessage() for r in warnings)
        assert any("PROVIDER_DAILY_REQUEST_CAP_GROQ" in r.getMessage() for r in warnings)
        assert e.check("nvidia", "m", K).allowed
    finally:
        e.close()


def test_env_is_read_from_the_mapping_not_os_environ(
    db_path: Path, clock: q.ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROVIDER_DAILY_REQUEST_CAP_GROQ", "1")
    with make(db_path, clock) as e:
        assert e.provider_caps(P).daily_requests is None
    with q.QuotaEngine(db_path, clock=clock) as e:  # env=None -> os.environ
        assert e.provider_caps(P).daily_requests == 1


# ---------------------------------------------------------------------------- key concurrency


def count_admitted_by_concurrency(e: q.QuotaEngine, platform: str, key: int, limit: int = 50) -> int:
    ids = []
    while e.can_use_key_concurrency(platform, key) and len(ids) < limit:
        ids.append(e.acquire_lease(platform, f"m{len(ids)}", key))
    for i in ids:
        e.release_lease(i)
    return len(ids)


def test_key_concurrency_default_is_no_cap(engine: q.QuotaEngine) -> None:
    assert count_admitted_by_concurrency(engine, P, K) == 50


def test_key_concurrency_global_cap(db_path: Path, clock: q.ManualClock) -> None:
    with make(db_path, clock, MAX_CONCURRENT_REQUESTS_PER_KEY="2") as e:
        a = e.lease(P, "a", K)
        assert e.can_use_key_concurrency(P, K)
        b = e.lease(P, "b", K)
        assert not e.can_use_key_concurrency(P, K)  # 2 >= 2
        assert e.can_use_key_concurrency(P, 2)
        adm = e.check(P, "c", K)
        assert (adm.allowed, adm.reason, adm.retry_at_ms) == (False, "key_concurrency", None)
        with pytest.raises(q.QuotaExceeded) as exc:
            e.lease(P, "c", K)
        assert exc.value.reason == "key_concurrency"
        assert exc.value.retry_at_ms is None
        a.release()
        assert e.can_use_key_concurrency(P, K)
        b.success()
        assert count_admitted_by_concurrency(e, "cerebras", K) == 2


def test_key_concurrency_platform_cap_wins(db_path: Path, clock: q.ManualClock) -> None:
    env = {
        "MAX_CONCURRENT_REQUESTS_PER_KEY": "2",
        "MAX_CONCURRENT_REQUESTS_PER_KEY_GROQ": "3",
        "MAX_CONCURRENT_REQUESTS_PER_KEY_CEREBRAS": "0",
        "MAX_CONCURRENT_REQUESTS_PER_KEY_NVIDIA": "-4",
        "MAX_CONCURRENT_REQUESTS_PER_KEY_MISTRAL": "many",
    }
    with q.QuotaEngine(db_path, clock=clock, env=env) as e:
        assert count_admitted_by_concurrency(e, "groq", K) == 3
        assert count_admitted_by_concurrency(e, "cerebras", K) == 2  # non-positive ignored
        assert count_admitted_by_concurrency(e, "nvidia", K) == 2
        assert count_admitted_by_concurrency(e, "mistral", K) == 2
        assert count_admitted_by_concurrency(e, "github", K) == 2


def test_key_concurrency_platform_only(db_path: Path, clock: q.ManualClock) -> None:
    with make(db_path, clock, MAX_CONCURRENT_REQUESTS_PER_KEY_GROQ="1") as e:
        assert count_admitted_by_concurrency(e, "groq", K) == 1
        assert count_admitted_by_concurrency(e, "cerebras", K) == 50


def test_key_concurrency_nonpositive_global_is_no_cap(db_path: Path, clock: q.ManualClock) -> None:
    with make(db_path, clock, MAX_CONCURRENT_REQUESTS_PER_KEY="0") as e:
        assert count_admitted_by_concurrency(e, P, K) == 50


# ---------------------------------------------------------------------------- check(): order and retry times


def test_check_allowed(engine: q.QuotaEngine) -> None:
    adm = engine.check(P, M, K, 10, limits={"rpm": 5, "rpd": 5, "tpm": 100, "tpd": 100})
    assert isinstance(adm, q.Admission)
    assert (adm.allowed, adm.reason, adm.retry_at_ms) == (True, None, None)
    assert adm


def test_check_reasons_in_spec_order(db_path: Path, clock: q.ManualClock) -> None:
    env = {
        "PROVIDER_DAILY_REQUEST_CAP_GROQ": "1",
        "PROVIDER_MINUTE_REQUEST_CAP_GROQ": "1",
        "PROVIDER_DAILY_TOKEN_CAP_GROQ": "1",
        "MAX_CONCURRENT_REQUESTS_PER_KEY_GROQ": "1",
    }
    with q.QuotaEngine(db_path, clock=clock, env=env) as e:
        # Every gate fails at once.
        e.record_request(P, M, K)
        e.record_tokens(P, M, K, 5)
        other = e.acquire_lease(P, "other-model", K)  # holds the key's one concurrency slot
        e.set_cooldown(P, M, K, duration_ms=30_000)
        tight = {"rpm": 1, "rpd": 1, "tpm": 1, "tpd": 1}

        def reason(limits: dict[str, int | None]) -> str | None:
            adm = e.check(P, M, K, 1, limits=limits)
            assert adm.allowed is (adm.reason is None)
            return adm.reason

        assert reason(tight) == "cooldown"
        with pytest.raises(q.QuotaExceeded) as exc:
            e.lease(P, M, K, 1, limits=tight)
        assert exc.value.reason == "cooldown"
        e.clear_cooldown_early(P, M, K)
        assert reason(tight) == "rpm"
        assert reason({**tight, "rpm": None}) == "rpd"
        assert reason({**tight, "rpm": None, "rpd": None}) == "tpm"
        assert reason({"rpm": None, "rpd": None, "tpm": None, "tpd": 1}) == "tpd"
        free: dict[str, int | None] = {"rpm": None, "rpd": None, "tpm": None, "tpd": None}
        assert reason(free) == "provider_daily_requests"
        e.set_provider_caps(P, daily_requests=None)
        assert reason(free) == "provider_minute_requests"
        e.set_provider_caps(P, minute_requests=None)
        assert reason(free) == "provider_daily_tokens"
        e.set_provider_caps(P, daily_tokens=None)
        assert reason(free) == "key_concurrency"
        e.release_lease(other)
        assert reason(free) is None


def test_retry_at_cooldown_expiry(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.set_cooldown(P, M, K, duration_ms=45_000)
    adm = engine.check(P, M, K)
    assert (adm.reason, adm.retry_at_ms) == ("cooldown", TEN_AM + 45_000)


def test_retry_at_sliding_window_oldest_leaves(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    t0 = clock.now_ms()
    engine.record_request(P, M, K)
    clock.set(t0 + 1000)
    engine.record_request(P, M, K)
    clock.set(t0 + 2000)
    adm = engine.check(P, M, K, limits={"rpm": 2})
    assert (adm.reason, adm.retry_at_ms) == ("rpm", t0 + 60_000)
    # With three events and rpm=2 two must leave: the second one leaves at t0+61_000.
    engine.record_request(P, M, K)
    adm = engine.check(P, M, K, limits={"rpm": 2})
    assert (adm.reason, adm.retry_at_ms) == ("rpm", t0 + 61_000)
    with pytest.raises(q.QuotaExceeded) as exc:
        engine.lease(P, M, K, limits={"rpm": 2})
    assert (exc.value.reason, exc.value.retry_at_ms) == ("rpm", t0 + 61_000)
    # The retry time is right: the gate opens exactly then.
    clock.set(t0 + 60_999)
    assert not engine.can_make_request(P, M, K, limits={"rpm": 2})
    clock.set(t0 + 61_000)
    assert engine.can_make_request(P, M, K, limits={"rpm": 2})


def test_retry_at_sliding_window_with_a_lease(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    t0 = clock.now_ms()
    engine.record_request(P, M, K)
    clock.advance(5_000)
    engine.acquire_lease(P, M, K)
    adm = engine.check(P, M, K, limits={"rpm": 2})
    assert (adm.reason, adm.retry_at_ms) == ("rpm", t0 + 60_000)


def test_retry_at_none_when_only_leases_block(engine: q.QuotaEngine) -> None:
    engine.acquire_lease(P, M, K, 50)
    engine.acquire_lease(P, M, K, 50)
    adm = engine.check(P, M, K, limits={"rpm": 2})
    assert (adm.allowed, adm.reason, adm.retry_at_ms) == (False, "rpm", None)
    adm = engine.check(P, M, K, 1, limits={"tpm": 100})
    assert (adm.allowed, adm.reason, adm.retry_at_ms) == (False, "tpm", None)


def test_retry_at_tpm_oldest_tokens_leave(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    t0 = clock.now_ms()
    engine.record_tokens(P, M, K, 60)
    clock.set(t0 + 1000)
    engine.record_tokens(P, M, K, 30)
    clock.set(t0 + 2000)
    adm = engine.check(P, M, K, 20, limits={"tpm": 100})  # 90 + 20 > 100: the 60 must leave
    assert (adm.reason, adm.retry_at_ms) == ("tpm", t0 + 60_000)
    adm = engine.check(P, M, K, 80, limits={"tpm": 100})  # both must leave
    assert (adm.reason, adm.retry_at_ms) == ("tpm", t0 + 61_000)


@pytest.mark.parametrize(
    ("limits", "reason"),
    [({"rpd": 1}, "rpd"), ({"tpd": 10}, "tpd")],
)
def test_retry_at_next_midnight_for_day_windows(
    engine: q.QuotaEngine, clock: q.ManualClock, limits: dict[str, int], reason: str
) -> None:
    clock.set(T0 + 3 * HOUR)
    engine.record_request(P, M, K)
    engine.record_tokens(P, M, K, 10)
    clock.set(T0 + 20 * HOUR)
    adm = engine.check(P, M, K, 1, limits=limits)
    assert (adm.allowed, adm.reason, adm.retry_at_ms) == (False, reason, NEXT_MIDNIGHT)


def test_retry_at_next_midnight_for_daily_caps(db_path: Path, clock: q.ManualClock) -> None:
    env = {"PROVIDER_DAILY_REQUEST_CAP_GROQ": "1", "PROVIDER_DAILY_TOKEN_CAP_CEREBRAS": "10"}
    with q.QuotaEngine(db_path, clock=clock, env=env) as e:
        e.record_request(P, "a", K)
        adm = e.check(P, "b", K)
        assert (adm.reason, adm.retry_at_ms) == ("provider_daily_requests", NEXT_MIDNIGHT)
        e.record_tokens("cerebras", "a", K, 10)
        adm = e.check("cerebras", "b", K, 1)
        assert (adm.reason, adm.retry_at_ms) == ("provider_daily_tokens", NEXT_MIDNIGHT)


def test_retry_at_provider_minute_cap(db_path: Path, clock: q.ManualClock) -> None:
    with make(db_path, clock, PROVIDER_MINUTE_REQUEST_CAP_GROQ="2") as e:
        t0 = clock.now_ms()
        e.record_request(P, "a", K)
        clock.set(t0 + 1000)
        e.record_request(P, "b", K)
        adm = e.check(P, "c", K)
        assert (adm.reason, adm.retry_at_ms) == ("provider_minute_requests", t0 + 60_000)


# ---------------------------------------------------------------------------- set / reset provider caps


def test_set_provider_caps(db_path: Path, clock: q.ManualClock) -> None:
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        e.set_provider_caps(P, daily_requests=5, daily_tokens=100)
        assert e.provider_caps(P) == e.provider_caps(P)
        c = e.provider_caps(P)
        assert isinstance(c, q.ProviderCaps)
        assert (c.daily_requests, c.minute_requests, c.daily_tokens) == (5, None, 100)
        e.set_provider_caps(P, minute_requests=7)  # omitted ones keep
        c = e.provider_caps(P)
        assert (c.daily_requests, c.minute_requests, c.daily_tokens) == (5, 7, 100)
        e.set_provider_caps(P, daily_tokens=None)  # None: no cap
        c = e.provider_caps(P)
        assert (c.daily_requests, c.minute_requests, c.daily_tokens) == (5, 7, None)
        e.set_provider_caps("nvidia", minute_requests=None)  # removes a default
        assert e.provider_caps("nvidia").minute_requests is None
        for _ in range(45):
            e.record_request("nvidia", "m", K)
        assert e.can_use_provider_minute("nvidia", K)
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:  # persisted
        c = e.provider_caps(P)
        assert (c.daily_requests, c.minute_requests, c.daily_tokens) == (5, 7, None)
        assert e.provider_caps("nvidia").minute_requests is None


def test_set_provider_cap_zero_refuses_everything(engine: q.QuotaEngine) -> None:
    engine.set_provider_caps(P, daily_requests=0)
    assert not engine.can_use_provider(P, K)
    assert engine.check(P, M, K).reason == "provider_daily_requests"
    engine.set_provider_caps(P, daily_requests=None, daily_tokens=0)
    assert not engine.can_use_provider_tokens(P, K, M, 1)


def test_set_provider_caps_wins_over_env_and_reset_restores(db_path: Path, clock: q.ManualClock) -> None:
    env = {"PROVIDER_DAILY_REQUEST_CAP_GROQ": "3", "PROVIDER_MINUTE_REQUEST_CAP_NVIDIA": "0"}
    with q.QuotaEngine(db_path, clock=clock, env=env) as e:
        assert e.provider_caps(P).daily_requests == 3
        e.set_provider_caps(P, daily_requests=10)
        e.set_provider_caps("nvidia", minute_requests=5)
        assert e.provider_caps(P).daily_requests == 10
    with q.QuotaEngine(db_path, clock=clock, env=env) as e:
        assert e.provider_caps(P).daily_requests == 10
        assert e.provider_caps("nvidia").minute_requests == 5
        for _ in range(4):
            e.record_request(P, M, K)
        assert e.can_use_provider(P, K)  # 4 < 10 although env says 3
        e.reset_provider_caps(P)
        assert e.provider_caps(P).daily_requests == 3
        assert not e.can_use_provider(P, K)
        e.reset_provider_caps("nvidia")
        assert e.provider_caps("nvidia").minute_requests is None  # env 0 = no cap
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        assert e.provider_caps(P).daily_requests is None
        assert e.provider_caps("nvidia").minute_requests == 40  # the default again
