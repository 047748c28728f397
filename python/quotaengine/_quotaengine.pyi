"""Type stubs and documentation of the Rust core (``quotaengine._quotaengine``).

Every method of ``QuotaEngine`` and ``Lease`` releases the GIL while it does Rust
work (locks, SQLite, arithmetic) and takes it again only to convert arguments and
results. Times are ``int`` milliseconds since the Unix epoch, UTC.
"""

import asyncio
import os
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Final, Literal, Protocol, TypeAlias, final

from typing_extensions import Self

__version__: Final[str]
# SQLite compiled into the extension (cargo feature bundled-sqlite: the Windows wheel).
_sqlite_compiled_in: Final[bool]
# SPEC 27.2's families, (key, name, help, type, labels) each (a counter's name without
# _total), and the Content-Type of QuotaEngine._metrics_text().
_metric_families: Final[list[tuple[str, str, str, str, list[str]]]]
_metrics_content_type: Final[str]

#: The gates whose reason is a fixed name, in gate order (SPEC 4, 14.1).
_GateName = Literal[
    "cooldown",
    "rpm",
    "rpd",
    "tpm",
    "tpd",
    "provider_daily_requests",
    "provider_minute_requests",
    "provider_daily_tokens",
    "key_concurrency",
]
#: Every reason a gate can give (SPEC 14.1): a fixed name, or a declared limit beyond the
#: classic four named ``"<metric>/<per>"`` as declared (``"requests/1s"``, ``"tokens/month"``,
#: ``"input_tokens/minute"``), with ``":key"`` appended to a key-scope limit whose window is
#: also declared at account scope (``"rpm:key"``, ``"requests/1s:key"``).
_Reason: TypeAlias = _GateName | str
_Source = Literal["heuristic", "authoritative", "credit", "tier"]
# What benched: also "upstream", the model-wide bench of a congested upstream (SPEC 21.1).
_BenchSource = Literal["heuristic", "authoritative", "credit", "tier", "upstream"]
_Kind = Literal[
    "payment",
    "forbidden",
    "auth",
    "upstream",
    "daily_quota",
    "concurrency",
    "rate_limit",
    "timeout",
    "server_error",
    "transport",
    "empty_completion",
    "other",
]

def sqlite_version() -> str:
    """The version of the SQLite library the engine runs on (equals ``sqlite3.sqlite_version``)."""

def parse_retry_after_ms(value: str | None, now_ms: int | None = None) -> int | None:
    """A Retry-After value (delta-seconds or HTTP-date) in ms, clamped to 24 h; a past
    date gives 0; None when it cannot be parsed. ``now_ms`` defaults to the wall clock."""

def parse_stated_retry_ms(message: str | None) -> int | None:
    """A delay stated in an error body ("try again in 7.66s", ``"retryDelay": "17s"``),
    in ms, clamped to 24 h; None when nothing is stated. A bare number is never a delay."""

def parse_provider_limit(message: str | None) -> LearnedLimit | None:
    """The limit an error body states: needs "limit N" and a confident axis (tried TPD,
    TPM, RPD, RPM); else None."""

def infer_quota_pool_key(platform: str, model_id: str | None = None) -> str:
    """The quota pool a (platform, model) draws from, e.g. ``openrouter::free``. The
    platform is case-sensitive: ``"Google"`` is not ``"google"``."""

def is_shared_pool(platform: str) -> bool:
    """True for platforms whose keys share one account-wide or free pool."""

def provider_hosts() -> dict[str, str]:
    """The API hosts the engine knows (an ``api_base``'s host, lower-case) and the
    platform each means, e.g. ``{"api.groq.com": "groq", ...}``."""

@final
class ManualClock:
    """A clock that moves only when told to; the engine and its threads read it."""

    def __new__(cls, now_ms: int) -> ManualClock: ...
    def now_ms(self) -> int: ...
    def advance(self, ms: int) -> None:
        """Move the clock by ``ms`` (negative moves it back)."""
    def set(self, now_ms: int) -> None: ...

@final
class Limits:
    """A model's window limits; ``None`` is unlimited. Frozen, hashable."""

    def __new__(
        cls, rpm: int | None = None, rpd: int | None = None, tpm: int | None = None, tpd: int | None = None
    ) -> Limits: ...
    @property
    def rpm(self) -> int | None: ...
    @property
    def rpd(self) -> int | None: ...
    @property
    def tpm(self) -> int | None: ...
    @property
    def tpd(self) -> int | None: ...
    def to_dict(self) -> dict[str, int | None]: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Limit:
    """One limit as data (SPEC §14.1): at most ``limit`` of ``metric`` per ``per``, counted at
    ``scope``. ``metric``: "requests", "tokens", "input_tokens", "output_tokens" or "cost" (micro-dollars, SPEC 23.1). ``per``:
    "minute", "day", "week", "month" (the platform's calendar) or a sliding width "<N>s",
    "<N>m", "<N>h", "<N>d" from 1s to 31d. ``scope``: "account" (default) or "key". Anything
    else is a ``ValueError`` naming what is accepted. Frozen, hashable."""

    def __new__(cls, metric: str, limit: int, per: str, scope: str = "account") -> Limit: ...
    @staticmethod
    def dollars(amount: float, per: str, scope: str = "account") -> Limit:
        """A ``cost`` limit of ``amount`` dollars per ``per`` (SPEC 23.1): ``round(amount *
        10**6)`` micro-dollars. Negative or non-finite is a ``ValueError``, a bool or a
        non-number a ``TypeError``."""
    @property
    def metric(self) -> str: ...
    @property
    def limit(self) -> int: ...
    @property
    def per(self) -> str: ...
    @property
    def scope(self) -> str: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

