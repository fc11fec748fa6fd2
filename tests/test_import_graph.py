"""No import cycles in ``cproxy``, ``consumer_sdk`` and ``spark_sink``, type-only imports
included; ``cproxy/store`` knows nothing of ``cproxy/cluster``.

The graph is read from the source with ``ast`` (nothing is imported): an edge for every
``import`` and ``from ... import`` of a module of the three packages, wherever it stands at
module level (under ``if TYPE_CHECKING:`` and ``try:`` included). Imports inside functions
are deferred, not free: they count for the folder-level check and for a second module-level
walk, where only the allowed edges below may close a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cproxy", "consumer_sdk", "spark_sink")

#: Module cycles tolerated for now: none. An entry must still be a cycle (the test says when
#: it is not, so the exception goes with it).
KNOWN_CYCLES: set[frozenset[str]] = set()

#: Imports inside a function that may point back up the graph, with why.
DEFERRED_ALLOWED = {
    # Runs on Spark's workers to check that they can import the package at all.
    ("spark_sink.executors", "spark_sink"),
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _known(name: str) -> str | None:
    """The module of ours that importing ``name`` runs (itself, or the package holding it)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".")
            if MODULES[module].name != "__init__.py":
                package.pop()
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, base] if base else package)
        # ``from pkg import sub`` imports the submodule; ``from mod import name`` the module.
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    for name in names:
        target = _known(name)
        if target is not None and target != module:
            yield target


def _imports(module: str, deferred: bool) -> set[str]:
    """What ``module`` imports at module level (class bodies and ``if``/``try`` blocks
    included), and inside its functions too when ``deferred``."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            function = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if function and not deferred:
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                out.update(_targets(module, child))
            visit(child)

    visit(ast.parse(MODULES[module].read_text(encoding="utf-8")))
    return out


def graph(deferred: bool) -> dict[str, set[str]]:
    return {m: _imports(m, deferred) for m in MODULES}


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def folder(module: str) -> str:
    """A module's folder in ``cproxy`` (``cproxy.store``, ``cproxy.config`` for a top-level
    module); the module itself in the flat packages."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "cproxy" else module


def _describe(components: Iterable[frozenset[str]], edges: dict[str, set[str]]) -> str:
    lines = []
    for component in components:
        inside = sorted(f"{a} -> {b}" for a in component for b in edges[a] if b in component)
        lines.append("cycle: " + ", ".join(inside))
    return "\n".join(lines)


def test_no_module_imports_itself_back_type_only_imports_included() -> None:
    edges = graph(deferred=False)
    found = cycles(edges)
    unknown = [c for c in found if c not in KNOWN_CYCLES]
    assert not unknown, _describe(unknown, edges)
    stale = KNOWN_CYCLES - set(found)
    assert not stale, f"no longer cycles, remove them from KNOWN_CYCLES: {stale}"


def test_imports_inside_functions_close_no_cycle_but_the_allowed_ones() -> None:
    edges = graph(deferred=True)
    for a, b in DEFERRED_ALLOWED:
        assert b in edges[a], f"{a} no longer imports {b}: remove it from DEFERRED_ALLOWED"
        edges[a].discard(b)
    unknown = [c for c in cycles(edges) if c not in KNOWN_CYCLES]
    assert not unknown, _describe(unknown, edges)


def test_no_cycle_between_the_folders_of_cproxy() -> None:
    """config, cluster, broker, engine, store, api, cli, ... (and top-level modules) form a
    graph without cycles, counting every import, deferred ones too."""
    edges: dict[str, set[str]] = {}
    for module, targets in graph(deferred=True).items():
        if not module.startswith("cproxy."):
            continue
        mine = edges.setdefault(folder(module), set())
        mine.update(
            folder(t) for t in targets if t.startswith("cproxy.") and folder(t) != folder(module)
        )
    found = cycles(edges)
    assert not found, _describe(found, edges)


def test_the_store_imports_nothing_of_the_cluster() -> None:
    for module, targets in graph(deferred=True).items():
        if module.startswith("cproxy.store"):
            assert not [t for t in targets if t.startswith("cproxy.cluster")], module


def test_the_cluster_uses_only_the_stores_public_cluster_interface() -> None:
    """No private store module (``_pg_*``, SQL) in ``cproxy/cluster``: it asks the store
    through ``cproxy.store.cluster_base``."""
    for module, targets in graph(deferred=True).items():
        if module.startswith("cproxy.cluster"):
            used = {t for t in targets if t.startswith("cproxy.store")}
            assert used <= {"cproxy.store", "cproxy.store.cluster_base"}, (module, used)


def test_the_graph_sees_type_only_relative_and_deferred_imports(tmp_path: Path) -> None:
    """The walker itself: a cycle closed under TYPE_CHECKING, through a relative import, and
    one only a function's import closes."""
    source = {
        "a": "import typing\nif typing.TYPE_CHECKING:\n    from cproxy.store.b import X\n",
        "b": "from .a import Y\n",
        "c": "def f():\n    from cproxy.store import a\n",
    }
    saved = dict(MODULES)
    try:
        for name, text in source.items():
            path = tmp_path / f"{name}.py"
            path.write_text(text)
            MODULES[f"cproxy.store.{name}"] = path
        eager = graph(deferred=False)
        assert frozenset({"cproxy.store.a", "cproxy.store.b"}) in cycles(eager)
        assert "cproxy.store.a" not in eager["cproxy.store.c"]
        assert "cproxy.store.a" in graph(deferred=True)["cproxy.store.c"]
    finally:
        MODULES.clear()
        MODULES.update(saved)
