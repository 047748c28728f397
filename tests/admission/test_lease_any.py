"""SPEC 17.1 (`lease_any`: choosing among candidates in one atomic step) on both
backends: the strategies, refusals, bad input, and the race across processes."""

from __future__ import annotations

import pytest
import quotaengine as q
from subprocesses import race

NOW = 1_767_268_800_000  # 2026-01-01 12:00 UTC
M = "m"


@pytest.fixture
def clock() -> q.ManualClock:
    return q.ManualClock(NOW)


def in_flight(e: q.QuotaEngine, routes: list[tuple[str, str, int]]) -> int:
    return sum(e.usage(*r)["in_flight"] for r in routes)


def test_order_takes_the_first_that_passes(engine: q.QuotaEngine) -> None:
    engine.set_model_limits("a", M, rpm=1)
    engine.set_model_limits("b", M, rpm=1)
    routes = [("a", M, 1), ("b", M, 2), ("c", M, 3)]
    first = engine.lease_any(routes, 40, strategy="order")
    assert (first.platform, first.model_id, first.key_id, first.estimated_tokens) == ("a", M, 1, 40)
    second = engine.lease_any(routes, strategy="order")
    assert second.platform == "b"
    third = engine.lease_any(routes, strategy="order")
    assert third.platform == "c"  # nothing declared: always passes
    assert engine.usage("a", M, 1)["in_flight"] == 1
    for lease in (first, second, third):
        lease.success()
    assert engine.usage("a", M, 1)["rpm"]["used"] == 1


def test_headroom_sends_a_big_request_where_it_hurts_least(engine: q.QuotaEngine) -> None:
    """One token-metered route and one request-metered route: a big request goes to the
    request-metered one (it costs it one request of ten), a small one to the token-metered
    one (it costs it 1% of its tokens)."""
    engine.set_model_limits("tokens", M, tpm=10_000)
    engine.set_model_limits("requests", M, rpm=10)
    routes = [("tokens", M, 1), ("requests", M, 2)]
    big = engine.lease_any(routes, 8_000)
    assert big.platform == "requests"  # tokens would keep 20%, requests 90%
    big.release()
    small = engine.lease_any(routes, 100)
    assert small.platform == "tokens"  # 99% against 90%
    small.release()
    # What the route has used counts: 9 requests used leave 0% after one more.
    for _ in range(9):
        engine.record_request("requests", M, 2)
    assert engine.lease_any(routes, 8_000).platform == "tokens"


def test_headroom_reads_every_declared_limit_provider_caps_and_observed_headroom(engine: q.QuotaEngine) -> None:
    engine.set_model_limits("a", M, rpm=100, rpd=10)  # the day is the binding window
    engine.set_model_limits("b", M, rpm=50)
    routes = [("a", M, 1), ("b", M, 2)]
    assert engine.lease_any(routes).platform == "b"  # a: 90% of its day left, b: 98% of its minute
    engine.set_provider_caps("b", daily_requests=5)  # b's provider cap binds now: 4/5 < ...
    for _ in range(3):
        engine.record_request("b", M, 2)
    lease = engine.lease_any(routes)
    assert lease.platform == "a"
    lease.release()
    engine.set_provider_caps("b", daily_requests=None)
    # A key's observed quota headroom (8.2) bounds its score too.
    engine.record_quota_headers("b", 2, {"x-ratelimit-limit-requests": "100", "x-ratelimit-remaining-requests": "5"})
    assert engine.key_quota_headroom("b")[2] == pytest.approx(0.05)
    assert engine.lease_any(routes).platform == "a"


def test_ties_go_to_the_given_order_and_nothing_declared_scores_one(engine: q.QuotaEngine) -> None:
    routes = [("x", M, 1), ("y", M, 2)]
    assert engine.lease_any(routes).platform == "x"
    assert engine.lease_any(list(reversed(routes))).platform == "y"


def test_spread_picks_the_least_recently_leased(engine: q.QuotaEngine) -> None:
    routes = [("a", M, 1), ("b", M, 2), ("c", M, 3)]
    engine.lease("b", M, 2).release()  # lease() counts as a lease of b
    picks = [engine.lease_any(routes, strategy="spread") for _ in range(4)]
    assert [p.platform for p in picks] == ["a", "c", "b", "a"]  # never leased first, in order
    for p in picks:
        p.release()


