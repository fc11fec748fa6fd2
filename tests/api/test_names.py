"""Topic and group names made only of dots (``.``, ``..``) are refused with 422 everywhere a
name is created: ``POST /v1/topics``, ``PUT /v1/groups/{group}`` and the config file. They
read as path segments (clients rewrite ``/v1/groups/..`` to ``/v1``) and name nothing."""

from __future__ import annotations

import pytest

from cproxy.config import settings_from_mapping
from cproxy.errors import ConfigError
from tests.api.http_helpers import assert_error, create_topic, fresh_client
from tests.support import RunningServer

DOTS_ONLY = [".", "..", "...", "." * 200]
# Percent-encoded so the client sends the dots instead of resolving them as path segments.
DOTS_IN_PATH = {".": "%2E", "..": "%2E%2E", "...": "...", "." * 200: "." * 200}
WITH_DOTS = ["a.b", ".hidden", "..x", "x..", "-.-", "_"]


@pytest.mark.parametrize("name", DOTS_ONLY)
def test_dot_only_topic_name_is_422(server: RunningServer, name: str) -> None:
    with fresh_client(server) as client:
        response = client.post("/v1/topics", json={"name": name, "queues": 1})
        assert_error(response, 422)
        assert client.get("/v1/topics").json() == {"topics": []}


@pytest.mark.parametrize("name", DOTS_ONLY)
def test_dot_only_group_name_is_422(server: RunningServer, name: str) -> None:
    with fresh_client(server) as client:
        create_topic(client, "a")
        response = client.put(f"/v1/groups/{DOTS_IN_PATH[name]}", json={"topics": {"a": {}}})
        error = assert_error(response, 422)
        assert repr(name) in error["message"], error
        assert client.get("/v1/groups").json() == {"groups": []}


def test_names_with_dots_and_more_are_still_fine(server: RunningServer) -> None:
    with fresh_client(server) as client:
        for name in WITH_DOTS:
            response = client.post("/v1/topics", json={"name": name, "queues": 1})
            assert response.status_code == 201, response.text
            put = client.put(f"/v1/groups/{name}", json={"topics": {name: {}}})
            assert put.status_code == 200, put.text
        listed = {g["name"] for g in client.get("/v1/groups").json()["groups"]}
        assert listed == set(WITH_DOTS)


@pytest.mark.parametrize("name", DOTS_ONLY)
def test_dot_only_names_in_the_config_file_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="not only dots"):
        settings_from_mapping({"topics": {name: {"queues": 1}}})
    with pytest.raises(ConfigError, match="not only dots"):
        settings_from_mapping(
            {"topics": {"a": {"queues": 1}}, "groups": {name: {"topics": {"a": {}}}}}
        )
