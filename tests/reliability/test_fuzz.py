"""Hostile input (SPEC §6.2, §7, §8.2, §13): fuzzing of every parser and of header parsing, a state machine over
the whole API against a simple model of the SPEC, and the edges: 1 MB strings, NUL bytes, lone surrogates, SQL
metacharacters in names, key ids at the int64 edges, times near the epoch and in 2100.

Lone surrogates ("\\ud800") cannot be encoded as UTF-8: every str argument raises UnicodeEncodeError (a
ValueError) except header mappings, which raise TypeError ("headers must map str to str"); either way a clear
exception, state unchanged, the engine keeps working.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import quotaengine as q
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from moments import DAY, MINUTE, T0

Y2100 = 4_102_444_800_000  # 2100-01-01 00:00 UTC
I64_MAX = 2**63 - 1
I64_MIN = -(2**63)
KINDS = {
    "payment",
    "forbidden",
    "auth",
    "daily_quota",
    "rate_limit",
    "timeout",
    "server_error",
    "transport",
    "empty_completion",
    "other",
}
REASONS = {
    "cooldown",
    "rpm",
    "rpd",
    "tpm",
    "tpd",
    "provider_daily_requests",
    "provider_minute_requests",
    "provider_daily_tokens",
    "key_concurrency",
}
SOURCES = ("heuristic", "authoritative", "credit", "tier")

# ---------------------------------------------------------------------------- parsers

FRAGMENTS = [
    "try again in ",
    "retry after ",
    "Please retry in ",
    '"retryDelay": "',
    '"retry_after": "',
    "Limit ",
    "limit: ",
    "tokens per minute",
    "tokens per day",
    "requests per day",
    "requests per minute",
    "TPM",
    "TPD",
    "RPM",
    "RPD",
    "1m26.4s",
    "7.66s",
    "250ms",
    "2h",
    "s",
    "m",
    "h",
    "ms",
    " seconds",
    "minutes",
    "9" * 40,
    "1e308",
    "-0",
    "0x1F",
    "1,000,000",
    ",,,",
    "..",
    "NaN",
    "inf",
    "\x00",
    "\u202e",
    "\u0663",
    "\U0001f600",
    "\r\n",
    "\t",
    "Thu, 01 Jan 2026 12:02:00 GMT",
    "Fri, 31 Dec 9999 23:59:59 GMT",
    "Mon, 01 Jan 0001 00:00:00 GMT",
    "2026-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999999+14:00",
]
hostile_text = st.one_of(
    st.text(),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x7F)),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=4)), max_size=16).map("".join),
    st.binary(max_size=64).map(lambda b: b.decode("latin-1")),
)


def in_day(v: object) -> bool:
    return v is None or (type(v) is int and 0 <= v <= DAY)


@settings(max_examples=100, deadline=None)
@given(hostile_text, st.one_of(st.none(), st.integers(I64_MIN, I64_MAX)))
def test_fuzz_retry_parsers(text: str, now_ms: int | None) -> None:
    assert in_day(q.parse_retry_after_ms(text, now_ms=now_ms))
    assert in_day(q.parse_stated_retry_ms(text))


@settings(max_examples=100, deadline=None)
@given(hostile_text)
def test_fuzz_parse_provider_limit(text: str) -> None:
    got = q.parse_provider_limit(text)
    if got is not None:
        assert got.kind in {"tpm", "tpd", "rpm", "rpd"}
        assert type(got.limit) is int and 0 < got.limit <= I64_MAX


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("x" * (1 << 20), id="1MB-plain"),
        pytest.param("try again in " * 80_000 + "1s", id="1MB-retry-phrases"),
        pytest.param("limit " * 170_000 + "5 requests per day", id="1MB-limit-words"),
        pytest.param("9" * (1 << 20), id="1MB-digits"),
        pytest.param("1," * (1 << 19), id="1MB-separators"),
        pytest.param("retry after " + "9" * (1 << 20) + " seconds", id="1MB-number"),
        pytest.param('{"retryDelay": "' + "1" * (1 << 20) + 's"}', id="1MB-json"),
        pytest.param("\x00" * (1 << 20), id="1MB-NUL"),
        pytest.param("try again in 1m" + "26.4" * 250_000 + "s", id="1MB-compound"),
    ],
)
def test_parsers_on_huge_strings(text: str) -> None:
    started = time.monotonic()
    assert in_day(q.parse_retry_after_ms(text, now_ms=T0))
    assert in_day(q.parse_stated_retry_ms(text))
    got = q.parse_provider_limit(text)
    assert got is None or 0 < got.limit <= I64_MAX
    e = q.QuotaEngine(":memory:", clock=q.ManualClock(T0), env={})
    try:
        out = e.record_failure("groq", "m", 1, status=429, retry_after=text, message=text)
        assert out.kind in KINDS
        assert out.cooldown is None or 0 <= out.cooldown.duration_ms <= DAY
        e.record_quota_headers("groq", 1, {"x-ratelimit-reset-requests": text, "retry-after": text}, status=429)
    finally:
        e.close()
    assert time.monotonic() - started < 20  # no pathological backtracking (debug build)


@pytest.mark.parametrize(
    "call",
    [
        lambda: q.parse_retry_after_ms("\ud800"),
        lambda: q.parse_stated_retry_ms("try again in 5s \udfff"),
        lambda: q.parse_provider_limit("\ud800 Limit 5 requests per day"),
        lambda: q.infer_quota_pool_key("\ud800"),
        lambda: q.is_shared_pool("groq\udc00"),
    ],
)
def test_parsers_reject_lone_surrogates_clearly(call: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        call()


# ---------------------------------------------------------------------------- headers

HEADER_NAMES = (
    [
        f"{prefix}-{what}-{metric}"
        for prefix in ("x-ratelimit",)
        for what in ("limit", "remaining", "reset")
        for metric in ("requests", "tokens", "requests-day", "tokens-minute")
    ]
    + [
        f"anthropic-ratelimit-{metric}-{what}"
        for metric in ("requests", "tokens", "input-tokens", "output-tokens")
        for what in ("limit", "remaining", "reset")
    ]
    + ["retry-after", "content-type", "x-request-id"]
)

header_name = st.one_of(
    st.sampled_from(HEADER_NAMES),
    st.sampled_from(HEADER_NAMES).map(str.upper),
    st.sampled_from(HEADER_NAMES).map(str.title),
    st.text(max_size=20),
)
header_value = st.one_of(
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(
        [
            "6m0s",
            "2m59.56s",
            "1.5s",
            "250ms",
            "0s",
            "-5s",
            "1h",
            "99999999999999999999s",
            "1767225660000",
            "1767225660",
            "2026-01-01T00:01:00Z",
            "2026-01-01T00:01:00.5+02:00",
            "9999-12-31T23:59:59Z",
            "0001-01-01T00:00:00Z",
            "Thu, 01 Jan 2026 00:01:00 GMT",
            "",
            " ",
            "\x00",
            "NaN",
            "1e400",
            str(I64_MAX),
            str(I64_MIN),
            str(2**64),
        ]
    ),
    hostile_text,
)
statuses = st.one_of(st.sampled_from([200, 201, 400, 401, 402, 403, 404, 429, 500, 503]), st.integers(-(2**40), 2**40))


@settings(max_examples=100, deadline=None)
@given(
    headers=st.dictionaries(header_name, header_value, max_size=12),
    status=statuses,
    model_id=st.one_of(st.none(), st.sampled_from(["llama", "gpt-4o:free", "m"])),
    platform=st.sampled_from(["groq", "openrouter", "cerebras", "anthropic", "nvidia"]),
    key_id=st.integers(I64_MIN, I64_MAX),
    now=st.sampled_from([T0, 0, -1, Y2100]),
)
def test_fuzz_record_quota_headers(
    headers: dict[str, str], status: int, model_id: str | None, platform: str, key_id: int, now: int
) -> None:
    clock = q.ManualClock(now)
    e = q.QuotaEngine(":memory:", clock=clock, env={})
    try:
        e.register_key(key_id, platform)
        obs = e.record_quota_headers(platform, key_id, headers, model_id=model_id, status=status)
        for o in obs:
            assert (o.platform, o.key_id, o.model_id, o.status) == (platform, key_id, model_id, status)
            assert o.metric in ("requests", "tokens", "input_tokens", "output_tokens")
            assert o.limit is None or o.limit >= 0
            assert o.remaining is None or o.remaining >= 0
            assert in_day(o.retry_after_ms)
            assert 0 < o.confidence <= 1
            assert o.pool_key == q.infer_quota_pool_key(platform, model_id)
        states = e.quota_state()
        assert len(states) <= len(obs)
        for s in states:
            assert s.remaining is None or s.remaining >= 0
            assert s.limit is None or s.limit >= 0
            assert 0 < s.confidence <= 1
        for k, headroom in e.key_quota_headroom(platform).items():
            assert k == key_id
            assert 0.0 <= headroom <= 1.0
        clock.advance(DAY)
        e.quota_state()
        e.key_quota_headroom(platform)
        # The engine still works.
        with e.lease(platform, "m", key_id):
            pass
    finally:
        e.close()


# ---------------------------------------------------------------------------- hostile names and values

HOSTILE_NAMES = [
    "'; DROP TABLE rate_limit_usage; --",
    '" OR 1=1 --',
    "groq'); DELETE FROM rate_limit_cooldowns; --",
    "%_*?[]\\",
    "a\x00b",
    "\x00",
    "名前 🚀 \u202e",
    "x" * (1 << 20),
]


def test_hostile_names_are_data_not_sql(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    clock = q.ManualClock(T0 + 10 * 3_600_000)
    with q.QuotaEngine(db, clock=clock, env={}) as e:
        for i, name in enumerate(HOSTILE_NAMES):
            e.set_model_limits(name, name, rpm=2)
            e.register_key(100 + i, name, label=name, base_url=name)
            with e.lease(name, name, 100 + i, 7):
                pass
            e.record_request(name, "m", 100 + i)
            e.set_cooldown(name, "benched", 100 + i, duration_ms=MINUTE, source="authoritative")
            out = e.record_failure(name, name, 100 + i, status=429, message=name)
            assert out.kind == "rate_limit"
            e.record_quota_headers(
                name,
                100 + i,
                {"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "4"},
                model_id=name,
            )
            clock.advance(1)
    # Another engine on the file: every name came back exactly, each route its own, nothing was dropped.
    with q.QuotaEngine(db, clock=clock, env={}) as e:
        for i, name in enumerate(HOSTILE_NAMES):
            u = e.usage(name, name, 100 + i)
            assert (u["rpd"]["used"], u["tpd"]["used"], u["rpm"]["limit"]) == (1, 7, 2), i
            assert e.usage(name, "m", 100 + i)["rpd"]["used"] == 1
            assert e.is_on_cooldown(name, "benched", 100 + i)
            assert e.model_limits(name, name) == q.Limits(rpm=2)
            assert e.key_quota_headroom(name) == {100 + i: 0.4}
        # "a\x00b" was not cut at the NUL
        assert e.usage("a", "a", 100 + HOSTILE_NAMES.index("a\x00b"))["rpd"]["used"] == 0
        events = e.usage_events()
        assert {ev["platform"] for ev in events} == set(HOSTILE_NAMES)
        assert len([ev for ev in events if ev["kind"] == "request"]) == 2 * len(HOSTILE_NAMES)
    con = sqlite3.connect(db)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"rate_limit_usage", "rate_limit_cooldowns", "server_logs"} <= tables
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        platforms = {r[0] for r in con.execute("SELECT DISTINCT platform FROM rate_limit_usage")}
        assert platforms == set(HOSTILE_NAMES)  # NUL bytes and 1 MB names stored whole
    finally:
        con.close()


def surrogate_calls(e: q.QuotaEngine) -> list[tuple[str, Any]]:
    s = "\ud800"
    return [
        ("record_request platform", lambda: e.record_request(s, "m", 1)),
        ("record_request model", lambda: e.record_request("groq", "m" + s, 1)),
        ("lease", lambda: e.lease("groq", s, 1)),
        ("check", lambda: e.check(s, "m", 1)),
        ("usage", lambda: e.usage("groq", s, 1)),
        ("set_cooldown", lambda: e.set_cooldown("groq", s, 1)),
        ("set_cooldown source", lambda: e.set_cooldown("groq", "m", 1, source=s)),
        ("record_failure message", lambda: e.record_failure("groq", "m", 1, status=429, message=s)),
        ("record_failure retry_after", lambda: e.record_failure("groq", "m", 1, status=429, retry_after=s)),
        ("record_failure kind", lambda: e.record_failure("groq", "m", 1, kind=s)),
        ("register_key label", lambda: e.register_key(5, "groq", label=s)),
        ("register_key base_url", lambda: e.register_key(5, "groq", base_url="http://" + s)),
        ("set_model_limits budget", lambda: e.set_model_limits("groq", "m", rpm=1, monthly_token_budget=s)),
        ("learn_limit_from_error", lambda: e.learn_limit_from_error("groq", "m", "Limit 1 requests per day" + s)),
        ("header value", lambda: e.record_quota_headers("groq", 1, {"x-ratelimit-limit-requests": s})),
        ("header name", lambda: e.record_quota_headers("groq", 1, {s: "1"})),
        ("provider_caps", lambda: e.provider_caps(s)),
        ("usage_events filter", lambda: e.usage_events(platform=s)),
    ]


def test_lone_surrogates_raise_clearly_and_change_nothing(engine: q.QuotaEngine) -> None:
    engine.set_model_limits("groq", "m", rpm=3)
    engine.record_request("groq", "m", 1)
    before = (
        engine.usage("groq", "m", 1),
        engine.usage_events(),
        engine.active_cooldowns(),
        engine.model_limits("groq", "m"),
    )
    raised = {}
    for name, call in surrogate_calls(engine):
        with pytest.raises((ValueError, TypeError)) as exc:
            call()
        raised[name] = type(exc.value).__name__
    after = (
        engine.usage("groq", "m", 1),
        engine.usage_events(),
        engine.active_cooldowns(),
        engine.model_limits("groq", "m"),
    )
    assert after == before
    assert set(raised.values()) <= {"UnicodeEncodeError", "ValueError", "TypeError"}, raised
    with engine.lease("groq", "m", 1):
        pass
    assert engine.usage("groq", "m", 1)["rpm"]["used"] == 2


def test_surrogate_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises((ValueError, TypeError, q.DatabaseError)):
        q.QuotaEngine(str(tmp_path / "\ud800.db"), env={})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("key_id", [I64_MAX, I64_MIN + 1, I64_MIN, 0, -1])
def test_key_ids_at_the_int64_edges(tmp_path: Path, key_id: int) -> None:
    db = tmp_path / "q.db"
    clock = q.ManualClock(T0 + 3_600_000)
    with q.QuotaEngine(db, clock=clock, env={}) as e:
        e.register_key(key_id, "groq", label="edge")
        e.set_model_limits("groq", "m", rpm=2)
        with e.lease("groq", "m", key_id, 3):
            pass
        e.record_request("groq", "m", key_id)
        with pytest.raises(q.QuotaExceeded) as exc:
            e.lease("groq", "m", key_id)
        assert exc.value.key_id == key_id
        e.set_cooldown("groq", "other", key_id, duration_ms=MINUTE)
        e.record_failure("groq", "third", key_id, status=401)
        assert e.usage("groq", "m", key_id ^ 1)["rpd"]["used"] == 0  # a neighbour is another key
    with q.QuotaEngine(db, clock=clock, env={}) as e:
        assert e.usage("groq", "m", key_id)["rpd"]["used"] == 2
        assert {ev["key_id"] for ev in e.usage_events()} == {key_id}
        assert [c.key_id for c in e.active_cooldowns([key_id])] == [key_id, key_id]
        assert e.clear_cooldowns_for_key(key_id) == 2


@pytest.mark.parametrize("key_id", [I64_MAX + 1, I64_MIN - 1, 2**64, -(2**70)])
def test_key_ids_outside_int64_overflow(engine: q.QuotaEngine, key_id: int) -> None:
    for call in (
        lambda: engine.record_request("groq", "m", key_id),
        lambda: engine.lease("groq", "m", key_id),
        lambda: engine.check("groq", "m", key_id),
        lambda: engine.usage("groq", "m", key_id),
        lambda: engine.register_key(key_id, "groq"),
        lambda: engine.set_cooldown("groq", "m", key_id),
        lambda: engine.record_failure("groq", "m", key_id, status=429),
        lambda: engine.record_quota_headers("groq", key_id, {"x-ratelimit-limit-requests": "5"}),
        lambda: engine.active_cooldowns([key_id]),
        lambda: engine.usage_events(key_id=key_id),
    ):
        with pytest.raises(OverflowError):
            call()
    assert engine.usage_events() == []


@pytest.mark.parametrize(
    "start",
    [
        pytest.param(0, id="epoch"),
        pytest.param(-1, id="epoch-1ms"),
        pytest.param(Y2100 - 1, id="2100-eve"),
        pytest.param(Y2100 + 12 * 3_600_000, id="2100-noon"),
    ],
)
def test_times_near_the_epoch_and_in_2100(tmp_path: Path, start: int) -> None:
    db = tmp_path / "q.db"
    clock = q.ManualClock(start)
    midnight = start - start % DAY  # floor, also below zero
    with q.QuotaEngine(db, clock=clock, env={}) as e:
        e.set_model_limits("groq", "m", rpm=2, rpd=3, tpm=100)
        with e.lease("groq", "m", 1, 40):
            pass
        adm = e.check("groq", "m", 1, 61)
        assert (adm.allowed, adm.reason, adm.retry_at_ms) == (False, "tpm", start + MINUTE)
        e.record_request("groq", "m", 1)
        adm = e.check("groq", "m", 1)
        assert (adm.reason, adm.retry_at_ms) == ("rpm", start + MINUTE)
        clock.advance(MINUTE)
        adm = e.check("groq", "m", 1)
        if start + MINUTE < midnight + DAY:
            # same day: 2 of 3 used, rpm open again
            assert adm.allowed
            with e.lease("groq", "m", 1):
                pass
            adm = e.check("groq", "m", 1)
            assert (adm.reason, adm.retry_at_ms) == ("rpd", midnight + DAY)
        else:
            # the day rolled over at midnight: the day window is empty again
            assert adm.allowed
            assert e.usage("groq", "m", 1)["rpd"]["used"] == 0
        out = e.record_failure("groq", "m", 2, status=429, retry_after="120")
        assert out.cooldown is not None
        cd = e.cooldown("groq", "m", 2)
        assert cd is not None and cd.expires_at_ms == clock.now_ms() + 120_000
        clock.advance(-5 * MINUTE)  # and back: nothing breaks, "future" events still count
        u = e.usage("groq", "m", 1)
        assert u["rpm"]["used"] >= 2 and u["in_flight"] == 0
    with q.QuotaEngine(db, clock=clock, env={}) as e:
        events = e.usage_events()
        assert all(ev["created_at_ms"] in (start, start + MINUTE) for ev in events)
        assert e.is_on_cooldown("groq", "m", 2)


def test_parse_retry_after_near_the_epoch() -> None:
    assert q.parse_retry_after_ms("Thu, 01 Jan 1970 00:00:30 GMT", now_ms=0) == 30_000
    assert q.parse_retry_after_ms("Thu, 01 Jan 1970 00:00:30 GMT", now_ms=-1) == 30_001
    assert q.parse_retry_after_ms("Thu, 01 Jan 1970 00:00:30 GMT", now_ms=Y2100) == 0
    assert q.parse_retry_after_ms("Fri, 01 Jan 2100 00:00:10 GMT", now_ms=Y2100) == 10_000
    assert q.parse_retry_after_ms("30", now_ms=I64_MAX) == 30_000
    assert q.parse_retry_after_ms("Fri, 01 Jan 2100 00:00:10 GMT", now_ms=I64_MIN) == DAY


# ---------------------------------------------------------------------------- the whole API as a state machine

PLATFORM = "groq"  # no default provider caps; env={} sets none
MODELS = ("m1", "m2")
KEYS = (1, 2)
ROUTES = [(m, k) for m in MODELS for k in KEYS]
START = T0 + DAY - 5 * MINUTE  # 23:55 UTC: day windows roll over in longer runs

opt_limit = st.one_of(st.none(), st.integers(0, 6))
opt_tokens = st.one_of(st.none(), st.integers(0, 300))
routes = st.sampled_from(ROUTES)
pick = st.integers(0, 10_000)
LEARNABLE = [
    None,
    "Rate limit reached for model on tokens per minute (TPM): Limit 150, Used 140, Requested 20.",
    "Rate limit reached on requests per day (RPD): Limit 4, Used 4.",
    "Rate limit reached on requests per minute (RPM): Limit 2. Please try again in 1.5s",
    "daily quota exceeded, try again tomorrow",
    "connection reset by peer",
]


class ApiMachine(RuleBasedStateMachine):
    """Random call sequences against a model of SPEC §4/§5: usage windows from the events the calls recorded,
    in flight = leases not yet finished; lease() admits exactly when no cooldown is active and every window
    has room."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = q.ManualClock(START)
        # Leases never expire here, so the model needs no backstop.
        self.e = q.QuotaEngine(":memory:", clock=self.clock, env={}, lease_max_age_ms=30 * DAY)
        self.events: list[tuple[tuple[str, int], int, str, int]] = []  # (route, t, kind, amount)
        self.live: list[tuple[q.Lease, tuple[str, int]]] = []
        self.finished: list[q.Lease] = []

    def teardown(self) -> None:
        self.e.close()

    @initialize(limits=st.lists(st.tuples(opt_limit, opt_limit, opt_tokens, opt_tokens), min_size=2, max_size=2))
    def set_limits(self, limits: list[tuple[int | None, ...]]) -> None:
        for model, (rpm, rpd, tpm, tpd) in zip(MODELS, limits, strict=True):
            self.e.set_model_limits(PLATFORM, model, rpm=rpm, rpd=rpd, tpm=tpm, tpd=tpd)

    # -- the model

    def windows(self, route: tuple[str, int]) -> dict[str, int]:
        now = self.clock.now_ms()
        midnight = now - now % DAY
        evs = [(t, kind, n) for r, t, kind, n in self.events if r == route]
        return {
            "rpm": sum(1 for t, kind, _ in evs if kind == "request" and t > now - MINUTE),
            "rpd": sum(1 for t, kind, _ in evs if kind == "request" and t >= midnight),
            "tpm": sum(n for t, kind, n in evs if kind == "tokens" and t > now - MINUTE),
            "tpd": sum(n for t, kind, n in evs if kind == "tokens" and t >= midnight),
        }

    def in_flight(self, route: tuple[str, int]) -> tuple[int, int]:
        leases = [lease for lease, r in self.live if r == route]
        return len(leases), sum(lease.estimated_tokens for lease in leases)

    def model_allows(self, route: tuple[str, int], est: int) -> bool:
        lim = self.e.model_limits(PLATFORM, route[0]) or q.Limits()
        w = self.windows(route)
        n, tokens = self.in_flight(route)
        return (
            (lim.rpm is None or w["rpm"] + n < lim.rpm)
            and (lim.rpd is None or w["rpd"] + n < lim.rpd)
            and (lim.tpm is None or w["tpm"] + tokens + est <= lim.tpm)
            and (lim.tpd is None or w["tpd"] + tokens + est <= lim.tpd)
        )

    def record(self, route: tuple[str, int], tokens: int | None) -> None:
        now = self.clock.now_ms()
        self.events.append((route, now, "request", 1))
        if tokens is not None:
            self.events.append((route, now, "tokens", tokens))

    # -- rules

    @rule(route=routes, est=st.integers(0, 120))
    def lease(self, route: tuple[str, int], est: int) -> None:
        model, key = route
        adm = self.e.check(PLATFORM, model, key, est)
        expected = not self.e.is_on_cooldown(PLATFORM, model, key) and self.model_allows(route, est)
        assert adm.allowed == expected, (adm, self.windows(route), self.in_flight(route))
        try:
            lease = self.e.lease(PLATFORM, model, key, est)
        except q.QuotaExceeded as exc:
            assert not expected
            assert exc.reason == adm.reason and exc.reason in REASONS
            assert (exc.platform, exc.model_id, exc.key_id) == (PLATFORM, model, key)
            return
        assert expected
        self.live.append((lease, route))
        lim = self.e.model_limits(PLATFORM, model) or q.Limits()
        u = self.e.usage(PLATFORM, model, key)
        w = self.windows(route)
        # lease() never lets a route exceed its limits: recorded + live <= limit right after an admission.
        if lim.rpm is not None:
            assert w["rpm"] + self.in_flight(route)[0] <= lim.rpm
            assert u["rpm"]["used"] + u["in_flight"] <= lim.rpm
        if lim.rpd is not None:
            assert u["rpd"]["used"] + u["in_flight"] <= lim.rpd

    @precondition(lambda self: self.live)
    @rule(i=pick, tokens=st.one_of(st.none(), st.integers(0, 150)))
    def success(self, i: int, tokens: int | None) -> None:
        lease, route = self.live.pop(i % len(self.live))
        lease.success(tokens=tokens)
        self.record(route, tokens)
        self.finished.append(lease)

    @precondition(lambda self: self.live)
    @rule(
        i=pick,
        status=st.sampled_from([429, 503, 500, 402, 403, 401, 408, 400, None]),
        retry_after=st.sampled_from([None, "5", "abc", 30, 1.5, "Thu, 01 Jan 2026 00:10:00 GMT"]),
        message=st.sampled_from(LEARNABLE),
    )
    def failure(self, i: int, status: int | None, retry_after: Any, message: str | None) -> None:
        lease, route = self.live.pop(i % len(self.live))
        out = lease.failure(status=status, retry_after=retry_after, message=message)
        assert out is not None and out.kind in KINDS
        self.check_outcome(route, out)
        self.finished.append(lease)

    def check_outcome(self, route: tuple[str, int], out: q.FailureOutcome) -> None:
        """The reported bench is the route's cooldown now: the one just set, or a later one that stands (after a
        step back of the clock a standing bench may have more than 24 h left)."""
        if out.cooldown is None or out.cooldown.duration_ms == 0:
            return
        assert out.cooldown.duration_ms > 0
        assert out.cooldown.source in SOURCES
        cd = self.e.cooldown(PLATFORM, *route)
        assert cd is not None
        assert (cd.expires_at_ms, cd.source) == (self.clock.now_ms() + out.cooldown.duration_ms, out.cooldown.source)

    @precondition(lambda self: self.live)
    @rule(i=pick, by_id=st.booleans())
    def release(self, i: int, by_id: bool) -> None:
        lease, _ = self.live.pop(i % len(self.live))
        if by_id:
            self.e.release_lease(lease.id)
            self.e.release_lease(lease.id)  # idempotent
        else:
            lease.release()
            self.finished.append(lease)

    @precondition(lambda self: self.finished)
    @rule(i=pick, how=st.sampled_from(["success", "failure", "release"]))
    def finish_again(self, i: int, how: str) -> None:
        # A finished lease records nothing more.
        lease = self.finished[i % len(self.finished)]
        assert lease.done
        if how == "success":
            assert lease.success(tokens=5) is None
        elif how == "failure":
            assert lease.failure(status=429) is None
        else:
            lease.release()

    @rule(route=routes)
    def record_request(self, route: tuple[str, int]) -> None:
        self.e.record_request(PLATFORM, *route)
        self.events.append((route, self.clock.now_ms(), "request", 1))

    @rule(route=routes, tokens=st.integers(0, 200))
    def record_tokens(self, route: tuple[str, int], tokens: int) -> None:
        self.e.record_tokens(PLATFORM, *route, tokens)
        self.events.append((route, self.clock.now_ms(), "tokens", tokens))

    @rule(route=routes, duration=st.integers(0, 3 * MINUTE), source=st.sampled_from(SOURCES))
    def set_cooldown(self, route: tuple[str, int], duration: int, source: str) -> None:
        self.e.set_cooldown(PLATFORM, *route, duration_ms=duration, source=source)
        cd = self.e.cooldown(PLATFORM, *route)
        if duration > 0:
            assert cd is not None and (cd.expires_at_ms, cd.source) == (self.clock.now_ms() + duration, source)

    @rule(route=routes)
    def clear_cooldown_early(self, route: tuple[str, int]) -> None:
        self.e.clear_cooldown_early(PLATFORM, *route)
        assert not self.e.is_on_cooldown(PLATFORM, *route)

    @rule(
        route=routes,
        status=st.sampled_from([429, 503, 401, 402, 403, 408, 404, None]),
        message=st.sampled_from(LEARNABLE),
        retry_after=st.sampled_from([None, "2", 0.5, "garbage"]),
        kind=st.sampled_from([None, None, "empty_completion", "rate_limit", "other"]),
    )
    def record_failure(
        self, route: tuple[str, int], status: int | None, message: str | None, retry_after: Any, kind: str | None
    ) -> None:
        before = self.e.model_limits(PLATFORM, route[0]) or q.Limits()
        out = self.e.record_failure(
            PLATFORM, *route, status=status, message=message, retry_after=retry_after, kind=kind
        )
        assert out.kind in KINDS
        after = self.e.model_limits(PLATFORM, route[0]) or q.Limits()
        for axis in ("rpm", "rpd", "tpm", "tpd"):  # learning only ever tightens a limit
            b, a = getattr(before, axis), getattr(after, axis)
            assert a == b or (a is not None and (b is None or a < b)), (axis, b, a)
        self.check_outcome(route, out)

    @rule(ms=st.integers(0, 90_000))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(ms=st.integers(1, 3 * MINUTE))
    def step_back(self, ms: int) -> None:
        self.clock.advance(-ms)

    @rule(route=routes, est=st.integers(0, 60))
    def gates(self, route: tuple[str, int], est: int) -> None:
        model, key = route
        on_cd = self.e.is_on_cooldown(PLATFORM, model, key)
        adm = self.e.check(PLATFORM, model, key, est)
        assert adm.allowed == (not on_cd and self.model_allows(route, est))
        assert adm.allowed == (adm.reason is None)
        if not adm.allowed and adm.retry_at_ms is not None:
            assert adm.retry_at_ms > self.clock.now_ms() - 1
        assert self.e.can_make_request(PLATFORM, model, key) in (True, False)

    @rule(
        route=routes,
        bad=st.sampled_from(
            [
                "neg_tokens",
                "key_overflow",
                "float_key",
                "empty",
                "nan_limit",
                "bool_key",
                "neg_duration",
                "bad_source",
                "bad_kind",
                "neg_estimate",
            ]
        ),
    )
    def bad_input(self, route: tuple[str, int], bad: str) -> None:
        model, key = route
        calls: dict[str, tuple[type[Exception], Any]] = {
            "neg_tokens": (ValueError, lambda: self.e.record_tokens(PLATFORM, model, key, -1)),
            "key_overflow": (OverflowError, lambda: self.e.lease(PLATFORM, model, 2**63)),
            "float_key": (TypeError, lambda: self.e.record_request(PLATFORM, model, 1.0)),
            "empty": (ValueError, lambda: self.e.lease(PLATFORM, "", key)),
            "nan_limit": (ValueError, lambda: self.e.check(PLATFORM, model, key, limits={"rpm": float("nan")})),
            "bool_key": (TypeError, lambda: self.e.lease(PLATFORM, model, True)),
            "neg_duration": (ValueError, lambda: self.e.set_cooldown(PLATFORM, model, key, duration_ms=-5)),
            "bad_source": (ValueError, lambda: self.e.set_cooldown(PLATFORM, model, key, source="guess")),
            "bad_kind": (ValueError, lambda: self.e.record_failure(PLATFORM, model, key, kind="meteor")),
            "neg_estimate": (ValueError, lambda: self.e.lease(PLATFORM, model, key, -1)),
        }
        exc, call = calls[bad]
        before = [self.e.usage(PLATFORM, *r) for r in ROUTES]
        with pytest.raises(exc):
            call()
        assert [self.e.usage(PLATFORM, *r) for r in ROUTES] == before

    # -- invariants

    @invariant()
    def usage_matches_the_model(self) -> None:
        for route in ROUTES:
            u = self.e.usage(PLATFORM, *route)
            w = self.windows(route)
            assert {axis: u[axis]["used"] for axis in w} == w, (route, u, w)
            assert u["in_flight"] == self.in_flight(route)[0], route
            assert min(u[axis]["used"] for axis in w) >= 0 and u["in_flight"] >= 0


TestApiMachine = ApiMachine.TestCase
TestApiMachine.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
