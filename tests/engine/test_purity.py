"""The engine is pure: no web framework, no store, no I/O, no clock (README "Layout")."""

from __future__ import annotations

import ast
from pathlib import Path

import cproxy.engine

FORBIDDEN = (
    "fastapi",
    "starlette",
    "uvicorn",
    "httpx",
    "anyio",
    "asyncio",
    "sqlite3",
    "aiokafka",
    "prometheus_client",
    "time",
    "socket",
    "threading",
    "cproxy.store",
    "cproxy.broker",
    "cproxy.api",
    "cproxy.metrics",
)


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_engine_imports_nothing_impure() -> None:
    engine_dir = Path(cproxy.engine.__file__).parent
    files = sorted(engine_dir.glob("*.py"))
    assert len(files) >= 7
    offenders = {
        f"{path.name}: {name}"
        for path in files
        for name in imported_modules(path)
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN)
    }
    assert offenders == set()
