"""Where push may send (cproxy.push_targets): listed prefixes, who may push elsewhere, and
the addresses refused unless listed. No request is sent: names resolve through stubs."""

from __future__ import annotations

import socket

import pytest

from cproxy.config import settings_from_mapping
from cproxy.errors import ConfigError, Forbidden, PushTargetRefused
from cproxy.push_targets import PushTargets, internal

TARGETS = PushTargets(["https://hooks.example.com/cproxy/", "http://127.0.0.1:8080"])


@pytest.mark.parametrize(
    ("url", "listed"),
    [
        ("https://hooks.example.com/cproxy/orders", True),
        ("https://hooks.example.com/cproxy", True),
        ("https://HOOKS.example.com:443/cproxy/x", True),
        ("https://hooks.example.com/cproxyx", False),  # a path prefix ends at a segment
        ("https://hooks.example.com/other", False),
        ("http://hooks.example.com/cproxy/", False),  # scheme
        ("https://hooks.example.com:8443/cproxy/", False),  # port
        ("https://hooks.example.com.evil.test/cproxy/", False),  # host, not a string prefix
        ("https://evil.test/?https://hooks.example.com/cproxy/", False),
        ("http://127.0.0.1:8080/anything", True),
        ("http://127.0.0.1:8081/", False),
    ],
)
def test_a_url_is_listed_by_scheme_host_port_and_path(url: str, listed: bool) -> None:
    assert TARGETS.listed(url) is listed


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "127.8.9.10", "::1", "169.254.169.254", "fe80::1", "10.0.0.1",
        "172.16.5.4", "192.168.1.1", "fc00::1", "fd12::1", "0.0.0.0", "::", "100.64.0.1",
        "::ffff:127.0.0.1", "::ffff:169.254.169.254", "224.0.0.1",
    ],
)  # fmt: skip
def test_internal_addresses(address: str) -> None:
    assert internal(address)


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111"])
def test_public_addresses(address: str) -> None:
    assert not internal(address)


def test_an_unprivileged_caller_may_push_only_under_a_listed_prefix() -> None:
    TARGETS.check_now("https://hooks.example.com/cproxy/a", privileged=False)
    TARGETS.check_now("http://127.0.0.1:8080/x", privileged=False)  # listed: even loopback
    with pytest.raises(Forbidden, match="allowed_urls"):
        TARGETS.check_now("https://elsewhere.example.com/hook", privileged=False)
    with pytest.raises(Forbidden):  # 403 before the address is looked at
        TARGETS.check_now("http://169.254.169.254/latest/meta-data", privileged=False)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/internal/admin",
        "http://169.254.169.254/latest/meta-data",
        "http://[fe80::1]/x",
        "http://[::1]:8080/",
        "http://10.0.0.8/",
        "http://192.168.0.1/",
        "http://172.31.0.1/",
        "http://[fd00::1]/",
        "http://0.0.0.0:80/",
        "http://100.100.100.200/",
        "http://localhost:8080/",
        "http://api.localhost/",
        "http://127.1/",  # legacy forms of 127.0.0.1
        "http://2130706433/",
        "http://0x7f.1/",
    ],
)
def test_internal_targets_are_refused_for_any_caller(url: str) -> None:
    with pytest.raises(PushTargetRefused):
        TARGETS.check_now(url, privileged=True)


async def test_a_name_is_resolved_at_put_and_refused_when_internal() -> None:
    answers = {"public.test": "93.184.216.34", "private.test": "192.168.7.7"}

    async def stub(host: str, port: int, family: int) -> list[tuple[int, str]]:
        return [(socket.AF_INET, answers[host])]

    targets = PushTargets([], resolve=stub)
    await targets.check("https://public.test/hook", privileged=True)
    with pytest.raises(PushTargetRefused, match=r"192\.168\.7\.7"):
        await targets.check("https://private.test/hook", privileged=True)
    # At connect time, the same rule: the addresses, or an OSError (no connection).
    assert await targets.guarded_addresses("public.test", 443, socket.AF_INET) == [
        (socket.AF_INET, "93.184.216.34")
    ]
    with pytest.raises(OSError, match="internal address"):
        await targets.guarded_addresses("private.test", 443, socket.AF_INET)


async def test_a_name_that_does_not_resolve_at_put_is_left_to_the_connect_check() -> None:
    async def unknown(host: str, port: int, family: int) -> list[tuple[int, str]]:
        raise socket.gaierror(socket.EAI_NONAME, "unknown")

    await PushTargets([], resolve=unknown).check("https://later.test/hook", privileged=True)


def test_the_config_file_lists_prefixes_and_its_groups_follow_the_rule() -> None:
    group = {"topics": {"t": {"push": {"url": "http://127.0.0.1:9000/hook"}}}}
    with pytest.raises(ConfigError, match=r"groups\.g\.topics\.t\.push: .*127\.0\.0\.1"):
        settings_from_mapping({"groups": {"g": group}})
    listed = {"push": {"allowed_urls": ["http://127.0.0.1:9000/"]}, "groups": {"g": group}}
    assert settings_from_mapping(listed).push_allowed_urls == ("http://127.0.0.1:9000/",)
    for bad in (["ftp://x/"], ["https://h/?q=1"], "https://h/", [1]):
        with pytest.raises(ConfigError, match="allowed_urls"):
            settings_from_mapping({"push": {"allowed_urls": bad}})
    with pytest.raises(ConfigError, match=r"push\.allowed"):
        settings_from_mapping({"push": {"allowed": []}})
