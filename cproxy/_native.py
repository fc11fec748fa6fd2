"""The compiled core: the hot path compiled with mypyc, and when the compiled modules are used.

``setup.py`` compiles the modules in ``MODULES`` (the engine, ``Record``, the append plan,
record batches, produce checks, queue placement: pure, strictly typed Python) into C extensions
with mypyc when cproxy is installed and a C compiler is there; without one the install is pure
Python (one warning line), and nothing else changes. ``describe()`` says which runs (``cproxy
--version``, ``cproxy_build_info`` in ``/metrics``, the start-up line). The ``.py`` stays next
to each compiled module and is the source of truth. A compiled module is only used while it was
built from exactly that source: ``setup.py`` records every source's SHA-256 in
``_native_build.json``, and ``install()`` (called when ``cproxy`` is imported) compares them.

If a source changed since the build (an editable install, then an edit), *all* of ``MODULES``
load from source, with one warning: compiled modules call each other's native classes
directly, so a mix of compiled and source modules would not work. ``CPROXY_PURE_PYTHON=1``
in the environment loads them from source always (debugging, or an A/B benchmark of the
compiler's gain), and at build time skips compiling.

The boundary: every module in ``MODULES`` starts with the line ``MARKER``, and no other module
does (tests/test_native.py checks both ways), so a reader sees at the top of a file that it is
compiled. Only sync, CPU-bound code goes in: a module that awaits (store or network I/O) gains
nothing from the compiler, whose gain is in per-message loops and attribute reads, and pays
its constraints (run-time type checks, no monkeypatching). When such a module has a hot
loop, the loop moves into a compiled module (``Topics.place`` calls
``cproxy.placement.place``). Code shaped for the compiler stays inside the boundary.

Writing for the compiler: module-level constants that hot code reads are ``Final`` (mypyc
inlines literals and keeps other objects in C statics, where a plain global is a dict lookup
on every read; the states of ``engine/work.py`` are ``Final`` names defined there once, also
five times faster than ``State.READY`` interpreted), and the classes that are read per message
are native (``Record`` lives in ``cproxy/_message.py`` for that reason). One record idiom: a
slotted ``dataclass``, with its ``__init__`` written out when one is built per message (the
generated one is interpreted even in a compiled class: 1,000 six-field records, 38 µs
compiled against 250 µs generated, 150 µs for a named tuple's ``tuple.__new__``; interpreted
all ~250 µs; fields read twice as fast as a named tuple's both ways). Store rows that a database
driver takes as tuples (``store/_records.Batch``) stay named tuples. ``placement.py`` is the
one module that branches on ``status()`` (why: there).

This module must stay importable on its own (``setup.py`` runs it before cproxy exists): the
standard library only.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

#: The compiled modules. Only sync, CPU-bound code whose every caller is typed: mypyc checks
#: argument and attribute types at run time, and native classes cannot be monkeypatched. None
#: may define a msgspec ``Struct``: mypyc drops the keyword arguments of the classes it
#: compiles, so ``gc=False`` or ``omit_defaults=True`` would silently not apply (the answer
#: Structs, in ``api/bodies.py`` and ``broker/message_json.py``, stay Python for that reason;
#: ``api/items.py``, compiled, builds them).
MODULES = (
    "cproxy._message",
    "cproxy.engine.blocked",
    "cproxy.engine.chains",
    "cproxy.engine.cursor",
    "cproxy.engine.deadlines",
    "cproxy.engine.delays",
    "cproxy.engine.effects",
    "cproxy.engine.expressions",
    "cproxy.engine.group",
    "cproxy.engine.group_config",
    "cproxy.engine.in_flight",
    "cproxy.engine.offsets",
    "cproxy.engine.orderkey",
    "cproxy.engine.progress",
    "cproxy.engine.push_config",
    "cproxy.engine.readback",
    "cproxy.engine.reader",
    "cproxy.engine.records",
    "cproxy.engine.sequencer",
    "cproxy.engine.snapshots",
    "cproxy.engine.work",
    "cproxy.store._append_plan",
    "cproxy.store._records",
    "cproxy.api.items",
    "cproxy.api.produced",
    "cproxy.broker.delays",
    "cproxy.placement",
)

#: The first line of every module in ``MODULES``, and of no other module.
MARKER = "# cproxy: compiled (mypyc), see cproxy/_native.py"

#: Environment variable: "1" loads ``MODULES`` from source (and skips compiling at build).
PURE_ENV = "CPROXY_PURE_PYTHON"
#: Written by ``setup.py`` next to this module: {module: SHA-256 of the source compiled}.
BUILD_RECORD = "_native_build.json"

_ROOT = Path(__file__).resolve().parent.parent
#: The decision of ``install()``: see ``status()``.
_state = {"status": "source (not compiled)"}


def source_path(module: str, root: Path = _ROOT) -> Path:
    """The ``.py`` of one of ``MODULES`` under ``root`` (the directory holding ``cproxy/``)."""
    return root.joinpath(*module.split(".")).with_suffix(".py")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def record_build(root: Path = _ROOT) -> dict[str, str]:
    """``setup.py``: what is being compiled, to be checked by ``install()`` later."""
    return {module: digest(source_path(module, root)) for module in MODULES}


def compiled_modules(root: Path = _ROOT) -> list[str]:
    """Those of ``MODULES`` with a compiled extension module next to their source."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    return [
        module
        for module in MODULES
        if any(source_path(module, root).with_suffix(suffix).exists() for suffix in suffixes)
    ]


