"""The ``Store`` contract (``cproxy/store/base.py``), run against every implementation.

The ``store`` fixture (``conftest.py``) gives each implementation in turn; the PostgreSQL run
needs the ``pg_dsn`` fixture: a real server. Retention and topic deletes: ``test_store_retention``.
"""

from __future__ import annotations

import pytest

from cproxy.errors import InvalidRequest, StoreError, TopicConflict, TopicNotFound
from cproxy.model import (
    AppendResult,
    DeadLetter,
    NewMessage,
    QueueProgress,
    QueueStats,
    Record,
    TopicInfo,
)
from cproxy.store.base import Store

T0 = 1_700_000_000_000
WINDOW = 60_000


def new(
    qid: int, body: bytes = b"{}", *, key: str | None = None, id: str | None = None
) -> NewMessage:
    return NewMessage(qid=qid, key=key, body_json=body, id=id)


async def offsets(store: Store, topic: str, qid: int) -> list[int]:
    return [m.offset for m in await store.read(topic, qid, 0, 10_000)]


async def next_offsets(store: Store, topic: str) -> list[int]:
    return [s.next_offset for s in await store.queue_stats(topic)]


def dead(message: Record, attempts: int = 3, *, redriving: bool = False) -> DeadLetter:
    return DeadLetter("g", message, attempts, f"error {attempts}", T0 + 5, redriving)


# -- topics ----------------------------------------------------------------------------------


async def test_create_topic_is_idempotent_and_conflicts_on_other_queue_count(store: Store) -> None:
    assert await store.create_topic("orders", 4) == (TopicInfo("orders", 4), True)
    assert await store.create_topic("orders", 4) == (TopicInfo("orders", 4), False)
    with pytest.raises(TopicConflict):
        await store.create_topic("orders", 8)
    await store.create_topic("audit", 1)
    assert await store.list_topics() == [TopicInfo("audit", 1), TopicInfo("orders", 4)]


async def test_create_topic_rejects_zero_queues(store: Store) -> None:
    with pytest.raises(InvalidRequest):
        await store.create_topic("t", 0)
    assert await store.list_topics() == []


async def test_queue_stats(store: Store) -> None:
    await store.create_topic("t", 3)
    assert await store.queue_stats("t") == [QueueStats(q, 0, 0) for q in range(3)]
    await store.append("t", [new(0), new(2), new(2)], T0, 0)
    assert await store.queue_stats("t") == [
        QueueStats(0, 0, 1),
        QueueStats(1, 0, 0),
        QueueStats(2, 0, 2),
    ]
    with pytest.raises(TopicNotFound):
        await store.queue_stats("nope")


# -- append and read -------------------------------------------------------------------------


async def test_offsets_start_at_zero_and_are_contiguous_per_queue(store: Store) -> None:
    await store.create_topic("t", 3)
    first = await store.append("t", [new(0), new(1), new(0), new(2), new(0)], T0, 0)
    assert [(r.qid, r.offset) for r in first] == [(0, 0), (1, 0), (0, 1), (2, 0), (0, 2)]
    second = await store.append("t", [new(1), new(0)], T0, 0)
    assert [(r.qid, r.offset) for r in second] == [(1, 1), (0, 3)]
    assert await offsets(store, "t", 0) == [0, 1, 2, 3]
    assert await offsets(store, "t", 1) == [0, 1]
    assert await offsets(store, "t", 2) == [0]


async def test_append_stores_every_field(store: Store) -> None:
    await store.create_topic("t", 2)
    await store.append(
        "t",
        [
            NewMessage("ride-7", b'{"event":"pickup"}', b'{"h":"v"}', "m-1", qid=1),
            NewMessage(None, b'"plain"', qid=1),
        ],
        T0,
        WINDOW,
    )
    assert await store.read("t", 1, 0, 10) == [
        Record("t", 1, 0, "ride-7", b'{"event":"pickup"}', b'{"h":"v"}', "m-1", T0),
        Record("t", 1, 1, None, b'"plain"', None, None, T0),
    ]


async def test_deliver_at_is_stored_and_read_back(store: Store) -> None:
    await store.create_topic("t", 1)
    results = await store.append(
        "t",
        [
            NewMessage("k", b"1", qid=0, deliver_at_ms=T0 + 60_000),
            NewMessage("k", b"2", qid=0),
            NewMessage(None, b"3", qid=0, deliver_at_ms=2**62),
        ],
        T0,
        WINDOW,
    )
    read = await store.read("t", 0, 0, 10)
    assert [m.deliver_at_ms for m in read] == [T0 + 60_000, None, 2**62]
    assert [r.message for r in results] == read


