"""Produced messages, from the decoded request to ``NewMessage``: each body checked once and
stored as the bytes the client sent.

msgspec hands each ``body`` over as ``Raw`` (the JSON bytes of the value, already checked for
JSON syntax, NaN/Infinity and lone surrogates). Those bytes are stored as they are when they
cannot differ in meaning from what parsing and re-encoding would store: ASCII only (so valid
UTF-8), no number that could exceed a double's precision or range (no run of 16+ digits, no
exponent) and too short to nest 255 levels deep. Any other body takes the old path: parsed
and encoded by orjson, so big integers become floats (docs/api.md), ``1e400`` is refused
(400), invalid UTF-8 is refused (400) and deeper nesting than orjson stores is a 422.
The checks are a few C-level scans, far cheaper than parsing and encoding in Python.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import orjson

from cproxy.config import Limits
from cproxy.errors import InvalidRequest, TooLarge
from cproxy.model import NewMessage

from .bodies import OutMessage
from .errors import BadBody

#: Bytes that may make the stored value differ from orjson's reading of it (see above).
_NEEDS_PARSING = re.compile(rb"[^\x00-\x7f]|[0-9]{16}|[0-9][eE]")
#: Bodies shorter than this cannot nest deeper than orjson encodes (254 levels).
_SHALLOW_BYTES = 250


def stored_body(raw: bytes, index: int) -> bytes:
    """The bytes to store for ``messages[index].body`` (sent as ``raw``)."""
    if _NEEDS_PARSING.search(raw) is None and (
        len(raw) < _SHALLOW_BYTES or raw.count(b"[") + raw.count(b"{") < _SHALLOW_BYTES
    ):
        return raw
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # msgspec took it as JSON, orjson does not (invalid UTF-8, 1e400): not JSON, as before.
        raise BadBody(400, "invalid_json", "the request body is not valid JSON") from None
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise InvalidRequest(f"messages[{index}].body cannot be stored as JSON: {exc}") from exc


def new_messages(messages: Sequence[OutMessage], limits: Limits) -> list[NewMessage]:
    """``NewMessage``s for the broker; ``TooLarge`` (413) for one over ``max_message_bytes``
    (body, headers, key and id in UTF-8 bytes)."""
    items = []
    for i, m in enumerate(messages):
        body_json = stored_body(bytes(m.body), i)
        headers_json = orjson.dumps(m.headers) if m.headers else None
        size = len(body_json)
        if headers_json is not None:
            size += len(headers_json)
        if m.key is not None:
            size += len(m.key.encode())
        if m.id is not None:
            size += len(m.id.encode())
        if size > limits.max_message_bytes:
            raise TooLarge(
                f"messages[{i}] is {size} bytes; the limit is {limits.max_message_bytes}"
            )
        items.append(NewMessage(m.key, body_json, headers_json, m.id, m.qid))
    return items
