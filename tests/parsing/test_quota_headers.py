"""Observed provider quota (SPEC §8.2): record_quota_headers on real header sets, every reset format, the
429/402 error-body observation, quota_state merging and replenishment, key_quota_headroom and its cache."""

from __future__ import annotations

import sqlite3
import types
from pathlib import Path

import pytest
import quotaengine as q
from moments import HOUR, SECOND, T0

NOW = T0 + 10 * HOUR  # 2026-01-01 10:00:00.000 UTC = 1_767_261_600_000


# Header sets as the providers document them.
OPENAI = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-limit-tokens": "150000",
    "x-ratelimit-remaining-requests": "59",
    "x-ratelimit-remaining-tokens": "149984",
    "x-ratelimit-reset-requests": "1s",
    "x-ratelimit-reset-tokens": "6m0s",
}
GROQ_429 = {
    "retry-after": "2",
    "x-ratelimit-limit-requests": "14400",
    "x-ratelimit-limit-tokens": "18000",
    "x-ratelimit-remaining-requests": "14370",
    "x-ratelimit-remaining-tokens": "17997",
    "x-ratelimit-reset-requests": "2m59.56s",
    "x-ratelimit-reset-tokens": "7.66s",
}
CEREBRAS = {
    "x-ratelimit-limit-requests-day": "14400",
    "x-ratelimit-limit-tokens-minute": "60000",
    "x-ratelimit-remaining-requests-day": "14398",
    "x-ratelimit-remaining-tokens-minute": "59881",
    "x-ratelimit-reset-requests-day": "50400.25",
    "x-ratelimit-reset-tokens-minute": "11.5",
}
ANTHROPIC = {
    "anthropic-ratelimit-requests-limit": "50",
    "anthropic-ratelimit-requests-remaining": "49",
    "anthropic-ratelimit-requests-reset": "2026-01-01T10:00:01Z",
    "anthropic-ratelimit-tokens-limit": "40000",
    "anthropic-ratelimit-tokens-remaining": "39000",
    "anthropic-ratelimit-tokens-reset": "2026-01-01T10:00:06Z",
    "anthropic-ratelimit-input-tokens-limit": "30000",
    "anthropic-ratelimit-input-tokens-remaining": "29500",
    "anthropic-ratelimit-input-tokens-reset": "2026-01-01T10:00:02Z",
    "anthropic-ratelimit-output-tokens-limit": "8000",
    "anthropic-ratelimit-output-tokens-remaining": "7900",
    "anthropic-ratelimit-output-tokens-reset": "2026-01-01T10:00:03Z",
    "request-id": "req_018EeWyXxfu5pfWkrYcMdjWG",
}


def by_metric(obs: list[q.QuotaObservation], source: str = "header") -> dict[str, q.QuotaObservation]:
    out: dict[str, q.QuotaObservation] = {}
    for o in obs:
        if o.source == source:
            assert o.metric not in out, f"two {source} observations of {o.metric}"
            out[o.metric] = o
    return out


def error_obs(obs: list[q.QuotaObservation]) -> list[q.QuotaObservation]:
    return [o for o in obs if o.source != "header"]


def state_rows(e: q.QuotaEngine, platform: str | None = None) -> dict[tuple[int, str, str], q.QuotaState]:
    out: dict[tuple[int, str, str], q.QuotaState] = {}
    for s in e.quota_state():
        assert isinstance(s, q.QuotaState)
        if platform is None or s.platform == platform:
            k = (s.key_id, s.pool_key, s.metric)
            assert k not in out, f"duplicate state row {s.platform} {k}"
            out[k] = s
    return out


def req(limit: int | None, remaining: int | None, reset: str | None = None) -> dict[str, str]:
    h = {}
    if limit is not None:
        h["x-ratelimit-limit-requests"] = str(limit)
    if remaining is not None:
        h["x-ratelimit-remaining-requests"] = str(remaining)
    if reset is not None:
        h["x-ratelimit-reset-requests"] = reset
    return h


def tok(limit: int | None, remaining: int | None, reset: str | None = None) -> dict[str, str]:
    h = {}
    if limit is not None:
        h["x-ratelimit-limit-tokens"] = str(limit)
    if remaining is not None:
        h["x-ratelimit-remaining-tokens"] = str(remaining)
    if reset is not None:
        h["x-ratelimit-reset-tokens"] = reset
    return h


