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
* a parsed completion, or a dict, with a ``usage`` member: a success with its counts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._quotaengine import FailureOutcome, Lease

# What is read of a body: an error message as far as the parsers look (SPEC 13's
# 16 KiB), a success body as far as a completion with its usage reasonably goes.
MESSAGE_BYTES = 16 * 1024
BODY_BYTES = 1024 * 1024
_MISSING = object()


def observe(lease: Lease, outcome: object, tokens: int | None = None) -> FailureOutcome | None:
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)):
        raise TypeError(f"tokens must be an int or None, not {type(tokens).__name__}")
    if tokens is not None and tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    response = _response_of(outcome)
    if response is not None:
        return _observe_response(lease, response, tokens)
    if isinstance(outcome, BaseException):
        message = str(outcome) or type(outcome).__name__
        if _is_timeout(outcome):
            return lease.failure(message=message, kind="timeout")
        return lease.failure(message=message, kind="transport")
    usage = outcome.get("usage", _MISSING) if isinstance(outcome, Mapping) else getattr(outcome, "usage", _MISSING)
    if usage is not _MISSING:
        _succeed(lease, _counts(usage), tokens)
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


def _observe_response(lease: Lease, response: Any, tokens: int | None) -> FailureOutcome | None:
    status: int = response.status_code
    headers = {str(k): str(v) for k, v in response.headers.items()}
    lease._record_quota_headers(headers, status)
    if 200 <= status < 300:
        _succeed(lease, _counts(_usage_of_body(response)), tokens)
        return None
    retry_after = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    return lease.failure(status=status, retry_after=retry_after, message=_text(response, MESSAGE_BYTES))


def _body(response: Any, limit: int) -> bytes | str | None:
    """The body as far as `limit`, or None when it is not there to read (a stream)."""
    inner = getattr(response, "http_response", None)  # an SDK's raw response wraps one
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
    except (ValueError, UnicodeDecodeError):
        return None
    return data.get("usage") if isinstance(data, dict) else None


def _field(obj: object, name: str) -> object:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _count(obj: object, name: str) -> int | None:
    v = _field(obj, name)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


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
        lease.success(tokens=lease.estimated_tokens if tokens is None else tokens)
        return
    if tokens is not None:
        counts = {**counts, "tokens": tokens}
    lease.success(**counts)


def _is_timeout(exc: BaseException) -> bool:
    if isinstance(exc, TimeoutError):
        return True
    if any("timeout" in t.__name__.lower() for t in type(exc).__mro__):
        return True
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text
