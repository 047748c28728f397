"""SPEC 23.4: ``analysis.spend``, dollars spent per period and per tenant, route, platform or
model, from ``usage_events``. Every test runs on a SQLite file and on a real redis-server."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import quotaengine as q
from moments import HOUR, MINUTE, T0, TEN_AM
from quotaengine import analysis

# 2.5 $/M input, 10 $/M output, 0.001 $ a request: a request costs 1,000 µ$, 1,000 input and
# 100 output tokens 2,500 + 1,000 µ$, a bare total of 1,000 tokens 10,000 µ$ (the dearer price).
DEAR = q.Prices(2.5, 10, per_request=0.001)
# 0.15 $/M input: 7 input tokens are 1,050,000 p$, rounded up to 2 µ$.
CHEAP = q.Prices(0.15, 0.6)
DAY1 = T0  # the fixture clock starts at 10:00 of this day (UTC)
DAY2 = T0 + 24 * HOUR


def period(ms: int) -> pd.Timestamp:
    return pd.Timestamp(ms, unit="ms", tz="UTC")


def frame(by: str, index: list[int], columns: dict[str, list[float]]) -> pd.DataFrame:
    """The frame ``spend`` should return: columns in order, dollars, periods by their start."""
    df = pd.DataFrame(columns, index=pd.DatetimeIndex([period(ms) for ms in index], name="period"), dtype="float64")
    df.index = df.index.astype("datetime64[ns, UTC]")
    df.columns = pd.Index(list(columns), name=by)
    return df


def check(got: pd.DataFrame, want: pd.DataFrame) -> None:
    # exact: the micro-dollars are summed as integers, then divided once
    pd.testing.assert_frame_equal(got, want, check_exact=True, check_freq=False, check_column_type=False)
    assert got.columns.name == want.columns.name
    assert list(got.columns) == list(want.columns)


@pytest.fixture
def priced(engine: q.QuotaEngine, clock: q.ManualClock) -> q.QuotaEngine:
    """Two days of events (the second within the default retention of a day):

    * day 1, 10:00: openai/gpt-4o key 1 a request (1,000 µ$) and 1,000 + 100 tokens (3,500 µ$);
      groq/llama key 3, unpriced, a request (0 µ$);
    * day 1, 11:30: openai/gpt-4o-mini key 2, 7 input tokens (2 µ$);
    * day 2, 09:00: openai/gpt-4o key 2, a bare total of 1,000 tokens (10,000 µ$).
    """
    engine.set_model_prices("openai", "gpt-4o", DEAR)
    engine.set_model_prices("openai", "gpt-4o-mini", CHEAP)
    engine.record_request("openai", "gpt-4o", 1)
    engine.record_tokens("openai", "gpt-4o", 1, input_tokens=1_000, output_tokens=100)
    engine.record_request("groq", "llama", 3)
    clock.advance(90 * MINUTE)
    engine.record_tokens("openai", "gpt-4o-mini", 2, input_tokens=7, output_tokens=0)
    clock.set(DAY2 + 9 * HOUR)
    engine.record_tokens("openai", "gpt-4o", 2, 1_000)
    assert [r["cost"] for r in engine.usage_events()] == [1_000, 3_500, 0, 2, 10_000]
    return engine


def test_spend_by_route(priced: q.QuotaEngine) -> None:
    want = frame(
        "route",
        [DAY1, DAY2],
        {
            "groq/llama/3": [0.0, 0.0],
            "openai/gpt-4o-mini/2": [0.000002, 0.0],
            "openai/gpt-4o/1": [0.0045, 0.0],
            "openai/gpt-4o/2": [0.0, 0.01],
        },
    )
    check(analysis.spend(priced, by="route"), want)


def test_spend_by_platform_and_by_model(priced: q.QuotaEngine) -> None:
    check(
        analysis.spend(priced, by="platform"),
        frame("platform", [DAY1, DAY2], {"groq": [0.0, 0.0], "openai": [0.004502, 0.01]}),
    )
    check(
        analysis.spend(priced, by="model"),
        frame(
            "model",
            [DAY1, DAY2],
            {"groq/llama": [0.0, 0.0], "openai/gpt-4o": [0.0045, 0.01], "openai/gpt-4o-mini": [0.000002, 0.0]},
        ),
    )


def test_spend_periods_follow_freq_and_include_the_empty_ones(priced: q.QuotaEngine) -> None:
    hourly = analysis.spend(priced, by="platform", freq="1h")
    # from 10:00 of day 1 to 09:00 of day 2: 24 hours, most of them without spending
    assert len(hourly) == 24
    assert hourly.index[0] == period(TEN_AM) and hourly.index[-1] == period(DAY2 + 9 * HOUR)
    assert str(hourly.index.dtype) == "datetime64[ns, UTC]"
    assert hourly.loc[period(TEN_AM), "openai"] == 0.0045
    assert hourly.loc[period(TEN_AM + HOUR), "openai"] == 0.000002  # 11:30 falls in the 11:00 hour
    assert hourly.loc[period(DAY2 + 9 * HOUR), "openai"] == 0.01
    assert hourly["openai"].sum() == pytest.approx(0.014502)
    assert (hourly.iloc[2:-1] == 0.0).all().all()
    # a calendar frequency: the month, labelled by its first day
    monthly = analysis.spend(priced, by="platform", freq="MS")
    check(monthly, frame("platform", [DAY1], {"groq": [0.0], "openai": [0.014502]}))


def test_spend_since_ms(priced: q.QuotaEngine) -> None:
    check(
        analysis.spend(priced, by="model", since_ms=DAY1 + 11 * HOUR),
        frame("model", [DAY1, DAY2], {"openai/gpt-4o": [0.0, 0.01], "openai/gpt-4o-mini": [0.000002, 0.0]}),
    )
    check(
        analysis.spend(priced, by="model", since_ms=DAY2),
        frame("model", [DAY2], {"openai/gpt-4o": [0.01]}),
    )


def test_spend_sums_micro_dollars_exactly(engine: q.QuotaEngine) -> None:
    # 0.1 + 0.2 in floats is not 0.3; summed as integers, then divided, it is
    engine.set_model_prices("p", "m", q.Prices(0, 0, per_request=0.1))
    engine.set_model_prices("p", "n", q.Prices(0, 0, per_request=0.2))
    engine.record_request("p", "m", 1)
    engine.record_request("p", "n", 1)
    assert 0.1 + 0.2 != 0.3
    got = analysis.spend(engine, by="platform")
    assert got.loc[period(DAY1), "p"] == 0.3


def test_spend_without_events_is_an_empty_frame(engine: q.QuotaEngine) -> None:
    for by in analysis.SPEND_BY:
        df = analysis.spend(engine, by=by)
        assert df.shape == (0, 0)
        assert str(df.index.dtype) == "datetime64[ns, UTC]" and df.index.name == "period"
        assert df.columns.name == by


@pytest.mark.parametrize("by", ["tenants", "key", "", "Route", None, 1])
def test_spend_refuses_an_unknown_grouping(engine: q.QuotaEngine, by: object) -> None:
    with pytest.raises(ValueError, match="by must be one of"):
        analysis.spend(engine, by=by)  # type: ignore[arg-type]


def test_spend_is_exported() -> None:
    assert "spend" in analysis.__all__


@pytest.mark.sqlite_only
def test_spend_from_a_path(priced: q.QuotaEngine, store: str) -> None:
    got = analysis.spend(Path(store), by="platform")
    assert list(got.columns) == ["groq", "openai"] and list(got["openai"]) == [0.004502, 0.01]


def test_spend_by_tenant(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    """An event naming several tenants counts for each; one naming none goes to "(none)"."""
    engine.set_model_prices("openai", "gpt-4o", DEAR)
    engine.record_request("openai", "gpt-4o", 1, tenant=["user:ann", "team:a"])  # 1,000 µ$
    engine.record_tokens("openai", "gpt-4o", 1, input_tokens=1_000, output_tokens=100, tenant="team:b")  # 3,500
    with engine.lease("openai", "gpt-4o", 1, 100, tenant=["user:ann", "team:b"]) as lease:
        lease.success(input_tokens=100, output_tokens=0)  # a request (1,000 µ$) and 250 µ$ of tokens
    engine.record_request("groq", "llama", 1)  # unpriced, no tenant
    clock.set(DAY2 + 9 * HOUR)
    engine.record_tokens("openai", "gpt-4o", 2, 1_000)  # 10,000 µ$, no tenant
    events = engine.usage_events()
    assert [r["tenants"] for r in events][:2] == [["user:ann", "team:a"], ["team:b"]]
    want = frame(
        "tenant",
        [DAY1, DAY2],
        {
            "(none)": [0.0, 0.01],
            "team:a": [0.001, 0.0],
            "team:b": [0.00475, 0.0],
            "user:ann": [0.00225, 0.0],
        },
    )
    check(analysis.spend(engine), want)  # by="tenant" is the default
    check(analysis.spend(engine, by="tenant", freq="1D"), want)
    # the tenants' columns add up to more than was spent: an event counts for each it names
    assert analysis.spend(engine, by="platform").to_numpy().sum() == pytest.approx(0.01575)
    assert analysis.spend(engine).to_numpy().sum() == pytest.approx(0.018)
    assert analysis.NO_TENANT == "(none)"
