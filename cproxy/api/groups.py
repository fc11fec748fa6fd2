"""Consumer groups: config, pull/ack/extend and operator actions."""

from __future__ import annotations

import time
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Body, Depends, Query, Request
from starlette.responses import Response

from cproxy.config import GROUP_NAME, Token
from cproxy.engine import operations
from cproxy.engine.config import GroupConfig
from cproxy.engine.records import Result
from cproxy.errors import InvalidRequest

from .auth import require
from .deps import BrokerDep
from .responses import json_response, message_json, refs_json
from .routing import CproxyRoute
from .schemas import Ack, BlockedKeyAction, Extend, Pull, QueueResults, Redrive, Seek

router = APIRouter(prefix="/v1/groups", tags=["groups"], route_class=CproxyRoute)
UseGroup = Depends(require("use_group"))


def _results(items: list[QueueResults]) -> list[Result]:
    return [
        Result(
            r.topic,
            r.qid,
            r.acks,
            [(f, None) if isinstance(f, int) else (f.offset, f.error) for f in r.fails],
        )
        for r in items
    ]


@router.get("", summary="List groups (extension)")
async def list_groups(request: Request, broker: BrokerDep) -> Response:
    token = request.state.token
    names = sorted(broker.groups)
    if token is not None and token.role != "admin":
        names = [n for n in names if token.groups is None or n in token.groups]
    return json_response(
        {
            "groups": [
                {"name": n, "topics": sorted(broker.groups[n].engine.config.topics)} for n in names
            ]
        }
    )


@router.put("/{group}", summary="Create or update a group")
async def put_group(
    group: str,
    request: Request,
    broker: BrokerDep,
    token: Annotated[Token | None, UseGroup],
    body: Annotated[dict[str, Any], Body(examples=[{"topics": {"orders": {"order_by": "key"}}}])],
) -> Response:
    if not GROUP_NAME.match(group):
        raise InvalidRequest(f"group name must match {GROUP_NAME.pattern}")
    config = GroupConfig.from_dict(body)
    request.app.state.authorizer.check(token, "use_group", config.topics, group)
    effective, _ = await broker.put_group(group, config)
    return json_response({"name": group, **effective.to_dict()})


@router.get("/{group}", summary="Group config and stats", dependencies=[UseGroup])
async def get_group(group: str, broker: BrokerDep) -> Response:
    described = broker.describe_group(group)
    return json_response({"name": group, **described["config"], "stats": described["stats"]})


@router.delete(
    "/{group}",
    summary="Delete a group and its progress",
    dependencies=[Depends(require("delete_group"))],
)
async def delete_group(group: str, broker: BrokerDep) -> Response:
    await broker.delete_group(group)
    return json_response({"deleted": group})


@router.post(
    "/{group}/pull", summary="Apply results, then pull (long poll)", dependencies=[UseGroup]
)
async def pull(group: str, body: Pull, request: Request, broker: BrokerDep) -> Response:
    limits = request.app.state.settings.limits
    if body.max_messages > limits.max_pull_messages:
        raise InvalidRequest(f"max_messages must be at most {limits.max_pull_messages}")
    if body.wait_ms > limits.max_wait_ms:
        raise InvalidRequest(f"wait_ms must be at most {limits.max_wait_ms}")
    runner = broker.group(group)
    if body.topics is not None:
        unknown = [t for t in body.topics if t not in runner.engine.config.topics]
        if unknown:
            raise InvalidRequest(f"group {group!r} does not read topic(s) {unknown}")
    started = time.perf_counter()
    result = await runner.pull(body.max_messages, body.wait_ms, body.topics, _results(body.results))
    request.app.state.metrics.observe_pull(group, time.perf_counter() - started)
    return json_response(
        {
            "messages": [message_json(e) for e in result.entries],
            "results": {"applied": result.applied, "unknown": refs_json(result.unknown)},
        }
    )


@router.post("/{group}/ack", summary="Apply acks and fails", dependencies=[UseGroup])
async def ack(group: str, body: Ack, broker: BrokerDep) -> Response:
    applied, unknown = broker.group(group).apply(_results(body.results))
    return json_response({"applied": applied, "unknown": refs_json(unknown)})


