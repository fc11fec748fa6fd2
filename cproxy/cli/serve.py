"""``cproxy serve``: run the service in this process until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import logging
import socket
from typing import Any

from cproxy import _native
from cproxy.config import Settings
from cproxy.errors import CproxyError
from cproxy.logs import configure_logging

logger = logging.getLogger("cproxy")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: The garbage collector's thresholds in a serving process: the youngest generation is
#: collected after 50,000 net allocations instead of Python's 700 (older ones as by default).
#: Measured with 5,000 open long polls and 100 msgs/s (``benchmarks.longpoll``): with the
#: default, young collections ran every few milliseconds and some took 40-240 ms (delivery
#: p99 143-292 ms); with this, delivery p99 2.2-2.7 ms, as with the collector off, and 15-20 %
#: less CPU. Cyclic garbage is still collected, a little later; reference counting frees the
#: rest at once as always.
GC_THRESHOLDS = (50_000, 10, 10)


def tune_gc() -> None:
    """Set ``GC_THRESHOLDS`` for this process (see there)."""
    gc.set_threshold(*GC_THRESHOLDS)


def freeze_startup_objects() -> None:
    """Move every object alive now (modules, the app, its routes and schemas: ~65k) out of the
    collector's sight for good. A full collection otherwise walks them all every time, 10-30
    ms with the server stalled, which showed as the latency tail at high rates."""
    gc.collect()
    gc.freeze()


def require_store_driver(settings: Settings) -> None:
    """PostgreSQL needs the optional driver: without it, one line naming the extra (exit 1)
    instead of an import traceback from inside the app."""
    if settings.store_url is None:
        return
    try:
        import asyncpg  # noqa: F401 (only checked)
    except ImportError:
        raise SystemExit(
            "cproxy: error: the PostgreSQL store needs its driver: "
            "pip install 'cproxy-ordered[postgres]'"
        ) from None


def serve(settings: Settings) -> None:
    """Run the service until SIGINT/SIGTERM; shutdown persists every group's progress."""
    import uvicorn

    from cproxy.api.app import create_app
    from cproxy.api.lean_http import protocol_for

    require_store_driver(settings)  # before anything else is printed: the one line
    configure_logging(settings.log_level, settings.log_format)
    tune_gc()
    if not settings.auth_enabled:
        if _is_loopback(settings.host):
            logger.warning(
                "no tokens configured: auth is off; serving on loopback %s only", settings.host
            )
        else:
            logger.warning(
                "no tokens configured: auth is OFF and %s is reachable from the "
                "network; declare [[tokens]] in the config file",
                settings.host,
            )
    # Fail fast, with one line, on what would otherwise surface only after start-up (a
    # traceback from the app's lifespan, or a bind error after the store was opened).
    if settings.store_url is None:
        try:
            from cproxy.store.sqlite import check_data_dir

            check_data_dir(settings.data_dir)
        except CproxyError as exc:
            raise SystemExit(f"cproxy: error: {exc.message}") from None
    listener = _listen(settings.host, settings.port)
    logger.info(
        "serving on %s://%s:%d with data in %s; hot path %s",
        "https" if settings.tls_enabled else "http",
        settings.host,
        settings.port,
        settings.data_dir.resolve() if settings.store_url is None else "PostgreSQL",
        _native.status(),
    )
    app = create_app(settings)
    freeze_startup_objects()
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        # No wrapper per request for X-Forwarded-* (nothing reads the client address) and
        # no "server: uvicorn" header on every answer: both cost CPU on every call.
        proxy_headers=False,
        server_header=False,
        loop="auto",
        http=protocol_for(app),
        lifespan="on",
        timeout_graceful_shutdown=5,
        # uvicorn's own TLS: None for both serves plain HTTP.
        ssl_certfile=settings.tls_cert,
        ssl_keyfile=settings.tls_key,
    )
    server = uvicorn.Server(config)
    broker = app.state.broker
    original = server.handle_exit

    node = app.state.cluster
    leaving: list[asyncio.Task[None]] = []

    def handle_exit(sig: int, frame: Any) -> None:
        if node is not None and not leaving:
            # Cluster: hand the owned queues over while still serving HTTP, so consumers can
            # answer what they hold (nothing is delivered twice); then shut down as usual.
            async def leave_then_exit() -> None:
                try:
                    await node.leave()
                finally:
                    broker.begin_shutdown()
                    original(sig, frame)

            loop = asyncio.get_running_loop()
            leaving.append(loop.create_task(leave_then_exit()))
            return
        # Stop taking pulls now, so long polls do not hold up the shutdown.
        broker.begin_shutdown()
        original(sig, frame)

    server.handle_exit = handle_exit  # type: ignore[method-assign]
    with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C during shutdown
        server.run(sockets=[listener])


def _listen(host: str, port: int) -> socket.socket:
    """Bind the listening socket before anything starts; one clear line if that fails."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"cproxy: error: cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock
