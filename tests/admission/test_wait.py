"""SPEC 17.2: `wait_s` on `lease()` and `lease_any()`, and the async forms, on both
backends, with real threads, a real clock, real processes and real signals."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest
import quotaengine as q
from subprocesses import spawn, stderr_of
from waiters import admitted_one_at_a_time, admitted_while_it_waits, order_of_admission

NOW = 1_767_268_800_000  # 2026-01-01 12:00 UTC
P, M, K = "groq", "llama", 1
TWO_SECONDS = [q.Limit("requests", 1, "2s")]  # a window that frees in real time, soon


@pytest.fixture
def e(store: str) -> Iterator[q.QuotaEngine]:
    with q.QuotaEngine(store, env={}) as engine:  # the real clock
        yield engine


def test_a_wait_is_admitted_when_the_window_frees(e: q.QuotaEngine) -> None:
    """A thread blocked in lease(wait_s=5) on a full window is admitted when it frees, and
    other threads keep running meanwhile (the GIL is free)."""
    e.set_model_limits(P, M, limits=TWO_SECONDS)
    e.lease(P, M, K).success()
    t0 = time.monotonic()
    ticks = 0
    stop = threading.Event()

    def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.01)

    th = threading.Thread(target=ticker)
    th.start()
    try:
        lease = e.lease(P, M, K, wait_s=5)
    finally:
        stop.set()
        th.join()
    waited = time.monotonic() - t0
    assert 1.0 < waited < 4.0  # the 2 s window freed, less what passed since the first
    assert ticks > 50  # the ticker ran throughout
    lease.success()
    assert e.usage(P, M, K)["in_flight"] == 0


def test_a_wait_is_admitted_when_another_threads_lease_ends(store: str) -> None:
    env = {"MAX_CONCURRENT_REQUESTS_PER_KEY": "1"}
    with q.QuotaEngine(store, env=env) as e:
        held = e.lease(P, M, K)
        ended_at: list[float] = []

        def end_it() -> None:
            time.sleep(0.3)
            ended_at.append(time.monotonic())
            held.success()

        th = threading.Thread(target=end_it)
        th.start()
        lease = e.lease(P, M, K, wait_s=5)
        admitted = time.monotonic()
        th.join()
        assert admitted >= ended_at[0]
        lease.release()


def test_wait_zero_never_waits_and_lease_any_waits_too(e: q.QuotaEngine) -> None:
    e.set_model_limits(P, M, limits=TWO_SECONDS)
    e.set_model_limits("other", M, limits=TWO_SECONDS)
    routes = [(P, M, K), ("other", M, 2)]
    e.lease_any(routes).success()
    e.lease_any(routes).success()
    t0 = time.monotonic()
    with pytest.raises(q.QuotaExceeded) as exc:
        e.lease_any(routes)
    assert time.monotonic() - t0 < 0.5
    assert len(exc.value.refusals) == 2
    lease = e.lease_any(routes, wait_s=5)
    assert 0.5 < time.monotonic() - t0 < 4.0
    lease.release()


def test_it_never_sleeps_in_vain(store: str) -> None:
    """With a ManualClock, a window 60 s away is beyond a 1 s wait: refused at once. With a
    longer wait, a clock moved by another thread admits it."""
    clock = q.ManualClock(NOW)
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        e.set_model_limits(P, M, rpm=1)
        e.lease(P, M, K).success()
        t0 = time.monotonic()
        with pytest.raises(q.QuotaExceeded) as exc:
            e.lease(P, M, K, wait_s=1)
        assert time.monotonic() - t0 < 0.3
        assert exc.value.retry_at_ms == NOW + 60_000
        mover = threading.Timer(0.2, clock.advance, args=(60_000,))
        mover.start()
        lease = e.lease(P, M, K, wait_s=61)
        mover.join()
        assert time.monotonic() - t0 < 5
        lease.release()


def test_a_wait_that_runs_out_raises_with_the_refusals(store: str) -> None:
    env = {"MAX_CONCURRENT_REQUESTS_PER_KEY": "1"}
    with q.QuotaEngine(store, env=env) as e:
        held = e.lease(P, M, K)
        t0 = time.monotonic()
        with pytest.raises(q.QuotaExceeded) as exc:
            e.lease_any([(P, M, K)], wait_s=0.3)  # no retry time known: waits it out
        assert 0.3 <= time.monotonic() - t0 < 2
        assert exc.value.reason == "key_concurrency"
        held.release()


def test_first_come_first_served(store: str) -> None:
    env = {"MAX_CONCURRENT_REQUESTS_PER_KEY": "1"}
    with q.QuotaEngine(store, env=env) as e:
        held = e.lease(P, M, K)
        order = order_of_admission(lambda i: e.lease(P, M, K, wait_s=10), held, 4)
        assert order == [0, 1, 2, 3]


def test_close_ends_every_wait(store: str) -> None:
    env = {"MAX_CONCURRENT_REQUESTS_PER_KEY": "1"}
    e = q.QuotaEngine(store, env=env)
    e.lease(P, M, K)
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            e.lease(P, M, K, wait_s=30)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=waiter) for _ in range(3)]
    for th in threads:
        th.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    e.close()
    for th in threads:
        th.join(5)
    assert time.monotonic() - t0 < 2
    assert len(errors) == 3 and all(isinstance(x, q.EngineClosed) for x in errors)


INTERRUPTED = """
    import sys, time
    import quotaengine as q
    store = sys.argv[1]
    e = q.QuotaEngine(store, env={"MAX_CONCURRENT_REQUESTS_PER_KEY": "1"})
    e.lease("groq", "llama", 1)
    print("waiting", flush=True)
    t0 = time.monotonic()
    try:
        e.lease("groq", "llama", 1, wait_s=30)
    except KeyboardInterrupt:
        print("interrupted", round(time.monotonic() - t0, 3), e.usage("groq", "llama", 1)["in_flight"], flush=True)
