"""Acceptance: SIGKILL the server mid-stream, restart it on the same data, lose nothing.

docs/guarantees.md §1/2/5/6: the server runs as a real subprocess (``cproxy serve``) with
``commit_interval_ms = 200``. A paced producer writes per-key sequence numbers with message ids;
consumer threads pull with piggybacked acks (and a few deliberate fails, some of them until the
message is dead-lettered) and log every delivery and every ack the server *confirmed*. The
server is SIGKILLed while messages are being produced and consumed, restarted on the same data
dir and port, and the run goes on until every message is finished. Then:

- every produced message was acked or dead-lettered (and only the always-failing ones were
  dead-lettered), and each message was stored exactly once (a produce call cut by the kill is
  retried with the same ids and relies on dedup; the retried call is all-or-nothing);
- per key, no message was delivered before its predecessor was finished (acked, or failed on
  its last attempt), deliveries never go backwards within one server lifetime, and one pull
  response never holds two messages of one key;
- messages whose ack the server had confirmed before the kill and that came back after the
  restart are bounded by what was acked in the last commit interval(s) before the kill plus
  one pull batch per consumer.
"""

from __future__ import annotations

import itertools
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import wait_until

pytestmark = pytest.mark.slow

TOPIC = "rides"
GROUP = "billing"
QUEUES = 4
KEYS = 200
MESSAGES = 3000
PRODUCE_BATCH = 20
PRODUCE_RATE = 1000.0  # msgs/s: production overlaps the kills
CONSUMERS = 4
PULL_BATCH = 20
COMMIT_INTERVAL_MS = 200
MAX_ATTEMPTS = 3
ACK_TIMEOUT_MS = 2000

Msg = tuple[int, int]  # (key index, seq)


def key_name(k: int) -> str:
    return f"ride-{k}"


def fails_always(msg: Msg) -> bool:
    """A handful of messages fail on every attempt: they must end dead-lettered."""
    k, seq = msg
    return k % 40 == 7 and seq == 3


def fails_first(msg: Msg) -> bool:
    """Some more fail on their first attempt only (retried after the backoff)."""
    k, seq = msg
    return (k * 31 + seq) % 37 == 0


# -- the server subprocess -------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``cproxy serve`` in a subprocess; restartable on the same data dir and port."""

    def __init__(self, root: Path, extra_config: str = "", port: int | None = None) -> None:
        """``extra_config``: more TOML for the config file (e.g. a ``[push]`` table);
        ``port``: restart on it every time (clients keep their URL), else a fresh one each."""
        self.fixed_port = port
        self.data_dir = root / "data"
        self.config = root / "cproxy.toml"
        self.config.write_text(
            f"[server]\ncommit_interval_ms = {COMMIT_INTERVAL_MS}\n{extra_config}"
        )
        self.log_path = root / "server.log"
        self.port = 0
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start on a fresh port, so no request meant for a killed server reaches this one
        (unless a fixed port was given)."""
        self.port = self.fixed_port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "cproxy.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--config",
            str(self.config),
            "--log-level",
            "info",
        ]
        with self.log_path.open("ab") as log:
            log.write(f"--- start {time.time():.3f}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                return httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, 20, 0.02, "server /readyz")

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self) -> None:
        """Graceful stop (SIGTERM): progress is persisted."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(20)

    def log(self) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-6000:]


@pytest.fixture
def server_proc(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path)
    try:
        yield server
    finally:
        server.kill()


# -- what the clients saw ----------------------------------------------------------------------
@dataclass
class Delivery:
    order: int  # global event order (causal: logged after the response arrived)
    epoch: int  # server lifetime the pull was sent to
    msg: Msg
    attempt: int
    qid: int
    offset: int
    at: float


@dataclass
class Sent:
    """One result (ack or fail) sent on a pull; confirmed when the pull returned 200 and the
    server did not report it unknown."""

    order: int  # logged before the request was sent
    epoch: int
    msg: Msg
    ack: bool
    attempt: int
    #: Charged deliveries before this one (``charged_attempts``): a fail with
    #: ``charged + 1 == MAX_ATTEMPTS`` dead-letters the message.
    charged: int = 0
    confirmed: bool = False
    confirmed_at: float = 0.0
    lost: bool = False  # the request failed (server killed): outcome unknown


