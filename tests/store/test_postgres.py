"""What the PostgreSQL store adds to the shared contract: several proxies on one database,
the schema version, session settings, unreachable servers, and surviving a server crash."""

from __future__ import annotations

import itertools
import random
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import anyio
import asyncpg
import pytest

from cproxy.errors import ConfigError, StoreError, TopicNotFound
from cproxy.model import AppendResult, NewMessage, QueueProgress, TopicInfo
from cproxy.store import _pg_log
from cproxy.store.postgres import PostgresStore
from tests.store.conftest import pg_skip
from tests.store.pg_server import PgServer, PgUnavailable, free_port

T0 = 1_700_000_000_000
WINDOW = 60_000
R = TypeVar("R")


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(pg_dsn)
    await s.open()
    yield s
    await s.close()


async def sql(dsn: str, statement: str) -> object:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(statement)
    finally:
        await conn.close()


#: The one-row-per-message table of schema versions 1 and 2.
V2_MESSAGES = """CREATE TABLE messages (
    tid integer NOT NULL, qid integer NOT NULL, off bigint NOT NULL,
    produced_at_ms bigint NOT NULL,
    key text, id text, headers bytea, body bytea NOT NULL,
    PRIMARY KEY (tid, qid, off))"""


async def back_to_messages_table(dsn: str) -> None:
    """Turn a database of this version into schema version 2: every stored message moves from
    the record batches back into the ``messages`` table, as version 2 kept it."""
    s = PostgresStore(dsn)
    await s.open()
    try:
        stored = []
        for topic in await s.list_topics():
            tid = await sql(dsn, f"SELECT tid FROM topics WHERE name = '{topic.name}'")
            for qid in range(topic.queues):
                for m in await s.read(topic.name, qid, 0, 1_000_000):
                    stored.append((tid, m))
    finally:
        await s.close()
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("DROP TABLE batches")
            await conn.execute(V2_MESSAGES)
            await conn.executemany(
                "INSERT INTO messages VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                [
                    (tid, m.qid, m.offset, m.produced_at_ms, m.key, m.id, m.headers_json,
                     m.body_json)
                    for tid, m in stored
                ],
            )  # fmt: skip
            await conn.execute("UPDATE cproxy_meta SET v = '2' WHERE k = 'schema_version'")
    finally:
        await conn.close()


def msg(qid: int, body: bytes, msg_id: str | None = None) -> NewMessage:
    return NewMessage(None, body, id=msg_id, qid=qid)


# -- settings and schema ---------------------------------------------------------------------


def test_settings_are_validated_eagerly() -> None:
    with pytest.raises(ConfigError):
        PostgresStore("sqlite:///x")
    with pytest.raises(ConfigError):
        PostgresStore("postgresql://h/db", min_connections=5, max_connections=2)
    with pytest.raises(ConfigError):
        PostgresStore("postgresql://h/db", command_timeout_ms=0)


async def test_sessions_commit_synchronously_whatever_the_database_default(pg_dsn: str) -> None:
    database = pg_dsn.rsplit("/", 1)[1]
    await sql(pg_dsn, f'ALTER DATABASE "{database}" SET synchronous_commit = off')
    assert await sql(pg_dsn, "SHOW synchronous_commit") == "off"
    s = PostgresStore(pg_dsn)
    await s.open()
    try:
        async with s._conn() as conn:
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
    finally:
        await s.close()


async def test_schema_version_is_recorded_and_a_newer_one_is_refused(pg_dsn: str) -> None:
    s = PostgresStore(pg_dsn)
    await s.open()
    await s.create_topic("t", 2)
    await s.close()
    assert await sql(pg_dsn, "SELECT v FROM cproxy_meta WHERE k = 'schema_version'") == "3"
    await s.open()  # an existing schema of our version opens as it is
    assert await s.list_topics() == [TopicInfo("t", 2)]
    await s.close()
    await sql(pg_dsn, "UPDATE cproxy_meta SET v = '99' WHERE k = 'schema_version'")
    with pytest.raises(StoreError, match="newer"):
        await s.open()
    assert not await s.ping()


