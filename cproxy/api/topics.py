"""Topics and produce."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from cproxy.config import Limits, Token
from cproxy.errors import InvalidRequest, TooLarge
from cproxy.model import NewMessage

from . import wire
from .auth import require
from .deps import BrokerDep
from .routing import CproxyRoute
from .schemas import CreateTopic, Produce, UpdateTopic

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


def _encode(body: Produce, limits: Limits) -> tuple[list[NewMessage], list[int | None] | None]:
    """The messages to store, and each one's ``delay_ms`` (None when no message has one):
    the broker turns delays into ``deliver_at_ms`` with its clock."""
    if len(body.messages) > limits.max_messages_per_call:
        raise TooLarge(
            f"{len(body.messages)} messages in one call; the limit is "
            f"{limits.max_messages_per_call}"
        )
    items = []
    delays: list[int | None] | None = None
    for i, m in enumerate(body.messages):
        try:
            body_json = orjson.dumps(m.body)
        except orjson.JSONEncodeError as exc:
            raise InvalidRequest(f"messages[{i}].body cannot be stored as JSON: {exc}") from exc
        headers_json = orjson.dumps(m.headers) if m.headers else None
        size = len(body_json) + len(headers_json or b"")
        size += len((m.key or "").encode()) + len((m.id or "").encode())
        if size > limits.max_message_bytes:
            raise TooLarge(
                f"messages[{i}] is {size} bytes; the limit is {limits.max_message_bytes}"
            )
        items.append(NewMessage(m.key, body_json, headers_json, m.id, m.qid, m.deliver_at_ms))
        if m.delay_ms is not None:
            if m.deliver_at_ms is not None:
                raise InvalidRequest(f"messages[{i}] has both delay_ms and deliver_at_ms; give one")
            delays = delays or [None] * len(body.messages)
            delays[i] = m.delay_ms
    return items, delays


@router.post(
    "/{topic}/messages",
    summary="Produce messages (atomic per call)",
    dependencies=[Depends(require("produce"))],
)
async def produce(topic: str, body: Produce, request: Request, broker: BrokerDep) -> Response:
    items, delays = _encode(body, request.app.state.settings.limits)
    results = await broker.produce(topic, items, delays)
    return wire.json_response(wire.produce_results(results))
