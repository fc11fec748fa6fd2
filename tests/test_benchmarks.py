"""Every benchmark scenario runs end to end in a small mode and prints its report (the figures
are not checked here: they are measured, on purpose, elsewhere)."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks
from benchmarks.harness.load import client, consume, create_topic, make_batches, produce, put_group
from benchmarks.harness.server import MEMORY_REF, servers
from consumer_sdk import Client
from tests.store.conftest import pg_skip
from tests.store.pg_server import PgUnavailable, bin_dir
from tests.support import RunningServer

ROOT = Path(__file__).resolve().parents[1]

#: Scenario -> arguments that make it take seconds (on top of --quick).
SMALL = {
    "peers": ["--messages", "2000"],
    "latency": ["--seconds", "0.5", "--peak-cap", "4000", "--ab", ":pure"],
    "memory": ["--messages", "3000"],
    "dedup": ["--entries", "5000", "--appends", "50", "--ab", ":pure"],
    "longpoll": ["--pullers", "50", "--idle-s", "0.5", "--trickle-s", "0.5", "--rate", "20"],
    "push": ["--messages", "1000"],
    "cluster": ["--repeat", "1", "--latency-seconds", "1"],
    "spark_sink": ["--sizes", "5000", "--without-dedup"],
    "matrix": [
        "--sweeps",
        "base,ids",
        "--messages",
        "2000",
        "--ab",
        ":pure",
        "--latency-seconds",
        "0.5",
    ],
    "pipeline": ["--messages", "300", "--rounds", "1"],
    "sdk_submit": ["--messages", "2000", "--send-messages", "100"],
    "sdk_transport": ["--messages", "500"],
}


def _with_repo_on_path() -> dict[str, str]:
    """This process's environment with the repository first on ``PYTHONPATH``."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }


def _scripts() -> list[str]:
    return sorted(
        m.name
        for m in pkgutil.iter_modules(benchmarks.__path__)
        if not m.name.startswith("_") and not m.ispkg
    )


@pytest.mark.parametrize("name", _scripts())
def test_benchmark_script_imports(name: str) -> None:
    imported = importlib.import_module(f"benchmarks.{name}")
    assert callable(getattr(imported, "main", None)), f"benchmarks.{name} has no main()"


def test_the_harness_package_imports() -> None:
    for m in pkgutil.iter_modules(importlib.import_module("benchmarks.harness").__path__):
        importlib.import_module(f"benchmarks.harness.{m.name}")


def test_run_all_runs_what_the_page_lists() -> None:
    """run_all.sh runs exactly the scenarios docs/benchmarks.md lists as its reproduction."""
    script = (ROOT / "benchmarks" / "run_all.sh").read_text()
    ran = [line.split()[1] for line in script.splitlines() if line.startswith("run ")]
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    for name in ran:
        assert f"python -m benchmarks.{name} " in page, f"{name} runs but the page has no table"
    assert sorted(ran) == sorted(set(ran))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(SMALL))
def test_scenario_runs_in_its_quick_mode(name: str, tmp_path: Path) -> None:
    if name == "spark_sink" and importlib.util.find_spec("pyspark") is None:
        pytest.skip("needs pyspark")
    out = tmp_path / "out.json"
    env = _with_repo_on_path()
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", "--quick", "--json", str(out), *SMALL[name]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "|---" in done.stdout, done.stdout  # a markdown table
    assert f"python -m benchmarks.{name} --quick" in done.stdout  # its command, with the load
    assert json.loads(out.read_text())["machine"]["logical_cores"] == os.cpu_count()


@pytest.mark.timeout(300)
def test_dedup_runs_proxies_over_one_postgres(request: pytest.FixtureRequest) -> None:
    try:
        bin_dir()
    except PgUnavailable as exc:
        pg_skip(request, exc)
    env = _with_repo_on_path()
    args = ["--quick", "--store", "postgres", "--proxies", "2", "--entries", "5000"]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.dedup", *args, "--appends", "50"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "postgres x 2 proxies" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--proxies", "2"], "above 1 only with --store postgres"),
        # Its --ab sides are stores driven in-process, not served apps.
        (["--ab", ":memory"], "measures the store itself"),
    ],
)
def test_dedup_refuses_what_it_cannot_measure(args: list[str], why: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.dedup", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert why in done.stderr.splitlines()[-1]


async def test_a_run_ends_without_waiting_out_the_pullers_long_polls(
    server: RunningServer,
) -> None:
    """With ``stop_parked``, ``consume`` returns once the last message is delivered: pullers
    parked in a 30 s long poll are stopped there, not waited for, and the server hands their
    polls nothing."""
    async with client(server.url) as admin:
        await create_topic(admin, "t", 2)
        await put_group(admin, "g", "t")
        consumer = asyncio.create_task(
            consume(server.url, "g", 200, 4, 100, wait_ms=30_000, stop_parked=True)
        )
        await produce(server.url, "t", make_batches(200, 20, 10, 50), 2, 1)
        # Waiting out the parked polls would take 30 s.
        stats = await asyncio.wait_for(consumer, 15)
        assert (stats.delivered, stats.redeliveries, stats.order_violations) == (200, 0, 0)
        # Every message acked (the last acks rode on the polls that were stopped), none
        # handed out since.
        group = (await admin.get_group("g"))["stats"]
        assert (group["in_flight"], [q["lag"] for q in group["queues"]]) == (0, [0, 0])


def test_ab_memory_serves_this_tree_without_storage() -> None:
    """``--ab :memory``: B is this tree's server on the in-memory store. It answers the same
    calls as A, and writes no database where A writes its SQLite file."""
    with servers("cproxy-test-memory-", MEMORY_REF) as (a, b):
        assert b.source.commit.endswith("(memory store)")
        for server in (a, b):
            with Client(server.url) as admin:
                admin.create_topic("t", queues=2)
                admin.produce("t", [{"key": "k", "body": {"n": 1}}])
                assert [t.name for t in admin.list_topics()] == ["t"]
        assert (a.data_dir / "cproxy.db").exists()
        assert not (b.data_dir / "cproxy.db").exists()
