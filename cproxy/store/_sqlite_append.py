"""The SQLite store's dedup table (offsets are planned by ``_append_plan``).

Runs on the writer thread inside the writer's transaction, so an id recorded by an earlier
append of the same group transaction is already visible to the next one (same connection),
committed or not.

Expired entries are swept in key order, a little with every insert (``Dedup.record``): the
insert of n entries also looks at the next ``SWEEP_PER_ENTRY`` * n entries after where the
last sweep stopped and deletes the expired ones among them, starting over at the end of the
table. Entries sit in the table by id, and ids are random, so the entries that expire in any
stretch of time are spread over all of its pages: deleting them by time (schema 4 kept an
index on ``produced_at_ms`` for that, pruning every 10,000 inserts) rewrote about one page
per expired entry in one transaction. Once a 24-hour window filled up, that stalled the
writer for tens of milliseconds every 10,000 ids (``python -m benchmarks.dedup``: on 500,000
live entries, the p99 of an append of 100 ids was 45 ms that way, 5.6 with the sweep). A
sweep rewrites only the few consecutive pages it reads, and needs no index to keep up to
date on every insert. In a steady state, with as many entries expiring as coming, a lap
over the table takes a quarter of the window, so an entry is gone at most 1.25 windows
after it was stored (``known`` checks the time anyway, so a late delete only takes space).
When ids come slowly after a burst, the burst's entries expire faster than 4 per insert can
clear them; so while a sweep finds more than half of what it looked at expired, the next
one looks twice as far (up to ``SWEEP_BACKLOG_MAX``).
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

#: Entries the sweep looks at per entry inserted.
SWEEP_PER_ENTRY = 4
#: While sweeps keep finding mostly expired entries (a backlog: many ids came, then few), each
#: looks twice as far as the last, up to this many entries (a few dozen pages).
SWEEP_BACKLOG_MAX = 2048

#: The key before every entry (tids start at 1): where a lap of the sweep starts; and a key
#: after every entry (SQLite's largest integer as the tid): where the last stretch of a lap ends.
_TABLE_START = (0, "")
_TABLE_END = (2**63 - 1, "")


class Dedup:
    """Dedup lookups and writes for the writer thread; keeps where the sweep is."""

    def __init__(self) -> None:
        # Hints for the sweep only: a write that is rolled back may still have moved them,
        # which at worst leaves expired entries for the next lap.
        self._max_window_ms = 0
        #: The last key swept, (tid, id); ``_TABLE_START`` at the start of a lap.
        self._swept_to = _TABLE_START
        #: How far the next sweep looks at least, while clearing a backlog (else 0).
        self._backlog_stretch = 0

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
        """Insert ``(tid, id, qid, off, produced_at_ms)`` rows, and sweep a little."""
        if not rows:
            return
        conn.executemany(
            "INSERT OR REPLACE INTO dedup (tid, id, qid, off, produced_at_ms)"
            " VALUES (?, ?, ?, ?, ?)",
            rows,
        )
        self._max_window_ms = max(self._max_window_ms, window_ms)
        entries = max(SWEEP_PER_ENTRY * len(rows), self._backlog_stretch)
        if 2 * self._sweep(conn, now_ms, entries) > entries:
            self._backlog_stretch = min(SWEEP_BACKLOG_MAX, 2 * entries)
        else:
            self._backlog_stretch = 0

    def _sweep(self, conn: sqlite3.Connection, now_ms: int, entries: int) -> int:
        """Delete the expired entries among the next ``entries`` after the last sweep (to the
        end of the table, then the next sweep starts over); returns how many were deleted."""
        start = self._swept_to
        cutoff = now_ms - self._max_window_ms
        # The key ``entries`` on: both statements walk the same stretch of the primary key.
        end = conn.execute(
            "SELECT tid, id FROM dedup WHERE (tid, id) > (?, ?) ORDER BY tid, id LIMIT 1 OFFSET ?",
            (*start, entries - 1),
        ).fetchone()
        stop = _TABLE_END if end is None else (end[0], end[1])
        cur = conn.execute(
            "DELETE FROM dedup WHERE (tid, id) > (?, ?) AND (tid, id) <= (?, ?)"
            " AND produced_at_ms <= ?",
            (*start, *stop, cutoff),
        )
        self._swept_to = _TABLE_START if end is None else stop
        if cur.rowcount:
            logger.debug("swept %d expired dedup entries", cur.rowcount)
        return cur.rowcount
