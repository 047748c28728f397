"""SPEC 24.2 (amends 15.4): a learned key concurrency cap that settles, on both backends.
A concurrency failure sets the cap to the other leases live on the key when the failing
lease was admitted; the cap is never forgotten and rises by one each time its wait
(1 h, doubled by a failure after a rise, at most 24 h) has passed."""

from __future__ import annotations

import sqlite3

import pytest
import quotaengine as q
from moments import DAY, HOUR, MINUTE, NOON
from provider_bodies import OLLAMA_BUSY

P, M, K = "ollama", "llama3", 7
LONG = 30 * DAY  # leases that outlive every test's clock


def busy(e: q.QuotaEngine, key: int = K) -> int:
    """A concurrency failure recorded without a lease: what it learned."""
    o = e.record_failure(P, M, key, status=503, message=OLLAMA_BUSY)
    assert o.kind == "concurrency" and o.learned is not None and o.learned.kind == "concurrency"
    return o.learned.limit


def caps_at(e: q.QuotaEngine, clock: q.ManualClock, start: int, hours: list[float]) -> list[int | None]:
    """The cap in force at `start` plus each of `hours` (in order; the clock moves on)."""
    out = []
    for h in hours:
        clock.set(start + int(h * HOUR))
        out.append(e.key_concurrency_cap(P, K))
    return out


# ------------------------------------------------------------------ the count at admission


def test_the_cap_is_the_other_leases_live_when_the_failing_lease_was_admitted(qengine: q.QuotaEngine) -> None:
    """Hold three, end two, fail the third: two were live when it was admitted."""
    a, b, c = (qengine.lease(P, M, K) for _ in range(3))
    a.success()
    b.release()
    o = c.failure(status=503, message=OLLAMA_BUSY)
    assert o is not None and o.learned is not None and (o.learned.kind, o.learned.limit) == ("concurrency", 2)
    assert qengine.key_concurrency_cap(P, K) == 2


def test_leases_admitted_after_the_failing_one_do_not_count(qengine: q.QuotaEngine) -> None:
    first = qengine.lease(P, M, K)  # admitted alone
    later = [qengine.lease(P, "qwen2.5", K) for _ in range(3)]  # any model of the key
    o = first.failure(status=503, message=OLLAMA_BUSY)
    assert o is not None and o.learned is not None and o.learned.limit == 1  # at least 1
    assert qengine.key_concurrency_cap(P, K) == 1
    for lease in later:
        lease.release()
    # Leases of another key never count.
    other = [qengine.lease(P, M, K + 1) for _ in range(2)]
    mine = qengine.lease(P, M, K + 2)
    then = qengine.lease(P, M, K + 2)
    o = then.failure(status=503, message=OLLAMA_BUSY)
    assert o is not None and o.learned is not None and o.learned.limit == 1
    for lease in [*other, mine]:
        lease.release()


def test_a_failure_without_a_lease_counts_the_leases_live_when_recorded(qengine: q.QuotaEngine) -> None:
    held = [qengine.lease(P, M, K) for _ in range(3)]
    assert busy(qengine) == 3
    for lease in held[1:]:
        lease.release()
    # Each failure sets the cap (no longer only tightens, SPEC 24.2): one live now.
    assert busy(qengine) == 1
    assert qengine.key_concurrency_cap(P, K) == 1
    held[0].release()


def test_the_count_survives_another_engines_writes(store: str, qclock: q.ManualClock) -> None:
    """What the admitting engine knew stays when another engine's leases make it read
    the store's leases again."""
    with q.QuotaEngine(store, clock=qclock, env={}) as a, q.QuotaEngine(store, clock=qclock, env={}) as b:
        first, second, third = (a.lease(P, M, K) for _ in range(3))
        b.lease(P, M, K).release()  # after `third`: not counted
        first.release()
        second.success()
        assert a.key_concurrency_cap(P, K) is None  # `a` read b's writes
        o = third.failure(status=503, message=OLLAMA_BUSY)
        assert o is not None and o.learned is not None and o.learned.limit == 2
        assert b.key_concurrency_cap(P, K) == 2


