"""Persisted progress under a long stall: 1 % of keys never finish while the rest flow, for
minutes; then a graceful restart must replay nothing that was acked.

One producer sends ``--rate`` msgs/s over ``--keys`` keys (batches of 50) to a topic of
``--queues`` queues for ``--seconds``. Each stall variant is its own group on that topic, with
its own ``--pullers`` pullers (max_messages 100, wait_ms 500, acks on the next pull), all at
the same time; keys whose index is a multiple of ``--stall-every`` stall:

- ``never-ack``: stalled messages are held, never acked (ack_timeout_ms 3,600,000: nothing
  times out during the run);
- ``fail-block``: stalled messages fail on every delivery; max_attempts 3, retry_backoff_ms
  [200], ``on_exhausted: "block"`` (the head stays exhausted, its key blocked).

Both groups use ``max_buffered = --max-buffered``, so waiting messages of stalled keys fill
the buffer and the keys get parked. Every ``--every`` seconds: per group, the persisted
progress (the ``progress`` rows of the server's SQLite file, read-only: bytes of the
``finished`` column, open ranges, parked entries), and from GET /v1/groups/{group}: ``lag``,
``lag_excluding_parked``, ``oldest_unfinished_age_ms``, ``parked_keys``, ``blocked_keys``,
``buffered``; next to them the client's healthy backlog (healthy messages stored whose ack
was not sent yet).

Then production stops, the pullers finish the healthy backlog, flush their acks and stop; the
server gets SIGTERM (graceful: progress persisted) and is started again on the same data dir.
New pullers take everything the groups hand out until every healthy message not acked before
the restart is acked, then ``--settle`` seconds more. *Replayed* = deliveries after the
restart of messages whose ack the server had confirmed before it (must be 0); *missing* =
healthy messages acked neither before nor after (must be 0).

    python -m benchmarks.stall_progress --quick        # ~45 s
    python -m benchmarks.stall_progress --json stall.json   # 5 minutes of stall, ~6 minutes
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness.ledger import (
    GroupLedger,
    ProducedLog,
    StallAction,
    pull_loop,
    raise_failed,
    steady_produce,
    wait_true,
)
from benchmarks.harness.load import client, create_topic, group_stats, put_group, run_loop
from benchmarks.harness.persisted import PersistedProgress, read_progress
from benchmarks.harness.report import (
    arg_parser,
    finish,
    load_average,
    machine_facts,
    markdown_table,
    progress,
)
from benchmarks.harness.server import ServerProcess

TOPIC = "stall"
#: Variant -> (what the pullers do with a stalled message, the group's config).
VARIANTS: dict[str, tuple[StallAction, dict[str, Any]]] = {
    "never-ack": ("hold", {"ack_timeout_ms": 3_600_000, "max_attempts": 1000}),
    "fail-block": (
        "fail",
        {"max_attempts": 3, "retry_backoff_ms": [200], "on_exhausted": "block"},
    ),
}


@dataclass
class Variant:
    name: str
    action: StallAction
    config: dict[str, Any]
    before: GroupLedger
    after: GroupLedger
    samples: list[dict[str, Any]] = field(default_factory=list)
    restart: dict[str, Any] = field(default_factory=dict)

    @property
    def group(self) -> str:
        return f"stall-{self.name}"


async def sample(
    admin: Any, data_dir: Path, v: Variant, log: ProducedLog, acks_sent: int, t: float
) -> dict[str, Any]:
    """One row: the group's stats, its persisted progress and the client's healthy backlog."""
    s = await group_stats(admin, v.group)
    p: PersistedProgress = await asyncio.to_thread(read_progress, data_dir, v.group)
    return {
        "t_s": round(t, 1),
        "produced": len(log.keys),
        "lag": sum(q["lag"] for q in s["queues"]),
        "lag_excluding_parked": s["lag_excluding_parked"],
        "healthy_backlog": log.healthy - acks_sent,
        "oldest_unfinished_age_ms": s["oldest_unfinished_age_ms"],
        "parked_keys": s["parked_keys"],
        "blocked_keys": s["blocked_keys"],
        "buffered": s["buffered"],
        "in_flight": s["in_flight"],
        "progress_bytes": p.bytes,
        "open_ranges": p.open_ranges,
        "parked_entries": p.parked,
        "old_form_ranges": p.finished_ranges,
        "load_1m": load_average(),
    }


async def stall_phase(args: Any, server: ServerProcess, variants: list[Variant]) -> ProducedLog:
    """Produce and consume with stalled keys for ``args.seconds``, sampling every
    ``args.every`` s; then finish the healthy backlog and stop the pullers."""
    log = ProducedLog(args.stalled)
    async with client(server.url) as admin:
        await create_topic(admin, TOPIC, args.queues)
        for v in variants:
            config = {**v.config, "max_buffered": args.max_buffered}
            await put_group(admin, v.group, TOPIC, "key", **config)
        stop_produce, stop_pull = asyncio.Event(), asyncio.Event()
        tasks = [
            asyncio.create_task(
                steady_produce(server.url, TOPIC, args.rate, args.keys, log, stop_produce)
            )
        ]
        for v in variants:
            tasks += [
                asyncio.create_task(pull_loop(server.url, v.group, v.before, stop_pull))
                for _ in range(args.pullers)
            ]
        t0 = time.perf_counter()
        try:
            for tick in range(1, int(args.seconds // args.every) + 1):
                await asyncio.sleep(max(0.0, t0 + tick * args.every - time.perf_counter()))
                raise_failed(tasks)
                for v in variants:
                    row = await sample(
                        admin,
                        server.data_dir,
                        v,
                        log,
                        len(v.before.ack_sent),
                        time.perf_counter() - t0,
                    )
                    v.samples.append(row)
                    progress(
                        f"{v.name:10s} t={row['t_s']:6.1f}s produced {row['produced']:,} "
                        f"lag {row['lag']:,} lag_excl {row['lag_excluding_parked']:,} "
                        f"healthy backlog {row['healthy_backlog']:,} parked "
                        f"{row['parked_keys']} progress {row['progress_bytes']:,} B "
                        f"({row['open_ranges']} open, {row['parked_entries']} parked) "
                        f"load {row['load_1m']}"
                    )
            stop_produce.set()
            await tasks[0]
            for v in variants:
                await wait_true(
                    f"{v.name}: every healthy message acked",
                    v.before.acked_all(log.healthy_refs()),
                    tasks,
                    args.drain_timeout,
                )
                row = await sample(
                    admin, server.data_dir, v, log, len(v.before.ack_sent), time.perf_counter() - t0
                )
                v.samples.append({**row, "note": "drained"})
        finally:
            stop_produce.set()
            stop_pull.set()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        errors = [e for e in outcomes if isinstance(e, Exception)]
        if errors:
            raise errors[0]
    return log


async def restart_phase(
    args: Any, server: ServerProcess, variants: list[Variant], log: ProducedLog
) -> None:
    """After the restart: take everything the groups hand out until every healthy message
    not acked before is acked, then ``args.settle`` seconds more; record replays."""
    healthy = log.healthy_refs()
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(pull_loop(server.url, v.group, v.after, stop))
        for v in variants
        for _ in range(args.pullers)
    ]
    t0 = time.perf_counter()
    try:
        for v in variants:
            todo = healthy - v.before.acked
            v.restart["healthy_to_finish"] = len(todo)
            await wait_true(
                f"{v.name}: healthy messages finished after the restart",
                v.after.acked_all(todo),
                tasks,
                args.drain_timeout,
            )
            v.restart["healthy_finished_s"] = round(time.perf_counter() - t0, 2)
        await asyncio.sleep(args.settle)
        async with client(server.url) as admin:
            for v in variants:
                sent = len(v.before.ack_sent | v.after.ack_sent)
                t = time.perf_counter() - t0
                v.restart["stats"] = await sample(admin, server.data_dir, v, log, sent, t)
    finally:
        stop.set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [e for e in outcomes if isinstance(e, Exception)]
    if errors:
        raise errors[0]
    for v in variants:
        replayed = v.after.delivered & v.before.acked
        v.restart.update(
            replayed_acked=len(replayed),
            replayed_examples=sorted(replayed)[:10],
            missing=len(healthy - v.before.acked - v.after.acked),
            deliveries=v.after.deliveries,
            stalled_deliveries=v.after.stalled_deliveries,
            never_acked_delivered=len(v.after.delivered - v.before.acked),
            order_violations=v.after.order_violations,
        )


def run(args: Any) -> dict[str, Any]:
    variants = [
        Variant(
            name,
            VARIANTS[name][0],
            VARIANTS[name][1],
            GroupLedger(args.stalled, VARIANTS[name][0]),
            GroupLedger(args.stalled, VARIANTS[name][0]),
        )
        for name in args.variants
    ]
    root = Path(tempfile.mkdtemp(prefix="cproxy-stall-"))
    out: dict[str, Any] = {}
    try:
        server = ServerProcess(root / "data", log_level="info")
        out["commit"] = server.source.commit
        try:
            server.start()
            log = run_loop(lambda: stall_phase(args, server, variants))
            server.stop()  # SIGTERM: progress is persisted on the way out
            # uvicorn re-raises SIGTERM after its graceful shutdown (exit code -15): the
            # broker's last log line is what tells a graceful stop from a kill.
            out["graceful_stop"] = "broker stopped" in server.log()
        except BaseException:
            progress(server.log())
            raise
        finally:
            server.stop()
        for v in variants:
            p = read_progress(server.data_dir, v.group)
            v.restart["persisted_at_stop"] = p.__dict__ | {"entries": p.entries}
        again = ServerProcess(root / "data", log_level="info")
        try:
            again.start()
            run_loop(lambda: restart_phase(args, again, variants, log))
        except BaseException:
            progress(again.log())
            raise
        finally:
            again.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["produced"] = len(log.keys)
    out["healthy_produced"] = log.healthy
    out["late_batches"] = log.late_batches
    out["variants"] = {
        v.name: {
            "config": {**v.config, "max_buffered": args.max_buffered},
            "samples": v.samples,
            "restart": v.restart,
            "unknown_acks": v.before.unknown_acks,
            "order_violations": v.before.order_violations,
        }
        for v in variants
    }
    return out


def verdict(name: str, v: dict[str, Any], args: Any) -> dict[str, Any]:
    """The figures the acceptance point asks for, from one variant's samples and restart."""
    during = [s for s in v["samples"] if "note" not in s]
    half = [s for s in during if s["t_s"] >= during[-1]["t_s"] / 2]
    entries = [s["open_ranges"] + s["parked_entries"] + s["old_form_ranges"] for s in during]
    excess = [s["lag_excluding_parked"] - s["healthy_backlog"] for s in during]
    last = during[-1]
    return {
        "variant": name,
        "stalled_keys": args.stalled_keys,
        "entry_bound": args.max_buffered + args.stalled_keys,
        "max_entries": max(entries),
        "max_bytes": max(s["progress_bytes"] for s in during),
        "bytes_2nd_half": (
            min(s["progress_bytes"] for s in half),
            max(s["progress_bytes"] for s in half),
        ),
        "bytes_at_end": last["progress_bytes"],
        "bytes_per_stalled_key": round(last["progress_bytes"] / max(1, args.stalled_keys), 1),
        "persisted_at_stop": v["restart"]["persisted_at_stop"],
        "lag_at_end": last["lag"],
        "lag_excluding_parked_at_end": last["lag_excluding_parked"],
        "max_lag_excluding_parked": max(s["lag_excluding_parked"] for s in during),
        "lag_excl_minus_healthy_backlog": (min(excess), max(excess)),
        "parked_keys_at_end": last["parked_keys"],
        "replayed_acked": v["restart"]["replayed_acked"],
        "missing": v["restart"]["missing"],
    }


