"""quotaengine: the quota and cooldown engine an LLM router puts in front of its providers.

Counts requests and tokens per (platform, model, key) in the windows each model
declares (any sliding width, or the provider's calendar day, week or month), admits
requests atomically with leases (across threads and processes sharing one SQLite
file), and benches failing keys. The core is Rust; every call releases the GIL.
"""

from __future__ import annotations

import asyncio as _asyncio
import atexit as _atexit
import contextvars as _contextvars
import os as _os
import sys as _sys
import weakref as _weakref
from collections.abc import Awaitable as _Awaitable
from collections.abc import Iterable as _Iterable
from typing import Any as _Any
from typing import Literal as _Literal

from ._sqlite import check_runs_on as _check_sqlite
from ._sqlite import share_sqlite as _share_sqlite

# Before the extension loads: its SQLite symbols resolve against the SQLite that
# Python's sqlite3 uses (one SQLite per process, SPEC 1 and 26; see _sqlite.py).
_share_sqlite()

from ._errors import DatabaseError, EngineClosed, QuotaEngineError, QuotaExceeded, Refusal  # noqa: E402
from ._quotaengine import (  # noqa: E402
    Admission,
    Cooldown,
    CooldownDecision,
    FailureOutcome,
    LearnedLimit,
    Lease,
    Limit,
    Limits,
    ManualClock,
    Prices,
    ProbePassResult,
    ProviderCaps,
    QuotaObservation,
    QuotaState,
    __version__,
    _after_fork_in_child,
    _after_fork_in_parent,
    _before_fork,
    _LeaseWaiter,
    _QuotaEngine,
    _sqlite_compiled_in,
    infer_quota_pool_key,
    is_shared_pool,
    parse_provider_limit,
    parse_retry_after_ms,
    parse_stated_retry_ms,
    sqlite_version,
)
from ._snapshot import QuotaSnapshot  # noqa: E402

_check_sqlite(sqlite_version(), compiled_in=_sqlite_compiled_in)


class QuotaEngine(_QuotaEngine):
    """The quota and cooldown engine (see ``_QuotaEngine`` for every method).

    ``QuotaEngine(path=None, *, clock=None, env=None, retention_ms=86_400_000,
    lease_max_age_ms=120_000, window_usage_ttl_ms=5_000, busy_timeout_ms=5_000,
    flush_interval_ms=0, readonly=False)``. ``path`` is a SQLite file (or
    ``":memory:"``), or a Redis URL (``redis://[:password@]host:port/db[?prefix=name]``,
    ``rediss://...[?ssl_ca_certs=ca.pem]``, ``redis+sentinel://host:26379[,...]/service``,
    ``redis+cluster://host:7000[,...]``) shared by engines on several hosts. Thread-safe: share one per
    process.
    """

    __slots__ = ()

    def __init__(self, *args: _Any, **kwargs: _Any) -> None:
        # Construction happened in Rust; remember the engine so that interpreter exit
        # stops its probe thread and flushes it before Python finalizes.
        _live_engines.add(self)
        _close_at_multiprocessing_exit()

    async def lease_async(
        self,
        platform: str,
        model_id: str,
        key_id: int,
        estimated_tokens: int = 0,
        limits: _Any = None,
        *,
        estimated_output_tokens: int = 0,
        wait_s: float = 0.0,
        priority: int = 0,
        tenant: str | _Iterable[str] | None = None,
    ) -> Lease:
        """``lease()`` for asyncio (SPEC 17.2): waits up to ``wait_s`` seconds for
        capacity without blocking the event loop; cancelling the task ends the wait
        with nothing leased. ``async with await engine.lease_async(...) as lease:``.
        ``priority`` and ``tenant`` as for ``lease()`` (SPEC 22.1, 23.2)."""
        waiter = self._lease_waiter(
            platform,
            model_id,
            key_id,
            estimated_tokens,
            limits,
            estimated_output_tokens=estimated_output_tokens,
            wait_s=wait_s,
            priority=priority,
            tenant=tenant,
        )
        return await _wait_for(waiter)

    async def lease_any_async(
        self,
        routes: _Iterable[tuple[str, str, int]],
        estimated_tokens: int = 0,
        *,
        estimated_output_tokens: int = 0,
        strategy: _Literal["headroom", "order", "spread"] = "headroom",
        wait_s: float = 0.0,
        priority: int = 0,
        tenant: str | _Iterable[str] | None = None,
        exclude: _Iterable[tuple[str, str, int] | tuple[str, str] | tuple[str]] | None = None,
    ) -> Lease:
        """``lease_any()`` for asyncio (SPEC 17.1, 17.2): waits up to ``wait_s``
        seconds without blocking the event loop; cancelling the task ends the wait
        with nothing leased. ``priority`` and ``tenant`` as for ``lease()`` (SPEC 22.1,
        23.2); ``exclude`` as for ``lease_any()`` (SPEC 24.7)."""
        waiter = self._lease_any_waiter(
            routes,
            estimated_tokens,
            estimated_output_tokens=estimated_output_tokens,
            strategy=strategy,
            wait_s=wait_s,
            priority=priority,
            tenant=tenant,
            exclude=exclude,
        )
        return await _wait_for(waiter)

    def snapshot(self) -> QuotaSnapshot:
        """Every route with usage today, a live lease or an active cooldown; ``.tenants``:
        every limit in force of each tenant with limits or usage today (SPEC 23.4)."""
        taken_at, rows = self._snapshot_rows()
        return QuotaSnapshot(rows, taken_at, self.path, self._tenant_rows()[1])


