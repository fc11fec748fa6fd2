"""``cproxy serve`` as a real subprocess (config file, flags, graceful SIGTERM), and the client
commands against real servers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from consumer_sdk import Client, ClientError, QueueResult, TransportError
from cproxy import __version__
from cproxy._native import describe
from cproxy.cli import main
from tests.conftest import ServerFactory
from tests.support import RunningServer, wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(data_dir: Path, config: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "cproxy.cli",
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--config",
        str(config),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"server exited: {proc.stdout.read().decode() if proc.stdout else ''}"
            )
        try:
            with Client(f"http://127.0.0.1:{port}", timeout_ms=1000) as client:
                return client.ready()
        except TransportError:
            return False

    wait_until(ready, 30, 0.05, "server ready")
    return proc


@pytest.mark.slow
def test_sigterm_persists_progress_and_config_file_declares_topics_and_groups(
    tmp_path: Path,
) -> None:
    config = tmp_path / "cproxy.toml"
    # A 10-minute commit interval: only the shutdown commit can persist the acks below.
    config.write_text(
        "[server]\ncommit_interval_ms = 600000\n"
        "[topics.rides]\nqueues = 2\n"
        '[groups.billing]\ntopics = { rides = { order_by = "key" } }\n'
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve(tmp_path / "data", config, port)
    try:
        with Client(url) as c:
            msgs = [{"key": f"k{i}", "body": i} for i in range(10)]
            assert len(c.produce("rides", msgs)) == 10
            got: list[Any] = []

            def pulled_all() -> bool:
                got.extend(c.pull("billing", max_messages=10, wait_ms=500).messages)
                return len(got) == 10

            wait_until(pulled_all, 10, 0, "all 10 messages")
            results = [QueueResult("rides", m.qid, acks=(m.offset,)) for m in got]
            assert c.ack("billing", results).applied == 10
        proc.send_signal(signal.SIGTERM)
        # uvicorn re-raises the captured SIGTERM after its graceful shutdown.
        assert proc.wait(20) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
    proc = serve(tmp_path / "data", config, port)
    try:
        with Client(url) as c:
            again = c.pull("billing", max_messages=10, wait_ms=300).messages
            assert again == ()
            stats = c.get_group("billing")["stats"]
            assert sum(q["committed_offset"] for q in stats["queues"]) == 10
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_bad_config_file_fails_fast_with_a_clear_message(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[groups.g]\ntopics = { t = { order_by = "$..x" } }\n')
    out = subprocess.run(
        [sys.executable, "-m", "cproxy.cli", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ},
    )
    assert out.returncode != 0
    assert "groups.g" in out.stderr and "recursive descent" in out.stderr


def test_client_commands_against_a_real_server(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(*args: str) -> Any:
        main([*args[:1], "--url", server.url, *args[1:]])
        out = capsys.readouterr().out
        return json.loads(out) if out.lstrip().startswith("{") else out

    assert run("topics", "create", "rides", "--queues", "2") == {"name": "rides", "queues": 2}
    assert run("topics")["topics"] == [{"name": "rides", "queues": 2}]
    produced = run("produce", "rides", '{"event": "call"}', "--key", "ride-7", "--id", "e1")
    assert produced["results"][0]["duplicate"] is False
    with Client(server.url) as c:
        c.put_group("billing", {"topics": {"rides": {"order_by": "key"}}})
    assert run("groups")["groups"] == [{"name": "billing", "topics": ["rides"]}]
    tailed = run("tail", "billing", "--count", "1")  # one JSON line per message
    assert tailed["body"] == {"event": "call"} and tailed["key"] == "ride-7"
    shown = run("groups", "billing")
    assert shown["stats"]["in_flight"] == 0  # tail acked what it printed
    with pytest.raises(SystemExit, match="topic_not_found"):
        main(["produce", "--url", server.url, "nope", "{}"])


# -- the operator commands (issue 14) -------------------------------------------------------------
def cli(server: RunningServer, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    """Run ``cproxy ARGS --url <server>``; the JSON it printed (a list for JSON lines)."""
    main([*args, "--url", server.url])
    out = capsys.readouterr().out
    if out.startswith("{\n") or not out.strip():
        return json.loads(out) if out.strip() else None
    return [json.loads(line) for line in out.splitlines()]


def test_tail_count_is_a_real_limit_and_peek_does_not_touch_the_group(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    cli(server, capsys, "topics", "create", "t")
    cli(server, capsys, "groups", "create", "g", "--topic", "t=none")
    for i in range(5):
        cli(server, capsys, "produce", "t", json.dumps({"n": i}))
    with Client(server.url) as c:
        wait_until(lambda: c.get_group("g")["stats"]["ready"] == 5, message="5 ready")
        [one] = cli(server, capsys, "tail", "g", "--count", "1")
        assert one["body"] == {"n": 0}
        stats = c.get_group("g")["stats"]
        assert (stats["in_flight"], stats["ready"]) == (0, 4)  # one taken, and acked
        peeked = cli(server, capsys, "peek", "t", "--last", "2")
        assert [(m["offset"], m["body"]) for m in peeked] == [(3, {"n": 3}), (4, {"n": 4})]
        assert [
            m["offset"] for m in cli(server, capsys, "peek", "t", "--from", "1", "--limit", "2")
        ] == [1, 2]
        stats = c.get_group("g")["stats"]
        assert (stats["in_flight"], stats["ready"]) == (0, 4)  # peek touched nothing
        rest = cli(server, capsys, "tail", "g", "--count", "2", "--no-ack")
        assert [m["body"] for m in rest] == [{"n": 1}, {"n": 2}]
        assert c.get_group("g")["stats"]["in_flight"] == 2


def test_dead_letters_redrive_one_and_delete_with_confirmation(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    cli(server, capsys, "topics", "create", "t")
    cli(server, capsys, "groups", "create", "g", "--topic", "t", "--max-attempts", "1")
    with Client(server.url) as c:
        c.produce("t", [{"key": "a", "body": f"a{i}"} for i in range(3)])
        for _ in range(3):
            [m] = c.pull("g", wait_ms=2000).messages
            c.ack("g", [QueueResult("t", 0, fails=((m.offset, "boom"),))])
        wait_until(lambda: c.get_group("g")["stats"]["dead_lettered"] == 3, message="3 dead")
    assert cli(server, capsys, "dead-letters", "redrive", "g", "--message", "t:0:1") == {
        "redriven": 1
    }
    [again] = cli(server, capsys, "tail", "g", "--count", "1")
    assert (again["offset"], again["body"]) == (1, "a1")
    with pytest.raises(SystemExit):  # no terminal to ask on, no --yes: nothing deleted
        main(["dead-letters", "delete", "g", "--message", "t:0:0", "--url", server.url])
    assert "Not confirmed" in capsys.readouterr().err
    deleted = cli(server, capsys, "dead-letters", "delete", "g", "--message", "t:0:0", "--yes")
    assert deleted == {"deleted": 1}
    left = cli(server, capsys, "dead-letters", "list", "g")["dead_letters"]
    assert [d["offset"] for d in left] == [2]
    assert cli(server, capsys, "dead-letters", "delete", "g", "--topic", "t", "--yes") == {
        "deleted": 1
    }
    assert cli(server, capsys, "dead-letters", "list", "g")["dead_letters"] == []


def test_groups_create_seek_delete(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    cli(server, capsys, "topics", "create", "t", "--queues", "2")
    created = cli(
        server, capsys, "groups", "create", "g", "--topic", "t", "--max-attempts", "3",
        "--retry-backoff-ms", "10,20", "--start", "latest", "--max-per-second", "1000",
    )  # fmt: skip
    assert created["topics"]["t"]["order_by"] == "key"  # the --order-by default
    assert (created["max_attempts"], created["retry_backoff_ms"]) == (3, [10, 20])
    shown = cli(server, capsys, "groups", "show", "g")
    assert (shown["max_attempts"], shown["max_per_second"]) == (3, 1000)
    for i in range(4):
        cli(server, capsys, "produce", "t", str(i), "--qid", str(i % 2))
    sought = cli(server, capsys, "groups", "seek", "g", "--topic", "t", "--to", "latest")
    assert sought["offsets"] == [{"qid": 0, "offset": 2}, {"qid": 1, "offset": 2}]
    sought = cli(server, capsys, "groups", "seek", "g", "--topic", "t", "--to", "1", "--qid", "0")
    assert sought["offsets"] == [{"qid": 0, "offset": 1}]
    assert [m["body"] for m in cli(server, capsys, "tail", "g", "--count", "1")] == [2]
    assert cli(server, capsys, "groups", "delete", "g") == {"deleted": "g"}
    assert cli(server, capsys, "groups", "list")["groups"] == []


def test_groups_replay_redelivers_one_key(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    cli(server, capsys, "topics", "create", "t", "--queues", "1")
    cli(server, capsys, "groups", "create", "g", "--topic", "t")
    for body, key in (("a0", "a"), ("b0", "b"), ("a1", "a")):
        cli(server, capsys, "produce", "t", json.dumps(body), "--key", key)
    assert len(cli(server, capsys, "tail", "g", "--count", "3")) == 3
    replayed = cli(server, capsys, "groups", "replay", "g", "--topic", "t", "--order-value", "a")
    assert replayed == {"replaying": 2, "lost_to_retention": 0}
    again = cli(server, capsys, "tail", "g", "--count", "2")
    assert [m["body"] for m in again] == ["a0", "a1"]
    later = cli(
        server, capsys, "groups", "replay", "g", "--topic", "t", "--order-value", "a", "--from", "2"
    )
    assert later == {"replaying": 1, "lost_to_retention": 0}


def test_groups_create_with_filter_transform_and_push(
    server_factory: ServerFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    server = server_factory(push_allowed_urls=("http://127.0.0.1:9/",))  # a loopback push
    cli(server, capsys, "topics", "create", "t")
    created = cli(
        server, capsys, "groups", "create", "g", "--topic", "t",
        "--filter", "body.kind == 'keep'", "--transform", "{n: body.n}",
    )  # fmt: skip
    entry = created["topics"]["t"]
    assert (entry["filter"], entry["transform"]) == ("body.kind == 'keep'", "{n: body.n}")
    cli(server, capsys, "produce", "t", '{"kind": "drop", "n": 1}', "--key", "a")
    cli(server, capsys, "produce", "t", '{"kind": "keep", "n": 2}', "--key", "a")
    assert [m["body"] for m in cli(server, capsys, "tail", "g", "--count", "1")] == [{"n": 2}]
    pushed = cli(
        server, capsys, "groups", "create", "p", "--topic", "t",
        "--push-url", "http://127.0.0.1:9/hook", "--push-max-in-flight", "3",
        "--push-secret", "s3cret",
    )  # fmt: skip
    push = pushed["topics"]["t"]["push"]
    assert (push["url"], push["max_in_flight"], push["secret"]) == (
        "http://127.0.0.1:9/hook",
        3,
        "********",
    )
    with pytest.raises(SystemExit, match=r"^cproxy: error: 422 .*filter is not valid JMESPath"):
        main(["groups", "create", "h", "--topic", "t", "--filter", "body.[", "--url", server.url])


def test_blocked_keys_skip_release_and_dead_letters(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    cli(server, capsys, "topics", "create", "t")
    cli(server, capsys, "groups", "create", "g", "--topic", "t", "--max-attempts", "2",
        "--retry-backoff-ms", "60000")  # fmt: skip
    with Client(server.url) as c:
        c.produce("t", [{"key": "a", "body": "a0"}, {"key": "b", "body": "b0"}])
        got: list[Any] = []
        wait_until(lambda: got.extend(c.pull("g", wait_ms=200).messages) or len(got) == 2)
        fails = tuple((m.offset, "boom") for m in got)
        c.ack("g", [QueueResult("t", 0, fails=fails)])  # both keys now retrying: blocked
    blocked = cli(server, capsys, "blocked", "list", "g")["blocked_keys"]
    assert sorted(b["order_value"] for b in blocked) == ["a", "b"]
    released = cli(server, capsys, "blocked", "release", "g", "--topic", "t", "--order-value", "a")
    b_offset = next(m.offset for m in got if m.key == "b")
    skipped = cli(server, capsys, "blocked", "skip", "g", "--topic", "t", "--qid", "0",
                  "--offset", str(b_offset))  # fmt: skip
    assert released["released"]["offset"] != skipped["skipped"]["offset"] == b_offset
    assert cli(server, capsys, "blocked", "list", "g")["blocked_keys"] == []
    [dead] = cli(server, capsys, "dead-letters", "list", "g")["dead_letters"]
    assert (dead["key"], dead["body"]) == ("b", "b0")
    assert cli(server, capsys, "dead-letters", "redrive", "g") == {"redriven": 1}
    again = cli(server, capsys, "tail", "g", "--count", "2")
    assert sorted(m["body"] for m in again) == ["a0", "b0"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["topics", "show"], "the topic name is required"),
        (["topics", "create"], "the topic name is required"),
        (["groups", "create", "g"], "at least one --topic"),
        (["groups", "seek", "g", "--topic", "t"], "one of --to or --timestamp-ms"),
        (["groups", "replay", "g", "--topic", "t"], "--order-value is required"),
        (["groups", "replay", "g", "--order-value", "a"], "exactly one --topic"),
        (["blocked", "skip", "g", "--topic", "t"], "--order-value, or --qid and --offset"),
        (["produce", "t", "{not json"], "body is not valid JSON"),
        (["tail", "g", "--count", "0"], "must be >= 1"),
        (["peek", "t", "--from", "1", "--last", "2"], "not allowed with argument"),
        (["groups", "create", "g", "--topic", "t", "--push-secret", "x"], "need(s) --push-url"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    args: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # No server needed: these fail before any call.
    with pytest.raises(SystemExit) as info:
        main([*args, "--url", "http://127.0.0.1:9"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and "None" not in err


def test_errors_print_in_one_format(server: RunningServer) -> None:
    with pytest.raises(SystemExit, match=r"^cproxy: error: 404 group_not_found: "):
        main(["groups", "show", "nope", "--url", server.url])
    with pytest.raises(SystemExit, match=r"^cproxy: error: GET http://127.0.0.1:9/v1/topics: "):
        main(["topics", "--url", "http://127.0.0.1:9"])


def test_version_and_help_show_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"cproxy {__version__} (hot path: {describe()})"
    with pytest.raises(SystemExit):
        main(["tail", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # help wraps lines
    assert "(default: 5000)" in text and "(default: http://127.0.0.1:9713)" in text
    assert "``" not in text
    with pytest.raises(SystemExit):
        main(["topics", "--help"])
    assert "(default: 1)" in capsys.readouterr().out  # --queues


def test_ctrl_c_on_tail_prints_one_line_and_exits_130(server: RunningServer) -> None:
    with Client(server.url) as c:
        c.create_topic("t", 1)
        c.put_group("g", {"topics": {"t": {"order_by": "none"}}})
        c.produce("t", [{"body": 1}])
        proc = subprocess.Popen(
            [sys.executable, "-m", "cproxy.cli", "tail", "g", "--url", server.url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # blocks until tail printed the message
            assert json.loads(line)["body"] == 1
            # Its ack rides on the next pull, which then long-polls: Ctrl-C lands in a pull.
            wait_until(lambda: c.get_group("g")["stats"]["in_flight"] == 0, message="acked")
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 130
        assert err == "cproxy: interrupted\n"


def test_client_errors_reach_the_cli_as_sdk_errors() -> None:
    # The CLI's error path relies on every failure of a call being a ClientError.
    with pytest.raises(SystemExit) as info:
        main(["topics", "--url", "http://127.0.0.1:9", "--timeout-ms", "500"])
    assert isinstance(info.value.__cause__, ClientError)


@pytest.mark.slow
def test_serve_startup_errors_and_ctrl_c_print_one_line(tmp_path: Path) -> None:
    config = tmp_path / "cproxy.toml"
    config.write_text("")
    port = free_port()
    first = serve(tmp_path / "data", config, port)
    try:
        # A second server on the same data dir, and one on a port in use: one line each,
        # before anything starts (the busy port's data dir gets no store).
        for data_dir, port_arg, expected in (
            (tmp_path / "data", free_port(), "is in use by another cproxy store"),
            (tmp_path / "other", port, "cannot listen on 127.0.0.1:"),
        ):
            cmd = [sys.executable, "-m", "cproxy.cli", "serve", "--data-dir", str(data_dir)]
            cmd += ["--port", str(port_arg), "--config", str(config)]
            out = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert out.returncode == 1, out
            assert "Traceback" not in out.stdout + out.stderr
            assert out.stderr.strip().splitlines()[-1].startswith("cproxy: error: "), out.stderr
            assert expected in out.stderr
        assert not (tmp_path / "other" / "cproxy.db").exists()
        first.send_signal(signal.SIGINT)  # Ctrl-C
        output = first.communicate(timeout=30)[0].decode()
        assert first.returncode == 0
        assert "Traceback" not in output and "broker stopped" in output
    finally:
        if first.poll() is None:
            first.kill()


def test_a_serving_process_collects_young_garbage_less_often() -> None:
    import gc
    import importlib

    serve_module = importlib.import_module("cproxy.cli.serve")  # the package re-exports serve()
    before = gc.get_threshold()
    try:
        serve_module.tune_gc()
        assert gc.get_threshold() == serve_module.GC_THRESHOLDS
        assert serve_module.GC_THRESHOLDS[0] > before[0]
    finally:
        gc.set_threshold(*before)
