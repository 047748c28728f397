"""SPEC 27.3: ``quotaengine serve``: its JSON, its 1 s cache, /metrics, and what it refuses.
The page itself is tested in a real browser in test_serve_browser.py."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import quotaengine as q
from expositions import parsed
from quotaengine._serve import Server
from stores import BACKENDS


@pytest.fixture(params=BACKENDS)
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLite file or a Redis prefix (serve opens either, as QuotaEngine does)."""
    if request.param == "redis":
        from redis_servers import redis_location

        return redis_location(request.getfixturevalue("redis_server"))
    return str(tmp_path / "quota.db")


#: An unparsable cap in an engine's environment: a warning in ``server_logs`` (SPEC 12).
BAD_ENV = {"PROVIDER_DAILY_REQUEST_CAP_OPENROUTER": "lots"}


def populate(location: str) -> None:
    """A database with usage, cooldowns, forecasts, tenants and a warning."""
    with q.QuotaEngine(location, env=BAD_ENV) as e:
        fill(e)


def fill(e: q.QuotaEngine) -> None:
    e.register_key(1, "groq")
    e.register_key(2, "groq")
    e.register_key(7, "google")
    e.set_model_limits("groq", "llama-3.3-70b", rpm=120, rpd=1_000, tpm=12_000, tpd=100_000)
    e.set_model_limits(
        "google", "gemini-2.5-flash", rpm=10, rpd=250, limits=[q.Limit("input_tokens", 1_000_000, "day")]
    )
    for _ in range(100):
        e.record_request("groq", "llama-3.3-70b", 1, tenant="team:search")
    e.record_tokens("groq", "llama-3.3-70b", 1, 4_000, tenant="team:search")
    for _ in range(3):
        e.record_request("google", "gemini-2.5-flash", 7, tenant="acme")
    e.record_tokens("google", "gemini-2.5-flash", 7, input_tokens=52_000, output_tokens=1_000, tenant="acme")
    e.set_cooldown("groq", "llama-3.3-70b", 2, 10 * 60_000, "authoritative")
    e.set_tenant_limits(
        "acme", [q.Limit("requests", 1_000, "day"), q.Limit("tokens", 200_000, "day"), q.Limit.dollars(5, "day")]
    )
    e.set_tenant_limits("team:search", [q.Limit("requests", 500, "day")])


