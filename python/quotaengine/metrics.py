"""Prometheus metrics of an engine (SPEC 27.2); needs the ``metrics`` extra
(``pip install quotaengine[metrics]``, which installs ``prometheus_client``).

>>> from prometheus_client import CollectorRegistry, generate_latest
>>> registry = CollectorRegistry()
>>> registry.register(Collector(engine))  # doctest: +SKIP

Each scrape reads the engine once (``QuotaEngine._metrics_read()``, the GIL released)
and yields these families:

=========================================== ========= ==========================================
family                                      type      labels
=========================================== ========= ==========================================
``quotaengine_window_used``, ``_limit``     gauge     platform, model, key, window
``quotaengine_in_flight``                   gauge     platform, model, key
``quotaengine_cooldown_remaining_seconds``  gauge     platform, model, key (``*``: model-wide), source
``quotaengine_exhausts_in_seconds``         gauge     platform, model, key
``quotaengine_tenant_used``, ``_limit``     gauge     tenant, window
``quotaengine_admitted_total``              counter   platform, model
``quotaengine_refused_total``               counter   reason
``quotaengine_failures_total``              counter   platform, kind
``quotaengine_wait_seconds``                histogram (none)
``quotaengine_degraded``                    gauge     (none): 0 or 1
=========================================== ========= ==========================================

``window`` is the key ``usage()`` gives the window (``rpm``, ``requests/1s``,
``cost/day``, ``platform:requests/minute``, ...) and its samples are what ``usage()``
reports (a limit's use at its scope: a shared account's, the platform's); cost windows
count micro-dollars; a window with no limit has a ``used`` sample and no ``limit`` sample. Only routes with
usage today, a live lease or a cooldown are reported. The counters and the histogram
are this process's engine's (``QuotaEngine.stats()``); the gauges are the database's.

:func:`exposition` gives the same families as text without ``prometheus_client``
(what ``quotaengine serve`` answers at ``/metrics``): at 10,000 routes the client's
formatting of the collector's samples takes most of a second, the Rust-written text a
small part of that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ._quotaengine import _metric_families, _metrics_content_type

if TYPE_CHECKING:
    from . import QuotaEngine

__all__ = ["CONTENT_TYPE", "Collector", "check_target", "exposition", "register"]

#: The ``Content-Type`` of :func:`exposition`: Prometheus' text format 0.0.4.
CONTENT_TYPE: str = _metrics_content_type


def exposition(engine: QuotaEngine) -> bytes:
    """The same families as a :class:`Collector`'s scrape, already in Prometheus' text
    format 0.0.4 (UTF-8, served as :data:`CONTENT_TYPE`): the engine read once and the
    text written by the Prometheus project's Rust client, the GIL released for both.
    What ``quotaengine serve`` answers at ``/metrics``; for a process that serves its own
    ``/metrics`` without a ``prometheus_client`` registry. At 10,000 routes it takes a
    tenth of the time ``prometheus_client.generate_latest`` takes to format the
    collector's samples (``benches/RESULTS-metrics.md``). Needs no extra."""
    return engine._metrics_text()


