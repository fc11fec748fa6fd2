"""Fault injection into the SQLite store's own tables, shared by its white-box tests.

Messages are stored as record batches (``cproxy.store._records``): one ``batches`` row per
queue and produce call, the bodies inside its MessagePack ``records`` blob. A trigger that must
fire "when the message with this body is written" therefore matches the body's encoding inside
the blob of the row being inserted.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec


def on_body_written(name: str, when: str, body: bytes, action: str) -> str:
    """``CREATE TRIGGER`` text: run ``action`` (SQL) ``when`` ("BEFORE"/"AFTER") a batch
    holding a message whose body is ``body`` is inserted."""
    pattern = msgspec.msgpack.encode(body).hex()
    return (
        f"CREATE TRIGGER {name} {when} INSERT ON batches"
        f" WHEN instr(NEW.records, x'{pattern}') > 0 BEGIN {action}; END"
    )


def refuse_rows_with(path: Path, body: bytes = b"!") -> None:
    """Make SQLite itself refuse (ABORT, "injected failure") every ``batches`` row holding a
    message whose body is ``body``, from a second connection to the file at ``path``."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(
            on_body_written("boom", "BEFORE", body, "SELECT RAISE(ABORT, 'injected failure')")
        )
    finally:
        conn.close()


#: A row for another connection to write while holding the write lock (any table will do).
LOCKING_WRITE = "INSERT OR REPLACE INTO meta (k, v) VALUES ('test-lock', 'x')"
