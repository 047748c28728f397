"""BASELINE ONLY -- not part of quotaengine.

A hand-written, plain-Python + stdlib ``sqlite3`` implementation of quotaengine's
design, kept as the yardstick that ``bench_compare.py`` measures the Rust engine
against. It is what a careful Python user would write without the engine:

* one row per event in ``rate_limit_usage`` (kind 'request' or 'tokens'), same
  table and columns as SPEC section 10;
* every check runs one COUNT/SUM query per window (RPM, RPD, TPM, TPD) plus one
  over the live leases, through a covering index;
* ``lease()`` takes the cross-process write lock first (``BEGIN IMMEDIATE``),
  THEN reads the clock, runs the gates and inserts the lease row, and commits;
  reading the clock before the lock would let a process that waited for the lock
  miss rows stamped just before it and admit one too many;
* ``success()`` inserts the request row and the tokens row and deletes the lease
  in one transaction;
* WAL mode, ``synchronous=NORMAL`` (the engine's settings): every call has
  committed when it returns.

Model limits are read from the ``models`` table on every lease (the file is the
shared truth), a retention sweep runs at most once a minute of clock time. The
day windows count every row since midnight, so each check gets slower as the
day's rows pile up -- that is the behaviour being measured.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections.abc import Callable

MINUTE_MS = 60_000
DAY_MS = 86_400_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rate_limit_usage (
    id            INTEGER PRIMARY KEY,
    platform      TEXT    NOT NULL,
    model_id      TEXT    NOT NULL,
    key_id        INTEGER NOT NULL,
    kind          TEXT    NOT NULL,
    tokens        INTEGER NOT NULL DEFAULT 1,
    created_at_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_usage_route
    ON rate_limit_usage (platform, model_id, key_id, kind, created_at_ms, tokens);
CREATE INDEX IF NOT EXISTS idx_usage_time ON rate_limit_usage (created_at_ms);
CREATE TABLE IF NOT EXISTS quota_leases (
    id            INTEGER PRIMARY KEY,
    platform      TEXT    NOT NULL,
    model_id      TEXT    NOT NULL,
    key_id        INTEGER NOT NULL,
    tokens        INTEGER NOT NULL,
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_leases_route ON quota_leases (platform, model_id, key_id, expires_at_ms);
CREATE TABLE IF NOT EXISTS models (
    platform  TEXT NOT NULL,
    model_id  TEXT NOT NULL,
    rpm_limit INTEGER, rpd_limit INTEGER, tpm_limit INTEGER, tpd_limit INTEGER,
    PRIMARY KEY (platform, model_id)
);
"""

_Q_COUNT = (
    "SELECT COUNT(*) FROM rate_limit_usage WHERE platform=? AND model_id=? AND key_id=?"
    " AND kind='request' AND created_at_ms>?"
)
_Q_COUNT_DAY = (
    "SELECT COUNT(*) FROM rate_limit_usage WHERE platform=? AND model_id=? AND key_id=?"
    " AND kind='request' AND created_at_ms>=?"
)
_Q_SUM = (
    "SELECT COALESCE(SUM(tokens),0) FROM rate_limit_usage WHERE platform=? AND model_id=?"
    " AND key_id=? AND kind='tokens' AND created_at_ms>?"
)
_Q_SUM_DAY = (
    "SELECT COALESCE(SUM(tokens),0) FROM rate_limit_usage WHERE platform=? AND model_id=?"
    " AND key_id=? AND kind='tokens' AND created_at_ms>=?"
)
_Q_LEASES = (
    "SELECT COUNT(*), COALESCE(SUM(tokens),0) FROM quota_leases WHERE platform=? AND model_id=?"
    " AND key_id=? AND expires_at_ms>?"
)
_Q_LIMITS = "SELECT rpm_limit, rpd_limit, tpm_limit, tpd_limit FROM models WHERE platform=? AND model_id=?"


