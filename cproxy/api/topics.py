"""Topics (produce is a lean endpoint: ``lean.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from starlette.responses import Response

from cproxy.tokens import Token

from . import wire
from .auth import require
from .deps import BrokerDep
from .routing import CproxyRoute
from .schemas import CreateTopic, UpdateTopic

router = APIRouter(prefix="/v1/topics", tags=["topics"], route_class=CproxyRoute)


@router.post("", summary="Create a topic (idempotent)", status_code=201)
async def create_topic(
    body: CreateTopic,
    request: Request,
    broker: BrokerDep,
    token: Annotated[Token | None, Depends(require("create_topic"))],
) -> Response:
    request.app.state.authorizer.check(token, "create_topic", [body.name])
    retention = None
    if body.model_fields_set & {"retention_ms", "retention_bytes"}:
        retention = (body.retention_ms, body.retention_bytes)
    info, created = await broker.create_topic(body.name, body.queues, retention)
    return wire.json_response(wire.topic(info), 201 if created else 200)


@router.patch(
    "/{topic}",
    summary="Change a topic's retention",
    dependencies=[Depends(require("create_topic"))],
)
async def update_topic(topic: str, body: UpdateTopic, broker: BrokerDep) -> Response:
    info = broker.topic(topic)
    given = body.model_fields_set
    info = await broker.update_topic(
        topic,
        body.retention_ms if "retention_ms" in given else info.retention_ms,
        body.retention_bytes if "retention_bytes" in given else info.retention_bytes,
    )
    return wire.json_response(wire.topic(info))


@router.delete(
    "/{topic}",
    summary="Delete a topic no group reads (admin)",
    dependencies=[Depends(require("delete_topic"))],
)
async def delete_topic(topic: str, broker: BrokerDep) -> Response:
    await broker.delete_topic(topic)
    return wire.json_response({"deleted": topic})


@router.get("", summary="List topics (those in the token's scope)")
async def list_topics(
    request: Request,
    broker: BrokerDep,
    token: Annotated[Token | None, Depends(require("read_topics"))],
) -> Response:
    visible = request.app.state.authorizer.visible_topics(token, broker.list_topics())
    return wire.json_response(wire.topics(visible))


@router.get("/{topic}", summary="Describe a topic", dependencies=[Depends(require("read_topics"))])
async def get_topic(topic: str, broker: BrokerDep) -> Response:
    info = broker.topic(topic)
    return wire.json_response(wire.topic_detail(info, await broker.queue_stats(topic)))


@router.get(
    "/{topic}/messages",
    summary="Read stored messages without any group (no attempt, no hold)",
    dependencies=[Depends(require("read_topics"))],
)
async def browse(
    topic: str,
    broker: BrokerDep,
    qid: Annotated[int | None, Query(ge=0, le=1023)] = None,
    from_offset: Annotated[int | None, Query(alias="from", ge=0, le=2**63 - 1)] = None,
    from_ms: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
    last: Annotated[int | None, Query(ge=1, le=1000)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> Response:
    found = await broker.browse(topic, qid, from_offset, from_ms, last, limit)
    return wire.json_response(wire.browsed(topic, *found))
