"""Provider calendars (SPEC §14.2): a platform's day starts at 00:00 in its IANA zone, DST
honoured; `set_platform_calendar` (persisted, shared) wins over PROVIDER_DAY_TZ_<PLATFORM>,
which wins over the built-in zone (google: America/Los_Angeles; others UTC). Every "midnight"
of sections 4-12 is the platform's day. Both backends, ManualClock."""

from __future__ import annotations

import pytest
import quotaengine as q
from moments import DAY, HOUR
from old_schemas import downgrade_schema

JAN1 = 1_767_225_600_000  # 2026-01-01 00:00 UTC
PST_MIDNIGHT = JAN1 + 8 * HOUR  # 2026-01-01 00:00 PST
MAR8_PST = 1_772_956_800_000  # 2026-03-08 00:00 PST (spring forward)
NOV1_PDT = 1_793_516_400_000  # 2026-11-01 00:00 PDT (fall back)
M, K = "gemini-2.5-flash", 1


@pytest.fixture
def cal_clock() -> q.ManualClock:
    return q.ManualClock(PST_MIDNIGHT + 12 * HOUR)


@pytest.fixture
def cal(store: str, cal_clock: q.ManualClock) -> q.QuotaEngine:
    e = q.QuotaEngine(store, clock=cal_clock, env={})
    yield e  # type: ignore[misc]
    e.close()


def test_built_in_calendars(cal: q.QuotaEngine) -> None:
    assert cal.platform_calendar("google") == "America/Los_Angeles"
    assert cal.platform_calendar("groq") == "UTC"
    assert cal.platform_calendar("openrouter") == "UTC"


def test_days_follow_daylight_saving_time(cal: q.QuotaEngine) -> None:
    assert cal.day_start_ms("google", PST_MIDNIGHT + 5 * HOUR) == PST_MIDNIGHT
    assert cal.next_day_start_ms("google", PST_MIDNIGHT) == PST_MIDNIGHT + DAY
    # 23 h on the spring-forward Sunday, 25 h on the fall-back Sunday.
    assert cal.next_day_start_ms("google", MAR8_PST + HOUR) - cal.day_start_ms("google", MAR8_PST + HOUR) == 23 * HOUR
    assert cal.next_day_start_ms("google", NOV1_PDT + 24 * HOUR) - NOV1_PDT == 25 * HOUR
    assert cal.day_start_ms("google", NOV1_PDT + 24 * HOUR) == NOV1_PDT
    # The first instant of a day belongs to it.
    assert cal.day_start_ms("google", NOV1_PDT) == NOV1_PDT
    assert cal.day_start_ms("google", NOV1_PDT - 1) == NOV1_PDT - 24 * HOUR
    # UTC platforms: midnight UTC; the default instant is now.
    assert cal.day_start_ms("groq") == JAN1
    assert cal.next_day_start_ms("groq") == JAN1 + DAY


def test_daily_windows_reset_at_the_platforms_midnight(store: str) -> None:
    """Gemini's daily quota resets at midnight Pacific: a request at 23:30 PST fills rpd=1 until
    08:00 UTC, not 00:00 UTC; a UTC platform's day resets at 00:00 UTC."""
    clock = q.ManualClock(JAN1 + 7 * HOUR + 30 * 60_000)  # Jan 1 07:30 UTC = Dec 31 23:30 PST
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        e.set_model_limits("google", M, rpd=1)
        e.set_model_limits("groq", M, rpd=1)
        e.record_request("google", M, K)
        e.record_request("groq", M, K)
        clock.set(PST_MIDNIGHT - 1)
        a = e.check("google", M, K)
        assert (a.allowed, a.reason, a.retry_at_ms) == (False, "rpd", PST_MIDNIGHT)
        assert not e.check("groq", M, K).allowed
        assert e.check("groq", M, K).retry_at_ms == JAN1 + DAY
        assert e.usage("google", M, K)["rpd"]["used"] == 1
        clock.set(PST_MIDNIGHT)
        assert e.check("google", M, K).allowed
        assert e.usage("google", M, K)["rpd"]["used"] == 0
        e.lease("google", M, K).success()
    with q.QuotaEngine(store, clock=clock, env={}) as again:  # what a restart loads
        assert not again.check("google", M, K).allowed
        assert again.usage("google", M, K)["rpd"]["used"] == 1


