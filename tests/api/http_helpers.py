"""Small helpers for the HTTP API tests: error-body checks, setup calls and a pull loop.

Setup calls go through the SDK client (``consumer_sdk.Client``), the one client of the API;
tests pass the ``httpx.Client`` they also use for raw requests, and :func:`sdk_for` derives an
SDK client with the same base URL and token from it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import httpx
import pytest

from consumer_sdk import Client
from tests.support import RunningServer, make_settings

SNAKE_CASE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")
JSON_HEADERS = {"content-type": "application/json"}


@contextmanager
def shared_server(
    tmp_path_factory: pytest.TempPathFactory, **overrides: Any
) -> Iterator[RunningServer]:
    """A server for a module-scoped fixture (``server_factory`` is per test)."""
    running = RunningServer(make_settings(tmp_path_factory.mktemp("cproxy-data"), **overrides))
    try:
        yield running
    finally:
        running.stop()


class StateWatch:
    """Checks that requests leave stored data alone: each check compares what ``probe`` sees
    now with what it saw at the previous check (so one bad request fails only its own test).
    """

    def __init__(self, probe: Callable[[], dict[str, Any]]) -> None:
        self._probe = probe
        self._last = probe()

    def assert_unchanged(self) -> None:
        now = self._probe()
        before, self._last = self._last, now
        assert now == before, "the request changed stored data"


def fresh_client(server: RunningServer) -> httpx.Client:
    """A client with its own connection; plain HTTP, so skip building a TLS context (slow)."""
    return server.client(verify=False)


def assert_error(
    response: httpx.Response,
    status: int | Iterable[int] | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """Check the contract's error body ``{"error": {"code", "message"}}`` and the status.

    ``status`` of None means "any 4xx" (a 5xx is never acceptable for client input).
    """
    where = f"{response.request.method} {response.request.url.path}"
    detail = f"{where} -> {response.status_code} {response.text[:300]}"
    if status is None:
        assert 400 <= response.status_code < 500, detail
    elif isinstance(status, int):
        assert response.status_code == status, detail
    else:
        assert response.status_code in set(status), detail
    assert response.headers.get("content-type", "").startswith("application/json"), detail
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, detail
    error = body["error"]
    assert isinstance(error, dict), detail
    # A 409 stale_results also lists the results that were not current (docs/api.md).
    extra = {"unknown"} if error.get("code") == "stale_results" else set()
    assert set(error) == {"code", "message", *extra}, detail
    assert isinstance(error["code"], str) and SNAKE_CASE.match(error["code"]), detail
    assert isinstance(error["message"], str) and error["message"].strip(), detail
    if code is not None:
        assert error["code"] == code, detail
    return error


def sdk_for(client: httpx.Client) -> Client:
    """An SDK client for the same server and token as ``client`` (read at call time, so a
    token added to ``client.headers`` later is used too). Close it after use."""
    auth = client.headers.get("authorization", "")
    token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else None
    return Client(str(client.base_url), token=token, timeout_ms=40_000)


def create_topic(client: httpx.Client, name: str, queues: int = 1) -> None:
    with sdk_for(client) as sdk:
        sdk.create_topic(name, queues)


def produce(
    client: httpx.Client, topic: str, messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Produce ``messages``; the results as the JSON dicts ``{"qid", "offset", "duplicate"}``."""
    with sdk_for(client) as sdk:
        results = sdk.produce(topic, messages)
    assert len(results) == len(messages)
    return [asdict(r) for r in results]


def queue_stats(client: httpx.Client, topic: str) -> list[dict[str, Any]]:
    with sdk_for(client) as sdk:
        stats: list[dict[str, Any]] = sdk.get_topic(topic)["queue_stats"]
    return stats


def put_group(
    client: httpx.Client, group: str, topics: dict[str, str], **settings: Any
) -> dict[str, Any]:
    body = {"topics": {t: {"order_by": o} for t, o in topics.items()}, **settings}
    with sdk_for(client) as sdk:
        return sdk.put_group(group, body)


def group_stats(client: httpx.Client, group: str) -> dict[str, Any]:
    with sdk_for(client) as sdk:
        stats: dict[str, Any] = sdk.get_group(group)["stats"]
    return stats


def acks_for(messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``results`` entries that ack ``messages``."""
    return _acks_per_queue(messages, lambda m: m["offset"])


def fenced_acks_for(messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``results`` entries that ack ``messages``, each fenced by its delivery number."""
    return _acks_per_queue(messages, lambda m: {"offset": m["offset"], "attempt": m["attempt"]})


def _acks_per_queue(
    messages: Iterable[dict[str, Any]], ack: Callable[[dict[str, Any]], Any]
) -> list[dict[str, Any]]:
    by_queue: dict[tuple[str, int], list[Any]] = {}
    for m in messages:
        by_queue.setdefault((m["topic"], m["qid"]), []).append(ack(m))
    return [{"topic": t, "qid": q, "acks": acks} for (t, q), acks in by_queue.items()]


def pull_all(
    client: httpx.Client, group: str, count: int, timeout_s: float = 10.0
) -> list[dict[str, Any]]:
    """Pull (acking everything received on the next call) until ``count`` messages arrived.

    Returns the messages in the order they were handed out; fails after ``timeout_s``.
    Deliberately raw HTTP: it returns each message exactly as the wire carried it, because
    the API tests assert the wire shape (the SDK would fill in defaults for missing fields).
    """
    got: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"only {len(got)} of {count} messages pulled"
        response = client.post(
            f"/v1/groups/{group}/pull",
            json={"max_messages": 100, "wait_ms": 200, "results": results},
        )
        assert response.status_code == 200, response.text
        batch = response.json()["messages"]
        got.extend(batch)
        results = acks_for(batch)
    if results:
        response = client.post(f"/v1/groups/{group}/ack", json={"results": results})
        assert response.status_code == 200, response.text
        assert response.json()["unknown"] == [], response.text
    return got
