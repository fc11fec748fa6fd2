"""A single proxy on SQLite is not a cluster, and says so."""

from __future__ import annotations

from tests.support import RunningServer


def test_a_sqlite_proxy_answers_404_for_the_cluster(server: RunningServer) -> None:
    answer = server.client().get("/v1/cluster")
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "not_found"
