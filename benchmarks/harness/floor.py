"""The floor: a bare uvicorn ASGI app with an in-memory FIFO, answering the three hot calls of
cproxy's API (produce, pull with a long poll, ack) in its wire format, so that the same Python
clients drive it. Nothing is stored, ordered or tracked: what a message costs here is the
HTTP and JSON work of those clients and of uvicorn, the least a Python HTTP service takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

Send = Callable[[dict[str, Any]], Awaitable[None]]


class Fifo:
    """One queue for everything; a pull takes from its head, waiting up to ``wait_ms``."""

    def __init__(self) -> None:
        self.items: deque[dict[str, Any]] = deque()
        self.offset = 0
        self.waiters: list[asyncio.Future[None]] = []

    def put(self, topic: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        now_ms = time.time_ns() // 1_000_000
        results = []
        for m in messages:
            self.items.append(
                {"topic": topic, "qid": 0, "offset": self.offset, "key": m.get("key"),
                 "body": m.get("body"), "attempt": 1, "produced_at_ms": now_ms}
            )  # fmt: skip
            results.append({"qid": 0, "offset": self.offset, "duplicate": False})
            self.offset += 1
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)
        return results

    async def take(self, n: int, wait_ms: int) -> list[dict[str, Any]]:
        if not self.items and wait_ms > 0:
            waiter = asyncio.get_running_loop().create_future()
            self.waiters.append(waiter)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, wait_ms / 1000)
        return [self.items.popleft() for _ in range(min(n, len(self.items)))]


FIFO = Fifo()


async def _body(receive: Callable[[], Awaitable[dict[str, Any]]]) -> Any:
    chunks = []
    while True:
        event = await receive()
        chunks.append(event.get("body", b""))
        if not event.get("more_body"):
            return orjson.loads(b"".join(chunks) or b"{}")


async def _answer(send: Send, status: int, data: Any) -> None:
    body = orjson.dumps(data)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def app(scope: dict[str, Any], receive: Any, send: Send) -> None:
    if scope["type"] != "http":
        return
    parts = scope["path"].strip("/").split("/")
    body = await _body(receive) if scope["method"] == "POST" else {}
    acked = sum(len(r.get("acks", ())) for r in body.get("results") or ())
    if parts[:2] == ["v1", "topics"] and parts[-1] == "messages":
        await _answer(send, 200, {"results": FIFO.put(parts[2], body["messages"])})
    elif parts[:2] == ["v1", "groups"] and parts[-1] == "pull":
        messages = await FIFO.take(body.get("max_messages", 10), body.get("wait_ms", 0))
        await _answer(send, 200, {"messages": messages, "results": {"applied": acked}})
    elif parts[:2] == ["v1", "groups"] and parts[-1] == "ack":
        await _answer(send, 200, {"applied": acked})
    else:
        await _answer(send, 200, {"topics": []})
