"""Bad input (SPEC §13): the right exception, state unchanged, the engine still works. A Rust panic is an
ordinary exception. A model-based property: lease() admits exactly what the windows allow."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import quotaengine as q
from hypothesis import given
from hypothesis import strategies as st
from moments import DAY, MINUTE, T0

P, M, K = "groq", "llama-3.1-8b", 1
NAN = float("nan")
INF = float("inf")


@pytest.fixture
def busy(engine: q.QuotaEngine, clock: q.ManualClock) -> Iterator[q.QuotaEngine]:
    """An engine with some state on the route: limits, usage, a live lease and a cooldown elsewhere."""
    engine.set_model_limits(P, M, rpm=10, rpd=100, tpm=1000, tpd=10_000)
    engine.record_request(P, M, K)
    engine.record_tokens(P, M, K, 50)
    engine.acquire_lease(P, M, K, 20)
    engine.set_cooldown(P, "other", K, duration_ms=MINUTE)
    engine.set_provider_caps(P, daily_requests=500)
    clock.advance(1)
    yield engine


def state(e: q.QuotaEngine) -> tuple[Any, ...]:
    cd = e.cooldown(P, "other", K)
    return (
        e.usage(P, M, K),
        e.usage(P, M, 2),
        e.model_limits(P, M),
        e.provider_caps(P),
        None if cd is None else (cd.expires_at_ms, cd.source),
        e.is_on_cooldown(P, M, K),
        e.usage_events(),
    )


Call = Callable[[q.QuotaEngine], object]

BAD_CALLS: list[tuple[str, Call, type[Exception]]] = [
    # negative tokens, limits, durations
    ("record_tokens negative", lambda e: e.record_tokens(P, M, K, -1), ValueError),
    ("lease negative estimate", lambda e: e.lease(P, M, K, -5), ValueError),
    ("acquire_lease negative estimate", lambda e: e.acquire_lease(P, M, K, -5), ValueError),
    ("check negative estimate", lambda e: e.check(P, M, K, -1), ValueError),
    ("can_use_tokens negative", lambda e: e.can_use_tokens(P, M, K, -1), ValueError),
    ("set_model_limits negative", lambda e: e.set_model_limits(P, M, rpm=-1), ValueError),
    ("set_model_limits negative tpd", lambda e: e.set_model_limits(P, M, rpm=5, tpd=-1), ValueError),
    ("limits dict negative", lambda e: e.check(P, M, K, limits={"rpm": -1}), ValueError),
    ("lease limits negative", lambda e: e.lease(P, M, K, limits={"tpm": -3}), ValueError),
    ("Limits negative", lambda e: e.usage(P, M, K, limits=q.Limits(rpd=-1)), ValueError),
    ("set_cooldown negative duration", lambda e: e.set_cooldown(P, M, K, duration_ms=-1), ValueError),
    ("set_provider_caps negative", lambda e: e.set_provider_caps(P, daily_requests=-1), ValueError),
    # empty platform / model
    ("record_request empty platform", lambda e: e.record_request("", M, K), ValueError),
    ("record_request empty model", lambda e: e.record_request(P, "", K), ValueError),
    ("lease empty model", lambda e: e.lease(P, "", K), ValueError),
    ("lease empty platform", lambda e: e.lease("", M, K), ValueError),
    ("record_tokens empty model", lambda e: e.record_tokens(P, "", K, 5), ValueError),
    ("set_model_limits empty model", lambda e: e.set_model_limits(P, "", rpm=1), ValueError),
    ("set_cooldown empty platform", lambda e: e.set_cooldown("", M, K), ValueError),
    # wrong types
    ("key_id float", lambda e: e.record_request(P, M, 1.0), TypeError),
    ("tokens float", lambda e: e.record_tokens(P, M, K, 1.5), TypeError),
    ("tokens integral float", lambda e: e.record_tokens(P, M, K, 2.0), TypeError),
    ("estimate float", lambda e: e.lease(P, M, K, 10.0), TypeError),
    ("key_id bool", lambda e: e.record_request(P, M, True), TypeError),
    ("tokens bool", lambda e: e.record_tokens(P, M, K, True), TypeError),
    ("lease key_id bool", lambda e: e.lease(P, M, False), TypeError),
    ("duration float", lambda e: e.set_cooldown(P, M, K, duration_ms=1000.0), TypeError),
    ("limit float", lambda e: e.check(P, M, K, limits={"rpm": 1.5}), TypeError),
    ("set_model_limits float", lambda e: e.set_model_limits(P, M, rpm=2.0), TypeError),
    ("key_id str", lambda e: e.record_request(P, M, "1"), TypeError),
    ("platform int", lambda e: e.record_request(3, M, K), TypeError),
    # out of int64
    ("key_id 2**63", lambda e: e.record_request(P, M, 2**63), OverflowError),
    ("key_id -2**63-1", lambda e: e.record_request(P, M, -(2**63) - 1), OverflowError),
    ("tokens 2**63", lambda e: e.record_tokens(P, M, K, 2**63), OverflowError),
    ("estimate 2**64", lambda e: e.lease(P, M, K, 2**64), OverflowError),
    ("duration 2**63", lambda e: e.set_cooldown(P, M, K, duration_ms=2**63), OverflowError),
    ("release_lease 2**63", lambda e: e.release_lease(2**63), OverflowError),
    # NaN / infinite
    ("limit NaN", lambda e: e.check(P, M, K, limits={"rpm": NAN}), ValueError),
    ("limit inf", lambda e: e.lease(P, M, K, limits={"tpm": INF}), ValueError),
    ("Limits NaN via usage", lambda e: e.usage(P, M, K, limits={"tpd": NAN}), ValueError),
    ("set_model_limits NaN", lambda e: e.set_model_limits(P, M, rpm=NAN), ValueError),
    # unknown names
    ("unknown cooldown source", lambda e: e.set_cooldown(P, M, K, source="guess"), ValueError),
]


@pytest.mark.parametrize(("call", "exc"), [(c, x) for _, c, x in BAD_CALLS], ids=[n for n, _, _ in BAD_CALLS])
def test_bad_input_raises_and_changes_nothing(busy: q.QuotaEngine, call: Call, exc: type[Exception]) -> None:
    before = state(busy)
    with pytest.raises(exc):
        call(busy)
    assert state(busy) == before
    # The engine still works.
    busy.record_request(P, M, K)
    with busy.lease(P, M, K, 5):
        pass
    u = busy.usage(P, M, K)
    assert u["rpm"]["used"] == before[0]["rpm"]["used"] + 2
    assert u["tpm"]["used"] == before[0]["tpm"]["used"] + 5


def test_bad_limits_object_constructor() -> None:
    with pytest.raises(ValueError):
        q.Limits(rpm=-1)
    with pytest.raises(ValueError):
        q.Limits(tpm=NAN)
    with pytest.raises(TypeError):
        q.Limits(rpd=1.5)
    with pytest.raises(TypeError):
        q.Limits(rpm=True)
    with pytest.raises(OverflowError):
        q.Limits(tpd=2**63)


def test_bad_constructor_arguments(db_path: Path) -> None:
    for kwargs, exc in [
        ({"retention_ms": -1}, ValueError),
        ({"lease_max_age_ms": -1}, ValueError),
        ({"busy_timeout_ms": -1}, ValueError),
        ({"flush_interval_ms": -1}, ValueError),
        ({"lease_max_age_ms": 1.5}, TypeError),
        ({"retention_ms": 2**63}, OverflowError),
    ]:
        with pytest.raises(exc):
            q.QuotaEngine(db_path, env={}, **kwargs)
    with pytest.raises(TypeError):
        q.ManualClock(1.0)
    with pytest.raises(OverflowError):
        q.ManualClock(2**63)


def test_bad_success_tokens_keeps_the_lease(busy: q.QuotaEngine) -> None:
    lease = busy.lease(P, M, K, 5)
    before = state(busy)
    with pytest.raises(ValueError):
        lease.success(tokens=-1)
    with pytest.raises(TypeError):
        lease.success(tokens=1.5)
    assert state(busy) == before
    lease.success(tokens=3)
    assert busy.usage(P, M, K)["tpm"]["used"] == before[0]["tpm"]["used"] + 3


def test_rust_panic_is_an_ordinary_exception(busy: q.QuotaEngine) -> None:
    before = state(busy)
    for _ in range(2):
        with pytest.raises(q.QuotaEngineError) as exc:
            busy._debug_panic()
        assert isinstance(exc.value, Exception)
        assert type(exc.value).__name__ != "PanicException"
    assert state(busy) == before
    busy.record_request(P, M, K)
    with busy.lease(P, M, K, 5):
        pass
    assert busy.usage(P, M, K)["rpm"]["used"] == before[0]["rpm"]["used"] + 2
    assert not busy.closed


# ---------------------------------------------------------------------------- model-based property

ops = st.lists(
    st.one_of(
        st.tuples(st.just("record")),
        st.tuples(st.just("tokens"), st.integers(0, 60)),
        st.tuples(st.just("lease"), st.integers(0, 60)),
        st.tuples(st.just("release"), st.integers(0, 10)),
        st.tuples(st.just("success"), st.integers(0, 10), st.one_of(st.none(), st.integers(0, 60))),
        st.tuples(st.just("advance"), st.integers(0, 40_000)),
    ),
    max_size=40,
)
small = st.integers(0, 6)
opt_small = st.one_of(st.none(), st.integers(0, 12))
opt_tokens = st.one_of(st.none(), st.integers(0, 200))


@given(ops=ops, rpm=small, rpd=opt_small, tpm=opt_tokens, tpd=opt_tokens)
def test_lease_admits_exactly_what_the_windows_allow(
    ops: list[tuple[Any, ...]], rpm: int, rpd: int | None, tpm: int | None, tpd: int | None
) -> None:
    limits = {"rpm": rpm, "rpd": rpd, "tpm": tpm, "tpd": tpd}
    clock = q.ManualClock(T0 + DAY - 2 * MINUTE)  # 23:58: the day windows may roll over
    # A lease never expires here, so the model need not know the backstop.
    e = q.QuotaEngine(":memory:", clock=clock, env={}, lease_max_age_ms=10 * DAY)
    events: list[tuple[int, str, int]] = []  # (t, kind, amount)
    held: list[q.Lease] = []

    def model() -> dict[str, int]:
        now = clock.now_ms()
        midnight = now - now % DAY
        return {
            "rpm": sum(1 for t, k, _ in events if k == "request" and t > now - MINUTE),
            "rpd": sum(1 for t, k, _ in events if k == "request" and t >= midnight),
            "tpm": sum(n for t, k, n in events if k == "tokens" and t > now - MINUTE),
            "tpd": sum(n for t, k, n in events if k == "tokens" and t >= midnight),
            "in_flight": len(held),
            "in_flight_tokens": sum(lease.estimated_tokens for lease in held),
        }

    try:
        for op in ops:
            now = clock.now_ms()
            if op[0] == "record":
                e.record_request(P, M, K)
                events.append((now, "request", 1))
            elif op[0] == "tokens":
                e.record_tokens(P, M, K, op[1])
                events.append((now, "tokens", op[1]))
            elif op[0] == "advance":
                clock.advance(op[1])
            elif op[0] == "lease":
                m = model()
                allowed = (
                    m["rpm"] + m["in_flight"] < rpm
                    and (rpd is None or m["rpd"] + m["in_flight"] < rpd)
                    and (tpm is None or m["tpm"] + m["in_flight_tokens"] + op[1] <= tpm)
                    and (tpd is None or m["tpd"] + m["in_flight_tokens"] + op[1] <= tpd)
                )
                try:
                    held.append(e.lease(P, M, K, op[1], limits=limits))
                    admitted = True
                except q.QuotaExceeded:
                    admitted = False
                assert admitted == allowed, (m, op)
                if admitted:
                    u = e.usage(P, M, K, limits=limits)
                    assert u["rpm"]["used"] + u["in_flight"] <= rpm
            elif held:
                lease = held.pop(op[1] % len(held))
                if op[0] == "release":
                    lease.release()
                else:
                    lease.success(tokens=op[2])
                    events.append((now, "request", 1))
                    if op[2] is not None:
                        events.append((now, "tokens", op[2]))
            m = model()
            u = e.usage(P, M, K, limits=limits)
            assert {w: u[w]["used"] for w in ("rpm", "rpd", "tpm", "tpd")} == {
                w: m[w] for w in ("rpm", "rpd", "tpm", "tpd")
            }
            assert u["in_flight"] == m["in_flight"]
    finally:
        e.close()
