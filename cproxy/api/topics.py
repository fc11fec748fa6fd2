"""Topics and produce."""

from __future__ import annotations

import orjson
from msgspec import UNSET

from cproxy.config import check_name

from . import answers as a
from . import wire
from .bodies import BrowseQuery, CreateTopic, Produce, UpdateTopic
from .endpoint import Call, Endpoint
from .errors import Reply, json_reply
from .produced import check_count, new_messages


async def produce(call: Call[Produce, None]) -> bytes:
    limits = call.state.settings.limits
    check_count(len(call.body.messages), limits)
    messages = new_messages(call.body.messages, limits, call.raw)
    stored = await call.broker.produce(call.params["topic"], messages)
    return wire.produce_answer(stored)


async def create_topic(call: Call[CreateTopic, None]) -> Reply:
    body = call.body
    check_name("topic", body.name)
    call.authorizer.check(call.token, "create_topic", [body.name])
    retention = None
    if body.retention_ms is not UNSET or body.retention_bytes is not UNSET:
        retention = (
            None if body.retention_ms is UNSET else body.retention_ms,
            None if body.retention_bytes is UNSET else body.retention_bytes,
        )
    info, created = await call.broker.create_topic(body.name, body.queues, retention)
    return json_reply(wire.topic(info), 201 if created else 200)


async def update_topic(call: Call[UpdateTopic, None]) -> bytes:
    topic = call.params["topic"]
    info = call.broker.topic(topic)
    body = call.body
    info = await call.broker.update_topic(
        topic,
        info.retention_ms if body.retention_ms is UNSET else body.retention_ms,
        info.retention_bytes if body.retention_bytes is UNSET else body.retention_bytes,
    )
    return orjson.dumps(wire.topic(info))


async def delete_topic(call: Call[None, None]) -> bytes:
    await call.broker.delete_topic(call.params["topic"])
    return orjson.dumps({"deleted": call.params["topic"]})


async def list_topics(call: Call[None, None]) -> bytes:
    visible = call.authorizer.visible_topics(call.token, call.broker.list_topics())
    return orjson.dumps(wire.topics(visible))


async def get_topic(call: Call[None, None]) -> bytes:
    topic = call.params["topic"]
    info = call.broker.topic(topic)
    return orjson.dumps(wire.topic_detail(info, await call.broker.queue_stats(topic)))


async def browse(call: Call[None, BrowseQuery]) -> bytes:
    q = call.query
    found = await call.broker.operator.browse(
        call.params["topic"], q.qid, q.from_offset, q.from_ms, q.last, q.limit
    )
    return orjson.dumps(wire.browsed(call.params["topic"], *found))


T = "/v1/topics/{topic}"
ENDPOINTS = [
    Endpoint("POST", f"{T}/messages", produce, action="produce", body=Produce,
             summary="Produce messages (atomic per call)", answers={200: a.ProduceResults},
             errors=(404,)),
    Endpoint("POST", "/v1/topics", create_topic, action="create_topic", body=CreateTopic,
             summary="Create a topic (idempotent)", answers={201: a.Topic, 200: a.Topic},
             errors=(409,)),
    Endpoint("GET", f"{T}/messages", browse, action="read_topics", query=BrowseQuery,
             summary="Read stored messages without any group (no attempt, no hold)",
             answers={200: a.BrowseAnswer}, errors=(404,)),
    Endpoint("GET", "/v1/topics", list_topics, action="read_topics",
             summary="List topics (those in the token's scope)", answers={200: a.TopicList}),
    Endpoint("GET", T, get_topic, action="read_topics", summary="Describe a topic",
             answers={200: a.TopicDetail}, errors=(404,)),
    Endpoint("PATCH", T, update_topic, action="create_topic", body=UpdateTopic,
             summary="Change a topic's retention", answers={200: a.Topic}, errors=(404,)),
    Endpoint("DELETE", T, delete_topic, action="delete_topic",
             summary="Delete a topic no group reads (admin)", answers={200: a.Deleted},
             errors=(404, 409)),
]  # fmt: skip
