"""The routing guardrail (SPEC §9): model_window_used_fraction over one usage snapshot reused for
window_usage_ttl_ms, following the key with the most headroom; invalidate_window_usage; and the hard gates,
which never use the snapshot."""

from __future__ import annotations

import pytest
import quotaengine as q
from moments import DAY, MINUTE, T0, TEN_AM

P, M = "groq", "llama-3.3-70b"
TTL = 5_000


def requests(e: q.QuotaEngine, n: int, key: int, model: str = M, platform: str = P) -> None:
    for _ in range(n):
        e.record_request(platform, model, key)


def frac(e: q.QuotaEngine, model: str = M, platform: str = P, **kw: object) -> float | None:
    e.invalidate_window_usage()
    return e.model_window_used_fraction(platform, model, **kw)  # type: ignore[arg-type]


# ============================================================================ None cases


def test_none_without_window_limits(engine: q.QuotaEngine) -> None:
    engine.register_key(1, P)
    requests(engine, 3, 1)
    assert frac(engine) is None  # no stored row: unlimited
    engine.set_model_limits(P, M)  # a row with no limits
    assert frac(engine) is None
    engine.set_model_limits(P, M, monthly_token_budget="150K/day · 2x")  # a label is no window limit
    assert frac(engine) is None
    assert frac(engine, limits={"rpm": None, "rpd": None, "tpm": None, "tpd": None}) is None
    assert frac(engine, limits=q.Limits()) is None


def test_none_without_registered_key(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=10)
    requests(engine, 5, 1)
    assert frac(engine) is None
    engine.register_key(1, "cerebras")  # a key of another platform does not serve groq
    assert frac(engine) is None
    engine.register_key(2, P)
    assert frac(engine) == 0.0


def test_disabled_keys_do_not_count(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=10)
    engine.register_key(1, P, enabled=False)
    assert frac(engine) is None
    engine.register_key(2, P)
    requests(engine, 6, 2)
    # Key 1 is idle but disabled: the answer follows key 2, the only routable one.
    assert frac(engine) == pytest.approx(0.6)
    engine.register_key(2, P, enabled=False)  # upsert
    assert frac(engine) is None
    engine.register_key(1, P, enabled=True)
    assert frac(engine) == 0.0


def test_key_id_restricts_to_that_key(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=10)
    engine.register_key(1, P)
    engine.register_key(2, P)
    engine.register_key(3, P, enabled=False)
    engine.register_key(4, "cerebras")
    requests(engine, 8, 1)
    requests(engine, 2, 2)
    assert frac(engine) == pytest.approx(0.2)
    assert frac(engine, key_id=1) == pytest.approx(0.8)
    assert frac(engine, key_id=2) == pytest.approx(0.2)
    assert frac(engine, key_id=3) is None  # disabled
    assert frac(engine, key_id=4) is None  # another platform's key
    assert frac(engine, key_id=99) is None  # not registered


# ============================================================================ per-key value and key choice


