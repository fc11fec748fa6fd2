"""SinkOptions: validation, string parsing for the Data Source, immutability."""

from __future__ import annotations

import pickle

import pytest

from spark_sink import SinkConfigError, SinkOptions

BASE = {"url": "http://127.0.0.1:9713", "topic": "rides", "key_col": "ride_id"}


def test_defaults_and_normalisation() -> None:
    options = SinkOptions.create(
        **{**BASE, "url": "http://h:1/"}, id_cols="a, b", headers={"z": 1, "a": "x"}
    )
    assert options.url == "http://h:1"
    assert options.id_cols == ("a", "b")
    assert options.headers == (("a", "x"), ("z", "1"))
    assert options.batch_size == 1000
    assert options.null_keys == "error"
    assert options.id_scheme == 2


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"url": "127.0.0.1:9713"}, "url must be"),
        ({"url": "ftp://h"}, "url must be"),
        ({"topic": "bad topic"}, "topic 'bad topic'"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 1001}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"batch_size": "10"}, "batch_size"),
        ({"null_keys": "drop"}, "null_keys must be one of"),
        ({"id_cols": []}, "id_cols must name"),
        ({"key_col": ""}, "key_col"),
        ({"max_retries": -1}, "max_retries"),
        ({"retry_max_ms": 10, "retry_initial_ms": 100}, "retry_max_ms"),
        ({"max_request_bytes": 100}, "max_request_bytes"),
        ({"id_prefix": "x" * 129}, "id_prefix"),
        ({"id_scheme": 3}, "id_scheme"),
        ({"id_scheme": 0}, "id_scheme"),
        ({"no_such": 1}, "unexpected keyword"),
    ],
)
def test_invalid_options_fail_with_a_clear_message(
    change: dict[str, object], fragment: str
) -> None:
    with pytest.raises(SinkConfigError, match=fragment):
        SinkOptions.create(**{**BASE, **change})


def test_from_strings_parses_types_and_headers() -> None:
    options = SinkOptions.from_strings(
        {
            **BASE,
            "batchSize": "250",
            "ORDER_COL": "ts",
            "verify_order": "false",
            "id_cols": "ride_id,event",
            "header.source": "spark",
            "create_topic_queues": "8",
            "idScheme": "1",
        }
    )
    assert options.batch_size == 250
    assert options.order_col == "ts"
    assert options.verify_order is False
    assert options.id_cols == ("ride_id", "event")
    assert options.headers == (("source", "spark"),)
    assert options.create_topic_queues == 8
    assert options.id_scheme == 1


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"url": "http://h:1", "topic": "t"}, "'key_col' is required"),
        ({**BASE, "kee_col": "x"}, "unknown option 'kee_col'"),
        ({**BASE, "batch_size": "many"}, "must be an integer"),
        ({**BASE, "verify_order": "yes"}, "true or false"),
        ({**BASE, "path": "/tmp/x"}, "not supported"),
    ],
)
def test_from_strings_rejects_bad_input(raw: dict[str, str], fragment: str) -> None:
    with pytest.raises(SinkConfigError, match=fragment):
        SinkOptions.from_strings(raw)


def test_check_columns_names_every_missing_column() -> None:
    options = SinkOptions.create(**BASE, order_col="ts", id_cols=["ride_id", "nope"])
    with pytest.raises(SinkConfigError, match=r"'ts', 'nope' not in the DataFrame"):
        options.check_columns(["ride_id", "event"])
    options.replace(order_col=None, id_cols=None).check_columns(["ride_id"])


def test_immutable_picklable_and_token_hidden() -> None:
    options = SinkOptions.create(**BASE, token="s3cret")
    assert "s3cret" not in repr(options)
    assert pickle.loads(pickle.dumps(options)) == options
    with pytest.raises(AttributeError):
        options.topic = "other"  # type: ignore[misc]
    with pytest.raises(SinkConfigError):
        options.replace(batch_size=0)
