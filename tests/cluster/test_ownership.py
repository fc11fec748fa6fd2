"""Membership, queue ownership transitions and fencing against a real PostgreSQL, through
the store's cluster interface (``cproxy.store.cluster_base.ClusterStore``).

Several stores on one database stand for several proxies, each joined as one node; all times
are the database's.
"""

from __future__ import annotations

import time

import anyio
import pytest

from cproxy.errors import ConfigError, QueueNotOwned, StoreError
from cproxy.model import DeadLetter, NewMessage, QueueProgress, Record
from cproxy.store.cluster_base import FinalCommit
from cproxy.store.postgres import PostgresStore
from tests.cluster.conftest import StoreFactory

LEASE_MS = 300
GRACE_MS = 400


async def cluster_store(stores: StoreFactory, queues: int = 4) -> PostgresStore:
    """Node "a", on a database with topic ``rides``."""
    store = await stores()
    await store.create_topic("rides", queues)
    await store.join_cluster("a")
    await store.join_cluster("a")  # idempotent (the tables exist)
    return store


async def node(stores: StoreFactory, node_id: str) -> PostgresStore:
    store = await stores()
    await store.join_cluster(node_id)
    return store


async def tid_of(store: PostgresStore, qid: int) -> tuple[int, int]:
    return next((r.tid, r.qid) for r in await store.owner_rows() if r.qid == qid)


async def test_members_are_live_while_their_lease_runs_by_the_database_clock(
    stores: StoreFactory,
) -> None:
    a = await cluster_store(stores)
    b = await node(stores, "b")
    await a.heartbeat("http://127.0.0.1:1", 60_000)
    await b.heartbeat("http://127.0.0.1:2", LEASE_MS)
    assert [m.node_id for m in await a.live_members()] == ["a", "b"]
    deadline = time.monotonic() + 10
    while [m.node_id for m in await a.live_members()] != ["a"]:
        assert time.monotonic() < deadline, "b's lease never ran out"
        await anyio.sleep(0.05)
    await b.heartbeat("http://127.0.0.1:3", 60_000)  # b is back
    live = await b.live_members()
    assert [(m.node_id, m.advertise_url) for m in live] == [
        ("a", "http://127.0.0.1:1"),
        ("b", "http://127.0.0.1:3"),
    ]
    await a.leave_cluster()
    assert [m.node_id for m in await b.live_members()] == ["b"]


async def test_a_store_that_has_not_joined_refuses_cluster_calls(stores: StoreFactory) -> None:
    store = await stores()
    with pytest.raises(StoreError, match="not joined"):
        await store.heartbeat("http://127.0.0.1:1", 60_000)
    with pytest.raises(StoreError, match="not joined"):
        await store.claim((1, 0), 60_000, 0)


async def test_joining_again_keeps_the_epochs_held_and_one_store_is_one_node(
    stores: StoreFactory,
) -> None:
    store = await cluster_store(stores)
    q0 = await tid_of(store, 0)
    assert await store.claim(q0, 60_000, 0) == 1
    await store.join_cluster("a")
    await store.commit("billing", {("rides", 0): QueueProgress(1)})  # still held at epoch 1
    with pytest.raises(ConfigError, match="as 'a' already"):
        await store.join_cluster("b")


async def test_claim_only_free_queues_and_epochs_grow(stores: StoreFactory) -> None:
    a = await cluster_store(stores)
    b = await node(stores, "b")
    q0 = await tid_of(a, 0)
    rows = await a.owner_rows()
    assert [(r.ref, r.owner, r.epoch, r.claimable) for r in rows] == [
        (("rides", qid), None, 0, True) for qid in range(4)
    ]
    assert await a.claim(q0, 60_000, GRACE_MS) == 1
    assert await b.claim(q0, 60_000, GRACE_MS) is None
    assert await a.renew(60_000, GRACE_MS) == {q0: 1}
    assert await b.renew(60_000, GRACE_MS) == {}
    row = (await a.owner_rows())[0]
    assert (row.owner, row.epoch, row.state, row.claimable) == ("a", 1, "owned", False)


