"""SPEC 27.2: ``quotaengine.metrics.Collector(engine)`` in a ``prometheus_client`` registry:
the families, types and labels of the SPEC's table, read back through the client's own
exposition parser; routes with nothing to report left out; ``install(..., metrics=)`` and
``proxy_handler_for(..., metrics=)`` register it. On SQLite and Redis."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import quotaengine as q
from expositions import families, parsed
from moments import MINUTE
from prometheus_client import CollectorRegistry, generate_latest
from provider_bodies import OPENROUTER_UPSTREAM
from quotaengine import metrics
from quotaengine.metrics import Collector

P, M, M2 = "groq", "llama-3.1-8b", "mixtral"
ROUTER = "openrouter"


def scrape(registry: CollectorRegistry) -> dict[str, Any]:
    """The exposition as the client's parser reads it: family name -> family."""
    return families(generate_latest(registry))


def samples(families: dict[str, Any], name: str, sample: str | None = None) -> dict[tuple, float]:
    """``{tuple(sorted(labels.items())): value}`` of one family's samples (named ``sample``)."""
    fam = families[name]
    return {tuple(sorted(s.labels.items())): s.value for s in fam.samples if s.name == (sample or name)}


def lab(**kw: object) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in kw.items()))


def busy_engine(e: q.QuotaEngine) -> q.Lease:
    """A route with usage, limits and a forecast; one holding a lease; one benched; a
    model benched model-wide; a tenant with a budget; a route declared but unused."""
    e.set_model_limits(P, M, rpm=5, rpd=10, limits=[q.Limit("requests", 4, "1s", scope="key")])
    e.set_tenant_limits("acme", [q.Limit.dollars(5, "day"), q.Limit("requests", 100, "day")])
    e.set_model_prices(P, M, q.Prices(1.0, 2.0))
    for _ in range(3):
        e.lease(P, M, 1, tenant="acme").success(input_tokens=1000, output_tokens=500)
    e.set_model_limits(P, "unused", rpm=7)  # declared, never used: not reported
    e.register_key(9, P)
    held = e.lease(P, M2, 2)  # a live lease, nothing recorded yet
    e.set_cooldown(P, M2, 3, 30_000, "heuristic")
    e.record_failure(ROUTER, "x/y:free", 1, status=429, message=OPENROUTER_UPSTREAM)
    e.set_model_limits(P, "none", rpm=0)
    with pytest.raises(q.QuotaExceeded):
        e.lease(P, "none", 1)
    return held