def _families() -> dict[str, Any]:
    """Empty families of SPEC 27.2's table (the core's, one for both expositions), by key."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    make = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "histogram": HistogramMetricFamily}
    return {
        key: make[kind](name, help, labels=labels) if labels else make[kind](name, help)
        for key, name, help, kind, labels in _metric_families
    }


class Collector:
    """A ``prometheus_client`` collector of ``engine`` (SPEC 27.2): register it in a
    registry (``registry.register(Collector(engine))``, or :func:`register`). Each
    scrape reads the engine once, with the GIL released; see the module's docstring for
    the families."""

    #: The registry :func:`register` put it in (``None`` otherwise).
    registry: Any = None

    def __init__(self, engine: QuotaEngine) -> None:
        self._engine: Callable[[], Any] = lambda: engine

    @classmethod
    def _of(cls, engine: Callable[[], Any]) -> Collector:
        """A collector of whichever engine ``engine()`` returns at each scrape (nothing
        is reported while it returns ``None``: a proxy worker opens its engine at its
        first request)."""
        c = cls.__new__(cls)
        c._engine = engine
        return c

    def describe(self) -> Iterator[Any]:
        """The families, without samples (the registry checks their names at
        ``register`` without reading the engine)."""
        yield from _families().values()

    def collect(self) -> Iterator[Any]:
        """One scrape: reads the engine once and yields every family."""
        from prometheus_client.samples import Sample

        engine = self._engine()
        if engine is None:
            return
        m = engine._metrics_read()
        f = _families()
        # The read's rows are the samples' label values and values already (str, float):
        # the samples are built here as ``add_metric`` builds them, without its per-call work.
        for name in ("used", "limit"):
            n = f[name].name
            f[name].samples = [
                Sample(n, {"platform": p, "model": mo, "key": k, "window": w}, v) for p, mo, k, w, v in m[name]
            ]
        for name in ("in_flight", "exhausts"):
            n = f[name].name
            f[name].samples = [Sample(n, {"platform": p, "model": mo, "key": k}, v) for p, mo, k, v in m[name]]
        n = f["cooldown"].name
        f["cooldown"].samples = [
            Sample(n, {"platform": p, "model": mo, "key": k, "source": s}, v) for p, mo, k, s, v in m["cooldown"]
        ]
        for name in ("tenant_used", "tenant_limit"):
            n = f[name].name
            f[name].samples = [Sample(n, {"tenant": t, "window": w}, v) for t, w, v in m[name]]
        stats = m["stats"]
        for (platform, model), count in stats["admitted"].items():
            f["admitted"].add_metric([platform, model], count)
        for reason, count in stats["refused"].items():
            f["refused"].add_metric([reason], count)
        for (platform, kind), count in stats["failures"].items():
            f["failures"].add_metric([platform, kind], count)
        waits = stats["waits"]
        buckets = [(_bound(b), count) for b, count in m["wait_buckets"]]
        buckets.append(("+Inf", waits["count"]))
        f["waits"].add_metric([], buckets, waits["seconds"])
        f["degraded"].add_metric([], 1 if m["degraded"] else 0)
        yield from f.values()


def _bound(b: float) -> str:
    """A bucket's bound as Prometheus writes it (``0.5``, ``1.0``)."""
    return repr(float(b))


def check_target(metrics: Any) -> None:
    """What :func:`register` takes, checked before anything changes: a ``TypeError`` for
    a wrong kind, an ``ImportError`` naming the extra when ``prometheus_client`` is
    missing."""
    _registry_of(metrics)


def _registry_of(metrics: Any) -> Any:
    if metrics is None or metrics is False:
        return None
    try:
        import prometheus_client
    except ImportError:  # pragma: no cover - the extra is installed in the tests
        raise ImportError("metrics= needs prometheus_client: pip install quotaengine[metrics]") from None
    if metrics is True:
        return prometheus_client.REGISTRY
    if isinstance(metrics, prometheus_client.CollectorRegistry):
        return metrics
    raise TypeError(f"metrics must be None, True or a prometheus_client.CollectorRegistry, not {metrics!r}")


def register(engine: QuotaEngine | Collector, metrics: Any) -> Collector | None:
    """Registers a :class:`Collector` of ``engine`` as ``install(..., metrics=)`` and
    ``proxy_handler_for(..., metrics=)`` take it: ``metrics`` is ``None`` or ``False``
    (nothing registered, ``None`` returned), ``True`` (``prometheus_client.REGISTRY``,
    the default registry ``start_http_server`` and ``make_asgi_app`` serve) or a
    ``prometheus_client.CollectorRegistry``. Anything else is a ``TypeError``, and
    ``prometheus_client`` missing an ``ImportError`` naming the extra."""
    registry = _registry_of(metrics)
    if registry is None:
        return None
    collector = engine if isinstance(engine, Collector) else Collector(engine)
    registry.register(collector)
    collector.registry = registry
    return collector
