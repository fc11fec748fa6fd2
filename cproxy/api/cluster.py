"""``GET /v1/cluster``: the proxies of the cluster and the queues each owns."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from .auth import require
from .routing import CproxyRoute
from .wire import json_response

router = APIRouter(prefix="/v1/cluster", tags=["cluster"], route_class=CproxyRoute)


@router.get(
    "",
    summary="Live proxies and the queues each owns",
    dependencies=[Depends(require("read_topics"))],
)
async def cluster(request: Request) -> Response:
    """``{"cluster": true, "node_id": <this proxy>, "members": [{"node_id", "advertise_url",
    "queues": [{"topic", "qid", "epoch", "state"}]}]}``, members by node id; a single proxy
    (SQLite) answers ``{"cluster": false, "node_id": null, "members": []}``."""
    node = request.app.state.cluster
    if node is None:
        return json_response({"cluster": False, "node_id": None, "members": []})
    members = await node.view()
    return json_response(
        {
            "cluster": True,
            "node_id": node.node_id,
            "members": [
                {
                    "node_id": m.node_id,
                    "advertise_url": m.advertise_url,
                    "queues": [
                        {"topic": q.topic, "qid": q.qid, "epoch": q.epoch, "state": q.state}
                        for q in m.queues
                    ],
                }
                for m in members
            ],
        }
    )
