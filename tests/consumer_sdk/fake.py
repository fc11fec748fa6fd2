"""An in-memory stand-in for a cproxy server behind ``httpx.MockTransport`` (no sockets).

It keeps just enough of the contract to exercise the SDK: topics, produce with id dedup, one
chain per (topic, key), pull with long poll and piggybacked results, ack, extend, ack timeouts,
retries with a fixed backoff, and error injection (``fail_next``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


def now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass
class Stored:
    topic: str
    qid: int
    offset: int
    key: str | None
    body: Any
    state: str = "ready"  # ready | in_flight | retrying | done | dead
    attempt: int = 0
    deadline_ms: int = 0
    errors: list[str | None] = field(default_factory=list)


class FakeServer:
    def __init__(
        self,
        url: str = "http://fake",
        *,
        ack_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 20,
        max_attempts: int = 5,
    ) -> None:
        self.url = url
        self.ack_timeout_ms = ack_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.max_attempts = max_attempts
        self.queues: dict[str, int] = {}
        self.messages: list[Stored] = []
        self.ids: dict[tuple[str, str], Stored] = {}
        self.groups: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str, Any]] = []
        #: (method, path suffix) -> list of errors to raise/return on the next matching calls:
        #: an int status, or an exception instance to raise (e.g. httpx.ConnectError).
        self.fail_next: dict[tuple[str, str], list[int | Exception]] = {}
        self.retry_at: dict[int, int] = {}

    # -- helpers for tests -------------------------------------------------------------------
    def add_topic(self, name: str, queues: int = 1) -> None:
        self.queues[name] = queues

    def add_group(self, name: str, **config: Any) -> None:
        self.groups[name] = {"ack_timeout_ms": self.ack_timeout_ms, **config}

    def produce(self, topic: str, body: Any, key: str | None = None, qid: int = 0) -> Stored:
        offset = sum(1 for m in self.messages if m.topic == topic and m.qid == qid)
        stored = Stored(topic, qid, offset, key, body)
        self.messages.append(stored)
        return stored

    def count(self, method: str, suffix: str) -> int:
        return sum(1 for m, p, _ in self.calls if m == method and p.endswith(suffix))

    def in_flight(self) -> int:
        return sum(1 for m in self.messages if m.state == "in_flight")

    # -- engine --------------------------------------------------------------------------------
    def _tick(self) -> None:
        now = now_ms()
        for i, m in enumerate(self.messages):
            if m.state == "in_flight" and m.deadline_ms <= now:
                self._failed(i, m, "ack timeout")
            elif m.state == "retrying" and self.retry_at.get(i, 0) <= now:
                m.state = "ready"

    def _failed(self, i: int, m: Stored, error: str | None) -> None:
        m.errors.append(error)
        if m.attempt >= self.max_attempts:
            m.state = "dead"
        else:
            m.state = "retrying"
            self.retry_at[i] = now_ms() + self.retry_backoff_ms

    def _ready(self, topics: list[str] | None, limit: int) -> list[Stored]:
        out: list[Stored] = []
        blocked: set[tuple[str, str]] = set()
        for m in self.messages:
            if topics is not None and m.topic not in topics:
                continue
            chain = (m.topic, m.key) if m.key is not None else None
            if chain is not None and chain in blocked:
                continue
            if m.state in ("done", "dead"):
                continue
            if chain is not None:
                blocked.add(chain)
            if m.state == "ready" and len(out) < limit:
                out.append(m)
        return out

    def _find(self, topic: str, qid: int, offset: int) -> tuple[int, Stored] | None:
        for i, m in enumerate(self.messages):
            if (m.topic, m.qid, m.offset) == (topic, qid, offset):
                return i, m
        return None

    def _apply(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        applied, unknown = 0, []
        for r in results:
            # Plain offsets are unfenced; {"offset", "attempt"} answers only that delivery.
            outcomes: list[tuple[int, str | None, bool, int | None]] = []
            for a in r.get("acks", []):
                if isinstance(a, int):
                    outcomes.append((a, None, True, None))
                else:
                    outcomes.append((a["offset"], None, True, a.get("attempt")))
            for f in r.get("fails", []):
                if isinstance(f, int):
                    outcomes.append((f, None, False, None))
                else:
                    outcomes.append((f["offset"], f.get("error"), False, f.get("attempt")))
            for offset, error, ok, attempt in outcomes:
                found = self._find(r["topic"], r["qid"], offset)
                stale = found is not None and attempt is not None and attempt != found[1].attempt
                if found is None or found[1].state != "in_flight" or stale:
                    unknown.append({"topic": r["topic"], "qid": r["qid"], "offset": offset})
                    continue
                applied += 1
                i, m = found
                if ok:
                    m.state = "done"
                else:
                    self._failed(i, m, error)
        return {"applied": applied, "unknown": unknown}

    # -- HTTP ----------------------------------------------------------------------------------
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def sync_transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(lambda request: asyncio.run(self.handle(request)))

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        path = request.url.path
        self.calls.append((request.method, path, body))
        for (method, suffix), errors in self.fail_next.items():
            if errors and request.method == method and path.endswith(suffix):
                error = errors.pop(0)
                if isinstance(error, Exception):
                    raise error
                return _error(error, "injected", "injected failure")
        return await self._route(request.method, path.split("/")[2:], body)

    async def _route(self, method: str, parts: list[str], body: Any) -> httpx.Response:
        if parts[0] == "topics" and len(parts) == 3 and method == "POST":
            return self._produce(parts[1], body["messages"])
        if parts[0] != "groups":
            return _error(404, "not_found", "no such route")
        group = parts[1]
        if method == "PUT":
            self.groups[group] = {"ack_timeout_ms": self.ack_timeout_ms, **body}
            return httpx.Response(200, json={"name": group, **self.groups[group]})
        if group not in self.groups:
            return _error(404, "group_not_found", f"group {group!r} does not exist")
        action = parts[2] if len(parts) > 2 else None
        if action is None:
            stats = {"in_flight": self.in_flight()}
            return httpx.Response(200, json={"name": group, **self.groups[group], "stats": stats})
        if action == "pull":
            return await self._pull(body)
        if action == "ack":
            return httpx.Response(200, json=self._apply(body["results"]))
        if action == "extend":
            return self._extend(body)
        return _error(404, "not_found", "no such route")

    def _produce(self, topic: str, messages: list[dict[str, Any]]) -> httpx.Response:
        if topic not in self.queues:
            return _error(404, "topic_not_found", f"topic {topic!r} does not exist")
        results = []
        for m in messages:
            mid = m.get("id")
            if mid is not None and (topic, mid) in self.ids:
                old = self.ids[(topic, mid)]
                results.append({"qid": old.qid, "offset": old.offset, "duplicate": True})
                continue
            stored = self.produce(topic, m["body"], m.get("key"), m.get("qid") or 0)
            if mid is not None:
                self.ids[(topic, mid)] = stored
            results.append({"qid": stored.qid, "offset": stored.offset, "duplicate": False})
        return httpx.Response(200, json={"results": results})

    async def _pull(self, body: dict[str, Any]) -> httpx.Response:
        results = self._apply(body.get("results", []))
        deadline = time.monotonic() + body.get("wait_ms", 0) / 1000
        while True:
            self._tick()
            ready = self._ready(body.get("topics"), body.get("max_messages", 32))
            if ready or time.monotonic() >= deadline:
                break
            # Polling in short steps keeps the fake usable from any thread and event loop.
            await asyncio.sleep(min(0.002, max(0.0, deadline - time.monotonic())))
        out = []
        for m in ready:
            m.state, m.attempt = "in_flight", m.attempt + 1
            m.deadline_ms = now_ms() + self.ack_timeout_ms
            out.append(
                {
                    "topic": m.topic,
                    "qid": m.qid,
                    "offset": m.offset,
                    "key": m.key,
                    "body": m.body,
                    "headers": {},
                    "attempt": m.attempt,
                    "produced_at_ms": 1,
                }
            )
        return httpx.Response(200, json={"messages": out, "results": results})

    def _extend(self, body: dict[str, Any]) -> httpx.Response:
        applied, unknown = 0, []
        for ref in body["messages"]:
            found = self._find(ref["topic"], ref["qid"], ref["offset"])
            if found is None or found[1].state != "in_flight":
                unknown.append(ref)
                continue
            found[1].deadline_ms = now_ms() + body["ack_timeout_ms"]
            applied += 1
        return httpx.Response(200, json={"applied": applied, "unknown": unknown})


def _error(status: int, code: str, message: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message}})


def multi_transport(*servers: FakeServer) -> httpx.MockTransport:
    """One transport that routes by host to several fake servers."""
    by_host = {httpx.URL(s.url).host: s for s in servers}

    async def handle(request: httpx.Request) -> httpx.Response:
        return await by_host[request.url.host].handle(request)

    return httpx.MockTransport(handle)


def wait_for(predicate: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Poll ``predicate`` until truthy (sync tests); fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for condition")
        time.sleep(0.005)


async def async_wait_for(predicate: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for condition")
        await asyncio.sleep(0.005)
