"""Every JSON shape the HTTP API sends, in one place (docs/api.md describes them).

Handlers hand the broker's snapshots to these functions and answer with the result encoded
(``orjson.dumps``, or ``errors.json_reply`` for a status other than 200). Stored message
bodies and headers are already valid JSON, so they are embedded verbatim instead of being
decoded and encoded again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
import orjson

from cproxy.broker import (
    BlockedKey,
    GroupStats,
    GroupSummary,
    GroupView,
    Outcome,
    Pulled,
    PushStats,
    message_json,
)
from cproxy.model import AppendResult, DeadLetter, MessageRef, QueueStats, Record, TopicInfo

from . import items

_encode = msgspec.json.Encoder().encode


# -- topics and produce ----------------------------------------------------------------------
def topic(info: TopicInfo) -> dict[str, Any]:
    """A topic; with a retention bound, both bounds (null: unbounded). A topic without any
    keeps the original shape ``{"name", "queues"}``."""
    out: dict[str, Any] = {"name": info.name, "queues": info.queues}
    if info.retention_ms is not None or info.retention_bytes is not None:
        out["retention_ms"] = info.retention_ms
        out["retention_bytes"] = info.retention_bytes
    return out


def topics(infos: Iterable[TopicInfo]) -> dict[str, Any]:
    return {"topics": [topic(t) for t in infos]}


def topic_detail(info: TopicInfo, stats: Sequence[QueueStats]) -> dict[str, Any]:
    return {
        **topic(info),
        "queue_stats": [
            {"qid": s.qid, "min_offset": s.min_offset, "next_offset": s.next_offset} for s in stats
        ],
    }


def browsed(topic_name: str, qid: int, rows: Sequence[Record], next_offset: int) -> dict[str, Any]:
    """Stored messages read without a group, and the offset to continue from."""
    out = [_stored(m, deliver_at_ms=m.deliver_at_ms) for m in rows]
    return {"topic": topic_name, "qid": qid, "messages": out, "next": next_offset}


def _stored(m: Record, **extra: Any) -> dict[str, Any]:
    """A stored message as every answer but a pull shows it (``answers.StoredMessage``)."""
    return {**message_json(m), "id": m.id, "produced_at_ms": m.produced_at_ms, **extra}


class _Stored(msgspec.Struct, gc=False):
    """One item of a produce answer, in the order of its keys."""

    qid: int
    offset: int
    duplicate: bool


class _Produced(msgspec.Struct):
    results: list[_Stored]


def produce_answer(results: Sequence[AppendResult]) -> bytes:
    """``{"results": [{"qid", "offset", "duplicate"}, ...]}`` as bytes."""
    return _encode(_Produced([_Stored(r.qid, r.offset, r.duplicate) for r in results]))


# -- consuming (the message shape lives with the broker: push requests use it too) -----------


def refs(items: Iterable[MessageRef]) -> list[dict[str, Any]]:
    return [{"topic": t, "qid": q, "offset": o} for t, q, o in items]


def outcome(o: Outcome) -> dict[str, Any]:
    return {"applied": o.applied, "unknown": refs(o.unknown)}


def ack_produced(
    o: Outcome, outputs: Sequence[str], stored: Sequence[Sequence[AppendResult]]
) -> bytes:
    """An ack with ``produce``: the outcome and ``produced``, every output message's
    ``{"topic", "qid", "offset", "duplicate"}`` in request order."""
    produced = [
        {"topic": topic, "qid": r.qid, "offset": r.offset, "duplicate": r.duplicate}
        for topic, results in zip(outputs, stored, strict=True)
        for r in results
    ]
    return _encode({**outcome(o), "produced": produced})


def pull_answer(r: Pulled, runs: bool = False) -> bytes:
    """``{"messages": [delivery_json(d, runs), ...], "results": outcome}`` as bytes; with
    ``runs`` (``max_per_key`` > 1) each message names its run's first position. The messages
    are encoded from ``Struct``s (``items.delivered``): the same JSON, cheaper per message."""
    return _encode(
        {
            "messages": items.delivered(r.deliveries, runs),
            "results": outcome(Outcome(r.applied, r.unknown)),
        }
    )


# -- groups ----------------------------------------------------------------------------------
def group_list(groups: Iterable[GroupSummary]) -> dict[str, Any]:
    return {"groups": [{"name": g.name, "topics": list(g.topics)} for g in groups]}


def group_config(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """A group's config as shown to clients: push secrets are never sent back."""
    topics = config.get("topics")
    if isinstance(topics, dict):
        config = {**config, "topics": {t: _redacted(entry) for t, entry in topics.items()}}
    return {"name": name, **config}


