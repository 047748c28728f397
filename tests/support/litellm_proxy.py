"""The real LiteLLM proxy (``litellm --config ...``) in a process group of its own, for the
SPEC 25.3 tests: started from this venv's interpreter (``python -m
litellm.proxy.proxy_cli``), without a database, with the local model cost map; ready when
it answers ``/health/liveliness``; killed with its workers (SIGKILL of the group: its
gunicorn and uvicorn workers take ~40 s to stop on SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

# The proxy refuses to start without a master key (or with a weak one).
MASTER_KEY = "sk-" + "5f0c9a" * 8
AUTH = {"authorization": f"Bearer {MASTER_KEY}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiteLLMProxy:
    def __init__(
        self,
        workdir: Path,
        config: dict[str, Any],
        env: dict[str, str],
        *,
        workers: int = 1,
        gunicorn: bool = False,
        start_timeout_s: float = 60.0,
        wait: bool = True,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        path = workdir / "config.yaml"
        path.write_text(json.dumps(config))  # JSON is YAML
        self.log = workdir / f"proxy-{self.port}.log"
        args = [sys.executable, "-m", "litellm.proxy.proxy_cli", "--config", str(path), "--port", str(self.port)]
        args += ["--host", "127.0.0.1", "--num_workers", str(workers)]
        if gunicorn:
            args.append("--run_gunicorn")
        elif workers > 1:
            # uvicorn's supervisor kills a worker that has not answered its health check in
            # 5 s; importing the proxy takes longer than that on a busy machine.
            args += ["--timeout_worker_healthcheck", "120"]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("QUOTAENGINE_", "DATABASE_URL"))}
        full_env.update({"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MASTER_KEY": MASTER_KEY, **env})
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                args, cwd=workdir, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.start_timeout_s = start_timeout_s
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Returns when the proxy answers (``wait=False`` starts it without waiting, so that
        several proxies start at once)."""
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the proxy exited: {self.output()}")
            try:
                if httpx.get(f"{self.url}/health/liveliness", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the proxy did not start: {self.output()}")
            time.sleep(0.2)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
