"""``GET /v1/cluster``: the proxies of the cluster and which one owns each queue."""

from __future__ import annotations

import orjson

from cproxy.errors import NotFound

from . import answers as a
from .endpoint import Call, Endpoint


async def cluster(call: Call[None, None]) -> bytes:
    """``{"node": <this proxy>, "members": [{"node", "url", "heartbeat_ms_ago"}], "queues":
    [{"topic", "qid", "owner", "state", "epoch"}]}``: members by node id, queues by (topic,
    qid); ``owner`` is null while a queue is between owners. 404 on a proxy that is not in a
    cluster (SQLite)."""
    node = call.state.cluster
    if node is None:
        raise NotFound("this proxy is not part of a cluster (it runs on SQLite)")
    view = await node.view()
    members = [
        {"node": m.node_id, "url": m.advertise_url, "heartbeat_ms_ago": m.heartbeat_ms_ago}
        for m in view.members
    ]
    queues = [
        {"topic": q.topic, "qid": q.qid, "owner": q.owner, "state": q.state, "epoch": q.epoch}
        for q in view.queues
    ]
    return orjson.dumps({"node": node.node_id, "members": members, "queues": queues})


ENDPOINTS = [
    Endpoint("GET", "/v1/cluster", cluster, action="read_topics",
             summary="Live proxies and the owner of every queue", answers={200: a.ClusterOut},
             errors=(404,)),
]  # fmt: skip
