"""Real Redis topologies for the tests (SPEC 19.3, 19.4): a primary with replicas under three
sentinels, and a three-primary cluster, each of real ``redis-server`` processes on loopback
ports in a directory of their own. Administration goes through ``redis-cli`` (installed with
``redis-server``)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from redis_servers import RedisServer, free_port, server_exe

SERVICE = "qe"


def cli(port: int, *args: str, password: str | None = None, ca: Path | None = None) -> str:
    """One command through ``redis-cli`` (over TLS trusting ``ca`` when given); its printed
    reply, stripped."""
    exe = shutil.which("redis-cli")
    if exe is None:
        pytest.fail("redis-cli is not installed (it comes with Debian's redis-server package)")
    auth = ["-a", password, "--no-auth-warning"] if password else []
    tls = ["--tls", "--cacert", str(ca)] if ca else []
    r = subprocess.run([exe, "-p", str(port), *tls, *auth, *args], capture_output=True, text=True, timeout=60)
    return r.stdout.strip()


def info(port: int, section: str, ca: Path | None = None) -> dict[str, str]:
    out = {}
    for line in cli(port, "INFO", section, ca=ca).splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            out[k] = v.strip()
    return out


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def calls(port: int, *names: str, ca: Path | None = None) -> int:
    """How many of the named commands (``INFO commandstats`` names: ``evalsha``,
    ``sentinel|get-master-addr-by-name``...) a server has answered."""
    n = 0
    for line in cli(port, "INFO", "commandstats", ca=ca).splitlines():
        name, _, rest = line.partition(":")
        if name.removeprefix("cmdstat_") in names:
            n += int(rest.split("calls=")[1].split(",")[0])
    return n


class Sentinel:
    """One ``redis-server --sentinel`` monitoring ``SERVICE``."""

    def __init__(
        self,
        workdir: Path,
        primary_port: int,
        down_after_ms: int,
        auth_pass: str | None = None,
        requirepass: str | None = None,
        tls: tuple[Path, Path, Path] | None = None,
    ) -> None:
        """``auth_pass``: the data nodes' password; ``requirepass``: this sentinel's own; ``tls``
        (CA, certificate, key): it speaks only TLS, to clients, the data nodes and the other
        sentinels."""
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.port = free_port()
        self.password = requirepass
        self.ca = tls[0] if tls else None
        ports = (
            f"port 0\ntls-port {self.port}\ntls-ca-cert-file {tls[0]}\ntls-cert-file {tls[1]}\n"
            f"tls-key-file {tls[2]}\ntls-auth-clients no\ntls-replication yes\n"
            if tls
            else f"port {self.port}\n"
        )
        (workdir / "sentinel.conf").write_text(
            f"{ports}bind 127.0.0.1\ndaemonize no\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n"
            f"sentinel failover-timeout {SERVICE} 4000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
            + (f"sentinel auth-pass {SERVICE} {auth_pass}\n" if auth_pass else "")
            + (f"requirepass {requirepass}\n" if requirepass else "")
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        exe = server_exe()
        assert exe is not None
        self.proc = subprocess.Popen(
            [exe, str(self.workdir / "sentinel.conf"), "--sentinel"],
            cwd=self.workdir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(
            lambda: cli(self.port, "PING", password=self.password, ca=self.ca) == "PONG", 10, f"sentinel on {self.port}"
        )

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


class SentinelSet:
    """A primary, ``replicas`` replicas and three sentinels (quorum 2). With ``tls`` (CA,
    certificate, key) every one of them speaks only TLS (replication and the sentinels' links
    too)."""

    def __init__(
        self, workdir: Path, replicas: int = 1, down_after_ms: int = 1000, tls: tuple[Path, Path, Path] | None = None
    ) -> None:
        self.workdir = workdir
        self.ca = tls[0] if tls else None
        # Every data node reads a config file of its own, which the sentinels rewrite.
        keep = ("--appendonly", "no", *(("--tls-replication", "yes") if tls else ()))
        self.servers = [RedisServer(workdir / "n0", tls=tls, extra=keep)]
        primary = self.servers[0].port
        for i in range(replicas):
            replica = (*keep, "--replicaof", "127.0.0.1", str(primary))
            self.servers.append(RedisServer(workdir / f"n{i + 1}", tls=tls, extra=replica))
        self.sentinels: list[Sentinel] = []
        try:
            self.sentinels = [Sentinel(workdir / f"s{i}", primary, down_after_ms, tls=tls) for i in range(3)]
            self.wait_settled()
        except BaseException:
            self.close()
            raise

    def wait_settled(self, timeout: float = 30) -> None:
        """Until every sentinel agrees on the primary, knows the other two sentinels and
        every live replica, and those replicas are in sync."""
        live = [s for s in self.servers if s.proc is not None]

        def settled() -> bool:
            primary = self.primary_port()
            if primary is None:
                return False
            for s in self.sentinels:
                named = cli(s.port, "SENTINEL", "get-master-addr-by-name", SERVICE, ca=self.ca).split()
                if named != ["127.0.0.1", str(primary)]:
                    return False
                master = cli(s.port, "SENTINEL", "master", SERVICE, ca=self.ca).split("\n")
                fields = dict(zip(master[::2], master[1::2], strict=False))
                if fields.get("num-other-sentinels") != "2" or fields.get("num-slaves") != str(len(live) - 1):
                    return False
                if "master" not in fields.get("flags", "") or "down" in fields.get("flags", ""):
                    return False
            for r in live:
                if r.port != primary:
                    rep = info(r.port, "replication", self.ca)
                    if rep.get("role") != "slave" or rep.get("master_link_status") != "up":
                        return False
                    if rep.get("master_port") != str(primary):
                        return False
            return info(primary, "replication", self.ca).get("connected_slaves") == str(len(live) - 1)

        wait_until(settled, timeout, "the sentinels and replicas to settle")

    def wait_replicated(self, timeout: float = 20) -> None:
        """Until every live replica has everything the primary holds (replication offsets)."""
        primary = self.primary()
        offset = int(info(primary.port, "replication", self.ca)["master_repl_offset"])
        replicas = [s for s in self.servers if s.proc is not None and s is not primary]

        def caught_up() -> bool:
            return all(
                int(info(r.port, "replication", self.ca).get("slave_repl_offset", "-1")) >= offset for r in replicas
            )

        wait_until(caught_up, timeout, "the replicas to catch up")

    def url(self, prefix: str | None = None, query: str = "") -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        prefix = prefix or f"t{uuid.uuid4().hex[:12]}"
        scheme, ca = ("rediss", f"&ssl_ca_certs={self.ca}") if self.ca else ("redis", "")
        return f"{scheme}+sentinel://{hosts}/{SERVICE}?prefix={prefix}{ca}{'&' + query if query else ''}"

    def primary_port(self) -> int | None:
        """The primary's port as the first sentinel that answers names it."""
        for s in self.sentinels:
            if s.proc is None:
                continue
            out = cli(s.port, "SENTINEL", "get-master-addr-by-name", SERVICE, ca=self.ca).split()
            if len(out) == 2:
                return int(out[1])
        return None

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def primary(self) -> RedisServer:
        port = self.primary_port()
        assert port is not None
        return self.server(port)

    def wait_new_primary(self, old: int, timeout: float = 30) -> int:
        """Until the sentinels name a primary other than `old` and it says it is one."""

        def moved() -> bool:
            port = self.primary_port()
            return port is not None and port != old and info(port, "replication", self.ca).get("role") == "master"

        wait_until(moved, timeout, "a failover")
        port = self.primary_port()
        assert port is not None
        return port

    def failover(self) -> int:
        """``SENTINEL FAILOVER``: a replica promoted, the old primary demoted. Returns the new
        primary's port."""
        old = self.primary_port()
        assert old is not None
        assert cli(self.sentinels[0].port, "SENTINEL", "FAILOVER", SERVICE, ca=self.ca) == "OK"
        return self.wait_new_primary(old)

    def close(self) -> None:
        for s in self.sentinels:
            s.kill()
        for r in self.servers:
            r.kill()


