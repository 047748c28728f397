"""SPEC 15.2 (a short stated delay on a route's first transient bench) and 15.4 (the
`concurrency` failure kind and the key concurrency cap it teaches, as 24.2 amends it),
on both backends, with real provider bodies. 15.1 and 15.3 are in test_failures.py;
the cap that settles (24.2) in test_settling_cap.py."""

from __future__ import annotations

import pytest
import quotaengine as q
from moments import HOUR, MINUTE, NOON, SECOND
from provider_bodies import (
    GEMINI_PER_DAY_17S,
    GEMINI_PER_MINUTE_17S,
    GROQ_TPM_766,
    OLLAMA_BUSY,
    OPENAI_TPM_20MS,
    gemini_body,
)
from subprocesses import finish, spawn

P, M, K = "groq", "llama-3.3-70b-versatile", 1
KNOWN = {"rpd": 14_400}  # a daily limit far from spent: no unknown-limit ladder


def bench(o: q.FailureOutcome) -> tuple[int, str] | None:
    return None if o.cooldown is None else (o.cooldown.duration_ms, o.cooldown.source)


# ------------------------------------------------------------------ 15.2 short stated delay


def test_groq_tpm_delay_is_believed_on_the_first_transient_bench(qengine: q.QuotaEngine) -> None:
    """A minute window that frees in 7.66 s should not idle 90 s; the upsell's "today"
    keeps it a rate limit, and the body teaches TPM."""
    o = qengine.record_failure(P, M, K, status=429, message=GROQ_TPM_766, limits=KNOWN)
    assert o.kind == "rate_limit"
    assert bench(o) == (7_660, "authoritative")
    cd = qengine.cooldown(P, M, K)
    assert cd is not None and (cd.expires_at_ms, cd.source) == (NOON + 7_660, "authoritative")
    assert o.learned is not None and (o.learned.kind, o.learned.limit) == ("tpm", 6000)
    # Authoritative: the probe leaves it alone.
    assert qengine.probeable_cooldowns() == []


