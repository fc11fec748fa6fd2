"""Progress under stalls: compact persisted form, restarts that replay nothing acked, lag."""

from __future__ import annotations

from cproxy.model import QueueProgress
from tests.engine.harness import Harness, keys, offsets


def _stall_run(h: Harness, stalled: set[str], messages: int) -> set[int]:
    """Produce ``messages`` over 100 keys; ack everything but the stalled keys' messages."""
    acked: set[int] = set()
    for i in range(messages):
        h.produce(f"k{i % 100}")
        if i % 50 == 0:
            while got := h.pull(200):
                ok = [d for d in got if d.message.key not in stalled]
                h.ack(*ok)
                acked |= {d.message.offset for d in ok}
            h.advance(200)
    while got := h.pull(200):
        ok = [d for d in got if d.message.key not in stalled]
        h.ack(*ok)
        acked |= {d.message.offset for d in ok}
        h.advance(200)
    return acked


def test_persisted_progress_stays_bounded_by_stalled_keys_under_a_long_stall() -> None:
    stalled = {"k7"}
    h = Harness(max_buffered=50, ack_timeout_ms=10_000_000)
    acked = _stall_run(h, stalled, 20_000)
    p = h.engine.take_commit().progress[("t", 0)]
    assert p.committed == 7  # never past the stalled key's head
    # One stalled key: its head is open (held) and the rest of its chain parked.
    assert len(p.open) == 1 and len(p.parked) == 1, p
    assert len(p.detail_json()) < 200
    s = h.engine.stats(h.now)
    assert s.queues[0].lag == 20_000 - 7
    assert s.lag_excluding_parked <= 1  # healthy keys are caught up: only the stuck head
    assert len(acked) == 20_000 - 200


def test_a_restart_from_compact_progress_replays_nothing_acked() -> None:
    stalled = {"k3", "k42"}
    h = Harness(max_buffered=40, ack_timeout_ms=10_000_000)
    acked = _stall_run(h, stalled, 5_000)
    progress = h.engine.take_commit().progress
    h.new_engine(progress)
    replayed: list[int] = []
    while got := h.pull(500):
        assert set(keys(got)) <= stalled
        replayed += offsets(got)
        h.ack(*got)
    assert not set(replayed) & acked
    expected = sorted(o for o in range(5_000) if f"k{o % 100}" in stalled)
    assert sorted(replayed) == expected
    assert h.engine.take_commit().progress[("t", 0)].committed == 5_000


def test_order_holds_across_a_restart_with_held_and_new_messages() -> None:
    h = Harness(ack_timeout_ms=10_000_000)
    for _ in range(3):
        h.produce("a")
    assert offsets(h.pull()) == [0]  # 1 and 2 wait in memory behind the head
    progress = h.engine.take_commit().progress
    # The head is open; what waits behind it is persisted as (order value, first offset).
    assert progress[("t", 0)].open == ((0, 1),) and progress[("t", 0)].parked == (("a", 1),)
    h.new_engine(progress)
    h.produce("a")  # new after the restart: must come after 0, 1, 2
    assert h.produce_and_offer("a") is False  # not taken before the restore is read
    order: list[int] = []
    while got := h.pull():
        order += offsets(got)
        h.ack(*got)
    assert order == [0, 1, 2, 3, 4]


def test_retention_skips_unread_messages_and_counts_them() -> None:
    h = Harness(max_buffered=5)
    for i in range(20):
        h.produce(f"k{i}")
    h.pull()  # 5 held (in flight)
    assert h.engine.on_retention("t", 0, 12) == 7  # 5..11 were never read
    got = h.pull()
    assert got == []  # buffer still full of the in-flight five
    s = h.engine.stats(h.now)
    assert s.lost_to_retention == 7 and s.topics[0].lost_to_retention == 7
    assert s.queues[0].fetch_offset == 12
    h.engine.take_commit()
    assert h.engine.on_retention("t", 0, 3) == 0  # nothing unread below 3


def test_a_legacy_range_form_loads_and_is_rewritten_compactly() -> None:
    h = Harness()
    for k in "abcdef":
        h.produce(k)
    h.new_engine({("t", 0): QueueProgress(1, ((2, 4),))})
    assert offsets(h.pull()) == [1, 4, 5]
    p = h.engine.take_commit().progress[("t", 0)]
    assert p.read_to == 6 and p.open == ((1, 2), (4, 6)) and p.committed == 1


def test_a_restore_longer_than_one_read_finishes_before_new_messages() -> None:
    h = Harness(max_buffered=3000, ack_timeout_ms=10_000_000)
    for _ in range(1500):
        h.produce("a")
    assert offsets(h.pull()) == [0]  # 1..1499 wait in memory behind the head
    progress = h.engine.take_commit().progress
    h.new_engine(progress)
    h.produce("a")  # offset 1500, after the restart
    order: list[int] = []
    while got := h.pull():
        order += offsets(got)
        h.ack(*got)
    assert order == list(range(1501))


def test_progress_is_per_stalled_key_before_the_buffer_fills() -> None:
    # A big buffer: the stuck keys' waiting messages stay in memory (nothing parked) ...
    stalled = {f"k{i}" for i in range(5)}
    h = Harness(max_buffered=100_000, ack_timeout_ms=10_000_000)
    _stall_run(h, stalled, 10_000)
    assert h.engine.stats(h.now).parked_keys == 0 and h.engine.stats(h.now).waiting > 400
    p = h.engine.take_commit().progress[("t", 0)]
    # ... yet progress names each stuck key once: its head open, the rest as one pair.
    assert len(p.open) <= 5 and len(p.parked) == 5, p
    assert len(p.detail_json()) < 300


def test_a_restart_reads_all_stuck_keys_back_in_one_scan() -> None:
    stalled = {f"k{i}" for i in range(20)}
    h = Harness(max_buffered=100_000, ack_timeout_ms=10_000_000)
    acked = _stall_run(h, stalled, 8_000)
    progress = h.engine.take_commit().progress
    h.new_engine(progress)
    before = h.store.reads
    replayed: list[int] = []
    while got := h.pull(1000):
        replayed += offsets(got)
        h.ack(*got)
    assert not set(replayed) & acked
    assert sorted(replayed) == sorted(o for o in range(8_000) if f"k{o % 100}" in stalled)
    # 20 restore ranges (the heads) + one scan of 8,000 offsets, not one scan per key.
    assert h.store.reads - before < 20 + 8_000 // 2000 + 8


def test_the_restart_scan_skips_heads_that_were_restored() -> None:
    h = Harness(ack_timeout_ms=10_000_000)
    for k in "BBABA":  # B: 0 (head), 1, 3 waiting; A: 2 (head), 4 waiting
        h.produce(k)
    assert sorted(offsets(h.pull())) == [0, 2]
    progress = h.engine.take_commit().progress
    assert progress[("t", 0)].parked == (("A", 4), ("B", 1))
    h.new_engine(progress)
    seen: list[int] = []
    while got := h.pull():
        seen += offsets(got)
        h.ack(*got)
    assert sorted(seen) == [0, 1, 2, 3, 4]  # each exactly once, A's head not read twice
