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
    env = os.environ | env_extra  # as this process's, unless the test says otherwise
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


@pytest.mark.skipif(
    os.environ.get(_native.PURE_ENV) != "1",
    reason=f"{_native.PURE_ENV} is not set (.ci/run sets it for its interpreted run)",
)
def test_the_interpreted_run_runs_every_compiled_module_from_source() -> None:
    assert _native.status().startswith("source (")
    for module in _native.MODULES:
        __import__(module)
        assert sys.modules[module].__file__ == str(_native.source_path(module)), module


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
    warning line says why the hot path stays pure Python, said before mypyc would generate any C."""
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
    (warning,) = [line for line in done.stderr.splitlines() if line.startswith("cproxy:")]
    assert warning.startswith("cproxy: WARNING: no C compiler") and "pure-Python" in warning


def test_the_compiled_modules_and_only_they_carry_the_marker() -> None:
    """The boundary of the compiled core is visible in each file: its first line says so,
    and a module that says so is compiled (``setup.py`` builds ``MODULES``)."""
    root = Path(__file__).resolve().parents[1]
    marked = set()
    for package in ("cproxy", "consumer_sdk", "spark_sink"):
        for path in (root / package).rglob("*.py"):
            lines = path.read_text().splitlines()
            if _native.MARKER in lines:
                assert lines[0] == _native.MARKER, f"{path}: the marker is not the first line"
                marked.add(".".join(path.relative_to(root).with_suffix("").parts))
    assert sorted(marked) == sorted(_native.MODULES)


def test_the_engine_is_compiled_whole() -> None:
    """The engine is pure, sync and the hottest code: a new module of it is compiled too
    (listed in ``MODULES``, marked), or its classes would run interpreted between compiled
    ones and a native class could not extend them."""
    root = Path(__file__).resolve().parents[1]
    engine = sorted(
        f"cproxy.engine.{path.stem}"
        for path in (root / "cproxy" / "engine").glob("*.py")
        if path.stem != "__init__"
    )
    assert [m for m in engine if m not in _native.MODULES] == []


def test_no_compiled_module_awaits() -> None:
    """Only sync, CPU-bound code is compiled: I/O gains nothing from mypyc."""
    import ast

    offenders = [
        module
        for module in _native.MODULES
        for node in ast.walk(ast.parse(_native.source_path(module).read_text()))
        if isinstance(node, (ast.AsyncFunctionDef, ast.Await))
    ]
    assert offenders == []


def test_the_version_and_the_metrics_say_when_the_hot_path_runs_from_source(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cproxy.metrics import _BuildInfo

    def compiled_label() -> str:
        (family,) = _BuildInfo().collect()
        (sample,) = family.samples
        return sample.labels["compiled"]

    monkeypatch.setitem(_native._state, "status", "compiled")
    assert _native.describe() == "compiled"
    assert compiled_label() == "true"
    stale = "source (changed since the build: cproxy.engine.group)"
    monkeypatch.setitem(_native._state, "status", stale)
    assert _native.describe() == "interpreted: changed since the build: cproxy.engine.group"
    assert compiled_label() == "false"


def _version(env_extra: dict[str, str], root: Path | None = None) -> str:
    env = os.environ | env_extra
    if root is not None:  # ahead of the real tree, which still provides consumer_sdk
        env["PYTHONPATH"] = os.pathsep.join([str(root), str(Path(__file__).resolve().parents[1])])
    done = subprocess.run(
        [sys.executable, "-m", "cproxy", "--version"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout.strip()


def test_the_version_says_how_the_hot_path_runs() -> None:
    from cproxy import __version__

    assert _version({}) == f"cproxy {__version__} (hot path: {_native.describe()})"
    pure = _version({_native.PURE_ENV: "1"})
    if _native.compiled_modules():
        assert pure.endswith(f"(hot path: interpreted: {_native.PURE_ENV}=1)")
    else:
        assert pure.endswith("(hot path: interpreted: not compiled)")


@pytest.mark.skipif(_native.status() != "compiled", reason="the hot path runs interpreted here")
def test_a_source_edited_after_the_build_runs_interpreted_and_says_so(tmp_path: Path) -> None:
    """An editable install edited after its build: the version names the changed module."""
    import shutil

    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "cproxy", tmp_path / "cproxy")
    for shared in root.glob("cproxy_native__mypyc*"):  # the group's shared library
        shutil.copy2(shared, tmp_path)
    assert _version({}, tmp_path).endswith("(hot path: compiled)")
    edited = _native.source_path("cproxy.engine.group", tmp_path)
    edited.write_text(edited.read_text() + "# edited after the build\n")
    version = _version({}, tmp_path)
    assert version.endswith("(hot path: interpreted: changed since the build: cproxy.engine.group)")


def test_the_build_pins_the_mypy_that_constraints_pin() -> None:
    """A new mypyc can fail the compile (the slow path installs) or change the code it
    generates: the build uses exactly the mypy the suite last passed with."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    requires = tomllib.loads((root / "pyproject.toml").read_text())["build-system"]["requires"]
    (mypy,) = [r for r in requires if r.startswith("mypy")]
    pins = (root / "constraints.txt").read_text().splitlines()
    assert mypy.startswith("mypy==") and mypy in pins
