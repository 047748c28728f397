"""An engine inherited by forked workers (issue: Part 9b): a child behaves as if it had
opened the engine anew on the same store with the same settings. Real forks (os.fork,
multiprocessing's fork / forkserver / spawn, gunicorn --preload), real SQLite files and
a real redis-server, the system clock.

Also: every public method goes through the one boundary that turns a caught panic into
QuotaEngineError (a panic injected inside each)."""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing
import multiprocessing.forkserver
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import quotaengine as q
from redis_servers import free_port

P, M, K = "groq", "llama-3.1-8b", 1
# fork_app.py, the module the workers import.
SUPPORT = Path(__file__).resolve().parents[1] / "support"

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()"),
    # Python 3.12+ warns about fork() in a process with threads: forking such a process is the case.
    pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning"),
]


def fork_children(n: int, work: Callable[[], int]) -> list[int]:
    """Runs `work` in `n` children made by os.fork (all at once); returns what each returned.
    Each child then exits as an interpreter does (the package's atexit hook closes its
    engines). A child that raises (anything, BaseException included) fails the test."""
    pipes = []
    for _ in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            os.close(r)
            code, out = 0, ""
            try:
                out = str(work())
                q._close_engines_at_exit()  # what the interpreter's exit does (atexit)
            except BaseException:  # noqa: BLE001 - reported to the parent
                code, out = 1, traceback.format_exc()
            os.write(w, out.encode())
            os.close(w)
            os._exit(code)
        os.close(w)
        pipes.append((pid, r))
    results = []
    for pid, r in pipes:
        chunks = []
        while chunk := os.read(r, 65536):
            chunks.append(chunk)
        os.close(r)
        _, status = os.waitpid(pid, 0)
        out = b"".join(chunks).decode()
        assert os.waitstatus_to_exitcode(status) == 0, f"child failed:\n{out}"
        results.append(int(out))
    return results


def admit(e: q.QuotaEngine, attempts: int, rpm: int, tokens: int = 10) -> int:
    n = 0
    for _ in range(attempts):
        try:
            with e.lease(P, M, K, tokens, limits={"rpm": rpm}) as lease:
                lease.success(tokens=tokens)
            n += 1
        except q.QuotaExceeded:
            pass
    return n


def stored(store: str) -> tuple[int, int]:
    """(requests, tokens) of the route as a fresh engine reads them from the store."""
    with q.QuotaEngine(store, env={}) as reader:
        events = reader.usage_events(platform=P, model_id=M, key_id=K)
    return (
        sum(1 for ev in events if ev["kind"] == "request"),
        sum(ev["tokens"] for ev in events if ev["kind"] == "tokens"),
    )


def probe_tids() -> set[str]:
    """The ids of this process's threads named as a background probe."""
    out = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip().startswith("quotaengine-probe"[:15]):
                out.add(task.name)
        except OSError:
            pass
    return out


def threads_named(prefix: str, expect: int | None = None) -> int:
    """Threads of this process whose name starts with `prefix` (Linux names are 15 bytes).
    With `expect`, waits up to a second for that many (a new thread names itself)."""
    deadline = time.monotonic() + 1
    while True:
        n = 0
        for task in Path("/proc/self/task").iterdir():
            try:
                if (task / "comm").read_text().strip().startswith(prefix[:15]):
                    n += 1
            except OSError:
                pass
        if expect is None or n == expect or time.monotonic() > deadline:
            return n
        time.sleep(0.01)


@pytest.mark.parametrize("flush", [0, 10])
def test_forked_children_admit_exactly_and_lose_nothing(store: str, flush: int) -> None:
    """The issue's case: an engine opened (and used) in the parent, 3 forked children of 100
    leases each on rpm=200. Before: close() raised PanicException in the children and their
    buffered rows were lost (105 of 200 in the file)."""
    e = q.QuotaEngine(store, env={}, flush_interval_ms=flush)
    try:
        assert admit(e, 1, rpm=200) == 1  # the parent uses it before the fork

        def child() -> int:
            n = admit(e, 100, rpm=200)
            e.close()  # must not raise (PanicException is a BaseException: it would fail the child)
            return n

        assert sum(fork_children(3, child)) == 199
        # The parent is unaffected: its engine sees the children's leases and refuses the 201st.
        assert admit(e, 5, rpm=200) == 0
        assert e.usage(P, M, K)["rpm"]["used"] == 200
    finally:
        e.close()
    assert stored(store) == (200, 2000)


