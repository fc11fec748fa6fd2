"""What the broker asks of the cluster it serves in (``cproxy.cluster.node.ClusterNode``
implements it). A leaf module: the cluster imports the broker, never the other way round."""

from __future__ import annotations

from typing import Protocol


class ClusterLease(Protocol):
    def check_lease(self) -> None:
        """Raise ``StoreError`` (503) while this proxy cannot be sure it still owns its queues
        (its lease ran out locally, e.g. after a pause): pulls, acks and extends wait, so
        nothing is handed out or finished on a queue that moved."""
        ...

    async def announce_redrive(self, group: str, topic: str | None) -> None:
        """Tell the peers to redrive the dead letters of their queues too (group, topic or
        None for all)."""
        ...
