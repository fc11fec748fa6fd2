"""Request bodies of the hot calls (produce, pull, ack) as msgspec ``Struct``s.

msgspec decodes and validates in one pass over the request bytes (types, ranges, unknown
fields), several times faster than parsing to dicts and validating them with pydantic. The
shapes are those of the pydantic models they replaced, so clients see the same contract:
strict types (no ``"1"`` for 1, no ``true`` for 1), unknown fields refused, the same ranges.

A produced message's ``body`` is decoded as ``msgspec.Raw``: the exact JSON bytes the client
sent, never turned into Python objects. ``cproxy.api.lean`` checks them once and stores them
as they are (no re-encoding). The OpenAPI document takes these schemas from
``schema_components`` (``cproxy.api.openapi``), so the shapes are declared in one place.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

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


class OutTopic(_Strict):
    """Messages an ack stores with its results, in the produce call's shape."""

    topic: str
    messages: Annotated[list[OutMessage], msgspec.Meta(min_length=1)]


class Ack(_Strict):
    results: list[QueueResults]
    #: Outputs stored in one transaction with the results (every result fenced).
    produce: list[OutTopic] | None = None


#: The Structs whose JSON schemas the OpenAPI document declares (by class name).
DOCUMENTED: tuple[type[msgspec.Struct], ...] = (Produce, Pull, Ack)
