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
from starlette.types import Scope

from cproxy.errors import UnsupportedMediaType

#: Content types read as JSON: none given, and curl's default for ``-d``.
_READ_AS_JSON = (b"", b"application/x-www-form-urlencoded")


def _as_json(scope: Scope) -> Scope:
    """The API speaks only JSON: read bodies sent without a JSON content type as JSON.

    ``curl -d '{...}'`` labels its body form-urlencoded; refusing it would only trip up
    people trying the API. Any other explicit non-JSON type gets 415.
    """
    if scope["method"] in ("GET", "HEAD"):
        return scope
    headers = scope["headers"]
    content_type = next((v for k, v in headers if k == b"content-type"), b"")
    if check_media_type(content_type):
        return scope
    rest = [(k, v) for k, v in headers if k != b"content-type"]
    return {**scope, "headers": [*rest, (b"content-type", b"application/json")]}


def check_media_type(content_type: bytes) -> bool:
    """True for a JSON media type, False for one read as JSON (none, form-urlencoded);
    ``UnsupportedMediaType`` (415) for any other."""
    media = content_type.split(b";")[0].strip().lower()
    if media == b"application/json" or media.endswith(b"+json"):
        return True
    if media not in _READ_AS_JSON:
        raise UnsupportedMediaType(
            f"send JSON (Content-Type: application/json), not {media.decode(errors='replace')}"
        )
    return False


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
            return await handler(_OrjsonRequest(_as_json(request.scope), request.receive))

        return authenticate_then_handle
