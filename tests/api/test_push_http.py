"""Push settings over HTTP: validation (422), the effective config (secret hidden) and the
group's push stats, with a real server pushing to a real receiver."""

from __future__ import annotations

from typing import Any

from tests.api.http_helpers import create_topic, fresh_client
from tests.push_receiver import Receiver
from tests.support import RunningServer, wait_until


def test_push_group_over_http(server: RunningServer) -> None:
    receiver = Receiver().start()
    try:
        with fresh_client(server) as client:
            create_topic(client, "t")
            bad = client.put("/v1/groups/g", json={"topics": {"t": {"push": {"url": "ftp://x/y"}}}})
            assert bad.status_code == 422, bad.text
            assert "push.url" in bad.json()["error"]["message"]
            push = {"url": receiver.url, "secret": "hush", "headers": {"X-Team": "billing"}}
            r = client.put("/v1/groups/g", json={"topics": {"t": {"push": push}}})
            assert r.status_code == 200, r.text
            shown = r.json()["topics"]["t"]["push"]
            assert shown["url"] == receiver.url and shown["secret"] != "hush"
            assert (shown["max_in_flight"], shown["timeout_ms"]) == (64, 10_000)
            sent = client.post(
                "/v1/topics/t/messages",
                json={"messages": [{"key": "a", "body": {"n": i}} for i in range(3)]},
            )
            assert sent.status_code == 200, sent.text

            def stats() -> dict[str, Any]:
                got = client.get("/v1/groups/g")
                assert got.status_code == 200, got.text
                body: dict[str, Any] = got.json()
                return body

            wait_until(lambda: stats()["stats"]["lag_excluding_parked"] == 0, message="drained")
            view = stats()
            assert view["topics"]["t"]["push"]["secret"] != "hush"
            # Sending back what GET shows would store the placeholder as the secret: refused.
            again = {k: v for k, v in view.items() if k not in ("name", "stats")}
            back = client.put("/v1/groups/g", json=again)
            assert back.status_code == 422 and "placeholder" in back.text, back.text
            assert view["stats"]["push"] == {
                "t": {
                    "url": receiver.url,
                    "in_flight": 0,
                    "paused_until_ms": None,
                    "last_error": None,
                }
            }
            assert [m["body"] for m in receiver.acked_messages()] == [{"n": i} for i in range(3)]
            assert all(r.headers["x-team"] == "billing" for r in receiver.requests)
    finally:
        receiver.stop()
