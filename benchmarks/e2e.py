"""End-to-end benchmark: a real ``cproxy serve`` subprocess driven over HTTP.

Phases (each on its own topic and group, order_by key, 1,000 keys):

0. memory (first, on a fresh server): resident memory at start, after producing 100k
   messages with no group, with those 100k buffered by a group (``max_buffered=200000``) that
   has read them in but consumes nothing, and after deleting that group; RSS is read again at
   the very end, when every group is drained;
1. produce: M messages in batches of 100 from several concurrent async producers;
2. consume: N async pullers (``max_messages=100``, acks piggybacked on the next pull) drain
   the group; end-to-end = M / (produce time + consume time);
3. mixed: producers and pullers run at the same time on a fresh topic (M messages, first
   produce to last ack);
4. latency: long-polling pullers (``wait_ms=5000``) are waiting; a producer sends at a fixed
   rate (open loop) in small batches; per message, delivery time - ``produced_at_ms``
   (the server's store time) and delivery time - client send time.

Client and server share the machine: on few cores the numbers are a floor, not a ceiling.

    .venv/bin/python -m benchmarks.e2e --quick               # < 1 minute
    .venv/bin/python -m benchmarks.e2e --messages 200000 --json out.json
    .venv/bin/python -m benchmarks.e2e --quick --profile /tmp/prof   # py-spy per phase
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

try:
    from benchmarks._common import (
        ServerProcess,
        machine_facts,
        markdown_table,
        percentile,
    )
except ImportError:  # run as a script: benchmarks/ is on sys.path
    from _common import (  # type: ignore[no-redef,import-not-found,unused-ignore]
        ServerProcess,
        machine_facts,
        markdown_table,
        percentile,
    )

KEYS = 1000
JSON = {"content-type": "application/json"}


# -- producing ---------------------------------------------------------------------------------
def build_batches(total: int, batch: int, body_bytes: int, ids: bool, tag: str) -> list[bytes]:
    """Pre-encoded produce request bodies: message i has key i % 1000 and seq i // 1000."""
    pad = "x" * max(0, body_bytes - 40)
    out = []
    for start in range(0, total, batch):
        messages = []
        for i in range(start, min(total, start + batch)):
            m: dict[str, Any] = {
                "key": f"key-{i % KEYS}",
                "body": {"k": i % KEYS, "seq": i // KEYS, "p": pad},
            }
            if ids:
                m["id"] = f"{tag}-{i}"
            messages.append(m)
        out.append(orjson.dumps({"messages": messages}))
    return out


def key_stride(batch: int) -> int:
    """Batches ``b`` and ``b + stride`` are the first to share keys (message i has key i % 1000)."""
    return KEYS // batch if batch <= KEYS and KEYS % batch == 0 else 1


async def produce(url: str, topic: str, batches: list[bytes], producers: int, batch: int) -> float:
    """Send every batch through ``producers`` concurrent clients; returns elapsed seconds.

    Per-key order is kept: a batch is sent only once the previous batch holding the same keys
    was stored, so consumers can check that seq numbers arrive in order.
    """
    it = iter(enumerate(batches))
    stride = key_stride(batch)
    stored = [asyncio.Event() for _ in batches]

    async def worker() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            for b, body in it:
                if b >= stride:
                    await stored[b - stride].wait()
                r = await client.post(f"/v1/topics/{topic}/messages", content=body, headers=JSON)
                if r.status_code != 200:
                    raise RuntimeError(f"produce {r.status_code}: {r.text[:300]}")
                stored[b].set()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(producers)))
    return time.perf_counter() - started


# -- consuming ---------------------------------------------------------------------------------
@dataclass
class ConsumeState:
    total: int
    delivered: int = 0
    order_violations: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    done_at: float = 0.0
    last_flush_at: float = 0.0
    last_seq: dict[int, int] = field(default_factory=dict)
    pulls: int = 0
    empty_pulls: int = 0


