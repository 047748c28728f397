"""The failure tests (cooldowns, failures, wasted dispatches, the probe, aggregators): an engine
on the store whose clock starts at noon."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import quotaengine as q
from moments import NOON


@pytest.fixture
def qclock() -> q.ManualClock:
    return q.ManualClock(NOON)


@pytest.fixture
def qengine(store: str, qclock: q.ManualClock) -> Iterator[q.QuotaEngine]:
    with q.QuotaEngine(store, clock=qclock, env={}) as e:
        yield e