def stale_modules(root: Path = _ROOT, compiled: Sequence[str] | None = None) -> list[str]:
    """Modules whose source differs from what was compiled, or that were not compiled (a
    build that failed half-way): all of them without a build record. ``compiled``: what
    ``compiled_modules(root)`` returned, if the caller has it already."""
    try:
        built = json.loads((root / "cproxy" / BUILD_RECORD).read_text())
    except (OSError, ValueError):
        return list(MODULES)
    present = set(compiled_modules(root) if compiled is None else compiled)
    return [m for m in MODULES if m not in present or built.get(m) != digest(source_path(m, root))]


class _FromSource(importlib.abc.MetaPathFinder):
    """Finds ``MODULES`` as their ``.py`` files, ahead of the compiled extension modules that
    the standard path finder would prefer."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        name = fullname.rpartition(".")[2] + ".py"
        for entry in path if path is not None else sys.path:
            candidate = Path(entry) / name
            if candidate.is_file():
                return importlib.util.spec_from_file_location(fullname, candidate)
        return None


def install() -> str:
    """Decide, once per process, whether ``MODULES`` load compiled or from source; returns the
    decision as ``status()`` describes it."""
    if not any(isinstance(finder, _FromSource) for finder in sys.meta_path):
        compiled = compiled_modules()
        _state["status"] = _decide(compiled)
        if _state["status"] != "compiled" and compiled:
            sys.meta_path.insert(0, _FromSource())
    return _state["status"]


def _decide(compiled: list[str]) -> str:
    if not compiled:
        return "source (not compiled)"
    if os.environ.get(PURE_ENV) == "1":
        return f"source ({PURE_ENV}=1)"
    stale = stale_modules(compiled=compiled)
    if not stale:
        return "compiled"
    logger.warning(
        "%s changed since they were compiled; running all compiled modules from source "
        "(rebuild with `pip install -e .` to compile them again)",
        ", ".join(stale),
    )
    more = f" and {len(stale) - 3} more" if len(stale) > 3 else ""
    return f"source (changed since the build: {', '.join(stale[:3])}{more})"


def status() -> str:
    """ "compiled", or "source (why)": how the hot path's modules run in this process."""
    return _state["status"]


def describe() -> str:
    """``status()`` for a person: "compiled", or "interpreted: why" (``cproxy --version``)."""
    decision = status()
    if decision == "compiled":
        return decision
    return "interpreted: " + decision.removeprefix("source (").removesuffix(")")
