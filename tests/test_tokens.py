"""``[[tokens]]`` entries: one role or several, with their scopes (cproxy/tokens.py)."""

from __future__ import annotations

import pytest

from cproxy.errors import ConfigError
from cproxy.tokens import Token, tokens_from_config


def test_a_token_may_hold_several_roles_with_its_scopes() -> None:
    (worker, single) = tokens_from_config(
        [
            {
                "token": "pipeline-secret",
                "roles": ["consumer", "producer"],
                "topics": ["in", "out"],
                "groups": ["enrich"],
            },
            {"token": "producer-secret", "role": "producer"},
        ]
    )
    assert worker.roles == {"consumer", "producer"}
    assert worker.role == "consumer"
    assert worker.topics == {"in", "out"} and worker.groups == {"enrich"}
    assert single.roles == {"producer"} and single.role == "producer"
    assert Token("x" * 8, "admin").roles == {"admin"}


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"role": "admin", "roles": ["admin"]}, "exactly one of role or roles"),
        ({}, "exactly one of role or roles"),
        ({"roles": []}, "non-empty list"),
        ({"roles": ["consumer", "root"]}, "non-empty list"),
        ({"roles": "consumer"}, "non-empty list"),
        ({"role": "root"}, "role must be"),
    ],
)
def test_roles_are_checked(entry: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        tokens_from_config([{"token": "a-secret-token", **entry}])
