"""Every ```python and ```bash block of README.md and docs/*.md runs, as a newcomer runs it.

The snippets of all documents run, one after another, against ONE live server (uvicorn on a
free loopback port, SQLite in a fresh temp dir), README first, then docs/ in name order, each
document's snippets in document order. Sharing one server is the point: a reader who follows
the README tour and then the SDK guide uses the same server, so the documents must not collide
(topic names, group names).

How a snippet runs:

- ``127.0.0.1:9713`` and ``localhost:9713`` in its text are rewritten to the test server, and
  ``CPROXY_URL`` is set to the server's URL (the examples honour it);
- python blocks run with this interpreter, bash blocks with ``bash -e -o pipefail``; the venv's
  ``bin`` is first on PATH (``python``, ``cproxy``), the working directory is a temp dir with
  an ``examples`` link to the repository's, and ``PYSPARK_PYTHON`` is unset (snippets that
  start Spark must say how executors find the package, as docs/spark.md tells users to);
- it passes when it exits 0 within its timeout, and, for bash, prints no API error body unless
  one is expected.

An HTML comment on the line before a block controls it (attributes are checked, typos fail):

- ``<!-- snippet: skip reason="starts a long-running server" -->``: not run; the reason is
  printed;
- ``<!-- snippet: needs="spark" timeout_s="240" -->``: needs PySpark and Java (otherwise
  skipped with a printed reason), and may take that long (default timeout 60 s);
- ``<!-- snippet: expect="ride-7" expect_error="topic_conflict" -->``: the output (stdout or
  stderr) must contain the text / stdout that API error code (several ``expect`` values are
  separated by ``|``; values may be in single quotes when they contain double quotes).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import RunningServer, make_settings

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_LANGUAGES = ("python", "bash")
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_HOST_PORTS = ("127.0.0.1:9713", "localhost:9713")

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n`]*$")
_MARKER = re.compile(r"^\s*<!--\s*snippet:(?P<attrs>.*?)-->\s*$")
_ATTR = re.compile(r"""(?P<name>[a-z_]+)(?:="(?P<dq>[^"]*)"|='(?P<sq>[^']*)')?""")
_ATTRIBUTES = frozenset({"skip", "reason", "needs", "timeout_s", "expect", "expect_error"})
_API_ERROR = re.compile(r'"error"\s*:\s*\{\s*"code"\s*:\s*"(?P<code>[a-z_]+)"')


@dataclass(frozen=True)
class Snippet:
    document: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip_reason: str | None = None
    needs: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    expect: tuple[str, ...] = ()
    expect_error: str | None = None

    @property
    def where(self) -> str:
        return f"{_shown(self.document)}:{self.line}"


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _parse_marker(text: str, where: str) -> dict[str, str]:
    attrs: dict[str, str] = {}
    rest = text.strip()
    while rest:
        match = _ATTR.match(rest)
        if match is None:
            raise AssertionError(f"{where}: cannot read snippet marker at {rest!r}")
        name = match["name"]
        if name not in _ATTRIBUTES:
            raise AssertionError(f"{where}: unknown snippet attribute {name!r}")
        attrs[name] = match["dq"] if match["dq"] is not None else (match["sq"] or "")
        rest = rest[match.end() :].lstrip()
    if "skip" in attrs and not attrs.get("reason"):
        raise AssertionError(f'{where}: a skipped snippet needs reason="..."')
    return attrs


def extract(document: Path) -> list[Snippet]:
    """The fenced python and bash blocks of ``document``, with their markers, in order."""
    lines = document.read_text(encoding="utf-8").splitlines()
    snippets: list[Snippet] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, lang, start = opening["indent"], opening["lang"], i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"{document.name}:{start + 1}: unterminated code fence")
        i += 1
        previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.match(previous)
        where = f"{_shown(document)}:{start + 1}"
        attrs = _parse_marker(marker["attrs"], where) if marker else {}
        if lang not in RUN_LANGUAGES:
            if attrs:
                raise AssertionError(f"{where}: snippet marker on a ```{lang} block")
            continue
        snippets.append(
            Snippet(
                document=document,
                line=start + 1,
                lang=lang,
                code="\n".join(body) + "\n",
                skip_reason=attrs["reason"] if "skip" in attrs else None,
                needs=attrs.get("needs") or None,
                timeout_s=float(attrs.get("timeout_s", DEFAULT_TIMEOUT_S)),
                expect=tuple(t for t in attrs.get("expect", "").split("|") if t),
                expect_error=attrs.get("expect_error") or None,
            )
        )
    return snippets


def _spark_missing() -> str | None:
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        return f"PySpark extra not installed ({exc.name})"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime (Spark needs Java 17)"
    return None


