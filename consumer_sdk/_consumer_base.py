"""What :class:`~consumer_sdk.Consumer` and :class:`~consumer_sdk.AsyncConsumer` share: their
arguments, turned into settings in one place, and the loop core they build from them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from consumer_sdk._tls import Verify
from consumer_sdk.config import ConsumerConfig, ConsumerOptions

from ._core import ConsumerCore, Dispatcher
from ._ledger import ConsumerStats
from ._util import group_body


def server_list(servers: str | Sequence[str]) -> list[str]:
    """One base URL or several, as a non-empty list."""
    urls = [servers] if isinstance(servers, str) else list(servers)
    if not urls:
        raise ValueError("give at least one server URL")
    return urls


class ConsumerBase:
    """Validated arguments and the shared read-only surface of both consumers.

    Everything is checked here, at construction, so a bad option or group config fails in the
    constructor rather than inside ``start()``.
    """

    def __init__(
        self,
        servers: str | Sequence[str],
        *,
        group: str,
        topics: Sequence[str] | None,
        ensure_group: Mapping[str, Any] | None,
        token: str | None,
        handle_signals: bool,
        transport: httpx.AsyncBaseTransport | None,
        options: ConsumerOptions,
        verify: Verify = True,
        discover: bool = False,
    ) -> None:
        self.servers = server_list(servers)
        self.group = group
        self.topics = list(topics) if topics is not None else None
        #: The validated settings (see :class:`~consumer_sdk.ConsumerConfig`).
        self.config = ConsumerConfig.from_options(options)
        self._ensure_group = group_body(ensure_group, topics) if ensure_group is not None else None
        self._token = token
        self._handle_signals = handle_signals
        self._transport = transport
        self._verify = verify
        self._discover = discover
        self._core: ConsumerCore | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(group={self.group!r}, servers={self.servers!r})"

    @property
    def active_servers(self) -> list[str]:
        """The servers pulled from now: ``servers``, or with ``discover=True`` the live proxies
        last discovered (empty before ``start()``)."""
        return self._core.active_servers if self._core is not None else []

    def stats(self) -> ConsumerStats:
        """Counters of this consumer (pulls, acks, fails, outstanding...)."""
        return self._core.stats() if self._core is not None else ConsumerStats()

    def _new_core(self, dispatcher: Dispatcher) -> ConsumerCore:
        return ConsumerCore(
            self.servers,
            self.group,
            self.topics,
            self.config,
            dispatcher,
            token=self._token,
            ensure_group=self._ensure_group,
            transport=self._transport,
            verify=self._verify,
            discover=self._discover,
        )
