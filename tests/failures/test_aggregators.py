"""SPEC 21: an aggregator's upstream congested for one model on every key (21.1), and
provider caps learned from a pool's 429s (21.2), on both backends, with OpenRouter's
real bodies; through record_failure and Lease.observe."""

from __future__ import annotations

import json

import pytest
import quotaengine as q
from moments import MINUTE, NOON, SECOND
from provider_bodies import (
    OPENROUTER_402,
    OPENROUTER_PER_DAY_UPSELL,
    OPENROUTER_UPSTREAM,
    OPENROUTER_UPSTREAM_LITELLM,
    openrouter_pool_body,
)
from subprocesses import finish, spawn

MIDNIGHT = NOON + 12 * 3_600_000  # OpenRouter's day ends at 00:00 UTC
P, M, M2 = "openrouter", "google/gemini-2.0-flash-exp:free", "meta-llama/llama-3.3-70b-instruct:free"
M3, PAID = "deepseek/deepseek-chat-v3-0324:free", "anthropic/claude-sonnet-4"


@pytest.fixture
def qengine(qengine: q.QuotaEngine) -> q.QuotaEngine:
    """The area's engine, with three keys of OpenRouter's."""
    for k in (1, 2, 3):
        qengine.register_key(k, P)
    return qengine


def bench(o: q.FailureOutcome) -> tuple[int, str] | None:
    return None if o.cooldown is None else (o.cooldown.duration_ms, o.cooldown.source)


def upstream(e: q.QuotaEngine, key: int = 1, model: str = M, **kw: object) -> q.FailureOutcome:
    return e.record_failure(P, model, key, status=429, message=OPENROUTER_UPSTREAM, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------ 21.1 classification


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (429, OPENROUTER_UPSTREAM, "upstream"),
        (429, OPENROUTER_UPSTREAM_LITELLM, "upstream"),
        (503, "Model is temporarily overloaded upstream, please retry", "upstream"),
        # The metadata naming the upstream is enough.
        (429, '{"error":{"message":"Provider returned error","metadata":{"provider_name":"Chutes"}}}', "upstream"),
        # Other wordings keep their kinds.
        (503, "upstream overloaded, try again in 5 minutes", "server_error"),
        (None, "google/gemini is temporarily rate-limited upstream", "rate_limit"),
        (500, OPENROUTER_UPSTREAM, "rate_limit"),  # not a 429 or 503: its "rate-limited" row
        # Checked after payment, forbidden and auth ...
        (402, OPENROUTER_402, "payment"),
        (401, OPENROUTER_UPSTREAM, "auth"),
        (403, OPENROUTER_UPSTREAM, "forbidden"),
        # ... and before daily_quota, concurrency and rate_limit.
        (429, OPENROUTER_UPSTREAM.replace("rate-limited", "daily quota used up, rate-limited"), "upstream"),
        (429, '{"error":{"message":"too many concurrent requests","metadata":{"provider_name":"Chutes"}}}', "upstream"),
    ],
)
def test_upstream_kind_is_inferred_in_its_place(
    qengine: q.QuotaEngine, status: int | None, message: str, kind: str
) -> None:
    assert qengine.record_failure(P, M, 1, status=status, message=message).kind == kind


# ------------------------------------------------------------------ 21.1 the model-wide bench


