# cproxy: compiled (mypyc), see cproxy/_native.py
"""One consumer group: fetch -> sequence -> ready -> in flight -> ack / fail / timeout.

``GroupEngine`` is a pure state machine and the sole owner of its state: it performs no I/O
and reads no clock. A driver (``cproxy.broker``) feeds it what it read from the store
(``plan_fetches`` / ``on_fetched``, see ``cproxy.broker.drive``), the current time (``now_ms``
arguments, ms since the epoch) and the consumers' results, and persists what it hands back
(``take_commit``). Everything runs on one event loop, so nothing here locks. Callers get
frozen snapshots (``Handout``, ``GroupStats``, ``BlockedKey``), never live containers.

Delivery semantics (docs/guarantees.md): a message is handed out only when it is the head of
its chain; a fail or ack timeout schedules the next attempt after ``retry_backoff_ms`` while
the chain stays blocked; after ``max_attempts`` charged deliveries the message is
dead-lettered (or, with ``on_exhausted = "block"``, holds its chain until an operator skips or
releases it). Every hand-out gets the next delivery number (``Entry.attempt``, the fencing
token), charged or not, and numbers keep growing across restarts and changes of owner
(``ATTEMPT_RESERVE``): a result naming an earlier delivery is unknown.
A message with a ``deliver_at_ms`` is not handed out before then (the driver's ``now_ms``
decides); it holds its own chain only (``cproxy.engine.sequencer``, ``cproxy.engine.delays``).

``GroupEngine`` owns its collaborators and builds each with what it reads: the ``Reader``
(read planning and take-in), the ``Sequencer`` (chains, ready queues), the ``Tally`` (states
and counts), ``InFlight`` (current deliveries and ack deadlines, ``in_flight.py``) and
``Blocked`` (exhausted and stuck heads, ``blocked.py``). Each state-changing verb records what
it made due for the driver (``cproxy.engine.effects``, read with ``take_effects``).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Final

from cproxy.engine.blocked import Blocked
from cproxy.engine.cursor import FetchRequest
from cproxy.engine.deadlines import DeadlineHeap, earliest
from cproxy.engine.effects import COMMIT, DEADLINE, FETCH, READY
from cproxy.engine.expressions import Screen
from cproxy.engine.group_config import GroupConfig
from cproxy.engine.in_flight import InFlight
from cproxy.engine.progress import (
    committed_offset,
    parked_by_queue,
    queue_progress,
    snapshot,
    stuck_waiting_by_queue,
)
from cproxy.engine.reader import Reader
from cproxy.engine.records import CommitBatch, Counters, Result
from cproxy.engine.sequencer import Sequencer
from cproxy.engine.snapshots import (
    BlockedKey,
    GroupStats,
    Handout,
    Outcome,
    QueuePosition,
    TopicCounts,
)
from cproxy.engine.work import ATTEMPT_RESERVE, IN_FLIGHT, OUT, Chain, Entry, State, Tally
from cproxy.errors import ReplayInProgress
from cproxy.model import DeadLetter, MessageRef, QueueProgress, QueueRef, Record

#: An effect bit of the engine's own: deliveries finished or time passed. ``take_effects``
#: turns it into what that made due, from the state then: once per take, not per call.
_FINISHED: Final = 16
#: Another of its own: messages were read into memory, or time moved for the sequencer;
#: ``take_effects`` reports ``READY`` if work is ready then.
_READ: Final = 32
#: Head states that do not block their key: ready, or delayed (waiting for its time).
_NOT_BLOCKED: Final = (State.READY, State.DELAYED)


class GroupEngine:
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
        self._flight = InFlight()
        self._retries = DeadlineHeap(State.RETRYING, "due_ms")
        self._blocked = Blocked(self._seq, self._retries, config.stuck_after_ms)
        self._topic_cursor = 0
        self._pending = CommitBatch()
        self._on_ack_latency_s = on_ack_latency_s
        #: What was last handed out for persisting, per queue: commits send only changes.
        self._persisted: dict[QueueRef, QueueProgress] = {}
        #: Cluster mode: queues being released, and their ready entries that ``pull`` set
        #: aside (see "queues joining and leaving"); empty otherwise.
        self._paused: dict[QueueRef, list[Entry]] = {}
        #: What the calls since the last ``take_effects`` made due (``cproxy.engine.effects``).
        self._effects = 0

    def take_effects(self) -> int:
        """The wake-ups the calls since the last take made due (``cproxy.engine.effects``
        bits), then none: the driver wakes its loops from these, in one place."""
        effects = self._effects
        self._effects = 0
        if effects & _FINISHED:
            # Deliveries finished (acked, dead-lettered, timed out): reads into freed buffer
            # space or for a reload, new dead letters to persist, work made ready. Reads that
            # only time brings (delay rescans, waking chains) are the timer's (``tick``).
            effects ^= _FINISHED
            if self.wants_fetch():
                effects |= FETCH
            if self._pending.dead_letters:
                effects |= COMMIT
            if self.has_ready():
                effects |= READY
        elif effects & _READ and self.has_ready():
            effects |= READY
        return effects & ~_READ

    def _order_value(self, message: Record) -> str | None:
        return self._extract[message.topic](message)

    def reads(self, topic: str) -> bool:
        """Whether the group subscribes to ``topic``."""
        return topic in self._counters

    # -- reading (see cproxy.engine.reader) ----------------------------------------------------
    def note_end(self, topic: str, qid: int, end_offset: int) -> None:
        """The store's next offset for a queue grew (a produce landed)."""
        self._reader.note_end(topic, qid, end_offset)
        self._effects |= FETCH

    def offer(self, topic: str, qid: int, messages: Sequence[Record]) -> bool:
        """Take just-stored consecutive messages without a store read, if caught up.

        Accepted only when they start exactly at the queue's fetch position and fit in the
        buffer; otherwise (False) the queue's end moves and a later fetch reads them. A read
        already under way for the same offsets is then recognised as stale.
        """
        taken = self._reader.offer(topic, qid, messages)
        self._effects |= READY if taken else FETCH
        return taken

    def wants_fetch(self) -> bool:
        """Whether ``plan_fetches`` may plan a read without time passing: a queue has
        messages not read yet (or a restore or scan under way), or a parked chain waits for
        its reload. False when only time can bring reads (delay rescans, waking chains):
        ``next_deadline_ms`` covers those."""
        return self._reader.has_unread() or self._seq.has_reloads()

    def plan_fetches(self, now_ms: int) -> list[FetchRequest]:
        """Reads to make now; empty when the buffer is full or every queue is caught up."""
        self._now_ms = max(self._now_ms, now_ms)
        self._seq.advance(now_ms)  # (may make delayed heads due: ready work to report)
        self._effects |= _READ
        return self._reader.plan(now_ms)

    def on_fetched(self, request: FetchRequest, messages: Sequence[Record]) -> None:
        """Hand back what the store returned for ``request`` (its range, unfiltered)."""
        self._reader.on_read(request, messages)
        self._effects |= _READ

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
    ) -> list[Handout]:
        """Hand out up to ``max_messages`` ready heads; they are in flight until acked.

        ``consumer`` names who pulled (stats count its messages in flight; None: a push).

        With ``max_per_key`` > 1 a head may bring up to ``max_per_key - 1`` of the messages
        waiting behind it (a same-key run, in offset order): the consumer handles them in
        order, and a fail at one sends the rest of the run back behind it.
        """
        self._expire(now_ms)
        names = (
            list(self._counters) if topics is None else [t for t in topics if t in self._counters]
        )
        if not names:
            return []
        self._topic_cursor = (self._topic_cursor + 1) % len(names)
        out: list[Handout] = []
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
        if sent:
            self._flight.add_all(deadline, sent, consumer)
            # Half the reserved delivery numbers used: persist more now, so a crash cannot
            # come before they are (docs/guarantees.md, fenced deliveries).
            self._effects |= (DEADLINE | COMMIT) if self.needs_reserve else DEADLINE
        return out

    def _send(
        self,
        entry: Entry,
        deadline_ms: int,
        now_ms: int,
        out: list[Handout],
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
        out.append(Handout(message, attempt, run, entry.body_json, entry.charged, entry.replay))

    def apply_results(self, results: Iterable[Result], now_ms: int) -> Outcome:
        """Apply acks and fails of in-flight messages; others are reported unknown."""
        applied = 0
        unknown: list[MessageRef] = []
        latencies: list[float] | None = None if self._on_ack_latency_s is None else []
        for result in results:
            for offset in result.acks:
                entry = self._flight.take(result, offset)
                if entry is None:
                    unknown.append((result.topic, result.qid, offset))
                    continue
                applied += 1
                if latencies is not None:
                    latencies.append((now_ms - entry.message.produced_at_ms) / 1000)
                self._on_success(entry)
            for offset, error in result.fails:
                entry = self._flight.take(result, offset)
                if entry is None:
                    unknown.append((result.topic, result.qid, offset))
                    continue
                applied += 1
                self._on_failure(entry, error or "failed by consumer", now_ms)
        self._compact_heaps()
        if latencies and self._on_ack_latency_s is not None:
            self._on_ack_latency_s(latencies)
        if applied:
            self._effects |= _FINISHED | DEADLINE
        return Outcome(applied, unknown)

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
        return self._flight.extend(refs, now_ms + ack_timeout_ms, attempts)

    def tick(self, now_ms: int) -> None:
        """Expire ack deadlines, make due retries and delayed messages ready, and wake the
        sleeping delayed chains due soon (their reloads are planned by the next fetch).

        The driver's timer calls it: time may have made reads due (delay rescans, waking
        chains), so a fetch is always due after it."""
        self._expire(now_ms)
        self._effects |= _FINISHED | FETCH

    def _expire(self, now_ms: int) -> None:
        """``tick``'s state change, without effects (``pull`` runs it first)."""
        self._now_ms = max(self._now_ms, now_ms)
        self._seq.advance(now_ms)
        for entry in self._flight.expired(now_ms):
            self._on_timeout(entry, now_ms)
        for entry in self._retries.pop_due(now_ms):
            self._seq.retry_now(entry)

    def _compact_heaps(self) -> None:
        self._flight.compact()
        self._retries.compact(self._tally.count(State.RETRYING))

    def next_deadline_ms(self) -> int | None:
        """When ``tick`` next has work (ms), or None."""
        return earliest(
            earliest(self._flight.next_ms(), self._retries.next_ms()),
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
        return self._flight.hold(results)

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
        return self._flight.held_redrives(results)

    def settle_held(
        self,
        results: Sequence[Result],
        now_ms: int,
        persisted: Mapping[QueueRef, QueueProgress],
    ) -> Outcome:
        """The transaction of held ``results`` committed ``persisted``: apply them.

        A held delivery an operator dropped meanwhile (seek) is not applied again."""
        self._flight.settle(results)
        # What the store holds now: the next commit writes these queues only if they change.
        self._persisted.update(persisted)
        return self.apply_results(results, now_ms)

    def unhold(self, results: Iterable[Result]) -> None:
        """The transaction of held ``results`` failed: the deliveries are in flight again
        with the ack deadlines they had (the next ``tick`` times out those now past)."""
        self._flight.unhold(results)

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
            self._blocked.exhausted(entry)

    def _send_back(self, chain: Chain, members: list[Entry]) -> None:
        """Run members go back to waiting, uncharged: results for their deliveries become
        unknown (their next hand-out has a new delivery number)."""
        for member in members:
            self._flight.pop(member.message.ref)
        self._seq.send_back(chain, members)

    def _filtered(self, topic: str) -> None:
        self._counters[topic].filtered += 1

    def _failed(self, message: Record, error: str) -> None:
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

    # -- operator actions and rare verbs (they may scan the held state) ------------------------
    def seek(self, topic: str, targets: Mapping[int, int]) -> None:
        """Restart the given queues of ``topic`` at the given offsets (qid -> offset).

        Everything the group holds in memory for those queues is dropped: results for
        messages that were in flight there become unknown. Redriven dead letters of those
        queues are dropped too, since the seek replays (or deliberately skips) them.
        """
        qids = set(targets)
        dropped = self._seq.drop(topic, qids)
        # Unordered messages that are handed out, retrying or exhausted hold no chain.
        dropped += self._flight.drop(topic, qids)
        dropped += self._blocked.drop(topic, qids)
        dropped += [
            e
            for e in (*self._retries.live(), *self._seq.delayed_unordered())
            if e.chain is None and e.message.topic == topic and e.message.qid in qids
        ]
        for entry in dropped:
            self._tally.move(entry, State.OUT)
            if entry.redriven and not entry.replay:
                self._pending.redrive_done.append(entry.message.ref)
        for qid, offset in targets.items():
            # What is read again may have been handed out: numbered above all so far.
            self._reader.reset(topic, qid, offset, self._max_issued)
        self._effects |= FETCH

    def redrive(self, dead_letters: Sequence[DeadLetter]) -> int:
        """Deliver dead letters again, in the given (original) order; returns how many.

        Redriven messages bypass parking (their offsets are already committed, so they could
        not be read back) and get a fresh budget of ``max_attempts`` charged deliveries; their
        delivery numbers go on above every number handed out so far.
        """
        count = 0
        base = self._max_issued
        for dead in dead_letters:
            message = dead.message
            cur = self._reader.cursor(message.topic, message.qid)
            if cur is None:
                # No longer subscribed: keep it a plain dead letter (listed again, not left
                # marked as redriving, which would hide it for good).
                self._pending.dead_letters.append(dataclasses.replace(dead, redriving=False))
                continue
            if not self._is_finished(message):
                # A seek put it back in the normal flow: it will be delivered anyway.
                self._pending.redrive_done.append(message.ref)
                continue
            entry = Entry(message, redriven=True)
            entry.attempt = base
            self._seq.admit(entry, self._order_value(message), force=True)
            count += 1
        if count:
            self._effects |= READY
        return count

    def replay_bounds(self, topic: str) -> dict[int, int]:
        """Per queue of ``topic`` this engine serves: the offset below which a message may
        be finished (the fetch position; nothing at or above it is)."""
        return {c.qid: c.fetch_offset for c in self._reader.cursors() if c.topic == topic}

    def replaying(self, topic: str | None = None, value: str | None = None) -> int:
        """Replayed messages still to deliver (of ``topic`` and ``value`` when given)."""
        count = 0
        for chain in self._seq.chains():
            if (topic is not None and chain.topic != topic) or (
                value is not None and chain.value != value
            ):
                continue
            for entry in (chain.head, *chain.run, *chain.waiting):
                if entry is not None and entry.replay:
                    count += 1
        return count

    def replay(self, topic: str, value: str, found: Sequence[Sequence[Record]]) -> int:
        """Deliver the order value's finished messages again; returns how many.

        ``found`` holds, per queue in offset order, the messages of ``value`` read from the
        store (a range below ``replay_bounds``). Those the group has finished are delivered
        again, marked as replayed, in offset order per queue (queues merged by produce
        time): after the value's message now handed out (if any), before its next
        unfinished one. Committed offsets and other values are untouched; each replayed
        message has a fresh budget of charged deliveries and, out of it, is dead-lettered
        as any other. Raises ``ReplayInProgress`` while an earlier replay of the value
        still delivers.
        """
        if self.replaying(topic, value):
            raise ReplayInProgress(
                f"order value {value!r} of topic {topic!r} is still being replayed"
            )
        base = self._max_issued
        entries: list[Entry] = []
        merged = heapq.merge(*found, key=lambda m: m.produced_at_ms)
        for message in merged:
            if self._order_value(message) != value or not self._is_finished(message):
                continue
            entry = self._reader.screen_again(message)
            if entry is None:
                continue  # the group's filter leaves it out: it was never delivered
            entry.redriven = True
            entry.replay = True
            entry.attempt = base
            entries.append(entry)
        if entries:
            self._seq.replay(topic, value, entries)
            self._effects |= READY
        return len(entries)

    def blocked_keys(self, now_ms: int, topic: str | None = None) -> list[BlockedKey]:
        """Stuck order values (``Blocked.is_stuck``) and exhausted unordered messages,
        longest-blocked first, each with its head's body."""
        return self._blocked.rows(now_ms, topic)

    def in_flight_by_consumer(self) -> dict[str | None, int]:
        """Messages in flight per consumer id (None: pushed)."""
        return self._flight.by_consumer()

    def delivered_and_acked(self) -> tuple[int, int]:
        """Deliveries and acks since the group started (for rates over a window)."""
        delivered = acked = 0
        for c in self._counters.values():
            delivered += c.delivered
            acked += c.acked
        return delivered, acked

    def skip(
        self,
        topic: str,
        order_value: str | None,
        ref: MessageRef | None,
        now_ms: int,
    ) -> MessageRef:
        """Dead-letter a retrying or exhausted head so its chain moves on."""
        entry = self._blocked.find(topic, order_value, ref)
        self._blocked.discard(entry)
        entry.last_error = f"{entry.last_error or 'blocked'} (skipped by operator)"
        self._dead_letter(entry, now_ms)
        self._effects |= READY | FETCH | COMMIT
        return entry.message.ref

    def release(self, topic: str, order_value: str | None, ref: MessageRef | None) -> MessageRef:
        """Deliver a retrying or exhausted head again now, with a fresh budget of charged
        deliveries (its delivery numbers go on)."""
        entry = self._blocked.find(topic, order_value, ref)
        self._blocked.discard(entry)
        entry.charged = 0
        entry.blocked_since_ms = -1
        self._seq.retry_now(entry)
        self._effects |= READY
        return entry.message.ref

    def stats(self, now_ms: int) -> GroupStats:
        """A snapshot of the group's counts and positions (``now_ms``: the driver's clock,
        which tells a head in flight past ``stuck_after_ms``)."""
        tally = self._tally
        chains = list(self._seq.chains())
        busy_heads = [c for c in chains if c.head is not None and c.head.state not in _NOT_BLOCKED]
        stuck = 0
        in_flight_keys = 0
        for chain in busy_heads:
            head = chain.head
            assert head is not None
            if self._blocked.is_stuck(head, now_ms):
                stuck += 1
            elif head.state is State.IN_FLIGHT:
                in_flight_keys += 1
        blocked = stuck + self._blocked.unordered()
        # Messages waiting behind a head that is not ready do not count in lag_excluding_parked.
        stuck_waiting: dict[QueueRef, int] = {}
        for chain in busy_heads:
            for entry in chain.waiting:
                ref = (entry.message.topic, entry.message.qid)
                stuck_waiting[ref] = stuck_waiting.get(ref, 0) + 1
        parked = parked_by_queue(chains)
        queues = []
        for cur in self._reader.cursors():
            ref = (cur.topic, cur.qid)
            held = tally.held_offsets(cur.topic, cur.qid)
            committed = committed_offset(cur, held, parked.get(ref, []))
            unread = max(0, cur.end_offset - cur.fetch_offset)
            queues.append(
                QueuePosition(
                    topic=cur.topic,
                    qid=cur.qid,
                    committed_offset=committed,
                    next_offset=cur.end_offset,
                    lag=max(0, cur.end_offset - committed),
                    fetch_offset=cur.fetch_offset,
                    lag_excluding_parked=unread + len(held) - stuck_waiting.get(ref, 0),
                    lost_to_retention=cur.lost,
                )
            )
        topics = tuple(
            TopicCounts(
                topic,
                tally.count(State.READY, topic),
                tally.count(State.IN_FLIGHT, topic),
                sum(q.lag for q in queues if q.topic == topic),
                c.delivered,
                c.acked,
                c.failed,
                c.timed_out,
                c.retried,
                c.dead_lettered,
                c.lost_to_retention,
                c.filtered,
            )
            for topic, c in self._counters.items()
        )
        return GroupStats(
            queues=tuple(queues),
            lag_excluding_parked=sum(q.lag_excluding_parked for q in queues),
            lost_to_retention=sum(q.lost_to_retention for q in queues),
            filtered=sum(c.filtered for c in self._counters.values()),
            topics=topics,
            ready=tally.count(State.READY),
            in_flight=tally.count(State.IN_FLIGHT),
            waiting=tally.count(State.WAITING),
            retrying=tally.count(State.RETRYING),
            exhausted=tally.count(State.EXHAUSTED),
            buffered=tally.held,
            blocked_keys=blocked,
            in_flight_keys=in_flight_keys,
            parked_keys=sum(1 for c in chains if c.is_parked),
            pending_dead_letters=len(self._pending.dead_letters),
            delayed=tally.count(State.DELAYED)
            + self._seq.sleeping()
            + self._reader.delayed_released(),
            replaying=self.replaying(),
        )

    def release_uncharged(
        self, refs: Iterable[MessageRef], attempts: Mapping[MessageRef, int] | None = None
    ) -> Outcome:
        """Take in-flight deliveries back without charging an attempt (they never arrived).

        For a delivery that could not reach its consumer at all (the push endpoint refused
        the connection, a long poll left before its answer): a head becomes ready again at
        once, ahead of fresh work, with its charged count as before the delivery; a run
        member goes back behind its head with the rest of its run, uncharged too. Results
        for the released deliveries become unknown: the next hand-out has a new delivery
        number. ``attempts`` fences as for results; refs not in flight are unknown.
        """
        applied = 0
        unknown: list[MessageRef] = []
        for ref in refs:
            entry = self._flight.current(ref, attempts.get(ref) if attempts else None)
            if entry is None:
                unknown.append(ref)
                continue
            applied += 1
            chain = entry.chain
            if chain is not None and entry is not chain.head:
                members = list(chain.run)
                self._send_back(chain, members[members.index(entry) :])
                continue
            if chain is not None and chain.run:
                self._send_back(chain, list(chain.run))
            self._flight.pop(ref)
            self._seq.retry_now(entry)
        self._compact_heaps()
        if applied:
            self._effects |= READY
        return Outcome(applied, unknown)

    def on_retention(self, topic: str, qid: int, min_offset: int) -> int:
        """Retention deleted the queue's messages below ``min_offset``: skip those not read
        yet and count them as lost (``stats().lost_to_retention``); returns how many."""
        lost = self._reader.skip_to(topic, qid, min_offset)
        if topic in self._counters:
            self._counters[topic].lost_to_retention += lost
        # A position moved: read from there; a skip is persisted at once.
        self._effects |= (READY | FETCH | COMMIT) if lost else (READY | FETCH)
        return lost

    def _is_finished(self, message: Record) -> bool:
        """Acked or dead-lettered (as far as this group's position says)."""
        cur = self._reader.cursor(message.topic, message.qid)
        offset = message.offset
        if cur is None or offset >= cur.fetch_offset:
            return False
        if any(start <= offset < end for start, end in cur.restore):
            return False
        value = self._order_value(message)
        first = None if value is None else cur.scan.get(value)
        if first is not None and offset >= max(first, cur.scan_from):
            return False
        if offset in self._tally.held_offsets(message.topic, message.qid):
            return False
        chain = None if value is None else self._seq.chain(message.topic, value)
        low = None if chain is None else chain.lowest_unread(message.qid)
        return low is None or offset < low

    # -- queues joining and leaving (cluster mode, DESIGN.md s. 8; a single proxy never calls
    # these): ``add_queue`` serves a queue from its persisted progress; ``pause_queue`` hands
    # out nothing new from a releasing queue (``pull`` sets its ready entries aside) while
    # results still apply; ``in_flight_on`` tells when the hand-over may go (0);
    # ``queue_progress`` is the final commit's; ``drop_queue`` forgets it (results answer
    # ``unknown``). ----------------------------------------------------------------------------
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
        self._effects |= FETCH

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
        return self._flight.on(topic, qid)

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
        self._effects |= READY

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
