"""SPEC 23.1: the cost of events and the ``cost`` metric. Events are costed in integer
micro-dollars (µ$) at the prices in force when they are recorded; a lease reserves the worst
case of its estimate and its outcome replaces the reservation with what was recorded; a
``cost`` limit (``Limit.dollars``) refuses as a token gate does. Every test runs on a SQLite
file and on a real redis-server."""

from __future__ import annotations

import math
import threading

import pytest
import quotaengine as q
from subprocesses import race

P, M, K = "openai", "gpt-4o-mini", 1
# 0.15 $/M input (150,000 p$ a token), 0.6 $/M output, 0.075 $/M cached input.
MINI = q.Prices(0.15, 0.6, cached_input=0.075)
# 3 $/M input, 15 $/M output, 0.002 $ a request.
DEAR = q.Prices(3, 15, per_request=0.002)


def costs(e: q.QuotaEngine, key_id: int = K) -> list[tuple[str, int, int]]:
    return [(r["kind"], r["tokens"], r["cost"]) for r in e.usage_events(key_id=key_id)]


# ================================================================== Limit.dollars


def test_limit_dollars_builds_a_cost_limit_in_micro_dollars() -> None:
    assert q.Limit.dollars(5, "day") == q.Limit("cost", 5_000_000, "day")
    assert q.Limit.dollars(0.25, "month", "key") == q.Limit("cost", 250_000, "month", "key")
    assert q.Limit.dollars(1.2345675, "5h").limit == round(1.2345675 * 10**6)
    assert q.Limit.dollars(0, "day").limit == 0
    assert repr(q.Limit.dollars(10, "month")) == 'Limit(metric="cost", limit=10000000, per="month", scope="account")'


@pytest.mark.parametrize("amount", [-0.01, math.nan, math.inf, -math.inf])
def test_limit_dollars_refuses_a_negative_or_non_finite_amount(amount: float) -> None:
    with pytest.raises(ValueError):
        q.Limit.dollars(amount, "day")


@pytest.mark.parametrize("amount", [True, "5", None, [5]])
def test_limit_dollars_refuses_a_non_number(amount: object) -> None:
    with pytest.raises(TypeError):
        q.Limit.dollars(amount, "day")  # type: ignore[arg-type]


def test_two_cost_limits_of_one_window_are_a_duplicate(engine: q.QuotaEngine) -> None:
    with pytest.raises(ValueError):
        engine.set_model_limits(P, M, limits=[q.Limit.dollars(1, "day"), q.Limit("cost", 5, "day")])
    assert engine.model_limit_list(P, M) == []
    engine.set_model_limits(P, M, limits=[q.Limit.dollars(1, "day"), q.Limit.dollars(1, "day", "key")])
    assert [x.metric for x in engine.model_limit_list(P, M)] == ["cost", "cost"]


# ================================================================== what events cost


def test_events_are_costed_exactly_and_rounded_up(engine: q.QuotaEngine) -> None:
    engine.set_model_prices(P, M, MINI)
    engine.record_request(P, M, K)  # no price per request: 0
    # 1,000 input of which 400 cached, 200 output:
    # 600 x 150,000 + 400 x 75,000 + 200 x 600,000 p$ = 240,000,000 p$ = 240 µ$.
    engine.record_tokens(P, M, K, input_tokens=1_000, output_tokens=200, cached_tokens=400)
    # A bare total at the dearer price: 7 x 600,000 p$ = 4.2 µ$, rounded up to 5.
    engine.record_tokens(P, M, K, 7)
    # One token at the input price: 0.15 µ$, rounded up to 1.
    engine.record_tokens(P, M, K, input_tokens=1)
    assert costs(engine) == [("request", 0, 0), ("tokens", 1_200, 240), ("tokens", 7, 5), ("tokens", 1, 1)]


def test_a_request_costs_its_price_per_request(engine: q.QuotaEngine) -> None:
    engine.set_model_prices(P, M, DEAR)
    engine.record_request(P, M, K)
    engine.lease(P, M, K).success()
    assert costs(engine) == [("request", 0, 2_000), ("request", 0, 2_000)]


def test_an_unpriced_model_costs_nothing(engine: q.QuotaEngine) -> None:
    engine.set_model_prices(P, "other", DEAR)
    engine.record_request(P, M, K)
    engine.record_tokens(P, M, K, 10**9)
    assert [c for _, _, c in costs(engine)] == [0, 0]


def test_events_keep_the_prices_they_were_recorded_at(engine: q.QuotaEngine) -> None:
    engine.set_model_prices(P, M, DEAR)
    engine.record_tokens(P, M, K, input_tokens=1_000)  # 3,000 µ$
    engine.set_model_prices(P, M, MINI)
    engine.record_tokens(P, M, K, input_tokens=1_000)  # 150 µ$
    engine.set_model_prices(P, M, None)
    engine.record_tokens(P, M, K, input_tokens=1_000)
    assert [c for _, _, c in costs(engine)] == [3_000, 150, 0]


