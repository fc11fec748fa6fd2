"""Running conventions (DESIGN §5): ``python -m cproxy``, ``CPROXY_*`` variables, a missing
optional dependency, the standard ``/metrics`` series, UTC log timestamps."""

from __future__ import annotations

import calendar
import os
import re
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from cproxy import __version__, _native
from cproxy.cli import serve_arguments
from cproxy.config import load_settings
from tests.consumer_sdk.serve_proc import free_port
from tests.support import RunningServer, wait_until

ROOT = Path(__file__).resolve().parent.parent
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{3})Z ")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        check=False,
    )


def test_python_m_cproxy_is_the_cproxy_command() -> None:
    done = run("-m", "cproxy", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"cproxy {__version__} (hot path: {_native.describe()})"


def test_serve_takes_port_and_data_dir_from_the_environment_and_logs_utc_ms(
    tmp_path: Path,
) -> None:
    port = free_port()
    data = tmp_path / "from-env"
    log = tmp_path / "server.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CPROXY_PORT": str(port),
        "CPROXY_DATA_DIR": str(data),
        "TZ": "America/Los_Angeles",  # never UTC: the log must say UTC anyway
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cproxy", "serve"], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:

        def ready() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, 30, 0.05, "server on CPROXY_PORT")
        assert data.is_dir() and any(data.iterdir())
    finally:
        proc.terminate()
        proc.wait(20)
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert lines
    for line in lines:
        if line.startswith((" ", "\t", "Traceback")):
            continue
        match = STAMP.match(line)
        assert match, f"not a UTC ms timestamp: {line!r}"
        stamp = calendar.timegm(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S"))
        assert abs(stamp - time.time()) < 120, line


def test_flags_win_over_the_environment_which_wins_over_the_file(tmp_path: Path) -> None:
    config = tmp_path / "cproxy.toml"
    config.write_text('[server]\nport = 1111\nhost = "127.0.0.2"\n')
    env = {"CPROXY_CONFIG": str(config), "CPROXY_PORT": "2222", "CPROXY_HOST": "127.0.0.3"}
    flags = Namespace(config=None, host="127.0.0.4", port=None, data_dir=None, store=None)
    given = serve_arguments(flags, env)
    settings = load_settings(
        given["config"], host=given["host"], port=given["port"], data_dir=given["data_dir"]
    )
    assert (settings.host, settings.port) == ("127.0.0.4", 2222)
    assert load_settings(config).port == 1111


def test_a_bad_port_variable_is_one_line() -> None:
    done = run("-m", "cproxy", "serve", env={"CPROXY_PORT": "http"})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "cproxy: error: CPROXY_PORT must be a port number, got 'http'"
    ]


def test_postgres_store_without_its_driver_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    blocked = (
        "import sys; sys.modules['asyncpg'] = None\n"  # an import of it raises ImportError
        "from cproxy.cli import main\n"
        f"main(['serve', '--port', '0', '--data-dir', {str(tmp_path)!r},"
        " '--store', 'postgresql://u@127.0.0.1:1/db'])\n"
    )
    done = run("-c", blocked)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "pip install 'cproxy-ordered[postgres]'" in lines[0]


def test_metrics_parse_and_carry_process_series_and_build_info(server: RunningServer) -> None:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    samples = {s.name: s for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples["process_cpu_seconds_total"].value > 0
    assert "python_info" in samples
    info = samples["cproxy_build_info"]
    assert info.value == 1
    assert info.labels["version"] == __version__
    # The server runs in this environment: it decided as this process did.
    assert info.labels["compiled"] == ("true" if _native.status() == "compiled" else "false")