def report(out: dict[str, Any], args: Any) -> str:
    cols = [
        ("t s", "t_s"),
        ("produced", "produced"),
        ("lag", "lag"),
        ("lag_excluding_parked", "lag_excluding_parked"),
        ("healthy backlog (client)", "healthy_backlog"),
        ("oldest unfinished s", "oldest_unfinished_age_ms"),
        ("parked keys", "parked_keys"),
        ("blocked keys", "blocked_keys"),
        ("buffered", "buffered"),
        ("progress bytes", "progress_bytes"),
        ("open ranges", "open_ranges"),
        ("parked entries", "parked_entries"),
    ]
    lines = [
        f"## Progress under a long stall (commit {out['commit']})",
        "",
        f"{out['produced']:,} messages at {args.rate:,.0f} msgs/s for {args.seconds:.0f} s over "
        f"{args.keys:,} keys on {args.queues} queues; {args.stalled_keys} stalled keys (every "
        f"{args.stall_every}th); {out['healthy_produced']:,} healthy messages; "
        f"{args.pullers} pullers per group; max_buffered {args.max_buffered}; "
        f"{out['late_batches']} late produce batches; the first server stopped gracefully on "
        f"SIGTERM: {out['graceful_stop']}.",
    ]
    for name, v in out["variants"].items():
        rows = []
        for s in v["samples"]:
            age = s["oldest_unfinished_age_ms"]
            row = {**s, "oldest_unfinished_age_ms": "-" if age is None else round(age / 1000, 1)}
            if "note" in s:
                row["t_s"] = f"{s['t_s']} ({s['note']})"
            rows.append([row[k] for _, k in cols])
        r, d = v["restart"], verdict(name, v, args)
        at_stop = d["persisted_at_stop"]
        lines += [
            "",
            f"### {name}: {v['config']}",
            "",
            markdown_table([h for h, _ in cols], rows),
            "",
            f"- **Persisted progress** (bound: open ranges + parked entries ≤ max_buffered + "
            f"stalled keys = {d['entry_bound']:,}): at most {d['max_entries']:,} entries / "
            f"{d['max_bytes']:,} bytes; {d['bytes_2nd_half'][0]:,} to {d['bytes_2nd_half'][1]:,} "
            f"bytes over the second half; {d['bytes_at_end']:,} bytes at the end = "
            f"{d['bytes_per_stalled_key']} bytes per stalled key; after SIGTERM "
            f"{at_stop['bytes']:,} bytes ({at_stop['open_ranges']} open ranges, "
            f"{at_stop['parked']} parked entries, {at_stop['finished_ranges']} old-form ranges).",
            f"- **Lag**: `lag` {d['lag_at_end']:,} at the end of the stall; "
            f"`lag_excluding_parked` {d['lag_excluding_parked_at_end']:,} (max "
            f"{d['max_lag_excluding_parked']:,}); `lag_excluding_parked` minus the client's "
            f"healthy backlog within {d['lag_excl_minus_healthy_backlog'][0]:,} to "
            f"{d['lag_excl_minus_healthy_backlog'][1]:,} (the stalled heads themselves are "
            f"unfinished: {args.stalled_keys} keys).",
            f"- **Restart** (SIGTERM, same data dir): {r['deliveries']:,} deliveries in the "
            f"first {r['healthy_finished_s']} s + {args.settle} s settle; "
            f"{r['stalled_deliveries']:,} of stalled keys, {r['never_acked_delivered']:,} "
            f"distinct messages never acked before ({r['healthy_to_finish']:,} healthy ones "
            f"were left); **replayed acked messages: {r['replayed_acked']}**; missing healthy: "
            f"{r['missing']}; order violations {r['order_violations']}. After the restart: "
            f"parked keys {r['stats']['parked_keys']}, lag {r['stats']['lag']:,}, "
            f"lag_excluding_parked {r['stats']['lag_excluding_parked']:,}, progress "
            f"{r['stats']['progress_bytes']:,} bytes.",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = arg_parser(__doc__, "30 s, 1,000 keys, max_buffered 200, samples every 5 s (~45 s)")
    parser.add_argument("--seconds", type=float, help="stall duration (default 300; 30)")
    parser.add_argument("--rate", type=float, default=1000.0, help="msgs/s produced")
    parser.add_argument("--keys", type=int, help="default 10,000 (1,000 with --quick)")
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--stall-every", type=int, default=100, help="k %% N == 0 stalls (1%%)")
    parser.add_argument("--pullers", type=int, default=2, help="per group")
    parser.add_argument("--max-buffered", type=int, help="per group (default 1,000; 200)")
    parser.add_argument("--every", type=float, help="sample interval, s (default 10; 5)")
    parser.add_argument("--variants", default="never-ack,fail-block", help="comma-separated")
    parser.add_argument("--settle", type=float, default=3.0, help="s pulled after the restart")
    parser.add_argument("--drain-timeout", type=float, default=120.0, help="s")
    args = parser.parse_args()
    args.seconds = args.seconds or (30.0 if args.quick else 300.0)
    args.keys = args.keys or (1_000 if args.quick else 10_000)
    args.max_buffered = args.max_buffered or (200 if args.quick else 1_000)
    args.every = args.every or (5.0 if args.quick else 10.0)
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")
    every = args.stall_every
    args.stalled = lambda k: k % every == 0
    args.stalled_keys = sum(1 for k in range(args.keys) if args.stalled(k))
    facts = machine_facts()
    out = run(args)
    out["machine"] = facts
    out["verdicts"] = {name: verdict(name, v, args) for name, v in out["variants"].items()}
    finish(out, args, "stall_progress", report(out, args))


if __name__ == "__main__":
    main()
