"""SPEC §11: the background probe that recovers heuristic cooldowns early.

Every engine runs on a real SQLite file under tmp_path with a ManualClock (the probe thread reads
it too) and env={} unless a test says otherwise. Nothing about the thread is mocked.

Scenarios where the main thread calls into the engine while the probe thread may sit in a
validator (stop, close, concurrent passes, interpreter exit) run in a fresh interpreter with a
timeout: a deadlock that holds the GIL would otherwise hang the whole test session instead of
failing one test.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import quotaengine as q
from moments import DAY, HOUR, MINUTE, NOON, SECOND

MIDNIGHT = 1_767_225_600_000  # 2026-01-01 00:00:00.000 UTC

P, M = "groq", "llama-3.1-8b-instant"
JITTER_SPAN_MS = 45_000
BACKOFF_MIN = [2, 4, 8, 15, 15]


def zero() -> float:
    return 0.0


# --------------------------------------------------------------------------- fixtures and helpers


@pytest.fixture
def qengine_with_env(store: str, qclock: q.ManualClock) -> Iterator[Callable[[dict[str, str]], q.QuotaEngine]]:
    made: list[q.QuotaEngine] = []

    def make(env: dict[str, str]) -> q.QuotaEngine:
        e = q.QuotaEngine(store, clock=qclock, env=env)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


@pytest.fixture
def probe_loop() -> Iterator[tuple[asyncio.AbstractEventLoop, int]]:
    """A real asyncio loop running forever in a daemon thread; yields (loop, that thread's ident)."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    ident: list[int] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        ident.append(threading.get_ident())
        started.set()
        loop.run_forever()

    t = threading.Thread(target=run, name="probe-test-loop", daemon=True)
    t.start()
    assert started.wait(5)
    yield loop, ident[0]
    loop.call_soon_threadsafe(loop.stop)
    t.join(5)
    assert not t.is_alive()
    loop.close()


class Recorder:
    """A validator that records every call (key, thread) and answers with `answer(key)`."""

    def __init__(self, answer: Any = False) -> None:
        self._answer = answer
        self._lock = threading.Lock()
        self.keys: list[int] = []
        self.threads: list[int] = []
        self.types: list[type] = []

    def __call__(self, key_id: int) -> Any:
        with self._lock:
            self.keys.append(key_id)
            self.threads.append(threading.get_ident())
            self.types.append(type(key_id))
        if callable(self._answer):
            return self._answer(key_id)
        return self._answer

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.keys)


def cd_state(e: q.QuotaEngine, platform: str, model: str, key: int) -> tuple[int, str, int] | None:
    cd = e.cooldown(platform, model, key)
    return None if cd is None else (cd.expires_at_ms, cd.source, cd.set_at_ms)


