# cproxy: compiled (mypyc), see cproxy/_native.py
"""Order value extraction: which chain a message belongs to.

``order_by`` is one of ``"qid"`` (the whole queue is one chain), ``"key"`` (the message key),
``"none"`` (every message independent) or a JSON path into the body such as ``$.user.id`` or
``$.items[0].sku``. The path grammar is deliberately small — dotted names, quoted names
(``$['a.b']``) and array indexes — because an order value must be a single, deterministic
value: wildcards, slices, filters and recursive descent are rejected rather than guessed at.

The order value is a string (the *string form* of the value): strings as they are, other
scalars and containers as canonical JSON. Chains are keyed by that exact string, never by a
hash. ``None`` means "unordered": the message joins no chain.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from cproxy.errors import InvalidOrderBy
from cproxy.model import Record

Segment = str | int

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
_INDEX = re.compile(r"\[(-?\d+)\]")
_QUOTED = re.compile(r"""\[\s*(?:'((?:[^'\\]|\\.)*)'|"((?:[^"\\]|\\.)*)")\s*\]""")
_MAX_PATH_CHARS: Final = 512


def parse_json_path(path: str) -> tuple[Segment, ...]:
    """Parse ``$.a.b[0]['c d']`` into ``("a", "b", 0, "c d")``; raise ``InvalidOrderBy``."""
    if len(path) > _MAX_PATH_CHARS:
        raise InvalidOrderBy(f"JSON path longer than {_MAX_PATH_CHARS} characters")
    if not path.startswith("$"):
        raise InvalidOrderBy(f"JSON path {path!r} must start with '$'")
    segments: list[Segment] = []
    pos = 1
    while pos < len(path):
        char = path[pos]
        if char == "." and path.startswith("..", pos):
            raise InvalidOrderBy(f"JSON path {path!r}: recursive descent '..' is not supported")
        if char == ".":
            match = _NAME.match(path, pos + 1)
            if match is None:
                raise InvalidOrderBy(
                    f"JSON path {path!r}: expected a field name at position {pos + 1}"
                )
            segments.append(match.group(0))
            pos = match.end()
        elif char == "[":
            if (index := _INDEX.match(path, pos)) is not None:
                segments.append(int(index.group(1)))
                pos = index.end()
            elif (quoted := _QUOTED.match(path, pos)) is not None:
                raw = quoted.group(1) if quoted.group(1) is not None else quoted.group(2)
                segments.append(re.sub(r"\\(.)", r"\1", raw))
                pos = quoted.end()
            else:
                raise InvalidOrderBy(
                    f"JSON path {path!r}: unsupported selector at position {pos} "
                    "(only [n], ['name'] and .name are allowed)"
                )
        else:
            raise InvalidOrderBy(f"JSON path {path!r}: unexpected {char!r} at position {pos}")
    if not segments:
        raise InvalidOrderBy("JSON path '$' selects the whole body; name a field")
    return tuple(segments)


def _string_form(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    # Sorted keys make {"a":1,"b":2} and {"b":2,"a":1} the same chain.
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _select(document: Any, segments: tuple[Segment, ...]) -> Any:
    node = document
    for segment in segments:
        if isinstance(segment, str):
            if not isinstance(node, dict):
                return None
            node = node.get(segment)
        else:
            if not isinstance(node, list) or not -len(node) <= segment < len(node):
                return None
            node = node[segment]
        if node is None:
            return None
    return node


Extractor = Callable[[Record], str | None]


def by_key(message: Record) -> str | None:
    """``order_by: key``. The reader reads ``message.key`` itself when a topic's extractor
    is this one: a call through a function object costs more than the read."""
    return message.key


def by_qid(message: Record) -> str | None:
    """``order_by: qid``: one chain per queue."""
    return str(message.qid)


def unordered(message: Record) -> str | None:
    """``order_by: none``."""
    return None


@dataclass(frozen=True, slots=True)
class OrderBy:
    """A parsed ``order_by`` setting; ``extract`` gives a message's order value."""

    spec: str
    #: Two settings are equal when their specs are: a re-PUT of the same group config must
    #: not restart the group (that would make every in-flight delivery unknown).
    extract: Extractor = field(compare=False)

    @classmethod
    def parse(cls, spec: str) -> OrderBy:
        if spec == "qid":
            return cls(spec, by_qid)
        if spec == "key":
            return cls(spec, by_key)
        if spec == "none":
            return cls(spec, unordered)
        if spec.startswith("$"):
            segments = parse_json_path(spec)

            def extract(message: Record) -> str | None:
                try:
                    document = orjson.loads(message.body_json)
                except orjson.JSONDecodeError:
                    return None
                return _string_form(_select(document, segments))

            return cls(spec, extract)
        raise InvalidOrderBy(
            f"order_by must be 'qid', 'key', 'none' or a JSON path like '$.user.id', got {spec!r}"
        )