def test_a_scrape_yields_the_families_of_the_table(engine: q.QuotaEngine) -> None:
    held = busy_engine(engine)
    registry = CollectorRegistry()
    registry.register(Collector(engine))
    f = scrape(registry)
    types = {name: fam.type for name, fam in f.items()}
    assert types == {
        "quotaengine_window_used": "gauge",
        "quotaengine_window_limit": "gauge",
        "quotaengine_in_flight": "gauge",
        "quotaengine_cooldown_remaining_seconds": "gauge",
        "quotaengine_exhausts_in_seconds": "gauge",
        "quotaengine_tenant_used": "gauge",
        "quotaengine_tenant_limit": "gauge",
        "quotaengine_admitted": "counter",
        "quotaengine_refused": "counter",
        "quotaengine_failures": "counter",
        "quotaengine_wait_seconds": "histogram",
        "quotaengine_degraded": "gauge",
    }
    # The counters are exposed as <name>_total.
    text = generate_latest(registry).decode()
    for counter in ("admitted", "refused", "failures"):
        assert f"# TYPE quotaengine_{counter}_total counter" in text

    used = samples(f, "quotaengine_window_used")
    limit = samples(f, "quotaengine_window_limit")
    route = {"platform": P, "model": M, "key": 1}
    # The usage() keys: the classic four, then the declared limit by its reason.
    assert used[lab(**route, window="rpm")] == 3 and limit[lab(**route, window="rpm")] == 5
    assert used[lab(**route, window="rpd")] == 3 and limit[lab(**route, window="rpd")] == 10
    assert used[lab(**route, window="tpm")] == 4500
    assert lab(**route, window="tpm") not in limit  # no limit: a used sample alone
    usage = engine.usage(P, M, 1)
    declared = [k for k in usage if k not in ("rpm", "rpd", "tpm", "tpd", "in_flight")]
    assert declared and all(used[lab(**route, window=k)] == usage[k]["used"] for k in declared)
    assert all(limit[lab(**route, window=k)] == usage[k]["limit"] for k in declared)
    # The live lease's route and the benched one are reported; the unused ones are not.
    routes = {(dict(k)["platform"], dict(k)["model"], dict(k)["key"]) for k in used}
    assert routes == {(P, M, "1"), (P, M2, "2"), (P, M2, "3")}
    in_flight = samples(f, "quotaengine_in_flight")
    assert in_flight[lab(platform=P, model=M2, key=2)] == 1
    assert in_flight[lab(**route)] == 0
    # Cooldowns: seconds left, the source; `*` for a model-wide bench.
    cd = samples(f, "quotaengine_cooldown_remaining_seconds")
    assert cd[lab(platform=P, model=M2, key=3, source="heuristic")] == 30.0
    assert cd[lab(platform=ROUTER, model="x/y:free", key="*", source="upstream")] == 60.0
    # The forecast of the route with a day window and a recent pace, in seconds from now.
    fc = engine.forecast(P, M, 1)
    now = engine._metrics_read()["now_ms"]
    assert samples(f, "quotaengine_exhausts_in_seconds") == {
        lab(**route): (min(t for t in fc.values() if t is not None) - now) / 1000
    }
    # Tenants: cost windows in micro-dollars.
    assert samples(f, "quotaengine_tenant_used") == {
        lab(tenant="acme", window="cost/day"): 3 * (1000 + 1000),
        lab(tenant="acme", window="requests/day"): 3,
    }
    assert samples(f, "quotaengine_tenant_limit") == {
        lab(tenant="acme", window="cost/day"): 5_000_000,
        lab(tenant="acme", window="requests/day"): 100,
    }
    # This process's counters.
    assert samples(f, "quotaengine_admitted", "quotaengine_admitted_total") == {
        lab(platform=P, model=M): 3,
        lab(platform=P, model=M2): 1,
    }
    assert samples(f, "quotaengine_refused", "quotaengine_refused_total") == {lab(reason="rpm"): 1}
    assert samples(f, "quotaengine_failures", "quotaengine_failures_total") == {
        lab(platform=ROUTER, kind="upstream"): 1
    }
    assert samples(f, "quotaengine_wait_seconds", "quotaengine_wait_seconds_count") == {(): 0}
    assert samples(f, "quotaengine_degraded") == {(): 0}
    held.success()


def test_the_wait_histogram(engine: q.QuotaEngine) -> None:
    engine.set_key_concurrency_cap(P, 1, 1)
    held = engine.lease(P, M, 1)
    timer = threading.Timer(0.1, held.success)
    timer.start()
    engine.lease(P, M, 1, wait_s=10).success()
    timer.join()
    registry = CollectorRegistry()
    registry.register(Collector(engine))
    f = scrape(registry)
    buckets = samples(f, "quotaengine_wait_seconds", "quotaengine_wait_seconds_bucket")
    counts = [n for _, n in sorted(((float(dict(k)["le"]), n) for k, n in buckets.items()))]
    assert counts == sorted(counts) and counts[-1] == 1  # cumulative, +Inf the count
    assert dict(next(iter(buckets)))["le"] and lab(le="+Inf") in buckets
    stats = engine.stats()["waits"]
    assert samples(f, "quotaengine_wait_seconds", "quotaengine_wait_seconds_sum") == {(): stats["seconds"]}


