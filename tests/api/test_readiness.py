"""``/readyz`` reflects whether writes succeed, not just whether the store answers a read.

Real failures, each through the real SQLite store of a real server:

- a full disk: a small tmpfs filled up (needs root to mount; skipped otherwise). The store's
  readiness probe (a one-row write on its own connection) fails, and so do appends;
- a writer that cannot write: ``PRAGMA query_only`` on the store's writer connection makes
  every append fail with SQLITE_READONLY, as a read-only database does; the broker remembers
  the failed append and ``/readyz`` says 503 until an append succeeds;
- a database that cannot grow: ``PRAGMA max_page_count`` makes appends fail with SQLITE_FULL
  ("database or disk is full") while the tiny probe, which rewrites an existing page, passes.

Not here: a database file made read-only under a running server (chmod, chattr +i). SQLite
reuses the process's open descriptors, so that only bites a new process; and a filesystem
cannot be remounted read-only while files on it are open for writing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cproxy.broker import health as health_module
from tests.api.http_helpers import assert_error, create_topic, fresh_client
from tests.conftest import ServerFactory
from tests.support import RunningServer, wait_until


def writer_connection(server: RunningServer) -> sqlite3.Connection:
    """The SQLite store's writer connection (internal: the store has no switch for this)."""
    conn: sqlite3.Connection = server.app.state.broker.store._db._tx.conn
    return conn


def readyz(client: httpx.Client) -> int:
    return client.get("/readyz").status_code


def produce(client: httpx.Client, count: int = 1, size: int = 10) -> httpx.Response:
    messages = [{"body": "x" * size} for _ in range(count)]
    return client.post("/v1/topics/t/messages", json={"messages": messages})


def test_failed_appends_keep_readyz_503_while_the_probe_passes(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(health_module, "WRITE_FAILURE_HOLD_MS", 1500)
    with fresh_client(server) as client:
        create_topic(client, "t")
        conn = writer_connection(server)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
        try:
            # Big enough to need new pages: SQLITE_FULL.
            assert_error(produce(client, count=50, size=2000), 503, "store_unavailable")
            assert readyz(client) == 503
            # No appends for the hold time: the probe (which still passes) decides again, so
            # readiness cannot stick at 503 once traffic stops coming.
            wait_until(lambda: readyz(client) == 200, 10, 0.1, "readiness after the hold")
            assert_error(produce(client, count=50, size=2000), 503, "store_unavailable")
            assert readyz(client) == 503
        finally:
            conn.execute(f"PRAGMA max_page_count = {2**31}")
        assert produce(client, count=50, size=2000).status_code == 200
        assert readyz(client) == 200


@contextlib.contextmanager
def small_tmpfs(path: Path, size_kib: int) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a real full disk needs root to mount a small tmpfs")
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Write a file until the disk is full; returns it (delete it to free the space)."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        chunk = b"\0" * 4096
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


def test_full_disk_is_not_ready(server_factory: ServerFactory, tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", 8192) as disk:
        server = server_factory(data_dir=disk / "data")
        try:
            with fresh_client(server) as client:
                create_topic(client, "t")
                assert produce(client).status_code == 200
                assert readyz(client) == 200
                filler = fill(disk)
                assert readyz(client) == 503  # the probe alone sees it: no append failed yet
                assert_error(produce(client, count=200, size=2000), 503, "store_unavailable")
                assert readyz(client) == 503
                filler.unlink()
                assert produce(client, count=200, size=2000).status_code == 200
                assert readyz(client) == 200
        finally:
            server.stop()


def test_failed_appends_are_remembered_until_one_succeeds(server: RunningServer) -> None:
    with fresh_client(server) as client:
        create_topic(client, "t")
        conn = writer_connection(server)
        conn.execute("PRAGMA query_only = ON")
        try:
            assert_error(produce(client), 503, "store_unavailable")
            assert readyz(client) == 503
        finally:
            conn.execute("PRAGMA query_only = OFF")
        # Writable again, but an append failed a moment ago: not ready until one works.
        assert readyz(client) == 503
        assert produce(client).status_code == 200
        assert readyz(client) == 200