def steady(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without their forecasts, which move with the clock."""
    return [{k: v for k, v in r.items() if k != "exhausts_at_ms"} for r in rows]


def get(url: str, method: str = "GET", data: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, method=method, data=data)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


class Running:
    """A ``Server`` on a read-only engine, serving from a thread of this process."""

    def __init__(self, location: str, **kwargs: Any) -> None:
        self.engine = q.QuotaEngine(location, readonly=True)
        self.server = Server(self.engine, "127.0.0.1", 0, **kwargs)
        self.url = self.server.url.rstrip("/")
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.engine.close()


@pytest.fixture
def served(location: str) -> Iterator[Running]:
    populate(location)
    running = Running(location)
    yield running
    running.close()


def test_api_snapshot_holds_routes_tenants_cooldowns_forecasts(served: Running) -> None:
    status, headers, body = get(served.url + "/api/snapshot")
    assert status == 200 and headers["Content-Type"] == "application/json"
    doc = json.loads(body)
    assert {"routes", "tenants", "cooldowns", "forecasts", "generated_at_ms"} <= set(doc)
    e = served.engine
    assert abs(doc["generated_at_ms"] - e.now_ms()) < 60_000
    # routes: the snapshot's rows, under the snapshot's names
    snap = e.snapshot()

    assert steady(doc["routes"]) == steady([dict(r) for r in snap.rows])
    groq1 = next(r for r in doc["routes"] if (r["platform"], r["key_id"]) == ("groq", 1))
    assert (groq1["rpd_used"], groq1["rpd_limit"], groq1["tpm_used"]) == (100, 1_000, 4_000)
    gem = next(r for r in doc["routes"] if r["platform"] == "google")
    assert (gem["input_tokens/day_used"], gem["input_tokens/day_limit"]) == (52_000, 1_000_000)
    # the benched route is a row too, and its cooldown is listed with Cooldown's names
    assert any(r["key_id"] == 2 for r in doc["routes"])
    (cd,) = doc["cooldowns"]
    assert {k: cd[k] for k in ("platform", "model_id", "key_id", "source")} == {
        "platform": "groq",
        "model_id": "llama-3.3-70b",
        "key_id": 2,
        "source": "authoritative",
    }
    assert 0 < cd["remaining_ms"] <= 10 * 60_000 and cd["expires_at_ms"] > doc["generated_at_ms"]
    # forecasts: one per route and forecast() key
    fc = {(f["platform"], f["key_id"], f["window"]): f["exhausts_at_ms"] for f in doc["forecasts"]}
    want = e.forecast("groq", "llama-3.3-70b", 1)
    assert set(want) == {w for (p, k, w) in fc if (p, k) == ("groq", 1)}
    # 100 of 1,000 requests in the last 10 minutes: the rest go in 90 minutes (or the day ends first)
    at, now = fc[("groq", 1, "rpd")], doc["generated_at_ms"]
    to_midnight = 86_400_000 - now % 86_400_000  # groq's day is UTC's
    if to_midnight > 92 * 60_000:
        assert at is not None and now + 80 * 60_000 < at <= now + 91 * 60_000
    elif to_midnight < 79 * 60_000:
        assert at is None
    assert ("google", 7, "input_tokens/day") in fc
    # tenants: snapshot().tenants
    assert steady(doc["tenants"]) == steady([dict(t) for t in snap.tenants])
    acme = {t["window"]: t for t in doc["tenants"] if t["tenant"] == "acme"}
    assert (acme["tokens/day"]["used"], acme["tokens/day"]["limit"]) == (53_000, 200_000)
    assert doc["path"] == e.path
    # warnings: the newest warnings and errors of server_logs
    (warning,) = doc["warnings"]
    assert warning["level"] == "warn" and "PROVIDER_DAILY_REQUEST_CAP_OPENROUTER" in warning["message"]
    assert set(warning) == set(e.server_logs(1)[0])


def test_page_is_one_self_contained_document(served: Running) -> None:
    status, headers, body = get(served.url + "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    page = body.decode()
    assert page.startswith("<!doctype html>") and "<style>" in page and "<script>" in page
    # nothing from outside the package: no external script, stylesheet, font or image
    for outside in ('src="http', "src='http", 'href="http', "@import", "url(http", "<link"):
        assert outside not in page
    assert "/api/snapshot" in page and "setInterval(refresh, 2000)" in page


def test_reads_are_cached_for_one_second(location: str) -> None:
    populate(location)
    now = [1000.0]
    running = Running(location, clock=lambda: now[0])
    try:
        with ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(lambda _: get(running.url + "/api/snapshot"), range(64)))
        assert {r[0] for r in replies} == {200} and len({r[2] for r in replies}) == 1
        assert running.server.snapshot_cache.reads == 1
        now[0] += 0.999
        get(running.url + "/api/snapshot")
        assert running.server.snapshot_cache.reads == 1
        now[0] += 0.001
        for _ in range(5):
            get(running.url + "/api/snapshot")
        assert running.server.snapshot_cache.reads == 2
        # the page itself reads nothing
        get(running.url + "/")
        assert running.server.snapshot_cache.reads == 2
    finally:
        running.close()


def test_a_change_by_another_engine_is_served_after_the_cache(served: Running, location: str) -> None:
    first = json.loads(get(served.url + "/api/snapshot")[2])
    with q.QuotaEngine(location) as other:
        other.set_cooldown("google", "gemini-2.5-flash", 7, 5 * 60_000, "heuristic")
    served.server.snapshot_cache._at = None  # the second has passed
    later = json.loads(get(served.url + "/api/snapshot")[2])
    assert len(later["cooldowns"]) == len(first["cooldowns"]) + 1
    assert any(c["key_id"] == 7 and c["source"] == "heuristic" for c in later["cooldowns"])


class DownStore:
    """An engine whose store does not answer (a Redis that is down)."""

    path = "redis://10.0.0.1:6379/0"

    def __init__(self) -> None:
        self.calls = 0

    def snapshot(self) -> Any:
        self.calls += 1
        raise q.DatabaseError("redis: connection refused")


def test_a_store_that_does_not_answer_is_a_503_read_once_a_second() -> None:
    now = [0.0]
    engine = DownStore()
    server = Server(engine, "127.0.0.1", 0, clock=lambda: now[0])
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        for _ in range(5):
            status, _, body = get(server.url + "api/snapshot")
            assert status == 503
            assert body == b"cannot read the database: DatabaseError: redis: connection refused\n"
        assert engine.calls == 1
        now[0] += 1
        assert get(server.url + "api/snapshot")[0] == 503
        assert engine.calls == 2
    finally:
        server.shutdown()
        server.server_close()


def test_metrics_serves_the_databases_gauges(served: Running) -> None:
    status, headers, body = get(served.url + "/metrics")
    assert status == 200 and headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    f = parsed(body)
    route = (("key", "1"), ("model", "llama-3.3-70b"), ("platform", "groq"))
    assert ("quotaengine_window_used", (*route, ("window", "rpd")), 100.0) in f["quotaengine_window_used"][2]
    (cooldown,) = f["quotaengine_cooldown_remaining_seconds"][2]
    assert cooldown[1] == (("key", "2"), ("model", "llama-3.3-70b"), ("platform", "groq"), ("source", "authoritative"))
    tenant = ("quotaengine_tenant_limit", (("tenant", "acme"), ("window", "tokens/day")), 200000.0)
    assert tenant in f["quotaengine_tenant_limit"][2]
    reads = served.server.metrics_cache.reads
    get(served.url + "/metrics")
    assert served.server.metrics_cache.reads == reads  # cached for 1 s as well


def test_metrics_says_what_the_collector_of_the_readonly_engine_says(served: Running) -> None:
    """/metrics is ``metrics.exposition`` of the read-only engine: sample for sample what
    ``Collector(engine)`` (SPEC 27.2) yields through prometheus_client."""
    from prometheus_client import CollectorRegistry, generate_latest
    from quotaengine.metrics import Collector

    _, _, body = get(served.url + "/metrics")
    registry = CollectorRegistry()
    registry.register(Collector(served.engine))
    assert served.engine.readonly
    ours, theirs = parsed(body), parsed(generate_latest(registry))
    # Seconds left count down between the two reads (a real clock): same samples, close values.
    for name in ("quotaengine_cooldown_remaining_seconds", "quotaengine_exhausts_in_seconds"):
        a, b = ours.pop(name), theirs.pop(name)
        assert a[:2] == b[:2] and [s[:2] for s in a[2]] == [s[:2] for s in b[2]]
        assert all(abs(x[2] - y[2]) < 5 for x, y in zip(a[2], b[2], strict=True))
    assert ours == theirs


def test_metrics_without_prometheus_is_404_with_a_hint(served: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # an import of it fails
    status, _, body = get(served.url + "/metrics")
    assert status == 404
    assert b"pip install 'quotaengine[metrics]'" in body


# ---- what it refuses ----


def test_unknown_path_is_404(served: Running) -> None:
    """SPEC 27.3 serves `/`, `/api/snapshot` and `/metrics`: any other path is a 404, the
    page's usual other name too."""
    paths = ("/nope", "/index.html", "/api", "/api/snapshot/x", "/metrics/", "/../etc/passwd", "/favicon.ico")
    for path in paths:
        status, _, body = get(served.url + path)
        assert status == 404, path
    assert served.server.snapshot_cache.reads == 0  # a 404 reads nothing


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_nothing_that_writes_is_served(served: Running, location: str, method: str) -> None:
    before = steady(served.engine.snapshot().rows)
    for path in ("/", "/api/snapshot", "/metrics", "/elsewhere"):
        status, headers, _ = get(served.url + path, method=method, data=b"{}")
        assert status == 405, (method, path)
        assert headers["Allow"] == "GET, HEAD"
    assert served.engine.readonly
    with q.QuotaEngine(location, readonly=True) as e:
        assert steady(e.snapshot().rows) == before


def test_head_is_get_without_a_body(served: Running) -> None:
    status, headers, body = get(served.url + "/api/snapshot", method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0


def serve_cli(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quotaengine", "serve", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_database_that_is_not_the_engines_is_a_clear_error(tmp_path: Path) -> None:
    other = tmp_path / "app.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    text = tmp_path / "notes.txt"
    text.write_text("not a database at all\n" * 100)
    for path in (other, text, tmp_path / "missing.db"):
        before = path.read_bytes() if path.exists() else None
        r = serve_cli("--db", str(path), "--port", "0")
        assert r.returncode == 2, r
        assert r.stderr.startswith("quotaengine: error: ") and "Traceback" not in r.stderr
        assert r.stdout == ""
        assert (path.read_bytes() if path.exists() else None) == before


def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "quota.db"
    q.QuotaEngine(str(db)).close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = serve_cli("--db", str(db), "--port", str(port))
    assert r.returncode == 2
    assert r.stderr == f"quotaengine: error: cannot listen on 127.0.0.1:{port}: address already in use\n"


def start_cli(db: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "quotaengine", "serve", "--db", str(db), "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("serving "), line + (proc.stderr.read() if proc.stderr else "")
    return proc, line.split(" at ", 1)[1].split()[0]


def stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=10)
    return err


def test_the_cli_defaults_are_loopback_and_port_9464() -> None:
    """SPEC 27.3: ``serve [--db PATH] [--host 127.0.0.1] [--port 9464]``, read from the
    command line's parser (nothing bound); ``serve()`` itself has the same defaults."""
    import inspect

    from quotaengine.__main__ import build_parser, cmd_serve
    from quotaengine._serve import serve

    args = build_parser().parse_args(["serve"])
    assert (args.db, args.host, args.port) == (None, "127.0.0.1", 9464)
    assert args.func is cmd_serve
    given = build_parser().parse_args(["serve", "--db", "q.db", "--host", "0.0.0.0", "--port", "8080"])
    assert (given.db, given.host, given.port) == ("q.db", "0.0.0.0", 8080)
    defaults = inspect.signature(serve).parameters
    assert (defaults["host"].default, defaults["port"].default) == ("127.0.0.1", 9464)


def test_the_cli_binds_loopback_by_default(tmp_path: Path) -> None:
    db = tmp_path / "quota.db"
    populate(str(db))
    proc, url = start_cli(db)
    try:
        assert url.startswith("http://127.0.0.1:")
        doc = json.loads(get(url + "api/snapshot")[2])
        assert len(doc["routes"]) == 3
    finally:
        err = stop(proc)
    assert "WARNING" not in err.upper()


def test_the_cli_warns_when_bound_elsewhere(tmp_path: Path) -> None:
    db = tmp_path / "quota.db"
    q.QuotaEngine(str(db)).close()
    proc, url = start_cli(db, "--host", "0.0.0.0")
    try:
        port = url.rsplit(":", 1)[1].rstrip("/")
        assert get(f"http://127.0.0.1:{port}/api/snapshot")[0] == 200
    finally:
        err = stop(proc)
    assert "bound to 0.0.0.0" in err
