"""Read planning looks only at queues with something to read, and misses none of them."""

from __future__ import annotations

from cproxy.model import QueueProgress
from tests.engine.harness import Harness, offsets


def _planned(h: Harness) -> list[tuple[int, int]]:
    return [(r.qid, r.from_offset) for r in h.engine.plan_fetches(h.now)]


def test_only_queues_with_unread_messages_are_planned() -> None:
    h = Harness(queues=64)
    assert _planned(h) == []
    h.produce("a", qid=7)
    h.produce("b", qid=40)
    assert sorted(_planned(h)) == [(7, 0), (40, 0)]
    h.fetch()
    assert _planned(h) == []
    h.produce("c", qid=7)
    assert _planned(h) == [(7, 1)]


def test_a_queue_taken_by_an_offer_is_not_planned_again() -> None:
    h = Harness(queues=4)
    assert h.produce_and_offer("a", qid=2)
    assert _planned(h) == []
    assert offsets(h.engine.pull(10, None, h.now)) == [0]


def test_a_queue_whose_read_was_cut_by_the_buffer_is_planned_again() -> None:
    h = Harness(queues=2, max_buffered=3)
    for i in range(5):
        h.produce(f"k{i}", qid=1)
    h.fetch()
    assert h.engine.stats(h.now).buffered == 3
    assert _planned(h) == []  # no room
    h.ack(*h.engine.pull(10, None, h.now))
    assert _planned(h) == [(1, 3)]


def test_a_seek_on_a_caught_up_queue_plans_it_again() -> None:
    h = Harness(queues=3)
    for i in range(3):
        h.produce(f"k{i}", qid=1)
    h.ack(*h.pull())
    assert _planned(h) == []
    h.engine.seek("t", {1: 1})
    assert _planned(h) == [(1, 1)]
    assert offsets(h.pull()) == [1, 2]


def test_an_empty_read_drops_the_queue_until_it_grows() -> None:
    h = Harness(queues=2)
    h.engine.note_end("t", 0, 5)  # heard of messages the store does not have (yet)
    requests = h.engine.plan_fetches(h.now)
    assert [(r.qid, r.from_offset) for r in requests] == [(0, 0)]
    h.serve(requests)
    assert _planned(h) == []
    h.produce("a", qid=0)
    assert _planned(h) == [(0, 0)]


def test_restored_ranges_after_a_restart_are_planned_without_new_messages() -> None:
    h = Harness(queues=8)
    for i in range(4):
        h.produce(f"k{i}", qid=5)
    held = h.pull()
    h.ack(held[1], held[3])
    progress = h.engine.progress()
    h.new_engine(progress)
    assert progress[("t", 5)] != QueueProgress(0)
    assert {qid for qid, _ in _planned(h)} == {5}
    assert sorted(offsets(h.pull())) == [0, 2]