def bench_ripe(e: q.QuotaEngine, clock: q.ManualClock, keys: list[int], ms: int = DAY) -> None:
    """Heuristic cooldowns of `ms` on every key, then half of them served: ripe for ms/2 - 60 s."""
    for k in keys:
        e.set_cooldown(P, M, k, ms, "heuristic")
    clock.advance(ms // 2)


def recovered_rows(e: q.QuotaEngine) -> list[dict[str, Any]]:
    return [r for r in e.server_logs(1000) if r["event"] == "cooldown_recovered"]


def tick_until(
    pred: Callable[[], bool], clock: q.ManualClock, *, timeout: float = 10.0, step_ms: int = 46_000, sleep: float = 0.02
) -> bool:
    """Advance the clock by step_ms (past any first-sighting jitter) every `sleep` s until pred()."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        clock.advance(step_ms)
        time.sleep(sleep)
    return True


def wait_until(pred: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


# A fresh interpreter per scenario; the script prints "RESULT {json}" when it reaches the end.
PRELUDE = textwrap.dedent(
    """
    import asyncio, json, sys, threading, time
    import quotaengine as q
    NOON = %d
    MINUTE = 60_000
    HOUR = 3_600_000
    P, M = "groq", "llama-3.1-8b-instant"
    clock = q.ManualClock(NOON)
    e = q.QuotaEngine(sys.argv[1], clock=clock, env={})
    out = {}

    def bench(*keys, ms=24 * HOUR):
        for k in keys:
            e.set_cooldown(P, M, k, ms, "heuristic")
        clock.advance(ms // 2)

    def wait_while_ticking(event, timeout=10.0):
        # advance the clock 46 s every 20 ms (past any first-sighting jitter) until event is set
        deadline = time.monotonic() + timeout
        while not event.wait(0.02):
            if time.monotonic() > deadline:
                return False
            clock.advance(46_000)
        return True

    def done():
        print("RESULT " + json.dumps(out), flush=True)
    """
    % NOON
)


def run_script(tmp_path: Path, body: str, *, timeout: float = 30.0) -> tuple[dict[str, Any], float]:
    script = tmp_path / "probe_scenario.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, str(script), str(tmp_path / "scenario.db")],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=tmp_path,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"scenario did not finish within {timeout} s (deadlock?); stdout={exc.stdout!r} stderr={exc.stderr!r}"
        )
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, f"exit code {proc.returncode}; stderr:\n{proc.stderr}"
    assert "panicked" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"no result; stdout={proc.stdout!r} stderr={proc.stderr!r}"
    return json.loads(lines[-1][len("RESULT ") :]), elapsed


# --------------------------------------------------------------------------- ripeness


@pytest.mark.parametrize(
    ("bench_ms", "served_ms", "ripe"),
    [
        pytest.param(10 * MINUTE, 5 * MINUTE - 1, False, id="half-not-yet-served"),
        pytest.param(10 * MINUTE, 5 * MINUTE, True, id="exactly-half-served"),
        pytest.param(10 * MINUTE, 9 * MINUTE, True, id="exactly-60s-left"),
        pytest.param(10 * MINUTE, 9 * MINUTE + 1, False, id="under-60s-left"),
        pytest.param(2 * MINUTE, MINUTE, True, id="2min-both-edges-at-once"),
        pytest.param(2 * MINUTE - 2, MINUTE - 1, False, id="just-under-2min-never-ripe"),
        pytest.param(90 * SECOND, 45 * SECOND, False, id="transient-90s-never-ripe"),
        pytest.param(DAY, 12 * HOUR, True, id="24h-half-served"),
        pytest.param(DAY, 0, False, id="24h-just-set"),
    ],
)
def test_ripeness_boundaries(
    qengine: q.QuotaEngine, qclock: q.ManualClock, bench_ms: int, served_ms: int, ripe: bool
) -> None:
    qengine.set_cooldown(P, M, 1, bench_ms, "heuristic")
    before = cd_state(qengine, P, M, 1)
    qclock.advance(served_ms)
    v = Recorder(False)
    first = qengine.run_probe_pass(v, jitter=zero)
    second = qengine.run_probe_pass(v, jitter=zero)
    # A ripe key is first sighted (never probed in that pass), then probed once its time (now) came.
    assert first.probed_key_ids == []
    assert second.probed_key_ids == ([1] if ripe else [])
    assert v.keys == ([1] if ripe else [])
    assert cd_state(qengine, P, M, 1) == before


def test_ripeness_of_several_keys_at_one_instant(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    qengine.set_cooldown(P, M, 1, 2 * MINUTE)  # at +60 s: 60 s left, half served -> ripe
    qengine.set_cooldown(P, M, 2, 2 * MINUTE + 1)  # 60.001 s left, but 1 ms short of half
    qengine.set_cooldown(P, M, 3, 2 * MINUTE - 1)  # more than half served, 59.999 s left
    qengine.set_cooldown(P, M, 4, 10 * MINUTE)  # 1 of 10 min served
    qclock.advance(MINUTE)
    v = Recorder(False)
    assert qengine.run_probe_pass(v, jitter=zero).probed_key_ids == []
    assert qengine.run_probe_pass(v, jitter=zero).probed_key_ids == [1]
    assert v.keys == [1]


def test_key_is_first_sighted_only_once_ripe(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    qengine.set_cooldown(P, M, 1, 10 * MINUTE)
    v = Recorder(False)
    qclock.advance(5 * MINUTE - 1)
    for _ in range(3):
        assert qengine.run_probe_pass(v, jitter=zero).probed_key_ids == []
    qclock.advance(1)
    # Ripe now: this pass is its first sighting, so still no probe ...
    assert qengine.run_probe_pass(v, jitter=zero).probed_key_ids == []
    # ... and the next one probes it.
    assert qengine.run_probe_pass(v, jitter=zero).probed_key_ids == [1]


@pytest.mark.parametrize("source", ["authoritative", "credit", "tier"])
def test_non_heuristic_cooldowns_are_never_probed(qengine: q.QuotaEngine, qclock: q.ManualClock, source: str) -> None:
    qengine.set_cooldown(P, M, 1, DAY, "heuristic")
    qengine.set_cooldown(P, M, 2, DAY, source)
    qengine.set_cooldown(P, "other-model", 3, DAY, source)
    before = {k: cd_state(qengine, P, m, k) for k, m in [(2, M), (3, "other-model")]}
    qclock.advance(12 * HOUR)
    assert [(c.key_id, c.source) for c in qengine.probeable_cooldowns()] == [(1, "heuristic")]
    v = Recorder(True)
    for _ in range(6):
        qengine.run_probe_pass(v, jitter=zero, max_probes=10)
        qclock.advance(16 * MINUTE)
    assert v.keys == [1]
    assert {k: cd_state(qengine, P, m, k) for k, m in [(2, M), (3, "other-model")]} == before


# --------------------------------------------------------------------------- first sighting


@pytest.mark.parametrize(
    ("jitter_value", "delay_ms"),
    [(0.5, 22_500), (0.25, 11_250), (0.99999, 44_999), (0.1, 4_500)],
)
def test_first_probe_scheduled_at_now_plus_floor_jitter_times_45s(
    qengine: q.QuotaEngine, qclock: q.ManualClock, jitter_value: float, delay_ms: int
) -> None:
    bench_ripe(qengine, qclock, [1], ms=HOUR)
    calls: list[None] = []

    def jitter() -> float:
        calls.append(None)
        return jitter_value

    v = Recorder(False)
    assert qengine.run_probe_pass(v, jitter=jitter).probed_key_ids == []
    assert calls, "jitter() was not consulted for a first sighting"
    qclock.advance(delay_ms - 1)
    assert qengine.run_probe_pass(v, jitter=jitter).probed_key_ids == []
    qclock.advance(1)
    assert qengine.run_probe_pass(v, jitter=jitter).probed_key_ids == [1]
    assert v.keys == [1]


def test_each_first_sighted_key_draws_its_own_jitter(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    bench_ripe(qengine, qclock, [1, 2, 3], ms=HOUR)
    values = iter([0.1, 0.5, 0.9])

    def jitter() -> float:
        return next(values, 0.999)

    v = Recorder(False)
    assert qengine.run_probe_pass(v, jitter=jitter, max_probes=10).probed_key_ids == []
    probed: list[list[int]] = []
    now = qclock.now_ms()
    for at in [4_499, 4_500, 22_499, 22_500, 40_499, 40_500]:
        qclock.set(now + at)
        probed.append(qengine.run_probe_pass(v, jitter=jitter, max_probes=10).probed_key_ids)
    assert [len(p) for p in probed] == [0, 1, 0, 1, 0, 1]
    assert sorted(k for p in probed for k in p) == [1, 2, 3]


def test_first_sightings_use_no_budget(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    bench_ripe(qengine, qclock, [1, 2, 3, 4, 5], ms=HOUR)
    v = Recorder(False)
    # All five are first sighted in one pass even though the budget is one probe.
    assert qengine.run_probe_pass(v, jitter=zero, max_probes=1).probed_key_ids == []
    assert sorted(qengine.run_probe_pass(v, jitter=zero, max_probes=5).probed_key_ids) == [1, 2, 3, 4, 5]


def test_first_sightings_do_not_eat_the_budget_of_due_keys(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    qengine.set_cooldown(P, M, 1, HOUR)
    qclock.advance(10 * MINUTE)
    for k in (2, 3, 4):
        qengine.set_cooldown(P, M, k, HOUR)
    qclock.advance(20 * MINUTE)  # key 1: 30 of 60 min served (ripe); keys 2-4: 20 of 60 (not ripe)
    v = Recorder(False)
    assert qengine.run_probe_pass(v, jitter=zero).probed_key_ids == []  # sights key 1
    qclock.advance(10 * MINUTE)  # key 1 due; keys 2-4 ripe for the first time
    assert qengine.run_probe_pass(v, jitter=zero, max_probes=1).probed_key_ids == [1]
    assert sorted(qengine.run_probe_pass(v, jitter=zero, max_probes=3).probed_key_ids) == [2, 3, 4]


# --------------------------------------------------------------------------- budget


@pytest.mark.parametrize(
    ("env", "max_probes", "expected"),
    [
        pytest.param({}, None, [3, 2], id="default-3"),
        pytest.param({"COOLDOWN_PROBE_MAX_PER_PASS": "2"}, None, [2, 2, 1], id="env-2"),
        pytest.param({"COOLDOWN_PROBE_MAX_PER_PASS": "2"}, 4, [4, 1], id="argument-beats-env"),
        pytest.param({}, 1, [1, 1, 1, 1, 1], id="argument-1"),
    ],
)
def test_per_pass_budget(
    qengine_with_env: Callable[[dict[str, str]], q.QuotaEngine],
    qclock: q.ManualClock,
    env: dict[str, str],
    max_probes: int | None,
    expected: list[int],
) -> None:
    e = qengine_with_env(env)
    bench_ripe(e, qclock, [1, 2, 3, 4, 5])
    v = Recorder(False)
    assert e.run_probe_pass(v, jitter=zero, max_probes=max_probes).probed_key_ids == []
    sizes = []
    seen: list[int] = []
    for _ in range(len(expected) + 1):
        probed = e.run_probe_pass(v, jitter=zero, max_probes=max_probes).probed_key_ids
        sizes.append(len(probed))
        seen += probed
    # Failed keys wait 2 min, so later passes at the same instant take the rest, then nothing.
    assert sizes == expected + [0]
    assert sorted(seen) == [1, 2, 3, 4, 5]
    assert len(e.probeable_cooldowns()) == 5


@pytest.mark.parametrize(
    ("env", "max_per_pass", "batches"),
    [
        pytest.param({}, None, [3, 2], id="default-3"),
        pytest.param({}, 2, [2, 2, 1], id="max_per_pass-2"),
        pytest.param({"COOLDOWN_PROBE_MAX_PER_PASS": "4"}, None, [4, 1], id="env-4"),
        pytest.param({"COOLDOWN_PROBE_MAX_PER_PASS": "4"}, 1, [1, 1, 1, 1, 1], id="argument-beats-env"),
    ],
)
def test_background_thread_respects_max_per_pass(
    qengine_with_env: Callable[[dict[str, str]], q.QuotaEngine],
    qclock: q.ManualClock,
    env: dict[str, str],
    max_per_pass: int | None,
    batches: list[int],
) -> None:
    e = qengine_with_env(env)
    bench_ripe(e, qclock, [1, 2, 3, 4, 5])
    ripe_at = qclock.now_ms()
    unripe = ripe_at - 1  # 1 ms short of half served: nothing is ripe

    # Each probe moves the clock back to a time where nothing is ripe, so exactly one pass
    # (the one planned at the instant the test set) probes per batch. Whether a failed key's
    # 2 min backoff counts from before or after its probe, it is not due again within the batches.
    def answer(_key: int) -> bool:
        qclock.set(unripe)
        return False

    v = Recorder(answer)
    assert e.start_probe(v, interval_s=0.02, max_per_pass=max_per_pass) is True
    time.sleep(0.4)  # ~20 passes: every key first sighted (scheduled within 45 s)
    assert v.count == 0
    sizes = []
    for i, _ in enumerate(batches):
        before = v.count
        qclock.set(ripe_at + JITTER_SPAN_MS + (i + 1) * SECOND)  # all sighted keys due, none failed yet due
        wait_until(lambda before=before: v.count > before, timeout=5)
        time.sleep(0.25)  # more passes, all at the unripe time
        sizes.append(v.count - before)
    e.stop_probe()
    assert sizes == batches
    assert sorted(v.keys) == [1, 2, 3, 4, 5]


# --------------------------------------------------------------------------- a passing key


@pytest.mark.parametrize("verdict", [True, "valid"])
def test_pass_clears_every_heuristic_cooldown_of_the_key(
    qengine: q.QuotaEngine, qclock: q.ManualClock, caplog: pytest.LogCaptureFixture, verdict: object
) -> None:
    caplog.set_level(logging.INFO, logger="quotaengine")
    e = qengine
    e.set_cooldown(P, "m1", 1, HOUR, "heuristic")
    e.set_cooldown(P, "m3", 1, HOUR, "authoritative")
    e.set_cooldown(P, "m4", 1, HOUR, "credit")
    e.set_cooldown(P, "m5", 1, HOUR, "tier")
    e.set_cooldown(P, "m1", 2, HOUR, "heuristic")
    qclock.advance(29 * MINUTE)
    e.set_cooldown(P, "m2", 1, 10 * MINUTE, "heuristic")  # far from ripe when key 1 passes
    qclock.advance(MINUTE)
    kept = {m: cd_state(e, P, m, 1) for m in ("m3", "m4", "m5")}
    kept_2 = cd_state(e, P, "m1", 2)

    v = Recorder(lambda k: verdict if k == 1 else False)
    assert e.run_probe_pass(v, jitter=zero).probed_key_ids == []
    caplog.clear()
    result = e.run_probe_pass(v, jitter=zero)

    assert isinstance(result, q.ProbePassResult)
    assert sorted(result.probed_key_ids) == [1, 2]
    assert sorted(v.keys) == [1, 2]  # one probe per key, not per cooldown
    assert all(t is int for t in v.types)
    assert result.cleared_cooldowns == 2
    assert e.cooldown(P, "m1", 1) is None
    assert e.cooldown(P, "m2", 1) is None  # not ripe, cleared anyway
    assert {m: cd_state(e, P, m, 1) for m in ("m3", "m4", "m5")} == kept
    assert cd_state(e, P, "m1", 2) == kept_2  # a failing key is untouched
    assert [(c.key_id, c.model_id) for c in e.probeable_cooldowns()] == [(2, "m1")]

    rows = recovered_rows(e)
    assert len(rows) == 1
    assert rows[0]["level"] == "info"
    assert rows[0]["created_at_ms"] == qclock.now_ms()
    records = [
        r
        for r in caplog.records
        if r.name.startswith("quotaengine") and r.levelno == logging.INFO and "recover" in r.getMessage().lower()
    ]
    assert records, [(r.name, r.levelname, r.getMessage()) for r in caplog.records]


def test_pass_keeps_the_ladder_history(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    e = qengine
    e.set_model_limits(P, M, rpd=1)
    e.record_request(P, M, 1)  # daily exhausted: a 429 takes a ladder step
    first = e.record_failure(P, M, 1, status=429)
    assert first.cooldown is not None
    assert (first.cooldown.duration_ms, first.cooldown.source) == (2 * MINUTE, "heuristic")
    qclock.advance(MINUTE)  # 60 s left, half served: ripe
    v = Recorder(True)
    assert e.run_probe_pass(v, jitter=zero).probed_key_ids == []
    result = e.run_probe_pass(v, jitter=zero)
    assert result.probed_key_ids == [1]
    assert result.cleared_cooldowns == 1
    assert e.cooldown(P, M, 1) is None
    # clear_cooldown_early keeps the ladder: the next step is the 2nd (10 min), not the 1st again.
    second = e.record_failure(P, M, 1, status=429)
    assert second.cooldown is not None
    assert second.cooldown.duration_ms == 10 * MINUTE


def test_cleared_cooldowns_survive_a_reopen(store: str, qclock: q.ManualClock) -> None:
    with q.QuotaEngine(store, clock=qclock, env={}) as e:
        bench_ripe(e, qclock, [1, 2])
        e.run_probe_pass(Recorder(True), jitter=zero)
        assert e.run_probe_pass(Recorder(True), jitter=zero).cleared_cooldowns == 2
    with q.QuotaEngine(store, clock=qclock, env={}) as e:
        assert e.active_cooldowns() == []
        assert len(recovered_rows(e)) == 2


# --------------------------------------------------------------------------- a failing key


class Evil:
    """A validator answer that raises from every dunder the engine might use on it."""

    def __bool__(self) -> bool:
        raise RuntimeError("__bool__")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("__eq__")

    def __ne__(self, other: object) -> bool:
        raise RuntimeError("__ne__")

    __hash__ = None  # type: ignore[assignment]

    def __str__(self) -> str:
        raise RuntimeError("__str__")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__")


def _raise(_key: int) -> Any:
    raise RuntimeError("validator exploded")


FAILURES = [
    pytest.param(lambda k: False, id="False"),
    pytest.param(lambda k: None, id="None"),
    pytest.param(lambda k: "invalid", id="invalid"),
    pytest.param(lambda k: 0, id="zero"),
    pytest.param(lambda k: object(), id="object"),
    pytest.param(lambda k: "", id="empty-str"),
    pytest.param(lambda k: {"valid": True}, id="dict"),
    pytest.param(lambda k: [True], id="list"),
    pytest.param(lambda k: Evil(), id="evil-object"),
    pytest.param(_raise, id="raises"),
]


@pytest.mark.parametrize("answer", FAILURES)
def test_failure_never_touches_a_cooldown(
    qengine: q.QuotaEngine, qclock: q.ManualClock, answer: Callable[[int], Any]
) -> None:
    e = qengine
    e.set_cooldown(P, M, 1, DAY, "heuristic")
    e.set_cooldown(P, "other", 1, DAY, "heuristic")
    qclock.advance(12 * HOUR)
    before = [cd_state(e, P, m, 1) for m in (M, "other")]
    v = Recorder(answer)
    assert e.run_probe_pass(v, jitter=zero).probed_key_ids == []
    result = e.run_probe_pass(v, jitter=zero)  # must not raise, whatever the validator did
    assert result.probed_key_ids == [1]
    assert result.cleared_cooldowns == 0
    assert v.keys == [1]
    assert [cd_state(e, P, m, 1) for m in (M, "other")] == before
    assert len(e.probeable_cooldowns()) == 2
    assert recovered_rows(e) == []
    # The engine keeps working afterwards.
    e.record_request(P, M, 7)
    assert e.usage(P, M, 7)["rpm"]["used"] == 1


def test_failure_backoff_2_4_8_15_15_minutes(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    bench_ripe(qengine, qclock, [1])
    v = Recorder(False)
    assert qengine.run_probe_pass(v, jitter=zero).probed_key_ids == []
    assert qengine.run_probe_pass(v, jitter=zero).probed_key_ids == [1]
    for minutes in BACKOFF_MIN:
        qclock.advance(minutes * MINUTE - 1)
        assert qengine.run_probe_pass(v, jitter=zero).probed_key_ids == [], f"probed before {minutes} min"
        qclock.advance(1)
        assert qengine.run_probe_pass(v, jitter=zero).probed_key_ids == [1], f"not probed after {minutes} min"
    assert v.keys == [1] * (len(BACKOFF_MIN) + 1)
    assert len(qengine.probeable_cooldowns()) == 1


def test_backoff_is_per_key(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    bench_ripe(qengine, qclock, [1, 2])
    v = Recorder(False)
    assert qengine.run_probe_pass(v, jitter=zero).probed_key_ids == []
    first = qengine.run_probe_pass(v, jitter=zero, max_probes=1).probed_key_ids
    assert len(first) == 1
    qclock.advance(MINUTE)
    second = qengine.run_probe_pass(v, jitter=zero, max_probes=1).probed_key_ids
    assert len(second) == 1
    assert sorted(first + second) == [1, 2]
    # Each key waits 2 min from its own failure.
    qclock.advance(MINUTE)
    assert qengine.run_probe_pass(v, jitter=zero).probed_key_ids == first
    qclock.advance(MINUTE)
    assert qengine.run_probe_pass(v, jitter=zero).probed_key_ids == second


def _fail_once(e: q.QuotaEngine) -> None:
    v = Recorder(False)
    assert e.run_probe_pass(v, jitter=zero).probed_key_ids == []
    assert e.run_probe_pass(v, jitter=zero).probed_key_ids == [1]  # 1st failure: next probe in 2 min


def test_pacing_kept_when_benched_again_at_once(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    e = qengine
    bench_ripe(e, qclock, [1])
    _fail_once(e)
    e.clear_cooldown_early(P, M, 1)
    assert e.run_probe_pass(Recorder(False), jitter=zero).probed_key_ids == []  # sees the key go
    e.set_cooldown(P, M, 1, 2 * MINUTE, "heuristic")  # benched again at once
    qclock.advance(MINUTE)  # ripe (exactly), but the 2 min backoff has not run out
    v = Recorder(False)
    assert e.run_probe_pass(v, jitter=zero).probed_key_ids == []
    assert e.run_probe_pass(v, jitter=zero).probed_key_ids == []  # a first sighting would be probed here
    assert v.keys == []


def test_pacing_kept_continues_the_backoff(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    e = qengine
    bench_ripe(e, qclock, [1])
    _fail_once(e)
    e.clear_cooldown_early(P, M, 1)
    e.run_probe_pass(Recorder(False), jitter=zero)
    e.set_cooldown(P, M, 1, 12 * MINUTE, "heuristic")
    qclock.advance(6 * MINUTE)  # ripe; the 2 min backoff ran out: probed at once, not sighted
    v = Recorder(False)
    assert e.run_probe_pass(v, jitter=zero).probed_key_ids == [1]  # 2nd failure: 4 min
    qclock.advance(4 * MINUTE - 1)
    assert e.run_probe_pass(v, jitter=zero).probed_key_ids == []
    qclock.advance(1)
    assert e.run_probe_pass(v, jitter=zero).probed_key_ids == [1]


@pytest.mark.parametrize("how", ["cleared", "expired"])
def test_pacing_dropped_15_min_after_the_last_cooldown_went(
    qengine: q.QuotaEngine, qclock: q.ManualClock, how: str
) -> None:
    e = qengine
    bench_ripe(e, qclock, [1], ms=4 * HOUR)
    _fail_once(e)
    if how == "cleared":
        e.clear_cooldown_early(P, M, 1)
    else:
        qclock.advance(2 * HOUR)  # the 4 h bench runs out
    assert e.active_cooldowns() == []
    assert e.run_probe_pass(Recorder(False), jitter=zero).probed_key_ids == []
    qclock.advance(15 * MINUTE + SECOND)
    assert e.run_probe_pass(Recorder(False), jitter=zero).probed_key_ids == []
    e.set_cooldown(P, M, 1, 2 * MINUTE, "heuristic")
    qclock.advance(MINUTE)
    v = Recorder(False)
    # A first sighting again: not probed in this pass (with kept pacing it would be: its time has come).
    assert e.run_probe_pass(v, jitter=zero).probed_key_ids == []
    assert e.run_probe_pass(v, jitter=zero).probed_key_ids == [1]


def test_pacing_kept_within_15_min_after_expiry(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    # As with the background thread: passes keep running while the key sits out its bench.
    e = qengine
    bench_ripe(e, qclock, [1], ms=4 * HOUR)
    _fail_once(e)
    for _ in range(24):  # 24 x 5 min: the 4 h bench runs out
        qclock.advance(5 * MINUTE)
        e.run_probe_pass(Recorder(False), jitter=zero, max_probes=0)
    assert e.active_cooldowns() == []
    qclock.advance(10 * MINUTE)
    e.set_cooldown(P, M, 1, 2 * MINUTE, "heuristic")
    qclock.advance(MINUTE)
    # Not a first sighting: its (long passed) scheduled time has come, so this very pass probes it.
    assert e.run_probe_pass(Recorder(False), jitter=zero).probed_key_ids == [1]


def test_pacing_kept_within_15_min_after_expiry_without_passes_in_between(
    qengine: q.QuotaEngine, qclock: q.ManualClock
) -> None:
    # "Dropped 15 min after its last one went": the cooldown went when it expired, not when a pass
    # last looked at it (with interval_s of 30 min or manual passes, the two are far apart).
    e = qengine
    bench_ripe(e, qclock, [1], ms=4 * HOUR)
    _fail_once(e)
    qclock.advance(2 * HOUR)  # the bench runs out right now
    assert e.active_cooldowns() == []
    assert e.run_probe_pass(Recorder(False), jitter=zero).probed_key_ids == []
    qclock.advance(10 * MINUTE)
    e.set_cooldown(P, M, 1, 2 * MINUTE, "heuristic")
    qclock.advance(MINUTE)
    assert e.run_probe_pass(Recorder(False), jitter=zero).probed_key_ids == [1]


# --------------------------------------------------------------------------- run_probe_pass / start_probe


def test_run_probe_pass_without_validator_is_value_error(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    bench_ripe(qengine, qclock, [1])
    with pytest.raises(ValueError):
        qengine.run_probe_pass()
    with pytest.raises(ValueError):
        qengine.run_probe_pass(None, jitter=zero)
    assert len(qengine.probeable_cooldowns()) == 1


def test_run_probe_pass_uses_the_start_probe_validator(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    bench_ripe(qengine, qclock, [1])
    v = Recorder(False)
    assert qengine.start_probe(v, interval_s=30.0) is True
    main = threading.get_ident()
    probed: list[int] = []
    for _ in range(10):  # the thread's own first pass may have sighted the key with its random jitter
        probed = qengine.run_probe_pass(jitter=zero).probed_key_ids
        if probed:
            break
        qclock.advance(46_000)
    qengine.stop_probe()
    assert probed == [1]
    assert main in v.threads
    assert len(qengine.probeable_cooldowns()) == 1


def test_start_probe_twice_starts_one_thread(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    bench_ripe(qengine, qclock, [1])
    first, second = Recorder(False), Recorder(False)
    before = os_threads()
    assert qengine.start_probe(first, interval_s=0.02) is True
    after_first = os_threads()
    assert qengine.start_probe(second, interval_s=0.02) is True
    assert os_threads() == after_first
    assert after_first == before + 1
    assert tick_until(lambda: first.count >= 2, qclock)
    assert second.keys == []
    qengine.stop_probe()
    assert wait_until(lambda: os_threads() == before, timeout=5)


@pytest.mark.parametrize(("value", "runs"), [("1", False), ("0", True)])
def test_cooldown_probe_disabled_kill_switch(
    qengine_with_env: Callable[[dict[str, str]], q.QuotaEngine], qclock: q.ManualClock, value: str, runs: bool
) -> None:
    e = qengine_with_env({"COOLDOWN_PROBE_DISABLED": value})
    bench_ripe(e, qclock, [1])
    before_cd = cd_state(e, P, M, 1)
    v = Recorder(True)
    before = os_threads()
    assert e.start_probe(v, interval_s=0.02) is runs
    if runs:
        assert tick_until(lambda: e.cooldown(P, M, 1) is None, qclock)
    else:
        assert os_threads() == before
        for _ in range(15):
            qclock.advance(46_000)
            time.sleep(0.02)
        assert v.keys == []
        assert cd_state(e, P, M, 1) == before_cd
    e.stop_probe()


def test_coroutine_validator_without_loop_is_value_error(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    async def v(key: int) -> bool:
        return True

    bench_ripe(qengine, qclock, [1])
    before = os_threads()
    with pytest.raises(ValueError):
        qengine.start_probe(v, interval_s=0.02)
    assert os_threads() == before
    for _ in range(5):
        qclock.advance(46_000)
        time.sleep(0.02)
    assert len(qengine.probeable_cooldowns()) == 1
    # Nothing was started by the failed call: a later start does start.
    sync = Recorder(True)
    assert qengine.start_probe(sync, interval_s=0.02) is True
    assert tick_until(lambda: qengine.cooldown(P, M, 1) is None, qclock)
    qengine.stop_probe()


# --------------------------------------------------------------------------- the background thread


def test_background_thread_probes_from_another_thread_and_clears(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    bench_ripe(qengine, qclock, [1, 2, 3])
    v = Recorder(True)
    assert qengine.start_probe(v, interval_s=0.02) is True
    assert tick_until(lambda: qengine.probeable_cooldowns() == [], qclock), v.keys
    qengine.stop_probe()
    assert sorted(v.keys) == [1, 2, 3]
    assert threading.get_ident() not in v.threads
    assert qengine.active_cooldowns() == []
    assert len(recovered_rows(qengine)) == 3


def test_background_thread_reads_the_manual_clock(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    qengine.set_cooldown(P, M, 1, DAY, "heuristic")  # set just now: not ripe by the manual clock
    v = Recorder(True)
    assert qengine.start_probe(v, interval_s=0.02) is True
    time.sleep(0.3)
    assert v.keys == []
    qclock.advance(12 * HOUR)
    assert tick_until(lambda: qengine.cooldown(P, M, 1) is None, qclock)
    qengine.stop_probe()
    assert v.keys == [1]


def test_background_thread_survives_a_raising_validator(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    bench_ripe(qengine, qclock, [1])
    before = cd_state(qengine, P, M, 1)
    v = Recorder(_raise)
    assert qengine.start_probe(v, interval_s=0.02) is True
    # A second call needs the 2 min backoff to pass: the thread lived through the first exception.
    assert tick_until(lambda: v.count >= 3, qclock, timeout=15)
    t = time.monotonic()
    qengine.stop_probe()
    assert time.monotonic() - t < 1.0
    assert cd_state(qengine, P, M, 1) == before
    assert recovered_rows(qengine) == []


def test_background_thread_survives_garbage_answers(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    bench_ripe(qengine, qclock, [1])
    before = cd_state(qengine, P, M, 1)
    answers = [None, "invalid", 0, object(), Evil(), [True], {"valid": True}, float("nan"), "VALID!"]
    v = Recorder(lambda k: answers[(v.count - 1) % len(answers)])
    assert qengine.start_probe(v, interval_s=0.02) is True
    assert tick_until(lambda: v.count >= len(answers), qclock, timeout=20, step_ms=5 * MINUTE)
    qengine.stop_probe()
    assert cd_state(qengine, P, M, 1) == before
    assert recovered_rows(qengine) == []


def test_stop_probe_stops_the_passes(qengine: q.QuotaEngine, qclock: q.ManualClock) -> None:
    bench_ripe(qengine, qclock, [1])
    v = Recorder(False)
    assert qengine.start_probe(v, interval_s=0.02) is True
    assert tick_until(lambda: v.count >= 1, qclock)
    t = time.monotonic()
    qengine.stop_probe()
    assert time.monotonic() - t < 1.0
    n = v.count
    for _ in range(10):
        qclock.advance(16 * MINUTE)
        time.sleep(0.02)
    assert v.count == n
    assert len(qengine.probeable_cooldowns()) == 1


# --------------------------------------------------------------------------- async validators


def test_async_validator_runs_on_the_given_loop(
    probe_loop: tuple[asyncio.AbstractEventLoop, int], qengine: q.QuotaEngine, qclock: q.ManualClock
) -> None:
    loop, loop_thread = probe_loop
    ran_on: list[int] = []
    keys: list[int] = []

    async def v(key: int) -> bool:
        ran_on.append(threading.get_ident())
        keys.append(key)
        await asyncio.sleep(0.01)
        return True

    bench_ripe(qengine, qclock, [1, 2])
    qengine.set_cooldown(P, M, 3, DAY, "authoritative")
    assert qengine.start_probe(v, interval_s=0.02, loop=loop) is True
    assert tick_until(lambda: qengine.probeable_cooldowns() == [], qclock)
    qengine.stop_probe()
    assert sorted(keys) == [1, 2]
    assert set(ran_on) == {loop_thread}
    assert [c.key_id for c in qengine.active_cooldowns()] == [3]
    assert len(recovered_rows(qengine)) == 2


@pytest.mark.parametrize("verdict", ["valid", False, "raise"])
def test_async_validator_verdicts(
    probe_loop: tuple[asyncio.AbstractEventLoop, int], qengine: q.QuotaEngine, qclock: q.ManualClock, verdict: object
) -> None:
    loop, loop_thread = probe_loop
    ran_on: list[int] = []

    async def v(key: int) -> object:
        ran_on.append(threading.get_ident())
        await asyncio.sleep(0.01)
        if verdict == "raise":
            raise RuntimeError("async validator exploded")
        return verdict

    bench_ripe(qengine, qclock, [1])
    before = cd_state(qengine, P, M, 1)
    assert qengine.start_probe(v, interval_s=0.02, loop=loop) is True
    if verdict == "valid":
        assert tick_until(lambda: qengine.cooldown(P, M, 1) is None, qclock)
    else:
        assert tick_until(lambda: len(ran_on) >= 2, qclock, step_ms=MINUTE)  # probed again after the backoff
        assert cd_state(qengine, P, M, 1) == before
    qengine.stop_probe()
    assert set(ran_on) == {loop_thread}


# --------------------------------------------------------------------------- no deadlocks (fresh interpreters)


def test_stop_probe_while_a_slow_validator_runs(tmp_path: Path) -> None:
    out, _ = run_script(
        tmp_path,
        """
        entered, left, calls = threading.Event(), threading.Event(), []
        def v(key):
            calls.append(key)
            entered.set()
            time.sleep(2.0)
            left.set()
            return False
        bench(1)
        out["started"] = e.start_probe(v, interval_s=0.02)
        out["entered"] = wait_while_ticking(entered)
        t = time.monotonic(); e.stop_probe(); out["stop_s"] = time.monotonic() - t
        out["left"] = left.wait(5)
        time.sleep(0.1)
        n = len(calls)
        for _ in range(10):
            clock.advance(16 * MINUTE); time.sleep(0.03)
        out["calls_after_stop"] = len(calls) - n
        t = time.monotonic(); e.close(); out["close_s"] = time.monotonic() - t
        done()
    """,
    )
    assert out["started"] is True
    assert out["entered"] is True
    assert out["stop_s"] < 1.0, out
    assert out["left"] is True
    assert out["calls_after_stop"] == 0
    assert out["close_s"] < 1.0


def test_stop_probe_from_inside_the_validator(tmp_path: Path) -> None:
    out, _ = run_script(
        tmp_path,
        """
        calls, returned = [], threading.Event()
        def v(key):
            calls.append(key)
            if len(calls) == 1:
                t = time.monotonic(); e.stop_probe(); out["stop_in_validator_s"] = time.monotonic() - t
                returned.set()
            return False
        bench(1, 2, 3)
        e.start_probe(v, interval_s=0.02)
        out["returned"] = wait_while_ticking(returned)
        time.sleep(0.2)
        n = len(calls)
        for _ in range(10):
            clock.advance(16 * MINUTE); time.sleep(0.03)
        out["calls_after_stop"] = len(calls) - n
        out["cooldowns"] = len(e.probeable_cooldowns())
        t = time.monotonic(); e.close(); out["close_s"] = time.monotonic() - t
        done()
    """,
    )
    assert out["returned"] is True
    assert out["stop_in_validator_s"] < 1.0
    assert out["calls_after_stop"] == 0
    assert out["cooldowns"] == 3
    assert out["close_s"] < 1.0


def test_close_during_a_pass(tmp_path: Path) -> None:
    out, _ = run_script(
        tmp_path,
        """
        entered, left = threading.Event(), threading.Event()
        def v(key):
            entered.set()
            time.sleep(2.0)
            left.set()
            return True
        bench(1)
        e.start_probe(v, interval_s=0.02)
        out["entered"] = wait_while_ticking(entered)
        t = time.monotonic(); e.close(); out["close_s"] = time.monotonic() - t
        out["closed"] = e.closed
        out["left"] = left.wait(5)
        time.sleep(0.3)  # the thread comes back from the validator to a closed engine
        try:
            e.active_cooldowns()
            out["after_close"] = "no error"
        except q.EngineClosed:
            out["after_close"] = "EngineClosed"
        with q.QuotaEngine(sys.argv[1], clock=clock, env={}) as again:
            out["reopened_cooldowns"] = len(again.active_cooldowns())
        done()
    """,
    )
    assert out["entered"] is True
    assert out["close_s"] < 1.0, out
    assert out["closed"] is True
    assert out["left"] is True
    assert out["after_close"] == "EngineClosed"
    assert out["reopened_cooldowns"] in (0, 1)


def test_close_from_inside_the_validator(tmp_path: Path) -> None:
    out, _ = run_script(
        tmp_path,
        """
        returned = threading.Event()
        def v(key):
            t = time.monotonic(); e.close(); out["close_in_validator_s"] = time.monotonic() - t
            returned.set()
            return True
        bench(1)
        e.start_probe(v, interval_s=0.02)
        out["returned"] = wait_while_ticking(returned)
        time.sleep(0.3)
        out["closed"] = e.closed
        done()
    """,
    )
    assert out["returned"] is True
    assert out["close_in_validator_s"] < 1.0
    assert out["closed"] is True


@pytest.mark.parametrize("method", ["stop_probe", "close"])
def test_stop_or_close_in_the_middle_of_an_interval(tmp_path: Path, method: str) -> None:
    out, _ = run_script(
        tmp_path,
        """
        calls = []
        bench(1)
        out["started"] = e.start_probe(lambda k: calls.append(k), interval_s=30.0)
        time.sleep(0.3)
        t = time.monotonic(); e.METHOD(); out["s"] = time.monotonic() - t
        e.close()
        done()
    """.replace("METHOD", method),
    )
    assert out["started"] is True
    assert out["s"] < 1.0, out


def test_validator_blocked_on_an_event_set_later(tmp_path: Path) -> None:
    out, _ = run_script(
        tmp_path,
        """
        entered, release = threading.Event(), threading.Event()
        def v(key):
            entered.set()
            out["released"] = release.wait(20)
            return True
        bench(1)
        e.start_probe(v, interval_s=0.02)
        out["entered"] = wait_while_ticking(entered)
        timings = {}
        def timed(name, f):
            t = time.monotonic(); f(); timings[name] = time.monotonic() - t
        # The engine keeps answering while the validator blocks.
        timed("record_request", lambda: e.record_request(P, M, 99))
        timed("set_cooldown", lambda: e.set_cooldown(P, "other", 2, 10 * MINUTE, "heuristic"))
        timed("active_cooldowns", e.active_cooldowns)
        timed("probeable_cooldowns", e.probeable_cooldowns)
        timed("server_logs", e.server_logs)
        timer = threading.Timer(0.3, release.set)
        timer.start()
        # A pass from the main thread while the background pass is stuck in the validator.
        timed("run_probe_pass", lambda: e.run_probe_pass(jitter=lambda: 0.0))
        timer.join()
        deadline = time.monotonic() + 5
        while e.cooldown(P, M, 1) is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        out["cleared"] = e.cooldown(P, M, 1) is None
        out["timings"] = timings
        t = time.monotonic(); e.close(); timings["close"] = time.monotonic() - t
        done()
    """,
    )
    assert out["entered"] is True
    timings = out["timings"]
    for name in ("record_request", "set_cooldown", "active_cooldowns", "probeable_cooldowns", "server_logs", "close"):
        assert timings[name] < 1.0, (name, timings)
    assert timings["run_probe_pass"] < 5.0, timings
    assert out["released"] is True
    assert out["cleared"] is True


def test_passes_never_overlap(tmp_path: Path) -> None:
    out, _ = run_script(
        tmp_path,
        """
        lock = threading.Lock()
        state = {"active": 0, "max": 0}
        main = threading.get_ident()
        by_thread = {"main": 0, "other": 0}
        def v(key):
            with lock:
                state["active"] += 1
                state["max"] = max(state["max"], state["active"])
                by_thread["main" if threading.get_ident() == main else "other"] += 1
            time.sleep(0.01)
            with lock:
                state["active"] -= 1
            return False
        bench(1, 2, 3, 4, 5, 6)
        e.start_probe(v, interval_s=0.02)
        time.sleep(0.2)
        for _ in range(30):  # 30 x 16 min stays inside the 12 h ripe window
            clock.advance(16 * MINUTE)  # every key is due again (the backoff is at most 15 min)
            e.run_probe_pass(jitter=lambda: 0.0)
            time.sleep(0.01)
        e.stop_probe()
        out["max"] = state["max"]
        out.update(by_thread)
        e.close()
        done()
    """,
        timeout=60,
    )
    assert out["max"] == 1, out
    assert out["main"] >= 1, out
    assert out["other"] >= 1, out


@pytest.mark.parametrize("scenario", ["idle", "probing", "sleeping-validator", "async-validator"])
def test_interpreter_exit_with_the_probe_running(tmp_path: Path, scenario: str) -> None:
    body = {
        "idle": """
            e.start_probe(lambda k: False, interval_s=0.01)
            time.sleep(0.1)
        """,
        "probing": """
            calls, enough = [], threading.Event()
            def v(key):
                calls.append(key)
                if len(calls) >= 3:
                    enough.set()
                return False
            bench(1, 2, 3)
            e.start_probe(v, interval_s=0.01)
            out["probed"] = wait_while_ticking(enough)
        """,
        "sleeping-validator": """
            entered = threading.Event()
            def v(key):
                entered.set()
                time.sleep(30)
                return True
            bench(1)
            e.start_probe(v, interval_s=0.01)
            out["probed"] = wait_while_ticking(entered)
        """,
        "async-validator": """
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, daemon=True).start()
            entered = threading.Event()
            async def v(key):
                entered.set()
                await asyncio.sleep(30)
                return True
            bench(1)
            e.start_probe(v, interval_s=0.01, loop=loop)
            out["probed"] = wait_while_ticking(entered)
        """,
    }[scenario]
    # No stop_probe(), no close(): the interpreter exits with the thread running.
    out, elapsed = run_script(tmp_path, textwrap.dedent(body) + "done()\n", timeout=20)
    assert out.get("probed", True) is True
    assert elapsed < 10.0
