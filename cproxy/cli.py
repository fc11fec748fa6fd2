"""``cproxy serve | topics | groups | produce | tail``.

``serve`` runs the service; the other commands are a small HTTP client for a running server
(``--url``, default http://127.0.0.1:9713; ``--token`` or ``CPROXY_TOKEN`` for auth).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from cproxy.config import Settings, load_settings
from cproxy.errors import CproxyError
from cproxy.logs import configure_logging

logger = logging.getLogger("cproxy")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(settings: Settings) -> None:
    """Run the service until SIGINT/SIGTERM; shutdown persists every group's progress."""
    import uvicorn

    from cproxy.api.app import create_app

    configure_logging(settings.log_level, settings.log_format)
    if not settings.auth_enabled:
        if _is_loopback(settings.host):
            logger.warning(
                "no tokens configured: auth is off; serving on loopback %s only", settings.host
            )
        else:
            logger.warning(
                "no tokens configured: auth is OFF and %s is reachable from the "
                "network; declare [[tokens]] in the config file",
                settings.host,
            )
    logger.info(
        "serving on http://%s:%d with data in %s",
        settings.host,
        settings.port,
        settings.data_dir.resolve(),
    )
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        loop="auto",
        http="auto",
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    broker = app.state.broker
    original = server.handle_exit

    def handle_exit(sig: int, frame: Any) -> None:
        # Stop taking pulls now, so long polls do not hold up the shutdown.
        broker.begin_shutdown()
        original(sig, frame)

    server.handle_exit = handle_exit  # type: ignore[method-assign]
    server.run()


def _client(args: argparse.Namespace) -> httpx.Client:
    token = args.token or os.environ.get("CPROXY_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=args.url, headers=headers, timeout=40)


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    with _client(args) as client:
        response = client.request(method, path, json=body)
    data = response.json()
    if response.status_code >= 400:
        error = data.get("error", {})
        raise SystemExit(
            f"error {response.status_code} {error.get('code')}: {error.get('message')}"
        )
    return data


def _print(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _tail(args: argparse.Namespace) -> None:
    """Pull and print messages as JSON lines; acks them unless --no-ack."""
    results: list[dict[str, Any]] = []
    printed = 0
    with _client(args) as client:
        while args.count is None or printed < args.count:
            body = {"max_messages": 100, "wait_ms": 5000, "results": results}
            response = client.post(f"/v1/groups/{args.group}/pull", json=body)
            if response.status_code >= 400:
                raise SystemExit(f"error {response.status_code}: {response.text}")
            messages = response.json()["messages"]
            acks: dict[tuple[str, int], list[int]] = {}
            for message in messages:
                sys.stdout.write(json.dumps(message) + "\n")
                acks.setdefault((message["topic"], message["qid"]), []).append(message["offset"])
                printed += 1
            sys.stdout.flush()
            results = (
                []
                if args.no_ack
                else [{"topic": t, "qid": q, "acks": offsets} for (t, q), offsets in acks.items()]
            )
        if results:
            client.post(f"/v1/groups/{args.group}/ack", json={"results": results})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cproxy", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the service")
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.add_argument("--data-dir", type=Path)
    s.add_argument("--config", type=Path, help="TOML file (topics, groups, tokens, limits)")
    s.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    s.add_argument("--log-format", choices=["text", "json"])
    for name, helptext in (
        ("topics", "list or create topics"),
        ("groups", "list or show groups"),
        ("produce", "produce one message"),
        ("tail", "pull and print"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--url", default="http://127.0.0.1:9713")
        p.add_argument("--token")
        if name == "topics":
            p.add_argument("action", choices=["list", "create", "show"], nargs="?", default="list")
            p.add_argument("name", nargs="?")
            p.add_argument("--queues", type=int, default=1)
        elif name == "groups":
            p.add_argument("name", nargs="?", help="show this group's config and stats")
        elif name == "produce":
            p.add_argument("topic")
            p.add_argument("body", help="JSON body, e.g. '{\"ride\": 7}'")
            p.add_argument("--key")
            p.add_argument("--id")
        else:
            p.add_argument("group")
            p.add_argument("--count", type=int)
            p.add_argument("--no-ack", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            settings = load_settings(
                args.config,
                host=args.host,
                port=args.port,
                data_dir=args.data_dir,
                log_level=args.log_level,
                log_format=args.log_format,
            )
            serve(settings)
        elif args.command == "topics":
            if args.action == "create":
                _print(
                    _call(args, "POST", "/v1/topics", {"name": args.name, "queues": args.queues})
                )
            elif args.action == "show":
                _print(_call(args, "GET", f"/v1/topics/{args.name}"))
            else:
                _print(_call(args, "GET", "/v1/topics"))
        elif args.command == "groups":
            _print(_call(args, "GET", f"/v1/groups/{args.name}" if args.name else "/v1/groups"))
        elif args.command == "produce":
            try:
                body = json.loads(args.body)
            except json.JSONDecodeError as exc:
                raise SystemExit(f"body is not valid JSON: {exc}") from exc
            message = {"key": args.key, "body": body, "id": args.id}
            _print(
                _call(args, "POST", f"/v1/topics/{args.topic}/messages", {"messages": [message]})
            )
        elif args.command == "tail":
            _tail(args)
    except CproxyError as exc:
        raise SystemExit(f"cproxy: {exc.message}") from exc
    except httpx.HTTPError as exc:
        raise SystemExit(f"cproxy: cannot reach {args.url}: {exc}") from exc


if __name__ == "__main__":
    main()
