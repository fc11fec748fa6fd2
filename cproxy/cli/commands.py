"""The client commands of ``cproxy``: each one call (or a pull loop) through the SDK client.

Every command prints JSON on stdout. Errors are raised as :class:`CommandError` (a usage
problem the parser could not see) or as the SDK's :class:`~consumer_sdk.ClientError`;
``cproxy.cli.main`` prints both in one format.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Any

from consumer_sdk import NO_RETRY, Client, ClientError, Message, QueueResult


class CommandError(Exception):
    """Arguments that parse but do not make a valid command (e.g. ``topics show`` without
    a name); printed as a usage error."""


def _print(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _need(value: Any, what: str) -> Any:
    if value is None:
        raise CommandError(f"{what} is required")
    return value


def _json_arg(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandError(f"{what} is not valid JSON: {exc}") from exc


def client_for(args: argparse.Namespace) -> Client:
    """An SDK client for ``--url``/``--token`` (or ``$CPROXY_TOKEN``) and ``--ca-file`` (or
    ``$CPROXY_CA_FILE``; without one an https:// server is checked against the usual CAs)."""
    token = args.token or os.environ.get("CPROXY_TOKEN")
    verify = args.ca_file if args.ca_file is not None else True
    try:
        return Client(args.url, token=token, timeout_ms=args.timeout_ms, verify=verify)
    except ValueError as exc:  # a malformed --url, or a --ca-file that does not load
        raise CommandError(str(exc)) from exc


# -- topics -------------------------------------------------------------------------------------
def topics(args: argparse.Namespace, client: Client) -> None:
    if args.action == "list":
        _print({"topics": [asdict(t) for t in client.list_topics()]})
        return
    name = _need(args.name, f"'topics {args.action}': the topic name")
    if args.action == "create":
        _print(asdict(client.create_topic(name, args.queues)))
    else:
        _print(client.get_topic(name))


def produce(args: argparse.Namespace, client: Client) -> None:
    headers = {}
    for item in args.header:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CommandError(f"--header wants NAME=VALUE, got {item!r}")
        headers[name] = value
    message = {
        "body": _json_arg(args.body, "body"),
        "key": args.key,
        "id": args.id,
        "qid": args.qid,
        "headers": headers or None,
        "delay_ms": args.delay_ms,
    }
    _print({"results": [asdict(r) for r in client.produce(args.topic, [message])]})


# -- groups -------------------------------------------------------------------------------------
GROUP_ACTIONS = ("list", "show", "create", "delete", "seek", "replay")


def groups(args: argparse.Namespace, client: Client) -> None:
    action, name = args.action, args.name
    if action not in GROUP_ACTIONS:  # 'cproxy groups NAME': show it (the original form)
        if name is not None:
            raise CommandError(f"unknown groups action {action!r}; use {', '.join(GROUP_ACTIONS)}")
        action, name = "show", action
    if action == "list":
        _print({"groups": [asdict(g) for g in client.list_groups()]})
        return
    name = _need(name, f"'groups {action}': the group name")
    if action == "show":
        _print(client.get_group(name))
    elif action == "create":
        _print(client.put_group(name, _group_config(args)))
    elif action == "delete":
        client.delete_group(name)
        _print({"deleted": name})
    elif action == "replay":
        value = _need(args.order_value, "'groups replay': --order-value")
        _print(client.replay(name, _one_topic(args), value, _replay_from(args)))
    else:
        _print(client.seek(name, _one_topic(args), _seek_target(args), args.qid))


def _group_config(args: argparse.Namespace) -> dict[str, Any]:
    if not args.topic:
        raise CommandError("'groups create' needs at least one --topic TOPIC[=ORDER_BY]")
    per_topic: dict[str, Any] = {}
    for field in ("filter", "transform"):
        if getattr(args, field) is not None:
            per_topic[field] = getattr(args, field)
    push = _push_config(args)
    if push is not None:
        per_topic["push"] = push
    topic_map: dict[str, dict[str, Any]] = {}
    for item in args.topic:
        topic, _, order_by = item.partition("=")
        topic_map[topic] = {"order_by": order_by or args.order_by, **per_topic}
    config: dict[str, Any] = {"topics": topic_map}
    if args.retry_backoff_ms is not None:
        try:
            config["retry_backoff_ms"] = [int(v) for v in args.retry_backoff_ms.split(",")]
        except ValueError:
            raise CommandError("--retry-backoff-ms wants integers like 1000,5000") from None
    for field in (
        "max_attempts",
        "ack_timeout_ms",
        "start",
        "on_exhausted",
        "max_buffered",
        "stuck_after_ms",
        "dead_letter_retention_ms",
        "max_per_second",
    ):
        value = getattr(args, field)
        if value is not None:
            config[field] = value
    return config


def _push_config(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``push`` entry from the ``--push-*`` flags, or None without ``--push-url``."""
    extras = {
        "max_in_flight": args.push_max_in_flight,
        "timeout_ms": args.push_timeout_ms,
        "secret": args.push_secret,
    }
    if args.push_url is None:
        given = [f"--push-{k.replace('_', '-')}" for k, v in extras.items() if v is not None]
        if given:
            raise CommandError(f"{', '.join(given)} need(s) --push-url")
        return None
    return {"url": args.push_url, **{k: v for k, v in extras.items() if v is not None}}


def _one_topic(args: argparse.Namespace) -> str:
    if len(args.topic) != 1:
        raise CommandError(f"'groups {args.action}' needs exactly one --topic")
    topic: str = args.topic[0]
    return topic


def _seek_target(args: argparse.Namespace) -> str | int | dict[str, int]:
    if (args.to is None) == (args.timestamp_ms is None):
        raise CommandError("'groups seek' needs one of --to or --timestamp-ms")
    if args.timestamp_ms is not None:
        return {"timestamp_ms": args.timestamp_ms}
    if args.to in ("earliest", "latest"):
        return str(args.to)
    try:
        offset = int(args.to)
    except ValueError:
        raise CommandError(f"--to wants earliest, latest or an offset, got {args.to!r}") from None
    if offset < 0:
        raise CommandError("--to: an offset is >= 0")
    return offset


def _replay_from(args: argparse.Namespace) -> str | int | dict[str, int]:
    if args.timestamp_ms is not None:
        return {"timestamp_ms": args.timestamp_ms}
    if args.replay_from == "earliest":
        return "earliest"
    try:
        offset = int(args.replay_from)
    except ValueError:
        raise CommandError(
            f"--from wants earliest or an offset, got {args.replay_from!r}"
        ) from None
    if offset < 0:
        raise CommandError("--from: an offset is >= 0")
    return offset


# -- operations ---------------------------------------------------------------------------------
def _refs(texts: list[str] | None) -> list[tuple[str, int, int]] | None:
    """``--message TOPIC:QID:OFFSET`` values as message refs (None when none was given)."""
    if not texts:
        return None
    refs = []
    for text in texts:
        topic, _, rest = text.rpartition(":")
        topic, _, qid = topic.rpartition(":")
        if not topic or not qid.isdigit() or not rest.isdigit():
            raise CommandError(f"--message: expected TOPIC:QID:OFFSET, got {text!r}")
        refs.append((topic, int(qid), int(rest)))
    return refs


def _confirm(question: str) -> None:
    """Ask on the terminal; refuse without one (``--yes`` skips the question)."""
    if not sys.stdin.isatty():
        raise CommandError(f"{question} Not confirmed: run it on a terminal, or add --yes")
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise CommandError("not confirmed: nothing deleted")


def dead_letters(args: argparse.Namespace, client: Client) -> None:
    refs = _refs(args.message)
    if args.action == "list":
        rows = client.dead_letters(args.group, topic=args.topic, limit=args.limit)
        _print({"dead_letters": rows})
    elif args.action == "redrive":
        _print({"redriven": client.redrive(args.group, args.topic, refs)})
    else:
        if refs is None and args.topic is None:
            raise CommandError("'dead-letters delete' needs --message or --topic")
        if refs is not None and args.topic is not None:
            raise CommandError("'dead-letters delete': --message or --topic, not both")
        if not args.yes:
            what = f"{len(refs)} dead letter(s)" if refs else f"every dead letter of {args.topic!r}"
            _confirm(f"Delete {what} of group {args.group!r} for good?")
        _print({"deleted": client.delete_dead_letters(args.group, topic=args.topic, messages=refs)})


def peek(args: argparse.Namespace, client: Client) -> None:
    """Print stored messages, one JSON object per line (no group: nothing is touched)."""
    page = client.browse(
        args.topic,
        qid=args.qid,
        start=args.start,
        from_ms=args.from_ms,
        last=args.last,
        limit=args.limit,
    )
    for message in page["messages"]:
        sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def blocked(args: argparse.Namespace, client: Client) -> None:
    if args.action == "list":
        _print({"blocked_keys": client.blocked_keys(args.group, topic=args.topic)})
        return
    topic = _need(args.topic, f"'blocked {args.action}': --topic")
    if args.order_value is None and (args.qid is None or args.offset is None):
        raise CommandError(f"'blocked {args.action}' needs --order-value, or --qid and --offset")
    act = client.skip if args.action == "skip" else client.release
    head = args.order_value if args.order_value is not None else (args.qid, args.offset)
    topic_, qid, offset = act(args.group, topic, head)
    word = "skipped" if args.action == "skip" else "released"
    _print({word: {"topic": topic_, "qid": qid, "offset": offset}})


# -- tail / peek --------------------------------------------------------------------------------
#: Most messages one pull of ``tail`` asks for.
TAIL_BATCH = 100


def _acks(messages: Iterable[Message]) -> list[QueueResult]:
    by_queue: dict[tuple[str, int], list[int]] = {}
    for m in messages:
        by_queue.setdefault((m.topic, m.qid), []).append(m.offset)
    return [QueueResult(t, q, acks=tuple(offsets)) for (t, q), offsets in by_queue.items()]


def tail(args: argparse.Namespace, client: Client) -> None:
    """Pull and print until ``--count`` messages were printed (or forever).

    Never asks for more than the messages still wanted, so ``--count 1`` takes (and acks) one.
    A message is acked only once printed; acks ride on the next pull, and the last ones (or
    those pending on Ctrl-C) go in one ack call.
    """
    printed = 0
    shown: list[Message] = []
    try:
        while args.count is None or printed < args.count:
            wanted = TAIL_BATCH if args.count is None else min(TAIL_BATCH, args.count - printed)
            answer = client.pull(
                args.group,
                max_messages=wanted,
                wait_ms=args.wait_ms,
                topics=args.topic,
                results=_acks(shown),
            )
            shown = []
            for message in answer.messages:
                sys.stdout.write(json.dumps(message.to_dict()) + "\n")
                sys.stdout.flush()
                printed += 1
                if not args.no_ack:
                    shown.append(message)
    finally:
        if shown:
            _flush_acks(client, args.group, _acks(shown))


def _flush_acks(client: Client, group: str, pending: list[QueueResult]) -> None:
    try:
        client.ack(group, pending, retry=NO_RETRY)
    except ClientError as exc:
        # Not fatal: unacked messages are delivered again after the group's ack timeout.
        sys.stderr.write(f"cproxy: warning: could not ack printed messages: {exc}\n")


COMMANDS: dict[str, Callable[[argparse.Namespace, Client], None]] = {
    "topics": topics,
    "groups": groups,
    "produce": produce,
    "tail": tail,
    "peek": peek,
    "dead-letters": dead_letters,
    "blocked": blocked,
}