async def test_append_results_carry_the_stored_message(store: Store) -> None:
    await store.create_topic("t", 2)
    results = await store.append(
        "t", [new(1, b"1", key="k", id="a"), new(1, b"2", id="a"), new(0, b"3")], T0, WINDOW
    )
    assert [r.message for r in results] == [
        Record("t", 1, 0, "k", b"1", None, "a", T0),
        None,  # a duplicate: the original is not read back
        Record("t", 0, 0, None, b"3", None, None, T0),
    ]
    assert [r.message for r in results if r.message] == [
        *await store.read("t", 1, 0, 10),
        *await store.read("t", 0, 0, 10),
    ]


async def test_append_requires_a_qid(store: Store) -> None:
    await store.create_topic("t", 2)
    with pytest.raises(InvalidRequest):
        await store.append("t", [new(0), NewMessage("k", b"{}")], T0, 0)
    assert await next_offsets(store, "t") == [0, 0]


async def test_append_to_unknown_topic_raises(store: Store) -> None:
    with pytest.raises(TopicNotFound):
        await store.append("nope", [new(0)], T0, 0)


async def test_append_is_atomic(store: Store) -> None:
    await store.create_topic("t", 2)
    await store.append("t", [new(0, b"1")], T0, WINDOW)
    # The bad qid comes last, after valid messages and a new dedup id.
    batch = [new(0, b"2", id="a"), new(1, b"3"), new(5, b"4")]
    with pytest.raises(InvalidRequest):
        await store.append("t", batch, T0, WINDOW)
    assert await next_offsets(store, "t") == [1, 0]
    assert [m.body_json for m in await store.read("t", 0, 0, 10)] == [b"1"]
    # Nothing of the failed call leaks into later ones: offsets and dedup ids are untouched.
    results = await store.append("t", [new(0, id="a"), new(1)], T0, WINDOW)
    assert results == [AppendResult(0, 1), AppendResult(1, 0)]


async def test_append_empty_batch(store: Store) -> None:
    await store.create_topic("t", 1)
    assert await store.append("t", [], T0, WINDOW) == []
    assert await next_offsets(store, "t") == [0]


async def test_read_ranges_and_max_count(store: Store) -> None:
    await store.create_topic("t", 2)
    await store.append("t", [new(0, str(i).encode()) for i in range(10)], T0, 0)
    assert [m.offset for m in await store.read("t", 0, 3, 4)] == [3, 4, 5, 6]
    assert [m.body_json for m in await store.read("t", 0, 8, 100)] == [b"8", b"9"]
    assert [m.offset for m in await store.read("t", 0, -5, 2)] == [0, 1]
    assert await store.read("t", 0, 10, 100) == []
    assert await store.read("t", 0, 0, 0) == []
    assert await store.read("t", 1, 0, 100) == []
    with pytest.raises(TopicNotFound):
        await store.read("nope", 0, 0, 10)
    with pytest.raises(InvalidRequest):
        await store.read("t", 2, 0, 10)


# -- dedup -----------------------------------------------------------------------------------


async def test_dedup_within_window_returns_original(store: Store) -> None:
    await store.create_topic("t", 4)
    assert await store.append("t", [new(2, b"1", id="x")], T0, WINDOW) == [AppendResult(2, 0)]
    # Same id, other queue, later but within the window: the original qid/offset comes back.
    again = await store.append("t", [new(0, id="y"), new(3, b"2", id="x")], T0 + WINDOW - 1, WINDOW)
    assert again == [AppendResult(0, 0), AppendResult(2, 0, duplicate=True)]
    assert await next_offsets(store, "t") == [1, 0, 1, 0]


async def test_dedup_of_duplicate_ids_in_one_call(store: Store) -> None:
    await store.create_topic("t", 2)
    results = await store.append(
        "t", [new(0, id="a"), new(1, id="b"), new(1, id="a"), new(0), new(0)], T0, WINDOW
    )
    assert results == [
        AppendResult(0, 0),
        AppendResult(1, 0),
        AppendResult(0, 0, duplicate=True),
        AppendResult(0, 1),
        AppendResult(0, 2),  # messages without an id are never deduplicated
    ]
    assert await next_offsets(store, "t") == [3, 1]


