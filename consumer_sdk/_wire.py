"""The wire side of the contract (docs/api.md): request bodies out, typed answers in.

Pure functions used by :mod:`consumer_sdk._base`; every malformed answer becomes a
:class:`~consumer_sdk.ProtocolError` here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, Protocol
from urllib.parse import quote

from consumer_sdk.errors import ApiError, ProtocolError, api_error_class
from consumer_sdk.models import (
    AckResult,
    ExtendResult,
    GroupInfo,
    MessageRef,
    OutgoingMessage,
    Produce,
    QueueResult,
    SendResult,
    TopicInfo,
    send_result_from_wire,
)

_OUTGOING_KEYS: Final = frozenset(
    {"key", "body", "headers", "id", "qid", "delay_ms", "deliver_at_ms"}
)


def mapping(data: Any) -> dict[str, Any]:
    """An answer that is a JSON object (or empty), as a dict."""
    return dict(as_object(data)) if data is not None else {}


def outgoing_to_wire(message: OutgoingMessage) -> dict[str, Any]:
    """Check one message mapping for :meth:`Producer.send_batch` and return its wire form."""
    if not _OUTGOING_KEYS.issuperset(message):
        extra = set(message) - _OUTGOING_KEYS
        raise ValueError(
            f"unknown message field(s) {sorted(extra)}; allowed: {sorted(_OUTGOING_KEYS)}"
        )
    if "body" not in message:
        raise ValueError("every message needs a 'body' (any JSON value)")
    if type(message) is dict:
        for value in message.values():
            if value is None:
                break
        else:  # nothing to leave out: encoded as it is, not copied (a copy is per message)
            return message
    return {k: v for k, v in message.items() if v is not None or k == "body"}


def results_to_wire(results: Iterable[QueueResult]) -> list[dict[str, Any]]:
    """Results in the pull/ack shape: fails in the extended form that carries the error, and
    results with a known attempt in the fenced form (``{"offset", "attempt"}``)."""
    out: list[dict[str, Any]] = []
    for r in results:
        attempts = dict(r.attempts)
        fails: list[dict[str, Any]] = []
        for offset, error in r.fails:
            fail: dict[str, Any] = {"offset": offset}
            if error is not None:
                fail["error"] = error
            if offset in attempts:
                fail["attempt"] = attempts[offset]
            fails.append(fail)
        acks: list[Any] = [
            {"offset": o, "attempt": attempts[o]} if o in attempts else o for o in r.acks
        ]
        out.append({"topic": r.topic, "qid": r.qid, "acks": acks, "fails": fails})
    return out


def produce_to_wire(outputs: Iterable[Produce]) -> list[dict[str, Any]]:
    """An ack's ``produce``: each output's topic and its messages in the produce shape."""
    out = []
    for p in outputs:
        if not isinstance(p, Produce):
            raise TypeError(f"expected Produce(topic, messages), got {type(p).__name__}")
        messages = [outgoing_to_wire(m) for m in p.messages]
        if not messages:
            raise ValueError(f"Produce({p.topic!r}, ...) needs at least one message")
        out.append({"topic": p.topic, "messages": messages})
    return out


class HttpAnswer(Protocol):
    """What decoding reads of an answer: an ``httpx.Response`` or the lean pool's ``Answer``."""

    @property
    def status_code(self) -> int: ...
    @property
    def reason_phrase(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def content(self) -> bytes: ...
    @property
    def text(self) -> str: ...


def api_error(response: HttpAnswer, code: str, message: str) -> ApiError:
    return api_error_class(response.status_code)(
        response.status_code,
        code,
        message,
        retry_after_ms=_retry_after_ms(response.headers.get("retry-after")),
    )


def _retry_after_ms(value: str | None) -> int | None:
    """``Retry-After`` in seconds as milliseconds; None when absent or an HTTP date."""
    try:
        return max(0, round(float(value) * 1000)) if value is not None else None
    except ValueError:
        return None


def parse_topic(data: Any) -> TopicInfo:
    obj = as_object(data)
    try:
        return TopicInfo(name=str(obj["name"]), queues=int(obj["queues"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed topic in answer: {exc!r}") from exc


def parse_group(data: Any) -> GroupInfo:
    obj = as_object(data)
    try:
        return GroupInfo(name=str(obj["name"]), topics=tuple(str(t) for t in obj["topics"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed group in answer: {exc!r}") from exc


def parse_send(data: Any, expected: int) -> list[SendResult]:
    rows = as_object(data).get("results")
    if not isinstance(rows, list) or len(rows) != expected:
        got = len(rows) if isinstance(rows, list) else repr(rows)
        raise ProtocolError(f"sent {expected} messages but got {got} results")
    try:
        return [send_result_from_wire(r) for r in rows]
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed produce result: {exc!r}") from exc


def parse_ref(data: Any) -> MessageRef:
    obj = as_object(data)
    try:
        return (str(obj["topic"]), int(obj["qid"]), int(obj["offset"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed message reference in answer: {exc!r}") from exc


def parse_ack(data: Any) -> AckResult:
    if data is None:
        return AckResult()
    obj = as_object(data)
    try:
        unknown = tuple(
            (str(u["topic"]), int(u["qid"]), int(u["offset"])) for u in obj.get("unknown") or ()
        )
        produced = tuple(
            SendResult(int(p["qid"]), int(p["offset"]), bool(p.get("duplicate", False)))
            for p in obj.get("produced") or ()
        )
        return AckResult(applied=int(obj.get("applied", 0)), unknown=unknown, produced=produced)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed results in answer: {exc!r}") from exc


def parse_extend(data: Any) -> ExtendResult:
    ack = parse_ack(data)
    return ExtendResult(applied=ack.applied, unknown=ack.unknown)


def list_field(data: Any, field: str) -> list[Any]:
    rows = as_object(data).get(field, [])
    if not isinstance(rows, list):
        raise ProtocolError(f"expected a list in {field!r}, got {type(rows).__name__}")
    return rows


def query_params(**values: str | int | None) -> dict[str, str]:
    return {k: str(v) for k, v in values.items() if v is not None}


def as_object(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProtocolError(f"expected a JSON object, got {type(data).__name__}")
    return data


def seg(name: str) -> str:
    return quote(name, safe="")
