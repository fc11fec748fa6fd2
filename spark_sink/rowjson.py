"""Rows to JSON bodies, keys and deterministic message ids, driven by the Spark schema.

Works on the schema's JSON form (``StructType.jsonValue()``) so it needs no pyspark import
and can be unit-tested without Spark. Conversion rules (documented in ``docs/spark.md``):

- null -> null; string, boolean, integral types -> themselves;
- float/double -> number, NaN and +-Infinity -> null (JSON has no such numbers);
- decimal -> string in plain notation (``"12.50"``), so no precision is lost;
- date -> ``"YYYY-MM-DD"``; timestamp -> UTC ``"YYYY-MM-DDTHH:MM:SS.ffffffZ"``;
  timestamp_ntz -> the same without ``Z``;
- binary -> base64 string; day-time interval -> seconds as a number;
- array -> list; struct -> object; map -> object with keys converted like message keys;
- anything else (variant, UDTs) -> its JSON text if it has one, else ``str(value)``.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from itertools import repeat
from typing import Any

import orjson

Converter = Callable[[Any], Any]
#: Bumping this changes every derived id; never do it silently (it breaks dedup of re-runs).
ID_SCHEME = b"cproxy-spark-id-v1\x00"

#: Salt of the key digest that starts every id of id scheme 2 (same rule as ``ID_SCHEME``).
KEY_SCHEME = b"cproxy-spark-key-v1\x00"

IDENTITY_TYPES = frozenset(
    ["string", "boolean", "byte", "short", "integer", "long", "float", "double", "null"]
)


def _convert_decimal(value: Any) -> Any:
    return None if value is None else format(value, "f")


def _convert_date(value: Any) -> Any:
    return None if value is None else value.isoformat()


def _convert_timestamp(value: Any) -> Any:
    if value is None:
        return None
    # PySpark hands TimestampType out as a naive datetime in the worker's local time zone;
    # astimezone() interprets a naive value exactly that way, so the instant is preserved.
    utc = value.astimezone(dt.UTC)
    return utc.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def _convert_timestamp_ntz(value: Any) -> Any:
    return None if value is None else value.isoformat(timespec="microseconds")


def _convert_binary(value: Any) -> Any:
    return None if value is None else base64.b64encode(bytes(value)).decode("ascii")


def _convert_interval(value: Any) -> Any:
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return value


def _convert_other(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    to_json = getattr(value, "toJson", None)
    if callable(to_json):
        # Spark's VariantVal: embed its JSON text verbatim.
        return orjson.Fragment(to_json())
    return str(value)


def _convert_array(element: Converter | None) -> Converter:
    def convert(value: Any) -> Any:
        if value is None:
            return None
        if element is None:
            return list(value)
        return [element(item) for item in value]

    return convert


def _convert_map(key: Converter | None, val: Converter | None) -> Converter:
    def convert(value: Any) -> Any:
        if value is None:
            return None
        return {
            key_text(k if key is None else key(k)): (v if val is None else val(v))
            for k, v in value.items()
        }

    return convert


def _convert_struct(names: Sequence[str], fields: Sequence[Converter | None]) -> Converter:
    def convert(value: Any) -> Any:
        if value is None:
            return None
        # Rows are tuples; a dict only appears when callers hand in plain Python data.
        items = [value.get(name) for name in names] if isinstance(value, Mapping) else value
        return {
            name: item if conv is None else conv(item)
            for name, conv, item in zip(names, fields, items, strict=True)
        }

    return convert


def build_converter(spark_type: Any) -> Converter | None:
    """Converter for one Spark type in JSON form; ``None`` means the value is used as is."""
    if isinstance(spark_type, str):
        name = spark_type.lower()
        if name in IDENTITY_TYPES or name.startswith(("char(", "varchar(")):
            return None
        if name.startswith("decimal"):
            return _convert_decimal
        if name == "date":
            return _convert_date
        if name == "timestamp":
            return _convert_timestamp
        if name == "timestamp_ntz":
            return _convert_timestamp_ntz
        if name == "binary":
            return _convert_binary
        if name.startswith("interval"):
            return _convert_interval
        return _convert_other
    kind = spark_type.get("type")
    if kind == "array":
        return _convert_array(build_converter(spark_type["elementType"]))
    if kind == "map":
        return _convert_map(
            build_converter(spark_type["keyType"]), build_converter(spark_type["valueType"])
        )
    if kind == "struct":
        fields = spark_type["fields"]
        return _convert_struct(
            [f["name"] for f in fields], [build_converter(f["type"]) for f in fields]
        )
    return _convert_other


def key_text(value: Any) -> str:
    """A message key (or map key) from an already converted value.

    Strings stay as they are; everything else becomes its compact JSON text, so ``7`` is
    ``"7"``, ``True`` is ``"true"`` and a struct is its JSON object text.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, Decimal):
        return format(value, "f")
    return orjson.dumps(value).decode("utf-8")


