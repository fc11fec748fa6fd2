"""The store interface: where messages and group progress live.

The engine never sees a store; the broker (``cproxy.broker``) drives one. Implementations:
``memory.MemoryStore`` (tests), ``sqlite.SqliteStore`` (the embedded default) and
``postgres.PostgresStore`` (shared by several proxies). Everything is async so a networked
backend fits without touching callers.

The interface is two protocols, because the two halves scale differently and a deployment
may one day put them in different places:

- ``MessageLog``: topics and their queues of messages (append, read, seek by time). Every
  proxy of a cluster appends to and reads from the same log.
- ``GroupStateStore``: consumer-group configs, progress, dead letters and redrives. Each
  group is driven by one proxy at a time, which commits its state here.

``Store`` is both; every implementation so far is a ``Store``. Both halves share ``open``,
``close`` and ``ping`` (``Lifecycle``), so either can be used on its own.

Rules of the log (``MessageLog``):

- Offsets per (topic, qid) start at 0 and are contiguous and increasing.
- ``append`` is atomic: every message of the call is stored, or none is (and then it raises).
- ``append`` requires ``NewMessage.qid`` to be set (the broker places it, see
  ``cproxy.placement``); a message with ``qid=None`` raises ``InvalidRequest``. Each
  ``AppendResult`` carries the stored ``Record`` (``None`` for a duplicate), so callers need
  not rebuild it.
- Dedup: a message whose ``id`` was stored on the same topic within ``dedup_window_ms`` is not
  stored again; its result is the original qid/offset with ``duplicate=True``. Two messages with
  one id in a single call: the second is a duplicate of the first. An entry counts while
  ``now_ms - produced_at_ms < dedup_window_ms``; a window of 0 disables dedup.
- ``produced_at_ms`` is non-decreasing per queue (the store clamps to the previous value), so
  ``offset_for_time`` can binary-search.
- Retention (``TopicInfo.retention_ms`` / ``retention_bytes``; rules in ``_retention``): only
  ``apply_retention`` deletes messages, oldest first, and each queue's ``min_offset`` is then
  the lowest offset still stored (``next_offset`` when the queue is empty). Offsets are never
  reused: ``next_offset`` survives its queue being emptied, and restarts. A read from below
  ``min_offset`` returns messages from ``min_offset`` on; ``offset_for_time`` answers within
  ``[min_offset, next_offset]``.
- ``delete_topic`` removes the topic, its messages and dedup entries, and what groups kept of
  it (progress and dead letters name a topic that no longer exists; the broker refuses while a
  group reads it). The name can be created again, from offset 0.

Rules of the group state (``GroupStateStore``):

- ``commit`` writes progress, new dead letters and finished redrives in one transaction;
  ``redrive_done`` is applied before ``dead_letters``, so a redriven message that is
  dead-lettered again stays dead-lettered.
- Progress and dead letters name topics of the log: an unknown one makes ``commit`` raise
  ``TopicNotFound`` and write nothing.

Rules of both (``Store``):

- ``commit_with_outputs`` appends messages to topics (each output as ``append`` would: its
  own dedup, placement checks and offsets) and writes a group's progress (as ``commit``
  would, fenced alike) in ONE transaction: all of it is durable when it returns, or nothing
  is written and it raises. This is the ack with ``produce`` (guarantee 10).

- Unknown topics raise ``TopicNotFound`` (a ``topic`` filter on dead letters just matches
  nothing); a qid outside the topic raises ``InvalidRequest``.
- Foreign errors are translated to ``cproxy.errors.StoreError`` at this boundary; so is any
  call on a store that is not open.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from cproxy.model import (
    AppendResult,
    DeadLetter,
    MessageRef,
    NewMessage,
    QueueProgress,
    QueueRef,
    QueueStats,
    Record,
    TopicInfo,
)


class Lifecycle(Protocol):
    """What both halves share: opening, closing and the health check."""

    async def open(self) -> None:
        """Open files/connections and create the schema if needed."""

    async def close(self) -> None:
        """Flush and release everything; idempotent."""

    async def ping(self) -> bool:
        """True when the store can serve requests (used by ``/readyz``)."""


class MessageLog(Lifecycle, Protocol):
    """Topics and their append-only queues of messages (see the module docstring's rules)."""

    # -- topics --------------------------------------------------------------------------------
    async def create_topic(
        self,
        name: str,
        queues: int,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
    ) -> tuple[TopicInfo, bool]:
        """Create a topic; returns ``(info, created)``.

        Same name and queue count again returns ``created=False`` and the stored info (its
        retention unchanged: ``update_topic`` changes it); a different queue count raises
        ``TopicConflict``. A retention bound that is not None or a positive integer raises
        ``InvalidRequest``.
        """

    async def update_topic(
        self, name: str, retention_ms: int | None, retention_bytes: int | None
    ) -> TopicInfo:
        """Set both retention bounds of a topic (None: unbounded); returns the new info.

        Takes effect at the next ``apply_retention``. Raises ``TopicNotFound``, and
        ``InvalidRequest`` for a bound that is not None or a positive integer.
        """

    async def delete_topic(self, name: str) -> None:
        """Delete a topic and everything stored of it (see the module rules); raises
        ``TopicNotFound``. Large topics are deleted in several short transactions."""

    async def list_topics(self) -> list[TopicInfo]: ...

    async def queue_stats(self, topic: str) -> list[QueueStats]:
        """Per-queue ``min_offset`` / ``next_offset``; raises ``TopicNotFound``."""

    # -- messages ------------------------------------------------------------------------------
    async def append(
        self,
        topic: str,
        messages: Sequence[NewMessage],
        now_ms: int,
        dedup_window_ms: int,
    ) -> list[AppendResult]:
        """Append atomically; results are in input order. Raises ``TopicNotFound``."""

    async def read(self, topic: str, qid: int, from_offset: int, max_count: int) -> list[Record]:
        """Messages with ``offset >= from_offset`` in offset order, at most ``max_count``."""

    async def offset_for_time(self, topic: str, qid: int, timestamp_ms: int) -> int:
        """First stored offset with ``produced_at_ms >= timestamp_ms`` (``next_offset`` if
        none), never below ``min_offset``."""

    async def apply_retention(self, topic: str, now_ms: int) -> dict[int, int]:
        """Delete the topic's messages past retention at ``now_ms``; returns ``{qid:
        min_offset}`` for the queues whose ``min_offset`` moved (empty when none did).

        Deletes in bounded batches, each its own short transaction, so produce calls are not
        stalled behind one long delete. Raises ``TopicNotFound``.
        """


class GroupStateStore(Lifecycle, Protocol):
    """Consumer-group configs, progress, dead letters and redrives."""

    # -- groups --------------------------------------------------------------------------------
    async def save_group(self, name: str, config_json: bytes) -> None:
        """Create or replace the stored config of a group."""

    async def load_groups(self) -> dict[str, bytes]:
        """Every stored group's config, by name."""

    async def delete_group(self, name: str) -> None:
        """Drop the group's config, progress and dead letters."""

    async def load_progress(self, group: str) -> dict[QueueRef, QueueProgress]: ...

    async def commit(
        self,
        group: str,
        progress: Mapping[QueueRef, QueueProgress],
        dead_letters: Sequence[DeadLetter] = (),
        redrive_done: Sequence[MessageRef] = (),
    ) -> None:
        """Persist progress, upsert dead letters, delete finished redrives: one transaction."""

    # -- dead letters --------------------------------------------------------------------------
    async def list_dead_letters(
        self, group: str, topic: str | None, limit: int
    ) -> list[DeadLetter]:
        """Dead letters in (topic, qid, offset) order, redriving ones excluded."""

    async def count_dead_letters(self, group: str) -> int:
        """How many dead letters the group has, redriving ones excluded."""

    async def start_redrive(
        self,
        group: str,
        topic: str | None,
        queues: Collection[QueueRef] | None = None,
        refs: Collection[MessageRef] | None = None,
    ) -> list[DeadLetter]:
        """Mark dead letters as redriving and return them in (topic, qid, offset) order;
        ``queues`` (cluster: those this proxy owns) limits it to dead letters of those,
        ``refs`` to those messages (refs that are no dead letter are ignored)."""

    async def delete_dead_letters(
        self,
        group: str,
        topic: str | None = None,
        refs: Collection[MessageRef] | None = None,
        before_ms: int | None = None,
    ) -> int:
        """Delete dead letters (redriving ones excluded) of ``topic`` (None: any), among
        ``refs`` (None: any), dead-lettered before ``before_ms`` (None: any time); returns
        how many were deleted."""

    async def load_redriving(self, group: str) -> list[DeadLetter]:
        """Dead letters marked redriving (to resume delivery after a restart)."""


class Store(MessageLog, GroupStateStore, Protocol):
    """A log and the group state in one place: what the broker drives."""

    async def commit_with_outputs(
        self,
        group: str,
        progress: Mapping[QueueRef, QueueProgress],
        outputs: Sequence[tuple[str, Sequence[NewMessage]]],
        now_ms: int,
        dedup_window_ms: int,
        redrive_done: Sequence[MessageRef] = (),
    ) -> list[list[AppendResult]]:
        """Append each output ``(topic, messages)`` and persist ``progress`` (and finished
        redrives, as ``commit`` does) in one transaction (see the module rules); the append
        results of each output, in order.
        Raises ``TopicNotFound``/``InvalidRequest`` as ``append`` and ``commit`` do, and
        ``QueueNotOwned`` when a fenced queue of ``progress`` was lost; nothing is written
        then."""