async def puller(
    url: str,
    group: str,
    state: ConsumeState,
    max_messages: int,
    wait_ms: int,
    on_messages: Callable[[list[dict[str, Any]]], None] | None = None,
) -> None:
    """Pull, hand the batch to ``on_messages``, ack it on the next pull; flush when done."""
    pending: dict[tuple[str, int], list[int]] = defaultdict(list)
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        while True:
            results = [{"topic": t, "qid": q, "acks": offs} for (t, q), offs in pending.items()]
            if state.done.is_set():
                if results:
                    r = await client.post(
                        f"/v1/groups/{group}/ack",
                        content=orjson.dumps({"results": results}),
                        headers=JSON,
                    )
                    r.raise_for_status()
                    state.last_flush_at = max(state.last_flush_at, time.perf_counter())
                return
            body = {"max_messages": max_messages, "wait_ms": wait_ms, "results": results}
            r = await client.post(
                f"/v1/groups/{group}/pull", content=orjson.dumps(body), headers=JSON
            )
            if r.status_code != 200:
                raise RuntimeError(f"pull {r.status_code}: {r.text[:300]}")
            messages = orjson.loads(r.content)["messages"]
            state.pulls += 1
            pending = defaultdict(list)
            if not messages:
                state.empty_pulls += 1
                continue
            if on_messages is not None:
                on_messages(messages)
            for m in messages:
                pending[(m["topic"], m["qid"])].append(m["offset"])
                body_ = m["body"]
                k, seq = body_["k"], body_["seq"]
                if state.last_seq.get(k, -1) >= seq and m["attempt"] == 1:
                    state.order_violations += 1
                state.last_seq[k] = seq
            state.delivered += len(messages)
            if state.delivered >= state.total and not state.done.is_set():
                state.done_at = time.perf_counter()
                state.done.set()


async def consume(
    url: str,
    group: str,
    total: int,
    pullers: int,
    max_messages: int,
    wait_ms: int = 500,
    on_messages: Callable[[list[dict[str, Any]]], None] | None = None,
) -> tuple[float, ConsumeState]:
    """Drain ``total`` messages; returns (seconds until the last ack was applied, state)."""
    state = ConsumeState(total)
    started = time.perf_counter()
    await asyncio.gather(
        *(puller(url, group, state, max_messages, wait_ms, on_messages) for _ in range(pullers))
    )
    return max(state.done_at, state.last_flush_at) - started, state


# -- server helpers ----------------------------------------------------------------------------
async def setup(
    client: httpx.AsyncClient, topic: str, queues: int, group: str | None, **group_config: Any
) -> None:
    r = await client.post("/v1/topics", json={"name": topic, "queues": queues})
    r.raise_for_status()
    if group is not None:
        await put_group(client, group, topic, **group_config)


async def put_group(client: httpx.AsyncClient, group: str, topic: str, **group_config: Any) -> None:
    r = await client.put(
        f"/v1/groups/{group}", json={"topics": {topic: {"order_by": "key"}}, **group_config}
    )
    r.raise_for_status()


async def group_stats(client: httpx.AsyncClient, group: str) -> dict[str, Any]:
    r = await client.get(f"/v1/groups/{group}")
    r.raise_for_status()
    stats: dict[str, Any] = r.json()["stats"]
    return stats


async def wait_drained(client: httpx.AsyncClient, group: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        s = await group_stats(client, group)
        if all(q["lag"] == 0 for q in s["queues"]) and s["in_flight"] == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"group {group} not drained: {s}")
        await asyncio.sleep(0.05)


