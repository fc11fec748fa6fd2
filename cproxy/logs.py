"""Logging setup: ``key=value`` text lines by default, or one JSON object per line.

Log calls put identifiers in the message as ``group=... topic=... qid=... offset=...`` so
both formats can be grepped and parsed the same way.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Literal

import orjson

LogFormat = Literal["text", "json"]


def utc_timestamp(record: logging.LogRecord) -> str:
    """``2026-11-27T08:52:52.123Z``: UTC with milliseconds, whatever the host's time zone."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{stamp}.{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return utc_timestamp(record)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": utc_timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def configure_logging(level: str, fmt: LogFormat = "text") -> None:
    """One handler on the root logger; uvicorn's loggers propagate to it (``serve`` gives
    uvicorn no log config of its own), so its lines carry the same timestamps."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
