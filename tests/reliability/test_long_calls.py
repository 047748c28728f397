"""SPEC 24.1: a live lease never expires under its caller. A live `Lease` object is renewed
by its engine (a background thread at least every lease_max_age_ms / 4 of real time, and
any call of that engine once the lease is half its max age old by the engine's clock), so
it counts in every engine sharing the store for as long as it lives and its holder lives;
the max age bounds only dead holders, dropped `Lease` objects and raw `acquire_lease` ids."""

from __future__ import annotations

import signal
import time

import pytest
import quotaengine as q
from subprocesses import spawn

P, M, K = "openai", "o3", 1
MAX_AGE = 120_000  # the default: the background thread renews every 30 s of real time


def in_flight(e: q.QuotaEngine) -> int:
    return int(e.usage(P, M, K)["in_flight"])


def test_a_live_lease_counts_far_past_its_max_age_in_another_engine(store: str, clock: q.ManualClock) -> None:
    with (
        q.QuotaEngine(store, clock=clock, env={}, lease_max_age_ms=MAX_AGE) as a,
        q.QuotaEngine(store, clock=clock, env={}, lease_max_age_ms=MAX_AGE) as b,
    ):
        a.set_key_concurrency_cap(P, K, 1)
        lease = a.lease(P, M, K, 1_000)  # a long reasoning call
        raw = a.acquire_lease(P, "raw", K)  # an id, never renewed
        for _ in range(5):
            clock.advance(MAX_AGE // 2)  # half the max age at a time: 2.5 max ages in all
            a.usage(P, "other", K)  # any call of the holder's engine renews what is due
            assert in_flight(b) == 1
            with pytest.raises(q.QuotaExceeded) as exc:
                b.lease(P, M, K)
            assert exc.value.reason == "key_concurrency"
        assert b.usage(P, "raw", K)["in_flight"] == 0  # the raw id expired long ago
        lease.success(tokens=900)
        assert in_flight(b) == 0
        assert b.usage(P, M, K)["tpm"]["used"] == 900
        a.release_lease(raw)


def test_a_jump_past_the_max_age_counts_again_at_the_holders_next_call(store: str, clock: q.ManualClock) -> None:
    with (
        q.QuotaEngine(store, clock=clock, env={}, lease_max_age_ms=MAX_AGE) as a,
        q.QuotaEngine(store, clock=clock, env={}, lease_max_age_ms=MAX_AGE) as b,
    ):
        lease = a.lease(P, M, K)
        clock.advance(10 * MAX_AGE)  # the holder was paused, or the clock jumped
        b.record_request(P, "other", K)  # b sweeps the expired row
        assert in_flight(b) == 0
        a.check(P, "other", K)  # the holder's next call: renewed, counted again from now
        assert in_flight(b) == 1
        lease.release()
        assert in_flight(b) == 0


def test_the_background_thread_renews_without_any_call(store: str, clock: q.ManualClock) -> None:
    # A max age of 400 ms: the holder's thread renews at least every 100 ms of real time.
    with (
        q.QuotaEngine(store, clock=clock, env={}, lease_max_age_ms=400) as a,
        q.QuotaEngine(store, clock=clock, env={}) as b,
    ):
        lease = a.lease(P, M, K)
        clock.advance(100 * 400)
        deadline = time.monotonic() + 5
        while in_flight(b) == 0:  # the thread renews it at the clock's new time
            assert time.monotonic() < deadline, "never renewed"
            time.sleep(0.02)
        clock.advance(300)
        time.sleep(0.3)
        assert in_flight(b) == 1
        lease.release()


def test_dropped_leases_and_raw_ids_are_not_renewed(store: str, clock: q.ManualClock) -> None:
    with (
        q.QuotaEngine(store, clock=clock, env={}, lease_max_age_ms=MAX_AGE) as a,
        q.QuotaEngine(store, clock=clock, env={}) as b,
    ):
        a.lease(P, M, K)  # its Lease object is dropped at once: it counts until its max age
        a.acquire_lease(P, M, K)
        assert in_flight(b) == 2
        clock.advance(MAX_AGE // 2 + 1)
        a.usage(P, M, K)  # would renew what is due: nothing of these
        clock.advance(MAX_AGE // 2)
        assert in_flight(b) == 0


HOLDER = """
import sys, time
import quotaengine as q
e = q.QuotaEngine(sys.argv[1], env={}, lease_max_age_ms=int(sys.argv[2]))
lease = e.lease("openai", "o3", 1)
print("ready", flush=True)
time.sleep(600)
"""


def test_a_killed_holders_lease_stops_counting_within_the_max_age(db_path: object) -> None:
    max_age = 600  # ms of real time
    with spawn(HOLDER, str(db_path), str(max_age)) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        with q.QuotaEngine(str(db_path), env={}) as e:
            # alive: it counts for many max ages of real time
            end = time.monotonic() + 4 * max_age / 1000
            while time.monotonic() < end:
                assert in_flight(e) == 1
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            killed = time.monotonic()
            while in_flight(e) == 1:
                assert time.monotonic() - killed < 2 * max_age / 1000 + 1, "a dead holder's lease still counts"
                time.sleep(0.05)