_LimitsArg: TypeAlias = Limits | Mapping[str, int | None] | Iterable[Limit] | None
_TenantArg: TypeAlias = str | Iterable[str] | None
_ExcludeArg: TypeAlias = Iterable[tuple[str, str, int] | tuple[str, str] | tuple[str]] | None

@final
class Prices:
    """A model's prices (SPEC 23.1): ``input``, ``output`` and ``cached_input`` in dollars per
    million tokens (``cached_input``, cache reads, defaults to ``input``; ``input`` excludes
    them), ``per_request`` in dollars per request. Held exactly as integer pico-dollars
    (``round(x * 10**6)`` per token, ``round(per_request * 10**12)`` per request) and read
    back as held. A negative, NaN or infinite price is a ``ValueError``, a bool or a
    non-number a ``TypeError``, one beyond 2**63 - 1 pico-dollars an ``OverflowError``.
    Frozen, hashable."""

    def __new__(
        cls, input: float, output: float, *, cached_input: float | None = None, per_request: float = 0.0
    ) -> Prices: ...
    @property
    def input(self) -> float: ...
    @property
    def output(self) -> float: ...
    @property
    def cached_input(self) -> float: ...
    @property
    def per_request(self) -> float: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Admission:
    """The answer of ``check()``; truthy when allowed."""

    @property
    def allowed(self) -> bool: ...
    @property
    def reason(self) -> _Reason | None:
        """The first failing gate, in SPEC order (a fixed name such as ``"rpm"`` or
        ``"key_concurrency"``, or a declared limit's ``"<metric>/<per>"``); None when allowed."""
    @property
    def retry_at_ms(self) -> int | None:
        """Earliest time the failing gate can open; None when allowed or unknown."""
    def __bool__(self) -> bool: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class Cooldown:
    """An active bench of one (platform, model_id, key_id); with key_id None, of the
    model for every key of the platform (source "upstream", SPEC 21.1)."""

    @property
    def platform(self) -> str: ...
    @property
    def model_id(self) -> str: ...
    @property
    def key_id(self) -> int | None:
        """None for a model-wide bench (SPEC 21.1)."""
    @property
    def expires_at_ms(self) -> int: ...
    @property
    def remaining_ms(self) -> int:
        """Milliseconds left when this object was read."""
    @property
    def source(self) -> _BenchSource: ...
    @property
    def set_at_ms(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class ProviderCaps:
    """Provider-wide caps of a platform; None is no cap."""

    @property
    def daily_requests(self) -> int | None: ...
    @property
    def minute_requests(self) -> int | None: ...
    @property
    def daily_tokens(self) -> int | None: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class CooldownDecision:
    """A bench chosen for a failure."""

    @property
    def duration_ms(self) -> int: ...
    @property
    def source(self) -> _BenchSource: ...
    def __eq__(self, other: object, /) -> bool: ...

@final
class LearnedLimit:
    """A limit read from a provider's error body, or a key concurrency cap learned from a
    concurrency failure (SPEC 15.4)."""

    @property
    def kind(self) -> Literal["tpm", "tpd", "rpm", "rpd", "concurrency"]:
        """The limit's axis; ``"concurrency"`` for a key concurrency cap learned from a
        concurrency failure (SPEC 15.4), whose ``limit`` is the cap."""
    @property
    def limit(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class FailureOutcome:
    """What ``record_failure`` decided: the kind, the bench (None when the kind does not
    bench; an active later-expiring cooldown is reported when it stands), a learned limit,
    and what the rest of the request skips."""

    @property
    def kind(self) -> _Kind: ...
    @property
    def cooldown(self) -> CooldownDecision | None: ...
    @property
    def learned(self) -> LearnedLimit | None: ...
    @property
    def skip(self) -> Literal["route", "model", "platform"]:
        """What the rest of the request skips (SPEC 24.7)."""
    def __eq__(self, other: object, /) -> bool: ...

@final
class QuotaObservation:
    """One observation of a provider's quota, from headers or an error response."""

    @property
    def platform(self) -> str: ...
    @property
    def key_id(self) -> int: ...
    @property
    def model_id(self) -> str | None: ...
    @property
    def pool_key(self) -> str: ...
    @property
    def metric(self) -> Literal["requests", "tokens"]: ...
    @property
    def limit(self) -> int | None: ...
    @property
    def remaining(self) -> int | None: ...
    @property
    def reset_at_ms(self) -> int | None: ...
    @property
    def retry_after_ms(self) -> int | None: ...
    @property
    def source(self) -> str: ...
    @property
    def confidence(self) -> float: ...
    @property
    def status(self) -> int: ...

@final
class QuotaState:
    """The merged quota of one (platform, key_id, pool_key, metric)."""

    @property
    def platform(self) -> str: ...
    @property
    def key_id(self) -> int: ...
    @property
    def pool_key(self) -> str: ...
    @property
    def metric(self) -> str: ...
    @property
    def limit(self) -> int | None: ...
    @property
    def remaining(self) -> int | None: ...
    @property
    def reset_at_ms(self) -> int | None: ...
    @property
    def source(self) -> str: ...
    @property
    def confidence(self) -> float: ...
    @property
    def observed_at_ms(self) -> int: ...

@final
class ProbePassResult:
    """What one probe pass did."""

    @property
    def probed_key_ids(self) -> list[int]:
        """Keys whose validator ran in this pass, in order."""
    @property
    def cleared_cooldowns(self) -> int:
        """Heuristic cooldowns cleared by passing keys."""
    def __eq__(self, other: object, /) -> bool: ...

class _HTTPResponse(Protocol):
    """What ``Lease.observe`` reads of an HTTP response (httpx, requests, the SDKs' raw
    responses): an int status and a mapping of headers; the body from ``content`` or
    ``text``."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...

class _HasUsage(Protocol):
    """A parsed completion (OpenAI's ``ChatCompletion``, Anthropic's ``Message``)."""

    @property
    def usage(self) -> object: ...

_Observable: TypeAlias = _HTTPResponse | BaseException | Mapping[str, object] | _HasUsage

@final
class _LeaseWaiter:
    """A pending ``lease_async`` / ``lease_any_async``."""

    def step(self) -> tuple[Lease | None, float]:
        """One look at the gates: ``(lease, 0.0)`` when admitted, ``(None, seconds)`` to
        sleep first; raises QuotaExceeded when the wait is over."""
    def on_wake(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` (from any thread) once the engine may have freed capacity
        since the last step, or at once when it already has."""
    def close(self) -> None:
        """Leave the wait queue; idempotent."""

@final
class Lease:
    """An admitted, in-flight request. A context manager, sync and async.

    Leaving the block normally with no explicit outcome records its estimate as used
    (``estimated_tokens``, split into input and output as estimated, so that it costs
    what it reserved, SPEC 23.1); leaving it by an exception records nothing.
    The lease is released either way. The engine's ``close()`` ends a live lease the
    same way; one garbage-collected unended keeps counting until ``lease_max_age_ms``
    (its call may still run).
    """

    @property
    def id(self) -> int: ...
    @property
    def platform(self) -> str: ...
    @property
    def model_id(self) -> str: ...
    @property
    def key_id(self) -> int: ...
    @property
    def estimated_tokens(self) -> int: ...
    @property
    def done(self) -> bool:
        """True once an outcome was recorded or the lease released."""
    def success(
        self,
        tokens: int | None = None,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        cached_tokens: int | None = None,
    ) -> None:
        """Record the request (and its tokens when given: the total, or input and output
        apart, the total then their sum, and the cached part of the input; SPEC §14.4) and
        release, in one commit."""
    def _success_estimate(self) -> None: ...
    def failure(
        self,
        *,
        status: int | None = None,
        retry_after: str | int | float | None = None,
        message: str | None = None,
        kind: _Kind | None = None,
    ) -> FailureOutcome | None:
        """``record_failure(...)`` for this route, then release. None if already finished."""
    def observe(self, outcome: _Observable, *, tokens: int | None = None) -> FailureOutcome | None:
        """Tell the engine what came back and end the lease (SPEC 16), from what the router
        holds: an HTTP response (``status_code`` and ``headers``: httpx, requests, an SDK's
        ``with_raw_response``), an SDK's status error or connection/timeout error, or a
        parsed completion or dict with ``usage``. Duck-typed: no SDK is imported. Returns
        the ``FailureOutcome`` of a failure, None on success; anything else is a
        TypeError and the lease stays live."""
    def _record_quota_headers(self, headers: Mapping[str, str], status: int) -> None:
        """``record_quota_headers`` for this lease's route."""
    def _failure_with_headers(
        self,
        headers: Mapping[str, str],
        *,
        status: int,
        retry_after: str | int | float | None = None,
        message: str | None = None,
    ) -> FailureOutcome | None:
        """``record_quota_headers`` for this lease's route, then ``failure(...)`` with the
        response's headers at hand (a pool 429's cap may sit there, SPEC 21.2): what
        ``observe`` does with a failed response."""
    def release(self) -> None:
        """Release without recording anything. Idempotent."""
    def __enter__(self) -> Lease: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None = None,
        _exc: BaseException | None = None,
        _tb: TracebackType | None = None,
    ) -> bool: ...
    def __aenter__(self) -> _Ready: ...
    def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        _exc: BaseException | None = None,
        _tb: TracebackType | None = None,
    ) -> _Ready: ...

