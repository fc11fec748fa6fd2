"""Fast JSON responses: orjson, with message bodies embedded verbatim."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from cproxy.engine.sequencer import Entry
from cproxy.model import MessageRef


def json_response(payload: Any, status_code: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status_code, media_type="application/json")


def error_response(status_code: int, code: str, message: str) -> Response:
    return json_response({"error": {"code": code, "message": message}}, status_code)


_NULL = orjson.Fragment(b"null")


def message_json(entry: Entry) -> dict[str, Any]:
    m = entry.message
    return {
        "topic": m.topic,
        "qid": m.qid,
        "offset": m.offset,
        "key": m.key,
        # Stored bodies are valid JSON already: embed them without decoding.
        "body": orjson.Fragment(m.body_json),
        "headers": orjson.Fragment(m.headers_json) if m.headers_json else _NULL,
        "attempt": entry.attempt,
        "produced_at_ms": m.produced_at_ms,
    }


def refs_json(refs: list[MessageRef]) -> list[dict[str, Any]]:
    return [{"topic": t, "qid": q, "offset": o} for t, q, o in refs]
