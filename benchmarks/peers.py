"""Throughput and CPU against peers: cproxy (its SDK, and plain HTTP pullers) against Redis
Streams and NATS JetStream on one ordered workload, in one run.

Workload (every system, every run): 200,000 messages of 200-byte JSON over 10,000 keys,
8 partitions, produce batches of 100; 4 producers and 4 consumers, each in its own process;
a fresh server on loopback per run. Partitioned peers place a key by Kafka's murmur2 (as
cproxy does) into one of 8 Redis streams (redis-py with hiredis; XREADGROUP, XACK riding on
the next read) or 8 file-backed JetStream streams (nats-py; a pull consumer with ack policy
*all*), each read by exactly one ordered consumer. cproxy runs as ``cproxy-sdk``
(``AsyncProducer.send_batch`` and ``AsyncConsumer``) and as ``cproxy-pull`` (plain
``AsyncClient.pull`` loops, ``order_by: key``, acks on the next pull: what an HTTP user in
any language writes).

Each system runs without and with 1 % stalled keys (every key index divisible by 100):

- no stall: e2e msgs/s = messages / (barrier -> last first delivery); server CPU per message
  (psutil, the server process) and client CPU per message (process time of the 8 clients);
- 1 % stalled: cproxy pullers never ack a stalled message, the SDK handler fails it on every
  delivery; a Redis/NATS partition consumer stops at it for good (an ordered partition
  consumer may not pass it). The run ends when every healthy message arrived, or after twice
  the no-stall time; the healthy-key rate is compared with the no-stall run's.

Rounds are interleaved (rotating order; stall first in odd rounds; each run's data deleted
and synced before the next); medians, and medians of per-round ratios to Redis.
    python -m benchmarks.peers --quick          # 20k messages, 1 round
    python -m benchmarks.peers --rounds 5 --json peers.json
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import psutil

from benchmarks._peers import (
    GROUP,
    TOPIC,
    ChildSpec,
    Shared,
    Workload,
    child_main,
    setup_nats,
    setup_redis,
)
from benchmarks.harness.load import STALL_GROUP_CONFIG
from benchmarks.harness.probe import cpu_seconds
from benchmarks.harness.report import (
    arg_parser,
    finish,
    machine_facts,
    median,
    pct,
    progress,
    table,
)
from benchmarks.harness.server import missing, peer_process, running, this_tree
from consumer_sdk import Client

#: A run that has not finished after this long is stopped (and reported as such).
HARD_LIMIT_S = 300.0


@contextlib.contextmanager
def fresh_server(system: str, wl: Workload, root: Path, name: str) -> Iterator[tuple[str, int]]:
    """A fresh server for one run (``system``: cproxy-sdk, cproxy-pull, redis or nats), set up
    for the workload: (address, pid)."""
    data = root / name
    if system in ("redis", "nats"):
        with peer_process(system, data) as (address, pid):
            if system == "redis":
                setup_redis(address, wl)
            else:
                asyncio.run(setup_nats(address, wl))
            yield address, pid
    else:
        with running(root, name) as server, Client(server.url) as c:
            c.create_topic(TOPIC, wl.partitions)
            c.put_group(GROUP, {"topics": {TOPIC: {"order_by": "key"}}, **STALL_GROUP_CONFIG})
            yield server.url, server.pid


def settle(data: Path) -> None:
    """Delete a finished run's data and wait until the kernel has written back what is
    dirty: otherwise the next run pays for this one's writeback (a systematic handicap for
    whichever run comes second)."""
    shutil.rmtree(data, ignore_errors=True)
    os.sync()


def run_once(
    system: str, wl: Workload, stall: bool, window_s: float, root: Path, name: str
) -> dict[str, Any]:
    """One run; the clock starts when all 8 client processes are connected and released."""
    ctx = multiprocessing.get_context("spawn")
    n = wl.producers + wl.consumers
    shared = Shared(
        barrier=ctx.Barrier(n + 1),
        stop=ctx.RawValue("b", 0),
        all_count=ctx.Array("q", wl.consumers, lock=False),  # type: ignore[arg-type]
        healthy_count=ctx.Array("q", wl.consumers, lock=False),  # type: ignore[arg-type]
        all_at=ctx.Array("d", wl.consumers, lock=False),  # type: ignore[arg-type]
        healthy_at=ctx.Array("d", wl.consumers, lock=False),  # type: ignore[arg-type]
        reports=ctx.Queue(),
    )
    healthy_total = wl.healthy
    with fresh_server(system, wl, root, name) as (address, pid):
        roles = [("producer", i) for i in range(wl.producers)]
        roles += [("consumer", i) for i in range(wl.consumers)]
        specs = [ChildSpec(system, role, i, address, wl, stall) for role, i in roles]
        procs = [ctx.Process(target=child_main, args=(s, shared), daemon=True) for s in specs]
        for p in procs:
            p.start()
        server = psutil.Process(pid)
        try:
            shared.barrier.wait(timeout=120)
            t0, cpu0 = time.monotonic(), cpu_seconds(server)
            deadline = t0 + min(window_s, HARD_LIMIT_S)
            while time.monotonic() < deadline:
                if stall and sum(shared.healthy_count) >= healthy_total:
                    break
                if not stall and sum(shared.all_count) >= wl.messages:
                    break
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError(f"{system}: a client process failed")
                time.sleep(0.005)
            ended = time.monotonic()
            server_cpu = cpu_seconds(server) - cpu0
            shared.stop.value = 1
            reports = [shared.reports.get(timeout=60) for _ in procs]
        finally:
            shared.stop.value = 1
            for p in procs:
                p.join(30)
                if p.is_alive():
                    p.kill()
    settle(root / name)
    healthy = sum(shared.healthy_count)
    everything = sum(shared.all_count)
    healthy_done = healthy >= healthy_total
    healthy_s = (max(shared.healthy_at) if healthy_done else ended) - t0
    out: dict[str, Any] = {
        "system": system,
        "stall": stall,
        "delivered": everything,
        "healthy_delivered": healthy,
        "healthy_share": healthy / healthy_total,
        "healthy_msgs_per_s": healthy / healthy_s,
        "client_cpu_s": sum(r[2] for r in reports),
        "order_violations": sum(r[3] for r in reports),
        "server_cpu_s": server_cpu,
    }
    if not stall:
        if everything < wl.messages:
            raise RuntimeError(f"{system}: {everything} of {wl.messages} delivered")
        elapsed = max(shared.all_at) - t0
        out |= {
            "seconds": elapsed,
            "msgs_per_s": wl.messages / elapsed,
            "server_cpu_us_per_msg": server_cpu / wl.messages * 1e6,
            "client_cpu_us_per_msg": out["client_cpu_s"] / wl.messages * 1e6,
        }
    return out


def describe(r: dict[str, Any]) -> str:
    if r["stall"]:
        return (
            f"1 % stalled: healthy {r['healthy_msgs_per_s']:,.0f} msgs/s ({r['healthy_share']:.1%})"
        )
    return f"{r['msgs_per_s']:,.0f} msgs/s, server {r['server_cpu_us_per_msg']:.1f} µs/msg"


def run_rounds(systems: list[str], wl: Workload, rounds: int) -> dict[str, list[dict[str, Any]]]:
    """Per round and system: the no-stall and the stall run (window: 2 x the no-stall time),
    in alternating order."""
    out: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    root = Path(tempfile.mkdtemp(prefix="cproxy-peers-"))
    try:
        plain_s: dict[str, float] = {}  # system -> its latest no-stall run's seconds

        def one(system: str, rnd: int, stall: bool) -> dict[str, Any]:
            tag = f"{system}-r{rnd}-{'stall' if stall else 'plain'}"
            window = 2 * plain_s[system] if stall else HARD_LIMIT_S
            r = run_once(system, wl, stall, window, root, tag)
            if not stall:
                plain_s[system] = r["seconds"]
            progress(f"round {rnd + 1} {system:12s} {describe(r)}")
            return r

        for rnd in range(rounds):
            shift = rnd % len(systems)
            for system in [*systems[shift:], *systems[:shift]]:
                # Odd rounds run the stall case first, so that neither case always comes
                # second (after the other run's load); its window is then 2 x the previous
                # round's no-stall time.
                stall_first = rnd % 2 == 1 and system in plain_s
                first = one(system, rnd, stall_first)
                second = one(system, rnd, not stall_first)
                plain, stalled = (second, first) if stall_first else (first, second)
                out[system].append({"round": rnd, "plain": plain, "stall": stalled})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def summarise(results: dict[str, list[dict[str, Any]]], baseline: str) -> list[dict[str, Any]]:
    """Medians per system, and medians of the per-round ratios to ``baseline``."""
    base = {r["round"]: r for r in results[baseline]}
    rows = []
    for name, runs in results.items():

        def med(kind: str, key: str, runs: list[dict[str, Any]] = runs) -> float:
            return median([r[kind][key] for r in runs])

        def to_base(key: str, runs: list[dict[str, Any]] = runs) -> float:
            return median([r["plain"][key] / base[r["round"]]["plain"][key] for r in runs])

        stall_ratios = [r["stall"]["healthy_msgs_per_s"] / r["plain"]["healthy_msgs_per_s"]
                        for r in runs]  # fmt: skip
        violations = sum(r[k]["order_violations"] for r in runs for k in ("plain", "stall"))
        rows.append(
            {"system": name, "runs": len(runs), "msgs_per_s": med("plain", "msgs_per_s"),
             "vs_base": to_base("msgs_per_s"), "server_us": med("plain", "server_cpu_us_per_msg"),
             "server_vs_base": to_base("server_cpu_us_per_msg"),
             "client_us": med("plain", "client_cpu_us_per_msg"),
             "stall_ratio": median(stall_ratios), "healthy_share": med("stall", "healthy_share"),
             "violations": violations}
        )  # fmt: skip
    return rows


def report(rows: list[dict[str, Any]], wl: Workload, args: Any, skipped: dict[str, str]) -> str:
    base = rows[0]["system"] if not any(r["system"] == "redis" for r in rows) else "redis"
    columns = [
        ("system", lambda r: r["system"]),
        ("e2e msgs/s", lambda r: f"{r['msgs_per_s']:,.0f}"),
        (f"vs {base}", lambda r: f"{r['vs_base']:.2f}"),
        ("server CPU µs/msg", lambda r: f"{r['server_us']:.1f}"),
        ("client CPU µs/msg", lambda r: f"{r['client_us']:.1f}"),
        ("healthy rate, 1 % stalled / none", lambda r: f"{r['stall_ratio']:.3f}"),
        ("healthy delivered, 1 % stalled", lambda r: pct(r["healthy_share"])),
        ("order violations", lambda r: str(r["violations"])),
    ]
    lines = [
        f"## Peers: {wl.messages:,} msgs of {wl.body_bytes} B over {wl.keys:,} keys, "
        f"{wl.partitions} partitions, batch {wl.batch}, {wl.producers} producer + "
        f"{wl.consumers} consumer processes; medians of {args.rounds} interleaved round(s)",
        "",
        table(columns, rows),
        "",
        "Ratios are medians of per-round ratios. A stall run stops when every healthy message "
        "arrived or after twice the no-stall time.",
    ]
    lines += [f"- skipped {name}: {why}" for name, why in skipped.items()]
    return "\n".join(lines)


def main() -> None:
    parser = arg_parser(__doc__, "20,000 messages, 1 round")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5; 1 quick)")
    parser.add_argument("--messages", type=int, help="default 200,000 (20,000 quick)")
    parser.add_argument(
        "--systems",
        default="cproxy-sdk,cproxy-pull,redis,nats",
        help="comma-separated subset of cproxy-sdk,cproxy-pull,redis,nats",
    )
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 5)
    wl = Workload()
    wl = replace(wl, messages=args.messages or (20_000 if args.quick else wl.messages))
    facts = machine_facts()
    skipped: dict[str, str] = {}
    systems: list[str] = []
    for kind in args.systems.split(","):
        if not kind.startswith("cproxy") and (why := missing(kind)) is not None:
            skipped[kind] = why
            progress(f"skipping {kind}: {why}")
        else:
            systems.append(kind)
    results = run_rounds(systems, wl, args.rounds)
    rows = summarise(results, "redis" if "redis" in systems else systems[0])
    out = {"machine": facts, "commit": this_tree().commit, "workload": asdict(wl),
           "rounds": args.rounds, "skipped": skipped, "summary": rows, "runs": results}  # fmt: skip
    finish(out, args, "peers", report(rows, wl, args, skipped))


if __name__ == "__main__":
    main()
