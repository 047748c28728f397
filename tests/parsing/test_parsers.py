"""SPEC §6.2 retry-time parsers and §7 parse_provider_limit, with hypothesis properties."""

from __future__ import annotations

import email.utils
import time

import pytest
import quotaengine as q
from hypothesis import given
from hypothesis import strategies as st
from moments import DAY, NOON


def http_date(ms: int) -> str:
    return email.utils.formatdate(ms / 1000, usegmt=True)


# --------------------------------------------------------------------------- parse_retry_after_ms


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30", 30_000),
        ("0", 0),
        ("1.5", 1_500),
        ("120", 120_000),
        ("86400", DAY),
        ("86401", DAY),
        ("99999999999", DAY),
        ("9" * 40, DAY),
        ("garbage", None),
        ("", None),
        ("soon", None),
        ("30s", None),
        ("-5", None),
        ("nan", None),
        ("inf", None),
        (None, None),
    ],
)
def test_parse_retry_after_delta_seconds(value: str | None, expected: int | None) -> None:
    assert q.parse_retry_after_ms(value, now_ms=NOON) == expected


def test_parse_retry_after_http_date_future() -> None:
    assert http_date(NOON + 120_000) == "Thu, 01 Jan 2026 12:02:00 GMT"
    assert q.parse_retry_after_ms("Thu, 01 Jan 2026 12:02:00 GMT", now_ms=NOON) == 120_000
    assert q.parse_retry_after_ms(http_date(NOON + 3_600_000), now_ms=NOON) == 3_600_000


def test_parse_retry_after_http_date_relative_to_now_ms() -> None:
    date = http_date(NOON + 600_000)
    assert q.parse_retry_after_ms(date, now_ms=NOON) == 600_000
    assert q.parse_retry_after_ms(date, now_ms=NOON + 500_000) == 100_000
    # sub-second now: the date has whole seconds
    assert q.parse_retry_after_ms(date, now_ms=NOON + 250) == 599_750


def test_parse_retry_after_past_http_date_is_zero() -> None:
    assert q.parse_retry_after_ms(http_date(NOON - 60_000), now_ms=NOON) == 0
    assert q.parse_retry_after_ms("Wed, 21 Oct 2015 07:28:00 GMT", now_ms=NOON) == 0


def test_parse_retry_after_far_future_http_date_is_clamped() -> None:
    assert q.parse_retry_after_ms(http_date(NOON + 10 * DAY), now_ms=NOON) == DAY
    assert q.parse_retry_after_ms("Fri, 31 Dec 9999 23:59:59 GMT", now_ms=NOON) == DAY


def test_parse_retry_after_http_date_uses_system_clock_without_now() -> None:
    now = int(time.time() * 1000)
    got = q.parse_retry_after_ms(http_date(now + 3_600_000))
    assert got is not None
    assert 3_590_000 <= got <= 3_600_000


def test_parse_retry_after_invalid_dates_are_none() -> None:
    assert q.parse_retry_after_ms("Thu, 32 Jan 2026 12:02:00 GMT", now_ms=NOON) is None
    assert q.parse_retry_after_ms("not a date, 01 Jan 2026", now_ms=NOON) is None


