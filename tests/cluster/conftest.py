"""Cluster fixtures: the real PostgreSQL of ``tests/store`` (``pg_server``, ``pg_dsn``);
``stores``: open ``PostgresStore`` objects on one database, as several proxies would have;
``proxies``: real proxy subprocesses on that database (``proxies.Proxy``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from cproxy.store.postgres import PostgresStore
from tests.cluster.proxies import Proxy
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


ProxyFactory = Callable[..., list[Proxy]]


@pytest.fixture
def proxies(pg_dsn: str, tmp_path: Path) -> Iterator[ProxyFactory]:
    """``proxies("p0", "p1", ...)`` starts them at once and waits until all are ready."""
    started: list[Proxy] = []

    def start(*node_ids: str) -> list[Proxy]:
        batch = [Proxy(tmp_path, pg_dsn, node_id) for node_id in node_ids]
        started.extend(batch)
        for proxy in batch:
            proxy.spawn()
        for proxy in batch:
            proxy.wait_ready()
        return batch

    yield start
    for proxy in started:
        proxy.stop()
