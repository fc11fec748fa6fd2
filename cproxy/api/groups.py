"""Consumer groups: the consumer's calls (pull, ack, extend), config and operator actions.

Each handler gets its request past the one prologue (``endpoint.py``: size, token, media
type, body, the path's group), checks the topics its body names, calls the broker and
answers with ``wire``'s shapes; rules (limits, scopes, clocks) live in the broker and the
authorizer. A new route is a handler plus one ``Endpoint`` line in ``ENDPOINTS``.
"""

from __future__ import annotations

from typing import Any

import orjson

from cproxy.broker import GroupConfig, Output
from cproxy.config import check_name
from cproxy.errors import InvalidRequest
from cproxy.model import MessageRef

from . import answers as a
from . import items, wire
from .bodies import (
    Ack,
    BlockedKeyAction,
    BlockedKeysQuery,
    DeadLetterQuery,
    DeleteDeadLetters,
    Extend,
    GroupSettings,
    OutTopic,
    Pull,
    Redrive,
    Replay,
    Seek,
    TopicQuery,
)
from .endpoint import Call, Endpoint
from .produced import check_count, new_messages


# -- the consumer's calls (hot: as little work as the checks allow) -----------------------------
async def pull(call: Call[Pull, None]) -> bytes:
    body = call.body
    call.check_topics([*(body.topics or ()), *(r.topic for r in body.results)])
    answer = await call.broker.pull(
        call.params["group"],
        body.max_messages,
        body.wait_ms,
        body.topics,
        items.results(body.results),
        body.max_per_key,
        gone=call.watch_gone,
        consumer=body.consumer or call.peer,
    )
    return wire.pull_answer(answer, runs=body.max_per_key > 1)


async def ack(call: Call[Ack, None]) -> bytes:
    call.check_topics([r.topic for r in call.body.results])
    if call.body.produce is not None:
        return await _ack_produce(call, call.body.produce)
    outcome = call.broker.ack(call.params["group"], items.results(call.body.results))
    return orjson.dumps(wire.outcome(outcome))


async def _ack_produce(call: Call[Ack, None], produce: list[OutTopic]) -> bytes:
    """An ack with outputs (guarantee 10): produce rights on every output topic, and the
    produce call's limits over all of its messages together."""
    for out in produce:
        call.authorizer.check(call.token, "produce", [out.topic])
    limits = call.state.settings.limits
    check_count(sum(len(out.messages) for out in produce), limits)
    outputs = [Output(out.topic, new_messages(out.messages, limits, call.raw)) for out in produce]
    results = items.results(call.body.results)
    outcome, stored = await call.broker.ack_with_outputs(call.params["group"], results, outputs)
    return wire.ack_produced(outcome, [out.topic for out in outputs], stored)


async def extend(call: Call[Extend, None]) -> bytes:
    messages = call.body.messages
    call.check_topics([m.topic for m in messages])
    refs: list[MessageRef] = [(m.topic, m.qid, m.offset) for m in messages]
    attempts = {(m.topic, m.qid, m.offset): m.attempt for m in messages if m.attempt}
    outcome = call.broker.extend(
        call.params["group"], refs, call.body.ack_timeout_ms, attempts or None
    )
    return orjson.dumps(wire.outcome(outcome))


# -- config --------------------------------------------------------------------------------------
async def list_groups(call: Call[None, None]) -> bytes:
    visible = call.authorizer.visible_groups(call.token, call.broker.list_groups())
    return orjson.dumps(wire.group_list(visible))


async def put_group(call: Call[dict[str, Any], None]) -> bytes:
    group = check_name("group", call.params["group"])
    config = GroupConfig.from_dict(call.body)
    call.authorizer.check(call.token, "use_group", config.topics, group)
    privileged = call.authorizer.may_push_anywhere(call.token)
    effective, _ = await call.broker.put_group(group, config, privileged=privileged)
    return orjson.dumps(wire.group_config(group, effective.to_dict()))


async def get_group(call: Call[None, None]) -> bytes:
    return orjson.dumps(wire.group_view(await call.broker.describe_group(call.params["group"])))


async def delete_group(call: Call[None, None]) -> bytes:
    await call.broker.delete_group(call.params["group"])
    return orjson.dumps({"deleted": call.params["group"]})


# -- operator actions ----------------------------------------------------------------------------
async def seek(call: Call[Seek, None]) -> bytes:
    body = call.body
    call.check_topics([body.topic])
    to = body.to if isinstance(body.to, str | int) else {"timestamp_ms": body.to.timestamp_ms}
    targets = await call.broker.operator.seek(call.params["group"], body.topic, body.qid, to)
    return orjson.dumps(wire.seek(body.topic, targets))


async def replay(call: Call[Replay, None]) -> bytes:
    body = call.body
    call.check_topics([body.topic])
    start = (
        body.from_
        if isinstance(body.from_, str | int)
        else {"timestamp_ms": body.from_.timestamp_ms}
    )
    replaying, lost = await call.broker.operator.replay(
        call.params["group"], body.topic, body.order_value, start
    )
    return orjson.dumps(wire.replay(replaying, lost))


async def dead_letters(call: Call[None, DeadLetterQuery]) -> bytes:
    topic = call.query.topic
    call.check_topics([topic])
    # A group keeps dead letters of topics it no longer reads: filter by each one's topic.
    within = call.authorizer.topic_scope(call.token)
    rows = await call.broker.operator.dead_letters(
        call.params["group"], topic, call.query.limit, within
    )
    return orjson.dumps(wire.dead_letters(rows))


