"""Message ids from ``new_message_id``: valid UUIDv7 strings, increasing, unique across threads."""

from __future__ import annotations

import threading
import time
import uuid

from consumer_sdk import IdGenerator, new_message_id


def _ms_of(message_id: str) -> int:
    return uuid.UUID(message_id).int >> 80


def test_an_id_is_a_uuid7_of_now() -> None:
    before = time.time_ns() // 1_000_000
    message_id = new_message_id()
    after = time.time_ns() // 1_000_000
    parsed = uuid.UUID(message_id)
    assert str(parsed) == message_id  # the canonical form: 36 characters, lowercase
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122
    # Its millisecond is now's, or one borrowed by ids made earlier in this millisecond.
    assert before <= _ms_of(message_id) <= after + 1


def test_ids_increase_as_strings_within_one_millisecond() -> None:
    ids = [new_message_id() for _ in range(10_000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_past_4096_ids_in_one_millisecond_the_next_is_borrowed() -> None:
    gen = IdGenerator(clock_ms=lambda: 1_700_000_000_000)
    ids = [gen.new() for _ in range(5000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert _ms_of(ids[0]) == 1_700_000_000_000
    assert _ms_of(ids[-1]) == 1_700_000_000_001


def test_a_clock_that_steps_back_does_not_make_ids_go_back() -> None:
    now = [1_700_000_000_500]
    gen = IdGenerator(clock_ms=lambda: now[0])
    first = gen.new()
    now[0] -= 400  # the system clock was set back
    second = gen.new()
    assert second > first
    assert _ms_of(second) == 1_700_000_000_500
    now[0] += 1000
    assert _ms_of(gen.new()) == 1_700_000_001_100  # the clock again, once it is ahead


def test_ids_of_many_threads_are_unique_and_each_threads_increase() -> None:
    gen = IdGenerator()
    made: list[list[str]] = [[] for _ in range(4)]

    def make(out: list[str]) -> None:
        out.extend(gen.new() for _ in range(3000))

    threads = [threading.Thread(target=make, args=(out,)) for out in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    every = [i for out in made for i in out]
    assert len(set(every)) == 4 * 3000
    assert all(out == sorted(out) for out in made)
