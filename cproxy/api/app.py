"""The FastAPI application: wiring only (settings, store, broker, routers, errors)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from cproxy import __version__
from cproxy.broker import Broker
from cproxy.config import Settings
from cproxy.metrics import Metrics
from cproxy.store.base import Store

from . import cluster, errors, groups, health, lean, openapi, topics, ui
from .auth import Authorizer
from .limits import BodyLimit

logger = logging.getLogger(__name__)


class CproxyApp(FastAPI):
    """FastAPI, with the hot calls (``lean.match``: produce, pull, ack) sent straight to
    their lean endpoints, past the middleware stack and the router: those endpoints
    authenticate, limit the body size and render errors themselves (``lean.py``)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            found = lean.match(scope)
            if found is not None:
                endpoint, params = found
                scope["app"] = self
                scope["path_params"] = params
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(settings: Settings, store: Store | None = None) -> CproxyApp:
    """Build the app; the store defaults to SQLite under ``settings.data_dir``, or PostgreSQL
    in a cluster when ``settings.store_url`` is set."""
    if store is None and settings.store_url is not None:
        from cproxy.store.postgres import PostgresStore

        store = PostgresStore(settings.store_url)
    if store is None:
        from cproxy.store.sqlite import SqliteStore

        store = SqliteStore(settings.data_dir, synchronous=settings.sqlite_synchronous)
    metrics = Metrics()
    broker = Broker(
        store,
        settings,
        ack_latency_for=metrics.ack_latency_observer,
        on_produced=metrics.on_produced,
        on_pull=metrics.observe_pull,
    )
    metrics.attach(broker)
    node = None
    if settings.store_url is not None:
        from cproxy.cluster.node import ClusterNode
        from cproxy.store.postgres import PostgresStore

        assert isinstance(store, PostgresStore)
        node = ClusterNode(settings.cluster_settings(), store, broker)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with anyio.create_task_group() as task_group:
            await broker.start(task_group)
            if node is not None:
                await node.start(task_group)
            try:
                yield
            finally:
                if node is not None:
                    await node.leave()  # hands owned queues over (a no-op after a SIGTERM's)
                await broker.stop()
                task_group.cancel_scope.cancel()

    app = CproxyApp(
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
    # First in the router: other methods on these paths get their 405 without a search.
    app.router.routes[:0] = lean.ROUTES
    app.include_router(topics.router)
    app.include_router(groups.router)
    app.include_router(cluster.router)
    app.include_router(health.router)
    app.include_router(ui.router)
    openapi.install(app)
    app.add_middleware(BodyLimit, max_bytes=settings.limits.max_request_bytes)
    return app
