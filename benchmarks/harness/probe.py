"""Probes on the server process: CPU seconds over a phase, resident memory."""

from __future__ import annotations

import time
from types import TracebackType

import psutil


def cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds of ``process`` so far (all its threads)."""
    t = process.cpu_times()
    return float(t.user + t.system)


class Probe:
    """Wall seconds, server CPU seconds and this process's CPU seconds over a ``with`` block."""

    def __init__(self, pid: int) -> None:
        self.server = psutil.Process(pid)
        self.me = psutil.Process()
        self.wall = self.server_cpu = self.client_cpu = 0.0

    def __enter__(self) -> Probe:
        self.t0 = time.perf_counter()
        self.s0, self.c0 = cpu_seconds(self.server), cpu_seconds(self.me)
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.wall = time.perf_counter() - self.t0
        self.server_cpu = cpu_seconds(self.server) - self.s0
        self.client_cpu = cpu_seconds(self.me) - self.c0


def rss(pid: int) -> dict[str, float]:
    """Resident MiB of ``pid``, and *anon* MiB (RSS minus file-backed pages such as SQLite's
    mmap and shared libraries: the heap) where the OS reports shared pages."""
    info = psutil.Process(pid).memory_info()
    out = {"rss_mib": info.rss / 2**20}
    shared = getattr(info, "shared", None)
    if shared is not None:
        out["anon_mib"] = (info.rss - shared) / 2**20
    return {k: round(v, 1) for k, v in out.items()}