"""


def test_ctrl_c_ends_a_wait_promptly_with_nothing_leased(store: str) -> None:
    with spawn(INTERRUPTED, store) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "waiting", stderr_of(proc)
        time.sleep(0.3)
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGINT)
        line = proc.stdout.readline().split()
        answered = time.monotonic() - sent
        assert line[:1] == ["interrupted"], stderr_of(proc)
        assert line[2] == "1"  # the one lease held before the wait, no other
        assert answered < 1.0  # within 100 ms of the signal, plus the pipe on a loaded machine
        proc.wait(10)


RELEASER = """
    import sys, time
    import quotaengine as q
    store = sys.argv[1]
    e = q.QuotaEngine(store, env={})
    lease = e.lease("groq", "llama", 1)
    print("held", flush=True)
    sys.stdin.readline()
    lease.release()
    print("released", flush=True)
    e.close()
"""


def test_a_wait_sees_another_process_release(store: str) -> None:
    with q.QuotaEngine(store, env={"MAX_CONCURRENT_REQUESTS_PER_KEY": "1"}) as e:
        with spawn(RELEASER, store) as proc:
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.readline().strip() == "held", stderr_of(proc)
            assert not e.check(P, M, K)
            threading.Timer(0.3, lambda: (proc.stdin.write("go\n"), proc.stdin.flush())).start()  # type: ignore[union-attr]
            t0 = time.monotonic()
            lease = e.lease(P, M, K, wait_s=10)
            assert time.monotonic() - t0 < 5
            assert proc.stdout.readline().strip() == "released"
            lease.release()


# ------------------------------------------------------------------ asyncio


def test_a_hundred_async_waiters_on_ten_requests_admit_exactly_ten(store: str) -> None:
    clock = q.ManualClock(NOW)
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        e.set_model_limits(P, M, rpm=10)
        routes = [(P, M, K)]

        async def main() -> tuple[int, int, int]:
            ticks = 0
            done = asyncio.Event()

            async def ticker() -> None:
                nonlocal ticks
                while not done.is_set():
                    ticks += 1
                    await asyncio.sleep(0.01)

            async def one() -> bool:
                try:
                    async with await e.lease_any_async(routes, 5, wait_s=2):
                        await asyncio.sleep(0.01)
                    return True
                except q.QuotaExceeded:
                    return False

            t = asyncio.create_task(ticker())
            t0 = time.monotonic()
            results = await asyncio.gather(*(one() for _ in range(100)))
            elapsed = time.monotonic() - t0
            done.set()
            await t
            return sum(results), ticks, int(elapsed * 1000)

        admitted, ticks, elapsed_ms = asyncio.run(main())
        assert admitted == 10
        # The other 90 wait while the ten are in flight, then are refused as soon as the
        # window's retry time (60 s away by the ManualClock) is known to lie beyond their
        # 2 s; the loop ticked throughout.
        assert elapsed_ms < 2_000
        # The loop ran while they waited (a count of ticks per elapsed time would be a
        # timed assertion: on a loaded machine a tick can take longer than 30 ms).
        assert ticks >= 2
        assert e.usage(P, M, K)["rpm"]["used"] == 10
        assert e.usage(P, M, K)["in_flight"] == 0


def test_async_waiters_are_admitted_as_leases_end_and_the_loop_keeps_ticking(store: str) -> None:
    env = {"MAX_CONCURRENT_REQUESTS_PER_KEY": "2"}
    with q.QuotaEngine(store, env=env) as e:

        async def main() -> tuple[int, int]:
            ticks = 0
            done = asyncio.Event()

            async def ticker() -> None:
                nonlocal ticks
                while not done.is_set():
                    ticks += 1
                    await asyncio.sleep(0.005)

            async def one() -> None:
                lease = await e.lease_async(P, M, K, 10, wait_s=5)
                async with lease:
                    await asyncio.sleep(0.05)

            t = asyncio.create_task(ticker())
            await asyncio.gather(*(one() for _ in range(10)))
            done.set()
            await t
            return ticks, e.usage(P, M, K)["rpd"]["used"]

        ticks, used = asyncio.run(main())
        assert used == 10  # all ten, two at a time
        assert ticks > 20


def test_cancelling_an_async_wait_leases_nothing(store: str) -> None:
    env = {"MAX_CONCURRENT_REQUESTS_PER_KEY": "1"}
    with q.QuotaEngine(store, env=env) as e:
        held = e.lease(P, M, K)

        async def main() -> None:
            task = asyncio.create_task(e.lease_async(P, M, K, wait_s=10))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        assert e.usage(P, M, K)["in_flight"] == 1  # only the held one
        held.release()
        e.lease(P, M, K, wait_s=1).release()  # the queue is empty again: no ghost ahead


def test_async_bad_input_is_raised_before_waiting(e: q.QuotaEngine) -> None:
    async def main() -> None:
        with pytest.raises(ValueError):
            await e.lease_any_async([], wait_s=1)
        with pytest.raises(ValueError):
            await e.lease_async(P, M, K, wait_s=-1)
        with pytest.raises(ValueError):
            await e.lease_any_async([(P, M, K)], strategy="nope")

    asyncio.run(main())


def test_an_async_wait_is_woken_by_a_lease_ending_not_by_its_timer(store: str) -> None:
    """The stepper behind the async forms: after a refused step, the callback it was given
    runs as soon as a lease of this engine ends (in the thread that ended it), so the
    event loop's nap ends then rather than at its 50 ms timer."""
    with q.QuotaEngine(store, env={"MAX_CONCURRENT_REQUESTS_PER_KEY": "1"}) as e:
        held = e.lease(P, M, K)
        waiter = e._lease_waiter(P, M, K, wait_s=5)
        lease, nap = waiter.step()
        assert lease is None and 0 < nap <= 0.05
        lease, nap = waiter.step()  # queued now; the next bump is the one to wait for
        woken: list[int] = []
        waiter.on_wake(lambda: woken.append(threading.get_ident()))
        assert woken == []
        other = threading.Thread(target=held.release)
        other.start()
        other.join()
        assert woken == [other.ident]
        lease, _ = waiter.step()
        assert lease is not None
        lease.release()
        waiter.close()


