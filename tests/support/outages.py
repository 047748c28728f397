"""Outages a test makes: a SQLite file another connection holds locked (the engine goes
degraded); events buffered while the Redis store is down (past the threshold where the
engine merges them in memory), and what the store holds once they are written: one server
restarted empty, or a primary that died and a replica promoted."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import quotaengine as q

Route = tuple[str, str, int]


@contextmanager
def exclusive_lock(db_path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holds `db_path` in ``BEGIN EXCLUSIVE`` for the block (then rolls
    back): the engine's writes wait their busy timeout and it goes degraded."""
    con = sqlite3.connect(db_path, isolation_level=None, timeout=10)
    try:
        con.execute("BEGIN EXCLUSIVE")
        yield con
        con.execute("ROLLBACK")
    finally:
        con.close()


def buffer_events_past_merging(e: q.QuotaEngine, clock: q.ManualClock, route: Route, calls: int = 0) -> tuple[int, int]:
    """6,000 requests and their tokens over 10 minutes while the store is down, after `calls`
    requests made before: (calls, tokens) in all."""
    tokens = 0
    for i in range(6_000):  # past the merge threshold, over 10 minutes
        e.record_request(*route)
        e.record_tokens(*route, 1 + i % 7)
        calls += 1
        tokens += 1 + i % 7
        clock.advance(100)
    assert e.degraded
    assert e._pending_writes() < 2 * calls, "buffered events were merged"
    return calls, tokens


def assert_one_row_per_request(url: str, clock: q.ManualClock, route: Route, calls: int, tokens: int) -> None:
    """Another engine on the store sees one request row per request (tokens 0) and every token."""
    with q.QuotaEngine(url, clock=clock, env={}) as other:
        events = other.usage_events()
        reqs = [ev for ev in events if ev["kind"] == "request"]
        assert len(reqs) == calls
        assert {ev["tokens"] for ev in reqs} == {0}
        assert sum(ev["tokens"] for ev in events if ev["kind"] == "tokens") == tokens
        assert other.usage(*route)["rpd"]["used"] == calls


TENANTS = ("a", "b", None)


def declare_tenant_days(e: q.QuotaEngine) -> None:
    """A daily requests limit, never reached, on each tenant of :data:`TENANTS`, so that
    ``tenant_usage`` reports their day."""
    for t in TENANTS:
        if t is not None:
            e.set_tenant_limits(t, [q.Limit("requests", 10**9, "day")])


def buffer_tenant_events_past_merging(e: q.QuotaEngine, clock: q.ManualClock, route: Route) -> dict[str, int]:
    """6,000 requests on one route over 10 minutes while the store fails, in turn for tenant
    "a", "b" and none (past the threshold where the buffer merges per minute): the requests
    each tenant was told it made."""
    told = {"a": 0, "b": 0}
    for i in range(6_000):
        tenant = TENANTS[i % 3]
        e.record_request(*route, tenant=tenant)
        if tenant is not None:
            told[tenant] += 1
        clock.advance(100)
    assert e.degraded
    assert e._pending_writes() < 5_000, "buffered events were not merged"
    return told


def tenant_days(e: q.QuotaEngine) -> dict[str, int]:
    """What each tenant of :data:`TENANTS` has used of its day, as ``e`` reads it."""
    return {t: e.tenant_usage(t)["requests/day"]["used"] for t in TENANTS if t is not None}
