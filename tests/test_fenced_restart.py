"""Acceptance: delivery numbers keep growing across a SIGKILL and a graceful restart.

docs/guarantees.md, fenced deliveries: the real server (``cproxy serve``, a subprocess) hands
a message out, is killed (or stopped) before the result arrives and restarted on the same
data; the message is handed out again under a number above every one handed out before, so
the late fenced ack for the delivery of before the restart is ``unknown`` and changes nothing,
while the consumer that holds the new delivery acks it. A message stored after the restart
starts at 1.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import wait_until
from tests.test_kill_restart import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def server_proc(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path)
    try:
        yield server
    finally:
        server.kill()


def pull(url: str, results: list[Any] | None = None, wait_ms: int = 2000) -> dict[str, Any]:
    body = {"max_messages": 10, "wait_ms": wait_ms, "results": results or []}
    r = httpx.post(f"{url}/v1/groups/g/pull", json=body, timeout=10)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def fenced_ack(m: dict[str, Any]) -> dict[str, Any]:
    return {
        "topic": m["topic"],
        "qid": m["qid"],
        "acks": [{"offset": m["offset"], "attempt": m["attempt"]}],
    }


def committed(url: str) -> int:
    stats = httpx.get(f"{url}/v1/groups/g", timeout=10).json()["stats"]
    return int(stats["queues"][0]["committed_offset"])


def produce(url: str, key: str) -> None:
    r = httpx.post(
        f"{url}/v1/topics/t/messages", json={"messages": [{"key": key, "body": {}}]}, timeout=10
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("graceful", [False, True], ids=["sigkill", "sigterm"])
def test_a_late_ack_from_before_a_restart_is_unknown(
    server_proc: ServerProcess, graceful: bool
) -> None:
    server_proc.start()
    url = server_proc.url
    assert httpx.post(f"{url}/v1/topics", json={"name": "t", "queues": 1}).status_code == 201
    group = {"topics": {"t": {"order_by": "key"}}, "ack_timeout_ms": 600_000}
    assert httpx.put(f"{url}/v1/groups/g", json=group).status_code == 200
    produce(url, "a")
    (before,) = pull(url)["messages"]
    assert (before["attempt"], before["charged_attempts"]) == (1, 0)
    if graceful:
        server_proc.terminate()
    else:
        server_proc.kill()
    server_proc.start()
    url = server_proc.url
    (after,) = pull(url)["messages"]
    assert after["offset"] == before["offset"]
    assert after["attempt"] > before["attempt"] and after["charged_attempts"] == 0
    # The consumer of before the restart finally answers: its ack names the old delivery.
    late = pull(url, [fenced_ack(before)], wait_ms=0)
    assert late["results"]["applied"] == 0
    assert late["results"]["unknown"] == [{"topic": "t", "qid": 0, "offset": before["offset"]}]
    stats = httpx.get(f"{url}/v1/groups/g").json()["stats"]
    assert stats["in_flight"] == 1
    produce(url, "b")  # stored after the restart: never delivered before
    (fresh,) = pull(url)["messages"]
    assert (fresh["key"], fresh["attempt"]) == ("b", 1)
    done = pull(url, [fenced_ack(after), fenced_ack(fresh)], wait_ms=0)
    assert done["results"] == {"applied": 2, "unknown": []}
    # A second restart numbers above the first one's deliveries again.
    wait_until(lambda: committed(url) == 2, 10, 0.02, "the acks committed")
    produce(url, "a")
    (third,) = pull(url)["messages"]
    server_proc.kill()
    server_proc.start()
    # The stats' committed offset is the engine's; the SIGKILL may land before the committer
    # persisted it, and then "a" (offset 0) and "b" come back too. Whatever comes back was
    # (or may have been) handed out before: it is numbered above every earlier delivery.
    highest = max(after["attempt"], fresh["attempt"], third["attempt"])
    seen: dict[int, dict[str, Any]] = {}
    results: list[Any] = []
    for _ in range(5):
        messages = pull(server_proc.url, results)["messages"]
        seen.update((m["offset"], m) for m in messages)
        if third["offset"] in seen:
            break
        results = [fenced_ack(m) for m in messages]
    assert third["offset"] in seen, seen
    assert all(m["attempt"] > highest for m in seen.values()), seen
