"""The SQLite store's dedup table (offsets are planned by ``_append_plan``).

Runs on the writer thread inside the writer's transaction, so an id recorded by an earlier
append of the same group transaction is already visible to the next one (same connection),
committed or not.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence

import orjson

from cproxy.model import NewMessage
from cproxy.store._append_plan import Stored
from cproxy.store._common import dedup_live

logger = logging.getLogger(__name__)

#: Prune expired dedup entries after this many new ones, so the cost is amortised over appends.
PRUNE_EVERY = 10_000


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