class Probe:
    """Server CPU seconds and client CPU seconds over a phase, optionally a py-spy profile."""

    def __init__(self, pid: int, profile_dir: Path | None, name: str) -> None:
        self.server = psutil.Process(pid)
        self.me = psutil.Process()
        self.profile_dir = profile_dir
        self.name = name
        self.spy: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Probe:
        if self.profile_dir is not None:
            spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            self.spy = subprocess.Popen(
                [
                    spy,
                    "record",
                    "--nonblocking",
                    "--rate",
                    "250",
                    "--format",
                    "raw",
                    "-o",
                    str(self.profile_dir / f"{self.name}.txt"),
                    "-p",
                    str(self.server.pid),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)  # let it attach
        self.t0 = time.perf_counter()
        self.s0 = self._cpu(self.server)
        self.c0 = self._cpu(self.me)
        return self

    @staticmethod
    def _cpu(p: psutil.Process) -> float:
        t = p.cpu_times()
        return float(t.user + t.system)

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t0
        self.server_cpu = self._cpu(self.server) - self.s0
        self.client_cpu = self._cpu(self.me) - self.c0
        if self.spy is not None:
            self.spy.send_signal(signal.SIGINT)
            try:
                self.spy.wait(30)
            except subprocess.TimeoutExpired:
                self.spy.kill()

    def row(self) -> dict[str, float]:
        return {
            "wall_s": round(self.wall, 3),
            "server_cpu_s": round(self.server_cpu, 3),
            "client_cpu_s": round(self.client_cpu, 3),
        }


def rss(pid: int) -> dict[str, float]:
    p = psutil.Process(pid)
    info = p.memory_info()
    out = {"rss_mib": info.rss / 2**20}
    shared = getattr(info, "shared", None)
    if shared is not None:
        # File-backed pages (SQLite mmap, shared libraries) count in RSS; anon is the heap.
        out["anon_mib"] = (info.rss - shared) / 2**20
    return {k: round(v, 1) for k, v in out.items()}


# -- phases ------------------------------------------------------------------------------------
async def run(args: argparse.Namespace, server: ServerProcess) -> dict[str, Any]:
    url = server.url
    pid = server.pid
    out: dict[str, Any] = {
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    }
    out["memory_baseline"] = rss(pid)
    M = args.messages
    prof = args.profile
    async with httpx.AsyncClient(base_url=url, timeout=60) as admin:
        # Memory first, on a fresh process, so earlier phases do not blur it.
        out["memory"] = await memory_phase(args, url, admin, pid)

        # 1. produce, 2. consume
        buffer = {} if args.max_buffered is None else {"max_buffered": args.max_buffered}
        await setup(admin, "tput", args.queues, "tput-g", **buffer)
        batches = build_batches(M, args.batch, args.body_bytes, args.ids, "tput")
        with Probe(pid, prof, "produce") as p:
            produce_s = await produce(url, "tput", batches, args.producers, args.batch)
        out["produce"] = {
            "messages": M,
            "seconds": round(produce_s, 3),
            "msgs_per_s": round(M / produce_s),
            **p.row(),
        }
        with Probe(pid, prof, "consume") as p:
            consume_s, state = await consume(url, "tput-g", M, args.pullers, 100)
        await wait_drained(admin, "tput-g")
        out["consume"] = {
            "messages": state.delivered,
            "seconds": round(consume_s, 3),
            "msgs_per_s": round(M / consume_s),
            "pulls": state.pulls,
            "empty_pulls": state.empty_pulls,
            "order_violations": state.order_violations,
            **p.row(),
        }
        out["e2e_sequential"] = {"msgs_per_s": round(M / (produce_s + consume_s))}

        # 3. mixed: produce and consume at the same time
        await setup(admin, "mixed", args.queues, "mixed-g", **buffer)
        batches = build_batches(M, args.batch, args.body_bytes, args.ids, "mixed")
        with Probe(pid, prof, "mixed") as p:
            started = time.perf_counter()
            (_, (_, mstate)) = await asyncio.gather(
                produce(url, "mixed", batches, args.producers, args.batch),
                consume(url, "mixed-g", M, args.pullers, 100),
            )
            mixed_s = max(mstate.done_at, mstate.last_flush_at) - started
        await wait_drained(admin, "mixed-g")
        out["mixed"] = {
            "messages": M,
            "seconds": round(mixed_s, 3),
            "msgs_per_s": round(M / mixed_s),
            "order_violations": mstate.order_violations,
            **p.row(),
        }

        # 4. latency under a fixed produce rate
        out["latency"] = await latency_phase(args, url, admin, pid)

        # Every group is drained now: what the server still holds.
        buffered = 0
        for g in ("tput-g", "mixed-g", "lat-g"):
            buffered += (await group_stats(admin, g))["buffered"]
        out["memory_end"] = {**rss(pid), "buffered": buffered}
    return out


async def latency_phase(
    args: argparse.Namespace, url: str, admin: httpx.AsyncClient, pid: int
) -> dict[str, Any]:
    await setup(admin, "lat", args.queues, "lat-g")
    rate, batch = args.rate, args.rate_batch
    n_batches = max(1, int(args.latency_seconds * rate / batch))
    total = n_batches * batch
    store_ms: list[float] = []
    send_ms: list[float] = []
    call_ms: list[float] = []

    def record(messages: list[dict[str, Any]]) -> None:
        now_ns = time.time_ns()
        for m in messages:
            store_ms.append(now_ns / 1e6 - m["produced_at_ms"])
            send_ms.append((now_ns - m["body"]["t"]) / 1e6)

    consumers = asyncio.ensure_future(
        consume(url, "lat-g", total, args.pullers, 100, wait_ms=5000, on_messages=record)
    )
    await asyncio.sleep(0.5)  # the pullers are now parked in their long polls
    late = 0
    outstanding = asyncio.Semaphore(64)
    tasks: list[asyncio.Task[None]] = []
    stride = key_stride(batch)

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def send(i: int) -> None:
            if i >= stride:  # per-key order: the batch before with these keys is stored
                await tasks[i - stride]
            async with outstanding:
                messages = [
                    {
                        "key": f"key-{(i * batch + j) % KEYS}",
                        "body": {
                            "k": (i * batch + j) % KEYS,
                            "seq": (i * batch + j) // KEYS,
                            "t": time.time_ns(),
                        },
                    }
                    for j in range(batch)
                ]
                t = time.perf_counter()
                r = await client.post(
                    "/v1/topics/lat/messages",
                    content=orjson.dumps({"messages": messages}),
                    headers=JSON,
                )
                call_ms.append((time.perf_counter() - t) * 1000)
                r.raise_for_status()

        with Probe(pid, args.profile, "latency") as p:
            interval = batch / rate
            t0 = time.perf_counter()
            for i in range(n_batches):
                delay = t0 + i * interval - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -interval:
                    late += 1
                tasks.append(asyncio.create_task(send(i)))  # open loop: never wait on a reply
            send_s = time.perf_counter() - t0
            await asyncio.gather(*tasks)
            _, state = await consumers
    await wait_drained(admin, "lat-g")
    store_ms.sort()
    send_ms.sort()
    call_ms.sort()

    def pct(values: list[float]) -> dict[str, float]:
        return {
            "p50": round(percentile(values, 50), 2),
            "p99": round(percentile(values, 99), 2),
            "p999": round(percentile(values, 99.9), 2),
            "max": round(values[-1], 2),
        }

    return {
        "messages": total,
        "target_rate": rate,
        "batch": batch,
        "achieved_rate": round(total / send_s),
        "late_batches": late,
        "delivered": state.delivered,
        "order_violations": state.order_violations,
        "store_to_delivery_ms": pct(store_ms),
        "send_to_delivery_ms": pct(send_ms),
        "produce_call_ms": pct(call_ms),
        **p.row(),
    }


async def memory_phase(
    args: argparse.Namespace, url: str, admin: httpx.AsyncClient, pid: int
) -> dict[str, Any]:
    n = args.memory_messages
    result: dict[str, Any] = {"messages": n, "before": rss(pid)}
    await setup(admin, "mem", args.queues, None)
    batches = build_batches(n, args.batch, args.body_bytes, args.ids, "mem")
    await produce(url, "mem", batches, args.producers, args.batch)
    result["after_produce_no_group"] = rss(pid)
    started = time.perf_counter()
    await put_group(admin, "mem-g", "mem", max_buffered=200_000)
    deadline = time.monotonic() + 120
    while True:
        s = await group_stats(admin, "mem-g")
        if s["buffered"] >= n:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"group did not buffer {n} messages: {s}")
        await asyncio.sleep(0.05)
    result["read_in_seconds"] = round(time.perf_counter() - started, 3)
    await asyncio.sleep(0.5)  # let allocations settle
    result["buffered"] = {k: s[k] for k in ("buffered", "ready", "waiting")}
    result["after_buffering"] = after = rss(pid)
    (await admin.delete("/v1/groups/mem-g")).raise_for_status()
    result["after_group_deleted"] = rss(pid)
    base = result["after_produce_no_group"]
    result["bytes_per_buffered_message"] = round((after["rss_mib"] - base["rss_mib"]) * 2**20 / n)
    if "anon_mib" in after:
        result["anon_bytes_per_buffered_message"] = round(
            (after["anon_mib"] - base["anon_mib"]) * 2**20 / n
        )
    return result