def test_a_cost_beyond_int64_is_an_overflow_error_and_records_nothing(engine: q.QuotaEngine) -> None:
    engine.set_model_prices(P, M, q.Prices(9e12, 9e12))
    with pytest.raises(OverflowError):
        engine.record_tokens(P, M, K, 2**62)
    assert costs(engine) == []


# ================================================================== reservation and outcome


def test_a_lease_reserves_the_worst_case_and_its_outcome_replaces_it(
    engine: q.QuotaEngine, clock: q.ManualClock
) -> None:
    engine.set_model_prices(P, M, DEAR)
    engine.set_model_limits(P, M, limits=[q.Limit.dollars(1, "day")])
    # 1,000 estimated of which 400 output: 2,000 + 600 x 3 + 400 x 15 = 9,800 µ$ reserved.
    lease = engine.lease(P, M, K, 1_000, estimated_output_tokens=400)
    assert engine.usage(P, M, K)["cost/day"] == {"used": 0, "limit": 1_000_000}
    # What it recorded replaces the reservation: 2,000 + 100 x 3 + 10 x 15 = 2,450 µ$.
    lease.success(input_tokens=100, output_tokens=10)
    assert engine.usage(P, M, K)["cost/day"] == {"used": 2_450, "limit": 1_000_000}
    # A call that spent more than it reserved is charged what it spent.
    engine.lease(P, M, K, 10).success(input_tokens=10_000)
    assert engine.usage(P, M, K)["cost/day"]["used"] == 2_450 + 2_000 + 30_000


