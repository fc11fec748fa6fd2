"""Dependency bounds: every requirement is pinned in constraints.txt (what .ci/run installs
with) to a version its bound in pyproject.toml allows, and .ci/run installs with it."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def pins() -> dict[str, str]:
    out: dict[str, str] = {}
    for raw in (ROOT / "constraints.txt").read_text().splitlines():
        line = raw.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"not a pin: {line!r}"
            out[canonicalize_name(name)] = version
    return out


def test_every_requirement_is_pinned_within_its_bounds() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    wanted = [
        *project["project"]["dependencies"],
        *(r for extra in ("dev", "spark", "postgres", "otel") for r in extras[extra]),
        *(r for r in project["build-system"]["requires"] if r.startswith("mypy")),
    ]
    pinned = pins()
    for text in wanted:
        requirement = Requirement(text)
        version = pinned.get(canonicalize_name(requirement.name))
        assert version is not None, f"{requirement.name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{requirement.name}=={version} is outside {requirement.specifier}"
        )


def test_ci_installs_with_the_constraints_and_bounds_what_reaches_into_internals() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "-c constraints.txt" in ci
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    uvicorn = next(
        Requirement(r) for r in project["project"]["dependencies"] if r.startswith("uvicorn")
    )
    mypy = next(Requirement(r) for r in project["build-system"]["requires"] if "mypy" in r)
    for requirement in (uvicorn, mypy):
        # Bounded above, or pinned exactly (mypy: a new mypyc changes the compiled code).
        assert any(s.operator in ("<", "==") for s in requirement.specifier), requirement
