"""``cproxy serve``: run the service in this process until SIGINT/SIGTERM."""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

from cproxy.config import Settings
from cproxy.logs import configure_logging

logger = logging.getLogger("cproxy")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(settings: Settings) -> None:
    """Run the service until SIGINT/SIGTERM; shutdown persists every group's progress."""
    import uvicorn

    from cproxy.api.app import create_app

    configure_logging(settings.log_level, settings.log_format)
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
    logger.info(
        "serving on %s://%s:%d with data in %s",
        "https" if settings.tls_enabled else "http",
        settings.host,
        settings.port,
        settings.data_dir.resolve(),
    )
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        loop="auto",
        http="auto",
        lifespan="on",
        timeout_graceful_shutdown=5,
        # uvicorn's own TLS: None for both serves plain HTTP.
        ssl_certfile=settings.tls_cert,
        ssl_keyfile=settings.tls_key,
    )
    server = uvicorn.Server(config)
    broker = app.state.broker
    original = server.handle_exit

    def handle_exit(sig: int, frame: Any) -> None:
        # Stop taking pulls now, so long polls do not hold up the shutdown.
        broker.begin_shutdown()
        original(sig, frame)

    server.handle_exit = handle_exit  # type: ignore[method-assign]
    server.run()