def test_upstream_benches_the_model_on_every_key_not_the_key(qengine: q.QuotaEngine) -> None:
    o = upstream(qengine)
    assert o.kind == "upstream"
    assert bench(o) == (60_000, "upstream")
    for key in (1, 2, 3, 99):  # 99: a key this engine never saw on the model
        cd = qengine.cooldown(P, M, key)
        assert cd is not None
        assert (cd.platform, cd.model_id, cd.key_id, cd.source) == (P, M, None, "upstream")
        assert (cd.expires_at_ms, cd.set_at_ms, cd.remaining_ms) == (NOON + MINUTE, NOON, MINUTE)
        assert qengine.is_on_cooldown(P, M, key)
        assert qengine.check(P, M, key).reason == "cooldown"
        with pytest.raises(q.QuotaExceeded) as err:
            qengine.lease(P, M, key)
        assert err.value.reason == "cooldown" and err.value.retry_at_ms == NOON + MINUTE
    # lease_any refuses every key of the platform on the model, and picks another model.
    with pytest.raises(q.QuotaExceeded):
        qengine.lease_any([(P, M, 1), (P, M, 2)])
    with qengine.lease_any([(P, M, 1), (P, M2, 2)]) as lease:
        assert (lease.model_id, lease.key_id) == (M2, 2)
    # The key's other models stay open; no cooldown of its own.
    assert qengine.cooldown(P, M2, 1) is None and qengine.check(P, M2, 1).allowed
    listed = qengine.active_cooldowns()
    assert [(c.model_id, c.key_id, c.source) for c in listed] == [(M, None, "upstream")]
    assert "key_id=None" in repr(listed[0])
    # Filtered by a key, the model's bench is listed: it blocks that key (issue 35, item 7).
    assert [(c.model_id, c.key_id) for c in qengine.active_cooldowns([1])] == [(M, None)]
    # Never probed.
    assert qengine.probeable_cooldowns() == []


