# cproxy: compiled (mypyc), see cproxy/_native.py
"""Reading for one group: what to read from the store next, and taking in what was read.

The reader keeps each queue's fetch position and completion tracker (``QueueCursor``) and plans
two kinds of read, both plain range reads ``[from_offset, from_offset + max_count)`` that the
driver makes and hands back unchanged (``cproxy.broker.drive``):

- a *fetch* of new messages at a queue's fetch position, admitted into chains;
- a *reload* of a parked chain: a range below the fetch position, of which the reader keeps
  only the chain's own messages. A long range takes several reads; each hands back where it
  stopped, so nothing past a cut is lost.

Memory stays within ``max_buffered``: reads are planned for the free space only, admission
stops at the bound, and chains whose head is stuck (or delayed) are parked when they fill the
buffer. Unordered delayed messages due far off are not held at all: a third kind of read, a
*delay rescan*, finds them again when they are due (``cproxy.engine.delays``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final

from cproxy.engine.cursor import FetchRequest, QueueCursor
from cproxy.engine.deadlines import earliest
from cproxy.engine.orderkey import by_key
from cproxy.engine.readback import ReadBack
from cproxy.engine.sequencer import WAKE_LEAD_MS, Sequencer
from cproxy.engine.work import Chain, Entry, State, Tally
from cproxy.model import QueueProgress, QueueRef, Record

#: Largest read the reader asks for at once, in messages.
FETCH_BATCH: Final = 1000
#: Messages scanned per store read while reloading a parked chain.
RELOAD_SCAN_BATCH: Final = 2000
#: A head in flight this long (ms) counts as stuck when the buffer is full.
PARK_AFTER_MS: Final = 1000
#: How often (ms) a full buffer is checked for stuck chains to park.
PARK_CHECK_INTERVAL_MS: Final = 100


def _is_stuck(head: Entry, now_ms: int) -> bool:
    if head.state in (State.RETRYING, State.EXHAUSTED):
        return True
    if head.state is State.DELAYED:
        return head.due_ms - now_ms > WAKE_LEAD_MS  # else it is about to be ready
    return head.state is State.IN_FLIGHT and (
        head.charged > 0 or now_ms - head.blocked_since_ms >= PARK_AFTER_MS
    )


def _has_work(cur: QueueCursor) -> bool:
    """Something to read for this queue: new messages, or a restore or scan under way."""
    return cur.fetch_offset < cur.end_offset or cur.catching_up


def _hold(message: Record, first_read: bool) -> Entry:
    """No filter or transform: every read message is held."""
    return Entry(message)


class Reader:
    """Fetch positions and read planning of one group's queues."""

    __slots__ = (
        "_cursors",
        "_extractors",
        "_max_buffered",
        "_next_park_check_ms",
        "_readback",
        "_rotation",
        "_screen",
        "_seq",
        "_tally",
        "_unread",
    )

    def __init__(
        self,
        progress: Mapping[QueueRef, QueueProgress],
        end_offsets: Mapping[QueueRef, int],
        max_buffered: int,
        extractors: Mapping[str, Callable[[Record], str | None]],
        sequencer: Sequencer,
        tally: Tally,
        screen: Callable[[Record, bool], Entry | None] | None = None,
        reread_base: int = 0,
    ) -> None:
        """``screen(message, first_read)`` gives the entry to hold for a read message, or
        None when it is not held (a group's filter); ``first_read`` is False when a message
        is read again (a reload). None: every message is held as it is. ``reread_base``:
        the delivery numbers reserved before this load (``QueueCursor.reread_base``)."""
        sample = max(1, max_buffered // 4)
        self._cursors = {
            ref: QueueCursor(ref[0], ref[1], p, end_offsets.get(ref, 0), sample, reread_base)
            for ref, p in progress.items()
        }
        self._max_buffered = max_buffered
        self._extractors = dict(extractors)
        self._seq = sequencer
        self._tally = tally
        self._screen = screen or _hold
        self._readback = ReadBack(sequencer, tally, max_buffered, self._screen, self._extract)
        self._rotation = 0
        self._next_park_check_ms = 0
        #: Cursors that may have something to read (new messages, or a restore or scan
        #: after a restart): planning looks only at these, not at every queue. A superset:
        #: every change that can create work adds the cursor (``_touch``); ``plan`` drops
        #: those it finds with nothing to read.
        self._unread: dict[QueueRef, QueueCursor] = {
            ref: cur for ref, cur in self._cursors.items() if _has_work(cur)
        }

    def _extract(self, message: Record) -> str | None:
        return self._extractors[message.topic](message)

    def cursor(self, topic: str, qid: int) -> QueueCursor | None:
        return self._cursors.get((topic, qid))

    def cursors(self) -> Iterator[QueueCursor]:
        return iter(self._cursors.values())

    def screen_again(self, message: Record) -> Entry | None:
        """The entry to hold for a message delivered again (a replay): None when the
        group's filter leaves it out; the group's transform applied."""
        return self._screen(message, False)

    def add_queue(
        self, ref: QueueRef, progress: QueueProgress, end_offset: int, reread_base: int
    ) -> None:
        """Start reading a queue from its persisted progress (cluster: it became owned);
        its stored messages are numbered above ``reread_base``."""
        sample = max(1, self._max_buffered // 4)
        cur = QueueCursor(ref[0], ref[1], progress, end_offset, sample, reread_base)
        self._cursors[ref] = cur
        if _has_work(cur):
            self._unread[ref] = cur

    def remove_queue(self, ref: QueueRef) -> None:
        """Stop reading a queue (its held entries were dropped first); reads of it that are
        still under way find no cursor and are ignored."""
        self._cursors.pop(ref, None)
        self._unread.pop(ref, None)

    # -- new messages --------------------------------------------------------------------------
    def note_end(self, topic: str, qid: int, end_offset: int) -> None:
        """The store's next offset for a queue grew (a produce landed)."""
        cur = self._cursors.get((topic, qid))
        if cur is not None and end_offset > cur.end_offset:
            cur.end_offset = end_offset
            self._unread[(topic, qid)] = cur

    def offer(self, topic: str, qid: int, messages: Sequence[Record]) -> bool:
        """Take just-stored consecutive messages without a store read, if caught up."""
        cur = self._cursors.get((topic, qid))
        if cur is None or not messages:
            return False
        self.note_end(topic, qid, messages[-1].offset + 1)
        if (
            cur.fetch_offset != messages[0].offset
            or cur.catching_up
            or self._tally.held + len(messages) > self._max_buffered
        ):
            return False
        self._take_fetch(cur, messages)
        return True

    # -- planning ------------------------------------------------------------------------------
    def plan(self, now_ms: int) -> list[FetchRequest]:
        """Reads to make now: reloads of parked chains first, then new messages."""
        self._seq.note_time(now_ms)
        self._park_if_stuck(now_ms)
        space = self._max_buffered - self._tally.held
        requests: list[FetchRequest] = []
        for cur in self._cursors.values():
            space -= self._plan_delay_rescan(cur, now_ms, space, requests)
        unread = self._unread
        for ref in [ref for ref, cur in unread.items() if not _has_work(cur)]:
            del unread[ref]
        # Ranges held in memory before a restart come back first, whole, in offset order.
        for cur in unread.values():
            if cur.restore and space > 0:
                start, end = cur.restore[0]
                count = min(FETCH_BATCH, space, end - start)
                request = FetchRequest(
                    cur.topic, cur.qid, start, count, cur.epoch, upto=end, restore=True
                )
                requests.append(request)
                space -= count
            elif cur.scan and space > 0:
                # After the restore: one scan reads back every stuck chain of this queue.
                count = min(RELOAD_SCAN_BATCH, cur.fetch_offset - cur.scan_from)
                requests.append(
                    FetchRequest(
                        cur.topic,
                        cur.qid,
                        cur.scan_from,
                        count,
                        cur.epoch,
                        upto=cur.fetch_offset,
                        scan=True,
                    )
                )
        deferred: list[Chain] = []
        while space > 0 and (chain := self._seq.next_reload()) is not None:
            for qid, start in sorted(chain.parked.items()):
                cur = self._cursors[(chain.topic, qid)]
                if cur.catching_up:
                    continue  # its restore reads admit (or park) these messages first
                count = min(RELOAD_SCAN_BATCH, cur.fetch_offset - start)
                chain.start_reload(qid)
                requests.append(
                    FetchRequest(
                        chain.topic, qid, start, count, cur.epoch, chain.value, cur.fetch_offset
                    )
                )
                space -= count
            if chain.parked:
                deferred.append(chain)
        for chain in deferred:
            self._seq.reload_later(chain)
        curs = [p for p in unread.values() if p.fetch_offset < p.end_offset and not p.catching_up]
        if not curs or space <= 0:
            return requests
        share = max(1, min(FETCH_BATCH, space // len(curs)))
        self._rotation = (self._rotation + 1) % len(curs)
        for cur in curs[self._rotation :] + curs[: self._rotation]:
            count = min(share, space, cur.end_offset - cur.fetch_offset)
            if count <= 0:
                break
            requests.append(FetchRequest(cur.topic, cur.qid, cur.fetch_offset, count, cur.epoch))
            space -= count
        return requests

    def _plan_delay_rescan(
        self, cur: QueueCursor, now_ms: int, space: int, requests: list[FetchRequest]
    ) -> int:
        """Plan the next read of the queue's delay rescan, starting one when due (even
        without buffer space: it reads when there is); returns the space it may use."""
        read = cur.delays.next_read(now_ms, cur.fetch_offset, RELOAD_SCAN_BATCH)
        if read is None or space <= 0:
            return 0
        start, count, upto = read
        requests.append(
            FetchRequest(cur.topic, cur.qid, start, count, cur.epoch, upto=upto, delayed=True)
        )
        return min(space, count)

    def next_rescan_ms(self) -> int | None:
        """When a delay rescan should next start (ms), or None."""
        first: int | None = None
        for cur in self._cursors.values():
            first = earliest(first, cur.delays.rescan_at_ms())
        return first

    def has_unread(self) -> bool:
        """A queue has messages not read yet, or a restore or scan under way."""
        return any(_has_work(cur) for cur in self._unread.values())

    def delayed_released(self) -> int:
        """Unordered delayed messages released from memory (as far as known)."""
        return sum(c.delays.released for c in self._cursors.values())

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
            or self._tally.count(State.WAITING) + self._tally.count(State.DELAYED) == 0
            or now_ms < self._next_park_check_ms
        ):
            return
        # Sorting chains is O(n log n): with a full buffer, do it at most every 100 ms.
        self._next_park_check_ms = now_ms + PARK_CHECK_INTERVAL_MS
        self._seq.park_stuck(lambda head: _is_stuck(head, now_ms), limit * 3 // 4)

    # -- taking in what was read ---------------------------------------------------------------
    def on_read_failed(self, request: FetchRequest) -> None:
        """A planned read failed: a fetch is simply planned again; a reload is re-queued."""
        if request.is_reload:
            self._readback.reload_failed(request, self._cursors.get((request.topic, request.qid)))

    def on_read(self, request: FetchRequest, messages: Sequence[Record]) -> None:
        """Hand back the messages read for ``request``: the store's range, unfiltered."""
        cur = self._cursors.get((request.topic, request.qid))
        if request.is_reload:
            self._readback.take_reload(request, cur, messages)
            return
        if cur is None or cur.epoch != request.epoch:
            return  # planned before a seek: stale
        if request.restore:
            self._readback.take_restore(request, cur, messages)
            return
        if request.scan:
            self._readback.take_scan(request, cur, messages)
            return
        if request.delayed:
            self._take_delay_rescan(request, cur, messages)
            return
        if cur.fetch_offset != request.from_offset:
            return  # overtaken by an offer: stale
        if not messages:
            # The store has nothing there (yet): trust it over our notion of the end.
            cur.end_offset = cur.fetch_offset
            return
        if messages[0].offset > cur.fetch_offset:
            cur.skip_to(messages[0].offset)  # retention deleted what was not read yet
        self._take_fetch(cur, messages)

    def _take_delay_rescan(
        self, request: FetchRequest, cur: QueueCursor, messages: Sequence[Record]
    ) -> None:
        def admit(message: Record) -> bool:
            if self._tally.held >= self._max_buffered:
                return False
            entry = self._screen(message, True)  # its first screening
            if entry is not None:
                cur.renumber(entry)
                self._seq.admit(entry, None)
            return True

        cur.delays.take_rescan(
            request.from_offset,
            request.max_count,
            request.upto,
            messages,
            lambda m: (
                self._extract(m) is None
                and m.offset not in self._tally.held_offsets(cur.topic, cur.qid)
            ),
            admit,
        )

    def _take_fetch(self, cur: QueueCursor, messages: Sequence[Record]) -> None:
        # Runs for every message a group takes in: lookups are hoisted out of the loop, and
        # without a filter or transform the entry is built here rather than by ``_screen``.
        limit = self._max_buffered
        window = cur.delays
        tally = self._tally
        extract = self._extractors[cur.topic]
        keyed = extract is by_key  # read the key here: cheaper than a call per message
        # The sequencer's method is called on it, not hoisted as a bound method: compiled,
        # a native method is a direct C call, a bound method object a Python call.
        seq = self._seq
        screen = None if self._screen is _hold else self._screen
        legacy = cur.legacy
        fetch_offset = cur.fetch_offset
        reread_until = cur.reread_until
        for message in messages:
            offset = message.offset
            if legacy is not None and legacy.is_finished(offset):
                fetch_offset = offset + 1
                continue  # finished before a restart
            due = message.deliver_at_ms
            value = message.key if keyed else extract(message)
            if due is not None and value is None and window.releases(due):
                window.release(offset, due)  # far off: found again by a rescan
                fetch_offset = offset + 1
                continue
            if tally.held >= limit:
                # An offer() on another queue may have used the space this read was
                # planned with: stop here and read the rest later.
                break
            if screen is None:
                entry = Entry(message)
            elif (screened := screen(message, True)) is not None:
                entry = screened
            else:
                fetch_offset = offset + 1
                continue
            if offset < reread_until:
                entry.attempt = cur.reread_base
            seq.admit(entry, value)
            fetch_offset = offset + 1
        cur.fetch_offset = fetch_offset
        cur.end_offset = max(cur.end_offset, fetch_offset)

    # -- operator actions ----------------------------------------------------------------------
    def reset(self, topic: str, qid: int, offset: int, reread_base: int) -> None:
        """Restart a queue at ``offset``: reads planned before are recognised as stale; what
        is read again is numbered above ``reread_base``."""
        cur = self._cursors[(topic, qid)]
        cur.reset(offset, reread_base)
        self._unread[(topic, qid)] = cur

    def skip_to(self, topic: str, qid: int, min_offset: int) -> int:
        """Retention moved the queue's first offset: skip what is gone; returns how many."""
        cur = self._cursors.get((topic, qid))
        if cur is None:
            return 0
        self._unread[(topic, qid)] = cur  # conservative: plan() drops it if nothing to read
        return cur.skip_to(min_offset)
