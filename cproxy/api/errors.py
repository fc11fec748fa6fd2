"""Every answer's bytes and every error's answer, rendered here and nowhere else.

An answer is a ``Reply``: ``(status, headers, body)``, written by the ASGI adapter or the
lean HTTP protocol alike. Errors are ``{"error": {"code", "message"}}``: domain errors map by
class (a 401 also carries an RFC 6750 ``WWW-Authenticate`` challenge), a request body that is
missing or not JSON is 400 and one of the wrong shape 422 (``bad_body``: the one translator
of decoding errors), and anything unexpected is logged with its traceback and becomes a 500
that reveals nothing (``internal``).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import msgspec
import orjson
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException
from starlette.responses import Response

from cproxy import errors

from .wire import refs

logger = logging.getLogger(__name__)

#: ``(status, headers, body)``: a whole answer; the headers include ``content-length``.
Reply = tuple[int, list[tuple[bytes, bytes]], bytes]
JSON = b"application/json"
#: The realm named in ``WWW-Authenticate`` challenges.
REALM = "cproxy"

STATUS: dict[type[errors.CproxyError], int] = {
    errors.InvalidRequest: 422,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.TooLarge: 413,
    errors.UnsupportedMediaType: 415,
    errors.StoreError: 503,
    errors.Unauthorized: 401,
    errors.Forbidden: 403,
}


def reply(
    body: bytes, status: int = 200, content_type: bytes = JSON, *extra: tuple[bytes, bytes]
) -> Reply:
    return (
        status,
        [(b"content-type", content_type), (b"content-length", b"%d" % len(body)), *extra],
        body,
    )


def json_reply(payload: Any, status: int = 200) -> Reply:
    return reply(orjson.dumps(payload), status)


def error_reply(status: int, code: str, message: str, *extra: tuple[bytes, bytes]) -> Reply:
    return reply(orjson.dumps({"error": {"code": code, "message": message}}), status, JSON, *extra)


class BadBody(Exception):
    """A request body that is missing (400 ``missing_body``), not JSON (400
    ``invalid_json``) or of the wrong shape, a query string included (422
    ``validation_error``)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def status_for(exc: errors.CproxyError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def render(exc: errors.CproxyError | BadBody, method: str, path: str) -> Reply:
    """The error answer for ``exc`` (a 401 with its ``WWW-Authenticate`` challenge)."""
    if isinstance(exc, BadBody):
        return error_reply(exc.status, exc.code, exc.message)
    status = status_for(exc)
    if status >= 500:
        logger.warning("%s %s -> %d %s: %s", method, path, status, exc.code, exc.message)
    if isinstance(exc, errors.StaleResults):  # the results that were not current
        error = {"code": exc.code, "message": exc.message, "unknown": refs(exc.refs)}
        return reply(orjson.dumps({"error": error}), status, JSON)
    if isinstance(exc, errors.Unauthorized):
        return error_reply(status, exc.code, exc.message, (b"www-authenticate", challenge(exc)))
    return error_reply(status, exc.code, exc.message)


def challenge(exc: errors.Unauthorized) -> bytes:
    """The RFC 6750 ``WWW-Authenticate`` value of a 401: the realm, plus
    ``error="invalid_token"`` when a bearer token was given but nobody configured it (no
    error code when no credentials came, as RFC 6750 section 3.1 asks)."""
    if isinstance(exc, errors.InvalidToken):
        return f'Bearer realm="{REALM}", error="invalid_token"'.encode()
    return f'Bearer realm="{REALM}"'.encode()


def internal(method: str, path: str) -> Reply:
    """The one 500: logged with the traceback being handled, nothing revealed."""
    logger.exception("unhandled error on %s %s", method, path)
    return error_reply(500, "internal_error", "internal error; see the server log")


# -- decoding: the one translator ----------------------------------------------------------------
_AT = re.compile(r"^(.*) - at `\$(.*)`$", re.DOTALL)
_INDEX = re.compile(r"\[(\d+)\]")


def describe(exc: msgspec.ValidationError) -> str:
    """msgspec's "Expected `int`, got `str` - at `$.messages[0].qid`" as the API's
    "messages.0.qid: Expected `int`, got `str`" (the path first, as for every 422)."""
    found = _AT.match(str(exc))
    if found is None:
        return f"body: {exc}"
    where = _INDEX.sub(r".\1", found.group(2)).lstrip(".")
    return f"{where or 'body'}: {found.group(1)}"


def not_json(raw: bytes) -> BadBody:
    if not raw:
        return BadBody(400, "missing_body", "this call needs a JSON request body")
    return BadBody(400, "invalid_json", "the request body is not valid JSON")


def bad_body(exc: Exception, raw: bytes | None) -> BadBody:
    """The answer to a request a decoder refused with ``exc``: its body ``raw``, or its query
    string (``raw`` None). msgspec stops at the first wrong field, possibly before bytes that
    are not JSON at all: the body is parsed once more (only on this error path) so that those
    stay a 400."""
    if isinstance(exc, msgspec.ValidationError):
        if raw is None:
            return BadBody(422, "validation_error", f"query.{describe(exc)}")
        try:
            orjson.loads(raw)
        except orjson.JSONDecodeError:
            return not_json(raw)
        return BadBody(422, "validation_error", describe(exc))
    return not_json(raw or b"")


# -- what FastAPI answers itself (unknown paths, other methods, /openapi.json failing) -----------
def _response(answer: Reply) -> Response:
    status, headers, body = answer
    response = Response(body, status_code=status)
    response.raw_headers = headers
    return response


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    extra = [(k.lower().encode(), v.encode()) for k, v in (exc.headers or {}).items()]
    return _response(error_reply(exc.status_code, code, str(exc.detail), *extra))


async def _unexpected(request: Request, exc: Exception) -> Response:
    return _response(internal(request.method, request.url.path))


def install(app: FastAPI) -> None:
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
