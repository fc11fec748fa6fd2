"""Acceptance: SIGKILL the proxy while it pushes, restart it on the same data, lose nothing.

The server runs as a real subprocess (``cproxy serve``, ``commit_interval_ms = 200``, the
harness of tests/test_kill_restart.py) and pushes a group's messages to a receiver in this
process (uvicorn on a loopback port) that answers after a random few milliseconds and fails
some messages' first attempt with 503. Half the messages are produced, the server is
SIGKILLed once the receiver has acked a third of them, restarted on the same data dir, the
rest is produced, and the run goes on until the group has no lag. Then:

- every message was acked by the receiver at least once, and none was dead-lettered;
- within each server lifetime, each key's acked messages came in order with no gap, and no
  two requests of one key were ever open at once;
- after the restart each key resumed at or before the message after its last ack before the
  kill (nothing skipped), and messages acked twice are bounded by what the last commit
  interval(s) before the kill could have missed.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.push_receiver import Receiver, Request
from tests.support import wait_until
from tests.test_kill_restart import ServerProcess

pytestmark = pytest.mark.slow

KEYS = 80
PER_KEY = 20
QUEUES = 4


def _decide_with(seed: int) -> Any:
    rng = random.Random(seed)
    lock = threading.Lock()

    def decide(messages: list[dict[str, Any]], headers: dict[str, str]) -> tuple[int, float]:
        with lock:
            delay = rng.random() * 0.004
        m = messages[0]
        fail = m["attempt"] == 1 and (int(m["key"][1:]) * 31 + m["body"]["seq"]) % 23 == 0
        return (503 if fail else 200), delay

    return decide


def _produce(url: str, seqs: range) -> None:
    messages = [
        {"key": f"k{k}", "body": {"seq": s}, "id": f"k{k}-{s}"} for s in seqs for k in range(KEYS)
    ]
    with httpx.Client(base_url=url, timeout=30) as client:
        for start in range(0, len(messages), 200):
            r = client.post(
                "/v1/topics/t/messages", json={"messages": messages[start : start + 200]}
            )
            assert r.status_code == 200, r.text


def _persisted_progress(data_dir: Path) -> int:
    """Sum of the committed offsets the server has written (read-only, beside the server)."""
    path = data_dir / "cproxy.db"
    if not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        try:
            (total,) = db.execute("SELECT coalesce(sum(committed), 0) FROM progress").fetchone()
        except sqlite3.OperationalError:
            return 0  # the schema is being created
    return int(total)


def _acked_by_key(requests: list[Request]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for r in sorted((r for r in requests if r.status == 200), key=lambda r: r.answered_at):
        for m in r.messages:
            out[m["key"]].append(m["body"]["seq"])
    return out


def _assert_in_order(acked: dict[str, list[int]], lifetime: str) -> None:
    for key, seqs in acked.items():
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (lifetime, key, seqs)


def test_sigkill_while_pushing_loses_nothing_and_keeps_order(tmp_path: Path) -> None:
    receiver = Receiver(_decide_with(11)).start()
    # The receiver is on loopback: the operator lists it, as a push there is refused otherwise.
    server = ServerProcess(tmp_path, f'[push]\nallowed_urls = ["{receiver.url}"]\n')
    try:
        server.start()
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.post("/v1/topics", json={"name": "t", "queues": QUEUES}).is_success
            group = {
                "topics": {
                    "t": {"order_by": "key", "push": {"url": receiver.url, "max_in_flight": 16}}
                },
                "retry_backoff_ms": [50],
                "ack_timeout_ms": 5000,
            }
            assert client.put("/v1/groups/g", json=group).status_code == 200
        _produce(server.url, range(PER_KEY // 2))
        total = KEYS * PER_KEY
        wait_until(
            lambda: len(receiver.acked_messages()) >= total // 3, 30, message="a third acked"
        )
        # Kill only once progress was committed: pushing is fast enough to ack a third of the
        # messages before the first commit interval ends, and the bound below is about what
        # the last interval before the kill misses, not about a group that never committed.
        wait_until(lambda: _persisted_progress(server.data_dir) > 0, 30, 0.02, "a progress commit")
        server.kill()
        killed_at = time.monotonic()
        server.start()
        _produce(server.url, range(PER_KEY // 2, PER_KEY))

        def drained() -> bool:
            view = httpx.get(f"{server.url}/v1/groups/g", timeout=10).json()
            return view["stats"]["lag_excluding_parked"] == 0 and all(
                q["lag"] == 0 for q in view["stats"]["queues"]
            )

        wait_until(drained, 60, 0.1, "the group drained after the restart")
        view = httpx.get(f"{server.url}/v1/groups/g", timeout=10).json()
        server.terminate()
    finally:
        server.kill()
        receiver.stop()

    assert view["stats"]["dead_lettered"] == 0
    assert receiver.overlaps == 0
    before = _acked_by_key([r for r in receiver.requests if r.at < killed_at])
    after = _acked_by_key([r for r in receiver.requests if r.at >= killed_at])
    _assert_in_order(before, "before the kill")
    _assert_in_order(after, "after the restart")
    everything = {f"k{k}": set(range(PER_KEY)) for k in range(KEYS)}
    got = {key: set(before.get(key, [])) | set(after.get(key, [])) for key in everything}
    assert got == everything
    again = 0
    for key, seqs in before.items():
        resumed = after[key][0]
        assert resumed <= seqs[-1] + 1, (key, seqs, after[key])  # nothing skipped
        again += max(0, seqs[-1] + 1 - resumed)
    # Acked twice: at most what the commit interval (200 ms) before the kill left unsaved.
    assert again < total // 3, again
