"""docs/ARCHITECTURE.md stays true to the code it names: every backticked file path (`jobs/model.py`,
`backends/slurm/`) is a file or folder of the repository, and every dotted name
(`JobService.submit`, `processes.HEARTBEAT_STALE`) names a module, class, function or attribute
that the packages define. A rename that leaves the map behind fails here."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "ARCHITECTURE.md"
SOURCES = ("jupyterlab_mlcluster", "notebook_controller", "tests", "bench", "scripts", "src")

_SPAN = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"[\w.-]+(/[\w.-]+)*/?")
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
_WORD = re.compile(r"[A-Za-z_]\w*")
_EXTENSION = re.compile(r"[\w.-]+\.(py|toml|yaml|json|jsonl|ts|tsx|mjs|sh|md|log|txt|css)")


def _repo_paths() -> tuple[set[str], set[str]]:
    """Every file and folder under the sources, as paths relative to the repository and to each
    package (so `jobs/model.py` and `jupyterlab_mlcluster/jobs/model.py` both resolve)."""
    files = {p.name for p in REPO.iterdir() if p.is_file()}
    folders = {p.name for p in REPO.iterdir() if p.is_dir()}
    for root in SOURCES:
        for path in (REPO / root).rglob("*"):
            if "__pycache__" in path.parts or "node_modules" in path.parts:
                continue
            rel = path.relative_to(REPO).parts
            into = folders if path.is_dir() else files
            for start in range(len(rel)):
                into.add("/".join(rel[start:]))
    return files, folders


def _defined_names() -> set[str]:
    """Every module of the packages and every word their code spells (a name the doc cites must
    at least be written somewhere: defined, assigned or an attribute)."""
    names: set[str] = set()
    for package in ("jupyterlab_mlcluster", "notebook_controller"):
        for path in (REPO / package).rglob("*.py"):
            names.update(path.relative_to(REPO).with_suffix("").parts)
            names.update(_WORD.findall(path.read_text()))
    return names


def cited() -> tuple[list[str], list[str]]:
    """The doc's backticked repository paths, and its dotted code names (`a/b.name`: the module
    `a/b.py` and the name)."""
    paths, dotted = [], []
    for span in _SPAN.findall(DOC.read_text()):
        for token in re.split(r"[\s,()]+", span):
            token = token.strip("'\".:;")
            extension = _EXTENSION.fullmatch(token.rsplit("/", 1)[-1])
            if "/" in token and _PATH.fullmatch(token):
                if token.startswith("/") or "." in token.split("/")[0]:
                    continue  # a route, a machine's absolute path, an annotation's domain
                if not token.endswith("/") and "." in token.rsplit("/", 1)[-1] and not extension:
                    module, name = token.rsplit(".", 1)
                    paths.append(module + ".py")
                    dotted.append(name)
                elif token.endswith("/") or extension:
                    paths.append(token)
            elif extension:
                if token.endswith(".py"):
                    paths.append(token)  # other bare names are files a job writes
            elif _DOTTED.fullmatch(token):
                dotted.append(token)
    return paths, dotted


def test_the_architecture_doc_cites_files_that_exist():
    files, folders = _repo_paths()
    paths, _ = cited()
    assert len(paths) > 100  # the parser still finds the map's paths
    missing = sorted(
        {p for p in paths if (p.rstrip("/") not in folders if p.endswith("/") else p not in files)}
    )
    assert missing == [], f"docs/ARCHITECTURE.md names files that are not there: {missing}"


def test_the_architecture_doc_cites_names_the_code_defines():
    names = _defined_names()
    _, dotted = cited()
    assert len(dotted) > 20
    missing = sorted({d for d in dotted if d.split(".")[-1] not in names})
    assert missing == [], f"docs/ARCHITECTURE.md names what the code does not define: {missing}"
