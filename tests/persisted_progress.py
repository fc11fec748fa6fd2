"""A group's persisted progress as the SQLite store keeps it, read from the server's data dir
with a separate read-only connection (the server keeps running).

The ``progress`` table has one row per (group, topic id, qid): ``committed`` (the lowest
unfinished offset) and ``finished``, a JSON text: either the compact form
``{"read_to": n, "open": [[start, end], ...], "parked": [[order value, offset], ...]}`` or,
from older versions, a list of finished ``[start, end]`` ranges.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PersistedProgress:
    """One group's persisted progress, summed over its queues."""

    queues: int
    bytes: int  # sum of length(finished): what is rewritten every commit interval
    open_ranges: int  # held-in-memory ranges (compact form)
    parked: int  # (order value, offset) entries (compact form)
    finished_ranges: int  # ranges of the old form (0 with the compact form)
    committed: int  # sum of committed offsets

    @property
    def entries(self) -> int:
        return self.open_ranges + self.parked + self.finished_ranges


def read_progress(data_dir: Path, group: str) -> PersistedProgress:
    """The persisted progress of ``group`` in the SQLite store under ``data_dir``."""
    uri = f"file:{data_dir / 'cproxy.db'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=10)) as db:
        rows = db.execute(
            "SELECT length(finished), committed, finished FROM progress WHERE grp = ?", (group,)
        ).fetchall()
    open_ranges = parked = finished = 0
    for _, _, detail in rows:
        data = json.loads(detail)
        if isinstance(data, list):
            finished += len(data)
        else:
            open_ranges += len(data["open"])
            parked += len(data["parked"])
    return PersistedProgress(
        queues=len(rows),
        bytes=sum(int(n) for n, _, _ in rows),
        open_ranges=open_ranges,
        parked=parked,
        finished_ranges=finished,
        committed=sum(int(c) for _, c, _ in rows),
    )
