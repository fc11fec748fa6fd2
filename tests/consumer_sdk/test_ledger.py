"""The consumer's ledger: results recorded per server, grouped per queue when sent, put back
when sending failed."""

from __future__ import annotations

from consumer_sdk._ledger import Ledger
from consumer_sdk.models import Message, QueueResult


def message(qid: int, offset: int, attempt: int = 1) -> Message:
    return Message("rides", qid, offset, None, {}, attempt=attempt)


def test_results_are_grouped_per_queue_and_fenced_by_their_attempt() -> None:
    ledger = Ledger(1)
    a, b, c = ledger.add(0, [message(0, 5), message(1, 7, attempt=3), message(0, 6)])
    assert ledger.settle(a, None) and ledger.settle(b, "ValueError: x" * 500)
    assert ledger.settle(c, None)
    assert not ledger.settle(a, "again")  # a delivery is settled once
    assert ledger.stats().pending_results == 3 and ledger.stats().outstanding == 0
    results = ledger.take_results(0)
    assert results == [
        QueueResult("rides", 0, acks=(5, 6), attempts=((5, 1), (6, 1))),
        QueueResult("rides", 1, fails=((7, ("ValueError: x" * 500)[:2000]),), attempts=((7, 3),)),
    ]
    assert ledger.take_results(0) == [] and ledger.stats().pending_results == 0
    assert (ledger.stats().acked, ledger.stats().failed) == (2, 1)


def test_results_put_back_go_first_in_the_next_send_of_their_queue() -> None:
    ledger = Ledger(2)
    first, second = ledger.add(1, [message(0, 1), message(0, 2)])
    ledger.settle(first, None)
    sent = ledger.take_results(1)
    ledger.settle(second, "boom")
    ledger.restore_results(1, sent)  # that send failed
    assert ledger.pending_since(1) is not None and ledger.urgent(1)
    assert ledger.stats().pending_results == 2 and ledger.take_results(0) == []
    assert ledger.take_results(1) == [
        QueueResult("rides", 0, acks=(1,), fails=((2, "boom"),), attempts=((1, 1), (2, 1)))
    ]
