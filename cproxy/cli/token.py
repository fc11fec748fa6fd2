"""``cproxy token new | hash``: bearer tokens for the config file, so it need hold no secret.

``new`` prints a fresh random token and its SHA-256 as JSON (``{"token", "token_sha256"}``):
hand the token to the client, put the digest in ``[[tokens]] token_sha256``. ``hash`` reads a
token on stdin (without echo on a terminal) and prints its digest alone, one line.
"""

from __future__ import annotations

import getpass
import json
import secrets
import sys

from cproxy.tokens import MIN_TOKEN_CHARS, token_digest

#: Random bytes in a new token: 256 bits, printed as 43 URL-safe characters.
NEW_TOKEN_BYTES = 32


class TokenInputError(Exception):
    """The token given on stdin is unusable (empty or too short)."""


def new_token() -> dict[str, str]:
    """A random token and its digest."""
    secret = secrets.token_urlsafe(NEW_TOKEN_BYTES)
    return {"token": secret, "token_sha256": token_digest(secret)}


def read_token() -> str:
    """The token on stdin: its first line, without the line break (a prompt on a terminal)."""
    text = getpass.getpass("token: ") if sys.stdin.isatty() else sys.stdin.readline()
    secret = text.rstrip("\r\n")
    if len(secret) < MIN_TOKEN_CHARS:
        raise TokenInputError(
            f"the token on stdin must have at least {MIN_TOKEN_CHARS} characters "
            f"(got {len(secret)})"
        )
    return secret


def token_command(action: str) -> None:
    """Run ``cproxy token ACTION``; raises :class:`TokenInputError` for a bad token."""
    if action == "new":
        sys.stdout.write(json.dumps(new_token(), indent=2) + "\n")
    else:
        sys.stdout.write(token_digest(read_token()) + "\n")
