"""WAL checkpoints off the write path.

By default SQLite checkpoints inside the COMMIT that makes the WAL cross
``wal_autocheckpoint`` pages: that one commit then copies the whole WAL into the database
file and fsyncs it, and every produce queued behind it waits. Measured at 6,400 msgs/s
(batches of 20, `/tmp`-backed SQLite on the 2-core machine): produce-to-delivery p99 13 ms
with those checkpoints against 3-4 ms without.

So a daemon thread with its own connection runs ``PRAGMA wal_checkpoint(PASSIVE)`` every
``INTERVAL_S``: a passive checkpoint never waits for readers or the writer, and the writer
keeps appending to the WAL while it runs (WAL mode lets a checkpoint and a writer proceed
at once). Each run copies only what the last interval wrote. The writer's own
``wal_autocheckpoint`` stays on at ``FALLBACK_PAGES``, a safety net should this thread fall
behind. A checkpoint is crash-safe: a SIGKILL during one loses nothing committed.

A checkpoint alone never makes the WAL shorter: SQLite writes the WAL from its start again
only when a write transaction *begins* on a fully checkpointed WAL, and under steady load
frames are committed while every pass runs. So the WAL grew to ``FALLBACK_PAGES``, and the
writer's own checkpoint then copied up to a pass interval's frames inside a produce's
COMMIT: 8-15 ms with the event loop stopped, every ~1.5 s at 27k msgs/s, which was the
produce-to-delivery p99 on a disk-backed data dir (old journal, round 8).

So once a pass found the WAL over ``RESTART_FRAMES``, this thread *settles* it: it passes
again, back to back, until a pass finds no frame committed since the one before. The whole
WAL is then in the database file, and the writer's next transaction starts the WAL over by
itself (SQLite does so when a write begins on a fully checkpointed WAL), at no cost to it.
Each settling pass copies only the frames of the previous pass's few milliseconds, and the
writer is idle most of the time below its peak: in a latency run at 10-36k msgs/s this
took a median of 4 passes (5 ms), and 60 of 64 long WALs settled. Only if writes kept coming
(for ``SETTLE_S``, or over ``SETTLE_FRAMES``) does ``on_long_wal`` ask the writer to
checkpoint the few frames committed since, just before its next BEGIN (``Transactions``):
that costs the writer two fsyncs (2-6 ms with the event loop stopped on the 2-core
machine's disk, at 20k msgs/s, about every 0.6 s), which settling spares it. A saturated
writer grows the WAL by ``SETTLE_FRAMES`` within a few passes, so settling costs it little.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

#: How often the WAL is checkpointed (s): small enough that each run copies little.
INTERVAL_S = 0.2
#: The writer checkpoints by itself only when the WAL reaches this many pages (64 MiB of 4 KiB
#: pages), i.e. when the background checkpoints stopped keeping up.
FALLBACK_PAGES = 16384
#: A pass that found the WAL at least this long (frames = pages; 16 MiB) asks the writer to
#: start it over.
RESTART_FRAMES = 4096
#: Settling passes follow a pass over a long WAL for at most this long (s), and while the WAL
#: grew by fewer frames than this, before the writer is asked to catch up.
SETTLE_S = 0.05
SETTLE_FRAMES = 256


class Checkpointer:
    """``start()`` after the database is open, ``stop()`` before its connections close."""

    def __init__(self, path: Path, on_long_wal: Callable[[], None] | None = None) -> None:
        """``on_long_wal`` is called (from this thread) when a WAL of at least
        ``RESTART_FRAMES`` could not be settled."""
        self._path = path
        self._on_long_wal = on_long_wal
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failed = False
        #: Long WALs settled by this thread, and those the writer was asked to catch up.
        self.settled = 0
        self.asked = 0

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"sqlite-checkpoint:{self._path.name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop and wait for a checkpoint in progress (blocking: call from a worker thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            logger.warning("SQLite store: no background checkpoints (%s); writer does them", exc)
            return
        try:
            conn.execute("PRAGMA synchronous = NORMAL")
            while not self._stop.wait(INTERVAL_S):
                self._checkpoint(conn)
        finally:
            conn.close()

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        """One pass; if it found the WAL long, settle it (see the module docstring)."""
        result = self._pass(conn)
        if result is None or result[0] or result[1] < RESTART_FRAMES:
            return
        if self._settle(conn, result[1]):
            self.settled += 1
        elif self._on_long_wal is not None:
            self.asked += 1
            self._on_long_wal()

    def _settle(self, conn: sqlite3.Connection, frames: int) -> bool:
        """Pass again until a pass finds the WAL as the one before left it, all of it copied
        (or already started over); False if writes kept coming (see ``SETTLE_S``)."""
        deadline = time.monotonic() + SETTLE_S
        most = frames + SETTLE_FRAMES
        while frames < most and time.monotonic() < deadline and not self._stop.is_set():
            result = self._pass(conn)
            if result is None or result[0]:
                return False
            _, now_frames, copied = result
            if now_frames < frames:  # the writer started the WAL over already
                return True
            if now_frames == frames:
                if copied == now_frames:
                    return True
                # A reader's snapshot holds frames back: give it a moment, don't spin.
                self._stop.wait(0.001)
            frames = now_frames
        return False

    def _pass(self, conn: sqlite3.Connection) -> tuple[int, int, int] | None:
        """``PRAGMA wal_checkpoint(PASSIVE)``: (busy: another checkpoint ran, frames in the
        WAL, frames copied into the database), or None if it failed."""
        try:
            busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            if not self._failed:  # once, not every 200 ms (the writer's fallback still works)
                logger.warning("SQLite store: background checkpoint failed: %s", exc)
            self._failed = True
            return None
        if self._failed:
            logger.info("SQLite store: background checkpoints work again")
        self._failed = False
        return int(busy), int(frames), int(copied)
