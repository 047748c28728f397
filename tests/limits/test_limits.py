"""Limits as data (SPEC §14.1): `Limit(metric, limit, per, scope)`, sliding widths from 1 s to
31 d, calendar day/week/month in the platform's calendar, gate order and reasons, `usage()`
keys, `model_limit_list`, `limits=` as an iterable of `Limit` everywhere, persistence and
retention. Both backends, ManualClock."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import pytest
import quotaengine as q
from moments import DAY, HOUR
from old_schemas import downgrade_schema
from quotaengine import Limit

SEC = 1_000
MIN = 60_000
DEC1 = 1_796_083_200_000  # Tuesday 2026-12-01 00:00 UTC
MON = DEC1 - DAY  # Monday 2026-11-30 00:00 UTC
P, M, K = "mistral", "mistral-small", 1


# ---- the value ----------------------------------------------------------------------------


def test_a_limit_is_a_frozen_hashable_value() -> None:
    a = Limit("requests", 10, "1s", scope="account")
    assert (a.metric, a.limit, a.per, a.scope) == ("requests", 10, "1s", "account")
    assert repr(a) == 'Limit(metric="requests", limit=10, per="1s", scope="account")'
    assert a == Limit("requests", 10, "1s") and hash(a) == hash(Limit("requests", 10, "1s"))
    assert a != Limit("requests", 10, "1s", "key")
    assert len({a, Limit("requests", 10, "1s"), Limit("tokens", 10, "1s")}) == 2
    with pytest.raises(AttributeError):
        a.limit = 3  # type: ignore[misc]


@pytest.mark.parametrize("per", ["1s", "10s", "60s", "1m", "5h", "7d", "31d", "24h", "minute", "day", "week", "month"])
def test_accepted_per_forms(per: str) -> None:
    assert Limit("tokens", 1, per).per == per


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("requests", 1, "hour"), '"minute", "day", "week", "month"'),
        (("requests", 1, "1.5h"), "<N>s"),
        (("requests", 1, "0s"), "1s to 31d"),
        (("requests", 1, "32d"), "1s to 31d"),
        (("requests", 1, "745h"), "1s to 31d"),
        (("requests", 1, ""), "<N>h"),
        (("requests", 1, "-5s"), "<N>s"),
        (("calls", 1, "minute"), '"requests", "tokens", "input_tokens", "output_tokens" or "cost"'),
        (("requests", -1, "minute"), ">= 0"),
    ],
)
def test_bad_limits_are_value_errors_naming_what_is_accepted(args: tuple[str, int, str], needle: str) -> None:
    with pytest.raises(ValueError, match="expected|accepted|>= 0") as err:
        Limit(*args)
    assert needle in str(err.value)


def test_bad_scope_and_types() -> None:
    with pytest.raises(ValueError, match='"account" or "key"'):
        Limit("requests", 1, "minute", "org")
    with pytest.raises(TypeError):
        Limit("requests", 1.5, "minute")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Limit("requests", True, "minute")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Limit(1, 1, "minute")  # type: ignore[arg-type]


# ---- declaring -----------------------------------------------------------------------------


def test_classic_keywords_are_limits_and_the_list_is_in_gate_order(e: q.QuotaEngine) -> None:
    e.set_model_limits(
        P,
        M,
        rpm=60,
        tpd=1_000,
        limits=[
            Limit("tokens", 500_000, "month"),
            Limit("output_tokens", 50, "minute"),
            Limit("requests", 1, "1s"),
            Limit("requests", 5, "minute", "key"),
            Limit("requests", 1_000, "week"),
            Limit("tokens", 100, "5h"),
        ],
    )
    assert e.model_limit_list(P, M) == [
        Limit("requests", 1, "1s"),
        Limit("requests", 5, "minute", "key"),
        Limit("requests", 60, "minute"),
        Limit("requests", 1_000, "week"),
        Limit("tokens", 100, "5h"),
        Limit("tokens", 1_000, "day"),
        Limit("tokens", 500_000, "month"),
        Limit("output_tokens", 50, "minute"),
    ]
    limits = e.model_limits(P, M)
    assert limits is not None and (limits.rpm, limits.rpd, limits.tpm, limits.tpd) == (60, None, None, 1_000)


def test_a_minute_limit_at_account_scope_is_the_classic_rpm(e: q.QuotaEngine) -> None:
    e.set_model_limits(P, M, limits=[Limit("requests", 30, "60s"), Limit("tokens", 9_000, "day")])
    limits = e.model_limits(P, M)
    assert limits is not None and (limits.rpm, limits.tpd) == (30, 9_000)
    # learning tightens it
    learned = e.learn_limit_from_error(P, M, "on requests per minute (RPM): Limit 20, Used 20, Requested 1")
    assert learned is not None and learned.limit == 20
    assert e.model_limits(P, M).rpm == 20  # type: ignore[union-attr]
    assert Limit("requests", 20, "minute") in e.model_limit_list(P, M)
    assert Limit("tokens", 9_000, "day") in e.model_limit_list(P, M)


def test_set_model_limits_replaces_the_whole_declaration(e: q.QuotaEngine) -> None:
    e.set_model_limits(P, M, rpm=5, limits=[Limit("requests", 1, "1s")])
    e.set_model_limits(P, M, tpm=7)
    assert e.model_limit_list(P, M) == [Limit("tokens", 7, "minute")]


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"limits": [Limit("requests", 1, "minute"), Limit("requests", 2, "60s")]}, "declare each window once"),
        ({"limits": [Limit("tokens", 1, "1m"), Limit("tokens", 1, "60s")]}, "declare each window once"),
        ({"rpm": 5, "limits": [Limit("requests", 6, "1m")]}, "rpm="),
        ({"tpd": 5, "limits": [Limit("tokens", 6, "day")]}, "tpd="),
    ],
)
def test_duplicate_windows_are_refused_and_change_nothing(e: q.QuotaEngine, kwargs: dict, needle: str) -> None:  # type: ignore[type-arg]
    e.set_model_limits(P, M, rpd=3, limits=[Limit("requests", 1, "1s")])
    before = e.model_limit_list(P, M)
    with pytest.raises(ValueError, match="same window|declare each window once") as err:
        e.set_model_limits(P, M, **kwargs)
    assert needle in str(err.value)
    assert e.model_limit_list(P, M) == before


def test_a_sliding_day_is_not_the_calendar_day(e: q.QuotaEngine, lclock: q.ManualClock) -> None:
    e.set_model_limits(P, M, limits=[Limit("requests", 100, "day"), Limit("requests", 100, "24h")])
    lclock.set(DEC1 - HOUR)  # yesterday, 23:00 UTC
    e.record_request(P, M, K)
    lclock.set(DEC1 + HOUR)
    u = e.usage(P, M, K)
    assert u["rpd"] == {"used": 0, "limit": 100}
    assert u["requests/24h"] == {"used": 1, "limit": 100}


def test_limits_argument_accepts_an_iterable_of_limits(e: q.QuotaEngine) -> None:
    one_per_second = (Limit("requests", 1, "1s"),)  # a tuple; a generator below
    e.record_request(P, M, K)
    assert not e.check(P, M, K, limits=one_per_second)
    assert e.check(P, M, K, limits=[])
    assert e.usage(P, M, K, limits=(x for x in one_per_second))["requests/1s"] == {"used": 1, "limit": 1}
    assert not e.can_make_request(P, M, K, limits=one_per_second)
    assert e.can_use_tokens(P, M, K, 10, limits=one_per_second)
    with pytest.raises(q.QuotaExceeded) as err:
        e.lease(P, M, K, limits=one_per_second)
    assert err.value.reason == "requests/1s"
    assert e.cooldown_decision_for_limit(P, M, K, limits=one_per_second).source == "heuristic"
    e.register_key(K, P)
    assert e.model_window_used_fraction(P, M, limits=[Limit("requests", 4, "5h")]) == 0.25
    with pytest.raises(TypeError, match="Limit"):
        e.check(P, M, K, limits=["requests/1s"])
    with pytest.raises(TypeError):
        e.check(P, M, K, limits=Limit("requests", 1, "1s"))  # one Limit is not an iterable of them
    with pytest.raises(ValueError, match="declare each window once"):
        e.check(P, M, K, limits=[Limit("requests", 1, "1s"), Limit("requests", 2, "1s")])


# ---- windows -------------------------------------------------------------------------------


def test_a_one_second_window_slides_with_no_upper_edge(e: q.QuotaEngine, lclock: q.ManualClock) -> None:
    e.set_model_limits(P, M, limits=[Limit("requests", 2, "1s")])
    t0 = lclock.now_ms()
    e.lease(P, M, K).success()
    lclock.advance(400)
    e.lease(P, M, K).success()
    a = e.check(P, M, K)
    assert (a.allowed, a.reason, a.retry_at_ms) == (False, "requests/1s", t0 + SEC)
    lclock.set(t0 + SEC - 1)
    assert not e.check(P, M, K)
    lclock.set(t0 + SEC)  # the first event has left: t > now - 1000 no longer holds
    assert e.check(P, M, K)


def test_a_live_lease_counts_in_every_window(e: q.QuotaEngine) -> None:
    e.set_model_limits(P, M, limits=[Limit("requests", 1, "5h"), Limit("tokens", 100, "week")])
    with e.lease(P, M, K, 60):
        a = e.check(P, M, K)
        assert (a.reason, a.retry_at_ms) == ("requests/5h", None)  # only a lease: no retry time
        assert e.usage(P, M, K)["requests/5h"]["used"] == 0  # usage() is recorded usage


def test_token_windows_count_the_estimate(e: q.QuotaEngine, lclock: q.ManualClock) -> None:
    e.set_model_limits(P, M, limits=[Limit("tokens", 1_000, "5h")])
    t0 = lclock.now_ms()
    e.record_tokens(P, M, K, 700)
    assert e.check(P, M, K, 300)
    a = e.check(P, M, K, 301)
    assert (a.reason, a.retry_at_ms) == ("tokens/5h", t0 + 5 * HOUR)
    lclock.advance(4 * HOUR)
    assert not e.check(P, M, K, 301)
    lclock.set(t0 + 5 * HOUR)
    assert e.check(P, M, K, 1_000)


def test_week_windows_start_monday_in_the_platforms_calendar(e: q.QuotaEngine, lclock: q.ManualClock) -> None:
    e.set_model_limits(P, M, limits=[Limit("requests", 2, "week")])
    lclock.set(MON - 1)  # Sunday 23:59:59.999: last week
    e.record_request(P, M, K)
    lclock.set(MON)
    e.record_request(P, M, K)
    assert e.usage(P, M, K)["requests/week"]["used"] == 1
    lclock.set(MON + 6 * DAY + 23 * HOUR)
    e.record_request(P, M, K)
    a = e.check(P, M, K)
    assert (a.reason, a.retry_at_ms) == ("requests/week", MON + 7 * DAY)
    lclock.set(MON + 7 * DAY)
    assert e.check(P, M, K)
    # In Los Angeles the week starts Monday 00:00 Pacific, 08:00 UTC.
    e.set_platform_calendar(P, "America/Los_Angeles")
    lclock.set(MON + 7 * DAY + 7 * HOUR)  # still Sunday in LA
    # That week began Monday 08:00 UTC: the events at Monday 00:00 UTC were Sunday's there.
    assert e.usage(P, M, K)["requests/week"]["used"] == 1
    assert e.check(P, M, K).retry_at_ms is None
    e.record_request(P, M, K)
    assert e.check(P, M, K).retry_at_ms == MON + 7 * DAY + 8 * HOUR


def test_month_windows_start_on_the_first_in_the_platforms_calendar(e: q.QuotaEngine, lclock: q.ManualClock) -> None:
    e.set_model_limits("google", M, limits=[Limit("tokens", 1_000, "month")])
    nov1_pdt = 1_793_516_400_000  # 2026-11-01 00:00 PDT
    dec1_pst = DEC1 + 8 * HOUR
    lclock.set(nov1_pdt - 1)  # October in Los Angeles
    e.record_tokens("google", M, K, 900)
    lclock.set(nov1_pdt + 3 * DAY)
    e.record_tokens("google", M, K, 600)
    a = e.check("google", M, K, 401)
    assert (a.allowed, a.reason, a.retry_at_ms) == (False, "tokens/month", dec1_pst)
    assert e.usage("google", M, K)["tokens/month"] == {"used": 600, "limit": 1_000}
    lclock.set(dec1_pst - 1)  # 2026-12-01 07:59:59 UTC: still November in Los Angeles
    assert not e.check("google", M, K, 401)
    lclock.set(dec1_pst)
    assert e.check("google", M, K, 1_000)


def test_gate_order_decides_the_reason(e: q.QuotaEngine) -> None:
    """Metric, then window (sliding by width, then day, week, month), then scope (key first);
    cooldown first, provider caps after the model's limits."""
    e.set_model_limits(
        P,
        M,
        rpd=1,
        limits=[Limit("requests", 1, "week"), Limit("requests", 1, "5h"), Limit("requests", 1, "minute", "key")],
    )
    e.record_request(P, M, K)
    assert e.check(P, M, K).reason == "rpm"  # minute < 5h < day < week; "rpm" whatever the scope
    e.set_model_limits(P, M, rpm=1, limits=[Limit("requests", 1, "minute", "key")])
    assert e.check(P, M, K).reason == "rpm:key"  # key before account, named apart
    e.set_model_limits(P, M, limits=[Limit("tokens", 0, "1s"), Limit("requests", 1, "month")])
    assert e.check(P, M, K).reason == "requests/month"  # requests before tokens
    e.set_cooldown(P, M, K, 60_000, "heuristic")
    assert e.check(P, M, K).reason == "cooldown"


