"""A real browser for the tests: Debian's ``chromium`` headless, driven through the
DevTools protocol over ``--remote-debugging-pipe`` (file descriptors 3 and 4,
NUL-separated JSON), so that nothing beyond the standard library is needed."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
]

# argv: the read end, the write end, then the browser's command line.
_PLACE_FDS = """
import fcntl, os, sys
r, w = int(sys.argv[1]), int(sys.argv[2])
a, b = fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, 10), fcntl.fcntl(w, fcntl.F_DUPFD_CLOEXEC, 10)
for fd in {r, w} - {3, 4}:
    os.close(fd)
os.dup2(a, 3)
os.dup2(b, 4)
os.execv(sys.argv[3], sys.argv[3:])
"""


class Chromium:
    """One headless browser with one page; ``call`` sends a DevTools command to it."""

    def __init__(self, profile: Path) -> None:
        exe = chromium_path()
        assert exe, "chromium is not installed: apt-get install chromium (bash .ci/run installs it)"
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        # The protocol's ends must be descriptors 3 and 4 of the browser. A small Python
        # step puts them there and execs chromium: no preexec_fn (it would run the
        # engine's at-fork handlers and is unsafe with threads).
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _PLACE_FDS, str(to_child_r), str(from_child_w), exe, *_FLAGS]
            + [f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(to_child_r, from_child_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._from_child, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"chromium exited ({self.proc.poll()})")
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))

    def page(self, method: str, **params: Any) -> dict[str, Any]:
        return self.call(method, session=True, **params)

    def viewport(self, width: int, height: int, mobile: bool = False) -> None:
        self.page(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=mobile,
        )

    def goto(self, url: str) -> None:
        self.page("Page.navigate", url=url)

    def eval(self, expression: str) -> Any:
        got = self.page("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in got:
            raise RuntimeError(f"{expression}: {got['exceptionDetails']}")
        return got["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 10.0) -> Any:
        """Evaluates ``expression`` until it is truthy in JavaScript (the page's own timers run in between)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                value = self.eval(f"!!({expression})")
            except RuntimeError:
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not true within {timeout_s} s: {expression}")
            time.sleep(0.1)

    def screenshot(self, path: Path) -> None:
        data = self.page("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)
