"""One rooted exception hierarchy for the service.

Every error carries a stable snake_case ``code``; the HTTP layer maps the class to a status
code (see ``cproxy.api.errors``) and never needs to inspect messages. Foreign errors (sqlite3,
aiokafka, OS errors) are translated once, at the store boundary, with ``raise ... from exc``.
"""

from __future__ import annotations


class CproxyError(Exception):
    """Base of every error cproxy raises on purpose."""

    code = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(CproxyError):
    """The request is well-formed JSON but asks for something invalid (maps to 422)."""

    code = "invalid_request"


class InvalidOrderBy(InvalidRequest):
    """An ``order_by`` value is not ``qid``, ``key``, ``none`` or a valid JSON path."""

    code = "invalid_order_by"


class ConfigError(InvalidRequest):
    """A settings file, flag or group config is invalid."""

    code = "invalid_config"


class PushTargetRefused(InvalidRequest):
    """A push URL points at a loopback, link-local or private address that ``[push]
    allowed_urls`` does not list (maps to 422)."""

    code = "push_target_refused"


class NotFound(CproxyError):
    code = "not_found"


class TopicNotFound(NotFound):
    code = "topic_not_found"


class GroupNotFound(NotFound):
    code = "group_not_found"


class Conflict(CproxyError):
    code = "conflict"


class TopicConflict(Conflict):
    """A topic exists with a different queue count (or retention)."""

    code = "topic_conflict"


class TopicInUse(Conflict):
    """A topic cannot be deleted while a group reads it."""

    code = "topic_in_use"


class TooLarge(CproxyError):
    """A request or message exceeds a configured size limit (maps to 413)."""

    code = "too_large"


class UnsupportedMediaType(CproxyError):
    """The request body is declared as something other than JSON (maps to 415)."""

    code = "unsupported_media_type"


class StoreError(CproxyError):
    """The store failed or is unavailable (maps to 503)."""

    code = "store_unavailable"


class ShuttingDown(StoreError):
    code = "shutting_down"


class AuthError(CproxyError):
    code = "unauthorized"


class Unauthorized(AuthError):
    """No token, or a token nobody configured (maps to 401)."""

    code = "unauthorized"


class InvalidToken(Unauthorized):
    """A bearer token nobody configured (401 with ``error="invalid_token"``)."""

    code = "unauthorized"


class Forbidden(AuthError):
    """A valid token used outside its role or scope (maps to 403)."""

    code = "forbidden"


class BlockedKeyNotFound(NotFound):
    """No blocked head matches the operator's request."""

    code = "blocked_key_not_found"


class NotBlocked(Conflict):
    """The head named by an operator action is not in a state the action applies to."""

    code = "not_blocked"


class ReplayInProgress(Conflict):
    """A replay of the order value is still delivering (maps to 409)."""

    code = "replay_in_progress"


class StaleResults(Conflict):
    """An ack with outputs named a result that does not answer a current delivery: nothing
    was applied or stored. ``refs`` lists those results as (topic, qid, offset); the answer
    carries them as ``unknown``."""

    code = "stale_results"

    def __init__(self, refs: list[tuple[str, int, int]]) -> None:
        super().__init__(
            f"{len(refs)} result(s) do not answer a current delivery; nothing was applied or stored"
        )
        self.refs = refs


class QueueNotOwned(Conflict):
    """A commit named queues this proxy no longer owns at the epoch it holds (cluster mode):
    another proxy took them over. Nothing of the commit was written; ``refs`` lists the
    (topic, qid) queues that were lost."""

    code = "queue_not_owned"

    def __init__(self, message: str, refs: list[tuple[str, int]]) -> None:
        super().__init__(message)
        self.refs = refs
