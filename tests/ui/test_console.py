"""The operator console (docs/console.md) in a real headless Chromium against a real server.

Each test produces its own messages on its own topic and group, opens ``/ui`` and checks what
an operator sees and what the buttons do, verifying server state through the HTTP API.
Screenshots of a group in trouble go to ``$CPROXY_UI_SCREENSHOT_DIR`` when set (docs/img).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("selenium", reason="selenium is missing: pip install -e '.[dev]'")

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from cproxy.tokens import Token
from tests.api.http_helpers import (
    create_topic,
    group_stats,
    produce,
    pull_all,
    put_group,
    queue_stats,
    shared_server,
)
from tests.conftest import ServerFactory
from tests.support import RunningServer, wait_until
from tests.ui.console_page import REFRESH_MS, ConsolePage


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with shared_server(tmp_path_factory) as running:
        yield running


@pytest.fixture
def client(server: RunningServer) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


@pytest.fixture
def page(browser: WebDriver, server: RunningServer) -> Iterator[ConsolePage]:
    console = ConsolePage(browser, server.url)
    yield console
    assert console.script_errors() == []


def fail_key(client: httpx.Client, group: str, key: str, error: str) -> dict[str, Any]:
    """Pull once; fail the message of ``key`` (with ``error``) and ack every other one."""

    def pulled() -> list[dict[str, Any]]:
        response = client.post(
            f"/v1/groups/{group}/pull", json={"max_messages": 100, "wait_ms": 200}
        )
        assert response.status_code == 200, response.text
        messages: list[dict[str, Any]] = response.json()["messages"]
        return messages if any(m["key"] == key for m in messages) else []

    messages = wait_until(pulled, message=f"a delivery of {key}")
    results = [
        {"topic": m["topic"], "qid": m["qid"], "fails": [{"offset": m["offset"], "error": error}]}
        if m["key"] == key
        else {"topic": m["topic"], "qid": m["qid"], "acks": [m["offset"]]}
        for m in messages
    ]
    response = client.post(f"/v1/groups/{group}/ack", json={"results": results})
    assert response.status_code == 200 and response.json()["applied"] == len(results)
    return next(m for m in messages if m["key"] == key)


def blocked(client: httpx.Client, group: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = client.get(f"/v1/groups/{group}/blocked-keys").json()[
        "blocked_keys"
    ]
    return rows


def dead_letters(client: httpx.Client, group: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = client.get(f"/v1/groups/{group}/dead-letters").json()[
        "dead_letters"
    ]
    return rows


def exhaust(client: httpx.Client, group: str, topic: str, key: str, error: str) -> dict[str, Any]:
    """A group (max_attempts 2, on_exhausted block) whose ``key`` head has failed twice."""
    create_topic(client, topic, queues=2)
    put_group(
        client, group, {topic: "key"}, max_attempts=2, retry_backoff_ms=[10], on_exhausted="block"
    )
    produce(
        client,
        topic,
        [{"key": key, "body": {"ride": 7, "step": n, "fare": 12.5}} for n in range(3)]
        + [{"key": "ride-8", "body": {"ride": 8, "step": 0}}],
    )
    head = fail_key(client, group, key, error)
    fail_key(client, group, key, error)
    wait_until(lambda: group_stats(client, group)["exhausted"] == 1, message="the key exhausted")
    return head


def test_console_assets_are_served_without_a_token(server_factory: ServerFactory) -> None:
    running = server_factory(tokens=(Token("secret-admin", "admin"),))
    with running.client(follow_redirects=False) as c:
        page = c.get("/ui")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert '<script type="module" src="ui/console.js">' in page.text
        for name, media in [("console.js", "text/javascript"), ("console.css", "text/css")]:
            asset = c.get(f"/ui/{name}")
            assert asset.status_code == 200 and asset.headers["content-type"].startswith(media)
        assert c.get("/ui/").status_code == 308 and c.get("/ui/").headers["location"] == "../ui"
        missing = c.get("/ui/..%2Fapp.py")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
        assert c.get("/v1/topics").status_code == 401  # only the page is open, not the API


def test_shows_topics_and_groups_and_numbers_change_live(
    page: ConsolePage, client: httpx.Client
) -> None:
    create_topic(client, "live", queues=2)
    put_group(client, "live-g", {"live": "key"})
    page.open()
    page.wait(lambda: page.visible(page.group("live-g")), "the group card")
    page.wait_stat("live-g", "lag", "0")
    assert page.text('article.topic[data-topic="live"] h3').startswith("live")
    assert not page.visible("#cluster-panel")  # this server has no /v1/cluster (404)
    # This server reports retention losses and filtered messages (none yet).
    page.wait_stat("live-g", "lost_to_retention", "0")
    page.wait_stat("live-g", "filtered", "0")

    produce(client, "live", [{"key": f"k{n}", "body": {"n": n}} for n in range(7)])
    page.wait_stat("live-g", "lag", "7")
    page.wait_stat("live-g", "ready", "7")
    page.wait(lambda: page.text('[data-topic="live"] [data-stat="stored"]') == "7", "stored 7")
    nexts = {q["qid"]: q["next_offset"] for q in queue_stats(client, "live")}
    shown = {
        qid: page.text(f'article.topic[data-topic="live"] tr[data-qid="{qid}"] [data-col="next"]')
        for qid in nexts
    }
    assert shown == {qid: str(n) for qid, n in nexts.items()}

    pull_all(client, "live-g", 7)
    page.wait_stat("live-g", "lag", "0")
    page.wait_stat("live-g", "in_flight", "0")
    assert page.attr(page.group("live-g"), "data-trouble") == "false"


def screenshot_dir(tmp_path: Path) -> Path:
    """``$CPROXY_UI_SCREENSHOT_DIR`` (to refresh docs/img), else the test's temp dir."""
    shots = Path(os.environ.get("CPROXY_UI_SCREENSHOT_DIR") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    return shots


def test_blocked_key_skip_then_redrive(
    page: ConsolePage, client: httpx.Client, tmp_path: Path
) -> None:
    head = exhaust(client, "billing", "rides", "ride-7", "card declined")
    page.open()
    card = page.group("billing")
    row = f'{card} tr[data-key="ride-7"]'
    page.wait(lambda: page.visible(row), "the blocked key row")
    page.wait(lambda: "exhausted" in page.text(row) and "card declined" in page.text(row), "row")
    assert page.text(f"{row} td:nth-child(4)") == "2"  # attempts
    assert "1 key blocked for an operator" in page.text(f"{card} header")
    assert "bad" in page.attr(card, "class").split()
    assert "1 in trouble" in page.text("#summary")

    page.click(f'{row} button[data-action="skip"]')
    assert "Skip key ride-7" in page.text("#confirm-title")
    shot = screenshot_dir(tmp_path) / "console-skip-confirm.png"
    assert page.driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    page.confirm()
    wait_until(lambda: dead_letters(client, "billing"), message="the skipped head dead-lettered")
    [dead] = dead_letters(client, "billing")
    assert (dead["qid"], dead["offset"]) == (head["qid"], head["offset"])
    assert "skipped by operator" in dead["last_error"]
    assert all(b["offset"] != head["offset"] for b in blocked(client, "billing"))
    dead_row = f'{card} .dead tr[data-offset="{head["offset"]}"]'
    page.wait(lambda: '"step":0' in page.text(dead_row), "the dead letter with its body")
    assert "skipped by operator" in page.text(dead_row)

    rest = pull_all(client, "billing", 2)  # the key moved on to its next messages
    assert [m["body"]["step"] for m in rest] == [1, 2]
    page.click(f'{card} button[data-action="redrive"]')
    page.confirm()
    wait_until(lambda: not dead_letters(client, "billing"), message="dead letters redriven")
    [again] = pull_all(client, "billing", 1)
    assert (again["qid"], again["offset"], again["body"]) == (
        head["qid"],
        head["offset"],
        head["body"],
    )
    page.wait_stat("billing", "dead_lettered", "0")
    page.wait_stat("billing", "lag", "0")


def test_release_retries_a_blocked_key(page: ConsolePage, client: httpx.Client) -> None:
    head = exhaust(client, "settle", "settlements", "ride-7", "ledger offline")
    page.open()
    row = f'{page.group("settle")} tr[data-key="ride-7"]'
    page.click(f'{row} button[data-action="release"]')
    page.confirm()
    wait_until(lambda: group_stats(client, "settle")["exhausted"] == 0, message="released")
    [again] = pull_all(client, "settle", 1)
    assert (again["offset"], again["attempt"]) == (head["offset"], 1)
    page.wait(lambda: not page.visible(f'{row} button[data-action="release"]'), "row gone")


def test_dead_letters_show_body_and_error(
    page: ConsolePage, client: httpx.Client, tmp_path: Path
) -> None:
    create_topic(client, "payments", queues=2)
    put_group(client, "audit", {"payments": "key"}, max_attempts=1)
    produce(client, "payments", [{"key": "p-1", "body": {"amount": -5, "currency": "EUR"}}])
    fail_key(client, "audit", "p-1", "ValueError: amount must be positive")
    exhaust(client, "payouts", "payouts", "ride-7", "bank timeout")  # a second troubled group
    produce(client, "payouts", [{"key": f"d{n}", "body": {"n": n}} for n in range(40)])
    page.open()
    card = page.group("audit")
    page.wait(lambda: "amount must be positive" in page.text(f"{card} .dead"), "the dead letter")
    page.wait_stat("audit", "dead_lettered", "1")
    assert '"amount":-5' in page.text(f"{card} .dead td.body")
    assert "1 dead letter" in page.text(f"{card} header")
    page.click(f"{card} .dead td.body summary")  # unfold the body; it stays open on refresh
    before = page.polls()
    page.wait(lambda: page.polls() >= before + 2, "two more refreshes")
    assert page.text(f"{card} .dead td.body pre").startswith("{")
    page.wait(lambda: "2 in trouble" in page.text("#summary"), "both groups in trouble")

    shot = screenshot_dir(tmp_path) / "console-trouble.png"
    assert page.driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def test_seek_earliest_offset_and_timestamp(page: ConsolePage, client: httpx.Client) -> None:
    create_topic(client, "replay", queues=1)
    put_group(client, "replay-g", {"replay": "none"})
    produce(client, "replay", [{"body": {"n": n}} for n in range(5)])
    pull_all(client, "replay-g", 5)
    wait_until(lambda: group_stats(client, "replay-g")["queues"][0]["lag"] == 0, message="lag 0")
    page.open()
    page.wait_stat("replay-g", "lag", "0")

    def seek(choose: str, fill: str = "") -> None:
        page.click(f'{page.group("replay-g")} button[data-action="seek"]')
        page.wait(lambda: page.visible("#seek-topic"), "the seek form")
        Select(page.driver.find_element(By.ID, "seek-qid")).select_by_value("0")
        page.click(f'input[name="seek-to"][value="{choose}"]')
        if choose == "offset":
            page.driver.find_element(By.ID, "seek-offset").send_keys(fill)
        if choose == "timestamp":  # the native date picker's typing is locale-dependent
            page.driver.execute_script(
                "document.getElementById('seek-time').value = arguments[0]", fill
            )
        page.confirm()

    def committed() -> int:
        offset: int = group_stats(client, "replay-g")["queues"][0]["committed_offset"]
        return offset

    seek("earliest")
    wait_until(lambda: committed() == 0, message="seek to earliest")
    page.wait_stat("replay-g", "lag", "5")
    seek("offset", "3")
    wait_until(lambda: committed() == 3, message="seek to offset 3")
    page.wait_stat("replay-g", "lag", "2")
    seek("timestamp", "2999-01-01T00:00:00")  # later than every message: the end
    wait_until(lambda: committed() == 5, message="seek to a time")
    page.wait_stat("replay-g", "lag", "0")
    # An invalid form is refused in the dialog, and nothing moves.
    page.click(f'{page.group("replay-g")} button[data-action="seek"]')
    page.click('input[name="seek-to"][value="offset"]')
    page.click("#confirm-ok")
    page.wait(lambda: "enter an offset" in page.dialog_error(), "the form error")
    page.click("#confirm-cancel")
    assert committed() == 5


def test_token_prompt_with_auth_on(browser: WebDriver, server_factory: ServerFactory) -> None:
    running = server_factory(tokens=(Token("admin-secret-1", "admin"),))
    with running.client(headers={"authorization": "Bearer admin-secret-1"}) as admin:
        create_topic(admin, "secure")
        put_group(admin, "secure-g", {"secure": "key"})
    page = ConsolePage(browser, running.url)
    page.open(wait_for_data=False)
    page.wait(lambda: page.visible("#token-form"), "the token prompt")
    assert page.text("#status") == "token needed"

    page.driver.find_element(By.ID, "token-input").send_keys("wrong-token")
    page.click("#token-submit")
    page.wait(lambda: "refused" in page.text("#token-prompt"), "the refusal")

    page.driver.find_element(By.ID, "token-input").send_keys("admin-secret-1")
    page.click("#token-submit")
    page.wait(lambda: page.visible(page.group("secure-g")), "the group behind auth")
    assert not page.visible("#token-form")

    page.open()  # a reload keeps the token (sessionStorage)
    page.wait(lambda: page.visible(page.group("secure-g")), "the group after reload")
    assert not page.visible("#token-form")
    page.click("#forget-token")
    page.wait(lambda: page.visible("#token-form"), "the prompt after forgetting the token")
    assert page.script_errors() == []


def test_polling_pauses_while_the_tab_is_hidden(page: ConsolePage, client: httpx.Client) -> None:
    create_topic(client, "quiet")
    put_group(client, "quiet-g", {"quiet": "key"})
    page.open()
    page.wait_stat("quiet-g", "lag", "0")
    page.driver.execute_script(
        "Object.defineProperty(document, 'hidden', {value: true, configurable: true});"
        "document.dispatchEvent(new Event('visibilitychange'));"
    )
    page.wait(lambda: page.text("#status").startswith("paused"), "the paused status")
    polls = page.polls()
    produce(client, "quiet", [{"key": "a", "body": 1}])
    wait_until(lambda: group_stats(client, "quiet-g")["ready"] == 1, message="message read")
    # Absence can only be shown over a window: several refresh periods without a poll.
    with pytest.raises(AssertionError):
        page.wait(lambda: page.polls() > polls, "a poll while hidden", timeout_s=REFRESH_MS / 200)
    assert page.stat("quiet-g", "lag") == "0"
    page.driver.execute_script(
        "Object.defineProperty(document, 'hidden', {value: false, configurable: true});"
        "document.dispatchEvent(new Event('visibilitychange'));"
    )
    page.wait_stat("quiet-g", "lag", "1")


#: Wraps the page's fetch before its scripts run: answers /v1/cluster and adds the stats and
#: topic fields that newer servers report, on top of the real server's answers.
NEWER_SERVER = """
const realFetch = window.fetch.bind(window);
const reply = (data) => new Response(JSON.stringify(data),
  {status: 200, headers: {"content-type": "application/json"}});
window.fetch = async (url, init) => {
  const path = new URL(url, location.href).pathname;
  if (path.endsWith("/v1/cluster")) return reply({node: "n1",
    members: [{node: "n1", url: "http://127.0.0.1:1", heartbeat_ms_ago: 120}],
    queues: [{topic: "newer", qid: 0, owner: "n1", state: "owned", epoch: 3},
             {topic: "newer", qid: 1, owner: null, state: "releasing", epoch: 2}]});
  const response = await realFetch(url, init);
  if (!response.ok) return response;
  if (/[/]v1[/]groups[/][^/]+$/.test(path)) {
    const d = await response.json();
    Object.assign(d.stats, {lag_excluding_parked: 0, oldest_unfinished_age_ms: 65000,
                            lost_to_retention: 3, filtered: 11});
    return reply(d);
  }
  if (/[/]v1[/]topics[/][^/]+$/.test(path)) {
    const d = await response.json();
    return reply({...d, retention_ms: 86400000, retention_bytes: null});
  }
  return response;
};
"""


def test_fields_of_newer_servers_are_shown(page: ConsolePage, client: httpx.Client) -> None:
    """Cluster, retention and the extra stats fields appear when the API sends them (simulated
    in the browser: this server version does not report them yet)."""
    create_topic(client, "newer", queues=2)
    put_group(client, "newer-g", {"newer": "key"})
    script = page.driver.execute_cdp_cmd(  # type: ignore[attr-defined]
        "Page.addScriptToEvaluateOnNewDocument", {"source": NEWER_SERVER}
    )
    try:
        page.open()
        page.wait_stat("newer-g", "lost_to_retention", "3")
        assert page.stat("newer-g", "filtered") == "11"
        assert page.stat("newer-g", "oldest_unfinished_age_ms") == "1m 05s"
        assert page.stat("newer-g", "lag_excluding_parked") == "0"
        assert "3 lost to retention" in page.text(f"{page.group('newer-g')} header")
        assert "retention 1d 0h" in page.text('article.topic[data-topic="newer"] h3')
        page.wait(lambda: page.visible("#cluster-panel"), "the cluster panel")
        assert "This node: n1" in page.text("#cluster")
        assert "1 not owned" in page.text("#cluster")
    finally:
        page.driver.execute_cdp_cmd(  # type: ignore[attr-defined]
            "Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]}
        )


def test_delayed_messages_are_shown(page: ConsolePage, client: httpx.Client) -> None:
    create_topic(client, "later", queues=1)
    put_group(client, "later-g", {"later": "key"})
    produce(client, "later", [{"key": "k", "body": 1, "delay_ms": 600_000}, {"body": 2}])
    page.open()
    page.wait_stat("later-g", "delayed", "1")
    page.wait_stat("later-g", "ready", "1")


def test_a_group_with_lag_and_no_consumer_is_in_trouble(
    page: ConsolePage, client: httpx.Client
) -> None:
    create_topic(client, "orphan", queues=1)
    put_group(client, "orphan-g", {"orphan": "key"})
    produce(client, "orphan", [{"key": f"k{n}", "body": n} for n in range(3)])
    page.open()
    card = page.group("orphan-g")
    page.wait(lambda: "lag and no consumer" in page.text(f"{card} header"), "the trouble badge")
    assert "bad" in page.attr(card, "class").split()
    assert page.attr(card, "data-trouble") == "true"
    assert page.stat("orphan-g", "consumers") == "0"
    assert page.stat("orphan-g", "last_pull_ms_ago") == "never"
    # A consumer shows up (and names itself): the group is not orphaned any more.
    response = client.post(
        "/v1/groups/orphan-g/pull",
        json={"max_messages": 10, "wait_ms": 1000, "consumer": "worker-7"},
    )
    got = response.json()["messages"]
    page.wait_stat("orphan-g", "consumers", "1")
    page.wait(lambda: "lag and no consumer" not in page.text(f"{card} header"), "badge gone")
    page.click(f"{card} details[data-fold='orphan-g:consumers'] summary")
    page.wait(lambda: "worker-7" in page.text(f"{card} table.consumers"), "the consumer listed")
    client.post("/v1/groups/orphan-g/ack", json={"results": acks(got)})
    if len(got) < 3:
        pull_all(client, "orphan-g", 3 - len(got))
    page.wait_stat("orphan-g", "lag", "0")
    page.wait(lambda: page.attr(card, "data-trouble") == "false", "the group healthy again")
    # The rates show the work done (sampled every second, over the last minute).
    page.wait(lambda: page.stat("orphan-g", "acked_per_s") not in ("0.0/s", ""), "acked rate")
    assert page.stat("orphan-g", "delivered_per_s").endswith("/s")


def acks(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"topic": m["topic"], "qid": m["qid"], "acks": [m["offset"]]} for m in messages]


