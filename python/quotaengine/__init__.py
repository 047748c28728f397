"""quotaengine: the quota and cooldown engine an LLM router puts in front of its providers.

Counts requests and tokens per (platform, model, key) in four windows, admits
requests atomically with leases (across threads and processes sharing one SQLite
file), and benches failing keys. The core is Rust; every call releases the GIL.
"""

from __future__ import annotations

from ._errors import DatabaseError, EngineClosed, QuotaEngineError, QuotaExceeded
from ._quotaengine import (
    Admission,
    Cooldown,
    Lease,
    Limits,
    ManualClock,
    ProviderCaps,
    QuotaEngine,
    __version__,
    sqlite_version,
)

__all__ = [
    "Admission",
    "Cooldown",
    "DatabaseError",
    "EngineClosed",
    "Lease",
    "Limits",
    "ManualClock",
    "ProviderCaps",
    "QuotaEngine",
    "QuotaEngineError",
    "QuotaExceeded",
    "__version__",
    "sqlite_version",
]