# ------------------------------------------- waiting is for capacity, not per key (SPEC 24.5)

WAIT_LONG = 600  # beyond a minute window's retry by a ManualClock: these waits never end in vain


@pytest.fixture
def manual() -> q.ManualClock:
    return q.ManualClock(NOW)


def full(e: q.QuotaEngine, model: str, key: int = K) -> None:
    """Declares one request a minute on ``model`` and spends it (the clock stays put)."""
    e.set_model_limits(P, model, rpm=1)
    e.record_request(P, model, key)


@pytest.mark.parametrize(("waiting_priority", "free_priority"), [(0, 0), (0, 1)])
def test_a_free_model_is_never_held_behind_a_full_one_of_the_same_key(
    store: str, manual: q.ManualClock, waiting_priority: int, free_priority: int
) -> None:
    """A waiter on a full model of a key, earlier (or more important), does not hold a
    later waiter on a free model of the same key: that one is admitted while it waits."""
    with q.QuotaEngine(store, clock=manual, env={}) as e:
        full(e, "full")
        waiting = e._lease_waiter(P, "full", K, wait_s=WAIT_LONG, priority=waiting_priority)
        assert admitted_while_it_waits(waiting, lambda: e.lease(P, "free", K, wait_s=30, priority=free_priority))


def test_lease_any_with_a_free_candidate_on_another_key_is_not_held(store: str, manual: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=manual, env={}) as e:
        full(e, M, key=1)
        waiting = e._lease_waiter(P, M, 1, wait_s=WAIT_LONG)
        assert admitted_while_it_waits(waiting, lambda: e.lease_any([(P, M, 1), (P, M, 2)], wait_s=30))


def test_lease_async_on_a_free_model_is_not_held(store: str, manual: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=manual, env={}) as e:
        full(e, "full")

        def free() -> q.Lease:
            return asyncio.run(e.lease_async(P, "free", K, wait_s=30))

        assert admitted_while_it_waits(e._lease_waiter(P, "full", K, wait_s=WAIT_LONG), free)


