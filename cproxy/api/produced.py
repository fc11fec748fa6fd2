# cproxy: compiled (mypyc), see cproxy/_native.py
"""Produced messages, from the decoded request to ``NewMessage``: each body checked once and
stored as the bytes the client sent.

msgspec hands each ``body`` over as ``Raw``: the JSON bytes of the value, already checked for
JSON syntax, NaN/Infinity and lone surrogates. Those bytes are stored as they are when their
meaning cannot differ from what parsing and re-encoding would store: ASCII only (so valid
UTF-8), no integer orjson might read as a float (docs/api.md): none of 20+ digits and no
negative one of 19 (a positive one of 19 digits is below 2**64 and reads exactly), no
exponent of 3+ digits (``1e400`` is out of a double's range) and too short or too flat to
nest 255 levels deep. Any other body takes the old path: parsed and encoded by orjson, so
big integers become floats, ``1e400`` and invalid UTF-8 are refused (400) and deeper nesting
than orjson encodes is a 422. (Spacing, escapes and number spellings such as ``1.50`` are
kept as sent: they mean the same JSON value.)

The number checks run once over the whole request (``plain``): a few C-level scans. Only when
the request as a whole fails them (a key or a string that merely looks like a risky number
also does) is each body checked on its own. Nesting is checked per body, and only for bodies
long enough to nest that deep (most are not).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec
import orjson

from cproxy.config import Limits
from cproxy.errors import InvalidRequest, TooLarge
from cproxy.model import NewMessage

from .bodies import OutMessage
from .errors import not_json

_astuple: Final = msgspec.structs.astuple
#: ``OutMessage``'s fields in declaration order, as ``new_messages`` unpacks them.
_FIELDS: Final = ("key", "body", "headers", "id", "qid", "delay_ms", "deliver_at_ms")
if tuple(f.name for f in msgspec.structs.fields(OutMessage)) != _FIELDS:
    # Loud at import: unpacking by position would silently swap fields.
    raise RuntimeError(f"api.produced._FIELDS {_FIELDS} must list OutMessage's fields in order")

#: Bodies shorter than this cannot nest deeper than orjson encodes (254 levels).
_SHALLOW_BYTES: Final = 250


def _shape(c: int) -> int:
    """Byte ``c`` as ``_SHAPES`` maps it: an ASCII digit to "0", "e"/"E" to "e", "-" kept,
    anything else to " "."""
    if 0x30 <= c <= 0x39:
        return ord("0")
    if c in b"eE":
        return ord("e")
    return c if c == ord("-") else ord(" ")


#: Every byte as ``_shape`` maps it, so that the risky spellings are found with three
#: substring searches; "+" is deleted, so "e+400" reads as "e400".
_SHAPES: Final = bytes(_shape(c) for c in range(256))
#: orjson reads integers below -2**63 (19 digits) or above 2**64 - 1 (20) as floats; a
#: 19-digit positive one (at most 10**19 - 1) it reads exactly, as nanosecond timestamps are.
_LONG_INTEGER: Final = b"0" * 20
_LONG_NEGATIVE: Final = b"-" + b"0" * 19
_LONG_EXPONENT: Final = b"e000"


def plain(raw: bytes) -> bool:
    """Whether no JSON value inside ``raw`` can read differently once parsed by orjson
    (nesting aside): ASCII, no 20-digit run, no "-" and 19 digits, no 3-digit exponent."""
    if not raw.isascii():
        return False
    shapes = raw.translate(_SHAPES, b"+")
    # ``rfind``, not ``in``: the same answer, 2-3x faster here. Searching backwards compares
    # a needle's first byte first ("e", "-": rare in shapes), forwards its last ("0":
    # frequent wherever there are numbers, and a near miss there allows only a 1-byte skip).
    return (
        shapes.rfind(_LONG_INTEGER) < 0
        and shapes.rfind(_LONG_NEGATIVE) < 0
        and shapes.rfind(_LONG_EXPONENT) < 0
    )


def _shallow(raw: bytes) -> bool:
    """Whether no JSON value inside ``raw`` can nest deeper than orjson encodes."""
    return len(raw) < _SHALLOW_BYTES or raw.count(b"[") + raw.count(b"{") < _SHALLOW_BYTES


def stored_body(raw: bytes, index: int, checked: bool = False) -> bytes:
    """The bytes to store for ``messages[index].body`` (sent as ``raw``); ``checked``: the
    whole request passed ``plain``."""
    if (checked or plain(raw)) and _shallow(raw):
        return raw
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # msgspec took it as JSON, orjson does not (invalid UTF-8, 1e400): not JSON, as before.
        raise not_json(raw) from None
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise InvalidRequest(f"messages[{index}].body cannot be stored as JSON: {exc}") from exc


def check_count(count: int, limits: Limits) -> None:
    """413 for more messages in one call than ``max_messages_per_call`` (a produce call, or
    the outputs of an ack with ``produce`` together)."""
    if count > limits.max_messages_per_call:
        raise TooLarge(f"{count} messages in one call; the limit is {limits.max_messages_per_call}")


def new_messages(
    messages: Sequence[OutMessage], limits: Limits, request: bytes
) -> list[NewMessage]:
    """``NewMessage``s for the broker from the decoded ``request`` (the broker turns a
    ``delay_ms`` into ``deliver_at_ms`` with its clock). ``TooLarge`` (413) for one over
    ``max_message_bytes``
    (body, headers, key and id in UTF-8 bytes); ``InvalidRequest`` for one with both
    ``delay_ms`` and ``deliver_at_ms``."""
    plain_request = plain(request)
    # The common case, checked once for the whole request: every body is stored as sent
    # unless it is long enough to nest too deep (``_shallow``, per body: most are too short
    # to need a count), and no message can be over the limit, as none is longer than the
    # request: its body is a part of it, and key, id and headers take at most as many bytes
    # in UTF-8 (headers re-encoded compactly) as in the JSON text they were sent in.
    as_sent = plain_request and len(request) <= limits.max_message_bytes
    items = []
    for i, m in enumerate(messages):
        # Reading the decoded ``OutMessage``, not a shape of its own: one C call for all
        # fields, as compiled each ``m.field`` is a generic attribute lookup (a Struct is not
        # a native class).
        key, body, headers, id_, qid, delay_ms, deliver_at_ms = _astuple(m)
        headers_json = orjson.dumps(headers) if headers else None
        body_json = bytes(body)
        if not (as_sent and _shallow(body_json)):
            body_json = stored_body(body_json, i, plain_request)
            _check_size(i, m, body_json, headers_json, limits.max_message_bytes)
        if delay_ms is not None and deliver_at_ms is not None:
            raise InvalidRequest(f"messages[{i}] has both delay_ms and deliver_at_ms; give one")
        items.append(NewMessage(key, body_json, headers_json, id_, qid, deliver_at_ms, delay_ms))
    return items


def _check_size(
    index: int, m: OutMessage, body_json: bytes, headers_json: bytes | None, limit: int
) -> None:
    """``TooLarge`` when body, headers, key and id take more than ``limit`` UTF-8 bytes."""
    size = len(body_json)
    if headers_json is not None:
        size += len(headers_json)
    if m.key is not None:
        size += len(m.key.encode())
    if m.id is not None:
        size += len(m.id.encode())
    if size > limit:
        raise TooLarge(f"messages[{index}] is {size} bytes; the limit is {limit}")
