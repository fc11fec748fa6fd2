"""Fixtures for the Spark sink tests.

- ``fake_cproxy``: an in-process stand-in for the produce API behind ``httpx.MockTransport``
  (dedup by id, atomic batches, injectable failures) for unit tests of the pure parts.
- ``spark``: one session-scoped local Spark session; ``local[2,3]`` lets a failed task be
  retried (up to 3 attempts), which the fault-injection test relies on.
- ``cproxy``: helpers over a real server (unique topics, reading a topic back in order).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.spark_sink.sink_testing import FakeCproxy, ServerIO


@pytest.fixture
def fake_cproxy() -> FakeCproxy:
    return FakeCproxy()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    from pyspark.sql import SparkSession

    # Workers must run this interpreter (the venv), or they cannot import spark_sink.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("spark_sink-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def cproxy(request: pytest.FixtureRequest) -> ServerIO:
    """A real server: ``SPARK_SINK_TEST_URL`` if set, else the suite's ``server`` fixture."""
    url = os.environ.get("SPARK_SINK_TEST_URL")
    if url:
        return ServerIO(url.rstrip("/"))
    return ServerIO(str(request.getfixturevalue("server").url).rstrip("/"))
