"""Acceptance with real proxy subprocesses on one real PostgreSQL (issue 11).

Each test gets a fresh database on the session's server; proxies run with 100 ms heartbeats
and 600 ms leases (``proxies.CLUSTER_TOML``) so hand-overs and takeovers are quick.
"""

from __future__ import annotations

import itertools
import signal
import threading
import time

import httpx

from tests.cluster.conftest import ProxyFactory
from tests.cluster.proxies import ACK_TIMEOUT_MS, LEASE_MS, Proxy, Puller, Record
from tests.store.pg_server import PgServer
from tests.support import wait_until

QUEUES = 4
KEYS = 24


def setup(via: Proxy, group_via: Proxy) -> None:
    httpx.post(f"{via.url}/v1/topics", json={"name": "rides", "queues": QUEUES}).raise_for_status()
    httpx.put(
        f"{group_via.url}/v1/groups/billing",
        json={"topics": {"rides": {"order_by": "key"}}, "ack_timeout_ms": ACK_TIMEOUT_MS},
    ).raise_for_status()


def spread(members: list[Proxy]) -> dict[str, set[int]]:
    """Wait until every queue has exactly one owner among ``members``, each owning some."""

    def settled() -> dict[str, set[int]] | None:
        owned = {p.node_id: p.owned() for p in members}
        qids = [q for qs in owned.values() for q in qs]
        if sorted(qids) == list(range(QUEUES)) and all(owned.values()):
            return owned
        return None

    return wait_until(settled, 20, 0.05, "queues spread over the proxies")


class Producer:
    """Produces keyed messages round robin over proxies; remembers every accepted one."""

    def __init__(self) -> None:
        self.sent: dict[tuple[int, int], str] = {}
        self._n = itertools.count()

    def send(self, targets: list[Proxy], count: int, batch: int = 20) -> None:
        urls = itertools.cycle([p.url for p in targets])
        for _ in range(0, count, batch):
            msgs = []
            for _ in range(batch):
                n = next(self._n)
                msgs.append({"key": f"k{n % KEYS}", "body": {"n": n}})
            answer = httpx.post(f"{next(urls)}/v1/topics/rides/messages", json={"messages": msgs})
            answer.raise_for_status()
            for m, r in zip(msgs, answer.json()["results"], strict=True):
                self.sent[r["qid"], r["offset"]] = str(m["key"])


def all_acked(record: Record, producer: Producer, proxies: list[Proxy] | None = None) -> bool:
    """Every accepted message acked; with ``proxies``, acks in doubt (their proxy was killed
    before answering) count too, once the live proxies report no lag on any queue."""
    with record.lock:
        if set(producer.sent) <= set(record.acked):
            return True
        if proxies is None or not set(producer.sent) <= record.settled():
            return False
    return no_lag(proxies)


def no_lag(proxies: list[Proxy]) -> bool:
    """Every queue owned by a live proxy that reports the group's lag on it as 0."""
    lags: dict[int, int] = {}
    for p in proxies:
        if p.proc is None or p.proc.poll() is not None:
            continue
        stats = httpx.get(f"{p.url}/v1/groups/billing", timeout=5).json()["stats"]
        lags.update({q["qid"]: q["lag"] for q in stats["queues"]})
    return sorted(lags) == list(range(QUEUES)) and not any(lags.values())


def wait_all_acked(
    record: Record, producer: Producer, timeout_s: float, proxies: list[Proxy]
) -> None:
    try:
        wait_until(
            lambda: all_acked(record, producer, proxies), timeout_s, 0.05, "every message acked"
        )
    except AssertionError:
        with record.lock:
            missing = sorted(set(producer.sent) - record.settled())
            seen = {ref: record.deliveries.get(ref) for ref in missing[:10]}
        stats = [
            httpx.get(f"{p.url}/v1/groups/billing", timeout=5).json()["stats"]
            for p in proxies
            if p.proc and p.proc.poll() is None
        ]
        raise AssertionError(f"{len(missing)} not acked, e.g. {seen}; stats {stats}") from None


def start_pullers(
    targets: list[Proxy], count: int, record: Record, stop: threading.Event, hold_s: float = 0
) -> list[Puller]:
    urls = [p.url for p in targets]
    pullers = [
        Puller(urls[i % len(urls) :] + urls[: i % len(urls)], "billing", record, stop, hold_s)
        for i in range(count)
    ]
    for p in pullers:
        p.start()
    return pullers


def finish(pullers: list[Puller], stop: threading.Event) -> None:
    stop.set()
    for p in pullers:
        p.join(30)


