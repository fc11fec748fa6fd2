"""``GET /v1/cluster``: the proxies of the cluster and which one owns each queue."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from cproxy.errors import NotFound

from .auth import require
from .routing import CproxyRoute
from .wire import json_response

router = APIRouter(prefix="/v1/cluster", tags=["cluster"], route_class=CproxyRoute)


@router.get(
    "",
    summary="Live proxies and the owner of every queue",
    dependencies=[Depends(require("read_topics"))],
)
async def cluster(request: Request) -> Response:
    """``{"node": <this proxy>, "members": [{"node", "url", "heartbeat_ms_ago"}], "queues":
    [{"topic", "qid", "owner", "state", "epoch"}]}``: members by node id, queues by (topic,
    qid); ``owner`` is null while a queue is between owners. 404 on a proxy that is not in a
    cluster (SQLite)."""
    node = request.app.state.cluster
    if node is None:
        raise NotFound("this proxy is not part of a cluster (it runs on SQLite)")
    view = await node.view()
    return json_response(
        {
            "node": node.node_id,
            "members": [
                {"node": m.node_id, "url": m.advertise_url, "heartbeat_ms_ago": m.heartbeat_ms_ago}
                for m in view.members
            ],
            "queues": [
                {
                    "topic": q.topic,
                    "qid": q.qid,
                    "owner": q.owner,
                    "state": q.state,
                    "epoch": q.epoch,
                }
                for q in view.queues
            ],
        }
    )