class QuotaExceeded(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _system_ms() -> int:
    return time.time_ns() // 1_000_000


class BaselineLease:
    __slots__ = ("_engine", "id", "platform", "model_id", "key_id", "estimated_tokens")

    def __init__(self, engine: BaselineEngine, lease_id: int, platform: str, model_id: str, key_id: int, est: int):
        self._engine = engine
        self.id = lease_id
        self.platform = platform
        self.model_id = model_id
        self.key_id = key_id
        self.estimated_tokens = est

    def success(self, tokens: int | None = None) -> None:
        self._engine._success(self, self.estimated_tokens if tokens is None else tokens)

    def release(self) -> None:
        self._engine._release(self.id)


class BaselineEngine:
    """quotaengine's design in plain Python + sqlite3 (one connection, one thread)."""

    def __init__(
        self,
        path: str,
        *,
        clock: Callable[[], int] | None = None,
        lease_max_age_ms: int = 120_000,
        retention_ms: int = DAY_MS,
        busy_timeout_ms: int = 5_000,
    ) -> None:
        self.now_ms = clock or _system_ms
        self.lease_max_age_ms = lease_max_age_ms
        self.retention_ms = retention_ms
        self._last_sweep = None
        self._rng = random.Random(os.getpid() ^ time.time_ns())
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=busy_timeout_ms / 1000)
        self.conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(_SCHEMA)

    def close(self) -> None:
        self.conn.close()

    def set_model_limits(self, platform: str, model_id: str, *, rpm=None, rpd=None, tpm=None, tpd=None) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO models VALUES (?,?,?,?,?,?)", (platform, model_id, rpm, rpd, tpm, tpd)
        )

    def lease(self, platform: str, model_id: str, key_id: int, estimated_tokens: int = 0) -> BaselineLease:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")  # the cross-process write lock ...
        try:
            now = self.now_ms()  # ... and only then the clock
            self._maybe_sweep(now)
            row = c.execute(_Q_LIMITS, (platform, model_id)).fetchone()
            rpm, rpd, tpm, tpd = row if row else (None, None, None, None)
            midnight = now - now % DAY_MS
            minute_start = now - MINUTE_MS
            n_live, tok_live = c.execute(_Q_LEASES, (platform, model_id, key_id, now)).fetchone()
            reason = None
            if (
                rpm is not None
                and c.execute(_Q_COUNT, (platform, model_id, key_id, minute_start)).fetchone()[0] + n_live >= rpm
            ):
                reason = "rpm"
            elif (
                rpd is not None
                and c.execute(_Q_COUNT_DAY, (platform, model_id, key_id, midnight)).fetchone()[0] + n_live >= rpd
            ):
                reason = "rpd"
            elif (
                tpm is not None
                and c.execute(_Q_SUM, (platform, model_id, key_id, minute_start)).fetchone()[0]
                + tok_live
                + estimated_tokens
                > tpm
            ):
                reason = "tpm"
            elif (
                tpd is not None
                and c.execute(_Q_SUM_DAY, (platform, model_id, key_id, midnight)).fetchone()[0]
                + tok_live
                + estimated_tokens
                > tpd
            ):
                reason = "tpd"
            if reason is not None:
                c.execute("ROLLBACK")
                raise QuotaExceeded(reason)
            lease_id = self._rng.getrandbits(62) + 1
            c.execute(
                "INSERT INTO quota_leases VALUES (?,?,?,?,?,?,?)",
                (lease_id, platform, model_id, key_id, estimated_tokens, now, now + self.lease_max_age_ms),
            )
            c.execute("COMMIT")
        except QuotaExceeded:
            raise
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise
        return BaselineLease(self, lease_id, platform, model_id, key_id, estimated_tokens)

    def _success(self, lease: BaselineLease, tokens: int) -> None:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            now = self.now_ms()
            route = (lease.platform, lease.model_id, lease.key_id)
            c.execute(
                "INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms)"
                " VALUES (?,?,?,'request',1,?)",
                (*route, now),
            )
            if tokens:
                c.execute(
                    "INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms)"
                    " VALUES (?,?,?,'tokens',?,?)",
                    (*route, tokens, now),
                )
            c.execute("DELETE FROM quota_leases WHERE id=?", (lease.id,))
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise

    def _release(self, lease_id: int) -> None:
        self.conn.execute("DELETE FROM quota_leases WHERE id=?", (lease_id,))

    def _maybe_sweep(self, now: int) -> None:
        # inside the caller's transaction; at most once a minute, again after a step back
        last = self._last_sweep
        if last is not None and last <= now < last + MINUTE_MS:
            return
        self._last_sweep = now
        self.conn.execute("DELETE FROM rate_limit_usage WHERE created_at_ms < ?", (now - self.retention_ms,))
        self.conn.execute("DELETE FROM quota_leases WHERE expires_at_ms <= ?", (now,))
