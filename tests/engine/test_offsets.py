from __future__ import annotations

import random

from cproxy.engine.offsets import OffsetTracker


def test_in_order_advances_base_without_ranges() -> None:
    t = OffsetTracker(5)
    for o in range(5, 10):
        assert t.finish(o)
    assert t.base == 10
    assert t.ranges() == ()


def test_out_of_order_keeps_lowest_unfinished() -> None:
    t = OffsetTracker(0)
    for o in (3, 4, 1, 7):
        t.finish(o)
    assert t.base == 0
    assert t.ranges() == ((1, 2), (3, 5), (7, 8))
    t.finish(2)
    assert t.ranges() == ((1, 5), (7, 8))
    t.finish(0)
    assert t.base == 5
    assert t.ranges() == ((7, 8),)
    assert t.is_finished(7) and not t.is_finished(6) and t.is_finished(4)


def test_finish_twice_and_below_base_are_noops() -> None:
    t = OffsetTracker(10)
    assert not t.finish(3)
    assert t.finish(12)
    assert not t.finish(12)


def test_load_from_ranges_folds_into_base() -> None:
    t = OffsetTracker(4, [(4, 6), (8, 9), (2, 3), (9, 11)])
    assert t.base == 6
    assert t.ranges() == ((8, 11),)
    assert not t.dirty


def test_random_order_matches_a_set_model() -> None:
    rng = random.Random(7)
    offsets = list(range(2000))
    rng.shuffle(offsets)
    t = OffsetTracker(0)
    done: set[int] = set()
    for o in offsets:
        t.finish(o)
        done.add(o)
        expected_base = 0
        while expected_base in done:
            expected_base += 1
        assert t.base == expected_base
        if o % 97 == 0:
            covered = {x for s, e in t.ranges() for x in range(s, e)}
            assert covered == {x for x in done if x >= t.base}
            reloaded = OffsetTracker(t.base, t.ranges())
            assert (reloaded.base, reloaded.ranges()) == (t.base, t.ranges())
    assert t.base == 2000 and t.ranges() == ()


def test_reset() -> None:
    t = OffsetTracker(0, [(3, 5)])
    t.reset(100)
    assert t.base == 100 and t.ranges() == () and t.dirty
