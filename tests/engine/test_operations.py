"""Operator actions as engine methods: seek, redrive, skip, release, blocked keys, stats."""

from __future__ import annotations

import pytest

from cproxy.errors import BlockedKeyNotFound, NotBlocked
from tests.engine.harness import Harness, keys, offsets


def test_seek_back_replays_only_the_sought_queue_and_drops_its_held_state() -> None:
    h = Harness(queues=2, ack_timeout_ms=60_000)
    for q in (0, 1):
        for k in "abc":
            h.produce(f"{k}{q}", qid=q)  # a chain spans queues: distinct keys per queue
    held = h.pull()
    assert len(held) == 6 and h.engine.stats(h.now).in_flight == 6
    h.engine.seek("t", {0: 1})
    stats = h.engine.stats(h.now)
    assert stats.in_flight == 3 and stats.buffered == 3  # queue 1 untouched
    # Results for the dropped deliveries of queue 0 are unknown now.
    outcome = h.ack(*[d for d in held if d.message.qid == 0])
    assert outcome.applied == 0 and len(outcome.unknown) == 3
    replay = h.pull()
    assert sorted((d.message.qid, d.message.offset) for d in replay) == [(0, 1), (0, 2)]
    assert h.engine.stats(h.now).queues[0].committed_offset == 1


def test_seek_forward_skips_and_commits_the_new_position() -> None:
    h = Harness()
    for k in "abcd":
        h.produce(k)
    h.pull()
    h.engine.seek("t", {0: 3})
    assert offsets(h.pull()) == [3]
    assert h.engine.take_commit().progress[("t", 0)].committed == 3


def test_seek_drops_retrying_and_exhausted_heads_and_parked_state() -> None:
    h = Harness(max_attempts=1, on_exhausted="block", retry_backoff_ms=[60_000])
    h.produce("a")
    h.produce("a")
    h.produce(None)
    got = h.pull()
    h.fail(*got)
    stats = h.engine.stats(h.now)
    assert stats.exhausted == 2 and stats.waiting == 1 and stats.blocked_keys == 2
    h.engine.seek("t", {0: 0})
    assert h.engine.stats(h.now).buffered == 0 and h.engine.blocked_keys(h.now) == []
    assert sorted(offsets(h.pull())) == [0, 2]  # replayed from the start, in order


def test_redrive_skips_letters_a_seek_put_back_and_keeps_unsubscribed_ones() -> None:
    h = Harness(max_attempts=1)
    for _ in range(2):
        h.produce("a")
    h.fail(*h.pull())
    h.fail(*h.pull())
    dead = h.engine.take_commit().dead_letters
    h.engine.seek("t", {0: 1})  # offset 1 is back in the normal flow
    assert h.engine.redrive(dead) == 1
    batch = h.engine.take_commit()
    assert batch.redrive_done == [("t", 0, 1)]
    other = Harness(topic="u", max_attempts=1)
    assert other.engine.redrive(dead) == 0  # not subscribed to "t": stays dead
    assert other.engine.take_commit().dead_letters == dead


def test_skip_and_release_by_ref_for_unordered_messages() -> None:
    h = Harness(max_attempts=1, on_exhausted="block", topics={"t": {"order_by": "none"}})
    h.produce("x")
    h.produce("y")
    h.fail(*h.pull())
    rows = h.engine.blocked_keys(h.now)
    assert [(r.order_value, r.offset, r.state) for r in rows] == [
        (None, 0, "exhausted"),
        (None, 1, "exhausted"),
    ]
    assert h.engine.release("t", None, ("t", 0, 0)) == ("t", 0, 0)
    assert [(d.message.offset, d.attempt) for d in h.pull()] == [(0, 1)]
    assert h.engine.skip("t", None, ("t", 0, 1), h.now) == ("t", 0, 1)
    assert h.engine.stats(h.now).exhausted == 0
    assert [d.message.offset for d in h.engine.take_commit().dead_letters] == [1]


