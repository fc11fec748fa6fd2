"""GroupEngine behaviour, docs/guarantees.md, without store or sockets."""

from __future__ import annotations

from cproxy.engine.group import GroupEngine
from cproxy.engine.records import Result
from cproxy.engine.work import ATTEMPT_RESERVE
from cproxy.model import QueueProgress
from tests.engine.harness import Harness, keys, offsets


def test_one_message_per_key_in_flight_and_keys_in_parallel() -> None:
    h = Harness()
    for i in range(3):
        for k in ("a", "b", "c"):
            h.produce(k, {"i": i})
    first = h.pull(10)
    assert sorted(keys(first)) == ["a", "b", "c"]
    assert h.pull(10) == []  # every key's next message waits for its head
    h.ack(first[0])
    nxt = h.pull(10)
    assert keys(nxt) == [first[0].message.key]
    assert nxt[0].message.offset > first[0].message.offset


def test_reactivated_chain_goes_before_fresh_work() -> None:
    h = Harness(max_buffered=100)
    h.produce("a")
    h.produce("a")
    head = h.pull(1)
    for k in "bcdef":
        h.produce(k)
    h.fetch()
    h.ack(*head)
    assert keys(h.pull(1)) == ["a"]


def test_unordered_messages_flow_together() -> None:
    h = Harness()
    for _ in range(5):
        h.produce(None)
    assert len(h.pull(10)) == 5


def test_qid_mode_serialises_a_queue_and_none_mode_nothing() -> None:
    h = Harness(queues=2, topics={"t": {"order_by": "qid"}})
    for q in (0, 0, 1, 1):
        h.produce("x", qid=q)
    got = h.pull(10)
    assert sorted((e.message.qid, e.message.offset) for e in got) == [(0, 0), (1, 0)]
    h2 = Harness(topics={"t": {"order_by": "none"}})
    for _ in range(4):
        h2.produce("same")
    assert len(h2.pull(10)) == 4


def test_json_path_mode_chains_by_body_field() -> None:
    h = Harness(topics={"t": {"order_by": "$.ride.id"}})
    h.produce(None, {"ride": {"id": 1}, "e": "call"})
    h.produce(None, {"ride": {"id": 1}, "e": "pickup"})
    h.produce(None, {"ride": {"id": 2}, "e": "call"})
    h.produce(None, {"other": 1})
    got = h.pull(10)
    assert offsets(got) == [0, 2, 3]


def test_fail_retries_after_backoff_and_blocks_only_its_key() -> None:
    h = Harness(retry_backoff_ms=[100, 400], max_attempts=5)
    h.produce("a")
    h.produce("a")
    h.produce("b")
    h.produce("b")
    got = {e.message.key: e for e in h.pull(10)}
    h.fail(got["a"], error="ValueError: boom")
    h.ack(got["b"])
    assert keys(h.pull(10)) == ["b"]  # b flows while a backs off
    h.advance(99)
    assert h.pull(10) == []
    h.advance(1)
    again = h.pull(10)
    assert [(e.message.offset, e.attempt) for e in again] == [(0, 2)]
    h.fail(*again)
    h.advance(399)
    assert h.pull(10) == []
    h.advance(1)
    third = h.pull(10)
    assert third[0].attempt == 3
    h.fail(*third)
    h.advance(400)  # the last backoff repeats
    assert h.pull(10)[0].attempt == 4


def test_ack_timeout_redelivers() -> None:
    h = Harness(ack_timeout_ms=1000, retry_backoff_ms=[0])
    h.produce("a")
    first = h.pull(1)
    h.advance(999)
    assert h.pull(1) == []
    h.advance(1)
    again = h.pull(1)
    assert again[0].attempt == 2
    assert h.engine.stats(h.now).topics[0].timed_out == 1
    assert h.ack(first[0])[0] == 1  # the same message is in flight again: the ack applies
    assert h.ack(first[0]) == (0, [("t", 0, 0)])  # now it is not


def test_dead_letter_after_max_attempts_and_chain_moves_on() -> None:
    h = Harness(max_attempts=2, retry_backoff_ms=[0])
    h.produce("a", {"n": 1})
    h.produce("a", {"n": 2})
    h.fail(*h.pull())
    h.advance(0)
    h.fail(*h.pull(), error="still broken")
    nxt = h.pull()
    assert offsets(nxt) == [1]
    batch = h.engine.take_commit()
    assert [(d.message.offset, d.attempts, d.last_error) for d in batch.dead_letters] == [
        (0, 2, "still broken")
    ]
    assert batch.progress[("t", 0)].committed == 1


