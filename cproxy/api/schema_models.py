"""Pydantic models of every response body, for the OpenAPI document only.

Responses are built as bytes by ``wire.py`` (orjson, message bodies embedded verbatim); these
models describe exactly those shapes so that ``/openapi.json`` is truthful (a test validates
every response the suite sees against it). Extra properties are allowed: a newer server may
add fields, and clients must ignore what they do not know.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorDetail(_Out):
    code: str
    message: str
    #: With a 409 ``stale_results`` (an ack with ``produce``): the results that were not
    #: current deliveries.
    unknown: list[MessageRefOut] | None = None


class ErrorBody(_Out):
    """Every error: 4xx and 503."""

    error: ErrorDetail


class Topic(_Out):
    name: str
    queues: int
    retention_ms: int | None = None
    retention_bytes: int | None = None


class TopicList(_Out):
    topics: list[Topic]


class QueueOffsets(_Out):
    qid: int
    min_offset: int
    next_offset: int


class TopicDetail(Topic):
    queue_stats: list[QueueOffsets]


class Deleted(_Out):
    deleted: str


class AppendOutcome(_Out):
    qid: int
    offset: int
    duplicate: bool


class ProduceResults(_Out):
    results: list[AppendOutcome]


class MessageRefOut(_Out):
    topic: str
    qid: int
    offset: int


class Message(_Out):
    topic: str
    qid: int
    offset: int
    key: str | None
    body: Any
    headers: dict[str, str] | None
    attempt: int
    produced_at_ms: int
    #: With ``max_per_key`` > 1: the position of the first message of this one's run.
    run: int | None = None


class ResultsOutcome(_Out):
    applied: int
    unknown: list[MessageRefOut]


class ProducedOut(_Out):
    topic: str
    qid: int
    offset: int
    duplicate: bool


class AckOutcome(ResultsOutcome):
    """An ack's answer; with ``produce`` in the request also ``produced``: each output
    message's place, in request order (``unknown`` is then empty)."""

    produced: list[ProducedOut] | None = None


class PullAnswer(_Out):
    messages: list[Message]
    results: ResultsOutcome


class PushSettings(_Out):
    url: str
    max_in_flight: int
    timeout_ms: int
    headers: dict[str, str]
    max_per_key: int
    secret: str | None = None


class TopicEntry(_Out):
    order_by: str
    push: PushSettings | None = None
    #: JMESPath on {key, headers, body}: messages for which it is not truthy are not delivered.
    filter: str | None = None
    #: JMESPath on {key, headers, body}: the delivered body.
    transform: str | None = None


class GroupConfigBody(_Out):
    """A group's settings (``PUT`` body and the effective config answered)."""

    topics: dict[str, TopicEntry]
    max_attempts: int = 5
    retry_backoff_ms: list[int] = [1000, 5000, 30000]
    ack_timeout_ms: int = 30000
    start: Literal["earliest", "latest"] = "earliest"
    on_exhausted: Literal["dead_letter", "block"] = "dead_letter"
    max_buffered: int = 10000


class GroupConfigOut(GroupConfigBody):
    name: str


class QueuePosition(_Out):
    topic: str
    qid: int
    committed_offset: int
    next_offset: int
    lag: int
    lag_excluding_parked: int
    lost_to_retention: int


class PushState(_Out):
    url: str
    in_flight: int
    paused_until_ms: int | None
    last_error: str | None


class GroupStatsOut(_Out):
    queues: list[QueuePosition]
    lag_excluding_parked: int
    oldest_unfinished_age_ms: int | None
    lost_to_retention: int
    filtered: int
    ready: int
    in_flight: int
    waiting: int
    retrying: int
    exhausted: int
    buffered: int
    blocked_keys: int
    parked_keys: int
    #: Delayed messages not due yet (held, heading a sleeping key, or released unordered).
    delayed: int = 0
    dead_lettered: int
    push: dict[str, PushState] | None = None


class GroupOut(GroupConfigOut):
    stats: GroupStatsOut


class GroupSummaryOut(_Out):
    name: str
    topics: list[str]


class GroupList(_Out):
    groups: list[GroupSummaryOut]


class SeekOffset(_Out):
    qid: int
    offset: int


class SeekAnswer(_Out):
    topic: str
    offsets: list[SeekOffset]


class DeadLetterOut(_Out):
    topic: str
    qid: int
    offset: int
    key: str | None
    id: str | None
    body: Any
    headers: dict[str, str] | None
    produced_at_ms: int
    attempts: int
    last_error: str | None
    dead_lettered_at_ms: int


class DeadLetterList(_Out):
    dead_letters: list[DeadLetterOut]


class Redriven(_Out):
    redriven: int


class BlockedKeyOut(_Out):
    topic: str
    order_value: str | None
    qid: int
    offset: int
    head_offset: int
    state: Literal["in_flight", "retrying", "exhausted"]
    attempts: int
    last_error: str | None
    blocked_since_ms: int
    waiting: int
    parked: bool


class BlockedKeyList(_Out):
    blocked_keys: list[BlockedKeyOut]


class Skipped(_Out):
    skipped: MessageRefOut


class Released(_Out):
    released: MessageRefOut


class Status(_Out):
    status: str


class ClusterMember(_Out):
    node: str
    #: Where clients reach it (``--advertise-url``).
    url: str
    #: How long ago its last heartbeat was (ms, database clock).
    heartbeat_ms_ago: int


class QueueOwner(_Out):
    topic: str
    qid: int
    #: The owning proxy; null while the queue is between owners.
    owner: str | None
    #: "owned", or "releasing" while the owner drains it before handing it over.
    state: str
    #: Grows by one each time the queue changes owner; commits are fenced with it.
    epoch: int


class ClusterOut(_Out):
    node: str
    members: list[ClusterMember]
    queues: list[QueueOwner]
