"""SPEC §6 (cooldowns with provenance) and §6.1 (the decision for a rate-limit-like failure).

Every test runs on a real SQLite file under tmp_path with a ManualClock.
"""

from __future__ import annotations

import logging
import sqlite3

import pytest
import quotaengine as q
from moments import DAY, HOUR, MINUTE, NOON, SECOND

MIDNIGHT = 1_767_225_600_000  # 2026-01-01 00:00:00.000 UTC

P, M, K = "groq", "llama-3.1-8b-instant", 1

LADDER = [2 * MINUTE, 10 * MINUTE, HOUR, DAY]


def decide(e: q.QuotaEngine, **kw: object) -> tuple[int, str]:
    d = e.cooldown_decision_for_limit(P, M, K, **kw)
    return d.duration_ms, d.source


def exhaust_daily(e: q.QuotaEngine, platform: str = P, model: str = M, key: int = K) -> None:
    """rpd = 1 and one recorded request: RPD used >= rpd (daily exhaustion)."""
    e.set_model_limits(platform, model, rpd=1)
    e.record_request(platform, model, key)


# --------------------------------------------------------------------------- §6 cooldowns


@pytest.mark.parametrize("source", ["heuristic", "authoritative", "credit", "tier"])
def test_cooldown_keeps_its_source(qengine: q.QuotaEngine, source: str) -> None:
    qengine.set_cooldown(P, M, K, 30 * MINUTE, source)
    cd = qengine.cooldown(P, M, K)
    assert cd is not None
    assert cd.source == source
    assert (cd.platform, cd.model_id, cd.key_id) == (P, M, K)
    assert cd.set_at_ms == NOON
    assert cd.expires_at_ms == NOON + 30 * MINUTE
    assert cd.remaining_ms == 30 * MINUTE


def test_set_cooldown_defaults_to_one_minute_heuristic(qengine: q.QuotaEngine) -> None:
    qengine.set_cooldown(P, M, K)
    cd = qengine.cooldown(P, M, K)
    assert cd is not None
    assert cd.source == "heuristic"
    assert cd.expires_at_ms == NOON + 60_000


def test_unknown_cooldown_source_is_value_error(qengine: q.QuotaEngine) -> None:
    with pytest.raises(ValueError):
        qengine.set_cooldown(P, M, K, MINUTE, "permanent")
    assert qengine.cooldown(P, M, K) is None
    assert qengine.active_cooldowns() == []


