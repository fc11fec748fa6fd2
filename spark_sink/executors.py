"""Check, on the driver, that Spark's Python workers can import ``spark_sink``.

Workers run the interpreter Spark is told to use (``PYSPARK_PYTHON`` /
``spark.pyspark.python``, else ``python3`` from PATH), not necessarily the driver's. Without
this check a write fails inside every task with a long worker traceback ending in
``ModuleNotFoundError: No module named 'spark_sink'``; with it, the driver raises one line
that says what to do. The check runs one tiny job once per Spark application.
"""

from __future__ import annotations

import re
from typing import Any

from spark_sink.errors import SinkConfigError

_checked: set[str] = set()
_MISSING = re.compile(r"No module named '([^']+)'")


def _probe(_: Any) -> str:
    import spark_sink

    return spark_sink.__name__


def check_executors(spark: Any) -> None:
    """Raise ``SinkConfigError`` unless the workers of ``spark`` can import ``spark_sink``."""
    context = spark.sparkContext
    app = str(context.applicationId)
    if app in _checked:
        return
    try:
        context.parallelize([0], 1).map(_probe).collect()
    except Exception as exc:
        missing = _MISSING.search(str(exc))
        if missing is None:
            raise
        worker = context.pythonExec or "python3"
        raise SinkConfigError(
            f"Spark's Python workers ({worker}) cannot import spark_sink (no module named "
            f"{missing.group(1)!r}): run them with the interpreter that has cproxy-ordered[spark] "
            "installed (set PYSPARK_PYTHON, or spark.pyspark.python, to e.g. the virtualenv's "
            "python; see docs/spark.md)"
        ) from None
    _checked.add(app)
