"""Cluster fixtures: the real PostgreSQL of ``tests/store`` (``pg_server``, ``pg_dsn``), and
``stores``: open ``PostgresStore`` objects on one database, as several proxies would have."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from cproxy.store.postgres import PostgresStore
from tests.store.conftest import pg_dsn, pg_server

__all__ = ["pg_dsn", "pg_server"]

StoreFactory = Callable[[], Awaitable[PostgresStore]]


@pytest.fixture
async def stores(pg_dsn: str) -> AsyncIterator[StoreFactory]:
    opened: list[PostgresStore] = []

    async def make() -> PostgresStore:
        store = PostgresStore(pg_dsn)
        await store.open()
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.close()
