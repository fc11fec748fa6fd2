"""Real proxy subprocesses on one PostgreSQL, and consumers that record what they saw.

- ``Proxy``: ``cproxy serve --store postgresql://... --node-id ...`` in a subprocess with short
  heartbeats and leases (``CLUSTER_TOML``), on a free loopback port.
- ``Puller``: a thread pulling from one proxy, holding each message ``hold_s`` before acking
  it (fenced by attempt) on its next pull; every delivery and every ack is recorded in a
  shared ``Record`` with monotonic times, so order and duplicates can be checked afterwards.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.store.pg_server import free_port
from tests.support import wait_until

# Short, but not so short that a loaded 2-core machine makes members flap.
HEARTBEAT_MS = 200
LEASE_MS = 2000
# Long enough that a consumer holding a message 300 ms on a loaded machine still acks in time
# (a timeout would be a legitimate redelivery, but the planned test asserts none).
ACK_TIMEOUT_MS = 4000

CLUSTER_TOML = f"""\
[server]
commit_interval_ms = 100

[cluster]
heartbeat_interval_ms = {HEARTBEAT_MS}
lease_ms = {LEASE_MS}
"""


class Proxy:
    def __init__(self, root: Path, dsn: str, node_id: str) -> None:
        self.node_id = node_id
        self.dsn = dsn
        self.config = root / f"{node_id}.toml"
        self.config.write_text(CLUSTER_TOML)
        self.log_path = root / f"{node_id}.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Proxy:
        """Start and wait until ready."""
        self.spawn()
        self.wait_ready()
        return self

    def spawn(self) -> None:
        cmd = [
            sys.executable, "-m", "cproxy.cli", "serve", "--host", "127.0.0.1",
            "--port", str(self.port), "--store", self.dsn, "--node-id", self.node_id,
            "--advertise-url", self.url, "--config", str(self.config), "--log-level", "info",
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.node_id} exited:\n{self.log()}")
            try:
                return httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, 60, 0.02, f"{self.node_id} /readyz")

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float = 30) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-8000:] if self.log_path.exists() else ""

    def cluster(self) -> dict[str, Any]:
        answer = httpx.get(f"{self.url}/v1/cluster", timeout=5)
        answer.raise_for_status()
        body: dict[str, Any] = answer.json()
        return body

    def owned(self) -> set[int]:
        """The qids this proxy owns, as it reports them."""
        return {q["qid"] for q in self.cluster()["queues"] if q["owner"] == self.node_id}


@dataclass
class Record:
    """Everything the pullers saw, with monotonic times (one lock)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    #: (qid, offset) -> [(received_at, attempt, proxy)]
    deliveries: dict[tuple[int, int], list[tuple[float, int, str]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    keys: dict[tuple[int, int], str] = field(default_factory=dict)
    #: (qid, offset) -> time the ack that the proxy applied was sent
    acked: dict[tuple[int, int], float] = field(default_factory=dict)
    #: (qid, offset) -> every time an ack of it that a proxy applied was sent
    ack_times: dict[tuple[int, int], list[float]] = field(default_factory=lambda: defaultdict(list))
    #: acks answered unknown
    unknown: list[tuple[int, int]] = field(default_factory=list)
    #: (qid, offset) -> (time, proxy) of an ack sent on a call that died with its proxy
    #: (SIGKILL) after reaching it: the proxy may have applied it (and handed out the next
    #: message of the key, and committed) without answering.
    in_doubt: dict[tuple[int, int], tuple[float, str]] = field(default_factory=dict)

    def settled(self) -> set[tuple[int, int]]:
        """Acked, or acked in doubt (whether it stuck is checked by the group's lag)."""
        return set(self.acked) | set(self.in_doubt)

    def duplicates(self) -> dict[tuple[int, int], int]:
        return {ref: len(d) for ref, d in self.deliveries.items() if len(d) > 1}

    def order_violations(self) -> list[str]:
        """Per key, message n+1 handed out while n was unfinished. Two checks:

        - every delivery of n+1 comes after an ack of n sent after n's latest delivery before
          it (an applied ack, or one in doubt: a proxy that applied it and then handed out
          n+1 or committed may have died before answering);
        - no proxy delivers n again after it delivered n+1 (after a crash, the next owner
          may deliver n again after the dead one had delivered n+1: allowed, that is the
          contract's duplicate; on one proxy it would be disorder).
        """
        by_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for ref, key in self.keys.items():
            by_key[key].append(ref)
        bad: list[str] = []
        for key, refs in by_key.items():
            refs.sort(key=lambda r: r[1])
            for prev, ref in itertools.pairwise(refs):
                acks = [*self.ack_times.get(prev, []), *self.in_doubt_times(prev)]
                for t, _, url in self.deliveries[ref]:
                    before = [tp for tp, _, _ in self.deliveries[prev] if tp <= t]
                    if not before or not any(max(before) <= a < t for a in acks):
                        bad.append(f"{key}: {ref} delivered by {url} before {prev} was acked")
                        break
                    if any(u == url and tp > t for tp, _, u in self.deliveries[prev]):
                        bad.append(f"{key}: {url} delivered {prev} again after {ref}")
                        break
        return bad

    def in_doubt_times(self, ref: tuple[int, int]) -> list[float]:
        doubt = self.in_doubt.get(ref)
        return [] if doubt is None else [doubt[0]]


class Puller(threading.Thread):
    def __init__(
        self,
        urls: list[str],
        group: str,
        record: Record,
        stop: threading.Event,
        hold_s: float = 0.0,
    ) -> None:
        """Pulls from ``urls[0]``; moves on to the next URL when a proxy cannot be reached."""
        super().__init__(daemon=True)
        self.urls = list(urls)
        self.url = urls[0]
        self.group = group
        self.record = record
        self.stop_event = stop
        self.hold_s = hold_s
        self.errors = 0

    def run(self) -> None:
        client = httpx.Client(timeout=10)
        held: list[tuple[float, dict[str, Any]]] = []
        while True:
            now = time.monotonic()
            due = [m for at, m in held if now - at >= self.hold_s]
            held = [(at, m) for at, m in held if now - at < self.hold_s]
            if self.stop_event.is_set() and not held and not due:
                break
            results: dict[tuple[str, int], list[dict[str, int]]] = defaultdict(list)
            for m in due:
                results[m["topic"], m["qid"]].append(
                    {"offset": m["offset"], "attempt": m["attempt"]}
                )
            body = {
                "max_messages": 0 if self.stop_event.is_set() else 8,
                "wait_ms": 100,
                "results": [{"topic": t, "qid": q, "acks": a} for (t, q), a in results.items()],
            }
            if body["max_messages"] == 0:
                body["max_messages"] = 1
                body["wait_ms"] = 0
            sent = time.monotonic()
            try:
                answer = client.post(f"{self.url}/v1/groups/{self.group}/pull", json=body)
            except httpx.TransportError as exc:
                self.errors += 1
                if not isinstance(exc, httpx.ConnectError):  # the call may have been applied
                    with self.record.lock:
                        for m in due:
                            ref = (m["qid"], m["offset"])
                            self.record.in_doubt.setdefault(ref, (sent, self.url))
                self.urls.append(self.urls.pop(0))  # a proxy that is down costs a retry
                self.url = self.urls[0]
                held += [(0.0, m) for m in due]  # answer them again (elsewhere: unknown)
                if self.stop_event.is_set():
                    break
                time.sleep(0.05)
                continue
            if answer.status_code != 200:
                self.errors += 1
                if answer.status_code == 503 and "shutting_down" in answer.text:
                    self.urls.append(self.urls.pop(0))
                    self.url = self.urls[0]
                held += [(0.0, m) for m in due]
                time.sleep(0.05)
                continue
            got = answer.json()
            received = time.monotonic()
            unknown = {(u["qid"], u["offset"]) for u in got["results"]["unknown"]}
            with self.record.lock:
                for m in due:
                    ref = (m["qid"], m["offset"])
                    if ref in unknown:
                        self.record.unknown.append(ref)
                    else:
                        self.record.acked.setdefault(ref, sent)
                        self.record.ack_times[ref].append(sent)
                for m in got["messages"]:
                    ref = (m["qid"], m["offset"])
                    self.record.deliveries[ref].append((received, m["attempt"], self.url))
                    self.record.keys[ref] = m["key"]
            held += [(received, m) for m in got["messages"]]
        client.close()
