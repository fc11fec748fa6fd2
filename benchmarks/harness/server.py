"""The servers under test, each a subprocess on a free loopback port: ``cproxy serve``
(uvicorn, SQLite store) from this tree or from another git ref (for A/B runs), and the
others it is compared with: Redis (``redis-server``), NATS (``nats-server``) and the floor
(a bare uvicorn ASGI app, :mod:`.floor`)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness.report import REPO, git_commit
from consumer_sdk import NO_RETRY, Client, ClientError
from cproxy import _native
from cproxy._native import PURE_ENV

#: What each peer needs here: (server binary, Python client module).
PEER_NEEDS = {"redis": ("redis-server", "redis"), "nats": ("nats-server", "nats")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Source:
    """Where the server's code comes from: ``tree`` goes first on its ``PYTHONPATH`` (and is
    its working directory); ``commit`` is what the report names."""

    label: str
    tree: Path
    commit: str
    #: Extra environment of the server process.
    env: tuple[tuple[str, str], ...] = ()
    #: The module run as ``python -m <module> serve ...``.
    module: str = "cproxy.cli"


#: ``--ab`` value for "this tree with its hot path from source" (``cproxy/_native.py``): the
#: compiler's gain, A/B in one run.
PURE_REF = ":pure"
#: ``--ab`` value for "this tree on the in-memory store" (:mod:`.memory_serve`): what the
#: server's path costs without storage, A/B in one run.
MEMORY_REF = ":memory"


def this_tree(label: str = "A") -> Source:
    compiled = _native.status() == "compiled"
    return Source(label, REPO, git_commit(REPO) + ("" if compiled else " (from source)"))


def this_tree_pure(label: str = "B") -> Source:
    """This tree, with the compiled modules loaded from source (``CPROXY_PURE_PYTHON=1``)."""
    return Source(label, REPO, f"{git_commit(REPO)} (source)", ((PURE_ENV, "1"),))


def this_tree_memory(label: str = "B") -> Source:
    """This tree with the in-memory store in place of SQLite (:mod:`.memory_serve`)."""
    commit = f"{this_tree(label).commit} (memory store)"
    return Source(label, REPO, commit, module="benchmarks.harness.memory_serve")


@contextlib.contextmanager
def tree_at(ref: str, label: str = "B") -> Iterator[Source]:
    """A detached temporary ``git worktree`` of ``ref``, removed again on exit."""
    tmp = Path(tempfile.mkdtemp(prefix="cproxy-ab-"))
    tree = tmp / "tree"
    subprocess.run(
        ["git", "worktree", "add", "--quiet", "--detach", str(tree), ref],
        cwd=REPO,
        check=True,
    )
    try:
        compiled = build_native(tree)
        yield Source(label, tree, git_commit(REPO, ref) + ("" if compiled else " (from source)"))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def build_native(tree: Path) -> bool:
    """Compile ``tree``'s hot path in place when it has one (``cproxy/_native.py``), as
    installing that tree would: a ref run from source would be measured ~2x slower than it
    is. Falls back to source as its install would, with a warning on stderr (the report
    names such a side "from source"). Needs setuptools >= 77 (the project's build-system)."""
    if not (tree / "cproxy" / "_native.py").exists():
        return False
    print(f"compiling the hot path of {tree} (about a minute)", file=sys.stderr)
    done = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        print(f"warning: compiling {tree} failed ({tail[0]}); it runs from source", file=sys.stderr)
    return done.returncode == 0


class ServerProcess:
    """``cproxy serve`` on ``data_dir`` (created), with ``config_toml`` as its config file.

    ``start()`` waits until the API answers (uvicorn accepts connections only after the
    app's startup, which opens the store); ``stop()`` is SIGTERM, then SIGKILL after 20 s.
    """

    def __init__(
        self,
        data_dir: Path,
        config_toml: str = "",
        log_level: str = "warning",
        source: Source | None = None,
        store: str | None = None,
        node_id: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        #: ``postgresql://...``: serve on that database as cluster member ``node_id``
        #: (advertised at this server's URL) instead of on SQLite in ``data_dir``.
        self.store = store
        self.node_id = node_id
        data_dir.mkdir(parents=True, exist_ok=True)
        self.config = data_dir.parent / f"{data_dir.name}.toml"
        self.config.write_text(config_toml)
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.log_level = log_level
        self.source = source or this_tree()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        cmd = [sys.executable, "-m", self.source.module, "serve", "--host", "127.0.0.1"]
        cmd += ["--port", str(self.port), "--data-dir", str(self.data_dir)]
        cmd += ["--config", str(self.config), "--log-level", self.log_level]
        if self.store is not None:
            cmd += ["--store", self.store, "--node-id", self.node_id or f"n{self.port}"]
            cmd += ["--advertise-url", self.url]
        tree = str(self.source.tree)
        path = os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONPATH": path, **dict(self.source.env)}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tree, env=env
            )
        deadline = time.monotonic() + timeout_s
        with Client(self.url, timeout_ms=1000, retry=NO_RETRY) as client:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
                try:
                    client.list_topics()
                    return
                except ClientError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server not ready after {timeout_s}s:\n{self.log()}")
                time.sleep(0.02)

    @property
    def pid(self) -> int:
        assert self.proc is not None, "server not started"
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:] if self.log_path.exists() else ""


