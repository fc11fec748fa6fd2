"""Every response the test suite sees must match what ``/openapi.json`` declares.

``RunningServer`` wraps its app in ``Recorder``; an autouse fixture (tests/conftest.py) checks
what was recorded after each test: the status must be declared for the operation, and a JSON
body must validate against the declared schema (JSON Schema, with the document's components).
"""

from __future__ import annotations

import re
import threading
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Responses kept per test before checking (a long test keeps the first ones).
MAX_KEPT = 20_000


class Recorder:
    """ASGI middleware: keeps (method, path, status, content type, body) of each response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[tuple[str, str, int, str, bytes]] = []
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0
        content_type = ""
        chunks: list[bytes] = []

        async def recording(message: Message) -> None:
            nonlocal status, content_type
            if message["type"] == "http.response.start":
                status = message["status"]
                for name, value in message.get("headers", []):
                    if name.lower() == b"content-type":
                        content_type = value.decode()
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
            await send(message)

        await self.app(scope, receive, recording)
        with self._lock:
            if len(self.seen) < MAX_KEPT:
                body = b"".join(chunks)
                self.seen.append((scope["method"], scope["path"], status, content_type, body))

    def observe(self, method: str, path: str, status: int, content_type: str, body: bytes) -> None:
        """The same for an answer of the lean HTTP protocol (``cproxy.api.lean_http``), which
        serves the endpoints without going through this middleware."""
        with self._lock:
            if len(self.seen) < MAX_KEPT:
                self.seen.append((method, path, status, content_type, body))

    def take(self) -> list[tuple[str, str, int, str, bytes]]:
        with self._lock:
            seen, self.seen = self.seen, []
        return seen


class Checker:
    """Validates recorded responses against one OpenAPI document."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self._spec = spec
        self._paths = [
            (re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$"), path)
            for path in sorted(spec["paths"], key=lambda p: (p.count("{"), -len(p)))
        ]
        self._validators: dict[str, Draft202012Validator] = {}

    def _template(self, path: str) -> str | None:
        for pattern, template in self._paths:
            if pattern.match(path):
                return template
        return None

    def problems(self, seen: list[tuple[str, str, int, str, bytes]]) -> list[str]:
        out: list[str] = []
        for method, path, status, content_type, body in seen:
            template = self._template(path)
            if template is None:
                continue  # not part of the API (the console page, its assets, /docs)
            operation = self._spec["paths"][template].get(method.lower())
            if operation is None:
                continue  # 405: the method is not an operation of the path
            declared = operation["responses"].get(str(status))
            if declared is None:
                out.append(f"{method} {path}: status {status} is not declared")
                continue
            if "json" not in content_type or not body:
                continue
            schema = declared.get("content", {}).get("application/json", {}).get("schema")
            if schema is None:
                out.append(f"{method} {path}: {status} answered JSON, none is declared")
                continue
            key = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode()
            validator = self._validators.get(key)
            if validator is None:
                root = {**schema, "components": self._spec["components"]}
                validator = self._validators[key] = Draft202012Validator(root)
            for error in validator.iter_errors(orjson.loads(body)):
                out.append(f"{method} {path} {status}: {error.message} at {list(error.path)}")
                break
        return out