async def test_a_version_2_database_is_migrated_keeping_every_message(pg_dsn: str) -> None:
    s = PostgresStore(pg_dsn)
    await s.open()
    await s.create_topic("t", 3)
    await s.create_topic("u", 1)
    sent = [
        NewMessage(f"k{i % 7}", b'{"n":%d}' % i, b'{"h":1}' if i % 3 else None,
                   f"id-{i}" if i % 2 else None, qid=i % 3)
        for i in range(250)
    ]  # fmt: skip
    for start in range(0, 250, 25):
        await s.append("t", sent[start : start + 25], T0 + start, WINDOW)
    await s.append("u", [msg(0, b"1")], T0, 0)
    before = {qid: await s.read("t", qid, 0, 1000) for qid in range(3)}
    stats = await s.queue_stats("t")
    await s.close()
    await back_to_messages_table(pg_dsn)
    assert await sql(pg_dsn, "SELECT count(*) FROM messages") == 251

    await s.open()
    try:
        assert await sql(pg_dsn, "SELECT v FROM cproxy_meta WHERE k = 'schema_version'") == "3"
        assert await sql(pg_dsn, "SELECT to_regclass('messages') IS NULL") is True
        assert {qid: await s.read("t", qid, 0, 1000) for qid in range(3)} == before
        assert sum(len(ms) for ms in before.values()) == 250
        assert [m.body_json for m in await s.read("u", 0, 0, 10)] == [b"1"]
        assert await s.queue_stats("t") == stats
        # Seek by time, dedup and appends carry on over the migrated log.
        assert await s.offset_for_time("t", 0, T0 + 100) == before[0][34].offset
        again = await s.append("t", [sent[1], msg(0, b"new")], T0 + 500, WINDOW)
        assert again[0].duplicate and (again[0].qid, again[0].offset) == (1, 0)
        assert again[1].offset == stats[0].next_offset
    finally:
        await s.close()


async def test_a_version_1_schema_is_migrated(pg_dsn: str) -> None:
    s = PostgresStore(pg_dsn)
    await s.open()
    await s.create_topic("t", 1)
    await s.append("t", [msg(0, b"1")], T0, 0)
    await s.close()
    await back_to_messages_table(pg_dsn)
    # Back to what version 1 had: no retention columns, no min_offset.
    await sql(pg_dsn, "ALTER TABLE topics DROP COLUMN retention_ms, DROP COLUMN retention_bytes")
    await sql(pg_dsn, "ALTER TABLE queues DROP COLUMN min_offset")
    await sql(pg_dsn, "UPDATE cproxy_meta SET v = '1' WHERE k = 'schema_version'")
    await s.open()
    try:
        assert await s.list_topics() == [TopicInfo("t", 1)]
        assert [q.min_offset for q in await s.queue_stats("t")] == [0]
        await s.update_topic("t", 1000, None)
        assert await s.apply_retention("t", T0 + 5000) == {0: 1}
    finally:
        await s.close()
    assert await sql(pg_dsn, "SELECT v FROM cproxy_meta WHERE k = 'schema_version'") == "3"


async def test_expired_dedup_entries_go_a_few_per_append(
    store: PostgresStore, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_pg_log, "PRUNE_PER_ENTRY", 2)
    monkeypatch.setattr(_pg_log, "PRUNE_EVERY", 1)
    await store.create_topic("t", 1)
    for i in range(10):  # a burst, one id per millisecond
        await store.append("t", [NewMessage(None, b"{}", id=f"old-{i}", qid=0)], T0 + i, WINDOW)

    async def old_left() -> object:
        return await sql(pg_dsn, "SELECT count(*) FROM dedup WHERE id LIKE 'old-%'")

    # Once the burst has expired, each append of one id deletes at most 2 of it, oldest first.
    later = T0 + WINDOW + 20
    left = []
    for i in range(6):
        await store.append("t", [NewMessage(None, b"{}", id=f"new-{i}", qid=0)], later, WINDOW)
        left.append(await old_left())
    assert left == [8, 6, 4, 2, 0, 0]
    assert await sql(pg_dsn, "SELECT count(*) FROM dedup WHERE id LIKE 'new-%'") == 6
    assert (await store.append("t", [NewMessage(None, b"{}", id="new-0", qid=0)], later, WINDOW))[
        0
    ].duplicate


