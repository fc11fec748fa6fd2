"""The OpenAPI document, made from the endpoints' own declarations, and ``/docs`` served
without the internet.

Every operation comes from an ``Endpoint`` (``endpoint.py``): its path and query parameters,
its request body type (``bodies.py``), its answers by status (``answers.py``) and the error
statuses it may answer. All schemas come from one generator (``msgspec``) over those types,
so what decodes a request is what the document says. Every response the test suite sees is
validated against the document (tests/openapi_check.py).

Swagger UI's assets (version 5, which renders OpenAPI 3.1) come from the ``fastapi-offline``
package (no CDN).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

from . import answers
from .endpoint import Endpoint

_REF = "#/components/schemas/{name}"
_DESCRIPTIONS = {
    200: "OK",
    201: "Created",
    400: "Bad request (the body is missing or not valid JSON)",
    401: "Missing, unknown or repeated token (with `WWW-Authenticate: Bearer`)",
    403: "The token may not do this",
    404: "Unknown topic, group or blocked head",
    409: "Conflict",
    413: "Too large",
    415: "Unsupported media type",
    422: "Validation failed",
    503: "The store is unavailable or the server is stopping",
}


def _errors(endpoint: Endpoint) -> set[int]:
    """The error statuses ``endpoint`` may answer: those of its prologue and its own."""
    found = {*endpoint.errors, 413}  # a declared Content-Length over the limit: any route
    if endpoint.action is not None:
        found |= {401, 403, 503}
    if endpoint.body is not None:
        found |= {400, 413, 415, 422}
    if endpoint.query is not None:
        found.add(422)
    return found


def _operation(endpoint: Endpoint, schema: dict[Any, Any], components: dict[str, Any]) -> Any:
    parameters = [
        {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
        for p in re.findall(r"\{(\w+)\}", endpoint.path)
    ]
    if endpoint.query is not None:
        query = components[endpoint.query.__name__]
        parameters += [
            {
                "name": name,
                "in": "query",
                "required": name in query.get("required", ()),
                "schema": s,
            }
            for name, s in query["properties"].items()
        ]
    responses: dict[str, Any] = {}
    for status, kind in sorted(endpoint.answers.items()):
        content = {endpoint.content_type: {"schema": schema[kind]}}
        responses[str(status)] = {"description": _DESCRIPTIONS[status], "content": content}
    error = {"application/json": {"schema": schema[answers.ErrorBody]}}
    for status in sorted(_errors(endpoint)):
        responses.setdefault(str(status), {"description": _DESCRIPTIONS[status], "content": error})
    operation: dict[str, Any] = {
        "tags": [endpoint.path.split("/")[2] if endpoint.path.startswith("/v1/") else "health"],
        "summary": endpoint.summary,
        # FastAPI's scheme (handler name + path + method): the ids the routes always had.
        "operationId": re.sub(r"\W", "_", f"{endpoint.handler.__name__}{endpoint.path}")
        + f"_{endpoint.method.lower()}",
        "parameters": parameters,
        "responses": responses,
    }
    if endpoint.body is not None:
        operation["requestBody"] = {
            "required": not endpoint.optional_body,
            "content": {"application/json": {"schema": schema[endpoint.body]}},
        }
    return operation


def build(app: FastAPI, endpoints: list[Endpoint]) -> dict[str, Any]:
    """The OpenAPI document of ``endpoints`` (cached on the app); an endpoint without
    declared answers (the console) is no part of the API."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    spec = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=[])
    documented = [e for e in endpoints if e.answers]
    types = list(
        dict.fromkeys(
            [answers.ErrorBody, answers.GroupConfigBody]
            + [t for e in documented for t in (e.body, e.query, *e.answers.values()) if t]
        )
    )
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    schema = dict(zip(types, schemas, strict=True))
    paths: dict[str, Any] = {}
    for endpoint in documented:
        operation = _operation(endpoint, schema, components)
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = operation
    spec["paths"] = paths
    # Every /v1 call takes a bearer token when tokens are configured: /docs shows an
    # Authorize button for it (``/healthz``, ``/readyz`` and ``/metrics`` need none).
    spec["components"] = {
        "schemas": components,
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
    }
    for path, operations in paths.items():
        if path.startswith("/v1/"):
            for operation in operations.values():
                operation["security"] = [{"bearer": []}]
    app.openapi_schema = spec
    return spec


def install(app: FastAPI, endpoints: list[Endpoint]) -> None:
    """Serve ``/openapi.json`` from ``build`` and ``/docs`` with bundled Swagger UI assets."""
    import fastapi_offline

    app.openapi = lambda: build(app, endpoints)  # type: ignore[method-assign]
    assets = Path(fastapi_offline.__file__).parent / "static"
    app.mount("/docs/assets", StaticFiles(directory=assets), name="swagger-ui-assets")

    async def docs(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="openapi.json",
            title=f"{app.title} API",
            swagger_js_url="docs/assets/swagger-ui-bundle.js",
            swagger_css_url="docs/assets/swagger-ui.css",
            swagger_favicon_url="docs/assets/favicon.png",
        )

    app.add_route("/docs", docs, include_in_schema=False)