async def test_dedup_ids_are_per_topic(store: Store) -> None:
    await store.create_topic("a", 1)
    await store.create_topic("b", 1)
    await store.append("a", [new(0), new(0, id="same")], T0, WINDOW)
    assert await store.append("b", [new(0, id="same")], T0, WINDOW) == [AppendResult(0, 0)]
    assert await store.append("a", [new(0, id="same")], T0, WINDOW) == [
        AppendResult(0, 1, duplicate=True)
    ]


async def test_dedup_expires_after_window(store: Store) -> None:
    await store.create_topic("t", 1)
    await store.append("t", [new(0, id="x")], T0, WINDOW)
    # At exactly the window the old entry no longer counts: the message is stored again...
    assert await store.append("t", [new(0, id="x")], T0 + WINDOW, WINDOW) == [AppendResult(0, 1)]
    # ...and later duplicates point at the new copy.
    assert await store.append("t", [new(0, id="x")], T0 + WINDOW + 1, WINDOW) == [
        AppendResult(0, 1, duplicate=True)
    ]


async def test_dedup_window_zero_disables_dedup(store: Store) -> None:
    await store.create_topic("t", 1)
    results = await store.append("t", [new(0, id="x"), new(0, id="x")], T0, 0)
    assert results == [AppendResult(0, 0), AppendResult(0, 1)]


# -- time ------------------------------------------------------------------------------------


async def test_produced_at_is_clamped_to_be_non_decreasing(store: Store) -> None:
    await store.create_topic("t", 2)
    await store.append("t", [new(0)], T0 + 1000, 0)
    await store.append("t", [new(0), new(1)], T0, 0)  # the clock went back
    await store.append("t", [new(0)], T0 + 2000, 0)
    assert [m.produced_at_ms for m in await store.read("t", 0, 0, 10)] == [
        T0 + 1000,
        T0 + 1000,
        T0 + 2000,
    ]
    # Clamping is per queue: queue 1 never saw the later time.
    assert [m.produced_at_ms for m in await store.read("t", 1, 0, 10)] == [T0]


async def test_offset_for_time(store: Store) -> None:
    await store.create_topic("t", 2)
    # Offsets 0-2 at T0+10, 3 at T0+20, 4-6 at T0+30 (the last one clamped up from T0+5).
    await store.append("t", [new(0)] * 3, T0 + 10, 0)
    await store.append("t", [new(0)], T0 + 20, 0)
    await store.append("t", [new(0)] * 2, T0 + 30, 0)
    await store.append("t", [new(0)], T0 + 5, 0)
    expected = {T0: 0, T0 + 10: 0, T0 + 11: 3, T0 + 20: 3, T0 + 21: 4, T0 + 30: 4, T0 + 31: 7}
    for timestamp, offset in expected.items():
        assert await store.offset_for_time("t", 0, timestamp) == offset, timestamp
    assert await store.offset_for_time("t", 1, T0) == 0
    with pytest.raises(TopicNotFound):
        await store.offset_for_time("nope", 0, T0)


async def test_offset_for_time_on_a_long_queue(store: Store) -> None:
    await store.create_topic("t", 1)
    for i in range(100):
        await store.append("t", [new(0), new(0)], T0 + 10 * i, 0)
    for i in range(100):
        assert await store.offset_for_time("t", 0, T0 + 10 * i) == 2 * i
        assert await store.offset_for_time("t", 0, T0 + 10 * i - 3) == 2 * i
    assert await store.offset_for_time("t", 0, T0 + 1000) == 200


# -- groups and progress ---------------------------------------------------------------------


async def test_group_config_save_load_replace(store: Store) -> None:
    assert await store.load_groups() == {}
    await store.save_group("billing", b'{"v":1}')
    await store.save_group("audit", b'{"a":1}')
    await store.save_group("billing", b'{"v":2}')
    assert await store.load_groups() == {"billing": b'{"v":2}', "audit": b'{"a":1}'}


async def test_progress_round_trip(store: Store) -> None:
    await store.create_topic("t", 2)
    await store.create_topic("u", 1)
    assert await store.load_progress("g") == {}
    await store.commit(
        "g", {("t", 0): QueueProgress(5, ((7, 9), (12, 13))), ("t", 1): QueueProgress(0)}
    )
    await store.commit("g", {("t", 1): QueueProgress(3), ("u", 0): QueueProgress(1, ((4, 6),))})
    await store.commit("other", {("t", 0): QueueProgress(99)})
    assert await store.load_progress("g") == {
        ("t", 0): QueueProgress(5, ((7, 9), (12, 13))),
        ("t", 1): QueueProgress(3),
        ("u", 0): QueueProgress(1, ((4, 6),)),
    }
    assert await store.load_progress("other") == {("t", 0): QueueProgress(99)}


