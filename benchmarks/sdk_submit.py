"""Background batching (``Producer.submit``) against one call per message (``send``).

One server; each round runs both contenders in rotating order on a fresh topic:

- ``send``: sequential ``Producer.send``, one HTTP call per message (the baseline);
- ``submit``: ``--threads`` threads calling ``Producer.submit`` over ``--keys`` shared keys,
  then ``flush()``: every future resolved.

Reported: median msgs/s, the median of per-round ratios submit/send (target >= 5), and client
CPU per message. ``send`` is timed on ``--send-messages`` (fewer: it is slow by design).

    python -m benchmarks.sdk_submit --quick          # 2 rounds
    python -m benchmarks.sdk_submit --messages 40000 --rounds 5
"""

from __future__ import annotations

import threading
import time

from benchmarks.harness.report import arg_parser, finish, interleaved, machine_facts, median, table
from benchmarks.harness.server import servers
from consumer_sdk import Producer


def run_send(url: str, topic: str, n: int, keys: int) -> float:
    with Producer(url) as producer:
        producer.create_topic(topic, 8)
        start = time.perf_counter()
        for i in range(n):
            producer.send(topic, {"n": i, "pad": "x" * 64}, key=f"k{i % keys}")
        return time.perf_counter() - start


def run_submit(url: str, topic: str, n: int, keys: int, threads: int) -> float:
    with Producer(url) as producer:
        producer.create_topic(topic, 8)
        per = n // threads

        def work(t: int) -> None:
            for i in range(per):
                producer.submit(topic, {"t": t, "n": i, "pad": "x" * 64}, key=f"k{i % keys}")

        start = time.perf_counter()
        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        left = producer.flush(120)
        elapsed = time.perf_counter() - start
        assert left == 0, f"{left} futures unresolved"
        return elapsed


def main() -> None:
    parser = arg_parser(__doc__, "2 rounds, 20,000 submitted, 1,000 sent")
    parser.add_argument("--messages", type=int, help="submitted per round (default 20,000)")
    parser.add_argument("--send-messages", type=int, default=1_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n = args.messages or 20_000
    rounds = 2 if args.quick else args.rounds
    facts = machine_facts()

    def one(name: str, rnd: int) -> tuple[float, float]:
        count, cpu = (args.send_messages if name == "send" else n), time.process_time()
        if name == "send":
            elapsed = run_send(server.url, f"send-{rnd}", count, args.keys)
        else:
            elapsed = run_submit(server.url, f"submit-{rnd}", count, args.keys, args.threads)
        return count / elapsed, (time.process_time() - cpu) / count * 1e6

    with servers("cproxy-submit-") as (server,):
        runs = interleaved(["send", "submit"], rounds, one)
    rate = {name: [r for r, _ in rs] for name, rs in runs.items()}
    ratio = median([a / b for a, b in zip(rate["submit"], rate["send"], strict=True)])
    rows = [{"producer": name, "msgs_per_s": median(rate[name]),
             "cpu_us": median([c for _, c in rs])} for name, rs in runs.items()]  # fmt: skip
    out = {"machine": facts, "rounds": rounds, "results": rows, "submit_over_send": ratio}
    text = table(
        [
            ("producer", lambda r: r["producer"]),
            ("msgs/s", lambda r: f"{r['msgs_per_s']:,.0f}"),
            ("client CPU per msg", lambda r: f"{r['cpu_us']:.1f} µs"),
        ],
        rows,
    )
    header = (
        f"## Producer.submit ({args.threads} threads, {n:,} messages) against sequential send "
        f"({args.send_messages:,}), {args.keys} keys, median of {rounds} rounds: "
        f"submit/send = {ratio:.1f}x (target >= 5)"
    )
    finish(out, args, "sdk_submit", f"{header}\n\n{text}")


if __name__ == "__main__":
    main()