def test_skip_and_release_refuse_heads_that_are_not_blocked() -> None:
    h = Harness()
    h.produce("a")
    h.pull()
    with pytest.raises(NotBlocked):
        h.engine.skip("t", "a", None, h.now)  # in flight, not retrying
    with pytest.raises(BlockedKeyNotFound):
        h.engine.release("t", "nope", None)
    with pytest.raises(BlockedKeyNotFound):
        h.engine.release("t", None, ("t", 0, 9))


def test_skip_a_retrying_head_moves_the_chain_on_and_forgets_the_retry() -> None:
    h = Harness(retry_backoff_ms=[10_000])
    h.produce("a")
    h.produce("a")
    h.fail(*h.pull())
    assert h.engine.stats(h.now).retrying == 1
    h.engine.skip("t", "a", None, h.now)
    assert h.engine.stats(h.now).retrying == 0
    assert offsets(h.pull()) == [1]
    h.advance(10_000)  # the stale retry must not resurface
    assert h.pull() == []


def test_heads_merely_in_flight_are_not_blocked_until_stuck_after_ms() -> None:
    h = Harness(ack_timeout_ms=60_000, stuck_after_ms=1_000)
    h.produce("old", body={"n": 1})
    h.produce("old")
    h.pull()
    h.advance(500)
    h.produce("new")
    h.pull()
    stats = h.engine.stats(h.now)
    assert (stats.blocked_keys, stats.in_flight_keys) == (0, 2)
    assert h.engine.blocked_keys(h.now) == []
    h.advance(500)  # "old" has been in flight for stuck_after_ms: stuck; "new" is not
    rows = h.engine.blocked_keys(h.now)
    assert [(r.order_value, r.state, r.waiting, r.body_json) for r in rows] == [
        ("old", "in_flight", 1, b'{"n":1}')
    ]
    stats = h.engine.stats(h.now)
    assert (stats.blocked_keys, stats.in_flight_keys) == (1, 1)
    h.advance(500)  # both stuck now: longest blocked first
    assert [r.order_value for r in h.engine.blocked_keys(h.now)] == ["old", "new"]
    assert h.engine.blocked_keys(h.now, "other") == []
    assert keys(h.pull()) == []


def test_a_failed_head_and_an_exhausted_head_are_blocked_at_once() -> None:
    h = Harness(
        max_attempts=2, on_exhausted="block", retry_backoff_ms=[10_000], stuck_after_ms=60_000
    )
    h.produce("retry")
    h.produce("done")
    h.fail(*h.pull())
    rows = h.engine.blocked_keys(h.now)
    assert [(r.order_value, r.state) for r in rows] == [("retry", "retrying"), ("done", "retrying")]
    h.advance(10_000)
    again = h.pull()
    assert sorted(keys(again)) == ["done", "retry"]
    h.ack(*[d for d in again if d.message.key == "done"])
    h.fail(*[d for d in again if d.message.key == "retry"])  # second attempt: exhausted
    rows = h.engine.blocked_keys(h.now)
    assert [(r.order_value, r.state, r.attempts) for r in rows] == [("retry", "exhausted", 2)]
    stats = h.engine.stats(h.now)
    assert (stats.blocked_keys, stats.in_flight_keys) == (1, 0)


def test_stats_counts_add_up_to_buffered() -> None:
    h = Harness(max_attempts=1, on_exhausted="block", retry_backoff_ms=[10_000])
    for k in ("a", "a", "b", "c", "d"):
        h.produce(k)
    got = {d.message.key: d for d in h.pull()}
    h.fail(got["b"])  # exhausted (max_attempts 1)
    h.ack(got["c"])
    s = h.engine.stats(h.now)
    assert (s.ready, s.in_flight, s.waiting, s.exhausted) == (0, 2, 1, 1)
    assert s.buffered == s.ready + s.in_flight + s.waiting + s.retrying + s.exhausted