@router.post(
    "/{group}/extend",
    summary="Extend the ack deadline of in-flight messages",
    dependencies=[UseGroup],
)
async def extend(group: str, body: Extend, broker: BrokerDep) -> Response:
    refs = [(m.topic, m.qid, m.offset) for m in body.messages]
    applied, unknown = broker.group(group).extend(refs, body.ack_timeout_ms)
    return json_response({"applied": applied, "unknown": refs_json(unknown)})


@router.post("/{group}/seek", summary="Move the group's position", dependencies=[UseGroup])
async def seek(group: str, body: Seek, broker: BrokerDep) -> Response:
    to = body.to if isinstance(body.to, str | int) else {"timestamp_ms": body.to.timestamp_ms}
    targets = await broker.seek(group, body.topic, body.qid, to)
    return json_response(
        {
            "topic": body.topic,
            "offsets": [{"qid": q, "offset": o} for q, o in sorted(targets.items())],
        }
    )


@router.get("/{group}/dead-letters", summary="List dead letters", dependencies=[UseGroup])
async def dead_letters(
    group: str,
    broker: BrokerDep,
    topic: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> Response:
    rows = await broker.dead_letters(group, topic, limit)
    return json_response(
        {
            "dead_letters": [
                {
                    "topic": d.message.topic,
                    "qid": d.message.qid,
                    "offset": d.message.offset,
                    "key": d.message.key,
                    "id": d.message.id,
                    "body": _fragment(d.message.body_json),
                    "headers": _fragment(d.message.headers_json or b"null"),
                    "produced_at_ms": d.message.produced_at_ms,
                    "attempts": d.attempts,
                    "last_error": d.last_error,
                    "dead_lettered_at_ms": d.dead_lettered_at_ms,
                }
                for d in rows
            ]
        }
    )


def _fragment(raw: bytes) -> Any:
    return orjson.Fragment(raw)


@router.post(
    "/{group}/dead-letters/redrive", summary="Deliver dead letters again", dependencies=[UseGroup]
)
async def redrive(
    group: str, broker: BrokerDep, body: Annotated[Redrive | None, Body()] = None
) -> Response:
    count = await broker.group(group).redrive(body.topic if body else None)
    return json_response({"redriven": count})


@router.get(
    "/{group}/blocked-keys",
    summary="Order values whose head is not acked yet",
    dependencies=[UseGroup],
)
async def blocked_keys(
    group: str,
    broker: BrokerDep,
    topic: str | None = None,
    min_blocked_ms: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
) -> Response:
    runner = broker.group(group)
    cutoff = time.time_ns() // 1_000_000 - min_blocked_ms
    rows = [
        r for r in operations.blocked_keys(runner.engine, topic) if r.blocked_since_ms <= cutoff
    ]
    return json_response({"blocked_keys": [r.to_dict() for r in rows[:limit]]})


def _target(body: BlockedKeyAction) -> tuple[str | None, tuple[str, int, int] | None]:
    if body.order_value is not None:
        return body.order_value, None
    if body.qid is None or body.offset is None:
        raise InvalidRequest("name the head by 'order_value', or by 'qid' and 'offset'")
    return None, (body.topic, body.qid, body.offset)


@router.post(
    "/{group}/blocked-keys/skip", summary="Dead-letter a blocked head", dependencies=[UseGroup]
)
async def skip(group: str, body: BlockedKeyAction, broker: BrokerDep) -> Response:
    value, ref = _target(body)
    t, q, o = broker.group(group).skip(body.topic, value, ref)
    return json_response({"skipped": {"topic": t, "qid": q, "offset": o}})


@router.post(
    "/{group}/blocked-keys/release",
    summary="Retry a blocked head now with a fresh attempt budget",
    dependencies=[UseGroup],
)
async def release(group: str, body: BlockedKeyAction, broker: BrokerDep) -> Response:
    value, ref = _target(body)
    t, q, o = broker.group(group).release(body.topic, value, ref)
    return json_response({"released": {"topic": t, "qid": q, "offset": o}})
