"""Drive a ``GroupEngine`` by hand: an in-memory log, a fake clock, no I/O.

Reads go through the same loop the broker uses (``cproxy.broker.drive``); the log's ``read``
never suspends, so the coroutine is run to completion without an event loop.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable, Sequence
from typing import Any, TypeVar

import orjson

from cproxy.broker.drive import fetch_all
from cproxy.engine.group import GroupEngine
from cproxy.engine.group_config import GroupConfig
from cproxy.engine.records import Result
from cproxy.engine.snapshots import Handout, Outcome
from cproxy.model import QueueProgress, QueueRef, Record

T = TypeVar("T")


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (the harness log's reads do not)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise AssertionError("the coroutine suspended")


class Log:
    """Messages per queue; ``read`` is the store's range read."""

    def __init__(self, refs: Iterable[QueueRef]) -> None:
        self.queues: dict[QueueRef, list[Record]] = {ref: [] for ref in refs}
        self.reads = 0

    async def read(self, topic: str, qid: int, from_offset: int, max_count: int) -> list[Record]:
        self.reads += 1
        return self.queues[(topic, qid)][from_offset : from_offset + max_count]


class Harness:
    def __init__(self, queues: int = 1, topic: str = "t", **config: Any) -> None:
        config.setdefault("topics", {topic: {"order_by": "key"}})
        self.config = GroupConfig.from_dict(config)
        self.store = Log((t, q) for t in self.config.topics for q in range(queues))
        self.log = self.store.queues
        self.now = 1_000_000
        self.topic = topic
        self.engine = self.new_engine({ref: QueueProgress(0) for ref in self.log})

    def new_engine(self, progress: dict[QueueRef, QueueProgress]) -> GroupEngine:
        ends = {ref: len(msgs) for ref, msgs in self.log.items()}
        self.engine = GroupEngine("g", self.config, progress, ends)
        return self.engine

    def produce(
        self,
        key: str | None,
        body: Any = None,
        qid: int = 0,
        topic: str | None = None,
        delay_ms: int | None = None,
    ) -> Record:
        """Append a message (delayed by ``delay_ms`` from the harness clock, if given)."""
        topic = topic or self.topic
        queue = self.log[(topic, qid)]
        due = None if delay_ms is None else self.now + delay_ms
        message = Record(topic, qid, len(queue), key, orjson.dumps(body), None, None, self.now, due)
        queue.append(message)
        self.engine.note_end(topic, qid, len(queue))
        return message

    def produce_and_offer(self, key: str | None, qid: int = 0) -> bool:
        """Produce, then offer the message as the broker does after an append."""
        message = self.produce(key, qid=qid)
        return self.engine.offer(message.topic, qid, [message])

    def fetch(self) -> None:
        """Serve every read the engine plans until it plans none."""
        run_now(fetch_all(self.engine, self.store, self.now))

    def serve(self, requests: Sequence[Any]) -> None:
        """Hand back reads planned earlier, as a driver would."""
        for r in requests:
            found = run_now(self.store.read(r.topic, r.qid, r.from_offset, r.max_count))
            self.engine.on_fetched(r, found)

    def pull(self, n: int = 100, topics: Iterable[str] | None = None) -> list[Handout]:
        self.fetch()
        return self.engine.pull(n, list(topics) if topics else None, self.now)

    def ack(self, *deliveries: Handout) -> Outcome:
        return self.engine.apply_results(
            [Result(d.message.topic, d.message.qid, acks=[d.message.offset]) for d in deliveries],
            self.now,
        )

    def fail(self, *deliveries: Handout, error: str = "boom") -> Outcome:
        return self.engine.apply_results(
            [
                Result(d.message.topic, d.message.qid, fails=[(d.message.offset, error)])
                for d in deliveries
            ],
            self.now,
        )

    def advance(self, ms: int) -> None:
        self.now += ms
        self.engine.tick(self.now)


def keys(deliveries: Iterable[Handout]) -> list[str | None]:
    return [d.message.key for d in deliveries]


def offsets(deliveries: Iterable[Handout]) -> list[int]:
    return [d.message.offset for d in deliveries]


def fenced_acks(*deliveries: Handout) -> list[Result]:
    """Results that ack ``deliveries``, each fenced by its delivery number."""
    return [
        Result(
            d.message.topic,
            d.message.qid,
            acks=[d.message.offset],
            attempts={d.message.offset: d.attempt},
        )
        for d in deliveries
    ]