#: Shown instead of a push ``secret``.
REDACTED = "********"


def _redacted(entry: Any) -> Any:
    push = entry.get("push") if isinstance(entry, dict) else None
    if not isinstance(push, dict) or "secret" not in push:
        return entry
    return {**entry, "push": {**push, "secret": REDACTED}}


def push_stats(rows: Iterable[PushStats]) -> dict[str, Any]:
    """Per pushed topic: url, in_flight, paused_until_ms (ms since the epoch), last_error."""
    return {
        p.topic: {
            "url": p.url,
            "in_flight": p.in_flight,
            "paused_until_ms": p.paused_until_ms,
            "last_error": p.last_error,
        }
        for p in rows
    }


def _stats(stats: GroupStats, dead_lettered: int, oldest_age_ms: int | None) -> dict[str, Any]:
    return {
        "queues": [
            {
                "topic": q.topic,
                "qid": q.qid,
                "committed_offset": q.committed_offset,
                "next_offset": q.next_offset,
                "lag": q.lag,
                "lag_excluding_parked": q.lag_excluding_parked,
                "lost_to_retention": q.lost_to_retention,
            }
            for q in stats.queues
        ],
        "lag_excluding_parked": stats.lag_excluding_parked,
        "oldest_unfinished_age_ms": oldest_age_ms,
        "lost_to_retention": stats.lost_to_retention,
        "filtered": stats.filtered,
        "ready": stats.ready,
        "in_flight": stats.in_flight,
        "waiting": stats.waiting,
        "retrying": stats.retrying,
        "exhausted": stats.exhausted,
        "buffered": stats.buffered,
        "blocked_keys": stats.blocked_keys,
        "in_flight_keys": stats.in_flight_keys,
        "parked_keys": stats.parked_keys,
        "delayed": stats.delayed,
        "replaying": stats.replaying,
        "dead_lettered": dead_lettered,
    }


def group_view(view: GroupView) -> dict[str, Any]:
    return {
        **group_config(view.name, view.config.to_dict()),
        "stats": {
            **_stats(view.stats, view.dead_lettered, view.oldest_unfinished_age_ms),
            "push": push_stats(view.push),
            "consumers": [
                {
                    "consumer": c.consumer,
                    "last_pull_ms_ago": c.last_pull_ms_ago,
                    "in_flight": c.in_flight,
                }
                for c in view.consumers
            ],
            "last_pull_ms_ago": view.last_pull_ms_ago,
            "delivered_per_s": round(view.delivered_per_s, 3),
            "acked_per_s": round(view.acked_per_s, 3),
            "throttled_ms": view.throttled_ms,
        },
    }


def dead_letters(rows: Iterable[DeadLetter]) -> dict[str, Any]:
    return {
        "dead_letters": [
            _stored(
                d.message,
                attempts=d.attempts,
                last_error=d.last_error,
                dead_lettered_at_ms=d.dead_lettered_at_ms,
            )
            for d in rows
        ]
    }


def blocked_keys(rows: Iterable[BlockedKey]) -> dict[str, Any]:
    return {
        "blocked_keys": [
            {
                "topic": b.topic,
                "order_value": b.order_value,
                "qid": b.qid,
                # "offset" names the head like every other message reference does;
                # "head_offset" is the contract's name for the same number.
                "offset": b.offset,
                "head_offset": b.offset,
                "state": b.state,
                "attempts": b.attempts,
                "last_error": b.last_error,
                "blocked_since_ms": b.blocked_since_ms,
                "waiting": b.waiting,
                "parked": b.parked,
                "body": orjson.Fragment(b.body_json),
            }
            for b in rows
        ]
    }


def ref(action: str, r: MessageRef) -> dict[str, Any]:
    """``{"skipped": {...}}`` / ``{"released": {...}}``: the head an action applied to."""
    return {action: {"topic": r[0], "qid": r[1], "offset": r[2]}}


def replay(replaying: int, lost_to_retention: int) -> dict[str, Any]:
    return {"replaying": replaying, "lost_to_retention": lost_to_retention}


def seek(topic_name: str, targets: dict[int, int]) -> dict[str, Any]:
    return {
        "topic": topic_name,
        "offsets": [{"qid": q, "offset": o} for q, o in sorted(targets.items())],
    }
