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
