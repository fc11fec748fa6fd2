"""Every hand-out is a new delivery number (docs/guarantees.md, fenced deliveries).

``attempt`` is the fencing token: each hand-out of a message gets the next number, whatever
ended the one before (a fail, a timeout, an uncharged send-back), and numbering resumes above
every earlier number after a restart, a change of owner, a seek, a park or a redrive. A result
naming an earlier delivery is unknown and changes nothing. ``max_attempts`` counts charged
deliveries only.
"""

from __future__ import annotations

from cproxy.engine.records import Result
from cproxy.engine.snapshots import Handout, Outcome
from cproxy.engine.work import ATTEMPT_RESERVE
from cproxy.model import QueueProgress
from tests.engine.harness import Harness, fenced_acks, offsets


def fenced_ack(h: Harness, *deliveries: Handout) -> Outcome:
    return h.engine.apply_results(fenced_acks(*deliveries), h.now)


def fenced_fail(h: Harness, d: Handout) -> Outcome:
    return h.engine.apply_results(
        [
            Result(
                d.message.topic,
                d.message.qid,
                fails=[(d.message.offset, "boom")],
                attempts={d.message.offset: d.attempt},
            )
        ],
        h.now,
    )


def pull_run(h: Harness, per_key: int = 8) -> list[Handout]:
    h.fetch()
    return h.engine.pull(100, None, h.now, max_per_key=per_key)


def test_a_stale_ack_for_a_sent_back_run_tail_is_unknown_after_its_next_delivery() -> None:
    h = Harness(retry_backoff_ms=[0])
    for _ in range(3):
        h.produce("a")
    run = pull_run(h)
    assert [(d.message.offset, d.attempt) for d in run] == [(0, 1), (1, 1), (2, 1)]
    assert fenced_ack(h, run[0]).applied == 1
    assert fenced_fail(h, run[1]).applied == 1  # offset 2 goes back behind 1, uncharged
    h.advance(0)
    again = pull_run(h)
    assert [(d.message.offset, d.attempt, d.charged) for d in again] == [(1, 2, 1), (2, 2, 0)]
    # The first consumer finished offset 2 before it saw the fail: its late ack names the
    # earlier delivery, and must not finish the one another consumer now holds.
    stale = fenced_ack(h, run[2])
    assert stale.applied == 0 and stale.unknown == [("t", 0, 2)]
    assert h.engine.stats(h.now).in_flight == 2
    assert fenced_ack(h, *again).applied == 2


def test_a_stale_result_for_a_given_back_delivery_is_unknown() -> None:
    h = Harness()
    h.produce("a")
    (first,) = h.pull()
    h.engine.release_uncharged([first.message.ref], {first.message.ref: first.attempt})
    (second,) = h.pull()
    assert (second.attempt, second.charged) == (2, 0)
    assert fenced_ack(h, first).unknown == [first.message.ref]
    assert fenced_fail(h, first).unknown == [first.message.ref]
    assert h.engine.stats(h.now).in_flight == 1
    assert fenced_ack(h, second).applied == 1


def test_max_attempts_counts_charged_deliveries_only() -> None:
    h = Harness(max_attempts=2, retry_backoff_ms=[0])
    h.produce("a")
    for _ in range(5):  # given back five times: never charged
        (d,) = h.pull()
        h.engine.release_uncharged([d.message.ref])
    (d,) = h.pull()
    assert (d.attempt, d.charged) == (6, 0)
    fenced_fail(h, d)
    h.advance(0)
    (d,) = h.pull()
    assert (d.attempt, d.charged) == (7, 1)
    fenced_fail(h, d)
    (dead,) = h.engine.take_commit().dead_letters
    assert dead.attempts == 2  # the charged count, not the seven deliveries


def test_backoff_follows_the_charged_count() -> None:
    h = Harness(retry_backoff_ms=[100, 5000])
    h.produce("a")
    (d,) = h.pull()
    h.engine.release_uncharged([d.message.ref])
    (d,) = h.pull()
    fenced_fail(h, d)  # the first charged failure: 100 ms, although delivery number 2
    h.advance(100)
    (d,) = h.pull()
    assert (d.attempt, d.charged) == (3, 1)


