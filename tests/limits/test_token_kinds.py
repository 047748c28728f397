"""Token kinds (SPEC §14.4): `record_tokens` / `Lease.success` with `input_tokens`,
`output_tokens`, `cached_tokens`; `lease(..., estimated_output_tokens=)`; the `input_tokens`
and `output_tokens` metrics; the split where a user looks. Both backends, ManualClock."""

from __future__ import annotations

import sqlite3

import pytest
import quotaengine as q
from quotaengine import Limit

P, M, K = "anthropic", "claude-sonnet-4-5", 1
NOW = 1_796_119_200_000  # 2026-12-01 10:00 UTC


KINDS = [
    Limit("tokens", 10_000, "minute"),
    Limit("input_tokens", 1_000, "minute"),
    Limit("output_tokens", 300, "minute"),
]


def test_the_total_is_input_plus_output_and_cached_input_is_not_metered(e: q.QuotaEngine) -> None:
    e.set_model_limits(P, M, limits=KINDS)
    e.record_tokens(P, M, K, input_tokens=700, output_tokens=120, cached_tokens=500)
    u = e.usage(P, M, K)
    assert u["tpm"] == {"used": 820, "limit": 10_000}  # total as the sum
    assert u["input_tokens/minute"] == {"used": 200, "limit": 1_000}  # 700 - 500 cached
    assert u["output_tokens/minute"] == {"used": 120, "limit": 300}
    # a given total counts as given
    e.record_tokens(P, M, K, 50, input_tokens=10, output_tokens=10)
    assert e.usage(P, M, K)["tpm"]["used"] == 870
    # cached above input is not an error: it counts 0 in input windows
    e.record_tokens(P, M, K, input_tokens=5, cached_tokens=9)
    assert e.usage(P, M, K)["input_tokens/minute"]["used"] == 210
    # a call that reports only the total counts nothing in input/output windows
    e.record_tokens(P, M, K, 1_000)
    u = e.usage(P, M, K)
    assert (u["tpm"]["used"], u["input_tokens/minute"]["used"], u["output_tokens/minute"]["used"]) == (1_875, 210, 130)


def test_lease_success_records_the_split(e: q.QuotaEngine) -> None:
    e.set_model_limits(P, M, limits=KINDS)
    with e.lease(P, M, K, 900, estimated_output_tokens=200) as lease:
        lease.success(input_tokens=600, output_tokens=150, cached_tokens=100)
    u = e.usage(P, M, K)
    assert (u["tpm"]["used"], u["input_tokens/minute"]["used"], u["output_tokens/minute"]["used"]) == (750, 500, 150)
    (ev,) = [r for r in e.usage_events() if r["kind"] == "tokens"]
    assert (ev["tokens"], ev["input_tokens"], ev["output_tokens"], ev["cached_tokens"]) == (750, 600, 150, 100)
    (req,) = [r for r in e.usage_events() if r["kind"] == "request"]
    assert (req["tokens"], req["input_tokens"], req["output_tokens"], req["cached_tokens"]) == (0, None, None, None)
    e.lease(P, M, K, 10).success(tokens=10)
    last = [r for r in e.usage_events() if r["kind"] == "tokens"][-1]
    assert (last["tokens"], last["input_tokens"], last["output_tokens"]) == (10, None, None)


def test_a_lease_estimate_counts_its_output_apart(e: q.QuotaEngine) -> None:
    """`estimated_tokens` counts in tokens windows, minus `estimated_output_tokens` in input
    windows, and `estimated_output_tokens` in output windows."""
    e.set_model_limits(P, M, limits=KINDS)
    held = e.lease(P, M, K, 900, estimated_output_tokens=250)
    # input: 650 held, so 350 more input fits; output: 250 held, 50 more fits
    assert e.check(P, M, K, 350)  # an estimate without output is all input
    assert e.check(P, M, K, 351).reason == "input_tokens/minute"
    other = e.lease(P, M, K, 100, estimated_output_tokens=50)
    refused = e.check(P, M, K, 1)
    assert refused.allowed  # input 650+50+1 <= 1000; output 300, nothing more estimated
    with pytest.raises(q.QuotaExceeded) as err:
        e.lease(P, M, K, 1, estimated_output_tokens=1)
    assert err.value.reason == "output_tokens/minute"
    held.release()
    other.release()
    assert e.check(P, M, K, 1_000)


