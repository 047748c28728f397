"""Shared fixtures: a manual clock, a store (a SQLite file, or a prefix on a real
redis-server this session starts) and an engine on it. Each area's own fixtures are in its
``conftest.py``; the helpers the areas share are modules of ``tests/support/``.

Tests that take ``engine`` or ``store`` run once per backend. ``QE_BACKENDS=sqlite``
runs only the SQLite half (when no ``redis-server`` is installed)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import quotaengine as q
from hypothesis import HealthCheck, settings
from moments import TEN_AM
from redis_servers import RedisServer, redis_location
from redis_topologies import Cluster, SentinelSet
from stores import STORES

settings.register_profile(
    "quotaengine",
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile("quotaengine")


@pytest.fixture
def clock() -> q.ManualClock:
    return q.ManualClock(TEN_AM)


# Every module runs on Sentinel and Cluster too (about 3.5 minutes on a 2-core machine);
# ``QE_TOPOLOGY_SUITE=short`` runs only the modules of TOPOLOGY_SUITE there, a representative
# part (about 1 minute).
TOPOLOGY_SUITE = {
    "test_leases.py",
    "test_limits.py",
    "test_persistence.py",
    "test_processes.py",
    "test_token_kinds.py",
    "test_windows.py",
    "test_accounts.py",
    "test_calendars.py",
    "test_analysis.py",
    "test_probe.py",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``QE_TOPOLOGY_SUITE=short``, Sentinel and Cluster variants outside TOPOLOGY_SUITE are
    deselected (not skipped)."""
    if os.environ.get("QE_TOPOLOGY_SUITE", "all") == "all":
        return
    keep, drop = [], []
    for item in items:
        param = getattr(getattr(item, "callspec", None), "params", {}).get("store")
        if isinstance(param, str) and param.startswith("redis-") and item.path.name not in TOPOLOGY_SUITE:
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.kill()


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSet]:
    """A primary, a replica and three sentinels for the session (``redis_topologies``)."""
    topology = SentinelSet(tmp_path_factory.mktemp("sentinel"))
    yield topology
    topology.close()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A three-primary cluster for the session (``redis_topologies``)."""
    topology = Cluster(tmp_path_factory.mktemp("cluster"))
    yield topology
    topology.close()


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where an engine keeps its state: a SQLite file, or a Redis prefix (on one server, or
    through Sentinel or Cluster). A test marked ``sqlite_only`` reads the file itself and
    runs on SQLite only."""
    if request.param.startswith("redis"):
        if request.node.get_closest_marker("sqlite_only"):
            pytest.skip("reads the SQLite file itself")
        if request.param == "redis-sentinel":
            return str(request.getfixturevalue("redis_sentinel").url())  # type: ignore[attr-defined]
        if request.param == "redis-cluster":
            return str(request.getfixturevalue("redis_cluster").url())  # type: ignore[attr-defined]
        return redis_location(request.getfixturevalue("redis_server"))
    return str(tmp_path / "quota.db")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A SQLite file (tests that read the file itself, or SQLite-only behaviour)."""
    return tmp_path / "quota.db"


@pytest.fixture
def engine(store: str, clock: q.ManualClock) -> Iterator[q.QuotaEngine]:
    e = q.QuotaEngine(store, clock=clock, env={})
    yield e
    e.close()


@pytest.fixture
def local_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Sets the process's local time zone (``TZ``) for one test; restored after it."""

    def use(tz: str) -> None:
        monkeypatch.setenv("TZ", tz)
        time.tzset()

    yield use
    monkeypatch.undo()
    time.tzset()
