"""SPEC 23.3: platform limits. `set_platform_limits` / `platform_limits` (replaces; empty
forgets; persisted and shared through the file and Redis); limits that hold across every
model of a platform, scope "account" over every key of the key's account, "key" over the
key alone; reasons "platform:<metric>/<per>"; the gates run after section 8's caps and
before key concurrency, inside the one atomic admission; `usage()` and `forecast()` report
them under their reasons."""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

import pytest
import quotaengine as q
from moments import HOUR, MINUTE, SECOND, TEN_AM
from subprocesses import race

P, K = "groq", 1
M1, M2, M3 = "llama", "mixtral", "gemma"


def refusal(call: Any) -> q.QuotaExceeded:
    with pytest.raises(q.QuotaExceeded) as exc:
        call()
    return exc.value


# ================================================================ declaring them


def test_set_get_replace_and_forget(e: q.QuotaEngine) -> None:
    assert e.platform_limits(P) == []
    e.set_platform_limits(
        P,
        [
            q.Limit("tokens", 1000, "1h"),
            q.Limit("requests", 20, "minute"),
            q.Limit("requests", 5, "minute", "key"),
            q.Limit("requests", 900, "day"),
        ],
    )
    # in gate order: metric, then window, then scope (key before account)
    assert e.platform_limits(P) == [
        q.Limit("requests", 5, "minute", "key"),
        q.Limit("requests", 20, "minute"),
        q.Limit("requests", 900, "day"),
        q.Limit("tokens", 1000, "1h"),
    ]
    assert e.platform_limits("other") == []
    e.set_platform_limits(P, (q.Limit("output_tokens", 7, "month"),))  # replaces the whole declaration
    assert e.platform_limits(P) == [q.Limit("output_tokens", 7, "month")]
    e.set_platform_limits(P, [])  # empty forgets
    assert e.platform_limits(P) == []
    e.set_model_limits(P, M1, rpm=1)
    assert e.model_limit_list(P, M1) == [q.Limit("requests", 1, "minute")]  # model limits untouched


