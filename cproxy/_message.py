# cproxy: compiled (mypyc), see cproxy/_native.py
"""``Record`` and ``NewMessage``, in a module of their own so that mypyc compiles them
(``cproxy/_native.py``): the compiled engine, produce path and store read their fields several
times per message, and a native class's fields are read directly instead of through Python's
attribute lookup. ``cproxy.model`` re-exports them; import them from there.
"""

from __future__ import annotations

from dataclasses import dataclass

#: (topic, qid): one queue of one topic.
QueueRef = tuple[str, int]
#: (topic, qid, offset): one message.
MessageRef = tuple[str, int, int]


@dataclass(slots=True)
class Record:
    """A stored message: what a store keeps per message (on disk one MessagePack record,
    ``store/_records.py``), and what the engine holds and hands out. ``body_json`` is the
    UTF-8 JSON encoding of the body. Not the SDK's ``Message``, which is one delivery of it
    to a consumer (docs/architecture.md, "One message through the system")."""

    topic: str
    qid: int
    offset: int
    key: str | None
    body_json: bytes
    headers_json: bytes | None
    id: str | None
    produced_at_ms: int
    #: Not delivered before this time (ms since the epoch); None: not delayed.
    deliver_at_ms: int | None = None

    # Written out although ``dataclass`` would generate the same: a generated ``__init__``
    # is interpreted Python, this one is compiled with the class (``dataclass`` keeps an
    # ``__init__`` the class defines).
    def __init__(
        self,
        topic: str,
        qid: int,
        offset: int,
        key: str | None,
        body_json: bytes,
        headers_json: bytes | None,
        id: str | None,
        produced_at_ms: int,
        deliver_at_ms: int | None = None,
    ) -> None:
        self.topic = topic
        self.qid = qid
        self.offset = offset
        self.key = key
        self.body_json = body_json
        self.headers_json = headers_json
        self.id = id
        self.produced_at_ms = produced_at_ms
        self.deliver_at_ms = deliver_at_ms

    @property
    def ref(self) -> MessageRef:
        return (self.topic, self.qid, self.offset)


@dataclass(slots=True)
class NewMessage:
    """A message of a produce call, from the HTTP layer to the store; nothing stored yet.

    ``qid`` is the queue the producer asked for, or ``None`` to let the broker choose: the
    broker fills it in place (placement by key, else round robin) before ``append``, and
    stores require it set.
    """

    key: str | None
    body_json: bytes
    headers_json: bytes | None = None
    id: str | None = None
    qid: int | None = None
    #: Not delivered before this time (ms since the epoch); None: not delayed. The broker
    #: sets it from ``delay_ms`` with its clock.
    deliver_at_ms: int | None = None
    #: Not delivered before this many ms after it is stored, as the producer asked (never
    #: with ``deliver_at_ms``); the broker turns it into ``deliver_at_ms``.
    delay_ms: int | None = None

    # Written out for the same reason as ``Record.__init__``.
    def __init__(
        self,
        key: str | None,
        body_json: bytes,
        headers_json: bytes | None = None,
        id: str | None = None,
        qid: int | None = None,
        deliver_at_ms: int | None = None,
        delay_ms: int | None = None,
    ) -> None:
        self.key = key
        self.body_json = body_json
        self.headers_json = headers_json
        self.id = id
        self.qid = qid
        self.deliver_at_ms = deliver_at_ms
        self.delay_ms = delay_ms