@pytest.mark.sqlite_only
def test_a_fork_while_the_parent_holds_the_write_lock(store: str) -> None:
    """flush_interval_ms=10 on a file of its own: the parent keeps SQLite's write lock between
    calls. A fork then must not leave the children believing they hold it: the hook ends the
    hold period before the fork, and each child takes the lock of its own."""
    e = q.QuotaEngine(store, env={}, flush_interval_ms=10)
    try:
        admit(e, 1, rpm=300)
        probe = sqlite3.connect(store, timeout=0, isolation_level=None)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            probe.execute("BEGIN IMMEDIATE")  # the parent holds the lock right now
        admit(e, 1, rpm=300)  # ... and again, just before the fork
        counts = fork_children(4, lambda: admit(e, 100, rpm=300))
        assert sum(counts) == 298
        probe.close()
    finally:
        e.close()
    assert stored(store) == (300, 3000)


@pytest.mark.parametrize("flush", [0, 10])
def test_a_fork_while_another_parent_thread_is_inside_a_lease(store: str, flush: int) -> None:
    """Another thread of the parent keeps taking leases (and holding each a moment) while the
    main thread forks: parent thread and children together admit exactly rpm."""
    rpm = 150
    e = q.QuotaEngine(store, env={}, flush_interval_ms=flush)
    stop = threading.Event()
    inside = threading.Event()
    parent_admitted = [0]

    def parent_loop() -> None:
        while not stop.is_set():
            try:
                with e.lease(P, M, K, 10, limits={"rpm": rpm}) as lease:
                    inside.set()
                    time.sleep(0.001)
                    lease.success(tokens=10)
                parent_admitted[0] += 1
            except q.QuotaExceeded:
                time.sleep(0.001)

    t = threading.Thread(target=parent_loop)
    t.start()
    try:
        assert inside.wait(5)
        children = fork_children(3, lambda: admit(e, 100, rpm=rpm))
        time.sleep(0.05)
    finally:
        stop.set()
        t.join()
    try:
        assert parent_admitted[0] + sum(children) == rpm
        assert admit(e, 3, rpm=rpm) == 0
    finally:
        e.close()
    assert stored(store) == (rpm, 10 * rpm)


def test_a_fork_while_a_probe_pass_runs(store: str) -> None:
    """A fork while the background probe is inside a validator call (the fork does not wait
    for it: a validator holds no lock and is outside the fork gate). The child has neither
    the parent's probe thread nor its flusher; its engine admits exactly, runs probe passes
    (no pass of the parent's is running there), and starts a probe of its own. The parent's
    probe goes on."""
    clock = q.ManualClock(1_767_268_800_000)
    e = q.QuotaEngine(store, clock=clock, env={}, flush_interval_ms=10)
    in_validator = threading.Event()

    def slow_validator(key_id: int) -> bool:
        in_validator.set()
        time.sleep(0.3)
        return False

    benched = 2  # the key the probe tests; leases go to K
    try:
        e.register_key(benched, P)
        e.set_cooldown(P, M, benched, duration_ms=600_000)
        clock.advance(300_001)  # ripe: half served, more than a minute left
        e.run_probe_pass(lambda k: False, jitter=lambda: 0.0)  # first sighting: due at once
        # Probes of other engines in this process (one of an engine closed by an earlier
        # test may still be ending: compare thread ids, not counts).
        others = probe_tids()
        assert e.start_probe(slow_validator, interval_s=0.01)
        assert in_validator.wait(10)  # a pass is inside the validator now
        ours = probe_tids() - others
        assert len(ours) == 1

        def child() -> int:
            assert threads_named("quotaengine-probe") == 0, "the parent's probe thread is not the child's"
            assert threads_named("quotaengine-flush") == 0
            n = admit(e, 10, rpm=5)
            assert threads_named("quotaengine-flush", expect=1) == 1  # its own, once opened anew
            # A key benched now (the parent's probe claimed the other one, for 2 min of real
            # time: a fleet probes a key once): first seen, then probed by the child's engine.
            e.register_key(3, P)
            e.set_cooldown(P, M, 3, duration_ms=600_000)
            clock.advance(300_001)
            assert e.run_probe_pass(lambda k: True, jitter=lambda: 0.0).probed_key_ids == []
            assert e.run_probe_pass(lambda k: True, jitter=lambda: 0.0).probed_key_ids == [3]
            assert not e.is_on_cooldown(P, M, 3)
            assert e.start_probe(lambda k: True, interval_s=60)
            assert threads_named("quotaengine-probe", expect=1) == 1
            e.stop_probe()
            e.close()
            return n

        assert fork_children(1, child) == [5]
        assert ours <= probe_tids()  # the parent's goes on
        assert admit(e, 3, rpm=5) == 0  # the child's leases count here
        assert e.cooldown(P, M, 3) is None  # cleared by the child's probe, through the store
    finally:
        e.close()