def test_the_bench_doubles_within_ten_minutes_up_to_five(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    benches = []
    for key in (1, 2, 3, 1, 2):
        o = upstream(qengine, key)
        benches.append(bench(o))
        qclock.advance(o.cooldown.duration_ms if o.cooldown else 0)
    assert benches == [(60_000, "upstream"), (120_000, "upstream"), (240_000, "upstream")] + [(300_000, "upstream")] * 2
    # More than 10 min after the last: 60 s again.
    qclock.advance(10 * MINUTE + 1)
    assert bench(upstream(qengine, 3)) == (60_000, "upstream")
    # Another model has a chain of its own.
    assert bench(upstream(qengine, 1, M2)) == (60_000, "upstream")


def test_a_stated_retry_after_is_the_bench_and_a_shorter_one_never_shortens(
    qengine: q.QuotaEngine, qclock: q.ManualClock
) -> None:
    assert bench(upstream(qengine, retry_after="200")) == (200_000, "upstream")
    qclock.advance(10 * SECOND)
    # 120 s (the second in the chain) ends before the 190 s left: that bench stands.
    assert bench(upstream(qengine, 2)) == (190_000, "upstream")
    cd = qengine.cooldown(P, M, 3)
    assert cd is not None and cd.expires_at_ms == NOON + 200_000


def test_cooldown_reports_whichever_ends_later(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    qengine.set_cooldown(P, M, 1, 10 * MINUTE, "heuristic")
    upstream(qengine, 2)
    own = qengine.cooldown(P, M, 1)
    assert own is not None and (own.key_id, own.source, own.expires_at_ms) == (1, "heuristic", NOON + 10 * MINUTE)
    wide = qengine.cooldown(P, M, 2)
    assert wide is not None and (wide.key_id, wide.source) == (None, "upstream")
    # Both listed, soonest first.
    assert [(c.key_id, c.source) for c in qengine.active_cooldowns()] == [(None, "upstream"), (1, "heuristic")]
    qclock.advance(MINUTE)
    assert qengine.cooldown(P, M, 2) is None
    assert qengine.check(P, M, 2).allowed
    # The operator's source list has no "upstream".
    with pytest.raises(ValueError, match="upstream"):
        qengine.set_cooldown(P, M, 1, 1_000, "upstream")  # type: ignore[arg-type]


def test_the_keys_ladder_is_untouched(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    for _ in range(3):
        o = upstream(qengine, 1)
        qclock.advance(o.cooldown.duration_ms if o.cooldown else 0)
    # The route's first rate-limit failure with its daily limit spent takes the
    # ladder's first step (2 min): no step was counted by the upstream failures.
    qengine.record_request(P, M, 1)
    o = qengine.record_failure(P, M, 1, status=429, message="Rate limit exceeded", limits={"rpd": 1})
    assert bench(o) == (120_000, "heuristic")


def test_the_model_bench_is_shared_and_persisted(store: str, qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    upstream(qengine)
    upstream(qengine, 2)  # second in the chain: 120 s
    with q.QuotaEngine(store, clock=qclock, env={}) as other:
        cd = other.cooldown(P, M, 3)
        assert cd is not None and (cd.key_id, cd.source, cd.expires_at_ms) == (None, "upstream", NOON + 120_000)
        assert other.check(P, M, 1).reason == "cooldown"
        # The chain continues in another engine.
        qclock.advance(120_000)
        assert bench(other.record_failure(P, M, 2, status=429, message=OPENROUTER_UPSTREAM)) == (240_000, "upstream")
    assert qengine.cooldown(P, M, 1) is not None
    qclock.advance(240_000)
    assert qengine.cleanup_expired_cooldowns() == 1
    assert qengine.active_cooldowns() == []


# ------------------------------------------------------------------ 21.2 learned provider caps


def day_body(limit: int = 50) -> str:
    return openrouter_pool_body("free-models-per-day", limit, MIDNIGHT, OPENROUTER_PER_DAY_UPSELL)


def test_a_pool_429_teaches_the_account_its_cap_and_reset(qengine: q.QuotaEngine) -> None:
    none = qengine.learned_provider_caps(P, 1)
    assert (none.daily_requests, none.minute_requests, none.daily_tokens) == (None, None, None)
    o = qengine.record_failure(P, M, 1, status=429, message=day_body())
    assert o.kind == "daily_quota"
    # X-RateLimit-Reset is the authoritative retry time.
    assert bench(o) == (MIDNIGHT - NOON, "authoritative")
    learned = qengine.learned_provider_caps(P, 1)
    assert (learned.daily_requests, learned.minute_requests, learned.daily_tokens) == (50, None, None)
    # SPEC 24.6: the free pool is spent until the reset, whatever was counted.
    assert qengine.check(P, M2, 1).reason == "provider_daily_requests"
    # The platform's cap is unchanged; the gate uses the lower one (on every model of
    # the account: a paid one's route does not pass through the spent free pool).
    assert qengine.provider_caps(P).daily_requests == 1000
    for _ in range(49):
        qengine.record_request(P, PAID, 1)
    assert qengine.can_use_provider(P, 1) and qengine.check(P, PAID, 1).allowed
    qengine.record_request(P, PAID, 1)
    assert not qengine.can_use_provider(P, 1)
    with pytest.raises(q.QuotaExceeded) as err:
        qengine.lease(P, PAID, 1)
    assert err.value.reason == "provider_daily_requests"
    # Another key, its own account: untouched.
    assert qengine.learned_provider_caps(P, 2).daily_requests is None
    assert qengine.check(P, M2, 2).allowed


def test_the_minute_pool_in_seconds_and_only_lowered(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    reset_s = (NOON + 40 * SECOND) // 1000  # seconds: below 10^11
    o = qengine.record_failure(P, M, 1, status=429, message=openrouter_pool_body("free-models-per-min", 20, reset_s))
    assert o.kind == "rate_limit"
    assert bench(o) == (40_000, "authoritative")
    assert qengine.learned_provider_caps(P, 1).minute_requests == 20
    qclock.advance(MINUTE)
    qengine.record_failure(P, M2, 1, status=429, message=openrouter_pool_body("free-models-per-min", 50, NOON))
    assert qengine.learned_provider_caps(P, 1).minute_requests == 20
    qengine.record_failure(P, M2, 1, status=429, message=openrouter_pool_body("free-models-per-min", 16, NOON))
    assert qengine.learned_provider_caps(P, 1).minute_requests == 16
    for _ in range(16):
        qengine.record_request(P, M2, 1)
    assert not qengine.can_use_provider_minute(P, 1)


def test_set_provider_caps_wins_over_a_learned_cap(qengine: q.QuotaEngine) -> None:
    qengine.record_failure(P, M, 1, status=429, message=openrouter_pool_body("free-models-per-min", 5, NOON))
    for _ in range(5):
        qengine.record_request(P, M2, 1)
    assert not qengine.can_use_provider_minute(P, 1)
    qengine.set_provider_caps(P, minute_requests=100)
    assert qengine.can_use_provider_minute(P, 1)
    qengine.set_provider_caps(P, minute_requests=None)  # no cap, said by the operator
    assert qengine.can_use_provider_minute(P, 1)
    qengine.reset_provider_caps(P)
    assert not qengine.can_use_provider_minute(P, 1)
    # The learned cap is reported whatever the operator set.
    assert qengine.learned_provider_caps(P, 1).minute_requests == 5


def test_a_learned_cap_is_the_accounts_and_shared(store: str, qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    qengine.register_key(4, P, account="team")
    qengine.register_key(5, P, account="team")
    qengine.record_failure(P, M, 4, status=429, message=day_body(50))
    assert qengine.learned_provider_caps(P, 5).daily_requests == 50
    assert qengine.learned_provider_caps(P, 1).daily_requests is None
    with q.QuotaEngine(store, clock=qclock, env={}) as other:
        assert other.learned_provider_caps(P, 4).daily_requests == 50
        for _ in range(50):
            other.record_request(P, M2, 5)
        assert not other.can_use_provider(P, 4)
    assert not qengine.can_use_provider(P, 5)


# ------------------------------------------------------------------ 24.6 a pool 429 spends the pool

SIX_HOURS = 6 * 3_600_000

CHECK_SCRIPT = """
import sys
import quotaengine as q
store, now = sys.argv[1], int(sys.argv[2])
with q.QuotaEngine(store, clock=q.ManualClock(now), env={}) as e:
    for route in sys.argv[3:]:
        model, key = route.rsplit("@", 1)
        a = e.check("openrouter", model, int(key))
        print(a.reason, a.retry_at_ms, flush=True)
"""


def refused(e: q.QuotaEngine, model: str, key: int) -> tuple[str | None, int | None]:
    a = e.check(P, model, key)
    return (a.reason, a.retry_at_ms)


def in_another_process(store: str, now: int, *routes: tuple[str, int]) -> list[tuple[str, int | None]]:
    with spawn(CHECK_SCRIPT, store, str(now), *(f"{m}@{k}" for m, k in routes)) as proc:
        lines = finish(proc).splitlines()
    return [(r, None if t == "None" else int(t)) for r, t in (line.split() for line in lines)]


def test_a_day_pool_429_refuses_every_free_route_of_the_account_until_its_reset(
    store: str, qengine: q.QuotaEngine, qclock: q.ManualClock
) -> None:
    """Acceptance finding 5: a `free-models-per-day` 429 stating limit 50, remaining 0
    and a reset 6 h away, while the engine had counted 3."""
    reset = NOON + SIX_HOURS
    for k in (4, 5):
        qengine.register_key(k, P, account="team")
    for model in (M, M2, M3):
        qengine.lease(P, model, 4).success()
    o = qengine.record_failure(P, M, 4, status=429, message=openrouter_pool_body("free-models-per-day", 50, reset))
    assert bench(o) == (SIX_HOURS, "authoritative")
    spent = ("provider_daily_requests", reset)
    # Every free route of the account, on every key of it, through the pool's gate.
    for model in (M2, M3):
        for k in (4, 5):
            assert refused(qengine, model, k) == spent
    with pytest.raises(q.QuotaExceeded) as err:
        qengine.lease(P, M3, 5)
    assert (err.value.reason, err.value.retry_at_ms, err.value.key_id) == (*spent, 5)
    with pytest.raises(q.QuotaExceeded):
        qengine.lease_any([(P, M2, 4), (P, M3, 5)])
    # Another account, and a paid model (the account's other pool): untouched.
    assert qengine.check(P, M2, 1).allowed
    assert qengine.check(P, PAID, 5).allowed
    # Another engine and another process on the store see the pool spent.
    qclock.advance(MINUTE)
    with q.QuotaEngine(store, clock=qclock, env={}) as other:
        assert refused(other, M3, 5) == spent
        assert other.check(P, PAID, 4).allowed
    assert in_another_process(store, NOON + MINUTE, (M3, 5), (M2, 4), (M2, 1)) == [spent, spent, ("None", None)]
    # Until the reset, and no longer (3 counted of the 50 learned).
    qclock.set(reset - 1)
    assert refused(qengine, M2, 5) == spent
    qclock.set(reset)
    assert qengine.check(P, M2, 5).allowed
    qengine.lease(P, M3, 4).success()
    assert in_another_process(store, reset, (M3, 5)) == [("None", None)]


def test_a_minute_pool_429_refuses_the_pool_though_the_platform_has_no_minute_cap(
    store: str, qengine: q.QuotaEngine, qclock: q.ManualClock
) -> None:
    assert qengine.provider_caps(P).minute_requests is None
    reset = NOON + 40 * SECOND
    qengine.record_failure(P, M, 1, status=429, message=openrouter_pool_body("free-models-per-min", 20, reset))
    assert refused(qengine, M2, 1) == ("provider_minute_requests", reset)
    assert qengine.check(P, PAID, 1).allowed
    # What the provider said spent stays spent, whatever the operator set for the cap.
    qengine.set_provider_caps(P, minute_requests=None)
    assert refused(qengine, M3, 1) == ("provider_minute_requests", reset)
    qengine.set_provider_caps(P, minute_requests=1000)
    assert refused(qengine, M3, 1) == ("provider_minute_requests", reset)
    with q.QuotaEngine(store, clock=qclock, env={}) as other:
        assert refused(other, M3, 1) == ("provider_minute_requests", reset)
    qclock.set(reset)
    assert qengine.check(P, M2, 1).allowed


def test_a_reset_already_past_or_none_spends_nothing(qengine: q.QuotaEngine) -> None:
    qengine.record_failure(P, M, 1, status=429, message=openrouter_pool_body("free-models-per-day", 50, NOON))
    assert qengine.check(P, M2, 1).allowed
    no_reset = json.loads(openrouter_pool_body("free-models-per-day", 40, NOON))
    del no_reset["error"]["metadata"]["headers"]["X-RateLimit-Reset"]
    qengine.record_failure(P, M, 1, status=429, message=json.dumps(no_reset))
    assert qengine.check(P, M2, 1).allowed
    assert qengine.learned_provider_caps(P, 1).daily_requests == 40


def test_a_learned_pool_cap_stays_with_the_account_not_the_key(
    store: str, qengine: q.QuotaEngine, qclock: q.ManualClock
) -> None:
    for k in (4, 5):
        qengine.register_key(k, P, account="team")
    # A reset already past: the cap alone.
    qengine.record_failure(P, M, 4, status=429, message=openrouter_pool_body("free-models-per-day", 2, NOON))
    assert qengine.learned_provider_caps(P, 4).daily_requests == 2
    # Key 4 moves to an account of its own, key 6 joins the team.
    qengine.register_key(4, P, account="solo")
    qengine.register_key(6, P, account="team")
    qengine.record_request(P, M2, 4)
    qengine.record_request(P, M2, 4)
    with q.QuotaEngine(store, clock=qclock, env={}) as other:
        for e in (qengine, other):
            assert e.learned_provider_caps(P, 4).daily_requests is None
            assert e.check(P, M2, 4).allowed  # 2 counted on "solo", which learned nothing
            for k in (5, 6):
                assert e.learned_provider_caps(P, k).daily_requests == 2
    qengine.record_request(P, M2, 5)
    qengine.record_request(P, M2, 6)
    assert in_another_process(store, NOON, (M2, 4), (M3, 6)) == [("None", None), ("provider_daily_requests", MIDNIGHT)]
    # What key 4 learns now is its new account's.
    qengine.record_failure(P, M, 4, status=429, message=openrouter_pool_body("free-models-per-day", 30, NOON))
    assert qengine.learned_provider_caps(P, 4).daily_requests == 30
    assert qengine.learned_provider_caps(P, 5).daily_requests == 2


def test_a_spent_pool_stays_with_the_account_not_the_key(
    store: str, qengine: q.QuotaEngine, qclock: q.ManualClock
) -> None:
    for k in (4, 5):
        qengine.register_key(k, P, account="team")
    qengine.record_failure(P, M, 4, status=429, message=openrouter_pool_body("free-models-per-day", 50, MIDNIGHT))
    assert refused(qengine, M2, 4) == ("provider_daily_requests", MIDNIGHT)
    qengine.register_key(4, P, account="solo")
    qengine.register_key(6, P, account="team")
    with q.QuotaEngine(store, clock=qclock, env={}) as other:
        for e in (qengine, other):
            assert e.check(P, M2, 4).allowed
            for k in (5, 6):
                assert refused(e, M2, k) == ("provider_daily_requests", MIDNIGHT)
    assert in_another_process(store, NOON, (M2, 4), (M3, 6)) == [
        ("None", None),
        ("provider_daily_requests", MIDNIGHT),
    ]


@pytest.mark.parametrize(
    "limit",
    ["2e1", "12345678901234567890", "20.0", "-20"],  # 20 digits: never truncated to 18
    ids=["exponent", "twenty-digits", "fraction", "negative"],
)
def test_a_number_not_written_as_an_integer_teaches_nothing(qengine: q.QuotaEngine, limit: str) -> None:
    body = json.loads(openrouter_pool_body("free-models-per-day", 1, MIDNIGHT))
    body["error"]["metadata"]["headers"]["X-RateLimit-Limit"] = limit
    o = qengine.record_failure(P, M, 1, status=429, message=json.dumps(body))
    assert qengine.learned_provider_caps(P, 1).daily_requests is None
    assert bench(o) == (MIDNIGHT - NOON, "authoritative")  # the reset, a whole integer, is read


def test_a_reset_of_twenty_digits_is_no_reset(qengine: q.QuotaEngine) -> None:
    body = json.loads(openrouter_pool_body("free-models-per-day", 50, MIDNIGHT))
    body["error"]["metadata"]["headers"]["X-RateLimit-Reset"] = "17459712000000000000"
    qengine.record_failure(P, M, 1, status=429, message=json.dumps(body))
    assert qengine.learned_provider_caps(P, 1).daily_requests == 50
    assert qengine.check(P, M2, 1).allowed  # no reset read: the pool is not spent


def long_upstream(pad: int) -> str:
    body = json.loads(OPENROUTER_UPSTREAM)
    raw = body["error"]["metadata"]["raw"]
    body["error"]["metadata"]["raw"] = "<html>" + "x" * pad + "</html> " + raw
    return json.dumps(body)


def test_an_upstream_429_with_a_long_raw_answer_is_read_whole(store: str, qengine: q.QuotaEngine) -> None:
    """SPEC 24.6: the body is read as the provider wrote it (up to 1 MiB), so the
    upstream named after a long `metadata.raw` benches the model, not the key."""
    o = qengine.record_failure(P, M, 1, status=429, message=long_upstream(100_000))
    assert o.kind == "upstream" and bench(o) == (60_000, "upstream")
    cd = qengine.cooldown(P, M, 2)
    assert cd is not None and cd.key_id is None
    assert qengine.check(P, M2, 1).allowed  # the key's other models stay open

    class Response:
        status_code = 429
        headers: dict[str, str] = {}
        text = long_upstream(500_000)

    o = qengine.lease(P, M2, 3).observe(Response())
    assert o is not None and o.kind == "upstream"
    cd = qengine.cooldown(P, M2, 1)
    assert cd is not None and cd.key_id is None


def test_a_cap_or_reset_in_the_response_headers_through_observe(qengine: q.QuotaEngine) -> None:
    class Response:
        status_code = 429
        headers = {"X-RateLimit-Limit": "20", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(NOON + 30_000)}
        text = '{"error":{"message":"Rate limit exceeded: free-models-per-min. ","code":429}}'

    lease = qengine.lease(P, M, 1)
    o = lease.observe(Response())
    assert o is not None and o.kind == "rate_limit" and bench(o) == (30_000, "authoritative")
    assert lease.done
    assert qengine.learned_provider_caps(P, 1).minute_requests == 20


def test_upstream_through_observe(qengine: q.QuotaEngine) -> None:
    class Response:
        status_code = 429
        headers: dict[str, str] = {}
        text = OPENROUTER_UPSTREAM

    lease = qengine.lease(P, M, 2)
    o = lease.observe(Response())
    assert o is not None and o.kind == "upstream" and bench(o) == (60_000, "upstream")
    cd = qengine.cooldown(P, M, 1)
    assert cd is not None and cd.key_id is None


def test_bad_input_changes_nothing(qengine: q.QuotaEngine) -> None:
    with pytest.raises(TypeError):
        qengine.learned_provider_caps(P, "1")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        qengine.learned_provider_caps("", 1)
    lease = qengine.lease(P, M, 1)
    with pytest.raises(TypeError):
        lease._failure_with_headers({"a": 1}, status=429, message=OPENROUTER_UPSTREAM)  # type: ignore[dict-item]
    assert not lease.done
    assert qengine.active_cooldowns() == []
    lease.release()


@pytest.mark.sqlite_only
def test_a_version_8_file_migrates_and_keeps_its_cooldowns(db_path: object, qclock: q.ManualClock) -> None:
    """Version 9 rebuilds the cooldown table (a NULL key, the "upstream" source) and
    failure_history (three more kinds): what a version-8 file held stands."""
    import sqlite3

    from old_schemas import downgrade_schema

    with q.QuotaEngine(db_path, clock=qclock, env={}) as e:  # type: ignore[arg-type]
        e.set_cooldown(P, M2, 1, 10 * MINUTE, "tier")
        e.record_request(P, M, 1)
        e.record_failure(P, M, 1, status=429, limits={"rpd": 1})  # a ladder step
    con = sqlite3.connect(db_path)  # type: ignore[call-overload]
    with con:
        downgrade_schema(con, 8)
    con.close()
    with q.QuotaEngine(db_path, clock=qclock, env={}) as e:  # type: ignore[arg-type]
        own = e.cooldown(P, M2, 1)
        assert own is not None and (own.key_id, own.source) == (1, "tier")
        upstream(e, 2, M2)
        e.record_failure(P, M, 3, status=429, message=day_body())
        assert e.learned_provider_caps(P, 3).daily_requests == 50
    con = sqlite3.connect(db_path)  # type: ignore[call-overload]
    try:
        assert con.execute("PRAGMA user_version").fetchone()[0] == 13
        rows = set(con.execute("SELECT model_id, key_id, source FROM rate_limit_cooldowns"))
        assert (M2, None, "upstream") in rows and (M2, 1, "tier") in rows
        kinds = {k for (k,) in con.execute("SELECT kind FROM failure_history")}
        assert {"ladder", "upstream", "pool_day"} <= kinds
    finally:
        con.close()


@pytest.mark.sqlite_only
def test_the_cli_and_the_cooldowns_frame_show_a_model_wide_bench(db_path: object) -> None:
    import subprocess
    import sys
    import time

    qclock = q.ManualClock(int(time.time() * 1000))  # the CLI reads the system clock

    pd = pytest.importorskip("pandas")
    from quotaengine import analysis

    with q.QuotaEngine(db_path, clock=qclock, env={}) as e:  # type: ignore[arg-type]
        e.set_cooldown(P, M2, 1, 10 * MINUTE, "tier")
        upstream(e, 2)
        qclock.advance(1)
    df = analysis.cooldowns_frame(q.QuotaEngine(db_path, clock=qclock, env={}))  # type: ignore[arg-type]
    assert df.key_id.dtype == "Int64"
    pytest.importorskip("matplotlib")
    fig = analysis.plot_cooldowns(db_path)  # type: ignore[arg-type]
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == [f"{P} / {M} / every key", f"{P} / {M2} / key 1"]
    assert [
        (m, None if pd.isna(k) else int(k), s) for m, k, s in zip(df.model_id, df.key_id, df.source, strict=True)
    ] == [
        (M, None, "upstream"),
        (M2, 1, "tier"),
    ]
    out = subprocess.run(
        [sys.executable, "-m", "quotaengine", "cooldowns", "--db", str(db_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert f"{P}/{M}/*  upstream" in out.stdout and f"{P}/{M2}/1  tier" in out.stdout
