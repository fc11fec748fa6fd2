"""Where push may send: the one check of a push URL (DESIGN §4, push).

A push is a request the proxy makes from inside its network, so its destinations are the
operator's decision, not the API caller's:

- ``[push] allowed_urls`` lists URL prefixes (scheme, host and port equal, the path under the
  prefix's path). A URL under a listed prefix is the operator's choice: it is not checked
  further, whatever address its host has.
- Only a privileged caller (an admin token, the config file, or a server without tokens) may
  set a URL that is not listed; anyone else gets 403.
- An unlisted URL whose host is, or resolves to, a loopback, link-local, private, CGNAT,
  unspecified, multicast or reserved address is refused (422 ``push_target_refused``),
  ``localhost`` included. Names are resolved when the group is PUT and again at every
  connection (``guarded_addresses``, used by the pusher's resolver): a name that resolves
  to a public address at PUT and to an internal one later (DNS rebinding) is refused then.

``check_now`` is the rule (config-file groups, no DNS); ``check`` adds resolving the name
(``Broker.put_group``: PUT and PATCH); ``guarded_addresses`` is the rule at connect time.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Final
from urllib.parse import SplitResult, urlsplit

import anyio

from cproxy.errors import ConfigError, Forbidden, PushTargetRefused

#: ``(host, port, family) -> [(family, address)]``: name resolution (stubbed in tests).
Resolve = Callable[[str, int, int], Awaitable[list[tuple[int, str]]]]

#: How long resolving a name at PUT may take; an unresolved name is left to the connect check.
RESOLVE_AT_PUT_S: Final = 2.0
_CGNAT: Final = ipaddress.ip_network("100.64.0.0/10")
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


async def system_resolve(host: str, port: int, family: int) -> list[tuple[int, str]]:
    """The operating system's resolver (``getaddrinfo``), without blocking the loop."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, family=family, type=socket.SOCK_STREAM)
    return [(int(fam), str(addr[0])) for fam, _, _, _, addr in infos]


def internal(address: str) -> bool:
    """Whether ``address`` (an IP literal) is one a push may not reach unless listed."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_loopback
        or ip.is_link_local
        or ip.is_private
        or ip.is_unspecified
        or ip.is_multicast
        or ip.is_reserved
        or ip in _CGNAT
    )


def _literal(host: str) -> str | None:
    """``host`` as an IP address when it is one, legacy IPv4 forms (``127.1``,
    ``2130706433``, ``0x7f.1``) included; None for a name."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if host and all(c in "0123456789abcdefxABCDEFX." for c in host):
        try:
            return socket.inet_ntoa(socket.inet_aton(host))
        except OSError:
            return None
    return None


@dataclass(frozen=True, slots=True)
class _Prefix:
    scheme: str
    host: str
    port: int
    path: str

    def covers(self, url: SplitResult) -> bool:
        if (url.scheme, url.hostname, _port(url)) != (self.scheme, self.host, self.port):
            return False
        path = url.path or "/"
        return path.startswith(self.path) or path == self.path.rstrip("/")


def _port(url: SplitResult) -> int:
    return url.port if url.port is not None else _DEFAULT_PORTS[url.scheme]


def _split(url: str) -> SplitResult:
    parts = urlsplit(url)
    _port(parts)  # a bad port raises ValueError here, not later
    return parts


class PushTargets:
    """``[push] allowed_urls`` and the address rule; see the module docstring."""

    def __init__(self, allowed_urls: Iterable[str] = (), resolve: Resolve | None = None) -> None:
        prefixes = []
        for prefix in allowed_urls:
            try:
                parts = _split(prefix)
            except (ValueError, KeyError):
                parts = None
            if (
                parts is None
                or parts.scheme not in _DEFAULT_PORTS
                or not parts.hostname
                or parts.query
                or parts.fragment
                or parts.username is not None
            ):
                raise ConfigError(
                    f"push.allowed_urls: {prefix!r} must be an http:// or https:// URL prefix "
                    "like 'https://hooks.example.com/cproxy/'"
                )
            path = parts.path or "/"
            prefixes.append(
                _Prefix(parts.scheme, parts.hostname, _port(parts), path.rstrip("/") + "/")
            )
        self._prefixes = tuple(prefixes)
        #: Name resolution at PUT and at connect time (replaced by tests with a stub).
        self.resolve: Resolve = resolve or system_resolve

    def listed(self, url: str) -> bool:
        """Whether ``url`` is under a prefix of ``[push] allowed_urls``."""
        try:
            parts = _split(url)
        except (ValueError, KeyError):
            return False
        return any(p.covers(parts) for p in self._prefixes)

    def check_now(self, url: str, *, privileged: bool) -> None:
        """The rule without resolving names: ``Forbidden`` (403) for an unlisted URL set by
        an unprivileged caller; ``PushTargetRefused`` (422) for an unlisted URL whose host
        is an internal address or ``localhost``."""
        if self.listed(url):
            return
        if not privileged:
            raise Forbidden(
                f"push URL {url!r} is not under the server's [push] allowed_urls; only an "
                "admin token may push elsewhere"
            )
        host = urlsplit(url).hostname or ""
        address = _literal(host)
        if (address is not None and internal(address)) or _is_localhost(host):
            raise PushTargetRefused(_refused(url, address or host))

    async def check(self, url: str, *, privileged: bool) -> None:
        """``check_now``, then the URL's host name resolved: refused (422) when it resolves
        to an internal address. A name that does not resolve now is left to the check made
        at every connection."""
        self.check_now(url, privileged=privileged)
        parts = urlsplit(url)
        host = parts.hostname or ""
        if self.listed(url) or _literal(host) is not None:
            return
        found: list[tuple[int, str]] = []
        with anyio.move_on_after(RESOLVE_AT_PUT_S):
            try:
                found = await self.resolve(host, _port(parts), socket.AF_UNSPEC)
            except OSError:
                found = []
        bad = [address for _, address in found if internal(address)]
        if bad:
            raise PushTargetRefused(_refused(url, bad[0]))

    def connect_refusal(self, url: str) -> str | None:
        """Why the pusher must not connect to ``url`` as it is (an unlisted internal IP
        literal or ``localhost``, e.g. in a group stored before the rule), else None."""
        try:
            self.check_now(url, privileged=True)
        except PushTargetRefused as exc:
            return exc.message
        return None

    async def guarded_addresses(self, host: str, port: int, family: int) -> list[tuple[int, str]]:
        """``host``'s addresses for a connection of an unlisted URL; ``OSError`` when any
        of them is internal (the connection is not made)."""
        found = await self.resolve(host, port, family)
        bad = [address for _, address in found if internal(address)]
        if bad or not found:
            raise OSError(  # with an errno, so aiohttp's message shows the reason
                errno.EACCES,
                f"push target {host} resolves to {bad[0]}, an internal address not in "
                "[push] allowed_urls"
                if bad
                else f"push target {host} did not resolve",
            )
        return found


def _is_localhost(host: str) -> bool:
    host = host.rstrip(".").lower()
    return host == "localhost" or host.endswith(".localhost")


def _refused(url: str, address: str) -> str:
    return (
        f"push URL {url!r} points at {address}, a loopback, link-local or private address; "
        "list it in the server's [push] allowed_urls to allow it"
    )