async def test_planned_hand_over_writes_final_progress_and_frees_in_one_transaction(
    stores: StoreFactory,
) -> None:
    store = await cluster_store(stores)
    b = await node(stores, "b")
    q0 = await tid_of(store, 0)
    epoch = await store.claim(q0, 60_000, GRACE_MS)
    assert epoch == 1
    assert await store.release(q0, epoch)
    assert not await b.release(q0, epoch)
    row = (await store.owner_rows())[0]
    assert (row.owner, row.state, row.claimable) == ("a", "releasing", False)

    final = FinalCommit("billing", {("rides", 0): QueueProgress(17)})
    await store.hand_over(q0, epoch, [final])
    row = (await store.owner_rows())[0]
    assert (row.owner, row.epoch, row.state, row.claimable) == (None, 1, "owned", True)
    assert await b.claim(q0, 60_000, GRACE_MS) == 2
    assert (await store.load_progress("billing"))[("rides", 0)].committed == 17
    # Handed over: "a" holds the queue no more, so its commits on it are refused.
    with pytest.raises(QueueNotOwned):
        await store.commit("billing", {("rides", 0): QueueProgress(18)})


async def test_a_stale_hand_over_writes_nothing(stores: StoreFactory) -> None:
    store = await cluster_store(stores)
    q0 = await tid_of(store, 0)
    epoch = await store.claim(q0, 60_000, GRACE_MS)
    assert epoch is not None
    final = FinalCommit("billing", {("rides", 0): QueueProgress(5)})
    with pytest.raises(QueueNotOwned):
        await store.hand_over(q0, epoch + 1, [final])
    row = (await store.owner_rows())[0]
    assert (row.owner, row.epoch) == ("a", epoch)
    assert await store.load_progress("billing") == {}


async def test_after_a_crash_a_queue_is_claimable_only_after_lease_plus_grace(
    stores: StoreFactory,
) -> None:
    store = await cluster_store(stores)
    b = await node(stores, "b")
    q0 = await tid_of(store, 0)
    began = time.monotonic()
    assert await store.claim(q0, LEASE_MS, GRACE_MS) == 1
    # "a" crashes: it never renews again. "b" keeps trying.
    deadline = time.monotonic() + 15
    while (epoch := await b.claim(q0, 60_000, GRACE_MS)) is None:
        assert time.monotonic() < deadline, "the queue was never taken over"
        await anyio.sleep(0.02)
    waited_ms = (time.monotonic() - began) * 1000
    assert epoch == 2
    assert waited_ms >= LEASE_MS + GRACE_MS - 50, waited_ms  # clock granularity
    # The old owner's renewal no longer names the queue: it learns that it lost it.
    assert await store.renew(LEASE_MS, GRACE_MS) == {}


def dead_letter(qid: int, offset: int) -> DeadLetter:
    message = Record("rides", qid, offset, "k", b'{"n":1}', None, None, 1)
    return DeadLetter("billing", message, 3, "boom", 2)


