"""Operator actions on a group: seek, redrive, blocked keys, skip and release, stats.

These are rare and may scan the group's in-memory state; the hot path lives in ``group``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cproxy.engine.group import GroupEngine
from cproxy.engine.sequencer import Entry, State
from cproxy.errors import BlockedKeyNotFound, NotBlocked
from cproxy.model import DeadLetter, MessageRef

_STATE_NAMES = {
    State.READY: "ready",
    State.IN_FLIGHT: "in_flight",
    State.RETRYING: "retrying",
    State.EXHAUSTED: "exhausted",
}


def seek(engine: GroupEngine, topic: str, targets: Mapping[int, int]) -> None:
    """Restart the given queues of ``topic`` at the given offsets (qid -> offset).

    Everything the group holds in memory for those queues is dropped: acks for messages that
    were in flight there become unknown. Redriven dead letters of those queues are dropped
    too, since the seek replays (or deliberately skips) them.
    """
    qids = set(targets)

    def hit(entry: Entry) -> bool:
        return entry.message.topic == topic and entry.message.qid in qids

    dropped: list[Entry] = []
    for registry in (engine.in_flight, engine.exhausted):
        for ref in [r for r in registry if r[0] == topic and r[1] in qids]:
            dropped.append(registry.pop(ref))
    queue = engine.ready[topic]
    for entry in (*queue.reactivated, *queue.fresh):
        if entry.state is State.READY and hit(entry):
            queue.discard(entry)
            dropped.append(entry)
    for entry in engine.retrying_entries():
        if hit(entry):
            engine.retrying -= 1
            dropped.append(entry)
    seq = engine.sequencer
    for chain in [c for c in seq.chains.values() if c.topic == topic]:
        keep = deque(e for e in chain.waiting if not hit(e))
        gone = [e for e in chain.waiting if hit(e)]
        seq.waiting -= len(gone)
        chain.waiting = keep
        dropped.extend(gone)
        for qid in qids:
            chain.parked.pop(qid, None)
        if chain.head is not None and hit(chain.head):
            chain.head = None
            nxt = seq.advance(chain)
            if nxt is not None:
                engine.ready[topic].push(nxt, reactivated=True)
            elif chain.parked and chain.reloading == 0:
                engine.request_reload(chain)
        else:
            seq.forget_if_idle(chain)
    for entry in dropped:
        entry.state = State.DONE
        engine.buffered -= 1
        if entry.redriven:
            engine.pending.redrive_done.append(entry.message.ref)
    for qid, offset in targets.items():
        engine.partitions[(topic, qid)].reset(offset)


def redrive(engine: GroupEngine, dead_letters: Sequence[DeadLetter]) -> int:
    """Deliver dead letters again, in the given (original) order; returns how many.

    Redriven messages bypass ``max_buffered`` parking (their offsets are already committed,
    so they could not be read back) and start again at attempt 1.
    """
    count = 0
    for dead in dead_letters:
        message = dead.message
        part = engine.partitions.get((message.topic, message.qid))
        if part is None:
            # No longer subscribed: keep it a plain dead letter.
            engine.pending.dead_letters.append(
                DeadLetter(
                    dead.group, message, dead.attempts, dead.last_error, dead.dead_lettered_at_ms
                )
            )
            continue
        if not part.tracker.is_finished(message.offset):
            # A seek put it back in the normal flow: it will be delivered anyway.
            engine.pending.redrive_done.append(message.ref)
            continue
        entry = Entry(message, None, redriven=True)
        engine.buffered += 1
        if engine.sequencer.admit(entry, engine.order_value(message)):
            engine.ready[message.topic].push(entry, reactivated=False)
        count += 1
    return count


@dataclass(frozen=True, slots=True)
class BlockedKey:
    topic: str
    order_value: str | None
    qid: int
    offset: int
    state: str
    attempts: int
    last_error: str | None
    blocked_since_ms: int
    waiting: int
    parked: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "order_value": self.order_value,
            "qid": self.qid,
            "offset": self.offset,
            "head_offset": self.offset,  # the contract's name; "offset" kept for symmetry
            "state": self.state,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "blocked_since_ms": self.blocked_since_ms,
            "waiting": self.waiting,
            "parked": self.parked,
        }


def blocked_keys(
    engine: GroupEngine, topic: str | None = None, limit: int | None = None
) -> list[BlockedKey]:
    """Order values whose head is in flight, retrying or exhausted, longest-blocked first."""
    rows: list[BlockedKey] = []
    for chain in engine.sequencer.chains.values():
        head = chain.head
        if head is None or head.state is State.READY or (topic and chain.topic != topic):
            continue
        rows.append(_row(head, chain.value, len(chain.waiting), chain.is_parked))
    for entry in engine.exhausted.values():
        if entry.chain is None and (not topic or entry.message.topic == topic):
            rows.append(_row(entry, None, 0, False))
    rows.sort(key=lambda r: (r.blocked_since_ms, r.topic, r.qid, r.offset))
    return rows if limit is None else rows[:limit]


def _row(head: Entry, value: str | None, waiting: int, parked: bool) -> BlockedKey:
    m = head.message
    return BlockedKey(
        m.topic,
        value,
        m.qid,
        m.offset,
        _STATE_NAMES[head.state],
        head.attempt,
        head.last_error,
        head.blocked_since_ms,
        waiting,
        parked,
    )


def _find_blocked(
    engine: GroupEngine, topic: str, order_value: str | None, ref: MessageRef | None
) -> Entry:
    entry: Entry | None = None
    if order_value is not None:
        chain = engine.sequencer.chains.get((topic, order_value))
        entry = chain.head if chain is not None else None
    elif ref is not None:
        entry = engine.exhausted.get(ref) or next(
            (e for e in engine.retrying_entries() if e.message.ref == ref), None
        )
        if entry is None:
            entry = next(
                (
                    c.head
                    for c in engine.sequencer.chains.values()
                    if c.head is not None and c.head.message.ref == ref
                ),
                None,
            )
    if entry is None or entry.state is State.DONE:
        raise BlockedKeyNotFound(f"no blocked head for topic {topic!r} matches the request")
    if entry.state not in (State.EXHAUSTED, State.RETRYING):
        raise NotBlocked(
            f"head {entry.message.ref} is {_STATE_NAMES[entry.state]}: only retrying or "
            "exhausted heads can be skipped or released"
        )
    return entry


def _unblock(engine: GroupEngine, entry: Entry) -> None:
    if entry.state is State.EXHAUSTED:
        del engine.exhausted[entry.message.ref]
    else:
        engine.retrying -= 1


def skip(
    engine: GroupEngine, topic: str, order_value: str | None, ref: MessageRef | None, now_ms: int
) -> MessageRef:
    """Dead-letter a retrying or exhausted head so its chain moves on."""
    entry = _find_blocked(engine, topic, order_value, ref)
    _unblock(engine, entry)
    entry.last_error = f"{entry.last_error or 'blocked'} (skipped by operator)"
    engine.dead_letter(entry, now_ms)
    return entry.message.ref


def release(
    engine: GroupEngine, topic: str, order_value: str | None, ref: MessageRef | None
) -> MessageRef:
    """Deliver a retrying or exhausted head again now, with a fresh attempt budget."""
    entry = _find_blocked(engine, topic, order_value, ref)
    _unblock(engine, entry)
    entry.attempt = 0
    engine.ready[topic].push(entry, reactivated=True)
    return entry.message.ref


def stats(engine: GroupEngine) -> dict[str, Any]:
    """Counts and per-queue offsets (``dead_lettered`` is added by the broker)."""
    seq = engine.sequencer
    blocked = sum(
        1 for c in seq.chains.values() if c.head is not None and c.head.state is not State.READY
    )
    blocked += sum(1 for e in engine.exhausted.values() if e.chain is None)
    return {
        "queues": [
            {
                "topic": p.topic,
                "qid": p.qid,
                "committed_offset": p.tracker.base,
                "next_offset": p.end_offset,
                "lag": p.lag,
            }
            for p in engine.partitions.values()
        ],
        "ready": engine.ready_count,
        "in_flight": len(engine.in_flight),
        "waiting": seq.waiting,
        "retrying": engine.retrying,
        "exhausted": len(engine.exhausted),
        "buffered": engine.buffered,
        "blocked_keys": blocked,
        "parked_keys": sum(1 for c in seq.chains.values() if c.is_parked),
    }
