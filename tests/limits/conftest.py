"""The limit tests (limits as data, windows, calendars, accounts, token kinds, pools, the
forecast): an engine on the store whose clock starts on a Tuesday, 2026-12-01 10:00 UTC."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import quotaengine as q

DEC1_TEN_AM = 1_796_119_200_000  # Tuesday 2026-12-01 10:00 UTC


@pytest.fixture
def lclock() -> q.ManualClock:
    return q.ManualClock(DEC1_TEN_AM)


@pytest.fixture
def e(store: str, lclock: q.ManualClock) -> Iterator[q.QuotaEngine]:
    with q.QuotaEngine(store, clock=lclock, env={}) as eng:
        yield eng
