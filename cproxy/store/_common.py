"""Rules shared by every store implementation, kept in one place so they cannot drift apart."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from cproxy.errors import InvalidRequest, TopicNotFound
from cproxy.model import DeadLetter, MessageRef, NewMessage


def dedup_live(stored_at_ms: int, now_ms: int, window_ms: int) -> bool:
    """Whether a dedup entry stored at ``stored_at_ms`` still counts at ``now_ms``.

    A window of 0 or less disables dedup, even between two messages of one call.
    """
    return window_ms > 0 and now_ms - stored_at_ms < window_ms


def topic_not_found(topic: str) -> TopicNotFound:
    return TopicNotFound(f"topic {topic!r} does not exist")


def check_qid(topic: str, qid: int, queues: int) -> None:
    """Raise ``InvalidRequest`` unless ``qid`` is a queue of the topic."""
    if not 0 <= qid < queues:
        raise InvalidRequest(f"qid {qid} is outside topic {topic!r} (queues 0..{queues - 1})")


def message_qids(topic: str, messages: Sequence[NewMessage], queues: int) -> list[int]:
    """The qid of every message, in order; ``InvalidRequest`` if one is unset or out of range.

    Stores call this before touching anything, so a bad message fails the whole append.
    """
    qids: list[int] = []
    for i, m in enumerate(messages):
        if m.qid is None:
            raise InvalidRequest(f"messages[{i}] has no qid: the broker must choose one first")
        check_qid(topic, m.qid, queues)
        qids.append(m.qid)
    return qids


def check_queues(queues: int) -> None:
    if queues < 1:
        raise InvalidRequest(f"a topic needs at least one queue, got {queues}")


def dead_letters_matching(
    rows: Iterable[DeadLetter], refs: Collection[MessageRef] | None, before_ms: int | None
) -> list[DeadLetter]:
    """The dead letters among ``refs`` (None: any) dead-lettered before ``before_ms`` (None:
    any time): what ``delete_dead_letters`` deletes of a group's (topic-filtered) rows."""
    named = None if refs is None else set(refs)
    return [
        d
        for d in rows
        if (named is None or d.message.ref in named)
        and (before_ms is None or d.dead_lettered_at_ms < before_ms)
    ]
