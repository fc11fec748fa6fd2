"""Push settings over HTTP: validation (422), the effective config (secret hidden) and the
group's push stats, with a real server pushing to a real receiver."""

from __future__ import annotations

from typing import Any

import pytest

from cproxy.tokens import Token
from tests.api.http_helpers import create_topic, fresh_client
from tests.conftest import ServerFactory
from tests.push_receiver import Receiver
from tests.support import wait_until


def test_push_group_over_http(server_factory: ServerFactory) -> None:
    receiver = Receiver().start()
    try:
        # On loopback: pushing there takes the operator's listing.
        server = server_factory(push_allowed_urls=(receiver.url,))
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


TOKENS = (
    Token("admin-t", "admin", name="admin"),
    Token("cons-t", "consumer", topics=frozenset({"orders"}), name="orders-consumer"),
)


@pytest.mark.parametrize(
    ("token", "url", "status", "code"),
    [
        # A consumer token: only under a listed prefix.
        ("cons-t", "http://127.0.0.1:{port}/internal/admin/delete-everything", 403, "forbidden"),
        ("cons-t", "https://hooks.example.com/other", 403, "forbidden"),
        ("cons-t", "http://169.254.169.254/latest/meta-data", 403, "forbidden"),
        ("cons-t", "https://hooks.example.com/cproxy/orders", 200, None),
        # An admin token: anywhere but internal addresses that are not listed.
        ("admin-t", "http://169.254.169.254/latest/meta-data", 422, "push_target_refused"),
        ("admin-t", "http://[fe80::1]/x", 422, "push_target_refused"),
        ("admin-t", "http://10.0.0.8/hook", 422, "push_target_refused"),
        ("admin-t", "http://192.168.1.1/hook", 422, "push_target_refused"),
        ("admin-t", "http://localhost:{port}/x", 422, "push_target_refused"),
        ("admin-t", "http://127.0.0.1:{port}/internal", 422, "push_target_refused"),
        ("admin-t", "http://127.0.0.1:9/listed/hook", 200, None),
    ],
)
def test_who_may_push_where(
    server_factory: ServerFactory, token: str, url: str, status: int, code: str | None
) -> None:
    """The SSRF of issue 27: a scoped consumer token cannot point the proxy at an internal
    endpoint (with forged headers); internal addresses need the operator's listing."""
    allowed = ("https://hooks.example.com/cproxy/", "http://127.0.0.1:9/listed/")
    server = server_factory(tokens=TOKENS, push_allowed_urls=allowed)
    headers = {"Authorization": "Bearer admin-t"}
    with server.client(verify=False, headers=headers) as admin:
        create_topic(admin, "orders")
    push = {"url": url.format(port=server.port), "headers": {"X-Internal-Auth": "forged"}}
    with server.client(verify=False, headers={"Authorization": f"Bearer {token}"}) as client:
        r = client.put("/v1/groups/sneaky", json={"topics": {"orders": {"push": push}}})
        assert r.status_code == status, r.text
        if code is not None:
            assert r.json()["error"]["code"] == code
            assert client.get("/v1/groups/sneaky").status_code == 404
