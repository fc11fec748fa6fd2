"""Background batching behind ``Producer.submit`` and ``AsyncProducer.submit``.

:class:`Lanes` is the bookkeeping both producers share (no I/O, no threads, no clock of its
own): one lane of pending messages per topic. A lane sends at most one batch at a time and
takes its next batch only when the previous one is settled (stored, or finally failed after
the client's retries). That is what keeps every key's messages in submit order, across retries
and a server that stalls, without tracking keys: a topic's batches reach the server one after
another, and a batch is stored atomically in its order. Different topics send in parallel.

The cost of one batch in flight per topic is small: while it is on the wire the lane collects
the next one (up to ``batch_max_messages``), so a busy producer sends full batches back to
back, and each call's latency is spread over hundreds of messages.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from consumer_sdk.errors import BadRequest, PayloadTooLarge, ValidationFailed
from consumer_sdk.models import SendResult

F = TypeVar("F")

DEFAULT_BATCH_MAX_MESSAGES = 500
DEFAULT_LINGER_MS = 5
#: Under the server's default 8 MiB per produce call, with room for the envelope.
DEFAULT_BATCH_MAX_BYTES = 4 * 1024 * 1024

#: Answers that refuse a whole batch for what may be one message in it: the batch is then sent
#: again one message at a time, so only the refused messages fail.
REFUSED = (BadRequest, ValidationFailed, PayloadTooLarge)


Settle = Callable[["Pending[F]", SendResult | None, BaseException | None], None]


@dataclass(slots=True)
class Pending(Generic[F]):
    """One submitted message: its JSON object as bytes, and the future of its result."""

    encoded: bytes
    has_id: bool
    future: F


@dataclass(frozen=True, slots=True)
class BatchSettings:
    batch_max_messages: int = DEFAULT_BATCH_MAX_MESSAGES
    linger_ms: int = DEFAULT_LINGER_MS
    batch_max_bytes: int = DEFAULT_BATCH_MAX_BYTES

    def __post_init__(self) -> None:
        if not 1 <= self.batch_max_messages <= 1000:
            raise ValueError("batch_max_messages must be 1..1000 (the server's default limit)")
        if self.linger_ms < 0:
            raise ValueError("linger_ms must be >= 0")
        if self.batch_max_bytes < 1024:
            raise ValueError("batch_max_bytes must be >= 1024")


class _Lane(Generic[F]):
    __slots__ = ("busy", "first_at", "pending", "size")

    def __init__(self) -> None:
        self.pending: deque[Pending[F]] = deque()
        self.first_at = 0.0  # when the oldest pending message was submitted (monotonic s)
        self.size = 0  # bytes pending
        self.busy = False  # a batch of this topic is being sent


class Lanes(Generic[F]):
    """Pending messages per topic; callers hold their own lock around every method."""

    def __init__(self, settings: BatchSettings) -> None:
        self.settings = settings
        self._linger_s = settings.linger_ms / 1000
        self._lanes: dict[str, _Lane[F]] = {}
        #: Messages submitted and not yet settled (pending or in a batch on the wire).
        self.outstanding = 0
        #: While > 0 (a flush or close waits) lanes send what they have without lingering.
        self.flushing = 0

    def add(self, topic: str, item: Pending[F], now: float) -> bool:
        """Queue a message; True when its lane may have become due (full or first message)."""
        lane = self._lanes.get(topic)
        if lane is None:
            lane = self._lanes[topic] = _Lane()
        if not lane.pending:
            lane.first_at = now
        lane.pending.append(item)
        lane.size += len(item.encoded) + 1
        self.outstanding += 1
        return len(lane.pending) == 1 or self._full(lane)

    def _full(self, lane: _Lane[F]) -> bool:
        s = self.settings
        return len(lane.pending) >= s.batch_max_messages or lane.size >= s.batch_max_bytes

    def _due(self, lane: _Lane[F], now: float) -> bool:
        return (
            bool(lane.pending)
            and not lane.busy
            and (self.flushing > 0 or self._full(lane) or now - lane.first_at >= self._linger_s)
        )

    def take(self, now: float) -> list[tuple[str, list[Pending[F]]]]:
        """The batches to send now (each lane due and not busy); their lanes become busy."""
        out: list[tuple[str, list[Pending[F]]]] = []
        for topic, lane in self._lanes.items():
            if self._due(lane, now):
                out.append((topic, self._cut(lane)))
                lane.busy = True
        return out

    def _cut(self, lane: _Lane[F]) -> list[Pending[F]]:
        s = self.settings
        batch: list[Pending[F]] = []
        size = 0
        while lane.pending and len(batch) < s.batch_max_messages:
            nxt = len(lane.pending[0].encoded) + 1
            if batch and size + nxt > s.batch_max_bytes:
                break
            batch.append(lane.pending.popleft())
            size += nxt
        lane.size -= size
        # What stays keeps its first_at: it has waited behind a busy lane and goes next.
        return batch

    def done(self, topic: str, settled: int) -> None:
        """A batch of ``topic`` is settled (``settled`` messages resolved): the lane is free."""
        self._lanes[topic].busy = False
        self.outstanding -= settled

    def wait_s(self, now: float) -> float | None:
        """Seconds until the next idle lane is due; None when no idle lane has messages."""
        best: float | None = None
        for lane in self._lanes.values():
            if lane.pending and not lane.busy:
                left = (
                    0.0
                    if self.flushing or self._full(lane)
                    else (lane.first_at + self._linger_s - now)
                )
                best = left if best is None else min(best, left)
        return None if best is None else max(0.0, best)


def deliver(
    batch: Sequence[Pending[F]],
    send: Callable[[list[bytes], bool], list[SendResult]],
    settle: Settle[F],
) -> None:
    """Send one batch with ``send`` and settle each message (sync producers)."""
    try:
        results = send([p.encoded for p in batch], all(p.has_id for p in batch))
    except REFUSED as exc:
        if len(batch) == 1:
            settle(batch[0], None, exc)
            return
        for item in batch:  # in order: a key's later messages still follow its earlier ones
            deliver([item], send, settle)
        return
    except Exception as exc:  # a ClientError, or a bug: never leave a future unresolved
        for item in batch:
            settle(item, None, exc)
        return
    for item, result in zip(batch, results, strict=True):
        settle(item, result, None)


async def adeliver(
    batch: Sequence[Pending[F]],
    send: Callable[[list[bytes], bool], Awaitable[list[SendResult]]],
    settle: Settle[F],
) -> None:
    """The ``async`` twin of :func:`deliver`."""
    try:
        results = await send([p.encoded for p in batch], all(p.has_id for p in batch))
    except REFUSED as exc:
        if len(batch) == 1:
            settle(batch[0], None, exc)
            return
        for item in batch:
            await adeliver([item], send, settle)
        return
    except Exception as exc:
        for item in batch:
            settle(item, None, exc)
        return
    for item, result in zip(batch, results, strict=True):
        settle(item, result, None)
