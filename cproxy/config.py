"""Typed, validated settings: a TOML file plus command-line flags (flags win).

Example ``cproxy.toml``::

    [server]
    host = "0.0.0.0"
    port = 9713
    data_dir = "/var/lib/cproxy"
    commit_interval_ms = 1000
    dedup_window_ms = 86400000
    retention_interval_ms = 5000

    [limits]
    max_messages_per_call = 1000
    max_message_bytes = 1048576
    max_request_bytes = 8388608

    tls_cert = "/etc/cproxy/tls/server.crt"    # optional: serve HTTPS (both or neither)
    tls_key = "/etc/cproxy/tls/server.key"

    [[tokens]]
    token = "s3cret-token"
    role = "producer"            # admin | producer | consumer
    topics = ["rides"]           # optional scope

    [[tokens]]                   # a token kept out of the file: only its SHA-256 digest
    token_sha256 = "<64 hex digits, from 'cproxy token hash' or 'cproxy token new'>"
    role = "consumer"

    [[tokens]]                   # a pipeline worker: consumes group "enrich", produces to "out"
    token = "pipeline-token"
    roles = ["consumer", "producer"]
    topics = ["rides", "out"]
    groups = ["enrich"]

    [topics.rides]
    queues = 8
    retention_ms = 604800000     # optional: keep 7 days
    retention_bytes = 1073741824 # optional: at most 1 GiB per queue

    [groups.billing]
    topics = { rides = { order_by = "key" } }
    max_attempts = 5

    [push]                       # where groups may push (cproxy.push_targets)
    allowed_urls = ["https://hooks.example.com/cproxy/"]
"""

from __future__ import annotations

import re
import socket
import ssl
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

from cproxy.engine.group_config import GroupConfig
from cproxy.errors import ConfigError, InvalidRequest
from cproxy.push_targets import PushTargets
from cproxy.tokens import Token, tokens_from_config

#: Topic and group names: 1..200 of ``A-Z a-z 0-9 . _ -``, but not dots alone (``.`` and
#: ``..`` read as path segments: clients rewrite them, and they name nothing useful).
TOPIC_NAME: Final = re.compile(r"^(?!\.+\Z)[A-Za-z0-9._-]{1,200}\Z")
GROUP_NAME: Final = TOPIC_NAME
#: How a refused name is explained (the regex above, in words).
NAME_RULE: Final = "1-200 characters of A-Z a-z 0-9 . _ -, not only dots"


def check_name(kind: str, name: str) -> str:
    """Return ``name`` if it is a valid topic/group name; else raise ``InvalidRequest`` (422)."""
    if not TOPIC_NAME.match(name):
        raise InvalidRequest(f"{kind} name {name!r} is invalid: use {NAME_RULE}")
    return name


MAX_QUEUES: Final = 1024
MiB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """Request limits; a request over any of them gets 413 ``too_large``."""

    max_messages_per_call: int = 1000
    max_message_bytes: int = MiB
    max_request_bytes: int = 8 * MiB
    max_pull_messages: int = 1000
    max_wait_ms: int = 30_000
    #: The longest a produced message may be delayed (``delay_ms``/``deliver_at_ms``):
    #: 7 days. A longer delay is a 422.
    max_delay_ms: int = 7 * 24 * 3600 * 1000


