"""Bearer tokens: what a ``[[tokens]]`` entry of the config file holds, and its checks.

A token holds one or several roles (admin, producer, consumer) and optionally the topics and
groups it may touch (the scopes apply to each of its roles); the secret is given in plain
text or as its SHA-256 digest, and only digests are ever compared (``cproxy.access``).
``cproxy token new`` / ``cproxy token hash`` make them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, cast

from cproxy.errors import ConfigError

Role = Literal["admin", "producer", "consumer"]

#: Shortest accepted plain-text token, in characters.
MIN_TOKEN_CHARS: Final = 8
_SHA256_HEX: Final = re.compile(r"^[0-9a-f]{64}\Z")


def token_digest(secret: str) -> str:
    """The SHA-256 of a token's UTF-8 bytes, as 64 lowercase hex digits (``token_sha256``)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Token:
    """A bearer token; ``topics``/``groups`` of None mean "any".

    ``role`` is its first role; ``roles`` all of them (``role`` included), e.g. a pipeline
    worker's ``{"consumer", "producer"}``.

    Give the secret either in plain text (``token``) or as its SHA-256 digest
    (``token_sha256``, 64 hex digits), so a config file need not hold the secret itself;
    exactly one of the two. The authorizer only ever compares digests (:attr:`digest`).
    """

    token: str | None = field(repr=False)
    role: Role
    topics: frozenset[str] | None = None
    groups: frozenset[str] | None = None
    name: str = "unnamed"
    token_sha256: str | None = None
    roles: frozenset[Role] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", frozenset({self.role, *self.roles}))
        if (self.token is None) == (self.token_sha256 is None):
            raise ConfigError(f"token {self.name!r}: give exactly one of token or token_sha256")
        if self.token_sha256 is not None:
            normal = self.token_sha256.strip().lower()
            if not _SHA256_HEX.match(normal):
                raise ConfigError(
                    f"token {self.name!r}: token_sha256 must be 64 hex digits (a SHA-256)"
                )
            object.__setattr__(self, "token_sha256", normal)

    @property
    def digest(self) -> bytes:
        """The 32-byte SHA-256 of the secret."""
        if self.token_sha256 is not None:
            return bytes.fromhex(self.token_sha256)
        assert self.token is not None  # __post_init__: one of the two is set
        return hashlib.sha256(self.token.encode("utf-8")).digest()


def tokens_from_config(raw: Any) -> tuple[Token, ...]:
    """The ``[[tokens]]`` array of the config file, checked; ``ConfigError`` names the entry."""
    if not isinstance(raw, list):
        raise ConfigError("tokens must be an array of tables ([[tokens]])")
    tokens: list[Token] = []
    for i, item in enumerate(raw):
        where = f"tokens[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where} must be a table")
        unknown = set(item) - {
            "token", "token_sha256", "role", "roles", "topics", "groups", "name"
        }  # fmt: skip
        if unknown:
            raise ConfigError(f"{where}: unknown setting(s) {', '.join(sorted(unknown))}")
        secret, digest = item.get("token"), item.get("token_sha256")
        if (secret is None) == (digest is None):
            raise ConfigError(f"{where}: give exactly one of token or token_sha256")
        if secret is not None and (not isinstance(secret, str) or len(secret) < MIN_TOKEN_CHARS):
            raise ConfigError(
                f"{where}.token must be a string of at least {MIN_TOKEN_CHARS} characters"
            )
        if digest is not None and (
            not isinstance(digest, str) or not _SHA256_HEX.match(digest.strip().lower())
        ):
            raise ConfigError(
                f"{where}.token_sha256 must be 64 hex digits, the SHA-256 of the token "
                "('cproxy token hash' prints it)"
            )
        roles = _roles(item, where)
        scopes: dict[str, frozenset[str] | None] = {}
        for scope in ("topics", "groups"):
            names = item.get(scope)
            if names is not None and (
                not isinstance(names, list) or not all(isinstance(n, str) for n in names)
            ):
                raise ConfigError(f"{where}.{scope} must be a list of names")
            scopes[scope] = frozenset(names) if names is not None else None
        tokens.append(
            Token(
                secret,
                roles[0],
                scopes["topics"],
                scopes["groups"],
                str(item.get("name") or f"tokens[{i}]"),
                token_sha256=digest,
                roles=frozenset(roles),
            )
        )
    # By digest: the same secret given once in plain text and once hashed is a duplicate too.
    if len({t.digest for t in tokens}) != len(tokens):
        raise ConfigError("tokens must be unique")
    return tuple(tokens)


_ROLE_NAMES: Final = ("admin", "producer", "consumer")


def _roles(item: Mapping[str, Any], where: str) -> list[Role]:
    """``role = "x"`` or ``roles = ["x", ...]`` (exactly one of the two), checked."""
    if ("role" in item) == ("roles" in item):
        raise ConfigError(f"{where}: give exactly one of role or roles")
    if "role" in item:
        names = [item["role"]]
        if item["role"] not in _ROLE_NAMES:
            raise ConfigError(f"{where}.role must be 'admin', 'producer' or 'consumer'")
    else:
        names = item["roles"]
        if (
            not isinstance(names, list)
            or not names
            or not all(isinstance(n, str) and n in _ROLE_NAMES for n in names)
        ):
            raise ConfigError(
                f"{where}.roles must be a non-empty list of 'admin', 'producer', 'consumer'"
            )
    return [cast(Role, n) for n in names]
