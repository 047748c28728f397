"""Usage windows (SPEC §4): shape of usage(), sliding minute windows, day windows since UTC midnight,
the clock going back, and where limits come from (SPEC §3.1)."""

from __future__ import annotations

import pytest
import quotaengine as q
from moments import DAY, HOUR, MINUTE, T0

P, M, K = "groq", "llama-3.1-8b", 1


def used(engine: q.QuotaEngine, window: str, *, platform: str = P, model: str = M, key: int = K) -> int:
    return engine.usage(platform, model, key)[window]["used"]


def test_usage_shape_is_exact(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=10, rpd=100, tpm=1000, tpd=None)
    engine.record_request(P, M, K)
    engine.record_tokens(P, M, K, 250)
    u = engine.usage(P, M, K)
    assert u == {
        "rpm": {"used": 1, "limit": 10},
        "rpd": {"used": 1, "limit": 100},
        "tpm": {"used": 250, "limit": 1000},
        "tpd": {"used": 250, "limit": None},
        "in_flight": 0,
    }
    assert type(u["in_flight"]) is int
    for w in ("rpm", "rpd", "tpm", "tpd"):
        assert type(u[w]["used"]) is int


def test_empty_route_reports_zero(engine: q.QuotaEngine) -> None:
    assert engine.usage(P, M, K) == {
        "rpm": {"used": 0, "limit": None},
        "rpd": {"used": 0, "limit": None},
        "tpm": {"used": 0, "limit": None},
        "tpd": {"used": 0, "limit": None},
        "in_flight": 0,
    }


def test_record_tokens_counts_tokens_not_requests(engine: q.QuotaEngine) -> None:
    engine.record_tokens(P, M, K, 100)
    engine.record_tokens(P, M, K, 23)
    u = engine.usage(P, M, K)
    assert (u["rpm"]["used"], u["rpd"]["used"]) == (0, 0)
    assert (u["tpm"]["used"], u["tpd"]["used"]) == (123, 123)


def test_routes_are_counted_apart(engine: q.QuotaEngine) -> None:
    engine.record_request(P, M, K)
    engine.record_request(P, M, K)
    engine.record_request(P, "other-model", K)
    engine.record_request(P, M, 2)
    engine.record_request("cerebras", M, K)
    assert used(engine, "rpm") == 2
    assert used(engine, "rpm", model="other-model") == 1
    assert used(engine, "rpm", key=2) == 1
    assert used(engine, "rpm", platform="cerebras") == 1


