"""SPEC 18 (hardening): no panic crosses the boundary (18.1), a probe pass inside a probe pass
(18.3), live leases at ``close()`` and when dropped (18.5), names (18.6).

The panic cases run in a child process (a crash there cannot take pytest down): the child
reports each call's exception type and whether its engine still works afterwards."""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest
import quotaengine as q
from moments import MINUTE

P, M, K = "groq", "llama", 1


def run_child(body: str, store: str, timeout: float = 120.0) -> dict[str, Any]:
    """Runs `body` in a fresh interpreter with `e` an engine on `store` (a ManualClock) and
    `outcome(name, call)` recording the type of what `call()` raised ("ok" when nothing);
    returns the recorded outcomes and the engine's usage at the end as JSON."""
    script = (
        textwrap.dedent(
            """
        import asyncio, json, sys
        import quotaengine as q
        P, M, K = "groq", "llama", 1
        clock = q.ManualClock(1_767_261_600_000)
        e = q.QuotaEngine(sys.argv[1], clock=clock, env={})
        out = {}
        def outcome(name, call):
            try:
                r = call()
                if asyncio.iscoroutine(r):
                    r = asyncio.run(r)
                if isinstance(r, q.Lease):
                    r.release()
                out[name] = "ok"
            except BaseException as exc:
                out[name] = type(exc).__module__ + "." + type(exc).__name__
            # The engine keeps working after every call.
            with e.lease(P, M, 99):
                pass
        """
        )
        + textwrap.dedent(body)
        + textwrap.dedent(
            """
        out["_rpd_after"] = e.usage(P, M, 99)["rpd"]["used"]
        e.close()
        print(json.dumps(out))
        """
        )
    )
    done = subprocess.run(
        [sys.executable, "-c", script, store], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# ---------------------------------------------------------------------------- 18.1 no panic crosses the boundary


def test_odd_limit_periods_are_value_or_overflow_errors(store: str) -> None:
    out = run_child(
        """
        for per in ["5é", "é", "éééé", "1ｓ", "٣s"]:
            outcome("non-ascii " + per, lambda per=per: q.Limit("requests", 1, per))
        # Beyond 2**63 - 1 ms: an OverflowError; within it but past 31 d: a ValueError.
        for per in ["99999999999999999999s", "9223372036854775807s", "106751991168d"]:
            outcome("overflow " + per, lambda per=per: q.Limit("requests", 1, per))
        outcome("too wide 9223372036854775s", lambda: q.Limit("requests", 1, "9223372036854775s"))
        outcome("widest 31d", lambda: e.set_model_limits(P, "other", limits=[q.Limit("requests", 5, "31d")]))
        """,
        store,
    )
    for name, kind in out.items():
        if name.startswith("non-ascii") or name.startswith("too wide"):
            assert kind == "builtins.ValueError", (name, kind)
        elif name.startswith("overflow"):
            assert kind == "builtins.OverflowError", (name, kind)
    assert out["widest 31d"] == "ok"
    assert out["_rpd_after"] == len(out) - 1  # every call was followed by a working lease


def test_waits_and_probe_intervals_beyond_10_to_the_12_seconds_are_overflow_errors(store: str) -> None:
    out = run_child(
        """
        calls = {
            "lease": lambda w: e.lease(P, M, 2, wait_s=w),
            "lease_any": lambda w: e.lease_any([(P, M, 3)], wait_s=w),
            "lease_async": lambda w: e.lease_async(P, M, 4, wait_s=w),
            "lease_any_async": lambda w: e.lease_any_async([(P, M, 5)], wait_s=w),
            "start_probe": lambda w: (e.start_probe(lambda k: True, interval_s=w), e.stop_probe()),
        }
        for name, call in calls.items():
            for w in [1e19, 1e300, 2.0**64, 1e12 + 1, 10**13, 10**30]:
                outcome(f"{name} {w!r}", lambda call=call, w=w: call(w))
            # Up to the bound a value is accepted (capacity is free: no wait happens).
            for w in [1e12, 10**12, 0.5]:
                outcome(f"{name} ok {w!r}", lambda call=call, w=w: call(w))
        """,
        store,
    )
    for name, kind in out.items():
        if name.startswith("_"):
            continue
        assert kind == ("ok" if " ok " in name else "builtins.OverflowError"), (name, kind)


def test_millisecond_counts_up_to_2_63_are_accepted_and_beyond_are_overflow_errors(store: str) -> None:
    out = run_child(
        """
        big = 2**63 - 1
        for name in ["busy_timeout_ms", "flush_interval_ms", "retention_ms", "lease_max_age_ms",
                     "window_usage_ttl_ms"]:
            for v in [2**31 - 1, 2**31, big, 2**63]:
                def use(name=name, v=v):
                    other = q.QuotaEngine(sys.argv[1], clock=clock, env={}, **{name: v})
                    try:
                        other.record_request(P, M, 7)
                        with other.lease(P, M, 7):
                            pass
                        assert other.usage(P, M, 7)["rpd"]["used"] >= 2
                    finally:
                        other.close()
                outcome(f"{name}={v}", use)
        outcome("set_cooldown max", lambda: e.set_cooldown(P, M, 8, duration_ms=big))
        outcome("set_cooldown beyond", lambda: e.set_cooldown(P, M, 8, duration_ms=big + 1))
        outcome("decision max", lambda: e.cooldown_decision_for_limit(P, M, 8, retry_after_ms=big))
        outcome("failure retry_after huge", lambda: e.record_failure(P, M, 8, status=429, retry_after=1e300))
        outcome("advance max", lambda: clock.advance(big))
        outcome("usage at the end of time", lambda: e.usage(P, M, 8))
        clock.set(1_767_261_600_000)
        """,
        store,
    )
    for name, kind in out.items():
        if name.startswith("_"):
            continue
        expected = "builtins.OverflowError" if name.endswith("=9223372036854775808") or "beyond" in name else "ok"
        assert kind == expected, (name, kind)


def test_a_busy_timeout_beyond_sqlite_int_is_clamped(store: str) -> None:
    """`busy_timeout_ms=2**31` used to fail with "internal error: too big"; it is clamped to
    2**31 - 1 ms (SPEC 18.1), and the engine works."""
    for v in (2**31, 2**63 - 1):
        with q.QuotaEngine(store, env={}, busy_timeout_ms=v) as e:
            e.record_request(P, M, K)
            assert e.usage(P, M, K)["rpd"]["used"] >= 1


def test_a_panic_in_a_wait_step_and_in_the_probe_thread_is_quotaengine_error(store: str, clock: q.ManualClock) -> None:
    """The async stepper and the probe thread take several steps on the engine; a panic in any
    of them surfaces as QuotaEngineError (the stepper) or is survived (the thread)."""
    e = q.QuotaEngine(store, clock=clock, env={})
    try:
        e.set_model_limits(P, M, rpm=1)
        e.record_request(P, M, K)
        waiter = e._lease_waiter(P, M, K, wait_s=120.0)
        lease, nap = waiter.step()
        assert lease is None and nap > 0
        e._inject_panics(1)
        with pytest.raises(q.QuotaEngineError, match="injected panic"):
            waiter.step()
        assert e.check(P, M, 2).allowed  # still working

        async def waits() -> q.Lease:
            return await e.lease_async(P, M, K, wait_s=120.0)

        async def main() -> None:
            task = asyncio.ensure_future(waits())
            await asyncio.sleep(0.05)  # a first step was refused: it naps
            e._inject_panics(1)
            clock.advance(MINUTE)  # the window opens: the next step panics
            with pytest.raises(q.QuotaEngineError, match="injected panic"):
                await task

        asyncio.run(main())
        assert e.lease(P, M, K).release() is None  # and the engine admits

        # The probe thread: its first pass panics, a later one probes.
        e.set_cooldown(P, M, 5, 24 * 60 * MINUTE, "heuristic")
        clock.advance(12 * 60 * MINUTE)
        probed = threading.Event()
        assert e.start_probe(lambda k: probed.set() or True, interval_s=0.01)
        e._inject_panics(2)
        for _ in range(500):
            if probed.wait(0.01):
                break
            clock.advance(46_000)  # past the first sighting's jitter
        assert probed.is_set()
        e.stop_probe()
    finally:
        e.close()


# ---------------------------------------------------------------------------- 18.5 live leases at close()


def test_close_ends_every_live_lease_as_leaving_its_with_block(store: str, clock: q.ManualClock) -> None:
    """Two engines on one store: the leases A holds when it closes are recorded with their
    estimates and stop counting in B at once; ending one afterwards is EngineClosed."""
    a = q.QuotaEngine(store, clock=clock, env={})
    b = q.QuotaEngine(store, clock=clock, env={})
    try:
        b.set_model_limits(P, M, rpm=3)
        leases = [a.lease(P, M, K, 10), a.lease(P, M, K, 20), a.lease_any([(P, M, K)], 30)]
        raw = a.acquire_lease(P, M, 2, 5)  # an id without a Lease: the caller's to release
        ended = a.lease(P, M, 3, 7)
        ended.success(tokens=1)
        assert b.usage(P, M, K)["in_flight"] == 3
        assert not b.check(P, M, K).allowed  # rpm=3: the three leases fill it
        a.close()
        u = b.usage(P, M, K)
        assert u["in_flight"] == 0
        assert (u["rpm"]["used"], u["tpm"]["used"]) == (3, 60)  # the estimates, recorded
        assert b.usage(P, M, 2)["in_flight"] == 1 and b.usage(P, M, 2)["tpm"]["used"] == 0
        assert b.usage(P, M, 3)["tpm"]["used"] == 1  # an ended lease is not recorded again
        assert not b.check(P, M, K).allowed  # the requests count now, as usage
        clock.advance(MINUTE)
        assert b.lease(P, M, K).release() is None
        for lease in leases:
            with pytest.raises(q.EngineClosed):
                lease.success()
            with pytest.raises(q.EngineClosed):
                lease.failure(status=500)
            with pytest.raises(q.EngineClosed):
                lease.observe({"usage": {"prompt_tokens": 1, "completion_tokens": 1}})
        with pytest.raises(q.EngineClosed):
            a.release_lease(raw)
        assert b.usage(P, M, K)["rpd"]["used"] == 3  # nothing more was recorded
    finally:
        a.close()
        b.close()


def test_a_restarted_worker_is_not_blocked_by_the_closed_one_under_a_concurrency_cap(
    store: str, clock: q.ManualClock
) -> None:
    env = {"MAX_CONCURRENT_REQUESTS_PER_KEY_GROQ": "1"}
    old = q.QuotaEngine(store, clock=clock, env=env)
    held = old.lease(P, M, K)
    with q.QuotaEngine(store, clock=clock, env=env) as other:
        assert other.check(P, M, K).reason == "key_concurrency"
    old.close()  # the worker restarts
    with q.QuotaEngine(store, clock=clock, env=env) as new:
        with new.lease(P, M, K):
            pass
    with pytest.raises(q.EngineClosed):
        held.success()


def test_a_garbage_collected_live_lease_keeps_counting_until_its_max_age(store: str, clock: q.ManualClock) -> None:
    """Its call may still run: it counts (in every engine, and after its engine closes) until
    `lease_max_age_ms`, as a crashed process's lease does."""
    a = q.QuotaEngine(store, clock=clock, env={}, lease_max_age_ms=2 * MINUTE)
    b = q.QuotaEngine(store, clock=clock, env={})
    try:
        lease = a.lease(P, M, K, 10)
        kept = a.lease(P, M, 2, 10)
        del lease
        gc.collect()
        assert a.usage(P, M, K)["in_flight"] == 1
        assert b.usage(P, M, K)["in_flight"] == 1
        a.close()  # ends `kept`, not the dropped one
        assert b.usage(P, M, 2)["in_flight"] == 0
        assert kept is not None
        u = b.usage(P, M, K)
        assert (u["in_flight"], u["rpm"]["used"]) == (1, 0)
        clock.advance(2 * MINUTE + 1)
        assert b.usage(P, M, K)["in_flight"] == 0
        assert b.usage(P, M, K)["rpm"]["used"] == 0  # nothing recorded for it
    finally:
        a.close()
        b.close()


# ---------------------------------------------------------------------------- 18.3 a probe pass inside a probe pass


def test_a_validator_calling_run_probe_pass_gets_runtime_error_never_a_deadlock(store: str) -> None:
    """Sync in a pass of the caller's thread, sync in the background thread, and a coroutine
    on its loop's thread: each nested call raises RuntimeError at once (a deadlock here would
    hang the child until its timeout fails the test). Another engine's pass is no nesting."""
    out = run_child(
        """
        import threading
        DAY = 86_400_000
        seen = {}
        other = q.QuotaEngine(sys.argv[1], clock=clock, env={})

        def nested(tag, engine):
            try:
                engine.run_probe_pass(lambda k: True, jitter=lambda: 0.0)
                seen[tag] = "ok"
            except RuntimeError as exc:
                seen[tag] = "RuntimeError: " + str(exc)

        def bench():
            e.set_cooldown(P, M, 5, DAY, "heuristic")
            clock.advance(DAY // 2)
            e.run_probe_pass(lambda k: False, jitter=lambda: 0.0)  # first sighting

        def sync_validator(key):
            nested("sync", e)
            nested("other engine", other)
            return False
        bench()
        clock.advance(60_000)
        outcome("manual pass", lambda: e.run_probe_pass(sync_validator, jitter=lambda: 0.0))

        done = threading.Event()
        def thread_validator(key):
            nested("thread", e)
            done.set()
            return False
        clock.advance(16 * 60_000)  # past the failure's backoff
        e.start_probe(thread_validator, interval_s=0.01)
        outcome("thread probed", lambda: done.wait(30) or 1 / 0)
        e.stop_probe()

        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
        awaited = threading.Event()
        async def coroutine_validator(key):
            nested("coroutine", e)
            awaited.set()
            return False
        clock.advance(16 * 60_000)
        e.start_probe(coroutine_validator, interval_s=0.01, loop=loop)
        outcome("coroutine probed", lambda: awaited.wait(30) or 1 / 0)
        e.stop_probe()
        loop.call_soon_threadsafe(loop.stop)
        other.close()
        out["seen"] = seen
        """,
        store,
        timeout=90,
    )
    assert out["manual pass"] == out["thread probed"] == out["coroutine probed"] == "ok", out
    assert out["seen"] == {
        "sync": "RuntimeError: a probe pass is running",
        "other engine": "ok",
        "thread": "RuntimeError: a probe pass is running",
        "coroutine": "RuntimeError: a probe pass is running",
    }, out


# ---------------------------------------------------------------------------- 18.6 names


def test_platform_names_are_case_sensitive(engine: q.QuotaEngine) -> None:
    """Built-in calendars, caps and pools name lower-case platforms: "Google" is not "google"."""
    assert engine.platform_calendar("google") == "America/Los_Angeles"
    assert engine.platform_calendar("Google") == engine.platform_calendar("GOOGLE") == "UTC"
    assert engine.provider_caps("openrouter").daily_requests == 1000
    assert engine.provider_caps("OpenRouter").daily_requests is None
    assert engine.provider_caps("nvidia").minute_requests == 40
    assert engine.provider_caps("NVIDIA").minute_requests is None
    assert q.infer_quota_pool_key("google", "gemini") == "google::project"
    assert q.infer_quota_pool_key("Google", "gemini") == "Google::gemini"
    assert q.is_shared_pool("groq") and not q.is_shared_pool("Groq")
    # Usage of one spelling is not the other's.
    engine.set_model_limits("google", M, rpm=1)
    engine.record_request("google", M, K)
    assert not engine.check("google", M, K).allowed
    assert engine.check("Google", M, K).allowed


def test_an_explicit_account_beginning_with_key_is_a_value_error(engine: q.QuotaEngine) -> None:
    engine.register_key(1, P)
    for bad in ("key:1", "key:2", "key:", "key:acct"):
        with pytest.raises(ValueError, match="key:"):
            engine.register_key(2, P, account=bad)
    assert engine.key_account(P, 2) == "key:2"  # nothing changed
    engine.register_key(2, P, account="Key:1")  # another name (case-sensitive)
    assert engine.key_account(P, 2) == "Key:1"
    assert engine.key_account(P, 1) == "key:1"


def test_spread_reads_this_engines_own_history_only(store: str, clock: q.ManualClock) -> None:
    """Another engine's writes on the candidates (which make this engine's optimistic lease on
    Redis conflict and decide again) do not change which route this engine leased least
    recently: it alternates."""
    a = q.QuotaEngine(store, clock=clock, env={})
    b = q.QuotaEngine(store, clock=clock, env={})
    try:
        routes = [("x", M, 1), ("y", M, 2)]
        picks = []
        for _ in range(5):
            b.record_request("y", M, 2)
            b.record_request("x", M, 1)
            with a.lease_any(routes, strategy="spread") as lease:
                picks.append(lease.platform)
        assert picks == ["x", "y", "x", "y", "x"]
    finally:
        a.close()
        b.close()


# ---------------------------------------------------------------------------- SPEC 10 retention and the clock


def test_the_sweep_deletes_by_time_what_was_written_after_the_clock_stepped_back(
    store: str, clock: q.ManualClock
) -> None:
    """Rows written after a step back of the clock are older than rows written before it. On
    Redis they used to be kept until the retention passed the newest row written before
    the step back; the sweep deletes each row once it is older than `retention_ms`."""
    hour, t = 60 * MINUTE, clock.now_ms()
    with q.QuotaEngine(store, clock=clock, env={}, retention_ms=hour) as e:

        def minutes() -> list[int]:
            return sorted((r["created_at_ms"] - t) // MINUTE for r in e.usage_events())

        e.record_request(P, M, K)  # 10:00
        clock.advance(2 * MINUTE)
        e.record_request(P, M, K)  # 10:02, a sweep
        clock.set(t - 2 * hour)  # the clock steps back to 08:00
        e.record_request(P, M, K)
        clock.set(t - 2 * hour + 90 * MINUTE)  # 09:30: the retention keeps 08:30 on
        e.record_request(P, M, K)
        assert minutes() == [-30, 0, 2]
        clock.set(t + 3 * hour)  # 13:00
        e.record_request(P, M, K)
        clock.set(t + 3 * hour - 30_000)  # a step back of 30 s: the sweep runs again
        e.record_request(P, M, K)
        assert minutes() == [179, 180]
