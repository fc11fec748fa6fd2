"""Request bodies and query strings of every call, as msgspec ``Struct``s.

msgspec decodes and validates in one pass over the request bytes (types, ranges, unknown
fields), several times faster than parsing to dicts and validating them with pydantic:
strict types (no ``"1"`` for 1, no ``true`` for 1), unknown fields refused (422). Range
checks that belong to the domain (group settings, qids) are the engine's and the broker's;
these types pin down shapes. The OpenAPI document takes its schemas from the same types
(``openapi.py``), with the answers of ``answers.py``.

A produced message's ``body`` is decoded as ``msgspec.Raw``: the exact JSON bytes the client
sent, never turned into Python objects. ``cproxy.api.produced`` checks them once and stores
them as they are (no re-encoding).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

#: Offsets and qids: JSON integers the store can hold (signed 64-bit).
NonNegative = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
#: Delivery attempts start at 1 (see ``attempt`` on pulled messages).
Attempt = Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]
#: JSON ``null``: the body of a message sent without one.
NULL = msgspec.Raw(b"null")


class _Strict(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Unknown fields are a 422, as everywhere in the API."""


class OutMessage(_Strict):
    """One message to produce. New optional fields go at the end, with a default."""

    key: str | None = None
    #: Any JSON value, kept as the bytes sent (``null`` when left out).
    body: msgspec.Raw = msgspec.field(default_factory=lambda: NULL)
    headers: dict[str, str] | None = None
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=512)] | None = None
    qid: NonNegative | None = None
    delay_ms: Annotated[
        NonNegative | None,
        msgspec.Meta(
            description="Not delivered before this many ms after it is stored (at most "
            "the server's limits.max_delay_ms); not with deliver_at_ms."
        ),
    ] = None
    deliver_at_ms: Annotated[
        NonNegative | None,
        msgspec.Meta(
            description="Not delivered before this time (ms since the Unix epoch; a past "
            "time means no delay; at most limits.max_delay_ms ahead); not with delay_ms."
        ),
    ] = None


class Produce(_Strict):
    messages: Annotated[list[OutMessage], msgspec.Meta(min_length=1)]


class AckItem(_Strict):
    """A fenced ack: it applies only while ``attempt`` is the message's current delivery."""

    offset: NonNegative
    attempt: Attempt | None = None


class FailItem(_Strict):
    """A fail with the handler's error and, to fence it, the attempt it answers."""

    offset: NonNegative
    error: Annotated[str, msgspec.Meta(max_length=4096)] | None = None
    attempt: Attempt | None = None


class QueueResults(_Strict):
    """Results for one queue. A plain offset is unfenced: it answers the current delivery."""

    topic: str
    qid: NonNegative
    acks: list[NonNegative | AckItem] = []
    fails: list[NonNegative | FailItem] = []


class Pull(_Strict):
    max_messages: Annotated[int, msgspec.Meta(ge=1)] = 32
    wait_ms: Annotated[int, msgspec.Meta(ge=0)] = 5000
    topics: list[str] | None = None
    results: list[QueueResults] = []
    #: Up to this many consecutive messages of one order value per answer (a same-key run).
    max_per_key: Annotated[int, msgspec.Meta(ge=1)] = 1
    #: Who pulls (the SDK sends host, pid and a name); group stats list consumers by it.
    consumer: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None


class OutTopic(_Strict):
    """Messages an ack stores with its results, in the produce call's shape."""

    topic: str
    messages: Annotated[list[OutMessage], msgspec.Meta(min_length=1)]


class Ack(_Strict):
    results: list[QueueResults]
    #: Outputs stored in one transaction with the results (every result fenced).
    produce: list[OutTopic] | None = None


class MessageRefBody(_Strict):
    topic: str
    qid: NonNegative
    offset: NonNegative
    #: Fences the extend to this delivery attempt (optional).
    attempt: Attempt | None = None


class Extend(_Strict):
    messages: Annotated[list[MessageRefBody], msgspec.Meta(min_length=1)]
    ack_timeout_ms: Annotated[int, msgspec.Meta(ge=10, le=43_200_000)] = 30_000


#: A group's settings (``PUT /v1/groups/{group}``): an object, validated by the engine
#: (``GroupConfig.from_dict``: ranges, defaults, expressions); its shape is documented by
#: ``answers.GroupConfigBody``, the effective config a PUT answers.
GroupSettings = Annotated[
    dict[str, Any], msgspec.Meta(extra_json_schema={"$ref": "#/components/schemas/GroupConfigBody"})
]


#: A retention bound: a positive integer, or null for unbounded; left out: unchanged.
Retention = Annotated[int, msgspec.Meta(ge=1, le=2**62)] | None | UnsetType


class CreateTopic(_Strict):
    """``retention_ms``/``retention_bytes`` left out: an existing topic keeps its own."""

    name: str
    queues: Annotated[int, msgspec.Meta(ge=1, le=1024)] = 1
    retention_ms: Retention = UNSET
    retention_bytes: Retention = UNSET


class UpdateTopic(_Strict):
    """``PATCH /v1/topics/{topic}``: a field left out keeps its value; null is unbounded."""

    retention_ms: Retention = UNSET
    retention_bytes: Retention = UNSET


class Timestamp(_Strict):
    timestamp_ms: NonNegative


class Seek(_Strict):
    topic: str
    to: Literal["earliest", "latest"] | NonNegative | Timestamp
    qid: NonNegative | None = None


class Replay(_Strict):
    topic: str
    order_value: str
    from_: Literal["earliest"] | NonNegative | Timestamp = msgspec.field(
        name="from", default="earliest"
    )


class BlockedKeyAction(_Strict):
    """Name the head either by order value or, for unordered messages, by qid and offset."""

    topic: str
    order_value: str | None = None
    qid: NonNegative | None = None
    offset: NonNegative | None = None


class DeadLetterRef(_Strict):
    topic: str
    qid: NonNegative
    offset: NonNegative


class Redrive(_Strict):
    """All dead letters (of ``topic``), or just the named ``messages``."""

    topic: str | None = None
    messages: list[DeadLetterRef] | None = None


class DeleteDeadLetters(_Strict):
    messages: Annotated[list[DeadLetterRef], msgspec.Meta(min_length=1)]


# -- query strings (unknown parameters are ignored, as HTTP clients expect) ---------------------
class DeadLetterQuery(msgspec.Struct):
    topic: str | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 100


class TopicQuery(msgspec.Struct):
    topic: str | None = None


class BrowseQuery(msgspec.Struct):
    """Where to start reading: ``from`` (an offset), ``from_ms`` (a time) or ``last`` (the
    newest N); by default the oldest stored message."""

    qid: Annotated[int, msgspec.Meta(ge=0, le=1023)] | None = None
    from_offset: NonNegative | None = msgspec.field(default=None, name="from")
    from_ms: NonNegative | None = None
    last: Annotated[int, msgspec.Meta(ge=1, le=1000)] | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 50


class BlockedKeysQuery(msgspec.Struct):
    topic: str | None = None
    min_blocked_ms: Annotated[int, msgspec.Meta(ge=0)] = 0
    limit: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 1000