def test_numbers_keep_growing_across_a_restart() -> None:
    h = Harness()
    h.produce("a")
    h.produce("b")
    before = {d.message.offset: d for d in h.pull()}
    assert {d.attempt for d in before.values()} == {1}
    progress = h.engine.take_commit().progress
    assert progress[("t", 0)].attempt_ceiling == ATTEMPT_RESERVE
    h.new_engine(progress)  # a crash: nothing acked, everything redelivered
    h.produce("c")  # stored after the restart: never delivered before
    after = {d.message.offset: d for d in h.pull()}
    assert {o: d.attempt for o, d in after.items()} == {
        0: ATTEMPT_RESERVE + 1,
        1: ATTEMPT_RESERVE + 1,
        2: 1,
    }
    # A late ack from before the crash matches nothing.
    assert fenced_ack(h, before[0]).unknown == [("t", 0, 0)]
    assert h.engine.stats(h.now).in_flight == 3
    # The next load reserves above what this one did.
    again = h.engine.take_commit().progress[("t", 0)].attempt_ceiling
    assert again == 2 * ATTEMPT_RESERVE
    h.new_engine(h.engine.progress())
    assert {d.attempt for d in h.pull()} == {2 * ATTEMPT_RESERVE + 1}


def test_the_reserve_moves_up_before_it_runs_out() -> None:
    h = Harness()
    h.produce("a")
    ceiling = h.engine.take_commit().progress[("t", 0)].attempt_ceiling
    for _ in range(ATTEMPT_RESERVE // 2):
        (d,) = h.pull()
        h.engine.release_uncharged([d.message.ref])
    assert not h.engine.needs_reserve
    (d,) = h.pull()  # half the reserve used: the driver is asked to commit now
    h.engine.release_uncharged([d.message.ref])
    assert h.engine.needs_reserve
    progress = h.engine.take_commit().progress[("t", 0)]
    assert not h.engine.needs_reserve
    assert progress.attempt_ceiling == d.attempt + ATTEMPT_RESERVE > ceiling
    h.new_engine({("t", 0): progress})
    assert [x.attempt for x in h.pull()] == [progress.attempt_ceiling + 1]


def test_a_queue_taken_over_is_numbered_above_its_former_owner() -> None:
    old = Harness()
    old.produce("a")
    (d,) = old.pull()
    final = old.engine.queue_progress("t", 0)
    assert final is not None
    old.engine.drop_queue("t", 0)
    # The new owner serves another queue already, then takes this one over.
    new = Harness()
    new.log[("t", 0)] = old.log[("t", 0)]
    new.engine = new.new_engine({})
    new.engine.add_queue("t", 0, final, 1)
    (again,) = new.pull()
    assert again.attempt == final.attempt_ceiling + 1
    assert fenced_ack(new, d).unknown == [("t", 0, 0)]
    assert new.engine.take_commit().progress[("t", 0)].attempt_ceiling > again.attempt


def test_a_seek_back_numbers_redeliveries_above_the_earlier_ones() -> None:
    h = Harness()
    h.produce("a")
    (d,) = h.pull()
    h.engine.seek("t", {0: 0})
    (again,) = h.pull()
    assert again.attempt > d.attempt
    assert fenced_ack(h, d).unknown == [("t", 0, 0)]
    assert fenced_ack(h, again).applied == 1


def test_a_parked_run_tail_keeps_its_numbers_when_read_back() -> None:
    h = Harness(max_buffered=4, retry_backoff_ms=[60_000])
    for _ in range(4):
        h.produce("a")
    run = pull_run(h)
    assert offsets(run) == [0, 1, 2, 3]
    fenced_fail(h, run[0])  # the head retries in a minute; 1..3 go back behind it
    for n in range(6):
        h.produce(f"k{n}")  # other keys fill the buffer: the stuck chain is parked
    h.advance(200)  # past the next check of a full buffer
    h.fetch()
    assert h.engine.stats(h.now).parked_keys == 1
    while rest := [d for d in h.pull() if d.message.key != "a"]:
        fenced_ack(h, *rest)
    h.advance(60_000 - 200)
    head = pull_run(h, per_key=1)
    assert [(x.message.offset, x.attempt) for x in head] == [(0, 2)]
    fenced_ack(h, *head)
    tail = pull_run(h)
    assert offsets(tail) == [1, 2, 3]
    assert all(x.attempt > 1 for x in tail)
    assert fenced_ack(h, run[1]).unknown == [("t", 0, 1)]


def test_redriven_dead_letters_are_numbered_above_their_deliveries() -> None:
    h = Harness(max_attempts=1)
    h.produce("a")
    (d,) = h.pull()
    fenced_fail(h, d)
    dead = h.engine.take_commit().dead_letters
    h.engine.redrive(dead)
    (again,) = h.pull()
    assert (again.attempt, again.charged) == (2, 0)
    assert fenced_ack(h, d).unknown == [("t", 0, 0)]


def test_progress_json_keeps_the_ceiling() -> None:
    p = QueueProgress(3, read_to=5, open=((3, 4),), attempt_ceiling=2000)
    assert QueueProgress.from_detail_json(3, p.detail_json()) == p
    # Progress written before the ceiling existed loads as 0.
    assert QueueProgress.from_detail_json(3, b'{"read_to":5,"open":[],"parked":[]}') == (
        QueueProgress(3, read_to=5)
    )
