"""The ``Store`` contract for retention, topic updates and topic deletes, on every store.

Small batch sizes are patched in (``small_batches``) so that a cut spans several delete
transactions and the byte counter several size queries, as on a large queue.
"""

from __future__ import annotations

import pytest

from cproxy.errors import InvalidRequest, TopicNotFound
from cproxy.model import DeadLetter, NewMessage, QueueProgress, QueueStats, TopicInfo
from cproxy.store import _pg_log, _retention, _sqlite_topics
from cproxy.store.base import Store

T0 = 1_700_000_000_000


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sqlite_topics, "DELETE_BATCH", 7)
    monkeypatch.setattr(_pg_log, "DELETE_BATCH", 7)
    monkeypatch.setattr(_retention, "SIZE_SCAN_BATCH", 5)


def new(qid: int, body: bytes = b"{}", *, key: str | None = None) -> NewMessage:
    return NewMessage(qid=qid, key=key, body_json=body)


async def produce_over_time(store: Store, topic: str, qid: int, count: int, start_ms: int) -> None:
    """``count`` messages on one queue, one per second from ``start_ms``."""
    for i in range(count):
        await store.append(topic, [new(qid, b'{"i":%d}' % i)], start_ms + i * 1000, 0)


async def offsets(store: Store, topic: str, qid: int, start: int = 0) -> list[int]:
    return [m.offset for m in await store.read(topic, qid, start, 10_000)]


# -- settings --------------------------------------------------------------------------------


async def test_retention_is_stored_with_the_topic_and_updated(store: Store) -> None:
    info, created = await store.create_topic("t", 2, retention_ms=60_000)
    assert created and info == TopicInfo("t", 2, 60_000, None)
    # Creating again keeps the stored retention (an update changes it).
    assert await store.create_topic("t", 2) == (TopicInfo("t", 2, 60_000, None), False)
    assert await store.update_topic("t", None, 1 << 20) == TopicInfo("t", 2, None, 1 << 20)
    await store.create_topic("plain", 1)
    assert await store.list_topics() == [TopicInfo("plain", 1), TopicInfo("t", 2, None, 1 << 20)]


@pytest.mark.parametrize("bad", [0, -5, True, 1.5, "10"])
async def test_retention_bounds_must_be_positive_integers(store: Store, bad: object) -> None:
    with pytest.raises(InvalidRequest):
        await store.create_topic("t", 1, retention_ms=bad)  # type: ignore[arg-type]
    assert await store.list_topics() == []
    await store.create_topic("t", 1)
    with pytest.raises(InvalidRequest):
        await store.update_topic("t", None, bad)  # type: ignore[arg-type]
    assert await store.list_topics() == [TopicInfo("t", 1)]


async def test_update_and_delete_of_an_unknown_topic_raise(store: Store) -> None:
    with pytest.raises(TopicNotFound):
        await store.update_topic("nope", 1000, None)
    with pytest.raises(TopicNotFound):
        await store.delete_topic("nope")
    with pytest.raises(TopicNotFound):
        await store.apply_retention("nope", T0)


# -- retention by time -----------------------------------------------------------------------


async def test_retention_ms_deletes_old_messages_and_moves_min_offset(store: Store) -> None:
    await store.create_topic("t", 2, retention_ms=10_000)
    await produce_over_time(store, "t", 0, 30, T0)  # produced at T0 .. T0 + 29 s
    await store.append("t", [new(1)], T0 + 29_000, 0)
    # At T0 + 29.5 s, everything produced before T0 + 19.5 s is past retention: offsets 0..19.
    now = T0 + 29_500
    assert await store.apply_retention("t", now) == {0: 20}
    assert await store.queue_stats("t") == [QueueStats(0, 20, 30), QueueStats(1, 0, 1)]
    # A read from below min_offset starts at min_offset, never an error.
    assert await offsets(store, "t", 0) == list(range(20, 30))
    assert await offsets(store, "t", 0, start=5) == list(range(20, 30))
    # Nothing more to do until time passes.
    assert await store.apply_retention("t", now) == {}
    # Seek by time stays right: older than anything kept gives min_offset.
    assert await store.offset_for_time("t", 0, T0) == 20
    assert await store.offset_for_time("t", 0, T0 + 25_000) == 25
    assert await store.offset_for_time("t", 0, T0 + 99_000) == 30
    # Appends continue the offsets.
    results = await store.append("t", [new(0)], now, 0)
    assert results[0].offset == 30


