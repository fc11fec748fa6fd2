"""What the cluster asks of its store (``cproxy.cluster`` uses only this; the PostgreSQL store
implements it, see ``postgres.py``).

The store owns every table, the cluster's included (``cluster_members``, ``queue_owners``),
and the fencing check inside its commits: a node calls ``join_cluster(node_id)`` once, and
from then on every claim it makes records the epoch it holds, every ``commit`` of progress or
dead letters checks in its transaction that the node still owns the queues it writes at those
epochs (``QueueNotOwned`` otherwise), and every append wakes the other proxies. The node says
when it stops holding a queue (``disown``); a hand-over forgets it itself.

A leaf module: the cluster imports it, and it imports nothing of the cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from cproxy.model import DeadLetter, MessageRef, QueueProgress, QueueRef, QueueStats

#: A queue by topic id: ``(tid, qid)``.
TidQid = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Member:
    """A live member as the database last heard of it."""

    node_id: str
    advertise_url: str
    heartbeat_at: datetime
    lease_until: datetime
    #: How long ago (ms, database clock) the last heartbeat was.
    heartbeat_ms_ago: int


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


@dataclass(frozen=True, slots=True)
class FinalCommit:
    """One group's last writes for a queue handed over (as ``Store.commit`` takes them)."""

    group: str
    progress: Mapping[QueueRef, QueueProgress]
    dead_letters: Sequence[DeadLetter] = ()
    redrive_done: Sequence[MessageRef] = ()


class Listener(Protocol):
    """A dedicated connection receiving the store's notifications (``ClusterStore.listen``)."""

    def is_closed(self) -> bool: ...

    async def close(self) -> None: ...


class ClusterStore(Protocol):
    """Membership, queue ownership and fencing, each call one statement or transaction.

    Every transition names the epoch the caller holds and does nothing when the row moved on:
    a node that lost a queue learns it from the answer and never undoes someone else's claim.
    Calls other than ``join_cluster`` act as the node that joined.
    """

    async def join_cluster(self, node_id: str) -> None:
        """Create the cluster tables if missing (safe when several proxies race), turn on
        fencing for ``node_id`` and the wake-ups of peers on every append."""
        ...

    async def heartbeat(self, advertise_url: str, lease_ms: int) -> datetime:
        """Renew this member's lease at the database clock; returns the heartbeat's time."""
        ...

    async def live_members(self) -> list[Member]:
        """Members whose lease has not run out, by node id."""
        ...

    async def leave_cluster(self) -> None:
        """Remove this member (a graceful shutdown)."""
        ...

    async def owner_rows(self) -> list[OwnerRow]:
        """Every queue of every topic with its owner (queues never claimed: free, epoch 0)."""
        ...

    async def claim(self, queue: TidQid, lease_ms: int, grace_ms: int) -> int | None:
        """Take ``queue`` if claimable; returns the new epoch (now held: commits are fenced
        with it), or None if it is not claimable."""
        ...

    async def renew(self, lease_ms: int, grace_ms: int) -> dict[TidQid, int]:
        """Renew the lease of every owned queue; returns them with their epochs. A queue
        missing from the answer (or with another epoch) was taken by someone else."""
        ...

    async def release(self, queue: TidQid, epoch: int) -> bool:
        """Mark an owned queue releasing; False when not owned at ``epoch``."""
        ...

    async def hand_over(self, queue: TidQid, epoch: int, finals: Sequence[FinalCommit]) -> None:
        """Write the groups' final writes for the queue and free it, in one transaction
        (fenced as every commit is); the queue is no longer held. Raises ``QueueNotOwned``
        (and writes nothing) when not owned at ``epoch``."""
        ...

    def disown(self, queue: TidQid) -> None:
        """Stop holding ``queue`` (lost to another proxy): commits on it fail from now on."""
        ...

    async def notify_peers(self, what: str) -> None:
        """Wake every proxy's next round now, telling them ``what``."""
        ...

    async def listen(
        self, on_append: Callable[[str, int, int], None], on_peer: Callable[[str], None]
    ) -> Listener:
        """Open a connection that calls ``on_append(topic, qid, next_offset)`` for every
        append committed by any proxy and ``on_peer(what)`` for every ``notify_peers``."""
        ...

    async def queue_stats(self, topic: str) -> list[QueueStats]: ...
