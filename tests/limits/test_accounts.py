"""Accounts (SPEC §14.3): `register_key(..., account=)`, `key_account`, account-scope limits
and provider caps shared by the keys of one account, a key moved to another account counting
there at every engine's next call, and admission exact across processes. Both backends."""

from __future__ import annotations

import pytest
import quotaengine as q
from quotaengine import Limit
from subprocesses import race

NOW = 1_796_119_200_000  # 2026-12-01 10:00 UTC
P, M = "google", "gemini-2.5-flash"


def test_key_account(e: q.QuotaEngine) -> None:
    assert e.key_account(P, 7) == "key:7"  # never registered: its own
    e.register_key(7, P)
    assert e.key_account(P, 7) == "key:7"
    e.register_key(7, P, account="projects/router-prod")
    assert e.key_account(P, 7) == "projects/router-prod"
    assert e.key_account("groq", 7) == "key:7"  # the key is registered for google
    e.register_key(7, P)  # back to a key of its own
    assert e.key_account(P, 7) == "key:7"


@pytest.mark.parametrize(("account", "error"), [("", ValueError), (5, TypeError), (b"x", TypeError)])
def test_bad_accounts_change_nothing(e: q.QuotaEngine, account: object, error: type) -> None:
    e.register_key(1, P, account="proj-a")
    with pytest.raises(error):
        e.register_key(1, P, account=account)  # type: ignore[arg-type]
    assert e.key_account(P, 1) == "proj-a"


def test_keys_of_one_account_share_its_limits(e: q.QuotaEngine) -> None:
    e.register_key(1, P, account="proj-a")
    e.register_key(2, P, account="proj-a")
    e.register_key(3, P)  # a key of its own
    e.set_model_limits(P, M, rpm=2, limits=[Limit("requests", 5, "minute", "key"), Limit("tokens", 100, "day")])
    e.lease(P, M, 1, 10).success(tokens=30)
    e.lease(P, M, 2, 10).success(tokens=40)
    # rpm=2 at account scope is spent by keys 1 and 2 together
    for key in (1, 2):
        assert e.check(P, M, key).reason == "rpm"
    assert e.check(P, M, 3)
    u = e.usage(P, M, 1)
    assert u["rpm"] == {"used": 2, "limit": 2}  # the account's
    assert u["tpd"] == {"used": 70, "limit": 100}
    assert u["rpm:key"] == {"used": 1, "limit": 5}  # the key's own
    # tokens at account scope: 70 used, 30 left for either key
    assert e.check(P, M, 2, 30, limits=[Limit("tokens", 100, "day")])
    assert e.check(P, M, 2, 31, limits=[Limit("tokens", 100, "day")]).reason == "tpd"
    # a live lease on one key counts for the other
    e.set_model_limits(P, M, rpm=10)
    with e.lease(P, M, 1, 0, limits=[Limit("requests", 3, "minute")]):
        assert e.check(P, M, 2, limits=[Limit("requests", 3, "minute")]).reason == "rpm"
        assert e.check(P, M, 2, limits=[Limit("requests", 3, "minute", "key")])


def test_provider_caps_are_per_account(e: q.QuotaEngine) -> None:
    """Two keys of one OpenRouter account share its requests a day."""
    e.register_key(1, "openrouter", account="acct-1")
    e.register_key(2, "openrouter", account="acct-1")
    e.set_provider_caps("openrouter", daily_requests=3)
    for key in (1, 2, 1):
        e.lease("openrouter", "deepseek/deepseek-chat:free", key).success()
    assert e.provider_daily_request_count("openrouter", 2) == 3
    for key in (1, 2):
        assert e.check("openrouter", "deepseek/deepseek-chat:free", key).reason == "provider_daily_requests"
    assert e.check("openrouter", "deepseek/deepseek-chat:free", 3)  # another account


def test_a_key_moved_to_another_account_counts_there_in_every_engine(store: str) -> None:
    with (
        q.QuotaEngine(store, clock=q.ManualClock(NOW), env={}) as a,
        q.QuotaEngine(store, clock=q.ManualClock(NOW), env={}) as b,
    ):
        a.set_model_limits(P, M, rpm=3)
        for key in (1, 2):
            a.register_key(key, P)
        a.lease(P, M, 1).success()
        a.lease(P, M, 2).success()
        assert b.usage(P, M, 1)["rpm"]["used"] == 1  # keys of their own
        a.register_key(1, P, account="proj")
        a.register_key(2, P, account="proj")
        assert b.key_account(P, 2) == "proj"
        assert b.usage(P, M, 1)["rpm"]["used"] == 2  # now the account's, counted from the store
        b.lease(P, M, 2).success()
        assert a.check(P, M, 1).reason == "rpm"
        a.register_key(2, P, account="other")
        assert b.usage(P, M, 1)["rpm"]["used"] == 1
        assert b.check(P, M, 1)


def test_the_guardrail_reports_a_key_at_each_limits_scope(e: q.QuotaEngine) -> None:
    e.register_key(1, P, account="proj")
    e.register_key(2, P, account="proj")
    e.set_model_limits(P, M, rpm=4)
    for _ in range(3):
        e.lease(P, M, 1).success()
    # key 2 has no usage of its own, but the account has used 3 of 4
    assert e.model_window_used_fraction(P, M, key_id=2) == 0.75


RACE = """
    import random, sys, threading, time
    import quotaengine as q
    db, now, scope = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    e = q.QuotaEngine(db, clock=q.ManualClock(now), env={})
    counts = {1: 0, 2: 0, 3: 0}
    errors = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker(i):
        rng = random.Random(i)
        try:
            barrier.wait()
            keys = [1, 2, 3]
            while keys:
                key = rng.choice(keys)
                try:
                    e.lease("google", "gemini-2.5-flash", key, 10)  # held: counts until it ends
                    with lock:
                        counts[key] += 1
                    time.sleep(rng.uniform(0, 0.003))
                except q.QuotaExceeded as exc:
                    if exc.reason != "rpm":
                        errors.append(exc.reason)
                    keys.remove(key)
        except BaseException as exc:
            errors.append(repr(exc))

    print("ready", flush=True)
    sys.stdin.readline()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(counts[1], counts[2], counts[3], "errors", len(errors), *errors, flush=True)
    import os
    os._exit(0)
"""


@pytest.mark.parametrize("scope", ["account", "key"])
def test_four_processes_racing_over_one_account_admit_exactly_the_limit(store: str, scope: str) -> None:
    with q.QuotaEngine(store, clock=q.ManualClock(NOW), env={}) as e:
        for key in (1, 2, 3):
            e.register_key(key, P, account="proj")
        e.set_model_limits(P, M, limits=[Limit("requests", 100, "minute", scope)])
    per_key = [0, 0, 0]
    for words in race(RACE, [[store, str(NOW), scope]] * 4, timeout=60):
        assert words[3] == "errors" and words[4] == "0", words
        for i in range(3):
            per_key[i] += int(words[i])
    if scope == "account":
        assert sum(per_key) == 100, per_key
    else:
        assert per_key == [100, 100, 100]


def test_the_key_concurrency_cap_stays_per_key(store: str) -> None:
    env = {"MAX_CONCURRENT_REQUESTS_PER_KEY_GOOGLE": "1"}
    with q.QuotaEngine(store, clock=q.ManualClock(NOW), env=env) as e:
        e.register_key(1, P, account="proj")
        e.register_key(2, P, account="proj")
        with e.lease(P, M, 1):
            assert e.check(P, M, 1).reason == "key_concurrency"
            assert e.check(P, M, 2)  # the other key of the account has none in flight
