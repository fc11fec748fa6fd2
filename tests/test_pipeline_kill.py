"""Acceptance: a pipeline ``in -> out`` stores exactly one output per input (guarantee 10).

The server runs as a real subprocess (``cproxy serve`` on SQLite, see
``tests/test_kill_restart.py``). Four SDK consumers turn each input into one output by
returning ``Produce`` from their handler (the ack and the output in one call); a stale worker
pulls a few inputs, sleeps past the group's ack timeout and only then sends its ack with
outputs (which must answer 409 ``stale_results`` and store nothing). Meanwhile the server is
SIGKILLed three times and restarted on the same data dir and port. In the end every input is
finished, and "out" holds exactly one output per input, in input order per key.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from consumer_sdk import Client, Consumer, Message, Produce, RetryPolicy
from consumer_sdk.errors import ClientError, ResourceConflict
from consumer_sdk.models import QueueResult
from tests.support import wait_until
from tests.test_kill_restart import ServerProcess, free_port

pytestmark = pytest.mark.slow

INPUTS = 1200
KEYS = 40
ACK_TIMEOUT_MS = 1000
KILLS = 3
GROUP = {
    "topics": {"in": {"order_by": "key"}},
    "ack_timeout_ms": ACK_TIMEOUT_MS,
    "retry_backoff_ms": [50],
    "max_attempts": 1000,  # never dead-letter: every input must get its output
}


def transform(msg: Message) -> Produce:
    """The pipeline's one output per input: same key, the input's sequence in its key."""
    return Produce("out", [{"key": msg.key, "body": {"n": msg.body["n"], "seq": msg.body["seq"]}}])


def inputs() -> list[dict[str, Any]]:
    seqs: dict[int, int] = defaultdict(int)
    out = []
    for n in range(INPUTS):
        k = (n * 7) % KEYS
        out.append({"key": f"k{k}", "body": {"n": n, "seq": seqs[k]}, "id": f"in-{n}"})
        seqs[k] += 1
    return out


class StaleWorker(threading.Thread):
    """Pulls a few inputs, sleeps past the ack timeout, then acks them with outputs: each call
    must be refused (409 ``stale_results``) since the inputs were delivered again."""

    def __init__(self, url: Callable[[], str], stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self._url, self._halt = url, stop
        self.refused = 0
        self.accepted: list[int] = []

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                with Client(self._url(), retry=RetryPolicy(max_attempts=1)) as client:
                    got = client.pull("pipe", max_messages=3, wait_ms=200).messages
                    if not got:
                        continue
                    self._halt.wait(ACK_TIMEOUT_MS * 2.5 / 1000)
                    for m in got:
                        result = QueueResult(
                            m.topic, m.qid, (m.offset,), (), ((m.offset, m.attempt),)
                        )
                        try:
                            client.ack("pipe", [result], produce=[transform(m)])
                            # Possible only if the server still had it in flight: it was
                            # restarted and numbered the redelivery alike (issue 28, part 1).
                            self.accepted.append(m.body["n"])
                        except ResourceConflict as exc:
                            assert exc.code == "stale_results", exc
                            self.refused += 1
            except ClientError:
                self._halt.wait(0.1)  # the server is down: try again


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path, port=free_port())
    yield proc
    proc.kill()


def read_all(url: str, topic: str, least: int) -> list[Message]:
    got: list[Message] = []
    with Client(url) as client:
        client.put_group(f"read-{topic}", {"topics": {topic: {"order_by": "none"}}})
        deadline = time.monotonic() + 60
        results: list[QueueResult] = []
        while True:
            answer = client.pull(f"read-{topic}", max_messages=500, wait_ms=300, results=results)
            got += answer.messages
            results = [QueueResult(m.topic, m.qid, (m.offset,)) for m in answer.messages]
            if not answer.messages and len(got) >= least:
                return sorted(got, key=lambda m: (m.qid, m.offset))
            assert time.monotonic() < deadline, f"{len(got)} of {least} read"


def finished(url: str) -> bool:
    try:
        with Client(url, retry=RetryPolicy(max_attempts=1)) as client:
            stats = client.get_group("pipe")["stats"]
    except ClientError:
        return False
    return stats["in_flight"] == 0 and all(q["lag"] == 0 for q in stats["queues"])


def test_pipeline_stores_one_output_per_input_across_kills(server: ServerProcess) -> None:
    server.start()
    with Client(server.url) as client:
        client.create_topic("in", 2)
        client.create_topic("out", 2)
        client.put_group("pipe", GROUP)
        batch = inputs()
        for start in range(0, INPUTS, 500):
            client.produce("in", batch[start : start + 500])
    handled: list[int] = []
    lock = threading.Lock()

    def handle(msg: Message) -> Produce:
        with lock:
            handled.append(msg.body["n"])
        return transform(msg)

    workers = [
        Consumer(
            server.url,
            group="pipe",
            handler=handle,
            concurrency=2,
            wait_ms=200,
            request_timeout_ms=3000,
            retry=RetryPolicy(max_attempts=8, initial_backoff_ms=100, max_backoff_ms=1000),
        )
        for _ in range(4)
    ]
    stop = threading.Event()
    stale = StaleWorker(lambda: server.url, stop)
    for w in workers:
        w.start()
    stale.start()
    try:
        for kill in range(KILLS):
            target = (kill + 1) * INPUTS // (KILLS + 2)
            wait_until(lambda t=target: len(handled) >= t, 60, message=f"{target} handled")
            server.kill()
            time.sleep(0.2)
            server.start()
        wait_until(lambda: finished(server.url), 120, 0.2, "every input finished")
    finally:
        stop.set()
        for w in workers:
            w.stop()
        stale.join(10)
    outputs = read_all(server.url, "out", INPUTS)
    counts: dict[int, int] = defaultdict(int)
    for m in outputs:
        counts[m.body["n"]] += 1
    assert sorted(counts) == list(range(INPUTS)), "an input has no output"
    assert [n for n, c in counts.items() if c != 1] == [], "an input has several outputs"
    by_key: dict[str | None, list[int]] = defaultdict(list)
    for m in outputs:
        by_key[m.key].append(m.body["seq"])
    for key, seqs in by_key.items():
        assert seqs == list(range(len(seqs))), key
    assert stale.refused > 0, "the stale worker was never refused"
    assert len(handled) > INPUTS  # inputs were handled again (kills, stale worker)
    with httpx.Client(base_url=server.url) as http:
        assert http.get("/readyz").status_code == 200
