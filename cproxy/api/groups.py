"""Consumer groups: config, extend and operator actions (pull and ack: ``lean.py``).

Routes parse the request, call the broker and serialize its answer with ``wire``; rules
(limits, scopes, clocks) live in the broker and the authorizer.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request
from starlette.responses import Response

from cproxy.broker import GroupConfig
from cproxy.config import check_name
from cproxy.errors import InvalidRequest
from cproxy.model import MessageRef
from cproxy.tokens import Token

from . import wire
from .auth import Authorizer, require
from .deps import BrokerDep
from .routing import CproxyRoute
from .schemas import BlockedKeyAction, DeleteDeadLetters, Extend, Redrive, Seek

router = APIRouter(prefix="/v1/groups", tags=["groups"], route_class=CproxyRoute)
UseGroup = Depends(require("use_group"))
#: The token, once it passed the group's check (role, group scope, the group's topics).
GroupToken = Annotated[Token | None, UseGroup]


def _scoped(request: Request, token: Token | None, *named: str | None) -> Authorizer:
    """Refuse (403) topics named in the query or body outside the token's topic scope."""
    authorizer: Authorizer = request.app.state.authorizer
    authorizer.check_topics(token, named)
    return authorizer


@router.get("", summary="List groups (extension)")
async def list_groups(request: Request, broker: BrokerDep) -> Response:
    authorizer: Authorizer = request.app.state.authorizer
    visible = authorizer.visible_groups(request.state.token, broker.list_groups())
    return wire.json_response(wire.group_list(visible))


@router.put("/{group}", summary="Create or update a group")
async def put_group(
    group: str,
    request: Request,
    broker: BrokerDep,
    token: GroupToken,
    body: Annotated[dict[str, Any], Body(examples=[{"topics": {"orders": {"order_by": "key"}}}])],
) -> Response:
    check_name("group", group)
    config = GroupConfig.from_dict(body)
    request.app.state.authorizer.check(token, "use_group", config.topics, group)
    effective, _ = await broker.put_group(group, config)
    return wire.json_response(wire.group_config(group, effective.to_dict()))


@router.get("/{group}", summary="Group config and stats", dependencies=[UseGroup])
async def get_group(group: str, broker: BrokerDep) -> Response:
    return wire.json_response(wire.group_view(await broker.describe_group(group)))


@router.delete(
    "/{group}",
    summary="Delete a group and its progress",
    dependencies=[Depends(require("delete_group"))],
)
async def delete_group(group: str, broker: BrokerDep) -> Response:
    await broker.delete_group(group)
    return wire.json_response({"deleted": group})


@router.post(
    "/{group}/extend",
    summary="Extend the ack deadline of in-flight messages",
)
async def extend(
    group: str, body: Extend, request: Request, broker: BrokerDep, token: GroupToken
) -> Response:
    _scoped(request, token, *(m.topic for m in body.messages))
    refs: list[MessageRef] = [(m.topic, m.qid, m.offset) for m in body.messages]
    attempts = {(m.topic, m.qid, m.offset): m.attempt for m in body.messages if m.attempt}
    outcome = broker.extend(group, refs, body.ack_timeout_ms, attempts or None)
    return wire.json_response(wire.outcome(outcome))


@router.post("/{group}/seek", summary="Move the group's position")
async def seek(
    group: str, body: Seek, request: Request, broker: BrokerDep, token: GroupToken
) -> Response:
    _scoped(request, token, body.topic)
    to = body.to if isinstance(body.to, str | int) else {"timestamp_ms": body.to.timestamp_ms}
    targets = await broker.seek(group, body.topic, body.qid, to)
    return wire.json_response(wire.seek(body.topic, targets))


@router.get("/{group}/dead-letters", summary="List dead letters (of topics in the token's scope)")
async def dead_letters(
    group: str,
    request: Request,
    broker: BrokerDep,
    token: GroupToken,
    topic: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> Response:
    # A group keeps dead letters of topics it no longer reads: filter by each one's topic.
    within = _scoped(request, token, topic).topic_scope(token)
    rows = await broker.dead_letters(group, topic, limit, within)
    return wire.json_response(wire.dead_letters(rows))


@router.post("/{group}/dead-letters/redrive", summary="Deliver dead letters again")
async def redrive(
    group: str,
    request: Request,
    broker: BrokerDep,
    token: GroupToken,
    body: Annotated[Redrive | None, Body()] = None,
) -> Response:
    topic = body.topic if body else None
    named = None if body is None or body.messages is None else body.messages
    within = _scoped(request, token, topic, *(m.topic for m in named or ())).topic_scope(token)
    refs = None if named is None else [(m.topic, m.qid, m.offset) for m in named]
    count = await broker.redrive(group, topic, within, refs)
    return wire.json_response({"redriven": count})


@router.delete("/{group}/dead-letters", summary="Delete the named dead letters, or a topic's")
async def delete_dead_letters(
    group: str,
    request: Request,
    broker: BrokerDep,
    token: GroupToken,
    topic: str | None = None,
    body: Annotated[DeleteDeadLetters | None, Body()] = None,
) -> Response:
    named = [] if body is None else body.messages
    within = _scoped(request, token, topic, *(m.topic for m in named)).topic_scope(token)
    refs = None if body is None else [(m.topic, m.qid, m.offset) for m in named]
    count = await broker.delete_dead_letters(group, topic, refs, within)
    return wire.json_response({"deleted": count})


@router.get(
    "/{group}/blocked-keys",
    summary="Stuck order values (failed, exhausted, or in flight past stuck_after_ms)",
)
async def blocked_keys(
    group: str,
    request: Request,
    broker: BrokerDep,
    token: GroupToken,
    topic: str | None = None,
    min_blocked_ms: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
) -> Response:
    _scoped(request, token, topic)
    rows = broker.blocked_keys(group, topic, min_blocked_ms, limit)
    return wire.json_response(wire.blocked_keys(rows))


def _target(body: BlockedKeyAction) -> tuple[str | None, MessageRef | None]:
    if body.order_value is not None:
        return body.order_value, None
    if body.qid is None or body.offset is None:
        raise InvalidRequest("name the head by 'order_value', or by 'qid' and 'offset'")
    return None, (body.topic, body.qid, body.offset)


@router.post("/{group}/blocked-keys/skip", summary="Dead-letter a blocked head")
async def skip(
    group: str, body: BlockedKeyAction, request: Request, broker: BrokerDep, token: GroupToken
) -> Response:
    _scoped(request, token, body.topic)
    value, ref = _target(body)
    return wire.json_response(wire.ref("skipped", broker.skip(group, body.topic, value, ref)))


@router.post(
    "/{group}/blocked-keys/release",
    summary="Retry a blocked head now with a fresh attempt budget",
)
async def release(
    group: str, body: BlockedKeyAction, request: Request, broker: BrokerDep, token: GroupToken
) -> Response:
    _scoped(request, token, body.topic)
    value, ref = _target(body)
    return wire.json_response(wire.ref("released", broker.release(group, body.topic, value, ref)))
