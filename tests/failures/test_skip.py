"""SPEC 24.7: what a failed request skips (``FailureOutcome.skip``), ``lease_any(...,
exclude=)``, and the model penalty, on both backends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import quotaengine as q
from moments import NOON


@pytest.mark.parametrize(
    ("failure", "skip"),
    [
        ({"status": 403}, "model"),
        ({"kind": "forbidden"}, "model"),
        ({"status": 404, "message": "model not found"}, "model"),
        ({"status": 400, "message": "This model's maximum context length is 8192 tokens"}, "model"),
        ({"status": 400, "message": '{"error": {"code": "context_length_exceeded"}}'}, "model"),
        ({"status": 413, "message": "Request too large for model"}, "model"),
        ({"status": 400, "message": "prompt exceeds the Maximum Context of the model"}, "model"),
        ({"status": 400, "message": "invalid temperature"}, "route"),
        ({"status": 413, "message": "payload rejected"}, "route"),
        ({"status": 500}, "platform"),
        ({"status": 503, "message": "The server is overloaded"}, "platform"),
        ({"status": 408}, "platform"),
        ({"message": "request timed out"}, "platform"),
        ({"message": "connection reset by peer"}, "platform"),
        ({"kind": "transport"}, "platform"),
        ({"status": 429, "message": "rate limit reached"}, "route"),
        ({"status": 401}, "route"),
        ({"status": 402}, "route"),
        ({"kind": "empty_completion"}, "route"),
        ({"status": 418}, "route"),
    ],
)
def test_a_failure_says_what_the_request_skips(qengine: q.QuotaEngine, failure: dict, skip: str) -> None:
    out = qengine.record_failure("groq", "llama", 1, **failure)
    assert out.skip == skip
    assert f"skip={skip!r}" in repr(out).replace('"', "'")


def test_lease_failure_and_observe_carry_the_skip(qengine: q.QuotaEngine) -> None:
    e = qengine
    with e.lease("groq", "llama", 1) as lease:
        out = lease.failure(status=404, message="no such model")
    assert out is not None and (out.kind, out.skip) == ("other", "model")
    lease = e.lease("groq", "llama", 2)
    out = lease.observe(TimeoutError("timed out"))
    assert out is not None and (out.kind, out.skip) == ("timeout", "platform")


ROUTES = [("groq", "llama", 1), ("groq", "llama", 2), ("groq", "mixtral", 3), ("cerebras", "llama", 4)]


@pytest.mark.parametrize(
    ("exclude", "excluded"),
    [
        ([("groq", "llama", 1)], {0}),
        ([("groq", "llama")], {0, 1}),
        ([("groq",)], {0, 1, 2}),
        ([["groq", "mixtral", 3], ("cerebras",)], {2, 3}),
        ("a generator", {0, 1, 2}),
        ([("groq", "llama", 9), ("openai",), ("groq", "gemma")], set()),
        ([], set()),
        (None, set()),
    ],
)
def test_exclude_refuses_what_it_covers_without_running_its_gates(
    qengine: q.QuotaEngine, exclude: object, excluded: set[int]
) -> None:
    e = qengine
    if exclude == "a generator":  # any iterable, read once
        exclude = (x for x in [("groq", "llama"), ("groq", "mixtral")])
    # Every candidate is benched: those not excluded are refused by their gates.
    for r in ROUTES:
        e.set_cooldown(*r, duration_ms=60_000)
    with pytest.raises(q.QuotaExceeded) as info:
        e.lease_any(ROUTES, exclude=exclude)  # type: ignore[arg-type]
    refusals = info.value.refusals
    assert [(r.platform, r.model_id, r.key_id) for r in refusals] == ROUTES
    for i, r in enumerate(refusals):
        if i in excluded:
            assert (r.reason, r.retry_at_ms) == ("excluded", None)
        else:
            assert (r.reason, r.retry_at_ms) == ("cooldown", NOON + 60_000)
    # The headline is the earliest known retry time: never an excluded one.
    if len(excluded) < len(ROUTES):
        assert info.value.reason == "cooldown"


@pytest.mark.parametrize("strategy", ["order", "headroom", "spread"])
def test_the_first_candidate_not_excluded_is_leased(qengine: q.QuotaEngine, strategy: str) -> None:
    e = qengine
    lease = e.lease_any(ROUTES, strategy=strategy, exclude=[("groq", "llama")])  # type: ignore[arg-type]
    assert (lease.platform, lease.model_id, lease.key_id) in {("groq", "mixtral", 3), ("cerebras", "llama", 4)}
    lease = e.lease_any(ROUTES, strategy=strategy, exclude=[("groq",)])  # type: ignore[arg-type]
    assert (lease.platform, lease.model_id, lease.key_id) == ("cerebras", "llama", 4)
    # An excluded candidate is not even counted: its usage is untouched.
    assert e.usage("groq", "llama", 1)["in_flight"] == 0


@pytest.mark.parametrize(
    ("exclude", "error"),
    [
        ([("groq", "llama", 1, 2)], TypeError),
        ([()], TypeError),
        (["groq"], TypeError),
        ("groq", TypeError),
        (3, TypeError),
        ([("groq", 7)], TypeError),
        ([(7,)], TypeError),
        ([("groq", "llama", "1")], TypeError),
        ([("",)], ValueError),
        ([("groq", "")], ValueError),
        ([("", "llama", 1)], ValueError),
    ],
)
def test_a_bad_exclusion_is_an_error_with_nothing_leased(
    qengine: q.QuotaEngine, exclude: object, error: type[Exception]
) -> None:
    e = qengine
    with pytest.raises(error):
        e.lease_any(ROUTES, exclude=exclude)  # type: ignore[arg-type]
    with pytest.raises(error):
        asyncio.run(e.lease_any_async(ROUTES, exclude=exclude))  # type: ignore[arg-type]
    assert all(e.usage(*r)["in_flight"] == 0 for r in ROUTES)


def test_a_waiting_lease_any_whose_every_candidate_is_excluded_is_refused_at_once(qengine: q.QuotaEngine) -> None:
    e = qengine
    started = time.monotonic()
    with pytest.raises(q.QuotaExceeded) as info:
        e.lease_any(ROUTES[:2], wait_s=5, exclude=[("groq", "llama")])
    assert time.monotonic() - started < 1.0
    assert {r.reason for r in info.value.refusals} == {"excluded"}
    started = time.monotonic()
    with pytest.raises(q.QuotaExceeded):
        asyncio.run(e.lease_any_async(ROUTES[:2], wait_s=5, exclude=[("groq",)]))
    assert time.monotonic() - started < 1.0


def test_a_waiting_lease_any_waits_only_for_what_is_not_excluded(qengine: q.QuotaEngine) -> None:
    e = qengine
    e.set_cooldown("groq", "mixtral", 3, duration_ms=600_000)
    started = time.monotonic()
    # The one candidate left frees 10 min ahead, beyond the wait: refused at once.
    with pytest.raises(q.QuotaExceeded):
        e.lease_any(ROUTES[:3], wait_s=5, exclude=[("groq", "llama")])
    assert time.monotonic() - started < 1.0
    lease = asyncio.run(e.lease_any_async(ROUTES, wait_s=5, exclude=[("groq", "llama")]))
    assert (lease.platform, lease.model_id, lease.key_id) == ("cerebras", "llama", 4)


# ---- the model penalty -----------------------------------------------------------------

CANDIDATES = [("groq", "llama", 1), ("groq", "mixtral", 2), ("cerebras", "llama", 3)]


@pytest.fixture
def engines(store: str, qclock: q.ManualClock) -> Iterator[tuple[q.QuotaEngine, q.QuotaEngine]]:
    with q.QuotaEngine(store, clock=qclock, env={}) as a, q.QuotaEngine(store, clock=qclock, env={}) as b:
        for p, m, _ in CANDIDATES:
            # The penalized model has the most room: headroom would pick it first.
            b.set_model_limits(p, m, rpm=1000 if (p, m) == ("groq", "llama") else 10)
        yield a, b


def picked(e: q.QuotaEngine, strategy: str) -> tuple[str, str, int]:
    lease = e.lease_any(CANDIDATES, strategy=strategy)  # type: ignore[arg-type]
    lease.release()
    return (lease.platform, lease.model_id, lease.key_id)


@pytest.mark.parametrize("kind", ["server_error", "timeout", "transport", "empty_completion"])
def test_a_model_that_failed_server_side_ranks_last_in_another_engine(
    engines: tuple[q.QuotaEngine, q.QuotaEngine], qclock: q.ManualClock, kind: str
) -> None:
    a, b = engines
    assert picked(b, "headroom") == ("groq", "llama", 1)
    # Engine A's failure of the model, on a key B never leases.
    a.record_failure("groq", "llama", 99, kind=kind)
    assert picked(b, "headroom") != ("groq", "llama", 1)
    assert picked(b, "headroom")[:2] != ("groq", "llama")
    # spread: the never-leased penalized one would come first; it comes last.
    seen = [picked(b, "spread") for _ in range(3)]
    assert ("groq", "llama", 1) not in seen[:2]
    # order is unchanged.
    assert picked(b, "order") == ("groq", "llama", 1)
    # A penalized candidate still passes when it is the only one.
    assert b.lease_any([CANDIDATES[0]], strategy="headroom").key_id == 1
    qclock.advance(300_001)
    assert picked(b, "headroom") == ("groq", "llama", 1)


def test_other_failures_do_not_penalize_the_model(
    engines: tuple[q.QuotaEngine, q.QuotaEngine], qclock: q.ManualClock
) -> None:
    a, b = engines
    for failure in ({"status": 429}, {"status": 404}, {"status": 401}, {"kind": "other"}):
        a.record_failure("groq", "llama", 99, **failure)  # type: ignore[arg-type]
    assert picked(b, "headroom") == ("groq", "llama", 1)


def test_the_penalty_lasts_five_minutes_from_the_latest_failure(
    engines: tuple[q.QuotaEngine, q.QuotaEngine], qclock: q.ManualClock
) -> None:
    a, b = engines
    a.record_failure("groq", "llama", 99, status=500)
    qclock.advance(240_000)
    a.record_failure("groq", "llama", 98, status=502)
    qclock.advance(240_000)
    # 8 min after the first, 4 min after the latest: still penalized; a success does not clear it.
    b.lease("groq", "llama", 98).success()
    assert picked(b, "headroom")[:2] != ("groq", "llama")
    qclock.advance(60_001)
    assert picked(b, "headroom") == ("groq", "llama", 1)


def test_a_reopened_engine_still_sees_the_penalty(store: str, qclock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=qclock, env={}) as a:
        a.set_model_limits("groq", "llama", rpm=1000)
        a.set_model_limits("groq", "mixtral", rpm=10)
        a.record_failure("groq", "llama", 5, kind="transport")
    with q.QuotaEngine(store, clock=q.ManualClock(NOON + 1_000), env={}) as b:
        lease = b.lease_any(CANDIDATES[:2])
        assert lease.model_id == "mixtral"
