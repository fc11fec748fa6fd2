"""The ``cproxy`` command line: every command, flag, default and help text in one place."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TypeAlias

from cproxy import __version__, _native

DEFAULT_URL = "http://127.0.0.1:9713"
#: What ``add_subparsers()`` returns.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

DESCRIPTION = """\
cproxy: ordered delivery per key without head-of-line blocking.

'cproxy serve' runs the service. The other commands are a client of a running server:
--url (default $CPROXY_URL or http://127.0.0.1:9713), --token (default $CPROXY_TOKEN) and,
for https, --ca-file (default $CPROXY_CA_FILE). 'cproxy token new|hash' makes tokens.
Results print as JSON (tail/peek: one JSON object per line); errors print one line,
'cproxy: error: ...', and exit with status 1 (2 for a usage error, 130 on Ctrl-C).
"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and '(default: X)' after every flag with a default value
    (flags without one say in their help what happens when they are left out)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if default in (None, [], False, argparse.SUPPRESS) or "default" in text:
            return text
        return f"{text} (default: {default})"


def _int_at_least(low: int) -> type[int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse  # type: ignore[return-value]


def _client_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=os.environ.get("CPROXY_URL", DEFAULT_URL),
        help="base URL of the server ($CPROXY_URL)",
    )
    p.add_argument(
        "--token",
        default=None,
        help="bearer token (default: $CPROXY_TOKEN, or none when auth is off)",
    )
    p.add_argument(
        "--timeout-ms",
        type=_int_at_least(1),
        default=40_000,
        help="how long one HTTP call may take, in milliseconds",
    )
    p.add_argument(
        "--ca-file",
        type=Path,
        default=os.environ.get("CPROXY_CA_FILE") or None,
        help="PEM CA bundle that signed the server's certificate, for an https:// URL "
        "(default: $CPROXY_CA_FILE, else the usual trusted CAs)",
    )


def _add(sub: Commands, name: str, text: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=text, description=text, formatter_class=_Formatter)


def _serve(sub: Commands) -> None:
    s = _add(
        sub,
        "serve",
        "run the service (flags override $CPROXY_* variables, which override the config file)",
    )
    s.add_argument(
        "--host", help="interface to bind ($CPROXY_HOST; default: from the file, else 127.0.0.1)"
    )
    s.add_argument(
        "--port", type=int, help="port to bind ($CPROXY_PORT; default: from the file, else 9713)"
    )
    s.add_argument(
        "--data-dir",
        type=Path,
        help="SQLite data directory ($CPROXY_DATA_DIR; default: ./cproxy-data)",
    )
    s.add_argument(
        "--config", type=Path, help="TOML file: topics, groups, tokens, limits ($CPROXY_CONFIG)"
    )
    s.add_argument(
        "--tls-cert",
        type=Path,
        help="PEM certificate (chain) to serve HTTPS; needs --tls-key (default: plain HTTP)",
    )
    s.add_argument(
        "--tls-key", type=Path, help="PEM private key of --tls-cert, without a passphrase"
    )
    s.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], help="(default: info)"
    )
    s.add_argument("--log-format", choices=["text", "json"], help="(default: text)")
    s.add_argument(
        "--store",
        metavar="URL",
        help="postgresql://user@host:5432/db: run on PostgreSQL, one cluster with every proxy "
        "on that database ($CPROXY_STORE; default: SQLite in --data-dir)",
    )
    s.add_argument("--node-id", help="cluster: this proxy's name (default: <hostname>-<port>)")
    s.add_argument(
        "--advertise-url", help="cluster: the URL clients reach this proxy at (default: bound)"
    )


def _token(sub: Commands) -> None:
    p = _add(
        sub,
        "token",
        "make bearer tokens for the config file: 'new' prints a random token and its SHA-256 "
        "(JSON); 'hash' reads a token on stdin and prints its SHA-256, for token_sha256",
    )
    p.add_argument("action", choices=["new", "hash"], help="what to do")


