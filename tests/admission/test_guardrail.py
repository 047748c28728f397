"""The routing guardrail (SPEC §9): model_window_used_fraction over one usage snapshot reused for
window_usage_ttl_ms, following the key with the most headroom; invalidate_window_usage; and the hard gates,
which never use the snapshot."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import quotaengine as q

T0 = 1_767_225_600_000  # 2026-01-01 00:00 UTC
SECOND = 1_000
MINUTE = 60_000
HOUR = 3_600_000
DAY = 86_400_000
TEN_AM = T0 + 10 * HOUR
P, M = "groq", "llama-3.3-70b"
TTL = 5_000


@pytest.fixture
def guard_clock() -> q.ManualClock:
    return q.ManualClock(TEN_AM)


@pytest.fixture
def guard(store: str, guard_clock: q.ManualClock) -> Iterator[q.QuotaEngine]:
    e = q.QuotaEngine(store, clock=guard_clock, env={})
    yield e
    e.close()


def requests(e: q.QuotaEngine, n: int, key: int, model: str = M, platform: str = P) -> None:
    for _ in range(n):
        e.record_request(platform, model, key)


def frac(e: q.QuotaEngine, model: str = M, platform: str = P, **kw: object) -> float | None:
    e.invalidate_window_usage()
    return e.model_window_used_fraction(platform, model, **kw)  # type: ignore[arg-type]


# ============================================================================ None cases


def test_none_without_window_limits(guard: q.QuotaEngine) -> None:
    guard.register_key(1, P)
    requests(guard, 3, 1)
    assert frac(guard) is None  # no stored row: unlimited
    guard.set_model_limits(P, M)  # a row with no limits
    assert frac(guard) is None
    guard.set_model_limits(P, M, monthly_token_budget="150K/day · 2x")  # a label is no window limit
    assert frac(guard) is None
    assert frac(guard, limits={"rpm": None, "rpd": None, "tpm": None, "tpd": None}) is None
    assert frac(guard, limits=q.Limits()) is None


def test_none_without_registered_key(guard: q.QuotaEngine) -> None:
    guard.set_model_limits(P, M, rpm=10)
    requests(guard, 5, 1)
    assert frac(guard) is None
    guard.register_key(1, "cerebras")  # a key of another platform does not serve groq
    assert frac(guard) is None
    guard.register_key(2, P)
    assert frac(guard) == 0.0


def test_disabled_keys_do_not_count(guard: q.QuotaEngine) -> None:
    guard.set_model_limits(P, M, rpm=10)
    guard.register_key(1, P, enabled=False)
    assert frac(guard) is None
    guard.register_key(2, P)
    requests(guard, 6, 2)
    # Key 1 is idle but disabled: the answer follows key 2, the only routable one.
    assert frac(guard) == pytest.approx(0.6)
    guard.register_key(2, P, enabled=False)  # upsert
    assert frac(guard) is None
    guard.register_key(1, P, enabled=True)
    assert frac(guard) == 0.0


def test_key_id_restricts_to_that_key(guard: q.QuotaEngine) -> None:
    guard.set_model_limits(P, M, rpm=10)
    guard.register_key(1, P)
    guard.register_key(2, P)
    guard.register_key(3, P, enabled=False)
    guard.register_key(4, "cerebras")
    requests(guard, 8, 1)
    requests(guard, 2, 2)
    assert frac(guard) == pytest.approx(0.2)
    assert frac(guard, key_id=1) == pytest.approx(0.8)
    assert frac(guard, key_id=2) == pytest.approx(0.2)
    assert frac(guard, key_id=3) is None  # disabled
    assert frac(guard, key_id=4) is None  # another platform's key
    assert frac(guard, key_id=99) is None  # not registered


# ============================================================================ per-key value and key choice


def test_worst_window_per_key(guard: q.QuotaEngine, guard_clock: q.ManualClock) -> None:
    guard.register_key(1, P)
    guard.set_model_limits(P, M, rpm=10, rpd=100, tpm=1000, tpd=10_000)
    requests(guard, 5, 1)  # rpm 0.5, rpd 0.05
    guard.record_tokens(P, M, 1, 900)  # tpm 0.9, tpd 0.09
    assert frac(guard) == pytest.approx(0.9)
    guard_clock.advance(MINUTE)  # the minute windows empty; the day windows remain
    assert frac(guard) == pytest.approx(0.09)
    requests(guard, 15, 1)  # rpm 1.5: the worst
    assert frac(guard) == pytest.approx(1.5)
    guard_clock.advance(MINUTE)
    assert frac(guard) == pytest.approx(0.2)  # rpd 20 / 100


def test_only_declared_windows_count(guard: q.QuotaEngine) -> None:
    guard.register_key(1, P)
    guard.set_model_limits(P, M, tpd=1000)
    requests(guard, 50, 1)  # requests are not limited
    guard.record_tokens(P, M, 1, 250)
    assert frac(guard) == pytest.approx(0.25)


def test_day_windows_since_midnight(guard: q.QuotaEngine, guard_clock: q.ManualClock) -> None:
    guard.register_key(1, P)
    guard.set_model_limits(P, M, rpd=10)
    guard_clock.set(T0 - 1)
    requests(guard, 5, 1)  # yesterday
    guard_clock.set(T0)
    requests(guard, 2, 1)
    guard_clock.set(TEN_AM)
    assert frac(guard) == pytest.approx(0.2)
    guard_clock.set(T0 + DAY)
    assert frac(guard) == 0.0


def test_declared_limit_zero_counts_as_full(guard: q.QuotaEngine) -> None:
    guard.register_key(1, P)
    guard.set_model_limits(P, M, rpm=0, tpd=1000)
    assert frac(guard) == 1.0
    assert frac(guard, limits={"tpm": 0}) == 1.0
    guard.record_tokens(P, M, 1, 100)
    assert frac(guard, limits={"rpd": 0, "tpd": 1000}) == 1.0


def test_answer_follows_the_key_with_most_headroom(guard: q.QuotaEngine) -> None:
    guard.set_model_limits(P, M, rpm=10, tpm=1000)
    guard.register_key(1, P)
    guard.register_key(2, P)
    guard.register_key(3, P)
    requests(guard, 10, 1)  # key 1: 1.0
    requests(guard, 3, 2)  # key 2: rpm 0.3 ...
    guard.record_tokens(P, M, 2, 700)  # ... tpm 0.7 -> 0.7
    requests(guard, 6, 3)  # key 3: 0.6
    assert frac(guard) == pytest.approx(0.6)
    requests(guard, 4, 3)  # key 3: 1.0
    assert frac(guard) == pytest.approx(0.7)
    guard.register_key(4, P)  # an idle key
    assert frac(guard) == 0.0


def test_usage_of_other_models_and_platforms_does_not_count(guard: q.QuotaEngine) -> None:
    guard.set_model_limits(P, M, rpm=10)
    guard.set_model_limits(P, "other", rpm=10)
    guard.register_key(1, P)
    requests(guard, 9, 1, model="other")
    requests(guard, 9, 1, platform="cerebras")
    requests(guard, 2, 1)
    assert frac(guard) == pytest.approx(0.2)
    assert frac(guard, model="other") == pytest.approx(0.9)


def test_in_flight_leases_not_counted(guard: q.QuotaEngine) -> None:
    guard.set_model_limits(P, M, rpm=4, tpm=100)
    guard.register_key(1, P)
    requests(guard, 1, 1)
    leases = [guard.acquire_lease(P, M, 1, 20) for _ in range(2)]
    assert frac(guard) == pytest.approx(0.25)
    for lid in leases:
        guard.release_lease(lid)


def test_limits_argument_overrides_stored_limits(guard: q.QuotaEngine) -> None:
    guard.set_model_limits(P, M, rpm=10)
    guard.register_key(1, P)
    requests(guard, 5, 1)
    assert frac(guard) == pytest.approx(0.5)
    assert frac(guard, limits={"rpm": 20}) == pytest.approx(0.25)
    assert frac(guard, limits=q.Limits(rpm=50)) == pytest.approx(0.1)
    assert frac(guard, limits={"rpd": 100}) == pytest.approx(0.05)  # replaces all four: rpm not declared
    # A model without a stored row measured against given limits.
    requests(guard, 3, 1, model="unstored")
    assert frac(guard, model="unstored") is None
    assert frac(guard, model="unstored", limits={"rpm": 4}) == pytest.approx(0.75)


# ============================================================================ the snapshot


def test_snapshot_reused_until_ttl(guard: q.QuotaEngine, guard_clock: q.ManualClock) -> None:
    e = guard
    e.set_model_limits(P, M, rpd=10)
    e.register_key(1, P)
    assert frac(e) == 0.0  # the snapshot is built now
    requests(e, 4, 1)
    assert e.model_window_used_fraction(P, M) == 0.0  # the new usage is not seen
    guard_clock.advance(TTL - 1)
    assert e.model_window_used_fraction(P, M) == 0.0
    guard_clock.advance(2)  # past window_usage_ttl_ms of engine time
    assert e.model_window_used_fraction(P, M) == pytest.approx(0.4)


def test_snapshot_is_shared_by_every_model(guard: q.QuotaEngine, guard_clock: q.ManualClock) -> None:
    e = guard
    e.set_model_limits(P, "a", rpd=10)
    e.set_model_limits(P, "b", rpd=10)
    e.register_key(1, P)
    assert frac(e, model="a") == 0.0  # builds the snapshot
    requests(e, 5, 1, model="b")
    # "b" was never asked about, yet the answer comes from the snapshot taken before its usage.
    assert e.model_window_used_fraction(P, "b") == 0.0
    guard_clock.advance(TTL + 1)
    assert e.model_window_used_fraction(P, "b") == pytest.approx(0.5)


def test_invalidate_window_usage(guard: q.QuotaEngine) -> None:
    e = guard
    e.set_model_limits(P, M, rpm=10)
    e.register_key(1, P)
    assert frac(e) == 0.0
    requests(e, 3, 1)
    assert e.model_window_used_fraction(P, M) == 0.0
    e.invalidate_window_usage()
    assert e.model_window_used_fraction(P, M) == pytest.approx(0.3)


def test_custom_ttl(store: str, guard_clock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=guard_clock, env={}, window_usage_ttl_ms=60_000) as e:
        e.set_model_limits(P, M, rpd=10)
        e.register_key(1, P)
        assert e.model_window_used_fraction(P, M) == 0.0
        requests(e, 2, 1)
        guard_clock.advance(30_000)
        assert e.model_window_used_fraction(P, M) == 0.0  # the default 5 s is not what counts
        guard_clock.advance(30_001)
        assert e.model_window_used_fraction(P, M) == pytest.approx(0.2)


def test_snapshot_sees_other_engines_usage(store: str, guard_clock: q.ManualClock) -> None:
    with (
        q.QuotaEngine(store, clock=guard_clock, env={}) as a,
        q.QuotaEngine(store, clock=guard_clock, env={}) as b,
    ):
        a.set_model_limits(P, M, rpm=10)
        a.register_key(1, P)
        a.register_key(2, P)
        requests(b, 7, 1)
        requests(b, 9, 2)
        a.invalidate_window_usage()
        assert a.model_window_used_fraction(P, M) == pytest.approx(0.7)
        assert a.model_window_used_fraction(P, M, key_id=2) == pytest.approx(0.9)


def test_hard_gates_do_not_use_the_snapshot(guard: q.QuotaEngine, guard_clock: q.ManualClock) -> None:
    e = guard
    e.set_model_limits(P, M, rpm=3, tpd=100)
    e.register_key(1, P)
    assert frac(e) == 0.0  # snapshot: nothing used
    requests(e, 3, 1)
    e.record_tokens(P, M, 1, 100)
    assert e.model_window_used_fraction(P, M) == 0.0  # the stale snapshot
    assert not e.can_make_request(P, M, 1)
    assert not e.can_use_tokens(P, M, 1, 1)
    adm = e.check(P, M, 1)
    assert (adm.allowed, adm.reason) == (False, "rpm")
    with pytest.raises(q.QuotaExceeded) as exc:
        e.lease(P, M, 1)
    assert exc.value.reason == "rpm"
    guard_clock.advance(MINUTE)  # rpm slides free; tpd is still full
    assert e.check(P, M, 1, 1).reason == "tpd"
    assert e.model_window_used_fraction(P, M) == 1.0  # the snapshot was rebuilt (TTL passed): tpd 100/100


# ======================================================== key and limit changes (issue: at once)


def test_key_and_limit_changes_through_the_engine_count_at_once(guard: q.QuotaEngine) -> None:
    """SPEC §9: the snapshot is reused for window_usage_ttl_ms, but a key registered, enabled
    or disabled, or a limit set, through this engine shows in its very next answer."""
    guard.set_model_limits(P, M, rpm=10)
    guard.register_key(1, P)
    requests(guard, 5, 1)
    assert frac(guard) == 0.5  # builds the snapshot; no invalidation from here on
    use = guard.model_window_used_fraction
    guard.register_key(2, P)  # a new, unused key: the most headroom
    assert use(P, M) == 0.0
    guard.register_key(2, P, enabled=False)
    assert use(P, M) == 0.5
    guard.register_key(2, P, enabled=True)
    assert use(P, M) == 0.0
    guard.register_key(2, "other-platform")  # moved away: no longer serves P
    assert use(P, M) == 0.5
    assert use(P, M, key_id=2) is None
    guard.register_key(1, P, enabled=False)  # no routable key left
    assert use(P, M) is None
    guard.register_key(1, P)
    guard.set_model_limits(P, M, rpm=20)
    assert use(P, M) == 0.25
    guard.set_model_limits(P, M, rpd=5)
    assert use(P, M) == 1.0
    assert [r["used_fraction"] for r in guard.snapshot()] == [1.0]
    guard.set_model_limits(P, M)
    assert use(P, M) is None
    assert [r["used_fraction"] for r in guard.snapshot()] == [None]
