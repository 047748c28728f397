"""Shared fixtures: a manual clock, a database path under tmp_path and an engine on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import quotaengine as q
from hypothesis import HealthCheck, settings

# 2026-01-01 00:00:00.000 UTC, a midnight.
T0 = 1_767_225_600_000
MINUTE = 60_000
HOUR = 3_600_000
DAY = 86_400_000
# The fixture clock starts at 10:00 UTC on that day.
TEN_AM = T0 + 10 * HOUR

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


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "quota.db"


@pytest.fixture
def engine(db_path: Path, clock: q.ManualClock) -> Iterator[q.QuotaEngine]:
    e = q.QuotaEngine(db_path, clock=clock, env={})
    yield e
    e.close()
