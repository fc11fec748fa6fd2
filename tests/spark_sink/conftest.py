"""Fixtures for the Spark sink tests.

- ``fake_cproxy``: an in-process stand-in for the produce API behind ``httpx.MockTransport``
  (dedup by id, atomic batches, injectable failures) for unit tests of the pure parts.
- ``spark``: one session-scoped local Spark session; ``local[2,3]`` lets a failed task be
  retried (up to 3 attempts), which the fault-injection test relies on. Without PySpark,
  pyarrow or a Java runtime the tests that use it are skipped, with the reason printed
  (``pytest -rs``), instead of erroring while Spark starts.
- ``cproxy``: helpers over a real server (unique topics, reading a topic back in order).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.spark_sink.sink_testing import FakeCproxy, ServerIO


@pytest.fixture
def fake_cproxy() -> FakeCproxy:
    return FakeCproxy()


def java_missing() -> str | None:
    """Why Spark cannot start its JVM here, or None when a ``java`` can be found the way
    PySpark looks for it (``$JAVA_HOME/bin/java``, else ``java`` on the PATH)."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        if os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
            return None
        return f"JAVA_HOME={java_home} has no bin/java (Spark needs Java 17 or later)"
    if shutil.which("java") is None:
        return "no Java runtime: 'java' is not on PATH and JAVA_HOME is unset (Spark needs Java 17)"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="PySpark is not installed (the 'spark' extra)")
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (the 'spark' extra)")
    reason = java_missing()
    if reason is not None:
        pytest.skip(reason)
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