def test_duplicates_count_once_and_refusals_name_every_candidate(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.set_model_limits("a", M, rpm=1)
    engine.set_model_limits("b", M, rpd=1)
    engine.record_request("a", M, 1)
    engine.record_request("b", M, 2)
    engine.set_cooldown("c", M, 3, 30_000)
    routes = [("a", M, 1), ("b", M, 2), ("a", M, 1), ("c", M, 3)]
    with pytest.raises(q.QuotaExceeded) as exc:
        engine.lease_any(routes)
    refusals = exc.value.refusals
    assert [(r.platform, r.reason) for r in refusals] == [("a", "rpm"), ("b", "rpd"), ("c", "cooldown")]
    assert refusals[0].retry_at_ms == NOW + 60_000
    assert refusals[2].retry_at_ms == NOW + 30_000
    # The exception's own fields: the refusal with the earliest known retry time.
    assert (exc.value.platform, exc.value.reason, exc.value.retry_at_ms) == ("c", "cooldown", NOW + 30_000)
    assert isinstance(refusals[0], q.Refusal)
    assert in_flight(engine, routes) == 0


def test_a_lease_refusal_carries_one_refusal(engine: q.QuotaEngine) -> None:
    engine.set_model_limits("a", M, rpm=1)
    engine.lease("a", M, 1).success()
    with pytest.raises(q.QuotaExceeded) as exc:
        engine.lease("a", M, 1)
    assert exc.value.refusals == [q.Refusal("a", M, 1, "rpm", NOW + 60_000)]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"routes": []}, ValueError),
        ({"routes": "groq"}, TypeError),
        ({"routes": 5}, TypeError),
        ({"routes": [("a", M)]}, TypeError),
        ({"routes": [("a", M, "1")]}, TypeError),
        ({"routes": [("", M, 1)]}, ValueError),
        ({"strategy": "best"}, ValueError),
        ({"strategy": 3}, TypeError),
        ({"wait_s": -1}, ValueError),
        ({"wait_s": float("nan")}, ValueError),
        ({"wait_s": float("inf")}, ValueError),
        ({"wait_s": "1"}, TypeError),
        ({"estimated_tokens": -1}, ValueError),
        ({"estimated_tokens": 10, "estimated_output_tokens": 11}, ValueError),
    ],
)
def test_bad_input_leases_nothing(engine: q.QuotaEngine, kwargs: dict, error: type[Exception]) -> None:
    args = {"routes": [("a", M, 1), ("b", M, 2)], **kwargs}
    with pytest.raises(error):
        engine.lease_any(**args)
    assert in_flight(engine, [("a", M, 1), ("b", M, 2)]) == 0


def test_bad_wait_s_on_lease(engine: q.QuotaEngine) -> None:
    for bad, error in [(-0.5, ValueError), (float("nan"), ValueError), (True, TypeError)]:
        with pytest.raises(error):
            engine.lease("a", M, 1, wait_s=bad)
    assert engine.usage("a", M, 1)["in_flight"] == 0


RACE = """
    import sys, threading
    import quotaengine as q
    store, now = sys.argv[1], int(sys.argv[2])
    e = q.QuotaEngine(store, clock=q.ManualClock(now), env={})
    routes = [("p1", "m", 1), ("p2", "m", 2), ("p3", "m", 3)]
    counts = {1: 0, 2: 0, 3: 0}
    errors = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker():
        try:
            barrier.wait()
            while True:
                try:
                    lease = e.lease_any(routes, 10, strategy="spread")
                except q.QuotaExceeded as exc:
                    if any(r.reason != "rpm" for r in exc.refusals):
                        errors.append(str(exc))
                    return
                with lock:
                    counts[lease.key_id] += 1
                lease.success()
        except BaseException as exc:
            errors.append(repr(exc))

    print("ready", flush=True)
    sys.stdin.readline()
    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(counts[1], counts[2], counts[3], "errors", len(errors), *errors, flush=True)
    e.close()
"""


def test_four_processes_of_eight_threads_admit_exactly_the_limits(store: str) -> None:
    with q.QuotaEngine(store, clock=q.ManualClock(NOW), env={}) as e:
        for p in ("p1", "p2", "p3"):
            e.set_model_limits(p, M, rpm=100)
    totals = [0, 0, 0]
    for out in race(RACE, [[store, str(NOW)]] * 4):
        assert out[3:5] == ["errors", "0"], out
        for i in range(3):
            totals[i] += int(out[i])
    assert totals == [100, 100, 100]
    with q.QuotaEngine(store, clock=q.ManualClock(NOW), env={}) as e:
        assert [e.usage(p, M, k)["rpm"]["used"] for p, k in (("p1", 1), ("p2", 2), ("p3", 3))] == [100] * 3