def test_the_split_is_shared_and_persisted(store: str) -> None:
    with (
        q.QuotaEngine(store, clock=q.ManualClock(NOW), env={}) as a,
        q.QuotaEngine(store, clock=q.ManualClock(NOW), env={}) as b,
    ):
        a.set_model_limits(P, M, limits=KINDS)
        a.record_tokens(P, M, K, input_tokens=900, output_tokens=10, cached_tokens=100)
        lease = a.lease(P, M, K, 200, estimated_output_tokens=200)
        # b sees the recorded split and the lease's output estimate
        u = b.usage(P, M, K)
        assert (u["input_tokens/minute"]["used"], u["output_tokens/minute"]["used"]) == (800, 10)
        assert b.check(P, M, K, 90, limits=[Limit("output_tokens", 300, "minute")])
        refused = b.check(P, M, K, 91, limits=[Limit("input_tokens", 890, "minute")])
        assert refused.reason == "input_tokens/minute"  # 800 recorded + 0 held + 91 > 890
        assert b.lease(P, M, K, 0, limits=[Limit("output_tokens", 210, "minute")])
        with pytest.raises(q.QuotaExceeded):
            b.lease(P, M, K, 1, limits=[Limit("output_tokens", 210, "minute")], estimated_output_tokens=1)
        lease.release()
    with q.QuotaEngine(store, clock=q.ManualClock(NOW), env={}) as c:  # reopened: from the store
        assert c.usage(P, M, K)["input_tokens/minute"]["used"] == 800


@pytest.mark.sqlite_only
def test_a_plain_reader_sums_the_split(store: str) -> None:
    with q.QuotaEngine(store, clock=q.ManualClock(NOW), env={}) as e:
        e.record_tokens(P, M, K, input_tokens=700, output_tokens=120, cached_tokens=500)
        e.record_tokens(P, M, K, 30)
    con = sqlite3.connect(store)
    row = con.execute(
        "SELECT SUM(tokens), SUM(input_tokens), SUM(output_tokens), SUM(cached_tokens) "
        "FROM rate_limit_usage WHERE kind = 'tokens'"
    ).fetchone()
    con.close()
    assert row == (850, 700, 120, 500)  # SUM(tokens) stays the total


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({}, TypeError),
        ({"tokens": None}, TypeError),
        ({"tokens": -1}, ValueError),
        ({"input_tokens": -5}, ValueError),
        ({"output_tokens": -1}, ValueError),
        ({"cached_tokens": -1}, ValueError),
        ({"input_tokens": 1.5}, TypeError),
        ({"output_tokens": True}, TypeError),
    ],
)
def test_bad_token_counts_record_nothing(e: q.QuotaEngine, kwargs: dict, error: type) -> None:  # type: ignore[type-arg]
    with pytest.raises(error):
        e.record_tokens(P, M, K, **kwargs)
    assert e.usage_events() == []


def test_bad_lease_estimates_lease_nothing(e: q.QuotaEngine) -> None:
    with pytest.raises(ValueError, match="estimated_output_tokens"):
        e.lease(P, M, K, 10, estimated_output_tokens=11)
    with pytest.raises(ValueError):
        e.lease(P, M, K, 10, estimated_output_tokens=-1)
    with pytest.raises(TypeError):
        e.lease(P, M, K, 10, estimated_output_tokens=1.0)  # type: ignore[arg-type]
    assert e.usage(P, M, K)["in_flight"] == 0
    lease = e.lease(P, M, K, 10)
    with pytest.raises(ValueError):
        lease.success(input_tokens=-1)
    lease.success(output_tokens=4)
    assert [r["output_tokens"] for r in e.usage_events() if r["kind"] == "tokens"] == [4]


def test_anthropic_headers_keep_input_and_output_apart(e: q.QuotaEngine) -> None:
    obs = e.record_quota_headers(
        P,
        K,
        {
            "anthropic-ratelimit-input-tokens-limit": "30000",
            "anthropic-ratelimit-input-tokens-remaining": "100",
            "anthropic-ratelimit-output-tokens-limit": "8000",
            "anthropic-ratelimit-output-tokens-remaining": "7000",
        },
        model_id=M,
    )
    got = {o.metric: (o.limit, o.remaining) for o in obs}
    assert got == {"input_tokens": (30_000, 100), "output_tokens": (8_000, 7_000)}
    states = {s.metric: (s.limit, s.remaining) for s in e.quota_state()}
    assert states == got