class Cluster:
    """``n`` primaries with every slot assigned (``redis-cli --cluster create``), each with
    ``replicas`` replicas of its own."""

    def __init__(
        self,
        workdir: Path,
        n: int = 3,
        tls: tuple[Path, Path, Path] | None = None,
        replicas: int = 0,
        node_timeout_ms: int = 3000,
    ) -> None:
        """``tls``: (CA, certificate, key): the nodes speak only TLS, to clients and each other.
        ``node_timeout_ms``: how long a node may not answer before the others count it failed
        (and its replica takes over)."""
        self.ca = tls[0] if tls else None
        self.primaries = n
        self.workdir, self.tls, self.node_timeout_ms = workdir, tls, node_timeout_ms
        self.hung: set[int] = set()
        self.nodes = [self.new_node(i) for i in range(n * (1 + replicas))]
        exe = shutil.which("redis-cli")
        if exe is None:
            pytest.fail("redis-cli is not installed (it comes with Debian's redis-server package)")
        hosts = [f"127.0.0.1:{node.port}" for node in self.nodes]
        tls_args = ["--tls", "--cacert", str(self.ca)] if self.ca else []
        try:
            subprocess.run(
                [exe, *tls_args, "--cluster", "create", *hosts, "--cluster-replicas", str(replicas), "--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=60,
            )
            wait_until(self.ok, 30, "the cluster to form")
        except BaseException:
            self.close()
            raise

    def new_node(self, i: int) -> RedisServer:
        return RedisServer(
            self.workdir / f"c{i}",
            tls=self.tls,
            extra=(
                *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
                *("--cluster-node-timeout", str(self.node_timeout_ms), "--cluster-port", str(free_port())),
                *(("--tls-cluster", "yes") if self.tls else ()),
            ),
        )

    def add_replica(self, primary: int) -> int:
        """A new node joined to the cluster as a replica of the primary on `primary`, in sync.
        Returns its port."""
        node = self.new_node(len(self.nodes))
        self.nodes.append(node)
        bus = next(r["bus"] for r in self.table() if r["port"] == primary)
        assert cli(node.port, "CLUSTER", "MEET", "127.0.0.1", str(primary), str(bus), ca=self.ca) == "OK"
        wait_until(lambda: len(self.table()) == len(self.nodes), 20, "the new node to be known")
        primary_id = self.node_id(primary)
        wait_until(lambda: primary_id in cli(node.port, "CLUSTER", "NODES", ca=self.ca), 20, "the new node to meet")
        assert cli(node.port, "CLUSTER", "REPLICATE", primary_id, ca=self.ca) == "OK"
        wait_until(self.ok, 30, "the new replica to join")
        return node.port

    def live(self) -> list[RedisServer]:
        """The nodes running and not hung."""
        return [node for node in self.nodes if node.proc is not None and node.port not in self.hung]

    def hang(self, port: int) -> None:
        """SIGSTOP: the node keeps its connections but answers nothing until `wake`."""
        proc = self.node(port).proc
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)
        self.hung.add(port)

    def wake(self, port: int) -> None:
        proc = self.node(port).proc
        assert proc is not None
        proc.send_signal(signal.SIGCONT)
        self.hung.discard(port)

    def ok(self) -> bool:
        """Every live node knows every node, sees every slot served, and each live replica is
        in sync with its primary."""
        for node in self.live():
            i = info_lines(cli(node.port, "CLUSTER", "INFO", ca=self.ca))
            if i.get("cluster_state") != "ok" or i.get("cluster_known_nodes") != str(len(self.nodes)):
                return False
            if i.get("cluster_slots_ok") != "16384":
                return False
            rep = info_lines(cli(node.port, "INFO", "replication", ca=self.ca))
            if rep.get("role") == "slave" and rep.get("master_link_status") != "up":
                return False
        table = self.table()
        if any("fail" in r["flags"] or "fail?" in r["flags"] for r in table):
            return False
        return sum(1 for r in table if "master" in r["flags"] and r["slots"]) == self.primaries

    def table(self) -> list[dict[str, Any]]:
        """``CLUSTER NODES`` as a live node sees it: one dict a node (id, port, cluster bus port,
        flags, the id of its primary or "-", its slot ranges)."""
        node = self.live()[0]
        rows = []
        for line in cli(node.port, "CLUSTER", "NODES", ca=self.ca).splitlines():
            fields = line.split()
            slots = []
            for r in fields[8:]:
                if r.startswith("["):
                    continue
                lo, _, hi = r.partition("-")
                slots.append((int(lo), int(hi or lo)))
            addr, _, bus = fields[1].partition("@")
            port, bus = int(addr.rsplit(":", 1)[1]), int(bus.split(",")[0])
            rows.append(
                {
                    "id": fields[0],
                    "port": port,
                    "bus": bus,
                    "flags": fields[2].split(","),
                    "master": fields[3],
                    "slots": slots,
                }
            )
        return rows

    def node(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def replica_of(self, port: int, timeout: float = 10) -> int:
        """The port of a replica of the primary on `port` (the node asked may not list it yet
        just after the cluster formed: asked again until it does, up to `timeout` s)."""
        deadline = time.monotonic() + timeout
        while True:
            table = self.table()
            primary = next(r["id"] for r in table if r["port"] == port)
            replicas = [r["port"] for r in table if r["master"] == primary and "fail" not in r["flags"]]
            if replicas or time.monotonic() > deadline:
                return next(iter(replicas))
            time.sleep(0.1)

    def wait_replicated(self, port: int, timeout: float = 20) -> None:
        """Until every replica of the primary on `port` has everything it holds."""
        offset = int(info(port, "replication")["master_repl_offset"])
        table = self.table()
        primary = next(r["id"] for r in table if r["port"] == port)
        replicas = [r["port"] for r in table if r["master"] == primary]

        def caught_up() -> bool:
            return all(int(info(r, "replication").get("slave_repl_offset", "-1")) >= offset for r in replicas)

        wait_until(caught_up, timeout, "the replicas to catch up")

    def wait_owner(self, slot: int, old: int, timeout: float = 30) -> int:
        """Until every live node names a primary other than `old` for `slot`, and that node says
        it is a primary. Returns its port."""

        def moved() -> bool:
            owners = set()
            for node in self.live():
                reply = cli(node.port, "CLUSTER", "NODES", ca=self.ca)
                owners.add(owner_in(reply, slot))
            if len(owners) != 1:
                return False
            port = owners.pop()
            return port is not None and port != old and info(port, "replication").get("role") == "master"

        wait_until(moved, timeout, f"a new owner of slot {slot}")
        return self.owner(slot)

    def url(self, prefix: str | None = None, query: str = "") -> str:
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        prefix = prefix or f"t{uuid.uuid4().hex[:12]}"
        scheme, ca = ("rediss", f"&ssl_ca_certs={self.ca}") if self.ca else ("redis", "")
        return f"{scheme}+cluster://{hosts}/?prefix={prefix}{ca}{'&' + query if query else ''}"

    def slot(self, key: str) -> int:
        return int(cli(self.nodes[0].port, "CLUSTER", "KEYSLOT", key))

    def node_id(self, port: int) -> str:
        return cli(port, "CLUSTER", "MYID")

    def owner(self, slot: int) -> int:
        """The port of the node serving `slot`, as a live node sees it."""
        port = owner_in(cli(self.live()[0].port, "CLUSTER", "NODES", ca=self.ca), slot)
        if port is None:
            raise AssertionError(f"no owner for slot {slot}")
        return port

    def keys_in(self, port: int, slot: int) -> list[str]:
        out = cli(port, "CLUSTER", "GETKEYSINSLOT", str(slot), "100000")
        return [k for k in out.splitlines() if k]

    def begin_migration(self, slot: int, src: int, dst: int) -> None:
        """Slot `slot` marked importing on `dst` and migrating on `src`, its keys moved (so the
        source answers ASK), the slot not yet handed over."""
        assert cli(dst, "CLUSTER", "SETSLOT", str(slot), "IMPORTING", self.node_id(src)) == "OK"
        assert cli(src, "CLUSTER", "SETSLOT", str(slot), "MIGRATING", self.node_id(dst)) == "OK"
        keys = self.keys_in(src, slot)
        if keys:
            out = cli(src, "MIGRATE", "127.0.0.1", str(dst), "", "0", "5000", "KEYS", *keys)
            assert out == "OK", out

    def end_migration(self, slot: int, dst: int) -> None:
        """The slot handed over to `dst` on every node (the source then answers MOVED)."""
        for node in self.nodes:
            assert cli(node.port, "CLUSTER", "SETSLOT", str(slot), "NODE", self.node_id(dst)) == "OK"

    def close(self) -> None:
        for port in list(self.hung):
            self.wake(port)
        for node in self.nodes:
            node.kill()


def owner_in(nodes: str, slot: int) -> int | None:
    """The port of the primary serving `slot` in a ``CLUSTER NODES`` reply (None when none)."""
    for line in nodes.splitlines():
        fields = line.split()
        if "master" not in fields[2].split(",") or "fail" in fields[2].split(","):
            continue
        port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
        for r in fields[8:]:
            if r.startswith("["):
                continue
            lo, _, hi = r.partition("-")
            if int(lo) <= slot <= int(hi or lo):
                return port
    return None


def info_lines(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            out[k] = v.strip()
    return out