def test_three_proxies_eight_pullers_deliver_everything_in_key_order(
    proxies: ProxyFactory,
) -> None:
    members = proxies("p0", "p1", "p2")
    setup(members[0], members[1])
    owned = spread(members)
    view = members[2].cluster()
    assert view["node"] == "p2"
    assert [(m["node"], m["url"]) for m in view["members"]] == [(p.node_id, p.url) for p in members]
    assert all(0 <= m["heartbeat_ms_ago"] < 10_000 for m in view["members"])
    assert [(q["topic"], q["qid"], q["state"]) for q in view["queues"]] == [
        ("rides", qid, "owned") for qid in range(QUEUES)
    ]
    assert {q["qid"]: q["owner"] for q in view["queues"]} == {
        qid: node for node, qids in owned.items() for qid in qids
    }
    record, stop, producer = Record(), threading.Event(), Producer()
    pullers = start_pullers(members, 8, record, stop)
    producer.send(members, 600)
    wait_until(lambda: all_acked(record, producer), 60, 0.05, "every message acked")
    finish(pullers, stop)
    assert record.order_violations() == []
    assert record.duplicates() == {}
    assert {ref: record.keys[ref] for ref in producer.sent} == producer.sent
    # Every proxy served some of the messages.
    served = {url for ds in record.deliveries.values() for _, _, url in ds}
    assert served == {p.url for p in members}


class Flow(threading.Thread):
    """Produces ``batches`` batches, one every ``every_s``, through ``targets`` (in the
    background, so hand-overs happen while messages flow)."""

    def __init__(self, producer: Producer, targets: list[Proxy], batches: int, every_s: float):
        super().__init__(daemon=True)
        self.producer, self.targets = producer, targets
        self.batches, self.every_s = batches, every_s
        self.error: BaseException | None = None
        #: 503 answers (the database was down): nothing of those calls was stored.
        self.unavailable = 0

    def run(self) -> None:
        try:
            for _ in range(self.batches):
                try:
                    self.producer.send(self.targets, 10, batch=10)
                except httpx.HTTPStatusError as exc:
                    if exc.response.status_code != 503:
                        raise
                    self.unavailable += 1
                except httpx.TransportError:
                    self.unavailable += 1
                time.sleep(self.every_s)
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_planned_join_and_sigterm_deliver_nothing_twice(proxies: ProxyFactory) -> None:
    members = proxies("p0", "p1", "p2")
    setup(members[0], members[0])
    spread(members)
    record, stop, producer = Record(), threading.Event(), Producer()
    # Consumers hold every message 300 ms: hand-overs always find messages in flight.
    pullers = start_pullers(members, 8, record, stop, hold_s=0.3)
    flow = Flow(producer, [members[0], members[2]], batches=60, every_s=0.05)
    flow.start()
    wait_until(lambda: len(record.acked) >= 50, 60, 0.05, "messages flowing")
    (newcomer,) = proxies("p3")
    # Consumers learn of the newcomer (the SDK would from GET /v1/cluster).
    pullers += start_pullers([newcomer, members[0]], 3, record, stop, hold_s=0.3)
    wait_until(newcomer.owned, 30, 0.05, "the newcomer owning a queue")
    wait_until(lambda: len(record.acked) >= 200, 60, 0.05, "messages flowing after the join")
    leaver = members[1]
    leaver.signal(signal.SIGTERM)
    # uvicorn re-raises the signal once shut down: the exit status is "killed by SIGTERM".
    assert leaver.wait(60) in (0, -signal.SIGTERM), leaver.log()
    assert "left the cluster" in leaver.log()
    flow.join(120)
    assert flow.error is None, flow.error
    wait_all_acked(record, producer, 60, [*members, newcomer])
    finish(pullers, stop)
    assert record.duplicates() == {}
    assert record.unknown == []
    assert record.order_violations() == []
    survivors = [members[0], members[2], newcomer]
    assert sorted(q for p in survivors for q in p.owned()) == list(range(QUEUES))
    assert "handed over" in leaver.log()


def test_sigkill_takeover_after_lease_and_ack_timeout_keeps_order(proxies: ProxyFactory) -> None:
    members = proxies("p0", "p1", "p2")
    setup(members[0], members[0])
    owned = spread(members)
    record, stop, producer = Record(), threading.Event(), Producer()
    pullers = start_pullers(members, 8, record, stop, hold_s=0.05)
    flow = Flow(producer, [members[0], members[2]], batches=50, every_s=0.05)
    flow.start()
    wait_until(lambda: len(record.acked) >= 100, 60, 0.05, "messages flowing")
    victim = members[1]
    victim.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    victim.wait(10)
    survivors = [members[0], members[2]]
    wait_until(
        lambda: sorted(q for p in survivors for q in p.owned()) == list(range(QUEUES)),
        30, 0.05, "the survivors owning every queue",
    )  # fmt: skip
    taken_after_s = time.monotonic() - killed_at
    assert taken_after_s >= (LEASE_MS - 200) / 1000, taken_after_s  # not before the lease
    flow.join(120)
    assert flow.error is None, flow.error
    wait_all_acked(record, producer, 90, survivors)
    finish(pullers, stop)
    assert record.order_violations() == []
    # Duplicates only where the dead proxy served (at most what it had in flight or had
    # finished within its last commit interval), never elsewhere.
    lost_qids = owned["p1"]
    dups = record.duplicates()
    assert {qid for qid, _ in dups} <= lost_qids, dups
    assert all(record.deliveries[ref][0][2] == victim.url for ref in dups), dups


