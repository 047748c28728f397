"""Real ``redis-server`` processes on loopback for the tests (a server of a test's own, or the
session's), and where a Redis test runs (``RedisTarget``)."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import time
import uuid
from pathlib import Path

import pytest


def command(port: int, *args: str) -> bytes:
    """One command on a fresh connection to the server on ``port``, in RESP; returns the raw
    reply, whole (a bulk string read to its stated length)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(f"*{len(args)}\r\n".encode() + b"".join(f"${len(a)}\r\n{a}\r\n".encode() for a in args))
        reply = b""
        while True:
            chunk = c.recv(1 << 16)
            reply += chunk
            head, sep, _ = reply.partition(b"\r\n")
            if not chunk or (sep and not head.startswith(b"$")):
                return reply
            size = int(head[1:]) if sep else 0
            if sep and len(reply) >= len(head) + 2 + (size + 2 if size >= 0 else 0):
                return reply


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def server_exe() -> str | None:
    """The server binary the Redis tests start: ``QE_REDIS_SERVER`` (another build, such as a
    ``valkey-server``), else ``redis-server`` on the PATH."""
    return os.environ.get("QE_REDIS_SERVER") or shutil.which("redis-server")


def tls_files(d: Path) -> tuple[Path, Path, Path]:
    """A private CA and a certificate for 127.0.0.1 signed by it, good for a server and for
    a client (cluster nodes present it to each other): (CA file, cert file, key file)."""
    d.mkdir(parents=True, exist_ok=True)

    def openssl(args: str) -> None:
        subprocess.run(["openssl", *args.split()], cwd=d, check=True, capture_output=True)

    openssl("req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=qe-test-ca -keyout ca.key -out ca.pem")
    openssl("req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout node.key -out node.csr")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    openssl("x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile ext.cnf -out node.pem")
    return d / "ca.pem", d / "node.pem", d / "node.key"


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


def redis_location(server: RedisServer) -> str:
    """A fresh key prefix on the session's server: a store of its own."""
    return f"{server.url}?prefix=t{uuid.uuid4().hex[:12]}"


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
