"""The money tests (SPEC 23): prices and costs. Two engines on one store (a SQLite file, or a
prefix on a real redis-server), as two processes or hosts of a fleet share it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import quotaengine as q


@pytest.fixture
def other(store: str, clock: q.ManualClock, engine: q.QuotaEngine) -> Iterator[q.QuotaEngine]:
    """A second engine on the store of ``engine``."""
    with q.QuotaEngine(store, clock=clock, env={}) as e:
        yield e
