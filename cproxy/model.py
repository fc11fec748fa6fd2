"""Plain data shared by the engine, the stores and the HTTP layer.

Message bodies and headers travel as already-encoded JSON bytes: the proxy almost never needs
to look inside them (only a JSON-path ``order_by`` does), so decoding and re-encoding them on
every hop would be wasted work. The HTTP layer embeds them verbatim with ``orjson.Fragment``.

``Record``, ``NewMessage`` and ``AppendResult`` are built once per message on the hot path, so
they are cheap to build. ``Record`` and ``NewMessage`` (``cproxy._message``) are slotted
dataclasses that mypyc compiles, their ``__init__`` included (``cproxy/_native.py``): the
compiled produce path, placement and append plan read a ``NewMessage``'s fields about ten
times per message, each a direct field read instead of an attribute lookup. ``AppendResult``
is a msgspec ``Struct``, built by C code for a third of what a dataclass-generated
``__init__`` costs (~60 ns against ~200 ns), with the same fields, positional and keyword
construction, equality and ``repr``; ``gc=False``: it holds only numbers and a ``Record``, so
it can never be part of a reference cycle, and untracked objects do not count towards the
cyclic collector's allocation threshold. Treat all three as immutable all the same
(``NewMessage.qid`` aside, which the broker fills in).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import orjson

from cproxy._message import MessageRef as MessageRef  # noqa: PLC0414
from cproxy._message import NewMessage as NewMessage  # noqa: PLC0414
from cproxy._message import QueueRef as QueueRef  # noqa: PLC0414

# Re-exported (the "X as X" form is what strict mypy reads as a re-export): ``Record`` and
# ``NewMessage`` live in their own module only so that mypyc compiles them.
from cproxy._message import Record as Record  # noqa: PLC0414


class AppendResult(msgspec.Struct, gc=False, eq=False):
    qid: int
    offset: int
    duplicate: bool = False
    #: When the stored message was produced (the original's, for a duplicate). Not part of
    #: equality: two results are the same when they name the same stored message.
    produced_at_ms: int = 0
    #: The ``Record`` as stored, so the broker can hand it to groups without rebuilding it;
    #: ``None`` for a duplicate (the original is not read back). Not part of equality.
    message: Record | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AppendResult):
            return NotImplemented
        return (self.qid, self.offset, self.duplicate) == (
            other.qid,
            other.offset,
            other.duplicate,
        )

    __hash__: Any = None  # mutable and compared by value, as the dataclass was


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic and its retention (None: unbounded).

    ``retention_ms``: messages produced longer ago than this are deleted. ``retention_bytes``:
    per queue, the oldest messages are deleted while the queue stores more than this many
    message bytes (body + headers + key + id, as ``store._retention.message_bytes`` counts).
    """

    name: str
    queues: int
    retention_ms: int | None = None
    retention_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class QueueStats:
    qid: int
    min_offset: int
    next_offset: int


@dataclass(frozen=True, slots=True)
class QueueProgress:
    """Persisted progress of one group on one queue.

    ``committed`` is the lowest unfinished offset. Above it, what is already finished (acked
    or dead-lettered, so a restart does not replay it) is described in one of two forms:

    - the compact form (``read_to`` set), written by this version: below ``read_to`` every
      message is finished except the half-open ranges in ``open`` (messages that were held in
      memory) and the messages of the order values in ``parked`` from the given offset on
      (stuck keys whose waiting messages were released from memory). Its size grows with the
      messages held in memory and the number of parked keys, never with the messages
      finished behind a stuck key;
    - the range form (``read_to`` None): ``finished`` lists half-open ranges ``[start, end)``
      above ``committed`` that are finished (sorted, disjoint). Older versions wrote it.

    ``attempt_ceiling`` bounds the delivery numbers (``attempt``) the group may have handed
    out: after a restart or a change of owner, deliveries are numbered above it
    (``cproxy.engine.work.ATTEMPT_RESERVE``). Kept in the compact form's JSON; 0 when absent.
    """

    committed: int
    finished: tuple[tuple[int, int], ...] = ()
    read_to: int | None = None
    open: tuple[tuple[int, int], ...] = ()
    parked: tuple[tuple[str, int], ...] = ()
    #: Unordered delayed messages released from memory: ``(start, end, horizon_ms)``
    #: segments; in each, the unordered messages due after ``horizon_ms`` are unread
    #: (``cproxy.engine.delays``). Compact form only.
    delayed: tuple[tuple[int, int, int], ...] = ()
    attempt_ceiling: int = 0

    def detail_json(self) -> bytes:
        """Everything but ``committed``, as stores keep it in one JSON column."""
        if self.read_to is None:
            return orjson.dumps(self.finished)
        detail: dict[str, object] = {
            "read_to": self.read_to,
            "open": self.open,
            "parked": self.parked,
        }
        if self.delayed:  # absent unless used: older versions read the same JSON
            detail["delayed"] = self.delayed
        if self.attempt_ceiling:
            detail["attempt_ceiling"] = self.attempt_ceiling
        return orjson.dumps(detail)

    @classmethod
    def from_detail_json(cls, committed: int, detail: bytes | str) -> QueueProgress:
        """The inverse of ``detail_json``; a JSON list is the range form."""
        data = orjson.loads(detail)
        if isinstance(data, list):
            return cls(committed, tuple((int(s), int(e)) for s, e in data))
        return cls(
            committed,
            read_to=int(data["read_to"]),
            open=tuple((int(s), int(e)) for s, e in data["open"]),
            parked=tuple((str(v), int(o)) for v, o in data["parked"]),
            delayed=tuple((int(s), int(e), int(h)) for s, e, h in data.get("delayed", ())),
            attempt_ceiling=int(data.get("attempt_ceiling", 0)),
        )


@dataclass(frozen=True, slots=True)
class DeadLetter:
    group: str
    message: Record
    attempts: int
    last_error: str | None
    dead_lettered_at_ms: int
    #: True while the dead letter has been redriven and is being delivered again.
    redriving: bool = False
