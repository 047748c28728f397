"""A real HTTP server on a free loopback port, in a thread of its own, that answers each POST
through ``on_post`` with its JSON body read: the base of the local servers that answer as the
providers do (``provider_server``, ``litellm_server``, the LiteLLM bench)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

# The x-ratelimit-* headers of an OpenAI-compatible provider's answer.
OPENAI_HEADERS = {
    "x-ratelimit-limit-requests": "30",
    "x-ratelimit-remaining-requests": "29",
    "x-ratelimit-reset-requests": "2s",
    "x-ratelimit-limit-tokens": "6000",
    "x-ratelimit-remaining-tokens": "5850",
    "x-ratelimit-reset-tokens": "1.5s",
}


S = TypeVar("S", bound="LocalServer")


class LocalServer:
    """Starts serving at construction: a subclass sets its own state first, then calls this."""

    def __init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                server.on_post(self, json.loads(self.rfile.read(n) or b"{}"))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def on_post(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def send(
        h: BaseHTTPRequestHandler, status: int, body: bytes, headers: dict[str, str], ctype: str = "application/json"
    ) -> None:
        h.send_response(status)
        h.send_header("content-type", ctype)
        h.send_header("content-length", str(len(body)))
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)
