"""Arrow record batches to converted columns: the fast input path of ``write_dataframe``.

``mapInArrow`` hands each task its partition as Arrow record batches, which is much cheaper
than Spark pickling one ``Row`` per row for a Python worker. Here each column of a batch is
converted at once, by the same rules as :mod:`spark_sink.rowjson` (so bodies, keys and
message ids are identical to the row path's), and the columns go to the partition writer
a produce batch's worth at a time (:meth:`ArrowRows.chunks`).

Only types whose Arrow form is known to convert identically take this path
(:func:`arrow_supported`); a schema with anything else (intervals, variant, UDTs) is written
through the row path. pyarrow is imported by the functions that need it (executors have it
with the ``spark`` extra).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from spark_sink.rowjson import IDENTITY_TYPES, Converter, build_converter

#: Converts one Arrow array into the column's converted Python values.
ColumnConverter = Callable[[Any], list[Any]]

_SCALARS = frozenset([*IDENTITY_TYPES, "date", "timestamp", "timestamp_ntz", "binary"])
_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")
#: Arrow writes a decimal as ``format(value, "f")`` does, in plain notation, unless its
#: adjusted exponent is below -6 (then ``1E-7``); with at most 6 decimals that never happens.
_MAX_PLAIN_DECIMAL_SCALE = 6

#: Converted columns of some rows, and their raw ``order_col`` values (None without one):
#: what :meth:`~spark_sink.partition.PartitionWriter.write_chunks` takes.
Chunk = tuple[Sequence[Sequence[Any]], Sequence[Any] | None]


def arrow_supported(spark_type: Any) -> bool:
    """True when every (nested) type of ``spark_type`` (JSON form) converts on this path."""
    if isinstance(spark_type, str):
        name = spark_type.lower()
        return name in _SCALARS or name.startswith(("decimal", "char(", "varchar("))
    kind = spark_type.get("type")
    if kind == "array":
        return arrow_supported(spark_type["elementType"])
    if kind == "map":
        return arrow_supported(spark_type["keyType"]) and arrow_supported(spark_type["valueType"])
    if kind == "struct":
        return all(arrow_supported(f["type"]) for f in spark_type["fields"])
    return False


def _iso_text(array: Any, suffix: str) -> list[Any]:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    # Spark's Arrow timestamps hold UTC instants (tagged with the session time zone);
    # untagged they print as UTC, "YYYY-MM-DD HH:MM:SS.ffffff" for a timestamp[us] (four
    # year digits, six fraction digits always). With a "T" and the suffix that is
    # isoformat(timespec="microseconds") + suffix, the row path's text, ten times faster
    # than strftime.
    text = array.cast(pa.timestamp("us")).cast(pa.string())
    iso = pc.utf8_replace_slice(text, start=10, stop=11, replacement="T")
    if suffix:
        iso = pc.binary_join_element_wise(iso, pa.scalar(suffix), pa.scalar(""))
    values: list[Any] = iso.to_pylist()
    return values


def _timestamps(array: Any) -> list[Any]:
    return _iso_text(array, "Z")


def _timestamps_ntz(array: Any) -> list[Any]:
    return _iso_text(array, "")


def _arrow_text(array: Any) -> list[Any]:
    import pyarrow as pa

    # Arrow's own text is the row path's for dates (ISO 8601 with a 4-digit year, as
    # date.isoformat() does) and for decimals of up to _MAX_PLAIN_DECIMAL_SCALE places.
    values: list[Any] = array.cast(pa.string()).to_pylist()
    return values


def _plain(array: Any) -> list[Any]:
    return list(array.to_pylist())


def _each(convert: Converter) -> ColumnConverter:
    return lambda array: [convert(v) for v in array.to_pylist()]


def _map_pairs(spark_type: Any) -> Converter | None:
    """Arrow gives a map as a list of (key, value) pairs where a Row holds a dict: this
    turns pairs into dicts at every nesting level (None: the type holds no map)."""
    if isinstance(spark_type, str):
        return None
    kind = spark_type.get("type")
    if kind == "array":
        inner = _map_pairs(spark_type["elementType"])
        if inner is None:
            return None
        return lambda v: None if v is None else [inner(x) for x in v]
    if kind == "map":
        key, val = _map_pairs(spark_type["keyType"]), _map_pairs(spark_type["valueType"])
        return lambda v: (
            None
            if v is None
            else {(k if key is None else key(k)): (x if val is None else val(x)) for k, x in v}
        )
    if kind == "struct":
        names = [f["name"] for f in spark_type["fields"]]
        inner_fields = [_map_pairs(f["type"]) for f in spark_type["fields"]]
        if all(f is None for f in inner_fields):
            return None
        return lambda v: (
            None
            if v is None
            else {
                n: (v[n] if f is None else f(v[n]))
                for n, f in zip(names, inner_fields, strict=True)
            }
        )
    return None


def column_converter(spark_type: Any) -> ColumnConverter:
    """The converter of one column of an :func:`arrow_supported` type."""
    if isinstance(spark_type, str):
        name = spark_type.lower()
        if name == "timestamp":
            return _timestamps
        if name == "timestamp_ntz":
            return _timestamps_ntz
        decimal = _DECIMAL.fullmatch(name)
        if name == "date" or (
            decimal is not None and int(decimal.group(2)) <= _MAX_PLAIN_DECIMAL_SCALE
        ):
            return _arrow_text
    convert = build_converter(spark_type)
    pairs = _map_pairs(spark_type)
    if pairs is not None:
        after = convert
        return lambda array: [
            after(pairs(v)) if after is not None else pairs(v) for v in array.to_pylist()
        ]
    return _plain if convert is None else _each(convert)


class ArrowRows:
    """Converted columns from record batches of one schema (JSON form), in batch order."""

    def __init__(self, schema_json: Mapping[str, Any], order_index: int | None) -> None:
        self._converters = [column_converter(f["type"]) for f in schema_json["fields"]]
        self._order_index = order_index

    def chunks(self, batches: Iterable[Any], rows: int) -> Iterator[Chunk]:
        """The batches converted a whole column at a time, handed out ``rows`` rows at a
        time (a produce batch's worth: the writer encodes a batch while the previous one is
        being sent)."""
        for batch in batches:
            columns = [conv(batch.column(i)) for i, conv in enumerate(self._converters)]
            order = None
            if self._order_index is not None:
                order = _order_values(batch.column(self._order_index))
            for start in range(0, batch.num_rows, rows):
                end = start + rows
                part = order[start:end] if order is not None else None
                yield [column[start:end] for column in columns], part


def _order_values(array: Any) -> list[Any]:
    """The order column as the row path sees it (only compared, never sent). Timestamps
    compare as instants either way; naive UTC values avoid zone-aware comparisons."""
    import pyarrow as pa

    if pa.types.is_timestamp(array.type) and array.type.tz is not None:
        array = array.cast(pa.timestamp("us"))
    values: list[Any] = array.to_pylist()
    return values
