"""ASGI middleware rejecting request bodies over ``max_request_bytes`` before parsing."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .wire import error as error_response


def too_large_message(size: int, max_bytes: int) -> str:
    """The 413 message for a request body of at least ``size`` bytes."""
    return f"request body of {size}+ bytes; the limit is {max_bytes}"


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self, size: int) -> ASGIApp:
        return error_response(413, "too_large", too_large_message(size, self.max_bytes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) > self.max_bytes:
                await self._too_large(int(length))(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        # No length given (chunked): buffer up to the limit, then replay.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._too_large(size)(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)
