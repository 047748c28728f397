"""SPEC 27.1: ``e.stats()``, an engine's counters since it was opened, in memory and per
process: leases taken, refusals raised, failures recorded, waits, time degraded, writes
buffered. On SQLite and Redis; the async forms too."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import quotaengine as q
from moments import TEN_AM
from outages import exclusive_lock
from provider_bodies import OPENROUTER_UPSTREAM
from waiters import start_in_turn

P, M, M2 = "groq", "llama-3.1-8b", "mixtral"

EMPTY = {
    "admitted": {},
    "refused": {},
    "failures": {},
    "waits": {"count": 0, "seconds": 0.0},
    "degraded_s": 0.0,
    "buffered_writes": 0,
}


def test_a_new_engine_counts_nothing(engine: q.QuotaEngine) -> None:
    assert engine.stats() == EMPTY


def test_leases_refusals_and_failures_are_counted(engine: q.QuotaEngine, store: str, clock: q.ManualClock) -> None:
    engine.set_model_limits(P, M, rpm=2)
    with engine.lease(P, M, 1):
        pass
    engine.lease(P, M, 2).success(tokens=5)
    # lease_any takes one lease, on the route it picks.
    engine.lease_any([(P, M, 1), (P, M2, 1)], strategy="order").success()
    # A raw lease (no gate) is no admission.
    engine.release_lease(engine.acquire_lease(P, M2, 1))
    with pytest.raises(q.QuotaExceeded):
        engine.lease(P, M, 1)
    # lease_any's refusal is one QuotaExceeded, counted once by its reason.
    engine.set_model_limits(P, M2, rpm=0)
    with pytest.raises(q.QuotaExceeded) as refused:
        engine.lease_any([(P, M, 1), (P, M2, 1)])
    # check() raises nothing: not counted.
    assert not engine.check(P, M, 1).allowed
    # failures: failure(), observe() and record_failure(), by platform and kind.
    engine.set_model_limits(P, M, rpm=100)
    engine.lease(P, M, 1).failure(status=500)
    engine.record_failure(P, M, 2, status=429)

    class Response:
        status_code = 503
        headers: dict[str, str] = {}
        text = ""

    engine.lease(P, M, 3).observe(Response())
    engine.record_failure("openrouter", "x/y:free", 1, status=429, message=OPENROUTER_UPSTREAM)
    s = engine.stats()
    assert s["admitted"] == {(P, M): 5}
    assert refused.value.reason == "rpm"
    assert s["refused"] == {"rpm": 2}
    assert s["failures"] == {
        (P, "server_error"): 2,
        (P, "rate_limit"): 1,
        ("openrouter", "upstream"): 1,
    }
    assert s["waits"] == {"count": 0, "seconds": 0.0}
    # Per process, in memory: another engine on the same store has counted nothing.
    with q.QuotaEngine(store, clock=clock, env={}) as other:
        assert other.stats() == EMPTY


def test_a_wait_is_counted_with_its_seconds(engine: q.QuotaEngine) -> None:
    """A call with ``wait_s`` that was not admitted at once counts as a wait, whether the
    wait ended in a lease or a refusal; one admitted at once does not."""
    engine.set_key_concurrency_cap(P, 1, 1)
    engine.lease(P, M, 1, wait_s=5).success()  # admitted at once: no wait
    assert engine.stats()["waits"] == {"count": 0, "seconds": 0.0}
    held = engine.lease(P, M, 1)
    timer = threading.Timer(0.2, held.success)
    timer.start()
    engine.lease(P, M, 1, wait_s=10).success()  # waits for the release, about 0.2 s
    timer.join()
    s = engine.stats()
    # In seconds (not milliseconds): about the 0.2 s it was made to wait.
    assert s["waits"]["count"] == 1 and 0.15 <= s["waits"]["seconds"] <= 5
    assert s["admitted"] == {(P, M): 3}
    held = engine.lease(P, M, 1)
    with pytest.raises(q.QuotaExceeded) as refused:
        engine.lease(P, M, 1, wait_s=0.05)  # the wait runs out
    held.success()
    s2 = engine.stats()
    assert s2["waits"]["count"] == 2 and s2["waits"]["seconds"] > s["waits"]["seconds"]
    assert s2["refused"] == {refused.value.reason: 1}


@pytest.mark.parametrize("form", ["sync", "async"])
def test_a_wait_queued_behind_another_is_counted(engine: q.QuotaEngine, clock: q.ManualClock, form: str) -> None:
    """A call that queues behind a waiter and naps while that waiter holds its route has
    not been admitted at once, even when its first look at the gates admits it: both
    waits count (the blocking form and the async one)."""
    engine.set_model_limits(P, M, limits=[q.Limit("requests", 2, "1s", scope="key")])
    engine.lease(P, M, 1).success()
    engine.lease(P, M, 1).success()  # the route is full for this second
    admitted: list[int] = []

    async def lease_async() -> q.Lease:
        return await engine.lease_async(P, M, 1, wait_s=10)

    def waiter(i: int) -> None:
        lease = engine.lease(P, M, 1, wait_s=10) if form == "sync" else asyncio.run(lease_async())
        lease.success()
        admitted.append(i)

    # W1 is refused and waits; W2 queues at once behind it and naps, held, never refused.
    threads = start_in_turn(2, waiter)
    assert engine.stats()["waits"]["count"] == 0  # both still wait
    clock.advance(1000)  # both slots free at once: W1 is admitted, then W2 at its first look
    for th in threads:
        th.join(10)
    assert not any(th.is_alive() for th in threads)
    assert sorted(admitted) == [0, 1]
    s = engine.stats()
    assert s["waits"]["count"] == 2
    assert s["refused"] == {}
    assert s["admitted"] == {(P, M): 4}


def test_the_async_forms_are_counted(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=2)

    async def main() -> None:
        (await engine.lease_async(P, M, 1)).success()
        (await engine.lease_any_async([(P, M, 1), (P, M2, 1)], strategy="order")).success()
        with pytest.raises(q.QuotaExceeded):
            await engine.lease_async(P, M, 1)
        with pytest.raises(q.QuotaExceeded):
            await engine.lease_async(P, M, 1, wait_s=0.05)
        with pytest.raises(q.QuotaExceeded):
            await engine.lease_any_async([(P, M, 1)])

    asyncio.run(main())
    s = engine.stats()
    assert s["admitted"] == {(P, M): 2}
    assert s["refused"] == {"rpm": 3}
    assert s["waits"]["count"] == 1


def test_a_closed_engine_says_so(store: str, clock: q.ManualClock) -> None:
    e = q.QuotaEngine(store, clock=clock, env={})
    e.close()
    with pytest.raises(q.EngineClosed):
        e.stats()


def test_degraded_seconds_and_buffered_writes(db_path: Path) -> None:
    """Degraded (another connection holds the file's lock), the engine counts the time and
    the writes it buffers; once written, nothing is buffered and the time stays counted."""
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(db_path, clock=clock, env={}, busy_timeout_ms=50) as e:
        e.record_request(P, M, 1)
        with exclusive_lock(db_path):
            e.record_request(P, M, 1)
            e.lease(P, M, 1).success(tokens=3)
            assert e.degraded
            s = e.stats()
            assert s["buffered_writes"] == e._pending_writes() > 0
            assert s["degraded_s"] > 0
            assert s["admitted"] == {(P, M): 1}
        e.record_request(P, M, 1)
        assert not e.degraded
        after = e.stats()
        assert after["buffered_writes"] == 0
        assert after["degraded_s"] >= s["degraded_s"] > 0
        again = e.stats()["degraded_s"]
        assert again == after["degraded_s"]  # not degraded: the time no longer grows
