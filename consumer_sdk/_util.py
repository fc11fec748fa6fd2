"""Small helpers shared by the consumer modules."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from consumer_sdk.client import AsyncClient
from consumer_sdk.errors import ClientError, ResourceNotFound
from consumer_sdk.models import Message

log = logging.getLogger("consumer_sdk.consumer")


def describe(exc: BaseException) -> str:
    """The error string sent with a fail: ``"ValueError: boom"``."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def message_label(msg: Message) -> str:
    return f"{msg.topic}/{msg.qid}@{msg.offset}"


def group_body(ensure_group: Mapping[str, Any], topics: Sequence[str] | None) -> dict[str, Any]:
    """The ``PUT /v1/groups/{g}`` body for a consumer's ``ensure_group``.

    ``topics`` defaults to the consumer's topics; a top-level ``order_by`` applies to each.
    """
    body = dict(ensure_group)
    order_by = body.pop("order_by", None)
    if "topics" not in body:
        if not topics:
            raise ValueError("ensure_group needs 'topics', or pass topics= to the consumer")
        body["topics"] = {t: ({"order_by": order_by} if order_by else {}) for t in topics}
    elif order_by is not None:
        raise ValueError("ensure_group: give 'order_by' per topic inside 'topics', not both")
    return body


def ack_timeout_of(config: Mapping[str, Any]) -> int | None:
    """``ack_timeout_ms`` from a group config or ``GET /v1/groups/{g}`` answer, if present."""
    for source in (config, config.get("config")):
        if isinstance(source, Mapping) and isinstance(source.get("ack_timeout_ms"), int):
            return int(source["ack_timeout_ms"])
    return None


async def prepare_group(
    clients: Sequence[AsyncClient], group: str, body: Mapping[str, Any] | None, read: bool
) -> int | None:
    """PUT the group config ``body`` on every server, and return the group's ack timeout
    (reading the config with GET when ``read`` and the PUT did not tell).

    A server that cannot be reached is skipped with a warning (its puller retries later) as
    long as one server accepted the config; errors that retrying cannot fix are raised.
    """
    found: int | None = None
    if body is not None:
        failures: list[ClientError] = []
        for client in clients:
            try:
                answer = await client.put_group(group, body)
            except ClientError as exc:
                if not exc.retryable:
                    raise
                log.warning("cannot create group %r on %s: %s", group, client.url, exc)
                failures.append(exc)
                continue
            found = found or ack_timeout_of(answer)
        if len(failures) == len(clients):
            raise failures[-1]
    if found is not None or not read:
        return found
    for client in clients:
        try:
            return ack_timeout_of(await client.get_group(group))
        except ClientError as exc:
            if not exc.retryable:
                raise
            log.warning("cannot read group %r from %s yet: %s", group, client.url, exc)
    return None


async def recreate_group(
    client: AsyncClient, group: str, body: Mapping[str, Any] | None, exc: ClientError
) -> bool:
    """After ``exc`` from ``client``: when it says the group is missing and ``body`` (the
    consumer's ``ensure_group``) is given, PUT the group on that server (one that was down at
    start, or lost it); True if that worked."""
    if body is None or not (isinstance(exc, ResourceNotFound) and exc.code == "group_not_found"):
        return False
    try:
        await client.put_group(group, body)
    except ClientError as error:
        log.warning("cannot create group %r on %s: %s", group, client.url, error)
        return False
    log.warning("group %r was missing on %s: created it", group, client.url)
    return True
