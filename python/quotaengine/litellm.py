"""quotaengine in a LiteLLM ``Router`` (SPEC 20): two lines.

```python
import quotaengine.litellm as qel
plugin = qel.install(router, engine, wait_s=5)
```

From then on the engine chooses every deployment of the router: for a request to a
model group, ``lease_any`` over the group's deployments (each one a route) with the
prompt's token count plus ``max_tokens`` as the estimate; the lease travels with the
request (a token in its metadata) and ends exactly once, when LiteLLM logs the call's
success or failure (a stream when LiteLLM logs it complete) or when the caller's task
is cancelled. When every deployment refuses, the call raises ``litellm.RateLimitError``
with a ``retry-after`` header, so LiteLLM's fallbacks to other model groups still work.

Only LiteLLM's own extension points are used: its custom routing strategy
(``Router.register_plugin``, else ``set_custom_routing_strategy``) and its callbacks
(a ``CustomLogger``). Supported: LiteLLM 1.100 or later (tested with 1.110).

A derived route's key id is the deployment's credential (SPEC 25.1: two deployments on one
``api_key`` are one key); ``install(..., tenants=True)`` leases each request for its
tenants (SPEC 25.2, ``tenants_of``). In the LiteLLM proxy (SPEC 25.3) one config line,
``callbacks: ["quotaengine.litellm.proxy_handler"]``, does all of this on the proxy's
router, with the authenticated key's tenants and OpenAI's rate-limit headers
(``proxy_handler_for`` builds a handler with explicit options).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, cast
from urllib.parse import urlsplit

from ._errors import QuotaExceeded
from ._quotaengine import provider_hosts

if TYPE_CHECKING:
    from . import Lease, QuotaEngine

__all__ = [
    "QuotaEnginePlugin",
    "install",
    "derive_route",
    "key_id_of",
    "credential_key_id",
    "tenants_of",
    "key_tenants",
    "tenant_headers",
    "openai_duration",
    "proxy_handler_for",
]

Route = tuple[str, str, int]
# What a request skipped (SPEC 24.7): a route, a model (platform, model_id) or a platform.
Exclusion = tuple[str, str, int] | tuple[str, str] | tuple[str]
Strategy = Literal["headroom", "order", "spread"]

# SPEC 20: the platform of an api_base host, as the engine's provider table knows it.
_HOSTS = provider_hosts()
_GOOGLE_PROVIDERS = ("gemini", "vertex_ai")
# The metadata entry that carries a request's token: (plugin id, request number).
_META = "quotaengine"
_plugin_ids = itertools.count(1)
# How long a request's skips are kept after its last failure (its retries come sooner).
_SKIPS_KEPT_S = 600.0


def key_id_of(deployment_id: str) -> int:
    """A key id stable across processes and restarts: a 63-bit hash of the deployment's id."""
    digest = hashlib.blake2b(deployment_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def credential_key_id(platform: str, api_key: str) -> int:
    """SPEC 25.1: the key id of a credential: the top 63 bits of a blake2b hash of the
    platform and the API key, so deployments sharing one key are one key. It cannot be
    turned back into the key."""
    digest = hashlib.blake2b(f"{platform}\n{api_key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _provider_and_model(params: Mapping[str, Any]) -> tuple[str, str]:
    model = str(params.get("model") or "")
    provider = params.get("custom_llm_provider")
    head, sep, rest = model.partition("/")
    if isinstance(provider, str) and provider:
        return provider, rest if sep and head == provider else model
    if sep:
        return head, rest
    return "openai", model


def derive_route(deployment: Mapping[str, Any]) -> tuple[str, str, int]:
    """The route SPEC 20 derives for a deployment (a ``model_list`` entry): the platform
    from its provider and ``api_base`` host, the model id without the provider prefix,
    and the key id: a hash of the platform and the deployment's ``api_key`` (SPEC 25.1:
    deployments on one key are one key), else of ``model_info["id"]``."""
    params = deployment.get("litellm_params") or {}
    info = deployment.get("model_info") or {}
    provider, model_id = _provider_and_model(params)
    platform = provider
    base = params.get("api_base")
    if isinstance(base, str) and base:
        parts = urlsplit(base if "//" in base else "//" + base)
        host = (parts.hostname or "").lower()
        if host in _HOSTS:
            platform = _HOSTS[host]
        elif parts.port == 11434:
            platform = "ollama"
    elif provider in _GOOGLE_PROVIDERS:
        platform = "google"
    api_key = params.get("api_key")
    if isinstance(api_key, str) and api_key:
        return platform, model_id, credential_key_id(platform, api_key)
    return platform, model_id, key_id_of(str(info.get("id")))


class _Live:
    """One lease travelling with one attempt of a request."""

    __slots__ = ("lease", "deployment_id", "task", "callback")

    def __init__(self, lease: Lease, deployment_id: str) -> None:
        self.lease = lease
        self.deployment_id = deployment_id
        self.task: asyncio.Task[Any] | None = None
        self.callback: Any = None


class QuotaEnginePlugin:
    """What ``install`` put in a router: its routing strategy and its outcome logger.
    ``route_of(deployment_id)`` tells which route a deployment is; ``uninstall()``
    gives the router back its own routing and cooldowns."""

    def __init__(
        self,
        router: Any,
        engine: QuotaEngine,
        *,
        wait_s: float,
        strategy: str,
        routes: Mapping[str, Route],
        accounts: Mapping[str, str | None],
        tenants: bool = False,
    ) -> None:
        self._router = router
        self._tenants = tenants
        self._engine = engine
        #: The Prometheus collector ``install(..., metrics=)`` registered (SPEC 27.2).
        self.metrics: Any = None
        self._wait_s = wait_s
        self._strategy = cast(Strategy, strategy)
        self._routes = dict(routes)
        self._accounts = dict(accounts)
        self._explicit: dict[str, Route] = {}
        self._id = f"quotaengine-{next(_plugin_ids)}"
        self._requests = itertools.count(1)
        self._live: dict[tuple[str, int], list[_Live]] = {}
        # SPEC 24.7: what each request skipped, by its token, kept across LiteLLM's
        # retries of it (with when it last changed: a request gone is forgotten).
        self._skips: dict[tuple[str, int], tuple[float, set[Exclusion]]] = {}
        self._lock = threading.Lock()
        self._installed = False
        self._cooldowns_before: object = None
        self._logger: Any = None

    # ---- the public surface ----------------------------------------------------------

    def route_of(self, deployment_id: str) -> Route:
        """The route (platform, model_id, key_id) of a deployment; ``KeyError`` when the
        router has no deployment with that id."""
        route = self._routes.get(deployment_id)
        if route is None:
            deployment = self._deployment(deployment_id)
            if deployment is None:
                raise KeyError(deployment_id)
            route = self._route_for(deployment)
        return route

    @staticmethod
    def tenants_of(request: Mapping[str, Any] | None) -> list[str]:
        """SPEC 25.2: the tenants a request is leased for, in order:
        ``metadata["quotaengine_tenants"]`` (a str or a list of str), ``"end_user:<user>"``
        from the OpenAI ``user`` field, ``"tag:<tag>"`` for each of ``metadata["tags"]``, then
        those the proxy found on the authenticated key (25.3). A name given twice counts
        once."""
        return tenants_of(request)

    def uninstall(self) -> None:
        """Stop choosing: the router's own strategy and cooldowns come back, the outcome
        logger goes. Leases still travelling end as their calls end. Idempotent."""
        if not self._installed:
            return
        import litellm

        self._installed = False
        if self.metrics is not None and self.metrics.registry is not None:
            self.metrics.registry.unregister(self.metrics)
            self.metrics = None
        litellm.logging_callback_manager.remove_callback_from_all_lists(self._logger)
        router = self._router
        _restore_routing(router)
        _set_cooldowns_disabled(router, self._cooldowns_before)
        router._quotaengine_plugin = None

    # ---- LiteLLM's custom routing strategy -------------------------------------------

    def get_available_deployment(
        self,
        model: str,
        messages: list[dict[str, Any]] | None = None,
        input: Any = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """LiteLLM's sync pick: a lease on one of the group's deployments (waiting up to
        ``wait_s``), or ``litellm.RateLimitError``."""
        candidates, routes, estimate, output = self._request(
            model, messages, input, specific_deployment, request_kwargs
        )
        try:
            lease = self._engine.lease_any(routes, estimate, **self._lease_options(output, request_kwargs))
        except QuotaExceeded as refused:
            raise self._refusal(model, refused) from None
        except ValueError as bad:  # a tenant name the engine does not accept
            raise _bad_request(model, bad) from None
        return self._travel(lease, routes, candidates, request_kwargs, None)

    async def async_get_available_deployment(
        self,
        model: str,
        messages: list[dict[str, Any]] | None = None,
        input: Any = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """LiteLLM's async pick: as the sync one, waiting without blocking the loop."""
        candidates, routes, estimate, output = self._request(
            model, messages, input, specific_deployment, request_kwargs
        )
        try:
            lease = await self._engine.lease_any_async(routes, estimate, **self._lease_options(output, request_kwargs))
        except QuotaExceeded as refused:
            raise self._refusal(model, refused) from None
        except ValueError as bad:  # a tenant name the engine does not accept
            raise _bad_request(model, bad) from None
        return self._travel(lease, routes, candidates, request_kwargs, asyncio.current_task())

    def _lease_options(self, output: int | None, request_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        """The options of one request's lease, the same for the sync and async picks."""
        return {
            "estimated_output_tokens": output,
            "strategy": self._strategy,
            "wait_s": self._wait_s,
            "exclude": self._skipped(request_kwargs),
            "tenant": self.tenants_of(request_kwargs) if self._tenants else None,
        }

    def _request(
        self,
        model: str,
        messages: Any,
        input: Any,
        specific_deployment: bool | None,
        request_kwargs: Mapping[str, Any] | None,
    ) -> tuple[list[Mapping[str, Any]], list[Route], int, int]:
        """A request's candidates, their routes and its estimate (total, output)."""
        candidates = self._candidates(model, specific_deployment)
        routes = [self.route_of(_id_of(d)) for d in candidates]
        estimate, output = self._estimate(messages, input, request_kwargs)
        return candidates, routes, estimate, output

    async def _lease_chosen(self, kwargs: dict[str, Any]) -> None:
        """A request LiteLLM routed on its own (the strategy was dropped under the plugin):
        leased on the deployment LiteLLM chose, with its tenants, so it counts as any other
        (``litellm.RateLimitError`` when that deployment or a tenant has no room)."""
        params = kwargs.get("litellm_params")
        info = kwargs.get("model_info") or (params.get("model_info") if isinstance(params, Mapping) else None)
        deployment_id = info.get("id") if isinstance(info, Mapping) else None
        deployment = self._deployment(str(deployment_id)) if deployment_id is not None else None
        if deployment is None:
            return
        route = self.route_of(str(deployment_id))
        estimate, output = self._estimate(kwargs.get("messages"), kwargs.get("input"), kwargs)
        tenants = self.tenants_of(kwargs) if self._tenants else None
        try:
            lease = await self._engine.lease_any_async(
                [route], estimate, estimated_output_tokens=output, wait_s=self._wait_s, tenant=tenants
            )
        except QuotaExceeded as refused:
            raise self._refusal(str(kwargs.get("model") or route[1]), refused) from None
        self._travel(lease, [route], [deployment], kwargs, asyncio.current_task())

    # ---- outcomes (the logger calls these) ---------------------------------------------

    def _on_success(self, kwargs: Mapping[str, Any], response: Any) -> None:
        token = self._token_of(kwargs)
        live = self._take(kwargs)
        if live is not None:
            live.lease.observe(response)
        if token is not None:
            with self._lock:
                self._skips.pop(token, None)

    def _on_failure(self, kwargs: Mapping[str, Any]) -> None:
        token = self._token_of(kwargs)
        live = self._take(kwargs)
        if live is None:
            return
        exc = kwargs.get("exception")
        if isinstance(exc, BaseException):
            outcome = live.lease.observe(exc)
        else:  # LiteLLM logged a failure without its exception: nothing to learn from
            outcome = live.lease.failure(message=str(exc or "LiteLLM logged a failure"), kind="transport")
        skip = getattr(outcome, "skip", None)
        if token is not None and skip is not None:
            self._skip(token, live.lease, skip)

    # ---- what a request skipped (SPEC 24.7) ------------------------------------------

    def _skip(self, token: tuple[str, int], lease: Lease, skip: str) -> None:
        """Adds what a failed attempt skips to its request's exclusions."""
        entry: Exclusion
        if skip == "platform":
            entry = (lease.platform,)
        elif skip == "model":
            entry = (lease.platform, lease.model_id)
        else:
            entry = (lease.platform, lease.model_id, lease.key_id)
        now = time.monotonic()
        with self._lock:
            for t in [t for t, (at, _) in self._skips.items() if now - at > _SKIPS_KEPT_S]:
                del self._skips[t]
            _, skipped = self._skips.get(token, (now, set()))
            skipped.add(entry)
            self._skips[token] = (now, skipped)

    def _skipped(self, request_kwargs: Mapping[str, Any] | None) -> list[Exclusion] | None:
        """What the request of these kwargs (a retry) already skipped."""
        metadata = (request_kwargs or {}).get("metadata")
        token = metadata.get(_META) if isinstance(metadata, Mapping) else None
        if not (isinstance(token, tuple) and len(token) == 2 and token[0] == self._id):
            return None
        with self._lock:
            found = self._skips.get(token)
            return sorted(found[1], key=repr) if found else None

    # ---- the pieces -------------------------------------------------------------------

    def _deployment(self, deployment_id: str) -> Mapping[str, Any] | None:
        registry = getattr(self._router, "registry", None)
        if registry is not None:
            found = registry().deployment_dict(deployment_id)
        else:
            found = self._router.get_model_info(id=deployment_id)
        return found if isinstance(found, Mapping) else None

    def _route_for(self, deployment: Mapping[str, Any]) -> Route:
        route, account = _route_of(deployment, self._explicit)
        deployment_id = _id_of(deployment)
        if deployment_id not in self._routes:  # a deployment added after install
            self._engine.register_key(route[2], route[0], account=account)
            self._routes[deployment_id] = route
        return route

    def _candidates(self, model: str, specific_deployment: bool | None) -> list[Mapping[str, Any]]:
        group = _group(self._router, model)
        if not group and specific_deployment:
            one = self._deployment(model)
            group = [one] if one is not None else []
        if not group:
            from litellm.exceptions import BadRequestError

            raise BadRequestError(
                message=f"quotaengine: no deployment in model group {model!r}", model=model, llm_provider="quotaengine"
            )
        return group

    def _estimate(self, messages: Any, input: Any, request_kwargs: Mapping[str, Any] | None) -> tuple[int, int]:
        import litellm

        prompt = 0
        try:
            if messages:
                prompt = int(litellm.token_counter(messages=messages))
            elif isinstance(input, str):
                prompt = int(litellm.token_counter(text=input))
            elif isinstance(input, list):
                prompt = int(litellm.token_counter(text=" ".join(str(i) for i in input)))
        except Exception:  # noqa: BLE001 - a prompt the counter cannot read: no estimate
            prompt = 0
        output = 0
        kw = request_kwargs or {}
        for name in ("max_tokens", "max_completion_tokens"):
            v = kw.get(name)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                output = v
                break
        return prompt + output, output

    def _refusal(self, model: str, refused: Any) -> Exception:
        """LiteLLM's RateLimitError with a retry-after until the earliest retry time."""
        import httpx
        from litellm.exceptions import RateLimitError

        retry_at = [r.retry_at_ms for r in refused.refusals if r.retry_at_ms is not None]
        if retry_at:
            wait_ms = min(retry_at) - self._engine.now_ms()
            retry_after = max(1, math.ceil(wait_ms / 1000))
        else:
            retry_after = 1
        tenant_only = bool(refused.refusals) and all(getattr(r, "tenant", None) is not None for r in refused.refusals)
        if tenant_only:
            # Every candidate was refused by a tenant's limit: the caller's own limit.
            names = sorted({f"{r.tenant!r} ({self._limit_text(r.tenant, r.reason)})" for r in refused.refusals})
            message = f"quotaengine: tenant {' and tenant '.join(names)} is at its limit for {model!r}"
        else:
            reasons = ", ".join(
                f"{r.platform}/{r.model_id}/key {r.key_id}: "
                + (f"tenant {r.tenant!r} {self._limit_text(r.tenant, r.reason)}" if r.tenant is not None else r.reason)
                for r in refused.refusals
            )
            message = f"quotaengine: every deployment of {model!r} is at its limits ({reasons})"
        headers = {"retry-after": str(retry_after)}
        request = httpx.Request("POST", "http://quotaengine.invalid/")
        response = httpx.Response(429, headers=headers, request=request)
        error = RateLimitError(
            message=message,
            llm_provider="quotaengine",
            model=model,
            response=response,
            headers=headers,
        )
        error.quotaengine_refusal = refused  # type: ignore[attr-defined]  # the proxy's headers read it
        if tenant_only:
            # No deployment can serve the caller before its own window frees: LiteLLM must
            # answer now, not sleep `retry-after` and retry (it reads an error's
            # `num_retries`; with one deployment per group it would hold the client until
            # the window passed, then serve it past the moment the caller was refused).
            error.num_retries = 0
        return error

    def _limit_text(self, tenant: str, reason: str) -> str:
        """'requests/minute: 4' for a tenant's refusal reason 'tenant:requests/minute'."""
        window = reason.removeprefix("tenant:")
        try:
            for lim in self._engine.tenant_limits(tenant):
                if f"{lim.metric}/{lim.per}" == window:
                    return f"limit {lim.limit} {lim.metric} per {lim.per}"
        except Exception:  # noqa: BLE001 - the message only
            pass
        return f"limit {window}"

    def _travel(
        self,
        lease: Lease,
        routes: list[Route],
        candidates: list[Mapping[str, Any]],
        request_kwargs: dict[str, Any] | None,
        task: asyncio.Task[Any] | None,
    ) -> dict[str, Any]:
        picked = (lease.platform, lease.model_id, lease.key_id)
        deployment = candidates[routes.index(picked)]
        if request_kwargs is None:
            # Nobody to tell the outcome: the call is LiteLLM's own (never the Router's).
            lease.success(tokens=lease.estimated_tokens)
            return dict(deployment)
        metadata = request_kwargs.get("metadata")
        if not isinstance(metadata, dict):
            metadata = {}
            request_kwargs["metadata"] = metadata
        token = metadata.get(_META)
        if not (isinstance(token, tuple) and len(token) == 2 and token[0] == self._id):
            token = (self._id, next(self._requests))
            metadata[_META] = token
        live = _Live(lease, _id_of(deployment))
        with self._lock:
            self._live.setdefault(token, []).append(live)
        if task is not None:
            # A caller that cancels its task (wait_for's timeout included) ends the lease
            # as SPEC 18.4 says; a task that finishes otherwise leaves it to the logger.
            def cancelled(t: asyncio.Task[Any], token: tuple[str, int] = token, live: _Live = live) -> None:
                if t.cancelled() and self._take_live(token, live):
                    live.lease.observe(asyncio.CancelledError())

            live.task, live.callback = task, cancelled
            task.add_done_callback(cancelled)
        return dict(deployment)

    def _token_of(self, kwargs: Mapping[str, Any]) -> tuple[str, int] | None:
        params = kwargs.get("litellm_params") or {}
        for bucket in (params.get("metadata"), params.get("litellm_metadata"), kwargs.get("metadata")):
            if isinstance(bucket, Mapping):
                token = bucket.get(_META)
                if isinstance(token, tuple) and len(token) == 2 and token[0] == self._id:
                    return token
        return None

    def _take(self, kwargs: Mapping[str, Any]) -> _Live | None:
        """The live lease of the attempt LiteLLM logged, removed so that it ends once."""
        token = self._token_of(kwargs)
        if token is None:
            return None
        params = kwargs.get("litellm_params") or {}
        info = params.get("model_info") or kwargs.get("model_info") or {}
        deployment_id = info.get("id") if isinstance(info, Mapping) else None
        with self._lock:
            lives = self._live.get(token)
            if not lives:
                return None
            # The oldest live attempt on the deployment LiteLLM names (attempts of one
            # request run one after another); the oldest of all when it names none.
            live = next((x for x in lives if x.deployment_id == deployment_id), lives[0])
            lives.remove(live)
            if not lives:
                del self._live[token]
        self._forget_task(live)
        return live

    def _take_live(self, token: tuple[str, int], live: _Live) -> bool:
        with self._lock:
            lives = self._live.get(token)
            if not lives or live not in lives:
                return False
            lives.remove(live)
            if not lives:
                del self._live[token]
        return True

    @staticmethod
    def _forget_task(live: _Live) -> None:
        if live.task is not None:
            try:
                live.task.remove_done_callback(live.callback)
            except RuntimeError:  # noqa: PERF203 - its loop is gone
                pass
            live.task = live.callback = None


# SPEC 25.2: where a request names its tenants (the proxy stamps the key's under its own name).
TENANTS_META = "quotaengine_tenants"
KEY_TENANTS_META = "quotaengine_key_tenants"


def _metadata_buckets(request: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    found = []
    for name in ("metadata", "litellm_metadata"):
        bucket = request.get(name)
        if isinstance(bucket, Mapping):
            found.append(bucket)
    params = request.get("litellm_params")
    if isinstance(params, Mapping):
        for name in ("metadata", "litellm_metadata"):
            bucket = params.get(name)
            if isinstance(bucket, Mapping):
                found.append(bucket)
    return found


def _names(value: object) -> list[str]:
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value if isinstance(v, str) and v]
    return []


def tenants_of(request: Mapping[str, Any] | None) -> list[str]:
    """SPEC 25.2: the tenants a request (the kwargs of a Router call, or the proxy's
    request data) is served for, in order and each once: ``metadata["quotaengine_tenants"]``,
    ``"end_user:<user>"``, ``"tag:<tag>"`` for each of ``metadata["tags"]``, then the
    authenticated key's (``key:``, ``team:``, ``org:``, ``user:``) the proxy put there."""
    if not request:
        return []
    buckets = _metadata_buckets(request)
    given: list[str] = []
    for bucket in buckets:
        given += _names(bucket.get(TENANTS_META))
    user = request.get("user")
    if not (isinstance(user, str) and user):
        for bucket in buckets:
            u = bucket.get("user_api_key_end_user_id")
            if isinstance(u, str) and u:
                user = u
                break
    if isinstance(user, str) and user:
        given.append(f"end_user:{user}")
    for bucket in buckets:
        given += [f"tag:{t}" for t in _names(bucket.get("tags"))]
    for bucket in buckets:
        given += _names(bucket.get(KEY_TENANTS_META))
    return list(dict.fromkeys(given))


def _bad_request(model: str, error: Exception) -> Exception:
    from litellm.exceptions import BadRequestError

    return BadRequestError(message=f"quotaengine: {error}", model=model, llm_provider="quotaengine")


def _id_of(deployment: Mapping[str, Any]) -> str:
    return str((deployment.get("model_info") or {}).get("id"))


def _group(router: Any, model: str) -> list[Mapping[str, Any]]:
    registry = getattr(router, "registry", None)
    if registry is not None:
        found = registry().deployments(model, source="group")
    else:
        found = router.get_model_list(model_name=model)
    return [d for d in (found or []) if isinstance(d, Mapping)]


def _all_deployments(router: Any) -> list[Mapping[str, Any]]:
    registry = getattr(router, "registry", None)
    found = registry().deployments(source="group") if registry is not None else router.get_model_list()
    return [d for d in (found or []) if isinstance(d, Mapping)]


def _route_of(deployment: Mapping[str, Any], explicit: Mapping[str, Route]) -> tuple[Route, str | None]:
    """A deployment's route and account: ``routes`` given to install, else
    ``model_info["quotaengine"]``, else derived (SPEC 20). ValueError for a bad one."""
    deployment_id = _id_of(deployment)
    if deployment_id in explicit:
        return explicit[deployment_id], None
    params = deployment.get("litellm_params") or {}
    info = deployment.get("model_info") or {}
    given = info.get(_META)
    if given is None:
        return derive_route(deployment), None
    if not isinstance(given, Mapping):
        raise ValueError(f"deployment {deployment_id}: model_info['quotaengine'] must be a mapping, not {given!r}")
    platform, key_id, account = given.get("platform"), given.get("key_id"), given.get("account")
    if not isinstance(platform, str) or not platform:
        raise ValueError(f"deployment {deployment_id}: model_info['quotaengine']['platform'] must be a str")
    if not isinstance(key_id, int) or isinstance(key_id, bool):
        raise ValueError(f"deployment {deployment_id}: model_info['quotaengine']['key_id'] must be an int")
    if account is not None and (not isinstance(account, str) or not account):
        raise ValueError(f"deployment {deployment_id}: model_info['quotaengine']['account'] must be a str")
    model_id = given.get("model_id")
    if model_id is None:
        model_id = _provider_and_model(params)[1]
    elif not isinstance(model_id, str) or not model_id:
        raise ValueError(f"deployment {deployment_id}: model_info['quotaengine']['model_id'] must be a str")
    return (platform, model_id, key_id), account


def _check_route(name: str, route: object) -> Route:
    if (
        not isinstance(route, tuple)
        or len(route) != 3
        or not isinstance(route[0], str)
        or not route[0]
        or not isinstance(route[1], str)
        or not route[1]
        or not isinstance(route[2], int)
        or isinstance(route[2], bool)
    ):
        raise ValueError(f"routes[{name!r}] must be a (platform, model_id, key_id) tuple, not {route!r}")
    return route


def _declared(params: Mapping[str, Any], name: str) -> int | None:
    v = params.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        return None
    return v


def _import_limits(engine: QuotaEngine, deployment: Mapping[str, Any], route: Route) -> None:
    """SPEC 20: a deployment's rpm/tpm/rpd/tpd go to its route's limits where the engine
    knows nothing lower; max_parallel_requests to its key's concurrency cap."""
    from . import Limit

    params = deployment.get("litellm_params") or {}
    platform, model_id, key_id = route
    windows = {"rpm": ("requests", "minute"), "rpd": ("requests", "day"), "tpm": ("tokens", "minute")}
    windows["tpd"] = ("tokens", "day")
    declared = {name: _declared(params, name) for name in windows}
    if any(v is not None for v in declared.values()):
        current = engine.model_limit_list(platform, model_id)
        merged = list(current)
        for name, value in declared.items():
            if value is None:
                continue
            metric, per = windows[name]
            at = next(
                (i for i, lim in enumerate(merged) if (lim.metric, lim.per, lim.scope) == (metric, per, "account")),
                None,
            )
            if at is None:
                merged.append(Limit(metric, value, per))
            elif value < merged[at].limit:
                merged[at] = Limit(metric, value, per)
        if merged != current:
            engine.set_model_limits(platform, model_id, limits=merged)
    cap = _declared(params, "max_parallel_requests")
    if cap is not None:
        engine.set_key_concurrency_cap(platform, key_id, cap)


def _restore_routing(router: Any) -> None:
    """Gives the router its own strategy back: LiteLLM drops a custom strategy when the
    routing strategy changes, so it changes to another one and back."""
    settings = getattr(router, "settings", None)
    if callable(settings):
        from litellm.router_api import ChangeSet

        current = settings().routing_strategy or "simple-shuffle"
        other = "least-busy" if current != "least-busy" else "simple-shuffle"
        router.apply(ChangeSet(settings={"routing_strategy": other}))
        router.apply(ChangeSet(settings={"routing_strategy": current}))
    else:  # older LiteLLM: the strategy's picks were assigned over the router's own
        for name in ("get_available_deployment", "async_get_available_deployment"):
            router.__dict__.pop(name, None)


def _set_cooldowns_disabled(router: Any, value: object) -> object:
    """Sets the router's ``disable_cooldowns``; returns what it was."""
    settings = getattr(router, "settings", None)
    if callable(settings):
        before = settings().disable_cooldowns
        from litellm.router_api import ChangeSet

        router.apply(ChangeSet(assign={"disable_cooldowns": value}))
        return before
    before = getattr(router, "disable_cooldowns", None)
    router.disable_cooldowns = value
    return before


def _make_logger(plugin: QuotaEnginePlugin) -> Any:
    """The outcome logger of one plugin. LiteLLM keeps one logger per class and public
    attributes: ``plugin_id`` tells this one from another router's."""
    from litellm.integrations.custom_logger import CustomLogger

    class QuotaEngineLogger(CustomLogger):
        def __init__(self) -> None:
            super().__init__()
            self.plugin_id = plugin._id

        def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
            plugin._on_success(kwargs, response_obj)

        def log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
            plugin._on_failure(kwargs)

        async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
            plugin._on_success(kwargs, response_obj)

        async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
            plugin._on_failure(kwargs)

        # The deployment hooks run inside the call, before it returns (the log events
        # above run later, on a task of their own): the engine learns from a failure
        # before the next request is chosen. A stream never reaches the success hook.
        async def async_post_call_success_deployment_hook(
            self, request_data: Any, response: Any, call_type: Any
        ) -> Any:
            if isinstance(request_data, dict) and not request_data.get("stream"):
                plugin._on_success(request_data, response)
            return response

        async def async_post_call_failure_deployment_hook(
            self, request_data: Any, exception: Any, call_type: Any, fallback_depth: Any = None
        ) -> None:
            if isinstance(request_data, Mapping):
                plugin._on_failure({**request_data, "exception": exception})

    return QuotaEngineLogger()


def install(
    router: Any,
    engine: QuotaEngine,
    *,
    wait_s: float = 0.0,
    strategy: str = "headroom",
    routes: Mapping[str, Route] | None = None,
    import_limits: bool = True,
    tenants: bool = False,
    metrics: Any = None,
) -> QuotaEnginePlugin:
    """Make ``engine`` choose every deployment of ``router`` (a ``litellm.Router``).

    Each deployment is a route: ``routes[model_info["id"]]``, else
    ``model_info["quotaengine"]`` (``platform``, ``key_id``, ``account``), else derived
    from its provider and ``api_base`` (SPEC 20). Each key is registered with its
    account; with ``import_limits`` a deployment's ``rpm``/``tpm``/``rpd``/``tpd`` and
    ``max_parallel_requests`` go to the engine where it knows nothing lower. A bad
    set-up (a ``routes`` entry naming no deployment, a malformed
    ``model_info["quotaengine"]``, a second ``install`` on one router) is a
    ``ValueError`` before anything changes.

    With ``tenants=True`` each request is leased for its tenants too (SPEC 25.2:
    ``metadata["quotaengine_tenants"]``, ``"end_user:<user>"`` from ``user``,
    ``"tag:<tag>"`` from ``metadata["tags"]``), so the tenants' limits
    (``engine.set_tenant_limits``) hold in the same atomic lease; a refusal by a tenant's
    limit is a ``litellm.RateLimitError`` naming the tenant and the limit.

    With ``metrics`` (SPEC 27.2) a ``quotaengine.metrics.Collector`` of ``engine`` is
    registered: ``True`` in ``prometheus_client.REGISTRY`` (the default registry, which
    ``prometheus_client.start_http_server`` serves), or in the
    ``prometheus_client.CollectorRegistry`` given; ``uninstall()`` unregisters it.
    ``plugin.metrics`` is the collector (``None`` without)."""
    import litellm  # the extra: pip install quotaengine[litellm]

    from . import metrics as _metrics

    if getattr(router, "_quotaengine_plugin", None) is not None:
        raise ValueError("quotaengine is already installed on this router: uninstall() it first")
    if not isinstance(strategy, str) or strategy not in ("headroom", "order", "spread"):
        raise ValueError(f"strategy must be 'headroom', 'order' or 'spread', not {strategy!r}")
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not math.isfinite(wait_s) or wait_s < 0:
        raise ValueError(f"wait_s must be a finite number >= 0, not {wait_s!r}")
    _metrics.check_target(metrics)
    deployments = _all_deployments(router)
    ids = {_id_of(d) for d in deployments}
    explicit: dict[str, Route] = {}
    for name, route in (routes or {}).items():
        if name not in ids:
            raise ValueError(f"routes names {name!r}, which is no deployment of this router")
        explicit[name] = _check_route(name, route)
    # Every route first (a bad one raises before anything is changed), then the writes.
    found: dict[str, Route] = {}
    accounts: dict[str, str | None] = {}
    for d in deployments:
        route, account = _route_of(d, explicit)
        found[_id_of(d)] = route
        accounts[_id_of(d)] = account
    for d in deployments:
        deployment_id = _id_of(d)
        platform, _model, key_id = found[deployment_id]
        engine.register_key(key_id, platform, account=accounts[deployment_id])
        if import_limits:
            _import_limits(engine, d, found[deployment_id])
    plugin = QuotaEnginePlugin(
        router, engine, wait_s=float(wait_s), strategy=strategy, routes=found, accounts=accounts, tenants=bool(tenants)
    )
    plugin._explicit = explicit
    plugin._logger = _make_logger(plugin)
    litellm.logging_callback_manager.add_litellm_callback(plugin._logger)
    register = getattr(router, "register_plugin", None)
    if register is not None:
        register(plugin)
    else:
        router.set_custom_routing_strategy(plugin)
    # The engine benches a deployment once: LiteLLM's own cooldowns are off.
    plugin._cooldowns_before = _set_cooldowns_disabled(router, True)
    router._quotaengine_plugin = plugin
    plugin._installed = True
    plugin.metrics = _metrics.register(engine, metrics)
    return plugin


# ---- the LiteLLM proxy (SPEC 25.3) --------------------------------------------------------

_PROXY_ADMIN = "default_user_id"  # LiteLLM's placeholder user id: names no tenant
_MASTER_KEY_ALIAS = "litellm_proxy_master_key"  # what the proxy puts for its master key
_TOKEN_METRICS = ("tokens", "input_tokens", "output_tokens")


def _flag(name: str, default: bool) -> bool:
    import os

    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be 1 or 0, not {raw!r}")


def _check_location(location: str) -> str:
    if location.strip() == "" or location.strip().startswith(":memory:"):
        raise ValueError(
            f"QUOTAENGINE_DB={location!r}: the proxy's workers must share one engine, a file or a "
            "redis:// URL (':memory:' would give each worker limits of its own)"
        )
    return location


def openai_duration(ms: int) -> str:
    """A duration as OpenAI's ``x-ratelimit-reset-*`` headers write it: ``"1s"``,
    ``"6m0s"``, ``"1h2m3s"`` (whole seconds, rounded up; ``"0s"`` for none)."""
    s = max(0, math.ceil(ms / 1000))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{h}h{m}m{sec}s"
    if m:
        return f"{m}m{sec}s"
    return f"{sec}s"


_WIDTHS_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _reset_ms(per: str, now_ms: int, tz: str | None = None) -> int:
    """How long until a window of ``per`` holding usage now is empty again: its width for a
    sliding window, the start of the next period for a calendar one (an upper bound): 00:00
    local time in ``tz`` (SPEC 23.2's zone of the tenant's declaration; UTC when ``None``),
    weeks starting on Monday, months on the 1st."""
    import datetime as dt

    if per == "minute":
        return 60_000
    if per in ("day", "week", "month"):
        zone: dt.tzinfo = dt.timezone.utc
        if tz is not None:
            from zoneinfo import ZoneInfo

            zone = ZoneInfo(tz)
        now = dt.datetime.fromtimestamp(now_ms / 1000, tz=zone)
        today = now.date()
        if per == "day":
            nxt = today + dt.timedelta(days=1)
        elif per == "week":
            nxt = today + dt.timedelta(days=7 - today.weekday())
        else:
            nxt = (today.replace(day=1) + dt.timedelta(days=32)).replace(day=1)
        # Midnight of that local date (wall-clock arithmetic: a day may be 23 or 25 hours).
        start = dt.datetime(nxt.year, nxt.month, nxt.day, tzinfo=zone)
        return max(0, int(start.timestamp() * 1000) - now_ms)
    unit = _WIDTHS_MS.get(per[-1:])
    try:
        return int(per[:-1]) * unit if unit else 0
    except ValueError:
        return 0


def tenant_headers(engine: QuotaEngine, tenants: list[str]) -> dict[str, str]:
    """SPEC 25.3: OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for the
    tightest limit of each kind over ``tenants`` (the least room left, live leases
    counted); ``{}`` for a kind no tenant limits."""
    best: dict[str, tuple[int, int, int]] = {}  # kind -> (room, limit, reset_ms)
    now = engine.now_ms()
    for tenant in tenants:
        usage = engine.tenant_usage(tenant)
        tz = engine._tenant_zone(tenant) if usage else None  # its calendar periods' zone (23.2)
        for window, row in usage.items():
            metric, _, per = window.partition("/")
            kind = "requests" if metric == "requests" else "tokens" if metric in _TOKEN_METRICS else None
            if kind is None:
                continue
            limit, used, in_flight = int(row["limit"]), int(row["used"]), int(row["in_flight"])
            room = limit - used - in_flight
            if kind not in best or (room, limit) < best[kind][:2]:
                reset = _reset_ms(per, now, tz) if used + in_flight > 0 else 0
                best[kind] = (room, limit, reset)
    headers: dict[str, str] = {}
    for kind, (room, limit, reset) in best.items():
        headers[f"x-ratelimit-limit-{kind}"] = str(limit)
        headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, room))
        headers[f"x-ratelimit-reset-{kind}"] = openai_duration(reset)
    return headers


def key_tenants(user_api_key_dict: Any, master_key: str | None = None) -> list[str]:
    """SPEC 25.2: the tenants of LiteLLM's authenticated key (a ``UserAPIKeyAuth``):
    ``key:<alias, else the hashed key>``, ``team:``, ``org:``, ``user:``. The master key and
    LiteLLM's placeholder user id name none."""
    if user_api_key_dict is None:
        return []

    def field(name: str) -> str | None:
        v = getattr(user_api_key_dict, name, None)
        return v if isinstance(v, str) and v else None

    api_key, token = field("api_key"), field("token")
    master = {_MASTER_KEY_ALIAS}
    if master_key:
        master |= {master_key, hashlib.sha256(master_key.encode()).hexdigest()}
    found: list[str] = []
    if not master & {api_key, token, field("key_alias")}:
        key = field("key_alias") or token
        if key is not None:
            found.append(f"key:{key}")
    for prefix, name in (("team", "team_id"), ("org", "org_id"), ("user", "user_id")):
        v = field(name)
        if v is not None and v != _PROXY_ADMIN:
            found.append(f"{prefix}:{v}")
    return found


def _proxy_router() -> Any:
    try:
        from litellm.proxy import proxy_server
    except Exception:  # noqa: BLE001 - not in the proxy
        return None
    return getattr(proxy_server, "llm_router", None)


def _proxy_master_key() -> str | None:
    try:
        from litellm.proxy import proxy_server
    except Exception:  # noqa: BLE001 - not in the proxy
        return None
    key = getattr(proxy_server, "master_key", None)
    return key if isinstance(key, str) and key else None


def _make_proxy_handler_class() -> type:
    from litellm.integrations.custom_logger import CustomLogger

    class QuotaEngineProxyHandler(CustomLogger):
        """SPEC 25.3: quotaengine in the LiteLLM proxy, as a callback. It installs the
        plugin (``install``, with tenants) on the proxy's router at the first request and
        again whenever the router was replaced or its routing strategy changed; stamps the
        authenticated key's tenants into each request; answers with OpenAI's rate-limit
        headers for the tightest tenant limits."""

        def __init__(
            self,
            engine: QuotaEngine | None = None,
            *,
            location: str | None = None,
            wait_s: float = 0.0,
            strategy: str = "headroom",
            tenants: bool = True,
            headers: bool = True,
        ) -> None:
            super().__init__()
            self.quotaengine_location = location
            self.quotaengine_options = {"wait_s": wait_s, "strategy": strategy, "tenants": tenants}
            self.quotaengine_headers = headers
            self._qe_engine = engine
            self._qe_pid = 0
            self._qe_plugin: QuotaEnginePlugin | None = None
            self._qe_lock = threading.Lock()
            self._qe_stale = False

        # ---- the engine and the plugin ----------------------------------------------

        @property
        def engine(self) -> QuotaEngine:
            """The engine, opened in this process at its first use (never forked open)."""
            import os

            with self._qe_lock:
                if self._qe_engine is None or (self.quotaengine_location is not None and self._qe_pid != os.getpid()):
                    from . import QuotaEngine

                    self._qe_engine = QuotaEngine(_check_location(self.quotaengine_location or "./quota.db"))
                    self._qe_pid = os.getpid()
                    self._qe_plugin = None
                return self._qe_engine

        @property
        def plugin(self) -> QuotaEnginePlugin | None:
            """The plugin installed on the proxy's router (``None`` before the first request)."""
            return self._qe_plugin

        def ensure_installed(self, router: Any = None, *, again: bool = False) -> QuotaEnginePlugin | None:
            """Installs the plugin on ``router`` (the proxy's ``llm_router`` by default) when it
            is not installed there, or ``again``: uninstalling first."""
            router = router if router is not None else _proxy_router()
            if router is None:
                return None
            engine = self.engine
            with self._qe_lock:
                plugin = self._qe_plugin
                if plugin is not None and plugin._router is router and plugin._installed and not again:
                    return plugin
                if plugin is not None:
                    plugin.uninstall()
                stale = getattr(router, "_quotaengine_plugin", None)
                if stale is not None:
                    stale.uninstall()
                opts = self.quotaengine_options
                self._qe_plugin = install(
                    router,
                    engine,
                    wait_s=float(opts["wait_s"]),  # type: ignore[arg-type]
                    strategy=str(opts["strategy"]),
                    tenants=bool(opts["tenants"]),
                )
                return self._qe_plugin

        # ---- LiteLLM's hooks ----------------------------------------------------------

        async def async_pre_call_hook(
            self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
        ) -> Any:
            self.ensure_installed()
            if self.quotaengine_options["tenants"] and isinstance(data, dict):
                found = key_tenants(user_api_key_dict, _proxy_master_key())
                if found:
                    metadata = data.get("metadata")
                    if not isinstance(metadata, dict):
                        metadata = {}
                        data["metadata"] = metadata
                    metadata[KEY_TENANTS_META] = found
            return data

        async def async_filter_deployments(
            self,
            model: str,
            healthy_deployments: list[dict[str, Any]],
            messages: Any,
            request_kwargs: dict[str, Any] | None = None,
            parent_otel_span: Any = None,
        ) -> list[dict[str, Any]]:
            # LiteLLM's own routing ran: the plugin's strategy was dropped under it.
            if self._qe_plugin is not None:
                self._qe_stale = True
            return healthy_deployments

        async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any], call_type: Any) -> dict[str, Any] | None:
            plugin = self._qe_plugin
            # A request LiteLLM routed on its own (no token of the plugin's): the strategy
            # was dropped under it (a routing-strategy change, a router replaced).
            if plugin is not None and plugin._token_of(kwargs) is None:
                self._qe_stale = True
            if self._qe_stale:
                self._qe_stale = False
                plugin = self.ensure_installed(again=True)
                if plugin is not None and plugin._token_of(kwargs) is None:
                    await plugin._lease_chosen(kwargs)
            return None

        async def async_post_call_response_headers_hook(
            self,
            data: dict[str, Any],
            user_api_key_dict: Any,
            response: Any,
            request_headers: dict[str, str] | None = None,
            litellm_call_info: dict[str, object] | None = None,
        ) -> dict[str, str] | None:
            # Tenants off, the handler leases no tenant: no limit of one is reported as if
            # it held this request (SPEC 25.3: the headers of "a request with tenants").
            if not self.quotaengine_headers or not self.quotaengine_options["tenants"] or not isinstance(data, dict):
                return None
            found = tenants_of(data)
            if not found:
                return None
            try:
                return tenant_headers(self.engine, found) or None
            except Exception:  # noqa: BLE001 - headers never fail a response
                return None

    return QuotaEngineProxyHandler


_handler_class: type | None = None


def _handler_cls() -> type:
    global _handler_class
    if _handler_class is None:
        _handler_class = _make_proxy_handler_class()
    return _handler_class


def proxy_handler_for(
    engine: QuotaEngine | None = None,
    *,
    wait_s: float | None = None,
    strategy: str | None = None,
    tenants: bool = True,
    headers: bool = True,
    metrics: Any = None,
) -> Any:
    """SPEC 25.3: a ``QuotaEngineProxyHandler`` (a LiteLLM ``CustomLogger``) for a callback
    file of one's own: ``engine`` (else ``QuotaEngine($QUOTAENGINE_DB)``, opened in each
    worker at its first request), ``wait_s`` and ``strategy`` as for ``install`` (else
    ``$QUOTAENGINE_WAIT_S``, ``$QUOTAENGINE_STRATEGY``), ``tenants`` (25.2) and ``headers``
    (OpenAI's rate-limit headers for the tightest tenant limits). With ``metrics`` (SPEC
    27.2) a ``quotaengine.metrics.Collector`` of the handler's engine (opened at the first
    scrape when no request came before) is registered: ``True`` in
    ``prometheus_client.REGISTRY`` (the default registry, the one the proxy's own
    ``/metrics`` serves when its Prometheus callback is on), or in the
    ``prometheus_client.CollectorRegistry`` given; ``handler.quotaengine_metrics`` is the
    collector (``None`` without)."""
    import os

    from . import metrics as _metrics

    _metrics.check_target(metrics)
    if wait_s is None:
        raw = os.environ.get("QUOTAENGINE_WAIT_S", "").strip()
        try:
            wait_s = float(raw) if raw else 0.0
        except ValueError:
            raise ValueError(f"QUOTAENGINE_WAIT_S must be a number of seconds, not {raw!r}") from None
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not math.isfinite(wait_s) or wait_s < 0:
        raise ValueError(f"wait_s must be a finite number >= 0, not {wait_s!r}")
    if strategy is None:
        strategy = os.environ.get("QUOTAENGINE_STRATEGY", "").strip() or "headroom"
        if strategy not in ("headroom", "order", "spread"):
            raise ValueError(f"QUOTAENGINE_STRATEGY must be headroom, order or spread, not {strategy!r}")
    if strategy not in ("headroom", "order", "spread"):
        raise ValueError(f"strategy must be 'headroom', 'order' or 'spread', not {strategy!r}")
    location = None
    if engine is None:
        location = _check_location(os.environ.get("QUOTAENGINE_DB", "").strip() or "./quota.db")
    handler = _handler_cls()(
        engine, location=location, wait_s=float(wait_s), strategy=strategy, tenants=tenants, headers=headers
    )
    handler.quotaengine_metrics = _metrics.register(_metrics.Collector._of(lambda: handler.engine), metrics)
    return handler


def __getattr__(name: str) -> Any:
    """``proxy_handler`` (SPEC 25.3: the one config line) and ``QuotaEngineProxyHandler`` are
    made at first use, so that importing this module needs no LiteLLM."""
    if name == "QuotaEngineProxyHandler":
        return _handler_cls()
    if name == "proxy_handler":
        handler = proxy_handler_for(
            tenants=_flag("QUOTAENGINE_TENANTS", True), headers=_flag("QUOTAENGINE_HEADERS", True)
        )
        globals()["proxy_handler"] = handler
        return handler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
