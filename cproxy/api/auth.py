"""Bearer-token auth: roles and topic/group scopes.

=================  =====  ========  ========
action             admin  producer  consumer
=================  =====  ========  ========
read topics        yes    yes       yes
create topic       yes    scoped    no
produce            yes    scoped    no
use a group        yes    no        scoped
delete a group     yes    no        no
=================  =====  ========  ========

"Use a group" is everything under ``/v1/groups/{group}`` but DELETE: create/update it, pull,
ack, extend, seek, dead letters and blocked keys; every topic the group reads must be in the
token's topic scope (a group hands out all of them). A scope of ``None`` means any name.
With no tokens configured, auth is off.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable
from typing import Literal

from fastapi import Request

from cproxy.broker.broker import GroupSummary
from cproxy.config import Settings, Token
from cproxy.errors import Forbidden, Unauthorized
from cproxy.model import TopicInfo

Action = Literal["read_topics", "create_topic", "produce", "use_group", "delete_group"]

_ROLES: dict[Action, frozenset[str]] = {
    "read_topics": frozenset({"admin", "producer", "consumer"}),
    "create_topic": frozenset({"admin", "producer"}),
    "produce": frozenset({"admin", "producer"}),
    "use_group": frozenset({"admin", "consumer"}),
    "delete_group": frozenset({"admin"}),
}


class Authorizer:
    def __init__(self, settings: Settings) -> None:
        self.enabled = settings.auth_enabled
        self._tokens = {t.token: t for t in settings.tokens}

    def identify(self, header: str | None) -> Token | None:
        """The token behind an ``Authorization`` header; raises ``Unauthorized``."""
        if not self.enabled:
            return None
        if not header or not header.lower().startswith("bearer "):
            raise Unauthorized("missing 'Authorization: Bearer <token>' header")
        presented = header[7:].strip()
        for secret, token in self._tokens.items():
            # Constant-time compare so response timing reveals nothing about tokens.
            if hmac.compare_digest(secret.encode(), presented.encode()):
                return token
        raise Unauthorized("unknown token")

    def visible_topics(self, token: Token | None, topics: Iterable[TopicInfo]) -> list[TopicInfo]:
        """The topics a token may see in a listing (the same rule as reading one)."""
        if token is None or token.role == "admin" or token.topics is None:
            return list(topics)
        return [t for t in topics if t.name in token.topics]

    def visible_groups(
        self, token: Token | None, groups: Iterable[GroupSummary]
    ) -> list[GroupSummary]:
        """The groups a token may see in a listing."""
        if token is None or token.role == "admin":
            return list(groups)
        return [g for g in groups if token.groups is None or g.name in token.groups]

    def check(
        self,
        token: Token | None,
        action: Action,
        topics: Iterable[str] = (),
        group: str | None = None,
    ) -> None:
        """Raise ``Forbidden`` unless ``token`` may do ``action`` on these names."""
        if token is None:
            return
        if token.role not in _ROLES[action]:
            raise Forbidden(f"token {token.name!r} (role {token.role}) may not {action}")
        if token.role == "admin":
            return
        if token.topics is not None:
            outside = sorted(set(topics) - token.topics)
            if outside:
                raise Forbidden(f"token {token.name!r} is not allowed on topic(s) {outside}")
        if group is not None and token.groups is not None and group not in token.groups:
            raise Forbidden(f"token {token.name!r} is not allowed on group {group!r}")


def require(action: Action) -> Callable[[Request], Awaitable[Token | None]]:
    """A route dependency checking ``action`` against the path's topic/group."""

    async def dependency(request: Request) -> Token | None:
        authorizer: Authorizer = request.app.state.authorizer
        token: Token | None = request.state.token  # set by CproxyRoute before parsing
        params = request.path_params
        topics: list[str] = [params["topic"]] if "topic" in params else []
        group = params.get("group")
        if group is not None and action == "use_group":
            # A group hands out every topic it reads: the token must cover all of them.
            topics += request.app.state.broker.group_topics(group) or []
        authorizer.check(token, action, topics, group)
        return token

    return dependency
