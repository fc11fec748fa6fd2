"""Replay of one order value (docs/guarantees.md, replay): ``GroupEngine.replay``.

The driver reads the value's messages from the store (``replay_bounds`` says how far); the
engine delivers again those the group finished, in order, after the value's message in
flight and before its next unfinished one, without touching other values or the committed
offsets.
"""

from __future__ import annotations

import pytest

from cproxy.engine.records import Result
from cproxy.errors import ReplayInProgress
from cproxy.model import Record
from tests.engine.harness import Harness, keys, offsets


def found(h: Harness, value: str, topic: str = "t") -> list[list[Record]]:
    """What the driver reads for a replay: per served queue, the range below its bound."""
    bounds = h.engine.replay_bounds(topic)
    return [
        [m for m in h.log[(topic, q)] if m.offset < bound and m.key == value]
        for q, bound in sorted(bounds.items())
    ]


def drain(h: Harness) -> list[tuple[str | None, int, bool]]:
    seen = []
    while got := h.pull():
        seen += [(d.message.key, d.message.offset, d.replay) for d in got]
        h.ack(*got)
    return seen


def test_only_that_value_is_delivered_again_in_order_and_offsets_stay() -> None:
    h = Harness()
    for k in "abab":
        h.produce(k)
    assert sorted(x[1] for x in drain(h)) == [0, 1, 2, 3]
    committed = h.engine.take_commit().progress[("t", 0)].committed
    assert committed == 4
    assert h.engine.replay("t", "a", found(h, "a")) == 2
    assert h.engine.stats(h.now).replaying == 2
    assert h.engine.take_commit().progress == {}  # held replays are no unfinished work
    assert drain(h) == [("a", 0, True), ("a", 2, True)]
    assert h.engine.stats(h.now).replaying == 0
    # Committed offsets do not move back (nothing to persist but what was there).
    progress = h.engine.take_commit()
    assert progress.progress == {} and progress.redrive_done == []
    assert h.engine.progress()[("t", 0)].committed == committed


def test_replay_goes_after_the_message_in_flight_and_before_the_next_unfinished() -> None:
    h = Harness()
    h.produce("a")
    h.produce("a")
    (first,) = h.pull()
    h.ack(first)
    (second,) = h.pull()  # offset 1 in flight
    h.produce("a")  # offset 2: waits behind 1
    h.fetch()
    assert h.engine.replay("t", "a", found(h, "a")) == 1  # offset 0 (1 is unfinished)
    assert h.pull() == []  # 1 is still in flight: the chain holds
    h.ack(second)
    (replayed,) = h.pull()
    assert (replayed.message.offset, replayed.replay) == (0, True)
    assert h.pull() == []  # 2 waits for the replayed message
    h.ack(replayed)
    assert drain(h) == [("a", 2, False)]


def test_replay_goes_before_a_ready_head() -> None:
    h = Harness()
    h.produce("a")
    h.ack(*h.pull())
    h.produce("a")
    h.fetch()  # offset 1 is the ready head
    assert h.engine.replay("t", "a", found(h, "a")) == 1
    (replayed,) = h.pull()
    assert (replayed.message.offset, replayed.replay) == (0, True)
    assert h.pull() == []  # the ready head went behind the replay
    h.ack(replayed)
    assert drain(h) == [("a", 1, False)]


def test_other_keys_flow_while_a_value_replays() -> None:
    h = Harness()
    for _ in range(3):
        h.produce("a")
    for _ in range(3):
        h.ack(*h.pull())
    h.engine.replay("t", "a", found(h, "a"))
    (replayed,) = h.pull()
    assert replayed.replay and replayed.message.offset == 0
    h.produce("b")
    h.produce("c")
    # The replay holds its value only: new messages of other keys go out at once.
    assert sorted(keys(h.pull())) == ["b", "c"]


def test_a_second_replay_of_a_value_still_replaying_is_refused() -> None:
    h = Harness()
    h.produce("a")
    h.produce("b")
    h.ack(*h.pull())
    h.engine.replay("t", "a", found(h, "a"))
    with pytest.raises(ReplayInProgress):
        h.engine.replay("t", "a", found(h, "a"))
    assert h.engine.replay("t", "b", found(h, "b")) == 1  # another value may replay
    h.ack(*h.pull())
    assert h.engine.replay("t", "a", found(h, "a")) == 1  # finished: may replay again


def test_a_replayed_message_out_of_attempts_is_dead_lettered_with_its_charged_count() -> None:
    h = Harness(max_attempts=2, retry_backoff_ms=[0])
    h.produce("a")
    h.ack(*h.pull())
    h.engine.replay("t", "a", found(h, "a"))
    for _ in range(2):
        h.fail(*h.pull())
        h.advance(0)
    batch = h.engine.take_commit()
    assert [(d.message.offset, d.attempts) for d in batch.dead_letters] == [(0, 2)]
    assert batch.redrive_done == []
    assert h.engine.stats(h.now).replaying == 0


def test_json_path_values_are_replayed_across_queues() -> None:
    h = Harness(queues=2, topics={"t": {"order_by": "$.user"}})
    for n in range(6):
        h.produce(f"k{n}", {"user": "u1" if n % 2 == 0 else "u2", "n": n}, qid=n % 3 % 2)
    drain(h)
    bounds = h.engine.replay_bounds("t")
    per_queue = [list(h.log[("t", q)][: bounds[q]]) for q in sorted(bounds)]
    assert h.engine.replay("t", "u1", per_queue) == 3
    got = []
    while batch := h.pull():
        got += [(d.message.qid, d.message.offset, d.replay) for d in batch]
        h.engine.apply_results(
            [Result("t", d.message.qid, acks=[d.message.offset]) for d in batch], h.now
        )
    users = {(m.qid, m.offset): m for q in per_queue for m in q}
    assert all(replay for *_, replay in got)
    assert sorted(users[(q, o)].body_json for q, o, _ in got) == sorted(
        m.body_json for q in per_queue for m in q if b'"u1"' in m.body_json
    )
    # Per queue in offset order.
    for qid in (0, 1):
        mine = [o for q, o, _ in got if q == qid]
        assert mine == sorted(mine)


def test_a_seek_drops_a_replay_without_marking_dead_letters_done() -> None:
    h = Harness()
    h.produce("a")
    h.ack(*h.pull())
    h.engine.replay("t", "a", found(h, "a"))
    h.engine.seek("t", {0: 1})
    assert h.engine.stats(h.now).replaying == 0
    assert h.engine.take_commit().redrive_done == []
    assert offsets(h.pull()) == []
