"""The delivery engine alone: CPU per message through offer, pull and ack, compiled (mypyc,
``cproxy/_native.py``) against the same sources interpreted, in one run.

No HTTP, no store, no event loop: ``GroupEngine`` is offered produce batches of ``--batch``
messages over 8 queues (``--keys`` keys, one message per key per batch), pulled
``--batch`` at a time and every pull acked at once, as the broker drives it at full speed.
Each side is a child process of this script (the compiled modules are chosen once per
process, at import: ``CPROXY_PURE_PYTHON=1`` for the source side); rounds alternate the order
of the sides; medians of ``time.process_time`` µs per delivered message, and the ratio.

``--ab REF`` compares this tree's compiled engine (A) with REF's (B, a worktree compiled in
place), both driven by this file's ``run_engine``: the B child loads this file by path with
REF's tree first on ``PYTHONPATH``.

    python -m benchmarks.engine_loop --quick
    python -m benchmarks.engine_loop --messages 400000 --rounds 7 --json engine.json
    python -m benchmarks.engine_loop --ab df7cdf8 --rounds 7
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from benchmarks.harness.report import (
    arg_parser,
    finish,
    machine_facts,
    markdown_table,
    median,
    progress,
)
from benchmarks.harness.server import tree_at
from cproxy._native import PURE_ENV
from cproxy.cli.serve import tune_gc

QUEUES = 8
BODY = b'{"i":1,"pad":"' + b"x" * 80 + b'"}'


def run_engine(messages: int, batch: int, keys: int) -> dict[str, Any]:
    """One measurement in this process: µs of CPU per delivered message."""
    from cproxy import _native
    from cproxy.engine.group import GroupEngine
    from cproxy.engine.group_config import GroupConfig
    from cproxy.engine.records import Result
    from cproxy.model import Message, QueueProgress
    from cproxy.placement import queue_for_key

    config = GroupConfig.from_dict({"topics": {"t": {"order_by": "key"}}})
    progress_ = {("t", q): QueueProgress(0) for q in range(QUEUES)}
    engine = GroupEngine("g", config, progress_, {ref: 0 for ref in progress_})
    offsets = [0] * QUEUES
    batches: list[dict[int, list[Message]]] = []
    for j in range(messages // batch):
        per_queue: dict[int, list[Message]] = {}
        for i in range(batch):
            key = f"k{(j * batch + i) % keys}"
            qid = queue_for_key(key, QUEUES)
            message = Message("t", qid, offsets[qid], key, BODY, None, None, 1_000)
            per_queue.setdefault(qid, []).append(message)
            offsets[qid] += 1
        batches.append(per_queue)
    now_ms = 10_000
    delivered = 0
    results: list[Result] = []

    def pull_and_ack() -> int:
        nonlocal results
        engine.apply_results(results, now_ms)
        deliveries = engine.pull(batch, None, now_ms)
        acks: dict[tuple[str, int], list[int]] = {}
        for delivery in deliveries:
            m = delivery.message
            acks.setdefault((m.topic, m.qid), []).append(m.offset)
        results = [Result(t, q, acks=o) for (t, q), o in acks.items()]
        return len(deliveries)

    start = time.process_time()
    for per_queue in batches:
        for qid, queued in per_queue.items():
            engine.offer("t", qid, queued)
        delivered += pull_and_ack()
    while delivered < len(batches) * batch:
        got = pull_and_ack()
        if not got:
            break
        delivered += got
    engine.apply_results(results, now_ms)
    cpu_s = time.process_time() - start
    return {
        "hot_path": _native.status(),
        "delivered": delivered,
        "us_per_msg": cpu_s / max(delivered, 1) * 1e6,
    }


#: The B side of ``--ab``: this file's ``run_engine`` over the engine of the tree first on
#: ``PYTHONPATH`` (argv: this file, then the three sizes).
_CHILD_OF_TREE = """
import importlib.util, sys
import orjson
spec = importlib.util.spec_from_file_location("_engine_loop", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
m.tune_gc()
print(orjson.dumps(m.run_engine(*map(int, sys.argv[2:]))).decode())
"""


def _child(pure: bool, *sizes: int, tree: Path | None = None) -> dict[str, Any]:
    """``run_engine(*sizes)`` in a child process: compiled, from source (``pure``), or over
    the compiled engine of ``tree``."""
    env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    if pure:
        env[PURE_ENV] = "1"
    command = [sys.executable, "-m", "benchmarks.engine_loop", "--child", *map(str, sizes)]
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
        command = [sys.executable, "-c", _CHILD_OF_TREE, __file__, *map(str, sizes)]
    out = subprocess.run(command, env=env, cwd=tree, capture_output=True, check=True, timeout=600)
    result: dict[str, Any] = orjson.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = arg_parser(__doc__, "fewer messages and rounds (< 1 minute)")
    parser.add_argument("--messages", type=int, help="messages per measurement (400,000)")
    parser.add_argument("--rounds", type=int, help="measurements per side (5)")
    parser.add_argument("--batch", type=int, default=100, help="offer and pull size (100)")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct keys (10,000)")
    parser.add_argument("--ab", metavar="REF", help="this tree's engine (A) against REF's (B)")
    # Internal: run one measurement in this process and print it as JSON.
    parser.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        tune_gc()  # as in ``cproxy serve``
        print(orjson.dumps(run_engine(*args.child)).decode())
        return
    messages = args.messages or (100_000 if args.quick else 400_000)
    rounds = args.rounds or (3 if args.quick else 5)
    with contextlib.ExitStack() as stack:
        if args.ab:
            ref = stack.enter_context(tree_at(args.ab))
            sides = {"A": _side(False), "B": _side(False, ref.tree)}
            names = {"A": "A (this tree)", "B": f"B ({ref.commit})"}
        else:
            sides = {"compiled": _side(False), "source": _side(True)}
            names = {"compiled": "compiled", "source": "source"}
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for side in order:
                run = sides[side](messages, args.batch, args.keys)
                runs[side].append(run)
                progress(
                    f"round {r + 1} {side:8s} {run['us_per_msg']:.2f} µs/msg ({run['hot_path']})"
                )
    us = {side: median([run["us_per_msg"] for run in rs]) for side, rs in runs.items()}
    statuses = {side: rs[0]["hot_path"] for side, rs in runs.items()}
    rows = [
        [
            names[side],
            statuses[side],
            f"{us[side]:.2f}",
            f"{min(r['us_per_msg'] for r in runs[side]):.2f}-"
            f"{max(r['us_per_msg'] for r in runs[side]):.2f}",
        ]
        for side in sides
    ]
    first, second = sides
    text = "\n".join(
        [
            f"## Engine loop ({messages:,} messages, batch {args.batch}, {args.keys:,} keys, "
            f"{rounds} rounds, medians)",
            "",
            markdown_table(["side", "hot path", "µs CPU per message", "range"], rows),
            "",
            f"{first} / {second} CPU per message: **{us[first] / us[second]:.2f}**",
        ]
    )
    out = {"machine": machine_facts(), "us_per_msg": us, "runs": runs, "statuses": statuses}
    finish(out, args, "engine_loop", text)


def _side(pure: bool, tree: Path | None = None) -> Callable[[int, int, int], dict[str, Any]]:
    return lambda *sizes: _child(pure, *sizes, tree=tree)


if __name__ == "__main__":
    main()
