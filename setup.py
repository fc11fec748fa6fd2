"""Build hook: compiles the hot path with mypyc (``cproxy/_native.py`` says which modules and
why). All other metadata is in ``pyproject.toml``.

Without a working C compiler (or with ``CPROXY_PURE_PYTHON=1``) the install is pure Python:
the same behaviour, slower. Without a compiler or the Python headers no C is generated at all
(that alone takes a minute); a compile that fails prints one warning line and the install goes
on (``cproxy --version`` then says ``hot path: interpreted``). The warning goes to the terminal
when there is one: pip shows a build's own output only with ``-v``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import shlex
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
NATIVE: dict[str, Any] = runpy.run_path(str(HERE / "cproxy" / "_native.py"))


def _warn(message: str) -> None:
    line = (
        f"cproxy: WARNING: {message}; installing the pure-Python hot path "
        "(same behaviour, slower)\n"
    )
    try:  # pip captures the build's output: the terminal, if any, still shows this line
        with open("/dev/tty", "w") as tty:
            tty.write(line)
            return
    except OSError:
        pass
    sys.stderr.write(line)


def _cannot_compile() -> str | None:
    """Why no C extension can be built here (no C compiler, no Python headers), or None."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC")
    if cc:  # None on Windows, where setuptools finds MSVC itself
        program = shlex.split(cc)[0]
        if shutil.which(program) is None:
            return f"no C compiler ({program!r} not found)"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "no Python headers (Python.h; e.g. the python3-dev package)"
    return None


def _extensions() -> list[Any]:
    if os.environ.get(NATIVE["PURE_ENV"]) == "1":
        return []
    missing = _cannot_compile()
    if missing is not None:
        _warn(missing)  # before generating C from the sources: that alone takes a minute
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _warn("mypyc is not available")
        return []
    sources = [str(NATIVE["source_path"](m, HERE).relative_to(HERE)) for m in NATIVE["MODULES"]]
    # Not the project's strict settings: the build environment has none of cproxy's
    # dependencies, so their types are Any there (and some ignores look unused). Strict mypy
    # runs on the sources in CI.
    options = ["--config-file", os.devnull, "--ignore-missing-imports"]
    _remove_stale_extensions()
    record = NATIVE["record_build"](HERE)  # the sources as mypyc reads them now
    printed = io.StringIO()  # mypy prints its errors on stdout, notes on stderr
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            extensions = mypycify(options + sources, opt_level="3", group_name="cproxy_native")
    except (Exception, SystemExit) as exc:  # mypy's errors end in SystemExit
        errors = [line for line in printed.getvalue().splitlines() if ": error:" in line]
        more = f" and {len(errors) - 1} more errors" if len(errors) > 1 else ""
        _warn(f"mypyc could not compile the hot path ({errors[0] if errors else repr(exc)}{more})")
        return []
    OptionalBuildExt.record = record
    return extensions


def _remove_stale_extensions() -> None:
    """In-place (editable) builds leave compiled modules in the source tree; one of a module
    no longer in ``MODULES`` would still shadow its source, so it goes."""
    keep = {NATIVE["source_path"](m, HERE) for m in NATIVE["MODULES"]}
    for compiled in (HERE / "cproxy").rglob("*.so"):
        # "group.cpython-311-x86_64-linux-gnu.so" is module "group" (module names hold no dot)
        if compiled.with_name(compiled.name.split(".", 1)[0] + ".py") not in keep:
            compiled.unlink()


class OptionalBuildExt(build_ext):
    """A compile that fails (no compiler, no Python headers) leaves the pure-Python install."""

    #: What ``_extensions`` compiled; written next to the modules only once they all built.
    record: dict[str, str] | None = None

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # CCompilerError, DistutilsError, OSError: all mean "no"
            _warn(f"compiling the hot path failed ({exc})")
            return
        if self.record is None:
            return
        # In the source tree (in-place and editable builds) and in the wheel's tree.
        for root in {HERE, Path(self.build_lib).resolve()}:
            if (root / "cproxy").is_dir():
                (root / "cproxy" / NATIVE["BUILD_RECORD"]).write_text(json.dumps(self.record))


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
