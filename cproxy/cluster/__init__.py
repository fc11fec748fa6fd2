"""Many proxies over one PostgreSQL database (DESIGN.md section 8).

One module per concept:

- ``settings``: ``ClusterSettings`` (node id, advertise URL, heartbeat and lease times).
- ``assignment``: which live member should own each queue (rendezvous hashing, pure).
- ``schema``: the cluster's own tables (``cluster_members``, ``queue_owners``).
- ``membership``: heartbeats at the database clock, the live members.
- ``ownership``: queue ownership rows and their transitions (claim, renew, release, hand over),
  each one transaction.
- ``fencing``: the owner/epoch check that the PostgreSQL store runs inside every commit.
- ``node``: ``ClusterNode``, one proxy's loop over all of the above, driving the broker's
  queue hooks (``cproxy.broker.hosting``). Started by ``cproxy.api.app`` when
  ``Settings.store_url`` is set; documented for operators in docs/scaling.md.
"""