@final
class _Ready:
    """An already-completed awaitable."""

    def __await__(self) -> _Ready: ...
    def __iter__(self) -> _Ready: ...
    def __next__(self) -> None: ...

class _QuotaEngine:
    """The quota and cooldown engine. Thread-safe; share one per process.

    ``path``: a SQLite file (None -> ``$QUOTAENGINE_DB`` from ``env``, else ``./quota.db``),
    or ``":memory:"``, or a Redis URL (``redis://[:password@]host:port/db[?prefix=name]``,
    ``rediss://...[?ssl_ca_certs=ca.pem]``, ``redis+sentinel://host:26379[,...]/service``,
    ``redis+cluster://host:7000[,...]``) shared by engines on several hosts. ``env`` replaces ``os.environ`` for this engine and is read once.
    Raises ``DatabaseError`` when the file is not SQLite, holds another application's
    tables, or has a newer schema; the file is then left unchanged.

    ``flush_interval_ms=N > 0`` groups writes: a crash may lose the last N ms of events.
    An engine alone on its SQLite file then keeps the write lock for min(N/2, 10) ms at
    a time and commits once per period (registered in ``<path>-engines`` so that
    another engine opening the file ends that at once); with several engines only
    usage events are grouped.
    """

    def __new__(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        clock: ManualClock | None = None,
        env: Mapping[str, str] | None = None,
        retention_ms: int = 86_400_000,
        lease_max_age_ms: int = 120_000,
        window_usage_ttl_ms: int = 5_000,
        busy_timeout_ms: int = 5_000,
        flush_interval_ms: int = 0,
        readonly: bool = False,
    ) -> _QuotaEngine: ...
    @property
    def path(self) -> str: ...
    @property
    def readonly(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    @property
    def degraded(self) -> bool:
        """True while database writes fail and the engine serves from memory."""
    def now_ms(self) -> int:
        """The engine clock's time."""
    def close(self) -> None:
        """End every live ``Lease`` of this engine as leaving its ``with`` block does (its
        estimate recorded, its slot freed: other engines on the store see it gone at
        once), write what is buffered and close. Idempotent; later calls, and
        ``success``/``failure``/``observe`` on those leases, raise EngineClosed. A lease
        whose object was garbage-collected unended, and an ``acquire_lease`` id, count
        until ``lease_max_age_ms``; a live ``Lease`` is renewed by its engine and never
        expires under its caller (SPEC 24.1)."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool: ...
    # keys and models
    def register_key(
        self,
        key_id: int,
        platform: str,
        *,
        base_url: str | None = None,
        label: str | None = None,
        enabled: bool = True,
        account: str | None = None,
    ) -> None:
        """Insert or update an API key. ``account`` names the provider-side unit that meters
        it (a Google Cloud project, a Groq organisation, an OpenRouter account): keys of one
        platform with the same account share every account-scope limit and the provider
        caps. ``None`` makes the key its own account (SPEC §14.3); an explicit account
        beginning with ``"key:"`` is a ValueError."""
    def key_account(self, platform: str, key_id: int) -> str:
        """The account in force for a key: ``"key:<key_id>"`` for a key of its own."""
    def set_key_concurrency_cap(self, platform: str, key_id: int, cap: int | None) -> None:
        """Configure the most requests the key may have in flight at once (SPEC 20);
        ``None`` forgets it. Persisted and shared by every engine on the store; the
        gate refuses at the lowest of it, the env cap and a learned cap. A key not yet
        registered is registered for ``platform``; a key registered for another
        platform, or a negative cap, is a ``ValueError``. Releases the GIL."""
    def key_concurrency_cap(self, platform: str, key_id: int) -> int | None:
        """The key concurrency cap in force: the lowest of the configured one
        (``set_key_concurrency_cap``), the env one
        (``MAX_CONCURRENT_REQUESTS_PER_KEY[_<PLATFORM>]``) and the one learned from
        concurrency failures (SPEC 15.4), ``None`` when there is none."""
    def set_model_limits(
        self,
        platform: str,
        model_id: str,
        *,
        rpm: int | None = None,
        rpd: int | None = None,
        tpm: int | None = None,
        tpd: int | None = None,
        monthly_token_budget: str | None = None,
        limits: Iterable[Limit] | None = None,
    ) -> None:
        """SPEC §4/§14.1: replaces the model's whole declaration, the classic keywords and
        ``limits=`` (an iterable of ``Limit``). Two limits on one (metric, window, scope), or a
        keyword and a ``Limit`` on the same window, are a ``ValueError``."""
    def set_model_prices(self, platform: str, model_id: str, prices: Prices | None) -> None:
        """SPEC 23.1: sets the model's prices (a ``Prices``), persisted and shared: every
        engine on the store sees them at its next call. ``None`` forgets them (the model
        then costs nothing)."""
    def model_prices(self, platform: str, model_id: str) -> Prices | None:
        """SPEC 23.1: the model's prices as held (dollars: pico-dollars / 10**6 per million
        tokens, / 10**12 per request); ``None`` when none are set."""
    def set_priority_reserve(self, priority: int, fraction: float) -> None:
        """SPEC 22.1: a call of priority ``priority`` or larger (up to the next configured
        one) leaves ``floor(limit * fraction)`` of every window, provider cap and
        concurrency cap free. Persisted and shared through the store. A negative
        priority or a fraction outside ``[0, 1)`` is a ``ValueError``."""
    def priority_reserve(self, priority: int) -> float:
        """SPEC 22.1: the reserve in force for a call of ``priority``, the fraction set for
        the largest configured priority ``<= priority`` (0.0 when none)."""
    def forecast(
        self, platform: str, model_id: str, key_id: int, *, lookback_ms: int = 600_000
    ) -> dict[str, int | None]:
        """SPEC 22.2: for each declared window of an hour or longer (keyed as ``usage()``
        keys them) and each daily provider cap (keyed ``provider_daily_requests``,
        ``provider_daily_tokens``), the time in epoch ms at which it would run out if
        the pace of the last ``lookback_ms`` went on; ``None`` when it would not before the
        window resets, or nothing was used lately."""
    def set_platform_calendar(self, platform: str, tz: str | None) -> None:
        """Sets the IANA zone of a platform's days (persisted, shared; wins over
        ``PROVIDER_DAY_TZ_<PLATFORM>`` and the built-in zone). ``None`` forgets it. An
        unknown zone is a ``ValueError``."""
    def platform_calendar(self, platform: str) -> str:
        """The IANA zone in force for a platform's days (``"UTC"`` unless set, in the
        environment, or built in: ``"google"`` is ``"America/Los_Angeles"``)."""
    def day_start_ms(self, platform: str, at_ms: int | None = None) -> int:
        """Start (ms) of the platform's day holding ``at_ms`` (default: now)."""
    def next_day_start_ms(self, platform: str, at_ms: int | None = None) -> int:
        """Start (ms) of the platform's day after the one holding ``at_ms`` (default: now)."""
    def model_limits(self, platform: str, model_id: str) -> Limits | None: ...
    def model_limit_list(self, platform: str, model_id: str) -> list[Limit]:
        """SPEC §14.1: every declared limit of the model, the classic ones included, in gate
        order (a classic one with ``per`` "minute" or "day")."""
    def set_platform_limits(self, platform: str, limits: Iterable[Limit]) -> None:
        """SPEC 23.3: replaces the limits that hold across every model of ``platform``
        (empty forgets them). Scope ``"account"`` counts every key of the key's account,
        ``"key"`` the key alone; a refusal's reason is ``"platform:<metric>/<per>"``. The
        gates run after the provider caps and before key concurrency. Persisted and
        shared through the store. Two limits for the same window and scope are a
        ``ValueError``, a value that is not a ``Limit`` a ``TypeError``; nothing is
        written then."""
    def platform_limits(self, platform: str) -> list[Limit]:
        """SPEC 23.3: the platform's limits in gate order (metric, window, scope), as
        declared; an empty list when none."""
    # tenants (SPEC 23.2)
    def set_tenant_limits(self, tenant: str, limits: Iterable[Limit], *, tz: str | None = None) -> None:
        """SPEC 23.2: replaces the limits of a tenant, or of each tenant a pattern matches
        (a name ending in ``*``: ``"*"``, ``"team:*"``; each matching tenant has its own
        windows, the longest pattern wins, a tenant's own declaration wins over any
        pattern); an empty ``limits`` forgets it. Every metric, ``cost`` included, with any
        ``per``, at scope ``"account"``; calendar periods start at 00:00 in ``tz`` (an IANA
        name; default UTC). Persisted and shared through the store; bad input is a
        ``ValueError``/``TypeError`` with nothing written."""
    def tenant_limits(self, tenant: str) -> list[Limit]:
        """SPEC 23.2: the limits in force for that name (its own declaration, else the
        longest matching pattern's), as declared, in gate order; a pattern's own
        declaration when given one; ``[]`` when none."""
    def tenant_usage(self, tenant: str) -> dict[str, dict[str, int]]:
        """SPEC 23.2: ``{"<metric>/<per>": {"used", "limit", "in_flight"}}``, one entry per
        limit in force for the tenant (µ$ for ``cost``; in flight: its live leases, their
        estimated tokens or the µ$ they reserve); ``{}`` without limits."""
    def tenants(self, since_ms: int | None = None) -> list[str]:
        """SPEC 23.2: the tenants named in a declaration (never a pattern) or with usage
        recorded since ``since_ms`` (default: 00:00 UTC today), sorted."""
    def _tenant_zone(self, tenant: str) -> str | None:
        """The IANA zone of the calendar periods of the declaration in force for a tenant
        (SPEC 23.2's ``tz``; its own, else its pattern's), ``None`` for UTC or none: where
        the LiteLLM proxy's ``x-ratelimit-reset-*`` count to (SPEC 25.3) and where
        ``analysis.plot_usage`` starts a tenant's calendar windows."""
    def _tenant_rows(self) -> tuple[int, list[dict[str, Any]]]:
        """SPEC 23.4's rows of ``snapshot().tenants``: ``(taken_at_ms, rows)``, one dict per
        limit in force of each tenant with limits or usage today (``tenant``, ``window``,
        ``used``, ``limit``, ``in_flight``, ``used_fraction``, ``exhausts_at_ms``)."""
    # usage
    def record_request(self, platform: str, model_id: str, key_id: int, *, tenant: _TenantArg = None) -> None:
        """SPEC §4: one request; with ``tenant`` (SPEC 23.2) it counts for those tenants too."""
    def record_tokens(
        self,
        platform: str,
        model_id: str,
        key_id: int,
        tokens: int | None = None,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        cached_tokens: int | None = None,
        tenant: _TenantArg = None,
    ) -> None:
        """SPEC §14.4: one call's tokens. ``tokens`` when not given is ``input_tokens +
        output_tokens``; ``cached_tokens`` (cache reads, part of the input) do not count in
        ``input_tokens`` windows. Giving none of the four is a ``TypeError``."""
    def usage(self, platform: str, model_id: str, key_id: int, limits: _LimitsArg = None) -> dict[str, Any]:
        """``{"rpm": {"used", "limit"}, "rpd": .., "tpm": .., "tpd": .., "in_flight": int}``, and
        one ``{"used", "limit"}`` per other declared limit, named by its reason (e.g.
        ``"requests/1s"``, ``"tokens/month"``)."""
    # gates
    def can_make_request(self, platform: str, model_id: str, key_id: int, limits: _LimitsArg = None) -> bool: ...
    def can_use_tokens(
        self, platform: str, model_id: str, key_id: int, estimated_tokens: int, limits: _LimitsArg = None
    ) -> bool: ...
    def can_use_provider(self, platform: str, key_id: int) -> bool: ...
    def can_use_provider_minute(self, platform: str, key_id: int) -> bool: ...
    def can_use_provider_tokens(self, platform: str, key_id: int, model_id: str, estimated_tokens: int) -> bool: ...
    def can_use_key_concurrency(self, platform: str, key_id: int) -> bool: ...
    def is_on_cooldown(self, platform: str, model_id: str, key_id: int) -> bool: ...
    def check(
        self, platform: str, model_id: str, key_id: int, estimated_tokens: int = 0, limits: _LimitsArg = None
    ) -> Admission:
        """Every gate in order; the first that fails names the reason."""
    # leases
    def acquire_lease(self, platform: str, model_id: str, key_id: int, estimated_tokens: int = 0) -> int:
        """Take a lease without checking any gate; returns its id."""
    def release_lease(self, lease_id: int) -> None:
        """Release a lease. Idempotent."""
    def lease(
        self,
        platform: str,
        model_id: str,
        key_id: int,
        estimated_tokens: int = 0,
        limits: _LimitsArg = None,
        *,
        estimated_output_tokens: int = 0,
        wait_s: float = 0.0,
        priority: int = 0,
        tenant: _TenantArg = None,
    ) -> Lease:
        """Run every gate and take the lease as one atomic step (across threads and
        processes sharing the file). Raises QuotaExceeded when a gate refuses. The estimate
        counts in ``tokens`` windows, less ``estimated_output_tokens`` in ``input_tokens``
        windows, and ``estimated_output_tokens`` in ``output_tokens`` windows. With
        ``wait_s``, waits up to that many seconds of real time for a gate to open (SPEC
        17.2): the GIL and the engine's lock released, first come first served among the
        waiters for the capacity that refused it, never held behind a wait for another
        (SPEC 24.5), raising at once when every refusal's retry time lies beyond the wait. A ``wait_s`` over
        10**12 s is an OverflowError. ``priority`` (SPEC 22.1; 0 the most important): every
        gate leaves ``floor(limit * priority_reserve(priority))`` free, and waiters of a
        smaller number are admitted first."""
    def lease_any(
        self,
        routes: Iterable[tuple[str, str, int]],
        estimated_tokens: int = 0,
        *,
        estimated_output_tokens: int = 0,
        strategy: Literal["headroom", "order", "spread"] = "headroom",
        wait_s: float = 0.0,
        priority: int = 0,
        tenant: _TenantArg = None,
        exclude: _ExcludeArg = None,
    ) -> Lease:
        """Choose a route and lease it in one atomic step (SPEC 17.1): every gate of every
        candidate (duplicates once), then among those that pass the one ``strategy``
        picks: ``"headroom"`` the most room left after this request, ``"order"`` the
        first, ``"spread"`` the one this engine leased least recently. When none passes
        (and ``wait_s`` runs out), QuotaExceeded with ``refusals``, one per candidate.
        ``priority`` as for ``lease()``; ``headroom`` scores with the priority's limits.
        ``exclude`` (SPEC 24.7): what the request already skipped, routes
        ``(platform, model_id, key_id)``, models ``(platform, model_id)`` and platforms
        ``(platform,)``; the candidates they cover are refused ``"excluded"`` unchecked."""
    def _lease_waiter(
        self,
        platform: str,
        model_id: str,
        key_id: int,
        estimated_tokens: int = 0,
        limits: _LimitsArg = None,
        *,
        estimated_output_tokens: int = 0,
        wait_s: float = 0.0,
        priority: int = 0,
        tenant: _TenantArg = None,
    ) -> _LeaseWaiter:
        """The stepper behind ``lease_async``."""
    def _lease_any_waiter(
        self,
        routes: Iterable[tuple[str, str, int]],
        estimated_tokens: int = 0,
        *,
        estimated_output_tokens: int = 0,
        strategy: Literal["headroom", "order", "spread"] = "headroom",
        wait_s: float = 0.0,
        priority: int = 0,
        tenant: _TenantArg = None,
        exclude: _ExcludeArg = None,
    ) -> _LeaseWaiter:
        """The stepper behind ``lease_any_async``."""
    # cooldowns
    def set_cooldown(
        self, platform: str, model_id: str, key_id: int, duration_ms: int = 60_000, source: _Source = "heuristic"
    ) -> None:
        """Bench a route (the operator's call: always overwrites)."""
    def cooldown(self, platform: str, model_id: str, key_id: int) -> Cooldown | None:
        """The route's bench: whichever of its own cooldown and its model's model-wide one
        (key_id None, SPEC 21.1) ends later; None when neither is active."""
    def active_cooldowns(self, key_ids: Iterable[int] | None = None) -> list[Cooldown]:
        """Active cooldowns, soonest expiry first. With ``key_ids``, those of these keys and
        the model-wide ones (key_id None) that block one of them: of a platform the key is
        registered on or has been used on."""
    def stored_cooldowns(self) -> list[Cooldown]:
        """Every cooldown the store holds, expired ones included until they are cleaned up
        (``cleanup_expired_cooldowns``), sorted by platform, model_id, key_id; an expired
        one has ``remaining_ms`` 0. What ``analysis.plot_cooldowns`` draws."""
    def clear_cooldowns_for_key(self, key_id: int) -> int: ...
    def clear_cooldown_early(self, platform: str, model_id: str, key_id: int) -> None: ...
    def cleanup_expired_cooldowns(self) -> int: ...
    def soonest_cooldown_expiry(self) -> int | None: ...
    def probeable_cooldowns(self) -> list[Cooldown]:
        """Active heuristic cooldowns (those the probe may clear), soonest first."""
    def cooldown_decision_for_limit(
        self,
        platform: str,
        model_id: str,
        key_id: int,
        limits: _LimitsArg = None,
        retry_after_ms: int | None = None,
        quota_signal: bool = True,
    ) -> CooldownDecision:
        """SPEC 6.1: decides (and counts hits and ladder steps) but sets no cooldown."""
    def record_failure(
        self,
        platform: str,
        model_id: str,
        key_id: int,
        *,
        status: int | None = None,
        retry_after: str | int | float | None = None,
        message: str | None = None,
        kind: _Kind | None = None,
        limits: _LimitsArg = None,
    ) -> FailureOutcome:
        """One call for any failure: infers the kind, benches the route (never shortening
        a later-expiring cooldown), learns a limit stated in ``message``. Records no usage.
        An ``"upstream"`` failure benches the model on every key of the platform instead
        (SPEC 21.1); a pool 429 teaches the account a provider cap (21.2)."""
    def learn_limit_from_error(self, platform: str, model_id: str, message: str | None) -> LearnedLimit | None:
        """Writes the stated limit only when it tightens the stored one; returns it then."""
    # observed provider quota
    def record_quota_headers(
        self,
        platform: str,
        key_id: int,
        headers: Mapping[str, str],
        *,
        model_id: str | None = None,
        status: int = 200,
    ) -> list[QuotaObservation]:
        """Reads x-ratelimit-*, anthropic-ratelimit-* and retry-after; merges into the state."""
    def quota_state(self) -> list[QuotaState]: ...
    def key_quota_headroom(self, platform: str) -> dict[int, float]:
        """key_id -> worst min(1, remaining/limit) over confident rows; cached up to 5 s."""
    # routing guardrail
    def model_window_used_fraction(
        self, platform: str, model_id: str, limits: _LimitsArg = None, key_id: int | None = None
    ) -> float | None:
        """The model's window use on its key with the most headroom, from a snapshot reused
        for ``window_usage_ttl_ms``; None without window limits or a routable key."""
    def invalidate_window_usage(self) -> None: ...
    # background probe
    def start_probe(
        self,
        validator: Callable[[int], object],
        *,
        interval_s: float = 60.0,
        max_per_pass: int | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> bool:
        """Start the background probe thread (True; a second call starts nothing and
        returns True); False with COOLDOWN_PROBE_DISABLED=1. ``validator(key_id)``
        returning True or "valid" is a pass. A coroutine validator needs ``loop``."""
    def stop_probe(self) -> None:
        """Stop the probe; returns promptly, also while a validator runs."""
    def run_probe_pass(
        self,
        validator: Callable[[int], object] | None = None,
        *,
        jitter: Callable[[], float] | None = None,
        max_probes: int | None = None,
    ) -> ProbePassResult:
        """One probe pass in the calling thread; ``validator=None`` uses the one given to
        ``start_probe`` (ValueError when there is none). Called from inside a pass of this
        engine (its validator, or what that calls) it raises
        ``RuntimeError("a probe pass is running")`` instead of waiting for itself."""
    # provider pools
    def provider_caps(self, platform: str) -> ProviderCaps: ...
    def set_provider_caps(
        self,
        platform: str,
        *,
        daily_requests: int | None = ...,
        minute_requests: int | None = ...,
        daily_tokens: int | None = ...,
    ) -> None:
        """An int sets a cap (0 refuses everything), None means no cap, an omitted
        argument keeps what is set. Persisted; wins over env and defaults."""
    def reset_provider_caps(self, platform: str) -> None: ...
    def learned_provider_caps(self, platform: str, key_id: int) -> ProviderCaps:
        """SPEC 21.2, 24.6: the provider caps learned for the key's account from pool
        429s (daily and minute requests; None where nothing was learned). They belong
        to the account: a key moved to another account reports that account's."""
    def provider_daily_request_count(self, platform: str, key_id: int) -> int: ...
    def provider_minute_request_count(self, platform: str, key_id: int) -> int: ...
    def provider_daily_token_count(self, platform: str, key_id: int) -> int: ...
    # analysis
    def usage_events(
        self,
        since_ms: int | None = None,
        until_ms: int | None = None,
        platform: str | None = None,
        model_id: str | None = None,
        key_id: int | None = None,
    ) -> list[dict[str, Any]]:
        """Usage rows with ``since_ms <= created_at_ms < until_ms``, oldest first: ``platform``,
        ``model_id``, ``key_id``, ``kind``, ``tokens`` (the total; 0 for a request), and
        ``input_tokens``, ``output_tokens``, ``cached_tokens`` (``None`` where the call did
        not report them), ``cost`` (micro-dollars at the prices in force when it was
        recorded, SPEC 23.1; 0 unpriced), ``tenants`` (the tenants it was served for, in the
        order given, SPEC 23.2; empty when none), ``created_at_ms``."""
    def server_logs(self, limit: int = 100) -> list[dict[str, Any]]:
        """``server_logs`` rows, newest first."""
    def stats(self) -> dict[str, Any]:
        """SPEC 27.1: this engine's counters since it was opened, kept in memory with no
        I/O (so per process): ``admitted`` {(platform, model_id): leases taken by
        ``lease``, ``lease_any`` and their async forms}, ``refused`` {reason:
        ``QuotaExceeded`` raised to a caller}, ``failures`` {(platform, kind): failures
        recorded by ``failure``, ``observe`` and ``record_failure``}, ``waits``
        {"count": calls that waited (a ``wait_s`` > 0, not admitted at once), "seconds":
        how long they waited in all}, ``degraded_s`` (seconds spent degraded) and
        ``buffered_writes`` (writes buffered now)."""
    def _metrics_read(self) -> dict[str, Any]:
        """SPEC 27.2: everything a scrape reads, read in one call with the GIL released,
        shaped as the collector's samples: a dict with ``now_ms``; one list of rows per
        gauge family, each row its label values (str) then its value (float): ``used`` and
        ``limit`` ``(platform, model_id, key, window, value)`` for each window of each route
        with usage today, a live lease or a cooldown (keyed as ``usage()`` keys them; no
        ``limit`` row for a window without a limit), ``in_flight`` ``(platform, model_id,
        key, leases)`` and ``exhausts`` ``(platform, model_id, key, seconds from now to the
        route's earliest forecast)`` for those routes (none when it has no forecast),
        ``cooldown`` ``(platform, model_id, key or "*" for a model-wide bench, source,
        seconds left)`` per active cooldown, ``tenant_used`` and ``tenant_limit`` ``(tenant,
        window, value)`` per tenant limit in force (``key`` is the key id as text, seconds
        are never negative); ``stats`` (as ``stats()``); ``wait_buckets``, the waits as
        cumulative ``(upper bound in seconds, count)``; and ``degraded``."""
    def _metrics_text(self) -> bytes:
        """SPEC 27.2's families in Prometheus' text format 0.0.4 (UTF-8 bytes): the same
        read as ``_metrics_read``, written by the ``prometheus-client`` crate, the GIL
        released for both."""
    def _debug_panic(self) -> None: ...
    def _inject_panics(self, n: int) -> None: ...
    def _pending_writes(self) -> int: ...
    def _snapshot_rows(self) -> tuple[int, list[dict[str, Any]]]: ...

def _before_fork() -> None: ...
def _after_fork_in_parent() -> None: ...
def _after_fork_in_child() -> None: ...