def test_a_wider_window_declared_later_counts_past_usage(e: q.QuotaEngine, lclock: q.ManualClock) -> None:
    """The engine keeps events only as long as its windows need; a model that starts declaring
    a wider window (or a period) counts what the store holds for it."""
    for _ in range(3):
        e.record_request(P, M, K)
        lclock.advance(HOUR)
    e.set_model_limits(P, M, limits=[Limit("requests", 3, "5h"), Limit("requests", 10, "week")])
    u = e.usage(P, M, K)
    assert (u["requests/5h"]["used"], u["requests/week"]["used"]) == (3, 3)
    assert e.check(P, M, K).reason == "requests/5h"
    # so does an ad hoc limits= window
    assert e.usage(P, M, K, limits=[Limit("requests", 9, "7d")])["requests/7d"]["used"] == 3


def test_input_and_output_token_windows_count_lease_estimates(e: q.QuotaEngine) -> None:
    """Until a call reports the split (SPEC §14.4), an estimate counts as input tokens."""
    e.set_model_limits(P, M, limits=[Limit("input_tokens", 100, "minute"), Limit("output_tokens", 0, "minute")])
    assert e.check(P, M, K, 100)
    a = e.check(P, M, K, 101)
    assert a.reason == "input_tokens/minute"
    u = e.usage(P, M, K)
    assert u["input_tokens/minute"] == {"used": 0, "limit": 100}
    assert u["output_tokens/minute"] == {"used": 0, "limit": 0}