def key_digest(key: str | None) -> str:
    """8 hex digits of a message key (null apart from every string): the start of a message
    id in id scheme 2.

    The server keeps its dedup entries ordered by id. Row digests alone are random, so every
    message of a batch lands on another page of that index and each commit rewrites about
    one page per message; with the key's digest first, the rows of a key (contiguous in a
    task) share a neighbourhood and a batch touches about one page per key.
    """
    payload = b"\x01" if key is None else b"\x00" + key.encode("utf-8", "surrogatepass")
    return hashlib.blake2b(KEY_SCHEME + payload, digest_size=4).hexdigest()


class RowEncoder:
    """Turns positional row values into (key, body, id digest), per a Spark schema.

    Only the schema JSON and column choices are pickled; converters are rebuilt on the
    executor, so nothing depends on closures surviving serialization.
    """

    def __init__(
        self,
        schema_json: Mapping[str, Any],
        key_col: str,
        id_cols: Sequence[str] | None = None,
        body_cols: Sequence[str] | None = None,
        order_col: str | None = None,
    ) -> None:
        self._state = (
            dict(schema_json),
            key_col,
            tuple(id_cols or ()) or None,
            tuple(body_cols or ()) or None,
            order_col,
        )
        #: The schema (JSON form) the encoder was built for.
        self.schema_json: Mapping[str, Any] = self._state[0]
        fields = schema_json["fields"]
        self.names: tuple[str, ...] = tuple(f["name"] for f in fields)
        position = {name: i for i, name in enumerate(self.names)}
        self._converters = [build_converter(f["type"]) for f in fields]
        self.key_index = position[key_col]
        key_type = fields[self.key_index]["type"]
        # Text keys are their own message keys: the column is used as it is.
        self._key_is_text = isinstance(key_type, str) and (
            key_type.lower() == "string" or key_type.lower().startswith(("char(", "varchar("))
        )
        self.order_index = None if order_col is None else position[order_col]
        body = body_cols or self.names
        self._body = [(name, position[name]) for name in body]
        # The common case (every column, in order) builds the body dict in C.
        self._whole_row_body = [name for name, _ in self._body] == list(self.names)
        self._id_indices = [position[name] for name in (id_cols or self.names)]
        #: True when ids come from whole rows, so identical rows need occurrence numbers.
        self.ids_from_whole_row = id_cols is None

    def __reduce__(self) -> tuple[type[RowEncoder], tuple[Any, ...]]:
        return (RowEncoder, self._state)

    def convert(self, row: Sequence[Any]) -> list[Any]:
        """Every column of ``row`` converted to its JSON-ready form."""
        return [
            value if conv is None else conv(value)
            for conv, value in zip(self._converters, row, strict=True)
        ]

    def key(self, converted: Sequence[Any]) -> str | None:
        value = converted[self.key_index]
        return None if value is None else key_text(value)

    def body(self, converted: Sequence[Any]) -> dict[str, Any]:
        if self._whole_row_body:
            return dict(zip(self.names, converted, strict=True))
        return {name: converted[i] for name, i in self._body}

    def digest(self, converted: Sequence[Any]) -> str:
        """128-bit hex digest of the id columns: identical values give identical digests."""
        payload = orjson.dumps([converted[i] for i in self._id_indices])
        return hashlib.blake2b(ID_SCHEME + payload, digest_size=16).hexdigest()

    # The column forms below do for many rows at once what the row forms above do for one,
    # with the same results: ``columns`` holds every column converted (one sequence per
    # column, all of the same length). A row's Python-level work is then one pass of a
    # comprehension or of map() instead of several method calls.

    def keys(self, columns: Sequence[Sequence[Any]]) -> list[str | None]:
        """``key()`` of every row."""
        column = columns[self.key_index]
        if self._key_is_text:
            return list(column)
        return [None if value is None else key_text(value) for value in column]

    def bodies(self, columns: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
        """``body()`` of every row."""
        names = [name for name, _ in self._body]
        picked = columns if self._whole_row_body else [columns[i] for _, i in self._body]
        return list(map(dict, map(zip, repeat(names), zip(*picked, strict=True))))

    def digests(self, columns: Sequence[Sequence[Any]]) -> list[str]:
        """``digest()`` of every row (orjson writes a tuple as it writes a list)."""
        blake2b, dumps, scheme = hashlib.blake2b, orjson.dumps, ID_SCHEME
        rows = zip(*(columns[i] for i in self._id_indices), strict=True)
        return [blake2b(scheme + dumps(row), digest_size=16).hexdigest() for row in rows]
