"""Reading for one group: what to read from the store next, and taking in what was read.

The reader keeps each queue's fetch position and completion tracker (``Partition``) and plans
two kinds of read, both plain range reads ``[from_offset, from_offset + max_count)`` that the
driver makes and hands back unchanged (``cproxy.broker.drive``):

- a *fetch* of new messages at a queue's fetch position, admitted into chains;
- a *reload* of a parked chain: a range below the fetch position, of which the reader keeps
  only the chain's own messages. A long range takes several reads; each hands back where it
  stopped, so nothing past a cut is lost.

Memory stays within ``max_buffered``: reads are planned for the free space only, admission
stops at the bound, and chains whose head is stuck are parked when they fill the buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from cproxy.engine.partition import FetchRequest, Partition
from cproxy.engine.sequencer import Sequencer
from cproxy.engine.work import Entry, State, Tally
from cproxy.model import Message, QueueProgress, QueueRef

#: Largest read the reader asks for at once, in messages.
FETCH_BATCH = 1000
#: Messages scanned per store read while reloading a parked chain.
RELOAD_SCAN_BATCH = 2000
#: A head in flight this long (ms) counts as stuck when the buffer is full.
PARK_AFTER_MS = 1000
#: How often (ms) a full buffer is checked for stuck chains to park.
PARK_CHECK_INTERVAL_MS = 100


def _is_stuck(head: Entry, now_ms: int) -> bool:
    if head.state in (State.RETRYING, State.EXHAUSTED):
        return True
    return head.state is State.IN_FLIGHT and (
        head.attempt > 1 or now_ms - head.blocked_since_ms >= PARK_AFTER_MS
    )


class Reader:
    """Fetch positions and read planning of one group's queues."""

    __slots__ = (
        "_cursor",
        "_extract",
        "_max_buffered",
        "_next_park_check_ms",
        "_partitions",
        "_seq",
        "_tally",
    )

    def __init__(
        self,
        progress: Mapping[QueueRef, QueueProgress],
        end_offsets: Mapping[QueueRef, int],
        max_buffered: int,
        extract: Callable[[Message], str | None],
        sequencer: Sequencer,
        tally: Tally,
    ) -> None:
        self._partitions = {
            ref: Partition(ref[0], ref[1], p, end_offsets.get(ref, 0))
            for ref, p in progress.items()
        }
        self._max_buffered = max_buffered
        self._extract = extract
        self._seq = sequencer
        self._tally = tally
        self._cursor = 0
        self._next_park_check_ms = 0

    def partition(self, topic: str, qid: int) -> Partition | None:
        return self._partitions.get((topic, qid))

    def partitions(self) -> Iterator[Partition]:
        return iter(self._partitions.values())

    # -- new messages --------------------------------------------------------------------------
    def note_end(self, topic: str, qid: int, end_offset: int) -> None:
        """The store's next offset for a queue grew (a produce landed)."""
        part = self._partitions.get((topic, qid))
        if part is not None and end_offset > part.end_offset:
            part.end_offset = end_offset

    def offer(self, topic: str, qid: int, messages: Sequence[Message]) -> bool:
        """Take just-stored consecutive messages without a store read, if caught up."""
        part = self._partitions.get((topic, qid))
        if part is None or not messages:
            return False
        self.note_end(topic, qid, messages[-1].offset + 1)
        if (
            part.fetch_offset != messages[0].offset
            or self._tally.held + len(messages) > self._max_buffered
        ):
            return False
        self._take_fetch(part, messages)
        return True

    # -- planning ------------------------------------------------------------------------------
    def plan(self, now_ms: int) -> list[FetchRequest]:
        """Reads to make now: reloads of parked chains first, then new messages."""
        self._park_if_stuck(now_ms)
        space = self._max_buffered - self._tally.held
        requests: list[FetchRequest] = []
        while space > 0 and (chain := self._seq.next_reload()) is not None:
            for qid, start in sorted(chain.parked.items()):
                part = self._partitions[(chain.topic, qid)]
                count = min(RELOAD_SCAN_BATCH, part.fetch_offset - start)
                chain.reloading += 1
                requests.append(
                    FetchRequest(
                        chain.topic, qid, start, count, part.epoch, chain.value, part.fetch_offset
                    )
                )
                space -= count
            chain.parked.clear()
        parts = [p for p in self._partitions.values() if p.fetch_offset < p.end_offset]
        if not parts or space <= 0:
            return requests
        share = max(1, min(FETCH_BATCH, space // len(parts)))
        self._cursor = (self._cursor + 1) % len(parts)
        for part in parts[self._cursor :] + parts[: self._cursor]:
            count = min(share, space, part.end_offset - part.fetch_offset)
            if count <= 0:
                break
            requests.append(
                FetchRequest(part.topic, part.qid, part.fetch_offset, count, part.epoch)
            )
            space -= count
        return requests

    def _park_if_stuck(self, now_ms: int) -> None:
        """Release waiting messages of stuck chains when they fill the buffer.

        Only chains whose head looks stuck are parked: retrying, exhausted, delivered more
        than once, or in flight for ``PARK_AFTER_MS``. A deep backlog of healthy keys is
        plain backpressure: their heads are acked soon and parking them would only cost
        store rescans.
        """
        limit = self._max_buffered
        if (
            self._tally.held < limit
            or self._tally.count(State.WAITING) == 0
            or now_ms < self._next_park_check_ms
        ):
            return
        # Sorting chains is O(n log n): with a full buffer, do it at most every 100 ms.
        self._next_park_check_ms = now_ms + PARK_CHECK_INTERVAL_MS
        self._seq.park_stuck(lambda head: _is_stuck(head, now_ms), limit * 3 // 4)

    # -- taking in what was read ---------------------------------------------------------------
    def on_read(self, request: FetchRequest, messages: Sequence[Message]) -> None:
        """Hand back the messages read for ``request``: the store's range, unfiltered."""
        part = self._partitions.get((request.topic, request.qid))
        if request.is_reload:
            self._take_reload(request, part, messages)
            return
        if part is None or part.epoch != request.epoch or part.fetch_offset != request.from_offset:
            return  # planned before a seek, or overtaken by an offer: stale
        if not messages:
            # The store has nothing there (yet): trust it over our notion of the end.
            part.end_offset = part.fetch_offset
            return
        self._take_fetch(part, messages)

    def on_read_failed(self, request: FetchRequest) -> None:
        """A planned read failed: a fetch is simply planned again; a reload is re-queued."""
        if not request.is_reload:
            return
        assert request.chain_value is not None
        chain = self._seq.chain(request.topic, request.chain_value)
        part = self._partitions.get((request.topic, request.qid))
        if chain is None:
            return
        if part is not None and part.epoch == request.epoch:
            chain.note_parked(request.qid, request.from_offset)
        self._seq.reload_done(chain)

    def _take_fetch(self, part: Partition, messages: Sequence[Message]) -> None:
        tracker = part.tracker
        limit = self._max_buffered
        for message in messages:
            if tracker.is_finished(message.offset):
                part.fetch_offset = message.offset + 1
                continue  # finished before a restart
            if self._tally.held >= limit:
                # An offer() on another queue may have used the space this read was
                # planned with: stop here and read the rest later.
                break
            self._seq.admit(Entry(message), self._extract(message))
            part.fetch_offset = message.offset + 1
        part.end_offset = max(part.end_offset, part.fetch_offset)

    def _take_reload(
        self, request: FetchRequest, part: Partition | None, messages: Sequence[Message]
    ) -> None:
        assert request.chain_value is not None
        chain = self._seq.chain(request.topic, request.chain_value)
        if chain is None:
            return
        if part is None or part.epoch != request.epoch:
            self._seq.reload_done(chain)
            return  # a seek dropped this queue's parked state meanwhile
        # Where the scan stopped: a full read may have more behind it; a short one reached
        # the end of what the store holds below ``upto``.
        scanned_to = (
            messages[-1].offset + 1 if len(messages) >= request.max_count else request.upto
        )
        for message in messages:
            offset = message.offset
            if offset >= request.upto:
                scanned_to = request.upto
                break
            if self._extract(message) != chain.value or part.tracker.is_finished(offset):
                continue
            if self._tally.held >= self._max_buffered:
                scanned_to = offset  # no room: the rest of the chain stays parked
                break
            self._seq.admit_reloaded(Entry(message, chain), chain)
        scanned_to = min(scanned_to, request.upto)
        if scanned_to < request.upto:
            chain.note_parked(request.qid, scanned_to)
        self._seq.reload_done(chain)

    # -- operator actions ----------------------------------------------------------------------
    def reset(self, topic: str, qid: int, offset: int) -> None:
        """Restart a queue at ``offset``: reads planned before are recognised as stale."""
        self._partitions[(topic, qid)].reset(offset)