def test_each_window_is_what_usage_reports(engine: q.QuotaEngine) -> None:
    """SPEC 27.2's ``window`` is the ``usage()`` key and its samples are ``usage()``'s: a
    limit at account scope counts the shared account (SPEC 14.3), the platform's limits
    come as ``platform:<metric>/<per>`` (23.3), in the collector's scrape and in the text."""
    engine.register_key(1, P, account="team")
    engine.register_key(2, P, account="team")
    engine.set_model_limits(P, M, rpm=10, limits=[q.Limit("requests", 4, "1s", scope="key"), q.Limit.dollars(1, "day")])
    engine.set_model_prices(P, M, q.Prices(1.0, 2.0))  # $ per million tokens
    engine.set_platform_limits(P, [q.Limit("requests", 100, "minute"), q.Limit("tokens", 10_000, "day", scope="key")])
    for key in (1, 2, 2):
        engine.lease(P, M, key).success(tokens=50)
    engine.lease(P, M2, 1).success(tokens=5)
    registry = CollectorRegistry()
    registry.register(Collector(engine))
    for read in (scrape(registry), families(metrics.exposition(engine))):
        for model, key in ((M, 1), (M, 2), (M2, 1)):
            route = {"platform": P, "model": model, "key": str(key)}

            used, limit = (
                {
                    dict(labels)["window"]: v
                    for labels, v in samples(read, name).items()
                    if dict(labels).items() >= route.items()
                }
                for name in ("quotaengine_window_used", "quotaengine_window_limit")
            )
            want = {w: r for w, r in engine.usage(P, model, key).items() if w != "in_flight"}
            assert {w: {"used": used[w], "limit": limit.get(w)} for w in used} == want
        assert "platform:requests/minute" in want and "platform:tokens/day" in want
        account_rpm = lab(platform=P, model=M, key=1, window="rpm")
        assert samples(read, "quotaengine_window_used")[account_rpm] == 3  # the account's, not key 1's own 1
        cost = lab(platform=P, model=M, key=2, window="cost/day")
        assert samples(read, "quotaengine_window_limit")[cost] == 1_000_000  # $1 in µ$
        assert samples(read, "quotaengine_window_used")[cost] == 300  # 150 tokens at $2/M, in µ$


