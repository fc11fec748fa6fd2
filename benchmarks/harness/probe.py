"""Probes on the server process: CPU seconds over a phase, resident memory, py-spy profiles."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import psutil


def cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds of ``process`` so far (all its threads)."""
    t = process.cpu_times()
    return float(t.user + t.system)


class PySpy:
    """``py-spy record`` attached to ``pid`` (non-blocking: the target is never paused),
    writing collapsed stacks to ``out`` at ``rate_hz``; stopped with SIGINT on exit."""

    def __init__(self, pid: int, out: Path, rate_hz: int = 250, threads: bool = False) -> None:
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        self.cmd = [spy, "record", "--nonblocking", "--rate", str(rate_hz), "--format", "raw"]
        self.cmd += ["-o", str(out), "-p", str(pid)] + (["--threads"] if threads else [])
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr = b""

    def __enter__(self) -> PySpy:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # py-spy needs a moment to attach; samples before that are lost
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            _, self.stderr = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, self.stderr = self.proc.communicate()


class Probe:
    """Wall seconds, server CPU seconds and this process's CPU seconds over a ``with`` block;
    optionally a py-spy profile of the server into ``profile_dir/<name>.txt``."""

    def __init__(self, pid: int, profile_dir: Path | None = None, name: str = "phase") -> None:
        self.server = psutil.Process(pid)
        self.me = psutil.Process()
        self.spy = PySpy(pid, profile_dir / f"{name}.txt") if profile_dir is not None else None
        self.wall = self.server_cpu = self.client_cpu = 0.0

    def __enter__(self) -> Probe:
        if self.spy is not None:
            self.spy.__enter__()
        self.t0 = time.perf_counter()
        self.s0, self.c0 = cpu_seconds(self.server), cpu_seconds(self.me)
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.wall = time.perf_counter() - self.t0
        self.server_cpu = cpu_seconds(self.server) - self.s0
        self.client_cpu = cpu_seconds(self.me) - self.c0
        if self.spy is not None:
            self.spy.__exit__(t, e, tb)

    def row(self) -> dict[str, float]:
        return {
            "wall_s": round(self.wall, 3),
            "server_cpu_s": round(self.server_cpu, 3),
            "client_cpu_s": round(self.client_cpu, 3),
        }


def rss(pid: int) -> dict[str, float]:
    """Resident MiB of ``pid``, and *anon* MiB (RSS minus file-backed pages such as SQLite's
    mmap and shared libraries: the heap) where the OS reports shared pages."""
    info = psutil.Process(pid).memory_info()
    out = {"rss_mib": info.rss / 2**20}
    shared = getattr(info, "shared", None)
    if shared is not None:
        out["anon_mib"] = (info.rss - shared) / 2**20
    return {k: round(v, 1) for k, v in out.items()}