async def test_commits_are_fenced_by_owner_and_epoch(stores: StoreFactory) -> None:
    a, b = await cluster_store(stores), await node(stores, "b")
    q0, q1 = await tid_of(a, 0), await tid_of(a, 1)
    assert await a.claim(q0, LEASE_MS, 0) == 1
    assert await a.claim(q1, 60_000, 0) == 1
    await a.commit("billing", {("rides", 0): QueueProgress(3), ("rides", 1): QueueProgress(4)})
    # A queue never claimed cannot be committed either.
    with pytest.raises(QueueNotOwned) as never:
        await a.commit("billing", {("rides", 2): QueueProgress(9)})
    assert never.value.refs == [("rides", 2)]

    # "a" pauses past its lease on queue 0; "b" takes it over and commits.
    deadline = time.monotonic() + 15
    while await b.claim(q0, 60_000, 0) is None:
        assert time.monotonic() < deadline
        await anyio.sleep(0.02)
    await b.commit("billing", {("rides", 0): QueueProgress(10)})

    # "a" wakes: progress and dead letters of queue 0 are refused, and nothing of the commit
    # is written (queue 1's progress included), so the caller can drop queue 0 and retry.
    with pytest.raises(QueueNotOwned) as lost:
        await a.commit("billing", {("rides", 0): QueueProgress(5), ("rides", 1): QueueProgress(8)})
    assert lost.value.refs == [("rides", 0)]
    assert lost.value.code == "queue_not_owned"
    with pytest.raises(QueueNotOwned):
        await a.commit("billing", {}, [dead_letter(0, 4)])
    progress = await a.load_progress("billing")
    assert (progress[("rides", 0)].committed, progress[("rides", 1)].committed) == (10, 4)
    assert await a.count_dead_letters("billing") == 0
    await a.commit("billing", {("rides", 1): QueueProgress(8)}, [dead_letter(1, 6)])
    assert (await a.load_progress("billing"))[("rides", 1)].committed == 8
    assert await a.count_dead_letters("billing") == 1


async def test_a_store_without_a_fence_commits_anything(stores: StoreFactory) -> None:
    await cluster_store(stores)
    store = await stores()  # on the same database, never joined
    await store.commit("billing", {("rides", 3): QueueProgress(2)})
    assert (await store.load_progress("billing"))[("rides", 3)].committed == 2


async def test_outputs_with_progress_are_fenced_by_the_input_queues(stores: StoreFactory) -> None:
    a = await cluster_store(stores)
    q0 = await tid_of(a, 0)
    await a.create_topic("out", 1)
    assert await a.claim(q0, 60_000, 0) == 1
    out = [("out", [NewMessage("k", b"1", qid=0)])]
    stored = await a.commit_with_outputs("billing", {("rides", 0): QueueProgress(3)}, out, 1, 0)
    assert [(r.qid, r.offset) for r in stored[0]] == [(0, 0)]
    # Queue 1 was never claimed by "a": neither its progress nor the outputs are written.
    with pytest.raises(QueueNotOwned) as lost:
        await a.commit_with_outputs("billing", {("rides", 1): QueueProgress(5)}, out, 2, 0)
    assert lost.value.refs == [("rides", 1)]
    assert [s.next_offset for s in await a.queue_stats("out")] == [1]
    assert ("rides", 1) not in await a.load_progress("billing")


async def test_a_disowned_queue_is_fenced(stores: StoreFactory) -> None:
    store = await cluster_store(stores)
    q0 = await tid_of(store, 0)
    assert await store.claim(q0, 60_000, 0) == 1
    await store.commit("billing", {("rides", 0): QueueProgress(1)})
    store.disown(q0)  # the node learnt it lost the queue (e.g. missing from a renewal)
    with pytest.raises(QueueNotOwned):
        await store.commit("billing", {("rides", 0): QueueProgress(2)})
    assert (await store.load_progress("billing"))[("rides", 0)].committed == 1


async def test_the_listener_hears_appends_and_peers_of_joined_stores_only(
    stores: StoreFactory,
) -> None:
    a = await cluster_store(stores)
    b = await node(stores, "b")
    lone = await stores()  # a single proxy's store: appends notify nobody
    appended: list[tuple[str, int, int]] = []
    peers: list[str] = []
    heard = anyio.Event()

    def on_peer(what: str) -> None:
        peers.append(what)
        heard.set()

    listener = await a.listen(lambda *end: appended.append(end), on_peer)
    try:
        await lone.append("rides", [NewMessage("k", b"0", qid=1)], 1, 0)
        await b.append("rides", [NewMessage("k", b"1", qid=1)], 1, 0)
        await b.notify_peers("join:b")
        with anyio.fail_after(10):
            await heard.wait()
        # Notifications arrive in commit order: the append came first.
        assert appended == [("rides", 1, 2)]
        assert peers == ["join:b"]
    finally:
        await listener.close()
    assert listener.is_closed()
