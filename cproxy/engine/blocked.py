# cproxy: compiled (mypyc), see cproxy/_native.py
"""Heads that hold their key up: exhausted messages waiting for an operator, finding a blocked
head to skip or release, and listing stuck keys.

``Blocked`` is a collaborator of ``GroupEngine`` (``cproxy.engine.group``), which moves the
entries' states; it reads the sequencer's chains and the retry heap it is given.
"""

from __future__ import annotations

from collections.abc import Collection

from cproxy.engine.deadlines import DeadlineHeap
from cproxy.engine.sequencer import Sequencer
from cproxy.engine.snapshots import BlockedKey
from cproxy.engine.work import Entry, State, pop_queues
from cproxy.errors import BlockedKeyNotFound, NotBlocked
from cproxy.model import MessageRef

STATE_NAMES = {
    State.READY: "ready",
    State.IN_FLIGHT: "in_flight",
    State.RETRYING: "retrying",
    State.EXHAUSTED: "exhausted",
    State.DELAYED: "delayed",
}


class Blocked:
    """Exhausted entries (``on_exhausted = "block"``) and the stuck heads of one group."""

    def __init__(self, seq: Sequencer, retries: DeadlineHeap, stuck_after_ms: int) -> None:
        self._seq = seq
        self._retries = retries
        self._stuck_after_ms = stuck_after_ms
        self._exhausted: dict[MessageRef, Entry] = {}

    def exhausted(self, entry: Entry) -> None:
        """``entry`` (just moved to EXHAUSTED) waits for an operator."""
        self._exhausted[entry.message.ref] = entry

    def discard(self, entry: Entry) -> None:
        """``entry`` no longer waits for an operator (skipped or released)."""
        self._exhausted.pop(entry.message.ref, None)

    def drop(self, topic: str, qids: Collection[int]) -> list[Entry]:
        """Forget the exhausted entries of those queues (a seek); returns the unordered ones
        (no chain holds them, so the caller drops them itself)."""
        return pop_queues(self._exhausted, topic, qids)

    def unordered(self) -> int:
        """Exhausted messages that hold no chain (each blocks only itself)."""
        return sum(1 for e in self._exhausted.values() if e.chain is None)

    def is_stuck(self, head: Entry, now_ms: int) -> bool:
        """A chain head that holds its key up: it failed and waits for its retry, it is
        exhausted, or it has been in flight (since its first hand-out) ``stuck_after_ms`` or
        longer. A head merely being handled is not stuck."""
        state = head.state
        if state is State.RETRYING or state is State.EXHAUSTED:
            return True
        return state is State.IN_FLIGHT and now_ms - head.blocked_since_ms >= self._stuck_after_ms

    def rows(self, now_ms: int, topic: str | None) -> list[BlockedKey]:
        """Stuck order values and exhausted unordered messages, longest-blocked first, each
        with its head's body."""
        rows: list[BlockedKey] = []
        for chain in self._seq.chains():
            head = chain.head
            if head is None or (topic and chain.topic != topic) or not self.is_stuck(head, now_ms):
                continue
            rows.append(_row(head, chain.value, len(chain.waiting), chain.is_parked))
        for entry in self._exhausted.values():
            if entry.chain is None and (not topic or entry.message.topic == topic):
                rows.append(_row(entry, None, 0, False))
        rows.sort(key=lambda r: (r.blocked_since_ms, r.topic, r.qid, r.offset))
        return rows

    def find(self, topic: str, order_value: str | None, ref: MessageRef | None) -> Entry:
        """The retrying or exhausted head an operator names (by order value, or by ref if
        unordered): ``BlockedKeyNotFound`` or ``NotBlocked`` otherwise."""
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
                f"head {entry.message.ref} is {STATE_NAMES[entry.state]}: only retrying or "
                "exhausted heads can be skipped or released"
            )
        return entry


def _row(head: Entry, value: str | None, waiting: int, parked: bool) -> BlockedKey:
    m = head.message
    return BlockedKey(
        m.topic,
        value,
        m.qid,
        m.offset,
        STATE_NAMES[head.state],
        head.charged,
        head.last_error,
        head.blocked_since_ms,
        waiting,
        parked,
        m.body_json,
    )
