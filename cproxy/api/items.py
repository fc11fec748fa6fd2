# cproxy: compiled (mypyc), see cproxy/_native.py
"""The per-item loops of the hot calls, compiled with mypyc (``cproxy._native``).

A pull answer walks one item per delivered message, and a pull or ack with results one per
acked message. Interpreted, those loops cost more than the msgspec calls they feed: every
item is an interpreted iteration and every ``m.field`` an attribute lookup. Compiled, reading
a field of a native ``Record`` is a C struct access. (The produce answer's loop stays in
``wire.py``: it reads ``AppendResult``, a ``Struct``, whose fields compiled code reads with
generic lookups, slower than the interpreter's.) The msgspec ``Struct``s they build are
defined in modules mypyc leaves alone (``bodies``, ``cproxy.broker.message_json``): compiled
classes lose their ``Struct`` options.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, cast

import msgspec

from cproxy.broker import Delivered, Handout, Result

from .bodies import AckItem, FailItem, QueueResults

_RAW_NULL: Final = msgspec.Raw(b"null")


def delivered(items: Sequence[Handout], runs: bool) -> list[Delivered]:
    """The messages of a pull answer (``message_json.delivery_json`` as ``Struct``s): the
    group's transform of the body when it has one; ``run`` only with ``runs``."""
    raw = msgspec.Raw
    out: list[Delivered] = []
    for d in items:
        m = d.message
        body = d.body_json
        headers = m.headers_json
        out.append(
            Delivered(
                m.topic,
                m.qid,
                m.offset,
                m.key,
                raw(m.body_json if body is None else body),
                raw(headers) if headers else _RAW_NULL,
                d.attempt,
                d.charged,
                m.produced_at_ms,
                d.run if runs else None,
                True if d.replay else None,
            )
        )
    return out


def results(items: Sequence[QueueResults]) -> list[Result]:
    """Acks and fails as the broker takes them; ``{"offset", "attempt"}`` items fence."""
    out: list[Result] = []
    for r in items:
        attempts: dict[int, int] = {}
        acks = r.acks
        # Plain offsets, the common case, are taken as decoded, without a copy.
        if not _plain(acks):
            acks = [a if isinstance(a, int) else _fenced(a, attempts) for a in acks]
        fails: list[tuple[int, str | None]] = []
        for f in r.fails:
            if isinstance(f, int):
                fails.append((f, None))
            else:
                fails.append((_fenced(f, attempts), f.error))
        out.append(Result(r.topic, r.qid, cast(list[int], acks), fails, attempts or None))
    return out


def _plain(offsets: Sequence[object]) -> bool:
    """Whether every item is a plain offset (no fenced ``AckItem``)."""
    return all(isinstance(a, int) for a in offsets)  # mypyc compiles this to a loop


def _fenced(item: AckItem | FailItem, attempts: dict[int, int]) -> int:
    """``item``'s offset, its attempt (when it names one) recorded in ``attempts``."""
    if item.attempt is not None:
        attempts[item.offset] = item.attempt
    return item.offset
