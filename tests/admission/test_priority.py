"""SPEC 22.1: priorities. `set_priority_reserve` / `priority_reserve` (persisted, shared
through the file and Redis) and `priority=` on `lease`, `lease_any` and their async forms:
every gate leaves `floor(limit * reserve(p))` free for a call of priority p, with
`retry_at_ms` for that priority; waiters of a smaller priority number go first; `headroom`
scores with the priority's limits; `check()` and the `can_*` gates answer for priority 0."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import quotaengine as q
from moments import DAY, MINUTE, T0, TEN_AM
from old_schemas import downgrade_schema
from waiters import order_of_admission

P, M, K = "groq", "llama", 1


def refusal(call: Any) -> q.QuotaExceeded:
    with pytest.raises(q.QuotaExceeded) as exc:
        call()
    return exc.value


def fill(e: q.QuotaEngine, n: int, model: str = M, key: int = K) -> None:
    for _ in range(n):
        e.record_request(P, model, key)


# ================================================================== the reserve in force


def test_the_reserve_of_a_priority_is_that_of_the_largest_configured_one_at_or_below_it(
    engine: q.QuotaEngine,
) -> None:
    assert [engine.priority_reserve(p) for p in (0, 1, 7)] == [0.0, 0.0, 0.0]  # none set
    engine.set_priority_reserve(1, 0.2)
    engine.set_priority_reserve(3, 0.5)
    assert [engine.priority_reserve(p) for p in range(6)] == [0.0, 0.2, 0.2, 0.5, 0.5, 0.5]
    engine.set_priority_reserve(3, 0.0)  # a reserve of 0 set for 3 and above
    assert [engine.priority_reserve(p) for p in (1, 2, 3, 100)] == [0.2, 0.2, 0.0, 0.0]
    engine.set_priority_reserve(0, 0.1)
    assert engine.priority_reserve(0) == 0.1


def test_reserves_persist_and_are_shared_through_the_store(store: str, clock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=clock, env={}) as a, q.QuotaEngine(store, clock=clock, env={}) as b:
        a.set_model_limits(P, M, rpm=10)
        fill(a, 8)
        assert b.lease(P, M, K, priority=1).release() is None  # no reserve yet
        a.set_priority_reserve(1, 0.2)
        # the other engine, open all along, sees it at its next call
        assert b.priority_reserve(2) == 0.2
        assert refusal(lambda: b.lease(P, M, K, priority=1)).reason == "rpm"
    with q.QuotaEngine(store, clock=clock, env={}) as c:  # and it outlives both
        assert c.priority_reserve(1) == 0.2
        assert refusal(lambda: c.lease(P, M, K, priority=1)).reason == "rpm"
        c.lease(P, M, K).release()


@pytest.mark.sqlite_only
def test_a_schema_8_file_migrates_and_keeps_no_reserve(db_path: Path, clock: q.ManualClock) -> None:
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        e.set_priority_reserve(1, 0.5)
    con = sqlite3.connect(db_path)
    with con:
        downgrade_schema(con, 8)
    con.close()
    with q.QuotaEngine(db_path, clock=clock, env={}) as e:
        assert e.priority_reserve(1) == 0.0
        e.set_priority_reserve(2, 0.25)
        assert e.priority_reserve(5) == 0.25
    con = sqlite3.connect(db_path)
    try:
        assert con.execute("PRAGMA user_version").fetchone()[0] == 13
        assert con.execute("SELECT priority, fraction FROM priority_reserves").fetchall() == [(2, 0.25)]
    finally:
        con.close()


# ======================================================================== every gate


def test_a_request_window_leaves_the_reserve_free_with_a_retry_time_for_that_priority(
    engine: q.QuotaEngine, clock: q.ManualClock
) -> None:
    engine.set_model_limits(P, M, rpm=10)
    engine.set_priority_reserve(1, 0.2)  # floor(10 * 0.2) = 2 kept for priority 0
    fill(engine, 7)
    clock.advance(1_000)
    engine.lease(P, M, K, priority=1).success()  # 8 used: priority 1 is now refused
    r = refusal(lambda: engine.lease(P, M, K, priority=5))
    # priority 1 opens when one request leaves the window: the oldest, at TEN_AM
    assert (r.reason, r.retry_at_ms) == ("rpm", TEN_AM + MINUTE)
    engine.lease(P, M, K).success()
    engine.lease(P, M, K, priority=0).success()  # priority 0 fills the limit
    r = refusal(lambda: engine.lease(P, M, K))
    assert (r.reason, r.retry_at_ms) == ("rpm", TEN_AM + MINUTE)
    r = refusal(lambda: engine.lease(P, M, K, priority=1))
    # priority 1 now needs three requests gone: the third oldest is at TEN_AM too
    assert (r.reason, r.retry_at_ms) == ("rpm", TEN_AM + MINUTE)
    clock.advance(MINUTE - 1_000)  # the seven of TEN_AM leave: 3 used
    engine.lease(P, M, K, priority=1).release()


def test_in_flight_leases_count_against_the_reserve(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=5)
    engine.set_priority_reserve(1, 0.4)  # 2 kept: priority 1 may hold 3
    held = [engine.lease(P, M, K, priority=1) for _ in range(3)]
    r = refusal(lambda: engine.lease(P, M, K, priority=1))
    assert (r.reason, r.retry_at_ms) == ("rpm", None)  # only live leases block it
    held.append(engine.lease(P, M, K))
    held.append(engine.lease(P, M, K))
    assert refusal(lambda: engine.lease(P, M, K)).reason == "rpm"
    for h in held:
        h.release()


def test_a_token_window_refuses_when_the_estimate_passes_the_priority_limit(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, tpm=1000)
    engine.set_priority_reserve(1, 0.25)  # 750 for priority 1
    engine.record_tokens(P, M, K, 650)
    engine.lease(P, M, K, 100, priority=1).release()  # 750 is not > 750
    r = refusal(lambda: engine.lease(P, M, K, 101, priority=1))
    assert r.reason == "tpm"
    engine.lease(P, M, K, 350).release()  # priority 0: up to 1000


def test_the_floor_is_taken_in_double_precision(engine: q.QuotaEngine) -> None:
    # 100 * 0.29 is 28.999999999999996 in double precision: 28 kept, 72 for priority 1
    engine.set_model_limits(P, M, rpd=100)
    engine.set_priority_reserve(1, 0.29)
    fill(engine, 71)
    engine.lease(P, M, K, priority=1).success()
    assert refusal(lambda: engine.lease(P, M, K, priority=1)).reason == "rpd"


def test_declared_windows_at_key_and_account_scope(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.register_key(1, P, account="org")
    engine.register_key(2, P, account="org")
    engine.set_model_limits(P, M, limits=[q.Limit("requests", 10, "1h", scope="key"), q.Limit("requests", 10, "week")])
    engine.set_priority_reserve(1, 0.5)  # 5 of each kept
    fill(engine, 5, key=1)
    r = refusal(lambda: engine.lease(P, M, 1, priority=1))
    assert (r.reason, r.retry_at_ms) == ("requests/1h", TEN_AM + 3_600_000)  # key scope
    fill(engine, 2, key=1)  # the account has used 7 (key 2 none)
    r = refusal(lambda: engine.lease(P, M, 2, priority=1))
    week = 1_767_571_200_000  # Monday 2026-01-05 00:00 UTC
    assert (r.reason, r.retry_at_ms) == ("requests/week", week)  # account scope
    engine.lease(P, M, 2).success()  # priority 0 passes both
    clock.advance(3_600_000)  # the hour window frees; the week still holds 8 of 10
    assert refusal(lambda: engine.lease(P, M, 1, priority=1)).reason == "requests/week"


def test_provider_caps_leave_the_reserve_free(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.set_priority_reserve(1, 0.5)
    engine.set_provider_caps(P, daily_requests=10)
    fill(engine, 5, model="a")
    r = refusal(lambda: engine.lease(P, "b", K, priority=1))
    assert (r.reason, r.retry_at_ms) == ("provider_daily_requests", T0 + DAY)
    engine.lease(P, "b", K).success()
    engine.set_provider_caps(P, daily_requests=None, minute_requests=4)
    clock.advance(2 * MINUTE)
    fill(engine, 1, model="a")
    clock.advance(1_000)
    fill(engine, 1, model="a")
    r = refusal(lambda: engine.lease(P, "b", K, priority=1))  # 2 of 4, 2 kept
    # priority 1 opens when the older of the two leaves the minute
    assert (r.reason, r.retry_at_ms) == ("provider_minute_requests", TEN_AM + 2 * MINUTE + MINUTE)
    engine.lease(P, "b", K).release()
    engine.set_provider_caps(P, minute_requests=None, daily_tokens=1000)
    engine.record_tokens(P, "a", K, 450)
    engine.lease(P, "b", K, 50, priority=1).release()  # 500 is not > 500
    r = refusal(lambda: engine.lease(P, "b", K, 51, priority=1))
    assert (r.reason, r.retry_at_ms) == ("provider_daily_tokens", T0 + DAY)
    engine.lease(P, "b", K, 550).release()


def test_the_concurrency_cap_leaves_the_reserve_free(engine: q.QuotaEngine) -> None:
    engine.set_key_concurrency_cap(P, K, 5)
    engine.set_priority_reserve(2, 0.2)  # floor(5 * 0.2) = 1 kept
    held = [engine.lease(P, f"m{i}", K, priority=2) for i in range(4)]
    r = refusal(lambda: engine.lease(P, "x", K, priority=3))
    assert (r.reason, r.retry_at_ms) == ("key_concurrency", None)
    held.append(engine.lease(P, "x", K, priority=1))  # below any configured priority: no reserve
    assert refusal(lambda: engine.lease(P, "y", K)).reason == "key_concurrency"
    for h in held:
        h.release()


def test_check_and_the_can_gates_answer_for_priority_0(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=10)
    engine.set_priority_reserve(1, 0.5)
    fill(engine, 6)
    assert engine.check(P, M, K).allowed and engine.can_make_request(P, M, K)
    assert refusal(lambda: engine.lease(P, M, K, priority=1)).reason == "rpm"
    engine.set_priority_reserve(0, 0.5)  # a reserve priority 0 itself keeps
    a = engine.check(P, M, K)
    assert (a.allowed, a.reason) == (False, "rpm")
    assert not engine.can_make_request(P, M, K)
    assert refusal(lambda: engine.lease(P, M, K)).reason == "rpm"


# ========================================================================= lease_any


def test_lease_any_passes_and_scores_with_the_priority_limits(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, "a", rpm=10)
    engine.set_model_limits(P, "b", rpm=100)
    fill(engine, 2, model="a")  # priority 0: (10 - 3) / 10 = 0.70; priority 1: (9 - 3) / 9 = 0.67
    fill(engine, 28, model="b")  # priority 0: (100 - 29) / 100 = 0.71; priority 1: (85 - 29) / 85 = 0.66
    engine.set_priority_reserve(1, 0.15)  # floor(1.5) = 1 and floor(15) = 15 kept
    routes = [(P, "a", K), (P, "b", K)]
    with engine.lease_any(routes) as lease:
        assert lease.model_id == "b"
        lease.release()
    with engine.lease_any(routes, priority=1) as lease:
        assert lease.model_id == "a"
        lease.release()
    fill(engine, 7, model="a")  # a: 9 of 10, refused for priority 1 (its limit is 9)
    fill(engine, 56, model="b")  # b: 84 of 100
    with engine.lease_any(routes, priority=1, strategy="order") as lease:
        assert lease.model_id == "b"
        lease.release()
    fill(engine, 1, model="b")  # b: 85: refused for priority 1 too
    r = refusal(lambda: engine.lease_any(routes, priority=1))
    assert [(x.model_id, x.reason) for x in r.refusals] == [("a", "rpm"), ("b", "rpm")]
    engine.lease_any(routes, strategy="order").release()  # priority 0 still passes


def test_the_async_forms_take_a_priority(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=4)
    engine.set_priority_reserve(1, 0.5)
    fill(engine, 2)

    async def main() -> None:
        with pytest.raises(q.QuotaExceeded):
            await engine.lease_async(P, M, K, priority=1)
        with pytest.raises(q.QuotaExceeded):
            await engine.lease_any_async([(P, M, K)], priority=1)
        (await engine.lease_async(P, M, K)).release()
        (await engine.lease_any_async([(P, M, K)], priority=0)).release()

    asyncio.run(main())


# ========================================================================= waiting


def test_waiters_of_a_smaller_priority_number_are_admitted_first(store: str) -> None:
    with q.QuotaEngine(store, env={"MAX_CONCURRENT_REQUESTS_PER_KEY": "1"}) as e:
        held = e.lease(P, M, K)
        priorities = [2, 1, 0, 1, 0]
        order = order_of_admission(lambda i: e.lease(P, M, K, wait_s=20, priority=priorities[i]), held, 5)
        # priority 0 first (in arrival order), then 1, then 2
        assert order == [2, 4, 1, 3, 0]


def test_async_waiters_follow_priority_too(store: str) -> None:
    with q.QuotaEngine(store, env={"MAX_CONCURRENT_REQUESTS_PER_KEY": "1"}) as e:
        held = e.lease(P, M, K)
        order: list[int] = []

        async def waiter(i: int, priority: int) -> None:
            lease = await e.lease_any_async([(P, M, K)], wait_s=20, priority=priority)
            order.append(i)
            await asyncio.sleep(0.05)
            lease.release()

        async def main() -> None:
            tasks = []
            for i, priority in enumerate([3, 0, 3, 1]):
                tasks.append(asyncio.create_task(waiter(i, priority)))
                await asyncio.sleep(0.1)
            held.release()
            await asyncio.gather(*tasks)

        asyncio.run(main())
        assert order == [1, 3, 0, 2]


def test_async_waiters_on_two_keys_of_one_account_follow_priority_for_its_window(
    store: str, clock: q.ManualClock
) -> None:
    """SPEC 24.5: waiters for one account-scope window wait in one line whichever key of
    the account they asked for: the more important one first, though it came later."""
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        for k in (1, 2):
            e.register_key(k, P, account="org")
        e.set_model_limits(P, M, limits=[q.Limit("requests", 1, "minute")])

        async def main() -> list[int]:
            order: list[int] = []

            async def waiter(i: int) -> None:
                lease = await e.lease_any_async([(P, M, 1 + i)], wait_s=600, priority=1 - i)
                lease.success()
                order.append(i)

            for _ in range(10):
                clock.advance(60_000)
                e.record_request(P, M, 1)
                tasks = []
                for i in range(2):
                    tasks.append(asyncio.create_task(waiter(i)))
                    await asyncio.sleep(0.1)
                for n in (1, 2):
                    clock.advance(60_000)
                    while len(order) % 2 != n % 2:
                        await asyncio.sleep(0.01)
                await asyncio.gather(*tasks)
            return order

        order = asyncio.run(main())
        assert order == [1, 0] * 10


# ========================================================================= bad input


@pytest.mark.parametrize(
    ("priority", "fraction", "error"),
    [
        (-1, 0.1, ValueError),
        (1, 1.0, ValueError),
        (1, 1, ValueError),
        (1, -0.1, ValueError),
        (1, float("nan"), ValueError),
        (1, float("inf"), ValueError),
        (True, 0.1, TypeError),
        (1.0, 0.1, TypeError),
        ("1", 0.1, TypeError),
        (None, 0.1, TypeError),
        (1, "0.1", TypeError),
        (1, True, TypeError),
        (1, None, TypeError),
        (2**63, 0.1, OverflowError),
    ],
)
def test_bad_reserves_are_refused_and_change_nothing(
    engine: q.QuotaEngine, priority: Any, fraction: Any, error: type[Exception]
) -> None:
    engine.set_priority_reserve(1, 0.3)
    with pytest.raises(error):
        engine.set_priority_reserve(priority, fraction)
    assert [engine.priority_reserve(p) for p in (0, 1, 2)] == [0.0, 0.3, 0.3]


@pytest.mark.parametrize(
    ("priority", "error"), [(-1, ValueError), (True, TypeError), (1.0, TypeError), ("0", TypeError)]
)
def test_bad_priorities_are_refused_and_lease_nothing(engine: q.QuotaEngine, priority: Any, error: type) -> None:
    with pytest.raises(error):
        engine.priority_reserve(priority)
    with pytest.raises(error):
        engine.lease(P, M, K, priority=priority)
    with pytest.raises(error):
        engine.lease(P, M, K, wait_s=1, priority=priority)
    with pytest.raises(error):
        engine.lease_any([(P, M, K)], priority=priority)

    async def main() -> None:
        with pytest.raises(error):
            await engine.lease_async(P, M, K, priority=priority)
        with pytest.raises(error):
            await engine.lease_any_async([(P, M, K)], priority=priority)

    asyncio.run(main())
    assert engine.usage(P, M, K)["in_flight"] == 0
    assert engine.priority_reserve(0) == 0.0
