"""SPEC §6.2 (record_failure / Lease.failure: kinds, benches, Retry-After) and §7 (learning limits)."""

from __future__ import annotations

import email.utils

import pytest
import quotaengine as q
from moments import DAY, HOUR, MINUTE, NOON, SECOND
from provider_bodies import gemini_body

MIDNIGHT = 1_767_225_600_000  # 2026-01-01 00:00:00.000 UTC

P, M, K = "groq", "llama-3.1-8b-instant", 1

# --- real provider wordings -------------------------------------------------------------

OPENAI_INSUFFICIENT_QUOTA = (
    '{"error": {"message": "You exceeded your current quota, please check your plan and '
    "billing details. For more information on this error, read the docs: "
    'https://platform.openai.com/docs/guides/error-codes/api-errors.", '
    '"type": "insufficient_quota", "param": null, "code": "insufficient_quota"}}'
)

CLOUDFLARE_NEURONS = (
    '{"errors":[{"message":"AiError: AiError: you have used up your daily free allocation of '
    "10,000 neurons, please upgrade to Cloudflare's Workers Paid plan if you would like to "
    'continue usage. (8d0b3c2e-1f2a-4b5c-9d6e-7f8a9b0c1d2e)","code":4006}],'
    '"success":false,"result":{},"messages":[]}'
)


GEMINI_DAILY = gemini_body("GenerateRequestsPerDayPerProjectPerModel-FreeTier", None)
GEMINI_MINUTE = gemini_body("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "17s")

GROQ_TPM_429 = (
    "Rate limit reached for model `llama-3.3-70b-versatile` in organization `org_01hx` "
    "service tier `on_demand` on tokens per minute (TPM): Limit 12000, Used 9622, "
    "Requested 3456. Please try again in 5.39s. Need more tokens? Upgrade to Dev Tier "
    "today at https://console.groq.com/settings/billing"
)

GROQ_RPD_429 = (
    "Rate limit reached for model `llama-3.1-8b-instant` in organization `org_01hx` "
    "service tier `on_demand` on requests per day (RPD): Limit 14400, Used 14400, "
    "Requested 1. Please try again in 1m26.4s. Need more requests? Upgrade to Dev Tier "
    "today at https://console.groq.com/settings/billing"
)


def groq_413(limit: int) -> str:
    return (
        "Request too large for model `llama-3.1-8b-instant` in organization `org_x` service "
        f"tier `on_demand` on tokens per minute (TPM): Limit {limit}, Requested 7913, please "
        "reduce your message size and try again."
    )


# --- fixtures ----------------------------------------------------------------------------


def bench(o: q.FailureOutcome) -> tuple[int, str] | None:
    return None if o.cooldown is None else (o.cooldown.duration_ms, o.cooldown.source)


def stored(e: q.QuotaEngine, model: str = M, key: int = K) -> tuple[int, str] | None:
    cd = e.cooldown(P, model, key)
    return None if cd is None else (cd.expires_at_ms, cd.source)


# --------------------------------------------------------------------------- kind table: status


@pytest.mark.parametrize(
    ("status", "kind", "expected"),
    [
        (402, "payment", (DAY, "credit")),
        (403, "forbidden", (DAY, "tier")),
        (401, "auth", (5 * MINUTE, "heuristic")),
        (429, "rate_limit", (90 * SECOND, "heuristic")),
        (408, "timeout", (90 * SECOND, "heuristic")),
        (500, "server_error", (90 * SECOND, "heuristic")),
        (502, "server_error", (90 * SECOND, "heuristic")),
        (503, "server_error", (90 * SECOND, "heuristic")),
        (529, "server_error", (90 * SECOND, "heuristic")),
        (400, "other", None),
        (404, "other", None),
        (413, "other", None),
        (422, "other", None),
    ],
)
def test_kind_from_status(qengine: q.QuotaEngine, status: int, kind: str, expected: tuple[int, str] | None) -> None:
    o = qengine.record_failure(P, M, K, status=status)
    assert o.kind == kind
    assert bench(o) == expected
    if expected is None:
        assert qengine.cooldown(P, M, K) is None
    else:
        assert stored(qengine) == (NOON + expected[0], expected[1])
    assert o.learned is None


def test_no_status_no_message_is_other(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K)
    assert o.kind == "other"
    assert o.cooldown is None
    assert qengine.cooldown(P, M, K) is None


# --------------------------------------------------------------------------- kind table: message


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("Payment Required", "payment"),
        ("PAYMENT REQUIRED", "payment"),
        ("error code: insufficient_quota", "payment"),
        ("Insufficient credit on this account", "payment"),
        ("Insufficient Balance", "payment"),
        ("Forbidden", "forbidden"),
        ("403 FORBIDDEN: model is not available on your plan", "forbidden"),
        ("Daily quota exceeded for this model", "daily_quota"),
        ("You exceeded the requests per day limit", "daily_quota"),
        ("per_day quota exhausted", "daily_quota"),
        ("RPD limit reached", "daily_quota"),
        ("TPD quota exhausted", "daily_quota"),
        ("You have used up your allocation for today", "daily_quota"),
        ("Quota exceeded for quota metric 'GenerateRequestsPerDayPerProjectPerModel'", "daily_quota"),
        ("Daily limit reached, please try again in 30 minutes", "daily_quota"),
        ("Rate limit exceeded", "rate_limit"),
        ("RATE LIMIT EXCEEDED", "rate_limit"),
        ("Too Many Requests", "rate_limit"),
        ("RESOURCE_EXHAUSTED", "rate_limit"),
        ("Quota exceeded", "rate_limit"),
        ("RPM quota reached, more capacity available today", "rate_limit"),
        ("Daily quota fine, per minute limit reached", "rate_limit"),
        ("Request timed out", "timeout"),
        ("TIMEOUT", "timeout"),
        ("upstream deadline exceeded", "timeout"),
        ("read ECONNRESET", "transport"),
        ("connect ECONNREFUSED 127.0.0.1:443", "transport"),
        ("socket hang up", "transport"),
        ("Connection reset by peer", "transport"),
        ("Connection refused", "transport"),
        ("connection aborted", "transport"),
        ("[Errno 32] Broken pipe", "transport"),
        ("[Errno 101] Network is unreachable", "transport"),
        ("Temporary failure in name resolution", "transport"),
        ("Bad request: invalid JSON", "other"),
        ("model not found", "other"),
        ("", "other"),
    ],
)
def test_kind_from_message(qengine: q.QuotaEngine, message: str, kind: str) -> None:
    o = qengine.record_failure(P, M, K, message=message)
    assert o.kind == kind


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (429, OPENAI_INSUFFICIENT_QUOTA, "payment"),
        (401, "insufficient_quota", "payment"),
        (429, "Forbidden", "forbidden"),
        (403, "Rate limit exceeded", "forbidden"),
        (429, CLOUDFLARE_NEURONS, "daily_quota"),
        (429, GEMINI_DAILY, "daily_quota"),
        (429, GEMINI_MINUTE, "rate_limit"),
        (429, GROQ_TPM_429, "rate_limit"),
        (429, GROQ_RPD_429, "daily_quota"),
        (429, "Request timed out", "rate_limit"),
        (504, "Gateway Timeout", "timeout"),
        (500, "deadline exceeded", "timeout"),
        (502, "read ECONNRESET", "server_error"),
        (400, "Too many requests", "rate_limit"),
        (404, "socket hang up", "transport"),
    ],
)
def test_first_matching_row_wins(qengine: q.QuotaEngine, status: int, message: str, kind: str) -> None:
    assert qengine.record_failure(P, M, K, status=status, message=message).kind == kind


