"""Plain immutable values the SDK hands out and takes in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: (topic, qid, offset): one message of one queue.
MessageRef = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class Message:
    """One delivery of a message to a consumer group.

    ``body`` is the decoded JSON value the producer sent. ``attempt`` is this delivery's
    number, the token a fenced result names: 1 for the first delivery of a fresh message, and
    every later hand-out of the message gets a higher one (also one that was not charged,
    e.g. the tail of a failed same-key run sent back, and after a restart of the server).
    ``charged_attempts`` counts the earlier deliveries that failed or timed out, what the
    group's ``max_attempts`` counts (0 on a first try). ``produced_at_ms`` is the server's
    clock at produce time, in Unix milliseconds.
    ``server`` is the base URL the message was pulled from: its ack goes back there.
    """

    topic: str
    qid: int
    offset: int
    key: str | None
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)
    attempt: int = 1
    produced_at_ms: int = 0
    server: str = ""
    #: With ``max_per_key`` > 1: the position, in its pull answer, of the first message of the
    #: same-key run this message belongs to (messages of one run are handled in order).
    run: int | None = None
    charged_attempts: int = 0
    #: Delivered again by a replay of its order value (``POST /v1/groups/{g}/replay``).
    replay: bool = False

    @property
    def ref(self) -> MessageRef:
        """``(topic, qid, offset)``: the message's identity within one server's store."""
        return (self.topic, self.qid, self.offset)

    def to_dict(self) -> dict[str, Any]:
        """The message in the pull answer's JSON shape (``server`` left out), e.g. to print."""
        return {
            "topic": self.topic,
            "qid": self.qid,
            "offset": self.offset,
            "key": self.key,
            "body": self.body,
            "headers": dict(self.headers),
            "attempt": self.attempt,
            "charged_attempts": self.charged_attempts,
            "produced_at_ms": self.produced_at_ms,
        }


_new = object.__new__
# Slot descriptors set fields without the frozen-dataclass __init__, whose per-field
# object.__setattr__ calls cost several microseconds per message on the pull path.
(
    _topic,
    _qid,
    _offset,
    _key,
    _body,
    _headers,
    _attempt,
    _produced,
    _server,
    _run,
    _charged,
    _replay,
) = (Message.__dict__[name].__set__ for name in Message.__dataclass_fields__)


def message_from_wire(m: Mapping[str, Any], server: str) -> Message:
    """A :class:`Message` from one element of a pull answer's ``messages`` (KeyError if bad)."""
    msg = _new(Message)
    _topic(msg, m["topic"])
    _qid(msg, m["qid"])
    _offset(msg, m["offset"])
    _key(msg, m.get("key"))
    _body(msg, m.get("body"))
    _headers(msg, m.get("headers") or {})
    _attempt(msg, m.get("attempt", 1))
    _produced(msg, m.get("produced_at_ms", 0))
    _server(msg, server)
    _run(msg, m.get("run"))
    _charged(msg, m.get("charged_attempts", 0))
    _replay(msg, m.get("replay", False))
    return msg


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where a produced message was stored.

    ``duplicate`` is True when a message with the same ``id`` was already stored on the topic
    within the server's dedup window: nothing new was stored and ``qid``/``offset`` are the
    original's.
    """

    qid: int
    offset: int
    duplicate: bool = False


_send_qid, _send_offset, _send_duplicate = (
    SendResult.__dict__[name].__set__ for name in SendResult.__dataclass_fields__
)


def send_result_from_wire(r: Mapping[str, Any]) -> SendResult:
    """A :class:`SendResult` from one element of a produce answer's ``results`` (KeyError,
    TypeError or ValueError if bad); set like :func:`message_from_wire`, for the same reason."""
    result = _new(SendResult)
    _send_qid(result, int(r["qid"]))
    _send_offset(result, int(r["offset"]))
    _send_duplicate(result, bool(r["duplicate"]))
    return result


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic: its name and number of queues (qids ``0..queues-1``)."""

    name: str
    queues: int


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A consumer group as listed by ``GET /v1/groups``: its name and the topics it reads."""

    name: str
    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class QueueResult:
    """Outcomes for messages of one queue, as sent with a pull or an ack.

    ``fails`` pairs each failed offset with the handler's error (or None); the server records
    the error on the message and shows it on its dead letter if attempts run out.
    """

    topic: str
    qid: int
    acks: tuple[int, ...] = ()
    fails: tuple[tuple[int, str | None], ...] = ()
    #: ``(offset, attempt)`` pairs fencing results to the delivery they answer: the server
    #: ignores (reports unknown) a result for an attempt that is no longer current. The
    #: consumer loops always send them; offsets not named here are unfenced.
    attempts: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class AckResult:
    """What the server did with a batch of results.

    ``unknown`` lists results for messages that were not in flight (already finished, timed out
    and redelivered, or never delivered): they changed nothing.
    """

    applied: int = 0
    unknown: tuple[MessageRef, ...] = ()
    #: For an ack with ``produce``: where each output message was stored, in request order.
    produced: tuple[SendResult, ...] = ()


@dataclass(frozen=True, slots=True)
class PullResult:
    """The answer to a pull: new deliveries plus what happened to the results it carried."""

    messages: tuple[Message, ...]
    results: AckResult


@dataclass(frozen=True, slots=True)
class ExtendResult:
    """``applied`` leases were extended; ``unknown`` messages were no longer in flight."""

    applied: int = 0
    unknown: tuple[MessageRef, ...] = ()


@dataclass(frozen=True, slots=True)
class Produce:
    """Messages to store on ``topic`` together with the ack of the message being handled.

    A consumer's handler returns one (or a list of them) instead of None: the message's ack
    and these messages are then sent in one call and stored in one transaction, so each input
    gives its outputs exactly once (docs/guarantees.md, guarantee 10). ``messages`` take the
    shape of :meth:`Producer.send_batch`'s.
    """

    topic: str
    messages: Sequence[OutgoingMessage]


#: A message to produce, as a mapping with the keys ``body`` (any JSON value, required),
#: ``key`` (str or None), ``headers`` (str -> str), ``id`` (str, for dedup) and ``qid`` (int).
OutgoingMessage = Mapping[str, Any]

__all__ = [
    "AckResult",
    "ExtendResult",
    "GroupInfo",
    "Message",
    "MessageRef",
    "OutgoingMessage",
    "Produce",
    "PullResult",
    "QueueResult",
    "SendResult",
    "TopicInfo",
]
