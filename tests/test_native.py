"""The mypyc-compiled hot path (cproxy/_native.py): used only while built from the sources."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cproxy import _native

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def fake_build(root: Path, *, compiled: tuple[str, ...] = _native.MODULES) -> None:
    """A tree with every module's source, "compiled" files for ``compiled`` and a record."""
    for module in _native.MODULES:
        source = _native.source_path(module, root)
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(f"NAME = {module!r}\n")
        if module in compiled:
            source.with_suffix(SUFFIX).write_bytes(b"")
    record = _native.record_build(root)
    (root / "cproxy" / _native.BUILD_RECORD).write_text(json.dumps(record))


def test_a_build_whose_sources_are_unchanged_is_not_stale(tmp_path: Path) -> None:
    fake_build(tmp_path)
    assert _native.compiled_modules(tmp_path) == list(_native.MODULES)
    assert _native.stale_modules(tmp_path) == []


def test_an_edited_source_makes_its_module_stale(tmp_path: Path) -> None:
    fake_build(tmp_path)
    edited = _native.source_path("cproxy.engine.group", tmp_path)
    edited.write_text(edited.read_text() + "# edited after the build\n")
    assert _native.stale_modules(tmp_path) == ["cproxy.engine.group"]


def test_a_module_the_build_left_out_is_stale(tmp_path: Path) -> None:
    fake_build(tmp_path, compiled=_native.MODULES[1:])
    assert _native.stale_modules(tmp_path) == [_native.MODULES[0]]


def test_without_a_build_record_every_module_is_stale(tmp_path: Path) -> None:
    fake_build(tmp_path)
    (tmp_path / "cproxy" / _native.BUILD_RECORD).unlink()
    assert _native.stale_modules(tmp_path) == list(_native.MODULES)


def test_a_tree_without_compiled_modules_has_none(tmp_path: Path) -> None:
    fake_build(tmp_path, compiled=())
    assert _native.compiled_modules(tmp_path) == []


def test_every_listed_module_exists_and_the_package_inits_are_not_compiled() -> None:
    for module in _native.MODULES:
        assert _native.source_path(module).is_file(), module
        assert not module.endswith("__init__")


def _how_group_loads(env_extra: dict[str, str]) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k != _native.PURE_ENV} | env_extra
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import cproxy._native as n, cproxy.engine.group as g; print(n.status()); "
            "print(g.__file__)",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    status, path = out.stdout.strip().splitlines()
    return status, path


def test_the_environment_variable_loads_the_sources_and_says_so() -> None:
    status, path = _how_group_loads({_native.PURE_ENV: "1"})
    assert path.endswith("group.py")
    if _native.compiled_modules():
        assert status == f"source ({_native.PURE_ENV}=1)"
    else:
        assert status == "source (not compiled)"


def test_this_process_and_a_fresh_one_agree_on_the_compiled_modules() -> None:
    status, path = _how_group_loads({})
    assert status == _native.status()
    assert path.endswith("group.py") == (status != "compiled")


@pytest.mark.skipif(
    os.environ.get("CPROXY_REQUIRE_COMPILED") != "1",
    reason="CPROXY_REQUIRE_COMPILED is not set (.ci/run sets it: CI tests the compiled build)",
)
def test_ci_runs_the_suite_on_the_compiled_hot_path() -> None:
    assert _native.status() == "compiled"


def test_no_compiled_module_defines_a_msgspec_struct() -> None:
    """mypyc drops the class keyword arguments of what it compiles: a Struct's ``gc=False``
    or ``omit_defaults=True`` would silently not apply (the JSON of a pull answer changed)."""
    import ast

    offenders = []
    for module in _native.MODULES:
        tree = ast.parse(_native.source_path(module).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                "Struct" in ast.unparse(base) for base in node.bases
            ):
                offenders.append(f"{module}.{node.name}")
    assert offenders == []


def test_the_answer_structs_keep_their_options() -> None:
    from cproxy.api import wire
    from cproxy.broker.message_json import Delivered

    assert Delivered.__struct_config__.omit_defaults
    assert not Delivered.__struct_config__.gc
    assert not wire._Stored.__struct_config__.gc


def test_without_a_compiler_the_install_says_so_and_generates_no_c(tmp_path: Path) -> None:
    """``setup.py`` run as an install runs it, with a compiler that does not exist: one
    line says why the hot path stays pure Python, said before mypyc would generate any C."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != _native.PURE_ENV}
    env["CC"] = str(tmp_path / "no-such-cc")
    done = subprocess.run(
        [sys.executable, str(root / "setup.py"), "--name"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        start_new_session=True,  # no controlling terminal: the line goes to stderr
    )
    # (The exit status is setuptools' business: an old one refuses pyproject's license field.)
    assert "cproxy: no C compiler" in done.stderr and "pure-Python hot path" in done.stderr
