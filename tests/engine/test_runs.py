"""Same-key runs (``max_per_key``): several consecutive messages of one order value at once."""

from __future__ import annotations

from cproxy.engine.records import Result
from tests.engine.harness import Harness, offsets


def _pull(h: Harness, n: int = 100, per_key: int = 4) -> list:  # type: ignore[type-arg]
    h.fetch()
    return h.engine.pull(n, None, h.now, max_per_key=per_key)


def test_a_run_hands_out_consecutive_messages_of_one_key_in_order() -> None:
    h = Harness()
    for k in "aaaaab":
        h.produce(k)
    got = _pull(h)
    assert [(d.message.key, d.message.offset) for d in got] == [
        ("a", 0),
        ("a", 1),
        ("a", 2),
        ("a", 3),
        ("b", 5),
    ]
    assert _pull(h) == []  # a's fifth message waits until the run is finished
    h.ack(*got[:4])
    assert offsets(_pull(h)) == [4]


def test_max_messages_counts_messages_not_runs() -> None:
    h = Harness()
    for _ in range(10):
        h.produce("a")
    assert offsets(_pull(h, n=3, per_key=8)) == [0, 1, 2]


def test_a_fail_inside_a_run_sends_the_rest_back_uncharged() -> None:
    h = Harness(retry_backoff_ms=[0])
    for _ in range(5):
        h.produce("a")
    run = _pull(h)
    assert offsets(run) == [0, 1, 2, 3]
    # The consumer acks 0 and fails 1: 2 and 3 go back behind 1, their results unknown.
    outcome = h.engine.apply_results(
        [Result("t", 0, acks=[0], fails=[(1, "boom")]), Result("t", 0, acks=[2, 3])], h.now
    )
    assert outcome.applied == 2 and outcome.unknown == [("t", 0, 2), ("t", 0, 3)]
    s = h.engine.stats(h.now)
    assert (s.in_flight, s.retrying, s.waiting) == (0, 1, 3)
    h.advance(0)
    again = _pull(h)
    assert [(d.message.offset, d.attempt) for d in again] == [(1, 2), (2, 1), (3, 1), (4, 1)]


def test_a_timed_out_run_comes_back_in_order() -> None:
    h = Harness(ack_timeout_ms=100, retry_backoff_ms=[0])
    for _ in range(3):
        h.produce("a")
    assert offsets(_pull(h)) == [0, 1, 2]
    h.advance(100)
    again = _pull(h)
    assert [(d.message.offset, d.attempt) for d in again] == [(0, 2), (1, 1), (2, 1)]


def test_an_early_ack_of_a_run_member_finishes_it() -> None:
    h = Harness()
    for _ in range(3):
        h.produce("a")
    run = _pull(h)
    assert h.ack(run[2]).applied == 1  # out of order, but it was handed out: accepted
    h.ack(run[0], run[1])
    assert h.engine.stats(h.now).buffered == 0
    assert h.engine.take_commit().progress[("t", 0)].committed == 3


def test_runs_in_qid_mode_serve_a_whole_queue_in_order() -> None:
    h = Harness(queues=2, topics={"t": {"order_by": "qid"}})
    for i in range(6):
        h.produce(f"k{i}", qid=i % 2)
    got = _pull(h, per_key=32)
    assert sorted((d.message.qid, d.message.offset) for d in got) == [
        (q, o) for q in (0, 1) for o in range(3)
    ]
