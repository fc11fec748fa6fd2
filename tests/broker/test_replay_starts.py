"""Where a replay begins per queue, and what retention already took from the range asked for
(``Topics.replay_starts``, memory store)."""

from __future__ import annotations

import pytest

from cproxy.broker.topics import Topics
from cproxy.errors import InvalidRequest
from cproxy.model import NewMessage
from cproxy.store.memory import MemoryStore

T0 = 1_700_000_000_000


async def test_starts_and_messages_lost_to_retention() -> None:
    store = MemoryStore()
    await store.open()
    await store.create_topic("t", 2, retention_ms=1000)
    old = [NewMessage("k", b"1", qid=0) for _ in range(4)]
    await store.append("t", old, T0, 0)
    new = [NewMessage("k", b"2", qid=0) for _ in range(3)]
    await store.append("t", new, T0 + 5000, 0)
    await store.apply_retention("t", T0 + 5500)  # the 4 old messages of queue 0 are gone
    topics = Topics(store)
    await topics.load()
    assert await topics.replay_starts("t", [0, 1], "earliest") == {0: (4, 4), 1: (0, 0)}
    assert await topics.replay_starts("t", [0], 2) == {0: (4, 2)}
    assert await topics.replay_starts("t", [0], 5) == {0: (5, 0)}
    assert await topics.replay_starts("t", [0], 99) == {0: (7, 0)}  # clamped to the end
    # A time before the oldest kept message: what retention deleted may be newer than it.
    assert await topics.replay_starts("t", [0], {"timestamp_ms": T0 + 100}) == {0: (4, 4)}
    assert await topics.replay_starts("t", [0], {"timestamp_ms": T0 + 5000}) == {0: (4, 0)}
    with pytest.raises(InvalidRequest):
        await topics.replay_starts("t", [0], "latest")
    await store.close()
