"""No class declares another's private state: the engine, broker and store are built from
collaborators passed through constructors, not from mixins (or mypyc traits) that annotate
attributes their host sets (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "cproxy"
PACKAGES = ("engine", "broker", "store")
#: Bases whose bare class-body annotations are fields the class itself declares and fills.
RECORD_BASES = {"NamedTuple", "Protocol", "Struct", "TypedDict"}


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Call):
        return _name(node.func)
    return node.id if isinstance(node, ast.Name) else ""


def _records(tree: ast.Module) -> set[str]:
    """Classes of the module whose bare annotations are their own fields: dataclasses, and
    (directly or through a class of the module) named tuples, protocols and Structs."""
    out: set[str] = set()
    for node in tree.body:  # in order: a base is defined before its subclasses
        if not isinstance(node, ast.ClassDef):
            continue
        bases = {_name(b) for b in node.bases}
        decorators = {_name(d) for d in node.decorator_list}
        if "dataclass" in decorators or bases & (RECORD_BASES | out):
            out.add(node.name)
    return out


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_class_declares_state_it_does_not_set(path: Path) -> None:
    tree = ast.parse(path.read_text())
    records = _records(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name not in records:
            bare = [
                ast.unparse(s.target)
                for s in node.body
                if isinstance(s, ast.AnnAssign) and s.value is None
            ]
            if bare:
                found.append(f"{node.name}: {', '.join(bare)}")
    assert not found, f"attributes declared but not set by the class itself: {found}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_mypyc_trait_mixes_code_into_a_host(path: Path) -> None:
    tree = ast.parse(path.read_text())
    traits = [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and "trait" in {_name(d) for d in node.decorator_list}
    ]
    assert not traits, f"mixed-in traits: {traits}"
