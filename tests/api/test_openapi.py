"""The OpenAPI document is complete and truthful, and /docs works without the internet.

(That every response matches the document is checked after every test: tests/conftest.py.)
"""

from __future__ import annotations

import re

from fastapi.routing import APIRoute

from cproxy.api.endpoint import Endpoint
from tests.support import RunningServer


def test_every_route_declares_its_answers_and_the_real_error_shape(
    server: RunningServer,
) -> None:
    # Every route is an endpoint on the one request path; none is a FastAPI route of its own.
    assert not [r for r in server.app.routes if isinstance(r, APIRoute)]
    endpoints = [getattr(r, "endpoint", None) for r in server.app.routes]
    endpoints = [e for e in endpoints if isinstance(e, Endpoint)]
    with server.client() as client:
        spec = client.get("/openapi.json").json()
    documented = {(m, p) for p, operations in spec["paths"].items() for m in operations}
    api = {(e.method.lower(), e.path) for e in endpoints if not e.path.startswith("/ui")}
    assert ("post", "/v1/groups/{group}/extend") in api
    assert documented == api, "routes without declared answers"
    text = str(spec)
    assert "HTTPValidationError" not in text and "'detail'" not in text
    pull = spec["paths"]["/v1/groups/{group}/pull"]["post"]
    for status in ("200", "400", "401", "403", "404", "413", "422", "503"):
        assert status in pull["responses"], status
    error = pull["responses"]["422"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/ErrorBody"}
    # The new fields of this round are declared.
    schemas = spec["components"]["schemas"]
    assert "max_per_key" in schemas["Pull"]["properties"]
    assert "attempt" in schemas["AckItem"]["properties"]
    assert "run" in schemas["Message"]["properties"]
    for field in ("lag_excluding_parked", "oldest_unfinished_age_ms", "lost_to_retention"):
        assert field in schemas["GroupStatsOut"]["properties"], field
    # Every route declares its body (msgspec's schema of the type that decodes it) and path
    # parameters; queries their parameters.
    for path, body in (
        ("/v1/topics/{topic}/messages", "Produce"),
        ("/v1/groups/{group}/pull", "Pull"),
        ("/v1/groups/{group}/ack", "Ack"),
        ("/v1/groups/{group}/extend", "Extend"),
        ("/v1/groups/{group}/seek", "Seek"),
    ):
        operation = spec["paths"][path]["post"]
        declared = operation["requestBody"]["content"]["application/json"]["schema"]
        assert declared == {"$ref": f"#/components/schemas/{body}"}, path
        assert [p["name"] for p in operation["parameters"]] == [path.split("/")[3][1:-1]]
    assert schemas["OutMessage"]["additionalProperties"] is False
    put = spec["paths"]["/v1/groups/{group}"]["put"]["requestBody"]["content"]
    assert put["application/json"]["schema"]["$ref"] == "#/components/schemas/GroupConfigBody"
    assert "GroupConfigBody" in schemas
    dead = spec["paths"]["/v1/groups/{group}/dead-letters"]["get"]["parameters"]
    assert [(p["name"], p["in"]) for p in dead] == [
        ("group", "path"),
        ("topic", "query"),
        ("limit", "query"),
    ]


def test_docs_page_loads_its_assets_from_this_server(server: RunningServer) -> None:
    with server.client() as client:
        page = client.get("/docs")
        assert page.status_code == 200
        urls = re.findall(r"""(?:src|href|url)\s*[:=]\s*['"]([^'"]+)['"]""", page.text)
        assert urls, page.text
        for url in urls:
            assert "://" not in url and not url.startswith("//"), url
            assert client.get("/" + url.lstrip("/")).status_code == 200, url


def test_every_v1_call_declares_the_bearer_scheme_so_docs_can_authorize(
    server: RunningServer,
) -> None:
    with server.client() as client:
        spec = client.get("/openapi.json").json()
        docs = client.get("/docs").text
    assert spec["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            expected = [{"bearer": []}] if path.startswith("/v1/") else None
            assert operation.get("security") == expected, (method, path)
    assert "openapi.json" in docs  # Swagger UI reads the schemes from it: the Authorize button
