"""Without Java, the Spark tests skip with a printed reason instead of erroring."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: One test that needs the ``spark`` fixture (a real Spark session).
SPARK_TEST = "tests/spark_sink/test_spark_streaming.py::test_ids_include_the_batch_id"


def _run_spark_test(env: dict[str, str]) -> str:
    """Run :data:`SPARK_TEST` in a child pytest; its output, after checking it skipped."""
    pytest.importorskip("pyspark", reason="PySpark is not installed: the Java check comes after")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", SPARK_TEST],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    summary = output.strip().splitlines()[-1]
    assert result.returncode == 0, output
    assert "1 skipped" in summary and "error" not in summary, output
    return output


def test_spark_tests_skip_with_a_reason_when_java_is_missing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    # Only the venv's bin (and an empty dir): python is there, java is not.
    env["PATH"] = os.pathsep.join([str(tmp_path), str(Path(sys.executable).parent)])
    if shutil.which("java", path=env["PATH"]) is not None:
        pytest.skip("java sits next to this interpreter: cannot hide it by PATH")
    output = _run_spark_test(env)
    assert "no Java runtime" in output, output


def test_a_java_home_without_java_is_named(tmp_path: Path) -> None:
    output = _run_spark_test({**os.environ, "JAVA_HOME": str(tmp_path)})
    assert f"JAVA_HOME={tmp_path} has no bin/java" in output, output