# ============================================================================ provider header sets


def test_openai_headers(engine: q.QuotaEngine) -> None:
    obs = engine.record_quota_headers("openai", 7, OPENAI, model_id="gpt-4o")
    assert len(obs) == 2
    assert all(isinstance(o, q.QuotaObservation) for o in obs)
    m = by_metric(obs)
    r, t = m["requests"], m["tokens"]
    for o in (r, t):
        assert o.platform == "openai"
        assert o.key_id == 7
        assert o.model_id == "gpt-4o"
        assert o.pool_key == "openai::gpt-4o"
        assert o.source == "header"
        assert o.confidence == 1.0
        assert o.status == 200
        assert o.retry_after_ms is None
    assert (r.limit, r.remaining, r.reset_at_ms) == (60, 59, NOW + 1_000)
    assert (t.limit, t.remaining, t.reset_at_ms) == (150_000, 149_984, NOW + 360_000)


def test_groq_429_headers_with_retry_after(engine: q.QuotaEngine) -> None:
    obs = engine.record_quota_headers("groq", 3, GROQ_429, model_id="llama-3.1-8b-instant", status=429)
    m = by_metric(obs)
    r, t = m["requests"], m["tokens"]
    assert (r.limit, r.remaining, r.reset_at_ms) == (14_400, 14_370, NOW + 179_560)
    assert (t.limit, t.remaining, t.reset_at_ms) == (18_000, 17_997, NOW + 7_660)
    for o in (r, t):
        assert (o.pool_key, o.status, o.confidence) == ("groq::account", 429, 1.0)
    errs = error_obs(obs)
    assert len(errs) == 1
    err = errs[0]
    assert err.metric == "requests"
    assert err.remaining == 0
    assert err.confidence == 0.75
    assert err.reset_at_ms == NOW + 2_000
    assert err.retry_after_ms == 2_000
    assert err.status == 429
    assert (err.platform, err.key_id, err.model_id, err.pool_key) == (
        "groq",
        3,
        "llama-3.1-8b-instant",
        "groq::account",
    )
    assert len(obs) == 3


def test_openrouter_headers_epoch_ms(engine: q.QuotaEngine) -> None:
    h = {"X-RateLimit-Limit": "20", "X-RateLimit-Remaining": "17", "X-RateLimit-Reset": str(NOW + 42_000)}
    obs = engine.record_quota_headers("openrouter", 1, h, model_id="deepseek/deepseek-r1:free")
    assert len(obs) == 1
    o = obs[0]
    assert (o.metric, o.limit, o.remaining, o.reset_at_ms) == ("requests", 20, 17, NOW + 42_000)
    assert (o.pool_key, o.source, o.confidence) == ("openrouter::free", "header", 1.0)
    obs = engine.record_quota_headers("openrouter", 1, h, model_id="openai/gpt-4o")
    assert obs[0].pool_key == "openrouter::account"


def test_cerebras_headers(engine: q.QuotaEngine) -> None:
    obs = engine.record_quota_headers("cerebras", 2, CEREBRAS, model_id="llama3.1-8b")
    assert len(obs) == 2
    m = by_metric(obs)
    r, t = m["requests"], m["tokens"]
    assert (r.limit, r.remaining, r.reset_at_ms) == (14_400, 14_398, NOW + 50_400_250)
    assert (t.limit, t.remaining, t.reset_at_ms) == (60_000, 59_881, NOW + 11_500)
    assert r.pool_key == t.pool_key == "cerebras::shared"


def test_cerebras_long_fraction_seconds(engine: q.QuotaEngine) -> None:
    h = {
        "x-ratelimit-limit-requests-day": "14400",
        "x-ratelimit-remaining-requests-day": "14399",
        "x-ratelimit-reset-requests-day": "33011.382867097855",
    }
    (o,) = engine.record_quota_headers("cerebras", 2, h)
    assert o.reset_at_ms is not None
    assert abs(o.reset_at_ms - (NOW + 33_011_383)) <= 1


