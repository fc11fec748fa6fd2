"""Consume at least once, apply once: skip messages whose business key was already processed.

A handler wrapped with :func:`idempotent` claims the message's business key before running:

- the key is new (or its earlier claim expired): the handler runs; on success the key is marked
  done for ``ttl_ms``; on an exception the claim is released so a redelivery can try again;
- the key is done: the handler is skipped and the message acked (a redelivery after a crash
  between handling and ack, or a producer's duplicate);
- another delivery holds a live claim: :class:`~consumer_sdk.DuplicateInProgress` is raised, so
  this delivery is failed and retried after the group's backoff, when the other has finished.

A claim is a lease (``lease_ms``): if the process dies while holding it, the key becomes
claimable again after the lease, so nothing waits forever. Choose ``lease_ms`` above the
handler's longest run. Marking done happens after the handler's side effects, so a crash between
the two still runs the handler twice: make the effect itself atomic with the mark if that matters
(e.g. keep the store in the same database transaction as the effect).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar, overload

from consumer_sdk.errors import DuplicateInProgress
from consumer_sdk.models import Message

DEFAULT_PATH = "cproxy-idempotency.sqlite3"
DEFAULT_TTL_MS = 7 * 24 * 3600 * 1000
DEFAULT_LEASE_MS = 5 * 60 * 1000

R = TypeVar("R")


class Claim(enum.Enum):
    """Outcome of :meth:`IdempotencyStore.claim`."""

    CLAIMED = "claimed"  # run the handler
    DONE = "done"  # already processed: skip
    BUSY = "busy"  # another delivery holds the claim: retry later


class IdempotencyStore(Protocol):
    """Where processed keys live. Methods must be atomic and thread-safe; times are Unix ms."""

    def claim(self, key: str, owner: str, lease_ms: int) -> Claim:
        """Atomically claim ``key`` for ``owner`` unless it is done or claimed by a live lease."""

    def mark_done(self, key: str, owner: str, ttl_ms: int) -> None:
        """Record ``key`` as processed for ``ttl_ms``."""

    def release(self, key: str, owner: str) -> None:
        """Drop ``owner``'s claim on ``key`` (no-op if someone else holds it or it is done)."""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class MemoryIdempotencyStore:
    """A process-local store: fine for tests and single-process consumers without restarts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, tuple[str, str, int]] = {}  # key -> (state, owner, expires_ms)

    def claim(self, key: str, owner: str, lease_ms: int) -> Claim:
        now = _now_ms()
        with self._lock:
            row = self._rows.get(key)
            if row is not None and row[2] > now:
                return Claim.DONE if row[0] == "done" else Claim.BUSY
            self._rows[key] = ("claimed", owner, now + lease_ms)
            return Claim.CLAIMED

    def mark_done(self, key: str, owner: str, ttl_ms: int) -> None:
        with self._lock:
            self._rows[key] = ("done", owner, _now_ms() + ttl_ms)

    def release(self, key: str, owner: str) -> None:
        with self._lock:
            row = self._rows.get(key)
            if row is not None and row[0] == "claimed" and row[1] == owner:
                del self._rows[key]


class SQLiteIdempotencyStore:
    """The default store: one SQLite file, safe across threads and processes on one host.

    ``path`` is created if missing. Expired rows are purged every ``purge_every`` claims. Use
    one file per consuming application; ``namespace`` in :func:`idempotent` separates handlers.
    """

    def __init__(
        self, path: str | os.PathLike[str] = DEFAULT_PATH, *, purge_every: int = 1000
    ) -> None:
        self.path = os.fspath(path)
        self._purge_every = purge_every
        self._claims = 0
        self._lock = threading.Lock()
        # isolation_level=None: transactions are explicit, BEGIN IMMEDIATE takes the write
        # lock up front so check-then-claim is atomic across processes too.
        self._db = sqlite3.connect(
            self.path, timeout=30, isolation_level=None, check_same_thread=False
        )
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS cproxy_idempotency ("
                " key TEXT PRIMARY KEY, state TEXT NOT NULL, owner TEXT NOT NULL,"
                " expires_ms INTEGER NOT NULL)"
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def claim(self, key: str, owner: str, lease_ms: int) -> Claim:
        now = _now_ms()
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute(
                    "SELECT state, expires_ms FROM cproxy_idempotency WHERE key = ?", (key,)
                ).fetchone()
                if row is not None and row[1] > now:
                    result = Claim.DONE if row[0] == "done" else Claim.BUSY
                else:
                    db.execute(
                        "INSERT OR REPLACE INTO cproxy_idempotency VALUES (?, 'claimed', ?, ?)",
                        (key, owner, now + lease_ms),
                    )
                    result = Claim.CLAIMED
                self._claims += 1
                if self._claims % self._purge_every == 0:
                    db.execute("DELETE FROM cproxy_idempotency WHERE expires_ms <= ?", (now,))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return result

    def mark_done(self, key: str, owner: str, ttl_ms: int) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO cproxy_idempotency VALUES (?, 'done', ?, ?)",
                (key, owner, _now_ms() + ttl_ms),
            )

    def release(self, key: str, owner: str) -> None:
        with self._lock:
            self._db.execute(
                "DELETE FROM cproxy_idempotency WHERE key = ? AND state = 'claimed' AND owner = ?",
                (key, owner),
            )


KeyFunc = Callable[[Message], object]

_default_stores: dict[str, SQLiteIdempotencyStore] = {}
_default_lock = threading.Lock()


def _open(store: IdempotencyStore | str | os.PathLike[str] | None) -> IdempotencyStore:
    if store is not None and not isinstance(store, str | os.PathLike):
        return store
    path = os.path.abspath(os.fspath(store or DEFAULT_PATH))
    with _default_lock:  # one connection per file and process, shared by every decorator
        if path not in _default_stores:
            _default_stores[path] = SQLiteIdempotencyStore(path)
        return _default_stores[path]


class Idempotent:
    """A decorator made by :func:`idempotent`; works on sync and ``async def`` handlers."""

    def __init__(
        self,
        key: KeyFunc,
        store: IdempotencyStore | str | os.PathLike[str] | None,
        ttl_ms: int,
        lease_ms: int,
        namespace: str | None,
    ) -> None:
        if ttl_ms < 1 or lease_ms < 1:
            raise ValueError("ttl_ms and lease_ms must be >= 1")
        self._key = key
        self._store_arg = store
        self._store: IdempotencyStore | None = None
        self.ttl_ms = ttl_ms
        self.lease_ms = lease_ms
        self.namespace = namespace

    @property
    def store(self) -> IdempotencyStore:
        # Opened lazily, so decorating at import time creates no file.
        if self._store is None:
            self._store = _open(self._store_arg)
        return self._store

    @overload
    def __call__(
        self, handler: Callable[[Message], Awaitable[R]]
    ) -> Callable[[Message], Awaitable[R | None]]: ...
    @overload
    def __call__(self, handler: Callable[[Message], R]) -> Callable[[Message], R | None]: ...
    def __call__(self, handler: Callable[[Message], Any]) -> Callable[[Message], Any]:
        space = (
            self.namespace
            if self.namespace is not None
            else (f"{handler.__module__}.{getattr(handler, '__qualname__', repr(handler))}")
        )
        key, ttl_ms, lease_ms = self._key, self.ttl_ms, self.lease_ms

        if inspect.iscoroutinefunction(handler):

            @functools.wraps(handler)
            async def async_wrapper(msg: Message) -> Any:
                value = key(msg)
                if value is None:
                    return await handler(msg)
                bkey, owner, store = f"{space}\x1f{value}", uuid.uuid4().hex, self.store
                claim = await asyncio.to_thread(store.claim, bkey, owner, lease_ms)
                if claim is not Claim.CLAIMED:
                    return _skip(claim, value)
                try:
                    result = await handler(msg)
                except BaseException:
                    await asyncio.to_thread(store.release, bkey, owner)
                    raise
                await asyncio.to_thread(store.mark_done, bkey, owner, ttl_ms)
                return result

            return async_wrapper

        @functools.wraps(handler)
        def wrapper(msg: Message) -> Any:
            value = key(msg)
            if value is None:
                return handler(msg)
            bkey, owner, store = f"{space}\x1f{value}", uuid.uuid4().hex, self.store
            claim = store.claim(bkey, owner, lease_ms)
            if claim is not Claim.CLAIMED:
                return _skip(claim, value)
            try:
                result = handler(msg)
            except BaseException:
                store.release(bkey, owner)
                raise
            store.mark_done(bkey, owner, ttl_ms)
            return result

        return wrapper


def _skip(claim: Claim, value: object) -> None:
    if claim is Claim.BUSY:
        raise DuplicateInProgress(str(value))


def idempotent(
    key: KeyFunc,
    *,
    store: IdempotencyStore | str | os.PathLike[str] | None = None,
    ttl_ms: int = DEFAULT_TTL_MS,
    lease_ms: int = DEFAULT_LEASE_MS,
    namespace: str | None = None,
) -> Idempotent:
    """Make a decorator that applies each business key once, for sync or ``async`` handlers.

    ``key(msg)`` returns the business key (any value, made a string; None runs the handler
    without dedup). ``store`` is an :class:`IdempotencyStore` or the path of a SQLite file
    (default ``./cproxy-idempotency.sqlite3``). Keys stay done for ``ttl_ms`` (7 days); a claim
    lasts ``lease_ms`` (5 minutes). ``namespace`` (default: the handler's qualified name)
    separates handlers sharing a store. A skipped message returns None (and is acked)::

        @idempotent(key=lambda m: m.body["payment_id"])
        def handle(msg: Message) -> None: ...
    """
    return Idempotent(key, store, ttl_ms, lease_ms, namespace)
