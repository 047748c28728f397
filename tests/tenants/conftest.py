"""The tenant tests (SPEC 23.2): an engine on the store (a SQLite file, or a prefix
on a real redis-server) whose clock starts at 10:00 UTC on 2026-01-01."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import quotaengine as q


@pytest.fixture
def e(store: str, clock: q.ManualClock) -> Iterator[q.QuotaEngine]:
    with q.QuotaEngine(store, clock=clock, env={}) as eng:
        yield eng
