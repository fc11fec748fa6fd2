"""The PostgreSQL store's foundation: settings, the connection pool, the topic cache.

Shared by both halves of ``postgres.PostgresStore`` (``_pg_log`` and ``_pg_groups``). Every call
borrows a connection through ``_conn``, which is where asyncpg and OS errors become
``StoreError``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from cproxy.errors import ConfigError, StoreError, TopicNotFound
from cproxy.store._common import topic_not_found
from cproxy.store._pg_cluster import Fence
from cproxy.store._pg_schema import FOREIGN_ERRORS, as_store_error, ensure_schema
from cproxy.store._pg_sql import Conn
from cproxy.store._retention import ByteCounter

logger = logging.getLogger(__name__)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Nothing to reset when a connection goes back to the pool: the store leaves no session
    state behind (only transaction-level advisory locks; no cursors, LISTEN or SET on pooled
    connections). asyncpg's default reset (``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;
    RESET ALL``) is a round trip to the server on every release, as much as some reads cost;
    an open transaction is still rolled back by asyncpg before this runs."""


class PgBase:
    """The pool and the topic cache. ``dsn`` is a libpq URI (``postgresql://user@host/db``).

    The pool holds between ``min_connections`` and ``max_connections`` connections;
    ``connect_timeout_ms`` bounds opening or borrowing one, ``command_timeout_ms`` any single
    statement. Several stores (proxies) may use one database at once.
    """

    def __init__(
        self,
        dsn: str,
        *,
        min_connections: int = 1,
        max_connections: int = 10,
        connect_timeout_ms: int = 10_000,
        command_timeout_ms: int = 30_000,
    ) -> None:
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise ConfigError("the PostgreSQL store needs a postgresql:// DSN")
        if not 1 <= min_connections <= max_connections:
            raise ConfigError(
                f"need 1 <= min_connections <= max_connections, got {min_connections} and "
                f"{max_connections}"
            )
        if connect_timeout_ms <= 0 or command_timeout_ms <= 0:
            raise ConfigError("connect_timeout_ms and command_timeout_ms must be positive")
        self._dsn = dsn
        self._min, self._max = min_connections, max_connections
        self._connect_timeout_s = connect_timeout_ms / 1000
        self._command_timeout_s = command_timeout_ms / 1000
        self._pool: asyncpg.Pool | None = None
        # Topics never change their queue count and tids are never reused, so this cache can
        # miss (a topic another proxy created) and can name a topic another proxy deleted:
        # statements on a deleted tid find no rows (see ``_pg_log.PgLog.delete_topic``).
        self._topics: dict[str, tuple[int, int]] = {}  # name -> (tid, queues)
        self._bytes = ByteCounter()
        self._max_window_ms = 0
        #: Where the last delete of expired dedup entries ended (a stored time), and the
        #: entries added since (``PgLog._maybe_prune``).
        self._pruned_to_ms = 0
        self._prune_owed = 0
        #: Cluster mode (``join_cluster``): the owner/epoch check every ``commit`` runs in its
        #: transaction (``_pg_cluster.Fence``). None (a single proxy): no check, no cost.
        self._fence: Fence | None = None
        #: Cluster mode: every append notifies ``_pg_sql.APPEND_CHANNEL`` so that the owners
        #: of the queues, on other proxies, read the new messages at once.
        self._notify_appends = False

    async def open(self) -> None:
        if self._pool is not None:
            return
        try:
            pool = await asyncpg.create_pool(
                self._dsn,
                min_size=self._min,
                max_size=self._max,
                timeout=self._connect_timeout_s,
                command_timeout=self._command_timeout_s,
                server_settings={"synchronous_commit": "on", "application_name": "cproxy"},
                reset=_keep_session,
            )
        except FOREIGN_ERRORS as exc:
            raise as_store_error(exc) from exc
        try:
            async with pool.acquire() as conn:
                await ensure_schema(conn)
        except BaseException as exc:
            pool.terminate()
            if isinstance(exc, FOREIGN_ERRORS):
                raise as_store_error(exc) from exc
            raise
        self._pool = pool
        logger.info("opened PostgreSQL store pool=%d..%d", self._min, self._max)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            # Waits for calls in progress to give their connections back.
            await asyncio.wait_for(pool.close(), self._command_timeout_s)
        except FOREIGN_ERRORS:
            pool.terminate()

    async def ping(self) -> bool:
        try:
            async with self._conn() as conn:
                await conn.fetchval("SELECT 1")
        except StoreError:
            return False
        return True

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[Conn]:
        """A pooled connection; asyncpg and OS errors inside become ``StoreError``."""
        pool = self._pool
        if pool is None:
            raise StoreError("the store is not open")
        try:
            async with pool.acquire(timeout=self._connect_timeout_s) as conn:
                yield conn
        except FOREIGN_ERRORS as exc:
            raise as_store_error(exc) from exc

    async def _topic(self, conn: Conn, name: str) -> tuple[int, int]:
        """(tid, queues) of a topic; ``TopicNotFound`` if there is none."""
        entry = self._topics.get(name)
        if entry is None:
            row = await conn.fetchrow("SELECT tid, queues FROM topics WHERE name = $1", name)
            if row is None:
                raise topic_not_found(name)
            entry = self._topics[name] = (row[0], row[1])
        return entry

    async def _tid_or_none(self, conn: Conn, name: str) -> int | None:
        try:
            return (await self._topic(conn, name))[0]
        except TopicNotFound:
            return None

    async def _topic_filter(self, conn: Conn, topic: str | None) -> int | None:
        """The tid to filter dead letters by: ``None`` for all, -1 (never a tid) for a topic
        that does not exist, so it matches nothing."""
        if topic is None:
            return None
        tid = await self._tid_or_none(conn, topic)
        return -1 if tid is None else tid

    def _check_open(self) -> None:
        if self._pool is None:
            raise StoreError("the store is not open")