async def test_progress_keeps_the_delivery_number_ceiling(store: Store) -> None:
    # Delivery numbers resume above it after a restart (docs/guarantees.md, fenced
    # deliveries): it must come back exactly as committed, and grow with later commits.
    await store.create_topic("t", 1)
    first = QueueProgress(2, read_to=4, open=((2, 3),), attempt_ceiling=1000)
    await store.commit("g", {("t", 0): first})
    assert await store.load_progress("g") == {("t", 0): first}
    later = QueueProgress(3, read_to=5, attempt_ceiling=2001)
    await store.commit("g", {("t", 0): later})
    assert (await store.load_progress("g"))[("t", 0)].attempt_ceiling == 2001


async def _dead_lettered(store: Store) -> list[Record]:
    """Two topics, inserted out of order; returns their messages."""
    await store.create_topic("b", 2)
    await store.create_topic("a", 1)
    await store.append("b", [new(1, b"b1"), new(0, b"b0"), new(0, b"b0'")], T0, 0)
    await store.append("a", [new(0, b"a0"), new(0, b"a0'")], T0, 0)
    return [m for t, q in (("b", 1), ("b", 0), ("a", 0)) for m in await store.read(t, q, 0, 10)]


async def test_dead_letters_are_listed_in_topic_qid_offset_order(store: Store) -> None:
    messages = await _dead_lettered(store)
    await store.commit("g", {}, [dead(m) for m in messages])
    listed = await store.list_dead_letters("g", None, 100)
    assert [m.message.ref for m in listed] == [
        ("a", 0, 0), ("a", 0, 1), ("b", 0, 0), ("b", 0, 1), ("b", 1, 0)
    ]  # fmt: skip
    assert listed[0] == dead(messages[3])  # the full message, attempts and error are kept
    assert [d.message.ref for d in await store.list_dead_letters("g", "b", 2)] == [
        ("b", 0, 0), ("b", 0, 1)
    ]  # fmt: skip
    assert await store.list_dead_letters("g", "missing", 10) == []
    assert await store.list_dead_letters("g", None, 0) == []
    assert await store.list_dead_letters("other", None, 10) == []
    assert await store.count_dead_letters("g") == 5


async def test_commit_upserts_a_dead_letter(store: Store) -> None:
    messages = await _dead_lettered(store)
    await store.commit("g", {}, [dead(messages[0], 3)])
    await store.commit("g", {}, [dead(messages[0], 8)])
    assert [d.attempts for d in await store.list_dead_letters("g", None, 10)] == [8]


async def test_redrive_lifecycle(store: Store) -> None:
    messages = await _dead_lettered(store)
    await store.commit("g", {}, [dead(m) for m in messages])
    started = await store.start_redrive("g", "b")
    assert [d.message.ref for d in started] == [("b", 0, 0), ("b", 0, 1), ("b", 1, 0)]
    assert all(d.redriving for d in started)
    assert await store.start_redrive("g", "b") == []  # already redriving
    assert [d.message.ref for d in await store.list_dead_letters("g", None, 10)] == [
        ("a", 0, 0), ("a", 0, 1)
    ]  # fmt: skip
    assert await store.count_dead_letters("g") == 2
    assert await store.load_redriving("g") == started
    # One redrive finished, one failed again and is dead-lettered anew in the same commit.
    again = dead(messages[0], 9)
    await store.commit("g", {}, [again], [("b", 1, 0), ("b", 0, 0)])
    assert [d.message.ref for d in await store.load_redriving("g")] == [("b", 0, 1)]
    assert [(d.message.ref, d.attempts) for d in await store.list_dead_letters("g", "b", 10)] == [
        (("b", 1, 0), 9)
    ]
    everything = await store.start_redrive("g", None)
    assert [d.message.ref for d in everything] == [("a", 0, 0), ("a", 0, 1), ("b", 1, 0)]