def test_a_repeat_within_ten_minutes_gets_ninety_seconds(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    """A provider that said "retry in 7.66 s" and failed again is not telling the truth."""
    o = qengine.record_failure(P, M, K, status=429, message=GROQ_TPM_766, limits=KNOWN)
    assert bench(o) == (7_660, "authoritative")
    qclock.advance(8 * SECOND)
    o = qengine.record_failure(P, M, K, status=429, message=GROQ_TPM_766, limits=KNOWN)
    assert bench(o) == (90 * SECOND, "heuristic")
    # Still a repeat 9 min 59 s after the last transient bench ...
    qclock.advance(9 * MINUTE + 59 * SECOND)
    o = qengine.record_failure(P, M, K, status=429, retry_after="3", limits=KNOWN)
    assert bench(o) == (90 * SECOND, "heuristic")
    # ... and the first again 10 minutes after it.
    qclock.advance(10 * MINUTE)
    o = qengine.record_failure(P, M, K, status=429, retry_after="3", limits=KNOWN)
    assert bench(o) == (3 * SECOND, "authoritative")
    # The memory is the route's: another model of the key has its own first.
    o = qengine.record_failure(P, "other-model", K, status=429, retry_after="3", limits=KNOWN)
    assert bench(o) == (3 * SECOND, "authoritative")


def test_openai_twenty_milliseconds_bench_at_least_a_second(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure("openai", "gpt-4o-mini", K, status=429, message=OPENAI_TPM_20MS, limits=KNOWN)
    assert o.kind == "rate_limit"
    assert bench(o) == (SECOND, "authoritative")
    assert o.learned is not None and (o.learned.kind, o.learned.limit) == ("tpm", 200_000)
    # A Retry-After of 0 (or a date in the past) too.
    o = qengine.record_failure("openai", "gpt-4o-mini", K + 1, status=429, retry_after="0", limits=KNOWN)
    assert bench(o) == (SECOND, "authoritative")


def test_gemini_per_minute_retry_delay_is_believed_once(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    o = qengine.record_failure("google", "gemini-2.0-flash", K, status=429, message=GEMINI_PER_MINUTE_17S)
    assert o.kind == "rate_limit"
    assert bench(o) == (17 * SECOND, "authoritative")
    assert o.learned is not None and (o.learned.kind, o.learned.limit) == ("rpm", 200)
    qclock.advance(18 * SECOND)
    # A repeat: with its daily limits still unknown, the second hit in an hour is
    # "effectively exhausted" (6.1): a ladder step, never the stated 17 s.
    o = qengine.record_failure("google", "gemini-2.0-flash", K, status=429, message=GEMINI_PER_MINUTE_17S)
    assert bench(o) == (2 * MINUTE, "heuristic")
    # Another key: when the repeat comes with a daily limit known and far from spent, it
    # takes no step; it is the 90 s bench, heuristic.
    o = qengine.record_failure("google", "gemini-2.0-flash", K + 1, status=429, message=GEMINI_PER_MINUTE_17S)
    assert bench(o) == (17 * SECOND, "authoritative")
    qclock.advance(18 * SECOND)
    o = qengine.record_failure(
        "google", "gemini-2.0-flash", K + 1, status=429, message=GEMINI_PER_MINUTE_17S, limits=KNOWN
    )
    assert bench(o) == (90 * SECOND, "heuristic")


def test_transient_kinds_without_a_quota_signal_follow_the_same_rule(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, status=503, retry_after="2")
    assert (o.kind, bench(o)) == ("server_error", (2 * SECOND, "authoritative"))
    o = qengine.record_failure(P, M, K, status=503, retry_after="2")
    assert (o.kind, bench(o)) == ("server_error", (90 * SECOND, "heuristic"))
    o = qengine.record_failure(P, M, K + 1, status=408, retry_after="4")
    assert (o.kind, bench(o)) == ("timeout", (4 * SECOND, "authoritative"))


def test_no_stated_delay_and_ladder_steps_are_unchanged(qengine: q.QuotaEngine) -> None:
    # No delay stated: the transient 90 s, heuristic.
    o = qengine.record_failure(P, M, K, status=429, limits=KNOWN)
    assert bench(o) == (90 * SECOND, "heuristic")
    # A ladder step is not a transient bench: a short delay never shortens it.
    spent = {"rpd": 1}
    qengine.record_request(P, M, K + 1)
    o = qengine.record_failure(P, M, K + 1, status=429, retry_after="3", limits=spent)
    assert bench(o) == (2 * MINUTE, "heuristic")
    # Unknown limits: the first hit is transient (its delay believed), the second a step.
    o = qengine.record_failure(P, M, K + 2, status=429, retry_after="3")
    assert bench(o) == (3 * SECOND, "authoritative")
    o = qengine.record_failure(P, M, K + 2, status=429, retry_after="3")
    assert bench(o) == (2 * MINUTE, "heuristic")


def test_a_success_or_an_operator_reset_forgets_the_transient_bench(
    qengine: q.QuotaEngine, qclock: q.ManualClock
) -> None:
    """The choice where SPEC 15.2 is silent: a success on the route ends its failure
    history (as it ends the ladder), so the provider's next short delay is believed."""
    o = qengine.record_failure(P, M, K, status=429, retry_after="3", limits=KNOWN)
    assert bench(o) == (3 * SECOND, "authoritative")
    qclock.advance(4 * SECOND)
    qengine.lease(P, M, K, 10, limits=KNOWN).success(tokens=10)
    o = qengine.record_failure(P, M, K, status=429, retry_after="3", limits=KNOWN)
    assert bench(o) == (3 * SECOND, "authoritative")
    qclock.advance(4 * SECOND)
    qengine.clear_cooldowns_for_key(K)
    o = qengine.record_failure(P, M, K, status=429, retry_after="3", limits=KNOWN)
    assert bench(o) == (3 * SECOND, "authoritative")


def test_local_endpoints_keep_five_seconds(qengine: q.QuotaEngine) -> None:
    qengine.register_key(7, "ollama", base_url="http://127.0.0.1:11434")
    o = qengine.record_failure("ollama", "llama3", 7, status=429, retry_after="2", limits=KNOWN)
    assert bench(o) == (5 * SECOND, "heuristic")


def test_a_daily_quota_is_not_a_transient_bench(qengine: q.QuotaEngine) -> None:
    """15.1's ladder for Gemini's per-day quota with retryDelay 17s; 15.2 does not apply."""
    o = qengine.record_failure("google", "gemini-2.0-flash", K, status=429, message=GEMINI_PER_DAY_17S)
    assert (o.kind, bench(o)) == ("daily_quota", (2 * MINUTE, "heuristic"))
    assert o.learned is not None and (o.learned.kind, o.learned.limit) == ("rpd", 200)


def test_the_transient_memory_is_shared(store: str, qclock: q.ManualClock) -> None:
    """Two engines on one store (two workers): the second sees the first's transient bench."""
    with q.QuotaEngine(store, clock=qclock, env={}) as a, q.QuotaEngine(store, clock=qclock, env={}) as b:
        o = a.record_failure(P, M, K, status=429, retry_after="3", limits=KNOWN)
        assert bench(o) == (3 * SECOND, "authoritative")
        qclock.advance(4 * SECOND)
        o = b.record_failure(P, M, K, status=429, retry_after="3", limits=KNOWN)
        assert bench(o) == (90 * SECOND, "heuristic")


# ------------------------------------------------------------------ 15.4 concurrency


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (503, OLLAMA_BUSY, "concurrency"),
        (429, "Too many concurrent requests for this model", "concurrency"),
        (None, "concurrency limit exceeded", "concurrency"),
        (429, "Too many parallel requests", "concurrency"),
        (503, "too many simultaneous streams", "concurrency"),
        (None, "FATAL: too many connections for role", "concurrency"),
        # Only a 429 or a 503 (or no status) names concurrency.
        (500, OLLAMA_BUSY, "server_error"),
        (400, "concurrent requests not supported with this option", "other"),
        # Rows above it still win.
        (402, "too many concurrent requests", "payment"),
        (429, "daily quota exhausted (concurrent)", "daily_quota"),
        # A 503 without a concurrency phrase is still a server error.
        (503, "server busy, please try again", "server_error"),
    ],
)
def test_the_concurrency_kind(qengine: q.QuotaEngine, status: int | None, message: str, kind: str) -> None:
    o = qengine.record_failure(P, M, K, status=status, message=message)
    assert o.kind == kind


def test_ollama_busy_benches_nothing_and_learns_the_cap(qengine: q.QuotaEngine) -> None:
    """A local Ollama that takes 2 requests at a time answers the third with 503 "server busy":
    the engine benches nothing and refuses a third while two are out."""
    qengine.register_key(7, "ollama", base_url="http://127.0.0.1:11434")
    assert qengine.key_concurrency_cap("ollama", 7) is None
    first = qengine.lease("ollama", "llama3", 7)
    second = qengine.lease("ollama", "qwen2.5", 7)  # any model of the key counts
    third = qengine.lease("ollama", "llama3", 7)
    o = third.failure(status=503, message=OLLAMA_BUSY)
    assert o.kind == "concurrency"
    assert o.cooldown is None  # a local endpoint benches nothing either
    assert qengine.cooldown("ollama", "llama3", 7) is None
    # The failing lease itself is not counted: two others were live.
    assert o.learned is not None and (o.learned.kind, o.learned.limit) == ("concurrency", 2)
    assert qengine.key_concurrency_cap("ollama", 7) == 2
    with pytest.raises(q.QuotaExceeded) as exc:
        qengine.lease("ollama", "llama3", 7)
    assert exc.value.reason == "key_concurrency"
    assert not qengine.check("ollama", "mistral", 7).allowed
    first.success()
    with qengine.lease("ollama", "llama3", 7):  # one slot free again
        pass
    second.release()
    # Another key of the platform is not capped.
    assert qengine.key_concurrency_cap("ollama", 8) is None


def test_the_cap_is_at_least_one_and_each_failure_sets_it(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    """SPEC 24.2 (amends 15.4, where a learned cap only tightened): each concurrency
    failure sets the cap to the leases it counts."""
    o = qengine.record_failure(P, M, K, status=429, message="Too many concurrent requests")
    assert o.learned is not None and (o.learned.kind, o.learned.limit) == ("concurrency", 1)
    assert o.cooldown is None
    assert qengine.key_concurrency_cap(P, K) == 1
    # With three leases out (taken unconditionally, as a router may), a later failure
    # sets the cap to 3.
    ids = [qengine.acquire_lease(P, M, K) for _ in range(3)]
    qclock.advance(MINUTE)
    o = qengine.record_failure(P, M, K, status=429, message="Too many concurrent requests")
    assert o.learned is not None and o.learned.limit == 3
    assert qengine.key_concurrency_cap(P, K) == 3
    for i in ids:
        qengine.release_lease(i)
    # On another key: three out, then a tighter one with one out.
    ids = [qengine.acquire_lease(P, M, K + 1) for _ in range(3)]
    o = qengine.record_failure(P, M, K + 1, status=429, message="Too many concurrent requests")
    assert o.learned is not None and o.learned.limit == 3
    for i in ids[1:]:
        qengine.release_lease(i)
    o = qengine.record_failure(P, M, K + 1, status=429, message="Too many concurrent requests")
    assert o.learned is not None and o.learned.limit == 1
    assert qengine.key_concurrency_cap(P, K + 1) == 1


def test_the_cap_is_not_forgotten_an_hour_after_the_last_failure(store: str, qclock: q.ManualClock) -> None:
    """SPEC 24.2 (amends 15.4, where it was forgotten after an hour): an hour after the
    last failure it rises by one."""
    # Leases that live for hours, so that the confirming failure still sees two out.
    qengine = q.QuotaEngine(store, clock=qclock, env={}, lease_max_age_ms=3 * HOUR)
    leases = [qengine.lease(P, M, K) for _ in range(2)]
    qengine.record_failure(P, M, K, status=503, message=OLLAMA_BUSY)
    assert qengine.key_concurrency_cap(P, K) == 2
    # Confirmed 50 minutes later: the hour runs from there.
    qclock.advance(50 * MINUTE)
    o = qengine.record_failure(P, M, K, status=503, message=OLLAMA_BUSY)
    assert o.learned is not None and o.learned.limit == 2
    qclock.advance(59 * MINUTE)
    assert qengine.key_concurrency_cap(P, K) == 2
    with pytest.raises(q.QuotaExceeded):
        qengine.lease(P, M, K)
    qclock.advance(MINUTE)
    assert qengine.key_concurrency_cap(P, K) == 3
    third = qengine.lease(P, M, K)  # a third goes out again, not a fourth
    with pytest.raises(q.QuotaExceeded):
        qengine.lease(P, M, K)
    third.release()
    for lease in leases:
        lease.release()
    qengine.close()


def test_a_success_keeps_the_cap_and_the_operator_reset_forgets_it(qengine: q.QuotaEngine) -> None:
    held = qengine.lease(P, M, K)
    qengine.record_failure(P, M, K, status=429, message="Too many concurrent requests")
    held.success(tokens=5)
    assert qengine.key_concurrency_cap(P, K) == 1
    qengine.clear_cooldowns_for_key(K)
    assert qengine.key_concurrency_cap(P, K) is None


def test_the_configured_cap_and_the_learned_cap_the_smaller_wins(store: str, qclock: q.ManualClock) -> None:
    env = {"MAX_CONCURRENT_REQUESTS_PER_KEY_GROQ": "3"}
    with q.QuotaEngine(store, clock=qclock, env=env) as e:
        assert e.key_concurrency_cap(P, K) == 3
        held = [e.lease(P, M, K) for _ in range(2)]
        e.record_failure(P, M, K, status=429, message="Too many concurrent requests")
        assert e.key_concurrency_cap(P, K) == 2
        with pytest.raises(q.QuotaExceeded):
            e.lease(P, M, K)
        # Learned above the configured one: the configured one stands.
        more = [e.acquire_lease(P, M, K + 1) for _ in range(5)]
        e.record_failure(P, M, K + 1, status=429, message="Too many concurrent requests")
        assert e.key_concurrency_cap(P, K + 1) == 3
        for lease in held:
            lease.release()
        for i in more:
            e.release_lease(i)


def test_explicit_kind_and_bad_input(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, kind="concurrency")
    assert (o.kind, o.cooldown) == ("concurrency", None)
    assert o.learned is not None and o.learned.kind == "concurrency"
    with pytest.raises(TypeError):
        qengine.key_concurrency_cap(P, "1")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        qengine.key_concurrency_cap("", K)
    assert qengine.key_concurrency_cap(P, K) == 1


CHILD_TEACHES = """
    import sys
    import quotaengine as q
    store, now = sys.argv[1], int(sys.argv[2])
    with q.QuotaEngine(store, clock=q.ManualClock(now), env={}) as e:
        out = [e.lease("ollama", "llama3", 7) for _ in range(2)]
        third = e.lease("ollama", "llama3", 7)
        o = third.failure(status=503, message=sys.stdin.readline())
        print(o.kind, o.learned.limit, flush=True)
        for lease in out:
            lease.release()
"""


def test_a_cap_learned_in_one_worker_refuses_in_the_others(store: str, qclock: q.ManualClock) -> None:
    """Persisted and shared: a real second process learns the cap; this engine, open
    before it, refuses at it (and a new engine on the store does too)."""
    with q.QuotaEngine(store, clock=qclock, env={}) as e:
        assert e.key_concurrency_cap("ollama", 7) is None
        with spawn(CHILD_TEACHES, store, str(NOON)) as proc:
            assert proc.stdin is not None
            proc.stdin.write(OLLAMA_BUSY + "\n")
            proc.stdin.flush()
            assert finish(proc).split() == ["concurrency", "2"]
        assert e.key_concurrency_cap("ollama", 7) == 2
        held = [e.lease("ollama", "llama3", 7) for _ in range(2)]
        with pytest.raises(q.QuotaExceeded) as exc:
            e.lease("ollama", "llama3", 7)
        assert exc.value.reason == "key_concurrency"
        for lease in held:
            lease.release()
    with q.QuotaEngine(store, clock=qclock, env={}) as again:
        assert again.key_concurrency_cap("ollama", 7) == 2


# ------------------------------------------------------------------ junk never teaches


@pytest.mark.parametrize(
    "message",
    [
        gemini_body("GenerateRequestsPerDayPerProjectPerModel-FreeTier", "17s", quota_value="lots"),
        gemini_body("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "-5s", quota_value="-200"),
        gemini_body("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "9" * 40 + "s", quota_value="0"),
        "\x00\xff\xfe" * 50_000 + " try again in 5s GenerateRequestsPerDay quotaValue 9",
        "limit: " + "9" * 30 + " requests per day",
        "x" * (1 << 20) + GEMINI_PER_DAY_17S,  # beyond the 1 MiB that is read
    ],
    ids=["quotaValue-word", "negative", "huge", "binary", "overflow", "one-megabyte"],
)
def test_junk_teaches_nothing_and_never_panics(qengine: q.QuotaEngine, message: str) -> None:
    o = qengine.record_failure(P, M, K, status=429, message=message)
    assert o.learned is None
    assert qengine.model_limits(P, M) is None
    assert o.cooldown is not None and 0 < o.cooldown.duration_ms <= 24 * HOUR


@pytest.mark.sqlite_only
def test_a_file_of_schema_6_opens_and_keeps_its_failure_history(db_path: object, qclock: q.ManualClock) -> None:
    """Version 7 rebuilds failure_history (two more kinds and a value): the ladder a file
    of version 6 holds goes on from where it was."""
    import sqlite3

    from old_schemas import downgrade_schema

    spent = {"rpd": 1}
    with q.QuotaEngine(db_path, clock=qclock, env={}) as e:
        e.record_request(P, M, K)
        o = e.record_failure(P, M, K, status=429, limits=spent)
        assert bench(o) == (2 * MINUTE, "heuristic")
    con = sqlite3.connect(db_path)  # type: ignore[arg-type]
    with con:
        downgrade_schema(con, 6)
    con.close()
    qclock.advance(3 * MINUTE)
    with q.QuotaEngine(db_path, clock=qclock, env={}) as e:
        o = e.record_failure(P, M, K, status=429, limits=spent)
        assert bench(o) == (10 * MINUTE, "heuristic")  # the ladder's second step
        e.record_failure(P, M, K, status=429, message="Too many concurrent requests")
        assert e.key_concurrency_cap(P, K) == 1
    con = sqlite3.connect(db_path)  # type: ignore[arg-type]
    try:
        assert con.execute("PRAGMA user_version").fetchone()[0] == 13  # migrated to the current version
        kinds = {k for (k,) in con.execute("SELECT kind FROM failure_history")}
        assert kinds == {"ladder", "concurrency"}
    finally:
        con.close()


@pytest.mark.parametrize(
    ("message", "delay_ms"),
    [
        ('"retryDelay": "-5s"', None),  # negative: no delay
        ('"retryDelay": "' + "9" * 40 + 's"', 24 * HOUR),  # huge: clamped to 24 h
        ('"retryDelay": "1e9s"', None),
        ('"retryDelay": "nan"', None),
        ('"retryDelay": "0.5s"', 500),
    ],
)
def test_retry_delay_junk_is_parsed_within_bounds(message: str, delay_ms: int | None) -> None:
    assert q.parse_stated_retry_ms(message) == delay_ms


@pytest.mark.parametrize("value", ['"-200"', '"lots"', '"' + "9" * 25 + '"', '"0"', "null"])
def test_a_quota_value_that_is_not_a_positive_number_teaches_nothing(value: str) -> None:
    body = GEMINI_PER_DAY_17S.replace('"quotaValue": "200"', f'"quotaValue": {value}')
    assert body != GEMINI_PER_DAY_17S
    assert q.parse_provider_limit(body) is None