async def test_a_prune_that_loses_a_deadlock_leaves_the_append_stored(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A prune locks expired entries in time order; an append that re-sends expired ids locks
    # theirs in id order. PostgreSQL ends such a deadlock by failing one side: when that is
    # the prune, the append it follows has committed and must be answered as stored.
    monkeypatch.setattr(_pg_log, "PRUNE_EVERY", 1)
    database = await sql(pg_dsn, "SELECT current_database()")
    await sql(pg_dsn, f"ALTER DATABASE \"{database}\" SET deadlock_timeout = '20ms'")
    s = PostgresStore(pg_dsn)  # its sessions check for deadlocks first: the prune loses
    await s.open()
    holder = await asyncpg.connect(pg_dsn)
    try:
        await holder.execute("SET deadlock_timeout = '10s'")
        await s.create_topic("t", 1)
        for i in range(2):
            await s.append("t", [NewMessage(None, b"{}", id=f"old-{i}", qid=0)], T0 + i, WINDOW)
        later = T0 + WINDOW + 10
        answers: list[list[AppendResult]] = []

        async def produce() -> None:
            answers.append(
                await s.append("t", [NewMessage(None, b"{}", id="new-0", qid=0)], later, WINDOW)
            )

        async with holder.transaction():
            await holder.execute("SELECT 1 FROM dedup WHERE id = 'old-1' FOR UPDATE")
            async with anyio.create_task_group() as tg:
                tg.start_soon(produce)
                with anyio.fail_after(5):  # the prune has deleted old-0 and waits for old-1
                    while not await holder.fetchval(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    ):
                        await anyio.sleep(0.01)
                await holder.execute("SELECT 1 FROM dedup WHERE id = 'old-0' FOR UPDATE")
        assert answers == [[AppendResult(0, 2)]]
        assert await sql(pg_dsn, "SELECT count(*) FROM dedup WHERE id LIKE 'old-%'") == 2
        await s.append("t", [NewMessage(None, b"{}", id="new-1", qid=0)], later, WINDOW)
        assert await sql(pg_dsn, "SELECT count(*) FROM dedup WHERE id LIKE 'old-%'") == 0
    finally:
        await holder.close()
        await s.close()


async def test_a_failed_prune_leaves_the_append_stored_and_is_tried_again(
    store: PostgresStore, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_pg_log, "PRUNE_EVERY", 1)
    await store.create_topic("t", 1)
    for i in range(3):
        await store.append("t", [NewMessage(None, b"{}", id=f"old-{i}", qid=0)], T0 + i, WINDOW)
    later = T0 + WINDOW + 10
    good = _pg_log.PRUNE_DEDUP
    failing = "SELECT 1 / ($3::int - $3::int), $1::bigint + $2::bigint"  # division by zero
    monkeypatch.setattr(_pg_log, "PRUNE_DEDUP", failing)
    # The append committed before its prune: it is answered as stored, not as failed.
    results = await store.append("t", [NewMessage(None, b"{}", id="new-0", qid=0)], later, WINDOW)
    assert results == [AppendResult(0, 3)]
    assert [m.id for m in await store.read("t", 0, 0, 10)] == ["old-0", "old-1", "old-2", "new-0"]
    monkeypatch.setattr(_pg_log, "PRUNE_DEDUP", good)
    # The next prune owes what the failed one did not delete (4 per entry, 2 entries here).
    await store.append("t", [NewMessage(None, b"{}", id="new-1", qid=0)], later, WINDOW)
    assert await sql(pg_dsn, "SELECT count(*) FROM dedup WHERE id LIKE 'old-%'") == 0


async def test_unreachable_server_raises_store_error() -> None:
    s = PostgresStore(f"postgresql://postgres@127.0.0.1:{free_port()}/x", connect_timeout_ms=2000)
    with pytest.raises(StoreError):
        await s.open()
    assert not await s.ping()


# -- several proxies on one database ---------------------------------------------------------


async def test_a_second_proxy_sees_topics_and_continues_offsets(
    store: PostgresStore, pg_dsn: str
) -> None:
    other = PostgresStore(pg_dsn)
    await other.open()
    try:
        with pytest.raises(TopicNotFound):
            await other.queue_stats("t")  # a miss is not cached
        await store.create_topic("t", 2)
        assert await other.create_topic("t", 2) == (TopicInfo("t", 2), False)
        await store.append("t", [msg(0, b"1"), msg(1, b"2", "a")], T0, WINDOW)
        results = await other.append("t", [msg(0, b"3"), msg(0, b"4", "a")], T0, WINDOW)
        assert results == [AppendResult(0, 1), AppendResult(1, 0, duplicate=True)]
        assert [m.body_json for m in await store.read("t", 0, 0, 10)] == [b"1", b"3"]
        await other.commit("g", {("t", 0): QueueProgress(2)})
        assert await store.load_progress("g") == {("t", 0): QueueProgress(2)}
    finally:
        await other.close()


async def test_concurrent_appenders_on_several_proxies_never_deadlock(pg_dsn: str) -> None:
    """Batches spanning queues in every order, from three pools at once: offsets stay
    contiguous, each result names the stored message, nothing deadlocks (a deadlock would
    surface as a StoreError)."""
    stores = [PostgresStore(pg_dsn, max_connections=4) for _ in range(3)]
    for s in stores:
        await s.open()
    await stores[0].create_topic("t", 4)
    answered: list[tuple[NewMessage, AppendResult]] = []

    async def producer(task: int) -> None:
        rng = random.Random(task)
        s = stores[task % len(stores)]
        for call in range(25):
            batch = [msg(rng.randrange(4), b'"%d-%d-%d"' % (task, call, i)) for i in range(1, 7)]
            results = await s.append("t", batch, T0 + call, 0)
            answered.extend(zip(batch, results, strict=True))

    try:
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for task in range(9):
                    tg.start_soon(producer, task)
        stored = {
            (m.qid, m.offset): m for q in range(4) for m in await stores[1].read("t", q, 0, 10_000)
        }
        for q in range(4):
            assert sorted(off for qid, off in stored if qid == q) == list(
                range(len([1 for qid, _ in stored if qid == q]))
            )
        assert len(stored) == len(answered) == 9 * 25 * 6
        for new, result in answered:
            assert result.message == stored[result.qid, result.offset]
            assert result.message.body_json == new.body_json
    finally:
        for s in stores:
            await s.close()


async def test_one_id_appended_at_once_through_several_proxies_is_stored_once(
    pg_dsn: str,
) -> None:
    stores = [PostgresStore(pg_dsn) for _ in range(4)]
    for s in stores:
        await s.open()
    await stores[0].create_topic("t", 4)
    results: list[AppendResult] = []

    async def produce(i: int) -> None:
        # Each call also appends to another queue, so the calls overlap in the queues they lock.
        batch = [msg(i, b"other-%d" % i), msg((i + 1) % 4, b"same-%d" % i, "the-id")]
        results.append((await stores[i].append("t", batch, T0, WINDOW))[1])

    try:
        for _ in range(5):
            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(produce, i)
        originals = [r for r in results if not r.duplicate]
        assert len(originals) == 1
        assert all((r.qid, r.offset) == (originals[0].qid, originals[0].offset) for r in results)
        bodies = [m.body_json for q in range(4) for m in await stores[0].read("t", q, 0, 100)]
        assert sum(b.startswith(b"same-") for b in bodies) == 1
    finally:
        for s in stores:
            await s.close()


async def test_appends_over_many_queues_and_large_batches(store: PostgresStore) -> None:
    await store.create_topic("t", 64)
    batch = [msg(i % 64, b'{"i":%d}' % i, f"id-{i}") for i in range(5000)]
    results = await store.append("t", batch, T0, WINDOW)
    assert Counter(r.qid for r in results) == Counter(i % 64 for i in range(5000))
    assert [s.next_offset for s in await store.queue_stats("t")] == [79] * 8 + [78] * 56
    again = await store.append("t", batch[:10], T0 + 1, WINDOW)
    assert all(r.duplicate for r in again)
    assert [(r.qid, r.offset) for r in again] == [(r.qid, r.offset) for r in results[:10]]


async def test_read_many_answers_as_one_read_per_queue_would(store: PostgresStore) -> None:
    await store.create_topic("t", 4)
    for start in range(0, 300, 30):  # several record batches per queue
        await store.append("t", [msg(i % 3, b'{"i":%d}' % i) for i in range(start, start + 30)],
                           T0, WINDOW)  # fmt: skip
    wants = [(0, 0, 1000), (1, 37, 5), (2, 99, 2), (3, 0, 10), (0, 95, 0), (1, 100, 10)]
    many = await store.read_many("t", wants)
    singles = [await store.read("t", qid, start, n) for qid, start, n in wants]
    assert many == singles
    assert [len(m) for m in many] == [100, 5, 1, 0, 0, 0]
    assert [m.offset for m in many[1]] == [37, 38, 39, 40, 41]
    with pytest.raises(TopicNotFound):
        await store.read_many("nope", [(0, 0, 1)])


# -- crash of the server ---------------------------------------------------------------------


@pytest.fixture
def own_server(request: pytest.FixtureRequest) -> Iterator[PgServer]:
    """A server of the test's own (it gets killed), with fsync on as in production."""
    root = Path(tempfile.mkdtemp(prefix="cproxy-pg-kill-"))
    try:
        server = PgServer.start(root, fsync=True)
    except PgUnavailable as exc:
        pg_skip(request, exc)
    try:
        yield server
    finally:
        server.destroy()


async def eventually(call: Callable[[], Awaitable[R]], timeout_s: float = 30.0) -> R:
    """``call()``'s result once it stops raising ``StoreError`` (polling, with a deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call()
        except StoreError:
            if time.monotonic() > deadline:
                raise
            await anyio.sleep(0.05)


@pytest.mark.slow
async def test_acknowledged_appends_survive_a_server_sigkill(own_server: PgServer) -> None:
    dsn = own_server.create_database()
    store = PostgresStore(dsn, max_connections=8, command_timeout_ms=10_000)
    await store.open()
    await store.create_topic("t", 3)
    acked: list[tuple[list[NewMessage], list[AppendResult]]] = []
    cut: list[int] = []

    async def producer(task: int) -> None:
        for call in itertools.count():
            batch = [
                msg((task + i) % 3, b'"%d-%d-%d"' % (task, call, i), f"id-{task}-{call}-{i}")
                for i in range(1 + call % 5)
            ]
            try:
                results = await store.append("t", batch, T0 + call, WINDOW)
            except StoreError:
                cut.append(task)  # the server died under this call: it may or may not be in
                return
            acked.append((batch, results))

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for task in range(6):
                tg.start_soon(producer, task)
            while len(acked) < 150:
                await anyio.sleep(0.01)
            # Mid-stream: six producers are appending right now.
            await anyio.to_thread.run_sync(own_server.kill)
    assert sorted(cut) == list(range(6))
    await anyio.to_thread.run_sync(own_server.start_again)  # crash recovery

    # The same store serves again once the server is back (the pool reconnects).
    stats = await eventually(lambda: store.queue_stats("t"))
    stored = {(m.qid, m.offset): m for s in stats for m in await store.read("t", s.qid, 0, 10_000)}
    await store.close()
    for s in stats:
        assert sorted(off for qid, off in stored if qid == s.qid) == list(range(s.next_offset))
    for batch, results in acked:
        for new, result in zip(batch, results, strict=True):
            assert stored[result.qid, result.offset].body_json == new.body_json
    # Each call is all or nothing, the ones cut by the kill included.
    per_call: defaultdict[bytes, int] = defaultdict(int)
    for m in stored.values():
        per_call[m.body_json.rsplit(b"-", 1)[0]] += 1
    for call_key, count in per_call.items():
        call = int(call_key.split(b"-")[1])
        assert count == 1 + call % 5, call_key
    assert len(stored) >= sum(len(b) for b, _ in acked)