async def redrive(call: Call[Redrive | None, None]) -> bytes:
    topic = call.body.topic if call.body is not None else None
    named = call.body.messages if call.body is not None else None
    call.check_topics([topic, *(m.topic for m in named or ())])
    within = call.authorizer.topic_scope(call.token)
    refs = None if named is None else [(m.topic, m.qid, m.offset) for m in named]
    count = await call.broker.operator.redrive(call.params["group"], topic, within, refs)
    return orjson.dumps({"redriven": count})


async def delete_dead_letters(call: Call[DeleteDeadLetters | None, TopicQuery]) -> bytes:
    topic = call.query.topic
    named = call.body.messages if call.body is not None else []
    call.check_topics([topic, *(m.topic for m in named)])
    within = call.authorizer.topic_scope(call.token)
    refs = None if call.body is None else [(m.topic, m.qid, m.offset) for m in named]
    count = await call.broker.operator.delete_dead_letters(
        call.params["group"], topic, refs, within
    )
    return orjson.dumps({"deleted": count})


async def blocked_keys(call: Call[None, BlockedKeysQuery]) -> bytes:
    q = call.query
    call.check_topics([q.topic])
    rows = call.broker.operator.blocked_keys(
        call.params["group"], q.topic, q.min_blocked_ms, q.limit
    )
    return orjson.dumps(wire.blocked_keys(rows))


def _target(body: BlockedKeyAction) -> tuple[str | None, MessageRef | None]:
    if body.order_value is not None:
        return body.order_value, None
    if body.qid is None or body.offset is None:
        raise InvalidRequest("name the head by 'order_value', or by 'qid' and 'offset'")
    return None, (body.topic, body.qid, body.offset)


async def skip(call: Call[BlockedKeyAction, None]) -> bytes:
    call.check_topics([call.body.topic])
    value, ref = _target(call.body)
    skipped = call.broker.operator.skip(call.params["group"], call.body.topic, value, ref)
    return orjson.dumps(wire.ref("skipped", skipped))


async def release(call: Call[BlockedKeyAction, None]) -> bytes:
    call.check_topics([call.body.topic])
    value, ref = _target(call.body)
    released = call.broker.operator.release(call.params["group"], call.body.topic, value, ref)
    return orjson.dumps(wire.ref("released", released))


G = "/v1/groups/{group}"
ENDPOINTS = [
    # The consumer's calls first: the route table is searched in this order.
    Endpoint("POST", f"{G}/pull", pull, action="use_group", body=Pull,
             summary="Apply results, then pull (long poll)", answers={200: a.PullAnswer},
             errors=(404,)),
    Endpoint("POST", f"{G}/ack", ack, action="use_group", body=Ack,
             summary="Apply acks and fails; with produce, store outputs in the same transaction",
             answers={200: a.AckOutcome}, errors=(404, 409)),
    Endpoint("POST", f"{G}/extend", extend, action="use_group", body=Extend,
             summary="Extend the ack deadline of in-flight messages",
             answers={200: a.ResultsOutcome}, errors=(404,)),
    # Any token may list (``read_topics``: every role); the list is filtered.
    Endpoint("GET", "/v1/groups", list_groups, action="read_topics",
             summary="List groups (extension)", answers={200: a.GroupList}),
    Endpoint("PUT", G, put_group, action="use_group", body=GroupSettings,
             summary="Create or update a group", answers={200: a.GroupConfigOut},
             errors=(404,)),
    Endpoint("GET", G, get_group, action="use_group", summary="Group config and stats",
             answers={200: a.GroupOut}, errors=(404,)),
    Endpoint("DELETE", G, delete_group, action="delete_group",
             summary="Delete a group and its progress", answers={200: a.Deleted},
             errors=(404,)),
    Endpoint("POST", f"{G}/seek", seek, action="use_group", body=Seek,
             summary="Move the group's position", answers={200: a.SeekAnswer}, errors=(404,)),
    Endpoint("POST", f"{G}/replay", replay, action="use_group", body=Replay,
             summary="Deliver one order value's finished messages again",
             answers={200: a.ReplayAnswer}, errors=(404, 409)),
    Endpoint("GET", f"{G}/dead-letters", dead_letters, action="use_group",
             query=DeadLetterQuery, summary="List dead letters (of topics in the token's scope)",
             answers={200: a.DeadLetterList}, errors=(404,)),
    Endpoint("POST", f"{G}/dead-letters/redrive", redrive, action="use_group", body=Redrive,
             optional_body=True, summary="Deliver dead letters again",
             answers={200: a.Redriven}, errors=(404,)),
    Endpoint("DELETE", f"{G}/dead-letters", delete_dead_letters, action="use_group",
             body=DeleteDeadLetters, optional_body=True, query=TopicQuery,
             summary="Delete the named dead letters, or a topic's",
             answers={200: a.DeadLettersDeleted}, errors=(404,)),
    Endpoint("GET", f"{G}/blocked-keys", blocked_keys, action="use_group",
             query=BlockedKeysQuery,
             summary="Stuck order values (failed, exhausted, in flight past stuck_after_ms)",
             answers={200: a.BlockedKeyList}, errors=(404,)),
    Endpoint("POST", f"{G}/blocked-keys/skip", skip, action="use_group", body=BlockedKeyAction,
             summary="Dead-letter a blocked head", answers={200: a.Skipped}, errors=(404, 409)),
    Endpoint("POST", f"{G}/blocked-keys/release", release, action="use_group",
             body=BlockedKeyAction, summary="Retry a blocked head now with a fresh attempt budget",
             answers={200: a.Released}, errors=(404, 409)),
]  # fmt: skip
