# cproxy: compiled (mypyc), see cproxy/_native.py
"""A topic entry's ``push`` settings: where and how the proxy POSTs deliveries.

Validated once when the group is PUT (a bad value is a ``ConfigError``, HTTP 422), immutable
afterwards. The broker's pusher (``cproxy.broker.push``) acts on them; the engine only keeps
them with the group's config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

from cproxy.errors import ConfigError

MAX_PUSH_IN_FLIGHT: Final = 1024
MAX_PUSH_TIMEOUT_MS: Final = 600_000
MAX_PUSH_PER_KEY: Final = 1000
#: Headers the proxy sets itself on every push request.
RESERVED_HEADERS: Final = frozenset(
    {"content-type", "content-length", "host", "x-cproxy-signature"}
)

_KNOWN: Final = frozenset(
    {"url", "max_in_flight", "timeout_ms", "headers", "secret", "max_per_key"}
)


@dataclass(frozen=True, slots=True)
class PushConfig:
    """Push delivery of one topic entry (docs/api.md, "Push delivery").

    ``max_in_flight``: messages handed to the endpoint and not yet answered (1..1024, default
    64); it also bounds the connection pool. ``timeout_ms``: a request not answered within this
    long (default 10,000 ms) fails its messages. ``headers``: extra request headers.
    ``secret``: when set, each request is signed (``X-Cproxy-Signature: sha256=<hex>``).
    ``max_per_key``: messages of one order value sent together as a run (default 1).
    """

    url: str
    max_in_flight: int = 64
    timeout_ms: int = 10_000
    headers: Mapping[str, str] = field(default_factory=dict)
    secret: str | None = None
    max_per_key: int = 1

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "url": self.url,
            "max_in_flight": self.max_in_flight,
            "timeout_ms": self.timeout_ms,
            "headers": dict(self.headers),
            "max_per_key": self.max_per_key,
        }
        if self.secret is not None:
            out["secret"] = self.secret
        return out

    @classmethod
    def from_dict(cls, where: str, data: object) -> PushConfig:
        """Validate ``data`` (the ``push`` object of topic entry ``where``)."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}.push must be an object like {{'url': 'https://...'}}")
        unknown = set(data) - _KNOWN
        if unknown:
            raise ConfigError(f"{where}.push: unknown setting(s) {', '.join(sorted(unknown))}")
        url = data.get("url")
        if not isinstance(url, str) or not _is_http_url(url):
            raise ConfigError(f"{where}.push.url must be an http:// or https:// URL, got {url!r}")
        headers = data.get("headers", {})
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and k for k, v in headers.items()
        ):
            raise ConfigError(f"{where}.push.headers must be an object of string -> string")
        reserved = sorted(k for k in headers if k.lower() in RESERVED_HEADERS)
        if reserved:
            raise ConfigError(f"{where}.push.headers: {', '.join(reserved)} is set by the proxy")
        secret = data.get("secret")
        if secret is not None and (not isinstance(secret, str) or not secret):
            raise ConfigError(f"{where}.push.secret must be a non-empty string")
        if secret is not None and set(secret) == {"*"}:
            # GET shows the secret as asterisks: a GET-then-PUT must not store those.
            raise ConfigError(
                f"{where}.push.secret is the placeholder a GET shows; send the real secret"
            )
        return cls(
            url=url,
            max_in_flight=_int(data, where, "max_in_flight", 64, 1, MAX_PUSH_IN_FLIGHT),
            timeout_ms=_int(data, where, "timeout_ms", 10_000, 10, MAX_PUSH_TIMEOUT_MS),
            headers=dict(headers),
            secret=secret,
            max_per_key=_int(data, where, "max_per_key", 1, 1, MAX_PUSH_PER_KEY),
        )


def _is_http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _int(data: Mapping[str, Any], where: str, name: str, default: int, low: int, high: int) -> int:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{where}.push.{name} must be an integer in {low}..{high}, got {value!r}")
    return value
