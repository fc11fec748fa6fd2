"""Fencing: what the PostgreSQL store checks inside every progress or dead-letter commit.

A proxy holds each owned queue at an epoch (``ownership.claim``). The store's ``commit``
calls ``Fence.check`` inside its transaction with the queues the commit touches; the check
locks those ``queue_owners`` rows and raises ``QueueNotOwned`` (naming the lost queues) when
any of them is not owned by this proxy at the epoch it holds. A deposed or long-paused proxy
therefore cannot move a group's progress or write dead letters, and the broker drops the lost
queues' state so their late results answer ``unknown``.

A proxy without a fence (SQLite, or PostgreSQL outside a cluster) pays nothing: the store
skips the check when its ``fence`` is None.
"""

from __future__ import annotations

from collections.abc import Mapping

from cproxy.cluster import ownership
from cproxy.cluster.ownership import TidQid
from cproxy.errors import QueueNotOwned
from cproxy.store._pg_base import Conn


class Fence:
    """The epochs at which ``node_id`` holds its queues; updated by the coordinator only."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        #: (tid, qid) -> epoch held. A queue not listed is not owned: committing it fails.
        self.epochs: dict[TidQid, int] = {}

    async def check(self, conn: Conn, touched: Mapping[TidQid, tuple[str, int]]) -> None:
        """Raise ``QueueNotOwned`` unless every queue in ``touched`` (by tid, mapped to its
        (topic, qid)) is owned by this node at the held epoch. Call inside the transaction."""
        if not touched:
            return
        held = {q: self.epochs.get(q, -1) for q in touched}
        lost = await ownership.stale(conn, self.node_id, held)
        if lost:
            refs = sorted(touched[q] for q in lost)
            raise QueueNotOwned(
                f"node {self.node_id} no longer owns {refs} at the epoch it holds: "
                "another proxy took them over",
                refs,
            )
