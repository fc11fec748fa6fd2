# cproxy: compiled (mypyc), see cproxy/_native.py
"""Record batches: how the SQLite and PostgreSQL stores keep messages on disk.

A produce call becomes one row per (queue, call): a *batch* holding the call's messages for
that queue at the contiguous offsets ``base .. next_off - 1``. The row keeps what queries need
without decoding (``base``, ``next_off``, the first and last ``produced_at_ms``) and the
records themselves in one blob, encoded with MessagePack (``msgspec``): one array per message
holding the fields of ``RECORD_FIELDS`` in that order, one after the other, without the header
of an outer array. So the blobs of consecutive batches joined behind one array header (of
their ``next_off - base`` summed) are one MessagePack array, and a read of many small batches
decodes them with one call. Bodies and headers are already-encoded JSON bytes, stored as
MessagePack binaries, never decoded or re-encoded. A record's offset is its position.

Adding a per-message field to ``Record`` is a change of ``RECORD_FIELDS`` alone (one line):
records written before the field existed are shorter arrays, and decode with the field's
dataclass default (so a new field needs one, e.g. ``deliver_at_ms: int | None = None``).

Reads return whole batches sliced to the asked range (``decode``); retention cuts whole
batches, and a batch it cuts through stays until its last record is past the queue's floor
(the floor, not the rows, decides ``min_offset`` and where reads start).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields
from typing import Any, NamedTuple

import msgspec

from cproxy.model import Record
from cproxy.store._retention import message_bytes

#: The per-message fields a record stores, in ``Record`` field order after ``offset`` (the
#: order ``Record(topic, qid, offset, *record)`` takes them). THE line to change when a
#: per-message field is added to ``Record`` (see the module docstring).
RECORD_FIELDS: tuple[str, ...] = (
    "key", "body_json", "headers_json", "id", "produced_at_ms", "deliver_at_ms"
)  # fmt: skip

_MESSAGE_FIELDS = tuple(f.name for f in fields(Record))
if _MESSAGE_FIELDS[3 : 3 + len(RECORD_FIELDS)] != RECORD_FIELDS or set(_MESSAGE_FIELDS[3:]) != set(
    RECORD_FIELDS
):
    # Loud at import: a field stored nowhere would be lost at the first restart.
    raise RuntimeError(
        f"store._records.RECORD_FIELDS {RECORD_FIELDS} must list Record's fields after "
        f"'offset' in order, {_MESSAGE_FIELDS[3:]}"
    )


def _records_builder() -> Callable[[Sequence[Record]], list[tuple[Any, ...]]]:
    """``records(messages)``: each message's ``RECORD_FIELDS`` values as a tuple. Generated
    from ``RECORD_FIELDS`` as a list comprehension of attribute reads, which the interpreter
    specializes: half the cost of an ``operator.attrgetter`` call per message (every produced
    message goes through it)."""
    values = "".join(f"m.{name}, " for name in RECORD_FIELDS)
    source = f"def records(messages):\n    return [({values}) for m in messages]\n"
    scope: dict[str, Any] = {}
    exec(source, scope)  # fixed text, built from RECORD_FIELDS above
    build: Callable[[Sequence[Record]], list[tuple[Any, ...]]] = scope["records"]
    return build


_records_of = _records_builder()
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode
_KEY, _BODY, _HEADERS, _ID, _TS = (
    RECORD_FIELDS.index(f) for f in ("key", "body_json", "headers_json", "id", "produced_at_ms")
)


class Batch(NamedTuple):
    """One row of the batch table (without tid, in column order): records at the offsets
    ``base .. next_off - 1``, produced at ``first_ts .. last_ts``."""

    qid: int
    base: int
    next_off: int
    first_ts: int
    last_ts: int
    records: bytes


def batch(messages: Sequence[Record]) -> Batch:
    """The row of one (queue, call): ``messages`` are that call's stored messages of one
    queue, in offset order (contiguous: duplicates take no offset)."""
    first, last = messages[0], messages[-1]
    n = len(messages)
    # The encoder writes the shortest array header; the records follow it.
    header = 1 if n < 16 else 3 if n < 1 << 16 else 5
    return Batch(
        first.qid,
        first.offset,
        last.offset + 1,
        first.produced_at_ms,
        last.produced_at_ms,
        _encode(_records_of(messages))[header:],
    )


def _array(count: int) -> bytes:
    """A MessagePack array32 header (valid for any count, if not the shortest)."""
    return b"\xdd" + count.to_bytes(4, "big")


def records(count: int, *blobs: bytes) -> list[Any]:
    """The ``count`` records of ``blobs`` (consecutive batches), one list of
    ``RECORD_FIELDS`` values each."""
    out: list[Any] = _decode(b"".join([_array(count), *blobs]))
    return out


def _unpacking_builder() -> Callable[[str, int, int, list[Any]], list[Record]]:
    """``build(topic, qid, first_offset, records)``: the messages of full-length records.

    Generated from ``RECORD_FIELDS`` (as ``dataclasses`` generates ``__init__``): unpacking
    each record into named locals and calling ``Record`` positionally costs about 2/3 of
    ``Record(..., *record)``, and reads build every message a consumer gets this way.
    """
    names = ", ".join(f"f{i}" for i in range(len(RECORD_FIELDS)))
    source = (
        "def build(topic, qid, first, recs):\n"
        f"    return [Record(topic, qid, off, {names})"
        f" for off, ({names},) in zip(range(first, first + len(recs)), recs)]\n"
    )
    scope: dict[str, Any] = {"Record": Record}
    exec(source, scope)  # fixed text, built from RECORD_FIELDS above
    build: Callable[[str, int, int, list[Any]], list[Record]] = scope["build"]
    return build


_build = _unpacking_builder()


#: A batch row as reads see it: (base, next_off, records).
Row = tuple[int, int, bytes]


def decode(topic: str, qid: int, rows: Sequence[Row], start: int, stop: int) -> list[Record]:
    """The messages with ``start <= offset < stop`` of ``rows`` (batches of one queue in
    offset order), in offset order. Each run of contiguous batches (normally all of them)
    is decoded with one call."""
    out: list[Record] = []
    run_start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i][0] != rows[i - 1][1]:
            out += _decode_run(topic, qid, rows[run_start:i], start, stop)
            run_start = i
    return out


def _decode_run(topic: str, qid: int, rows: Sequence[Row], start: int, stop: int) -> list[Record]:
    first, end = rows[0][0], rows[-1][1]
    lo, hi = max(start, first) - first, min(stop, end) - first
    if lo >= hi:
        return []
    recs = records(end - first, *[r[2] for r in rows])
    if lo or hi < len(recs):
        recs = recs[lo:hi]
    try:
        return _build(topic, qid, first + lo, recs)
    except ValueError:
        # A record written before a field was added is shorter: the missing fields take
        # their defaults.
        return [Record(topic, qid, first + lo + i, *r) for i, r in enumerate(recs)]


def sizes(rows: Sequence[Row], start: int, stop: int) -> list[tuple[int, int]]:
    """(offset, retention bytes) of the records of ``rows`` with ``start <= offset < stop``."""
    out = []
    for base, next_off, blob in rows:
        for i, r in enumerate(records(next_off - base, blob)):
            off = base + i
            if start <= off < stop:
                out.append((off, message_bytes(r[_BODY], r[_HEADERS], r[_KEY], r[_ID])))
    return out


#: A batch row as seek by time looks at it: (base, next_off, first_ts, last_ts, records).
Head = tuple[int, int, int, int, bytes]


def narrow(
    low: int, high: int, mid: int, head: Head | None, timestamp_ms: int
) -> tuple[int, int, bool]:
    """One step of seek by time, shared by the stores that keep batches.

    They bisect the offsets ``[low, high)`` for the first one produced at or after
    ``timestamp_ms`` (``produced_at_ms`` is non-decreasing along a queue), probing the batch
    that holds ``mid``: ``head`` is the last batch starting at or below ``mid``, or None.
    Returns the narrowed ``(low, high)`` and whether the answer lies inside ``head`` (then
    ``first_at`` on it gives the answer). No batch holding ``mid`` means retention deleted it
    since: it was older than anything kept.
    """
    if head is None or head[1] <= mid:
        return mid + 1, high, False
    base, next_off, first_ts, last_ts, _ = head
    if last_ts < timestamp_ms:
        return next_off, high, False
    if first_ts >= timestamp_ms:
        return low, max(low, min(high, base)), False
    return low, high, True


def first_at(head: Head, timestamp_ms: int) -> int:
    """The offset of the first record of a batch produced at or after ``timestamp_ms`` (the
    batch's ``next_off`` if none is)."""
    base, next_off, _, _, blob = head
    for i, r in enumerate(records(next_off - base, blob)):
        if r[_TS] >= timestamp_ms:
            return base + i
    return next_off


def group_rows(rows: Iterable[tuple[int, Record]], max_records: int) -> Iterable[tuple[int, Batch]]:
    """(tid, batch) rows from (tid, message) rows in (tid, qid, offset) order: one batch per
    run of contiguous offsets of one queue, at most ``max_records`` each. For migrating a log
    kept one row per message."""
    run: list[Record] = []
    run_tid = -1
    for tid, m in rows:
        if run and (
            tid != run_tid
            or m.qid != run[-1].qid
            or m.offset != run[-1].offset + 1
            or len(run) >= max_records
        ):
            yield run_tid, batch(run)
            run = []
        run_tid = tid
        run.append(m)
    if run:
        yield run_tid, batch(run)
