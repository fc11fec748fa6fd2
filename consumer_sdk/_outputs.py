"""A handler's outputs (``Produce``): its message's ack and the outputs in one call.

The server stores both in one transaction (docs/guarantees.md, guarantee 10), so the outputs
of one input are stored exactly once. The call goes out as soon as the handler returns, on
its own (never on a pull), fenced by the delivery's attempt. A 409 ``stale_results`` means
the delivery is no longer current (it timed out and went to another consumer, or this very
call already applied and its answer was lost): the outputs are dropped, the input is handled
again by whoever has it now. Results of the same server still waiting to be sent go first,
so an earlier message's ack never arrives after a later one's outputs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from consumer_sdk.client import AsyncClient
from consumer_sdk.config import RetryPolicy
from consumer_sdk.errors import ApiError, ClientError
from consumer_sdk.models import Produce, QueueResult

from ._ledger import Delivery, Ledger
from ._util import message_label

log = logging.getLogger("consumer_sdk.consumer")


def outputs_of(returned: object) -> list[Produce] | None:
    """The outputs a handler returned: a ``Produce`` or a non-empty list/tuple of them;
    None for anything else (a plain ack, as a handler returning None gets)."""
    if isinstance(returned, Produce):
        return [returned]
    if (
        isinstance(returned, list | tuple)
        and returned
        and all(isinstance(p, Produce) for p in returned)
    ):
        return list(returned)
    return None


async def send_outputs(
    client: AsyncClient,
    group: str,
    ledger: Ledger,
    retry: RetryPolicy,
    delivery: Delivery,
    outputs: Sequence[Produce],
) -> bool:
    """Ack ``delivery`` (from ``client``'s server) with ``outputs``: one call, retried per
    ``retry``; True when they were stored."""
    index, msg = delivery.server, delivery.message
    try:
        earlier = ledger.take_results(index)
        if earlier:
            try:
                await client.ack(group, earlier, retry=retry)
            except ClientError:
                ledger.restore_results(index, earlier)
                raise
        result = QueueResult(
            msg.topic, msg.qid, acks=(msg.offset,), attempts=((msg.offset, msg.attempt),)
        )
        await client.ack(group, [result], retry=retry, produce=outputs)
        ledger.count("acked")
        return True
    except ApiError as exc:
        if exc.code != "stale_results":
            _gave_up(client.url, msg, exc)
        else:
            ledger.count("unknown_results")
            log.info(
                "%s: %s is no longer this consumer's delivery; its outputs are dropped (it is "
                "handled again where it is delivered now)",
                client.url,
                message_label(msg),
            )
    except ClientError as exc:
        _gave_up(client.url, msg, exc)
    return False


def _gave_up(url: str, msg: object, exc: ClientError) -> None:
    log.warning(
        "%s: ack with outputs failed (%s); the message is delivered again after its ack "
        "timeout and its outputs are made again then",
        url,
        exc,
    )
