"""Liveness, readiness and metrics (never behind auth: probes and scrapers have no token)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from .deps import BrokerDep
from .wire import json_response

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is alive")
async def healthz() -> Response:
    return json_response({"status": "ok"})


@router.get("/readyz", summary="The broker takes work and the store takes writes")
async def readyz(broker: BrokerDep) -> Response:
    """200 ``{"status": "ready"}``, or 503 ``{"status": "unavailable"}`` while shutting down,
    when the store's write probe fails (read-only database, full disk) or shortly after an
    append failed (see ``Broker.ready``)."""
    if await broker.ready():
        return json_response({"status": "ready"})
    return json_response({"status": "unavailable"}, 503)


@router.get("/metrics", summary="Prometheus metrics")
async def metrics(request: Request) -> Response:
    return Response(
        request.app.state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
    )
