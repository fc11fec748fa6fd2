"""``cproxy serve`` with the engine tests' in-memory store in place of SQLite (``--ab :memory``).

What the server costs with no storage at all: the same HTTP layer, broker and engine, and a
store that keeps everything in the process's dicts and lists. Run as ``python -m
benchmarks.harness.memory_serve serve ...`` with the arguments of ``cproxy serve``. A
benchmark's yardstick only: nothing survives the process, and nothing is ever trimmed.
"""

from __future__ import annotations

from pathlib import Path

import cproxy.store.sqlite
from cproxy.cli import main
from cproxy.store.memory import MemoryStore


def _memory_store(data_dir: Path | str, **_settings: object) -> MemoryStore:
    """Takes the place of ``SqliteStore(data_dir, ...)``, which ``create_app`` builds."""
    return MemoryStore()


if __name__ == "__main__":
    # create_app looks SqliteStore up in its module when it builds the default store, so
    # replacing the module's attribute before the CLI starts swaps the store of the app.
    cproxy.store.sqlite.SqliteStore = _memory_store  # type: ignore[misc,assignment]
    main()