def test_block_mode_holds_the_key_until_skip_or_release() -> None:
    h = Harness(max_attempts=1, on_exhausted="block")
    for k in ("a", "a", "b", "b"):
        h.produce(k)
    got = {e.message.key: e for e in h.pull()}
    h.fail(got["a"])
    h.ack(got["b"])
    assert keys(h.pull()) == ["b"]
    rows = h.engine.blocked_keys(h.now)
    exhausted = [r for r in rows if r.state == "exhausted"]
    assert [(r.order_value, r.offset, r.waiting) for r in exhausted] == [("a", 0, 1)]
    ref = h.engine.release("t", "a", None)
    assert ref == ("t", 0, 0)
    again = h.pull()
    # A fresh budget of charged deliveries; the delivery number goes on (never reused).
    assert [(e.message.offset, e.attempt, e.charged) for e in again] == [(0, 2, 0)]
    h.fail(*again)
    h.engine.skip("t", "a", None, h.now)
    assert offsets(h.pull()) == [1]
    dead = h.engine.take_commit().dead_letters
    assert [d.message.offset for d in dead] == [0]
    assert "skipped by operator" in (dead[0].last_error or "")


def test_finished_messages_are_not_kept_alive_by_deadline_heaps() -> None:
    h = Harness(ack_timeout_ms=60_000, retry_backoff_ms=[60_000], max_buffered=10_000)
    for i in range(2000):
        h.produce(f"k{i}")
    got = h.pull(2000)
    h.fail(*got[:500])  # retrying: their heap items are live
    h.ack(*got[500:])
    h.fetch()
    stats = h.engine.stats(h.now)
    live = stats.in_flight + stats.retrying
    # Only live items (plus a small slack) may stay referenced from the heaps (white box).
    assert len(h.engine._flight._timeouts) + len(h.engine._retries) <= 2 * live + 128
    retrying = {(b.qid, b.offset) for b in h.engine.blocked_keys(h.now) if b.state == "retrying"}
    assert retrying == {(d.message.qid, d.message.offset) for d in got[:500]}


def test_results_for_unknown_offsets_change_nothing() -> None:
    h = Harness()
    h.produce("a")
    h.pull()
    applied, unknown = h.engine.apply_results([Result("t", 0, acks=[5, 0])], h.now)
    assert applied == 1 and unknown == [("t", 0, 5)]
    assert h.engine.stats(h.now).in_flight == 0 and h.engine.stats(h.now).buffered == 0


def test_ack_latencies_are_reported_once_per_batch_of_results() -> None:
    h = Harness()
    calls: list[list[float]] = []
    h.engine = GroupEngine("g", h.config, {("t", 0): QueueProgress(0)}, {("t", 0): 0}, calls.append)
    for key in ("a", "b", "c"):
        h.produce(key)
    h.now += 250
    assert offsets(h.pull()) == [0, 1, 2]
    h.now += 500
    results = [Result("t", 0, acks=[0, 1], fails=[(2, "x")]), Result("t", 0, acks=[9])]
    applied, unknown = h.engine.apply_results(results, h.now)
    assert (applied, unknown) == (3, [("t", 0, 9)])
    assert calls == [[0.75, 0.75]]  # produced 750 ms before the acks; the fail is not an ack
    h.engine.apply_results([Result("t", 0, acks=[0])], h.now)  # already acked: unknown
    assert calls == [[0.75, 0.75]]


def test_extend_pushes_the_deadline() -> None:
    h = Harness(ack_timeout_ms=1000, retry_backoff_ms=[0])
    h.produce("a")
    got = h.pull()
    h.advance(900)
    assert h.engine.extend([got[0].message.ref], 1000, h.now) == (1, [])
    h.advance(900)
    assert h.pull() == [] and h.engine.stats(h.now).in_flight == 1
    h.advance(100)
    assert h.pull()[0].attempt == 2


def test_commit_progress_skips_finished_work_after_restart() -> None:
    h = Harness()
    for k in "abcd":
        h.produce(k)
    got = h.pull()
    h.ack(got[1], got[3])
    progress = h.engine.take_commit().progress
    # Compact form: below read_to only the open ranges (held in memory) are unfinished.
    assert progress[("t", 0)] == QueueProgress(
        0, read_to=4, open=((0, 1), (2, 3)), attempt_ceiling=ATTEMPT_RESERVE
    )
    h.new_engine(progress)
    assert offsets(h.pull()) == [0, 2]
    # Progress written by older versions (finished ranges) still loads.
    h.new_engine({("t", 0): QueueProgress(0, ((1, 2), (3, 4)))})
    assert offsets(h.pull()) == [0, 2]


