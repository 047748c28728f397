"""Defects found in acceptance (issue 35, item 7), each a test that failed before its fix:
a clock jump across most of int64 panicked every write, a reserve fraction too large for
a float was an OverflowError, and a filter by key left out the model-wide bench blocking
that key."""

from __future__ import annotations

import pytest
import quotaengine as q

P, M = "openrouter", "google/gemini-2.0-flash-exp:free"
UPSTREAM_503 = "Model is temporarily overloaded upstream, please retry"


def test_a_clock_jump_across_int64_writes_without_a_panic(store: str) -> None:
    clock = q.ManualClock(-(2**62))
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        e.record_request(P, M, 1)  # a sweep at a negative time
        clock.set(2**63 - 10_000)
        e.record_request(P, M, 1)  # the next sweep: now - last sweep is beyond int64
        e.lease(P, M, 1).success()
        assert e.usage(P, M, 1)["rpm"]["used"] == 2


def test_a_reserve_too_large_for_a_float_is_a_value_error(engine: q.QuotaEngine) -> None:
    for bad in (10**400, -(10**400)):
        with pytest.raises(ValueError, match=r"\[0, 1\)"):
            engine.set_priority_reserve(1, bad)
    assert engine.priority_reserve(1) == 0.0  # nothing written


def test_a_filter_by_key_keeps_the_model_wide_bench_that_blocks_it(engine: q.QuotaEngine) -> None:
    engine.register_key(2, P)
    engine.register_key(9, "other")
    engine.record_request(P, "another-model", 1)  # key 1 is seen on the platform, not registered
    out = engine.record_failure(P, M, 1, status=503, message=UPSTREAM_503)
    assert out.kind == "upstream"
    wide = [c for c in engine.active_cooldowns() if c.key_id is None]
    assert len(wide) == 1
    # key 2 is registered on the platform: the model's bench blocks it too
    assert not engine.check(P, M, 2).allowed
    assert [c.key_id for c in engine.active_cooldowns(key_ids=[2])] == [None]
    # key 1 was seen on the platform
    assert None in [c.key_id for c in engine.active_cooldowns(key_ids=[1])]
    # a key of another platform is not blocked by it
    assert engine.active_cooldowns(key_ids=[9]) == []
