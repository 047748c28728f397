"""``Lease.observe`` (SPEC 16): one call per response, duck-typed over the objects a
router already holds. No HTTP or SDK package is imported: an object is recognised by
its shape.

* an HTTP response (an int ``status_code`` and a ``headers`` mapping: httpx, requests,
  the OpenAI and Anthropic SDKs' ``with_raw_response`` objects): its rate-limit headers
  are recorded for the lease's route, then a 2xx is a success with the token counts of
  the JSON body's ``usage``, anything else a failure with the status, the
  ``Retry-After`` header and the body;
* an exception with a ``response`` of that shape (``openai.APIStatusError``,
  ``anthropic.APIStatusError``, ``httpx.HTTPStatusError``): the same for its response;
* an exception without a status: a failure of kind ``"timeout"`` (a timeout type, or
  a message naming one) or ``"transport"``;
* a parsed completion, or a dict, with a ``usage`` member: a success with its counts
  (and the rate-limit headers LiteLLM keeps in ``_hidden_params["additional_headers"]``);
* LiteLLM's exceptions (SPEC 20): the status, the headers of ``litellm_response_headers``
  (else of the response), the body of the response, else the message without LiteLLM's
  ``litellm.X: X: ...Exception - `` prefix; a connection error anywhere in the cause
  chain is ``"transport"``, a timeout ``"timeout"``;
* a ``BaseException`` that is not an ``Exception`` (a cancelled task, Ctrl-C): it says
  nothing about the provider; the lease ends as leaving its ``with`` block does (SPEC 18.4).

``observe`` is all or nothing: everything is read before anything is recorded, so an
object it cannot read raises ``TypeError`` with nothing recorded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._quotaengine import FailureOutcome, Lease

# What is read of a body: an error message as far as the parsers look (1 MiB, SPEC
# 24.6: what a provider writes is read), a success body as far as a completion with
# its usage reasonably goes.
MESSAGE_BYTES = 1024 * 1024
BODY_BYTES = 1024 * 1024
_MISSING = object()
# Token counts a success may record (SPEC 18.4): ints in 0..2**63.
_MAX_COUNT = 2**63 - 1
# LiteLLM's message prefix: "litellm.RateLimitError: RateLimitError: GroqException - ".
_LITELLM_PREFIX = re.compile(r"^litellm\.\w+:\s*(?:\w+:\s*)?(?:[\w.]+Exception\s*-\s*)?")
# What the Router appends to the message of the exception it raises.
_LITELLM_SUFFIX = re.compile(r"\s*\nLiteLLM: model group .*\Z", re.S)


def observe(lease: Lease, outcome: object, tokens: int | None = None) -> FailureOutcome | None:
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)):
        raise TypeError(f"tokens must be an int or None, not {type(tokens).__name__}")
    if tokens is not None and tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
        # Cancelled, interrupted, exiting: nothing about the provider (SPEC 18.4).
        lease._success_estimate()
        return None
    if isinstance(outcome, BaseException) and _is_litellm(outcome):
        return _observe_litellm(lease, outcome)
    response = _response_of(outcome)
    if response is not None:
        return _observe_response(lease, response, tokens)
    if isinstance(outcome, BaseException):
        message = str(outcome) or type(outcome).__name__
        if _is_timeout(outcome):
            return lease.failure(message=message, kind="timeout")
        return lease.failure(message=message, kind="transport")
    usage = _field_or_missing(outcome, "usage")
    if usage is not _MISSING:
        counts = _safe_counts(usage)
        headers = _hidden_headers(outcome)
        if headers:
            lease._record_quota_headers(headers, 200)
        _succeed(lease, counts, tokens)
        return None
    raise TypeError(
        "observe() takes an HTTP response (status_code and headers), an exception (with a response, or "
        f"without a status), or a completion or dict with a usage member; got {type(outcome).__name__}"
    )


def _is_response(obj: object) -> bool:
    status = getattr(obj, "status_code", None)
    headers = getattr(obj, "headers", None)
    return isinstance(status, int) and not isinstance(status, bool) and _is_mapping(headers)


def _is_mapping(obj: object) -> bool:
    return isinstance(obj, Mapping) or (hasattr(obj, "items") and hasattr(obj, "get"))


def _response_of(outcome: object) -> Any:
    """The HTTP response an outcome is or carries (an SDK's status error), else None."""
    if not isinstance(outcome, BaseException) and _is_response(outcome):
        return outcome
    if isinstance(outcome, BaseException):
        response = getattr(outcome, "response", None)
        if response is not None and _is_response(response):
            return response
    return None


def _field_or_missing(outcome: object, name: str) -> object:
    try:
        if isinstance(outcome, Mapping):
            return outcome.get(name, _MISSING)
        return getattr(outcome, name, _MISSING)
    except Exception:  # noqa: BLE001 - a property that raises: not a usage to read
        return _MISSING


def _headers_of(obj: object) -> dict[str, str]:
    """A headers mapping as str to str; TypeError when it cannot be read."""
    try:
        return {str(k): str(v) for k, v in obj.items()}  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - all or nothing (SPEC 18.4)
        raise TypeError(f"observe() could not read the response headers: {exc!r}") from None


def _observe_response(lease: Lease, response: Any, tokens: int | None) -> FailureOutcome | None:
    status: int = response.status_code
    headers = _headers_of(response.headers)
    if 200 <= status < 300:
        counts = _safe_counts(_usage_of_body(response))
        lease._record_quota_headers(headers, status)
        _succeed(lease, counts, tokens)
        return None
    message = _text(response, MESSAGE_BYTES)
    # The headers go with the failure too: a pool 429 states its cap there (SPEC 21.2).
    return lease._failure_with_headers(headers, status=status, retry_after=_retry_after(headers), message=message)


def _retry_after(headers: Mapping[str, str]) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == "retry-after"), None)


