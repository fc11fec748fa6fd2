"""Delayed messages in the engine: never early, only their own chain waits, memory stays
bounded (far-delayed keys sleep as parked records, far-delayed unordered messages are released
to the queue's delay window), and delays survive a restart."""

from __future__ import annotations

import random

import orjson

from cproxy.engine.delays import RELEASE_BEYOND_MS
from cproxy.engine.sequencer import SLEEP_BEYOND_MS
from cproxy.engine.snapshots import Handout
from tests.engine.harness import Harness, keys, offsets

UNORDERED = {"t": {"order_by": "none"}}


def drain(h: Harness, until_ms: int, step_ms: int = 100) -> list[Handout]:
    """Pull and ack everything until the harness clock reaches ``until_ms``, checking on
    every pull that nothing is handed out before its ``deliver_at_ms``."""
    got: list[Handout] = []
    while True:
        batch = h.pull(1000)
        for d in batch:
            due = d.message.deliver_at_ms
            assert due is None or due <= h.now, (d.message.offset, due, h.now)
        got += batch
        h.ack(*batch)
        if h.now >= until_ms and not batch:
            return got
        h.advance(step_ms)


def test_a_delayed_message_is_not_delivered_before_its_time() -> None:
    h = Harness()
    h.produce("a", delay_ms=1500)
    h.produce("b", delay_ms=60_000)
    h.produce(None, delay_ms=700)
    assert h.pull() == []
    h.advance(699)
    assert h.pull() == []
    h.advance(1)
    (unordered,) = h.pull()
    assert unordered.message.key is None
    h.ack(unordered)
    h.advance(799)
    assert h.pull() == []
    h.advance(1)
    (a,) = h.pull()
    assert a.message.key == "a"
    h.ack(a)
    got = drain(h, h.now + 60_000)
    assert keys(got) == ["b"]


def test_a_delayed_message_holds_only_its_own_key() -> None:
    h = Harness()
    h.produce("a", body=1, delay_ms=1000)
    h.produce("a", body=2)  # must wait behind the delayed one
    h.produce("b", body=3)
    h.produce(None, body=4)
    first = h.pull()
    assert sorted(str(k) for k in keys(first)) == ["None", "b"]
    h.ack(*first)
    assert h.engine.stats(h.now).delayed == 1
    assert h.engine.blocked_keys(h.now) == []  # delayed is not blocked
    h.advance(1000)
    d1 = h.pull()
    assert [d.message.body_json for d in d1] == [b"1"]
    assert h.pull() == []  # a's next waits for the ack, as order requires
    h.ack(*d1)
    assert [d.message.body_json for d in h.pull()] == [b"2"]


def test_far_delayed_keys_sleep_and_do_not_block_undelayed_keys() -> None:
    h = Harness(max_buffered=100, ack_timeout_ms=600_000)
    for i in range(1000):
        h.produce(f"late-{i}", delay_ms=60_000 + i)
        h.produce(f"late-{i}", body="behind")  # waits behind its delayed head
    for i in range(300):
        h.produce(f"now-{i}")
    got = drain(h, h.now + 1000)
    assert sorted(keys(got)) == sorted(f"now-{i}" for i in range(300))
    stats = h.engine.stats(h.now)
    assert stats.buffered == 0  # the sleeping chains hold no message
    assert stats.parked_keys == 1000
    assert stats.delayed == 1000
    # Persisted compactly: one (order value, first offset) per delayed key.
    (progress,) = h.engine.progress().values()
    assert len(progress.parked) == 1000
    assert progress.committed == 0
    late = drain(h, h.now + 62_000)
    assert len(late) == 2000
    by_key: dict[str | None, list[bytes]] = {}
    for d in late:
        by_key.setdefault(d.message.key, []).append(d.message.body_json)
    assert all(bodies[1] == b'"behind"' for bodies in by_key.values())
    assert h.engine.stats(h.now).parked_keys == 0
    assert h.engine.progress()[("t", 0)].committed == 2300


def test_a_buffer_full_of_soon_due_delayed_heads_does_not_block_other_keys() -> None:
    # Due within SLEEP_BEYOND_MS: held in memory as DELAYED heads; they fill the buffer.
    h = Harness(max_buffered=50, ack_timeout_ms=600_000)
    for i in range(50):
        h.produce(f"soon-{i}", delay_ms=SLEEP_BEYOND_MS - 100)
    for i in range(20):
        h.produce(f"free-{i}")
    h.fetch()
    assert h.engine.stats(h.now).buffered == 50
    got: list[Handout] = []
    for _ in range(5):  # a few park checks (every 100 ms)
        h.advance(100)
        got += h.pull()
    assert sorted(keys(got)) == sorted(f"free-{i}" for i in range(20))
    assert h.engine.stats(h.now).buffered <= 50
    h.ack(*got)
    late = drain(h, h.now + SLEEP_BEYOND_MS)
    assert sorted(keys(late)) == sorted(f"soon-{i}" for i in range(50))


