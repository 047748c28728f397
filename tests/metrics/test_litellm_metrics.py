"""SPEC 27.2: ``install(..., metrics=)`` and ``proxy_handler_for(..., metrics=)`` register a
``quotaengine.metrics.Collector`` (``True``: the default registry; or the registry given),
and ``uninstall()`` takes it out. On SQLite and Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import quotaengine as q
from expositions import families
from prometheus_client import CollectorRegistry, generate_latest

P, M = "groq", "llama-3.1-8b"

# LiteLLM's own warnings (its pydantic types, its deprecations) are not ours to fail on.
pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning:pydantic.*"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]


def scrape(registry: CollectorRegistry) -> dict[str, Any]:
    return families(generate_latest(registry))


def admitted(registry: CollectorRegistry) -> dict[tuple, float]:
    return {
        (s.labels["platform"], s.labels["model"]): s.value
        for s in scrape(registry)["quotaengine_admitted"].samples
        if s.name == "quotaengine_admitted_total"
    }


@pytest.fixture(scope="module", autouse=True)
def collect_litellm_leftovers() -> Iterator[None]:
    """LiteLLM leaves event loops and sockets of its own open: collected here."""
    import gc
    import warnings

    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gc.collect()


def test_install_and_proxy_handler_register_it(engine: q.QuotaEngine) -> None:
    import litellm
    import prometheus_client
    import quotaengine.litellm as qel

    router = litellm.Router(
        model_list=[
            {
                "model_name": "m",
                "litellm_params": {"model": f"groq/{M}", "api_key": "k"},
                "model_info": {"id": "d1", "quotaengine": {"platform": P, "key_id": 1}},
            }
        ]
    )
    with pytest.raises(TypeError, match="CollectorRegistry"):
        qel.install(router, engine, metrics="yes")
    assert getattr(router, "_quotaengine_plugin", None) is None  # nothing changed
    registry = CollectorRegistry()
    plugin = qel.install(router, engine, metrics=registry)
    engine.lease(P, M, 1).success()
    assert admitted(registry) == {(P, M): 1}
    plugin.uninstall()
    assert "quotaengine_admitted" not in scrape(registry)
    # True: the default registry.
    plugin = qel.install(router, engine, metrics=True)
    try:
        assert plugin.metrics is not None and plugin.metrics.registry is prometheus_client.REGISTRY
        assert "quotaengine_admitted" in scrape(prometheus_client.REGISTRY)
    finally:
        plugin.uninstall()
    assert "quotaengine_admitted" not in scrape(prometheus_client.REGISTRY)
    # The proxy's handler: a collector of the engine it uses.
    registry = CollectorRegistry()
    handler = qel.proxy_handler_for(engine, metrics=registry)
    assert handler.quotaengine_metrics.registry is registry
    assert admitted(registry) == {(P, M): 1}
    assert qel.proxy_handler_for(engine).quotaengine_metrics is None