def _is_litellm(exc: BaseException) -> bool:
    return type(exc).__module__.split(".", 1)[0] == "litellm" or hasattr(exc, "litellm_response_headers")


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes and contexts (bounded: a chain may loop)."""
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(out) < 16 and all(cur is not e for e in out):
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _is_connection_error(exc: BaseException) -> bool:
    names = ("apiconnectionerror", "connecterror", "connectionerror", "remoteprotocolerror")
    return isinstance(exc, ConnectionError) or any(t.__name__.lower() in names for t in type(exc).__mro__)


def _litellm_message(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc)
    return _LITELLM_SUFFIX.sub("", _LITELLM_PREFIX.sub("", text, count=1))


def _observe_litellm(lease: Lease, exc: BaseException) -> FailureOutcome | None:
    """A LiteLLM exception (SPEC 20): LiteLLM's own shapes first, then as an SDK error."""
    chain = _chain(exc)
    message = _litellm_message(exc)
    if any(_is_timeout_type(e) for e in chain):
        return lease.failure(message=message, kind="timeout")
    if any(_is_connection_error(e) for e in chain) or "connection error" in message.lower():
        return lease.failure(message=message, kind="transport")
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int) or isinstance(status, bool):
        return lease.failure(message=message, kind="timeout" if _is_timeout(exc) else "transport")
    response = getattr(exc, "response", None)
    if response is not None and not _is_response(response):
        response = None
    raw = getattr(exc, "litellm_response_headers", None)
    if raw is not None and _is_mapping(raw):
        headers = _headers_of(raw)
    elif response is not None:
        headers = _headers_of(response.headers)
    else:
        headers = {}
    # The groq/ provider's `.response` is an empty stand-in: its body is the message.
    body = _text(response, MESSAGE_BYTES) if response is not None else None
    if not body:
        body = message
    if 200 <= status < 300:  # not an error after all
        lease._record_quota_headers(headers, status)
        _succeed(lease, None, None)
        return None
    return lease._failure_with_headers(headers, status=status, retry_after=_retry_after(headers), message=body)


def _hidden_headers(outcome: object) -> dict[str, str]:
    """The provider's rate-limit headers LiteLLM keeps on a response
    (``_hidden_params["additional_headers"]``): its raw ``llm_provider-*`` copies first."""
    hidden = _field_or_missing(outcome, "_hidden_params")
    if not isinstance(hidden, Mapping):
        return {}
    extra = hidden.get("additional_headers")
    if not _is_mapping(extra):
        return {}
    headers = _headers_of(extra)
    raw = {k[len("llm_provider-") :]: v for k, v in headers.items() if k.lower().startswith("llm_provider-")}
    plain = {k: v for k, v in headers.items() if k.lower().startswith(("x-ratelimit", "retry-after", "anthropic-"))}
    return {**plain, **raw}


