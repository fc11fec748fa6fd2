"""Reporting: machine facts, statistics (medians, percentiles, ratios) and markdown tables,
plus the common ending of every scenario script (print the report, write ``--json``)."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from cproxy import _native

T = TypeVar("T")
#: The repository this harness belongs to (the tree the load generator always comes from).
REPO = Path(__file__).resolve().parents[2]


def machine_facts() -> dict[str, Any]:
    """Python, CPU, cores, memory and the 1-minute load at call time."""
    import psutil

    cpu = [
        ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")
    ]
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "logical_cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu": cpu[0].split(":", 1)[1].strip() if cpu else None,
        "load_average_1m_at_start": load_average(),
        # What this tree's server runs: "compiled" once built (setup.py build_ext --inplace).
        "hot_path": _native.status(),
    }


def load_average() -> float:
    """The 1-minute load average (NaN where the OS has none)."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else float("nan")


def git_commit(tree: Path = REPO, ref: str = "HEAD") -> str:
    """Short commit of ``ref`` in ``tree``, plus ``+dirty(cproxy/)`` when measuring the work
    tree itself and ``cproxy/`` has uncommitted changes (what the server runs)."""

    def git(*cmd: str) -> str:
        return subprocess.run(
            ["git", *cmd], cwd=tree, capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short", ref)
        dirty = git("status", "--porcelain", "--", "cproxy") if ref == "HEAD" else ""
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty(cproxy/)" if dirty else "")


def median(values: Sequence[float]) -> float:
    """Median; NaN for no values (a cell that never ran shows as n/a, not as 0)."""
    return float(statistics.median(values)) if values else float("nan")


def geomean(values: Sequence[float]) -> float:
    """Geometric mean of positive ratios (the average of ratios that is symmetric in A/B)."""
    good = [v for v in values if v > 0 and not math.isnan(v)]
    return math.exp(sum(math.log(v) for v in good) / len(good)) if good else float("nan")


def ratio(b: float, a: float) -> float:
    return b / a if a and not math.isnan(a) else float("nan")


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted sequence (``q`` in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def percentiles(values: Sequence[float], digits: int = 1) -> dict[str, float]:
    """p50, p99, p99.9 and max of unsorted ``values`` (milliseconds in every caller)."""
    ordered = sorted(values)
    points = (("p50", 50.0), ("p99", 99.0), ("p999", 99.9), ("max", 100.0))
    return {name: round(percentile(ordered, q), digits) for name, q in points}


def cell(value: Any) -> str:
    """One table cell: thousands separators; floats to 1 decimal (2 below 10); NaN as n/a."""
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


Column = tuple[str, Callable[[Any], Any]]


def table(columns: Sequence[Column], items: Sequence[Any]) -> str:
    """A markdown table with one row per item; each column is (header, item -> value)."""
    return markdown_table([h for h, _ in columns], [[f(i) for _, f in columns] for i in items])


def pct(value: float) -> str:
    """A share as a whole percentage (``0.83`` -> ``83%``)."""
    return "n/a" if math.isnan(value) else f"{value:.0%}"


def progress(text: str) -> None:
    """One progress line on stderr (stdout carries only the markdown report)."""
    print(text, file=sys.stderr, flush=True)


def interleaved(
    names: Sequence[str], rounds: int, run: Callable[[str, int], T]
) -> dict[str, list[T]]:
    """``run(name, round)`` for every name once per round, the order rotating from round to
    round, so that a drift in the machine's load hits every name alike."""
    out: dict[str, list[T]] = {n: [] for n in names}
    for rnd in range(rounds):
        for name in [*names[rnd % len(names) :], *names[: rnd % len(names)]]:
            out[name].append(run(name, rnd))
            progress(f"round {rnd + 1} {name:16s} {out[name][-1]}")
    return out


def finish(out: dict[str, Any], args: argparse.Namespace, script: str, text: str) -> None:
    """Print the report with its command and load, and write ``out`` to ``--json`` if given."""
    out["command"] = " ".join([f"python -m benchmarks.{script}", *sys.argv[1:]])
    out["load_1m_at_end"] = load_average()
    print(text)
    facts = out.get("machine", {})
    print(
        f"\n(`{out['command']}`: load {facts.get('load_average_1m_at_start')} -> "
        f"{out['load_1m_at_end']}, {facts.get('cpu')}, {facts.get('logical_cores')} cores, "
        f"hot path {facts.get('hot_path')})"
    )
    if getattr(args, "json", None) is not None:
        args.json.write_text(json.dumps(out, indent=2, default=str))


def arg_parser(doc: str | None, quick_help: str, ab: bool = False) -> argparse.ArgumentParser:
    """A parser with the options every scenario has: ``--quick``, ``--json FILE`` and, for
    the server scenarios that compare versions, ``--ab REF``."""
    parser = argparse.ArgumentParser(
        description=(doc or "").split("\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    if ab:
        parser.add_argument(
            "--ab",
            metavar="REF",
            help="also run a server from git REF (B, in a temporary worktree) and interleave\n"
            "its rounds with this tree's (A); report medians and ratios B/A. ':pure': B is\n"
            "this tree with its compiled hot path run from source (CPROXY_PURE_PYTHON=1);\n"
            "':memory': B is this tree on the in-memory store (no storage at all)",
        )
    return parser
