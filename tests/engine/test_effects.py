"""What engine calls report as due for their driver (``cproxy.engine.effects``): the bits the
runner wakes its loops from, in one place."""

from __future__ import annotations

from cproxy.engine.effects import COMMIT, DEADLINE, FETCH, READY
from tests.engine.harness import Harness


def test_a_taken_offer_makes_work_ready_and_a_refused_one_asks_for_a_fetch() -> None:
    h = Harness()
    first = h.produce("a")  # the broker's append tells the end (``note_end``) too
    h.engine.take_effects()
    assert h.engine.offer("t", 0, [first])
    assert h.engine.take_effects() == READY
    h.produce("b")  # never offered: the queue is no longer caught up
    late = h.produce("c")
    h.engine.take_effects()
    assert not h.engine.offer("t", 0, [late])
    assert h.engine.take_effects() == FETCH


def test_taking_the_effects_clears_them() -> None:
    h = Harness()
    h.produce_and_offer("a")
    assert h.engine.take_effects()
    assert h.engine.take_effects() == 0


def test_a_hand_out_sets_deadlines_and_an_empty_pull_reports_nothing() -> None:
    h = Harness()
    h.produce("a")
    h.fetch()
    h.engine.take_effects()
    assert h.engine.pull(10, None, h.now)
    assert h.engine.take_effects() == DEADLINE
    assert h.engine.pull(10, None, h.now) == []
    assert h.engine.take_effects() == 0


def test_an_ack_reports_the_next_ready_message_and_an_unknown_one_reports_nothing() -> None:
    h = Harness()
    h.produce("a")
    h.produce("a")
    first = h.pull(1)
    h.engine.take_effects()
    h.ack(*first)
    effects = h.engine.take_effects()
    assert effects & READY and effects & DEADLINE
    assert not effects & COMMIT
    h.ack(*first)  # answered already: unknown
    assert h.engine.take_effects() == 0


def test_a_dead_letter_asks_for_a_commit() -> None:
    h = Harness(max_attempts=1)
    h.produce("a")
    delivery = h.pull(1)
    h.engine.take_effects()
    h.fail(*delivery)
    assert h.engine.take_effects() & COMMIT


def test_the_timer_tick_always_asks_for_a_fetch() -> None:
    h = Harness()
    h.engine.take_effects()
    h.advance(10)
    assert h.engine.take_effects() & FETCH


def test_a_seek_asks_for_a_fetch() -> None:
    h = Harness()
    h.produce("a")
    h.pull(1)
    h.engine.take_effects()
    h.engine.seek("t", {0: 0})
    assert h.engine.take_effects() & FETCH