def _topics(sub: Commands) -> None:
    p = _add(sub, "topics", "list, show or create topics")
    _client_flags(p)
    p.add_argument(
        "action", choices=["list", "show", "create"], nargs="?", default="list", help="what to do"
    )
    p.add_argument("name", nargs="?", help="the topic (required by show and create)")
    p.add_argument(
        "--queues", type=_int_at_least(1), default=1, help="queues of a new topic (create)"
    )


def _groups(sub: Commands) -> None:
    p = _add(
        sub,
        "groups",
        "list, show, create, delete, seek or replay consumer groups "
        "('cproxy groups NAME' is 'cproxy groups show NAME')",
    )
    _client_flags(p)
    p.add_argument(
        "action",
        nargs="?",
        default="list",
        help="list | show | create | delete | seek | replay (or a group name to show)",
    )
    p.add_argument("name", nargs="?", help="the group (required by every action but list)")
    p.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="TOPIC[=ORDER_BY]",
        help="create: a topic to read, repeatable; ORDER_BY is qid, key, none or a JSON path "
        "(default: --order-by). seek: the one topic to move. replay: the one topic",
    )
    p.add_argument("--order-by", default="key", help="create: order of topics without =ORDER_BY")
    p.add_argument(
        "--max-attempts", type=_int_at_least(1), help="create (default: the server's, 5)"
    )
    p.add_argument(
        "--retry-backoff-ms",
        help="create: comma-separated backoffs in ms, e.g. 1000,5000,30000 (default: the server's)",
    )
    p.add_argument("--ack-timeout-ms", type=_int_at_least(1), help="create (default: the server's)")
    p.add_argument("--start", choices=["earliest", "latest"], help="create (default: earliest)")
    p.add_argument(
        "--on-exhausted", choices=["dead_letter", "block"], help="create (default: dead_letter)"
    )
    p.add_argument("--max-buffered", type=_int_at_least(1), help="create (default: the server's)")
    p.add_argument(
        "--stuck-after-ms",
        type=_int_at_least(1),
        help="create: a head in flight this long is a blocked key (default: 60000)",
    )
    p.add_argument(
        "--dead-letter-retention-ms",
        type=_int_at_least(1),
        help="create: delete dead letters older than this (default: keep them)",
    )
    p.add_argument(
        "--max-per-second",
        type=_int_at_least(1),
        help="create: deliver at most this many messages a second (default: no limit)",
    )
    p.add_argument(
        "--filter",
        metavar="JMESPATH",
        help="create: deliver only messages for which this expression on {key, headers, body} "
        "is truthy (every --topic)",
    )
    p.add_argument(
        "--transform", metavar="JMESPATH", help="create: reshape delivered bodies (every --topic)"
    )
    p.add_argument(
        "--push-url", metavar="URL", help="create: the proxy POSTs messages here (every --topic)"
    )
    p.add_argument(
        "--push-max-in-flight", type=_int_at_least(1), help="create: with --push-url (default 64)"
    )
    p.add_argument(
        "--push-timeout-ms", type=_int_at_least(1), help="create: with --push-url (default 10000)"
    )
    p.add_argument(
        "--push-secret", help="create: with --push-url, sign requests (X-Cproxy-Signature)"
    )
    p.add_argument("--to", help="seek: earliest, latest or an offset (or use --timestamp-ms)")
    p.add_argument(
        "--timestamp-ms", type=_int_at_least(0), help="seek: a Unix time in ms (default: use --to)"
    )
    p.add_argument("--qid", type=_int_at_least(0), help="seek: one queue (default: all)")
    p.add_argument("--order-value", help="replay: the order value (a key, a JSON-path value)")
    p.add_argument(
        "--from",
        dest="replay_from",
        default="earliest",
        help="replay: earliest or an offset (default: earliest; or use --timestamp-ms)",
    )


def _produce(sub: Commands) -> None:
    p = _add(sub, "produce", "produce one message")
    _client_flags(p)
    p.add_argument("topic", help="the topic to produce to")
    p.add_argument("body", help="JSON body, e.g. '{\"ride\": 7}'")
    p.add_argument("--key", help="order key (default: none)")
    p.add_argument("--id", help="message id for dedup (default: none)")
    p.add_argument("--qid", type=_int_at_least(0), help="explicit queue (default: by key)")
    p.add_argument(
        "--delay-ms",
        type=_int_at_least(0),
        help="do not deliver before this many ms from now (default: at once)",
    )
    p.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a message header, repeatable",
    )