# --------------------------------------------------------------------------- parse_stated_retry_ms


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Please try again in 7.66s", 7_660),
        ("Please try again in 7.66s. Need more tokens?", 7_660),
        ("retry after 30 seconds", 30_000),
        ("Retry after 30 seconds", 30_000),
        ("try again in 2m", 120_000),
        ("try again in 1m26.4s", 86_400),
        ("try again in 500ms", 500),
        ("try again in 10 sec", 10_000),
        ("try again in 10 secs", 10_000),
        ("try again in 1 second", 1_000),
        ("try again in 5 min", 300_000),
        ("try again in 5 mins", 300_000),
        ("try again in 3 minutes", 180_000),
        ("try again in 1h", 3_600_000),
        ("try again in 2 hours", 7_200_000),
        ("try again in 1 hour", 3_600_000),
        ("try again in 30 hours", DAY),
        ('{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "17s"}', 17_000),
        ('"retryDelay": "17s"', 17_000),
        ('"retryDelay": "0.5s"', 500),
        ('{"error": {"retry_after": "0.5s"}}', 500),
        ("42", None),
        ("Limit 6000, Requested 7913", None),
        ("please reduce your message size and try again.", None),
        ("rate limited for 30 seconds", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_stated_retry_ms(message: str | None, expected: int | None) -> None:
    assert q.parse_stated_retry_ms(message) == expected


def test_parse_stated_retry_ms_real_bodies() -> None:
    groq = (
        "Rate limit reached for model `llama-3.3-70b-versatile` in organization `org_01hx` "
        "service tier `on_demand` on tokens per minute (TPM): Limit 12000, Used 9622, "
        "Requested 3456. Please try again in 5.39s. Need more tokens? Upgrade to Dev Tier "
        "today at https://console.groq.com/settings/billing"
    )
    assert q.parse_stated_retry_ms(groq) == 5_390
    gemini = (
        '{"error": {"code": 429, "message": "You exceeded your current quota.", '
        '"status": "RESOURCE_EXHAUSTED", "details": [{"@type": '
        '"type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "46s"}]}}'
    )
    assert q.parse_stated_retry_ms(gemini) == 46_000
    groq_413 = (
        "Request too large for model `llama-3.1-8b-instant` in organization `org_x` service "
        "tier `on_demand` on tokens per minute (TPM): Limit 6000, Requested 7913, please "
        "reduce your message size and try again."
    )
    assert q.parse_stated_retry_ms(groq_413) is None


# --------------------------------------------------------------------------- parse_provider_limit

GROQ_TPM = (
    "Request too large for model `llama-3.1-8b-instant` in organization `org_x` service tier "
    "`on_demand` on tokens per minute (TPM): Limit 6000, Requested 7913, please reduce your "
    "message size and try again."
)
GROQ_TPD = (
    "Rate limit reached for model `llama-3.3-70b-versatile` in organization `org_x` service "
    "tier `on_demand` on tokens per day (TPD): Limit 100000, Used 99817, Requested 1016. "
    "Please try again in 12m19.68s. Need more tokens? Upgrade to Dev Tier today at "
    "https://console.groq.com/settings/billing"
)
GROQ_RPM = (
    "Rate limit reached for model `gemma2-9b-it` in organization `org_x` service tier "
    "`on_demand` on requests per minute (RPM): Limit 30, Used 30, Requested 1. Please try "
    "again in 2s."
)
GROQ_RPD = (
    "Rate limit reached for model `llama-3.1-8b-instant` in organization `org_x` service "
    "tier `on_demand` on requests per day (RPD): Limit 14400, Used 14400, Requested 1."
)


@pytest.mark.parametrize(
    ("message", "kind", "limit"),
    [
        (GROQ_TPM, "tpm", 6000),
        (GROQ_TPD, "tpd", 100000),
        (GROQ_RPM, "rpm", 30),
        (GROQ_RPD, "rpd", 14400),
        ("You have exceeded requests per day, limit: 1,000", "rpd", 1000),
        ("requests per day limit: 1,000", "rpd", 1000),
        ("tokens per minute: Limit 1,000,000", "tpm", 1_000_000),
        ("TPM: Limit 30000", "tpm", 30000),
        ("TPD limit 500000", "tpd", 500000),
        ("RPM limit 60", "rpm", 60),
        ("RPD Limit 1", "rpd", 1),
    ],
)
def test_parse_provider_limit(message: str, kind: str, limit: int) -> None:
    got = q.parse_provider_limit(message)
    assert got is not None
    assert (got.kind, got.limit) == (kind, limit)


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("Limit 5000 on tokens per minute; see also tokens per day", "tpd"),
        ("requests per day and tokens per minute: Limit 5000", "tpm"),
        ("requests per minute, requests per day: Limit 5000", "rpd"),
        ("RPM RPD TPM TPD Limit 5000", "tpd"),
        ("RPM and RPD Limit 5000", "rpd"),
        ("RPM and TPM Limit 5000", "tpm"),
    ],
)
def test_parse_provider_limit_axis_order(message: str, kind: str) -> None:
    got = q.parse_provider_limit(message)
    assert got is not None
    assert (got.kind, got.limit) == (kind, 5000)


