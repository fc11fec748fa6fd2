# cproxy: compiled (mypyc), see cproxy/_native.py
"""Produce-time delays: ``delay_ms`` becomes ``deliver_at_ms`` on the broker's clock.

Compiled (``cproxy._native``): ``check_delays`` walks every produced message."""

from __future__ import annotations

from collections.abc import Sequence

from cproxy.errors import InvalidRequest
from cproxy.model import NewMessage


def check_delays(messages: Sequence[NewMessage], now_ms: int, max_delay_ms: int) -> None:
    """Set ``deliver_at_ms = now_ms + delay_ms`` (in place) for each message given a delay, and
    refuse (``InvalidRequest``, a 422) a message due more than ``max_delay_ms`` from now.

    A ``deliver_at_ms`` in the past is kept as it is: it means no delay.
    """
    for i, message in enumerate(messages):
        delay = message.delay_ms
        if delay is not None:
            if delay > max_delay_ms:
                raise InvalidRequest(
                    f"messages[{i}].delay_ms is {delay}; the limit is {max_delay_ms} "
                    "(limits.max_delay_ms)"
                )
            message.deliver_at_ms = now_ms + delay
        elif message.deliver_at_ms is not None and message.deliver_at_ms - now_ms > max_delay_ms:
            raise InvalidRequest(
                f"messages[{i}].deliver_at_ms is {message.deliver_at_ms - now_ms} ms from now; "
                f"the limit is {max_delay_ms} (limits.max_delay_ms)"
            )
