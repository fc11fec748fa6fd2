# cproxy: compiled (mypyc), see cproxy/_native.py
"""Planning an append: offsets, clamped ``produced_at_ms`` and dedup hits, for any store.

Every store that keeps its log in tables (SQLite, PostgreSQL) plans an append the same way once
it knows each queue's tail and the live dedup entries of the call's ids, so the rules of
``base.py`` live here once and cannot drift apart between stores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cproxy.model import AppendResult, NewMessage, Record

#: (qid, offset, produced_at_ms) of a stored message.
Stored = tuple[int, int, int]


@dataclass(slots=True)
class Plan:
    """What one append writes, and what it returns."""

    #: The messages this append stores, by qid, in offset order (one record batch each).
    stored: dict[int, list[Record]] = field(default_factory=dict)
    dedup_rows: list[tuple[int, str, int, int, int]] = field(default_factory=list)
    results: list[AppendResult] = field(default_factory=list)
    #: qid -> (next offset, last produced_at_ms) once this append is in.
    tails: dict[int, tuple[int, int]] = field(default_factory=dict)


def plan(
    topic: str,
    tid: int,
    messages: Sequence[NewMessage],
    qids: Sequence[int],
    now_ms: int,
    dedup: bool,
    known: dict[str, Stored],
    tail: Callable[[int], tuple[int, int]],
) -> Plan:
    """Offsets, clamped produced_at and dedup hits of ``messages``.

    ``qids`` are the messages' validated queues (``_common.message_qids``).
    ``tail(qid)`` is the queue's (next offset, last produced_at_ms) before this append;
    ``known`` the live dedup entries of its ids, and it learns the ids stored here, so the
    second of two messages with one id is a duplicate of the first.
    """
    out = Plan()
    for qid, m in zip(qids, messages, strict=True):
        if dedup and m.id is not None:
            hit = known.get(m.id)
            if hit is not None:
                out.results.append(AppendResult(hit[0], hit[1], True, hit[2]))
                continue
        current = out.tails.get(qid)
        if current is None:
            off, last = tail(qid)
            ts = max(now_ms, last)  # produced_at never goes backwards within a queue
        else:
            off, ts = current
        out.tails[qid] = (off + 1, ts)
        if dedup and m.id is not None:
            known[m.id] = (qid, off, ts)
            out.dedup_rows.append((tid, m.id, qid, off, ts))
        message = Record(
            topic, qid, off, m.key, m.body_json, m.headers_json, m.id, ts, m.deliver_at_ms
        )
        group = out.stored.get(qid)
        if group is None:
            out.stored[qid] = [message]
        else:
            group.append(message)
        out.results.append(AppendResult(qid, off, False, ts, message))
    return out
