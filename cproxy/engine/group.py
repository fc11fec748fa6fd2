"""One consumer group: fetch -> sequence -> ready -> in flight -> ack / fail / timeout.

``GroupEngine`` is a pure state machine and the sole owner of its state: it performs no I/O
and reads no clock. A driver (``cproxy.broker``) feeds it what it read from the store
(``plan_fetches`` / ``on_fetched``, see ``cproxy.broker.drive``), the current time (``now_ms``
arguments, ms since the epoch) and the consumers' results, and persists what it hands back
(``take_commit``). Everything runs on one event loop, so nothing here locks. Callers get
frozen snapshots (``Delivery``, ``GroupStats``, ``BlockedKey``), never live containers.

Delivery semantics (docs/guarantees.md): a message is handed out only when it is the head of
its chain; a fail or ack timeout schedules the next attempt after ``retry_backoff_ms`` while
the chain stays blocked; after ``max_attempts`` deliveries the message is dead-lettered (or,
with ``on_exhausted = "block"``, holds its chain until an operator skips or releases it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from cproxy.engine.config import GroupConfig
from cproxy.engine.deadlines import DeadlineHeap
from cproxy.engine.operations import Operations
from cproxy.engine.partition import FetchRequest
from cproxy.engine.reader import Reader
from cproxy.engine.records import CommitBatch, Counters, Result
from cproxy.engine.sequencer import Sequencer
from cproxy.engine.snapshots import Delivery, Outcome
from cproxy.engine.work import Entry, State, Tally
from cproxy.model import DeadLetter, Message, MessageRef, QueueProgress, QueueRef


class GroupEngine(Operations):
    """The delivery state of one consumer group over its subscribed queues."""

    def __init__(
        self,
        name: str,
        config: GroupConfig,
        progress: Mapping[QueueRef, QueueProgress],
        end_offsets: Mapping[QueueRef, int],
        on_ack_latency_s: Callable[[float], None] | None = None,
    ) -> None:
        """``progress`` and ``end_offsets`` must name every queue of every subscribed topic.

        ``on_ack_latency_s`` is called with the produce-to-ack time (s) of each acked message.
        """
        self.name = name
        self.config = config
        topics = list(config.topics)
        self._extract = {t: ob.extract for t, ob in config.topics.items()}
        self._tally = Tally(topics)
        self._seq = Sequencer(topics, self._tally)
        self._reader = Reader(
            progress,
            end_offsets,
            config.max_buffered,
            self._order_value,
            self._seq,
            self._tally,
        )
        self._counters = {topic: Counters() for topic in topics}
        self._in_flight: dict[MessageRef, Entry] = {}
        self._exhausted: dict[MessageRef, Entry] = {}
        self._timeouts = DeadlineHeap(
            lambda when, e: e.state is State.IN_FLIGHT and e.deadline_ms == when
        )
        self._retries = DeadlineHeap(lambda when, e: e.state is State.RETRYING and e.due_ms == when)
        self._topic_cursor = 0
        self._pending = CommitBatch()
        self._on_ack_latency_s = on_ack_latency_s

    def _order_value(self, message: Message) -> str | None:
        return self._extract[message.topic](message)

    def reads(self, topic: str) -> bool:
        """Whether the group subscribes to ``topic``."""
        return topic in self._counters

    # -- reading (see cproxy.engine.reader) ----------------------------------------------------
    def note_end(self, topic: str, qid: int, end_offset: int) -> None:
        """The store's next offset for a queue grew (a produce landed)."""
        self._reader.note_end(topic, qid, end_offset)

    def offer(self, topic: str, qid: int, messages: Sequence[Message]) -> bool:
        """Take just-stored consecutive messages without a store read, if caught up.

        Accepted only when they start exactly at the queue's fetch position and fit in the
        buffer; otherwise (False) the queue's end moves and a later fetch reads them. A read
        already under way for the same offsets is then recognised as stale.
        """
        return self._reader.offer(topic, qid, messages)

    def plan_fetches(self, now_ms: int) -> list[FetchRequest]:
        """Reads to make now; empty when the buffer is full or every queue is caught up."""
        return self._reader.plan(now_ms)

    def on_fetched(self, request: FetchRequest, messages: Sequence[Message]) -> None:
        """Hand back what the store returned for ``request`` (its range, unfiltered)."""
        self._reader.on_read(request, messages)

    def on_fetch_failed(self, request: FetchRequest) -> None:
        """``request`` could not be read: plan it again later."""
        self._reader.on_read_failed(request)

    # -- delivering ----------------------------------------------------------------------------
    def has_ready(self, topics: Collection[str] | None = None) -> bool:
        names = self._counters if topics is None else topics
        return any(self._seq.has_ready(t) for t in names if t in self._counters)

    def pull(
        self, max_messages: int, topics: Collection[str] | None, now_ms: int
    ) -> list[Delivery]:
        """Hand out up to ``max_messages`` ready heads; they are in flight until acked."""
        self.tick(now_ms)
        names = (
            list(self._counters) if topics is None else [t for t in topics if t in self._counters]
        )
        if not names:
            return []
        self._topic_cursor = (self._topic_cursor + 1) % len(names)
        out: list[Delivery] = []
        deadline = now_ms + self.config.ack_timeout_ms
        move = self._tally.move
        for topic in names[self._topic_cursor :] + names[: self._topic_cursor]:
            counters = self._counters[topic]
            while len(out) < max_messages and (entry := self._seq.pop_ready(topic)) is not None:
                entry.attempt += 1
                move(entry, State.IN_FLIGHT)
                entry.deadline_ms = deadline
                if entry.attempt == 1:
                    entry.blocked_since_ms = now_ms
                self._timeouts.push(deadline, entry)
                self._in_flight[entry.message.ref] = entry
                counters.delivered += 1
                out.append(Delivery(entry.message, entry.attempt))
            if len(out) >= max_messages:
                break
        return out

    def apply_results(self, results: Iterable[Result], now_ms: int) -> Outcome:
        """Apply acks and fails of in-flight messages; others are reported unknown."""
        applied = 0
        unknown: list[MessageRef] = []
        in_flight = self._in_flight
        for result in results:
            for offset in result.acks:
                entry = in_flight.pop((result.topic, result.qid, offset), None)
                if entry is None:
                    unknown.append((result.topic, result.qid, offset))
                    continue
                applied += 1
                self._on_success(entry, now_ms)
            for offset, error in result.fails:
                entry = in_flight.pop((result.topic, result.qid, offset), None)
                if entry is None:
                    unknown.append((result.topic, result.qid, offset))
                    continue
                applied += 1
                self._on_failure(entry, error or "failed by consumer", now_ms)
        self._compact_heaps()
        return Outcome(applied, unknown)

    def extend(self, refs: Iterable[MessageRef], ack_timeout_ms: int, now_ms: int) -> Outcome:
        """Push the ack deadline of in-flight messages to ``now_ms + ack_timeout_ms``."""
        applied = 0
        unknown: list[MessageRef] = []
        for ref in refs:
            entry = self._in_flight.get(ref)
            if entry is None:
                unknown.append(ref)
                continue
            entry.deadline_ms = now_ms + ack_timeout_ms
            self._timeouts.push(entry.deadline_ms, entry)
            applied += 1
        return Outcome(applied, unknown)

    def tick(self, now_ms: int) -> None:
        """Expire ack deadlines and make due retries ready."""
        for entry in self._timeouts.pop_due(now_ms):
            del self._in_flight[entry.message.ref]
            self._on_timeout(entry, now_ms)
        for entry in self._retries.pop_due(now_ms):
            self._seq.retry_now(entry)

    def _compact_heaps(self) -> None:
        self._timeouts.compact(len(self._in_flight))
        self._retries.compact(self._tally.count(State.RETRYING))

    def next_deadline_ms(self) -> int | None:
        """When ``tick`` next has work (ms), or None."""
        times = [t for t in (self._timeouts.next_ms(), self._retries.next_ms()) if t is not None]
        return min(times) if times else None

    # -- the verbs of a delivery's end ---------------------------------------------------------
    def _on_success(self, entry: Entry, now_ms: int) -> None:
        self._counters[entry.message.topic].acked += 1
        if self._on_ack_latency_s is not None:
            self._on_ack_latency_s((now_ms - entry.message.produced_at_ms) / 1000)
        self._finish(entry)

    def _on_failure(self, entry: Entry, error: str, now_ms: int) -> None:
        self._counters[entry.message.topic].failed += 1
        self._attempt_failed(entry, error, now_ms)

    def _on_timeout(self, entry: Entry, now_ms: int) -> None:
        self._counters[entry.message.topic].timed_out += 1
        self._attempt_failed(entry, "ack timeout", now_ms)

    def _attempt_failed(self, entry: Entry, error: str, now_ms: int) -> None:
        entry.last_error = error
        if entry.attempt < self.config.max_attempts:
            entry.due_ms = now_ms + self.config.backoff_ms(entry.attempt)
            self._tally.move(entry, State.RETRYING)
            self._counters[entry.message.topic].retried += 1
            self._retries.push(entry.due_ms, entry)
        elif self.config.on_exhausted == "dead_letter":
            self._dead_letter(entry, now_ms)
        else:
            self._tally.move(entry, State.EXHAUSTED)
            self._exhausted[entry.message.ref] = entry

    def _dead_letter(self, entry: Entry, now_ms: int) -> None:
        """Finish ``entry`` as dead-lettered (persisted with the next commit)."""
        self._pending.dead_letters.append(
            DeadLetter(self.name, entry.message, entry.attempt, entry.last_error, now_ms)
        )
        self._counters[entry.message.topic].dead_lettered += 1
        self._finish(entry)

    def _finish(self, entry: Entry) -> None:
        """The entry is acked or dead-lettered: record it and move its chain on."""
        self._tally.move(entry, State.OUT)
        message = entry.message
        if entry.redriven:
            self._pending.redrive_done.append(message.ref)
        else:
            part = self._reader.partition(message.topic, message.qid)
            assert part is not None
            part.tracker.finish(message.offset)
        if entry.chain is not None:
            self._seq.head_done(entry.chain)

    # -- persistence ---------------------------------------------------------------------------
    @property
    def has_pending_dead_letters(self) -> bool:
        """Dead letters are waiting for a commit (worth persisting soon)."""
        return bool(self._pending.dead_letters)

    def take_commit(self) -> CommitBatch:
        """Progress of queues changed since the last call, plus pending dead letters."""
        batch, self._pending = self._pending, CommitBatch()
        for part in self._reader.partitions():
            if part.tracker.dirty:
                batch.progress[(part.topic, part.qid)] = part.progress()
                part.tracker.dirty = False
        return batch

    def requeue(self, batch: CommitBatch) -> None:
        """A commit failed: keep its contents for the next one."""
        for topic, qid in batch.progress:
            part = self._reader.partition(topic, qid)
            if part is not None:
                part.tracker.dirty = True
        self._pending.dead_letters[:0] = batch.dead_letters
        self._pending.redrive_done[:0] = batch.redrive_done

    def progress(self) -> dict[QueueRef, QueueProgress]:
        return {(p.topic, p.qid): p.progress() for p in self._reader.partitions()}