@pytest.mark.parametrize(
    "message",
    [
        None,
        "",
        "Limit 6000, Requested 7913",  # no axis
        "limit: 100 requests",  # no confident axis
        "tokens per minute exceeded",  # no number after "limit"
        "tokens per minute: 6000",  # number but no "limit"
        "tokens per minute (TPM): Limit 0",  # must be > 0
        "requests per day limit: 0",
        "Limit -5 tokens per day",
        "You exceeded your current quota",
    ],
)
def test_parse_provider_limit_none(message: str | None) -> None:
    assert q.parse_provider_limit(message) is None


# --------------------------------------------------------------------------- properties

FRAGMENTS = [
    "try again in ",
    "retry after ",
    "Please try again in ",
    '"retryDelay": "',
    '"retry_after": "',
    "Limit ",
    "limit: ",
    " tokens per minute ",
    " tokens per day ",
    " requests per day ",
    " requests per minute ",
    "TPM",
    "TPD",
    "RPM",
    "RPD",
    "1m26.4s",
    "7.66s",
    "ms",
    "s",
    "m",
    "h",
    " hours",
    " seconds",
    "99999999999999999999999",
    "1e400",
    "-1",
    "0",
    "1,000",
    ",,,",
    ".",
    "9" * 30,
    "Thu, 01 Jan 2026 12:02:00 GMT",
    "Fri, 31 Dec 9999 23:59:59 GMT",
    "Mon, 01 Jan 0001 00:00:00 GMT",
    "\u00e9",
    "\u0663",  # Arabic-Indic digit three
    "\x00",
    "\U0001f600",
]

texts = st.one_of(
    st.text(),
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=5)), max_size=12).map("".join),
)


def _in_range(v: int | None) -> bool:
    return v is None or (isinstance(v, int) and 0 <= v <= DAY)


@given(texts, st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63 - 1)))
def test_property_parse_retry_after_never_raises(value: str, now_ms: int | None) -> None:
    assert _in_range(q.parse_retry_after_ms(value, now_ms=now_ms))


@given(texts)
def test_property_parse_retry_after_without_now(value: str) -> None:
    assert _in_range(q.parse_retry_after_ms(value))


@given(texts)
def test_property_parse_stated_retry_never_raises(message: str) -> None:
    assert _in_range(q.parse_stated_retry_ms(message))


@given(texts)
def test_property_parse_provider_limit_never_raises(message: str) -> None:
    got = q.parse_provider_limit(message)
    if got is not None:
        assert got.kind in {"tpm", "tpd", "rpm", "rpd"}
        assert isinstance(got.limit, int)
        assert 0 < got.limit < 2**63


@given(st.integers(min_value=0, max_value=10**12))
def test_property_delta_seconds(seconds: int) -> None:
    assert q.parse_retry_after_ms(str(seconds), now_ms=NOON) == min(seconds * 1000, DAY)


@given(st.integers(min_value=1, max_value=10**15))
def test_property_limit_roundtrip(limit: int) -> None:
    got = q.parse_provider_limit(f"on tokens per minute (TPM): Limit {limit}, Requested 1")
    assert got is not None
    assert (got.kind, got.limit) == ("tpm", limit)
    got = q.parse_provider_limit(f"requests per day limit: {limit:,}")
    assert got is not None
    assert (got.kind, got.limit) == ("rpd", limit)
