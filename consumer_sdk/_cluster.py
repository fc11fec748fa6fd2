"""Many proxies of one cluster (docs/scaling.md): finding them, and choosing among them.

- Discovery: ``GET /v1/cluster`` of the first given proxy that answers lists the live proxies
  (``members[].url``, each one's ``--advertise-url``). A ``404`` means the server runs alone on
  SQLite: the given URLs are all there is.
- :class:`ProxyChoice`: which proxy a producer sends to. Each producer starts at a random one
  of the discovered (or given) proxies, so many producers spread over the cluster, and stays
  with the one that answers; one that is down costs a fail-over to the next, not an error.
- Re-discovery (``ConsumerCore._rediscover``) asks again every ``discover_interval_ms`` with
  :func:`adiscover`, gives a joining proxy a puller and retires the puller of one that left.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar

from consumer_sdk._base import Call
from consumer_sdk._wire import mapping
from consumer_sdk.client import AsyncClient, Client
from consumer_sdk.config import NO_RETRY
from consumer_sdk.errors import ClientError, ResourceNotFound

log = logging.getLogger("consumer_sdk.cluster")

_CLUSTER: Call[dict[str, Any]] = Call("GET", "/v1/cluster", mapping)

C = TypeVar("C", bound=Client | AsyncClient)


def unique_urls(urls: Iterable[str]) -> list[str]:
    """URLs without trailing slashes and without repeats, in their first order."""
    return list(dict.fromkeys(u.rstrip("/") for u in urls))


def _member_urls(answer: dict[str, Any]) -> list[str]:
    members = answer.get("members")
    found = [
        m["url"]
        for m in (members if isinstance(members, list) else [])
        if isinstance(m, dict)
        and isinstance(m.get("url"), str)
        and m["url"].startswith(("http://", "https://"))
    ]
    return unique_urls(found)


def _not_a_cluster(exc: ClientError) -> bool:
    return isinstance(exc, ResourceNotFound)


def _no_answer(errors: list[ClientError]) -> ClientError:
    log.warning("no proxy answered GET /v1/cluster: %s", errors[-1])
    return errors[-1]


def discover(clients: Sequence[Client]) -> list[str] | None:
    """The live proxies' URLs, asked of each client in turn (once each) until one answers.

    None when the server says it is not in a cluster (404: a single proxy on SQLite). Raises
    the last error when nobody answered, and at once an error that retrying cannot fix (e.g.
    401/403: the token may not read topics).
    """
    errors: list[ClientError] = []
    for client in clients:
        try:
            return _member_urls(client._send(_CLUSTER, NO_RETRY))
        except ClientError as exc:
            if _not_a_cluster(exc):
                return None
            if not exc.retryable:
                raise
            errors.append(exc)
    raise _no_answer(errors)


async def adiscover(clients: Sequence[AsyncClient]) -> list[str] | None:
    """The ``async`` twin of :func:`discover`."""
    errors: list[ClientError] = []
    for client in clients:
        try:
            return _member_urls(await client._send(_CLUSTER, NO_RETRY))
        except ClientError as exc:
            if _not_a_cluster(exc):
                return None
            if not exc.retryable:
                raise
            errors.append(exc)
    raise _no_answer(errors)


def discovered(
    given: list[C], members: list[str] | None, make: Callable[[str], C]
) -> ProxyChoice[C]:
    """What a producer sends to after discovery: the ``members`` (new clients from ``make``),
    then the ``given`` clients that are not members, as fall-backs. No members (a 404, or an
    empty list): just the given ones."""
    if not members:
        return ProxyChoice(given)
    by_url = {c.url: c for c in given}
    urls = unique_urls([*members, *by_url])
    return ProxyChoice([by_url.get(u) or make(u) for u in urls], spread=len(members))


class ProxyChoice(Generic[C]):
    """The proxies of a producer and the one it sends to now (not locked: the producers
    serialise :meth:`replace`; a racing :meth:`answered` only moves the next call's start).

    ``spread``: the first proxy is chosen at random among the first ``spread`` clients (the
    discovered members; the rest are fall-backs), so producers spread over the cluster while
    each keeps its connections to one proxy.
    """

    def __init__(self, clients: list[C], spread: int | None = None) -> None:
        self.clients: list[C] = clients
        self.current = random.randrange(min(spread or len(clients), len(clients)))

    @property
    def client(self) -> C:
        return self.clients[self.current]

    def attempts(self) -> list[tuple[C, bool]]:
        """Every client, the current one first then in list order, each with "is the last"."""
        n = len(self.clients)
        order = [self.clients[(self.current + i) % n] for i in range(n)]
        return [(c, i == n - 1) for i, c in enumerate(order)]

    def answered(self, client: C) -> None:
        """``client`` answered: the following calls go to it too."""
        self.current = self.clients.index(client)