def test_dead_letters_one_by_one_and_their_messages(
    page: ConsolePage, client: httpx.Client
) -> None:
    create_topic(client, "dl", queues=1)
    put_group(client, "dl-g", {"dl": "key"}, max_attempts=1)
    produce(client, "dl", [{"key": "a", "body": {"n": n}} for n in range(3)])
    for _ in range(3):
        fail_key(client, "dl-g", "a", "boom")
    wait_until(lambda: len(dead_letters(client, "dl-g")) == 3, message="three dead letters")
    page.open()
    card = page.group("dl-g")
    page.wait(lambda: page.visible(f'{card} .dead tr[data-offset="2"]'), "the dead letters")

    # From a dead letter to its stored message, read without touching the group.
    page.click(f'{card} .dead tr[data-offset="1"] button[data-action="browse"]')
    page.wait(lambda: page.visible('#browser tr[data-offset="1"]'), "the message browser")
    assert '"n": 1' in page.text('#browser tr[data-offset="1"]')

    page.click(f'{card} .dead tr[data-offset="1"] input.pick')
    page.wait(lambda: "Redrive selected (1)" in page.text(f"{card} .dead"), "one ticked")
    page.click(f'{card} button[data-action="redrive-selected"]')
    assert "Redrive 1 dead letter of dl-g" in page.text("#confirm-title")
    page.confirm()
    wait_until(
        lambda: [d["offset"] for d in dead_letters(client, "dl-g")] == [0, 2],
        message="only offset 1 redriven",
    )
    [again] = pull_all(client, "dl-g", 1)
    assert (again["offset"], again["attempt"]) == (1, 1)

    page.wait(lambda: not page.visible(f'{card} .dead tr[data-offset="1"]'), "the row gone")
    page.click(f'{card} .dead tr[data-offset="0"] input.pick')
    page.wait(lambda: "Delete selected (1)" in page.text(f"{card} .dead"), "one ticked")
    page.click(f'{card} button[data-action="delete-selected"]')
    assert "for good" in page.text("#confirm-title")
    page.confirm()
    wait_until(lambda: [d["offset"] for d in dead_letters(client, "dl-g")] == [2])
    page.click(f'{card} button[data-action="purge"][data-topic="dl"]')
    page.confirm()
    wait_until(lambda: dead_letters(client, "dl-g") == [], message="the topic purged")
    page.wait_stat("dl-g", "dead_lettered", "0")


