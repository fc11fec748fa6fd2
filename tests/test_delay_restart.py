"""Acceptance: delays survive a SIGKILL of the real server process.

Keyed and unordered messages are produced with delays (some far enough off to be released
from memory: sleeping keys, the unordered delay window), plus undelayed messages that are
consumed at once. Once that progress is committed the server is SIGKILLed and restarted on the
same data. Then no delayed message is delivered before its time, each is delivered, each key's
messages stay in order, and nothing acked before the kill comes back.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import wait_until
from tests.test_kill_restart import ServerProcess

pytestmark = pytest.mark.slow

KEYS = 20
DELAY_MS = 6000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture
def server_proc(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path)
    try:
        yield server
    finally:
        server.kill()


def pull(client: httpx.Client, results: list[Any], wait_ms: int = 300) -> list[dict[str, Any]]:
    r = client.post(
        "/v1/groups/g/pull", json={"max_messages": 100, "wait_ms": wait_ms, "results": results}
    )
    assert r.status_code == 200, r.text
    return list(r.json()["messages"])


def acks(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    grouped: dict[tuple[str, int], list[int]] = {}
    for m in batch:
        grouped.setdefault((m["topic"], m["qid"]), []).append(m["offset"])
    return [{"topic": t, "qid": q, "acks": offs} for (t, q), offs in grouped.items()]


def persisted_read_to(data_dir: Path) -> int | None:
    """How far the group's persisted progress says it read, over both queues, once nothing
    is persisted as held in memory (else None); read from the server's SQLite file, as a
    restart will."""
    conn = sqlite3.connect(f"file:{data_dir / 'cproxy.db'}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT finished FROM progress WHERE grp = 'g'").fetchall()
    finally:
        conn.close()
    details = [json.loads(detail) for (detail,) in rows]
    if not all(isinstance(d, dict) and not d["open"] for d in details):
        return None
    return sum(d["read_to"] for d in details)


def test_delays_survive_a_sigkill(server_proc: ServerProcess) -> None:
    server_proc.start()
    with httpx.Client(base_url=server_proc.url, timeout=10) as client:
        assert client.post("/v1/topics", json={"name": "t", "queues": 2}).status_code == 201
        group = {"topics": {"t": {"order_by": "key"}}, "ack_timeout_ms": 60_000}
        assert client.put("/v1/groups/g", json=group).status_code == 200
        due = now_ms() + DELAY_MS
        messages: list[dict[str, Any]] = []
        for k in range(KEYS):
            messages += [
                {"key": f"k{k}", "body": f"k{k}-0", "deliver_at_ms": due},
                {"key": f"k{k}", "body": f"k{k}-1"},  # behind its delayed head
                {"body": f"u{k}", "deliver_at_ms": due},  # unordered
                {"key": f"free{k}", "body": "free"},
            ]
        r = client.post("/v1/topics/t/messages", json={"messages": messages})
        assert r.status_code == 200, r.text
        free = pull(client, [], wait_ms=1000)
        while len(free) < KEYS:
            free += pull(client, [], wait_ms=500)
        assert {m["body"] for m in free} == {"free"}
        pull(client, acks(free), wait_ms=0)
        assert client.get("/v1/groups/g").json()["stats"]["delayed"] == 2 * KEYS
        # Kill once everything read is persisted (the committed offsets stay at the first
        # delayed message, so they cannot tell).
        total = len(messages)
        wait_until(
            lambda: persisted_read_to(server_proc.data_dir) == total, 5, 0.05, "progress committed"
        )
        in_memory = client.get("/v1/groups/g").json()["stats"]
        assert in_memory["in_flight"] == 0
    server_proc.kill()
    server_proc.start()
    received: list[tuple[int, dict[str, Any]]] = []
    with httpx.Client(base_url=server_proc.url, timeout=10) as client:
        results: list[Any] = []
        deadline = time.monotonic() + DELAY_MS / 1000 + 15
        while len(received) < 3 * KEYS and time.monotonic() < deadline:
            batch = pull(client, results)
            at = now_ms()
            received += [(at, m) for m in batch]
            results = acks(batch)
        pull(client, results, wait_ms=0)
        stats = client.get("/v1/groups/g").json()["stats"]
    bodies = [m["body"] for _, m in received]
    assert "free" not in bodies  # acked before the kill: not delivered again
    expected = [f"k{k}-{i}" for k in range(KEYS) for i in (0, 1)] + [f"u{k}" for k in range(KEYS)]
    assert sorted(bodies) == sorted(expected)
    early = [(m["body"], due - at) for at, m in received if at < due]
    assert not early, f"delivered before deliver_at_ms: {early}"
    for k in range(KEYS):
        assert bodies.index(f"k{k}-0") < bodies.index(f"k{k}-1")
    assert stats["delayed"] == 0
