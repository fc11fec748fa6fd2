"""Many proxies over one PostgreSQL database (DESIGN.md section 8).

The cluster decides; the store keeps. Membership, queue ownership and the fencing of commits
are the store's tables and checks, behind ``cproxy.store.cluster_base.ClusterStore`` (the only
part of the store this package uses); this package never writes SQL.

- ``assignment``: which live member should own each queue (rendezvous hashing, pure).
- ``node``: ``ClusterNode``, one proxy's loop: heartbeat, claim, release and hand over its
  queues through the store, driving the broker's queue hooks (``cproxy.broker.hosting``;
  the broker gets the node through its constructor, as ``cproxy.broker.lease.ClusterLease``).
  Started by ``cproxy.api.app`` when ``Settings.store_url`` is set (settings:
  ``cproxy.config.ClusterSettings``); documented for operators in docs/scaling.md.
"""
