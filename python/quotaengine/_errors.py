"""Exceptions raised by quotaengine. The Rust core raises them by import."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

__all__ = ["QuotaEngineError", "QuotaExceeded", "Refusal", "DatabaseError", "EngineClosed"]


class Refusal(NamedTuple):
    """Why one candidate route was refused: the first failing gate, and when it can open
    (epoch ms; None when unknown)."""

    platform: str
    model_id: str
    key_id: int
    reason: str
    retry_at_ms: int | None
    #: The tenant whose limit refused (SPEC 23.2), by its own name; None for the route's
    #: own gates.
    tenant: str | None = None


class QuotaEngineError(Exception):
    """Base class of every quotaengine exception."""


class QuotaExceeded(QuotaEngineError):
    """``lease()`` was refused by a gate.

    ``reason`` is the first failing gate, in gate order (SPEC 14.1): "cooldown"; the
    model's limits in gate order: "rpm", "rpd", "tpm", "tpd" for the classic four, any
    other declared limit as "<metric>/<per>" as declared (e.g. "requests/1s",
    "tokens/month", "input_tokens/minute"; ":key" appended to a key-scope limit whose
    window is also declared at account scope, e.g. "rpm:key"); then
    "provider_daily_requests", "provider_minute_requests", "provider_daily_tokens";
    then the platform's limits (SPEC 23.3) as "platform:<metric>/<per>" (e.g.
    "platform:requests/minute", ":key" appended likewise); then "key_concurrency"; then
    each tenant's limits (SPEC 23.2) as "tenant:<metric>/<per>" (e.g. "tenant:cost/day"),
    ``tenant`` naming the tenant whose limit refused (None for the route's own gates).
    ``retry_at_ms`` is the earliest time it can open (epoch ms) or None when unknown. ``refusals`` has one ``Refusal`` per candidate, in the given
    order (one entry for ``lease()``); from ``lease_any()`` the exception's own fields
    are those of the refusal with the earliest known ``retry_at_ms`` (else the first).
    """

    # must match the tuple built in src/python/errors.rs
    def __init__(
        self,
        reason: str,
        retry_at_ms: int | None = None,
        platform: str | None = None,
        model_id: str | None = None,
        key_id: int | None = None,
        refusals: Iterable[tuple[str, str, int, str, int | None, str | None]] | None = None,
        tenant: str | None = None,
    ) -> None:
        super().__init__(reason, retry_at_ms, platform, model_id, key_id)
        self.reason = reason
        self.retry_at_ms = retry_at_ms
        self.platform = platform
        self.model_id = model_id
        self.key_id = key_id
        self.tenant = tenant
        self._refusals = refusals

    @property
    def refusals(self) -> list[Refusal]:
        """One ``Refusal`` per candidate, in the given order (built when first read)."""
        raw = self._refusals
        if raw is None:
            key = self.key_id if self.key_id is not None else 0
            raw = [(self.platform or "", self.model_id or "", key, self.reason, self.retry_at_ms, self.tenant)]
        return [Refusal(*r) for r in raw]

    def __str__(self) -> str:
        where = f"{self.platform}/{self.model_id}/{self.key_id}"
        retry = "" if self.retry_at_ms is None else f", retry at {self.retry_at_ms}"
        who = "" if self.tenant is None else f" (tenant {self.tenant!r})"
        return f"quota exceeded on {where}: {self.reason}{who}{retry}"


class DatabaseError(QuotaEngineError):
    """The file cannot be used as this engine's database, or a write on a read-only engine."""


class EngineClosed(QuotaEngineError):
    """A call after ``close()``."""