async def _wait_for(waiter: _LeaseWaiter) -> Lease:
    """Steps a wait on the event loop: a look at the gates (the GIL released inside),
    then a nap of at most 50 ms that a lease of this engine ending cuts short, until
    admitted or refused. Cancelled in its nap, it leaves the queue with nothing leased."""
    loop = _asyncio.get_running_loop()
    try:
        while True:
            lease, nap = waiter.step()
            if lease is not None:
                return lease
            woken = loop.create_future()

            def wake(fut: _asyncio.Future[None] = woken) -> None:
                if not fut.done():
                    fut.set_result(None)

            timer = loop.call_later(nap, wake)
            # A lease of this engine that ends (in any thread) ends the nap early.
            waiter.on_wake(lambda: loop.call_soon_threadsafe(wake))
            try:
                await woken
            finally:
                timer.cancel()
    finally:
        waiter.close()


# SPEC 18.3: the engines whose probe pass the current coroutine validator runs for; a
# `run_probe_pass()` it makes on one of them is a RuntimeError (the pass waits for it).
_probe_pass_engines: _contextvars.ContextVar[tuple[int, ...]] = _contextvars.ContextVar(
    "quotaengine_probe_pass_engines", default=()
)


async def _in_probe_pass(validation: _Awaitable[object], engine: int) -> object:
    """Awaits a coroutine validator's answer inside a context naming the engine whose
    pass asked for it (the probe schedules this on the validator's loop)."""
    _probe_pass_engines.set((*_probe_pass_engines.get(), engine))
    return await validation


_live_engines: _weakref.WeakSet[QuotaEngine] = _weakref.WeakSet()


@_atexit.register
def _close_engines_at_exit() -> None:
    for engine in list(_live_engines):
        try:
            engine.close()
        except Exception:  # noqa: BLE001 - nothing useful to do at exit
            pass


_mp_finalizer_pid: int | None = None
_mp_after_fork = False


def _close_at_multiprocessing_exit(again: bool = False) -> None:
    """A multiprocessing worker (fork or forkserver) ends with ``os._exit``, after
    multiprocessing's own finalizers but without ``atexit``: close the engines there
    too, so that what a worker buffered (``flush_interval_ms``) is written."""
    global _mp_finalizer_pid, _mp_after_fork
    util = _sys.modules.get("multiprocessing.util")
    if util is None or (_mp_finalizer_pid == _os.getpid() and not again):
        return
    _mp_finalizer_pid = _os.getpid()
    util.Finalize(None, _close_engines_at_exit, exitpriority=0)
    if not _mp_after_fork:
        # A forked worker drops the finalizers it inherited, then runs these callbacks.
        _mp_after_fork = True
        util.register_after_fork(_close_engines_at_exit, lambda _: _close_at_multiprocessing_exit(again=True))


def _after_fork_child() -> None:
    _after_fork_in_child()
    _close_at_multiprocessing_exit()


# A server that forks (gunicorn --preload, Celery prefork, multiprocessing "fork") hands
# its engines to every worker. Before the fork every engine is brought to rest (no call
# inside it, no transaction open, nothing buffered); in the child each one lets go of the
# parent's connection and threads and opens its store anew at its first call there.
if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_child,
    )


__all__ = [
    "Admission",
    "Cooldown",
    "CooldownDecision",
    "DatabaseError",
    "EngineClosed",
    "FailureOutcome",
    "LearnedLimit",
    "Lease",
    "Limit",
    "Limits",
    "ManualClock",
    "Prices",
    "ProbePassResult",
    "ProviderCaps",
    "QuotaEngine",
    "QuotaEngineError",
    "QuotaExceeded",
    "Refusal",
    "QuotaObservation",
    "QuotaSnapshot",
    "QuotaState",
    "__version__",
    "infer_quota_pool_key",
    "is_shared_pool",
    "parse_provider_limit",
    "parse_retry_after_ms",
    "parse_stated_retry_ms",
    "sqlite_version",
]