@dataclass
class Log:
    url: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    counter: Iterator[int] = field(default_factory=itertools.count)
    #: Server lifetime: bumped (with ``url``) under ``lock`` right after each SIGKILL.
    epoch: int = 0
    deliveries: list[Delivery] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    unknown_results: int = 0
    #: (key, seq) -> (qid, offset) from the produce responses
    produced: dict[Msg, tuple[int, int]] = field(default_factory=dict)
    produce_retries: int = 0  # produce calls cut by a kill and retried
    cut_calls_stored: int = 0  # of those, how many had been stored before the kill
    kills: list[float] = field(default_factory=list)  # monotonic time of each SIGKILL

    def next_order(self) -> int:
        return next(self.counter)

    @property
    def acked_confirmed(self) -> int:
        return sum(1 for s in self.sent if s.ack and s.confirmed)


def producer(log: Log, stop: threading.Event) -> None:
    """Paced, in per-key order; a call cut by the kill is retried with the same ids."""
    order = [(i % KEYS, i // KEYS) for i in range(MESSAGES)]
    next_at = time.monotonic()
    with httpx.Client(timeout=10) as client:
        for start in range(0, MESSAGES, PRODUCE_BATCH):
            batch = order[start : start + PRODUCE_BATCH]
            body = {
                "messages": [
                    {"key": key_name(k), "id": f"m-{k}-{s}", "body": {"k": k, "seq": s}}
                    for k, s in batch
                ]
            }
            cut = False
            while True:
                if stop.is_set():
                    return
                try:
                    response = client.post(f"{log.url}/v1/topics/{TOPIC}/messages", json=body)
                except httpx.TransportError:
                    cut = True
                    stop.wait(0.02)  # the server is down: retry until it is back
                    continue
                if response.status_code == 503:
                    cut = True
                    stop.wait(0.02)
                    continue
                if response.status_code != 200:
                    log.errors.append(f"produce {response.status_code}: {response.text}")
                    return
                break
            results = response.json()["results"]
            duplicates = {r["duplicate"] for r in results}
            if cut:
                log.produce_retries += 1
                log.cut_calls_stored += duplicates == {True}
                if len(duplicates) != 1:
                    log.errors.append(f"produce call not atomic across the kill: {results}")
            elif duplicates != {False}:
                log.errors.append(f"fresh produce call reported duplicates: {results}")
            for msg, r in zip(batch, results, strict=True):
                log.produced[msg] = (r["qid"], r["offset"])
            next_at = max(next_at + len(batch) / PRODUCE_RATE, time.monotonic() - 0.05)
            stop.wait(max(0.0, next_at - time.monotonic()))


def consumer(log: Log, stop: threading.Event) -> None:
    """Pull with acks of the previous batch piggybacked; log deliveries and confirmations.

    Results outlive a restart like in a real client: acks for deliveries of the killed server
    go to the new one, which applies them if that message is in flight again (and reports
    them unknown otherwise).
    """
    pending: list[tuple[Sent, int, int]] = []  # (sent, qid, offset)
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            with log.lock:
                epoch, url = log.epoch, log.url
                for sent, *_ in pending:
                    sent.order = log.next_order()
                    sent.epoch = epoch
                    log.sent.append(sent)
            by_queue: dict[int, dict[str, list[int]]] = defaultdict(
                lambda: {"acks": [], "fails": []}
            )
            for sent, qid, offset in pending:
                by_queue[qid]["acks" if sent.ack else "fails"].append(offset)
            body = {
                "max_messages": PULL_BATCH,
                "wait_ms": 200,
                "results": [{"topic": TOPIC, "qid": q, **r} for q, r in by_queue.items()],
            }
            try:
                response = client.post(f"{url}/v1/groups/{GROUP}/pull", json=body)
            except httpx.TransportError:
                response = None
            if response is None or response.status_code != 200:
                if response is not None and response.status_code != 503:
                    log.errors.append(f"pull {response.status_code}: {response.text}")
                for sent, *_ in pending:
                    sent.lost = True
                pending = []
                stop.wait(0.02)  # the server is down: retry until it is back
                continue
            data = response.json()
            now = time.monotonic()
            unknown = {(u["qid"], u["offset"]) for u in data["results"]["unknown"]}
            with log.lock:
                log.unknown_results += len(unknown)
                for sent, qid, offset in pending:
                    if (qid, offset) not in unknown:
                        sent.confirmed = True
                        sent.confirmed_at = now
                pending = []
                keys_in_response = [m["key"] for m in data["messages"]]
                if len(set(keys_in_response)) != len(keys_in_response):
                    log.errors.append(f"one pull response holds one key twice: {keys_in_response}")
                for m in data["messages"]:
                    msg = (m["body"]["k"], m["body"]["seq"])
                    log.deliveries.append(
                        Delivery(
                            log.next_order(), epoch, msg, m["attempt"], m["qid"], m["offset"], now
                        )
                    )
                    ack = not fails_always(msg) and not (fails_first(msg) and m["attempt"] == 1)
                    sent = Sent(0, epoch, msg, ack, m["attempt"], m["charged_attempts"])
                    pending.append((sent, m["qid"], m["offset"]))


# -- helpers -------------------------------------------------------------------------------------
def setup_topic_and_group(url: str) -> None:
    with httpx.Client(base_url=url, timeout=10) as client:
        assert client.post("/v1/topics", json={"name": TOPIC, "queues": QUEUES}).status_code == 201
        response = client.put(
            f"/v1/groups/{GROUP}",
            json={
                "topics": {TOPIC: {"order_by": "key"}},
                "max_attempts": MAX_ATTEMPTS,
                "retry_backoff_ms": [50],
                "ack_timeout_ms": ACK_TIMEOUT_MS,
                "on_exhausted": "dead_letter",
            },
        )
        assert response.status_code == 200, response.text


def group_stats(url: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/v1/groups/{GROUP}", timeout=10)
    assert response.status_code == 200, response.text
    stats: dict[str, Any] = response.json()["stats"]
    return stats


def dead_letters(url: str) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{url}/v1/groups/{GROUP}/dead-letters", params={"limit": 10_000}, timeout=10
    )
    assert response.status_code == 200, response.text
    rows: list[dict[str, Any]] = response.json()["dead_letters"]
    return rows


def all_finished(url: str, expected_dead: int) -> bool:
    stats = group_stats(url)
    return (
        all(q["lag"] == 0 for q in stats["queues"])
        and stats["in_flight"] == 0
        and stats["ready"] == 0
        and stats["retrying"] == 0
        and stats["waiting"] == 0
        and stats["dead_lettered"] == expected_dead
    )


def check_order(log: Log, dead: set[Msg]) -> list[str]:
    """Per key: deliveries never overtake an unfinished predecessor nor go backwards."""
    problems: list[str] = []
    events: list[tuple[int, Delivery | Sent]] = [(d.order, d) for d in log.deliveries]
    events += [(s.order, s) for s in log.sent]
    events.sort(key=lambda e: e[0])
    finished: dict[int, set[int]] = defaultdict(set)  # key -> seqs whose finishing result was sent
    last_seq: dict[tuple[int, int], int] = {}  # (epoch, key) -> last delivered seq
    for _, event in events:
        k, seq = event.msg
        if isinstance(event, Sent):
            if event.ack or event.charged + 1 >= MAX_ATTEMPTS:
                finished[k].add(seq)
            continue
        previous = last_seq.get((event.epoch, k))
        if previous is not None and seq < previous:
            problems.append(
                f"key {k}: seq {seq} delivered after seq {previous} "
                f"in server lifetime {event.epoch}"
            )
        last_seq[(event.epoch, k)] = seq
        missing = [s for s in range(seq) if s not in finished[k] and (k, s) not in dead]
        if missing:
            problems.append(
                f"key {k}: seq {seq} (attempt {event.attempt}, lifetime "
                f"{event.epoch}) delivered before seq {missing} finished"
            )
    return problems


def redelivery_report(log: Log, kill_index: int) -> tuple[int, int, float]:
    """For kill ``i`` (lifetime i -> i+1): (redelivered, bound, max ack age in s).

    Redelivered: messages whose last delivery before the kill was acked and confirmed, yet
    were delivered again after the restart. Bound: acks confirmed within 2 commit intervals
    before the kill, plus one pull batch per consumer.
    """
    t_kill = log.kills[kill_index]
    window_s = 2 * COMMIT_INTERVAL_MS / 1000
    last: dict[Msg, Delivery] = {}
    for d in log.deliveries:
        if d.epoch <= kill_index:
            last[d.msg] = d
    confirmed_at: dict[Msg, float] = {}
    for s in log.sent:
        latest = last.get(s.msg)
        if (
            s.ack
            and s.confirmed
            and s.epoch <= kill_index
            and latest is not None
            and latest.attempt == s.attempt
            and s.order > latest.order
        ):
            confirmed_at[s.msg] = s.confirmed_at
    after = {d.msg for d in log.deliveries if d.epoch == kill_index + 1}
    redelivered = [m for m in after if m in confirmed_at]
    recent = sum(
        1
        for s in log.sent
        if s.ack and s.confirmed and s.epoch == kill_index and s.confirmed_at >= t_kill - window_s
    )
    bound = recent + CONSUMERS * PULL_BATCH
    max_age = max((t_kill - confirmed_at[m] for m in redelivered), default=0.0)
    return len(redelivered), bound, max_age


# -- the test ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kill_at", "graceful_restart"),
    [((0.5,), True), ((0.3, 0.65), False)],
    ids=["one-kill-then-sigterm", "two-kills"],
)
def test_sigkill_and_restart_loses_nothing_and_keeps_order(
    server_proc: ServerProcess, kill_at: tuple[float, ...], graceful_restart: bool
) -> None:
    server = server_proc
    server.start()
    setup_topic_and_group(server.url)
    log = Log(server.url)
    stop = threading.Event()
    threads = [threading.Thread(target=producer, args=(log, stop), daemon=True)]
    threads += [
        threading.Thread(target=consumer, args=(log, stop), daemon=True) for _ in range(CONSUMERS)
    ]
    expected_dead = {
        (k, s) for k in range(KEYS) for s in range(MESSAGES // KEYS) if fails_always((k, s))
    }
    started = time.monotonic()
    try:
        for t in threads:
            t.start()
        for fraction in kill_at:

            def reached(f: float = fraction) -> bool:
                return log.acked_confirmed >= f * MESSAGES or bool(log.errors)

            wait_until(reached, 30, 0.005, f"{fraction:.0%} acked")
            assert not log.errors, log.errors
            with log.lock:  # no pull is sent between the kill and the epoch change
                log.kills.append(time.monotonic())
                server.kill()
                log.epoch += 1
            server.start()
            log.url = server.url
        wait_until(
            lambda: len(log.produced) == MESSAGES or log.errors, 30, 0.02, "everything produced"
        )
        wait_until(
            lambda: all_finished(server.url, len(expected_dead)) or log.errors,
            30,
            0.05,
            "every message acked or dead-lettered",
        )
        assert not log.errors, log.errors
    except BaseException:
        print(server.log())
        raise
    finally:
        stop.set()
        for t in threads:
            t.join(15)
    elapsed = time.monotonic() - started

    dead_rows = dead_letters(server.url)
    dead = {(r["body"]["k"], r["body"]["seq"]) for r in dead_rows}

    # Each message stored exactly once, and delivered from where it was stored.
    assert len(log.produced) == MESSAGES
    assert len(set(log.produced.values())) == MESSAGES, "a message was stored twice"
    wrong_place = [d for d in log.deliveries if log.produced[d.msg] != (d.qid, d.offset)]
    assert not wrong_place, wrong_place[:5]

    # Nothing lost: every message acked or dead-lettered, and only the failing ones dead.
    assert len(dead_rows) == len(dead), "a message was dead-lettered twice"
    assert dead == expected_dead
    acked = {s.msg for s in log.sent if s.ack and s.confirmed}
    acked_unconfirmed = {s.msg for s in log.sent if s.ack and s.lost} - acked
    unfinished = set(log.produced) - acked - dead - acked_unconfirmed
    assert not unfinished, sorted(unfinished)[:20]
    assert not (acked & dead)
    delivered = {d.msg for d in log.deliveries}
    assert delivered == set(log.produced)

    # Order per key.
    problems = check_order(log, dead)
    assert not problems, problems[:20]

    # Duplicates after each crash bounded by the last commit interval(s) before it.
    reports = [redelivery_report(log, i) for i in range(len(kill_at))]
    summary = (
        f"{elapsed:.1f}s, {len(log.deliveries)} deliveries, {len(acked)} acked, "
        f"{len(acked_unconfirmed)} acked-unconfirmed, {len(dead)} dead, "
        f"{log.produce_retries} produce calls cut ({log.cut_calls_stored} had been stored), "
        f"{log.unknown_results} unknown results, redelivered/bound/max-age per kill: "
        + ", ".join(f"{r}/{b}/{a * 1000:.0f}ms" for r, b, a in reports)
    )
    print(summary)
    for i, (redelivered, bound, max_age) in enumerate(reports):
        assert redelivered <= bound, f"kill {i}: {summary}"
        # Each one had been acked shortly before the kill (not, say, a commit ago of seconds).
        assert max_age <= 2 * COMMIT_INTERVAL_MS / 1000 + 0.3, f"kill {i}: {summary}"

    if not graceful_restart:
        return
    # A graceful restart persists everything: nothing is delivered again.
    server.terminate()
    server.start()
    assert all_finished(server.url, len(expected_dead))
    response = httpx.post(
        f"{server.url}/v1/groups/{GROUP}/pull",
        json={"max_messages": 100, "wait_ms": 300},
        timeout=10,
    )
    assert response.status_code == 200
    assert response.json()["messages"] == []
