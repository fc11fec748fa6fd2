"""The FastAPI application: wiring only (settings, store, broker, the routes, errors)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI

from cproxy import __version__
from cproxy.access import Authorizer
from cproxy.broker import Broker
from cproxy.config import Settings
from cproxy.metrics import Metrics
from cproxy.store.base import Store

from . import cluster, errors, groups, health, openapi, topics, ui
from .endpoint import Endpoint, route

logger = logging.getLogger(__name__)


#: Every route, in the order the router searches them (each module lists its hot calls
#: first: produce, pull, ack and extend are found after a match or two).
ENDPOINTS: list[Endpoint] = [
    *topics.ENDPOINTS,
    *groups.ENDPOINTS,
    *cluster.ENDPOINTS,
    *health.ENDPOINTS,
    *ui.ENDPOINTS,
]


def create_app(settings: Settings, store: Store | None = None) -> FastAPI:
    """Build the app; the store defaults to SQLite under ``settings.data_dir``, or PostgreSQL
    in a cluster when ``settings.store_url`` is set."""
    if store is None and settings.store_url is not None:
        from cproxy.store.postgres import PostgresStore

        store = PostgresStore(settings.store_url)
    if store is None:
        from cproxy.store.sqlite import SqliteStore

        store = SqliteStore(settings.data_dir, synchronous=settings.sqlite_synchronous)
    metrics = Metrics()
    node = None
    if settings.store_url is not None:
        from cproxy.cluster.node import ClusterNode
        from cproxy.store.postgres import PostgresStore

        assert isinstance(store, PostgresStore)
        node = ClusterNode(settings.cluster_settings(), store)
    broker = Broker(
        store,
        settings,
        ack_latency_for=metrics.ack_latency_observer,
        on_produced=metrics.on_produced,
        on_pull=metrics.observe_pull,
        cluster=node,
    )
    metrics.attach(broker)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with anyio.create_task_group() as task_group:
            await broker.start(task_group)
            if node is not None:
                await node.start(broker, task_group)
            try:
                yield
            finally:
                if node is not None:
                    await node.leave()  # hands owned queues over (a no-op after a SIGTERM's)
                await broker.stop()
                task_group.cancel_scope.cancel()

    app = FastAPI(
        title="cproxy",
        version=__version__,
        summary="Ordered delivery per key without head-of-line blocking",
        lifespan=lifespan,
        docs_url=None,  # served by openapi.install with bundled assets (no CDN)
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.broker = broker
    app.state.metrics = metrics
    app.state.cluster = node
    app.state.authorizer = Authorizer(settings)
    errors.install(app)
    # The one router: each endpoint runs the one prologue itself (endpoint.py), so there is
    # no middleware of ours and no FastAPI route (FastAPI keeps the app, /docs, OpenAPI).
    app.router.routes[:0] = [route(e) for e in ENDPOINTS]
    openapi.install(app, ENDPOINTS)
    return app
