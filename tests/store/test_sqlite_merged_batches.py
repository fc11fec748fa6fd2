"""The SQLite writer's fast path: appends of one group transaction merge their record batches
into one row per queue, a lone leader gathers the writes that arrive within a few loop turns,
and a failure inside a merged batch is redone write by write, so it still fails alone.

Like ``test_sqlite_group_commit``, most tests hold the writer (``writer_held``) so that the
writes started meanwhile run as ONE batch; the rows are counted with a second connection.
"""

from __future__ import annotations

import functools
import random
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from cproxy.errors import StoreError, TopicConflict
from cproxy.model import AppendResult, NewMessage, QueueProgress
from cproxy.store import _sqlite_writer, sqlite
from cproxy.store.sqlite import SqliteStore
from tests.store.sqlite_faults import refuse_rows_with
from tests.store.test_sqlite_group_commit import (
    T0,
    WINDOW,
    msgs,
    raw,
    transactions,
    wait_for,
    writer,
)
from tests.store.test_sqlite_group_commit import writer_held as held


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path, threads=True)  # ``writer_held`` holds the writer thread
    await s.open()
    await s.create_topic("t", 2)
    yield s
    await s.close()


def rows(store: SqliteStore, qid: int) -> list[tuple[int, int]]:
    """(base, next_off) of the stored rows of queue ``qid`` of topic "t"."""
    conn = raw(store.path)
    try:
        return conn.execute(
            "SELECT base, next_off FROM batches WHERE qid = ? ORDER BY base", (qid,)
        ).fetchall()
    finally:
        conn.close()


async def bodies(store: SqliteStore, qid: int) -> list[bytes]:
    return [m.body_json for m in await store.read("t", qid, 0, 100)]


async def test_appends_of_one_transaction_write_one_row_per_queue(store: SqliteStore) -> None:
    async with held(store) as calls:
        for i in range(4):
            batch = [*msgs(0, f"{i}a", f"{i}b"), *msgs(1, f"{i}c")]
            calls.start(f"{i}", functools.partial(store.append, "t", batch, T0 + i, 0))
            await wait_for(functools.partial(lambda n: len(writer(store)._queue) == n, i + 1))
    for i in range(4):
        assert calls.outcomes[f"{i}"] == [
            AppendResult(0, 2 * i),
            AppendResult(0, 2 * i + 1),
            AppendResult(1, i),
        ]
    assert rows(store, 0) == [(0, 8)] and rows(store, 1) == [(0, 4)]
    assert await bodies(store, 0) == [f"{i}{x}".encode() for i in range(4) for x in "ab"]
    assert await bodies(store, 1) == [f"{i}c".encode() for i in range(4)]
    # Each message keeps the produced_at of its own call.
    assert [m.produced_at_ms for m in await store.read("t", 1, 0, 10)] == [
        T0,
        T0 + 1,
        T0 + 2,
        T0 + 3,
    ]


async def test_a_merged_row_stops_growing_at_merge_max(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite, "MERGE_MAX", 5)
    async with held(store) as calls:
        for i in range(4):
            calls.start(f"{i}", functools.partial(store.append, "t", msgs(0, *"xy"), T0, 0))
            await wait_for(functools.partial(lambda n: len(writer(store)._queue) == n, i + 1))
        # One call larger than the limit is still one row of its own.
        calls.start("big", functools.partial(store.append, "t", msgs(0, *"abcdefg"), T0, 0))
    assert rows(store, 0) == [(0, 4), (4, 8), (8, 15)]
    assert len(await store.read("t", 0, 0, 100)) == 15