# ------------------------------------------------------------------ never forgotten, rising


def test_the_cap_is_never_forgotten_and_rises_by_one_an_hour(store: str, qclock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=qclock, env={}, lease_max_age_ms=LONG) as e:
        held = [e.lease(P, M, K) for _ in range(2)]
        o = e.lease(P, M, K).failure(status=503, message=OLLAMA_BUSY)
        assert o is not None and o.learned is not None and o.learned.limit == 2
        qclock.advance(HOUR - 1)
        assert e.key_concurrency_cap(P, K) == 2
        with pytest.raises(q.QuotaExceeded) as exc:
            e.lease(P, M, K)
        assert exc.value.reason == "key_concurrency"
        qclock.advance(1)  # an hour: the cap rises to 3, a third goes out
        assert e.key_concurrency_cap(P, K) == 3
        held.append(e.lease(P, M, K))
        with pytest.raises(q.QuotaExceeded):
            e.lease(P, M, K)
        qclock.advance(HOUR)
        assert e.key_concurrency_cap(P, K) == 4
        assert caps_at(e, qclock, NOON, [2.5, 10, 24 * 3]) == [4, 12, 74]
        for lease in held:
            lease.release()


def test_a_failure_after_a_rise_doubles_the_wait(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    assert busy(qengine) == 1
    qclock.advance(HOUR)
    assert qengine.key_concurrency_cap(P, K) == 2  # risen
    assert busy(qengine) == 1  # fails at the risen cap: the wait is 2 h
    start = NOON + HOUR
    assert caps_at(qengine, qclock, start, [1, 2 - 1 / 3600, 2, 4 - 1 / 3600, 4]) == [1, 1, 2, 2, 3]
    assert busy(qengine) == 1  # rose since: 4 h
    start = NOON + 5 * HOUR
    assert caps_at(qengine, qclock, start, [2, 4 - 1 / 3600, 4, 8]) == [1, 1, 2, 3]


def test_a_failure_with_no_rise_in_between_sets_the_wait_back_to_an_hour(
    qengine: q.QuotaEngine, qclock: q.ManualClock
) -> None:
    busy(qengine)
    qclock.advance(HOUR)
    busy(qengine)  # after a rise: 2 h
    qclock.advance(HOUR)
    assert qengine.key_concurrency_cap(P, K) == 1  # not risen yet
    busy(qengine)  # no rise since the last failure: 1 h again
    assert caps_at(qengine, qclock, NOON + 2 * HOUR, [1 - 1 / 3600, 1, 2]) == [1, 2, 3]
    # Failures in a row, none after a rise, keep the wait at 1 h.
    qclock.set(NOON + 10 * HOUR)
    busy(qengine, K + 1)
    qclock.advance(30 * MINUTE)
    busy(qengine, K + 1)
    qclock.advance(HOUR)
    assert qengine.key_concurrency_cap(P, K + 1) == 2


def test_the_wait_is_at_most_a_day(store: str, qclock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=qclock, env={}) as e:
        # Each failure just after the cap rose: 1, 2, 4, 8, 16, 24, 24 h.
        for h in [0, 1, 3, 7, 15, 31, 55]:
            qclock.set(NOON + h * HOUR)
            if h:
                assert e.key_concurrency_cap(P, K) == 2  # it rose once since the last
            busy(e)
        at = NOON + 55 * HOUR
        assert caps_at(e, qclock, at, [24 - 1 / 3600, 24, 48]) == [1, 2, 3]
    with q.QuotaEngine(store, clock=qclock, env={}) as again:  # as the store holds it
        assert again.key_concurrency_cap(P, K) == 3


def test_the_configured_cap_bounds_the_learned_one(store: str, qclock: q.ManualClock) -> None:
    env = {"MAX_CONCURRENT_REQUESTS_PER_KEY_OLLAMA": "3"}
    with q.QuotaEngine(store, clock=qclock, env=env) as e:
        busy(e)
        assert e.key_concurrency_cap(P, K) == 1
        qclock.advance(10 * HOUR)
        assert e.key_concurrency_cap(P, K) == 3  # 11 learned, the env's 3 holds
        e.set_key_concurrency_cap(P, K, 2)
        assert e.key_concurrency_cap(P, K) == 2
        e.set_key_concurrency_cap(P, K, None)
        assert e.key_concurrency_cap(P, K) == 3
    with q.QuotaEngine(store, clock=qclock, env={}) as unbounded:
        assert unbounded.key_concurrency_cap(P, K) == 11


def test_clear_cooldowns_for_key_forgets_the_cap_and_its_chain(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    busy(qengine)
    qclock.advance(HOUR)
    busy(qengine)  # the wait is 2 h
    qengine.clear_cooldowns_for_key(K)
    assert qengine.key_concurrency_cap(P, K) is None
    busy(qengine)  # a new chain: 1 h
    qclock.advance(HOUR)
    assert qengine.key_concurrency_cap(P, K) == 2


def test_a_second_engine_sees_the_cap_rise_and_its_failures_count(store: str, qclock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=qclock, env={}) as a, q.QuotaEngine(store, clock=qclock, env={}) as b:
        assert b.key_concurrency_cap(P, K) is None
        busy(a)
        assert b.key_concurrency_cap(P, K) == 1
        qclock.advance(HOUR)
        assert b.key_concurrency_cap(P, K) == 2
        busy(b)  # after a rise a taught: the wait is 2 h for both
        qclock.advance(HOUR)
        assert (a.key_concurrency_cap(P, K), b.key_concurrency_cap(P, K)) == (1, 1)
        qclock.advance(HOUR)
        assert (a.key_concurrency_cap(P, K), b.key_concurrency_cap(P, K)) == (2, 2)


# ------------------------------------------------------------------ kept past retention


def test_a_cap_learned_three_days_ago_still_holds(store: str, qclock: q.ManualClock) -> None:
    """History is swept after a day; a learned cap's rows are not."""
    with q.QuotaEngine(store, clock=qclock, env={}) as e:
        busy(e)
        qclock.advance(HOUR)
        busy(e)  # the wait is 2 h
        e.record_failure(P, M, K, status=500)  # a ladder row, swept after a day
        qclock.advance(3 * DAY)
        for _ in range(2):  # writing calls: the sweep runs
            e.record_request(P, M, K + 1)
            qclock.advance(2 * MINUTE)
        # 1 + one rise every 2 h for 3 days (and 4 min).
        assert e.key_concurrency_cap(P, K) == 1 + 36
    with q.QuotaEngine(store, clock=qclock, env={}) as again:
        assert again.key_concurrency_cap(P, K) == 37
        qclock.advance(2 * HOUR)
        assert again.key_concurrency_cap(P, K) == 38


@pytest.mark.sqlite_only
def test_the_sweep_keeps_only_the_cap_and_the_chain_stays_short(db_path: object, qclock: q.ManualClock) -> None:
    with q.QuotaEngine(db_path, clock=qclock, env={}) as e:  # type: ignore[arg-type]
        for h in [0, 1, 3, 7, 15, 31, 55, 79, 103]:  # a chain of doublings
            qclock.set(NOON + h * HOUR)
            busy(e)
        e.record_failure(P, M, K, status=500)
        qclock.advance(3 * DAY)
        e.record_request(P, M, K)
        cap = e.key_concurrency_cap(P, K)
        assert cap == 1 + 3
    con = sqlite3.connect(db_path)  # type: ignore[arg-type]
    try:
        kinds = [k for (k,) in con.execute("SELECT kind FROM failure_history")]
        assert set(kinds) == {"concurrency"} and len(kinds) <= 6
    finally:
        con.close()
    with q.QuotaEngine(db_path, clock=qclock, env={}) as again:  # type: ignore[arg-type]
        assert again.key_concurrency_cap(P, K) == cap