def test_buffer_is_bounded_and_stuck_keys_are_parked() -> None:
    h = Harness(max_buffered=20, ack_timeout_ms=60_000)
    h.produce("stuck")
    stuck = h.pull()
    h.advance(1000)  # in flight long enough to count as stuck
    for i in range(200):
        h.produce("stuck" if i % 2 == 0 else f"k{i}")
    done: list[int] = []
    for _ in range(200):
        got = h.pull()
        assert h.engine.stats(h.now).buffered <= 20
        if not got:
            break
        assert "stuck" not in keys(got)
        h.ack(*got)
        done += offsets(got)
    assert len(done) == 100  # every healthy key got through
    assert h.engine.stats(h.now).queues[0].committed_offset == 0  # never past the stuck head
    h.ack(*stuck)
    order: list[int] = []
    while got := h.pull():
        assert keys(got) == ["stuck"] and h.engine.stats(h.now).buffered <= 20
        order += offsets(got)
        h.ack(*got)
    assert order == list(range(1, 201, 2))  # reloaded from the store, in offset order
    assert h.engine.stats(h.now).queues[0].committed_offset == 201


def test_a_deep_healthy_backlog_is_not_parked() -> None:
    h = Harness(max_buffered=20)
    for i in range(100):
        h.produce(f"k{i % 4}")
    got = h.pull()
    assert len(got) == 4 and h.engine.stats(h.now).buffered == 20
    h.fetch()
    assert h.engine.stats(h.now).waiting == 16  # heads just delivered: nothing parked
    h.advance(1000)  # now the heads count as stuck: park until the buffer is 3/4 full
    h.engine.plan_fetches(h.now)
    assert h.engine.stats(h.now).buffered <= 15
    assert h.engine.stats(h.now).parked_keys == 2


def test_offer_takes_fresh_messages_only_when_caught_up() -> None:
    h = Harness(max_buffered=3)
    assert h.produce_and_offer("a")  # caught up: taken directly
    assert [e.message.offset for e in h.engine.pull(10, None, h.now)] == [0]
    h.produce("b")  # stored but not offered: the engine is now behind
    assert not h.produce_and_offer("c")
    assert offsets(h.pull()) == [1, 2]  # the fetcher reads both, in order, once
    for k in "def":
        h.produce(k)
    h.fetch()
    assert not h.produce_and_offer("g")  # buffer full (3 in flight... + 3 read)
    assert h.engine.stats(h.now).queues[0].next_offset == 7


def test_a_planned_read_never_overshoots_the_bound_after_an_offer() -> None:
    h = Harness(queues=2, max_buffered=4)
    for _ in range(2):
        h.produce("a", qid=1)
    requests = h.engine.plan_fetches(h.now)  # planned while the buffer was empty
    for i in range(4):
        h.produce_and_offer(f"k{i}", qid=0)  # offers on queue 0 fill the buffer
    assert h.engine.stats(h.now).buffered == 4
    for r in requests:
        queue = h.log[(r.topic, r.qid)]
        h.engine.on_fetched(r, queue[r.from_offset : r.from_offset + r.max_count])
    assert h.engine.stats(h.now).buffered == 4
    assert h.engine.stats(h.now).queues[1].fetch_offset == 0  # nothing skipped: read again later


def test_seek_drops_memory_and_replays() -> None:
    h = Harness(queues=2)
    for q in (0, 1):
        for k in "ab":
            h.produce(k, qid=q)
    got = h.pull()
    h.ack(*got)
    h.engine.seek("t", {0: 0})
    replay = h.pull()
    assert sorted((e.message.qid, e.message.offset) for e in replay) == [(0, 0), (0, 1)]
    h.engine.seek("t", {0: 2, 1: 2})
    assert h.pull() == []
    assert h.engine.stats(h.now).buffered == 0


def test_redrive_delivers_dead_letters_again_in_order() -> None:
    h = Harness(max_attempts=1)
    for n in range(3):
        h.produce("a", {"n": n})
    for _ in range(3):
        h.fail(*h.pull())
    dead = h.engine.take_commit().dead_letters
    assert [d.message.offset for d in dead] == [0, 1, 2]
    assert h.engine.redrive(dead) == 3
    seen = []
    while got := h.pull():
        # A fresh budget (nothing charged), numbered above the deliveries before.
        assert len(got) == 1 and (got[0].attempt, got[0].charged) == (2, 0)
        seen.append(got[0].message.offset)
        h.ack(*got)
    assert seen == [0, 1, 2]
    assert h.engine.take_commit().redrive_done == [("t", 0, 0), ("t", 0, 1), ("t", 0, 2)]


def test_topics_filter_on_pull() -> None:
    h = Harness(topics={"t": {"order_by": "key"}, "u": {"order_by": "key"}})
    h.produce("a", topic="t")
    h.produce("a", topic="u")
    assert [e.message.topic for e in h.pull(10, topics=["u"])] == ["u"]
    assert [e.message.topic for e in h.pull(10)] == ["t"]