def test_the_reservation_counts_at_the_gate(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.set_model_prices(P, M, DEAR)
    # Two leases' worth: each lease of 1 input token reserves 2,000 + 3 = 2,003 µ$.
    engine.set_model_limits(P, M, limits=[q.Limit("cost", 4_006, "day")])
    a = engine.lease(P, M, K, 1)
    b = engine.lease(P, M, K, 1)
    with pytest.raises(q.QuotaExceeded) as exc:
        engine.lease(P, M, K, 1)
    assert exc.value.reason == "cost/day"
    # As for a token window of the same per: the next calendar day.
    assert exc.value.retry_at_ms == (clock.now_ms() // 86_400_000 + 1) * 86_400_000
    # An outcome that spent less frees the difference: a records the request alone
    # (2,000 µ$), and 2,000 + b's 2,003 in flight + 2,003 is still over.
    a.success()
    with pytest.raises(q.QuotaExceeded):
        engine.lease(P, M, K, 1)
    # A release records nothing: b's whole reservation is freed.
    b.release()
    engine.lease(P, M, K, 1).release()
    # A lease of an unpriced model reserves 0 and passes even a cost limit of 0.
    engine.set_model_limits(P, "free", limits=[q.Limit("cost", 0, "day")])
    engine.lease(P, "free", K, 10**6).success(tokens=10**6)


def test_a_cost_window_retries_when_the_spend_leaves_it(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.set_model_prices(P, M, DEAR)
    engine.set_model_limits(P, M, limits=[q.Limit("cost", 2_100, "1h")])
    t0 = clock.now_ms()
    engine.lease(P, M, K, 0).success()  # 2,000 µ$
    clock.advance(60_000)
    with pytest.raises(q.QuotaExceeded) as exc:
        engine.lease(P, M, K, 0)
    assert exc.value.reason == "cost/1h"
    assert exc.value.retry_at_ms == t0 + 3_600_000
    clock.set(t0 + 3_600_000)
    engine.lease(P, M, K, 0).release()


def test_leaving_a_with_block_records_the_estimate_at_its_reservation(engine: q.QuotaEngine) -> None:
    engine.set_model_prices(P, M, DEAR)
    with engine.lease(P, M, K, 1_000, estimated_output_tokens=400):
        pass
    # The estimate with its split: 600 input, 400 output, and the request: 9,800 µ$ in all.
    assert costs(engine) == [("request", 0, 2_000), ("tokens", 1_000, 7_800)]
    rows = engine.usage_events(key_id=K)
    assert (rows[1]["input_tokens"], rows[1]["output_tokens"]) == (600, 400)


def test_close_records_a_live_lease_at_its_reservation(store: str, clock: q.ManualClock) -> None:
    e = q.QuotaEngine(store, clock=clock, env={})
    e.set_model_prices(P, M, DEAR)
    live = e.lease(P, M, K, 100, estimated_output_tokens=100)  # held: a collected one keeps counting
    e.close()
    del live
    with q.QuotaEngine(store, clock=clock, env={}) as again:
        assert costs(again) == [("request", 0, 2_000), ("tokens", 100, 1_500)]


def test_lease_any_reserves_each_candidate_at_its_own_prices(engine: q.QuotaEngine) -> None:
    engine.set_model_prices(P, "dear", DEAR)
    engine.set_model_prices(P, "cheap", MINI)
    for model in ("dear", "cheap"):
        engine.set_model_limits(P, model, limits=[q.Limit.dollars(0.01, "day")])
    # 10,000 input tokens: 32,000 µ$ on the dear model (over its 10,000), 1,500 on the cheap.
    lease = engine.lease_any([(P, "dear", K), (P, "cheap", K)], 10_000, strategy="order")
    assert lease.model_id == "cheap"
    lease.release()
    with pytest.raises(q.QuotaExceeded) as exc:
        engine.lease_any([(P, "dear", K)], 10_000)
    assert exc.value.reason == "cost/day"


def test_a_second_engine_counts_the_first_one_s_spend_and_reservations(
    store: str, clock: q.ManualClock, engine: q.QuotaEngine
) -> None:
    engine.set_model_prices(P, M, DEAR)
    engine.set_model_limits(P, M, limits=[q.Limit("cost", 5_000, "day")])
    engine.lease(P, M, K, 0).success()  # 2,000 µ$ recorded
    held = engine.lease(P, M, K, 0)  # 2,000 µ$ in flight
    with q.QuotaEngine(store, clock=clock, env={}) as other:
        assert other.usage(P, M, K)["cost/day"]["used"] == 2_000
        with pytest.raises(q.QuotaExceeded):
            other.lease(P, M, K, 0)
        held.release()
        other.lease(P, M, K, 0).release()


def test_racing_threads_never_spend_past_a_cost_limit(engine: q.QuotaEngine) -> None:
    engine.set_model_prices(P, M, DEAR)
    # Each lease reserves 2,000 + 3 x 100 = 2,300 µ$ and records what it reserved.
    engine.set_model_limits(P, M, limits=[q.Limit("cost", 100_000, "day")])
    admitted: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(20):
            try:
                with engine.lease(P, M, K, 100):
                    pass
            except q.QuotaExceeded:
                continue
            with lock:
                admitted.append(1)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 100_000 // 2_300
    assert engine.usage(P, M, K)["cost/day"]["used"] == len(admitted) * 2_300 <= 100_000


def test_a_platform_credit_costs_each_model_at_its_own_prices(engine: q.QuotaEngine) -> None:
    # SPEC 23.3: a monthly credit over every model of a platform, each at its own prices.
    engine.set_model_prices(P, "dear", DEAR)
    engine.set_model_prices(P, "cheap", MINI)
    engine.set_platform_limits(P, [q.Limit("cost", 10_000, "month")])
    assert engine.platform_limits(P) == [q.Limit("cost", 10_000, "month")]
    engine.lease(P, "dear", K, 0).success(input_tokens=1_000)  # 2,000 + 3,000 µ$
    engine.lease(P, "cheap", K, 0).success(input_tokens=10_000)  # 1,500 µ$
    assert engine.usage(P, "cheap", K)["platform:cost/month"]["used"] == 6_500
    # The dear model's next lease reserves 2,000 + 3,000 µ$ for 1,000 tokens: over.
    with pytest.raises(q.QuotaExceeded) as exc:
        engine.lease(P, "dear", K, 1_000)
    assert exc.value.reason == "platform:cost/month"
    # The cheap model's reserves 150 µ$: it passes.
    engine.lease(P, "cheap", K, 1_000).release()


COST_RACE = """
import random, sys, threading
import quotaengine as q
store, now, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
e = q.QuotaEngine(store, clock=q.ManualClock(now), env={})
e.model_prices("openai", "gpt-4o")
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"
lock = threading.Lock()
spent = []
errors = []
def worker(i):
    rng = random.Random(seed * 100 + i)
    try:
        while True:
            n = rng.randint(100, 2_000)  # 10 µ$ a token: $0.001 to $0.02
            try:
                lease = e.lease("openai", "gpt-4o", 1, n)
            except q.QuotaExceeded as exc:
                if exc.reason != "cost/day":
                    errors.append(exc.reason)
                # Done once no call could fit even with nothing in flight.
                if 1_000_000 - e.usage("openai", "gpt-4o", 1)["cost/day"]["used"] < 20_000:
                    return
                continue
            lease.success(input_tokens=n)
            with lock:
                spent.append(n * 10)
    except BaseException as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(sum(spent), "errors", len(errors), *errors, flush=True)
e.close()
"""


def test_four_processes_never_spend_past_a_dollar_budget(store: str, clock: q.ManualClock) -> None:
    # Issue 34's race: 4 processes x 8 threads spend from $1.00 a day with random
    # $0.001-0.02 reservations, each reporting its estimate; the admitted total is never
    # over the budget, and ends within one call's cost ($0.02) of it.
    budget = 1_000_000
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        e.set_model_prices("openai", "gpt-4o", q.Prices(10, 10))
        e.set_model_limits("openai", "gpt-4o", limits=[q.Limit.dollars(1, "day")])
    total = 0
    for out in race(COST_RACE, [[store, str(clock.now_ms()), str(seed)] for seed in range(4)]):
        assert out[1:3] == ["errors", "0"], out
        total += int(out[0])
    assert budget - 20_000 < total <= budget
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        assert e.usage("openai", "gpt-4o", 1)["cost/day"]["used"] == total