def test_provider_daily_caps_and_the_daily_quota_bench_use_the_platforms_day(cal: q.QuotaEngine) -> None:
    cal.set_provider_caps("google", daily_requests=1)
    cal.record_request("google", M, K)
    a = cal.check("google", "other-model", K)
    assert (a.reason, a.retry_at_ms) == ("provider_daily_requests", PST_MIDNIGHT + DAY)
    out = cal.record_failure("google", M, 2, kind="daily_quota")
    assert out.cooldown is not None
    assert cal.now_ms() + out.cooldown.duration_ms == PST_MIDNIGHT + DAY  # until midnight Pacific


def test_set_platform_calendar_is_persisted_and_shared(store: str, cal_clock: q.ManualClock) -> None:
    with (
        q.QuotaEngine(store, clock=cal_clock, env={}) as a,
        q.QuotaEngine(store, clock=cal_clock, env={}) as b,
    ):
        a.set_model_limits("groq", M, rpd=1)
        assert b.platform_calendar("groq") == "UTC"
        # 20:00 UTC Jan 1 is 05:00 Jan 2 in Tokyo: Tokyo's day began at 15:00 UTC.
        a.set_platform_calendar("groq", "Asia/Tokyo")
        assert b.platform_calendar("groq") == "Asia/Tokyo"  # the other engine, at its next call
        tokyo_day = JAN1 + 15 * HOUR
        assert b.day_start_ms("groq") == tokyo_day
        cal_clock.set(tokyo_day - 1)
        b.record_request("groq", M, K)
        assert not a.check("groq", M, K).allowed
        cal_clock.set(tokyo_day)
        assert a.check("groq", M, K).allowed  # a new Tokyo day
        assert b.check("groq", M, K).allowed
    with q.QuotaEngine(store, clock=cal_clock, env={}) as c:
        assert c.platform_calendar("groq") == "Asia/Tokyo"
        c.set_platform_calendar("groq", None)  # forgotten: the built-in zone again
        assert c.platform_calendar("groq") == "UTC"
    with q.QuotaEngine(store, clock=cal_clock, env={}) as d:
        assert d.platform_calendar("groq") == "UTC"


def test_a_calendar_changed_by_another_engine_recounts_the_day_windows(store: str, cal_clock: q.ManualClock) -> None:
    """Usage already counted by an engine follows a zone another engine sets afterwards."""
    cal_clock.set(JAN1 + 20 * HOUR)
    with (
        q.QuotaEngine(store, clock=cal_clock, env={}) as a,
        q.QuotaEngine(store, clock=cal_clock, env={}) as b,
    ):
        a.set_model_limits("groq", M, rpd=2)
        cal_clock.set(JAN1 + 10 * HOUR)
        a.record_request("groq", M, K)  # 10:00 UTC: before Tokyo's day (15:00 UTC)
        cal_clock.set(JAN1 + 20 * HOUR)
        a.record_request("groq", M, K)
        assert b.usage("groq", M, K)["rpd"]["used"] == 2
        a.set_platform_calendar("groq", "Asia/Tokyo")
        assert b.usage("groq", M, K)["rpd"]["used"] == 1
        assert a.usage("groq", M, K)["rpd"]["used"] == 1
        assert b.check("groq", M, K).allowed


