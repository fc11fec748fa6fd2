"""Acceptance: a pipeline ``in -> out`` stores exactly one output per input (guarantee 10).

The server runs as a real subprocess (``cproxy serve`` on SQLite, see
``tests/test_kill_restart.py``). Four SDK consumers turn each input into one output by
returning ``Produce`` from their handler (the ack and the output in one call); a stale worker
pulls a few inputs, sleeps past the group's ack timeout and only then sends its ack with
outputs (which must answer 409 ``stale_results`` and store nothing). Meanwhile the server is
SIGKILLed three times and restarted on the same data dir and port. In the end every input is
finished, and "out" holds exactly one output per input, in input order per key.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from consumer_sdk import Client, RetryPolicy
from consumer_sdk.errors import ClientError
from tests.pipeline import Workers, check_outputs, read_all, set_up
from tests.support import wait_until
from tests.test_kill_restart import ServerProcess, free_port

pytestmark = pytest.mark.slow

INPUTS = 1200
KILLS = 3


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path, port=free_port())
    yield proc
    proc.kill()


def finished(url: str) -> bool:
    try:
        with Client(url, retry=RetryPolicy(max_attempts=1)) as client:
            stats = client.get_group("pipe")["stats"]
    except ClientError:
        return False
    return stats["in_flight"] == 0 and all(q["lag"] == 0 for q in stats["queues"])


def test_pipeline_stores_one_output_per_input_across_kills(server: ServerProcess) -> None:
    server.start()
    set_up(server.url, 2, INPUTS, 500)
    with Workers(server.url, lambda: server.url, 3000, 8) as workers:
        handled = workers.handled
        for kill in range(KILLS):
            target = (kill + 1) * INPUTS // (KILLS + 2)
            wait_until(lambda t=target: len(handled) >= t, 60, message=f"{target} handled")
            server.kill()
            time.sleep(0.2)
            server.start()
        wait_until(lambda: finished(server.url), 120, 0.2, "every input finished")
    check_outputs(read_all(server.url, "out", INPUTS), INPUTS)
    assert workers.stale.refused > 0, "the stale worker was never refused"
    assert len(handled) > INPUTS  # inputs were handled again (kills, stale worker)
    with httpx.Client(base_url=server.url) as http:
        assert http.get("/readyz").status_code == 200
