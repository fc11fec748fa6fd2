"""Map every error to the JSON error body ``{"error": {"code", "message"}}``.

Domain errors map by class (a 401 also carries an RFC 6750 ``WWW-Authenticate`` challenge);
request validation errors become 400 (not JSON at all) or 422 (JSON of the wrong shape);
anything unexpected is logged with its traceback and becomes a 500 that reveals nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from cproxy import errors

from .wire import error as error_response
from .wire import refs

logger = logging.getLogger(__name__)

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


def status_for(exc: errors.CproxyError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def _describe(errs: Sequence[Any]) -> str:
    parts = []
    for err in errs[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    more = f" (and {len(errs) - 5} more)" if len(errs) > 5 else ""
    return "; ".join(parts) + more


class BadBody(Exception):
    """A request body that is missing (400 ``missing_body``), not JSON (400
    ``invalid_json``) or of the wrong shape (422 ``validation_error``), found by the lean
    endpoints' decoder (``lean.py``); the same answers FastAPI's validation errors get."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def render(exc: errors.CproxyError | BadBody, method: str, path: str) -> Response:
    """The error answer for ``exc`` (a 401 with its ``WWW-Authenticate`` challenge)."""
    if isinstance(exc, BadBody):
        return error_response(exc.status, exc.code, exc.message)
    status = status_for(exc)
    if status >= 500:
        logger.warning("%s %s -> %d %s: %s", method, path, status, exc.code, exc.message)
    details = {"unknown": refs(exc.refs)} if isinstance(exc, errors.StaleResults) else {}
    response = error_response(status, exc.code, exc.message, **details)
    if isinstance(exc, errors.Unauthorized):
        response.headers["WWW-Authenticate"] = challenge(exc)
    return response


async def _cproxy_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, errors.CproxyError)
    return render(exc, request.method, request.url.path)


def challenge(exc: errors.Unauthorized) -> str:
    """The RFC 6750 ``WWW-Authenticate`` value of a 401: the realm, plus
    ``error="invalid_token"`` when a bearer token was given but nobody configured it (no
    error code when no credentials came, as RFC 6750 section 3.1 asks)."""
    if isinstance(exc, errors.InvalidToken):
        return f'Bearer realm="{REALM}", error="invalid_token"'
    return f'Bearer realm="{REALM}"'


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errs = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errs):
        return error_response(400, "invalid_json", "the request body is not valid JSON")
    if any(e.get("type") == "missing" and tuple(e.get("loc", ())) == ("body",) for e in errs):
        return error_response(400, "missing_body", "this call needs a JSON request body")
    return error_response(422, "validation_error", _describe(errs))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, str(exc.detail))


async def _unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(500, "internal_error", "internal error; see the server log")


def install(app: FastAPI) -> None:
    app.add_exception_handler(errors.CproxyError, _cproxy_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
