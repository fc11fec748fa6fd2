"""The SQLite store's append: assigning offsets, and the dedup table.

Runs on the writer thread inside the writer's transaction, so an id recorded by an earlier
append of the same group transaction is already visible to the next one (same connection),
committed or not.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from cproxy.model import AppendResult, Message, NewMessage
from cproxy.store._common import dedup_live

logger = logging.getLogger(__name__)

#: Prune expired dedup entries after this many new ones, so the cost is amortised over appends.
PRUNE_EVERY = 10_000

#: (qid, offset, produced_at_ms) of a stored message.
Stored = tuple[int, int, int]


class Dedup:
    """Dedup lookups and writes for the writer thread; keeps what pruning needs to know."""

    def __init__(self) -> None:
        # Hints for pruning only: a write that is rolled back may still have moved them, which
        # at worst prunes a little early (the counter) or keeps entries longer (the window).
        self._max_window_ms = 0
        self._since_prune = 0

    def known(
        self,
        conn: sqlite3.Connection,
        tid: int,
        messages: Sequence[NewMessage],
        now_ms: int,
        window_ms: int,
    ) -> dict[str, Stored]:
        """The live entries for the ids of ``messages``: id -> where that message is stored."""
        ids = [m.id for m in messages if m.id is not None]
        if window_ms <= 0 or not ids:
            return {}
        known: dict[str, Stored] = {}
        # One statement for any number of ids: json_each avoids the variable limit.
        for msg_id, qid, off, ts in conn.execute(
            "SELECT id, qid, off, produced_at_ms FROM dedup"
            " WHERE tid = ? AND id IN (SELECT value FROM json_each(?))",
            (tid, orjson.dumps(ids).decode()),
        ):
            if dedup_live(ts, now_ms, window_ms):
                known[msg_id] = (qid, off, ts)
        return known

    def record(
        self,
        conn: sqlite3.Connection,
        rows: Sequence[tuple[int, str, int, int, int]],
        now_ms: int,
        window_ms: int,
    ) -> None:
        """Insert ``(tid, id, qid, off, produced_at_ms)`` rows; prune now and then."""
        if not rows:
            return
        conn.executemany(
            "INSERT OR REPLACE INTO dedup (tid, id, qid, off, produced_at_ms)"
            " VALUES (?, ?, ?, ?, ?)",
            rows,
        )
        self._max_window_ms = max(self._max_window_ms, window_ms)
        self._since_prune += len(rows)
        if self._since_prune >= PRUNE_EVERY:
            self._since_prune = 0
            cur = conn.execute(
                "DELETE FROM dedup WHERE produced_at_ms <= ?", (now_ms - self._max_window_ms,)
            )
            logger.debug("pruned %d expired dedup entries", cur.rowcount)


@dataclass
class Plan:
    """What one append writes, and what it returns."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)  # ``messages`` columns
    dedup_rows: list[tuple[int, str, int, int, int]] = field(default_factory=list)
    results: list[AppendResult] = field(default_factory=list)
    #: qid -> (next offset, last produced_at_ms) once this append is in.
    tails: dict[int, tuple[int, int]] = field(default_factory=dict)


def plan(
    topic: str,
    tid: int,
    messages: Sequence[NewMessage],
    qids: Sequence[int],
    now_ms: int,
    dedup: bool,
    known: dict[str, Stored],
    tail: Callable[[int], tuple[int, int]],
) -> Plan:
    """Offsets, clamped produced_at and dedup hits of ``messages``.

    ``qids`` are the messages' validated queues (``_common.message_qids``).
    ``tail(qid)`` is the queue's (next offset, last produced_at_ms) before this append;
    ``known`` the live dedup entries of its ids, and it learns the ids stored here, so the
    second of two messages with one id is a duplicate of the first.
    """
    out = Plan()
    for qid, m in zip(qids, messages, strict=True):
        if dedup and m.id is not None:
            hit = known.get(m.id)
            if hit is not None:
                out.results.append(AppendResult(hit[0], hit[1], True, hit[2]))
                continue
        current = out.tails.get(qid)
        if current is None:
            off, last = tail(qid)
            ts = max(now_ms, last)  # produced_at never goes backwards within a queue
        else:
            off, ts = current
        out.tails[qid] = (off + 1, ts)
        out.rows.append((tid, qid, off, ts, m.key, m.id, m.headers_json, m.body_json))
        if dedup and m.id is not None:
            known[m.id] = (qid, off, ts)
            out.dedup_rows.append((tid, m.id, qid, off, ts))
        message = Message(topic, qid, off, m.key, m.body_json, m.headers_json, m.id, ts)
        out.results.append(AppendResult(qid, off, False, ts, message))
    return out
