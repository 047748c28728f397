"""``quotaengine serve`` (SPEC 27.3): a live page, its JSON and Prometheus metrics for a
database, on the standard library's HTTP server, with the database opened read-only.

Reads are cached for :data:`CACHE_S` seconds: however many pages are open, the engine is
read at most once per second for ``/api/snapshot`` and once per second for ``/metrics``.
"""

from __future__ import annotations

import errno
import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ._serve_page import PAGE

log = logging.getLogger("quotaengine.serve")

#: How long a read of the engine is served again (SPEC 27.3: "Reads are cached for 1 s").
CACHE_S = 1.0
#: How many of the newest warnings (and errors) of ``server_logs`` the page shows.
WARNINGS = 20
#: Where ``python -m quotaengine serve`` listens unless told otherwise.
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 9464

METRICS_HINT = "/metrics needs quotaengine.metrics and prometheus_client: pip install 'quotaengine[metrics]'\n"


def _cooldown(c: Any) -> dict[str, Any]:
    return {
        "platform": c.platform,
        "model_id": c.model_id,
        "key_id": c.key_id,
        "source": c.source,
        "set_at_ms": c.set_at_ms,
        "expires_at_ms": c.expires_at_ms,
        "remaining_ms": c.remaining_ms,
    }


def snapshot_document(engine: Any) -> dict[str, Any]:
    """The object ``/api/snapshot`` serves: ``routes`` (the rows of ``snapshot()``, its
    column names), ``tenants`` (``snapshot().tenants``), ``cooldowns`` (``active_cooldowns()``,
    the ``Cooldown`` attribute names), ``forecasts`` (one object per route and window of
    ``forecast()``: ``platform``, ``model_id``, ``key_id``, ``window`` — the forecast's key —
    and ``exhausts_at_ms``), ``warnings`` (the newest warnings and errors of
    ``server_logs()``), ``path`` and ``generated_at_ms`` (the engine clock's time)."""
    snap = engine.snapshot()
    routes = [dict(r) for r in snap.rows]
    forecasts = []
    for r in routes:
        for window, at in engine.forecast(r["platform"], r["model_id"], r["key_id"]).items():
            forecasts.append(
                {
                    "platform": r["platform"],
                    "model_id": r["model_id"],
                    "key_id": r["key_id"],
                    "window": window,
                    "exhausts_at_ms": at,
                }
            )
    warnings = [w for w in engine.server_logs(500) if w.get("level") in ("warn", "warning", "error")][:WARNINGS]
    return {
        "routes": routes,
        "tenants": [dict(t) for t in snap.tenants],
        "cooldowns": [_cooldown(c) for c in engine.active_cooldowns()],
        "forecasts": forecasts,
        "warnings": warnings,
        "path": engine.path,
        "generated_at_ms": snap.taken_at_ms,
    }


def _metrics_exposition(engine: Any) -> tuple[bytes, str] | None:
    """27.2's families for the engine in Prometheus' text format (``metrics.exposition``:
    the read and the text in Rust), or ``None`` without the ``metrics`` extra (SPEC 27.3:
    ``/metrics`` comes with ``prometheus_client``)."""
    try:
        import prometheus_client  # type: ignore[import-not-found,unused-ignore]  # noqa: F401

        from .metrics import CONTENT_TYPE, exposition
    except ImportError:
        return None
    return exposition(engine), CONTENT_TYPE


class _Cache:
    """One value, computed at most once per ``ttl_s`` of ``clock`` whatever the number of
    threads asking; ``reads`` counts the computations. A computation that raises is
    cached as its exception (a store that is down is asked once a second, not once per
    request)."""

    def __init__(self, compute: Callable[[], Any], ttl_s: float, clock: Callable[[], float]) -> None:
        self._compute, self._ttl_s, self._clock = compute, ttl_s, clock
        self._lock = threading.Lock()
        self._value: Any = None
        self._at: float | None = None
        self.reads = 0

    def get(self) -> Any:
        with self._lock:
            now = self._clock()
            if self._at is None or now - self._at >= self._ttl_s:
                try:
                    self._value = self._compute()
                except Exception as exc:  # served as a 503 until the next read
                    log.warning("quotaengine serve: reading the database failed: %s", exc)
                    self._value = exc
                self._at = self._clock()
                self.reads += 1
            return self._value


