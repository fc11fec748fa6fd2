# cproxy: compiled (mypyc), see cproxy/_native.py
"""One consumer group: fetch -> sequence -> ready -> in flight -> ack / fail / timeout.

``GroupEngine`` is a pure state machine and the sole owner of its state: it performs no I/O
and reads no clock. A driver (``cproxy.broker``) feeds it what it read from the store
(``plan_fetches`` / ``on_fetched``, see ``cproxy.broker.drive``), the current time (``now_ms``
arguments, ms since the epoch) and the consumers' results, and persists what it hands back
(``take_commit``). Everything runs on one event loop, so nothing here locks. Callers get
frozen snapshots (``Delivery``, ``GroupStats``, ``BlockedKey``), never live containers.

Delivery semantics (docs/guarantees.md): a message is handed out only when it is the head of
its chain; a fail or ack timeout schedules the next attempt after ``retry_backoff_ms`` while
the chain stays blocked; after ``max_attempts`` charged deliveries the message is
dead-lettered (or, with ``on_exhausted = "block"``, holds its chain until an operator skips or
releases it). Every hand-out gets the next delivery number (``Entry.attempt``, the fencing
token), charged or not, and numbers keep growing across restarts and changes of owner
(``ATTEMPT_RESERVE``): a result naming an earlier delivery is unknown.
A message with a ``deliver_at_ms`` is not handed out before then (the driver's ``now_ms``
decides); it holds its own chain only (``cproxy.engine.sequencer``, ``cproxy.engine.delays``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Final

from cproxy.engine.chains import Chain
from cproxy.engine.cursor import FetchRequest
from cproxy.engine.deadlines import DeadlineHeap, earliest
from cproxy.engine.expressions import Screen
from cproxy.engine.group_config import GroupConfig
from cproxy.engine.operations import Operations
from cproxy.engine.progress import (
    parked_by_queue,
    queue_progress,
    snapshot,
    stuck_waiting_by_queue,
)
from cproxy.engine.queue_set import QueueSet
from cproxy.engine.reader import Reader
from cproxy.engine.records import CommitBatch, Counters, Result
from cproxy.engine.sequencer import Sequencer
from cproxy.engine.snapshots import Delivery, Outcome
from cproxy.engine.work import ATTEMPT_RESERVE, IN_FLIGHT, OUT, Entry, State, Tally
from cproxy.model import DeadLetter, Message, MessageRef, QueueProgress, QueueRef

#: ``deadline_ms`` of a held delivery (``hold``): no ack-timeout heap item ever matches it.
_HELD_DEADLINE: Final = -1


class GroupEngine(Operations, QueueSet):
    """The delivery state of one consumer group over its subscribed queues."""

    def __init__(
        self,
        name: str,
        config: GroupConfig,
        progress: Mapping[QueueRef, QueueProgress],
        end_offsets: Mapping[QueueRef, int],
        on_ack_latency_s: Callable[[list[float]], None] | None = None,
    ) -> None:
        """``progress`` and ``end_offsets`` must name every queue of every subscribed topic.

        ``on_ack_latency_s`` is called once per ``apply_results`` that acked anything, with
        the produce-to-ack times (s) of the messages it acked: one call per pull, not one per
        message (a call from compiled code into Python costs ~0.1 µs).
        """
        self.name = name
        self.config = config
        topics = list(config.topics)
        self._extract = {t: ob.extract for t, ob in config.topics.items()}
        # Delivery numbers resume above every one that was reserved before this load (a
        # restart or a change of owner may follow deliveries whose results are still out).
        floor = max((p.attempt_ceiling for p in progress.values()), default=0)
        #: At least every delivery number handed out (or reserved before this load): what a
        #: message read again starts above.
        self._max_issued = floor
        #: The delivery numbers reserved in the store (persisted with progress).
        self._ceiling = floor + ATTEMPT_RESERVE
        #: Half the reserve is used: the driver should commit now (``take_commit`` reserves
        #: more), not wait for its interval.
        self.needs_reserve = False
        self._tally = Tally(topics)
        self._seq = Sequencer(topics, self._tally)
        self._counters = {topic: Counters() for topic in topics}
        #: The latest time the driver told us (ms): dead letters decided while reading.
        self._now_ms = 0
        # Only groups with expressions pay for screening on the read path.
        screen = (
            Screen(config.filters, config.transforms, self._filtered, self._failed).entry_for
            if config.filters or config.transforms
            else None
        )
        self._reader = Reader(
            progress,
            end_offsets,
            config.max_buffered,
            self._extract,
            self._seq,
            self._tally,
            screen,
            floor,
        )
        self._in_flight: dict[MessageRef, Entry] = {}
        self._exhausted: dict[MessageRef, Entry] = {}
        self._timeouts = DeadlineHeap(State.IN_FLIGHT, "deadline_ms")
        self._retries = DeadlineHeap(State.RETRYING, "due_ms")
        self._topic_cursor = 0
        self._pending = CommitBatch()
        self._on_ack_latency_s = on_ack_latency_s
        #: What was last handed out for persisting, per queue: commits send only changes.
        self._persisted: dict[QueueRef, QueueProgress] = {}
        #: Cluster mode: queues being released (see ``queue_set``); empty otherwise.
        self._paused: dict[QueueRef, list[Entry]] = {}
        #: Deliveries set aside by ``hold`` while their results are persisted with outputs,
        #: with the ack deadline each had.
        self._held: dict[MessageRef, tuple[Entry, int]] = {}

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

    def wants_fetch(self) -> bool:
        """Whether ``plan_fetches`` may plan a read without time passing: a queue has
        messages not read yet (or a restore or scan under way), or a parked chain waits for
        its reload. False when only time can bring reads (delay rescans, waking chains):
        ``next_deadline_ms`` covers those."""
        return self._reader.has_unread() or self._seq.has_reloads()

    def plan_fetches(self, now_ms: int) -> list[FetchRequest]:
        """Reads to make now; empty when the buffer is full or every queue is caught up."""
        self._now_ms = max(self._now_ms, now_ms)
        self._seq.advance(now_ms)
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
        self,
        max_messages: int,
        topics: Collection[str] | None,
        now_ms: int,
        max_per_key: int = 1,
        consumer: str | None = None,
    ) -> list[Delivery]:
        """Hand out up to ``max_messages`` ready heads; they are in flight until acked.

        ``consumer`` names who pulled (stats count its messages in flight; None: a push).

        With ``max_per_key`` > 1 a head may bring up to ``max_per_key - 1`` of the messages
        waiting behind it (a same-key run, in offset order): the consumer handles them in
        order, and a fail at one sends the rest of the run back behind it.
        """
        self.tick(now_ms)
        names = (
            list(self._counters) if topics is None else [t for t in topics if t in self._counters]
        )
        if not names:
            return []
        self._topic_cursor = (self._topic_cursor + 1) % len(names)
        out: list[Delivery] = []
        sent: list[Entry] = []  # what ``out`` hands out: one ack-timeout heap item for all
        deadline = now_ms + self.config.ack_timeout_ms
        for topic in names[self._topic_cursor :] + names[: self._topic_cursor]:
            before = len(out)
            while len(out) < max_messages and (entry := self._seq.pop_ready(topic)) is not None:
                if self._paused and self.set_aside(entry):
                    continue
                run = len(out)
                self._send(entry, deadline, now_ms, out, run, sent)
                chain = entry.chain
                if max_per_key > 1 and chain is not None and chain.head is entry:
                    room = min(max_per_key - 1, max_messages - len(out))
                    for member in self._seq.take_run(chain, room):
                        self._send(member, deadline, now_ms, out, run, sent)
            self._counters[topic].delivered += len(out) - before
            if len(out) >= max_messages:
                break
        self._timeouts.push_all(deadline, sent)
        for entry in sent:
            entry.consumer = consumer
        return out

    def _send(
        self,
        entry: Entry,
        deadline_ms: int,
        now_ms: int,
        out: list[Delivery],
        run: int,
        sent: list[Entry],
    ) -> None:
        """Hand ``entry`` out (into ``out``); the caller pushes ``sent`` on the timeouts heap."""
        attempt = entry.attempt = entry.attempt + 1
        if attempt > self._max_issued:  # rare: a new highest number
            self._max_issued = attempt
            if attempt + ATTEMPT_RESERVE // 2 > self._ceiling:
                self.needs_reserve = True
        self._tally.move(entry, IN_FLIGHT)
        entry.deadline_ms = deadline_ms
        if entry.blocked_since_ms < 0:
            entry.blocked_since_ms = now_ms
        sent.append(entry)
        message = entry.message
        self._in_flight[(message.topic, message.qid, message.offset)] = entry
        out.append(Delivery(message, attempt, run, entry.body_json, entry.charged, entry.replay))

    def apply_results(self, results: Iterable[Result], now_ms: int) -> Outcome:
        """Apply acks and fails of in-flight messages; others are reported unknown."""
        applied = 0
        unknown: list[MessageRef] = []
        latencies: list[float] | None = None if self._on_ack_latency_s is None else []
        for result in results:
            for offset in result.acks:
                entry = self._take_in_flight(result, offset)
                if entry is None:
                    unknown.append((result.topic, result.qid, offset))
                    continue
                applied += 1
                if latencies is not None:
                    latencies.append((now_ms - entry.message.produced_at_ms) / 1000)
                self._on_success(entry)
            for offset, error in result.fails:
                entry = self._take_in_flight(result, offset)
                if entry is None:
                    unknown.append((result.topic, result.qid, offset))
                    continue
                applied += 1
                self._on_failure(entry, error or "failed by consumer", now_ms)
        self._compact_heaps()
        if latencies and self._on_ack_latency_s is not None:
            self._on_ack_latency_s(latencies)
        return Outcome(applied, unknown)

    def _take_in_flight(self, result: Result, offset: int) -> Entry | None:
        """The in-flight entry a result answers, removed from flight; None if unknown.

        A fenced result (its attempt named) answers only that delivery: after a timeout
        and redelivery, a late result for the old attempt must not finish the message
        while another consumer works on it (docs/guarantees.md, fenced deliveries).
        """
        ref = (result.topic, result.qid, offset)
        if result.attempts is None:  # unfenced: whatever delivery is current
            return self._in_flight.pop(ref, None)
        entry = self._current(ref, result.attempts.get(offset))
        if entry is not None:
            del self._in_flight[ref]
        return entry

    def _current(self, ref: MessageRef, attempt: int | None) -> Entry | None:
        """The in-flight entry of ``ref``, if ``attempt`` (when named) is its current one."""
        entry = self._in_flight.get(ref)
        if entry is None or attempt is None or attempt == entry.attempt:
            return entry
        return None

    def extend(
        self,
        refs: Iterable[MessageRef],
        ack_timeout_ms: int,
        now_ms: int,
        attempts: Mapping[MessageRef, int] | None = None,
    ) -> Outcome:
        """Push the ack deadline of in-flight messages to ``now_ms + ack_timeout_ms``.

        ``attempts`` fences extends as for results: naming a superseded attempt is unknown.
        """
        applied = 0
        unknown: list[MessageRef] = []
        for ref in refs:
            entry = self._current(ref, attempts.get(ref) if attempts else None)
            if entry is None:
                unknown.append(ref)
                continue
            entry.deadline_ms = now_ms + ack_timeout_ms
            self._timeouts.push(entry.deadline_ms, entry)
            applied += 1
        return Outcome(applied, unknown)

    def tick(self, now_ms: int) -> None:
        """Expire ack deadlines, make due retries and delayed messages ready, and wake the
        sleeping delayed chains due soon (their reloads are planned by the next fetch)."""
        self._now_ms = max(self._now_ms, now_ms)
        self._seq.advance(now_ms)
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
        return earliest(
            earliest(self._timeouts.next_ms(), self._retries.next_ms()),
            earliest(self._seq.next_due_ms(), self._reader.next_rescan_ms()),
        )

    # -- results persisted with outputs (exactly once, docs/guarantees.md) -------------------
    def hold(self, results: Iterable[Result]) -> list[MessageRef]:
        """Set aside the deliveries ``results`` answer while a transaction persists them.

        All or nothing: when any result does not answer the current delivery of its message
        (as for ``apply_results``), or answers a run member whose head is unfinished (its
        ack could not be persisted before the head's), nothing changes and those refs are
        returned. Otherwise (``[]``) the deliveries are held: they stay in flight for every
        count, but do not time out, and no extend or other result reaches them until
        ``settle_held`` applies the results or ``unhold`` puts the deliveries back.
        """
        found: list[tuple[MessageRef, Entry]] = []
        stale: list[MessageRef] = []
        seen: set[MessageRef] = set()
        for result in results:
            offsets = [*result.acks, *(offset for offset, _ in result.fails)]
            for offset in offsets:
                ref = (result.topic, result.qid, offset)
                attempt = result.attempts.get(offset) if result.attempts else None
                entry = self._current(ref, attempt)
                chain = entry.chain if entry is not None else None
                if entry is None or ref in seen or (chain is not None and chain.head is not entry):
                    stale.append(ref)
                    continue
                seen.add(ref)
                found.append((ref, entry))
        if stale:
            return stale
        for ref, entry in found:
            del self._in_flight[ref]
            self._held[ref] = (entry, entry.deadline_ms)
            entry.deadline_ms = _HELD_DEADLINE  # its ack-timeout heap item is now stale
        return stale

    def progress_after(self, results: Iterable[Result]) -> dict[QueueRef, QueueProgress]:
        """The persisted progress of the queues ``results`` name, as it will be once their
        acks apply (held deliveries, ``hold``): what the transaction writes."""
        done: dict[QueueRef, set[int]] = {}
        for result in results:
            done.setdefault((result.topic, result.qid), set()).update(result.acks)
        topics = {topic for topic, _ in done}
        chains = [c for c in self._seq.chains() if c.topic in topics]
        parked = parked_by_queue(chains)
        waiting = stuck_waiting_by_queue(chains)
        out: dict[QueueRef, QueueProgress] = {}
        for ref, offsets in done.items():
            cur = self._reader.cursor(ref[0], ref[1])
            if cur is not None:
                out[ref] = queue_progress(
                    cur,
                    self._tally,
                    parked.get(ref, []),
                    waiting.get(ref, {}),
                    self._ceiling,  # never lower the reserved delivery numbers
                    offsets,
                )
        return out

    def held_redrives(self, results: Iterable[Result]) -> list[MessageRef]:
        """The redriven dead letters that held ``results`` ack: finished with them, so the
        transaction deletes their dead letters too (a crash must not redrive them again)."""
        out: list[MessageRef] = []
        for result in results:
            for offset in result.acks:
                ref = (result.topic, result.qid, offset)
                held = self._held.get(ref)
                if held is not None and held[0].redriven and not held[0].replay:
                    out.append(ref)
        return out

    def settle_held(
        self,
        results: Sequence[Result],
        now_ms: int,
        persisted: Mapping[QueueRef, QueueProgress],
    ) -> Outcome:
        """The transaction of held ``results`` committed ``persisted``: apply them.

        A held delivery an operator dropped meanwhile (seek) is not applied again."""
        for result in results:
            for offset in [*result.acks, *(offset for offset, _ in result.fails)]:
                held = self._held.pop((result.topic, result.qid, offset), None)
                if held is not None and held[0].state is IN_FLIGHT:
                    self._in_flight[(result.topic, result.qid, offset)] = held[0]
        # What the store holds now: the next commit writes these queues only if they change.
        self._persisted.update(persisted)
        return self.apply_results(results, now_ms)

    def unhold(self, results: Iterable[Result]) -> None:
        """The transaction of held ``results`` failed: the deliveries are in flight again
        with the ack deadlines they had (the next ``tick`` times out those now past)."""
        for result in results:
            for offset in [*result.acks, *(offset for offset, _ in result.fails)]:
                ref = (result.topic, result.qid, offset)
                held = self._held.pop(ref, None)
                if held is None or held[0].state is not IN_FLIGHT:
                    continue
                entry, deadline_ms = held
                entry.deadline_ms = deadline_ms
                self._in_flight[ref] = entry
                self._timeouts.push(deadline_ms, entry)

    def held_on(self, topic: str, qid: int) -> int:
        """Deliveries of the queue held for a transaction (``hold``)."""
        return sum(1 for t, q, _ in self._held if t == topic and q == qid)

    # -- the verbs of a delivery's end ---------------------------------------------------------
    def _on_success(self, entry: Entry) -> None:
        self._counters[entry.message.topic].acked += 1
        self._finish(entry)

    def _on_failure(self, entry: Entry, error: str, now_ms: int) -> None:
        self._counters[entry.message.topic].failed += 1
        self._attempt_failed(entry, error, now_ms)

    def _on_timeout(self, entry: Entry, now_ms: int) -> None:
        self._counters[entry.message.topic].timed_out += 1
        self._attempt_failed(entry, "ack timeout", now_ms)

    def _attempt_failed(self, entry: Entry, error: str, now_ms: int) -> None:
        entry.last_error = error
        entry.charged += 1
        chain = entry.chain
        if chain is not None and chain.run:
            if entry is not chain.head:
                # A run member failed before the head finished: it and the rest of the run
                # go back behind the head; its delivery is charged, theirs are not.
                later = list(chain.run)[list(chain.run).index(entry) :]
                self._send_back(chain, later)
                return
            self._send_back(chain, list(chain.run))
        if entry.charged < self.config.max_attempts:
            entry.due_ms = now_ms + self.config.backoff_ms(entry.charged)
            self._tally.move(entry, State.RETRYING)
            self._counters[entry.message.topic].retried += 1
            self._retries.push(entry.due_ms, entry)
        elif self.config.on_exhausted == "dead_letter":
            self._dead_letter(entry, now_ms)
        else:
            self._tally.move(entry, State.EXHAUSTED)
            self._exhausted[entry.message.ref] = entry

    def _send_back(self, chain: Chain, members: list[Entry]) -> None:
        """Run members go back to waiting, uncharged: results for their deliveries become
        unknown (their next hand-out has a new delivery number)."""
        for member in members:
            self._in_flight.pop(member.message.ref, None)
        self._seq.send_back(chain, members)

    def _filtered(self, topic: str) -> None:
        self._counters[topic].filtered += 1

    def _failed(self, message: Message, error: str) -> None:
        """A filter or transform raised on a message being read: dead-letter it at once."""
        entry = Entry(message)
        entry.last_error = error
        self._dead_letter(entry, self._now_ms)

    def _dead_letter(self, entry: Entry, now_ms: int) -> None:
        """Finish ``entry`` as dead-lettered (persisted with the next commit)."""
        self._pending.dead_letters.append(
            DeadLetter(self.name, entry.message, entry.charged, entry.last_error, now_ms)
        )
        self._counters[entry.message.topic].dead_lettered += 1
        self._finish(entry)

    def _finish(self, entry: Entry) -> None:
        """The entry is acked or dead-lettered: record it and move its chain on."""
        self._tally.move(entry, OUT)
        message = entry.message
        if entry.redriven and not entry.replay:
            self._pending.redrive_done.append(message.ref)
        chain = entry.chain
        if chain is not None:
            if chain.head is entry:
                self._seq.head_done(chain)
            else:
                self._seq.run_member_done(chain, entry)

    # -- persistence ---------------------------------------------------------------------------
    @property
    def has_pending_dead_letters(self) -> bool:
        """Dead letters are waiting for a commit (worth persisting soon)."""
        return bool(self._pending.dead_letters)

    def take_commit(self) -> CommitBatch:
        """Progress of queues changed since the last call, plus pending dead letters."""
        batch, self._pending = self._pending, CommitBatch()
        if self._max_issued + ATTEMPT_RESERVE // 2 > self._ceiling:
            # Reserve more delivery numbers before the reserve runs out: every queue's
            # progress changes, so this commit persists the new ceiling everywhere.
            self._ceiling = self._max_issued + ATTEMPT_RESERVE
        self.needs_reserve = False
        for ref, p in self.progress().items():
            if self._persisted.get(ref) != p:
                batch.progress[ref] = self._persisted[ref] = p
        return batch

    def requeue(self, batch: CommitBatch) -> None:
        """A commit failed: keep its contents for the next one."""
        for ref in batch.progress:
            self._persisted.pop(ref, None)
        self._pending.dead_letters[:0] = batch.dead_letters
        self._pending.redrive_done[:0] = batch.redrive_done

    def progress(self) -> dict[QueueRef, QueueProgress]:
        """Every queue's progress in its persisted form (see ``cproxy.engine.progress``)."""
        return snapshot(self._reader.cursors(), self._tally, self._seq.chains(), self._ceiling)
