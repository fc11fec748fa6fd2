"""Row -> JSON conversion, message keys and deterministic ids (no Spark session needed)."""

from __future__ import annotations

import datetime as dt
import math
import pickle
from decimal import Decimal
from typing import Any

import orjson
import pytest

from spark_sink.rowjson import RowEncoder, build_converter, key_text


def field(name: str, spark_type: Any) -> dict[str, Any]:
    return {"name": name, "type": spark_type, "nullable": True, "metadata": {}}


def schema(*fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "struct", "fields": list(fields)}


def convert(spark_type: Any, value: Any) -> Any:
    converter = build_converter(spark_type)
    return value if converter is None else converter(value)


@pytest.mark.parametrize(
    ("spark_type", "value", "expected"),
    [
        ("string", "x", "x"),
        ("long", 2**62, 2**62),
        ("boolean", True, True),
        ("decimal(10,2)", Decimal("12.50"), "12.50"),
        ("decimal(38,0)", Decimal("1E+3"), "1000"),
        ("date", dt.date(2024, 2, 29), "2024-02-29"),
        ("timestamp_ntz", dt.datetime(2024, 1, 2, 3, 4, 5), "2024-01-02T03:04:05.000000"),
        ("binary", bytearray(b"\x00\xff"), "AP8="),
        ("interval day to second", dt.timedelta(minutes=1, microseconds=500), 60.0005),
        (
            {"type": "array", "elementType": "date", "containsNull": True},
            [dt.date(2024, 1, 1), None],
            ["2024-01-01", None],
        ),
        (
            {
                "type": "map",
                "keyType": "integer",
                "valueType": "decimal(4,1)",
                "valueContainsNull": True,
            },
            {1: Decimal("1.5")},
            {"1": "1.5"},
        ),
        (
            schema(
                field("a", "date"),
                field("b", {"type": "array", "elementType": "long", "containsNull": True}),
            ),
            (dt.date(2024, 1, 1), [1, 2]),
            {"a": "2024-01-01", "b": [1, 2]},
        ),
        ("date", None, None),
        (schema(field("a", "long")), None, None),
    ],
)
def test_conversions(spark_type: Any, value: Any, expected: Any) -> None:
    assert convert(spark_type, value) == expected


def test_timestamps_become_utc_instants() -> None:
    aware = dt.datetime(2024, 5, 1, 14, 0, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert convert("timestamp", aware) == "2024-05-01T12:00:00.123456Z"
    # PySpark hands out naive local times; the instant must survive whatever the local zone.
    naive_local = dt.datetime.fromtimestamp(1_700_000_000)
    text = convert("timestamp", naive_local)
    assert text == "2023-11-14T22:13:20.000000Z"


def test_non_finite_floats_encode_as_null() -> None:
    body = [convert("double", math.nan), convert("double", math.inf), convert("float", 1.5)]
    assert orjson.loads(orjson.dumps(body)) == [None, None, 1.5]


def test_unknown_types_fall_back_to_json_text_or_str() -> None:
    class Variant:
        def toJson(self) -> str:
            return '{"a":1}'

    assert orjson.dumps(convert("variant", Variant())) == b'{"a":1}'
    assert convert({"type": "udt", "class": "x"}, object) == str(object)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("ride-7", "ride-7"),
        (7, "7"),
        (True, "true"),
        (1.5, "1.5"),
        (Decimal("2.0"), "2.0"),
        ({"a": 1}, '{"a":1}'),
    ],
)
def test_key_text(value: Any, expected: str) -> None:
    assert key_text(value) == expected


RIDES = schema(
    field("ride_id", "long"),
    field("event", "string"),
    field("at", "timestamp_ntz"),
    field("fare", "decimal(8,2)"),
)
ROW = (7, "pickup", dt.datetime(2024, 1, 1, 8, 0), Decimal("9.90"))


def test_encoder_key_body_and_body_cols() -> None:
    encoder = RowEncoder(RIDES, "ride_id", body_cols=["event", "fare"])
    converted = encoder.convert(ROW)
    assert encoder.key(converted) == "7"
    assert encoder.body(converted) == {"event": "pickup", "fare": "9.90"}
    full = RowEncoder(RIDES, "ride_id")
    assert full.body(full.convert(ROW)) == {
        "ride_id": 7,
        "event": "pickup",
        "at": "2024-01-01T08:00:00.000000",
        "fare": "9.90",
    }
    assert full.key(full.convert((None, "x", None, None))) is None


def test_digest_is_deterministic_and_sensitive() -> None:
    encoder = RowEncoder(RIDES, "ride_id")
    digest = encoder.digest(encoder.convert(ROW))
    assert len(digest) == 32
    # A fresh encoder (another process, another run) gives the same id for the same row.
    again = pickle.loads(pickle.dumps(encoder))
    assert again.digest(again.convert(ROW)) == digest
    assert encoder.digest(encoder.convert((*ROW[:3], Decimal("9.91")))) != digest
    by_ride = RowEncoder(RIDES, "ride_id", id_cols=["ride_id", "event"])
    changed_fare = (*ROW[:3], Decimal("1.00"))
    assert by_ride.digest(by_ride.convert(changed_fare)) == by_ride.digest(by_ride.convert(ROW))
    assert not by_ride.ids_from_whole_row and encoder.ids_from_whole_row


def test_real_spark_schema_json_is_understood() -> None:
    types = pytest.importorskip("pyspark.sql.types")
    spark_schema = types.StructType(
        [
            types.StructField("k", types.StringType()),
            types.StructField("ts", types.TimestampType()),
            types.StructField("d", types.DecimalType(10, 3)),
            types.StructField("tags", types.ArrayType(types.StringType())),
            types.StructField("attrs", types.MapType(types.StringType(), types.DoubleType())),
            types.StructField(
                "pos",
                types.StructType(
                    [
                        types.StructField("lat", types.DoubleType()),
                        types.StructField("lon", types.DoubleType()),
                    ]
                ),
            ),
            types.StructField("c", types.CharType(3)),
        ]
    )
    encoder = RowEncoder(spark_schema.jsonValue(), "k", order_col="ts")
    row = (
        "a",
        dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        Decimal("1.500"),
        ["x"],
        {"p": 0.5},
        (1.0, 2.0),
        "abc",
    )
    assert encoder.body(encoder.convert(row)) == {
        "k": "a",
        "ts": "2024-01-01T00:00:00.000000Z",
        "d": "1.500",
        "tags": ["x"],
        "attrs": {"p": 0.5},
        "pos": {"lat": 1.0, "lon": 2.0},
        "c": "abc",
    }
    assert encoder.order_index == 1