def count_rows(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM batches").fetchone()[0])


async def test_a_write_after_appends_sees_their_rows(store: SqliteStore) -> None:
    async with held(store) as calls:
        calls.start("a", lambda: store.append("t", msgs(0, "a"), T0, 0))
        calls.start("b", lambda: store.append("t", msgs(0, "b"), T0, 0))
        calls.start("count", lambda: store._db.write(count_rows))
        calls.start("c", lambda: store.append("t", msgs(0, "c"), T0, 0))
    assert calls.outcomes["count"] == 1  # "a" and "b" merged, inserted before it ran
    assert rows(store, 0) == [(0, 2), (2, 3)]
    assert await bodies(store, 0) == [b"a", b"b", b"c"]


async def test_a_failed_write_among_merged_appends_fails_alone(store: SqliteStore) -> None:
    before = transactions(store)
    async with held(store) as calls:
        calls.start("a", lambda: store.append("t", msgs(0, "a"), T0, WINDOW))
        calls.start("conflict", lambda: store.create_topic("t", 3))
        calls.start("b", lambda: store.append("t", msgs(0, "b", ids=("id-b",)), T0, WINDOW))
        calls.start("c", lambda: store.append("t", msgs(1, "c"), T0, WINDOW))
    assert transactions(store) - before == 2  # the held write, then one batch
    assert isinstance(calls.outcomes["conflict"], TopicConflict)
    assert calls.outcomes["a"] == [AppendResult(0, 0)]
    assert calls.outcomes["b"] == [AppendResult(0, 1)]
    assert calls.outcomes["c"] == [AppendResult(1, 0)]
    assert await bodies(store, 0) == [b"a", b"b"] and await bodies(store, 1) == [b"c"]
    again = await store.append("t", msgs(1, "b2", ids=("id-b",)), T0 + 1, WINDOW)
    assert again == [AppendResult(0, 1, duplicate=True)]


async def test_a_row_refused_at_the_merged_insert_fails_only_its_append(
    store: SqliteStore,
) -> None:
    refuse_rows_with(store.path)
    async with held(store) as calls:
        calls.start("a", lambda: store.append("t", msgs(0, "a"), T0, 0))
        calls.start("bad", lambda: store.append("t", [*msgs(1, "x"), *msgs(0, "!")], T0, 0))
        calls.start("c", lambda: store.append("t", msgs(0, "c"), T0, 0))
    assert isinstance(calls.outcomes["bad"], StoreError)
    assert calls.outcomes["a"] == [AppendResult(0, 0)]
    assert calls.outcomes["c"] == [AppendResult(0, 1)]
    assert await bodies(store, 0) == [b"a", b"c"] and await bodies(store, 1) == []


async def test_a_lone_leader_gathers_writes_arriving_within_a_few_loop_turns(
    store: SqliteStore,
) -> None:
    before = transactions(store)

    async def append_after(turns: int, body: str) -> list[AppendResult]:
        for _ in range(turns):
            await anyio.lowlevel.checkpoint()
        return await store.append("t", msgs(0, body), T0, 0)

    results: dict[int, list[AppendResult]] = {}

    async def run(turns: int) -> None:
        results[turns] = await append_after(turns, str(turns))

    async with anyio.create_task_group() as tg:
        # One write more every loop turn: the leader keeps waiting while they keep coming.
        for turns in range(5):
            tg.start_soon(run, turns)
    assert transactions(store) - before == 1
    assert sorted(r[0].offset for r in results.values()) == list(range(5))


async def test_a_lone_leader_stops_gathering_after_the_last_turn(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sqlite_writer, "GATHER_TURNS", (2, 3))
    before = transactions(store)

    async def late() -> None:
        for _ in range(20):
            await anyio.lowlevel.checkpoint()
        await store.append("t", msgs(0, "late"), T0, 0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(store.append, "t", msgs(0, "first"), T0, 0)
        tg.start_soon(late)
    assert transactions(store) - before == 2
    assert await bodies(store, 0) == [b"first", b"late"]


async def test_a_progress_commit_between_appends_keeps_their_row_whole(store: SqliteStore) -> None:
    async with held(store) as calls:
        calls.start("a", lambda: store.append("t", msgs(0, "a"), T0, 0))
        await wait_for(lambda: len(writer(store)._queue) == 1)
        calls.start("commit", lambda: store.commit("g", {("t", 0): QueueProgress(1)}))
        await wait_for(lambda: len(writer(store)._queue) == 2)
        calls.start("b", lambda: store.append("t", msgs(0, "b"), T0, 0))
    assert rows(store, 0) == [(0, 2)]
    assert await store.load_progress("g") == {("t", 0): QueueProgress(1)}


@pytest.mark.parametrize("seed", range(6))
async def test_random_batches_with_refused_rows_store_exactly_the_calls_that_succeed(
    store: SqliteStore, seed: int
) -> None:
    """Batches of appends (some refused by SQLite), progress commits and plain writes, in a
    random mix: every append that succeeds is stored whole, in call order, and no other."""
    refuse_rows_with(store.path)
    rng = random.Random(seed)
    expected: dict[int, list[bytes]] = {0: [], 1: []}
    for round_ in range(4):
        plan: list[tuple[str, list[NewMessage]]] = []
        for i in range(rng.randint(2, 7)):
            kind = rng.choice(["append", "append", "append", "commit", "count"])
            batch = [
                *msgs(0, *(f"{round_}.{i}.{j}" for j in range(rng.randint(0, 3)))),
                *msgs(1, *(f"{round_}.{i}.q1" for _ in range(rng.randint(0, 1)))),
            ]
            if kind == "append" and (not batch or rng.random() < 0.3):
                batch.insert(rng.randrange(len(batch) + 1), *msgs(rng.randint(0, 1), "!"))
            plan.append((kind, batch))
        async with held(store) as calls:
            for i, (kind, batch) in enumerate(plan):
                if kind == "append":
                    call = functools.partial(store.append, "t", batch, T0, 0)
                elif kind == "commit":
                    call = functools.partial(store.commit, "g", {("t", 0): QueueProgress(i)})
                else:  # a write that is not mergeable: the rows before it are inserted first
                    call = functools.partial(store._db.write, count_rows)
                calls.start(f"{i}", call)
                # One write queued per call, in this order.
                await wait_for(functools.partial(lambda n: len(writer(store)._queue) == n, i + 1))
        for i, (kind, batch) in enumerate(plan):
            outcome = calls.outcomes[f"{i}"]
            if kind != "append":
                continue
            if any(m.body_json == b"!" for m in batch):
                assert isinstance(outcome, StoreError), (seed, round_, i)
                continue
            assert not isinstance(outcome, Exception), (seed, round_, i, outcome)
            for m, r in zip(batch, outcome, strict=True):
                assert r.qid == m.qid and r.offset == len(expected[r.qid])
                expected[r.qid].append(m.body_json)
    for qid in (0, 1):
        assert await bodies(store, qid) == expected[qid]
        assert [s.next_offset for s in await store.queue_stats("t")][qid] == len(expected[qid])
