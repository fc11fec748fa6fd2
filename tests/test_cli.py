"""``cproxy serve`` as a real subprocess: config file, flags, graceful SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from cproxy.cli import main
from tests.support import RunningServer, wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(data_dir: Path, config: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "cproxy.cli",
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--config",
        str(config),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"server exited: {proc.stdout.read().decode() if proc.stdout else ''}"
            )
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, 30, 0.05, "server ready")
    return proc


@pytest.mark.slow
def test_sigterm_persists_progress_and_config_file_declares_topics_and_groups(
    tmp_path: Path,
) -> None:
    config = tmp_path / "cproxy.toml"
    # A 10-minute commit interval: only the shutdown commit can persist the acks below.
    config.write_text(
        "[server]\ncommit_interval_ms = 600000\n"
        "[topics.rides]\nqueues = 2\n"
        '[groups.billing]\ntopics = { rides = { order_by = "key" } }\n'
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve(tmp_path / "data", config, port)
    try:
        with httpx.Client(base_url=url, timeout=10) as c:
            msgs = [{"key": f"k{i}", "body": i} for i in range(10)]
            assert c.post("/v1/topics/rides/messages", json={"messages": msgs}).status_code == 200
            got: list[dict[str, object]] = []

            def pulled_all() -> bool:
                body = {"max_messages": 10, "wait_ms": 500}
                got.extend(c.post("/v1/groups/billing/pull", json=body).json()["messages"])
                return len(got) == 10

            wait_until(pulled_all, 10, 0, "all 10 messages")
            results = [{"topic": "rides", "qid": m["qid"], "acks": [m["offset"]]} for m in got]
            r = c.post("/v1/groups/billing/ack", json={"results": results})
            assert r.json()["applied"] == 10
        proc.send_signal(signal.SIGTERM)
        # uvicorn re-raises the captured SIGTERM after its graceful shutdown.
        assert proc.wait(20) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
    proc = serve(tmp_path / "data", config, port)
    try:
        with httpx.Client(base_url=url, timeout=10) as c:
            again = c.post(
                "/v1/groups/billing/pull", json={"max_messages": 10, "wait_ms": 300}
            ).json()["messages"]
            assert again == []
            stats = c.get("/v1/groups/billing").json()["stats"]
            assert sum(q["committed_offset"] for q in stats["queues"]) == 10
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_bad_config_file_fails_fast_with_a_clear_message(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[groups.g]\ntopics = { t = { order_by = "$..x" } }\n')
    out = subprocess.run(
        [sys.executable, "-m", "cproxy.cli", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ},
    )
    assert out.returncode != 0
    assert "groups.g" in out.stderr and "recursive descent" in out.stderr


def test_client_commands_against_a_real_server(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(*args: str) -> Any:
        main([*args[:1], "--url", server.url, *args[1:]])
        out = capsys.readouterr().out
        return json.loads(out) if out.lstrip().startswith("{") else out

    assert run("topics", "create", "rides", "--queues", "2") == {"name": "rides", "queues": 2}
    assert run("topics")["topics"] == [{"name": "rides", "queues": 2}]
    produced = run("produce", "rides", '{"event": "call"}', "--key", "ride-7", "--id", "e1")
    assert produced["results"][0]["duplicate"] is False
    with server.client() as c:
        c.put("/v1/groups/billing", json={"topics": {"rides": {"order_by": "key"}}})
    assert run("groups")["groups"] == [{"name": "billing", "topics": ["rides"]}]
    tailed = run("tail", "billing", "--count", "1")  # one JSON line per message
    assert tailed["body"] == {"event": "call"} and tailed["key"] == "ride-7"
    shown = run("groups", "billing")
    assert shown["stats"]["in_flight"] == 0  # tail acked what it printed
    with pytest.raises(SystemExit, match="topic_not_found"):
        main(["produce", "--url", server.url, "nope", "{}"])
