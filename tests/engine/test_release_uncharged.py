"""``GroupEngine.release_uncharged``: a delivery that never reached its consumer goes back."""

from __future__ import annotations

from tests.engine.harness import Harness, offsets


def test_a_released_head_is_ready_again_at_once_with_its_attempt_uncharged() -> None:
    h = Harness(max_attempts=2)
    h.produce("a")
    h.produce("a")
    h.produce("b")
    first = h.pull()
    assert offsets(first) == [0, 2]
    outcome = h.engine.release_uncharged([first[0].message.ref], {first[0].message.ref: 1})
    assert outcome.applied == 1 and outcome.unknown == []
    s = h.engine.stats(h.now)
    assert (s.ready, s.in_flight, s.retrying, s.waiting) == (1, 1, 0, 1)
    # Released many times: never charged, so never dead-lettered; order still holds.
    for _ in range(5):
        again = h.pull()
        assert [(d.message.offset, d.attempt) for d in again] == [(0, 1)]
        h.engine.release_uncharged([again[0].message.ref])
    again = h.pull()
    assert h.ack(*again).applied == 1
    assert [(d.message.offset, d.attempt) for d in h.pull()] == [(1, 1)]
    assert h.engine.take_commit().dead_letters == []


def test_a_result_for_a_released_delivery_is_unknown() -> None:
    h = Harness()
    h.produce("a")
    (d,) = h.pull()
    h.engine.release_uncharged([d.message.ref])
    assert h.ack(d).unknown == [d.message.ref]
    assert h.engine.stats(h.now).ready == 1


def test_release_is_fenced_by_attempt_and_ignores_what_is_not_in_flight() -> None:
    h = Harness(retry_backoff_ms=[0])
    h.produce("a")
    (d,) = h.pull()
    stale = h.engine.release_uncharged([d.message.ref], {d.message.ref: 7})
    assert stale.applied == 0 and stale.unknown == [d.message.ref]
    h.ack(d)
    gone = h.engine.release_uncharged([d.message.ref])
    assert gone.applied == 0 and gone.unknown == [d.message.ref]


def test_releasing_a_run_head_sends_the_whole_run_back_in_order_uncharged() -> None:
    h = Harness()
    for _ in range(4):
        h.produce("a")
    h.fetch()
    run = h.engine.pull(10, None, h.now, max_per_key=3)
    assert offsets(run) == [0, 1, 2]
    outcome = h.engine.release_uncharged([d.message.ref for d in run])
    # The head took the run back with it; the members were no longer in flight.
    assert outcome.applied == 1 and len(outcome.unknown) == 2
    s = h.engine.stats(h.now)
    assert (s.ready, s.in_flight, s.waiting) == (1, 0, 3)
    again = h.engine.pull(10, None, h.now, max_per_key=3)
    assert [(d.message.offset, d.attempt) for d in again] == [(0, 1), (1, 1), (2, 1)]


def test_releasing_a_run_member_sends_it_and_the_rest_back_behind_the_head() -> None:
    h = Harness()
    for _ in range(3):
        h.produce("a")
    h.fetch()
    run = h.engine.pull(10, None, h.now, max_per_key=3)
    assert h.engine.release_uncharged([run[1].message.ref]).applied == 1
    assert h.ack(run[0]).applied == 1
    assert h.ack(run[2]).unknown == [run[2].message.ref]
    assert [(d.message.offset, d.attempt) for d in h.pull()] == [(1, 1)]