@contextlib.contextmanager
def running(
    root: Path, name: str, source: Source | None = None, config_toml: str = ""
) -> Iterator[ServerProcess]:
    """A started server on ``root/name``; stopped on exit, its log printed on failure."""
    server = ServerProcess(root / name, config_toml, source=source)
    try:
        server.start()
        yield server
    except BaseException:
        print(server.log(), file=sys.stderr)
        raise
    finally:
        server.stop()


@contextlib.contextmanager
def servers(
    prefix: str, ab_ref: str | None = None, config_toml: str = ""
) -> Iterator[list[ServerProcess]]:
    """One server from this tree (label A), plus one from ``ab_ref`` (label B) when given
    (``PURE_REF``: this tree, hot path from source; ``MEMORY_REF``: this tree on the
    in-memory store), each on its own temporary data dir and
    with ``config_toml`` as its config file; all stopped and cleaned up on exit."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with contextlib.ExitStack() as stack:
            sources = [this_tree()]
            if ab_ref == PURE_REF:
                sources.append(this_tree_pure())
            elif ab_ref == MEMORY_REF:
                sources.append(this_tree_memory())
            elif ab_ref is not None:
                sources.append(stack.enter_context(tree_at(ab_ref)))
            yield [stack.enter_context(running(root, s.label, s, config_toml)) for s in sources]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def nats_binary() -> str | None:
    local = Path(sys.executable).parent / "nats-server"
    return str(local) if local.exists() else shutil.which("nats-server")


def missing(kind: str) -> str | None:
    """Why the peer ``kind`` (redis, nats) cannot run here, or None."""
    binary, module = PEER_NEEDS[kind]
    if (nats_binary() if kind == "nats" else shutil.which(binary)) is None:
        return f"{binary} not found"
    if importlib.util.find_spec(module) is None:
        return f"the {module} client is not installed (pip install 'cproxy-ordered[bench]')"
    return None


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.02)
    raise RuntimeError(f"nothing listens on port {port} after {timeout_s} s")


@contextlib.contextmanager
def peer_process(kind: str, data: Path) -> Iterator[tuple[str, int]]:
    """A fresh ``redis``, ``nats`` or ``floor`` server keeping its files in ``data``:
    (address, pid). Redis keeps an AOF with ``appendfsync everysec`` (like SQLite's
    ``synchronous=normal``: durable against a process crash); JetStream keeps files."""
    data.mkdir(parents=True, exist_ok=True)
    port = free_port()
    if kind == "redis":
        cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)]
        cmd += ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec"]
        address = f"127.0.0.1:{port}"
    elif kind == "nats":
        cmd = [str(nats_binary()), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(data)]
        address = f"nats://127.0.0.1:{port}"
    else:
        cmd = [sys.executable, "-m", "uvicorn", "benchmarks.harness.floor:app", "--port"]
        cmd += [str(port), "--loop", "uvloop", "--http", "httptools", "--no-access-log"]
        cmd += ["--log-level", "warning"]
        address = f"http://127.0.0.1:{port}"
    with (data.parent / f"{data.name}.log").open("ab") as out:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    try:
        _wait_port(port, proc)
        yield address, proc.pid
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a cproxy cluster member hands its queues over), SIGKILL after 20 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
