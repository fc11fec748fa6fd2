"""Group commit in the SQLite store: writes queued while the writer is busy share a transaction.

Most tests hold the writer thread busy (``writer_held``) so that the writes started meanwhile
queue up and then run as ONE batch: that makes "these writes shared a transaction"
deterministic instead of a matter of timing. ``Writer.transactions`` counts transactions.
"""

from __future__ import annotations

import functools
import json
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from cproxy.errors import StoreError, TopicConflict
from cproxy.model import AppendResult, NewMessage, QueueProgress
from cproxy.store import _sqlite_writer
from cproxy.store._sqlite_writer import Writer
from cproxy.store.sqlite import SqliteStore
from tests.store.sqlite_faults import on_body_written, refuse_rows_with

T0 = 1_700_000_000_000
WINDOW = 60_000


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    # Worker threads: ``writer_held`` holds the writer thread to make writes queue up.
    s = SqliteStore(tmp_path, threads=True)
    await s.open()
    await s.create_topic("t", 2)
    yield s
    await s.close()


def writer(store: SqliteStore) -> Writer:
    return store._db._writer  # white box: the queue


def transactions(store: SqliteStore) -> int:
    return store._db._tx.transactions  # white box: transactions run so far


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def msgs(qid: int, *bodies: str, ids: tuple[str | None, ...] = ()) -> list[NewMessage]:
    ids = ids or (None,) * len(bodies)
    return [
        NewMessage(None, b.encode(), None, i, qid=qid) for b, i in zip(bodies, ids, strict=True)
    ]


class Calls:
    """Starts store calls as tasks and keeps each one's outcome: its result or its exception."""

    def __init__(self, tg: anyio.abc.TaskGroup) -> None:
        self._tg = tg
        self.started: list[str] = []
        self.outcomes: dict[str, Any] = {}

    def start(self, name: str, call: Callable[[], Awaitable[Any]]) -> None:
        self.started.append(name)

        async def run() -> None:
            try:
                self.outcomes[name] = await call()
            except Exception as exc:
                self.outcomes[name] = exc

        self._tg.start_soon(run)


