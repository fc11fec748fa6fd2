"""The answers of the API as msgspec ``Struct``s: the response types of the OpenAPI document.

``wire.py`` builds each answer as bytes; these types say what those bytes hold, and every
response the test suite sees is validated against the document made from them
(tests/openapi_check.py). They sit beside the request types (``bodies.py``): one kind of type,
one schema generator (``msgspec.json.schema_components``) for the whole document. Unknown
fields are allowed: a newer server may add fields, and clients must ignore what they do not
know.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec


class _Answer(msgspec.Struct, kw_only=True):
    pass


class ErrorDetail(_Answer, kw_only=True):
    code: str
    message: str
    #: With a 409 ``stale_results`` (an ack with ``produce``): the results that were not
    #: current deliveries.
    unknown: list[MessageRefOut] | None = None


class ErrorBody(_Answer, kw_only=True):
    """Every error: 4xx and 503."""

    error: ErrorDetail


class Topic(_Answer, kw_only=True):
    name: str
    queues: int
    retention_ms: int | None = None
    retention_bytes: int | None = None


class TopicList(_Answer, kw_only=True):
    topics: list[Topic]


class QueueOffsets(_Answer, kw_only=True):
    qid: int
    min_offset: int
    next_offset: int


class TopicDetail(Topic, kw_only=True):
    queue_stats: list[QueueOffsets]


class Deleted(_Answer, kw_only=True):
    deleted: str


class AppendOutcome(_Answer, kw_only=True):
    qid: int
    offset: int
    duplicate: bool


class ProduceResults(_Answer, kw_only=True):
    results: list[AppendOutcome]


class MessageRefOut(_Answer, kw_only=True):
    topic: str
    qid: int
    offset: int


class StoredMessage(MessageRefOut, kw_only=True):
    """What every answer that shows a message shows of it."""

    key: str | None
    body: Any
    headers: dict[str, str] | None
    produced_at_ms: int


class Message(StoredMessage, kw_only=True):
    """A delivered message."""

    attempt: Annotated[
        int,
        msgspec.Meta(
            description="The delivery number, which a fenced result names: 1 for a fresh "
            "message's first delivery; every later hand-out of the message gets a higher one "
            "(charged or not, across restarts and changes of owner)."
        ),
    ]
    charged_attempts: Annotated[
        int,
        msgspec.Meta(
            description="Charged deliveries before this one (fails and ack timeouts): what "
            "max_attempts counts."
        ),
    ]
    #: With ``max_per_key`` > 1: the position of the first message of this one's run.
    run: int | None = None
    replay: Annotated[
        bool | None,
        msgspec.Meta(
            description="Present (true) only on a message delivered again by a replay of its "
            "order value (POST /v1/groups/{group}/replay)."
        ),
    ] = None


class ResultsOutcome(_Answer, kw_only=True):
    applied: int
    unknown: list[MessageRefOut]


class ProducedOut(AppendOutcome, kw_only=True):
    topic: str


class AckOutcome(ResultsOutcome, kw_only=True):
    """An ack's answer; with ``produce`` in the request also ``produced``: each output
    message's place, in request order (``unknown`` is then empty)."""

    produced: list[ProducedOut] | None = None


class PullAnswer(_Answer, kw_only=True):
    messages: list[Message]
    results: ResultsOutcome


class PushSettings(_Answer, kw_only=True):
    url: str
    max_in_flight: int
    timeout_ms: int
    headers: dict[str, str]
    max_per_key: int
    secret: str | None = None


class TopicEntry(_Answer, kw_only=True):
    order_by: str
    push: PushSettings | None = None
    #: JMESPath on {key, headers, body}: messages for which it is not truthy are not delivered.
    filter: str | None = None
    #: JMESPath on {key, headers, body}: the delivered body.
    transform: str | None = None


class BrowsedMessage(StoredMessage, kw_only=True):
    id: str | None
    deliver_at_ms: int | None


class BrowseAnswer(_Answer, kw_only=True):
    topic: str
    qid: int
    messages: list[BrowsedMessage]
    #: The offset to continue from (``from=next``).
    next: int


class GroupConfigBody(_Answer, kw_only=True):
    """A group's settings (``PUT`` body and the effective config answered)."""

    topics: dict[str, TopicEntry]
    max_attempts: int = 5
    retry_backoff_ms: list[int] = msgspec.field(default_factory=lambda: [1000, 5000, 30000])
    ack_timeout_ms: int = 30000
    start: Literal["earliest", "latest"] = "earliest"
    on_exhausted: Literal["dead_letter", "block"] = "dead_letter"
    max_buffered: int = 10000
    #: A head in flight this long counts as a blocked (stuck) key.
    stuck_after_ms: int = 60000
    #: Dead letters older than this are deleted; null keeps them.
    dead_letter_retention_ms: int | None = None
    #: Deliveries per second of the group (pull and push together); null: unlimited.
    max_per_second: int | None = None