def test_cooldown_is_active_while_now_before_expiry(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    qengine.set_cooldown(P, M, K, MINUTE, "heuristic")
    assert qengine.is_on_cooldown(P, M, K)
    qclock.advance(MINUTE - 1)
    cd = qengine.cooldown(P, M, K)
    assert cd is not None and cd.remaining_ms == 1
    assert qengine.is_on_cooldown(P, M, K)
    qclock.advance(1)  # now == expires_at_ms: no longer active
    assert qengine.cooldown(P, M, K) is None
    assert not qengine.is_on_cooldown(P, M, K)
    assert qengine.active_cooldowns() == []
    assert qengine.probeable_cooldowns() == []
    assert qengine.check(P, M, K).allowed


def test_cooldown_is_per_route(qengine: q.QuotaEngine) -> None:
    qengine.set_cooldown(P, M, K, MINUTE)
    assert qengine.is_on_cooldown(P, M, K)
    assert not qengine.is_on_cooldown(P, "other-model", K)
    assert not qengine.is_on_cooldown(P, M, K + 1)
    assert not qengine.is_on_cooldown("cerebras", M, K)


def test_set_cooldown_always_overwrites_even_shorter(qengine: q.QuotaEngine) -> None:
    qengine.set_cooldown(P, M, K, HOUR, "tier")
    qengine.set_cooldown(P, M, K, 10 * SECOND, "heuristic")
    cd = qengine.cooldown(P, M, K)
    assert cd is not None
    assert cd.source == "heuristic"
    assert cd.expires_at_ms == NOON + 10 * SECOND
    # and longer, with another source
    qengine.set_cooldown(P, M, K, 2 * HOUR, "credit")
    cd = qengine.cooldown(P, M, K)
    assert cd is not None and cd.source == "credit" and cd.expires_at_ms == NOON + 2 * HOUR


def test_active_cooldowns_sorted_soonest_first_with_key_filter(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    qengine.set_cooldown(P, "m-a", 1, 30 * MINUTE, "heuristic")
    qengine.set_cooldown(P, "m-b", 2, 5 * MINUTE, "tier")
    qengine.set_cooldown(P, "m-c", 3, 20 * MINUTE, "credit")
    qengine.set_cooldown(P, "m-d", 1, 10 * MINUTE, "authoritative")
    qengine.set_cooldown(P, "m-e", 4, 1 * MINUTE, "heuristic")

    all_cd = qengine.active_cooldowns()
    assert [(c.model_id, c.key_id) for c in all_cd] == [
        ("m-e", 4),
        ("m-b", 2),
        ("m-d", 1),
        ("m-c", 3),
        ("m-a", 1),
    ]
    assert [c.expires_at_ms for c in all_cd] == sorted(c.expires_at_ms for c in all_cd)

    only = qengine.active_cooldowns([1, 3])
    assert [(c.model_id, c.key_id) for c in only] == [("m-d", 1), ("m-c", 3), ("m-a", 1)]
    assert [c.model_id for c in qengine.active_cooldowns(k for k in (2,))] == ["m-b"]
    assert qengine.active_cooldowns([99]) == []

    qclock.advance(5 * MINUTE)  # m-e and m-b expired
    assert [c.model_id for c in qengine.active_cooldowns()] == ["m-d", "m-c", "m-a"]
    assert [c.remaining_ms for c in qengine.active_cooldowns()] == [
        5 * MINUTE,
        15 * MINUTE,
        25 * MINUTE,
    ]


def test_probeable_cooldowns_are_active_heuristic_only(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    qengine.set_cooldown(P, "h-long", 1, 30 * MINUTE, "heuristic")
    qengine.set_cooldown(P, "h-short", 2, 1 * MINUTE, "heuristic")
    qengine.set_cooldown(P, "auth", 1, 10 * MINUTE, "authoritative")
    qengine.set_cooldown(P, "credit", 3, 10 * MINUTE, "credit")
    qengine.set_cooldown(P, "tier", 4, 10 * MINUTE, "tier")
    probe = qengine.probeable_cooldowns()
    assert [c.model_id for c in probe] == ["h-short", "h-long"]
    assert all(c.source == "heuristic" for c in probe)
    qclock.advance(MINUTE)
    assert [c.model_id for c in qengine.probeable_cooldowns()] == ["h-long"]


def test_soonest_cooldown_expiry(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    assert qengine.soonest_cooldown_expiry() is None
    qengine.set_cooldown(P, "a", 1, 20 * MINUTE, "tier")
    qengine.set_cooldown(P, "b", 2, 3 * MINUTE, "heuristic")
    qengine.set_cooldown(P, "c", 3, 7 * MINUTE, "credit")
    assert qengine.soonest_cooldown_expiry() == NOON + 3 * MINUTE
    qclock.advance(3 * MINUTE)  # "b" expired: the next one is the soonest
    assert qengine.soonest_cooldown_expiry() == NOON + 7 * MINUTE
    qclock.advance(HOUR)
    assert qengine.soonest_cooldown_expiry() is None


@pytest.mark.sqlite_only
def test_cleanup_expired_cooldowns_returns_count(qengine: q.QuotaEngine, qclock: q.ManualClock, store: str) -> None:
    assert qengine.cleanup_expired_cooldowns() == 0
    qengine.set_cooldown(P, "a", 1, 1 * MINUTE)
    qengine.set_cooldown(P, "b", 2, 2 * MINUTE, "tier")
    qengine.set_cooldown(P, "c", 3, 10 * MINUTE, "credit")
    assert qengine.cleanup_expired_cooldowns() == 0
    qclock.advance(2 * MINUTE)
    assert qengine.cleanup_expired_cooldowns() == 2
    assert qengine.cleanup_expired_cooldowns() == 0
    assert [c.model_id for c in qengine.active_cooldowns()] == ["c"]
    with sqlite3.connect(store) as con:
        rows = con.execute("SELECT model_id FROM rate_limit_cooldowns").fetchall()
    con.close()
    assert rows == [("c",)]


def test_clear_cooldowns_for_key_returns_count_and_spares_other_keys(
    qengine: q.QuotaEngine,
) -> None:
    qengine.set_cooldown(P, "a", 1, HOUR, "heuristic")
    qengine.set_cooldown("cerebras", "b", 1, HOUR, "tier")
    qengine.set_cooldown(P, "a", 2, HOUR, "credit")
    assert qengine.clear_cooldowns_for_key(1) == 2
    assert qengine.cooldown(P, "a", 1) is None
    assert qengine.cooldown("cerebras", "b", 1) is None
    assert qengine.cooldown(P, "a", 2) is not None
    assert qengine.clear_cooldowns_for_key(1) == 0
    assert qengine.clear_cooldowns_for_key(42) == 0


def test_clear_cooldown_early_keeps_ladder_history(qengine: q.QuotaEngine) -> None:
    exhaust_daily(qengine)
    o1 = qengine.record_failure(P, M, K, status=429)
    assert o1.cooldown is not None and o1.cooldown.duration_ms == 2 * MINUTE
    qengine.clear_cooldown_early(P, M, K)
    assert qengine.cooldown(P, M, K) is None
    assert not qengine.is_on_cooldown(P, M, K)
    o2 = qengine.record_failure(P, M, K, status=429)
    assert o2.cooldown is not None
    assert (o2.cooldown.duration_ms, o2.cooldown.source) == (10 * MINUTE, "heuristic")
    cd = qengine.cooldown(P, M, K)
    assert cd is not None and cd.expires_at_ms == NOON + 10 * MINUTE


def test_clear_cooldown_early_only_touches_its_route(qengine: q.QuotaEngine) -> None:
    qengine.set_cooldown(P, M, K, HOUR)
    qengine.set_cooldown(P, "other", K, HOUR)
    qengine.clear_cooldown_early(P, M, K)
    assert qengine.cooldown(P, M, K) is None
    assert qengine.cooldown(P, "other", K) is not None
    qengine.clear_cooldown_early(P, "never-benched", K)  # no-op, no error


def test_clear_cooldowns_for_key_forgets_ladder(qengine: q.QuotaEngine) -> None:
    exhaust_daily(qengine)
    assert qengine.record_failure(P, M, K, status=429).cooldown.duration_ms == 2 * MINUTE  # type: ignore[union-attr]
    qengine.clear_cooldown_early(P, M, K)
    assert qengine.record_failure(P, M, K, status=429).cooldown.duration_ms == 10 * MINUTE  # type: ignore[union-attr]
    assert qengine.clear_cooldowns_for_key(K) == 1
    assert qengine.cooldown(P, M, K) is None
    o = qengine.record_failure(P, M, K, status=429)
    assert o.cooldown is not None
    assert (o.cooldown.duration_ms, o.cooldown.source) == (2 * MINUTE, "heuristic")


def test_clear_cooldowns_for_key_forgets_ladder_of_that_key_only(
    qengine: q.QuotaEngine,
) -> None:
    for key in (1, 2):
        exhaust_daily(qengine, key=key)
        assert decide_key(qengine, key) == 2 * MINUTE
        assert decide_key(qengine, key) == 10 * MINUTE
    qengine.clear_cooldowns_for_key(1)
    assert decide_key(qengine, 1) == 2 * MINUTE
    assert decide_key(qengine, 2) == HOUR


def decide_key(e: q.QuotaEngine, key: int) -> int:
    return e.cooldown_decision_for_limit(P, M, key).duration_ms


# --------------------------------------------------------------------------- persistence


def test_cooldown_shared_by_second_engine_and_survives_reopen(store: str, qclock: q.ManualClock) -> None:
    a = q.QuotaEngine(store, clock=qclock, env={})
    b = q.QuotaEngine(store, clock=qclock, env={})
    try:
        a.set_cooldown(P, M, K, HOUR, "tier")
        cd = b.cooldown(P, M, K)
        assert cd is not None
        assert (cd.source, cd.expires_at_ms, cd.set_at_ms) == ("tier", NOON + HOUR, NOON)
        assert b.is_on_cooldown(P, M, K)
        assert [c.key_id for c in b.active_cooldowns()] == [K]
        # a clear by b is seen by a
        b.clear_cooldown_early(P, M, K)
        assert a.cooldown(P, M, K) is None
        a.set_cooldown(P, M, K, 2 * HOUR, "credit")
    finally:
        a.close()
        b.close()
    c = q.QuotaEngine(store, clock=qclock, env={})
    try:
        cd = c.cooldown(P, M, K)
        assert cd is not None
        assert (cd.source, cd.expires_at_ms) == ("credit", NOON + 2 * HOUR)
        assert c.soonest_cooldown_expiry() == NOON + 2 * HOUR
    finally:
        c.close()


def test_ladder_continues_across_engines_and_reopen(store: str, qclock: q.ManualClock) -> None:
    a = q.QuotaEngine(store, clock=qclock, env={})
    b = q.QuotaEngine(store, clock=qclock, env={})
    try:
        exhaust_daily(a)
        assert decide(a) == (2 * MINUTE, "heuristic")
        assert decide(b) == (10 * MINUTE, "heuristic")
        assert decide(a) == (HOUR, "heuristic")
    finally:
        a.close()
        b.close()
    c = q.QuotaEngine(store, clock=qclock, env={})
    try:
        # 4th step is 24 h, capped at the next midnight (12 h away at noon)
        assert decide(c) == (12 * HOUR, "heuristic")
    finally:
        c.close()


def test_unknown_limit_hits_shared_across_engines(store: str, qclock: q.ManualClock) -> None:
    a = q.QuotaEngine(store, clock=qclock, env={})
    try:
        assert decide(a) == (90 * SECOND, "heuristic")
    finally:
        a.close()
    b = q.QuotaEngine(store, clock=qclock, env={})
    try:
        qclock.advance(MINUTE)
        assert decide(b) == (2 * MINUTE, "heuristic")
    finally:
        b.close()


def test_record_failure_cooldown_seen_by_other_engine(store: str, qclock: q.ManualClock) -> None:
    a = q.QuotaEngine(store, clock=qclock, env={})
    b = q.QuotaEngine(store, clock=qclock, env={})
    try:
        a.record_failure(P, M, K, status=402)
        cd = b.cooldown(P, M, K)
        assert cd is not None and cd.source == "credit" and cd.expires_at_ms == NOON + DAY
        adm = b.check(P, M, K)
        assert not adm.allowed and adm.reason == "cooldown" and adm.retry_at_ms == NOON + DAY
    finally:
        a.close()
        b.close()


# --------------------------------------------------------------------------- logging


def _qe_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("quotaengine")]


def test_cooldown_set_cleared_and_learned_are_logged(qengine: q.QuotaEngine, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="quotaengine")

    caplog.clear()
    qengine.set_cooldown(P, M, K, MINUTE, "tier")
    assert _qe_records(caplog), "set_cooldown produced no quotaengine log record"

    caplog.clear()
    qengine.clear_cooldown_early(P, M, K)
    assert _qe_records(caplog), "clear_cooldown_early produced no quotaengine log record"

    caplog.clear()
    qengine.record_failure(P, "m2", K, status=429)
    assert _qe_records(caplog), "a cooldown set by record_failure was not logged"

    caplog.clear()
    learned = qengine.learn_limit_from_error(
        P, M, "Rate limit reached on tokens per minute (TPM): Limit 6000, Used 5000"
    )
    assert learned is not None
    assert _qe_records(caplog), "a learned limit was not logged"


# --------------------------------------------------------------------------- §6.1 local endpoints


@pytest.mark.parametrize(
    "base_url",
    [
        "http://127.0.0.1:8080/v1",
        "http://127.5.6.7",
        "http://localhost:11434",
        "http://LOCALHOST:11434/api",
        "http://ollama.localhost:8000",
        "http://[::1]:8000",
        "http://10.1.2.3",
        "http://192.168.0.5",
        "http://172.16.0.1",
        "http://172.31.255.254:9000",
        "http://169.254.10.20",
        "http://[fd00::1]:8080",
        "http://[fe80::1]/v1",
        "http://[fc00::5]",
        "http://user:pw@127.0.0.1:8080/v1",
        "HTTP://LOCALHOST",
    ],
)
def test_local_endpoint_gets_5s_ignores_retry_after_no_escalation(qengine: q.QuotaEngine, base_url: str) -> None:
    qengine.register_key(K, P, base_url=base_url)
    exhaust_daily(qengine)
    for _ in range(5):
        assert decide(qengine, retry_after_ms=10 * MINUTE) == (5_000, "heuristic")
    for _ in range(3):
        assert decide(qengine) == (5_000, "heuristic")
        assert decide(qengine, quota_signal=False) == (5_000, "heuristic")


@pytest.mark.parametrize(
    "base_url",
    [
        "https://api.groq.com/openai/v1",
        "http://172.32.0.1",
        "http://172.15.255.255",
        "http://localhost.example.com",
        "http://11.0.0.1",
        "http://192.169.0.1",
        "http://[2001:4860:4860::8888]",
        "http://[fbff::1]",
        "http://169.255.0.1",
        "http://127.0.0.1.nip.io",
        "http://localhost:11434@evil.example.com",
        "http://evil.example.com/?next=127.0.0.1",
    ],
)
def test_non_local_endpoint_uses_normal_rules(qengine: q.QuotaEngine, base_url: str) -> None:
    qengine.register_key(K, P, base_url=base_url)
    exhaust_daily(qengine)
    assert decide(qengine) == (2 * MINUTE, "heuristic")
    assert decide(qengine) == (10 * MINUTE, "heuristic")


def test_local_endpoint_counts_no_unknown_limit_hit(qengine: q.QuotaEngine) -> None:
    qengine.register_key(K, P, base_url="http://127.0.0.1:8080/v1")
    for _ in range(3):
        assert decide(qengine) == (5_000, "heuristic")
    # the same key now points at a remote host: nothing was counted while local
    qengine.register_key(K, P, base_url="https://api.groq.com/openai/v1")
    assert decide(qengine) == (90 * SECOND, "heuristic")
    assert decide(qengine) == (2 * MINUTE, "heuristic")


def test_local_endpoint_takes_no_ladder_step(qengine: q.QuotaEngine) -> None:
    qengine.register_key(K, P, base_url="http://localhost:11434")
    exhaust_daily(qengine)
    for _ in range(3):
        assert decide(qengine) == (5_000, "heuristic")
    qengine.register_key(K, P, base_url=None)
    assert decide(qengine) == (2 * MINUTE, "heuristic")


def test_decision_sets_no_cooldown(qengine: q.QuotaEngine) -> None:
    exhaust_daily(qengine)
    decide(qengine)
    decide(qengine, retry_after_ms=HOUR)
    assert qengine.cooldown(P, M, K) is None
    assert qengine.active_cooldowns() == []


# --------------------------------------------------------------------------- §6.1 daily exhaustion ladder


def test_daily_exhaustion_ladder_at_2am(qclock: q.ManualClock, qengine: q.QuotaEngine) -> None:
    qclock.set(MIDNIGHT + 2 * HOUR)
    exhaust_daily(qengine)
    assert decide(qengine) == (2 * MINUTE, "heuristic")
    assert decide(qengine) == (10 * MINUTE, "heuristic")
    assert decide(qengine) == (HOUR, "heuristic")
    # 4th step is 24 h but never reaches past the next midnight, 22 h away
    assert decide(qengine) == (22 * HOUR, "heuristic")
    qclock.advance(HOUR)
    assert decide(qengine) == (21 * HOUR, "heuristic")


def test_daily_exhaustion_by_tpd(qclock: q.ManualClock, qengine: q.QuotaEngine) -> None:
    qengine.set_model_limits(P, M, tpd=1000)
    qengine.record_request(P, M, K)
    qengine.record_tokens(P, M, K, 1000)
    assert decide(qengine) == (2 * MINUTE, "heuristic")
    assert decide(qengine) == (10 * MINUTE, "heuristic")


def test_daily_exhaustion_by_explicit_limits(qengine: q.QuotaEngine) -> None:
    qengine.record_request(P, M, K)
    qengine.record_request(P, M, K)
    # stored limits say nothing; the explicit limits say exhausted
    assert decide(qengine, limits=q.Limits(rpd=2)) == (2 * MINUTE, "heuristic")
    assert decide(qengine, limits={"rpm": None, "rpd": 2, "tpm": None, "tpd": None}) == (
        10 * MINUTE,
        "heuristic",
    )


def test_daily_24h_step_at_8pm_benches_until_midnight(qclock: q.ManualClock, qengine: q.QuotaEngine) -> None:
    qclock.set(MIDNIGHT + 20 * HOUR - 3 * HOUR)  # 17:00
    exhaust_daily(qengine)
    assert decide(qengine) == (2 * MINUTE, "heuristic")
    assert decide(qengine) == (10 * MINUTE, "heuristic")
    assert decide(qengine) == (HOUR, "heuristic")
    qclock.set(MIDNIGHT + 20 * HOUR)  # 20:00, same day, same usage
    assert decide(qengine) == (4 * HOUR, "heuristic")


def test_daily_step_capped_even_for_first_step_near_midnight(qclock: q.ManualClock, qengine: q.QuotaEngine) -> None:
    qclock.set(MIDNIGHT + DAY - MINUTE)  # 23:59:00
    exhaust_daily(qengine)
    assert decide(qengine) == (MINUTE, "heuristic")


def test_daily_ladder_fifth_step_still_24h(qclock: q.ManualClock, qengine: q.QuotaEngine) -> None:
    qclock.set(MIDNIGHT + 30 * MINUTE)  # 00:30: 24 h capped to 23.5 h
    exhaust_daily(qengine)
    got = [decide(qengine)[0] for _ in range(6)]
    assert got == [2 * MINUTE, 10 * MINUTE, HOUR, DAY - 30 * MINUTE, DAY - 30 * MINUTE, DAY - 30 * MINUTE]


def test_not_exhausted_with_known_limits_is_transient_90s(qengine: q.QuotaEngine) -> None:
    qengine.set_model_limits(P, M, rpd=100)
    qengine.record_request(P, M, K)
    for _ in range(4):
        assert decide(qengine) == (90 * SECOND, "heuristic")


def test_transient_bench_takes_no_ladder_step(qengine: q.QuotaEngine) -> None:
    qengine.record_request(P, M, K)
    for _ in range(3):
        assert decide(qengine, limits={"rpd": 100}) == (90 * SECOND, "heuristic")
    for _ in range(3):
        assert decide(qengine, quota_signal=False) == (90 * SECOND, "heuristic")
    # the first real step is still the first rung
    assert decide(qengine, limits={"rpd": 1}) == (2 * MINUTE, "heuristic")


# --------------------------------------------------------------------------- §6.1 unknown limits


def test_unknown_limits_first_hit_90s_then_ladder_capped_at_10min(
    qengine: q.QuotaEngine, qclock: q.ManualClock
) -> None:
    assert decide(qengine) == (90 * SECOND, "heuristic")
    qclock.advance(5 * MINUTE)
    assert decide(qengine) == (2 * MINUTE, "heuristic")
    qclock.advance(5 * MINUTE)
    assert decide(qengine) == (10 * MINUTE, "heuristic")
    qclock.advance(5 * MINUTE)
    assert decide(qengine) == (10 * MINUTE, "heuristic")  # 1 h step capped at 10 min
    qclock.advance(5 * MINUTE)
    assert decide(qengine) == (10 * MINUTE, "heuristic")  # 24 h step capped at 10 min


def test_unknown_limits_with_only_minute_limits_still_unknown(qengine: q.QuotaEngine) -> None:
    qengine.set_model_limits(P, M, rpm=30, tpm=6000)
    assert decide(qengine) == (90 * SECOND, "heuristic")
    assert decide(qengine) == (2 * MINUTE, "heuristic")


def test_unknown_limit_hits_older_than_an_hour_do_not_count(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    assert decide(qengine) == (90 * SECOND, "heuristic")
    qclock.advance(HOUR + MINUTE)
    assert decide(qengine) == (90 * SECOND, "heuristic")
    qclock.advance(HOUR + MINUTE)
    assert decide(qengine) == (90 * SECOND, "heuristic")
    qclock.advance(30 * MINUTE)
    assert decide(qengine) == (2 * MINUTE, "heuristic")


def test_quota_signal_false_never_counts_a_hit(qengine: q.QuotaEngine) -> None:
    for _ in range(4):
        assert decide(qengine, quota_signal=False) == (90 * SECOND, "heuristic")
    # none of those counted: this is the first hit
    assert decide(qengine) == (90 * SECOND, "heuristic")
    assert decide(qengine) == (2 * MINUTE, "heuristic")


def test_unknown_limit_hits_are_per_route(qengine: q.QuotaEngine) -> None:
    assert decide(qengine) == (90 * SECOND, "heuristic")
    assert qengine.cooldown_decision_for_limit(P, "other", K).duration_ms == 90 * SECOND
    assert qengine.cooldown_decision_for_limit(P, M, K + 1).duration_ms == 90 * SECOND
    assert decide(qengine) == (2 * MINUTE, "heuristic")


# --------------------------------------------------------------------------- §6.1 retry-after


def test_longer_retry_after_is_authoritative(qengine: q.QuotaEngine) -> None:
    assert decide(qengine, retry_after_ms=120_000, quota_signal=False) == (120_000, "authoritative")


def test_retry_after_equal_or_shorter_than_bench_is_heuristic(qengine: q.QuotaEngine) -> None:
    assert decide(qengine, retry_after_ms=90_000, quota_signal=False) == (90_000, "heuristic")
    assert decide(qengine, retry_after_ms=1_000, quota_signal=False) == (90_000, "heuristic")
    assert decide(qengine, retry_after_ms=0, quota_signal=False) == (90_000, "heuristic")


def test_retry_after_capped_at_24h(qengine: q.QuotaEngine) -> None:
    assert decide(qengine, retry_after_ms=3 * DAY, quota_signal=False) == (DAY, "authoritative")


def test_retry_after_vs_ladder_step(qengine: q.QuotaEngine) -> None:
    exhaust_daily(qengine)
    # step 1 is 2 min; a 60 s Retry-After does not shorten it
    assert decide(qengine, retry_after_ms=60_000) == (2 * MINUTE, "heuristic")
    # step 2 is 10 min; a 15 min Retry-After wins
    assert decide(qengine, retry_after_ms=15 * MINUTE) == (15 * MINUTE, "authoritative")


def test_retry_after_not_capped_at_midnight(qclock: q.ManualClock, qengine: q.QuotaEngine) -> None:
    qclock.set(MIDNIGHT + 23 * HOUR)  # 23:00
    exhaust_daily(qengine)
    assert decide(qengine, retry_after_ms=3 * HOUR) == (3 * HOUR, "authoritative")


# --------------------------------------------------------------------------- §6.1 rolling 24 h and success


def test_ladder_is_rolling_24h(qclock: q.ManualClock, qengine: q.QuotaEngine) -> None:
    exhausted = {"rpd": 0}  # RPD used 0 >= rpd 0: daily exhausted
    assert decide(qengine, limits=exhausted) == (2 * MINUTE, "heuristic")  # step at 12:00
    qclock.set(MIDNIGHT + 23 * HOUR)
    assert decide(qengine, limits=exhausted) == (10 * MINUTE, "heuristic")  # step at 23:00
    # next day 12:00 + 1 ms: the 12:00 step left the 24 h window, the 23:00 one did not
    qclock.set(NOON + DAY + 1)
    assert decide(qengine, limits=exhausted) == (10 * MINUTE, "heuristic")
    # another 24 h later everything is forgotten
    qclock.set(NOON + 2 * DAY + 1)
    assert decide(qengine, limits=exhausted) == (2 * MINUTE, "heuristic")


def test_ladder_steps_older_than_24h_forgotten_on_guessed_path(qclock: q.ManualClock, qengine: q.QuotaEngine) -> None:
    assert decide(qengine) == (90 * SECOND, "heuristic")
    assert decide(qengine) == (2 * MINUTE, "heuristic")
    assert decide(qengine) == (10 * MINUTE, "heuristic")
    qclock.advance(DAY + MINUTE)
    assert decide(qengine) == (90 * SECOND, "heuristic")
    assert decide(qengine) == (2 * MINUTE, "heuristic")  # a remembered ladder would give 10 min


def test_success_clears_ladder(qengine: q.QuotaEngine) -> None:
    exhaust_daily(qengine)
    assert decide(qengine) == (2 * MINUTE, "heuristic")
    assert decide(qengine) == (10 * MINUTE, "heuristic")
    qengine.record_request(P, M, K)  # a success on the route
    assert decide(qengine) == (2 * MINUTE, "heuristic")


def test_success_clears_unknown_limit_hits_and_ladder(qengine: q.QuotaEngine) -> None:
    assert decide(qengine) == (90 * SECOND, "heuristic")
    assert decide(qengine) == (2 * MINUTE, "heuristic")
    assert decide(qengine) == (10 * MINUTE, "heuristic")
    qengine.record_request(P, M, K)
    assert decide(qengine) == (90 * SECOND, "heuristic")
    assert decide(qengine) == (2 * MINUTE, "heuristic")


def test_lease_success_clears_failure_history(qengine: q.QuotaEngine) -> None:
    assert decide(qengine) == (90 * SECOND, "heuristic")
    assert decide(qengine) == (2 * MINUTE, "heuristic")
    lease = qengine.lease(P, M, K)
    lease.success(tokens=10)
    assert decide(qengine) == (90 * SECOND, "heuristic")


def test_lease_context_success_clears_failure_history(qengine: q.QuotaEngine) -> None:
    assert decide(qengine) == (90 * SECOND, "heuristic")
    assert decide(qengine) == (2 * MINUTE, "heuristic")
    with qengine.lease(P, M, K, estimated_tokens=5):
        pass
    assert decide(qengine) == (90 * SECOND, "heuristic")


def test_success_on_other_route_does_not_clear(qengine: q.QuotaEngine) -> None:
    assert decide(qengine) == (90 * SECOND, "heuristic")
    assert decide(qengine) == (2 * MINUTE, "heuristic")
    qengine.record_request(P, "other-model", K)
    qengine.record_request(P, M, K + 1)
    assert decide(qengine) == (10 * MINUTE, "heuristic")


def test_released_lease_is_no_success(qengine: q.QuotaEngine) -> None:
    assert decide(qengine) == (90 * SECOND, "heuristic")
    assert decide(qengine) == (2 * MINUTE, "heuristic")
    qengine.lease(P, M, K).release()
    assert decide(qengine) == (10 * MINUTE, "heuristic")


def test_log_level_raised_after_first_use_is_honoured(qengine: q.QuotaEngine, caplog: pytest.LogCaptureFixture) -> None:
    """Python logging configured after the engine already logged once still gets the records."""
    caplog.set_level(logging.WARNING, logger="quotaengine")
    qengine.set_cooldown(P, M, K, MINUTE, "tier")  # an INFO record, filtered out at WARNING
    caplog.set_level(logging.INFO, logger="quotaengine")
    caplog.clear()
    qengine.set_cooldown(P, M, K + 1, MINUTE, "tier")
    assert _qe_records(caplog), "INFO records stay suppressed after the level was lowered to INFO"
