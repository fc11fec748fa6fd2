"""The order checker the cluster tests rely on: it must flag disorder and accept the
duplicates a crash is allowed to cause."""

from __future__ import annotations

from tests.cluster.proxies import Record

A, B = "http://a", "http://b"


def record(*deliveries: tuple[int, float, str]) -> Record:
    r = Record()
    for offset, t, url in deliveries:
        r.deliveries[(0, offset)].append((t, 1, url))
        r.keys[(0, offset)] = "k"
    return r


def test_in_order_with_applied_acks_passes() -> None:
    r = record((0, 1.0, A), (1, 3.0, A))
    r.ack_times[(0, 0)].append(2.0)
    assert r.order_violations() == []


def test_next_before_the_ack_is_flagged() -> None:
    r = record((0, 1.0, A), (1, 3.0, A))
    r.ack_times[(0, 0)].append(4.0)
    assert r.order_violations() == ["k: (0, 1) delivered by http://a before (0, 0) was acked"]


def test_a_crash_redelivering_both_in_order_passes() -> None:
    # A applied the ack of 0 (the answer was lost), handed out 1, died uncommitted; B
    # delivers 0 and then 1 again.
    r = record((0, 1.0, A), (1, 3.0, A), (0, 10.0, B), (1, 12.0, B))
    r.in_doubt[(0, 0)] = (2.0, A)
    r.ack_times[(0, 0)].append(11.0)
    assert r.order_violations() == []


def test_the_next_owner_skipping_the_redelivered_ack_is_flagged() -> None:
    # B redelivers 0 but hands out 1 before 0's new ack: the old, in-doubt ack does not count.
    r = record((0, 1.0, A), (0, 10.0, B), (1, 11.0, B))
    r.in_doubt[(0, 0)] = (2.0, A)
    r.ack_times[(0, 0)].append(12.0)
    assert r.order_violations()


def test_one_proxy_delivering_the_previous_again_is_flagged() -> None:
    r = record((0, 1.0, A), (1, 3.0, A), (0, 5.0, A))
    r.ack_times[(0, 0)].append(2.0)
    assert r.order_violations() == ["k: http://a delivered (0, 0) again after (0, 1)"]
