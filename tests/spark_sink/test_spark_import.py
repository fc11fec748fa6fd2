"""``import spark_sink`` must work on a core install, without PySpark."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_import_without_pyspark_works_until_spark_is_needed() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["pyspark"] = None  # makes every 'import pyspark...' fail
        import spark_sink
        options = spark_sink.SinkOptions.create(url="http://h:1", topic="t", key_col="k")
        writer = spark_sink.foreach_batch_writer("http://h:1", "t", "k", check=False)
        for call in (lambda: spark_sink.write_dataframe(None, "http://h:1", "t", "k"),
                     lambda: spark_sink.register):
            try:
                call()
            except ImportError as exc:
                assert "pip install 'cproxy-ordered[spark]'" in str(exc), exc
            else:
                raise AssertionError("expected ImportError")
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