async def test_an_emptied_queue_keeps_its_next_offset(store: Store) -> None:
    await store.create_topic("t", 1, retention_ms=1000)
    await produce_over_time(store, "t", 0, 10, T0)
    assert await store.apply_retention("t", T0 + 60_000) == {0: 10}
    assert await store.queue_stats("t") == [QueueStats(0, 10, 10)]
    assert await store.read("t", 0, 0, 100) == []
    assert await store.offset_for_time("t", 0, T0) == 10
    assert (await store.append("t", [new(0)], T0 + 60_000, 0))[0].offset == 10
    assert await offsets(store, "t", 0) == [10]


async def test_no_retention_keeps_everything(store: Store) -> None:
    await store.create_topic("t", 1)
    await produce_over_time(store, "t", 0, 5, T0)
    assert await store.apply_retention("t", T0 + 10**9) == {}
    assert await offsets(store, "t", 0) == [0, 1, 2, 3, 4]


# -- retention by size -----------------------------------------------------------------------


async def test_retention_bytes_keeps_the_newest_messages_within_the_bound(store: Store) -> None:
    # Each message weighs body (10 bytes) + key (2 bytes) = 12 bytes.
    await store.create_topic("t", 2, retention_bytes=50)
    for i in range(20):
        await store.append("t", [new(0, b'"%08d"' % i, key="k0")], T0 + i, 0)
    await store.append("t", [new(1, b'"%08d"' % 0, key="k1")], T0, 0)
    # 50 bytes hold 4 messages of 12: offsets 16..19 stay.
    assert await store.apply_retention("t", T0 + 100) == {0: 16}
    assert await store.queue_stats("t") == [QueueStats(0, 16, 20), QueueStats(1, 0, 1)]
    assert await offsets(store, "t", 0) == [16, 17, 18, 19]
    # The running total follows new messages and the cut.
    for i in range(20, 23):
        await store.append("t", [new(0, b'"%08d"' % i, key="k0")], T0 + i, 0)
    assert await store.apply_retention("t", T0 + 100) == {0: 19}
    assert await offsets(store, "t", 0) == [19, 20, 21, 22]
    # A larger bound keeps what is there; a smaller one cuts again.
    await store.update_topic("t", None, 1000)
    assert await store.apply_retention("t", T0 + 100) == {}
    await store.update_topic("t", None, 12)
    assert await store.apply_retention("t", T0 + 100) == {0: 22}


async def test_both_bounds_cut_at_the_higher_offset(store: Store) -> None:
    await store.create_topic("t", 1, retention_ms=5_000, retention_bytes=10 * 8)
    # Bodies of 8 bytes, one per second: the size bound keeps 10, the time bound 5.
    for i in range(20):
        await store.append("t", [new(0, b'"%06d"' % i)], T0 + i * 1000, 0)
    assert await store.apply_retention("t", T0 + 19_500) == {0: 15}
    await store.update_topic("t", 60_000, 3 * 8)
    assert await store.apply_retention("t", T0 + 19_500) == {0: 17}


# -- delete ----------------------------------------------------------------------------------


async def test_delete_topic_removes_it_and_what_was_kept_of_it(store: Store) -> None:
    await store.create_topic("gone", 2)
    await store.create_topic("kept", 1)
    await produce_over_time(store, "gone", 1, 20, T0)
    await store.append("gone", [NewMessage(None, b"{}", None, "dup", qid=0)], T0, 60_000)
    await store.append("kept", [new(0)], T0, 0)
    message = (await store.read("gone", 1, 3, 1))[0]
    kept_message = (await store.read("kept", 0, 0, 1))[0]
    await store.commit(
        "g",
        {("gone", 1): QueueProgress(4), ("kept", 0): QueueProgress(1)},
        [
            DeadLetter("g", message, 3, "boom", T0, False),
            DeadLetter("g", kept_message, 3, "boom", T0, False),
        ],
    )
    await store.delete_topic("gone")
    assert await store.list_topics() == [TopicInfo("kept", 1)]
    for call in (store.queue_stats("gone"), store.read("gone", 0, 0, 10)):
        with pytest.raises(TopicNotFound):
            await call
    with pytest.raises(TopicNotFound):
        await store.append("gone", [new(0)], T0, 0)
    # The group keeps what it has of other topics, and nothing of the deleted one.
    assert await store.load_progress("g") == {("kept", 0): QueueProgress(1)}
    assert [d.message.topic for d in await store.list_dead_letters("g", None, 10)] == ["kept"]
    # The name can be used again: a new topic, from offset 0, without the old dedup entries.
    assert await store.create_topic("gone", 1) == (TopicInfo("gone", 1), True)
    assert await store.read("gone", 0, 0, 10) == []
    again = await store.append("gone", [NewMessage(None, b"{}", None, "dup", qid=0)], T0, 60_000)
    assert (again[0].offset, again[0].duplicate) == (0, False)
    assert await offsets(store, "kept", 0) == [0]
