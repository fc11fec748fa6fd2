"""The benchmark scripts stay importable and their harness runs (they are not timed here)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import benchmarks


def _scripts() -> list[str]:
    return sorted(
        f"benchmarks.{m.name}"
        for m in pkgutil.iter_modules(benchmarks.__path__)
        if not m.name.startswith("_") and not m.ispkg
    )


@pytest.mark.parametrize("module", _scripts())
def test_benchmark_script_imports(module: str) -> None:
    imported = importlib.import_module(module)
    assert callable(getattr(imported, "main", None)), f"{module} has no main()"


def test_the_harness_package_imports() -> None:
    for m in pkgutil.iter_modules(importlib.import_module("benchmarks.harness").__path__):
        importlib.import_module(f"benchmarks.harness.{m.name}")


def test_the_engine_loop_delivers_every_message_once_and_says_how_it_ran() -> None:
    from benchmarks.engine_loop import run_engine
    from cproxy import _native

    out = run_engine(2_000, 100, 300)
    assert out["delivered"] == 2_000
    assert out["us_per_msg"] > 0
    assert out["hot_path"] == _native.status()