def test_a_fork_does_not_wait_for_a_hung_validator(store: str) -> None:
    """A validator that hangs (a probe call that never answers) must not hold up a fork: the
    fork waits only for calls inside the engine, and a validator runs outside it."""
    clock = q.ManualClock(1_767_268_800_000)
    e = q.QuotaEngine(store, clock=clock, env={})
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def hung_validator(key_id: int) -> bool:
        entered.set()
        release.wait(10)  # "hangs" until the test lets it go (10 s at most)
        returned.set()
        return False

    try:
        e.register_key(2, P)
        e.set_cooldown(P, M, 2, duration_ms=600_000)
        clock.advance(300_001)
        e.run_probe_pass(lambda k: False, jitter=lambda: 0.0)
        assert e.start_probe(hung_validator, interval_s=0.01)
        assert entered.wait(10)
        assert sum(fork_children(2, lambda: admit(e, 5, rpm=3))) == 3
        assert not returned.is_set(), "the fork waited for the validator"
        assert admit(e, 1, rpm=3) == 0
    finally:
        release.set()
        e.close()


def test_a_lease_taken_before_the_fork_belongs_to_the_parent(store: str) -> None:
    """The parent's lease, seen in a child (the fork happened inside its `with` block): the
    child's engine is a new one, and finishing the lease there records nothing; the parent
    finishes it once."""
    e = q.QuotaEngine(store, env={})
    try:
        with e.lease(P, M, K, 7, limits={"rpm": 10}) as lease:

            def child() -> int:
                lease.success(tokens=7)  # not the child's: nothing recorded
                assert lease.done
                return e.usage(P, M, K)["in_flight"]

            assert fork_children(1, child) == [1]  # the parent's lease still in flight
            assert not lease.done
        assert e.usage(P, M, K)["rpm"]["used"] == 1
        assert e.usage(P, M, K)["in_flight"] == 0
    finally:
        e.close()
    assert stored(store) == (1, 7)


def test_an_engine_closed_before_the_fork_stays_closed(store: str) -> None:
    e = q.QuotaEngine(store, env={})
    e.close()

    def child() -> int:
        assert e.closed
        with pytest.raises(q.EngineClosed):
            e.usage(P, M, K)
        return 0

    assert fork_children(1, child) == [0]


