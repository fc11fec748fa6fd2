"""Queues joining and leaving a running engine (the cluster hand-over verbs of ``GroupEngine``)."""

from __future__ import annotations

from cproxy.engine.snapshots import Handout
from cproxy.model import QueueProgress
from tests.engine.harness import Harness, offsets


def refs(deliveries: list[Handout]) -> list[tuple[int, int]]:
    return sorted((d.message.qid, d.message.offset) for d in deliveries)


def test_an_engine_without_queues_serves_only_what_is_added() -> None:
    h = Harness(queues=2)
    h.new_engine({})
    for qid in (0, 1):
        h.produce("a", qid=qid)
        h.produce("b", qid=qid)
    assert h.pull() == []
    assert not h.engine.serves("t", 0)
    h.engine.add_queue("t", 1, QueueProgress(1), end_offset=2)
    assert h.engine.serves("t", 1)
    assert refs(h.pull()) == [(1, 1)]  # from the persisted progress on
    h.engine.add_queue("t", 1, QueueProgress(0), end_offset=2)  # already served: unchanged
    assert h.pull() == []
    assert set(h.engine.progress()) == {("t", 1)}


def test_a_paused_queue_hands_out_nothing_new_but_takes_results() -> None:
    h = Harness(queues=2)
    for qid in (0, 1):
        for key in ("a", "a", "b"):
            h.produce(f"{key}{qid}", qid=qid)  # a key lives in one queue
    first = h.pull()
    assert refs(first) == [(0, 0), (0, 2), (1, 0), (1, 2)]
    h.engine.pause_queue("t", 0)
    on_0 = [d for d in first if d.message.qid == 0]
    assert h.engine.in_flight_on("t", 0) == 2
    # Acking q0's "a" head would make offset 1 ready: it is set aside, not handed out.
    assert h.ack(on_0[0]).applied == 1
    # q1 keeps flowing.
    assert h.ack(*[d for d in first if d.message.qid == 1]).applied == 2
    assert refs(h.pull()) == [(1, 1)]
    assert h.engine.in_flight_on("t", 0) == 1
    assert h.ack(on_0[1]).applied == 1
    assert h.engine.in_flight_on("t", 0) == 0
    # The final progress names offset 1 as the first unfinished: the next owner starts there.
    final = h.engine.queue_progress("t", 0)
    assert final is not None and final.committed == 1


def test_a_failed_delivery_on_a_paused_queue_is_not_retried_here() -> None:
    h = Harness(queues=1, retry_backoff_ms=[10], max_attempts=5)
    h.produce("a")
    (d,) = h.pull()
    h.engine.pause_queue("t", 0)
    assert h.fail(d).applied == 1
    h.advance(50)
    assert h.pull() == []
    assert h.engine.in_flight_on("t", 0) == 0
    final = h.engine.queue_progress("t", 0)
    assert final is not None and final.committed == 0


def test_dropping_a_queue_forgets_it_and_late_results_are_unknown() -> None:
    h = Harness(queues=2)
    for qid in (0, 1):
        for key in ("a", "a", "b", None):
            h.produce(key and f"{key}{qid}", qid=qid)
    first = h.pull()
    h.engine.pause_queue("t", 0)
    on_0 = [d for d in first if d.message.qid == 0]
    h.ack(on_0[0])  # sets offset 1 aside
    h.pull()
    h.engine.drop_queue("t", 0)
    assert not h.engine.serves("t", 0)
    outcome = h.ack(*on_0[1:])
    assert outcome.applied == 0
    assert sorted(outcome.unknown) == [("t", 0, d.message.offset) for d in on_0[1:]]
    stats = h.engine.stats(h.now)
    assert stats.buffered == 4  # queue 1's: 3 in flight, "a1"@1 waiting
    assert [(q.topic, q.qid) for q in stats.queues] == [("t", 1)]
    assert ("t", 0) not in h.engine.progress()
    # Produced later: never read for the dropped queue.
    h.produce("c", qid=0)
    assert all(d.message.qid == 1 for d in h.pull())
    # Taken back later (ownership returned): served again from the given progress.
    h.engine.add_queue("t", 0, QueueProgress(1), end_offset=5)
    again = [d for d in h.pull() if d.message.qid == 0]
    assert offsets(again) == [1, 2, 3, 4]  # "a0"@1, "b0"@2, None@3, "c"@4: all chain heads