# -- output ------------------------------------------------------------------------------------
def report(out: dict[str, Any], facts: dict[str, Any]) -> str:
    p, c, mx, lat, mem = (
        out["produce"],
        out["consume"],
        out["mixed"],
        out["latency"],
        out["memory"],
    )
    base = out["memory_baseline"]

    def cpu(x: dict[str, Any]) -> str:
        # CPU per message is steadier than msgs/s on a shared machine.
        per_msg = x["server_cpu_s"] / x["messages"] * 1e6
        return (
            f"server {per_msg:.0f} µs CPU/msg, {x['server_cpu_s'] / x['wall_s']:.0%} of a "
            f"core; client {x['client_cpu_s'] / x['wall_s']:.0%}"
        )

    rows = [
        (
            "produce",
            f"{p['messages']:,} msgs, batch {out['params']['batch']}, "
            f"{out['params']['producers']} producers",
            f"{p['msgs_per_s']:,} msgs/s",
            cpu(p),
        ),
        (
            "consume",
            f"{c['messages']:,} msgs, {out['params']['pullers']} pullers, "
            "max_messages 100, piggybacked acks",
            f"{c['msgs_per_s']:,} msgs/s",
            cpu(c),
        ),
        (
            "end-to-end (sequential)",
            "M / (produce s + consume s)",
            f"{out['e2e_sequential']['msgs_per_s']:,} msgs/s",
            "",
        ),
        (
            "end-to-end (mixed)",
            "produce and consume at once, first produce to last ack",
            f"{mx['msgs_per_s']:,} msgs/s",
            cpu(mx),
        ),
    ]
    for name in ("store_to_delivery_ms", "send_to_delivery_ms", "produce_call_ms"):
        d = lat[name]
        rows.append(
            (
                f"latency {name.removesuffix('_ms').replace('_', ' ')}",
                f"{lat['achieved_rate']:,}/s (target {lat['target_rate']:,}) in batches "
                f"of {lat['batch']}, {lat['messages']:,} msgs, wait_ms 5000",
                f"p50 {d['p50']} ms, p99 {d['p99']} ms, p99.9 {d['p999']} ms, max {d['max']} ms",
                cpu(lat) if name.startswith("store") else "",
            )
        )
    end = out["memory_end"]
    rows += [
        ("RSS at start", "idle server", f"{base['rss_mib']} MiB", f"anon {base.get('anon_mib')}"),
        (
            "RSS after producing",
            f"{mem['messages']:,} msgs stored, no group",
            f"{mem['after_produce_no_group']['rss_mib']} MiB",
            f"anon {mem['after_produce_no_group'].get('anon_mib')}",
        ),
        (
            "RSS with messages buffered",
            f"{mem['buffered']['buffered']:,} buffered "
            f"(read in {mem['read_in_seconds']} s), max_buffered 200,000",
            f"{mem['after_buffering']['rss_mib']} MiB",
            f"anon {mem['after_buffering'].get('anon_mib')}; "
            f"{mem['bytes_per_buffered_message']} B/msg RSS, "
            f"{mem.get('anon_bytes_per_buffered_message')} B/msg anon",
        ),
        (
            "RSS after deleting that group",
            "",
            f"{mem['after_group_deleted']['rss_mib']} MiB",
            f"anon {mem['after_group_deleted'].get('anon_mib')}",
        ),
        (
            "RSS at the end",
            f"all phases done, groups drained ({end['buffered']} buffered)",
            f"{end['rss_mib']} MiB",
            f"anon {end.get('anon_mib')}",
        ),
    ]
    violations = c["order_violations"] + mx["order_violations"] + lat["order_violations"]
    text = [
        "## cproxy end-to-end",
        "",
        markdown_table(["phase", "setup", "result", "notes"], rows),
        "",
        f"Per-key order violations observed by the clients: {violations}",
        "",
        "### Machine",
        "",
        markdown_table(["fact", "value"], [(k, v) for k, v in facts.items()]),
    ]
    return "\n".join(text)


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="20k messages, 5 s latency phase (< 1 minute)"
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=200_000,
        help="messages for the produce/consume/mixed phases",
    )
    parser.add_argument("--batch", type=int, default=100, help="messages per produce call")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--pullers", type=int, default=4)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--body-bytes", type=int, default=100)
    parser.add_argument("--ids", action="store_true", help="give every message an id (dedup)")
    parser.add_argument(
        "--max-buffered",
        type=int,
        help="max_buffered of the throughput groups (default: the server's)",
    )
    parser.add_argument("--rate", type=int, default=2000, help="latency phase msgs/s")
    parser.add_argument("--rate-batch", type=int, default=10, help="latency phase batch size")
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--memory-messages", type=int, default=100_000)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--profile", type=Path, help="record a py-spy profile (raw collapsed stacks) per phase here"
    )
    parser.add_argument(
        "--client-loop",
        choices=["uvloop", "asyncio"],
        default="uvloop" if _has_uvloop() else "asyncio",
        help="event loop of the benchmark client (default uvloop if installed)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the data dir")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages = min(args.messages, 20_000)
        args.latency_seconds = min(args.latency_seconds, 5.0)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    facts = machine_facts()
    root = Path(tempfile.mkdtemp(prefix="cproxy-bench-"))
    server = ServerProcess(root / "data")
    started = time.perf_counter()
    try:
        server.start()
        if args.client_loop == "uvloop":
            import uvloop

            out = uvloop.run(run(args, server))
        else:
            out = asyncio.run(run(args, server))
    except BaseException:
        print(server.log(), file=sys.stderr)
        raise
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if hasattr(os, "getloadavg"):
        facts["load_average_1m_at_end"] = round(os.getloadavg()[0], 2)
    out["machine"] = facts
    out["total_seconds"] = round(time.perf_counter() - started, 1)
    print(report(out, facts))
    print(f"\n(total {out['total_seconds']} s)")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
