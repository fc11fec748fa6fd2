"""Who may do what: bearer tokens' roles and topic/group scopes, decided here and nowhere
else. The HTTP layer identifies the token (one ``Authorization`` header) and asks this
module; nothing here knows HTTP.

=================  =====  ========  ========
action             admin  producer  consumer
=================  =====  ========  ========
read topics        yes    yes       yes
create topic       yes    scoped    no
update topic       yes    scoped    no
delete a topic     yes    no        no
produce            yes    scoped    no
use a group        yes    no        scoped
delete a group     yes    no        no
=================  =====  ========  ========

A token may hold several roles (``roles = ["consumer", "producer"]``): it may do what any
of them may, within the same scopes. An ack with ``produce`` is "use a group" and "produce"
to each output topic.

"Use a group" is everything under ``/v1/groups/{group}`` but DELETE: create/update it, read
it, pull, ack, extend, seek, dead letters and blocked keys. The token's group scope must name
the group, and every topic the group reads must be in the token's topic scope (a group hands
out all of them). A scope of ``None`` means any name. With no tokens configured, auth is off.

Scopes follow the items too, not only the path: a topic named in a query or a body must be in
the token's topic scope (403 otherwise), and listings keep only what the same token could
read one by one (``visible_topics``, ``visible_groups``, ``topic_scope`` for dead letters a
group kept from topics it no longer reads). So a list never shows what a GET refuses.
See docs/auth.md for the per-endpoint table.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Literal

from cproxy.broker.views import GroupSummary
from cproxy.config import Settings
from cproxy.errors import Forbidden, InvalidToken, Unauthorized
from cproxy.model import TopicInfo
from cproxy.tokens import Token

Action = Literal[
    "read_topics", "create_topic", "delete_topic", "produce", "use_group", "delete_group"
]

_ROLES: dict[Action, frozenset[str]] = {
    "read_topics": frozenset({"admin", "producer", "consumer"}),
    # Also PATCH (retention): whoever may create a topic with a retention may change it.
    "create_topic": frozenset({"admin", "producer"}),
    "delete_topic": frozenset({"admin"}),
    "produce": frozenset({"admin", "producer"}),
    "use_group": frozenset({"admin", "consumer"}),
    "delete_group": frozenset({"admin"}),
}


class Authorizer:
    def __init__(self, settings: Settings) -> None:
        self.enabled = settings.auth_enabled
        # Digests only: a token may be configured as its SHA-256 (token_sha256), and comparing
        # digests of equal length keeps the comparison constant-time for plain tokens too.
        self._tokens = tuple((t.digest, t) for t in settings.tokens)

    def identify(self, header: bytes | None, repeated: bool = False) -> Token | None:
        """The token behind the request's ``Authorization`` header (``repeated``: it came
        more than once).

        Raises ``Unauthorized`` when no bearer token is given or the header is repeated (a
        gateway reading the first and a proxy reading the last would disagree on who
        calls), and ``InvalidToken`` (also a 401, with ``error="invalid_token"`` in
        ``WWW-Authenticate``) for a token nobody configured.
        """
        if not self.enabled:
            return None
        if repeated:
            raise Unauthorized("more than one Authorization header; send exactly one")
        scheme, _, rest = (header or b"").strip().partition(b" ")
        presented = rest.strip()
        if scheme.lower() != b"bearer" or not presented:
            raise Unauthorized("missing 'Authorization: Bearer <token>' header")
        digest = hashlib.sha256(presented).digest()
        found: Token | None = None
        for expected, token in self._tokens:
            # Constant-time compare of every configured digest, with no early exit, so
            # response timing reveals nothing about the tokens or about which one matched.
            if hmac.compare_digest(expected, digest) and found is None:
                found = token
        if found is None:
            raise InvalidToken("unknown token")
        return found

    # -- the rule --------------------------------------------------------------------------------
    @staticmethod
    def _refusal(
        token: Token, action: Action, topics: Iterable[str], group: str | None
    ) -> str | None:
        """Why ``token`` may not do ``action`` on these names, or None if it may."""
        roles = token.roles
        if not roles & _ROLES[action]:
            return f"token {token.name!r} (role {'/'.join(sorted(roles))}) may not {action}"
        if "admin" in roles:
            return None
        if token.topics is not None:
            outside = sorted(set(topics) - token.topics)
            if outside:
                return f"token {token.name!r} is not allowed on topic(s) {outside}"
        if group is not None and token.groups is not None and group not in token.groups:
            return f"token {token.name!r} is not allowed on group {group!r}"
        return None

    def allows(
        self,
        token: Token | None,
        action: Action,
        topics: Iterable[str] = (),
        group: str | None = None,
    ) -> bool:
        """Whether ``token`` may do ``action`` on these names (what ``check`` enforces)."""
        return token is None or self._refusal(token, action, topics, group) is None

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
        reason = self._refusal(token, action, topics, group)
        if reason is not None:
            raise Forbidden(reason)

    def check_topics(self, token: Token | None, topics: Iterable[str | None]) -> None:
        """Raise ``Forbidden`` if a topic named in a query or body is outside the scope.

        ``None`` entries (an optional filter left out) are ignored. Only the topic scope is
        checked: the prologue (``check_path``) already checked the role and the group.
        """
        scope = self.topic_scope(token)
        if scope is None:
            return
        outside = sorted({t for t in topics if t is not None} - scope)
        if outside:
            assert token is not None
            raise Forbidden(f"token {token.name!r} is not allowed on topic(s) {outside}")

    @staticmethod
    def may_push_anywhere(token: Token | None) -> bool:
        """Whether ``token`` may set a push URL outside ``[push] allowed_urls`` (admin
        only; anyone when auth is off)."""
        return token is None or "admin" in token.roles

    # -- listings: the same rule, item by item -----------------------------------------------------
    def topic_scope(self, token: Token | None) -> frozenset[str] | None:
        """The topics whose messages ``token`` may see, or None for any topic."""
        if token is None or "admin" in token.roles:
            return None
        return token.topics

    def visible_topics(self, token: Token | None, topics: Iterable[TopicInfo]) -> list[TopicInfo]:
        """The topics a token may see in a listing: those ``GET /v1/topics/{name}`` allows."""
        return [t for t in topics if self.allows(token, "read_topics", [t.name])]

    def visible_groups(
        self, token: Token | None, groups: Iterable[GroupSummary]
    ) -> list[GroupSummary]:
        """The groups a token may see in a listing: those ``GET /v1/groups/{name}`` allows
        (the group in its group scope and every topic the group reads in its topic scope;
        none for a producer, which cannot use groups)."""
        return [g for g in groups if self.allows(token, "use_group", g.topics, g.name)]
