"""``cproxy serve | token | topics | groups | produce | tail | peek | dead-letters | blocked``.

``serve`` runs the service (HTTPS with ``--tls-cert``/``--tls-key``); ``token`` makes bearer
tokens and their digests offline; the other commands are a client of a running server, built
on the SDK's :class:`consumer_sdk.Client` (``--url``, default http://127.0.0.1:9713;
``--token`` or ``CPROXY_TOKEN`` for auth; ``--ca-file`` or ``CPROXY_CA_FILE`` for a private
CA). ``main`` is the ``cproxy`` entry point, and ``python -m cproxy.cli`` runs it too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from consumer_sdk import ClientError
from cproxy.cli.commands import COMMANDS, CommandError, client_for
from cproxy.cli.parser import build_parser
from cproxy.cli.serve import serve
from cproxy.cli.token import TokenInputError, token_command
from cproxy.config import load_settings
from cproxy.errors import CproxyError

__all__ = ["build_parser", "main", "serve"]

#: Exit status after Ctrl-C, as a shell reports a process ended by SIGINT.
EXIT_INTERRUPTED = 130


#: ``serve``'s settings that may come from the environment (containers set these, not argv):
#: a flag wins over its variable, the variable over the config file.
SERVE_ENVIRONMENT = {
    "config": "CPROXY_CONFIG",
    "host": "CPROXY_HOST",
    "port": "CPROXY_PORT",
    "data_dir": "CPROXY_DATA_DIR",
    "store": "CPROXY_STORE",
}


def serve_arguments(args: Any, environ: Mapping[str, str]) -> dict[str, Any]:
    """``serve``'s flags, each missing one taken from its ``CPROXY_*`` variable if set."""
    out: dict[str, Any] = {}
    for name, variable in SERVE_ENVIRONMENT.items():
        value = getattr(args, name)
        raw = environ.get(variable, "")
        if value is None and raw:
            if name == "port":
                try:
                    value = int(raw)
                except ValueError:
                    raise SystemExit(
                        f"cproxy: error: {variable} must be a port number, got {raw!r}"
                    ) from None
            else:
                value = Path(raw) if name in ("config", "data_dir") else raw
        out[name] = value
    return out


def main(argv: list[str] | None = None) -> None:
    """Run one ``cproxy`` command; exits with status 1 on an error, 2 on a usage error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        given = serve_arguments(args, os.environ)
        try:
            settings = load_settings(
                given["config"],
                host=given["host"],
                port=given["port"],
                data_dir=given["data_dir"],
                log_level=args.log_level,
                log_format=args.log_format,
                tls_cert=args.tls_cert,
                tls_key=args.tls_key,
                store_url=given["store"],
                node_id=args.node_id,
                advertise_url=args.advertise_url,
            )
        except CproxyError as exc:
            raise SystemExit(f"cproxy: error: {exc.message}") from exc
        serve(settings)
        return
    if args.command == "token":
        try:
            token_command(args.action)
        except TokenInputError as exc:
            raise SystemExit(f"cproxy: error: {exc}") from exc
        return
    command = COMMANDS[args.command]
    try:
        with client_for(args) as client:
            command(args, client)
    except CommandError as exc:
        parser.exit(2, f"cproxy {args.command}: error: {exc}\n")
    except ClientError as exc:
        raise SystemExit(f"cproxy: error: {exc}") from exc
    except KeyboardInterrupt:
        sys.stderr.write("cproxy: interrupted\n")
        raise SystemExit(EXIT_INTERRUPTED) from None