def test_the_stepper_of_a_later_waiter_on_a_free_model_is_admitted_at_its_first_step(
    store: str, manual: q.ManualClock
) -> None:
    """The same, step by step: the queue holds a candidate only behind a waiter for a
    capacity it draws on; a candidate of the same call that draws on none is tried."""
    with q.QuotaEngine(store, clock=manual, env={}) as e:
        full(e, "full")
        first = e._lease_waiter(P, "full", K, wait_s=WAIT_LONG)
        assert first.step()[0] is None  # refused: it waits for the full model's minute
        later = e._lease_any_waiter([(P, "full", K), (P, "free", K)], wait_s=WAIT_LONG, strategy="order")
        lease, _ = later.step()
        assert lease is not None and lease.model_id == "free"  # not the full one, though listed first
        lease.release()
        # A later waiter on the full model alone waits behind the first, even once it frees.
        third = e._lease_waiter(P, "full", K, wait_s=WAIT_LONG)
        assert third.step()[0] is None
        manual.advance(60_000)
        assert third.step()[0] is None  # the first comes first
        got, _ = first.step()
        assert got is not None
        got.success()
        manual.advance(60_000)
        got, _ = third.step()
        assert got is not None
        got.release()
        for w in (first, later, third):
            w.close()


ORG_KEYS = (1, 2)


def org(e: q.QuotaEngine) -> None:
    for k in ORG_KEYS:
        e.register_key(k, P, account="org")


@pytest.mark.parametrize("priorities", [(1, 0), (0, 0)], ids=["priority", "first-come"])
def test_two_keys_of_one_account_wait_in_one_line_for_an_account_limit(
    store: str, manual: q.ManualClock, priorities: tuple[int, int]
) -> None:
    """Waiters on two keys of one account, for the same account-scope window (spent by
    another engine on the store), are admitted in the order of 17.2 and 22.1, every time:
    a smaller priority number first, else the earlier."""
    with q.QuotaEngine(store, clock=manual, env={}) as e, q.QuotaEngine(store, clock=manual, env={}) as other:
        org(e)
        expected = [1, 0] if priorities == (1, 0) else [0, 1]
        for trial in range(20):
            model = f"m{trial}"
            e.set_model_limits(P, model, limits=[q.Limit("requests", 1, "minute")])
            other.record_request(P, model, ORG_KEYS[0])
            order = admitted_one_at_a_time(
                lambda i, model=model: e.lease(P, model, ORG_KEYS[i], wait_s=WAIT_LONG, priority=priorities[i]),
                2,
                lambda: manual.advance(60_000),
            )
            assert order == expected, f"trial {trial}"


def test_tenant_limits_are_capacities(store: str, manual: q.ManualClock) -> None:
    """A waiter for a tenant's limit holds only the waiters drawing on it: a later call on
    the same route for another tenant is admitted at once; a more important one for the
    same tenant on another key comes first."""
    with q.QuotaEngine(store, clock=manual, env={}) as e:
        e.set_tenant_limits("u", [q.Limit("requests", 1, "minute")])
        e.record_request(P, M, K, tenant="u")
        waiting = e._lease_waiter(P, M, K, wait_s=WAIT_LONG, tenant="u")
        assert admitted_while_it_waits(waiting, lambda: e.lease(P, M, K, wait_s=30, tenant="v"))
        for trial in range(10):
            manual.advance(60_000)
            e.record_request(P, M, K, tenant="u")
            order_u = admitted_one_at_a_time(
                lambda i: e.lease(P, f"m{i}", 1 + i, wait_s=WAIT_LONG, priority=1 - i, tenant=["w", "u"]),
                2,
                lambda: manual.advance(60_000),
            )
            assert order_u == [1, 0], f"trial {trial}"


def test_platform_limits_are_capacities(store: str, manual: q.ManualClock) -> None:
    """Waiters on two models of two keys of one account, for the platform's account-wide
    limit, wait in one line."""
    with q.QuotaEngine(store, clock=manual, env={}) as e:
        org(e)
        e.set_platform_limits(P, [q.Limit("requests", 1, "minute")])
        for trial in range(10):
            manual.advance(60_000)
            e.record_request(P, "x", ORG_KEYS[0])
            order = admitted_one_at_a_time(
                lambda i: e.lease(P, f"m{i}", ORG_KEYS[i], wait_s=WAIT_LONG, priority=1 - i),
                2,
                lambda: manual.advance(60_000),
            )
            assert order == [1, 0], f"trial {trial}"


def test_a_call_that_does_not_wait_never_queues_and_takes_what_is_free(store: str, manual: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=manual, env={}) as e:
        e.set_model_limits(P, M, rpm=2)
        e.record_request(P, M, K)
        waiter = e._lease_waiter(P, "other", K, wait_s=WAIT_LONG)
        e.set_model_limits(P, "other", rpm=1)
        e.record_request(P, "other", K)
        assert waiter.step()[0] is None
        e.lease(P, M, K).release()  # wait_s=0 on another model of the key: at once
        waiter.close()