@pytest.mark.parametrize("flush", [0, 10])
def test_an_in_memory_engine_is_the_childs_own_copy(flush: int) -> None:
    """ ":memory:" is private to the process: the child keeps a copy of what the parent had
    (as any forked memory), and neither sees the other's changes after the fork."""
    e = q.QuotaEngine(":memory:", env={}, flush_interval_ms=flush)
    try:
        admit(e, 3, rpm=10)

        def child() -> int:
            n = admit(e, 10, rpm=10)
            return n + 100 * e.usage(P, M, K)["rpm"]["used"]

        assert fork_children(2, child) == [1007, 1007]
        assert e.usage(P, M, K)["rpm"]["used"] == 3
    finally:
        e.close()


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
@pytest.mark.parametrize("flush", [0, 10])
def test_multiprocessing_contexts_admit_exactly(
    store: str, method: str, flush: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module that creates its engine at import (tests/support/fork_app.py), a pool of 4 workers in
    each start method: with "fork" the workers inherit the parent's engine, with "forkserver"
    and "spawn" each imports the module and opens its own. Exactly rpm admitted, all stored."""
    monkeypatch.setenv("QE_FORK_STORE", store)
    monkeypatch.setenv("QE_FORK_FLUSH", str(flush))
    monkeypatch.setenv("QE_FORK_RPM", "100")
    monkeypatch.syspath_prepend(str(SUPPORT))
    import fork_app

    app = importlib.reload(fork_app)  # this test's store
    if method == "forkserver":
        # The server keeps the environment it started with: one of this test's own.
        stop = getattr(getattr(multiprocessing.forkserver, "_forkserver", None), "_stop", None)
        if stop is not None:
            stop()
    try:
        app.admit(1)  # the parent uses the engine first
        ctx = multiprocessing.get_context(method)
        with ctx.Pool(4) as pool:
            counts = pool.map(app.admit, [50] * 8)
            pool.close()
            pool.join()
        assert sum(counts) == 99
        assert app.admit(3) == 0
    finally:
        app.ENGINE.close()
    requests, tokens = stored(store)
    assert requests == 100
    assert 1000 <= tokens <= 1200


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gunicorn exited: {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("gunicorn did not listen")


@pytest.mark.parametrize("flush", [0, 10])
def test_gunicorn_preload_workers_share_the_engine_exactly(store: str, flush: int, tmp_path: Path) -> None:
    """gunicorn --preload -w 4 on a WSGI app whose module creates the engine at import: the
    master opens it, the 4 forked workers inherit it. 400 concurrent requests on rpm=100:
    exactly 100 answered 200, by more than one worker, and each admitted request is in the store
    with its tokens."""
    exe = shutil.which("gunicorn", path=os.path.dirname(sys.executable)) or shutil.which("gunicorn")
    if exe is None:
        pytest.fail("gunicorn is not installed (a test dependency: pip install .[test])")
    port = free_port()
    env = dict(os.environ, QE_FORK_STORE=store, QE_FORK_FLUSH=str(flush), QE_FORK_RPM="100")
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), env.get("PYTHONPATH", "")])
    log_file = open(tmp_path / "gunicorn.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [exe, "--preload", "-w", "4", "-b", f"127.0.0.1:{port}", "--graceful-timeout", "5", "fork_app:app"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=log_file,
    )
    try:
        wait_for_port(port, proc)
        # Every worker up (each answers its pid) before the measured requests.
        pids: set[str] = set()
        deadline = time.monotonic() + 20
        while len(pids) < 4 and time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/pid", timeout=5) as r:
                pids.add(r.read().decode())

        def call(i: int) -> tuple[int, str, int]:
            tokens = 1 + i % 5
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/?tokens={tokens}", timeout=20) as r:
                    return r.status, r.read().decode(), tokens
            except urllib.error.HTTPError as err:
                return err.code, "", tokens

        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(call, range(400)))
    finally:
        proc.terminate()  # graceful: workers finish and exit (atexit closes their engines)
        proc.wait(timeout=30)
        log_file.close()
    log = (tmp_path / "gunicorn.log").read_text()
    assert "PanicException" not in log and "Traceback" not in log, log
    admitted = [a for a in answers if a[0] == 200]
    assert {a[0] for a in answers} <= {200, 429}
    assert len(admitted) == 100
    assert len({a[1] for a in admitted}) > 1, "served by more than one worker"
    assert stored(store) == (100, sum(a[2] for a in admitted))


# ---------------------------------------------------------------------------- the panic boundary


LEASE_METHODS = ["success", "failure", "release", "__exit__"]


def public_calls(e: q.QuotaEngine) -> dict[str, Callable[[], Any]]:
    """Every public method of the engine, with valid arguments (close last)."""
    return {
        "register_key": lambda: e.register_key(5, P),
        "set_model_limits": lambda: e.set_model_limits(P, M, rpm=1000),
        "model_limits": lambda: e.model_limits(P, M),
        "model_limit_list": lambda: e.model_limit_list(P, M),
        "key_account": lambda: e.key_account(P, 1),
        "key_concurrency_cap": lambda: e.key_concurrency_cap(P, 1),
        "set_key_concurrency_cap": lambda: e.set_key_concurrency_cap(P, 99, None),
        "record_request": lambda: e.record_request(P, M, K),
        "record_tokens": lambda: e.record_tokens(P, M, K, 3),
        "usage": lambda: e.usage(P, M, K),
        "check": lambda: e.check(P, M, K),
        "can_make_request": lambda: e.can_make_request(P, M, K),
        "can_use_tokens": lambda: e.can_use_tokens(P, M, K, 1),
        "can_use_provider": lambda: e.can_use_provider(P, K),
        "can_use_provider_minute": lambda: e.can_use_provider_minute(P, K),
        "can_use_provider_tokens": lambda: e.can_use_provider_tokens(P, K, M, 1),
        "can_use_key_concurrency": lambda: e.can_use_key_concurrency(P, K),
        "is_on_cooldown": lambda: e.is_on_cooldown(P, M, K),
        "acquire_lease": lambda: e.acquire_lease(P, M, K),
        "release_lease": lambda: e.release_lease(12345),
        "lease": lambda: e.lease(P, M, K),
        "lease_any": lambda: e.lease_any([(P, M, 6), (P, M, 7)]).release(),
        "lease_async": lambda: asyncio.run(e.lease_async(P, M, 6)).release(),
        "lease_any_async": lambda: asyncio.run(e.lease_any_async([(P, M, 7)])).release(),
        "set_cooldown": lambda: e.set_cooldown(P, M, 3, duration_ms=1000),
        "cooldown": lambda: e.cooldown(P, M, K),
        "active_cooldowns": lambda: e.active_cooldowns(),
        "stored_cooldowns": lambda: e.stored_cooldowns(),
        "soonest_cooldown_expiry": lambda: e.soonest_cooldown_expiry(),
        "probeable_cooldowns": lambda: e.probeable_cooldowns(),
        "clear_cooldown_early": lambda: e.clear_cooldown_early(P, M, 3),
        "clear_cooldowns_for_key": lambda: e.clear_cooldowns_for_key(3),
        "cleanup_expired_cooldowns": lambda: e.cleanup_expired_cooldowns(),
        "record_failure": lambda: e.record_failure(P, M, 4, status=500),
        "cooldown_decision_for_limit": lambda: e.cooldown_decision_for_limit(P, M, 4),
        "learn_limit_from_error": lambda: e.learn_limit_from_error(P, M, "Limit 5, requests per minute"),
        "provider_caps": lambda: e.provider_caps(P),
        "set_provider_caps": lambda: e.set_provider_caps(P, daily_requests=None),
        "reset_provider_caps": lambda: e.reset_provider_caps(P),
        "learned_provider_caps": lambda: e.learned_provider_caps(P, 1),
        "provider_daily_request_count": lambda: e.provider_daily_request_count(P, K),
        "provider_minute_request_count": lambda: e.provider_minute_request_count(P, K),
        "provider_daily_token_count": lambda: e.provider_daily_token_count(P, K),
        "record_quota_headers": lambda: e.record_quota_headers(P, K, {"x-ratelimit-limit-requests": "10"}),
        "quota_state": lambda: e.quota_state(),
        "key_quota_headroom": lambda: e.key_quota_headroom(P),
        "model_window_used_fraction": lambda: e.model_window_used_fraction(P, M),
        "invalidate_window_usage": lambda: e.invalidate_window_usage(),
        "snapshot": lambda: e.snapshot(),
        "stats": lambda: e.stats(),
        "usage_events": lambda: e.usage_events(),
        "server_logs": lambda: e.server_logs(),
        "degraded": lambda: e.degraded,
        "start_probe": lambda: e.start_probe(lambda k: True, interval_s=60),
        "stop_probe": lambda: e.stop_probe(),
        "run_probe_pass": lambda: e.run_probe_pass(lambda k: True),
        "set_platform_calendar": lambda: e.set_platform_calendar(P, "UTC"),
        "platform_calendar": lambda: e.platform_calendar(P),
        "day_start_ms": lambda: e.day_start_ms(P),
        "next_day_start_ms": lambda: e.next_day_start_ms(P),
        "set_priority_reserve": lambda: e.set_priority_reserve(9, 0.0),
        "priority_reserve": lambda: e.priority_reserve(1),
        "set_model_prices": lambda: e.set_model_prices(P, M, q.Prices(0.15, 0.6)),
        "model_prices": lambda: e.model_prices(P, M),
        "set_platform_limits": lambda: e.set_platform_limits("p", []),
        "platform_limits": lambda: e.platform_limits("p"),
        "set_tenant_limits": lambda: e.set_tenant_limits("t", []),
        "tenant_limits": lambda: e.tenant_limits("t"),
        "tenant_usage": lambda: e.tenant_usage("t"),
        "tenants": lambda: e.tenants(),
        "forecast": lambda: e.forecast(P, M, K),
        "__exit__": lambda: e.__exit__(None, None, None),
    }


def expect_boundary_error(name: str, call: Callable[[], Any]) -> None:
    try:
        call()
    except q.QuotaEngineError as err:
        assert "injected panic" in str(err), (name, err)
    except BaseException as err:  # noqa: BLE001 - PanicException is one
        pytest.fail(f"{name}: {type(err).__name__}: {err}")
    else:
        pytest.fail(f"{name}: the injected panic did not surface")


def test_every_public_method_turns_a_panic_into_quotaengine_error(store: str) -> None:
    """A panic inside any call (injected at the boundary) comes back as QuotaEngineError (an
    Exception, never pyo3's PanicException, a BaseException), and the engine keeps working."""
    e = q.QuotaEngine(store, env={})
    try:
        calls = public_calls(e)
        methods = {n for n in dir(q.QuotaEngine) if not n.startswith("_") and callable(getattr(q.QuotaEngine, n))}
        missing = methods - set(calls) - {"now_ms", "close"}
        assert not missing, f"methods not driven through a panic: {sorted(missing)}"
        for name, call in [*calls.items(), ("close", e.close)]:
            e._inject_panics(1)
            expect_boundary_error(name, call)
            assert not e.closed, name
            assert e.check(P, M, K).allowed, name  # still working
            if name not in ("close", "__exit__"):
                call()  # and the call itself works once the panic is gone
        for i, method in enumerate(LEASE_METHODS):
            lease = e.lease(P, M, 90 + i, 1)
            e._inject_panics(1)
            args: dict[str, Any] = {"status": 500} if method == "failure" else {}
            exit_args = (None, None, None) if method == "__exit__" else ()
            expect_boundary_error(f"Lease.{method}", lambda: getattr(lease, method)(*exit_args, **args))  # noqa: B023
            assert not lease.done, method  # not finished: it can still be
            getattr(lease, method)(*exit_args, **args)
            assert lease.done
        assert all(e.usage(P, M, 90 + i)["in_flight"] == 0 for i in range(len(LEASE_METHODS)))
        e.close()
        assert e.closed
    finally:
        e.close()


def test_a_panic_while_the_engine_is_dropped_is_not_raised(store: str) -> None:
    e = q.QuotaEngine(store, env={})
    e.record_request(P, M, K)
    e._inject_panics(1)
    del e  # __del__ -> close(): the panic is caught there (nothing to raise to)
    with q.QuotaEngine(store, env={}) as again:
        assert again.usage(P, M, K)["rpd"]["used"] == 1


@pytest.mark.sqlite_only
def test_each_child_registers_on_the_file_and_the_last_one_out_removes_it(store: str) -> None:
    """A child's engine has its own `<db>-engines` registration: while a child uses the file the
    parent is not alone on it (so it no longer keeps the write lock across calls), the parent
    closing first leaves the child registered, and the last one out removes the side file."""
    side = Path(store + "-engines")
    e = q.QuotaEngine(store, env={}, flush_interval_ms=10)
    admit(e, 1, rpm=100)
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.close(done_r)
        code = 0
        try:
            admit(e, 1, rpm=100)  # opens the child's own connection and registration
            os.write(done_w, b"1")
            os.read(go_r, 1)  # the parent has closed its engine
            assert side.exists(), "the child is still registered"
            admit(e, 1, rpm=100)
            e.close()
        except BaseException:  # noqa: BLE001 - reported by the exit code
            traceback.print_exc()
            code = 1
        os._exit(code)
    os.close(go_r)
    os.close(done_w)
    assert os.read(done_r, 1) == b"1"
    # Parent and child both registered: a plain sqlite3 writer gets the lock between the
    # parent's calls (the parent commits each lease at once now).
    admit(e, 1, rpm=100)
    con = sqlite3.connect(store, timeout=0, isolation_level=None)
    con.execute("BEGIN IMMEDIATE")
    con.execute("ROLLBACK")
    con.close()
    e.close()
    assert side.exists()
    os.write(go_w, b"1")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not side.exists()
    assert stored(store) == (4, 40)
