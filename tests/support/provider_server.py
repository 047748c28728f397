"""A real local HTTP server that answers like the providers do, for the tests of SPEC 16
(`Lease.observe`) with the real openai, anthropic, httpx and requests packages.

The model named in the request's JSON body picks the answer:

* ``ok``: an OpenAI-style 200 with ``usage`` (cached prompt tokens too) and
  ``x-ratelimit-*`` headers; on ``/v1/messages`` an Anthropic-style 200 with
  ``input_tokens``, ``output_tokens``, ``cache_read_input_tokens`` and
  ``anthropic-ratelimit-*`` headers;
* ``groq-429``: Groq's TPM 429 with ``retry-after`` and a body stating the limit;
* ``anthropic-429`` (on ``/v1/messages``): a 429 with ``anthropic-ratelimit-*`` headers
  and ``retry-after``;
* ``402``, ``503``: those statuses with a provider-style body;
* ``slow``: answers after 3 s (a client with a shorter timeout times out);
* ``flaky``: 429 for the first two requests of a test, then ``ok``;
* ``no-usage``: a 200 whose JSON has no ``usage``; ``not-json``: a 200 of plain text;
* ``huge-429``: a 429 with a 2 MB body;
* any other model: as ``ok``; and any model asked with an API key containing
  ``exhausted``: as ``groq-429`` (a key whose quota is spent).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from local_server import OPENAI_HEADERS, LocalServer

GROQ_TPM = (
    "Rate limit reached for model `llama-3.3-70b-versatile` in organization `org_01jq3xk5ev` service tier "
    "`on_demand` on tokens per minute (TPM): Limit 6000, Used 5450, Requested 1081. Please try again in 7.66s. "
    "Need more tokens? Upgrade to Dev Tier today at https://console.groq.com/settings/billing"
)


def openai_ok(model: str) -> dict:
    return {
        "id": "chatcmpl-local",
        "object": "chat.completion",
        "created": 1_767_268_800,
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "logprobs": None, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": 120,
            "completion_tokens": 30,
            "total_tokens": 150,
            "prompt_tokens_details": {"cached_tokens": 100},
        },
    }


ANTHROPIC_OK = {
    "id": "msg_local",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4",
    "content": [{"type": "text", "text": "hi"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 20,
        "output_tokens": 40,
        "cache_read_input_tokens": 200,
        "cache_creation_input_tokens": 0,
    },
}


def anthropic_headers(remaining: int) -> dict[str, str]:
    # Resets a minute from now, as RFC 3339 (Anthropic's form).
    reset = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
    return {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": str(remaining),
        "anthropic-ratelimit-requests-reset": reset,
        "anthropic-ratelimit-input-tokens-limit": "40000",
        "anthropic-ratelimit-input-tokens-remaining": "39000",
        "anthropic-ratelimit-input-tokens-reset": reset,
        "anthropic-ratelimit-output-tokens-limit": "8000",
        "anthropic-ratelimit-output-tokens-remaining": "7960",
        "anthropic-ratelimit-output-tokens-reset": reset,
    }


class ProviderServer(LocalServer):
    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        self.lock = threading.Lock()
        super().__init__()

    def on_post(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        model = str(body.get("model", "ok"))
        auth = h.headers.get("authorization", "") + h.headers.get("x-api-key", "")
        if "exhausted" in auth:  # a key whose quota is spent, whatever the model
            model = "groq-429"
        with self.lock:
            self.hits[model] = self.hits.get(model, 0) + 1
            hit = self.hits[model]
        self.answer(h, h.path, model, hit)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        with self.lock:
            self.hits.clear()

    def answer(self, h: BaseHTTPRequestHandler, path: str, model: str, hit: int) -> None:
        anthropic = path.endswith("/messages")

        def js(status: int, obj: object, headers: dict[str, str] | None = None) -> None:
            self.send(h, status, json.dumps(obj).encode(), headers or {}, "application/json")

        if model == "flaky" and hit <= 2:
            # a 429 the SDK retries at once (its own retry loop, max_retries)
            err = {"error": {"message": GROQ_TPM, "type": "tokens", "code": "rate_limit_exceeded"}}
            js(429, err, {"retry-after-ms": "10", "retry-after": "0"})
            return
        if model == "slow":
            time.sleep(3)
            model = "ok"
        if model in ("ok", "flaky"):
            if anthropic:
                js(200, ANTHROPIC_OK, anthropic_headers(49))
            else:
                js(200, openai_ok(model), OPENAI_HEADERS)
        elif model == "groq-429":
            err = {"error": {"message": GROQ_TPM, "type": "tokens", "code": "rate_limit_exceeded"}}
            js(429, err, {"retry-after": "8", **OPENAI_HEADERS, "x-ratelimit-remaining-tokens": "550"})
        elif model == "anthropic-429":
            err = {
                "type": "error",
                "error": {
                    "type": "rate_limit_error",
                    "message": "Number of request tokens has exceeded your per-minute rate limit",
                },
            }
            js(429, err, {"retry-after": "20", **anthropic_headers(0)})
        elif model == "402":
            err = {
                "error": {"message": "Insufficient credits. Add more using https://openrouter.ai/credits", "code": 402}
            }
            js(402, err)
        elif model == "503":
            js(503, {"error": {"message": "The server is overloaded", "type": "server_error"}})
        elif model == "no-usage":
            js(200, {"id": "x", "object": "chat.completion", "choices": []})
        elif model == "not-json":
            self.send(h, 200, b"plain text, not JSON", {}, "text/plain")
        elif model == "huge-429":
            self.send(h, 429, b"x" * (2 * 1024 * 1024) + b" limit: 5 requests per day", {}, "text/plain")
        else:  # any other model: served
            if anthropic:
                js(200, ANTHROPIC_OK, anthropic_headers(49))
            else:
                js(200, openai_ok(model), OPENAI_HEADERS)
