"""The OpenAPI document, made truthful, and ``/docs`` served without the internet.

FastAPI derives request schemas from the routes, but the routes answer with bytes built by
``wire.py``, so the answers, the real error shape (``{"error": {"code", "message"}}``, not
FastAPI's ``{"detail": [...]}``) and the status codes are declared here, in one table.
``tests/api/test_openapi.py`` fails when a route is missing from it, and every response the
test suite sees is validated against the document (``tests/api/conftest.py``).

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
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

from . import bodies
from . import schema_models as m
from .lean import LeanRoute

#: Errors any ``/v1`` call may answer: bad JSON, auth, too large, media type, validation,
#: store unavailable or shutting down.
_COMMON = (400, 401, 403, 413, 415, 422, 503)

#: (method, path) -> (success status -> model, extra error statuses).
ROUTES: dict[tuple[str, str], tuple[dict[int, type[BaseModel]], tuple[int, ...]]] = {
    ("get", "/v1/topics"): ({200: m.TopicList}, ()),
    ("post", "/v1/topics"): ({201: m.Topic, 200: m.Topic}, (409,)),
    ("patch", "/v1/topics/{topic}"): ({200: m.Topic}, (404,)),
    ("delete", "/v1/topics/{topic}"): ({200: m.Deleted}, (404, 409)),
    ("get", "/v1/topics/{topic}"): ({200: m.TopicDetail}, (404,)),
    ("post", "/v1/topics/{topic}/messages"): ({200: m.ProduceResults}, (404,)),
    ("get", "/v1/groups"): ({200: m.GroupList}, ()),
    ("put", "/v1/groups/{group}"): ({200: m.GroupConfigOut}, (404,)),
    ("get", "/v1/groups/{group}"): ({200: m.GroupOut}, (404,)),
    ("delete", "/v1/groups/{group}"): ({200: m.Deleted}, (404,)),
    ("post", "/v1/groups/{group}/pull"): ({200: m.PullAnswer}, (404,)),
    ("post", "/v1/groups/{group}/ack"): ({200: m.AckOutcome}, (404, 409)),
    ("post", "/v1/groups/{group}/extend"): ({200: m.ResultsOutcome}, (404,)),
    ("post", "/v1/groups/{group}/seek"): ({200: m.SeekAnswer}, (404,)),
    ("get", "/v1/groups/{group}/dead-letters"): ({200: m.DeadLetterList}, (404,)),
    ("post", "/v1/groups/{group}/dead-letters/redrive"): ({200: m.Redriven}, (404,)),
    ("get", "/v1/groups/{group}/blocked-keys"): ({200: m.BlockedKeyList}, (404,)),
    ("post", "/v1/groups/{group}/blocked-keys/skip"): ({200: m.Skipped}, (404, 409)),
    ("post", "/v1/groups/{group}/blocked-keys/release"): ({200: m.Released}, (404, 409)),
    ("get", "/v1/cluster"): ({200: m.ClusterOut}, (404,)),
    ("get", "/healthz"): ({200: m.Status}, ()),
    ("get", "/readyz"): ({200: m.Status, 503: m.Status}, ()),
}
#: Routes that answer something other than JSON.
PLAIN = {("get", "/metrics"): "text/plain"}

_DESCRIPTIONS = {
    200: "OK",
    201: "Created",
    400: "Bad request (the body is not valid JSON, or a rule of the call is broken)",
    401: "Missing or unknown token (with `WWW-Authenticate: Bearer`)",
    403: "The token may not do this",
    404: "Unknown topic, group or blocked head",
    409: "Conflict",
    413: "Too large",
    415: "Unsupported media type",
    422: "Validation failed",
    503: "The store is unavailable or the server is stopping",
}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _add_lean_routes(app: FastAPI, paths: dict[str, Any], schemas: dict[str, Any]) -> None:
    """Declare the lean endpoints (plain ASGI, unseen by FastAPI): path parameters and the
    request body schema msgspec derives from the very ``Struct`` that decodes it."""
    _, components = msgspec.json.schema_components(
        bodies.DOCUMENTED, ref_template="#/components/schemas/{name}"
    )
    schemas.update(components)
    for route in app.routes:
        if not isinstance(route, LeanRoute):
            continue
        body = route.lean.body.__name__
        # FastAPI's scheme (handler name + path + method): the ids the old routes had.
        operation_id = re.sub(r"\W", "_", f"{route.lean.name}{route.path}") + "_post"
        paths.setdefault(route.path, {})["post"] = {
            "tags": [route.tag],
            "summary": route.summary,
            "operationId": operation_id,
            "parameters": [
                {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                for p in route.param_convertors
            ],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{body}"}}
                },
            },
        }


def build(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document of ``app`` with the declared answers (cached on the app)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    spec = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    schemas: dict[str, Any] = spec.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    _add_lean_routes(app, spec["paths"], schemas)
    models: set[type[BaseModel]] = {
        model for answers, _ in ROUTES.values() for model in answers.values()
    }
    models |= {m.ErrorBody, m.GroupConfigBody}
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            key = (method, path)
            if key in PLAIN:
                text = {PLAIN[key]: {"schema": {"type": "string"}}}
                operation["responses"] = {"200": {"description": "OK", "content": text}}
                continue
            answers, errors = ROUTES.get(key, ({}, ()))
            responses: dict[str, Any] = {}
            for status, model in sorted(answers.items()):
                responses[str(status)] = {
                    "description": _DESCRIPTIONS.get(status, "OK"),
                    "content": {"application/json": {"schema": _ref(model)}},
                }
            if path.startswith("/v1/"):
                for status in sorted({*_COMMON, *errors}):
                    responses.setdefault(
                        str(status),
                        {
                            "description": _DESCRIPTIONS[status],
                            "content": {"application/json": {"schema": _ref(m.ErrorBody)}},
                        },
                    )
            operation["responses"] = responses
    put_group = spec["paths"].get("/v1/groups/{group}", {}).get("put")
    if put_group is not None:
        put_group["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(m.GroupConfigBody)}},
        }
    app.openapi_schema = spec
    return spec


def install(app: FastAPI) -> None:
    """Serve ``/openapi.json`` from ``build`` and ``/docs`` with bundled Swagger UI assets."""
    import fastapi_offline

    app.openapi = lambda: build(app)  # type: ignore[method-assign]
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
