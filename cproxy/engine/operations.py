# cproxy: compiled (mypyc), see cproxy/_native.py
"""Operator actions and less frequent verbs of a group: seek, redrive, blocked keys, skip,
release, stats, retention, taking deliveries back uncharged.

These are ``GroupEngine`` methods (mixed in from here to keep modules small). They are rare
and may scan the group's held state; the hot path lives in ``group``. Each is built on the
same verbs as the hot path (``Tally.move``, ``Sequencer`` verbs, ``_finish``), so counts stay
derived from state.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from mypy_extensions import trait

from cproxy.engine.chains import Chain
from cproxy.engine.deadlines import DeadlineHeap
from cproxy.engine.group_config import GroupConfig
from cproxy.engine.progress import committed_offset, parked_by_queue
from cproxy.engine.reader import Reader
from cproxy.engine.records import CommitBatch, Counters
from cproxy.engine.sequencer import Sequencer
from cproxy.engine.snapshots import BlockedKey, GroupStats, Outcome, QueuePosition, TopicCounts
from cproxy.engine.work import Entry, State, Tally
from cproxy.errors import BlockedKeyNotFound, NotBlocked, ReplayInProgress
from cproxy.model import DeadLetter, Message, MessageRef, QueueRef

_STATE_NAMES = {
    State.READY: "ready",
    State.IN_FLIGHT: "in_flight",
    State.RETRYING: "retrying",
    State.EXHAUSTED: "exhausted",
    State.DELAYED: "delayed",
}

#: Head states that do not block their key: ready, or delayed (waiting for its time).
_NOT_BLOCKED: Final = (State.READY, State.DELAYED)


# A trait: when mypyc compiles the engine (``cproxy/_native.py``), a native class may have only
# one base class that is not a trait.
@trait
class Operations:
    """Operator actions, mixed into ``GroupEngine``, which owns (and sets) this state."""

    config: GroupConfig
    _seq: Sequencer
    _reader: Reader
    _tally: Tally
    _counters: dict[str, Counters]
    _in_flight: dict[MessageRef, Entry]
    _exhausted: dict[MessageRef, Entry]
    _retries: DeadlineHeap
    _pending: CommitBatch
    _max_issued: int

    # GroupEngine's own methods. Declared as methods, not as attributes of a Callable type:
    # in a compiled trait an attribute is a slot, which a method of the class does not fill.
    def _order_value(self, message: Message) -> str | None:
        raise NotImplementedError

    def _current(self, ref: MessageRef, attempt: int | None) -> Entry | None:
        raise NotImplementedError

    def _send_back(self, chain: Chain, members: list[Entry]) -> None:
        raise NotImplementedError

    def _compact_heaps(self) -> None:
        raise NotImplementedError

    def _dead_letter(self, entry: Entry, now_ms: int) -> None:
        raise NotImplementedError

    def seek(self, topic: str, targets: Mapping[int, int]) -> None:
        """Restart the given queues of ``topic`` at the given offsets (qid -> offset).

        Everything the group holds in memory for those queues is dropped: results for
        messages that were in flight there become unknown. Redriven dead letters of those
        queues are dropped too, since the seek replays (or deliberately skips) them.
        """
        qids = set(targets)
        dropped = self._seq.drop(topic, qids)
        # Unordered messages that are handed out, retrying or exhausted hold no chain.
        for registry in (self._in_flight, self._exhausted):
            for ref in [r for r in registry if r[0] == topic and r[1] in qids]:
                entry = registry.pop(ref)
                if entry.chain is None:
                    dropped.append(entry)
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

    def replay(self, topic: str, value: str, found: Sequence[Sequence[Message]]) -> int:
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
        return len(entries)

    def blocked_keys(self, now_ms: int, topic: str | None = None) -> list[BlockedKey]:
        """Stuck order values (``_stuck``) and exhausted unordered messages, longest-blocked
        first, each with its head's body."""
        rows: list[BlockedKey] = []
        for chain in self._seq.chains():
            head = chain.head
            if head is None or (topic and chain.topic != topic) or not self._stuck(head, now_ms):
                continue
            rows.append(_row(head, chain.value, len(chain.waiting), chain.is_parked))
        for entry in self._exhausted.values():
            if entry.chain is None and (not topic or entry.message.topic == topic):
                rows.append(_row(entry, None, 0, False))
        rows.sort(key=lambda r: (r.blocked_since_ms, r.topic, r.qid, r.offset))
        return rows

    def _stuck(self, head: Entry, now_ms: int) -> bool:
        """A chain head that holds its key up: it failed and waits for its retry, it is
        exhausted, or it has been in flight (since its first hand-out) ``stuck_after_ms`` or
        longer. A head merely being handled is not stuck."""
        state = head.state
        if state is State.RETRYING or state is State.EXHAUSTED:
            return True
        return (
            state is State.IN_FLIGHT
            and now_ms - head.blocked_since_ms >= self.config.stuck_after_ms
        )

    def in_flight_by_consumer(self) -> dict[str | None, int]:
        """Messages in flight per consumer id (None: pushed)."""
        counts: dict[str | None, int] = {}
        for entry in self._in_flight.values():
            counts[entry.consumer] = counts.get(entry.consumer, 0) + 1
        return counts

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
        entry = self._find_blocked(topic, order_value, ref)
        self._exhausted.pop(entry.message.ref, None)
        entry.last_error = f"{entry.last_error or 'blocked'} (skipped by operator)"
        self._dead_letter(entry, now_ms)
        return entry.message.ref

    def release(self, topic: str, order_value: str | None, ref: MessageRef | None) -> MessageRef:
        """Deliver a retrying or exhausted head again now, with a fresh budget of charged
        deliveries (its delivery numbers go on)."""
        entry = self._find_blocked(topic, order_value, ref)
        self._exhausted.pop(entry.message.ref, None)
        entry.charged = 0
        entry.blocked_since_ms = -1
        self._seq.retry_now(entry)
        return entry.message.ref

    def _find_blocked(self, topic: str, order_value: str | None, ref: MessageRef | None) -> Entry:
        entry: Entry | None = None
        if order_value is not None:
            chain = self._seq.chain(topic, order_value)
            entry = chain.head if chain is not None else None
        elif ref is not None:
            entry = self._exhausted.get(ref) or next(
                (e for e in self._retries.live() if e.message.ref == ref), None
            )
            if entry is None:
                entry = next(
                    (
                        c.head
                        for c in self._seq.chains()
                        if c.head is not None and c.head.message.ref == ref
                    ),
                    None,
                )
        if entry is None or entry.state is State.OUT:
            raise BlockedKeyNotFound(f"no blocked head for topic {topic!r} matches the request")
        if entry.state not in (State.EXHAUSTED, State.RETRYING):
            raise NotBlocked(
                f"head {entry.message.ref} is {_STATE_NAMES[entry.state]}: only retrying or "
                "exhausted heads can be skipped or released"
            )
        return entry

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
            if self._stuck(head, now_ms):
                stuck += 1
            elif head.state is State.IN_FLIGHT:
                in_flight_keys += 1
        blocked = stuck + sum(1 for e in self._exhausted.values() if e.chain is None)
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
            entry = self._current(ref, attempts.get(ref) if attempts else None)
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
            del self._in_flight[ref]
            self._seq.retry_now(entry)
        self._compact_heaps()
        return Outcome(applied, unknown)

    def on_retention(self, topic: str, qid: int, min_offset: int) -> int:
        """Retention deleted the queue's messages below ``min_offset``: skip those not read
        yet and count them as lost (``stats().lost_to_retention``); returns how many."""
        lost = self._reader.skip_to(topic, qid, min_offset)
        if topic in self._counters:
            self._counters[topic].lost_to_retention += lost
        return lost

    def _is_finished(self, message: Message) -> bool:
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


def _row(head: Entry, value: str | None, waiting: int, parked: bool) -> BlockedKey:
    m = head.message
    return BlockedKey(
        m.topic,
        value,
        m.qid,
        m.offset,
        _STATE_NAMES[head.state],
        head.charged,
        head.last_error,
        head.blocked_since_ms,
        waiting,
        parked,
        m.body_json,
    )
