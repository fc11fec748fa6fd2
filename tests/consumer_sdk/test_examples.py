"""The examples run as a newcomer would run them: as scripts, against a real server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from consumer_sdk import Client
from tests.support import RunningServer, wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def start(script: str, url: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES.parent)}
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / script), url],
        cwd=cwd,
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )


def collect(proc: subprocess.Popen[str]) -> list[str]:
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        lines.extend(proc.stderr)

    threading.Thread(target=read, daemon=True).start()
    return lines


def test_quickstart_handles_rides_in_order_and_stops_on_ctrl_c(
    server: RunningServer, tmp_path: Path
) -> None:
    proc = start("consumer_quickstart.py", server.url, tmp_path)
    lines = collect(proc)
    try:
        wait_until(
            lambda: sum("handled ride" in line for line in lines) == 12,
            30,
            message="12 ride events handled",
        )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, "".join(lines)
    finally:
        proc.kill()
    for ride in range(3):
        events = [line.split()[-3] for line in lines if f"handled ride {ride} " in line]
        assert events == ["requested", "accepted", "pickup", "dropoff"]
    assert any("pickup (attempt 2)" in line for line in lines)
    with Client(server.url) as client:
        assert client.get_group("quickstart")["stats"]["in_flight"] == 0


def test_async_example_consumes_nine_orders_and_exits(
    server: RunningServer, tmp_path: Path
) -> None:
    proc = start("consumer_async.py", server.url, tmp_path)
    lines = collect(proc)
    try:
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    wait_until(lambda: sum(" step " in line for line in lines) == 9, 5, message="output read")