class GroupConfigOut(GroupConfigBody, kw_only=True):
    name: str


class QueuePosition(_Answer, kw_only=True):
    topic: str
    qid: int
    committed_offset: int
    next_offset: int
    lag: int
    lag_excluding_parked: int
    lost_to_retention: int


class PushState(_Answer, kw_only=True):
    url: str
    in_flight: int
    paused_until_ms: int | None
    last_error: str | None


class ConsumerOut(_Answer, kw_only=True):
    #: The id the consumer sent with its pulls, or its address.
    consumer: str
    last_pull_ms_ago: int
    in_flight: int


class GroupStatsOut(_Answer, kw_only=True):
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
    replaying: Annotated[
        int, msgspec.Meta(description="Messages a replay of an order value has still to deliver.")
    ] = 0
    dead_lettered: int
    push: dict[str, PushState] | None = None
    #: Order values whose head is in flight and not stuck yet.
    in_flight_keys: int = 0
    consumers: list[ConsumerOut] = []
    #: Since anyone last pulled from this proxy (ms); null: nobody since it started.
    last_pull_ms_ago: int | None = None
    delivered_per_s: float = 0.0
    acked_per_s: float = 0.0
    #: Time max_per_second held ready messages back, summed (ms).
    throttled_ms: int = 0


class GroupOut(GroupConfigOut, kw_only=True):
    stats: GroupStatsOut


class GroupSummaryOut(_Answer, kw_only=True):
    name: str
    topics: list[str]


class GroupList(_Answer, kw_only=True):
    groups: list[GroupSummaryOut]


class SeekOffset(_Answer, kw_only=True):
    qid: int
    offset: int


class ReplayAnswer(_Answer, kw_only=True):
    replaying: Annotated[
        int, msgspec.Meta(description="Finished messages of the order value delivered again.")
    ]
    lost_to_retention: Annotated[
        int,
        msgspec.Meta(
            description="Messages of the requested range that retention already deleted (of any "
            "order value: their values went with them)."
        ),
    ]


class SeekAnswer(_Answer, kw_only=True):
    topic: str
    offsets: list[SeekOffset]


class DeadLetterOut(StoredMessage, kw_only=True):
    id: str | None
    attempts: Annotated[
        int, msgspec.Meta(description="Charged deliveries (fails and ack timeouts).")
    ]
    last_error: str | None
    dead_lettered_at_ms: int


class DeadLetterList(_Answer, kw_only=True):
    dead_letters: list[DeadLetterOut]


class Redriven(_Answer, kw_only=True):
    redriven: int


class DeadLettersDeleted(_Answer, kw_only=True):
    deleted: int


class BlockedKeyOut(_Answer, kw_only=True):
    topic: str
    order_value: str | None
    qid: int
    offset: int
    head_offset: int
    state: Literal["in_flight", "retrying", "exhausted"]
    attempts: Annotated[
        int,
        msgspec.Meta(
            description="The head's charged deliveries (fails and ack timeouts) since its last "
            "fresh budget: what max_attempts counts."
        ),
    ]
    last_error: str | None
    blocked_since_ms: int
    waiting: int
    parked: bool
    #: The head's body.
    body: Any = None


class BlockedKeyList(_Answer, kw_only=True):
    blocked_keys: list[BlockedKeyOut]


class Skipped(_Answer, kw_only=True):
    skipped: MessageRefOut


class Released(_Answer, kw_only=True):
    released: MessageRefOut


class Status(_Answer, kw_only=True):
    status: str


class ClusterMember(_Answer, kw_only=True):
    node: str
    #: Where clients reach it (``--advertise-url``).
    url: str
    #: How long ago its last heartbeat was (ms, database clock).
    heartbeat_ms_ago: int


class QueueOwner(_Answer, kw_only=True):
    topic: str
    qid: int
    #: The owning proxy; null while the queue is between owners.
    owner: str | None
    #: "owned", or "releasing" while the owner drains it before handing it over.
    state: str
    #: Grows by one each time the queue changes owner; commits are fenced with it.
    epoch: int


class ClusterOut(_Answer, kw_only=True):
    node: str
    members: list[ClusterMember]
    queues: list[QueueOwner]
