"""Request bodies of the HTTP API (pydantic: types, shapes and OpenAPI docs); those of the
hot calls (produce, pull, ack) are msgspec ``Struct``s in ``bodies.py``.

Range checks that belong to the domain (group settings, qids) are done by the engine and the
broker, so the rules live in one place; these models only pin down types and shapes.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StrictStr

from cproxy.config import check_name
from cproxy.errors import InvalidRequest

#: Offsets and qids: JSON integers the store can hold (signed 64-bit).
NonNegative = Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _topic_name(name: str) -> str:
    try:
        return check_name("topic", name)
    except InvalidRequest as exc:
        raise ValueError(exc.message) from None  # pydantic reports it: 422 validation_error


#: A retention bound: a positive JSON integer, or null for unbounded.
Retention = Annotated[StrictInt, Field(ge=1, le=2**62)] | None


class CreateTopic(_Strict):
    """``retention_ms``/``retention_bytes`` left out: an existing topic keeps its own."""

    name: Annotated[StrictStr, AfterValidator(_topic_name)]
    queues: Annotated[StrictInt, Field(ge=1, le=1024)] = 1
    retention_ms: Retention = None
    retention_bytes: Retention = None


class UpdateTopic(_Strict):
    """``PATCH /v1/topics/{topic}``: a field left out keeps its value; null is unbounded."""

    retention_ms: Retention = None
    retention_bytes: Retention = None


#: Delivery attempts start at 1 (see ``attempt`` on pulled messages).
Attempt = Annotated[StrictInt, Field(ge=1, le=2**31 - 1)]


class MessageRefBody(_Strict):
    topic: StrictStr
    qid: NonNegative
    offset: NonNegative
    #: Fences the extend to this delivery attempt (optional).
    attempt: Attempt | None = None


class Extend(_Strict):
    messages: Annotated[list[MessageRefBody], Field(min_length=1)]
    ack_timeout_ms: Annotated[StrictInt, Field(ge=10, le=43_200_000)] = 30_000


class Timestamp(_Strict):
    timestamp_ms: NonNegative


class Seek(_Strict):
    topic: StrictStr
    qid: NonNegative | None = None
    to: Literal["earliest", "latest"] | NonNegative | Timestamp


class BlockedKeyAction(_Strict):
    """Name the head either by order value or, for unordered messages, by qid and offset."""

    topic: StrictStr
    order_value: StrictStr | None = None
    qid: NonNegative | None = None
    offset: NonNegative | None = None


class DeadLetterRef(_Strict):
    topic: StrictStr
    qid: NonNegative
    offset: NonNegative


class Redrive(_Strict):
    """All dead letters (of ``topic``), or just the named ``messages``."""

    topic: StrictStr | None = None
    messages: list[DeadLetterRef] | None = None


class DeleteDeadLetters(_Strict):
    messages: Annotated[list[DeadLetterRef], Field(min_length=1)]
