"""The stores the tests run on: the backends (``QE_BACKENDS``) and the Redis topologies
(``QE_TOPOLOGIES``)."""

from __future__ import annotations

import os

BACKENDS = [b for b in os.environ.get("QE_BACKENDS", "sqlite,redis").split(",") if b]

# SPEC 19.3/19.4: the Redis contract runs unchanged on Sentinel (a primary, a replica, three
# sentinels) and on Cluster (three primaries) too. ``QE_TOPOLOGIES`` picks them (default
# "sentinel,cluster"; "" for none).
TOPOLOGIES = (
    [t for t in os.environ.get("QE_TOPOLOGIES", "sentinel,cluster").split(",") if t] if "redis" in BACKENDS else []
)
STORES = BACKENDS + [f"redis-{t}" for t in TOPOLOGIES]
