"""The Arrow path converts columns exactly as the row path converts rows: same bodies, keys
and message ids, whatever the type (so a re-run through either path is deduplicated)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import orjson
import pytest

from spark_sink import SinkOptions
from spark_sink.columns import ArrowRows, arrow_supported
from spark_sink.partition import PartitionWriter
from spark_sink.rowjson import RowEncoder
from tests.spark_sink.sink_testing import FakeCproxy

pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (the 'spark' extra)")

BERLIN = dt.timezone(dt.timedelta(hours=2))
FIELDS: list[tuple[str, Any, Any]] = [
    ("ride", "string", pa.string()),
    ("seq", "long", pa.int64()),
    ("ok", "boolean", pa.bool_()),
    ("fare", "decimal(8,2)", pa.decimal128(8, 2)),
    ("ratio", "double", pa.float64()),
    ("at", "timestamp", pa.timestamp("us", tz="Europe/Berlin")),
    ("local", "timestamp_ntz", pa.timestamp("us")),
    ("day", "date", pa.date32()),
    ("raw", "binary", pa.binary()),
    ("tags", {"type": "array", "elementType": "string", "containsNull": True}, None),
    (
        "extra",
        {"type": "map", "keyType": "string", "valueType": "integer", "valueContainsNull": True},
        pa.map_(pa.string(), pa.int32()),
    ),
    (
        "stop",
        {
            "type": "struct",
            "fields": [
                {"name": "lat", "type": "double", "nullable": True, "metadata": {}},
                {
                    "name": "seen",
                    "type": {
                        "type": "map",
                        "keyType": "integer",
                        "valueType": "timestamp",
                        "valueContainsNull": True,
                    },
                    "nullable": True,
                    "metadata": {},
                },
            ],
        },
        pa.struct(
            [("lat", pa.float64()), ("seen", pa.map_(pa.int32(), pa.timestamp("us", tz="UTC")))]
        ),
    ),
]
SCHEMA = {
    "type": "struct",
    "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t, _ in FIELDS],
}


def instant(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=dt.UTC)


def python_rows() -> list[dict[str, Any]]:
    """Rows as plain Python values, which is what Spark hands the row path."""
    full = {
        "ride": "r1",
        "seq": 3,
        "ok": True,
        "fare": Decimal("12.50"),
        "ratio": float("nan"),
        "at": instant(2024, 5, 1, 12, 0, 0, 250000),
        "local": dt.datetime(2024, 5, 1, 14, 0, 0, 1),
        "day": dt.date(2024, 5, 1),
        "raw": b"\x00\xff",
        "tags": ["a", None],
        "extra": {"k": 1, "j": None},
        "stop": {"lat": 52.5, "seen": {7: instant(1969, 12, 31, 23, 59, 59, 999999)}},
    }
    empty = dict.fromkeys(full)
    empty["ride"] = "r2"
    return [full, empty, {**full, "seq": -1, "fare": Decimal("-0.05"), "tags": []}]


def record_batch(rows: list[dict[str, Any]]) -> Any:
    arrays = []
    for name, _, arrow_type in FIELDS:
        values = [r[name] for r in rows]
        if name == "extra":
            values = [None if v is None else list(v.items()) for v in values]
        if name == "stop":
            values = [None if v is None else {**v, "seen": list(v["seen"].items())} for v in values]
        if name == "at":
            values = [None if v is None else v.astimezone(BERLIN) for v in values]
        arrays.append(pa.array(values, arrow_type) if arrow_type is not None else pa.array(values))
    return pa.RecordBatch.from_arrays(arrays, names=[n for n, _, _ in FIELDS])


def spark_row(row: dict[str, Any]) -> tuple[Any, ...]:
    """What a PySpark Row holds: a naive local datetime for timestamps (here the local zone
    is whatever the machine has; ``astimezone()`` is how PySpark builds them)."""
    values = []
    for name, _, _ in FIELDS:
        v = row[name]
        if name == "at" and v is not None:
            v = v.astimezone().replace(tzinfo=None)
        if name == "stop" and v is not None:
            seen = {k: t.astimezone().replace(tzinfo=None) for k, t in v["seen"].items()}
            v = (v["lat"], seen)
        values.append(v)
    return tuple(values)


def arrow_rows(
    schema: dict[str, Any], order_index: int | None, batches: list[Any], chunk_rows: int = 1000
) -> list[tuple[tuple[Any, ...], Any]]:
    """(converted row, raw order value or None) per row of what ``ArrowRows.chunks`` hands
    the writer."""
    got: list[tuple[tuple[Any, ...], Any]] = []
    for columns, order in ArrowRows(schema, order_index).chunks(batches, chunk_rows):
        rows = list(zip(*columns, strict=True))
        got += zip(rows, order if order is not None else [None] * len(rows), strict=True)
    return got


def test_every_supported_type_converts_like_the_row_path() -> None:
    encoder = RowEncoder(SCHEMA, "ride", order_col="seq")
    expected = [encoder.convert(spark_row(r)) for r in python_rows()]
    got = arrow_rows(SCHEMA, encoder.order_index, [record_batch(python_rows())], chunk_rows=2)
    # As JSON: NaN is not equal to itself, and JSON is what is sent and hashed.
    assert orjson.dumps([list(row) for row, _ in got]) == orjson.dumps(expected)
    assert [order for _, order in got] == [3, None, -1]
    assert [encoder.digest(row) for row, _ in got] == [encoder.digest(r) for r in expected]
    assert expected[0][5] == "2024-05-01T12:00:00.250000Z"
    assert expected[0][11] == {"lat": 52.5, "seen": {"7": "1969-12-31T23:59:59.999999Z"}}


def test_writes_through_both_paths_store_the_same_messages(fake_cproxy: FakeCproxy) -> None:
    options = SinkOptions.create(url="http://cproxy", topic="t", key_col="ride", batch_size=2)
    encoder = RowEncoder(SCHEMA, "ride")
    rows = sorted(python_rows(), key=lambda r: r["ride"])

    def writer() -> PartitionWriter:
        return PartitionWriter(options, encoder, transport=fake_cproxy.transport())

    first = writer().write([spark_row(r) for r in rows])
    chunks = ArrowRows(SCHEMA, None).chunks([record_batch(rows[:1]), record_batch(rows[1:])], 2)
    second = writer().write_chunks(chunks)
    assert (first.stored, second.stored, second.duplicates) == (3, 0, 3)


def test_types_without_a_known_arrow_form_take_the_row_path() -> None:
    assert arrow_supported(SCHEMA)
    assert not arrow_supported("interval day to second")
    assert not arrow_supported("variant")
    nested = {"type": "array", "elementType": "interval year to month", "containsNull": True}
    assert not arrow_supported({"type": "struct", "fields": [{"name": "x", "type": nested}]})


def test_timestamps_and_decimals_take_arrow_casts_with_the_row_paths_text() -> None:
    # Arrow formats these columns itself (no Python value per row): the text must be the row
    # path's to the character, at the ends of the range and with a zero fraction too.
    schema = {
        "type": "struct",
        "fields": [
            {"name": n, "type": t, "nullable": True, "metadata": {}}
            for n, t in (
                ("at", "timestamp"),
                ("local", "timestamp_ntz"),
                ("fare", "decimal(8,2)"),
                ("tiny", "decimal(38,6)"),
                ("fine", "decimal(38,18)"),
            )
        ],
    }
    utc = dt.UTC
    stamps = [
        dt.datetime(1, 1, 2, 3, 4, 5, tzinfo=utc),
        dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=utc),
        dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=utc),
        dt.datetime(9999, 12, 30, 23, 59, 59, 999999, tzinfo=utc),
        None,
    ]
    fares = [Decimal("-0.01"), Decimal("0.00"), Decimal("123456.78"), Decimal("1.5"), None]
    tiny = [Decimal("0.000001"), Decimal("-0.000001"), Decimal("0"), Decimal("12.5"), None]
    fine = [Decimal("1E-18"), Decimal("0"), Decimal("-3.25"), Decimal("1E+19"), None]
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(stamps, pa.timestamp("us", tz="Europe/Berlin")),
            pa.array([s and s.replace(tzinfo=None) for s in stamps], pa.timestamp("us")),
            pa.array(fares, pa.decimal128(8, 2)),
            pa.array(tiny, pa.decimal128(38, 6)),
            pa.array(fine, pa.decimal128(38, 18)),
        ],
        names=["at", "local", "fare", "tiny", "fine"],
    )
    encoder = RowEncoder(schema, "fare")
    local = [s and s.astimezone().replace(tzinfo=None) for s in stamps]
    naive = [s and s.replace(tzinfo=None) for s in stamps]
    # A Row holds a decimal at its column's scale (Decimal("1.50") in a decimal(8,2)).
    decimals = [batch.column(i).to_pylist() for i in (2, 3, 4)]
    spark_rows = list(zip(local, naive, *decimals, strict=True))
    expected = [encoder.convert(r) for r in spark_rows]
    got = [list(row) for row, _ in arrow_rows(schema, None, [batch])]
    assert got == expected
    assert got[0][:2] == ["0001-01-02T03:04:05.000000Z", "0001-01-02T03:04:05.000000"]
    assert [row[4] for row in got[:2]] == ["0.000000000000000001", "0.000000000000000000"]