# ---- sharing, persistence, retention ------------------------------------------------------


def test_declared_limits_are_shared_with_other_engines(store: str, lclock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=lclock, env={}) as a, q.QuotaEngine(store, clock=lclock, env={}) as b:
        assert b.check(P, M, K)
        a.set_model_limits(P, M, limits=[Limit("requests", 1, "10s")])
        b.record_request(P, M, K)
        assert a.check(P, M, K).reason == "requests/10s"
        assert b.model_limit_list(P, M) == [Limit("requests", 1, "10s")]
        assert b.check(P, M, K).reason == "requests/10s"


def test_declared_limits_hold_in_another_process(store: str) -> None:
    t = DEC1 + 10 * HOUR
    with q.QuotaEngine(store, clock=q.ManualClock(t), env={}) as e:
        e.set_model_limits(P, M, limits=[Limit("tokens", 50, "month"), Limit("requests", 2, "7d")])
        e.record_tokens(P, M, K, 40)
        e.record_request(P, M, K)
    script = textwrap.dedent(
        f"""
        import quotaengine as q
        e = q.QuotaEngine({store!r}, clock=q.ManualClock({t + 3 * DAY}), env={{}})
        print([repr(x) for x in e.model_limit_list({P!r}, {M!r})])
        print(e.check({P!r}, {M!r}, {K}, 11).reason, e.usage({P!r}, {M!r}, {K})["requests/7d"]["used"])
        e.close()
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    lines = out.stdout.splitlines()
    assert 'per="month"' in lines[0] and 'per="7d"' in lines[0]
    assert lines[1] == "tokens/month 1"


@pytest.mark.sqlite_only
def test_a_plain_reader_still_finds_the_classic_limits(store: str, lclock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=lclock, env={}) as e:
        e.set_model_limits(
            P, M, rpm=10, tpd=500, limits=[Limit("requests", 1, "1s"), Limit("tokens", 9, "month", "key")]
        )
    con = sqlite3.connect(store)
    row = con.execute(
        "SELECT rpm_limit, rpd_limit, tpm_limit, tpd_limit, limits FROM models WHERE platform = ? AND model_id = ?",
        (P, M),
    ).fetchone()
    con.close()
    assert row == (10, None, None, 500, "requests/1s=1 tokens/month:key=9")


@pytest.mark.sqlite_only
def test_a_file_of_schema_3_opens_and_keeps_its_four_limits(store: str, lclock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=lclock, env={}) as e:
        e.set_model_limits(P, M, rpm=5, rpd=100)
        e.record_request(P, M, K)
    con = sqlite3.connect(store)
    with con:  # back to version 3: no limits column
        downgrade_schema(con, 3)
    con.close()
    with q.QuotaEngine(store, clock=lclock, env={}) as e:
        assert e.model_limit_list(P, M) == [Limit("requests", 5, "minute"), Limit("requests", 100, "day")]
        assert e.usage(P, M, K)["rpd"] == {"used": 1, "limit": 100}
        e.set_model_limits(P, M, limits=[Limit("requests", 1, "1s")])
    con = sqlite3.connect(store)
    assert con.execute("PRAGMA user_version").fetchone()[0] >= 4
    assert con.execute("SELECT limits FROM models").fetchall() == [("requests/1s=1",)]
    con.close()


def test_retention_keeps_the_current_period_of_declared_month_limits(store: str) -> None:
    """retention_ms is 1 h, but a month limit needs the month's rows: after a restart the month
    still counts them; the rows of last month (and of undeclared models) go."""
    clock = q.ManualClock(DEC1 - HOUR)  # November
    opts = {"clock": clock, "env": {}, "retention_ms": HOUR}
    with q.QuotaEngine(store, **opts) as e:  # type: ignore[arg-type]
        e.set_model_limits(P, M, limits=[Limit("tokens", 1_000, "month")])
        e.record_tokens(P, M, K, 100)  # last month by the time it is checked
        e.record_tokens("groq", "llama", K, 5)  # no month limit
        clock.set(DEC1 + HOUR)
        e.record_tokens(P, M, K, 200)
        clock.set(DEC1 + 10 * DAY)
        e.record_tokens(P, M, K, 300)  # triggers the sweep
        assert e.usage(P, M, K)["tokens/month"]["used"] == 500
    with q.QuotaEngine(store, **opts) as e:  # type: ignore[arg-type]
        assert e.usage(P, M, K)["tokens/month"]["used"] == 500
        clock.advance(2 * MIN)
        e.record_request("groq", "llama", K)  # another sweep
        kept = e.usage_events(since_ms=0)
        assert sorted(r["tokens"] for r in kept if r["kind"] == "tokens") == [200, 300]


def test_retention_keeps_the_month_only_for_the_models_that_declare_it(store: str) -> None:
    """SPEC 14.2 read per model: the month limit of model A keeps A's rows of this month (in
    its own platform's calendar), while every other model's rows go at retention_ms (SPEC 10)
    and A's rows of last month go too. A's month limit still refuses after a reopen and in a
    second engine."""
    clock = q.ManualClock(DEC1 - HOUR)  # Monday 2026-11-30 23:00 UTC
    opts = {"clock": clock, "env": {}, "retention_ms": HOUR}
    a, b = "model-a", "model-b"
    # Google's month starts at 00:00 Pacific: 08:00 UTC on Dec 1.
    g = ("google", "gemini-month")
    with q.QuotaEngine(store, **opts) as e:  # type: ignore[arg-type]
        e.set_model_limits(P, a, limits=[Limit("requests", 3, "month")])
        e.set_model_limits(*g, limits=[Limit("requests", 10, "month")])
        for model in (a, b):
            e.record_request(P, model, K)  # November
        clock.set(DEC1 + HOUR)  # 01:00 UTC: this month for A, still November in Pacific time
        for model in (a, b):
            e.record_request(P, model, K)
        e.record_request(*g, K)
        clock.set(DEC1 + 9 * HOUR)  # 09:00 UTC: December in Pacific time too
        e.record_request(*g, K)
        clock.set(DEC1 + 10 * HOUR)
        e.record_request(P, a, K)  # a sweep: 09:00 UTC and later stays for undeclared models
        e.record_request(P, b, K)

        def rows() -> list[tuple[str, str, int]]:
            return [(r["platform"], r["model_id"], r["created_at_ms"]) for r in e.usage_events(since_ms=0)]

        assert sorted(rows()) == sorted(
            [
                (P, a, DEC1 + HOUR),  # A's month: kept past the hour of retention
                (P, a, DEC1 + 10 * HOUR),
                (P, b, DEC1 + 10 * HOUR),  # B keeps only the last hour
                ("google", g[1], DEC1 + 9 * HOUR),  # Google's month began at 08:00 UTC
            ]
        )
        assert e.usage(P, a, K)["requests/month"]["used"] == 2
        e.record_request(P, a, K)
        assert not e.check(P, a, K).allowed
    with q.QuotaEngine(store, **opts) as e, q.QuotaEngine(store, **opts) as other:  # type: ignore[arg-type]
        clock.advance(2 * MIN)
        e.record_request(P, b, K)  # another sweep, by the reopened engine
        assert other.usage(P, a, K)["requests/month"]["used"] == 3
        refused = other.check(P, a, K)
        assert (refused.allowed, refused.reason) == (False, "requests/month")
        assert not e.check(P, a, K).allowed
        assert e.check(P, b, K).allowed
        assert sorted(r["created_at_ms"] for r in e.usage_events(since_ms=0, model_id=b)) == [
            DEC1 + 10 * HOUR,
            DEC1 + 10 * HOUR + 2 * MIN,
        ]


def test_a_week_limit_keeps_the_rows_it_counts_and_no_others(store: str) -> None:
    """SPEC 24.3: a model's week limit keeps that model's rows past the retention, a platform's
    week limit every model's of that platform, and no other rows stay: after the sweeps, and
    after a reopen whose first call is a sweep, both weeks still count what they counted."""
    clock = q.ManualClock(DEC1 + 10 * HOUR)  # a Tuesday: the week began on Monday
    t0 = clock.now_ms()
    opts = {"clock": clock, "env": {}, "retention_ms": HOUR}
    routes = [(P, "weekly"), (P, "plain"), ("plat", "a"), ("plat", "b"), ("elsewhere", "a")]

    def old(e: q.QuotaEngine) -> list[tuple[str, str]]:
        return sorted((r["platform"], r["model_id"]) for r in e.usage_events(since_ms=0) if r["created_at_ms"] == t0)

    with q.QuotaEngine(store, **opts) as e:  # type: ignore[arg-type]
        e.set_model_limits(P, "weekly", limits=[Limit("requests", 100, "week")])
        e.set_platform_limits("plat", [Limit("requests", 100, "week")])
        for platform, model in routes:
            e.record_request(platform, model, K)
        clock.advance(3 * HOUR)
        e.record_request("z", "z", K)  # a sweep
        clock.advance(2 * MIN)
        e.record_request("z", "z", K)  # and another
        assert old(e) == [(P, "weekly"), ("plat", "a"), ("plat", "b")]
    clock.advance(2 * MIN)
    with q.QuotaEngine(store, **opts) as f:  # type: ignore[arg-type]
        f.record_request("z", "z", K)  # the reopened engine's first sweep
        assert old(f) == [(P, "weekly"), ("plat", "a"), ("plat", "b")]
        assert f.usage(P, "weekly", K)["requests/week"]["used"] == 1
        assert f.usage("plat", "a", K)["platform:requests/week"] == {"used": 2, "limit": 100}


def test_retention_of_a_kept_model_follows_its_sliding_window_across_sweeps(store: str) -> None:
    """A declared 3 h sliding window keeps that model's last 3 h, sweep after sweep, while a
    model declaring a month keeps its month and an undeclared one keeps retention_ms: each
    model's rows go at its own cut-off as the clock moves on."""
    clock = q.ManualClock(DEC1 + HOUR)
    opts = {"clock": clock, "env": {}, "retention_ms": HOUR}
    with q.QuotaEngine(store, **opts) as e:  # type: ignore[arg-type]
        e.set_model_limits(P, "slide", limits=[Limit("requests", 100, "3h")])
        e.set_model_limits(P, "month", limits=[Limit("requests", 100, "month")])
        for _ in range(8):  # a request of each model every 30 min, 01:00 to 04:30
            for model in ("slide", "month", "plain"):
                e.record_request(P, model, K)
            clock.advance(30 * MIN)
        now = clock.now_ms()  # 05:00
        e.record_request(P, "plain", K)

        def times(model: str) -> list[int]:
            return [(r["created_at_ms"] - DEC1) // MIN for r in e.usage_events(since_ms=0, model_id=model)]

        assert times("month") == [60 + 30 * i for i in range(8)]
        assert now == DEC1 + 300 * MIN
        assert times("slide") == [150, 180, 210, 240, 270]  # the last 3 h (t > now - 3 h)
        assert times("plain") == [240, 270, 300]  # the last hour
        assert e.usage(P, "slide", K)["requests/3h"]["used"] == len(times("slide"))


def test_a_sweep_of_many_rows_among_kept_ones_finishes_at_the_next_calls(store: str) -> None:
    """Between the rows a month limit keeps, 25,000 rows of an undeclared model pass the
    retention at once. The sweep deletes them in bounded steps (20,000 ids of SQLite, or
    feed entries of Redis, per step), the next step at the next call rather than a minute
    later: two calls on, none is left, and the month's rows all are."""
    clock = q.ManualClock(DEC1 + HOUR)
    opts = {"clock": clock, "env": {}, "retention_ms": HOUR}
    with q.QuotaEngine(store, **opts, flush_interval_ms=MIN) as e:  # type: ignore[arg-type]
        e.set_model_limits(P, "kept", limits=[Limit("requests", 10**6, "month")])
        for i in range(25_000):  # grouped: written together when the engine closes
            e.record_request(P, "plain", K)
            if i % 1_000 == 0:
                e.record_request(P, "kept", K)
    with q.QuotaEngine(store, **opts) as e:  # type: ignore[arg-type]
        e.record_request(P, "other", K)  # this engine's first sweep: nothing is due yet
        assert len(e.usage_events(since_ms=0, model_id="plain")) == 25_000
        clock.set(DEC1 + 3 * HOUR)
        e.record_request(P, "other", K)  # a sweep
        e.record_request(P, "other", K)  # and, when it stopped at its bound, the rest
        assert e.usage_events(since_ms=0, model_id="plain") == []
        assert len(e.usage_events(since_ms=0, model_id="kept")) == 25
        assert e.usage(P, "kept", K)["requests/month"]["used"] == 25


def test_after_a_step_back_of_the_clock_each_model_keeps_its_own_rows(store: str) -> None:
    """Rows written after the clock stepped back (SPEC 10: the sweep runs again then) go by
    the same per-model rule: an undeclared model's at retention_ms, a month model's at the
    start of its month."""
    t = DEC1 + 10 * HOUR
    clock = q.ManualClock(t)
    with q.QuotaEngine(store, clock=clock, env={}, retention_ms=HOUR) as e:
        e.set_model_limits(P, "month", limits=[Limit("requests", 100, "month")])

        def minutes(model: str) -> list[int]:
            return sorted((r["created_at_ms"] - t) // MIN for r in e.usage_events(since_ms=0, model_id=model))

        for model in ("month", "plain"):
            e.record_request(P, model, K)  # 10:00
        clock.advance(2 * MIN)
        e.record_request(P, "plain", K)  # 10:02, a sweep
        clock.set(t - 2 * HOUR)  # the clock steps back to 08:00
        for model in ("month", "plain"):
            e.record_request(P, model, K)
        clock.set(t - 2 * HOUR + 90 * MIN)  # 09:30: the retention keeps 08:30 on
        e.record_request(P, "plain", K)
        assert minutes("plain") == [-30, 0, 2]
        assert minutes("month") == [-120, 0]
        assert e.usage(P, "month", K)["requests/month"]["used"] == 2


# ---- where a user looks ---------------------------------------------------------------------


def test_the_snapshot_shows_every_declared_limit(e: q.QuotaEngine) -> None:
    pd = pytest.importorskip("pandas")
    e.set_model_limits(P, M, rpm=10, limits=[Limit("requests", 4, "1s"), Limit("tokens", 1_000, "month")])
    e.lease(P, M, K, 10).success(tokens=100)
    e.record_request("groq", "llama", 2)  # declares nothing
    snap = e.snapshot()
    assert snap.declared == ["requests/1s", "tokens/month"]
    mine = next(r for r in snap if r["platform"] == P)
    assert (mine["requests/1s_used"], mine["requests/1s_limit"]) == (1, 4)
    assert (mine["tokens/month_used"], mine["tokens/month_limit"]) == (100, 1_000)
    assert mine["used_fraction"] == 0.25  # the worst of every declared limit
    other = next(r for r in snap if r["platform"] == "groq")
    assert other["requests/1s_used"] is None
    df = snap.to_pandas()
    at = list(df.columns).index("tpd_limit")
    assert list(df.columns)[at + 1 : at + 5] == [
        "requests/1s_used",
        "requests/1s_limit",
        "tokens/month_used",
        "tokens/month_limit",
    ]
    assert str(df["tokens/month_used"].dtype) == "Int64"
    assert pd.isna(df.loc[df.platform == "groq", "requests/1s_limit"]).all()
    text = str(snap)
    assert "requests/1s" in text and "1/4" in text and "100/1000" in text
    html = snap._repr_html_()
    assert "<th>tokens/month</th>" in html and "100/1,000" in html


def test_no_extra_columns_when_no_route_declares_more(e: q.QuotaEngine) -> None:
    e.set_model_limits(P, M, rpm=10)
    e.record_request(P, M, K)
    snap = e.snapshot()
    assert snap.declared == []
    assert "requests/" not in str(snap)


def test_analysis_shows_every_declared_limit(e: q.QuotaEngine) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("pandas")
    from quotaengine import analysis

    e.set_model_limits(P, M, rpm=10, limits=[Limit("tokens", 1_000, "week")])
    e.lease(P, M, K, 10).success(tokens=250)
    e.record_request("groq", "llama", 2)
    state = analysis.state_frame(e)
    assert list(state.loc[state.platform == P, "tokens/week_used"]) == [250]
    image = analysis.plot_utilisation(e).axes[0].images[0].get_array()
    assert image.shape == (2, 5)  # routes x (rpm, rpd, tpm, tpd, tokens/week)
    groq, mine = (0, 1) if state.iloc[0].platform == "groq" else (1, 0)
    assert image[mine, 4] == 0.25
    assert image.mask[groq, 4] or image[groq, 4] != image[groq, 4]  # NaN: not declared there