def test_anthropic_headers(engine: q.QuotaEngine) -> None:
    obs = engine.record_quota_headers("anthropic", 4, ANTHROPIC, model_id="claude-sonnet-4-5")
    assert {o.metric for o in obs} == {"requests", "tokens", "input_tokens", "output_tokens"}
    r = [o for o in obs if o.metric == "requests"]
    assert len(r) == 1
    assert (r[0].limit, r[0].remaining, r[0].reset_at_ms) == (50, 49, NOW + 1_000)
    assert r[0].pool_key == "anthropic::claude-sonnet-4-5"
    t = [o for o in obs if o.metric == "tokens"]
    assert (40_000, 39_000, NOW + 6_000) in {(o.limit, o.remaining, o.reset_at_ms) for o in t}
    # SPEC 14.4: input and output tokens are metrics of their own, not folded into tokens.
    m = by_metric(obs)
    assert (m["input_tokens"].limit, m["input_tokens"].remaining, m["input_tokens"].reset_at_ms) == (
        30_000,
        29_500,
        NOW + 2_000,
    )
    assert (m["output_tokens"].limit, m["output_tokens"].remaining, m["output_tokens"].reset_at_ms) == (
        8_000,
        7_900,
        NOW + 3_000,
    )
    rows = state_rows(engine, "anthropic")
    pool = "anthropic::claude-sonnet-4-5"
    assert set(rows) == {(4, pool, metric) for metric in ("requests", "tokens", "input_tokens", "output_tokens")}
    s = rows[(4, pool, "tokens")]
    assert (s.limit, s.remaining, s.reset_at_ms) == (40_000, 39_000, NOW + 6_000)
    s = rows[(4, pool, "output_tokens")]
    assert (s.limit, s.remaining) == (8_000, 7_900)


def test_header_names_are_case_insensitive(engine: q.QuotaEngine) -> None:
    h = {
        "X-RateLimit-Limit-Requests": "60",
        "X-RATELIMIT-REMAINING-REQUESTS": "30",
        "x-RateLimit-Reset-Requests": "10s",
        "X-Ratelimit-Limit-Tokens": "1000",
        "x-ratelimit-remaining-TOKENS": "250",
    }
    m = by_metric(engine.record_quota_headers("openai", 1, h, model_id="gpt-4o"))
    assert (m["requests"].limit, m["requests"].remaining, m["requests"].reset_at_ms) == (60, 30, NOW + 10_000)
    assert (m["tokens"].limit, m["tokens"].remaining, m["tokens"].reset_at_ms) == (1000, 250, None)
    a = {k.upper(): v for k, v in ANTHROPIC.items()}
    m = by_metric(engine.record_quota_headers("anthropic", 1, a, model_id="claude"))
    assert (m["requests"].limit, m["requests"].remaining) == (50, 49)
    e = engine.record_quota_headers("groq", 1, {"Retry-After": "5", **req(10, 0)}, status=429)
    assert [o.reset_at_ms for o in error_obs(e)] == [NOW + 5_000]


def test_headers_may_be_any_mapping(engine: q.QuotaEngine) -> None:
    obs = engine.record_quota_headers("openai", 1, types.MappingProxyType(dict(OPENAI)), model_id="gpt-4o")
    assert len(obs) == 2


def test_without_model_id_the_pool_is_the_platform_pool(engine: q.QuotaEngine) -> None:
    (o,) = engine.record_quota_headers("openai", 1, req(10, 5))
    assert (o.model_id, o.pool_key) == (None, "openai::account")
    (o,) = engine.record_quota_headers("navy", 1, req(10, 5), model_id="gpt-4o")
    assert o.pool_key == "navy::free"


# ============================================================================ reset formats

