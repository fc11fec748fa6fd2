"""Drive a ``GroupEngine`` by hand: an in-memory log, a fake clock, no I/O."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from cproxy.engine.config import GroupConfig
from cproxy.engine.group import GroupEngine
from cproxy.engine.records import Result
from cproxy.engine.sequencer import Entry
from cproxy.model import Message, QueueProgress, QueueRef


class Harness:
    def __init__(self, queues: int = 1, topic: str = "t", **config: Any) -> None:
        config.setdefault("topics", {topic: {"order_by": "key"}})
        self.config = GroupConfig.from_dict(config)
        self.log: dict[QueueRef, list[Message]] = {
            (t, q): [] for t in self.config.topics for q in range(queues)
        }
        self.now = 1_000_000
        self.topic = topic
        self.engine = self.new_engine({ref: QueueProgress(0) for ref in self.log})

    def new_engine(self, progress: dict[QueueRef, QueueProgress]) -> GroupEngine:
        ends = {ref: len(msgs) for ref, msgs in self.log.items()}
        self.engine = GroupEngine("g", self.config, progress, ends)
        return self.engine

    def produce(
        self, key: str | None, body: Any = None, qid: int = 0, topic: str | None = None
    ) -> Message:
        topic = topic or self.topic
        queue = self.log[(topic, qid)]
        message = Message(topic, qid, len(queue), key, orjson.dumps(body), None, None, self.now)
        queue.append(message)
        self.engine.note_end(topic, qid, len(queue))
        return message

    def produce_and_offer(self, key: str | None, qid: int = 0) -> bool:
        """Produce, then offer the message as the broker does after an append."""
        message = self.produce(key, qid=qid)
        return self.engine.offer(message.topic, qid, [message])

    def fetch(self) -> None:
        """Serve every read the engine plans until it plans none."""
        while requests := self.engine.plan_fetches(self.now):
            for r in requests:
                queue = self.log[(r.topic, r.qid)]
                if r.is_reload:
                    found = [
                        m
                        for m in queue[r.from_offset : r.upto]
                        if self.engine.order_value(m) == r.chain_value
                    ][: r.max_count]
                    scanned = found[-1].offset + 1 if len(found) == r.max_count else r.upto
                    self.engine.on_fetched(r, found, scanned)
                else:
                    self.engine.on_fetched(r, queue[r.from_offset : r.from_offset + r.max_count])

    def pull(self, n: int = 100, topics: Iterable[str] | None = None) -> list[Entry]:
        self.fetch()
        return self.engine.pull(n, list(topics) if topics else None, self.now)

    def ack(self, *entries: Entry) -> tuple[int, list[Any]]:
        return self.engine.apply_results(
            [Result(e.message.topic, e.message.qid, acks=[e.message.offset]) for e in entries],
            self.now,
        )

    def fail(self, *entries: Entry, error: str = "boom") -> tuple[int, list[Any]]:
        return self.engine.apply_results(
            [
                Result(e.message.topic, e.message.qid, fails=[(e.message.offset, error)])
                for e in entries
            ],
            self.now,
        )

    def advance(self, ms: int) -> None:
        self.now += ms
        self.engine.tick(self.now)


def keys(entries: Iterable[Entry]) -> list[str | None]:
    return [e.message.key for e in entries]


def offsets(entries: Iterable[Entry]) -> list[int]:
    return [e.message.offset for e in entries]
