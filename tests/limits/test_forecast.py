"""SPEC 22.2: `forecast()` for windows of an hour or more, calendar windows and daily
provider caps; `exhausts_at_ms` in snapshot rows, `to_pandas()`, the HTML snapshot and
`quotaengine status` (a local time); on both backends."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time
import zoneinfo
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import quotaengine as q
from moments import DAY, HOUR, MINUTE, T0, TEN_AM

P, M, K = "groq", "llama", 1
LOOKBACK = 600_000
MIDNIGHT = T0 + DAY  # the day after TEN_AM's


def requests(e: q.QuotaEngine, n: int, model: str = M, key: int = K) -> None:
    for _ in range(n):
        e.record_request(P, model, key)


def test_the_keys_are_the_long_windows_as_usage_keys_them_and_the_daily_caps(engine: q.QuotaEngine) -> None:
    engine.set_model_limits(
        P,
        M,
        rpm=10,
        rpd=1000,
        tpm=100,
        tpd=10_000,
        limits=[
            q.Limit("requests", 100, "10m"),  # shorter than an hour: not forecast
            q.Limit("requests", 100, "59m"),
            q.Limit("requests", 100, "1h"),
            q.Limit("tokens", 10**6, "week"),
            q.Limit("output_tokens", 10**6, "month"),
            q.Limit("requests", 50, "5h", scope="key"),
            q.Limit("requests", 60, "5h"),
        ],
    )
    engine.set_provider_caps(P, daily_requests=500, minute_requests=40, daily_tokens=10**5)
    f = engine.forecast(P, M, K)
    assert list(f) == [  # gate order
        "requests/1h",
        "requests/5h:key",
        "requests/5h",
        "rpd",
        "tpd",
        "tokens/week",
        "output_tokens/month",
        "provider_daily_requests",
        "provider_daily_tokens",
    ]
    assert set(f) <= set(engine.usage(P, M, K)) | {"provider_daily_requests", "provider_daily_tokens"}
    assert all(v is None for v in f.values())  # nothing used: no pace
    engine.set_model_limits(P, M, rpm=10)
    engine.reset_provider_caps(P)
    assert engine.forecast(P, M, K) == {}


def test_now_plus_what_is_left_over_the_pace_of_the_lookback(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.set_model_limits(P, M, rpd=1000)
    requests(engine, 10)  # at 10:00, outside the lookback at 10:15
    clock.advance(6 * MINUTE)
    requests(engine, 12)  # at 10:06
    clock.advance(6 * MINUTE)
    requests(engine, 8)  # at 10:12
    clock.advance(3 * MINUTE)
    held = engine.lease(P, M, K)  # in flight: counts in what is left, not in the pace
    now = TEN_AM + 15 * MINUTE
    left = 1000 - 30 - 1
    assert engine.forecast(P, M, K) == {"rpd": now + left * LOOKBACK // 20}
    # another lookback: the last 5 minutes hold the 8 of 10:12
    assert engine.forecast(P, M, K, lookback_ms=5 * MINUTE) == {"rpd": now + left * 5 * MINUTE // 8}
    # an event exactly lookback_ms ago is not in it (t > now - lookback_ms)
    assert engine.forecast(P, M, K, lookback_ms=3 * MINUTE) == {"rpd": None}
    assert engine.forecast(P, M, K, lookback_ms=3 * MINUTE + 1) == {"rpd": now + left * (3 * MINUTE + 1) // 8}
    # a longer lookback than any asked before: the 30 of the last 20 minutes
    assert engine.forecast(P, M, K, lookback_ms=20 * MINUTE) == {"rpd": now + left * 20 * MINUTE // 30}
    held.release()


def test_a_spent_window_reports_now_whatever_the_pace(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.set_model_limits(P, M, rpd=5, tpd=100)
    requests(engine, 4)
    engine.record_tokens(P, M, K, 100)
    clock.advance(HOUR)  # nothing in the lookback: the pace is 0
    held = engine.acquire_lease(P, M, K)  # the fifth request, in flight
    now = TEN_AM + HOUR
    assert engine.forecast(P, M, K) == {"rpd": now, "tpd": now}
    engine.release_lease(held)
    assert engine.forecast(P, M, K) == {"rpd": None, "tpd": now}


def test_none_at_or_after_the_reset_but_a_sliding_window_never_resets(
    engine: q.QuotaEngine, clock: q.ManualClock
) -> None:
    engine.set_model_limits(P, M, rpd=1000, limits=[q.Limit("requests", 1000, "24h")])
    requests(engine, 1)
    f = engine.forecast(P, M, K)
    # 999 left at 1 per 10 minutes: 166.5 h from now, long past midnight
    assert f == {"requests/24h": TEN_AM + 999 * LOOKBACK, "rpd": None}
    engine.set_model_limits(P, M, rpd=1 + 84)  # 84 left at that pace: 14 h, exactly at midnight
    assert engine.forecast(P, M, K) == {"rpd": None}
    engine.set_model_limits(P, M, rpd=1 + 83)  # 83 left: 13 h 50 min, before it
    assert engine.forecast(P, M, K) == {"rpd": TEN_AM + 83 * LOOKBACK}
    assert TEN_AM + 84 * LOOKBACK == MIDNIGHT


def test_calendar_weeks_and_months_and_token_kinds(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.set_model_limits(
        P, M, limits=[q.Limit("tokens", 100_000, "week"), q.Limit("input_tokens", 3_000_000, "month")]
    )
    engine.record_tokens(P, M, K, input_tokens=900, output_tokens=100, cached_tokens=400)
    f = engine.forecast(P, M, K)
    monday = T0 + 4 * DAY  # 2026-01-01 is a Thursday
    assert f["tokens/week"] == TEN_AM + (100_000 - 1000) * LOOKBACK // 1000
    assert f["tokens/week"] < monday
    # input tokens count less the cached part: 500 per 10 min, 2999500 left runs past February
    assert f["input_tokens/month"] is None
    engine.set_model_limits(P, M, limits=[q.Limit("input_tokens", 10_000, "month")])
    assert engine.forecast(P, M, K) == {"input_tokens/month": TEN_AM + 9_500 * LOOKBACK // 500}


def test_the_scope_of_a_limit_is_the_scope_of_its_pace(engine: q.QuotaEngine) -> None:
    engine.register_key(1, P, account="org")
    engine.register_key(2, P, account="org")
    engine.register_key(3, P)  # another account
    engine.set_model_limits(P, M, rpd=100, limits=[q.Limit("requests", 1000, "1h", scope="key")])
    requests(engine, 2, key=1)
    requests(engine, 3, key=2)
    requests(engine, 7, key=3)
    requests(engine, 9, model="other", key=2)
    f = engine.forecast(P, M, 1)
    assert f == {
        "requests/1h": TEN_AM + (1000 - 2) * LOOKBACK // 2,  # the key's own
        "rpd": TEN_AM + (100 - 5) * LOOKBACK // 5,  # the account's, on this model
    }


def test_daily_provider_caps_count_the_account_and_bill_tokens(engine: q.QuotaEngine) -> None:
    engine.set_provider_caps(P, daily_requests=100, daily_tokens=10_000)
    engine.set_model_limits(P, "double", monthly_token_budget="150K/day · 2x")
    engine.register_key(1, P, account="org")
    engine.register_key(2, P, account="org")
    requests(engine, 3, model="a", key=1)
    requests(engine, 2, model="b", key=2)
    engine.record_tokens(P, "double", 2, 100)  # billed 200
    engine.record_tokens(P, "a", 1, 300)  # billed 300
    held = engine.lease(P, "double", 1, 50)  # a request in flight, 100 billed tokens
    f = engine.forecast(P, M, 1)
    assert f == {
        "provider_daily_requests": TEN_AM + (100 - 5 - 1) * LOOKBACK // 5,
        "provider_daily_tokens": TEN_AM + (10_000 - 500 - 100) * LOOKBACK // 500,
    }
    held.release()


@pytest.mark.parametrize(
    ("lookback", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (1.5, TypeError),
        (True, TypeError),
        ("600000", TypeError),
        (2**63, OverflowError),
    ],
)
def test_a_bad_lookback_is_refused(engine: q.QuotaEngine, lookback: Any, error: type) -> None:
    engine.set_model_limits(P, M, rpd=10)
    with pytest.raises(error):
        engine.forecast(P, M, K, lookback_ms=lookback)
    with pytest.raises(ValueError):
        engine.forecast("", M, K)
    with pytest.raises(TypeError):
        engine.forecast(P, M, "1")  # type: ignore[arg-type]
    assert engine.forecast(P, M, K, lookback_ms=None) == {"rpd": None}  # type: ignore[arg-type]


def test_another_engine_forecasts_what_this_one_recorded(store: str, clock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=clock, env={}) as a, q.QuotaEngine(store, clock=clock, env={}) as b:
        a.set_model_limits(P, M, rpd=100)
        requests(a, 4)
        assert b.forecast(P, M, K) == {"rpd": TEN_AM + 96 * LOOKBACK // 4}


# ============================================================================ snapshot


def test_snapshot_rows_and_pandas_carry_the_earliest_forecast(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.set_model_limits(P, M, rpd=500, tpd=3000)
    requests(engine, 10)
    engine.record_tokens(P, M, K, 1000)
    requests(engine, 1, model="free")  # no limits: no forecast
    rows = {r["model_id"]: r for r in engine.snapshot()}
    f = engine.forecast(P, M, K)
    assert f == {"rpd": TEN_AM + 490 * LOOKBACK // 10, "tpd": TEN_AM + 2000 * LOOKBACK // 1000}
    assert rows[M]["exhausts_at_ms"] == min(f.values()) == TEN_AM + 20 * MINUTE
    assert rows["free"]["exhausts_at_ms"] is None
    assert list(rows[M])[-2:] == ["cooldown_expires_at_ms", "exhausts_at_ms"]
    df = engine.snapshot().to_pandas()
    assert list(df.columns)[-2:] == ["cooldown_expires_at_ms", "exhausts_at_ms"]
    assert df.set_index("model_id").exhausts_at_ms.to_dict()[M] == TEN_AM + 20 * MINUTE
    assert str(df.exhausts_at_ms.dtype) == "Int64"


def test_html_and_text_show_a_local_time_with_the_date_when_not_today(
    engine: q.QuotaEngine, clock: q.ManualClock, local_zone: Callable[[str], None]
) -> None:
    engine.set_model_limits(P, M, rpd=1000)
    requests(engine, 10)  # 990 left at 10 per 10 min: 16 h 30 min, past midnight
    assert engine.forecast(P, M, K) == {"rpd": None}
    engine.set_model_limits(P, M, rpd=610)  # 600 left: 10 h, 20:00 UTC
    snap = engine.snapshot()
    assert snap.rows[0]["exhausts_at_ms"] == TEN_AM + 10 * HOUR
    local_zone("UTC")
    assert "20:00" in snap._repr_html_() and str(snap).splitlines()[-1].split()[-1] == "20:00"
    local_zone("Asia/Tokyo")  # 19:00 there now, and 05:00 tomorrow when it runs out
    assert "2026-01-02 05:00" in snap._repr_html_()
    assert str(snap).splitlines()[-1].split()[-2:] == ["2026-01-02", "05:00"]
    local_zone("America/New_York")  # 05:00 now, 15:00 then: today
    assert str(snap).splitlines()[-1].split()[-1] == "15:00"
    assert ">15:00</td>" in snap._repr_html_()


def test_quotaengine_status_shows_the_local_time(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    zone = "Asia/Kathmandu"  # UTC+05:45: no whole-hour offset
    with q.QuotaEngine(db, env={}) as e:
        e.set_model_limits(P, M, limits=[q.Limit("tokens", 1000, "5h")])
        e.record_tokens(P, M, K, 500)  # 500 left at 500 per 10 min: 10 minutes from now
    before = int(time.time() * 1000)
    r = subprocess.run(
        [sys.executable, "-m", "quotaengine", "status", "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TZ": zone},
    )
    after = int(time.time() * 1000)
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stdout.splitlines() if line.startswith("platform"))
    assert header.split()[-2:] == ["runs", "out"]
    row = next(line for line in r.stdout.splitlines() if line.startswith("groq"))
    tz = zoneinfo.ZoneInfo(zone)

    def shown(ms: int) -> str:
        at = datetime.datetime.fromtimestamp(ms / 1000, tz)
        today = datetime.datetime.fromtimestamp(before / 1000, tz).date()
        return at.strftime("%H:%M") if at.date() == today else at.strftime("%Y-%m-%d %H:%M")

    # the pace was read at some moment between `before` and `after`
    assert any(row.endswith(shown(t + LOOKBACK)) for t in range(before - 1000, after + 1, 1000)), row


# ============================================================================ a forecast past year 9999


def far_forecast(e: q.QuotaEngine) -> None:
    """A route and a tenant whose day runs out, at one token a day, in year ~19 million."""
    e.set_model_limits(P, M, limits=[q.Limit("tokens", 10**12, "1d")])
    e.set_tenant_limits("team:far", [q.Limit("tokens", 10**12, "1d")])
    e.record_tokens(P, M, K, 1, tenant="team:far")


def test_a_forecast_past_year_9999_is_shown_not_raised(
    engine: q.QuotaEngine, local_zone: Callable[[str], None]
) -> None:
    """Acceptance finding 6: a datetime holds years 1 to 9999, and one route forecast beyond
    made the whole snapshot unreadable. The text, the HTML (both tables) and the frames show
    every route, the far one as "after year 9999"."""
    far_forecast(engine)
    requests(engine, 1, model="near")
    snap = engine.snapshot()
    (row,) = [r for r in snap.rows if r["model_id"] == M]
    assert row["exhausts_at_ms"] > 253_402_300_800_000  # past 9999-12-31 UTC
    (tenant,) = snap.tenants
    assert tenant["exhausts_at_ms"] == row["exhausts_at_ms"]
    for zone in ("UTC", "Asia/Tokyo", "America/Los_Angeles"):
        local_zone(zone)
        text = str(snap)
        lines = text.splitlines()
        assert lines[0].startswith("quota snapshot of")
        route = next(line for line in lines if line.split()[:2] == [P, M])
        assert route.endswith("after year 9999")
        assert next(line for line in lines if line.startswith("team:far")).endswith("after year 9999")
        assert any(line.split()[:2] == [P, "near"] for line in lines)
        page = snap._repr_html_()
        assert page.count(">after year 9999</td>") == 2  # the route's and the tenant's
        assert 'at after year 9999"' not in page and "runs out at this pace after year 9999" in page
    df = snap.to_pandas().set_index("model_id")
    assert df.exhausts_at_ms[M] == row["exhausts_at_ms"]
    assert snap.tenants_to_pandas().exhausts_at_ms.tolist() == [row["exhausts_at_ms"]]


def test_quotaengine_status_shows_a_forecast_past_year_9999(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    with q.QuotaEngine(db, env={}) as e:
        far_forecast(e)
    r = subprocess.run(
        [sys.executable, "-m", "quotaengine", "status", "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert next(line for line in lines if line.startswith(P)).endswith("after year 9999")
    assert next(line for line in lines if line.startswith("team:far")).endswith("after year 9999")