def test_environment_zone_and_what_wins(store: str, cal_clock: q.ManualClock) -> None:
    env = {"PROVIDER_DAY_TZ_GROQ": "Europe/Warsaw", "PROVIDER_DAY_TZ_GOOGLE": "UTC"}
    with q.QuotaEngine(store, clock=cal_clock, env=env) as e:
        assert e.platform_calendar("groq") == "Europe/Warsaw"
        assert e.platform_calendar("google") == "UTC"  # the environment wins over the built-in
        assert e.day_start_ms("groq") == JAN1 - HOUR  # Warsaw is UTC+1 in January
        e.set_platform_calendar("groq", "America/New_York")  # stored wins over the environment
        assert e.platform_calendar("groq") == "America/New_York"
        e.set_platform_calendar("groq", None)
        assert e.platform_calendar("groq") == "Europe/Warsaw"


def test_an_unknown_zone_in_the_environment_is_a_warning_and_the_built_in_stands(
    store: str, cal_clock: q.ManualClock
) -> None:
    with q.QuotaEngine(store, clock=cal_clock, env={"PROVIDER_DAY_TZ_GOOGLE": "Pacific/Nowhere"}) as e:
        assert e.platform_calendar("google") == "America/Los_Angeles"
    with q.QuotaEngine(store, clock=cal_clock, env={}) as reader:
        rows = [r for r in reader.server_logs() if "PROVIDER_DAY_TZ_GOOGLE" in r["message"]]
    assert len(rows) == 1 and rows[0]["level"] == "warn" and "Pacific/Nowhere" in rows[0]["message"]


def test_bad_calendar_input_changes_nothing(cal: q.QuotaEngine) -> None:
    cal.set_platform_calendar("groq", "Asia/Tokyo")
    with pytest.raises(ValueError, match="IANA"):
        cal.set_platform_calendar("groq", "Mars/Olympus_Mons")
    with pytest.raises(ValueError, match="IANA"):
        cal.set_platform_calendar("groq", "")
    with pytest.raises(TypeError):
        cal.set_platform_calendar("groq", 9)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        cal.set_platform_calendar("", "UTC")
    with pytest.raises(TypeError):
        cal.day_start_ms("groq", 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        cal.platform_calendar("")
    assert cal.platform_calendar("groq") == "Asia/Tokyo"


def test_readonly_engine_reads_the_stored_calendar(store: str, cal_clock: q.ManualClock) -> None:
    if "://" in store:
        pytest.skip("readonly is tested on the file")
    with q.QuotaEngine(store, clock=cal_clock, env={}) as e:
        e.set_platform_calendar("groq", "Asia/Kolkata")
    with q.QuotaEngine(store, clock=cal_clock, env={}, readonly=True) as ro:
        assert ro.platform_calendar("groq") == "Asia/Kolkata"
        with pytest.raises(q.DatabaseError):
            ro.set_platform_calendar("groq", "UTC")


@pytest.mark.sqlite_only
def test_a_file_of_the_previous_schema_opens_and_keeps_its_limits(store: str, cal_clock: q.ManualClock) -> None:
    """Schema version 2 (before calendars) is migrated forward on open: its rows and limits
    stay, and calendars can be set in it."""
    import sqlite3

    with q.QuotaEngine(store, clock=cal_clock, env={}) as e:
        e.set_model_limits("google", M, rpm=5, rpd=100)
        e.record_request("google", M, K)
    con = sqlite3.connect(store)
    with con:  # back to version 2: no platform_calendars
        downgrade_schema(con, 2)
    con.close()
    with q.QuotaEngine(store, clock=cal_clock, env={}) as e:
        limits = e.model_limits("google", M)
        assert limits is not None and (limits.rpm, limits.rpd) == (5, 100)
        assert e.usage("google", M, K)["rpd"]["used"] == 1
        e.set_platform_calendar("google", "UTC")
        assert e.platform_calendar("google") == "UTC"
    con = sqlite3.connect(store)
    assert con.execute("PRAGMA user_version").fetchone()[0] >= 3
    assert con.execute("SELECT platform, tz FROM platform_calendars").fetchall() == [("google", "UTC")]
    con.close()