async def test_redrive_limited_to_queues(store: Store) -> None:
    """Cluster mode: a proxy redrives only the dead letters of the queues it owns."""
    messages = await _dead_lettered(store)
    await store.commit("g", {}, [dead(m) for m in messages])
    mine = await store.start_redrive("g", None, [("b", 0), ("a", 1)])
    assert [d.message.ref for d in mine] == [("b", 0, 0), ("b", 0, 1)]
    assert await store.start_redrive("g", "a", []) == []
    left = [d.message.ref for d in await store.list_dead_letters("g", None, 10)]
    assert left == [("a", 0, 0), ("a", 0, 1), ("b", 1, 0)]
    assert [d.message.ref for d in await store.load_redriving("g")] == [("b", 0, 0), ("b", 0, 1)]


async def test_redrive_of_named_dead_letters(store: Store) -> None:
    messages = await _dead_lettered(store)
    await store.commit("g", {}, [dead(m) for m in messages])
    named = [("b", 0, 1), ("a", 0, 0), ("a", 0, 9)]  # the last is no dead letter: ignored
    started = await store.start_redrive("g", None, refs=named)
    assert [d.message.ref for d in started] == [("a", 0, 0), ("b", 0, 1)]
    assert await store.start_redrive("g", "b", refs=[("a", 0, 1)]) == []  # other topic
    assert await store.start_redrive("g", None, [("b", 1)], refs=[("b", 0, 0)]) == []
    left = [d.message.ref for d in await store.list_dead_letters("g", None, 10)]
    assert left == [("a", 0, 1), ("b", 0, 0), ("b", 1, 0)]


async def test_delete_dead_letters_by_ref_topic_and_age(store: Store) -> None:
    messages = await _dead_lettered(store)
    old = [DeadLetter("g", m, 1, "x", T0 + i, False) for i, m in enumerate(messages)]
    await store.commit("g", {}, old)
    await store.commit("other", {}, [dead(messages[0])])
    await store.start_redrive("g", None, refs=[("b", 0, 1)])  # redriving: never deleted
    assert await store.delete_dead_letters("g", refs=[("b", 1, 0), ("b", 0, 1), ("x", 0, 0)]) == 1
    assert [d.message.ref for d in await store.list_dead_letters("g", None, 10)] == [
        ("a", 0, 0), ("a", 0, 1), ("b", 0, 0)
    ]  # fmt: skip
    # By age: dead-lettered before T0 + 4 (messages[3] is a0, at T0 + 3; a0' at T0 + 4).
    assert await store.delete_dead_letters("g", before_ms=T0 + 4) == 2
    assert [d.message.ref for d in await store.list_dead_letters("g", None, 10)] == [("a", 0, 1)]
    assert await store.delete_dead_letters("g", "b") == 0
    assert await store.delete_dead_letters("g", "missing") == 0
    assert await store.delete_dead_letters("g", "a") == 1
    assert await store.count_dead_letters("g") == 0
    assert [d.message.ref for d in await store.load_redriving("g")] == [("b", 0, 1)]
    assert await store.count_dead_letters("other") == 1  # other groups untouched


async def test_commit_is_all_or_nothing(store: Store) -> None:
    messages = await _dead_lettered(store)
    await store.commit("g", {("b", 0): QueueProgress(1)}, [dead(messages[0])])
    await store.start_redrive("g", None)
    ghost = dead(Record("gone", 0, 0, None, b"{}", None, None, T0))
    with pytest.raises(TopicNotFound):
        await store.commit(
            "g", {("b", 0): QueueProgress(2)}, [dead(messages[1]), ghost], [messages[0].ref]
        )
    assert await store.load_progress("g") == {("b", 0): QueueProgress(1)}
    assert await store.list_dead_letters("g", None, 10) == []
    assert [d.message.ref for d in await store.load_redriving("g")] == [messages[0].ref]


async def test_delete_group(store: Store) -> None:
    messages = await _dead_lettered(store)
    for group in ("g", "keep"):
        await store.save_group(group, b"{}")
        await store.commit(group, {("a", 0): QueueProgress(1)}, [dead(messages[0])])
    await store.start_redrive("g", "b")
    await store.delete_group("g")
    assert await store.load_groups() == {"keep": b"{}"}
    assert await store.load_progress("g") == {}
    assert await store.list_dead_letters("g", None, 10) == []
    assert await store.load_redriving("g") == []
    assert await store.load_progress("keep") == {("a", 0): QueueProgress(1)}
    assert await store.count_dead_letters("keep") == 1
    await store.delete_group("never-existed")


# -- outputs with progress (the ack with produce) ---------------------------------------------