def _tail(sub: Commands) -> None:
    p = _add(
        sub,
        "tail",
        "CONSUMES: pull from GROUP, print (one JSON object per line) and ack, so the group's "
        "own consumers never get these messages; Ctrl-C stops. To look without touching, use "
        "'cproxy peek'",
    )
    _client_flags(p)
    p.add_argument("group", help="the consumer group to consume from")
    p.add_argument(
        "--count", type=_int_at_least(1), help="stop after this many messages (default: never)"
    )
    p.add_argument(
        "--no-ack",
        action="store_true",
        help="do not ack: each message still uses up a delivery attempt and holds its key "
        "until the group's ack timeout",
    )
    p.add_argument("--topic", action="append", help="only these topics, repeatable (default: all)")
    p.add_argument(
        "--wait-ms", type=_int_at_least(0), default=5000, help="long-poll wait of each pull"
    )


def _peek(sub: Commands) -> None:
    p = _add(
        sub,
        "peek",
        "print stored messages of a topic's queue (one JSON object per line) without any "
        "group: nothing is delivered, held or charged",
    )
    _client_flags(p)
    p.add_argument("topic", help="the topic to read")
    p.add_argument(
        "--qid", type=_int_at_least(0), help="the queue (default: 0 on a one-queue topic)"
    )
    start = p.add_mutually_exclusive_group()
    start.add_argument(
        "--from", dest="start", type=_int_at_least(0), help="first offset (default: the oldest)"
    )
    start.add_argument(
        "--from-ms", type=_int_at_least(0), help="first message produced at or after this time"
    )
    start.add_argument("--last", type=_int_at_least(1), help="the newest N messages")
    p.add_argument("--limit", type=_int_at_least(1), default=50, help="at most this many")


def _dead_letters(sub: Commands) -> None:
    p = _add(
        sub, "dead-letters", "list a group's dead letters, redrive them, or delete them for good"
    )
    _client_flags(p)
    p.add_argument("action", choices=["list", "redrive", "delete"], help="what to do")
    p.add_argument("group", help="the consumer group")
    p.add_argument("--topic", help="only this topic (default: all; delete: --topic or --message)")
    p.add_argument(
        "--message",
        action="append",
        metavar="TOPIC:QID:OFFSET",
        help="redrive/delete: just this dead letter, repeatable (default: all of --topic)",
    )
    p.add_argument("--yes", action="store_true", help="delete without asking for confirmation")
    p.add_argument(
        "--limit",
        type=_int_at_least(1),
        help="list: at most this many (default: the server's, 100)",
    )


def _blocked(sub: Commands) -> None:
    p = _add(
        sub,
        "blocked",
        "list a group's blocked keys; skip (dead-letter) or release (retry now) a blocked head",
    )
    _client_flags(p)
    p.add_argument("action", choices=["list", "skip", "release"], help="what to do")
    p.add_argument("group", help="the consumer group")
    p.add_argument("--topic", help="list: only this topic (default: all); skip/release: required")
    p.add_argument(
        "--order-value", help="skip/release: the blocked order value (or --qid/--offset)"
    )
    p.add_argument(
        "--qid",
        type=_int_at_least(0),
        help="skip/release: queue of the head (default: use --order-value)",
    )
    p.add_argument(
        "--offset",
        type=_int_at_least(0),
        help="skip/release: offset of the head (default: use --order-value)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The full ``cproxy`` parser (``--version``, ``serve`` and the client commands)."""
    parser = argparse.ArgumentParser(
        prog="cproxy", description=DESCRIPTION, formatter_class=_Formatter
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"cproxy {__version__} (hot path: {_native.describe()})",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _serve(sub)
    _token(sub)
    _topics(sub)
    _groups(sub)
    _produce(sub)
    _tail(sub)
    _peek(sub)
    _dead_letters(sub)
    _blocked(sub)
    return parser
