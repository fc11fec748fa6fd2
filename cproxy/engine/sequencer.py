# cproxy: compiled (mypyc), see cproxy/_native.py
"""Per-order-value chains and the ready queues (DDMQ's UpstreamJobBlockingQueue).

A *chain* holds the messages of one order value that are in memory: the *head* (the one
message that may be ready, in flight, retrying or exhausted) and the messages *waiting* behind
it in arrival order. Only the head is ever handed out, which is what keeps per-key order; a
message with no order value joins no chain and is ready at once.

When the head finishes, the next waiting message goes to the *reactivation* queue, which pulls
drain before the *fresh* queue of new work: a key that was already in progress keeps moving
ahead of keys not yet started, like DDMQ's reactivation queue.

*Parking* bounds memory without head-of-line blocking (docs/guarantees.md, bounded memory):
when stuck keys fill the buffer with waiting messages, those messages are dropped from memory
and the chain remembers, per queue, the earliest offset it dropped. Messages of a parked chain
that arrive later are dropped too. When the chain runs dry it asks to be *reloaded* from the
store from that offset.

*Delayed* messages (``deliver_at_ms`` still ahead) head their chain like any other but are
DELAYED, not ready, until their time (a due-time heap, ``advance``): later messages of their
order value wait behind them, other keys flow. A delayed head due more than
``SLEEP_BEYOND_MS`` away is not held at all: its chain is parked whole, head included, and
*sleeps* until ``WAKE_LEAD_MS`` before the head is due, when it is reloaded like any parked
chain. A delayed key then costs one parked-chain record (order value + first offset and a
wake time), never its messages. When the buffer is full, chains whose head is delayed are
put to sleep too (``park_stuck``), so delayed heads never keep undelayed keys out.
Unordered delayed messages hold no chain; the reader keeps those that are far off out of
memory (``cproxy.engine.delays``).

The ``Sequencer`` owns chains and ready queues (parallel-consumer's ``ShardManager``): callers
use its verbs and never reach into a chain's containers.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Final

from cproxy.engine.chains import ReadyQueue
from cproxy.engine.deadlines import DeadlineHeap, earliest
from cproxy.engine.work import DELAYED, NO_ENTRIES, READY, WAITING, Chain, Entry, State, Tally

#: A delayed chain head due further than this (ms) from now is not held: the chain sleeps.
SLEEP_BEYOND_MS: Final = 3000
#: A sleeping chain is reloaded this long (ms) before its head is due. Over a second: the
#: driver's timer wakes at least once a second and then sleeps until the next due time, so
#: a head read back this early is handed out on time.
WAKE_LEAD_MS: Final = 1500


class Sequencer:
    """Chains and ready queues of one group, keyed by (topic, order value)."""

    __slots__ = (
        "_chains",
        "_delayed",
        "_now_ms",
        "_ready",
        "_reloads",
        "_sleep_seq",
        "_sleeping",
        "_tally",
    )

    def __init__(self, topics: list[str], tally: Tally) -> None:
        self._tally = tally
        self._chains: dict[tuple[str, str], Chain] = {}
        self._ready = {topic: ReadyQueue() for topic in topics}
        #: Chains that ran dry with parked messages: the reader plans their reloads.
        self._reloads: list[Chain] = []
        #: DELAYED entries by due time (at most the held entries, with lazy deletion).
        self._delayed = DeadlineHeap(DELAYED, "due_ms")
        #: Sleeping chains by wake time: (wake_ms, tie breaker, chain), one per sleeping key;
        #: an item is stale when the chain's ``wake_ms`` no longer matches.
        self._sleeping: list[tuple[int, int, Chain]] = []
        self._sleep_seq = itertools.count()
        #: The latest time the driver told us (ms): decides whether a new head is due.
        self._now_ms = 0

    # -- admission -----------------------------------------------------------------------------
    def admit(self, entry: Entry, value: str | None, *, force: bool = False) -> bool:
        """Hold a newly read message: ready when it heads its chain, else waiting.

        Returns False, holding nothing, when the chain is parked: the message's offset is
        recorded for the reload instead. ``force`` admits past parking (redriven dead letters
        cannot be read back from the store).
        """
        if value is None:
            self._make_head(entry, reactivated=False)
            return True
        key = (entry.message.topic, value)
        chain = self._chains.get(key)
        if chain is None:
            chain = self._chains[key] = Chain(key[0], value)
        elif chain.is_parked and not force:
            chain.note_parked(entry.message.qid, entry.message.offset)
            return False
        self._join(entry, chain, reactivated=False)
        return True

    def admit_reloaded(self, entry: Entry, chain: Chain) -> None:
        """Hold a message read back for a parked chain (a reload), in offset order."""
        if chain.wake_ms is not None:
            # The reload found a far delayed head and put the chain to sleep: the rest of
            # what it reads waits parked behind that head.
            chain.note_parked(entry.message.qid, entry.message.offset)
            return
        self._join(entry, chain, reactivated=True)

    def _join(self, entry: Entry, chain: Chain, *, reactivated: bool) -> None:
        entry.chain = chain
        if chain.head is None:
            chain.head = entry
            self._make_head(entry, reactivated=reactivated)
        else:
            if chain.waiting is NO_ENTRIES:
                chain.waiting = deque()
            chain.waiting.append(entry)
            self._tally.move(entry, WAITING)

    def chain(self, topic: str, value: str) -> Chain | None:
        return self._chains.get((topic, value))

    # -- delays --------------------------------------------------------------------------------
    def _make_head(self, entry: Entry, *, reactivated: bool) -> None:
        """``entry`` may be handed out next: ready, DELAYED until its ``deliver_at_ms``, or,
        for a chain head due later than ``SLEEP_BEYOND_MS`` from now, not held (the chain
        sleeps). A redriven dead letter was due already; so was a message sent back from a
        run or released by an operator (it was handed out, so its time had come, and the
        clock only moves on)."""
        due = entry.message.deliver_at_ms
        if due is None or due <= self._now_ms or entry.redriven:
            self._make_ready(entry, reactivated=reactivated)
            return
        entry.due_ms = due
        chain = entry.chain
        if chain is not None and due - self._now_ms > SLEEP_BEYOND_MS and not chain.run:
            self._tally.move(entry, DELAYED)  # counted while the chain is put to sleep
            self._sleep(chain)
            return
        self._tally.move(entry, DELAYED)
        self._delayed.push(due, entry)

    def note_time(self, now_ms: int) -> None:
        """The driver's clock (ms): heads due by then are ready when they are admitted."""
        self._now_ms = max(self._now_ms, now_ms)

    def advance(self, now_ms: int) -> None:
        """Make delayed heads due by ``now_ms`` ready and wake the sleeping chains due
        soon (queued for a reload, which the next fetch plans)."""
        self.note_time(now_ms)
        for entry in self._delayed.pop_due(now_ms):
            self._make_ready(entry, reactivated=False)
        sleeping = self._sleeping
        while sleeping and sleeping[0][0] <= now_ms:
            when, _, chain = heapq.heappop(sleeping)
            if chain.wake_ms != when:
                continue  # stale: woken already
            chain.wake_ms = None
            if chain.head is None and chain.parked and not chain.reloading:
                self._reloads.append(chain)
        self._delayed.compact(self._tally.count(DELAYED))

    def next_due_ms(self) -> int | None:
        """When ``advance`` next has work (ms), or None."""
        return earliest(self._delayed.next_ms(), self._sleeping[0][0] if self._sleeping else None)

    def has_reloads(self) -> bool:
        """Chains are queued for a reload (``next_reload`` may return one)."""
        return bool(self._reloads)

    def sleeping(self) -> int:
        """How many chains sleep (a far delayed head released from memory)."""
        return sum(1 for c in self._chains.values() if c.wake_ms is not None)

    def _sleep(self, chain: Chain) -> None:
        """Release the DELAYED head of ``chain`` and every message waiting behind it; the
        chain is reloaded ``WAKE_LEAD_MS`` before the head is due."""
        head = chain.head
        assert head is not None and head.state is DELAYED
        chain.head = None
        for entry in (head, *chain.waiting):
            chain.note_parked(entry.message.qid, entry.message.offset)
            chain.attempt_floor = max(chain.attempt_floor, entry.attempt)
            self._tally.move(entry, State.OUT)
        chain.waiting = NO_ENTRIES
        wake = chain.wake_ms = max(self._now_ms, head.due_ms - WAKE_LEAD_MS)
        heapq.heappush(self._sleeping, (wake, next(self._sleep_seq), chain))

    def delayed_unordered(self) -> list[Entry]:
        """Unordered DELAYED entries (for a seek)."""
        return [e for e in self._delayed.live() if e.chain is None]

    # -- ready work ----------------------------------------------------------------------------
    def _make_ready(self, entry: Entry, *, reactivated: bool) -> None:
        self._tally.move(entry, READY)
        queue = self._ready[entry.message.topic]
        (queue.reactivated if reactivated else queue.fresh).append(entry)

    def retry_now(self, entry: Entry) -> None:
        """A retrying, exhausted or released head is ready again, ahead of fresh work."""
        self._make_ready(entry, reactivated=True)

    def pop_ready(self, topic: str) -> Entry | None:
        """The next ready entry of ``topic`` (still READY: the caller moves it on)."""
        return self._ready[topic].pop()

    def has_ready(self, topic: str) -> bool:
        return self._tally.count(State.READY, topic) > 0

    # -- same-key runs --------------------------------------------------------------------------
    def take_run(self, chain: Chain, count: int) -> list[Entry]:
        """Up to ``count`` waiting entries to hand out with the head (the caller sends them);
        a run stops before a message that is not due yet."""
        out: list[Entry] = []
        while len(out) < count and chain.waiting:
            due = chain.waiting[0].message.deliver_at_ms
            if due is not None and due > self._now_ms:
                break
            entry = chain.waiting.popleft()
            if chain.run is NO_ENTRIES:
                chain.run = deque()
            chain.run.append(entry)
            out.append(entry)
        return out

    def send_back(self, chain: Chain, entries: list[Entry]) -> None:
        """Run members go back behind the head, in order, to wait for their turn again."""
        if chain.waiting is NO_ENTRIES:
            chain.waiting = deque()
        for entry in reversed(entries):
            chain.run.remove(entry)
            chain.waiting.appendleft(entry)
            self._tally.move(entry, State.WAITING)

    def run_member_done(self, chain: Chain, entry: Entry) -> None:
        """A run member (not the head) finished before the head did."""
        chain.run.remove(entry)
        if not chain.run:
            chain.run = NO_ENTRIES

    # -- finishing -----------------------------------------------------------------------------
    def head_done(self, chain: Chain) -> None:
        """The head of ``chain`` finished or was dropped: the next entry moves up.

        The next member of a run becomes the head while staying in flight; else the next
        waiting entry becomes ready. A chain that ran dry with parked messages asks for a
        reload; one with nothing in memory and nothing parked is forgotten.
        """
        if chain.run:
            chain.head = chain.run.popleft()
            if not chain.run:
                chain.run = NO_ENTRIES
            return
        if chain.waiting:
            nxt = chain.waiting.popleft()
            if not chain.waiting:
                chain.waiting = NO_ENTRIES  # an idle key goes back to the small form
            chain.head = nxt
            self._make_head(nxt, reactivated=True)
            return
        chain.head = None
        if chain.parked and not chain.reloading:
            self._reloads.append(chain)
        elif not chain.is_parked:
            del self._chains[(chain.topic, chain.value)]

    # -- parking and reloads -------------------------------------------------------------------
    def park_stuck(self, is_stuck: Callable[[Entry], bool], until_held: int) -> None:
        """Park chains whose head is stuck, most waiting first, until ``until_held`` is met.

        A chain whose head is delayed is put to sleep whole (head included): a buffer full
        of delayed heads from many keys must not keep undelayed keys out.
        """
        candidates = [
            c
            for c in self._chains.values()
            if c.waiting or (c.head is not None and c.head.state is DELAYED and not c.run)
        ]
        candidates.sort(key=lambda c: len(c.waiting), reverse=True)
        for chain in candidates:
            if chain.head is None or not is_stuck(chain.head):
                continue
            if chain.head.state is DELAYED and not chain.run:
                self._sleep(chain)
                if self._tally.held <= until_held:
                    break
                continue
            kept: deque[Entry] = deque()
            for entry in chain.waiting:
                if entry.redriven:  # finished already: cannot be read back, stays held
                    kept.append(entry)
                    continue
                chain.note_parked(entry.message.qid, entry.message.offset)
                chain.attempt_floor = max(chain.attempt_floor, entry.attempt)
                self._tally.move(entry, State.OUT)
            chain.waiting = kept if kept else NO_ENTRIES
            if self._tally.held <= until_held:
                break

    def next_reload(self) -> Chain | None:
        """A chain to reload, or None; the caller marks each read in ``chain.reloading``."""
        while self._reloads:
            chain = self._reloads.pop()
            if chain.wake_ms is None:
                return chain
            # Asleep: ``advance`` queues it again when it wakes.
        return None

    def reload_later(self, chain: Chain) -> None:
        """``chain`` still has parked queues that could not be read yet: plan them again."""
        if chain not in self._reloads:
            self._reloads.append(chain)

    def reload_done(self, chain: Chain, qid: int | None) -> None:
        """The reload read of ``chain`` in queue ``qid`` was handed back (or failed).

        ``qid`` None: the read was stale (a seek cleared its queue's reload state already).
        """
        if qid is not None:
            chain.reloading.pop(qid, None)
        if chain.head is None and chain.parked and not chain.reloading:
            self._reloads.append(chain)  # found nothing yet: keep scanning
        elif chain.head is None and not chain.is_parked:
            self._chains.pop((chain.topic, chain.value), None)

    def restore_parked(self, topic: str, value: str, qid: int, offset: int) -> None:
        """After a restart: the chain's messages from ``offset`` on in ``qid`` are unread."""
        key = (topic, value)
        chain = self._chains.get(key)
        if chain is None:
            chain = self._chains[key] = Chain(topic, value)
            self._reloads.append(chain)
        chain.note_parked(qid, offset)

    # -- operator views and actions ------------------------------------------------------------
    def replay(self, topic: str, value: str, entries: list[Entry]) -> None:
        """Replayed messages (finished before, in order) join the chain of ``value``: right
        after its head when the head has been handed out (in flight with its run, retrying
        or exhausted), else before it (a ready or delayed head, or none)."""
        key = (topic, value)
        chain = self._chains.get(key)
        if chain is None:
            chain = self._chains[key] = Chain(topic, value)
        for entry in entries:
            entry.chain = chain
        head = chain.head
        behind: list[Entry] = []
        if head is None or head.state is READY or head.state is DELAYED:
            first, entries = entries[0], entries[1:]
            if head is not None:
                behind.append(head)
            chain.head = first
            self._make_head(first, reactivated=True)
        waiting = deque([*entries, *behind, *chain.waiting])
        for entry in (*entries, *behind):
            self._tally.move(entry, WAITING)
        chain.waiting = waiting if waiting else NO_ENTRIES

    def chains(self) -> Iterator[Chain]:
        return iter(self._chains.values())

    def drop(self, topic: str, qids: set[int]) -> list[Entry]:
        """Drop every held entry of the given queues from memory (a seek); returns them.

        Parked offsets of those queues are forgotten; chains whose head was dropped move on.
        """

        def hit(entry: Entry) -> bool:
            return entry.message.topic == topic and entry.message.qid in qids

        dropped: list[Entry] = []
        for chain in [c for c in self._chains.values() if c.topic == topic]:
            for name in ("waiting", "run"):
                held: deque[Entry] = getattr(chain, name)
                gone = [e for e in held if hit(e)]
                if gone:
                    kept = deque(e for e in held if not hit(e))
                    setattr(chain, name, kept if kept else NO_ENTRIES)
                    dropped.extend(gone)
            for qid in qids:
                chain.parked.pop(qid, None)
                chain.reloading.pop(qid, None)  # its answer will be stale (new epoch)
            if chain.head is not None and hit(chain.head):
                dropped.append(chain.head)
                self.head_done(chain)
            elif chain.head is None and not chain.waiting and not chain.is_parked:
                del self._chains[(chain.topic, chain.value)]
        queue = self._ready[topic]
        for entry in (*queue.reactivated, *queue.fresh):
            if entry.state is State.READY and entry.chain is None and hit(entry):
                dropped.append(entry)
        return dropped
