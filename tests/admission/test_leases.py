"""Leases (SPEC §5): what a live lease counts, the context managers, QuotaExceeded, the leaked-lease
backstop, and lease() as one atomic step across threads."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import quotaengine as q
from moments import MINUTE

P, M, K = "groq", "llama-3.1-8b", 1


def counts(e: q.QuotaEngine) -> tuple[int, int, int, int, int]:
    u = e.usage(P, M, K)
    return (u["rpm"]["used"], u["rpd"]["used"], u["tpm"]["used"], u["tpd"]["used"], u["in_flight"])


def test_lease_object(engine: q.QuotaEngine) -> None:
    lease = engine.lease(P, M, K, 120)
    assert isinstance(lease, q.Lease)
    assert isinstance(lease.id, int)
    assert (lease.platform, lease.model_id, lease.key_id, lease.estimated_tokens) == (P, M, K, 120)
    other = engine.lease(P, M, K)
    assert other.id != lease.id
    assert other.estimated_tokens == 0
    lease.release()
    other.release()


def test_live_lease_counts_in_every_window(engine: q.QuotaEngine) -> None:
    lease = engine.lease(P, M, K, 100)
    assert counts(engine) == (0, 0, 0, 0, 1)
    assert not engine.can_make_request(P, M, K, limits={"rpm": 1})
    assert not engine.can_make_request(P, M, K, limits={"rpd": 1})
    assert engine.can_use_tokens(P, M, K, 50, limits={"tpm": 150})
    assert not engine.can_use_tokens(P, M, K, 51, limits={"tpm": 150})
    assert not engine.can_use_tokens(P, M, K, 51, limits={"tpd": 150})
    assert engine.check(P, M, K, limits={"rpm": 1}).reason == "rpm"
    assert engine.check(P, M, K, limits={"rpd": 1}).reason == "rpd"
    assert engine.check(P, M, K, 51, limits={"tpm": 150}).reason == "tpm"
    assert engine.check(P, M, K, 51, limits={"tpd": 150}).reason == "tpd"
    assert engine.check(P, M, K, 50, limits={"rpm": 2, "rpd": 2, "tpm": 150, "tpd": 150}).allowed
    lease.release()
    assert counts(engine) == (0, 0, 0, 0, 0)
    assert engine.can_make_request(P, M, K, limits={"rpm": 1})


def test_live_lease_counts_in_provider_counts(db_path: Path, clock: q.ManualClock) -> None:
    env = {
        "PROVIDER_DAILY_REQUEST_CAP_GROQ": "1",
        "PROVIDER_MINUTE_REQUEST_CAP_GROQ": "1",
        "PROVIDER_DAILY_TOKEN_CAP_GROQ": "100",
    }
    with q.QuotaEngine(db_path, clock=clock, env=env) as e:
        lease = e.lease(P, "a", K, 60)
        assert not e.can_use_provider(P, K)
        assert not e.can_use_provider_minute(P, K)
        assert e.can_use_provider_tokens(P, K, "b", 40)
        assert not e.can_use_provider_tokens(P, K, "b", 41)
        lease.release()
        assert e.can_use_provider(P, K) and e.can_use_provider_minute(P, K)
        assert e.can_use_provider_tokens(P, K, "b", 100)


def test_with_block_normal_exit_records_estimate(engine: q.QuotaEngine) -> None:
    with engine.lease(P, M, K, 75) as lease:
        assert isinstance(lease, q.Lease)
        assert counts(engine) == (0, 0, 0, 0, 1)
    assert lease.done
    assert counts(engine) == (1, 1, 75, 75, 0)


def test_with_block_exception_records_nothing(engine: q.QuotaEngine) -> None:
    with pytest.raises(RuntimeError, match="upstream"):
        with engine.lease(P, M, K, 75):
            assert counts(engine)[4] == 1
            raise RuntimeError("upstream broke")
    assert counts(engine) == (0, 0, 0, 0, 0)


def test_explicit_success_in_with_block_is_not_doubled(engine: q.QuotaEngine) -> None:
    with engine.lease(P, M, K, 75) as lease:
        lease.success(tokens=40)
        assert lease.done
        assert counts(engine) == (1, 1, 40, 40, 0)
    assert counts(engine) == (1, 1, 40, 40, 0)


def test_explicit_release_in_with_block_records_nothing(engine: q.QuotaEngine) -> None:
    with engine.lease(P, M, K, 75) as lease:
        lease.release()
    assert counts(engine) == (0, 0, 0, 0, 0)


def test_success_without_tokens_records_only_the_request(engine: q.QuotaEngine) -> None:
    lease = engine.lease(P, M, K, 75)
    lease.success()
    assert counts(engine) == (1, 1, 0, 0, 0)
    lease.success(tokens=10)  # a second outcome records nothing more
    lease.release()
    assert counts(engine) == (1, 1, 0, 0, 0)


def test_release_records_nothing(engine: q.QuotaEngine) -> None:
    lease = engine.lease(P, M, K, 75)
    lease.release()
    lease.release()
    assert lease.done
    assert counts(engine) == (0, 0, 0, 0, 0)


def test_release_lease_is_idempotent(engine: q.QuotaEngine) -> None:
    a = engine.acquire_lease(P, M, K, 5)
    b = engine.acquire_lease(P, M, K, 5)
    assert counts(engine)[4] == 2
    engine.release_lease(a)
    engine.release_lease(a)
    assert counts(engine) == (0, 0, 0, 0, 1)
    engine.release_lease(b)
    engine.release_lease(b)
    engine.release_lease(123456789)  # unknown id: nothing happens
    assert counts(engine) == (0, 0, 0, 0, 0)


def test_async_with(engine: q.QuotaEngine) -> None:
    async def ok() -> None:
        async with engine.lease(P, M, K, 30) as lease:
            assert isinstance(lease, q.Lease)
            assert counts(engine)[4] == 1

    async def boom() -> None:
        async with engine.lease(P, M, K, 30):
            raise KeyError("x")

    async def explicit() -> None:
        async with engine.lease(P, M, K, 30) as lease:
            lease.success(tokens=5)

    asyncio.run(ok())
    assert counts(engine) == (1, 1, 30, 30, 0)
    with pytest.raises(KeyError):
        asyncio.run(boom())
    assert counts(engine) == (1, 1, 30, 30, 0)
    asyncio.run(explicit())
    assert counts(engine) == (2, 2, 35, 35, 0)


def test_quota_exceeded_fields(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    assert issubclass(q.QuotaExceeded, q.QuotaEngineError)
    assert issubclass(q.QuotaEngineError, Exception)
    engine.record_request(P, M, K)
    with pytest.raises(q.QuotaExceeded) as exc:
        engine.lease(P, M, K, limits={"rpm": 1})
    err = exc.value
    assert isinstance(err, q.QuotaEngineError)
    assert (err.reason, err.retry_at_ms, err.platform, err.model_id, err.key_id) == (
        "rpm",
        clock.now_ms() + MINUTE,
        P,
        M,
        K,
    )
    assert counts(engine) == (1, 1, 0, 0, 0)  # a refused lease takes nothing


def test_lease_uses_stored_limits(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=2)
    engine.lease(P, M, K)
    engine.lease(P, M, K)
    with pytest.raises(q.QuotaExceeded):
        engine.lease(P, M, K)
    engine.lease(P, M, K, limits={"rpm": 3})


def test_lease_refused_on_tokens(engine: q.QuotaEngine) -> None:
    engine.lease(P, M, K, 60, limits={"tpm": 100})
    with pytest.raises(q.QuotaExceeded) as exc:
        engine.lease(P, M, K, 41, limits={"tpm": 100})
    assert exc.value.reason == "tpm"
    engine.lease(P, M, K, 40, limits={"tpm": 100})


def test_leaked_leases_stop_counting(store: str, clock: q.ManualClock) -> None:
    # SPEC §5: a lease counts until it is OLDER than lease_max_age_ms.
    with q.QuotaEngine(store, clock=clock, env={}, lease_max_age_ms=10_000) as e:
        e.lease(P, M, K, 50)  # leaked: never released
        e.acquire_lease(P, M, K, 50)
        assert counts(e)[4] == 2
        assert not e.can_make_request(P, M, K, limits={"rpm": 2})
        clock.advance(9_999)
        assert counts(e)[4] == 2
        clock.advance(1)  # exactly lease_max_age_ms old: still counts
        assert counts(e)[4] == 2
        assert not e.can_make_request(P, M, K, limits={"rpm": 2})
        assert not e.check(P, M, K, 1, limits={"tpm": 100}).allowed
        clock.advance(1)  # one millisecond older: no longer counts
        assert counts(e)[4] == 0
        assert e.can_make_request(P, M, K, limits={"rpm": 1})
        assert e.can_use_tokens(P, M, K, 100, limits={"tpm": 100})
        e.lease(P, M, K, limits={"rpm": 1})


def test_an_expired_lease_counts_in_another_engine_until_the_same_millisecond(store: str, clock: q.ManualClock) -> None:
    """The boundary holds for a lease read back from the store, and the sweep of one
    engine does not delete a lease another engine still counts."""
    with (
        q.QuotaEngine(store, clock=clock, env={}, lease_max_age_ms=10_000) as a,
        q.QuotaEngine(store, clock=clock, env={}) as b,
    ):
        a.acquire_lease(P, M, K)
        clock.advance(10_000)
        a.record_request(P, "other", K)  # a write section: sweeps expired leases
        assert not b.can_make_request(P, M, K, limits={"rpm": 1})
        assert not a.can_make_request(P, M, K, limits={"rpm": 1})
        clock.advance(1)
        a.record_request(P, "other", K)
        assert b.can_make_request(P, M, K, limits={"rpm": 1})


def test_default_lease_max_age_is_two_minutes(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.acquire_lease(P, M, K)
    clock.advance(120_000)
    assert counts(engine)[4] == 1
    clock.advance(1)
    assert counts(engine)[4] == 0


def test_each_lease_keeps_the_max_age_of_its_engine(db_path: Path, clock: q.ManualClock) -> None:
    with (
        q.QuotaEngine(db_path, clock=clock, env={}, lease_max_age_ms=5_000) as short,
        q.QuotaEngine(db_path, clock=clock, env={}, lease_max_age_ms=50_000) as long,
    ):
        short.acquire_lease(P, M, K)
        long.acquire_lease(P, M, K)
        assert counts(short)[4] == 2 and counts(long)[4] == 2
        clock.advance(5_001)
        assert counts(short)[4] == 1 and counts(long)[4] == 1
        clock.advance(45_000)
        assert counts(short)[4] == 0 and counts(long)[4] == 0


def test_acquire_lease_is_unconditional(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(P, M, rpm=1, rpd=1, tpm=10, tpd=10)
    engine.set_cooldown(P, M, K, duration_ms=60_000)
    ids = [engine.acquire_lease(P, M, K, 1000) for _ in range(5)]
    assert len(set(ids)) == 5
    assert counts(engine)[4] == 5
    assert not engine.check(P, M, K).allowed
    for i in ids:
        engine.release_lease(i)
    assert counts(engine)[4] == 0


def test_lease_success_records_tokens(engine: q.QuotaEngine) -> None:
    lease = engine.lease(P, M, K, 100)
    lease.success(tokens=87)
    assert counts(engine) == (1, 1, 87, 87, 0)


def test_sixteen_threads_race_on_rpm_50(engine: q.QuotaEngine) -> None:
    limits = {"rpm": 50}
    barrier = threading.Barrier(16)
    admitted: list[list[q.Lease]] = [[] for _ in range(16)]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            barrier.wait()
            while True:
                try:
                    admitted[i].append(engine.lease(P, M, K, limits=limits))
                except q.QuotaExceeded as exc:
                    assert exc.reason == "rpm"
                    return
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert sum(len(a) for a in admitted) == 50
    assert engine.usage(P, M, K)["in_flight"] == 50
    assert len({lease.id for a in admitted for lease in a}) == 50
