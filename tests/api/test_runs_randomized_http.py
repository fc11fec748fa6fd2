"""Issue 28's randomized run over HTTP (a smaller version of
``tests/engine/test_runs_randomized.py``): real server, 8 puller threads with
``max_per_key: 16``, 5 % fails, fenced results, and half of the pullers also acking the tail
of a run after its message k failed, on their next pull. For every ``order_by`` mode: no
message is handed out twice under one number, numbers grow per message, no stale result is
applied, and no message is handed out before the earlier ones of its (queue, order value)
were finished.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.api.test_delivery import setup
from tests.support import RunningServer

MESSAGES = 600
KEYS = 20
PULLERS = 8
Ref = tuple[int, int]  # (qid, offset)


@dataclass
class Log:
    lock: threading.Lock = field(default_factory=threading.Lock)
    clock: int = 0
    #: ref -> [(attempt, time received, run members before it in the same answer)]
    handouts: dict[Ref, list[tuple[int, int, frozenset[int]]]] = field(default_factory=dict)
    #: ref -> times at which an ack later reported applied was sent
    finished_at: dict[Ref, int] = field(default_factory=dict)
    stale_applied: list[Ref] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def tick(self) -> int:
        self.clock += 1
        return self.clock


def puller(url: str, seed: int, stale_tails: bool, log: Log, stop: threading.Event) -> None:
    rng = random.Random(seed)
    # (qid, offset, attempt, ack?, sent-time stale?) waiting for the next pull
    pending: list[tuple[int, int, int, bool]] = []
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            results: dict[int, dict[str, list[Any]]] = {}
            sent: list[tuple[Ref, int, bool, bool, int]] = []
            with log.lock:
                at = log.tick()
                for qid, offset, attempt, ack in pending:
                    ref = (qid, offset)
                    stale = log.handouts[ref][-1][0] != attempt
                    item = {"offset": offset, "attempt": attempt}
                    r = results.setdefault(qid, {"acks": [], "fails": []})
                    r["acks" if ack else "fails"].append(item)
                    sent.append((ref, attempt, ack, stale, at))
            pending = []
            body = {
                "max_messages": rng.randint(1, 32),
                "wait_ms": 100,
                "max_per_key": 16,
                "results": [{"topic": "t", "qid": q, **r} for q, r in results.items()],
            }
            answer = client.post("/v1/groups/g/pull", json=body)
            if answer.status_code != 200:
                log.errors.append(f"{answer.status_code} {answer.text}")
                return
            data = answer.json()
            unknown = {(u["qid"], u["offset"]) for u in data["results"]["unknown"]}
            messages = data["messages"]
            with log.lock:
                received = log.tick()
                for ref, _attempt, ack, stale, at in sent:
                    applied = ref not in unknown
                    if applied and stale:
                        log.stale_applied.append(ref)
                    if applied and ack:
                        log.finished_at.setdefault(ref, at)
                for i, m in enumerate(messages):
                    ref = (m["qid"], m["offset"])
                    before = frozenset(x["offset"] for x in messages[m.get("run", i) : i])
                    log.handouts.setdefault(ref, []).append((m["attempt"], received, before))
            runs: dict[int, list[dict[str, Any]]] = {}
            for i, m in enumerate(messages):
                runs.setdefault(m.get("run", i), []).append(m)
            for run in runs.values():
                failed = False
                for m in run:
                    if failed:
                        if stale_tails:  # finished before it saw the fail
                            pending.append((m["qid"], m["offset"], m["attempt"], True))
                        continue
                    ok = rng.random() >= 0.05
                    pending.append((m["qid"], m["offset"], m["attempt"], ok))
                    failed = not ok


@pytest.mark.parametrize("order_by", ["key", "qid", "$.k"])
def test_runs_fails_and_stale_tail_acks_over_http(server: RunningServer, order_by: str) -> None:
    rng = random.Random(280)
    with server.client() as client:
        setup(
            client,
            {
                "topics": {"t": {"order_by": order_by}},
                "max_attempts": 1000,
                "retry_backoff_ms": [0],
                "ack_timeout_ms": 120_000,
            },
            queues=2,
        )
        values: dict[Ref, str] = {}
        batch = []
        for n in range(MESSAGES):
            key = f"k{rng.randrange(KEYS)}"
            batch.append({"key": key, "body": {"k": key, "n": n}, "qid": rng.randrange(2)})
        r = client.post("/v1/topics/t/messages", json={"messages": batch})
        assert r.status_code == 200, r.text
        for item, res in zip(batch, r.json()["results"], strict=True):
            ref = (res["qid"], res["offset"])
            values[ref] = str(res["qid"]) if order_by == "qid" else item["key"]
        log, stop = Log(), threading.Event()
        threads = [
            threading.Thread(target=puller, args=(server.url, 7 * i, i % 2 == 0, log, stop))
            for i in range(PULLERS)
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        try:
            while len(log.finished_at) < MESSAGES and not log.errors:
                assert time.monotonic() < deadline, f"{len(log.finished_at)} finished"
                time.sleep(0.05)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
    assert log.errors == []
    assert log.stale_applied == []
    for ref, outs in log.handouts.items():
        numbers = [a for a, _, _ in outs]
        assert numbers == sorted(set(numbers)), (ref, numbers)
    # Order: a message is handed out only after every earlier one of its (queue, value)
    # was acked (an applied ack sent before the hand-out arrived), or with it in one run.
    violations = []
    for (qid, offset), outs in log.handouts.items():
        earlier = [o for (q, o), v in values.items() if q == qid and o < offset]
        earlier = [o for o in earlier if values[(qid, o)] == values[(qid, offset)]]
        for _, received, run_before in outs:
            for o in earlier:
                done = log.finished_at.get((qid, o))
                if (done is None or done > received) and o not in run_before:
                    violations.append(((qid, offset), o))
    assert violations == []
    assert sum(len(v) for v in log.handouts.values()) > MESSAGES  # fails were redelivered