def test_a_proxy_paused_past_its_lease_is_fenced_and_its_late_results_are_unknown(
    proxies: ProxyFactory,
) -> None:
    p0, p1 = proxies("p0", "p1")
    setup(p0, p0)
    owned = spread([p0, p1])
    producer = Producer()
    producer.send([p0], 40)
    # Take messages from p1 and keep them unanswered.
    held: list[dict[str, object]] = []

    def pulled() -> bool:
        answer = httpx.post(
            f"{p1.url}/v1/groups/billing/pull", json={"max_messages": 32, "wait_ms": 200}
        )
        held.extend(answer.json()["messages"])
        return len(held) > 0

    wait_until(pulled, 20, 0.05, "messages from p1")
    p1.signal(signal.SIGSTOP)
    try:
        # p0 takes p1's queues once p1's lease and the ack timeout have passed.
        wait_until(lambda: p0.owned() == set(range(QUEUES)), 30, 0.05, "p0 owning everything")
        # ... and serves the held messages again: they are acked there.
        again: set[tuple[int, int]] = set()

        def redelivered() -> bool:
            answer = httpx.post(
                f"{p0.url}/v1/groups/billing/pull", json={"max_messages": 64, "wait_ms": 200}
            )
            msgs = answer.json()["messages"]
            again.update((m["qid"], m["offset"]) for m in msgs)
            acks: dict[int, list[dict[str, int]]] = {}
            for m in msgs:
                acks.setdefault(m["qid"], []).append(
                    {"offset": m["offset"], "attempt": m["attempt"]}
                )
            httpx.post(
                f"{p0.url}/v1/groups/billing/ack",
                json={
                    "results": [{"topic": "rides", "qid": q, "acks": a} for q, a in acks.items()]
                },
            ).raise_for_status()
            return {(int(m["qid"]), int(m["offset"])) for m in held} <= again  # type: ignore[call-overload]

        wait_until(redelivered, 30, 0.05, "p0 redelivering p1's messages")
    finally:
        p1.signal(signal.SIGCONT)
    # p1 wakes: its late acks are refused while it re-checks ownership (503), then unknown.
    results: dict[int, list[dict[str, object]]] = {}
    for m in held:
        results.setdefault(int(m["qid"]), []).append(  # type: ignore[call-overload]
            {"offset": m["offset"], "attempt": m["attempt"]}
        )
    body = {"results": [{"topic": "rides", "qid": q, "acks": a} for q, a in results.items()]}

    def answered() -> dict[str, object] | None:
        answer = httpx.post(f"{p1.url}/v1/groups/billing/ack", json=body, timeout=10)
        if answer.status_code == 503:
            return None
        answer.raise_for_status()
        outcome: dict[str, object] = answer.json()
        return outcome

    outcome = wait_until(answered, 30, 0.05, "p1 answering again")
    assert outcome["applied"] == 0
    assert len(outcome["unknown"]) == len(held)  # type: ignore[arg-type]
    assert "lost topic=rides" in p1.log()
    # p0's progress stands: everything p0 acked stays committed (p1 could not undo it).
    wait_until(
        lambda: (
            sorted(q for p in (p0, p1) for q in p.owned()) == list(range(QUEUES)) and p1.owned()
        ),
        30,
        0.05,
        "p1 back in the cluster",
    )
    assert owned  # p1 owned queues before the pause


def test_postgresql_restarted_under_load_loses_nothing_acknowledged(
    proxies: ProxyFactory, pg_server: PgServer
) -> None:
    members = proxies("p0", "p1")
    setup(members[0], members[0])
    spread(members)
    record, stop, producer = Record(), threading.Event(), Producer()
    pullers = start_pullers(members, 4, record, stop, hold_s=0.02)
    flow = Flow(producer, members, batches=120, every_s=0.05)
    flow.start()
    wait_until(lambda: len(record.acked) >= 50, 60, 0.05, "messages flowing")
    pg_server.stop()
    try:
        wait_until(lambda: flow.unavailable > 0, 30, 0.05, "a produce refused while down")
        down = httpx.post(
            f"{members[1].url}/v1/topics/rides/messages", json={"messages": [{"body": 1}]}
        )
        assert down.status_code == 503, down.text
        assert down.json()["error"]["code"] == "store_unavailable"
    finally:
        pg_server.start_again()
    flow.join(180)
    assert flow.error is None, flow.error
    # Every message a produce call acknowledged (200) is delivered and acked.
    wait_all_acked(record, producer, 90, members)
    finish(pullers, stop)
    assert record.order_violations() == []
    # The proxies recovered by themselves: they take produce calls and own every queue.
    producer.send(members, 10, batch=10)
    wait_until(
        lambda: sorted(q for p in members for q in p.owned()) == list(range(QUEUES)),
        30, 0.05, "every queue owned again",
    )  # fmt: skip
