"""A router module that creates its engine at import, as servers that fork expect:
``QE_FORK_STORE`` (a SQLite path or Redis URL) and ``QE_FORK_FLUSH`` (flush_interval_ms)
from the environment. Used by test_fork.py through multiprocessing (fork, forkserver,
spawn) and as a WSGI app under ``gunicorn --preload``."""

from __future__ import annotations

import os

import quotaengine as q

P, M, K = "groq", "llama-3.1-8b", 1
RPM = int(os.environ.get("QE_FORK_RPM", "100"))

ENGINE = q.QuotaEngine(os.environ["QE_FORK_STORE"], env={}, flush_interval_ms=int(os.environ.get("QE_FORK_FLUSH", "0")))


def admit(attempts: int) -> int:
    """Tries `attempts` leases on one route with rpm=RPM; returns how many were admitted."""
    admitted = 0
    for i in range(attempts):
        try:
            with ENGINE.lease(P, M, K, 10, limits={"rpm": RPM}) as lease:
                lease.success(tokens=10 + i % 3)
            admitted += 1
        except q.QuotaExceeded:
            pass
    return admitted


def tokens_of(i: int) -> int:
    return 10 + i % 3


def app(environ: dict[str, str], start_response):  # type: ignore[no-untyped-def]
    """WSGI: one lease per request; ``?tokens=N`` is what the "provider" used. ``/pid``
    answers the worker's pid without touching the engine."""
    if environ.get("PATH_INFO") == "/pid":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [str(os.getpid()).encode()]
    tokens = int(environ.get("QUERY_STRING", "tokens=1").split("=")[1])
    try:
        with ENGINE.lease(P, M, K, tokens, limits={"rpm": RPM}) as lease:
            lease.success(tokens=tokens)
    except q.QuotaExceeded:
        start_response("429 Too Many Requests", [("Content-Type", "text/plain")])
        return [b"refused"]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [str(os.getpid()).encode()]