def test_many_groups_can_be_filtered(page: ConsolePage, client: httpx.Client) -> None:
    create_topic(client, "many", queues=1)
    for n in range(9):
        put_group(client, f"many-{n}", {"many": "key"})
    page.open()
    page.wait(lambda: page.visible("#group-filter-text"), "the filter")
    page.click("#group-filter-text")
    page.driver.find_element(By.CSS_SELECTOR, "#group-filter-text").send_keys("many-7")
    page.wait(
        lambda: (
            page.driver.execute_script(
                "return [...document.querySelectorAll('#groups article.group')]"
                ".map((e) => e.dataset.group).join(',')"
            )
            == "many-7"
        ),
        "only the matching group",
    )
    page.driver.find_element(By.CSS_SELECTOR, "#group-filter-text").clear()
    page.driver.execute_script(
        "document.getElementById('group-filter-text').dispatchEvent(new Event('input'))"
    )
    page.wait(
        lambda: (
            page.driver.execute_script(
                "return document.querySelectorAll('#groups article.group').length"
            )
            >= 9
        ),
        "every group again",
    )


def test_a_rate_limited_group_shows_its_limit_and_throttled_time(
    page: ConsolePage, client: httpx.Client
) -> None:
    create_topic(client, "slow", queues=1)
    r = client.put("/v1/groups/slow-g", json={"topics": {"slow": {}}, "max_per_second": 500})
    assert r.status_code == 200, r.text
    put_group(client, "free-g", {"slow": "key"})
    page.open()
    page.wait_stat("slow-g", "throttled_ms", "0s")
    assert "max 500/s" in page.text(f"{page.group('slow-g')} p.config")
    assert not page.visible(f'{page.group("free-g")} [data-stat="throttled_ms"]')
    assert "/s" not in page.text(f"{page.group('free-g')} p.config")