_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}$")


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """How one proxy takes part in a cluster.

    - ``node_id``: this proxy's name among its peers (letters, digits, ``._:-``; at most 100).
    - ``advertise_url``: where clients reach this proxy (listed by ``GET /v1/cluster``).
    - ``heartbeat_interval_ms`` (default 1000): how often membership and leases are renewed and
      the assignment is recomputed.
    - ``lease_ms`` (default 5000): how long a heartbeat keeps a member alive and its queues
      owned, timed by the database clock. Must be at least 3 heartbeats, so one late heartbeat
      never loses a lease.
    - ``handover_timeout_ms`` (default None: the group's longest ack timeout): how long a
      releasing queue waits for its in-flight messages before it is handed over anyway.
    """

    node_id: str
    advertise_url: str
    heartbeat_interval_ms: int = 1000
    lease_ms: int = 5000
    handover_timeout_ms: int | None = None

    def __post_init__(self) -> None:
        if not _NODE_ID.match(self.node_id):
            raise ConfigError(
                f"node_id must be 1-100 letters, digits or ._:- (starting with a letter or "
                f"digit), got {self.node_id!r}"
            )
        if not self.advertise_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"advertise_url must be an http:// or https:// URL, got {self.advertise_url!r}"
            )
        if not 10 <= self.heartbeat_interval_ms <= 600_000:
            raise ConfigError(
                f"heartbeat_interval_ms must be in 10..600000, got {self.heartbeat_interval_ms}"
            )
        if not 3 * self.heartbeat_interval_ms <= self.lease_ms <= 3_600_000:
            raise ConfigError(
                f"lease_ms must be at least 3 x heartbeat_interval_ms "
                f"({3 * self.heartbeat_interval_ms}) and at most 3600000, got {self.lease_ms}"
            )
        if self.handover_timeout_ms is not None and not 0 <= self.handover_timeout_ms <= 86_400_000:
            raise ConfigError(
                f"handover_timeout_ms must be in 0..86400000, got {self.handover_timeout_ms}"
            )


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything ``cproxy serve`` needs. Build with ``load_settings``."""

    host: str = "127.0.0.1"
    port: int = 9713
    data_dir: Path = Path("cproxy-data")
    #: How often group progress is persisted; bounds duplicates after a crash.
    commit_interval_ms: int = 1000
    #: How long a produced message id is remembered for dedup (default 24 h).
    dedup_window_ms: int = 86_400_000
    #: SQLite ``synchronous``: "normal" survives a process crash, "full" also power loss.
    sqlite_synchronous: Literal["normal", "full"] = "normal"
    log_level: str = "info"
    #: "text" (key=value lines) or "json" (one object per line).
    log_format: Literal["text", "json"] = "text"
    #: PEM certificate chain and private key for HTTPS; both or neither (None: plain HTTP).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    limits: Limits = field(default_factory=Limits)
    tokens: tuple[Token, ...] = ()
    #: How often topics with a retention bound are trimmed (and groups told what they lost).
    retention_interval_ms: int = 5000
    #: Topics declared in the config file: name -> queues.
    topics: Mapping[str, int] = field(default_factory=dict)
    #: Retention of the declared topics that set one, name -> (retention_ms, retention_bytes),
    #: None for unbounded; applied at every start (the file wins over changes made through the
    #: API). A declared topic without either key keeps whatever retention it has.
    topic_retention: Mapping[str, tuple[int | None, int | None]] = field(default_factory=dict)
    #: Groups declared in the config file: name -> validated config.
    groups: Mapping[str, GroupConfig] = field(default_factory=dict)
    #: ``postgresql://...`` to run on PostgreSQL in a cluster (``--store``, ``[store] url``);
    #: None: SQLite in ``data_dir``.
    store_url: str | None = None
    #: Cluster mode: this proxy's name (default ``<hostname>-<port>``) and the URL clients
    #: reach it at (default ``http://<host>:<port>``); see ``ClusterSettings``.
    node_id: str | None = None
    advertise_url: str | None = None
    heartbeat_interval_ms: int = 1000
    lease_ms: int = 5000
    #: None: the longest ack timeout of the groups.
    handover_timeout_ms: int | None = None
    #: ``[push] allowed_urls``: URL prefixes groups may push to (``cproxy.push_targets``).
    push_allowed_urls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        targets = self.push_targets()  # validates the prefixes eagerly
        for name, config in self.groups.items():
            for topic, push in config.push.items():
                try:
                    # The config file is the operator's: privileged, but still not internal
                    # addresses unless listed.
                    targets.check_now(push.url, privileged=True)
                except InvalidRequest as exc:
                    raise ConfigError(f"groups.{name}.topics.{topic}.push: {exc.message}") from exc
        if self.store_url is not None:
            if not self.store_url.startswith(("postgresql://", "postgres://")):
                raise ConfigError(f"the store URL must be postgresql://..., got {self.store_url!r}")
            self.cluster_settings()  # validate eagerly
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError(
                "tls_cert and tls_key go together (--tls-cert/--tls-key or [server] "
                "tls_cert/tls_key): give both or neither"
            )

    def cluster_settings(self) -> ClusterSettings:
        """This proxy's cluster settings (meaningful with ``store_url``); raises
        ``ConfigError`` when they are invalid."""
        scheme = "https" if self.tls_cert is not None else "http"
        return ClusterSettings(
            node_id=self.node_id or f"{socket.gethostname()}-{self.port}",
            advertise_url=self.advertise_url or f"{scheme}://{self.host}:{self.port}",
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            lease_ms=self.lease_ms,
            handover_timeout_ms=self.handover_timeout_ms,
        )

    def push_targets(self) -> PushTargets:
        """The push destination rule of ``push_allowed_urls``."""
        return PushTargets(self.push_allowed_urls)

    @property
    def auth_enabled(self) -> bool:
        return bool(self.tokens)

    @property
    def tls_enabled(self) -> bool:
        """Whether the server speaks HTTPS (``tls_cert`` and ``tls_key`` are set)."""
        return self.tls_cert is not None


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(f"{name} must be an integer in {low}..{high}, got {value!r}")
    return value


def _limits(raw: Mapping[str, Any]) -> Limits:
    defaults = Limits()
    values: dict[str, int] = {}
    for key, value in raw.items():
        if not hasattr(defaults, key):
            raise ConfigError(f"unknown setting limits.{key}")
        values[key] = _check_int(f"limits.{key}", value, 1, 1 << 40)
    limits = replace(defaults, **values)
    if limits.max_message_bytes > limits.max_request_bytes:
        raise ConfigError("limits.max_message_bytes cannot exceed limits.max_request_bytes")
    return limits


def _server(raw: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "host":
            if not isinstance(value, str) or not value:
                raise ConfigError("server.host must be a non-empty string")
            out[key] = value
        elif key == "port":
            out[key] = _check_int("server.port", value, 0, 65535)
        elif key == "data_dir":
            if not isinstance(value, str) or not value:
                raise ConfigError("server.data_dir must be a path string")
            out[key] = Path(value)
        elif key == "commit_interval_ms":
            out[key] = _check_int("server.commit_interval_ms", value, 10, 600_000)
        elif key == "retention_interval_ms":
            out[key] = _check_int("server.retention_interval_ms", value, 10, 3_600_000)
        elif key == "dedup_window_ms":
            out[key] = _check_int("server.dedup_window_ms", value, 0, 30 * 86_400_000)
        elif key == "sqlite_synchronous":
            if value not in ("normal", "full"):
                raise ConfigError("server.sqlite_synchronous must be 'normal' or 'full'")
            out[key] = value
        elif key == "log_format":
            if value not in ("text", "json"):
                raise ConfigError("server.log_format must be 'text' or 'json'")
            out[key] = value
        elif key in ("tls_cert", "tls_key"):
            if not isinstance(value, str) or not value:
                raise ConfigError(f"server.{key} must be a path string")
            out[key] = Path(value)
        elif key == "log_level":
            if value not in ("debug", "info", "warning", "error"):
                raise ConfigError("server.log_level must be debug, info, warning or error")
            out[key] = value
        else:
            raise ConfigError(f"unknown setting server.{key}")
    return out


def _store_and_cluster(store: Mapping[str, Any], cluster: Mapping[str, Any]) -> dict[str, Any]:
    """``[store] url`` and ``[cluster]`` (node_id, advertise_url, heartbeat_interval_ms,
    lease_ms, handover_timeout_ms); checked as a whole by ``Settings``."""
    out: dict[str, Any] = {}
    for key, value in store.items():
        if key != "url":
            raise ConfigError(f"unknown setting store.{key}")
        if not isinstance(value, str):
            raise ConfigError("store.url must be a string")
        out["store_url"] = value
    for key, value in cluster.items():
        if key in ("node_id", "advertise_url"):
            if not isinstance(value, str):
                raise ConfigError(f"cluster.{key} must be a string")
            out[key] = value
        elif key in ("heartbeat_interval_ms", "lease_ms", "handover_timeout_ms"):
            out[key] = _check_int(f"cluster.{key}", value, 0, 86_400_000)
        else:
            raise ConfigError(f"unknown setting cluster.{key}")
    return out


def settings_from_mapping(raw: Mapping[str, Any]) -> Settings:
    """Validate a parsed TOML document."""
    sections = {"server", "limits", "tokens", "topics", "groups", "store", "cluster", "push"}
    unknown = set(raw) - sections
    if unknown:
        raise ConfigError(f"unknown section(s): {', '.join(sorted(unknown))}")
    topics: dict[str, int] = {}
    retention: dict[str, tuple[int | None, int | None]] = {}
    for name, spec in dict(raw.get("topics", {})).items():
        if not TOPIC_NAME.match(name):
            raise ConfigError(f"topic name {name!r} is invalid: use {NAME_RULE}")
        if (
            not isinstance(spec, Mapping)
            or "queues" not in spec
            or not set(spec) <= {"queues", "retention_ms", "retention_bytes"}
        ):
            raise ConfigError(
                f"topics.{name} must be a table with 'queues' and optionally 'retention_ms' "
                "and 'retention_bytes'"
            )
        topics[name] = _check_int(f"topics.{name}.queues", spec["queues"], 1, MAX_QUEUES)
        bounds = [
            None if key not in spec else _check_int(f"topics.{name}.{key}", spec[key], 1, 1 << 62)
            for key in ("retention_ms", "retention_bytes")
        ]
        if "retention_ms" in spec or "retention_bytes" in spec:
            retention[name] = (bounds[0], bounds[1])
    groups: dict[str, GroupConfig] = {}
    for name, spec in dict(raw.get("groups", {})).items():
        if not GROUP_NAME.match(name):
            raise ConfigError(f"group name {name!r} is invalid: use {NAME_RULE}")
        if not isinstance(spec, Mapping):
            raise ConfigError(f"groups.{name} must be a table")
        try:
            groups[name] = GroupConfig.from_dict(spec)
        except InvalidRequest as exc:
            raise ConfigError(f"groups.{name}: {exc.message}") from exc
    return Settings(
        **_server(dict(raw.get("server", {}))),
        **_store_and_cluster(dict(raw.get("store", {})), dict(raw.get("cluster", {}))),
        limits=_limits(dict(raw.get("limits", {}))),
        tokens=tokens_from_config(raw.get("tokens", [])),
        topics=topics,
        topic_retention=retention,
        groups=groups,
        push_allowed_urls=_push(dict(raw.get("push", {}))),
    )


def _push(raw: Mapping[str, Any]) -> tuple[str, ...]:
    unknown = set(raw) - {"allowed_urls"}
    if unknown:
        raise ConfigError(f"unknown setting(s) push.{', push.'.join(sorted(unknown))}")
    urls = raw.get("allowed_urls", [])
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise ConfigError("push.allowed_urls must be a list of URL prefix strings")
    return tuple(urls)


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Read ``path`` (if given) and apply non-None ``overrides`` (host, port, data_dir...)."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    settings = settings_from_mapping(raw)
    given = {k: v for k, v in overrides.items() if v is not None}
    for key in ("data_dir", "tls_cert", "tls_key"):
        if key in given:
            given[key] = Path(given[key])
    if "port" in given:
        _check_int("--port", given["port"], 0, 65535)
    settings = replace(settings, **given)
    check_tls_files(settings)
    return settings


def check_tls_files(settings: Settings) -> None:
    """Load the TLS certificate and key once, so a wrong path, a key that does not match
    the certificate or a key with a passphrase fails at start with one line (``ConfigError``)
    instead of inside uvicorn. A no-op without TLS."""
    if settings.tls_cert is None or settings.tls_key is None:
        return
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # password="" makes an encrypted key fail at once instead of prompting on the tty.
        context.load_cert_chain(settings.tls_cert, settings.tls_key, password="")
    except ssl.SSLError as exc:
        raise ConfigError(
            f"cannot load TLS certificate {settings.tls_cert} with key {settings.tls_key}: "
            f"{exc.reason or exc} (both must be PEM, the key the certificate's own, without "
            "a passphrase)"
        ) from exc
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            f"cannot load TLS certificate {settings.tls_cert} with key {settings.tls_key}: {reason}"
        ) from exc