RESET_FORMATS = [
    pytest.param(str(NOW + 45_000), 45_000, id="epoch-ms"),
    pytest.param(str(NOW // 1000 + 45), 45_000, id="epoch-s"),
    pytest.param("2026-01-01T10:00:45Z", 45_000, id="rfc3339-Z"),
    pytest.param("2026-01-01T10:00:45.500Z", 45_500, id="rfc3339-fraction"),
    pytest.param("2026-01-01T11:00:45+01:00", 45_000, id="rfc3339-offset"),
    pytest.param("2026-01-01T05:00:45-05:00", 45_000, id="rfc3339-negative-offset"),
    pytest.param("6m0s", 360_000, id="duration-6m0s"),
    pytest.param("2m59.56s", 179_560, id="duration-2m59.56s"),
    pytest.param("1.5s", 1_500, id="duration-1.5s"),
    pytest.param("250ms", 250, id="duration-250ms"),
    pytest.param("1s", 1_000, id="duration-1s"),
    pytest.param("7.66s", 7_660, id="duration-7.66s"),
    pytest.param("1h0m0s", 3_600_000, id="duration-1h0m0s"),
    pytest.param("45", 45_000, id="plain-seconds"),
    pytest.param("0.5", 500, id="plain-fraction-seconds"),
    pytest.param("86400", 86_400_000, id="plain-seconds-a-day"),
]


@pytest.mark.parametrize(("value", "offset"), RESET_FORMATS)
def test_reset_formats(engine: q.QuotaEngine, value: str, offset: int) -> None:
    (o,) = engine.record_quota_headers("openai", 1, req(100, 50, value), model_id="gpt-4o")
    assert o.reset_at_ms == NOW + offset


@pytest.mark.parametrize(("value", "offset"), RESET_FORMATS)
def test_reset_formats_follow_the_clock(engine: q.QuotaEngine, clock: q.ManualClock, value: str, offset: int) -> None:
    # Relative formats move with the engine's clock; absolute ones do not.
    clock.advance(10 * SECOND)
    (o,) = engine.record_quota_headers("openai", 1, req(100, 50, value), model_id="gpt-4o")
    absolute = value.startswith("2026-") or (value.isdigit() and int(value) > 1_000_000_000)
    assert o.reset_at_ms == NOW + offset + (0 if absolute else 10 * SECOND)


def test_reset_header_alone_and_tokens_reset(engine: q.QuotaEngine) -> None:
    m = by_metric(engine.record_quota_headers("groq", 1, {**req(10, 9), **tok(100, 90, "2m59.56s")}))
    assert m["tokens"].reset_at_ms == NOW + 179_560
    assert m["requests"].reset_at_ms is None


# ============================================================================ error-body observations


@pytest.mark.parametrize("status", [429, 402])
def test_error_status_adds_error_body_observation(engine: q.QuotaEngine, status: int) -> None:
    obs = engine.record_quota_headers(
        "openai", 5, {**req(60, 12), "retry-after": "30"}, model_id="gpt-4o", status=status
    )
    assert len(obs) == 2
    assert by_metric(obs)["requests"].remaining == 12
    (err,) = error_obs(obs)
    assert (err.metric, err.remaining, err.confidence, err.status) == ("requests", 0, 0.75, status)
    assert err.reset_at_ms == NOW + 30_000
    assert (err.platform, err.key_id, err.model_id, err.pool_key) == ("openai", 5, "gpt-4o", "openai::gpt-4o")


def test_429_retry_after_only(engine: q.QuotaEngine) -> None:
    (err,) = engine.record_quota_headers("groq", 1, {"retry-after": "7"}, model_id="m", status=429)
    assert (err.metric, err.remaining, err.confidence, err.reset_at_ms) == ("requests", 0, 0.75, NOW + 7_000)
    assert err.source != "header"


def test_429_retry_after_http_date(engine: q.QuotaEngine) -> None:
    obs = engine.record_quota_headers(
        "groq", 1, {**req(10, 0), "Retry-After": "Thu, 01 Jan 2026 10:00:30 GMT"}, status=429
    )
    (err,) = error_obs(obs)
    assert err.reset_at_ms == NOW + 30_000


@pytest.mark.parametrize("status", [200, 400, 401, 403, 404, 500, 503])
def test_other_statuses_add_no_error_body_observation(engine: q.QuotaEngine, status: int) -> None:
    obs = engine.record_quota_headers("openai", 1, OPENAI, model_id="gpt-4o", status=status)
    assert len(obs) == 2
    assert all(o.source == "header" and o.confidence == 1.0 and o.status == status for o in obs)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"content-type": "application/json", "x-request-id": "req_abc", "openai-processing-ms": "120"},
        {"x-ratelimit-something-else": "5", "ratelimit-policy": "100;w=60"},
    ],
)
def test_no_quota_headers_adds_nothing(engine: q.QuotaEngine, headers: dict[str, str]) -> None:
    assert engine.record_quota_headers("openai", 1, headers, model_id="gpt-4o") == []
    assert engine.quota_state() == []
    assert engine.key_quota_headroom("openai") == {}