class Server(ThreadingHTTPServer):
    """The HTTP server of ``quotaengine serve`` on an open (read-only) engine.

    ``clock`` (seconds, default ``time.monotonic``) times the 1 s cache; ``reads`` counts
    the engine reads made for ``/api/snapshot`` and ``/metrics``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        engine: Any,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        ttl_s: float = CACHE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.snapshot_cache = _Cache(
            lambda: json.dumps(snapshot_document(engine), separators=(",", ":")).encode(), ttl_s, clock
        )
        self.metrics_cache = _Cache(lambda: _metrics_exposition(engine), ttl_s, clock)
        if ":" in host:  # an IPv6 address (``::1``, ``::``)
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)

    @property
    def reads(self) -> int:
        return self.snapshot_cache.reads + self.metrics_cache.reads

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = str(host)
        return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


class _Handler(BaseHTTPRequestHandler):
    server: Server
    server_version = "quotaengine-serve"
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str, head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if status == HTTPStatus.METHOD_NOT_ALLOWED:
            self.send_header("Allow", "GET, HEAD")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _get(self, head: bool) -> None:
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        if path == "/":
            self._send(200, PAGE.encode(), "text/html; charset=utf-8", head)
        elif path == "/api/snapshot":
            doc = self.server.snapshot_cache.get()
            if isinstance(doc, Exception):
                self._unavailable(doc, head)
            else:
                self._send(200, doc, "application/json", head)
        elif path == "/metrics":
            got = self.server.metrics_cache.get()
            if isinstance(got, Exception):
                self._unavailable(got, head)
            elif got is None:
                self._send(404, METRICS_HINT.encode(), "text/plain; charset=utf-8", head)
            else:
                self._send(200, got[0], got[1], head)
        else:
            self._send(404, f"not found: {path}\n".encode(), "text/plain; charset=utf-8", head)

    def _unavailable(self, exc: Exception, head: bool) -> None:
        body = f"cannot read the database: {type(exc).__name__}: {exc}\n".encode()
        self._send(503, body, "text/plain; charset=utf-8", head)

    def do_GET(self) -> None:
        self._get(head=False)

    def do_HEAD(self) -> None:
        self._get(head=True)

    def _refuse(self) -> None:
        # Nothing here writes (SPEC 27.3). The body is not read: the connection closes.
        self.close_connection = True
        self._send(405, b"read-only: only GET and HEAD\n", "text/plain; charset=utf-8")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse


def _loopback(host: str) -> bool:
    return host == "localhost" or host == "::1" or host.startswith("127.")


def serve(path: str | None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> int:
    """``python -m quotaengine serve``: opens ``path`` read-only and serves until interrupted.
    A database that is not the engine's raises ``DatabaseError`` (before listening); a port
    in use is a one-line error and exit code 2."""
    from . import QuotaEngine

    engine = QuotaEngine(path, readonly=True)
    try:
        try:
            server = Server(engine, host, port)
        except OSError as exc:
            why = "address already in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            print(f"quotaengine: error: cannot listen on {host}:{port}: {why}", file=sys.stderr)
            return 2
        with server:
            if not _loopback(host):
                log.warning(
                    "quotaengine serve is bound to %s: anyone who can reach this host reads the database's "
                    "routes, tenants and warnings",
                    host,
                )
            print(f"serving {engine.path} read-only at {server.url} (Ctrl-C to stop)", flush=True)
            try:
                server.serve_forever()
            except KeyboardInterrupt:
                pass
        return 0
    finally:
        engine.close()