def test_bad_input_is_refused_and_writes_nothing(e: q.QuotaEngine) -> None:
    keep = [q.Limit("requests", 3, "minute")]
    e.set_platform_limits(P, keep)
    with pytest.raises(ValueError, match="declare each window once"):
        e.set_platform_limits(P, [q.Limit("requests", 1, "minute"), q.Limit("requests", 2, "60s")])
    with pytest.raises(TypeError, match="Limit"):
        e.set_platform_limits(P, [q.Limit("requests", 1, "minute"), "requests/minute=2"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="Limit"):
        e.set_platform_limits(P, q.Limit("requests", 1, "minute"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Limit"):
        e.set_platform_limits(P, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Limit"):
        e.set_platform_limits(P, {"rpm": 5})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="platform"):
        e.set_platform_limits("", keep)
    with pytest.raises(TypeError):
        e.set_platform_limits(7, keep)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="platform"):
        e.platform_limits("")
    assert e.platform_limits(P) == keep  # nothing was written
    # the same window at key and account scope is no duplicate
    e.set_platform_limits(P, [q.Limit("requests", 1, "minute", "key"), q.Limit("requests", 2, "minute")])
    assert len(e.platform_limits(P)) == 2


def test_declarations_persist_and_are_shared_at_the_next_call(store: str, clock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=clock, env={}) as a, q.QuotaEngine(store, clock=clock, env={}) as b:
        assert b.lease(P, M1, K).release() is None  # b is open and has read everything
        a.set_platform_limits(P, [q.Limit("requests", 1, "minute")])
        assert b.platform_limits(P) == [q.Limit("requests", 1, "minute")]
        a.record_request(P, M1, K)
        assert refusal(lambda: b.lease(P, M2, K)).reason == "platform:requests/minute"
        a.set_platform_limits(P, [])
        assert b.platform_limits(P) == []
        assert b.lease(P, M2, K).release() is None
        a.set_platform_limits(P, [q.Limit("tokens", 50, "day", "key")])
    with q.QuotaEngine(store, clock=clock, env={}) as c:  # and it outlives both
        assert c.platform_limits(P) == [q.Limit("tokens", 50, "day", "key")]


@pytest.mark.sqlite_only
def test_the_file_keeps_them_in_a_table_of_their_own(store: str, clock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        e.set_platform_limits(P, [q.Limit("requests", 20, "minute"), q.Limit("tokens", 9, "month", "key")])
    with sqlite3.connect(store) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == 13
        rows = con.execute("SELECT platform, limits FROM platform_limits").fetchall()
    assert rows == [(P, "requests/minute=20 tokens/month:key=9")]


# ================================================================ what they count


def test_a_request_limit_counts_every_model_of_the_key(e: q.QuotaEngine, clock: q.ManualClock) -> None:
    e.set_platform_limits(P, [q.Limit("requests", 3, "minute")])
    e.record_request(P, M1, K)
    first = clock.now_ms()
    clock.advance(5 * SECOND)
    e.record_request(P, M2, K)
    held = e.lease(P, M3, K)  # the third request of the minute, on a third model
    exc = refusal(lambda: e.lease(P, M1, K))
    assert exc.reason == "platform:requests/minute"
    # the oldest recorded request leaves the minute first
    assert exc.retry_at_ms == first + MINUTE
    adm = e.check(P, M2, K)
    assert (adm.allowed, adm.reason, adm.retry_at_ms) == (False, "platform:requests/minute", first + MINUTE)
    held.release()  # a live lease counted; released, it no longer does
    e.lease(P, M1, K).release()
    # another key is another account: it has its own count
    assert e.lease(P, M1, 2).release() is None
    # another platform is not limited
    for _ in range(5):
        e.lease("cerebras", M1, K).release()
    clock.set(first + MINUTE)
    assert e.check(P, M1, K).allowed


def test_account_scope_counts_every_key_of_the_account_key_scope_the_key_alone(e: q.QuotaEngine) -> None:
    e.register_key(1, P, account="org")
    e.register_key(2, P, account="org")
    e.register_key(3, P)
    e.set_platform_limits(P, [q.Limit("requests", 3, "minute"), q.Limit("requests", 2, "minute", "key")])
    assert [lim.scope for lim in e.platform_limits(P)] == ["key", "account"]
    e.record_request(P, M1, 1)
    e.record_request(P, M2, 2)
    lease = e.lease(P, M3, 2)  # key 2: its second request; the account's third
    # key 1 has used 1 of its 2, but the account has used 3 of 3
    assert refusal(lambda: e.lease(P, M2, 1)).reason == "platform:requests/minute"
    lease.release()
    e.lease(P, M2, 1).release()  # the account's third again
    # key 2 has used its two: the key-scope limit refuses first (it runs before the account's)
    e.set_platform_limits(P, [q.Limit("requests", 10, "minute"), q.Limit("requests", 2, "minute", "key")])
    e.record_request(P, M2, 2)
    assert refusal(lambda: e.lease(P, M1, 2)).reason == "platform:requests/minute:key"
    assert e.check(P, M1, 1).allowed
    # a key of its own is its own account
    e.set_platform_limits(P, [q.Limit("requests", 1, "minute")])
    e.record_request(P, M1, 3)
    assert refusal(lambda: e.lease(P, M2, 3)).reason == "platform:requests/minute"
    # scope key alone on a shared account: the other key's requests do not count
    e.set_platform_limits(P, [q.Limit("requests", 2, "minute", "key")])
    assert e.check(P, M3, 1).allowed  # key 1: 1 recorded of 2 (a released lease records nothing)
    assert not e.check(P, M3, 2).allowed  # key 2: 2 recorded
    assert e.check(P, M3, 2).reason == "platform:requests/minute"  # no account twin: no ":key"


def test_a_token_limit_counts_the_estimates_in_flight(e: q.QuotaEngine, clock: q.ManualClock) -> None:
    e.set_platform_limits(P, [q.Limit("tokens", 100, "minute")])
    e.record_tokens(P, M1, K, 30)
    held = e.lease(P, M2, K, estimated_tokens=40)
    exc = refusal(lambda: e.lease(P, M3, K, estimated_tokens=31))
    assert exc.reason == "platform:tokens/minute"
    # the recorded 30 leave at the end of their minute, and 31 then fit beside the 40
    assert exc.retry_at_ms == clock.now_ms() + MINUTE
    e.lease(P, M3, K, estimated_tokens=30).release()  # exactly the limit
    held.success(tokens=70)
    assert refusal(lambda: e.lease(P, M1, K, estimated_tokens=1)).reason == "platform:tokens/minute"
    # input and output tokens are metrics of their own
    e.set_platform_limits(P, [q.Limit("output_tokens", 10, "minute"), q.Limit("input_tokens", 500, "minute")])
    held = e.lease(P, M1, K, estimated_tokens=20, estimated_output_tokens=8)
    exc = refusal(lambda: e.lease(P, M2, K, estimated_tokens=5, estimated_output_tokens=3))
    assert exc.reason == "platform:output_tokens/minute"
    held.release()


def test_calendar_windows_follow_the_platform_calendar(e: q.QuotaEngine, clock: q.ManualClock) -> None:
    e.set_platform_calendar(P, "America/Los_Angeles")
    e.set_platform_limits(P, [q.Limit("requests", 2, "day")])
    e.record_request(P, M1, K)
    e.record_request(P, M2, K)
    exc = refusal(lambda: e.lease(P, M3, K))
    assert exc.reason == "platform:requests/day"
    assert exc.retry_at_ms == e.next_day_start_ms(P)
    e.set_platform_limits(P, [q.Limit("requests", 2, "5h")])  # a sliding width
    assert refusal(lambda: e.lease(P, M3, K)).reason == "platform:requests/5h"


def test_a_month_limit_keeps_every_models_rows_past_the_retention(store: str) -> None:
    clock = q.ManualClock(TEN_AM)
    with q.QuotaEngine(store, clock=clock, env={}, retention_ms=HOUR) as e:
        e.set_platform_limits(P, [q.Limit("requests", 100, "month")])
        for model in (M1, M2):
            e.record_request(P, model, K)  # 10:00
        e.record_request("cerebras", M1, K)  # another platform's: retention_ms applies
        clock.advance(3 * HOUR)
        e.record_request(P, M3, K)  # 13:00: a sweep
        clock.advance(2 * MINUTE)
        e.record_request(P, M3, K)  # and another
        assert e.usage_events(since_ms=0, platform="cerebras") == []
        assert len(e.usage_events(since_ms=0, platform=P)) == 4
    with q.QuotaEngine(store, clock=clock, env={}, retention_ms=HOUR) as f:  # counted from the store
        assert f.usage(P, M1, K)["platform:requests/month"] == {"used": 4, "limit": 100}


def test_a_key_moved_to_another_account_counts_there_at_the_next_call(e: q.QuotaEngine) -> None:
    e.register_key(1, P, account="a")
    e.register_key(2, P, account="b")
    e.register_key(3, P, account="b")
    e.set_platform_limits(P, [q.Limit("requests", 2, "minute")])
    e.record_request(P, M1, 1)
    e.record_request(P, M2, 2)
    assert e.check(P, M3, 3).allowed  # account b: 1 of 2
    e.register_key(1, P, account="b")
    exc = refusal(lambda: e.lease(P, M3, 3))  # account b now holds key 1's request too
    assert exc.reason == "platform:requests/minute"


# ================================================================ gate order


def test_the_model_limits_and_provider_caps_refuse_first_key_concurrency_after(e: q.QuotaEngine) -> None:
    e.set_platform_limits(P, [q.Limit("requests", 1, "minute")])
    e.set_model_limits(P, M1, rpm=1)
    e.record_request(P, M1, K)
    # both full: the model's limit runs first
    assert refusal(lambda: e.lease(P, M1, K)).reason == "rpm"
    # on another model only the platform's is full
    assert refusal(lambda: e.lease(P, M2, K)).reason == "platform:requests/minute"
    # a provider cap full too: section 8's cap runs before the platform's
    e.set_provider_caps(P, minute_requests=1)
    assert refusal(lambda: e.lease(P, M2, K)).reason == "provider_minute_requests"
    assert e.check(P, M2, K).reason == "provider_minute_requests"
    e.reset_provider_caps(P)
    # key concurrency runs after the platform's limits
    e.set_key_concurrency_cap(P, K, 0)
    assert refusal(lambda: e.lease(P, M2, K)).reason == "platform:requests/minute"
    e.set_platform_limits(P, [])
    assert refusal(lambda: e.lease(P, M2, K)).reason == "key_concurrency"


def test_the_priority_reserve_applies_to_them(e: q.QuotaEngine) -> None:
    e.set_platform_limits(P, [q.Limit("requests", 10, "minute")])
    e.set_priority_reserve(1, 0.2)
    for _ in range(8):
        e.record_request(P, M1, K)
    assert refusal(lambda: e.lease(P, M2, K, priority=1)).reason == "platform:requests/minute"
    e.lease(P, M2, K, priority=0).release()  # priority 0 may take the reserved two


def test_lease_any_passes_over_a_candidate_the_platform_refuses(e: q.QuotaEngine) -> None:
    e.set_platform_limits(P, [q.Limit("requests", 1, "minute")])
    e.record_request(P, M1, K)
    lease = e.lease_any([(P, M2, K), ("cerebras", M2, K)])
    assert (lease.platform, lease.model_id) == ("cerebras", M2)
    lease.release()
    exc = refusal(lambda: e.lease_any([(P, M2, K), (P, M3, K)]))
    assert exc.reason == "platform:requests/minute"
    assert [r.reason for r in exc.refusals] == ["platform:requests/minute"] * 2


# ================================================================ reports


def test_usage_and_forecast_report_them_under_their_reasons(e: q.QuotaEngine, clock: q.ManualClock) -> None:
    e.register_key(1, P, account="org")
    e.register_key(2, P, account="org")
    e.set_platform_limits(
        P,
        [
            q.Limit("requests", 100, "minute"),
            q.Limit("requests", 40, "day", "key"),
            q.Limit("requests", 60, "day"),
            q.Limit("tokens", 1000, "2h"),
        ],
    )
    for _ in range(3):
        e.record_request(P, M1, 1)
    e.record_request(P, M2, 2)
    e.record_tokens(P, M2, 1, 100)
    lease = e.lease(P, M3, 1, estimated_tokens=50)
    u = e.usage(P, M1, 1)
    assert u["platform:requests/minute"] == {"used": 4, "limit": 100}  # the account, every model
    assert u["platform:requests/day:key"] == {"used": 3, "limit": 40}  # key 1, every model
    assert u["platform:requests/day"] == {"used": 4, "limit": 60}
    assert u["platform:tokens/2h"] == {"used": 100, "limit": 1000}
    assert u["rpm"] == {"used": 3, "limit": None}  # the model's own windows are as before
    assert u["in_flight"] == 0  # the route's own leases
    f = e.forecast(P, M1, 1, lookback_ms=10 * MINUTE)
    # the minute is shorter than an hour: not forecast
    assert "platform:requests/minute" not in f
    now = clock.now_ms()
    # key 1: 3 recorded + 1 in flight of 40, at 3 per 10 minutes: 36 left take 120 minutes
    assert f["platform:requests/day:key"] == now + 36 * 10 * MINUTE // 3
    # the account: 4 + 1 of 60 at 4 per 10 minutes
    assert f["platform:requests/day"] == now + 55 * 10 * MINUTE // 4
    # 100 recorded + 50 in flight of 1000 at 100 per 10 minutes: 85 minutes, within the 2 h
    assert f["platform:tokens/2h"] == now + 850 * 10 * MINUTE // 100
    lease.release()
    clock.advance(HOUR)
    assert e.usage(P, M2, 2)["platform:requests/minute"] == {"used": 0, "limit": 100}


# ================================================================ exactness under races


def test_sixteen_threads_over_three_models_admit_exactly_the_limit(e: q.QuotaEngine) -> None:
    e.set_platform_limits(P, [q.Limit("requests", 40, "minute")])
    barrier = threading.Barrier(16)
    admitted: list[list[q.Lease]] = [[] for _ in range(16)]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        model = (M1, M2, M3)[i % 3]
        try:
            barrier.wait()
            while True:
                try:
                    admitted[i].append(e.lease(P, model, K))
                except q.QuotaExceeded as exc:
                    assert exc.reason == "platform:requests/minute"
                    return
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert sum(len(a) for a in admitted) == 40
    assert sum(e.usage(P, m, K)["in_flight"] for m in (M1, M2, M3)) == 40


RACE = """
import sys, threading
import quotaengine as q
store, now = sys.argv[1], int(sys.argv[2])
e = q.QuotaEngine(store, clock=q.ManualClock(now), env={})
e.platform_limits("groq")
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"
lock = threading.Lock()
counts = {"admitted": 0}
errors = []
def worker(i):
    model = ("llama", "mixtral", "gemma")[i % 3]
    key = 1 + i % 2
    try:
        while True:
            try:
                lease = e.lease("groq", model, key)
            except q.QuotaExceeded as exc:
                if exc.reason != "platform:requests/minute":
                    errors.append(exc.reason)
                return
            lease.success()
            with lock:
                counts["admitted"] += 1
    except BaseException as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(counts["admitted"], "errors", len(errors), *errors, flush=True)
e.close()
"""


def test_four_processes_on_one_store_admit_exactly_the_account_limit(store: str) -> None:
    with q.QuotaEngine(store, clock=q.ManualClock(TEN_AM), env={}) as e:
        e.register_key(1, P, account="org")
        e.register_key(2, P, account="org")
        e.set_platform_limits(P, [q.Limit("requests", 60, "minute")])
    total = 0
    for out in race(RACE, [[store, str(TEN_AM)]] * 4):
        assert out[1:3] == ["errors", "0"], out
        total += int(out[0])
    assert total == 60
    with q.QuotaEngine(store, clock=q.ManualClock(TEN_AM), env={}) as e:
        assert e.usage(P, M1, 1)["platform:requests/minute"] == {"used": 60, "limit": 60}
