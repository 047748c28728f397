"""A real local HTTP server that answers LiteLLM's openai-compatible calls as the
providers do (SPEC 20 tests and benches/bench_litellm.py). The request's ``model`` picks
the answer:

* ``ok`` (or any model not named below): a 200 with ``usage`` and ``x-ratelimit-*``
  headers; with ``"stream": true`` a server-sent event stream whose last chunk carries
  the usage when ``stream_options.include_usage`` is set;
* ``groq-429``: Groq's TPM 429, ``retry-after: 8`` and the body stating the limit;
* ``gemini-day``: Google's RESOURCE_EXHAUSTED for a spent daily quota, RetryInfo 17s;
* ``busy``: at most ``busy_cap`` requests at once, each held ``busy_hold_s``; one more
  is answered 429 "Too many concurrent requests";
* ``or-upstream``: OpenRouter's 429 for a free model congested upstream (SPEC 21.1);
* ``or-pool``: OpenRouter's 429 "free-models-per-min" with ``X-RateLimit-Limit: 20``,
  ``-Remaining`` and ``-Reset`` (30 s ahead, epoch ms) as response headers (SPEC 21.2);
* ``flaky``: 503 for the first request, then ``ok``;
* ``e500``: always a 500; ``m404``: always a 404, the model not found; ``m403``: always a
  403, the model not on the key's tier (SPEC 24.7);
* ``slow``: answers after 3 s; ``slow-stream``: a stream whose first chunk comes at
  once and the rest 6 s later.

``hits`` counts answers per model and status; ``max_in_flight`` the most requests held
at once per model.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from local_server import OPENAI_HEADERS, LocalServer
from provider_bodies import GEMINI_PER_DAY_17S, GROQ_TPM_766, OPENROUTER_UPSTREAM

USAGE = {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}


def completion(model: str) -> dict[str, object]:
    return {
        "id": "chatcmpl-local",
        "object": "chat.completion",
        "created": 1_767_268_800,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": USAGE,
    }


def chunk(model: str, delta: dict[str, object], finish: str | None, usage: object = None) -> bytes:
    body: dict[str, object] = {
        "id": "chatcmpl-local",
        "object": "chat.completion.chunk",
        "created": 1_767_268_800,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if delta or finish else [],
    }
    if usage is not None:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class LiteLLMProviders(LocalServer):
    def __init__(self, busy_cap: int = 2, busy_hold_s: float = 0.05) -> None:
        self.busy_cap = busy_cap
        self.busy_hold_s = busy_hold_s
        self.hits: dict[tuple[str, int], int] = {}
        self.in_flight: dict[str, int] = {}
        self.max_in_flight: dict[str, int] = {}
        self.lock = threading.Lock()
        super().__init__()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def count(self, model: str, status: int) -> int:
        with self.lock:
            return self.hits.get((model, status), 0)

    def total(self, model: str) -> int:
        with self.lock:
            return sum(n for (m, _), n in self.hits.items() if m == model)

    def _note(self, model: str, status: int) -> None:
        with self.lock:
            self.hits[(model, status)] = self.hits.get((model, status), 0) + 1

    def on_post(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        model = str(body.get("model", "ok"))
        if model == "groq-429":
            self._note(model, 429)
            self.send(h, 429, GROQ_TPM_766.encode(), {"retry-after": "8", **OPENAI_HEADERS})
            return
        if model == "gemini-day":
            self._note(model, 429)
            self.send(h, 429, ("[" + GEMINI_PER_DAY_17S + "]").encode(), {})
            return
        if model == "or-upstream":
            self._note(model, 429)
            self.send(h, 429, OPENROUTER_UPSTREAM.encode(), {})
            return
        if model == "or-pool":
            self._note(model, 429)
            reset = str(int(time.time() * 1000) + 30_000)
            pool = {"X-RateLimit-Limit": "20", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": reset}
            err = {"error": {"message": "Rate limit exceeded: free-models-per-min. ", "code": 429}}
            self.send(h, 429, json.dumps(err).encode(), pool)
            return
        if model == "e500":
            self._note(model, 500)
            self.send(h, 500, b'{"error": {"message": "Internal server error", "type": "server_error"}}', {})
            return
        if model == "m404":
            self._note(model, 404)
            err = {"error": {"message": f"The model `{model}` does not exist", "type": "invalid_request_error"}}
            self.send(h, 404, json.dumps(err).encode(), {})
            return
        if model == "m403":
            self._note(model, 403)
            err = {"error": {"message": "Your key has no access to this model", "type": "permission_denied"}}
            self.send(h, 403, json.dumps(err).encode(), {})
            return
        if model == "flaky" and self.total(model) == 0:
            self._note(model, 503)
            self.send(h, 503, b'{"error": {"message": "The server is overloaded", "type": "server_error"}}', {})
            return
        if model == "slow":
            time.sleep(3)
        if model == "busy":
            with self.lock:
                now = self.in_flight.get(model, 0)
                over = now >= self.busy_cap
                if not over:
                    self.in_flight[model] = now + 1
                    self.max_in_flight[model] = max(self.max_in_flight.get(model, 0), now + 1)
            if over:
                self._note(model, 429)
                err = {"error": {"message": "Too many concurrent requests for this key", "type": "rate_limit"}}
                self.send(h, 429, json.dumps(err).encode(), {})
                return
            try:
                time.sleep(self.busy_hold_s)
            finally:
                with self.lock:
                    self.in_flight[model] -= 1
        self._note(model, 200)
        if body.get("stream"):
            self.stream(h, model, body)
            return
        self.send(h, 200, json.dumps(completion(model)).encode(), OPENAI_HEADERS)

    def stream(self, h: BaseHTTPRequestHandler, model: str, body: dict[str, object]) -> None:
        options = body.get("stream_options")
        usage = isinstance(options, dict) and options.get("include_usage")
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("transfer-encoding", "chunked")
        for k, v in OPENAI_HEADERS.items():
            h.send_header(k, v)
        h.end_headers()
        parts = [
            chunk(model, {"role": "assistant", "content": "h"}, None),
            chunk(model, {"content": "i"}, None),
            chunk(model, {}, "stop"),
        ]
        if usage:
            parts.append(chunk(model, {}, None, USAGE))
        parts.append(b"data: [DONE]\n\n")
        try:
            for i, p in enumerate(parts):
                if i == 1 and model == "slow-stream":
                    time.sleep(6)
                h.wfile.write(f"{len(p):x}\r\n".encode() + p + b"\r\n")
                h.wfile.flush()
            h.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):  # the caller went away mid-stream
            h.close_connection = True
