"""The reload path: parked chains read back from the store through plain range reads."""

from __future__ import annotations

from cproxy.engine.reader import RELOAD_SCAN_BATCH
from cproxy.engine.records import Result
from tests.engine.harness import Harness, keys


def _park_a_long_chain(h: Harness, total: int) -> None:
    h.produce("stuck")
    h.pull()
    h.advance(1000)  # in flight long enough to count as stuck
    for i in range(total):
        h.produce("stuck" if i % 2 == 0 else f"k{i}")


def test_a_parked_chain_longer_than_one_scan_is_reloaded_whole_and_in_order() -> None:
    # Scans are cut twice: at RELOAD_SCAN_BATCH messages per read and at the buffer bound,
    # so the chain's messages come back over many reads; none past a cut may drop out.
    total = 3 * RELOAD_SCAN_BATCH + 17
    h = Harness(max_buffered=20, ack_timeout_ms=600_000)
    _park_a_long_chain(h, total)
    healthy = 0
    while got := h.pull():
        assert "stuck" not in keys(got)
        h.ack(*got)
        healthy += len(got)
    assert healthy == total // 2
    assert h.engine.stats(h.now).parked_keys == 1
    # The stuck head is in flight: listed once it has been so for stuck_after_ms.
    first = [d for d in h.engine.blocked_keys(h.now + 60_000) if d.order_value == "stuck"]
    assert first[0].parked
    # Unblock: ack the head, then drain the stuck key.
    assert h.engine.apply_results([Result("t", 0, acks=[0])], h.now).applied == 1
    reads_before = h.store.reads
    order: list[int] = []
    while got := h.pull():
        assert keys(got) == ["stuck"] and h.engine.stats(h.now).buffered <= 20
        order += [d.message.offset for d in got]
        h.ack(*got)
    assert order == list(range(1, total + 1, 2))
    assert h.store.reads - reads_before >= 3  # really several range reads
    assert h.engine.stats(h.now).queues[0].committed_offset == total + 1
    assert h.engine.stats(h.now).parked_keys == 0


def test_a_failed_reload_read_is_planned_again() -> None:
    h = Harness(max_buffered=10, ack_timeout_ms=600_000)
    _park_a_long_chain(h, 60)
    while got := h.pull():
        h.ack(*got)
    h.engine.apply_results([Result("t", 0, acks=[0])], h.now)
    requests = h.engine.plan_fetches(h.now)
    assert requests and all(r.is_reload for r in requests)
    for r in requests:
        h.engine.on_fetch_failed(r)  # the store was down
    order: list[int] = []
    while got := h.pull():
        order += [d.message.offset for d in got]
        h.ack(*got)
    assert order == list(range(1, 61, 2))


def test_messages_arriving_during_a_reload_wait_behind_it() -> None:
    h = Harness(max_buffered=10, ack_timeout_ms=600_000)
    _park_a_long_chain(h, 40)
    while got := h.pull():
        h.ack(*got)
    h.engine.apply_results([Result("t", 0, acks=[0])], h.now)
    requests = h.engine.plan_fetches(h.now)  # reload planned, not yet served
    late = h.produce("stuck")  # arrives while the reload is under way
    assert h.engine.offer("t", 0, [late])  # read, but parked: the chain is reloading
    h.serve(requests)
    order: list[int] = []
    while got := h.pull():
        order += [d.message.offset for d in got]
        h.ack(*got)
    assert order == [*range(1, 41, 2), late.offset]


def _nothing_plannable_unless_wanted(h: Harness) -> None:
    """``wants_fetch`` False means ``plan_fetches`` plans nothing at this time."""
    if not h.engine.wants_fetch():
        assert h.engine.plan_fetches(h.now) == []


def test_wants_fetch_is_true_whenever_a_read_may_be_planned() -> None:
    # The broker wakes its fetcher after acks only when this says so (GroupRunner).
    h = Harness(max_buffered=10, ack_timeout_ms=600_000)
    assert not h.engine.wants_fetch()
    h.produce("a")
    assert h.engine.wants_fetch()  # a message not read yet
    got = h.pull()
    assert not h.engine.wants_fetch()
    h.ack(*got)
    _nothing_plannable_unless_wanted(h)

    _park_a_long_chain(h, 60)  # fills the buffer: new messages wait unread
    assert h.engine.wants_fetch()
    while got := h.pull():
        h.ack(*got)
        _nothing_plannable_unless_wanted(h)
    assert h.engine.stats(h.now).parked_keys == 1 and not h.engine.wants_fetch()
    # The stuck head is acked: its parked chain must be read back.
    assert h.engine.apply_results([Result("t", 0, acks=[1])], h.now).applied == 1
    assert h.engine.wants_fetch()
    while got := h.pull():
        h.ack(*got)
        _nothing_plannable_unless_wanted(h)
    assert h.engine.stats(h.now).parked_keys == 0 and not h.engine.wants_fetch()
    assert h.engine.stats(h.now).queues[0].committed_offset == 62