# ============================================================================ quota_state


def test_quota_state_fields(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.record_quota_headers("openai", 7, OPENAI, model_id="gpt-4o")
    rows = state_rows(engine)
    assert set(rows) == {(7, "openai::gpt-4o", "requests"), (7, "openai::gpt-4o", "tokens")}
    r = rows[(7, "openai::gpt-4o", "requests")]
    assert (r.platform, r.key_id, r.pool_key, r.metric) == ("openai", 7, "openai::gpt-4o", "requests")
    assert (r.limit, r.remaining, r.reset_at_ms) == (60, 59, NOW + 1_000)
    assert (r.source, r.confidence, r.observed_at_ms) == ("header", 1.0, NOW)
    t = rows[(7, "openai::gpt-4o", "tokens")]
    assert (t.limit, t.remaining, t.reset_at_ms) == (150_000, 149_984, NOW + 360_000)


def test_quota_state_one_row_per_platform_key_pool_metric(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    e = engine
    e.record_quota_headers("openai", 1, OPENAI, model_id="gpt-4o")
    e.record_quota_headers("openai", 1, OPENAI, model_id="gpt-4o-mini")  # another pool
    e.record_quota_headers("openai", 2, OPENAI, model_id="gpt-4o")  # another key
    e.record_quota_headers("groq", 1, {**req(1000, 900), **tok(6000, 5000)}, model_id="llama-a")
    clock.advance(SECOND)
    e.record_quota_headers("groq", 1, {**req(1000, 899), **tok(6000, 4000)}, model_id="llama-b")  # same pool
    e.record_quota_headers("openai", 1, OPENAI, model_id="gpt-4o")  # repeat: same rows
    rows = state_rows(e)
    assert len(e.quota_state()) == 8
    assert set(rows) == {
        (1, "openai::gpt-4o", "requests"),
        (1, "openai::gpt-4o", "tokens"),
        (1, "openai::gpt-4o-mini", "requests"),
        (1, "openai::gpt-4o-mini", "tokens"),
        (2, "openai::gpt-4o", "requests"),
        (2, "openai::gpt-4o", "tokens"),
        (1, "groq::account", "requests"),
        (1, "groq::account", "tokens"),
    }
    g = rows[(1, "groq::account", "requests")]
    assert (g.remaining, g.observed_at_ms) == (899, NOW + SECOND)
    assert rows[(1, "groq::account", "tokens")].remaining == 4000


def test_quota_state_merge_known_replace_missing_keep(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    e = engine
    e.record_quota_headers("groq", 1, req(100, 90, "60s"))
    clock.advance(SECOND)
    e.record_quota_headers("groq", 1, req(None, 80))  # only remaining
    (s,) = e.quota_state()
    assert (s.limit, s.remaining, s.reset_at_ms, s.observed_at_ms) == (100, 80, NOW + 60_000, NOW + SECOND)
    clock.advance(SECOND)
    e.record_quota_headers("groq", 1, req(200, None))  # only limit
    (s,) = e.quota_state()
    assert (s.limit, s.remaining, s.reset_at_ms) == (200, 80, NOW + 60_000)
    e.record_quota_headers("groq", 1, req(None, None, "10s"))  # only reset
    (s,) = e.quota_state()
    assert (s.limit, s.remaining, s.reset_at_ms) == (200, 80, NOW + 2 * SECOND + 10_000)
    # The tokens metric is its own row: nothing above touched it.
    e.record_quota_headers("groq", 1, tok(5000, 10))
    rows = state_rows(e)
    assert (rows[(1, "groq::account", "requests")].limit, rows[(1, "groq::account", "tokens")].limit) == (200, 5000)


def test_quota_state_confidence_is_the_max(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    e = engine
    # An error-body observation first: confidence 0.75, remaining 0, no limit.
    e.record_quota_headers("groq", 1, {"retry-after": "30"}, status=429)
    (s,) = e.quota_state()
    assert (s.metric, s.limit, s.remaining, s.reset_at_ms, s.confidence) == ("requests", None, 0, NOW + 30_000, 0.75)
    clock.advance(SECOND)
    # A header observation with only a limit: the limit is filled in, remaining kept, confidence max = 1.0.
    e.record_quota_headers("groq", 1, req(100, None))
    (s,) = e.quota_state()
    assert (s.limit, s.remaining, s.reset_at_ms, s.confidence) == (100, 0, NOW + 30_000, 1.0)
    # Another error body does not lower the confidence.
    e.record_quota_headers("groq", 1, {"retry-after": "5"}, status=429)
    (s,) = e.quota_state()
    assert (s.limit, s.remaining, s.confidence) == (100, 0, 1.0)


def test_quota_state_past_reset_reads_as_full(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    e = engine
    e.record_quota_headers("groq", 1, {**req(100, 0, "2s"), **tok(5000, 100, "60s")})
    clock.set(NOW + 1_999)
    rows = state_rows(e)
    assert (rows[(1, "groq::account", "requests")].remaining, rows[(1, "groq::account", "requests")].reset_at_ms) == (
        0,
        NOW + 2_000,
    )
    clock.set(NOW + 2_001)
    rows = state_rows(e)
    r = rows[(1, "groq::account", "requests")]
    assert (r.limit, r.remaining, r.reset_at_ms) == (100, 100, None)
    t = rows[(1, "groq::account", "tokens")]  # not yet reset
    assert (t.limit, t.remaining, t.reset_at_ms) == (5000, 100, NOW + 60_000)


def _quota_table(con: sqlite3.Connection) -> tuple[str, list[str]]:
    """The table that stores quota_state rows (its name is the implementer's choice)."""
    found = []
    for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        cols = [r[1] for r in con.execute(f'PRAGMA table_info("{name}")')]
        if {"remaining", "reset_at_ms", "confidence", "key_id", "metric"} <= set(cols):
            found.append((name, cols))
    assert len(found) == 1, found
    return found[0]


@pytest.mark.sqlite_only
def test_quota_state_past_reset_is_stored(store: str, clock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        e.record_quota_headers("groq", 1, req(100, 0, "2s"))
        clock.set(NOW + 3_000)
        (s,) = e.quota_state()
        assert (s.remaining, s.reset_at_ms) == (100, None)
        con = sqlite3.connect(store)
        try:
            name, _cols = _quota_table(con)
            rows = con.execute(f'SELECT remaining, reset_at_ms FROM "{name}" WHERE key_id = 1').fetchall()
        finally:
            con.close()
        assert rows == [(100, None)]
    # A second engine whose clock is BEFORE the old reset time still reads the replenished row: it was stored.
    with q.QuotaEngine(store, clock=q.ManualClock(NOW), env={}) as e2:
        (s,) = e2.quota_state()
        assert (s.limit, s.remaining, s.reset_at_ms) == (100, 100, None)


def test_quota_state_persisted_and_shared(store: str, clock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=clock, env={}) as a, q.QuotaEngine(store, clock=clock, env={}) as b:
        a.record_quota_headers("openai", 1, OPENAI, model_id="gpt-4o")
        assert len(b.quota_state()) == 2
        b.record_quota_headers("openai", 1, req(None, 10), model_id="gpt-4o")
        assert state_rows(a)[(1, "openai::gpt-4o", "requests")].remaining == 10
    with q.QuotaEngine(store, clock=clock, env={}) as c:
        rows = state_rows(c)
        assert (rows[(1, "openai::gpt-4o", "requests")].limit, rows[(1, "openai::gpt-4o", "requests")].remaining) == (
            60,
            10,
        )


# ============================================================================ key_quota_headroom


def test_headroom_worst_row_per_key(engine: q.QuotaEngine) -> None:
    e = engine
    e.record_quota_headers("openai", 1, {**req(60, 30), **tok(150_000, 149_984)}, model_id="gpt-4o")  # 0.5
    e.record_quota_headers("openai", 2, {**req(60, 59), **tok(1000, 900)}, model_id="gpt-4o")  # 0.9
    e.record_quota_headers("openai", 3, req(100, 90), model_id="gpt-4o")
    e.record_quota_headers("openai", 3, tok(100, 20), model_id="gpt-4o-mini")  # another pool of key 3: 0.2
    e.record_quota_headers("groq", 4, req(10, 1))  # another platform
    h = e.key_quota_headroom("openai")
    assert set(h) == {1, 2, 3}
    assert h[1] == pytest.approx(0.5)
    assert h[2] == pytest.approx(0.9)
    assert h[3] == pytest.approx(0.2)
    assert e.key_quota_headroom("groq") == {4: pytest.approx(0.1)}
    assert e.key_quota_headroom("mistral") == {}


def test_headroom_clamped_to_one(engine: q.QuotaEngine) -> None:
    engine.record_quota_headers("groq", 1, req(100, 150))
    assert engine.key_quota_headroom("groq") == {1: 1.0}


def test_headroom_needs_known_remaining_and_positive_limit(engine: q.QuotaEngine) -> None:
    e = engine
    e.record_quota_headers("groq", 1, {"retry-after": "30"}, status=429)  # remaining 0, no limit
    e.record_quota_headers("groq", 2, req(0, 0))  # limit 0
    e.record_quota_headers("groq", 3, req(100, None))  # no remaining
    e.record_quota_headers("groq", 4, req(100, 25))
    assert e.key_quota_headroom("groq") == {4: pytest.approx(0.25)}


def test_headroom_error_body_merged_with_header_counts(engine: q.QuotaEngine) -> None:
    e = engine
    e.record_quota_headers("groq", 1, req(100, 50))
    e.record_quota_headers("groq", 1, {"retry-after": "30"}, status=429)  # remaining 0 now known, limit kept
    assert e.key_quota_headroom("groq") == {1: 0.0}


def test_headroom_past_reset_counts_one(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    e = engine
    e.record_quota_headers("groq", 1, {**req(100, 0, "1s"), **tok(1000, 500, "1h0m0s")})
    e.record_quota_headers("groq", 2, req(100, 0, "1s"))
    assert e.key_quota_headroom("groq") == {1: 0.0, 2: 0.0}
    clock.advance(6 * SECOND)  # past the reset and past the cache
    h = e.key_quota_headroom("groq")
    assert h == {1: pytest.approx(0.5), 2: 1.0}


def _copy_row_with(db: Path, key_id: int, confidence: float) -> None:
    """Copy key 1's quota row to another key with another confidence, with plain sqlite3."""
    con = sqlite3.connect(db)
    try:
        name, cols = _quota_table(con)
        info = {r[1]: r for r in con.execute(f'PRAGMA table_info("{name}")')}
        select = []
        for c in cols:
            if c == "key_id":
                select.append(str(key_id))
            elif c == "confidence":
                select.append(repr(confidence))
            elif info[c][5] and info[c][2].upper() == "INTEGER" and len([x for x in info.values() if x[5]]) == 1:
                select.append("NULL")  # a rowid alias
            else:
                select.append(f'"{c}"')
        collist = ", ".join(f'"{c}"' for c in cols)
        con.execute(f'INSERT INTO "{name}" ({collist}) SELECT {", ".join(select)} FROM "{name}" WHERE key_id = 1')
        con.commit()
    finally:
        con.close()


@pytest.mark.sqlite_only
def test_headroom_confidence_floor(store: str, clock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        e.record_quota_headers("groq", 1, req(100, 40))
    _copy_row_with(store, 2, 0.6)  # a probe's confidence: below the floor
    _copy_row_with(store, 3, 0.7)  # exactly the floor
    _copy_row_with(store, 4, 0.45)
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        assert len(e.quota_state()) == 4
        assert e.key_quota_headroom("groq") == {1: pytest.approx(0.4), 3: pytest.approx(0.4)}


def test_headroom_cache_other_engine_not_seen_for_5s(store: str, clock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=clock, env={}) as a, q.QuotaEngine(store, clock=clock, env={}) as b:
        a.record_quota_headers("groq", 1, req(100, 50))
        assert a.key_quota_headroom("groq") == {1: pytest.approx(0.5)}  # cache built at NOW
        b.record_quota_headers("groq", 2, req(100, 80))
        b.record_quota_headers("groq", 1, req(100, 10))
        assert b.key_quota_headroom("groq") == {1: pytest.approx(0.1), 2: pytest.approx(0.8)}
        # quota_state is not cached: A sees B's rows at once.
        assert state_rows(a)[(1, "groq::account", "requests")].remaining == 10
        clock.advance(4_000)
        assert a.key_quota_headroom("groq") == {1: pytest.approx(0.5)}  # still the cached answer
        clock.advance(1_001)  # > 5 s after the cache was built
        assert a.key_quota_headroom("groq") == {1: pytest.approx(0.1), 2: pytest.approx(0.8)}


def test_headroom_cache_invalidated_by_own_observation(store: str, clock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=clock, env={}) as a, q.QuotaEngine(store, clock=clock, env={}) as b:
        a.record_quota_headers("groq", 1, req(100, 50))
        assert a.key_quota_headroom("groq") == {1: pytest.approx(0.5)}
        b.record_quota_headers("groq", 2, req(100, 80))
        clock.advance(1_000)
        assert a.key_quota_headroom("groq") == {1: pytest.approx(0.5)}
        # A new observation through A: A's next answer is fresh, including B's row.
        a.record_quota_headers("groq", 3, req(100, 30))
        assert a.key_quota_headroom("groq") == {1: pytest.approx(0.5), 2: pytest.approx(0.8), 3: pytest.approx(0.3)}
        a.record_quota_headers("groq", 1, req(None, 5))
        assert a.key_quota_headroom("groq")[1] == pytest.approx(0.05)


def test_headroom_of_another_engines_observation_at_the_next_call(store: str, clock: q.ManualClock) -> None:
    """The observed quota is mirror data fed by the change feed: what A observes reaches B's next
    `key_quota_headroom` and the `headroom` pick of B's next `lease_any`. On SQLite the pick decides
    under the lock, on what the file holds; on Redis it decides on what B's last round trip brought, at
    most 5 s old (SPEC 8.2)."""
    routes = [("groq", "m", 1), ("mistral", "m", 2)]
    with q.QuotaEngine(store, clock=clock, env={}) as a, q.QuotaEngine(store, clock=clock, env={}) as b:
        lease = b.lease_any(routes)
        assert lease.platform == "groq"  # nothing observed: ties go to the given order
        lease.release()
        a.record_quota_headers("groq", 1, req(100, 5))
        if store.startswith("redis"):
            clock.advance(5_000)
        lease = b.lease_any(routes)
        assert lease.platform == "mistral"  # key 1's observed 5% bounds its score
        lease.release()
        assert b.key_quota_headroom("groq") == {1: pytest.approx(0.05)}
        a.record_quota_headers("mistral", 2, req(100, 80))
        assert b.key_quota_headroom("mistral") == {2: pytest.approx(0.8)}  # B's first answer: at once


def test_headroom_own_error_observation_invalidates(engine: q.QuotaEngine) -> None:
    e = engine
    e.record_quota_headers("groq", 1, req(100, 100))
    assert e.key_quota_headroom("groq") == {1: 1.0}
    e.record_quota_headers("groq", 1, {"retry-after": "30"}, status=429)
    assert e.key_quota_headroom("groq") == {1: 0.0}


# ============================================================================ bad input


def test_record_quota_headers_bad_input(engine: q.QuotaEngine) -> None:
    e = engine
    with pytest.raises(TypeError):
        e.record_quota_headers("groq", 1, {"x-ratelimit-limit-requests": 10})  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        e.record_quota_headers("", 1, req(10, 5))
    with pytest.raises(ValueError):
        e.record_quota_headers("groq", 1, req(10, 5), model_id="")
    with pytest.raises(OverflowError):
        e.record_quota_headers("groq", 2**63, req(10, 5))
    assert e.quota_state() == []


def test_unparsable_values_are_dropped_not_fatal(engine: q.QuotaEngine) -> None:
    e = engine
    (o,) = e.record_quota_headers("groq", 1, {**req(None, 5, "soon"), "x-ratelimit-limit-requests": "lots"})
    assert (o.limit, o.remaining, o.reset_at_ms) == (None, 5, None)
    e.record_quota_headers("groq", 1, req(10, None))
    (s,) = e.quota_state()
    assert (s.limit, s.remaining) == (10, 5)
