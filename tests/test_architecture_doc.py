"""docs/ARCHITECTURE.md stays true to the code it names, and short enough to read in ten minutes.

Every backticked file path (`jobs/model.py`, `backends/slurm/`) is a file or folder of the
repository, and every code name (`JobSpec`, `processes.HEARTBEAT_STALE`) is spelled by the
packages' code: a rename that leaves the map behind fails here. Its layers table is the
import contract's, in order; the imports the contract excuses are the ones it names; the
modules it says speak SQL are the only ones that do. Each table cell is one sentence, and the
whole map stays under a word budget: what a module does in detail is its docstring's to say."""

from __future__ import annotations

import re
import tomllib
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
    assert len(paths) > 80  # the parser still finds the map's paths
    missing = sorted(
        {p for p in paths if (p.rstrip("/") not in folders if p.endswith("/") else p not in files)}
    )
    assert missing == [], f"docs/ARCHITECTURE.md names files that are not there: {missing}"


def test_the_architecture_doc_cites_names_the_code_defines():
    names = _defined_names()
    _, dotted = cited()
    assert len(dotted) > 3
    missing = sorted({d for d in dotted if d.split(".")[-1] not in names})
    assert missing == [], f"docs/ARCHITECTURE.md names what the code does not define: {missing}"


# A code name in a span: CamelCase (`JobSpec`, `MLClusterConfig`), or a snake or constant name
# with an underscore (`CELL_OPTIONS`, `max_restarts`), optionally called (`submit()`).
_CODE_NAME = re.compile(r"_*[A-Za-z]\w*(_\w+|[a-z][A-Z]\w*)(\(\))?|_*[A-Z][a-z]+[A-Z]\w*(\(\))?")


def test_the_architecture_doc_cites_code_names_the_code_spells():
    names = _defined_names()
    cited_names = set()
    for span in _SPAN.findall(DOC.read_text()):
        for token in re.split(r"[\s,()]+", span.replace("()", "")):
            token = token.strip("'\".:;*[]")
            if _CODE_NAME.fullmatch(token) and not token.startswith("__"):
                cited_names.add(token)
    assert len(cited_names) > 15  # the parser still finds the map's names
    missing = sorted(n for n in cited_names if n not in names)
    assert missing == [], f"docs/ARCHITECTURE.md names what the code does not spell: {missing}"


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _table_rows(text: str) -> list[list[str]]:
    """The cells of every table row (header and separator rows left out); `\\|` is a pipe."""
    rows = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|") or set(line) <= set("|- "):
            continue
        if i + 1 < len(lines) and set(lines[i + 1]) <= set("|- ") and "-" in lines[i + 1]:
            continue  # a header
        cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
        rows.append([c.strip() for c in cells])
    return rows


MAX_CELL = 300
WORD_BUDGET = 2500  # ten minutes at 250 words a minute


def _prose(cell: str) -> str:
    """A cell's own words: code spans and parenthesised asides left out."""
    text = _SPAN.sub("x", cell)
    while re.search(r"\([^()]*\)", text):
        text = re.sub(r"\([^()]*\)", "", text)
    return text


def test_every_table_cell_of_the_architecture_doc_is_one_sentence():
    rows = _table_rows(DOC.read_text())
    assert len(rows) > 60  # the parser still finds the modules tables
    long_cells, run_on = [], []
    for row in rows:
        for cell in row:
            if len(cell) > MAX_CELL:
                long_cells.append(cell[:80])
            stops = re.findall(r"[.;!?](?=\s|$)", _prose(cell).rstrip().rstrip("."))
            if stops:
                run_on.append(cell[:80])
    assert long_cells == [], f"cells over {MAX_CELL} characters (say the rest in a docstring)"
    assert run_on == [], f"cells of more than one sentence: {run_on}"


def test_the_one_sentence_rule_catches_a_run_on_cell():
    """The rule above must be able to fail: a second sentence or a semicolon is caught, a period
    inside a code span or an aside is not."""

    def sentences(cell: str) -> int:
        return 1 + len(re.findall(r"[.;!?](?=\s|$)", _prose(cell).rstrip().rstrip(".")))

    assert sentences("The job store (rows, e.g. jobs). ") == 1
    assert sentences("Reads `a. b` and `x.py`.") == 1
    assert sentences("The job store. It also keeps logs.") == 2
    assert sentences("The job store; the change feed") == 2
    assert _table_rows("| a | b |\n| --- | --- |\n| `x\\|y` | one. two. |\n") == [
        ["`x\\|y`", "one. two."]
    ]


def test_the_architecture_doc_reads_in_ten_minutes():
    words = len(re.findall(r"[A-Za-z]\S*", DOC.read_text()))
    assert 1000 < words <= WORD_BUDGET, (
        f"docs/ARCHITECTURE.md has {words} words, over its budget of {WORD_BUDGET}: say less "
        "here and more in the modules' docstrings"
    )


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def test_the_layers_table_is_the_import_contract_in_order():
    layers = _contracts()["layers"]["layers"]
    rows = _table_rows(_section("Layers"))
    assert len(rows) == len(layers), "one row of the layers table per layer of the contract"
    for row, layer in zip(rows, layers, strict=True):
        for name in re.split(r"[|:]", layer):
            name = name.strip()
            assert re.search(rf"\b{re.escape(name)}\b", row[1], re.IGNORECASE), (
                f"the layers table's row {row[0]!r} does not name {name!r}"
            )


def test_the_architecture_doc_names_every_excused_import():
    paths, _ = cited()
    for contract in _contracts().values():
        for rule in contract.get("ignore_imports", []):
            importer = rule.split("->")[0].strip().split(".", 1)[1].replace(".", "/") + ".py"
            assert importer in paths, f"the contracts excuse {rule!r}: the map must say so"


# A string that starts with an SQL statement's keyword (upper case, as the store writes them).
_SQL = re.compile(
    r"""(?:[rf]?(?:\"\"\"|"|'))\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|PRAGMA|BEGIN|WITH|REPLACE|ALTER)\s"""
)


def test_sql_is_spoken_only_where_the_architecture_doc_says():
    """The map says only jobs/storage/ and the experiment store write SQL: a statement anywhere
    else makes it untrue."""
    assert "SQL is spoken only in `jobs/storage/` and in `jobs/experiments/store.py`" in " ".join(
        DOC.read_text().split()
    )
    package = REPO / "jupyterlab_mlcluster"
    speakers = {
        path.relative_to(package).as_posix()
        for path in package.rglob("*.py")
        if _SQL.search(path.read_text())
    }
    assert {"jobs/experiments/store.py", "jobs/storage/database.py"} <= speakers
    elsewhere = sorted(
        s
        for s in speakers
        if not s.startswith("jobs/storage/") and s != "jobs/experiments/store.py"
    )
    assert elsewhere == [], f"SQL outside the store, against docs/ARCHITECTURE.md: {elsewhere}"
