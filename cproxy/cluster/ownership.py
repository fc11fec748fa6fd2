"""Queue ownership rows and their transitions, each a single statement or transaction.

A row of ``queue_owners`` (see ``schema.py``) says which proxy serves a queue, for every group,
and at which ``epoch``. The transitions:

- **claim**: take a queue that is free (``owner`` NULL: handed over), or whose owner stopped
  renewing: its ``lease_until`` plus its ``grace_ms`` (the longest ack timeout it served) lies
  in the database's past. Messages the dead owner had handed out have then timed out for
  their consumers too, so serving the queue again cannot break per-key order. ``epoch`` + 1.
- **renew**: push ``lease_until`` of every row this proxy owns to now + lease.
- **release**: mark an owned row ``releasing``. The owner hands out nothing new from it, still
  takes results, and when nothing is in flight (or the longest ack timeout has passed) calls
  **hand over**: in one transaction it writes the queue's final progress (``write_final``) and
  frees the row, so the next owner starts exactly where this one stopped.

Every transition names the epoch the caller holds and does nothing when the row moved on: a
proxy that lost a queue learns it from the answer and never undoes someone else's claim.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from cproxy.errors import QueueNotOwned
from cproxy.store._pg_base import Conn

#: A queue by topic id: ``(tid, qid)``.
TidQid = tuple[int, int]

_MS = "* interval '1 millisecond'"

_ROWS = (
    "SELECT t.name, q.tid, q.qid, o.owner, coalesce(o.epoch, 0), coalesce(o.state, 'owned'),"
    f" o.lease_until, (o.owner IS NULL OR o.lease_until + o.grace_ms {_MS} < clock_timestamp())"
    " FROM queues q JOIN topics t ON t.tid = q.tid"
    " LEFT JOIN queue_owners o ON o.tid = q.tid AND o.qid = q.qid"
    ' ORDER BY t.name COLLATE "C", q.qid'
)

_CLAIM = (
    "INSERT INTO queue_owners AS o (tid, qid, owner, epoch, state, lease_until, grace_ms)"
    f" VALUES ($1, $2, $3, 1, 'owned', clock_timestamp() + $4 {_MS}, $5)"
    " ON CONFLICT (tid, qid) DO UPDATE SET owner = excluded.owner, epoch = o.epoch + 1,"
    " state = 'owned', lease_until = excluded.lease_until, grace_ms = excluded.grace_ms"
    f" WHERE o.owner IS NULL OR o.lease_until + o.grace_ms {_MS} < clock_timestamp()"
    " RETURNING o.epoch"
)

_RENEW = (
    f"UPDATE queue_owners SET lease_until = clock_timestamp() + $2 {_MS}, grace_ms = $3"
    " WHERE owner = $1 RETURNING tid, qid, epoch, state"
)

_RELEASE = (
    "UPDATE queue_owners SET state = 'releasing'"
    " WHERE tid = $1 AND qid = $2 AND owner = $3 AND epoch = $4 RETURNING 1"
)

_FREE = (
    "UPDATE queue_owners SET owner = NULL, state = 'owned', lease_until = '-infinity'"
    " WHERE tid = $1 AND qid = $2 AND owner = $3 AND epoch = $4 RETURNING 1"
)

#: Locks the rows it reads until the caller's transaction ends (see ``fencing.py``).
_FENCE = (
    "SELECT tid, qid, owner, epoch FROM queue_owners"
    " WHERE (tid, qid) IN (SELECT * FROM unnest($1::int[], $2::int[])) FOR SHARE"
)

#: The channel that tells peers a queue became free or a member joined (so they claim or
#: release without waiting for their next heartbeat).
CHANNEL = "cproxy_cluster"


@dataclass(frozen=True, slots=True)
class OwnerRow:
    """One queue and its owner as the database has it (``owner`` None: free)."""

    topic: str
    tid: int
    qid: int
    owner: str | None
    epoch: int
    state: str
    lease_until: datetime | None
    #: Free, or its owner's lease plus grace has run out (database clock).
    claimable: bool

    @property
    def ref(self) -> tuple[str, int]:
        return (self.topic, self.qid)


async def rows(conn: Conn) -> list[OwnerRow]:
    """Every queue of every topic with its owner (queues never claimed are free, epoch 0)."""
    return [OwnerRow(*row) for row in await conn.fetch(_ROWS)]


async def claim(
    conn: Conn, node_id: str, queue: TidQid, lease_ms: int, grace_ms: int
) -> int | None:
    """Take ``queue`` if it is claimable; returns the new epoch, or None if it is not."""
    epoch: int | None = await conn.fetchval(_CLAIM, *queue, node_id, lease_ms, grace_ms)
    return epoch


async def renew(conn: Conn, node_id: str, lease_ms: int, grace_ms: int) -> dict[TidQid, int]:
    """Renew the lease of every queue this node owns; returns them with their epochs.

    A queue missing from the answer (or with another epoch) was taken by someone else.
    """
    return {
        (tid, qid): epoch
        for tid, qid, epoch, _ in await conn.fetch(_RENEW, node_id, lease_ms, grace_ms)
    }


async def release(conn: Conn, node_id: str, queue: TidQid, epoch: int) -> bool:
    """Mark an owned queue releasing; False when this node no longer owns it at ``epoch``."""
    return await conn.fetchval(_RELEASE, *queue, node_id, epoch) is not None


async def hand_over(
    conn: Conn,
    node_id: str,
    queue: TidQid,
    epoch: int,
    write_final: Callable[[Conn], Awaitable[None]],
) -> None:
    """Write the queue's final progress and free it, in one transaction.

    ``write_final(conn)`` runs inside the transaction (fenced as every commit is). Raises
    ``QueueNotOwned`` (and writes nothing) when this node no longer owns ``queue`` at ``epoch``.
    """
    async with conn.transaction():
        await write_final(conn)
        if await conn.fetchval(_FREE, *queue, node_id, epoch) is None:
            raise QueueNotOwned(f"queue {queue} is not owned by {node_id} at epoch {epoch}", [])
        await notify_peers(conn, f"free:{queue[0]}:{queue[1]}")


async def notify_peers(conn: Conn, what: str) -> None:
    """Wake every proxy's next round now (delivered when the caller's transaction commits)."""
    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, what)


async def stale(conn: Conn, node_id: str, held: dict[TidQid, int]) -> list[TidQid]:
    """Of the queues in ``held`` (queue -> epoch this node believes it holds), those it does
    not own at that epoch. Locks the rows read (``FOR SHARE``) until the transaction ends, so a
    claim cannot slip in between this check and the caller's writes."""
    if not held:
        return []
    tids, qids = zip(*held, strict=True)
    found = {
        (tid, qid): (owner, epoch)
        for tid, qid, owner, epoch in await conn.fetch(_FENCE, list(tids), list(qids))
    }
    return [q for q, e in held.items() if found.get(q) != (node_id, e)]