@pytest.fixture(scope="module")
def docs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = RunningServer(make_settings(tmp_path_factory.mktemp("docs-data")))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("docs-run")
    (directory / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    return directory


def _environment(url: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "CPROXY_TOKEN"):
        env.pop(name, None)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["CPROXY_URL"] = url
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_snippet(snippet: Snippet, url: str, workdir: Path) -> str:
    """Run one snippet; return why it failed, or an empty string."""
    host_port = url.removeprefix("http://")
    code = snippet.code
    for default in DEFAULT_HOST_PORTS:
        code = code.replace(default, host_port)
    name = re.sub(r"[^A-Za-z0-9]+", "_", snippet.where)
    if snippet.lang == "python":
        script = workdir / f"{name}.py"
        command = [sys.executable, str(script)]
    else:
        script = workdir / f"{name}.sh"
        command = ["bash", "-e", "-o", "pipefail", str(script)]
    script.write_text(code, encoding="utf-8")
    try:
        done = subprocess.run(
            command,
            cwd=workdir,
            env=_environment(url),
            capture_output=True,
            text=True,
            timeout=snippet.timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else ""
        return f"{snippet.where}: no exit within {snippet.timeout_s:g} s\n{out[-3000:]}"
    report = f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    if done.returncode != 0:
        return f"{snippet.where}: exit status {done.returncode}\n{report}"
    codes = {m["code"] for m in _API_ERROR.finditer(done.stdout)}
    unexpected = codes - {snippet.expect_error}
    if snippet.lang == "bash" and unexpected:
        return f"{snippet.where}: API error(s) {sorted(unexpected)}\n{report}"
    if snippet.expect_error and snippet.expect_error not in codes:
        return f"{snippet.where}: expected API error {snippet.expect_error!r}\n{report}"
    missing = [text for text in snippet.expect if text not in done.stdout + done.stderr]
    if missing:
        return f"{snippet.where}: output lacks {missing}\n{report}"
    return ""


def _document_param(document: Path) -> object:
    """Documents with Spark snippets carry the ``spark`` and ``slow`` marks (minutes of work)."""
    spark = any(s.needs == "spark" for s in extract(document))
    marks = [pytest.mark.spark, pytest.mark.slow] if spark else []
    return pytest.param(document, marks=marks, id=str(document.relative_to(ROOT)))


@pytest.mark.parametrize("document", [_document_param(d) for d in DOCUMENTS])
def test_document_snippets_run(
    document: Path,
    docs_server: RunningServer,
    workdir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    failures: list[str] = []
    for snippet in extract(document):
        reason = snippet.skip_reason
        if reason is None and snippet.needs == "spark":
            reason = _spark_missing()
        if reason is not None:
            with capsys.disabled():
                print(f"\n  skipped snippet {snippet.where} ({snippet.lang}): {reason}")
            continue
        failure = run_snippet(snippet, docs_server.url, workdir)
        if failure:
            failures.append(failure)
    assert not failures, "\n\n".join(failures)


def test_extract_reads_markers_and_rejects_typos(tmp_path: Path) -> None:
    document = tmp_path / "probe.md"
    good = (
        "text\n\n"
        '<!-- snippet: skip reason="blocks" -->\n'
        "```bash\ncproxy serve\n```\n\n"
        '<!-- snippet: expect="a|b" timeout_s="5" -->\n'
        "```python\nprint('a b')\n```\n\n"
        "```\nplain\n```\n"
    )
    document.write_text(good, encoding="utf-8")
    skipped, run = extract(document)
    assert (skipped.lang, skipped.skip_reason, skipped.code) == ("bash", "blocks", "cproxy serve\n")
    assert (run.expect, run.timeout_s, run.skip_reason) == (("a", "b"), 5.0, None)
    document.write_text('<!-- snippet: skp reason="x" -->\n```bash\ntrue\n```\n')
    with pytest.raises(AssertionError, match="unknown snippet attribute 'skp'"):
        extract(document)
    document.write_text("<!-- snippet: skip -->\n```bash\ntrue\n```\n")
    with pytest.raises(AssertionError, match="needs reason"):
        extract(document)


_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


@pytest.mark.parametrize(
    "document",
    [*DOCUMENTS, *sorted((ROOT / "examples").glob("*.py"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_documents_stay_inside_the_repository(document: Path) -> None:
    """No reference to the out-of-tree contract, and every relative link resolves."""
    text = document.read_text(encoding="utf-8")
    assert "DESIGN.md" not in text and "DESIGN §" not in text, (
        f"{document.name} cites the out-of-tree contract; link docs/api.md or "
        "docs/guarantees.md instead"
    )
    for match in _LINK.finditer(text):
        target = match["target"].split("#")[0]
        if not target or re.match(r"^[a-z]+:", target):
            continue
        resolved = (document.parent / target).resolve()
        assert resolved.is_relative_to(ROOT), f"{document.name}: {target} leaves the repository"
        assert resolved.exists(), f"{document.name}: broken link {target}"