def _body(response: Any, limit: int) -> bytes | str | None:
    """The body as far as `limit`, or None when it is not there to read (a stream, or
    a body that raises while it is read)."""
    try:
        inner = getattr(response, "http_response", None)  # an SDK's raw response wraps one
    except Exception:  # noqa: BLE001 - SPEC 18.4: a body that raises is left out
        return None
    if inner is not None and inner is not response and _is_response(inner):
        return _body(inner, limit)
    for name in ("content", "text"):
        try:
            value = getattr(response, name, None)
        except Exception:  # noqa: BLE001 - a stream not read (httpx.ResponseNotRead), a closed one
            return None
        if callable(value):  # an SDK's raw response: .text() / .content() in some versions
            continue
        if isinstance(value, (bytes, bytearray)):
            return bytes(value[: limit + 1])
        if isinstance(value, str):
            return value[: limit + 1]
    return None


def _text(response: Any, limit: int) -> str | None:
    body = _body(response, limit)
    if body is None:
        return None
    if isinstance(body, bytes):
        return body[:limit].decode("utf-8", "replace")
    return body[:limit]


def _usage_of_body(response: Any) -> object:
    body = _body(response, BODY_BYTES)
    if body is None or len(body) > BODY_BYTES:
        return None
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deep
        return None
    return data.get("usage") if isinstance(data, dict) else None


def _field(obj: object, name: str) -> object:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


class _Unusable(Exception):
    """A usage that cannot be used (SPEC 18.4): the estimate is recorded instead."""


def _count(obj: object, name: str) -> int | None:
    v = _field(obj, name)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= _MAX_COUNT:
        raise _Unusable(name)
    return v


def _safe_counts(usage: object) -> dict[str, int] | None:
    """`_counts`, or None (the estimate) when the usage cannot be used for any reason."""
    try:
        return _counts(usage)
    except Exception:  # noqa: BLE001 - SPEC 18.4: not ints in 0..2**63, a property raising, ...
        return None


def _counts(usage: object) -> dict[str, int] | None:
    """success() keywords from a `usage`: OpenAI's prompt/completion/total tokens and
    cached prompt tokens, or Anthropic's input/output tokens and cache reads (which
    Anthropic's input leaves out). None when there is no usage to read."""
    if usage is None:
        return None
    prompt, completion = _count(usage, "prompt_tokens"), _count(usage, "completion_tokens")
    if prompt is not None or completion is not None:
        out = {"input_tokens": prompt or 0, "output_tokens": completion or 0}
        total = _count(usage, "total_tokens")
        if total is not None:
            out["tokens"] = total
        cached = _count(_field(usage, "prompt_tokens_details") or {}, "cached_tokens")
        if cached is not None:
            out["cached_tokens"] = min(cached, out["input_tokens"])
        return out
    inp, outp = _count(usage, "input_tokens"), _count(usage, "output_tokens")
    if inp is not None or outp is not None:
        read = _count(usage, "cache_read_input_tokens") or 0
        out = {"input_tokens": (inp or 0) + read, "output_tokens": outp or 0}
        if read:
            out["cached_tokens"] = read
        return out
    total = _count(usage, "total_tokens")
    return None if total is None else {"tokens": total}


def _succeed(lease: Lease, counts: dict[str, int] | None, tokens: int | None) -> None:
    if counts is None:
        # No usage: the lease's estimate, as leaving a `with` block does.
        if tokens is None:
            lease._success_estimate()
        else:
            lease.success(tokens=tokens)
        return
    if tokens is not None:
        counts = {**counts, "tokens": tokens}
    lease.success(**counts)


def _is_timeout_type(exc: BaseException) -> bool:
    return isinstance(exc, TimeoutError) or any("timeout" in t.__name__.lower() for t in type(exc).__mro__)


def _is_timeout(exc: BaseException) -> bool:
    if _is_timeout_type(exc):
        return True
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text
