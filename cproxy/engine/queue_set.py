# cproxy: compiled (mypyc), see cproxy/_native.py
"""Queues joining and leaving a group's engine while it runs (cluster mode, DESIGN.md s. 8).

A proxy in a cluster serves only the queues it owns, and ownership moves. These verbs are
``GroupEngine`` methods (mixed in from here); a single proxy never calls them.

- ``add_queue``: start serving a queue from its persisted progress.
- ``pause_queue``: the queue is *releasing*: hand out nothing new from it (its ready entries
  are set aside as ``pull`` meets them), while results for what is in flight still apply.
- ``in_flight_on``: how many of its messages are handed out (the hand-over waits for 0).
- ``queue_progress``: its progress in the persisted form, for the final commit.
- ``drop_queue``: forget everything held for it; results for it then answer ``unknown``.
"""

from __future__ import annotations

from collections.abc import Mapping

from mypy_extensions import trait

from cproxy.engine.reader import Reader
from cproxy.engine.sequencer import Sequencer
from cproxy.engine.work import ATTEMPT_RESERVE, Entry
from cproxy.model import MessageRef, QueueProgress, QueueRef


@trait  # see ``Operations``
class QueueSet:
    """Queue membership verbs, mixed into ``GroupEngine`` (which sets this state)."""

    _reader: Reader
    _seq: Sequencer
    _in_flight: dict[MessageRef, Entry]
    _persisted: dict[QueueRef, QueueProgress]
    #: Releasing queues, and their ready entries that ``pull`` set aside.
    _paused: dict[QueueRef, list[Entry]]
    _max_issued: int
    _ceiling: int

    # Methods of GroupEngine and Operations (see ``Operations`` for why not attributes).
    def progress(self) -> dict[QueueRef, QueueProgress]:
        raise NotImplementedError

    def seek(self, topic: str, targets: Mapping[int, int]) -> None:
        raise NotImplementedError

    def held_on(self, topic: str, qid: int) -> int:
        raise NotImplementedError

    def serves(self, topic: str, qid: int) -> bool:
        """Whether the queue is part of this engine (paused or not)."""
        return self._reader.cursor(topic, qid) is not None

    def served_queues(self) -> list[QueueRef]:
        """Every queue of this engine (paused or not)."""
        return [(c.topic, c.qid) for c in self._reader.cursors()]

    def add_queue(self, topic: str, qid: int, progress: QueueProgress, end_offset: int) -> None:
        """Serve a queue from ``progress`` (as persisted); ``end_offset`` is the store's next
        offset. A queue already served is left as it is.

        Its messages are numbered above the delivery numbers its former owner reserved
        (and above this engine's own), and more are reserved: the caller persists the
        engine's progress before handing anything of it out."""
        ref = (topic, qid)
        if self.serves(topic, qid):
            return
        base = max(self._max_issued, progress.attempt_ceiling)
        self._max_issued = base
        self._ceiling = max(self._ceiling, base + ATTEMPT_RESERVE)
        self._reader.add_queue(ref, progress, end_offset, base)
        self._persisted[ref] = progress

    def pause_queue(self, topic: str, qid: int) -> None:
        """Hand out nothing new from the queue (it is being released)."""
        if self.serves(topic, qid):
            self._paused.setdefault((topic, qid), [])

    def set_aside(self, entry: Entry) -> bool:
        """Called by ``pull`` for each ready entry while any queue is paused: True (and the
        entry kept aside, still READY) when its queue is paused."""
        message = entry.message
        aside = self._paused.get((message.topic, message.qid))
        if aside is None:
            return False
        aside.append(entry)
        return True

    def in_flight_on(self, topic: str, qid: int) -> int:
        """Messages of the queue handed out and not yet answered (held ones included)."""
        in_flight = sum(1 for t, q, _ in self._in_flight if t == topic and q == qid)
        return in_flight + self.held_on(topic, qid)

    def queue_progress(self, topic: str, qid: int) -> QueueProgress | None:
        """The queue's progress in its persisted form; None when it is not served."""
        return self.progress().get((topic, qid))

    def drop_queue(self, topic: str, qid: int) -> None:
        """Forget the queue: everything held for it is dropped (results for its deliveries
        answer ``unknown`` from now on) and it is read no more."""
        ref = (topic, qid)
        if not self.serves(topic, qid):
            return
        # Entries set aside left the ready deques: put them back so the drop finds them.
        for entry in self._paused.pop(ref, []):
            self._seq.retry_now(entry)
        self.seek(topic, {qid: 0})
        self._reader.remove_queue(ref)
        self._persisted.pop(ref, None)
