"""SPEC 27.4: ``analysis.plot_usage`` draws each declared limit's fill over time (a sliding
window over its own width, a calendar window since its period's start in the platform's
zone; routes, platforms and tenants; cooldowns shaded), ``kind="rate"`` keeps the per-bin
view, ``analysis.plot_spend`` stacks 23.4's spend. Every engine test runs on a SQLite file
and on a real redis-server (the ``engine`` fixture)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.dates as mdates  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import quotaengine as q  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from moments import DAY, HOUR, MINUTE, SECOND, T0, TEN_AM  # noqa: E402
from quotaengine import analysis  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def lines(ax: Axes) -> dict[str, Any]:
    return {line.get_label(): line for line in ax.get_lines() if not line.get_label().startswith("_")}


def ms(x: Any) -> int:
    """A plotted x (a numpy datetime64 or a matplotlib date number) as epoch ms."""
    if isinstance(x, (float, np.floating)):
        return int(round(mdates.num2date(x).timestamp() * 1000))
    return int(np.datetime64(x, "ms").astype(np.int64))


def value_at(line: Any, at_ms: int) -> float:
    """What a steps-post line reads at ``at_ms``: the value of the last point at or before it."""
    xs = [ms(x) for x in line.get_xdata()]
    ys = list(line.get_ydata())
    assert xs == sorted(xs) and xs[0] <= at_ms <= xs[-1], (at_ms, xs[0], xs[-1])
    assert line.get_drawstyle() == "steps-post"
    return float(ys[max(i for i, x in enumerate(xs) if x <= at_ms)])


def check_labelled(ax: Axes) -> None:
    assert isinstance(ax, Axes)
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    ax.figure.canvas.draw()  # renders under Agg


# ============================================================================ the fill


def test_a_minute_window_fills_and_empties(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    """rpm=10 and 5 requests in a minute: 50% at the end of that minute, 0% a minute later."""
    engine.set_model_limits("groq", "llama", rpm=10)
    for _ in range(5):
        engine.record_request("groq", "llama", 1)
        clock.advance(10 * SECOND)  # at 10:00:00, :10, :20, :30, :40
    clock.set(TEN_AM + 3 * MINUTE)
    ax = analysis.plot_usage(engine)
    check_labelled(ax)
    assert "%" in ax.get_ylabel()
    line = lines(ax)["groq/llama / key 1 rpm"]
    assert value_at(line, TEN_AM) == 10
    assert value_at(line, TEN_AM + 40 * SECOND) == 50
    assert value_at(line, TEN_AM + 59 * SECOND) == 50  # the end of that minute
    assert value_at(line, TEN_AM + MINUTE) == 40  # the first request has left the window
    assert value_at(line, TEN_AM + 100 * SECOND) == 0  # a minute after the last
    assert value_at(line, TEN_AM + 3 * MINUTE) == 0
    assert ms(line.get_xdata()[-1]) == TEN_AM + 3 * MINUTE  # up to the engine's now
    # 100% is the ceiling: a horizontal line at 100.
    assert any(list(l_.get_ydata()) == [100, 100] for l_ in ax.get_lines())


def test_the_fill_is_what_the_engine_counted(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    """At every moment checked, the plotted fill is ``usage()``'s used / limit for each window,
    sliding ones of several widths and a token window included; never per-bin counts."""
    engine.set_model_limits(
        "groq", "llama", rpm=30, tpm=1_000, limits=[q.Limit("requests", 4, "10s"), q.Limit("tokens", 5_000, "1h")]
    )
    seen: list[tuple[int, dict[str, Any]]] = []
    rng = np.random.default_rng(7)
    for _ in range(40):
        clock.advance(int(rng.integers(200, 9_000)))
        if rng.random() < 0.6:
            engine.record_request("groq", "llama", 1)
        else:
            engine.record_tokens("groq", "llama", 1, int(rng.integers(1, 300)))
        clock.advance(1)
        seen.append((clock.now_ms(), engine.usage("groq", "llama", 1)))
    clock.advance(2 * HOUR)
    seen.append((clock.now_ms(), engine.usage("groq", "llama", 1)))
    got = lines(analysis.plot_usage(engine))
    for at, usage in seen:
        for reason in ("rpm", "tpm", "requests/10s", "tokens/1h"):
            want = 100 * usage[reason]["used"] / usage[reason]["limit"]
            assert value_at(got[f"groq/llama / key 1 {reason}"], at) == pytest.approx(want), (at, reason)


def test_a_burst_reads_full_not_per_second(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    """A per-minute limit is never drawn against per-second bins: 30 requests in one second
    under rpm=30 read 100% for the minute, not 30 per second against 30 per minute."""
    engine.set_model_limits("groq", "burst", rpm=30)
    for _ in range(30):
        engine.record_request("groq", "burst", 1)
    clock.advance(5 * MINUTE)
    line = lines(analysis.plot_usage(engine, freq="1s"))["groq/burst / key 1 rpm"]
    assert value_at(line, TEN_AM + 30 * SECOND) == 100
    assert value_at(line, TEN_AM + MINUTE) == 0
    assert max(line.get_ydata()) == 100


def test_a_calendar_day_resets_at_the_platforms_midnight(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    """A day window's fill rises through the platform's day and falls to 0 at 00:00 in its zone
    (Los Angeles: 08:00 UTC in January), not at 00:00 UTC."""
    engine.set_platform_calendar("google", "America/Los_Angeles")
    engine.set_model_limits("google", "gemini", rpd=10)
    la_midnight = T0 + DAY + 8 * HOUR  # 2026-01-02 00:00 in Los Angeles
    for at in (TEN_AM, TEN_AM + 6 * HOUR, TEN_AM + 12 * HOUR, la_midnight - HOUR, la_midnight + HOUR):
        clock.set(at)
        engine.record_request("google", "gemini", 1)
    clock.set(la_midnight + 2 * HOUR)
    line = lines(analysis.plot_usage(engine))["google/gemini / key 1 rpd"]
    assert value_at(line, TEN_AM + HOUR) == 10
    assert value_at(line, TEN_AM + 7 * HOUR) == 20
    assert value_at(line, T0 + DAY) == 30  # UTC midnight: the platform's day goes on
    assert value_at(line, la_midnight - 1) == 40
    assert value_at(line, la_midnight) == 0  # the period starts
    assert value_at(line, la_midnight + HOUR) == 10
    assert la_midnight in [ms(x) for x in line.get_xdata()]


def test_week_and_month_windows_reset_at_their_periods(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    """2026-01-01 is a Thursday: the week restarts on Monday the 5th, the month on 1 February."""
    engine.set_model_limits("groq", "llama", limits=[q.Limit("requests", 10, "week"), q.Limit("requests", 20, "month")])
    monday, february = T0 + 4 * DAY, T0 + 31 * DAY
    for at in (TEN_AM, monday - HOUR, monday + HOUR):
        clock.set(at)
        engine.record_request("groq", "llama", 1)
    clock.set(monday + 2 * HOUR)
    got = lines(analysis.plot_usage(engine))
    week, month = got["groq/llama / key 1 requests/week"], got["groq/llama / key 1 requests/month"]
    assert [value_at(week, t) for t in (monday - 1, monday, monday + HOUR)] == [20, 0, 10]
    assert [value_at(month, t) for t in (monday - 1, monday + HOUR)] == [10, 15]
    # Retention keeps only the current month's rows (SPEC 14.2): look at the turn of the month.
    for at in (february - HOUR, february + HOUR):
        clock.set(at)
        engine.record_request("groq", "llama", 1)
    clock.set(february + 2 * HOUR)
    month = lines(analysis.plot_usage(engine))["groq/llama / key 1 requests/month"]
    assert value_at(month, february - 1) >= 5
    assert [value_at(month, t) for t in (february, february + HOUR)] == [0, 5]


def test_tenant_and_platform_lines(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    """One line per (tenant, window) and per (platform, window) next to the routes'."""
    engine.set_model_limits("groq", "llama", rpm=100)
    engine.set_tenant_limits("alice", [q.Limit("requests", 4, "minute"), q.Limit("tokens", 1_000, "day")])
    engine.set_tenant_limits("team:*", [q.Limit("requests", 10, "minute")])
    engine.set_provider_caps("groq", daily_requests=20)
    engine.set_platform_limits("groq", [q.Limit("tokens", 2_000, "1h")])
    engine.record_request("groq", "llama", 1, tenant=["alice", "team:red"])
    engine.record_request("groq", "llama", 2, tenant="alice")
    engine.record_tokens("groq", "llama", 2, 250, tenant=["alice", "team:red"])
    engine.record_request("groq", "llama", 3)
    clock.advance(30 * SECOND)
    got = lines(analysis.plot_usage(engine))
    now = clock.now_ms()
    assert value_at(got["tenant alice requests/minute"], now) == 50
    assert value_at(got["tenant alice tokens/day"], now) == 25
    assert value_at(got["tenant team:red requests/minute"], now) == 10  # the pattern's limits, its own window
    # Each key is its own account: the platform's line is the fullest of them (key 2: 1 of 20).
    assert value_at(got["groq / fullest account provider_daily_requests"], now) == 5
    assert value_at(got["groq / fullest account platform:tokens/1h"], now) == 12.5
    # Accounts shared: the cap counts every key of the account.
    for k in (1, 2, 3):
        engine.register_key(k, "groq", account="org")
    got = lines(analysis.plot_usage(engine))
    assert value_at(got["groq / every key provider_daily_requests"], now) == 15
    # With a platform, only its lines; tenants are left out.
    assert not [k for k in lines(analysis.plot_usage(engine, platform="groq")) if k.startswith("tenant ")]