def test_an_idle_engine_reports_no_route(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    engine.set_model_limits(P, M, rpm=5)
    engine.register_key(1, P)
    registry = CollectorRegistry()
    registry.register(Collector(engine))
    f = scrape(registry)
    for name in ("quotaengine_window_used", "quotaengine_in_flight", "quotaengine_cooldown_remaining_seconds"):
        assert name not in f or f[name].samples == []
    engine.record_request(P, M, 1)
    assert samples(scrape(registry), "quotaengine_window_used")[lab(platform=P, model=M, key=1, window="rpm")] == 1
    clock.advance(2 * MINUTE)
    assert samples(scrape(registry), "quotaengine_window_used")[lab(platform=P, model=M, key=1, window="rpm")] == 0


def test_a_readonly_engine_reports_the_database(store: str, clock: q.ManualClock, tmp_path: Path) -> None:
    """The gauges are the database's: a read-only engine (as `quotaengine serve` opens) sees
    another engine's usage; its own counters are zero."""
    with q.QuotaEngine(store, clock=clock, env={}) as writer:
        writer.set_model_limits(P, M, rpm=5)
        writer.lease(P, M, 1).success()
        with q.QuotaEngine(store, clock=clock, env={}, readonly=True) as reader:
            registry = CollectorRegistry()
            registry.register(Collector(reader))
            f = scrape(registry)
            assert samples(f, "quotaengine_window_limit")[lab(platform=P, model=M, key=1, window="rpm")] == 5
            assert samples(f, "quotaengine_admitted", "quotaengine_admitted_total") == {}


@pytest.mark.parametrize("writer", ["prometheus_client", "exposition"])
def test_the_exposition_is_valid_text(engine: q.QuotaEngine, writer: str) -> None:
    """Every line is a comment or `name{labels} value` (what Prometheus reads), in the
    client's text and in ``metrics.exposition``'s."""
    held = busy_engine(engine)
    registry = CollectorRegistry()
    registry.register(Collector(engine))
    text = generate_latest(registry) if writer == "prometheus_client" else metrics.exposition(engine)
    line = re.compile(r'^(#.*|[a-z_]+(\{([a-z_]+="[^"]*",?)*\})? -?[0-9.e+]+|[a-z_]+(\{.*\})? \+?Inf)$')
    for row in text.decode().splitlines():
        assert line.match(row), row
    held.success()


def test_a_panic_in_the_text_is_a_quotaengine_error(engine: q.QuotaEngine) -> None:
    """The text crosses the engine's boundary like its methods: a panic inside is a
    ``QuotaEngineError`` (never pyo3's ``PanicException``), and the next call works."""
    engine.lease(P, M, 1).success()
    engine._inject_panics(1)
    with pytest.raises(q.QuotaEngineError, match="injected panic"):
        metrics.exposition(engine)
    assert b'window="rpm"} 1.0' in metrics.exposition(engine)


#: A model and a tenant whose names need escaping in the text: a quote, a backslash, a
#: newline, a non-ASCII letter.
ODD_MODEL, ODD_TENANT = 'say "hi"\\n\nü', 'team "a"\\b'


def test_the_text_exposition_says_what_the_collector_says(engine: q.QuotaEngine) -> None:
    """``metrics.exposition(engine)`` (the read and the text in Rust: what ``serve``
    answers at /metrics) is, sample for sample, the collector's scrape through
    prometheus_client: every family, help and type, counters and the wait histogram
    included, with label values that need escaping."""
    held = busy_engine(engine)
    engine.set_model_limits(P, ODD_MODEL, rpm=3)
    engine.set_tenant_limits(ODD_TENANT, [q.Limit("requests", 9, "day")])
    engine.lease(P, ODD_MODEL, 4, tenant=ODD_TENANT).success(tokens=7)
    engine.set_key_concurrency_cap(P, 5, 1)
    first = engine.lease(P, M, 5)
    timer = threading.Timer(0.05, first.success)
    timer.start()
    engine.lease(P, M, 5, wait_s=10).success()  # one wait, for the histogram
    timer.join()
    registry = CollectorRegistry()
    registry.register(Collector(engine))
    theirs = parsed(generate_latest(registry))
    ours = parsed(metrics.exposition(engine))
    assert ours == theirs
    assert len(ours) == 12 and all(rows for _, _, rows in ours.values())  # every family has samples
    used = ours["quotaengine_window_used"][2]
    odd = (("key", "4"), ("model", ODD_MODEL), ("platform", P), ("window", "rpm"))
    assert ("quotaengine_window_used", odd, 1.0) in used
    tenant = ("quotaengine_tenant_used", (("tenant", ODD_TENANT), ("window", "requests/day")), 1.0)
    assert tenant in ours["quotaengine_tenant_used"][2]
    assert ("quotaengine_wait_seconds_count", (), 1.0) in ours["quotaengine_wait_seconds"][2]
    held.success()


def test_the_text_exposition_needs_no_prometheus_client(tmp_path: Path) -> None:
    """A process where ``prometheus_client`` cannot be imported still gets the text."""
    script = f"""
import sys
sys.modules["prometheus_client"] = None  # an import of it fails
import quotaengine as q
from quotaengine import metrics
with q.QuotaEngine({str(tmp_path / "q.db")!r}, env={{}}) as e:
    e.lease("{P}", "{M}", 1).success()
    sys.stdout.write(metrics.CONTENT_TYPE + "\\n" + metrics.exposition(e).decode())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.startswith("text/plain; version=0.0.4; charset=utf-8\n# HELP quotaengine_window_used ")
    assert f'quotaengine_window_used{{platform="{P}",model="{M}",key="1",window="rpm"}} 1.0\n' in out


DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_docs_alerts_are_prometheus_rules() -> None:
    """The example alerts parse as a Prometheus rule file, on families the collector exports."""
    import yaml

    (rules,) = blocks("yaml")
    groups = yaml.safe_load(rules)["groups"]
    alerts = {r["alert"]: r for g in groups for r in g["rules"]}
    assert set(alerts) == {"QuotaEngineKeyBenched", "QuotaEngineBudgetRunsOutBeforeReset", "QuotaEngineDegraded"}
    assert "quotaengine_cooldown_remaining_seconds" in alerts["QuotaEngineKeyBenched"]["expr"]
    assert alerts["QuotaEngineKeyBenched"]["for"] == "10m"
    assert "quotaengine_exhausts_in_seconds" in alerts["QuotaEngineBudgetRunsOutBeforeReset"]["expr"]
    families = set(re.findall(r"quotaengine_[a-z_]+", DOC.read_text()))
    exported = {n.removesuffix("_bucket") for n in families} - {"quotaengine_window_used"}
    known = {
        "quotaengine_window_limit",
        "quotaengine_in_flight",
        "quotaengine_cooldown_remaining_seconds",
        "quotaengine_exhausts_in_seconds",
        "quotaengine_tenant_used",
        "quotaengine_tenant_limit",
        "quotaengine_admitted_total",
        "quotaengine_refused_total",
        "quotaengine_failures_total",
        "quotaengine_wait_seconds",
        "quotaengine_degraded",
        "quotaengine_admitted",  # the example reads the family by its parsed name
    }
    assert exported <= known, exported - known


def degraded_samples(e: q.QuotaEngine) -> tuple[dict[tuple, float], list[tuple[str, tuple, float]]]:
    """The ``quotaengine_degraded`` samples of the collector's scrape and of
    ``metrics.exposition``'s text."""
    registry = CollectorRegistry()
    registry.register(Collector(e))
    return samples(scrape(registry), "quotaengine_degraded"), parsed(metrics.exposition(e))["quotaengine_degraded"][2]


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_a_degraded_engine_scrapes_one(backend: str, tmp_path: Path) -> None:
    """SPEC 27.2's ``quotaengine_degraded`` is 1 while the engine serves degraded (another
    holds the store's write lock past the busy timeout: a SQLite connection in ``BEGIN
    EXCLUSIVE``, or the Redis lock key), in the collector's scrape and in the text written
    in Rust; 0 before and after."""
    from collections.abc import Iterator
    from contextlib import AbstractContextManager, contextmanager

    from moments import TEN_AM
    from outages import exclusive_lock
    from redis_servers import RedisServer, command

    @contextmanager
    def redis_lock(port: int) -> Iterator[None]:
        """Another engine's write lock on the store (``P:lock``), for the block."""
        assert command(port, "SET", "quotaengine:lock", "someone", "PX", "60000") == b"+OK\r\n"
        yield
        assert command(port, "DEL", "quotaengine:lock") == b":1\r\n"

    server = RedisServer(tmp_path / "redis") if backend == "redis" else None
    db = tmp_path / "quota.db"
    try:
        store = server.url if server else str(db)
        outage: AbstractContextManager[object] = redis_lock(server.port) if server else exclusive_lock(db)
        with q.QuotaEngine(store, clock=q.ManualClock(TEN_AM), env={}, busy_timeout_ms=50) as e:
            e.record_request(P, M, 1)
            assert degraded_samples(e) == ({(): 0}, [("quotaengine_degraded", (), 0.0)])
            with outage:
                e.record_request(P, M, 1)
                assert e.degraded
                assert degraded_samples(e) == ({(): 1}, [("quotaengine_degraded", (), 1.0)])
            e.record_request(P, M, 1)  # a write: writes back what was buffered
            assert not e.degraded
            assert degraded_samples(e) == ({(): 0}, [("quotaengine_degraded", (), 0.0)])
    finally:
        if server is not None:
            server.kill()


def test_a_route_used_only_yesterday_is_left_out(engine: q.QuotaEngine, clock: q.ManualClock) -> None:
    """SPEC 27.2: a route with no usage today, no lease and no cooldown is left out of the
    scrape, though it was used the day before."""
    from moments import DAY

    engine.set_model_limits(P, M, rpm=5, rpd=10)
    engine.lease(P, M, 1).success(tokens=5)
    engine.record_request(P, M2, 2)
    registry = CollectorRegistry()
    registry.register(Collector(engine))
    route = lab(platform=P, model=M, key=1, window="rpd")
    assert samples(scrape(registry), "quotaengine_window_used")[route] == 1
    clock.advance(DAY)  # the next day, past the UTC day boundary
    engine.record_request(P, M2, 2)  # another route used today stays
    f = scrape(registry)
    used = samples(f, "quotaengine_window_used")
    assert used and {(dict(k)["model"], dict(k)["key"]) for k in used} == {(M2, "2")}
    for name in ("quotaengine_window_limit", "quotaengine_in_flight", "quotaengine_exhausts_in_seconds"):
        assert all(dict(k)["model"] != M for k in (samples(f, name) if name in f else {})), name
    assert "quotaengine_window_used" in parsed(metrics.exposition(engine))
    text_used = parsed(metrics.exposition(engine))["quotaengine_window_used"][2]
    assert {dict(labels)["model"] for _, labels, _ in text_used} == {M2}
