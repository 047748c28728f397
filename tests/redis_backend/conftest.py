"""The Redis backend's own tests: where each runs (a server of its own, or the session's
Sentinel set or Cluster)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from redis_servers import RedisServer, RedisTarget
from stores import TOPOLOGIES


@pytest.fixture(params=["redis"] + [f"redis-{t}" for t in TOPOLOGIES])
def redis_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisTarget]:
    """A Redis test's target: a server of its own (which only it talks to), or the session's
    Sentinel set or Cluster."""
    if request.param == "redis":
        server = RedisServer(tmp_path / "redis")
        yield RedisTarget("redis", server=server)
        server.kill()
    else:
        yield RedisTarget(request.param, topology=request.getfixturevalue(request.param.replace("-", "_")))


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test's own, which it may kill and restart."""
    server = RedisServer(tmp_path / "redis")
    yield server
    server.kill()