def test_a_tenant_day_resets_at_its_own_midnight(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    """A tenant's daily dollar budget declared in New York (SPEC 23.2's ``tz``) fills
    through New York's day and falls to 0 at 00:00 there (05:00 UTC in January), not at
    00:00 UTC: what the engine's gate counts at each moment."""
    engine.set_model_prices("openai", "gpt-4o", q.Prices(2.5, 10.0))
    engine.set_tenant_limits("acme", [q.Limit.dollars(0.05, "day")], tz="America/New_York")
    ny_midnight = T0 + DAY + 5 * HOUR  # 2026-01-02 00:00 in New York
    for at in (TEN_AM, T0 + DAY + 2 * HOUR, ny_midnight + HOUR):
        clock.set(at)
        engine.record_tokens("openai", "gpt-4o", 1, input_tokens=1_000, output_tokens=500, tenant="acme")
    clock.set(ny_midnight + 2 * HOUR)
    line = lines(analysis.plot_usage(engine))["tenant acme cost/day"]
    per_call = 100 * (2.5 * 1_000 + 10.0 * 500) / 50_000  # µ$ of one call over the µ$ budget, in %
    assert value_at(line, T0 + DAY - 1) == per_call
    assert value_at(line, T0 + DAY) == per_call  # UTC midnight: New York's day goes on
    assert value_at(line, ny_midnight - 1) == 2 * per_call
    assert value_at(line, ny_midnight) == 0  # the tenant's day starts
    assert value_at(line, ny_midnight + HOUR) == per_call
    xs = [ms(x) for x in line.get_xdata()]
    assert ny_midnight in xs and T0 + DAY not in xs
    # The plot agrees with what the engine counts for the tenant now.
    used = engine.tenant_usage("acme")["cost/day"]
    assert value_at(line, clock.now_ms()) == 100 * used["used"] / used["limit"]


def test_a_pattern_gives_its_tenants_its_zone(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    """A tenant declared by a pattern with a zone (``"team:*"`` in Tokyo) has its days in
    that zone: 00:00 in Tokyo is 15:00 UTC the day before."""
    engine.set_tenant_limits("team:*", [q.Limit("requests", 10, "day")], tz="Asia/Tokyo")
    tokyo_midnight = T0 + 15 * HOUR  # 2026-01-02 00:00 in Tokyo
    for at in (TEN_AM, tokyo_midnight + HOUR):
        clock.set(at)
        engine.record_request("groq", "llama", 1, tenant="team:red")
    clock.set(tokyo_midnight + 2 * HOUR)
    line = lines(analysis.plot_usage(engine))["tenant team:red requests/day"]
    assert [value_at(line, t) for t in (tokyo_midnight - 1, tokyo_midnight, tokyo_midnight + HOUR)] == [10, 0, 10]


def test_cooldowns_are_shaded(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.set_model_limits("groq", "llama", rpm=10)
    engine.record_request("groq", "llama", 1)
    engine.record_request("groq", "llama", 3)
    clock.advance(MINUTE)
    engine.set_cooldown("groq", "llama", 3, 10 * MINUTE, "tier")
    clock.advance(20 * MINUTE)
    ax = analysis.plot_usage(engine)
    shaded = [p for p in ax.patches if p.get_label().startswith("cooldown ")]
    assert [p.get_label() for p in shaded] == ["cooldown groq/llama / key 3"]
    (x0, x1) = sorted(
        {round(v, 9) for v in shaded[0].get_path().transformed(shaded[0].get_patch_transform()).vertices[:, 0]}
    )
    assert (ms(x0), ms(x1)) == (TEN_AM + MINUTE, TEN_AM + 11 * MINUTE)
    # In the route's colour, pale.
    route = lines(ax)["groq/llama / key 3 rpm"]
    assert matplotlib.colors.to_rgb(shaded[0].get_facecolor()) == matplotlib.colors.to_rgb(route.get_color())
    assert shaded[0].get_alpha() < 0.5
    assert "cooldown (tier)" in [t.get_text() for t in ax.get_legend().get_texts()]
    check_labelled(ax)


def test_nothing_to_fill(engine: q.QuotaEngine) -> None:
    engine.record_request("cerebras", "qwen", 1)  # no limits declared
    ax = analysis.plot_usage(engine)
    assert isinstance(ax, Axes) and not ax.axison
    assert any("no data" in t.get_text() for t in ax.texts)
    with pytest.raises(ValueError, match="kind"):
        analysis.plot_usage(engine, kind="bars")


def test_kind_rate_is_the_per_bin_view(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.set_model_limits("groq", "llama", rpm=10)
    engine.record_request("groq", "llama", 1)
    engine.record_request("groq", "llama", 1)
    clock.advance(MINUTE)
    engine.record_request("groq", "llama", 1)
    ax = analysis.plot_usage(engine, kind="rate")
    requests, tokens = ax.figure.axes
    assert requests is ax
    check_labelled(ax)  # SPEC 27.4: the returned Axes titles and labels its axes
    assert ax.get_xlabel() == tokens.get_xlabel() == "time (UTC)"
    assert list(lines(requests)["groq"].get_ydata()) == [2, 1, 1]
    assert list(lines(requests)["groq/llama rpm 10"].get_ydata()) == [10, 10]


# ============================================================================ legends


def thirty_routes(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    for platform, model in (("groq", "llama"), ("cerebras", "qwen")):
        engine.set_model_prices(platform, model, q.Prices(1.0, 2.0, per_request=0.01))
        engine.set_model_limits(platform, model, rpm=20, tpd=100_000)
    for k in range(30):
        platform, model = ("groq", "llama") if k < 18 else ("cerebras", "qwen")
        for _ in range(1 + k % 4):
            engine.record_request(platform, model, k, tenant=f"user{k % 3}")
            engine.record_tokens(platform, model, k, input_tokens=100 * k, output_tokens=10, tenant=f"user{k % 3}")
        clock.advance(7 * SECOND)
    clock.advance(MINUTE)


def check_legend_outside(ax: Axes, names: list[str]) -> None:
    fig = ax.figure
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    legend = ax.get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    for name in names:
        assert name in texts
    renderer = canvas.get_renderer()
    box, frame = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
    assert box.x0 >= frame.x1  # beside the plot, never over the lines
    assert box.x1 <= fig.bbox.x1 + 1 and box.y0 >= fig.bbox.y0 - 1  # all of it inside the image
    assert frame.width >= 0.4 * fig.bbox.width  # the plot keeps most of the room
    per_column = -(-len(texts) // legend._ncols)
    assert per_column <= 32


def test_legends_with_thirty_routes(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    thirty_routes(engine, clock)
    ax = analysis.plot_usage(engine)
    assert len([k for k in lines(ax) if "/ key " in k]) == 60  # 30 routes x (rpm, tpd)
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    # Grouped by platform: a heading per platform, its routes under it; the windows once.
    assert texts.index("platform cerebras") < texts.index("qwen / key 18") < texts.index("platform groq")
    assert texts.index("platform groq") < texts.index("llama / key 0") < texts.index("windows")
    check_legend_outside(ax, [f"llama / key {k}" for k in range(18)] + ["rpm", "tpd"])
    spent = analysis.plot_spend(engine, by="route", freq="1h")
    check_legend_outside(spent, [f"groq/llama/{k}" for k in range(18)])


# ============================================================================ spend


def test_plot_spend_stacks_spend_by_tenant(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.set_model_prices("openai", "gpt-4o", q.Prices(2.5, 10, per_request=0.001))
    engine.record_request("openai", "gpt-4o", 1, tenant="alice")
    engine.record_tokens("openai", "gpt-4o", 1, input_tokens=1_000, output_tokens=100, tenant=["alice", "bob"])
    engine.record_request("openai", "gpt-4o", 2)
    clock.set(T0 + DAY + 9 * HOUR)
    engine.record_tokens("openai", "gpt-4o", 2, 1_000, tenant="bob")
    want = analysis.spend(engine, by="tenant", freq="1D")
    ax = analysis.plot_spend(engine)
    check_labelled(ax)
    assert "$" in ax.get_ylabel() or "USD" in ax.get_ylabel()
    bars = {c.get_label(): c for c in ax.containers}
    assert list(bars) == list(want.columns) == ["(none)", "alice", "bob"]
    bottom = np.zeros(len(want))
    for column, container in bars.items():
        heights = [p.get_height() for p in container.patches]
        assert heights == pytest.approx(list(want[column]))
        assert [p.get_y() for p in container.patches] == pytest.approx(list(bottom))  # stacked
        bottom += heights
        # one bar per period, at the period's start (UTC)
        assert [ms(p.get_x()) for p in container.patches] == [T0, T0 + DAY]
    assert bottom == pytest.approx(list(want.sum(axis=1)))
    # by and freq are spend()'s
    hourly = analysis.plot_spend(engine, by="platform", freq="1h")
    assert [c.get_label() for c in hourly.containers] == ["openai"]
    assert sum(p.get_height() for p in hourly.containers[0].patches) == pytest.approx(want.sum().sum() - 0.0035)
    with pytest.raises(ValueError, match="by"):
        analysis.plot_spend(engine, by="nobody")


def test_plot_spend_with_nothing_spent(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    q.QuotaEngine(path, env={}).close()
    ax = analysis.plot_spend(path)
    assert isinstance(ax, Axes) and not ax.axison
    assert any("no data" in t.get_text() for t in ax.texts)
    assert not analysis.plot_usage(path).axison


@pytest.mark.sqlite_only
def test_plots_of_a_path_open_it_read_only(engine: q.QuotaEngine, db_path: Path) -> None:
    engine.set_model_limits("groq", "llama", rpm=10)
    engine.record_request("groq", "llama", 1)
    engine.close()
    ax = analysis.plot_usage(db_path)  # the engine's real clock: the lines run up to today
    assert "groq/llama / key 1 rpm" in lines(ax)
    assert analysis.plot_spend(db_path).containers


# ============================================================================ the docs page


def test_docs_plots_page_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/plots.md: every ```python block runs, in order, in an empty folder."""
    text = (ROOT / "docs" / "plots.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    for image in re.findall(r"\]\((img/[^)]+\.png)\)", text):
        assert (ROOT / "docs" / image).is_file(), image
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for block in blocks:
        exec(compile(block, "docs/plots.md", "exec"), namespace)  # noqa: S102
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["spend.png", "usage-fill.png", "usage-rate.png"]
