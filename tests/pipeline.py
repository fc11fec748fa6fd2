"""The pipeline ``in -> out`` of the exactly-once acceptance tests (guarantee 10):
``tests/test_pipeline_kill.py`` (SQLite, SIGKILLs) and ``tests/cluster/test_pipeline.py``
(two proxies on PostgreSQL, hand-overs)."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from consumer_sdk import Client, Consumer, Message, Produce, RetryPolicy
from consumer_sdk.errors import ClientError, ResourceConflict
from consumer_sdk.models import QueueResult

KEYS = 40
ACK_TIMEOUT_MS = 1000
GROUP = {
    "topics": {"in": {"order_by": "key"}},
    "ack_timeout_ms": ACK_TIMEOUT_MS,
    "retry_backoff_ms": [50],
    "max_attempts": 1000,  # never dead-letter: every input must get its output
}


def set_up(url: str, in_queues: int, count: int, per_call: int) -> None:
    """Topics ``in`` (``in_queues`` queues) and ``out`` (2), the group ``pipe`` (``GROUP``),
    and ``count`` inputs produced on ``in`` in calls of ``per_call``."""
    with Client(url) as client:
        client.create_topic("in", in_queues)
        client.create_topic("out", 2)
        client.put_group("pipe", GROUP)
        batch = inputs(count)
        for start in range(0, count, per_call):
            client.produce("in", batch[start : start + per_call])


def transform(msg: Message) -> Produce:
    """The pipeline's one output per input: same key, the input's sequence in its key."""
    return Produce("out", [{"key": msg.key, "body": {"n": msg.body["n"], "seq": msg.body["seq"]}}])


def inputs(count: int) -> list[dict[str, Any]]:
    """``count`` inputs on ``KEYS`` keys, each with its sequence number within its key."""
    seqs: dict[int, int] = defaultdict(int)
    out = []
    for n in range(count):
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


def read_all(url: str, topic: str, least: int, timeout_s: float = 60) -> list[Message]:
    """Every message stored on ``topic`` (at least ``least``, within ``timeout_s``), read
    through a group of its own, in (qid, offset) order."""
    got: list[Message] = []
    with Client(url) as client:
        client.put_group(f"read-{topic}", {"topics": {topic: {"order_by": "none"}}})
        deadline = time.monotonic() + timeout_s
        results: list[QueueResult] = []
        while True:
            answer = client.pull(f"read-{topic}", max_messages=500, wait_ms=300, results=results)
            got += answer.messages
            results = [QueueResult(m.topic, m.qid, (m.offset,)) for m in answer.messages]
            if not answer.messages and len(got) >= least:
                return sorted(got, key=lambda m: (m.qid, m.offset))
            assert time.monotonic() < deadline, f"{len(got)} of {least} read"


def check_outputs(outputs: list[Message], inputs: int) -> None:
    """Exactly one output per input, and per key in input order."""
    counts: dict[int, int] = defaultdict(int)
    for m in outputs:
        counts[m.body["n"]] += 1
    assert sorted(counts) == list(range(inputs)), "an input has no output"
    assert [n for n, c in counts.items() if c != 1] == [], "an input has several outputs"
    by_key: dict[str | None, list[int]] = defaultdict(list)
    for m in outputs:
        by_key[m.key].append(m.body["seq"])
    for key, seqs in by_key.items():
        assert seqs == list(range(len(seqs))), key


class Workers:
    """The pipeline's consumers: four SDK workers on ``servers`` turning ``in`` into ``out``
    with the outputs on the ack (``handled`` lists every input handled, again included), and
    a ``StaleWorker`` on ``stale_url()``; started on entry, stopped on exit."""

    def __init__(
        self,
        servers: str | list[str],
        stale_url: Callable[[], str],
        request_timeout_ms: int,
        retry_attempts: int,
    ) -> None:
        self.handled: list[int] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        retry = RetryPolicy(
            max_attempts=retry_attempts, initial_backoff_ms=100, max_backoff_ms=1000
        )
        self._consumers = [
            Consumer(
                servers,
                group="pipe",
                handler=self._handle,
                concurrency=2,
                wait_ms=200,
                request_timeout_ms=request_timeout_ms,
                retry=retry,
            )
            for _ in range(4)
        ]
        self.stale = StaleWorker(stale_url, self._stop)

    def _handle(self, msg: Message) -> Produce:
        with self._lock:
            self.handled.append(msg.body["n"])
        return transform(msg)

    def __enter__(self) -> Workers:
        for consumer in self._consumers:
            consumer.start()
        self.stale.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for consumer in self._consumers:
            consumer.stop()
        self.stale.join(15)
