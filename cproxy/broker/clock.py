"""The service's one wall clock: milliseconds since the Unix epoch.

The engine reads no clock; the broker reads this one and passes ``now_ms`` down, so tests
and the HTTP layer never read time themselves.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000
