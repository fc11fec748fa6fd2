"""One consumer group: fetch -> sequence -> ready -> in flight -> ack / fail / timeout.

``GroupEngine`` is a pure state machine: it performs no I/O and reads no clock. A driver
(``cproxy.broker.runner``) feeds it what it read from the store (``plan_fetches`` /
``on_fetched``), the current time (``now_ms`` arguments) and the consumers' results, and
persists what it hands back (``take_commit``). Everything runs on one event loop, so nothing
here locks.

Delivery semantics, per docs/guarantees.md: a message is handed out only when it is the head of its
chain; a fail or ack timeout schedules the next attempt after ``retry_backoff_ms`` while the
chain stays blocked; after ``max_attempts`` deliveries the message is dead-lettered (or, with
``on_exhausted = "block"``, holds its chain until an operator skips or releases it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from cproxy.engine.config import GroupConfig
from cproxy.engine.deadlines import DeadlineHeap
from cproxy.engine.partition import FetchRequest, Partition
from cproxy.engine.records import CommitBatch, Counters, Result
from cproxy.engine.sequencer import Chain, Entry, ReadyQueue, Sequencer, State
from cproxy.model import DeadLetter, Message, MessageRef, QueueProgress, QueueRef

#: Largest read the engine asks for at once, in messages.
FETCH_BATCH = 1000
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


class GroupEngine:
    """The delivery state of one consumer group over its subscribed queues."""

    def __init__(
        self,
        name: str,
        config: GroupConfig,
        progress: Mapping[QueueRef, QueueProgress],
        end_offsets: Mapping[QueueRef, int],
        on_ack_latency_s: Callable[[float], None] | None = None,
    ) -> None:
        """``progress`` and ``end_offsets`` must name every queue of every subscribed topic."""
        self.name = name
        self.config = config
        self.partitions: dict[QueueRef, Partition] = {
            ref: Partition(ref[0], ref[1], p, end_offsets.get(ref, 0))
            for ref, p in progress.items()
        }
        self.sequencer = Sequencer()
        self.ready: dict[str, ReadyQueue] = {topic: ReadyQueue() for topic in config.topics}
        self.counters: dict[str, Counters] = {topic: Counters() for topic in config.topics}
        self.in_flight: dict[MessageRef, Entry] = {}
        self.exhausted: dict[MessageRef, Entry] = {}
        #: Entries held in memory in any state: what ``max_buffered`` bounds.
        self.buffered = 0
        self.retrying = 0
        self._extract = {t: ob.extract for t, ob in config.topics.items()}
        self._timeouts = DeadlineHeap(
            lambda when, e: e.state is State.IN_FLIGHT and e.deadline_ms == when
        )
        self._retries = DeadlineHeap(lambda when, e: e.state is State.RETRYING and e.due_ms == when)
        self._reloads: list[Chain] = []
        self._topic_cursor = 0
        self._fetch_cursor = 0
        self._next_park_check_ms = 0
        self.pending = CommitBatch()
        self._on_ack_latency_s = on_ack_latency_s

    # -- reading -------------------------------------------------------------------------------
    def note_end(self, topic: str, qid: int, end_offset: int) -> None:
        """The store's next offset for a queue grew (a produce landed)."""
        part = self.partitions.get((topic, qid))
        if part is not None and end_offset > part.end_offset:
            part.end_offset = end_offset

    def offer(self, topic: str, qid: int, messages: Sequence[Message]) -> bool:
        """Take just-stored consecutive messages without a store read, if caught up.

        Accepted only when they start exactly at the queue's fetch position and fit in the
        buffer; otherwise (False) the queue's end moves and the fetcher reads them later.
        A read already under way for the same offsets is then recognised as stale.
        """
        part = self.partitions.get((topic, qid))
        if part is None or not messages:
            return False
        self.note_end(topic, qid, messages[-1].offset + 1)
        if (
            part.fetch_offset != messages[0].offset
            or self.buffered + len(messages) > self.config.max_buffered
        ):
            return False
        request = FetchRequest(topic, qid, part.fetch_offset, len(messages), part.epoch)
        self.on_fetched(request, messages)
        return True

    def order_value(self, message: Message) -> str | None:
        return self._extract[message.topic](message)

    def plan_fetches(self, now_ms: int) -> list[FetchRequest]:
        """Reads to make now: reloads of parked chains first, then new messages.

        Empty when the buffer is full or every queue is caught up. Parks stuck chains first
        when they fill the buffer, so healthy keys keep flowing.
        """
        self._park_if_stuck(now_ms)
        space = self.config.max_buffered - self.buffered
        requests: list[FetchRequest] = []
        while self._reloads and space > 0:
            chain = self._reloads.pop()
            for qid, start in sorted(chain.parked.items()):
                part = self.partitions[(chain.topic, qid)]
                count = min(space, FETCH_BATCH)
                chain.reloading += 1
                requests.append(
                    FetchRequest(
                        chain.topic,
                        qid,
                        start,
                        count,
                        part.epoch,
                        chain.value,
                        upto=part.fetch_offset,
                    )
                )
                space -= count
            chain.parked.clear()
        parts = [p for p in self.partitions.values() if p.fetch_offset < p.end_offset]
        if not parts or space <= 0:
            return requests
        share = max(1, min(FETCH_BATCH, space // len(parts)))
        self._fetch_cursor = (self._fetch_cursor + 1) % len(parts)
        for part in parts[self._fetch_cursor :] + parts[: self._fetch_cursor]:
            count = min(share, space, part.end_offset - part.fetch_offset)
            if count <= 0:
                break
            requests.append(
                FetchRequest(part.topic, part.qid, part.fetch_offset, count, part.epoch)
            )
            space -= count
        return requests

    def on_fetched(
        self, request: FetchRequest, messages: Sequence[Message], scanned_to: int | None = None
    ) -> None:
        """Hand back the result of ``request``.

        For a plain fetch, ``messages`` are consecutive from ``request.from_offset``. For a
        reload, they are the chain's messages found, and ``scanned_to`` is where the scan
        stopped (exclusive).
        """
        part = self.partitions.get((request.topic, request.qid))
        if request.is_reload:
            self._on_reloaded(
                request, part, messages, request.upto if scanned_to is None else scanned_to
            )
            return
        if part is None or part.epoch != request.epoch or part.fetch_offset != request.from_offset:
            return  # planned before a seek: stale
        if not messages:
            # The store has nothing there (yet): trust it over our notion of the end.
            part.end_offset = part.fetch_offset
            return
        tracker = part.tracker
        limit = self.config.max_buffered
        for message in messages:
            if tracker.is_finished(message.offset):
                part.fetch_offset = message.offset + 1
                continue  # finished before a restart
            if self.buffered >= limit:
                # An offer() on another queue may have used the space this read was
                # planned with: stop here and read the rest later.
                break
            self._admit(Entry(message, None))
            part.fetch_offset = message.offset + 1
        part.end_offset = max(part.end_offset, part.fetch_offset)

    def _admit(self, entry: Entry) -> None:
        message = entry.message
        value = self.order_value(message)
        parked = self.sequencer.parked_chain(message.topic, value)
        if parked is not None:
            current = parked.parked.get(message.qid)
            if current is None or message.offset < current:
                parked.parked[message.qid] = message.offset
            return
        self.buffered += 1
        if self.sequencer.admit(entry, value):
            self.ready[message.topic].push(entry, reactivated=False)

    def _on_reloaded(
        self,
        request: FetchRequest,
        part: Partition | None,
        messages: Sequence[Message],
        scanned_to: int,
    ) -> None:
        assert request.chain_value is not None
        chain = self.sequencer.chains.get((request.topic, request.chain_value))
        if chain is None:
            return
        chain.reloading -= 1
        if part is None or part.epoch != request.epoch:
            self._after_reload(chain)
            return  # a seek dropped this queue's parked state meanwhile
        for message in messages:
            if message.offset >= request.upto or part.tracker.is_finished(message.offset):
                continue
            entry = Entry(message, chain)
            self.buffered += 1
            if chain.head is None:
                chain.head = entry
                self.ready[chain.topic].push(entry, reactivated=True)
            else:
                chain.waiting.append(entry)
                self.sequencer.waiting += 1
        if scanned_to < request.upto:
            current = chain.parked.get(request.qid)
            chain.parked[request.qid] = scanned_to if current is None else min(current, scanned_to)
        self._after_reload(chain)

    def _after_reload(self, chain: Chain) -> None:
        if chain.head is None and chain.parked and chain.reloading == 0:
            self._reloads.append(chain)  # found nothing yet: keep scanning
        self.sequencer.forget_if_idle(chain)

    def _park_if_stuck(self, now_ms: int) -> None:
        """Release waiting messages of stuck chains when they fill the buffer.

        Only chains whose head looks stuck are parked: retrying, exhausted, delivered more
        than once, or in flight for ``PARK_AFTER_MS``. A deep backlog of healthy keys is
        plain backpressure: their heads are acked soon and parking them would only cost
        store rescans.
        """
        limit = self.config.max_buffered
        seq = self.sequencer
        if self.buffered < limit or seq.waiting == 0 or now_ms < self._next_park_check_ms:
            return
        # Sorting chains is O(n log n): with a full buffer, do it at most every 100 ms.
        self._next_park_check_ms = now_ms + PARK_CHECK_INTERVAL_MS
        target = limit * 3 // 4
        for chain in seq.most_waiting():
            head = chain.head
            if head is None or not _is_stuck(head, now_ms):
                continue
            self.buffered -= len(seq.park(chain))
            if self.buffered <= target:
                break

    # -- delivering ----------------------------------------------------------------------------
    @property
    def ready_count(self) -> int:
        return sum(rq.size for rq in self.ready.values())

    def has_ready(self, topics: Collection[str] | None = None) -> bool:
        if topics is None:
            return any(rq.size for rq in self.ready.values())
        return any(self.ready[t].size for t in topics if t in self.ready)

    def pull(self, max_messages: int, topics: Collection[str] | None, now_ms: int) -> list[Entry]:
        """Hand out up to ``max_messages`` ready heads; they are in flight until acked."""
        self.tick(now_ms)
        names = list(self.ready) if topics is None else [t for t in topics if t in self.ready]
        if not names:
            return []
        self._topic_cursor = (self._topic_cursor + 1) % len(names)
        out: list[Entry] = []
        deadline = now_ms + self.config.ack_timeout_ms
        for topic in names[self._topic_cursor :] + names[: self._topic_cursor]:
            queue = self.ready[topic]
            counters = self.counters[topic]
            while len(out) < max_messages and (entry := queue.pop()) is not None:
                entry.attempt += 1
                entry.state = State.IN_FLIGHT
                entry.deadline_ms = deadline
                if entry.attempt == 1:
                    entry.blocked_since_ms = now_ms
                self._timeouts.push(deadline, entry)
                self.in_flight[entry.message.ref] = entry
                counters.delivered += 1
                out.append(entry)
            if len(out) >= max_messages:
                break
        return out

    def apply_results(self, results: Iterable[Result], now_ms: int) -> tuple[int, list[MessageRef]]:
        """Apply acks and fails; returns ``(applied, unknown refs)``."""
        applied = 0
        unknown: list[MessageRef] = []
        in_flight = self.in_flight
        for result in results:
            for offset in result.acks:
                ref = (result.topic, result.qid, offset)
                entry = in_flight.pop(ref, None)
                if entry is None:
                    unknown.append(ref)
                    continue
                applied += 1
                self.counters[result.topic].acked += 1
                if self._on_ack_latency_s is not None:
                    self._on_ack_latency_s((now_ms - entry.message.produced_at_ms) / 1000)
                self._finish(entry)
            for offset, error in result.fails:
                ref = (result.topic, result.qid, offset)
                entry = in_flight.pop(ref, None)
                if entry is None:
                    unknown.append(ref)
                    continue
                applied += 1
                self.counters[result.topic].failed += 1
                self._attempt_failed(entry, error or "failed by consumer", now_ms)
        self._compact_heaps()
        return applied, unknown

    def extend(
        self, refs: Iterable[MessageRef], ack_timeout_ms: int, now_ms: int
    ) -> tuple[int, list[MessageRef]]:
        """Push the ack deadline of in-flight messages to ``now + ack_timeout_ms``."""
        applied = 0
        unknown: list[MessageRef] = []
        for ref in refs:
            entry = self.in_flight.get(ref)
            if entry is None:
                unknown.append(ref)
                continue
            entry.deadline_ms = now_ms + ack_timeout_ms
            self._timeouts.push(entry.deadline_ms, entry)
            applied += 1
        return applied, unknown

    def tick(self, now_ms: int) -> None:
        """Expire ack deadlines and make due retries ready."""
        for entry in self._timeouts.pop_due(now_ms):
            del self.in_flight[entry.message.ref]
            self.counters[entry.message.topic].timed_out += 1
            self._attempt_failed(entry, "ack timeout", now_ms)
        for entry in self._retries.pop_due(now_ms):
            self.retrying -= 1
            self.ready[entry.message.topic].push(entry, reactivated=True)

    def _compact_heaps(self) -> None:
        self._timeouts.compact(len(self.in_flight))
        self._retries.compact(self.retrying)

    def next_deadline_ms(self) -> int | None:
        """When ``tick`` next has work, or None."""
        times = [t for t in (self._timeouts.next_ms(), self._retries.next_ms()) if t is not None]
        return min(times) if times else None

    # -- finishing -----------------------------------------------------------------------------
    def _attempt_failed(self, entry: Entry, error: str, now_ms: int) -> None:
        entry.last_error = error
        if entry.attempt >= self.config.max_attempts:
            if self.config.on_exhausted == "dead_letter":
                self.dead_letter(entry, now_ms)
            else:
                entry.state = State.EXHAUSTED
                self.exhausted[entry.message.ref] = entry
            return
        self._schedule_retry(entry, now_ms + self.config.backoff_ms(entry.attempt))

    def _schedule_retry(self, entry: Entry, due_ms: int) -> None:
        entry.state = State.RETRYING
        entry.due_ms = due_ms
        self.retrying += 1
        self.counters[entry.message.topic].retried += 1
        self._retries.push(due_ms, entry)

    def dead_letter(self, entry: Entry, now_ms: int) -> None:
        """Finish ``entry`` as dead-lettered (persisted with the next commit)."""
        self.pending.dead_letters.append(
            DeadLetter(self.name, entry.message, entry.attempt, entry.last_error, now_ms)
        )
        self.counters[entry.message.topic].dead_lettered += 1
        self._finish(entry)

    def _finish(self, entry: Entry) -> None:
        """The entry is acked or dead-lettered: record it and move its chain on."""
        entry.state = State.DONE
        self.buffered -= 1
        message = entry.message
        if entry.redriven:
            self.pending.redrive_done.append(message.ref)
        else:
            self.partitions[(message.topic, message.qid)].tracker.finish(message.offset)
        chain = entry.chain
        if chain is None:
            return
        nxt = self.sequencer.advance(chain)
        if nxt is not None:
            self.ready[chain.topic].push(nxt, reactivated=True)
        elif chain.parked and chain.reloading == 0:
            self._reloads.append(chain)

    def request_reload(self, chain: Chain) -> None:
        self._reloads.append(chain)

    def retrying_entries(self) -> list[Entry]:
        return self._retries.live()

    # -- persistence ---------------------------------------------------------------------------
    def take_commit(self) -> CommitBatch:
        """Progress of queues changed since the last call, plus pending dead letters."""
        batch, self.pending = self.pending, CommitBatch()
        for ref, part in self.partitions.items():
            if part.tracker.dirty:
                batch.progress[ref] = part.progress()
                part.tracker.dirty = False
        return batch

    def requeue(self, batch: CommitBatch) -> None:
        """A commit failed: keep its contents for the next one."""
        for ref in batch.progress:
            if ref in self.partitions:
                self.partitions[ref].tracker.dirty = True
        self.pending.dead_letters[:0] = batch.dead_letters
        self.pending.redrive_done[:0] = batch.redrive_done

    def progress(self) -> dict[QueueRef, QueueProgress]:
        return {ref: part.progress() for ref, part in self.partitions.items()}