# --------------------------------------------------------------------------- benches per kind


def test_openai_insufficient_quota_is_24h_credit(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, status=429, message=OPENAI_INSUFFICIENT_QUOTA)
    assert o.kind == "payment"
    assert bench(o) == (DAY, "credit")
    assert stored(qengine) == (NOON + DAY, "credit")
    assert qengine.probeable_cooldowns() == []


def test_402_ignores_retry_after(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, status=402, retry_after=60)
    assert bench(o) == (DAY, "credit")
    o = qengine.record_failure(P, M, K + 1, status=402, retry_after="60")
    assert bench(o) == (DAY, "credit")


def test_403_is_24h_tier_ignoring_retry_after(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, status=403, retry_after="60")
    assert o.kind == "forbidden"
    assert bench(o) == (DAY, "tier")
    assert stored(qengine) == (NOON + DAY, "tier")


def test_cloudflare_daily_allocation_until_midnight(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    o = qengine.record_failure(P, M, K, status=429, message=CLOUDFLARE_NEURONS)
    assert o.kind == "daily_quota"
    assert bench(o) == (12 * HOUR, "authoritative")
    assert stored(qengine) == (MIDNIGHT + DAY, "authoritative")
    qclock.set(MIDNIGHT + DAY + 2 * HOUR)  # next day 02:00
    o = qengine.record_failure(P, M, K + 1, status=429, message=CLOUDFLARE_NEURONS)
    assert bench(o) == (22 * HOUR, "authoritative")


def test_daily_quota_uses_retry_after_when_given(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, status=429, message=CLOUDFLARE_NEURONS, retry_after="3600")
    assert o.kind == "daily_quota"
    assert bench(o) == (HOUR, "authoritative")
    # SPEC 15.1: a delay shorter than the route's next ladder step (2 min) is not believed
    o = qengine.record_failure(P, M, K + 1, status=429, message=CLOUDFLARE_NEURONS, retry_after="30")
    assert bench(o) == (2 * MINUTE, "heuristic")


def test_daily_quota_uses_delay_stated_in_message(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, message="Daily limit reached, please try again in 30 minutes")
    assert o.kind == "daily_quota"
    assert bench(o) == (30 * MINUTE, "authoritative")


def test_gemini_per_day_quota_is_daily(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, status=429, message=GEMINI_DAILY)
    assert o.kind == "daily_quota"
    assert bench(o) == (12 * HOUR, "authoritative")


def test_gemini_per_minute_quota_is_rate_limit_and_uses_retry_delay(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, status=429, message=GEMINI_MINUTE)
    assert o.kind == "rate_limit"
    # SPEC 15.2: the route's first transient bench believes the stated 17 s
    assert bench(o) == (17 * SECOND, "authoritative")
    long_delay = gemini_body("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "170s")
    o = qengine.record_failure(P, M, K + 1, status=429, message=long_delay)
    assert o.kind == "rate_limit"
    assert bench(o) == (170 * SECOND, "authoritative")


def test_groq_per_minute_429_is_rate_limit_not_daily(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, status=429, message=GROQ_TPM_429)
    assert o.kind == "rate_limit"
    # SPEC 15.2: "Please try again in 5.39s" on the route's first transient bench
    assert bench(o) == (5_390, "authoritative")
    assert stored(qengine) == (NOON + 5_390, "authoritative")
    assert o.learned is not None and (o.learned.kind, o.learned.limit) == ("tpm", 12000)


def test_groq_per_day_429_is_daily_with_stated_delay(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, status=429, message=GROQ_RPD_429)
    assert o.kind == "daily_quota"
    # SPEC 15.1: "try again in 1m26.4s" on a spent daily quota: the ladder's 2 min instead
    assert bench(o) == (2 * MINUTE, "heuristic")
    assert o.learned is not None and (o.learned.kind, o.learned.limit) == ("rpd", 14400)
    lim = qengine.model_limits(P, M)
    assert lim is not None and lim.rpd == 14400


def test_rate_limit_goes_through_6_1_with_quota_signal(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    assert bench(qengine.record_failure(P, M, K, status=429)) == (90 * SECOND, "heuristic")
    qclock.advance(2 * MINUTE)
    assert bench(qengine.record_failure(P, M, K, status=429)) == (2 * MINUTE, "heuristic")
    qclock.advance(3 * MINUTE)
    assert bench(qengine.record_failure(P, M, K, status=429)) == (10 * MINUTE, "heuristic")


@pytest.mark.parametrize(
    ("status", "message"),
    [(408, None), (None, "request timed out"), (503, None), (None, "ECONNRESET")],
)
def test_6_1_kinds_without_quota_signal_never_escalate_on_unknown_limits(
    qengine: q.QuotaEngine, qclock: q.ManualClock, status: int | None, message: str | None
) -> None:
    for _ in range(4):
        o = qengine.record_failure(P, M, K, status=status, message=message)
        assert bench(o) == (90 * SECOND, "heuristic")
        qclock.advance(2 * MINUTE)
    # none of them counted an unknown-limit hit: a 429 now is the first hit
    assert bench(qengine.record_failure(P, M, K, status=429)) == (90 * SECOND, "heuristic")


def test_server_error_on_daily_exhausted_route_takes_ladder(qengine: q.QuotaEngine) -> None:
    qengine.set_model_limits(P, M, rpd=1)
    qengine.record_request(P, M, K)
    assert bench(qengine.record_failure(P, M, K, status=500)) == (2 * MINUTE, "heuristic")


def test_record_failure_honours_explicit_limits(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, status=429, limits={"rpd": 0})
    assert bench(o) == (2 * MINUTE, "heuristic")


def test_rate_limit_daily_exhausted_ladder_via_record_failure(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    qengine.set_model_limits(P, M, rpd=1)
    qengine.record_request(P, M, K)
    got = []
    for _ in range(4):
        o = qengine.record_failure(P, M, K, status=429)
        assert o.cooldown is not None
        got.append(o.cooldown.duration_ms)
        qengine.clear_cooldown_early(P, M, K)
    assert got == [2 * MINUTE, 10 * MINUTE, HOUR, 12 * HOUR]


# --------------------------------------------------------------------------- auth ladder


def test_auth_ladder_per_key_across_models(qengine: q.QuotaEngine) -> None:
    got = [bench(qengine.record_failure(P, f"model-{i}", K, status=401)) for i in range(5)]
    assert got == [
        (5 * MINUTE, "heuristic"),
        (30 * MINUTE, "heuristic"),
        (2 * HOUR, "heuristic"),
        (DAY, "heuristic"),
        (DAY, "heuristic"),
    ]
    assert [o.kind for o in [qengine.record_failure(P, "x", K, status=401)]] == ["auth"]
    # another key starts its own ladder
    assert bench(qengine.record_failure(P, "model-0", K + 1, status=401)) == (5 * MINUTE, "heuristic")


def test_auth_ladder_counts_any_model_and_platform_of_the_key(qengine: q.QuotaEngine) -> None:
    assert bench(qengine.record_failure("groq", "a", K, status=401)) == (5 * MINUTE, "heuristic")
    assert bench(qengine.record_failure("groq", "b", K, status=401)) == (30 * MINUTE, "heuristic")


def test_auth_ladder_forgets_401s_older_than_24h(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    assert bench(qengine.record_failure(P, "a", K, status=401))[0] == 5 * MINUTE  # type: ignore[index]
    qclock.advance(HOUR)
    assert bench(qengine.record_failure(P, "b", K, status=401))[0] == 30 * MINUTE  # type: ignore[index]
    qclock.advance(DAY + MINUTE)
    assert bench(qengine.record_failure(P, "c", K, status=401))[0] == 5 * MINUTE  # type: ignore[index]


def test_auth_ignores_retry_after(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, status=401, retry_after="7200")
    assert bench(o) == (5 * MINUTE, "heuristic")


def test_auth_ladder_cleared_by_success_on_any_route_of_key(qengine: q.QuotaEngine) -> None:
    qengine.record_failure(P, "a", K, status=401)
    qengine.record_failure(P, "b", K, status=401)
    qengine.record_request(P, "z", K + 1)  # another key: no effect
    assert bench(qengine.record_failure(P, "c", K, status=401)) == (2 * HOUR, "heuristic")
    qengine.record_request(P, "z", K)  # a success on another route of the same key
    assert bench(qengine.record_failure(P, "d", K, status=401)) == (5 * MINUTE, "heuristic")


def test_auth_ladder_cleared_by_lease_success(qengine: q.QuotaEngine) -> None:
    qengine.record_failure(P, "a", K, status=401)
    qengine.record_failure(P, "b", K, status=401)
    qengine.lease(P, "z", K).success()
    assert bench(qengine.record_failure(P, "c", K, status=401)) == (5 * MINUTE, "heuristic")


def test_auth_ladder_cleared_by_clear_cooldowns_for_key(qengine: q.QuotaEngine) -> None:
    qengine.record_failure(P, "a", K, status=401)
    qengine.record_failure(P, "b", K, status=401)
    assert qengine.clear_cooldowns_for_key(K) == 2
    assert bench(qengine.record_failure(P, "c", K, status=401)) == (5 * MINUTE, "heuristic")


def test_auth_ladder_not_cleared_by_clear_cooldown_early(qengine: q.QuotaEngine) -> None:
    qengine.record_failure(P, "a", K, status=401)
    qengine.clear_cooldown_early(P, "a", K)
    assert bench(qengine.record_failure(P, "a", K, status=401)) == (30 * MINUTE, "heuristic")


def test_auth_ladder_persists_across_engines(store: str, qclock: q.ManualClock) -> None:
    a = q.QuotaEngine(store, clock=qclock, env={})
    try:
        a.record_failure(P, "a", K, status=401)
    finally:
        a.close()
    b = q.QuotaEngine(store, clock=qclock, env={})
    try:
        assert bench(b.record_failure(P, "b", K, status=401)) == (30 * MINUTE, "heuristic")
    finally:
        b.close()


# --------------------------------------------------------------------------- empty completion


def test_empty_completion_streak(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    o1 = qengine.record_failure(P, M, K, kind="empty_completion")
    o2 = qengine.record_failure(P, M, K, kind="empty_completion")
    assert (o1.kind, o1.cooldown) == ("empty_completion", None)
    assert (o2.kind, o2.cooldown) == ("empty_completion", None)
    assert qengine.cooldown(P, M, K) is None
    o3 = qengine.record_failure(P, M, K, kind="empty_completion")
    assert bench(o3) == (90 * SECOND, "heuristic")
    assert stored(qengine) == (NOON + 90 * SECOND, "heuristic")
    qclock.advance(2 * MINUTE)
    o4 = qengine.record_failure(P, M, K, kind="empty_completion")
    assert bench(o4) == (90 * SECOND, "heuristic")
    qclock.advance(2 * MINUTE)
    # without quota_signal: no unknown-limit hits, no escalation
    assert bench(qengine.record_failure(P, M, K, kind="empty_completion")) == (90 * SECOND, "heuristic")


def test_empty_completion_streak_ended_by_success(qengine: q.QuotaEngine) -> None:
    qengine.record_failure(P, M, K, kind="empty_completion")
    qengine.record_failure(P, M, K, kind="empty_completion")
    qengine.record_request(P, M, K)
    assert qengine.record_failure(P, M, K, kind="empty_completion").cooldown is None
    assert qengine.record_failure(P, M, K, kind="empty_completion").cooldown is None
    assert qengine.record_failure(P, M, K, kind="empty_completion").cooldown is not None


def test_empty_completion_streak_ended_by_lease_success(qengine: q.QuotaEngine) -> None:
    qengine.record_failure(P, M, K, kind="empty_completion")
    qengine.record_failure(P, M, K, kind="empty_completion")
    with qengine.lease(P, M, K):
        pass
    assert qengine.record_failure(P, M, K, kind="empty_completion").cooldown is None


@pytest.mark.parametrize(("status", "kind"), [(400, None), (None, "other"), (404, None)])
def test_empty_completion_streak_ended_by_other_failure(
    qengine: q.QuotaEngine, status: int | None, kind: str | None
) -> None:
    qengine.record_failure(P, M, K, kind="empty_completion")
    qengine.record_failure(P, M, K, kind="empty_completion")
    o = qengine.record_failure(P, M, K, status=status, kind=kind)
    assert o.kind == "other"
    assert qengine.record_failure(P, M, K, kind="empty_completion").cooldown is None
    assert qengine.record_failure(P, M, K, kind="empty_completion").cooldown is None
    assert qengine.record_failure(P, M, K, kind="empty_completion").cooldown is not None


def test_empty_completion_streak_ended_by_benching_failure(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    qengine.record_failure(P, M, K, kind="empty_completion")
    qengine.record_failure(P, M, K, kind="empty_completion")
    qengine.record_failure(P, M, K, status=503)
    qclock.advance(2 * MINUTE)
    assert qengine.record_failure(P, M, K, kind="empty_completion").cooldown is None


def test_empty_completion_streak_is_per_route(qengine: q.QuotaEngine) -> None:
    qengine.record_failure(P, M, K, kind="empty_completion")
    qengine.record_failure(P, M, K, kind="empty_completion")
    assert qengine.record_failure(P, "other", K, kind="empty_completion").cooldown is None
    assert qengine.record_failure(P, M, K + 1, kind="empty_completion").cooldown is None
    assert qengine.record_failure(P, M, K, kind="empty_completion").cooldown is not None


def test_empty_completion_streak_lives_in_the_file(store: str, qclock: q.ManualClock) -> None:
    a = q.QuotaEngine(store, clock=qclock, env={})
    b = q.QuotaEngine(store, clock=qclock, env={})
    try:
        assert a.record_failure(P, M, K, kind="empty_completion").cooldown is None
        assert b.record_failure(P, M, K, kind="empty_completion").cooldown is None
    finally:
        a.close()
        b.close()
    c = q.QuotaEngine(store, clock=qclock, env={})
    try:
        o = c.record_failure(P, M, K, kind="empty_completion")
        assert bench(o) == (90 * SECOND, "heuristic")
    finally:
        c.close()


# --------------------------------------------------------------------------- explicit kind


@pytest.mark.parametrize(
    ("status", "message", "kind", "expected"),
    [
        (429, None, "other", None),
        (402, "insufficient_quota", "other", None),
        (400, None, "payment", (DAY, "credit")),
        (None, None, "forbidden", (DAY, "tier")),
        (500, None, "auth", (5 * MINUTE, "heuristic")),
        (None, "insufficient_quota", "rate_limit", (90 * SECOND, "heuristic")),
        (None, None, "daily_quota", (12 * HOUR, "authoritative")),
        (429, None, "timeout", (90 * SECOND, "heuristic")),
        (None, None, "server_error", (90 * SECOND, "heuristic")),
        (None, None, "transport", (90 * SECOND, "heuristic")),
        (429, None, "empty_completion", None),
    ],
)
def test_explicit_kind_overrides_inference(
    qengine: q.QuotaEngine,
    status: int | None,
    message: str | None,
    kind: str,
    expected: tuple[int, str] | None,
) -> None:
    o = qengine.record_failure(P, M, K, status=status, message=message, kind=kind)
    assert o.kind == kind
    assert bench(o) == expected


@pytest.mark.parametrize("kind", ["bogus", "quota", ""])
def test_unknown_kind_is_value_error(qengine: q.QuotaEngine, kind: str) -> None:
    with pytest.raises(ValueError):
        qengine.record_failure(P, M, K, status=429, kind=kind)
    assert qengine.cooldown(P, M, K) is None


# --------------------------------------------------------------------------- local endpoints


@pytest.mark.parametrize(
    ("kw", "kind"),
    [
        ({"status": 402}, "payment"),
        ({"status": 403}, "forbidden"),
        ({"status": 401}, "auth"),
        ({"status": 429, "message": CLOUDFLARE_NEURONS}, "daily_quota"),
        ({"status": 429}, "rate_limit"),
        ({"status": 429, "retry_after": "600"}, "rate_limit"),
        ({"status": 408}, "timeout"),
        ({"status": 502}, "server_error"),
        ({"message": "ECONNREFUSED"}, "transport"),
    ],
)
def test_local_endpoint_key_gets_5s_for_any_benching_kind(
    qengine: q.QuotaEngine, kw: dict[str, object], kind: str
) -> None:
    qengine.register_key(K, P, base_url="http://127.0.0.1:8080/v1")
    for _ in range(3):
        o = qengine.record_failure(P, M, K, **kw)  # type: ignore[arg-type]
        assert o.kind == kind
        assert bench(o) == (5_000, "heuristic")


def test_local_endpoint_other_and_empty_completion(qengine: q.QuotaEngine) -> None:
    qengine.register_key(K, P, base_url="http://localhost:11434")
    assert qengine.record_failure(P, M, K, status=400).cooldown is None
    assert qengine.record_failure(P, M, K, kind="empty_completion").cooldown is None
    assert qengine.record_failure(P, M, K, kind="empty_completion").cooldown is None
    o = qengine.record_failure(P, M, K, kind="empty_completion")
    assert bench(o) == (5_000, "heuristic")


# --------------------------------------------------------------------------- Retry-After


def http_date(ms: int) -> str:
    return email.utils.formatdate(ms / 1000, usegmt=True)


@pytest.mark.parametrize(
    ("retry_after", "expected_ms"),
    [
        ("300", 300_000),
        (300, 300_000),
        (150.5, 150_500),
        ("150.5", 150_500),
        (http_date(NOON + 10 * MINUTE), 10 * MINUTE),
        ("999999999", DAY),
    ],
)
def test_retry_after_forms_on_429(qengine: q.QuotaEngine, retry_after: str | int | float, expected_ms: int) -> None:
    o = qengine.record_failure(P, M, K, status=429, retry_after=retry_after)
    assert bench(o) == (expected_ms, "authoritative")
    assert stored(qengine) == (NOON + expected_ms, "authoritative")


def test_short_retry_after_does_not_shorten_a_repeated_bench(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    # SPEC 15.2: believed on the route's first transient bench, never on a repeat.
    o = qengine.record_failure(P, M, K, status=429, retry_after="5", limits={"rpd": 1000})
    assert bench(o) == (5 * SECOND, "authoritative")
    qclock.advance(6 * SECOND)
    o = qengine.record_failure(P, M, K, status=429, retry_after="5", limits={"rpd": 1000})
    assert bench(o) == (90 * SECOND, "heuristic")


def test_unparsable_retry_after_falls_back_to_stated_delay(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(
        P, M, K, status=429, retry_after="soon", message="Rate limit reached. Please try again in 150s."
    )
    assert bench(o) == (150 * SECOND, "authoritative")
    o = qengine.record_failure(P, M, K + 1, status=429, retry_after="soon", message="Please try again in 7.66s")
    assert bench(o) == (7_660, "authoritative")


def test_missing_retry_after_uses_stated_delay(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, status=429, message="Too many requests, try again in 2m30s")
    assert bench(o) == (150 * SECOND, "authoritative")


def test_parsable_retry_after_wins_over_stated_delay(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, status=429, retry_after="120", message="Please try again in 300s")
    assert bench(o) == (120 * SECOND, "authoritative")


def test_retry_after_on_server_error(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, status=503, retry_after="120")
    assert (o.kind, bench(o)) == ("server_error", (120 * SECOND, "authoritative"))


def test_retry_after_ignored_by_other_kind(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, status=400, retry_after="120")
    assert (o.kind, o.cooldown) == ("other", None)
    assert qengine.cooldown(P, M, K) is None


def test_bad_retry_after_float_is_value_error(qengine: q.QuotaEngine) -> None:
    with pytest.raises(ValueError):
        qengine.record_failure(P, M, K, status=429, retry_after=float("nan"))


# --------------------------------------------------------------------------- never shorten


def test_longer_active_cooldown_stands_and_is_reported(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    qengine.set_cooldown(P, M, K, HOUR, "tier")
    qclock.advance(10 * MINUTE)
    o = qengine.record_failure(P, M, K, status=429)
    assert o.kind == "rate_limit"
    assert bench(o) == (50 * MINUTE, "tier")
    assert stored(qengine) == (NOON + HOUR, "tier")


def test_equal_expiry_active_cooldown_stands(qengine: q.QuotaEngine) -> None:
    qengine.set_cooldown(P, M, K, 90 * SECOND, "authoritative")
    o = qengine.record_failure(P, M, K, status=429)
    assert bench(o) == (90 * SECOND, "authoritative")
    assert stored(qengine) == (NOON + 90 * SECOND, "authoritative")


def test_shorter_active_cooldown_is_replaced(qengine: q.QuotaEngine) -> None:
    qengine.set_cooldown(P, M, K, 10 * SECOND, "heuristic")
    o = qengine.record_failure(P, M, K, status=402)
    assert bench(o) == (DAY, "credit")
    assert stored(qengine) == (NOON + DAY, "credit")


def test_daily_quota_does_not_shorten_credit(qengine: q.QuotaEngine) -> None:
    qengine.record_failure(P, M, K, status=402)
    o = qengine.record_failure(P, M, K, status=429, message=CLOUDFLARE_NEURONS)
    assert o.kind == "daily_quota"
    assert bench(o) == (DAY, "credit")
    assert stored(qengine) == (NOON + DAY, "credit")


def test_operator_set_cooldown_overwrites_failure_bench(qengine: q.QuotaEngine) -> None:
    qengine.record_failure(P, M, K, status=402)
    qengine.set_cooldown(P, M, K, MINUTE, "heuristic")
    assert stored(qengine) == (NOON + MINUTE, "heuristic")


# --------------------------------------------------------------------------- no usage


def test_failure_records_no_usage(qengine: q.QuotaEngine) -> None:
    qengine.set_model_limits(P, M, rpm=10, rpd=100, tpm=1000, tpd=10000)
    before = qengine.usage(P, M, K)
    for kw in (
        {"status": 429},
        {"status": 402},
        {"status": 401},
        {"status": 400},
        {"kind": "empty_completion"},
        {"status": 413, "message": groq_413(6000)},
    ):
        qengine.record_failure(P, M, K, **kw)  # type: ignore[arg-type]
    after = qengine.usage(P, M, K)
    assert after["rpm"]["used"] == before["rpm"]["used"] == 0
    assert after["rpd"]["used"] == 0
    assert after["tpm"]["used"] == 0
    assert after["tpd"]["used"] == 0
    assert after["in_flight"] == 0
    assert qengine.usage_events() == []


# --------------------------------------------------------------------------- learning


def test_groq_413_learns_tpm_and_creates_model_row(qengine: q.QuotaEngine) -> None:
    assert qengine.model_limits(P, M) is None
    o = qengine.record_failure(P, M, K, status=413, message=groq_413(6000))
    assert o.kind == "other"
    assert o.cooldown is None
    assert o.learned is not None
    assert (o.learned.kind, o.learned.limit) == ("tpm", 6000)
    lim = qengine.model_limits(P, M)
    assert lim is not None
    assert (lim.rpm, lim.rpd, lim.tpm, lim.tpd) == (None, None, 6000, None)


def test_learning_only_tightens(qengine: q.QuotaEngine) -> None:
    qengine.record_failure(P, M, K, status=413, message=groq_413(6000))
    o = qengine.record_failure(P, M, K, status=413, message=groq_413(9000))
    assert o.learned is None
    assert qengine.model_limits(P, M).tpm == 6000  # type: ignore[union-attr]
    o = qengine.record_failure(P, M, K, status=413, message=groq_413(6000))
    assert o.learned is None  # same value changes nothing
    o = qengine.record_failure(P, M, K, status=413, message=groq_413(5000))
    assert o.learned is not None and (o.learned.kind, o.learned.limit) == ("tpm", 5000)
    assert qengine.model_limits(P, M).tpm == 5000  # type: ignore[union-attr]


def test_learning_keeps_other_stored_limits(qengine: q.QuotaEngine) -> None:
    qengine.set_model_limits(P, M, rpm=30, rpd=14400, tpm=20000, tpd=500000)
    o = qengine.record_failure(P, M, K, status=413, message=groq_413(6000))
    assert o.learned is not None and o.learned.limit == 6000
    lim = qengine.model_limits(P, M)
    assert lim is not None
    assert (lim.rpm, lim.rpd, lim.tpm, lim.tpd) == (30, 14400, 6000, 500000)


def test_learning_never_raises_a_stored_limit(qengine: q.QuotaEngine) -> None:
    qengine.set_model_limits(P, M, tpm=1000)
    assert qengine.learn_limit_from_error(P, M, groq_413(6000)) is None
    assert qengine.model_limits(P, M).tpm == 1000  # type: ignore[union-attr]


def test_auth_never_learns(qengine: q.QuotaEngine) -> None:
    o = qengine.record_failure(P, M, K, status=401, message=groq_413(6000))
    assert o.kind == "auth"
    assert o.learned is None
    assert qengine.model_limits(P, M) is None
    o = qengine.record_failure(P, M, K, kind="auth", message=groq_413(6000))
    assert o.learned is None
    assert qengine.model_limits(P, M) is None


@pytest.mark.parametrize(
    ("kw", "kind"),
    [
        ({"status": 429}, "rate_limit"),
        ({"status": 402}, "payment"),
        ({"status": 403}, "forbidden"),
        ({"status": 503}, "server_error"),
        ({"kind": "empty_completion"}, "empty_completion"),
    ],
)
def test_other_kinds_learn(qengine: q.QuotaEngine, kw: dict[str, object], kind: str) -> None:
    o = qengine.record_failure(P, M, K, message=groq_413(6000), **kw)  # type: ignore[arg-type]
    assert o.kind == kind
    assert o.learned is not None and (o.learned.kind, o.learned.limit) == ("tpm", 6000)


def test_learn_limit_from_error_returns_only_changes(qengine: q.QuotaEngine) -> None:
    got = qengine.learn_limit_from_error(P, M, groq_413(6000))
    assert got is not None and (got.kind, got.limit) == ("tpm", 6000)
    assert qengine.learn_limit_from_error(P, M, groq_413(6000)) is None
    assert qengine.learn_limit_from_error(P, M, groq_413(7000)) is None
    got = qengine.learn_limit_from_error(P, M, groq_413(100))
    assert got is not None and got.limit == 100
    assert qengine.learn_limit_from_error(P, M, "no limit stated here") is None
    assert qengine.learn_limit_from_error(P, M, "Limit 50") is None  # no axis
    assert qengine.model_limits(P, M).tpm == 100  # type: ignore[union-attr]


def test_learned_limit_is_per_model_and_shared(store: str, qclock: q.ManualClock) -> None:
    a = q.QuotaEngine(store, clock=qclock, env={})
    b = q.QuotaEngine(store, clock=qclock, env={})
    try:
        a.learn_limit_from_error(P, M, groq_413(6000))
        assert b.model_limits(P, M).tpm == 6000  # type: ignore[union-attr]
        assert b.model_limits(P, "other") is None
        assert b.learn_limit_from_error(P, M, groq_413(8000)) is None
    finally:
        a.close()
        b.close()


def test_learned_limit_is_enforced(qengine: q.QuotaEngine) -> None:
    qengine.learn_limit_from_error(P, M, groq_413(6000))
    assert qengine.can_use_tokens(P, M, K, 6000)
    assert not qengine.can_use_tokens(P, M, K, 6001)


# --------------------------------------------------------------------------- Lease.failure


def test_lease_failure_records_and_releases(qengine: q.QuotaEngine) -> None:
    lease = qengine.lease(P, M, K, estimated_tokens=100)
    assert qengine.usage(P, M, K)["in_flight"] == 1
    o = lease.failure(status=429, retry_after="120")
    assert o is not None
    assert o.kind == "rate_limit"
    assert bench(o) == (120 * SECOND, "authoritative")
    u = qengine.usage(P, M, K)
    assert u["in_flight"] == 0
    assert u["rpm"]["used"] == 0 and u["tpm"]["used"] == 0
    assert stored(qengine) == (NOON + 120 * SECOND, "authoritative")
    adm = qengine.check(P, M, K)
    assert (adm.allowed, adm.reason) == (False, "cooldown")


def test_lease_failure_message_and_kind(qengine: q.QuotaEngine) -> None:
    o = qengine.lease(P, M, K).failure(status=413, message=groq_413(6000))
    assert o is not None and o.kind == "other" and o.cooldown is None
    assert o.learned is not None and o.learned.limit == 6000
    o = qengine.lease(P, M, K).failure(kind="payment")
    assert o is not None and bench(o) == (DAY, "credit")


def test_lease_failure_in_context_manager_records_no_success(qengine: q.QuotaEngine) -> None:
    with qengine.lease(P, M, K, estimated_tokens=50) as lease:
        o = lease.failure(status=502)
    assert o is not None and o.kind == "server_error"
    u = qengine.usage(P, M, K)
    assert u["in_flight"] == 0
    assert u["rpd"]["used"] == 0 and u["tpd"]["used"] == 0


def test_lease_failure_empty_completion_streak(qengine: q.QuotaEngine) -> None:
    outs = [qengine.lease(P, M, K).failure(kind="empty_completion") for _ in range(3)]
    assert [o.cooldown is None for o in outs] == [True, True, False]  # type: ignore[union-attr]
    assert qengine.usage(P, M, K)["in_flight"] == 0


def test_lease_failure_unknown_kind_is_value_error(qengine: q.QuotaEngine) -> None:
    lease = qengine.lease(P, M, K)
    with pytest.raises(ValueError):
        lease.failure(kind="nope")
    assert qengine.cooldown(P, M, K) is None
    lease.release()
    assert qengine.usage(P, M, K)["in_flight"] == 0


def test_expired_cooldown_does_not_stand(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    qengine.set_cooldown(P, M, K, HOUR, "tier")
    qclock.advance(HOUR)  # expired exactly now
    o = qengine.record_failure(P, M, K, status=429)
    assert bench(o) == (90 * SECOND, "heuristic")
    assert stored(qengine) == (NOON + HOUR + 90 * SECOND, "heuristic")


def test_daily_quota_at_exact_midnight_benches_a_full_day(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    qclock.set(MIDNIGHT + DAY)
    o = qengine.record_failure(P, M, K, status=429, message=CLOUDFLARE_NEURONS)
    assert bench(o) == (DAY, "authoritative")
    qclock.set(MIDNIGHT + DAY - 1)
    o = qengine.record_failure(P, M, K + 1, status=429, message=CLOUDFLARE_NEURONS)
    assert bench(o) == (1, "authoritative")


def test_google_quota_ids_and_quota_value_teach_limits(qengine: q.QuotaEngine) -> None:
    """SPEC §15.3: the CamelCase quota id names the axis, `quotaValue` (or `limit: N`) the number."""
    daily = q.parse_provider_limit(GEMINI_DAILY)
    assert daily is not None and (daily.kind, daily.limit) == ("rpd", 200)
    minute = q.parse_provider_limit(GEMINI_MINUTE)
    assert minute is not None and (minute.kind, minute.limit) == ("rpm", 200)
    tokens = q.parse_provider_limit(gemini_body("GenerateContentInputTokensPerModelPerMinute-FreeTier", "9s"))
    assert tokens is not None and (tokens.kind, tokens.limit) == ("tpm", 200)
    learned = qengine.learn_limit_from_error(P, M, GEMINI_DAILY)
    assert learned is not None and (learned.kind, learned.limit) == ("rpd", 200)
    limits = qengine.model_limits(P, M)
    assert limits is not None and limits.rpd == 200
    # a failure records it too, and never loosens what is known
    o = qengine.record_failure(P, M, K, status=429, message=GEMINI_MINUTE)
    assert o.learned is not None and (o.learned.kind, o.learned.limit) == ("rpm", 200)
    assert qengine.learn_limit_from_error(P, M, GEMINI_MINUTE.replace('"200"', '"500"')) is None
    assert qengine.model_limits(P, M).rpm == 200  # type: ignore[union-attr]


def test_a_daily_quota_with_a_short_stated_delay_takes_the_ladder(
    qengine: q.QuotaEngine, qclock: q.ManualClock
) -> None:
    """SPEC §15.1: Gemini answers a spent daily quota with retryDelay "17s"; honouring it
    would retry the route all day. The route climbs its ladder instead (2 min, 10 min, 1 h,
    never past the platform's next day start); a delay longer than the step wins."""
    short = gemini_body("GenerateRequestsPerDayPerProjectPerModel-FreeTier", "17s")
    until_midnight_pacific = qengine.next_day_start_ms("google") - qclock.now_ms()
    assert until_midnight_pacific < 24 * HOUR
    steps = []
    for _ in range(4):
        o = qengine.record_failure("google", M, K, status=429, message=short)
        assert o.kind == "daily_quota"
        steps.append(bench(o))
    # the fourth step (24 h) stops at the next Pacific midnight
    assert steps == [
        (2 * MINUTE, "heuristic"),
        (10 * MINUTE, "heuristic"),
        (HOUR, "heuristic"),
        (until_midnight_pacific, "heuristic"),
    ]
    # no stated delay: until the next day start, authoritative (as before)
    o = qengine.record_failure("google", M, K + 1, status=429, message=GEMINI_DAILY)
    assert bench(o) == (until_midnight_pacific, "authoritative")
    # a delay reaching the next day start or beyond: min(delay, 24 h), authoritative
    o = qengine.record_failure("google", M, K + 2, status=429, message=short, retry_after=str(23 * 3600))
    assert bench(o) == (23 * HOUR, "authoritative")
    o = qengine.record_failure("google", M, K + 4, status=429, message=short, retry_after=str(30 * 3600))
    assert bench(o) == (24 * HOUR, "authoritative")
    # a delay longer than the step: the delay, authoritative (and the step still counts)
    o = qengine.record_failure("google", M, K + 3, status=429, message=short, retry_after="300")
    assert bench(o) == (5 * MINUTE, "authoritative")
    o = qengine.record_failure("google", M, K + 3, status=429, message=short)
    assert bench(o) == (10 * MINUTE, "heuristic")
