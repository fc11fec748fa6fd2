"""Who consumes and how fast (``cproxy.broker.activity``): consumers seen in the last five
minutes, rates from per-second samples."""

from __future__ import annotations

from cproxy.broker.activity import CONSUMER_WINDOW_MS, Activity, ConsumerSeen

T0 = 1_700_000_000_000


def test_consumers_are_listed_for_five_minutes_with_their_messages_in_flight() -> None:
    activity = Activity()
    assert activity.last_pull_ms is None and activity.consumers(T0, {}) == []
    activity.pulled("w1", T0)
    activity.pulled("w2", T0 + 1000)
    listed = activity.consumers(T0 + 2000, {"w1": 3, None: 7})
    assert listed == [ConsumerSeen("w1", 2000, 3), ConsumerSeen("w2", 1000, 0)]
    assert activity.last_pull_ms == T0 + 1000
    later = T0 + CONSUMER_WINDOW_MS + 500
    assert activity.consumers(later, {}) == [ConsumerSeen("w2", CONSUMER_WINDOW_MS - 500, 0)]
    activity.pulled("w1", later)  # back again
    assert [c.consumer for c in activity.consumers(later, {})] == ["w1", "w2"]


def test_rates_span_the_samples_of_the_last_minute() -> None:
    activity = Activity()
    assert activity.rates(T0) == (0.0, 0.0)
    activity.sample(T0, 100, 50)
    assert activity.rates(T0) == (0.0, 0.0)  # one sample: no span yet
    activity.sample(T0 + 400, 110, 55)  # the same second: the last sample wins
    activity.sample(T0 + 2000, 130, 75)
    assert activity.rates(T0 + 2000) == (10.0, 10.0)
    for second in range(3, 70):
        activity.sample(T0 + second * 1000, 130 + 6 * (second - 2), 75)
    delivered, acked = activity.rates(T0 + 69_000)
    assert delivered == 6.0 and acked == 0.0  # the old samples have left the window


def test_consumers_gone_for_five_minutes_are_forgotten_without_a_stats_call() -> None:
    activity = Activity()
    activity.pulled("w1", T0)
    later = T0 + CONSUMER_WINDOW_MS + 60_000
    activity.sample(later - later % 60_000, 0, 0)  # a sample on a whole minute prunes
    # Asked as of a time when w1 would still count: it was forgotten by the sample already.
    assert activity.consumers(T0 + 1000, {}) == [] and activity.last_pull_ms == T0