def test_far_delayed_unordered_messages_are_released_and_found_again() -> None:
    h = Harness(max_buffered=100, ack_timeout_ms=600_000, topics=UNORDERED)
    rng = random.Random(7)
    delays = [rng.randrange(RELEASE_BEYOND_MS + 1, 120_000) for _ in range(5000)]
    for i, delay in enumerate(delays):
        h.produce(None, body=i, delay_ms=delay)
        if i % 10 == 0:
            h.produce(None, body="now")
    first = drain(h, h.now + 200)
    assert [d.message.body_json for d in first] == [b'"now"'] * 500
    stats = h.engine.stats(h.now)
    # Only messages due within RELEASE_BEYOND_MS of a read are held (the clock moved).
    assert stats.buffered < 20
    assert stats.delayed == 5000
    (progress,) = h.engine.progress().values()
    assert progress.committed == 0
    assert 1 <= len(progress.delayed) <= 8  # a few segments, not one record per message
    rest = drain(h, h.now + 121_000, step_ms=250)
    assert sorted(int(d.message.body_json) for d in rest) == list(range(5000))
    assert max(d.attempt for d in rest) == 1
    assert h.engine.stats(h.now).delayed == 0
    assert h.engine.progress()[("t", 0)].committed == 5500
    assert h.engine.progress()[("t", 0)].delayed == ()


def test_rescans_admit_within_the_buffer_and_keep_the_rest_released() -> None:
    h = Harness(max_buffered=40, ack_timeout_ms=600_000, topics=UNORDERED)
    for i in range(400):  # all due at nearly the same time: far more than the buffer
        h.produce(None, body=i, delay_ms=10_000 + i % 3)
    h.fetch()
    assert h.engine.stats(h.now).buffered == 0
    seen: list[int] = []
    peak = 0
    while len(seen) < 400:
        h.advance(100)
        batch = h.pull(7)
        peak = max(peak, h.engine.stats(h.now).buffered)
        for d in batch:
            assert d.message.deliver_at_ms is not None
            assert d.message.deliver_at_ms <= h.now
        seen += [int(d.message.body_json) for d in batch]
        h.ack(*batch)
        assert h.now < 1_000_000 + 60_000, "delayed messages were lost"
    assert sorted(seen) == list(range(400))
    assert peak <= 40


def test_delays_survive_a_restart() -> None:
    h = Harness(max_buffered=100, ack_timeout_ms=600_000)
    for i in range(50):
        h.produce(f"k{i}", body=i, delay_ms=30_000)
        h.produce(None, body=100 + i, delay_ms=30_000)
    h.produce(None, body="near", delay_ms=1000)  # held in memory as DELAYED
    h.produce("x", body="now")
    got = drain(h, h.now + 100)
    assert [d.message.body_json for d in got] == [b'"now"']
    # Restart from the persisted progress (nothing else survives).
    h.new_engine(h.engine.progress())
    assert h.pull() == []
    h.advance(500)
    assert h.pull() == []
    later = drain(h, h.now + 31_000)
    bodies = sorted(str(orjson.loads(d.message.body_json)) for d in later)
    expected = ["near", *(str(i) for i in range(50)), *(str(100 + i) for i in range(50))]
    assert bodies == sorted(expected)
    assert h.engine.progress()[("t", 0)].committed == 102


def test_a_restart_during_a_rescan_loses_and_repeats_nothing() -> None:
    h = Harness(max_buffered=10, ack_timeout_ms=600_000, topics=UNORDERED)
    for i in range(100):
        h.produce(None, body=i, delay_ms=5000)
    h.fetch()
    h.advance(5000)
    first = h.pull(4)  # the rescan paused with a full buffer; 4 handed out
    h.ack(*first[:2])  # two finished, two in flight when the process dies
    h.new_engine(h.engine.progress())
    rest = drain(h, h.now + 1000)
    done = [int(d.message.body_json) for d in first[:2]]
    assert sorted(done + [int(d.message.body_json) for d in rest]) == list(range(100))


def test_a_retry_is_not_delayed_again_and_a_seek_drops_delayed_messages() -> None:
    h = Harness(retry_backoff_ms=[10])
    h.produce("a", delay_ms=500)
    h.advance(500)
    (d,) = h.pull()
    h.fail(d)
    h.advance(10)
    (again,) = h.pull()
    assert again.attempt == 2
    h.ack(again)
    h.produce(None, delay_ms=500)
    h.produce(None, delay_ms=60_000)
    h.produce("b", delay_ms=60_000)
    assert h.pull() == []
    h.engine.seek("t", {0: 4})
    assert h.engine.stats(h.now).buffered == 0
    assert h.engine.stats(h.now).delayed == 0
    assert drain(h, h.now + 61_000) == []
    assert offsets(h.pull()) == []


def test_a_same_key_run_stops_before_a_message_not_due_yet() -> None:
    h = Harness()
    h.produce("a", body=1)
    h.produce("a", body=2)
    h.produce("a", body=3, delay_ms=5000)
    h.produce("a", body=4)
    h.fetch()
    run = h.engine.pull(10, None, h.now, max_per_key=10)
    assert [d.message.body_json for d in run] == [b"1", b"2"]
    h.ack(*run)
    assert h.engine.pull(10, None, h.now, max_per_key=10) == []
    h.advance(5000)
    h.fetch()  # the chain slept (3 is far off) and is read back when it wakes
    assert [d.message.body_json for d in h.engine.pull(10, None, h.now, max_per_key=10)] == [
        b"3",
        b"4",
    ]
