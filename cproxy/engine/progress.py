# cproxy: compiled (mypyc), see cproxy/_native.py
"""What a group has finished, per queue: derived from its state, persisted compactly.

Below a queue's fetch position every message is finished, held in memory, or *unread* for a
parked chain (released from memory, to be read back). So the committed offset (the lowest
unfinished) is the lowest of: the held offsets, the parked chains' unread offsets, the ranges
still to restore after a restart, and the fetch position. Nothing is tracked per finished
message; finishing a message costs nothing here.

The persisted form (``QueueProgress`` with ``read_to``) lists the held offsets as ranges and
each parked chain as (order value, first unread offset), so its size is bounded by the messages
held in memory (at most ``max_buffered``; in a steady flow about the messages in flight) plus
the number of parked keys, however many messages finish behind a stuck key. Unordered delayed
messages released from memory add a few offset segments (``cproxy.engine.delays``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from cproxy.engine.cursor import QueueCursor
from cproxy.engine.work import Chain, State, Tally
from cproxy.model import QueueProgress, QueueRef


def parked_by_queue(chains: Iterable[Chain]) -> dict[QueueRef, list[tuple[str, int]]]:
    """(order value, first unread offset) of every parked chain, by queue."""
    out: dict[QueueRef, list[tuple[str, int]]] = {}
    for chain in chains:
        if not chain.is_parked:
            continue
        for qid in {*chain.parked, *chain.reloading}:
            offset = chain.lowest_unread(qid)
            if offset is not None:
                out.setdefault((chain.topic, qid), []).append((chain.value, offset))
    return out


def stuck_waiting_by_queue(chains: Iterable[Chain]) -> dict[QueueRef, dict[str, list[int]]]:
    """Offsets waiting in memory behind a head that is handed out, retrying or exhausted.

    They are persisted as (order value, first offset), not one by one: a stuck key may hold
    many waiting messages (up to ``max_buffered``) before it is parked.
    """
    out: dict[QueueRef, dict[str, list[int]]] = {}
    for chain in chains:
        head = chain.head
        if head is None or head.state is State.READY or not chain.waiting:
            continue
        for entry in chain.waiting:
            m = entry.message
            if not entry.redriven:
                out.setdefault((m.topic, m.qid), {}).setdefault(chain.value, []).append(m.offset)
    return out


def committed_offset(cur: QueueCursor, held: set[int], parked: list[tuple[str, int]]) -> int:
    """The lowest unfinished offset of the queue."""
    return min(
        cur.fetch_offset,
        min(held, default=cur.fetch_offset),
        min((offset for _, offset in parked), default=cur.fetch_offset),
        min((start for start, _ in cur.restore), default=cur.fetch_offset),
        min((offset for _, offset in cur.scan_pairs()), default=cur.fetch_offset),
        _first_released(cur),
    )


def _first_released(cur: QueueCursor) -> int:
    first = cur.delays.first_offset()
    return cur.fetch_offset if first is None else first


def _ranges(offsets: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for offset in sorted(offsets):
        if out and out[-1][1] == offset:
            out[-1] = (out[-1][0], offset + 1)
        else:
            out.append((offset, offset + 1))
    return out


def queue_progress(
    cur: QueueCursor,
    tally: Tally,
    parked: list[tuple[str, int]],
    stuck_waiting: dict[str, list[int]],
    attempt_ceiling: int = 0,
    done: Collection[int] = (),
) -> QueueProgress:
    """The persisted form of one queue's progress; ``done``: held offsets to count as
    finished (results about to be applied, ``GroupEngine.progress_after``)."""
    held = tally.held_offsets(cur.topic, cur.qid)
    if done:
        held = held - set(done)
    firsts: dict[str, int] = {}
    for value, offset in [*parked, *cur.scan_pairs()]:
        firsts[value] = min(offset, firsts.get(value, offset))
    listed: set[int] = set()
    for value, offsets in stuck_waiting.items():
        firsts[value] = min(*offsets, firsts.get(value, offsets[0]))
        listed.update(offsets)
    opened = sorted([*_ranges(held - listed if listed else held), *cur.restore])
    return QueueProgress(
        committed_offset(cur, held, parked),
        read_to=cur.fetch_offset,
        open=tuple(opened),
        parked=tuple(sorted(firsts.items())),
        delayed=cur.delays.persisted(),
        attempt_ceiling=attempt_ceiling,
    )


def snapshot(
    cursors: Iterable[QueueCursor], tally: Tally, chains: Iterable[Chain], attempt_ceiling: int = 0
) -> dict[QueueRef, QueueProgress]:
    chains = list(chains)
    parked = parked_by_queue(chains)
    waiting = stuck_waiting_by_queue(chains)
    return {
        (cur.topic, cur.qid): queue_progress(
            cur,
            tally,
            parked.get((cur.topic, cur.qid), []),
            waiting.get((cur.topic, cur.qid), {}),
            attempt_ceiling,
        )
        for cur in cursors
    }
