"""A/B in one run: the machines are shared and noisy, so two versions of the server are
compared side by side: every item (a matrix cell) runs once per side per round, in the order
A,B or B,A alternating; the report gives medians per side and their ratio B/A. The load
generator always comes from this tree; only the servers differ."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from benchmarks.harness.load import client
from benchmarks.harness.report import Column, geomean, median, progress, ratio, table
from benchmarks.harness.server import ServerProcess
from consumer_sdk import AsyncClient

Item = TypeVar("Item")
Results = dict[str, dict[str, list[dict[str, Any]]]]  # side label -> item name -> runs


@dataclass
class Side:
    """One server under test with its admin client."""

    server: ServerProcess
    admin: AsyncClient

    @property
    def label(self) -> str:
        return self.server.source.label

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def pid(self) -> int:
        return self.server.pid


@contextlib.asynccontextmanager
async def sides(servers: Sequence[ServerProcess]) -> AsyncIterator[list[Side]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [Side(s, await stack.enter_async_context(client(s.url))) for s in servers]


async def rounds(
    the_sides: Sequence[Side],
    items: Sequence[Item],
    repeat: int,
    name: Callable[[Item], str],
    run_one: Callable[[Side, Item, str], Awaitable[dict[str, Any]]],
    describe: Callable[[dict[str, Any]], str],
) -> Results:
    """Run every item on every side ``repeat`` times, interleaved; ``run_one(side, item, tag)``
    returns one result dict (``tag`` is unique per round and side, for topic names)."""
    out: Results = {s.label: {name(i): [] for i in items} for s in the_sides}
    for rnd in range(repeat):
        shift = rnd % len(items)
        for n, item in enumerate([*items[shift:], *items[:shift]]):
            order = list(the_sides) if (rnd + n) % 2 == 0 else list(reversed(the_sides))
            for side in order:
                r = await run_one(side, item, f"r{rnd}{side.label}")
                out[side.label][name(item)].append(r)
                progress(f"round {rnd + 1} {side.label} {name(item):24s} {describe(r)}")
    return out


def ab_report(
    results: Results,
    names: Sequence[str],
    metrics: Sequence[tuple[str, str]],
    commits: dict[str, str],
) -> str:
    """Per item and metric: median A, median B, B/A; last row: geometric mean of the B/A
    ratios over the items. ``metrics`` are (header, result key)."""
    a, b = results["A"], results["B"]

    def med(side: dict[str, list[dict[str, Any]]], item: str, key: str) -> float:
        return median([r[key] for r in side[item]])

    rows: list[dict[str, Any]] = []
    for item in names:
        row: dict[str, Any] = {"item": item, "runs": len(a[item])}
        for _, key in metrics:
            ma, mb = med(a, item, key), med(b, item, key)
            row |= {f"A {key}": ma, f"B {key}": mb, f"ratio {key}": ratio(mb, ma)}
        rows.append(row)
    overall: dict[str, Any] = {"item": "**all (geometric mean)**", "runs": ""}
    for _, key in metrics:
        overall |= {f"A {key}": "", f"B {key}": ""}
        overall[f"ratio {key}"] = geomean([r[f"ratio {key}"] for r in rows])
    columns = [_column("item", "item", str), _column("runs per side", "runs", str)]
    for header, key in metrics:
        columns += [
            _column(f"A {header}", f"A {key}", _num),
            _column(f"B {header}", f"B {key}", _num),
            _column(f"**B/A** {header}", f"ratio {key}", _ratio),
        ]
    return "\n".join(
        [
            f"A = this tree ({commits['A']}), B = {commits['B']}; medians per side; "
            "rounds interleaved A,B / B,A.",
            "",
            table(columns, [*rows, overall]),
        ]
    )


def _column(header: str, key: str, fmt: Callable[[Any], Any]) -> Column:
    return (header, lambda row: fmt(row[key]))


def _num(v: Any) -> Any:
    return f"{v:,.0f}" if isinstance(v, float) else v


def _ratio(v: Any) -> Any:
    return f"{v:.3f}" if isinstance(v, float) else v
