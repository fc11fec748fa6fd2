"""The route class of every /v1 endpoint: authenticate first, then parse JSON with orjson.

Authentication runs before the body is parsed, so an anonymous caller gets 401 whatever it
sends. Bodies are parsed with orjson rather than the standard library: it is faster, and it
rejects what is not JSON (NaN, Infinity, lone surrogates, absurd nesting) instead of storing
something other than what was sent. ``orjson.JSONDecodeError`` subclasses
``json.JSONDecodeError``, so FastAPI still reports it as ``json_invalid`` (400).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response


class _OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
        return self._json


class CproxyRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def authenticate_then_handle(request: Request) -> Response:
            authorizer = request.app.state.authorizer
            request.state.token = authorizer.identify(request.headers.get("authorization"))
            return await handler(_OrjsonRequest(request.scope, request.receive))

        return authenticate_then_handle