async def test_commit_with_outputs_appends_and_writes_progress(store: Store) -> None:
    await store.create_topic("in", 1)
    await store.create_topic("out", 2)
    await store.create_topic("audit", 1)
    progress = {("in", 0): QueueProgress(3, read_to=5, open=((4, 5),))}
    results = await store.commit_with_outputs(
        "g",
        progress,
        [
            ("out", [new(1, b"1", key="k"), new(0, b"2", id="x")]),
            ("audit", [new(0, b"3")]),
            ("out", [new(1, b"4"), new(0, b"5", id="x")]),
        ],
        T0,
        WINDOW,
    )
    assert [[(r.qid, r.offset, r.duplicate) for r in rs] for rs in results] == [
        [(1, 0, False), (0, 0, False)],
        [(0, 0, False)],
        [(1, 1, False), (0, 0, True)],  # the same id again: a duplicate, as in one append
    ]
    assert await store.load_progress("g") == progress
    assert [m.body_json for m in await store.read("out", 1, 0, 10)] == [b"1", b"4"]
    assert [m.body_json for m in await store.read("out", 0, 0, 10)] == [b"2"]
    assert [m.body_json for m in await store.read("audit", 0, 0, 10)] == [b"3"]
    # Dedup reaches across calls, as for append.
    again = await store.commit_with_outputs(
        "g", progress, [("out", [new(1, b"other", id="x")])], T0 + 1, WINDOW
    )
    assert [(r.qid, r.offset, r.duplicate) for r in again[0]] == [(0, 0, True)]
    assert await next_offsets(store, "out") == [1, 2]


async def test_commit_with_outputs_without_outputs_writes_progress(store: Store) -> None:
    await store.create_topic("in", 1)
    assert await store.commit_with_outputs("g", {("in", 0): QueueProgress(2)}, [], T0, 0) == []
    assert await store.load_progress("g") == {("in", 0): QueueProgress(2)}


async def test_commit_with_outputs_finishes_redrives(store: Store) -> None:
    messages = await _dead_lettered(store)
    await store.create_topic("out", 1)
    await store.commit("g", {}, [dead(m) for m in messages[:2]])
    redriving = await store.start_redrive("g", "b")
    assert len(redriving) == 2
    done = redriving[0].message.ref
    await store.commit_with_outputs(
        "g", {("b", 1): QueueProgress(1)}, [("out", [new(0)])], T0, 0, [done]
    )
    assert [d.message.ref for d in await store.load_redriving("g")] == [redriving[1].message.ref]


@pytest.mark.parametrize("broken", ["output topic", "output qid", "progress topic"])
async def test_commit_with_outputs_is_all_or_nothing(store: Store, broken: str) -> None:
    await store.create_topic("in", 1)
    await store.create_topic("out", 1)
    await store.commit("g", {("in", 0): QueueProgress(1)})
    outputs: list[tuple[str, list[NewMessage]]] = [("out", [new(0, b"1")])]
    progress = {("in", 0): QueueProgress(2)}
    if broken == "output topic":
        outputs.append(("nope", [new(0)]))
    elif broken == "output qid":
        outputs.append(("out", [new(5)]))
    else:
        progress[("nope", 0)] = QueueProgress(1)
    with pytest.raises((TopicNotFound, InvalidRequest)):
        await store.commit_with_outputs("g", progress, outputs, T0, WINDOW)
    assert await store.load_progress("g") == {("in", 0): QueueProgress(1)}
    assert await next_offsets(store, "out") == [0]
    # Nothing of the failed call counts for dedup or offsets afterwards.
    results = await store.commit_with_outputs("g", {}, [("out", [new(0, b"2")])], T0, WINDOW)
    assert [(r.offset, r.duplicate) for r in results[0]] == [(0, False)]


# -- lifecycle -------------------------------------------------------------------------------


async def test_closed_store_raises_store_error(store: Store) -> None:
    await store.create_topic("t", 1)
    assert await store.ping()
    await store.close()
    await store.close()  # idempotent
    assert not await store.ping()
    with pytest.raises(StoreError):
        await store.append("t", [new(0)], T0, 0)
    with pytest.raises(StoreError):
        await store.read("t", 0, 0, 1)
    with pytest.raises(StoreError):
        await store.list_topics()
    with pytest.raises(StoreError):
        await store.load_groups()
    with pytest.raises(StoreError):
        await store.commit("g", {})
