"""Shared fixtures: a manual clock, a store (a SQLite file, or a prefix on a real
redis-server this session starts) and an engine on it.

Tests that take ``engine`` or ``store`` run once per backend. ``QE_BACKENDS=sqlite``
runs only the SQLite half (when no ``redis-server`` is installed)."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
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


BACKENDS = [b for b in os.environ.get("QE_BACKENDS", "sqlite,redis").split(",") if b]

# SPEC 19.3/19.4: the Redis contract runs unchanged on Sentinel (a primary, a replica, three
# sentinels) and on Cluster (three primaries) too. ``QE_TOPOLOGIES`` picks them (default
# "sentinel,cluster"; "" for none). Every module runs on them (about 3.5 minutes on a 2-core
# machine); ``QE_TOPOLOGY_SUITE=short`` runs only the modules of TOPOLOGY_SUITE there, a
# representative part (about 1 minute).
TOPOLOGIES = (
    [t for t in os.environ.get("QE_TOPOLOGIES", "sentinel,cluster").split(",") if t] if "redis" in BACKENDS else []
)
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
STORES = BACKENDS + [f"redis-{t}" for t in TOPOLOGIES]


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def server_exe() -> str | None:
    """The server binary the Redis tests start: ``QE_REDIS_SERVER`` (another build, such as a
    ``valkey-server``), else ``redis-server`` on the PATH."""
    return os.environ.get("QE_REDIS_SERVER") or shutil.which("redis-server")


class RedisServer:
    """A real ``redis-server`` on loopback, without persistence, in its own directory. With ``tls``
    (CA file, certificate file, key file) it speaks only TLS. With ``durable`` it keeps an
    append-only file synced before every reply, so that a restart loses nothing it answered for.
    ``exe`` picks another binary (an old release). ``extra`` are more arguments (a replica's
    ``--replicaof``, a cluster node's ``--cluster-enabled yes``); the server then reads a config
    file of its own in its directory, which a sentinel may rewrite."""

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        password: str | None = None,
        tls: tuple[Path, Path, Path] | None = None,
        bind: tuple[str, ...] = ("127.0.0.1",),
        durable: bool = False,
        exe: str | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        exe = exe or server_exe()
        if exe is None:
            pytest.fail("redis-server is not installed (apt-get install redis-server, or QE_BACKENDS=sqlite)")
        self.exe = exe
        self.workdir = workdir
        self.port = port or free_port()
        self.password = password
        self.tls = tls
        self.bind = bind
        self.durable = durable
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = ["--port", str(self.port), "--bind", *self.bind, "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always"] if self.durable else ["--appendonly", "no"]
        if self.bind != ("127.0.0.1",):
            args += ["--protected-mode", "no"]  # only on the addresses given
        if self.password:
            args += ["--requirepass", self.password]
        if self.tls:
            ca, cert, key = self.tls
            args[1] = "0"  # no plain port
            args += ["--tls-port", str(self.port), "--tls-ca-cert-file", str(ca)]
            args += ["--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-auth-clients", "no"]
        if self.extra:
            conf = self.workdir / "redis.conf"
            if not conf.exists():
                conf.write_text("")
            args = [str(conf), *args, *self.extra]
        self.proc = subprocess.Popen(
            [self.exe, *args],
            cwd=self.workdir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with self._connect() as c:
                    auth = f"AUTH {self.password}\r\n".encode() if self.password else b""
                    c.sendall(auth + b"PING\r\n")
                    time.sleep(0.01)
                    if c.recv(64).endswith(b"+PONG\r\n"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def _connect(self) -> socket.socket:
        c = socket.create_connection(("127.0.0.1", self.port), timeout=0.2)
        if not self.tls:
            return c
        return ssl.create_default_context(cafile=str(self.tls[0])).wrap_socket(c, server_hostname="127.0.0.1")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.kill()


def redis_location(server: RedisServer) -> str:
    """A fresh key prefix on the session's server: a store of its own."""
    return f"{server.url}?prefix=t{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A primary, a replica and three sentinels for the session (``redis_topologies``)."""
    from redis_topologies import SentinelSet

    topology = SentinelSet(tmp_path_factory.mktemp("sentinel"))
    yield topology
    topology.close()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A three-primary cluster for the session (``redis_topologies``)."""
    from redis_topologies import Cluster

    topology = Cluster(tmp_path_factory.mktemp("cluster"))
    yield topology
    topology.close()


class RedisTarget:
    """Where a test of the Redis backend's own behaviour runs: a server of the test's own, or
    the session's Sentinel set or Cluster (``redis_topologies``), with what the test needs to
    reach the data node behind a prefix."""

    def __init__(self, kind: str, server: RedisServer | None = None, topology: object = None) -> None:
        self.kind = kind
        self.server = server
        self.topology = topology

    def url(self, prefix: str | None = None) -> str:
        """A URL for `prefix` (a fresh one when None): a store of its own."""
        prefix = prefix or f"t{uuid.uuid4().hex[:12]}"
        if self.server is not None:
            return f"{self.server.url}?prefix={prefix}"
        return str(self.topology.url(prefix))  # type: ignore[attr-defined]

    def own_prefix(self, name: str) -> str:
        """`name` on a server of the test's own; on a session's topology, `name` made unique."""
        return name if self.server is not None else f"{name}{uuid.uuid4().hex[:8]}"

    def key(self, prefix: str, name: str) -> str:
        """The name on the server of the key `name` under `prefix` (on a cluster the prefix is
        the hash tag)."""
        return f"{{{prefix}}}:{name}" if self.kind == "redis-cluster" else f"{prefix}:{name}"

    def port(self, prefix: str) -> int:
        """The port of the data node holding `prefix`: the server, the primary, or the cluster
        node owning the prefix's slot."""
        if self.server is not None:
            return self.server.port
        if self.kind == "redis-sentinel":
            port: int | None = self.topology.primary_port()  # type: ignore[attr-defined]
            assert port is not None
            return port
        t = self.topology
        return int(t.owner(t.slot(f"{{{prefix}}}")))  # type: ignore[attr-defined]


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


# What each schema version added, undone newest first: `downgrade_schema` turns a file
# the engine made into one of an older version, to test migrating it forward.
_UNDO = {
    10: ["DROP TABLE priority_reserves", "DELETE FROM quotaengine_meta WHERE name = 'priority_reserves'"],
    9: [
        "DELETE FROM rate_limit_cooldowns WHERE key_id IS NULL OR source = 'upstream'",
        "CREATE TABLE rate_limit_cooldowns_v8 (platform TEXT NOT NULL, model_id TEXT NOT NULL, "
        "key_id INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL, source TEXT NOT NULL "
        "CHECK (source IN ('heuristic', 'authoritative', 'credit', 'tier')), set_at_ms INTEGER NOT NULL, "
        "PRIMARY KEY (platform, model_id, key_id))",
        "INSERT INTO rate_limit_cooldowns_v8 SELECT * FROM rate_limit_cooldowns",
        "DROP TABLE rate_limit_cooldowns",
        "ALTER TABLE rate_limit_cooldowns_v8 RENAME TO rate_limit_cooldowns",
        "DELETE FROM failure_history WHERE kind IN ('upstream', 'pool_minute', 'pool_day')",
        "CREATE TABLE failure_history_v8 (platform TEXT NOT NULL, model_id TEXT NOT NULL, "
        "key_id INTEGER NOT NULL, kind TEXT NOT NULL CHECK (kind IN ('ladder', 'unknown', 'auth', 'empty', "
        "'transient', 'concurrency')), hit_at_ms INTEGER NOT NULL, value INTEGER)",
        "INSERT INTO failure_history_v8 SELECT * FROM failure_history",
        "DROP TABLE failure_history",
        "ALTER TABLE failure_history_v8 RENAME TO failure_history",
        "CREATE INDEX idx_failure_history_key ON failure_history (key_id)",
    ],
    8: ["ALTER TABLE api_keys DROP COLUMN concurrency_cap"],
    7: [
        "DELETE FROM failure_history WHERE kind IN ('transient', 'concurrency')",
        "CREATE TABLE failure_history_v6 (platform TEXT NOT NULL, model_id TEXT NOT NULL, "
        "key_id INTEGER NOT NULL, kind TEXT NOT NULL CHECK (kind IN ('ladder', 'unknown', 'auth', 'empty')), "
        "hit_at_ms INTEGER NOT NULL)",
        "INSERT INTO failure_history_v6 SELECT platform, model_id, key_id, kind, hit_at_ms FROM failure_history",
        "DROP TABLE failure_history",
        "ALTER TABLE failure_history_v6 RENAME TO failure_history",
        "CREATE INDEX idx_failure_history_key ON failure_history (key_id)",
    ],
    6: ["ALTER TABLE api_keys DROP COLUMN account"],
    5: [
        "ALTER TABLE rate_limit_usage DROP COLUMN input_tokens",
        "ALTER TABLE rate_limit_usage DROP COLUMN output_tokens",
        "ALTER TABLE rate_limit_usage DROP COLUMN cached_tokens",
        "ALTER TABLE quota_leases DROP COLUMN output_tokens",
    ],
    4: ["ALTER TABLE models DROP COLUMN limits"],
    3: ["DROP TABLE platform_calendars", "DELETE FROM quotaengine_meta WHERE name = 'platform_calendars'"],
}


def downgrade_schema(con: object, version: int) -> None:
    """Back to schema `version` on an open sqlite3 connection (inside the caller's `with con`)."""
    current = con.execute("PRAGMA user_version").fetchone()[0]  # type: ignore[attr-defined]
    for v in range(current, version, -1):
        for sql in _UNDO.get(v, []):
            con.execute(sql)  # type: ignore[attr-defined]
    con.execute(f"PRAGMA user_version = {version}")  # type: ignore[attr-defined]
