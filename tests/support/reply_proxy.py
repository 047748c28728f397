"""A TCP proxy on loopback in front of a Redis server that loses replies: armed, it reads the
server's next reply on any connection and throws it away (the request reached the server and
was carried out; only its answer is lost). ``mode`` says what happens to that connection:
``"cut"`` closes it; ``"stall"`` keeps it open and silent both ways (a server or network that
stopped answering: the client hears nothing until its read times out); ``"drop"`` goes on
forwarding, so that the bytes lost may be part of a longer reply (the stream is out of step).
It outlives its server: a client connecting while the server is down is cut at once, and one
connecting after a restart reaches the new server on the same port."""

from __future__ import annotations

import socket
import threading


class ReplyProxy:
    def __init__(self, upstream_port: int, mode: str = "cut") -> None:
        assert mode in ("cut", "stall", "drop")
        self.upstream_port = upstream_port
        self.mode = mode
        self.stalled: set[int] = set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.marker: bytes | None = None
        self.to_cut = 0
        self.cut = 0
        self.lock = threading.Lock()
        self.armed_on: set[int] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def cut_next_reply(self) -> None:
        """The next reply from the server, on whichever connection, is lost."""
        with self.lock:
            self.to_cut += 1

    def cut_reply_to(self, marker: bytes) -> None:
        """The reply to the next request holding ``marker`` is lost."""
        self.marker = marker

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=1)
                upstream.settimeout(None)
            except OSError:
                client.close()  # the server is down: as a refused connection would be
                continue
            pair = (client, upstream)
            threading.Thread(target=self._pump, args=(client, upstream, pair, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, pair, True), daemon=True).start()

    def _take_cut(self, conn: int) -> bool:
        with self.lock:
            if conn in self.armed_on:
                self.armed_on.discard(conn)
            elif self.to_cut > 0:
                self.to_cut -= 1
            else:
                return False
            self.cut += 1
            return True

    def _pump(self, src: socket.socket, dst: socket.socket, pair: tuple[socket.socket, ...], replies: bool) -> None:
        conn = id(pair)
        try:
            while data := src.recv(1 << 16):
                if not replies and self.marker is not None and self.marker in data:
                    with self.lock:
                        self.marker = None
                        self.armed_on.add(conn)
                if replies and self._take_cut(conn):
                    if self.mode == "cut":
                        break
                    if self.mode == "stall":
                        self.stalled.add(conn)
                    continue
                if conn not in self.stalled:
                    dst.sendall(data)
        except OSError:
            pass
        with self.lock:
            self.armed_on.discard(conn)
            self.stalled.discard(conn)
        for s in pair:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
