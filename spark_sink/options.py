"""Sink options: validated once on the driver into an immutable, picklable object.

``SinkOptions`` is what travels to the executors (inside the partition job or the Data Source
writer), so everything in it is plain data. Spark Data Source options arrive as strings;
``SinkOptions.from_strings`` parses them with the same validation as keyword arguments.
"""

from __future__ import annotations

import dataclasses
import re
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast
from urllib.parse import urlsplit

from spark_sink.errors import SinkConfigError

NullKeyPolicy = Literal["error", "skip", "unkeyed"]
NULL_KEY_POLICIES: tuple[str, ...] = ("error", "skip", "unkeyed")

TOPIC_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
#: Server defaults from the contract (docs/api.md "Limits"); the sink stays below them.
SERVER_MAX_MESSAGES_PER_CALL = 1000
#: Messages per produce call: the server's default limit, since every call costs the sink
#: and the server a fixed overhead (HTTP, a transaction) on top of the per-message work.
DEFAULT_BATCH_SIZE = SERVER_MAX_MESSAGES_PER_CALL
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
#: Ids ride in every message; a prefix longer than this is almost certainly a mistake.
MAX_ID_PREFIX_CHARS = 128
#: Message id layouts (docs/spark.md "Message ids"): 2 puts a digest of the key before the
#: row digest, 1 is the layout of earlier sinks (to re-run their writes within the window).
ID_SCHEMES = (1, 2)


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """Everything one write needs; build with :meth:`create` or :meth:`from_strings`."""

    url: str
    topic: str
    key_col: str
    order_col: str | None = None
    id_cols: tuple[str, ...] | None = None
    body_cols: tuple[str, ...] | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    num_partitions: int | None = None
    null_keys: NullKeyPolicy = "error"
    id_prefix: str = ""
    id_scheme: int = 2
    headers: tuple[tuple[str, str], ...] = ()
    token: str | None = field(default=None, repr=False)
    #: PEM CA bundle that signed an https:// server's certificate (a private CA). None: the
    #: usual trusted CAs. A path that must exist on the driver and on every executor.
    ca_file: str | None = None
    timeout_ms: int = 30_000
    max_retries: int = 8
    retry_initial_ms: int = 100
    retry_max_ms: int = 5_000
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    verify_order: bool = True
    create_topic_queues: int | None = None

    @classmethod
    def create(cls, **kwargs: Any) -> SinkOptions:
        """Build from keyword arguments, normalising sequences and validating every field."""
        for name in ("id_cols", "body_cols"):
            value = kwargs.get(name)
            if value is not None:
                kwargs[name] = _column_tuple(name, value)
        headers = kwargs.get("headers")
        if isinstance(headers, Mapping):
            kwargs["headers"] = tuple(sorted((str(k), str(v)) for k, v in headers.items()))
        elif headers is None:
            kwargs["headers"] = ()
        try:
            options = cls(**kwargs)
        except TypeError as exc:
            raise SinkConfigError(f"cproxy sink: {exc}") from exc
        options._validate()
        return options

    @classmethod
    def from_strings(cls, raw: Mapping[str, str]) -> SinkOptions:
        """Parse Spark Data Source options (all strings; ``keyCol`` and ``key_col`` both work).

        ``header.<name>`` options become message headers; unknown options are an error so
        that a typo (``keycol``) fails on the driver instead of being silently ignored.
        """
        # Spark's own options are camelCase; accept both key_col and keyCol spellings.
        known = {_normal(f.name): f.name for f in dataclasses.fields(cls) if f.name != "headers"}
        kwargs: dict[str, Any] = {}
        headers: dict[str, str] = {}
        for raw_name, value in raw.items():
            lowered = raw_name.lower()
            if lowered.startswith("header."):
                headers[raw_name[len("header.") :]] = value
                continue
            if lowered in ("path", "headers"):
                raise SinkConfigError(
                    f"cproxy sink: option {raw_name!r} is not supported "
                    "(use url/topic, and header.<name> for message headers)"
                )
            name = known.get(_normal(raw_name))
            if name is None:
                raise SinkConfigError(
                    f"cproxy sink: unknown option {raw_name!r}; known options: "
                    + ", ".join(sorted(known.values()))
                )
            kwargs[name] = _parse_string(name, value)
        for required in ("url", "topic", "key_col"):
            if required not in kwargs:
                raise SinkConfigError(f"cproxy sink: option {required!r} is required")
        kwargs["headers"] = headers
        return cls.create(**kwargs)

    def replace(self, **changes: Any) -> SinkOptions:
        """A validated copy with some fields changed (e.g. a per-batch ``id_prefix``)."""
        return SinkOptions.create(**{**_as_kwargs(self), **changes})

    @property
    def referenced_columns(self) -> tuple[str, ...]:
        """Every column the options name, in a stable order without repeats."""
        names: list[str] = [self.key_col]
        if self.order_col is not None:
            names.append(self.order_col)
        names.extend(self.id_cols or ())
        names.extend(self.body_cols or ())
        return tuple(dict.fromkeys(names))

    def check_columns(self, available: Sequence[str]) -> None:
        """Raise :class:`SinkConfigError` naming every referenced column that is missing."""
        present = set(available)
        missing = [name for name in self.referenced_columns if name not in present]
        if missing:
            raise SinkConfigError(
                f"cproxy sink: column(s) {', '.join(map(repr, missing))} not in the DataFrame; "
                f"available: {', '.join(available)}"
            )

    def _validate(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SinkConfigError(f"cproxy sink: url must be http(s)://host:port, got {self.url!r}")
        if self.url.endswith("/"):
            object.__setattr__(self, "url", self.url.rstrip("/"))
        if not TOPIC_NAME_RE.match(self.topic):
            raise SinkConfigError(
                f"cproxy sink: topic {self.topic!r} must match {TOPIC_NAME_RE.pattern}"
            )
        for name in ("key_col", "order_col"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise SinkConfigError(f"cproxy sink: {name} must be a non-empty column name")
        if self.id_cols == ():
            raise SinkConfigError("cproxy sink: id_cols must name at least one column")
        if self.body_cols == ():
            raise SinkConfigError("cproxy sink: body_cols must name at least one column")
        _check_int("batch_size", self.batch_size, 1, SERVER_MAX_MESSAGES_PER_CALL)
        if self.num_partitions is not None:
            _check_int("num_partitions", self.num_partitions, 1, 1_000_000)
        if self.create_topic_queues is not None:
            _check_int("create_topic_queues", self.create_topic_queues, 1, 1024)
        _check_int("timeout_ms", self.timeout_ms, 1, 600_000)
        _check_int("max_retries", self.max_retries, 0, 1000)
        _check_int("retry_initial_ms", self.retry_initial_ms, 0, 600_000)
        _check_int("retry_max_ms", self.retry_max_ms, self.retry_initial_ms, 600_000)
        _check_int("max_message_bytes", self.max_message_bytes, 64, 1 << 30)
        _check_int("max_request_bytes", self.max_request_bytes, self.max_message_bytes, 1 << 31)
        if self.null_keys not in NULL_KEY_POLICIES:
            raise SinkConfigError(
                f"cproxy sink: null_keys must be one of {', '.join(NULL_KEY_POLICIES)}, "
                f"got {self.null_keys!r}"
            )
        if not isinstance(self.id_prefix, str) or len(self.id_prefix) > MAX_ID_PREFIX_CHARS:
            raise SinkConfigError(
                f"cproxy sink: id_prefix must be a string of at most {MAX_ID_PREFIX_CHARS} chars"
            )
        _check_int("id_scheme", self.id_scheme, ID_SCHEMES[0], ID_SCHEMES[-1])
        if not isinstance(self.verify_order, bool):
            raise SinkConfigError("cproxy sink: verify_order must be a bool")
        if self.ca_file is not None:
            _check_ca_file(self.ca_file)


def _check_ca_file(path: object) -> None:
    """Load the CA bundle once on the driver, so a wrong path fails before any task runs."""
    if not isinstance(path, str) or not path:
        raise SinkConfigError("cproxy sink: ca_file must be a path string")
    try:
        ssl.create_default_context(cafile=path)
    except OSError as exc:  # ssl.SSLError is an OSError too
        raise SinkConfigError(
            f"cproxy sink: cannot load ca_file {path!r}: {exc.strerror or exc}"
        ) from exc


def _normal(name: str) -> str:
    return name.lower().replace("_", "")


def _check_int(name: str, value: object, low: int, high: int) -> None:
    # bool is an int subclass; True as a batch size is a bug, not a 1.
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise SinkConfigError(
            f"cproxy sink: {name} must be an integer in [{low}, {high}], got {value!r}"
        )


def _column_tuple(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, Iterable):
        raise SinkConfigError(f"cproxy sink: {name} must be a list of column names")
    columns = tuple(value)
    if not all(isinstance(c, str) and c for c in columns):
        raise SinkConfigError(f"cproxy sink: {name} must contain non-empty column names")
    return cast(tuple[str, ...], columns)


_INT_FIELDS = frozenset(
    f.name for f in dataclasses.fields(SinkOptions) if f.type in ("int", "int | None")
)


def _parse_string(name: str, value: str) -> object:
    if name in _INT_FIELDS:
        try:
            return int(value.strip())
        except ValueError:
            raise SinkConfigError(
                f"cproxy sink: option {name!r} must be an integer, got {value!r}"
            ) from None
    if name == "verify_order":
        lowered = value.strip().lower()
        if lowered not in ("true", "false"):
            raise SinkConfigError(
                f"cproxy sink: option 'verify_order' must be true or false, got {value!r}"
            )
        return lowered == "true"
    if name in ("order_col", "ca_file") and not value.strip():
        return None
    return value


def _as_kwargs(options: SinkOptions) -> dict[str, Any]:
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
