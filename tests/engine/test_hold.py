"""Results held while a transaction persists them with outputs (``GroupEngine.hold``,
``progress_after``, ``settle_held``, ``unhold``): docs/guarantees.md, exactly once."""

from __future__ import annotations

from cproxy.engine.records import Result
from cproxy.model import QueueProgress
from tests.engine.harness import Harness, fenced_acks, offsets


def test_hold_is_all_or_nothing_and_names_the_stale_results() -> None:
    h = Harness(ack_timeout_ms=1000)
    h.produce("a")
    h.produce("b")
    a, b = h.pull(10)
    stale = Result("t", 0, acks=[b.message.offset], attempts={b.message.offset: b.attempt + 1})
    assert h.engine.hold([*fenced_acks(a), stale]) == [("t", 0, b.message.offset)]
    # Nothing was held: both still answer to an ordinary ack.
    assert h.ack(a, b).applied == 2


def test_held_deliveries_neither_time_out_nor_take_other_results() -> None:
    h = Harness(ack_timeout_ms=1000, retry_backoff_ms=[10])
    h.produce("a")
    h.produce("a")
    (a,) = h.pull(10)
    results = fenced_acks(a)
    assert h.engine.hold(results) == []
    h.advance(5000)  # far past its ack deadline
    assert h.pull(10) == []  # not redelivered, and its key's next message still waits
    assert h.ack(a).unknown == [a.message.ref]  # someone else's ack does not reach it
    extended = h.engine.extend([a.message.ref], 1000, h.now)
    assert extended.unknown == [a.message.ref]
    assert h.engine.hold(results) == [a.message.ref]  # nor a second hold
    assert h.engine.stats(h.now).in_flight == 1
    outcome = h.engine.settle_held(results, h.now, {})
    assert (outcome.applied, outcome.unknown) == (1, [])
    assert offsets(h.pull(10)) == [1]


def test_progress_after_counts_the_held_acks_as_finished() -> None:
    h = Harness()
    for key in "abc":
        h.produce(key)
    _a, b, _c = h.pull(10)
    results = fenced_acks(b)
    assert h.engine.hold(results) == []
    after = h.engine.progress_after(results)
    assert set(after) == {("t", 0)}
    assert after["t", 0].committed == 0
    assert after["t", 0].open == ((0, 1), (2, 3))  # b (offset 1) is finished
    # Written with outputs, progress keeps the delivery numbers reserved (never lowers them).
    assert after["t", 0].attempt_ceiling == h.engine.progress()["t", 0].attempt_ceiling > 0
    # The engine itself still counts b unfinished until the transaction is settled.
    assert h.engine.progress()["t", 0].open == ((0, 3),)
    h.engine.settle_held(results, h.now, after)
    assert h.engine.progress()["t", 0] == after["t", 0]
    # Settled with the persisted progress: the next commit has nothing new for the queue.
    assert ("t", 0) not in h.engine.take_commit().progress


def test_unhold_puts_deliveries_back_in_flight_with_their_deadline() -> None:
    h = Harness(ack_timeout_ms=1000, retry_backoff_ms=[10])
    h.produce("a")
    (a,) = h.pull(10)
    results = fenced_acks(a)
    assert h.engine.hold(results) == []
    h.advance(500)
    h.engine.unhold(results)
    h.advance(499)
    assert h.pull(10) == []  # still in flight until its own deadline
    h.advance(1)
    h.advance(10)
    again = h.pull(10)
    assert [(d.message.offset, d.attempt) for d in again] == [(0, a.attempt + 1)]


def test_a_run_member_behind_an_unfinished_head_cannot_be_held() -> None:
    h = Harness()
    for _ in range(3):
        h.produce("a")
    h.fetch()
    run = h.engine.pull(10, None, h.now, max_per_key=3)
    assert offsets(run) == [0, 1, 2]
    # Its ack could land before the head's: refused, so outputs stay in input order.
    assert h.engine.hold(fenced_acks(run[1])) == [run[1].message.ref]
    head = fenced_acks(run[0])
    assert h.engine.hold(head) == []
    h.engine.settle_held(head, h.now, h.engine.progress_after(head))
    # Once the head is finished, the next member of the run leads its chain: it may be held.
    assert h.engine.hold(fenced_acks(run[1])) == []


def test_a_seek_while_held_is_not_undone_by_the_settle() -> None:
    h = Harness()
    h.produce("a")
    h.produce("a")
    (a,) = h.pull(10)
    results = fenced_acks(a)
    assert h.engine.hold(results) == []
    h.engine.seek("t", {0: 0})
    outcome = h.engine.settle_held(results, h.now, {})
    assert outcome.unknown == [a.message.ref]
    assert offsets(h.pull(10)) == [0]  # the seek replays from 0


def test_progress_after_for_a_restart_skips_what_was_held_and_settled() -> None:
    h = Harness()
    for key in "ab":
        h.produce(key)
    a, _b = h.pull(10)
    results = fenced_acks(a)
    assert h.engine.hold(results) == []
    persisted = h.engine.progress_after(results)
    # A crash right after the transaction: the restarted engine delivers b only.
    restarted = h.new_engine({("t", 0): persisted["t", 0]})
    assert restarted is h.engine
    assert offsets(h.pull(10)) == [1]
    assert isinstance(persisted["t", 0], QueueProgress)
