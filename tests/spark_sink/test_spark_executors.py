"""Workers that cannot import the sink: the driver says so in one line, before any task."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession
    from spark_sink import write_dataframe
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .getOrCreate())
    df = spark.createDataFrame([("k", 1)], ["key", "n"])
    try:
        write_dataframe(df, url="http://127.0.0.1:9", topic="t", key_col="key")
    except Exception as exc:
        print("RAISED", type(exc).__name__, str(exc))
        sys.exit(3)
    """
)


def test_workers_without_the_sink_fail_on_the_driver_with_one_line(
    tmp_path: Path, spark: object
) -> None:
    bare = shutil.which("python3", path="/usr/bin:/bin")
    if bare is None or bare == sys.executable:
        pytest.skip("no second Python interpreter (without spark_sink's dependencies) found")
    probe = subprocess.run([bare, "-c", "import httpx"], capture_output=True, check=False)
    if probe.returncode == 0:
        pytest.skip(f"{bare} can import httpx: it is not a bare interpreter")
    (tmp_path / "job.py").write_text(JOB)
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYSPARK_PYTHON": bare, "PYTHONPATH": root}
    out = subprocess.run(
        [sys.executable, "job.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 3, out.stdout + out.stderr[-2000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("RAISED")]
    assert "SinkConfigError" in line and "PYSPARK_PYTHON" in line and bare in line