async def wait_for(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(5):
        while not condition():
            await anyio.sleep(0.001)


@asynccontextmanager
async def writer_held(store: SqliteStore) -> AsyncIterator[Calls]:
    """Block the writer thread; calls started in the block queue up and, once the block is
    left, run as one batch (they are all queued by then). Yields a ``Calls`` to start them."""
    started, release = threading.Event(), threading.Event()

    def block(conn: sqlite3.Connection) -> None:
        started.set()
        release.wait(10)

    w = writer(store)
    async with anyio.create_task_group() as tg:
        calls = Calls(tg)
        tg.start_soon(store._db.write, block)
        await wait_for(started.is_set)
        queued = len(w._queue)
        try:
            yield calls
            # Every call started here queues exactly one write before it waits.
            await wait_for(lambda: len(w._queue) >= queued + len(calls.started))
        finally:
            release.set()


async def test_concurrent_appends_get_contiguous_offsets_that_match_reads(
    store: SqliteStore,
) -> None:
    sent: dict[tuple[int, int], bytes] = {}
    per_task: dict[int, list[list[AppendResult]]] = {}

    async def producer(task: int) -> None:
        for call in range(15):
            batch = [
                NewMessage(f"k{task}", b'"%d-%d-%d"' % (task, call, i), qid=(task + call + i) % 2)
                for i in range(1 + (task * 7 + call) % 9)
            ]
            results = await store.append("t", batch, T0 + call, 0)
            per_task.setdefault(task, []).append(results)
            for m, r in zip(batch, results, strict=True):
                assert r.qid == m.qid and not r.duplicate
                assert (r.qid, r.offset) not in sent
                sent[r.qid, r.offset] = m.body_json
            await anyio.lowlevel.checkpoint()

    before = transactions(store)
    async with anyio.create_task_group() as tg:
        for task in range(20):
            tg.start_soon(producer, task)
    assert transactions(store) - before < 20 * 15  # calls really were folded together
    nexts = [s.next_offset for s in await store.queue_stats("t")]
    for qid in (0, 1):
        stored = await store.read("t", qid, 0, 10_000)
        # No gap, no duplicate, and every result names the message that was sent with it.
        assert [m.offset for m in stored] == list(range(nexts[qid]))
        assert {m.offset: m.body_json for m in stored} == {
            off: body for (q, off), body in sent.items() if q == qid
        }
        assert [m.produced_at_ms for m in stored] == sorted(m.produced_at_ms for m in stored)
    for results in per_task.values():
        # One caller's successive calls land in call order (FIFO) on each queue.
        for qid in (0, 1):
            offs = [r.offset for rs in results for r in rs if r.qid == qid]
            assert offs == sorted(offs)


async def test_a_failing_append_fails_alone_and_its_batch_commits(store: SqliteStore) -> None:
    await store.append("t", msgs(0, "0"), T0, WINDOW)
    # SQLite itself refuses one row, after earlier rows of the same call were inserted.
    refuse_rows_with(store.path)
    before = transactions(store)
    async with writer_held(store) as calls:
        calls.start("a", lambda: store.append("t", msgs(0, "1", ids=("id-a",)), T0, WINDOW))
        # Later in time, a new id, two queues: none of it may survive the failure.
        bad = [*msgs(1, "2", ids=("id-b",)), *msgs(0, "3"), *msgs(0, "!")]
        calls.start("b", lambda: store.append("t", bad, T0 + 5000, WINDOW))
        calls.start("c", lambda: store.append("t", msgs(0, "4", "5"), T0 + 1, WINDOW))
        calls.start("d", lambda: store.append("t", msgs(1, "6", ids=("id-a",)), T0, WINDOW))
        calls.start("topic", lambda: store.create_topic("t", 3))
    out = calls.outcomes
    assert transactions(store) - before == 2  # the held write, then one batch
    assert isinstance(out["b"], StoreError) and "injected failure" in str(out["b"])
    assert isinstance(out["b"].__cause__, sqlite3.Error)
    assert isinstance(out["topic"], TopicConflict)
    # The others continue from each other's offsets as if "b" had never been there.
    assert out["a"] == [AppendResult(0, 1)]
    assert out["c"] == [AppendResult(0, 2), AppendResult(0, 3)]
    assert out["d"] == [AppendResult(0, 1, duplicate=True)]
    assert [s.next_offset for s in await store.queue_stats("t")] == [4, 0]
    stored = await store.read("t", 0, 0, 10)
    assert [m.body_json for m in stored] == [b"0", b"1", b"4", b"5"]
    # produced_at was not pushed forward by the failed append either.
    assert [m.produced_at_ms for m in stored] == [T0, T0, T0 + 1, T0 + 1]
    again = await store.append("t", msgs(1, "7", ids=("id-b",)), T0 + 2, WINDOW)
    assert again == [AppendResult(1, 0)]  # its id was never recorded


async def test_a_failed_commit_fails_the_whole_batch_and_keeps_caches(
    store: SqliteStore,
) -> None:
    await store.append("t", msgs(0, "0"), T0, WINDOW)
    await store.commit("g", {("t", 0): QueueProgress(1)})
    conn = raw(store.path)
    try:
        # A deferred foreign key is checked at COMMIT: every write of the batch succeeds on
        # its own, then the shared COMMIT fails.
        conn.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        conn.execute(
            "CREATE TABLE child (pid INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)"
        )
        conn.execute(on_body_written("late_boom", "AFTER", b"!", "INSERT INTO child VALUES (42)"))
    finally:
        conn.close()
    tx = store._db._tx
    assert tx.conn is not None
    tx.conn.execute("PRAGMA foreign_keys = ON")
    async with writer_held(store) as calls:
        calls.start("a", lambda: store.append("t", msgs(0, "1", ids=("id-a",)), T0 + 9, WINDOW))
        calls.start("bad", lambda: store.append("t", msgs(1, "!"), T0 + 9, WINDOW))
        calls.start("progress", lambda: store.commit("g", {("t", 0): QueueProgress(2)}))
        calls.start("topic", lambda: store.create_topic("u", 1))
    for name in ("a", "bad", "progress", "topic"):
        assert isinstance(calls.outcomes[name], StoreError), name
        assert "FOREIGN KEY" in str(calls.outcomes[name])
    # Nothing was published: offsets, produced_at, topics, progress, dedup ids.
    assert [s.next_offset for s in await store.queue_stats("t")] == [1, 0]
    assert await store.offset_for_time("t", 0, T0 + 1) == 1
    assert [t.name for t in await store.list_topics()] == ["t"]
    assert await store.load_progress("g") == {("t", 0): QueueProgress(1)}
    results = await store.append("t", [*msgs(0, "2", ids=("id-a",)), *msgs(1, "3")], T0, WINDOW)
    assert results == [AppendResult(0, 1), AppendResult(1, 0)]
    assert [m.produced_at_ms for m in await store.read("t", 0, 0, 10)] == [T0, T0]


async def test_dedup_sees_ids_of_earlier_appends_in_the_same_batch(store: SqliteStore) -> None:
    async with writer_held(store) as calls:
        for i in range(3):
            batch = msgs(i % 2, f"{i}", "x", ids=("same", f"own-{i}"))
            calls.start(f"call-{i}", functools.partial(store.append, "t", batch, T0 + i, WINDOW))
    out = calls.outcomes
    assert out["call-0"] == [AppendResult(0, 0), AppendResult(0, 1)]
    assert out["call-1"] == [AppendResult(0, 0, duplicate=True), AppendResult(1, 0)]
    assert out["call-2"] == [AppendResult(0, 0, duplicate=True), AppendResult(0, 2)]
    assert out["call-2"][0].produced_at_ms == T0  # the original's
    assert [s.next_offset for s in await store.queue_stats("t")] == [3, 1]
    later = await store.append("t", msgs(1, "y", ids=("own-1",)), T0 + 10, WINDOW)
    assert later == [AppendResult(1, 0, duplicate=True)]


async def test_one_topic_created_twice_in_one_batch(store: SqliteStore) -> None:
    async with writer_held(store) as calls:
        calls.start("first", lambda: store.create_topic("new", 2))
        calls.start("second", lambda: store.create_topic("new", 2))
        calls.start("other", lambda: store.create_topic("new", 5))
    assert calls.outcomes["first"][1] is True
    assert calls.outcomes["second"][1] is False
    assert isinstance(calls.outcomes["other"], TopicConflict)
    assert await store.append("new", msgs(1, "a"), T0, 0) == [AppendResult(1, 0)]


async def test_callers_of_one_batch_are_answered_in_offset_order(store: SqliteStore) -> None:
    # The broker hands just-stored messages to caught-up groups as each produce returns; that
    # fast path only takes them in offset order, so answers must go out in that order too.
    answered: list[int] = []

    async def append(body: str) -> None:
        answered.extend(r.offset for r in await store.append("t", msgs(0, body), T0, 0))

    async with writer_held(store) as calls:
        for i in range(6):
            calls.start(f"{i}", functools.partial(append, f"{i}"))
            await wait_for(functools.partial(lambda n: len(writer(store)._queue) == n, i + 1))
    assert answered == list(range(6))


async def test_progress_commits_and_appends_share_a_transaction(store: SqliteStore) -> None:
    before = transactions(store)
    async with writer_held(store) as calls:
        calls.start("a", lambda: store.append("t", msgs(0, "a"), T0, 0))
        calls.start("c", lambda: store.commit("g", {("t", 0): QueueProgress(1, ((2, 3),))}))
        calls.start("b", lambda: store.append("t", msgs(0, "b"), T0, 0))
        calls.start("save", lambda: store.save_group("g", b"{}"))
    assert transactions(store) - before == 2
    assert calls.outcomes["a"] == [AppendResult(0, 0)]
    assert calls.outcomes["b"] == [AppendResult(0, 1)]
    assert await store.load_progress("g") == {("t", 0): QueueProgress(1, ((2, 3),))}
    assert await store.load_groups() == {"g": b"{}"}


async def test_batches_are_capped_and_run_in_arrival_order(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sqlite_writer, "MAX_BATCH_WEIGHT", 10)
    before = transactions(store)
    async with writer_held(store) as calls:
        for i in range(5):
            calls.start(f"{i}", functools.partial(store.append, "t", msgs(0, *"abcd"), T0, 0))
            await wait_for(functools.partial(lambda n: len(writer(store)._queue) == n, i + 1))
    # 4 + 4 messages fit under the cap of 10, a third append does not: 3 transactions.
    assert transactions(store) - before == 1 + 3
    for i in range(5):
        assert [r.offset for r in calls.outcomes[f"{i}"]] == list(range(4 * i, 4 * i + 4))


async def test_a_cancelled_queued_append_is_not_stored(store: SqliteStore) -> None:
    async with writer_held(store) as calls:
        calls.start("a", lambda: store.append("t", msgs(0, "a"), T0, 0))
        with anyio.CancelScope() as scope:
            scope.cancel()
            await store.append("t", msgs(0, "cancelled"), T0, 0)
        calls.start("b", lambda: store.append("t", msgs(0, "b"), T0, 0))
    assert calls.outcomes == {"a": [AppendResult(0, 0)], "b": [AppendResult(0, 1)]}
    assert [m.body_json for m in await store.read("t", 0, 0, 10)] == [b"a", b"b"]


async def test_cancelling_callers_never_strands_the_queue(store: SqliteStore) -> None:
    """Leaders and followers cancelled at every stage: the others still all get answers."""
    done: list[AppendResult] = []

    async def caller(i: int) -> None:
        with anyio.move_on_after(0.0003 * (i % 7)):
            done.extend(await store.append("t", msgs(i % 2, f"{i}"), T0, 0))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for i in range(300):
                tg.start_soon(caller, i)
                if i % 10 == 0:
                    await anyio.sleep(0.0005)
        # The queue is idle again: a plain write goes through at once.
        final = await store.append("t", msgs(0, "last"), T0, 0)
    assert not writer(store)._queue and not writer(store)._leading
    stored = [m for q in (0, 1) for m in await store.read("t", q, 0, 1000)]
    # Everything that was answered is stored; a cancelled call may be stored or not, but never
    # leaves a gap.
    assert {(r.qid, r.offset) for r in [*done, *final]} <= {(m.qid, m.offset) for m in stored}
    for q in (0, 1):
        offs = [m.offset for m in stored if m.qid == q]
        assert offs == list(range(len(offs)))


async def test_old_path_without_group_commit(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path, group_commit=False)
    await s.open()
    try:
        await s.create_topic("t", 1)
        before = transactions(s)
        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(s.append, "t", msgs(0, f"{i}"), T0, 0)
        assert transactions(s) - before == 10
        assert [m.offset for m in await s.read("t", 0, 0, 100)] == list(range(10))
    finally:
        await s.close()


# -- durability --------------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import asyncio, json, os, random, signal, sys, threading, time
    from pathlib import Path
    from cproxy.model import NewMessage
    from cproxy.store.sqlite import SqliteStore

    def kill(delay: float) -> None:
        time.sleep(delay)
        os.kill(os.getpid(), signal.SIGKILL)

    async def main() -> None:
        store = SqliteStore(Path(sys.argv[1]))
        await store.open()
        await store.create_topic("t", 3)
        answered = 0

        async def producer(task: int) -> None:
            nonlocal answered
            for call in range(200):
                batch = [NewMessage(None, b'"%d-%d-%d"' % (task, call, i), None,
                                    f"id-{task}-{call}-{i}", qid=(task + i) % 3)
                         for i in range(1 + call % 5)]
                results = await store.append("t", batch, 1_700_000_000_000, 60_000)
                # Answered: from here on the caller may rely on it (a 200 would go out now).
                for m, r in zip(batch, results):
                    print(json.dumps([r.qid, r.offset, m.body_json.decode()]))
                sys.stdout.flush()
                answered += 1
                if answered == 300:
                    if sys.argv[2] == "now":
                        # Right after an answer: anything answered before its COMMIT is lost.
                        kill(0)
                    # From another thread a moment later: most likely while the writer thread
                    # is inside a batch transaction and more writes are queued behind it.
                    threading.Thread(target=kill, args=(random.uniform(0, 0.005),)).start()

        await asyncio.gather(*(producer(t) for t in range(16)))

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("when", ["now", "soon"])
def test_answered_appends_survive_sigkill_mid_batch(tmp_path: Path, when: str) -> None:
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path), when],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    answered = [json.loads(line) for line in child.stdout.splitlines()]
    assert len(answered) >= 300

    async def check() -> None:
        s = SqliteStore(tmp_path)
        await s.open()
        try:
            stored = {
                (q, m.offset): m.body_json.decode()
                for q in range(3)
                for m in await s.read("t", q, 0, 100_000)
            }
            for qid, offset, body in answered:
                assert stored.get((qid, offset)) == body, (qid, offset, body)
            for q in range(3):
                offs = sorted(off for qq, off in stored if qq == q)
                assert offs == list(range(len(offs)))
        finally:
            await s.close()

    anyio.run(check)
