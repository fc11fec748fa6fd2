"""Liveness, readiness and metrics: public endpoints (no token: probes and scrapers have none),
otherwise on the same request path as every route."""

from __future__ import annotations

from . import answers as a
from .endpoint import Call, Endpoint
from .errors import Reply, json_reply, reply


async def healthz(call: Call[None, None]) -> bytes:
    return b'{"status":"ok"}'


async def readyz(call: Call[None, None]) -> Reply:
    """200 ``{"status": "ready"}``, or 503 ``{"status": "unavailable"}`` while shutting down,
    when the store's write probe fails (read-only database, full disk) or shortly after an
    append failed (see ``Broker.ready``)."""
    if await call.broker.ready():
        return json_reply({"status": "ready"})
    return json_reply({"status": "unavailable"}, 503)


async def metrics(call: Call[None, None]) -> Reply:
    text: bytes = call.state.metrics.render()
    return reply(text, 200, PROMETHEUS)


PROMETHEUS = b"text/plain; version=0.0.4; charset=utf-8"
ENDPOINTS = [
    Endpoint("GET", "/healthz", healthz, action=None, summary="The process is alive",
             answers={200: a.Status}),
    Endpoint("GET", "/readyz", readyz, action=None,
             summary="The broker takes work and the store takes writes",
             answers={200: a.Status, 503: a.Status}),
    Endpoint("GET", "/metrics", metrics, action=None, summary="Prometheus metrics",
             answers={200: str}, content_type="text/plain"),
]  # fmt: skip