def test_worst_window_per_key(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.register_key(1, P)
    engine.set_model_limits(P, M, rpm=10, rpd=100, tpm=1000, tpd=10_000)
    requests(engine, 5, 1)  # rpm 0.5, rpd 0.05
    engine.record_tokens(P, M, 1, 900)  # tpm 0.9, tpd 0.09
    assert frac(engine) == pytest.approx(0.9)
    clock.advance(MINUTE)  # the minute windows empty; the day windows remain
    assert frac(engine) == pytest.approx(0.09)
    requests(engine, 15, 1)  # rpm 1.5: the worst
    assert frac(engine) == pytest.approx(1.5)
    clock.advance(MINUTE)
    assert frac(engine) == pytest.approx(0.2)  # rpd 20 / 100


def test_only_declared_windows_count(engine: q.QuotaEngine) -> None:
    engine.register_key(1, P)
    engine.set_model_limits(P, M, tpd=1000)
    requests(engine, 50, 1)  # requests are not limited
    engine.record_tokens(P, M, 1, 250)
    assert frac(engine) == pytest.approx(0.25)


def test_day_windows_since_midnight(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.register_key(1, P)
    engine.set_model_limits(P, M, rpd=10)
    clock.set(T0 - 1)
    requests(engine, 5, 1)  # yesterday
    clock.set(T0)
    requests(engine, 2, 1)
    clock.set(TEN_AM)
    assert frac(engine) == pytest.approx(0.2)
    clock.set(T0 + DAY)
    assert frac(engine) == 0.0


def test_declared_limit_zero_counts_as_full(engine: q.QuotaEngine) -> None:
    engine.register_key(1, P)
    engine.set_model_limits(P, M, rpm=0, tpd=1000)
    assert frac(engine) == 1.0
    assert frac(engine, limits={"tpm": 0}) == 1.0
    engine.record_tokens(P, M, 1, 100)
    assert frac(engine, limits={"rpd": 0, "tpd": 1000}) == 1.0


def test_answer_follows_the_key_with_most_headroom(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=10, tpm=1000)
    engine.register_key(1, P)
    engine.register_key(2, P)
    engine.register_key(3, P)
    requests(engine, 10, 1)  # key 1: 1.0
    requests(engine, 3, 2)  # key 2: rpm 0.3 ...
    engine.record_tokens(P, M, 2, 700)  # ... tpm 0.7 -> 0.7
    requests(engine, 6, 3)  # key 3: 0.6
    assert frac(engine) == pytest.approx(0.6)
    requests(engine, 4, 3)  # key 3: 1.0
    assert frac(engine) == pytest.approx(0.7)
    engine.register_key(4, P)  # an idle key
    assert frac(engine) == 0.0


def test_usage_of_other_models_and_platforms_does_not_count(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=10)
    engine.set_model_limits(P, "other", rpm=10)
    engine.register_key(1, P)
    requests(engine, 9, 1, model="other")
    requests(engine, 9, 1, platform="cerebras")
    requests(engine, 2, 1)
    assert frac(engine) == pytest.approx(0.2)
    assert frac(engine, model="other") == pytest.approx(0.9)


def test_in_flight_leases_not_counted(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=4, tpm=100)
    engine.register_key(1, P)
    requests(engine, 1, 1)
    leases = [engine.acquire_lease(P, M, 1, 20) for _ in range(2)]
    assert frac(engine) == pytest.approx(0.25)
    for lid in leases:
        engine.release_lease(lid)


def test_limits_argument_overrides_stored_limits(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=10)
    engine.register_key(1, P)
    requests(engine, 5, 1)
    assert frac(engine) == pytest.approx(0.5)
    assert frac(engine, limits={"rpm": 20}) == pytest.approx(0.25)
    assert frac(engine, limits=q.Limits(rpm=50)) == pytest.approx(0.1)
    assert frac(engine, limits={"rpd": 100}) == pytest.approx(0.05)  # replaces all four: rpm not declared
    # A model without a stored row measured against given limits.
    requests(engine, 3, 1, model="unstored")
    assert frac(engine, model="unstored") is None
    assert frac(engine, model="unstored", limits={"rpm": 4}) == pytest.approx(0.75)


# ============================================================================ the snapshot


def test_snapshot_reused_until_ttl(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    e = engine
    e.set_model_limits(P, M, rpd=10)
    e.register_key(1, P)
    assert frac(e) == 0.0  # the snapshot is built now
    requests(e, 4, 1)
    assert e.model_window_used_fraction(P, M) == 0.0  # the new usage is not seen
    clock.advance(TTL - 1)
    assert e.model_window_used_fraction(P, M) == 0.0
    clock.advance(2)  # past window_usage_ttl_ms of engine time
    assert e.model_window_used_fraction(P, M) == pytest.approx(0.4)


def test_snapshot_is_shared_by_every_model(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    e = engine
    e.set_model_limits(P, "a", rpd=10)
    e.set_model_limits(P, "b", rpd=10)
    e.register_key(1, P)
    assert frac(e, model="a") == 0.0  # builds the snapshot
    requests(e, 5, 1, model="b")
    # "b" was never asked about, yet the answer comes from the snapshot taken before its usage.
    assert e.model_window_used_fraction(P, "b") == 0.0
    clock.advance(TTL + 1)
    assert e.model_window_used_fraction(P, "b") == pytest.approx(0.5)


def test_invalidate_window_usage(engine: q.QuotaEngine) -> None:
    e = engine
    e.set_model_limits(P, M, rpm=10)
    e.register_key(1, P)
    assert frac(e) == 0.0
    requests(e, 3, 1)
    assert e.model_window_used_fraction(P, M) == 0.0
    e.invalidate_window_usage()
    assert e.model_window_used_fraction(P, M) == pytest.approx(0.3)


def test_custom_ttl(store: str, clock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=clock, env={}, window_usage_ttl_ms=60_000) as e:
        e.set_model_limits(P, M, rpd=10)
        e.register_key(1, P)
        assert e.model_window_used_fraction(P, M) == 0.0
        requests(e, 2, 1)
        clock.advance(30_000)
        assert e.model_window_used_fraction(P, M) == 0.0  # the default 5 s is not what counts
        clock.advance(30_001)
        assert e.model_window_used_fraction(P, M) == pytest.approx(0.2)


def test_snapshot_sees_other_engines_usage(store: str, clock: q.ManualClock) -> None:
    with (
        q.QuotaEngine(store, clock=clock, env={}) as a,
        q.QuotaEngine(store, clock=clock, env={}) as b,
    ):
        a.set_model_limits(P, M, rpm=10)
        a.register_key(1, P)
        a.register_key(2, P)
        requests(b, 7, 1)
        requests(b, 9, 2)
        a.invalidate_window_usage()
        assert a.model_window_used_fraction(P, M) == pytest.approx(0.7)
        assert a.model_window_used_fraction(P, M, key_id=2) == pytest.approx(0.9)


def test_hard_gates_do_not_use_the_snapshot(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    e = engine
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
    clock.advance(MINUTE)  # rpm slides free; tpd is still full
    assert e.check(P, M, 1, 1).reason == "tpd"
    assert e.model_window_used_fraction(P, M) == 1.0  # the snapshot was rebuilt (TTL passed): tpd 100/100


# ======================================================== key and limit changes (issue: at once)


def test_key_and_limit_changes_through_the_engine_count_at_once(engine: q.QuotaEngine) -> None:
    """SPEC §9: the snapshot is reused for window_usage_ttl_ms, but a key registered, enabled
    or disabled, or a limit set, through this engine shows in its very next answer."""
    engine.set_model_limits(P, M, rpm=10)
    engine.register_key(1, P)
    requests(engine, 5, 1)
    assert frac(engine) == 0.5  # builds the snapshot; no invalidation from here on
    use = engine.model_window_used_fraction
    engine.register_key(2, P)  # a new, unused key: the most headroom
    assert use(P, M) == 0.0
    engine.register_key(2, P, enabled=False)
    assert use(P, M) == 0.5
    engine.register_key(2, P, enabled=True)
    assert use(P, M) == 0.0
    engine.register_key(2, "other-platform")  # moved away: no longer serves P
    assert use(P, M) == 0.5
    assert use(P, M, key_id=2) is None
    engine.register_key(1, P, enabled=False)  # no routable key left
    assert use(P, M) is None
    engine.register_key(1, P)
    engine.set_model_limits(P, M, rpm=20)
    assert use(P, M) == 0.25
    engine.set_model_limits(P, M, rpd=5)
    assert use(P, M) == 1.0
    assert [r["used_fraction"] for r in engine.snapshot()] == [1.0]
    engine.set_model_limits(P, M)
    assert use(P, M) is None
    assert [r["used_fraction"] for r in engine.snapshot()] == [None]
