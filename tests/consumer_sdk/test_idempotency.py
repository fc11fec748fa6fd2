"""The idempotency helper: stores (claim, lease, TTL) and the handler decorator."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from consumer_sdk import (
    Claim,
    DuplicateInProgress,
    IdempotencyStore,
    MemoryIdempotencyStore,
    Message,
    SQLiteIdempotencyStore,
    idempotent,
)

from .fake import wait_for


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> IdempotencyStore:
    if request.param == "memory":
        return MemoryIdempotencyStore()
    return SQLiteIdempotencyStore(tmp_path / "idem.sqlite3")


def msg(payment: str | None, offset: int = 0) -> Message:
    return Message(topic="payments", qid=0, offset=offset, key=None, body={"payment": payment})


def test_claim_lifecycle(store: IdempotencyStore) -> None:
    assert store.claim("k", "a", 60_000) is Claim.CLAIMED
    assert store.claim("k", "b", 60_000) is Claim.BUSY
    store.release("k", "b")  # not the owner: no effect
    assert store.claim("k", "b", 60_000) is Claim.BUSY
    store.release("k", "a")
    assert store.claim("k", "b", 60_000) is Claim.CLAIMED
    store.mark_done("k", "b", 60_000)
    assert store.claim("k", "c", 60_000) is Claim.DONE
    store.release("k", "b")  # releasing a done key keeps it done
    assert store.claim("k", "c", 60_000) is Claim.DONE


def test_expired_lease_and_ttl_free_the_key(store: IdempotencyStore) -> None:
    assert store.claim("crashed", "a", 1) is Claim.CLAIMED
    wait_for(lambda: store.claim("crashed", "b", 60_000) is Claim.CLAIMED)
    store.mark_done("old", "a", 1)
    wait_for(lambda: store.claim("old", "c", 60_000) is Claim.CLAIMED)


def test_sqlite_claim_is_atomic_across_connections(tmp_path: Path) -> None:
    # Separate store objects (separate connections) stand in for separate processes.
    path = tmp_path / "shared.sqlite3"
    stores = [SQLiteIdempotencyStore(path) for _ in range(6)]
    barrier = threading.Barrier(len(stores))
    outcomes: list[Claim] = []

    def race(s: SQLiteIdempotencyStore, owner: str) -> None:
        barrier.wait()
        outcomes.append(s.claim("same-key", owner, 60_000))

    threads = [threading.Thread(target=race, args=(s, f"o{i}")) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o.value for o in outcomes) == ["busy"] * 5 + ["claimed"]
    for s in stores:
        s.close()


def test_sqlite_purges_expired_rows(tmp_path: Path) -> None:
    store = SQLiteIdempotencyStore(tmp_path / "p.sqlite3", purge_every=2)
    store.mark_done("gone", "a", -1)  # already expired
    store.claim("x", "a", 60_000)
    store.claim("y", "a", 60_000)
    rows = store._db.execute("SELECT key FROM cproxy_idempotency ORDER BY key").fetchall()
    assert rows == [("x",), ("y",)]


def test_decorator_skips_done_keys_and_retries_after_failure(store: IdempotencyStore) -> None:
    calls: list[str | None] = []
    fail = {"p2"}

    @idempotent(key=lambda m: m.body["payment"], store=store)
    def apply(m: Message) -> str:
        calls.append(m.body["payment"])
        if m.body["payment"] in fail:
            fail.discard(m.body["payment"])
            raise ValueError("card declined")
        return "applied"

    assert apply(msg("p1")) == "applied"
    assert apply(msg("p1", offset=9)) is None  # a duplicate, even at another offset: skipped
    with pytest.raises(ValueError):
        apply(msg("p2"))
    assert apply(msg("p2")) == "applied"  # the failure released the claim
    assert apply(msg(None)) == "applied" and apply(msg(None)) == "applied"  # no key: no dedup
    assert calls == ["p1", "p2", "p2", None, None]
    assert apply.__name__ == "apply"


def test_decorator_raises_while_another_delivery_holds_the_key() -> None:
    store = MemoryIdempotencyStore()
    entered, release = threading.Event(), threading.Event()

    @idempotent(key=lambda m: m.body["payment"], store=store)
    def slow(m: Message) -> None:
        entered.set()
        release.wait(5)

    first = threading.Thread(target=slow, args=(msg("p1"),))
    first.start()
    assert entered.wait(5)
    with pytest.raises(DuplicateInProgress) as info:
        slow(msg("p1"))
    assert info.value.key == "p1" and info.value.retryable
    release.set()
    first.join()
    assert slow(msg("p1")) is None


def test_namespaces_keep_handlers_apart() -> None:
    store = MemoryIdempotencyStore()
    billed: list[str] = []
    mailed: list[str] = []

    @idempotent(key=lambda m: m.body["payment"], store=store)
    def bill(m: Message) -> None:
        billed.append(m.body["payment"])

    @idempotent(key=lambda m: m.body["payment"], store=store)
    def mail(m: Message) -> None:
        mailed.append(m.body["payment"])

    for handler in (bill, mail, bill, mail):
        handler(msg("p1"))
    assert billed == mailed == ["p1"]


async def test_async_decorator(store: IdempotencyStore) -> None:
    calls: list[str] = []

    @idempotent(key=lambda m: m.body["payment"], store=store)
    async def apply(m: Message) -> int:
        calls.append(m.body["payment"])
        if len(calls) == 1:
            raise RuntimeError("transient")
        return len(calls)

    with pytest.raises(RuntimeError):
        await apply(msg("p1"))
    assert await apply(msg("p1")) == 2
    assert await apply(msg("p1")) is None
    assert calls == ["p1", "p1"]


def test_default_store_is_a_sqlite_file_opened_lazily(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    decorator = idempotent(key=lambda m: m.body["payment"])
    handler = decorator(lambda m: None)
    assert not (tmp_path / "cproxy-idempotency.sqlite3").exists()
    handler(msg("p1"))
    assert (tmp_path / "cproxy-idempotency.sqlite3").exists()
    assert isinstance(decorator.store, SQLiteIdempotencyStore)
