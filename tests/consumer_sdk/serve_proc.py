"""``cproxy serve`` in a subprocess, for tests that stop (SIGSTOP) or kill the server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServeProcess:
    """One ``python -m cproxy serve`` on a free loopback port and its own data dir."""

    def __init__(
        self, root: Path, *args: str, port: int = 0, env: dict[str, str] | None = None
    ) -> None:
        """``port``: a given one (a restart on the same address); 0 picks a free one."""
        root.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = root / "server.log"
        cmd = [sys.executable, "-m", "cproxy", "serve", "--port", str(self.port),
               "--data-dir", str(root / "data"), *args]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )
        wait_until(self._ready, 30, 0.05, "server /readyz")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
        try:
            return httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
