"""The read loop with a log that reads several queues at once (``ManyReader``, as the
PostgreSQL store does): one call per topic per round, same messages, failures replanned."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from cproxy.broker.drive import ManyReader, fetch_round
from cproxy.model import Record
from tests.engine.harness import Harness, Log, run_now


class ManyLog(Log):
    def __init__(self, log: Log) -> None:
        self.queues, self.reads = log.queues, 0
        self.many_calls: list[str] = []
        self.broken: set[str] = set()

    async def read_many(
        self, topic: str, wants: Sequence[tuple[int, int, int]]
    ) -> list[list[Record]]:
        self.many_calls.append(topic)
        if topic in self.broken:
            raise OSError("the database went away")
        return [self.queues[(topic, q)][start : start + n] for q, start, n in wants]


def two_topics() -> tuple[Harness, ManyLog]:
    h = Harness(queues=3, topics={"a": {"order_by": "key"}, "b": {"order_by": "key"}})
    log = ManyLog(h.store)
    h.store = log
    for topic in ("a", "b"):
        for qid in range(3):
            h.produce(f"{topic}{qid}", {"n": qid}, qid=qid, topic=topic)
    return h, log


def test_one_read_per_topic_and_every_message_handed_back() -> None:
    h, log = two_topics()
    assert isinstance(log, ManyReader)
    assert run_now(fetch_round(h.engine, log, h.now)) == 6
    assert sorted(log.many_calls) == ["a", "b"] and log.reads == 0
    delivered = h.engine.pull(100, None, h.now)
    assert sorted((d.message.topic, d.message.qid) for d in delivered) == [
        (t, q) for t in ("a", "b") for q in range(3)
    ]


def test_a_failed_topic_read_is_planned_again() -> None:
    h, log = two_topics()
    log.broken = {"b"}
    with pytest.raises(OSError):
        run_now(fetch_round(h.engine, log, h.now))
    log.broken = set()
    run_now(fetch_round(h.engine, log, h.now))
    delivered = h.engine.pull(100, None, h.now)
    assert len(delivered) == 6
