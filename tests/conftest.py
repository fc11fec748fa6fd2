"""Fixtures shared by every test package.

- ``server``: a fresh real server (uvicorn on a free loopback port, SQLite in a temp dir);
  ``server.url`` is its base URL, ``server.client()`` an ``httpx.Client`` for it.
- ``server_factory(**settings_overrides)``: start more servers (each in its own temp dir
  unless ``data_dir=`` is given, e.g. to restart on the same data). Overrides are
  ``cproxy.config.Settings`` fields such as ``commit_interval_ms=100`` or ``tokens=(...)``.
  All servers are stopped gracefully at the end of the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.openapi_check import Checker
from tests.support import RUNNING, RunningServer, make_settings

ServerFactory = Callable[..., RunningServer]


@pytest.fixture
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    started: list[RunningServer] = []

    def start(data_dir: Path | None = None, **overrides: Any) -> RunningServer:
        directory = data_dir or tmp_path_factory.mktemp("cproxy-data")
        running = RunningServer(make_settings(directory, **overrides))
        started.append(running)
        return running

    yield start
    for running in reversed(started):
        running.stop()


@pytest.fixture
def server(server_factory: ServerFactory) -> RunningServer:
    return server_factory()


@pytest.fixture(autouse=True)
def _responses_match_openapi() -> Iterator[None]:
    """After each test: every response its servers sent matches ``/openapi.json``."""
    yield
    problems: list[str] = []
    for running in list(RUNNING):
        seen = running.recorder.take()
        if seen:
            checker = _checkers.get(id(running))
            if checker is None:
                checker = _checkers[id(running)] = Checker(running.app.openapi())
            problems += checker.problems(seen)
        if not running.alive:
            RUNNING.remove(running)
            _checkers.pop(id(running), None)
    assert not problems, "responses not matching /openapi.json:\n" + "\n".join(problems[:20])


_checkers: dict[int, Checker] = {}