def test_minute_windows_slide(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    t = clock.now_ms()
    engine.record_request(P, M, K)
    engine.record_tokens(P, M, K, 40)
    clock.set(t + 59_999)
    assert used(engine, "rpm") == 1
    assert used(engine, "tpm") == 40
    clock.set(t + 60_000)
    assert used(engine, "rpm") == 0
    assert used(engine, "tpm") == 0
    # The day windows still hold them.
    assert used(engine, "rpd") == 1
    assert used(engine, "tpd") == 40


def test_minute_window_keeps_only_the_last_60_seconds(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    t = clock.now_ms()
    for i in range(5):
        clock.set(t + i * 20_000)  # t, +20s, +40s, +60s, +80s
        engine.record_request(P, M, K)
    # now = t+80s: events with ts > t+20s count -> +40s, +60s, +80s
    assert used(engine, "rpm") == 3
    assert used(engine, "rpd") == 5


def test_day_windows_reset_at_utc_midnight(db_path) -> None:
    clock = q.ManualClock(T0 + DAY - 1)  # 2026-01-01 23:59:59.999
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        e.record_request(P, M, K)
        e.record_tokens(P, M, K, 500)
        assert used(e, "rpd") == 1
        assert used(e, "tpd") == 500
        clock.set(T0 + DAY)  # midnight: a new day
        assert used(e, "rpd") == 0
        assert used(e, "tpd") == 0
        # Still inside the sliding minute.
        assert used(e, "rpm") == 1
        assert used(e, "tpm") == 500


def test_event_at_midnight_belongs_to_the_new_day(db_path) -> None:
    clock = q.ManualClock(T0 + DAY)  # 2026-01-02 00:00:00.000
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        e.record_request(P, M, K)
        e.record_tokens(P, M, K, 7)
        clock.set(T0 + 2 * DAY - 1)  # 23:59:59.999 the same day
        assert used(e, "rpd") == 1
        assert used(e, "tpd") == 7
        clock.set(T0 + 2 * DAY)
        assert used(e, "rpd") == 0
        assert used(e, "tpd") == 0


def test_day_window_counts_all_of_today(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    # fixture clock: 10:00. Events at 00:00:00.000, 03:00 and 10:00 count; one at 23:59:59.999 yesterday doesn't.
    clock.set(T0 - 1)
    engine.record_request(P, M, K)
    for t in (T0, T0 + 3 * HOUR, T0 + 10 * HOUR):
        clock.set(t)
        engine.record_request(P, M, K)
    assert used(engine, "rpd") == 3
    assert used(engine, "rpm") == 1


def test_clock_going_back_counts_future_events(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    t = clock.now_ms()
    engine.record_request(P, M, K)
    engine.record_tokens(P, M, K, 9)
    clock.set(t - 10 * MINUTE)  # NTP step back
    u = engine.usage(P, M, K)
    assert u["rpm"]["used"] == 1 and u["tpm"]["used"] == 9
    assert u["rpd"]["used"] == 1 and u["tpd"]["used"] == 9
    # Back past midnight: the event of "tomorrow" still counts in the day windows.
    clock.set(T0 - HOUR)
    u = engine.usage(P, M, K)
    assert u["rpd"]["used"] == 1 and u["tpd"]["used"] == 9
    assert u["rpm"]["used"] == 1
    # Recording and gates keep working in the past.
    engine.record_request(P, M, K)
    assert used(engine, "rpm") == 2
    assert engine.check(P, M, K).allowed
    lease = engine.lease(P, M, K, 3)
    lease.success(tokens=3)
    assert used(engine, "rpm") == 3
    # And forward again: the events age out normally.
    clock.set(t + MINUTE)
    assert used(engine, "rpm") == 0


def test_limits_none_uses_stored_model_limits(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=2, rpd=50, tpm=300, tpd=4000)
    u = engine.usage(P, M, K)
    assert {w: u[w]["limit"] for w in ("rpm", "rpd", "tpm", "tpd")} == {
        "rpm": 2,
        "rpd": 50,
        "tpm": 300,
        "tpd": 4000,
    }
    engine.record_request(P, M, K)
    assert engine.can_make_request(P, M, K)
    engine.record_request(P, M, K)
    assert not engine.can_make_request(P, M, K)
    assert not engine.can_make_request(P, M, K, limits=None)
    # Explicit limits override the stored ones.
    assert engine.can_make_request(P, M, K, limits={"rpm": 3})
    assert engine.usage(P, M, K, limits=q.Limits(rpm=3))["rpm"]["limit"] == 3


def test_set_model_limits_replaces_all_four(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=1, rpd=2, tpm=3, tpd=4)
    assert engine.model_limits(P, M) == q.Limits(rpm=1, rpd=2, tpm=3, tpd=4)
    engine.set_model_limits(P, M, tpm=9)
    assert engine.model_limits(P, M) == q.Limits(rpm=None, rpd=None, tpm=9, tpd=None)


def test_model_without_row_is_unlimited(engine: q.QuotaEngine) -> None:
    assert engine.model_limits(P, "no-such-model") is None
    for _ in range(200):
        engine.record_request(P, "no-such-model", K)
    engine.record_tokens(P, "no-such-model", K, 10**12)
    u = engine.usage(P, "no-such-model", K)
    assert all(u[w]["limit"] is None for w in ("rpm", "rpd", "tpm", "tpd"))
    assert engine.can_make_request(P, "no-such-model", K)
    assert engine.can_use_tokens(P, "no-such-model", K, 10**9)
    assert engine.check(P, "no-such-model", K, 10**9).allowed
    engine.lease(P, "no-such-model", K, 10**9).release()


def test_limits_as_dict_and_as_limits_object(engine: q.QuotaEngine) -> None:
    engine.record_request(P, M, K)
    engine.record_tokens(P, M, K, 100)
    as_dict = {"rpm": 1, "rpd": 5, "tpm": 150, "tpd": None}
    as_obj = q.Limits(rpm=1, rpd=5, tpm=150, tpd=None)
    assert engine.usage(P, M, K, limits=as_dict) == engine.usage(P, M, K, limits=as_obj)
    assert engine.usage(P, M, K, limits=as_dict)["rpm"] == {"used": 1, "limit": 1}
    for lim in (as_dict, as_obj):
        assert not engine.can_make_request(P, M, K, limits=lim)
        assert engine.can_use_tokens(P, M, K, 50, limits=lim)
        assert not engine.can_use_tokens(P, M, K, 51, limits=lim)
        assert engine.check(P, M, K, limits=lim).reason == "rpm"
    # A partial dict: missing keys are unlimited.
    assert engine.can_make_request(P, M, K, limits={"tpm": 1000})


def test_limits_is_frozen_equal_hashable() -> None:
    a = q.Limits(rpm=1, rpd=2, tpm=3, tpd=None)
    b = q.Limits(rpm=1, rpd=2, tpm=3, tpd=None)
    c = q.Limits(rpm=1, rpd=2, tpm=3, tpd=4)
    assert a == b and hash(a) == hash(b)
    assert a != c
    assert len({a, b, c}) == 2
    assert (a.rpm, a.rpd, a.tpm, a.tpd) == (1, 2, 3, None)
    assert q.Limits() == q.Limits(rpm=None, rpd=None, tpm=None, tpd=None)
    assert a.to_dict() == {"rpm": 1, "rpd": 2, "tpm": 3, "tpd": None}
    with pytest.raises(AttributeError):
        a.rpm = 5  # type: ignore[misc]
    assert a.rpm == 1


def test_usage_counts_live_leases_apart(engine: q.QuotaEngine) -> None:
    engine.record_request(P, M, K)
    lease = engine.lease(P, M, K, 40)
    u = engine.usage(P, M, K)
    assert u["rpm"]["used"] == 1 and u["tpm"]["used"] == 0
    assert u["in_flight"] == 1
    lease.release()
    assert engine.usage(P, M, K)["in_flight"] == 0
